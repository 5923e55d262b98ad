/* testutil.c - .pb reading and value comparison for tests. */
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int test_read_pb(const char *path, kiln_value_kind kind, kiln_value **out, char *why, size_t why_size)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, why_size, "cannot open %s", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(len > 0 ? (size_t)len : 1);
    if (!buf || (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len)) {
        fclose(f);
        free(buf);
        snprintf(why, why_size, "cannot read %s", path);
        return 1;
    }
    fclose(f);
    char err[512] = "";
    kiln_status st = kiln_value_decode_proto(buf, (size_t)len, kind, out, NULL, err, sizeof err);
    free(buf);
    if (st) {
        snprintf(why, why_size, "decoding %s: %s", path, err);
        return 1;
    }
    return 0;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);
    else if (exp == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    } else u = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float value of element i for the float types this comparison handles; false for others */
static bool as_double(kiln_dtype dt, const void *p, int64_t i, double *v)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT32: *v = ((const float *)p)[i]; return true;
    case KILN_DTYPE_FLOAT64: *v = ((const double *)p)[i]; return true;
    case KILN_DTYPE_FLOAT16: *v = half_to_float(((const uint16_t *)p)[i]); return true;
    case KILN_DTYPE_BFLOAT16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        *v = f;
        return true;
    }
    default: return false;
    }
}

static bool close_enough(double g, double w, double rtol, double atol)
{
    if (isnan(g) || isnan(w)) return isnan(g) && isnan(w);
    if (isinf(g) || isinf(w)) return g == w;
    return fabs(g - w) <= atol + rtol * fabs(w);
}

static void shape_str(const kiln_value *v, char *buf, size_t size)
{
    size_t at = (size_t)snprintf(buf, size, "%s[", kiln_dtype_name(kiln_value_dtype(v)));
    for (int k = 0; k < kiln_value_rank(v) && at < size; k++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", k ? "," : "", (long long)kiln_value_dims(v)[k]);
    if (at < size) snprintf(buf + at, size - at, "]");
}

bool test_values_close(const kiln_value *got, const kiln_value *want, double rtol, double atol, char *why,
                       size_t why_size)
{
    if (!got || !want) {
        snprintf(why, why_size, "missing value");
        return false;
    }
    kiln_value_kind gk = kiln_value_kind_of(got), wk = kiln_value_kind_of(want);
    if (gk != wk) {
        snprintf(why, why_size, "kind %d, expected %d", (int)gk, (int)wk);
        return false;
    }
    if (gk == KILN_VALUE_SEQUENCE) {
        int64_t n = kiln_value_sequence_length(got);
        if (n != kiln_value_sequence_length(want)) {
            snprintf(why, why_size, "sequence of %lld items, expected %lld", (long long)n,
                     (long long)kiln_value_sequence_length(want));
            return false;
        }
        for (int64_t i = 0; i < n; i++) {
            char sub[400];
            if (!test_values_close(kiln_value_sequence_at(got, i), kiln_value_sequence_at(want, i), rtol, atol, sub,
                                   sizeof sub)) {
                snprintf(why, why_size, "item %lld: %s", (long long)i, sub);
                return false;
            }
        }
        return true;
    }
    if (gk == KILN_VALUE_OPTIONAL) {
        const kiln_value *g = kiln_value_optional_get(got), *w = kiln_value_optional_get(want);
        if (!g || !w) {
            if (g == w) return true;
            snprintf(why, why_size, "optional is %s, expected %s", g ? "set" : "empty", w ? "set" : "empty");
            return false;
        }
        return test_values_close(g, w, rtol, atol, why, why_size);
    }
    char gs[256], ws[256];
    shape_str(got, gs, sizeof gs);
    shape_str(want, ws, sizeof ws);
    if (strcmp(gs, ws)) {
        snprintf(why, why_size, "got %s, expected %s", gs, ws);
        return false;
    }
    kiln_dtype dt = kiln_value_dtype(got);
    const void *g = kiln_value_data(got), *w = kiln_value_data(want);
    int64_t n = kiln_value_numel(got);
    int64_t bad = 0, first = -1;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double a, b;
        bool ok;
        if (dt == KILN_DTYPE_STRING) {
            ok = !strcmp(((char *const *)g)[i], ((char *const *)w)[i]);
        } else if (as_double(dt, g, i, &a)) {
            as_double(dt, w, i, &b);
            ok = close_enough(a, b, rtol, atol);
            if (!ok && !isnan(a - b) && fabs(a - b) > worst) worst = fabs(a - b);
        } else if (dt == KILN_DTYPE_COMPLEX64) {
            ok = close_enough(((const float *)g)[2 * i], ((const float *)w)[2 * i], rtol, atol) &&
                 close_enough(((const float *)g)[2 * i + 1], ((const float *)w)[2 * i + 1], rtol, atol);
        } else if (dt == KILN_DTYPE_COMPLEX128) {
            ok = close_enough(((const double *)g)[2 * i], ((const double *)w)[2 * i], rtol, atol) &&
                 close_enough(((const double *)g)[2 * i + 1], ((const double *)w)[2 * i + 1], rtol, atol);
        } else {
            size_t es = kiln_dtype_size(dt);
            ok = !memcmp((const char *)g + (size_t)i * es, (const char *)w + (size_t)i * es, es);
            /* 8-bit floats: any NaN code equals any NaN code of the format; compare bytes else */
        }
        if (!ok) {
            if (first < 0) first = i;
            bad++;
        }
    }
    if (bad) {
        char detail[200] = "";
        double a = 0, b = 0;
        if (dt != KILN_DTYPE_STRING && as_double(dt, g, first, &a)) {
            as_double(dt, w, first, &b);
            snprintf(detail, sizeof detail, " (first at flat index %lld: got %.9g, expected %.9g; max abs diff %.3g)",
                     (long long)first, a, b, worst);
        } else if (dt != KILN_DTYPE_STRING) {
            size_t es = kiln_dtype_size(dt);
            uint64_t ga = 0, wb = 0;
            memcpy(&ga, (const char *)g + (size_t)first * es, es < 8 ? es : 8);
            memcpy(&wb, (const char *)w + (size_t)first * es, es < 8 ? es : 8);
            snprintf(detail, sizeof detail, " (first at flat index %lld: got bits 0x%llx, expected 0x%llx)",
                     (long long)first, (unsigned long long)ga, (unsigned long long)wb);
        } else {
            snprintf(detail, sizeof detail, " (first at flat index %lld: got '%s', expected '%s')", (long long)first,
                     ((char *const *)g)[first], ((char *const *)w)[first]);
        }
        snprintf(why, why_size, "%lld of %lld elements differ%s", (long long)bad, (long long)n, detail);
        return false;
    }
    return true;
}
