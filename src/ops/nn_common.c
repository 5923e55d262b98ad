/* nn_common.c - helpers shared by the nn family: window geometry, bulk conversions, quantized
 * stores and the matrix-product core. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/nn_internal.h"
#include "ops/op.h"
#include "ops/semantics.h"
#include "ops/util.h"

/* Copies an optional ints attribute of nsp (or 2*nsp for pads) values into dst, checking that
 * each is >= min; absent keeps dst. */
static bool geom_ints(const kiln_node *n, const char *name, int count, int64_t min, int64_t *dst, char *msg,
                      int size)
{
    int k;
    const int64_t *v = kiln_attr_ints(n, name, &k);
    if (!v) return true;
    if (k != count) {
        snprintf(msg, (size_t)size, "attribute %s has %d values, expected %d", name, k, count);
        return false;
    }
    for (int i = 0; i < k; i++) {
        if (v[i] > NN_ATTR_MAX) {
            snprintf(msg, (size_t)size, "attribute %s[%d] = %lld is too large", name, i, (long long)v[i]);
            return false;
        }
        if (v[i] < min) {
            snprintf(msg, (size_t)size, "attribute %s[%d] = %lld must be >= %lld", name, i, (long long)v[i],
                     (long long)min);
            return false;
        }
        dst[i] = v[i];
    }
    return true;
}

bool kiln_nn_geom_parse(const kiln_node *n, int nsp, kiln_nn_geom *g, char *msg, int size)
{
    memset(g, 0, sizeof *g);
    g->nsp = nsp;
    if (nsp < 1 || nsp > KILN_MAX_RANK - 2) {
        snprintf(msg, (size_t)size, "%d spatial dims are not supported", nsp);
        return false;
    }
    for (int i = 0; i < nsp; i++) g->strides[i] = g->dilations[i] = 1;
    const char *ap = kiln_attr_string(n, "auto_pad", "NOTSET");
    if (!strcmp(ap, "NOTSET") || !*ap) g->auto_pad = NN_PAD_NOTSET;
    else if (!strcmp(ap, "SAME_UPPER")) g->auto_pad = NN_PAD_SAME_UPPER;
    else if (!strcmp(ap, "SAME_LOWER")) g->auto_pad = NN_PAD_SAME_LOWER;
    else if (!strcmp(ap, "VALID")) g->auto_pad = NN_PAD_VALID;
    else {
        snprintf(msg, (size_t)size, "unknown auto_pad '%s'", ap);
        return false;
    }
    g->ceil_mode = kiln_attr_int(n, "ceil_mode", 0) != 0;
    if (!geom_ints(n, "strides", nsp, 1, g->strides, msg, size)) return false;
    if (!geom_ints(n, "dilations", nsp, 1, g->dilations, msg, size)) return false;
    if (g->auto_pad == NN_PAD_NOTSET && !geom_ints(n, "pads", 2 * nsp, 0, g->pads, msg, size)) return false;
    return true;
}

kiln_dim kiln_nn_geom_out_dim(kiln_dimtab *t, const kiln_nn_geom *g, int i, kiln_dim in, kiln_dim k)
{
    kiln_dim s = kiln_dim_const(g->strides[i]);
    /* dilated window extent minus one: dilation*(k-1) */
    kiln_dim span = kiln_dim_mul(t, kiln_dim_const(g->dilations[i]), kiln_dim_sub(t, k, kiln_dim_const(1)));
    if (g->auto_pad == NN_PAD_SAME_UPPER || g->auto_pad == NN_PAD_SAME_LOWER) return kiln_dim_ceildiv(t, in, s);
    if (g->auto_pad == NN_PAD_VALID) return kiln_dim_ceildiv(t, kiln_dim_sub(t, in, span), s);
    kiln_dim padded = kiln_dim_add(t, in, kiln_dim_const(g->pads[i] + g->pads[g->nsp + i]));
    kiln_dim room = kiln_dim_sub(t, padded, kiln_dim_add(t, span, kiln_dim_const(1)));
    if (!g->ceil_mode) return kiln_dim_add(t, kiln_dim_floordiv(t, room, s), kiln_dim_const(1));
    /* ceil_mode: the last window must still start inside the input or the begin padding */
    kiln_dim out = kiln_dim_add(t, kiln_dim_ceildiv(t, room, s), kiln_dim_const(1));
    kiln_dim starts = kiln_dim_add(t, in, kiln_dim_const(g->pads[i] - 1));
    return kiln_dim_min(t, out, kiln_dim_add(t, kiln_dim_floordiv(t, starts, s), kiln_dim_const(1)));
}

bool kiln_nn_geom_resolve(kiln_nn_geom *g, const int64_t *in, int64_t *out)
{
    for (int i = 0; i < g->nsp; i++) {
        kiln_dim d = kiln_nn_geom_out_dim(NULL, g, i, kiln_dim_const(in[i]), kiln_dim_const(g->kernel[i]));
        if (!kiln_dim_is_const(d) || d.c < 1) return false;
        out[i] = d.c;
        if (g->auto_pad == NN_PAD_SAME_UPPER || g->auto_pad == NN_PAD_SAME_LOWER) {
            int64_t total = (out[i] - 1) * g->strides[i] + g->dilations[i] * (g->kernel[i] - 1) + 1 - in[i];
            kiln_same_pads(total < 0 ? 0 : total, g->auto_pad == NN_PAD_SAME_UPPER, &g->pads[i],
                           &g->pads[g->nsp + i]);
        } else if (g->auto_pad == NN_PAD_VALID) {
            g->pads[i] = g->pads[g->nsp + i] = 0;
        }
    }
    return true;
}

bool kiln_nn_pool_geom(const kiln_node *n, kiln_nn_geom *g, char *msg, int size)
{
    int nk;
    const int64_t *ks = kiln_attr_ints(n, "kernel_shape", &nk);
    if (!ks) {
        snprintf(msg, (size_t)size, "attribute kernel_shape is required");
        return false;
    }
    if (!kiln_nn_geom_parse(n, nk, g, msg, size)) return false;
    for (int i = 0; i < nk; i++) {
        if (ks[i] < 1 || ks[i] > NN_ATTR_MAX) {
            snprintf(msg, (size_t)size, "kernel_shape[%d] = %lld is out of range", i, (long long)ks[i]);
            return false;
        }
        g->kernel[i] = ks[i];
    }
    return true;
}

double kiln_nn_pool_p(const kiln_node *n)
{
    const kiln_attr *a = kiln_node_attr(n, "p");
    if (!a) return 2;
    return a->type == KILN_ATTR_FLOAT ? a->f : (double)a->i;
}

double *kiln_nn_load_f64(const kiln_value *v)
{
    double *p = malloc((size_t)(v->numel > 0 ? v->numel : 1) * sizeof *p);
    if (!p) return NULL;
    for (int64_t i = 0; i < v->numel; i++) p[i] = kiln_load_f64(v->dtype, v->data, i);
    return p;
}

int64_t *kiln_nn_load_i64(const kiln_value *v)
{
    int64_t *p = malloc((size_t)(v->numel > 0 ? v->numel : 1) * sizeof *p);
    if (!p) return NULL;
    for (int64_t i = 0; i < v->numel; i++)
        p[i] = v->dtype == KILN_DTYPE_UINT64 ? (int64_t)kiln_load_u64(v->dtype, v->data, i)
                                             : kiln_load_i64(v->dtype, v->data, i);
    return p;
}

void *kiln_nn_load_num(const kiln_value *v, bool is_int)
{
    return is_int ? (void *)kiln_nn_load_i64(v) : (void *)kiln_nn_load_f64(v);
}

void kiln_nn_store_all_f64(kiln_value *Y, const double *y)
{
    for (int64_t i = 0; i < Y->numel; i++) kiln_store_f64(Y->dtype, Y->data, i, y[i]);
}

void kiln_nn_store_all_i64(kiln_value *Y, const int64_t *y)
{
    for (int64_t i = 0; i < Y->numel; i++) kiln_store_i64(Y->dtype, Y->data, i, y[i]);
}

double kiln_nn_param_f64(const kiln_value *v, int64_t idx)
{
    return kiln_load_f64(v->dtype, v->data, v->numel == 1 ? 0 : idx);
}

int64_t kiln_nn_param_i64(const kiln_value *v, int64_t idx)
{
    if (!v) return 0;
    return kiln_load_i64(v->dtype, v->data, v->numel == 1 ? 0 : idx);
}

bool kiln_nn_param_ok(const kiln_value *v, int64_t len)
{
    return !v || v->numel == 1 || v->numel == len;
}

/* Rounds v to the precision of float dtype dt (identity for double). */
static double round_to(kiln_dtype dt, double v)
{
    uint64_t slot = 0;
    kiln_store_f64(dt, &slot, 0, v);
    return kiln_load_f64(dt, &slot, 0);
}

double kiln_nn_requant_scale(kiln_dtype dt, double a_scale, double b_scale, double y_scale)
{
    return round_to(dt, round_to(dt, a_scale * b_scale) / y_scale);
}

void kiln_nn_store_quantized(kiln_value *y, int64_t i, double v, int64_t zp)
{
    double q = nearbyint(v) + (double)zp;
    double lo = 0, hi = 255;
    switch (y->dtype) {
    case KILN_DTYPE_INT8: lo = -128, hi = 127; break;
    case KILN_DTYPE_UINT16: lo = 0, hi = 65535; break;
    case KILN_DTYPE_INT16: lo = -32768, hi = 32767; break;
    default: break;
    }
    if (isnan(q)) q = 0;
    kiln_store_f64(y->dtype, y->data, i, q < lo ? lo : q > hi ? hi : q);
}

/* One body for both accumulator types; ACC is uint64_t for integers so that overflow wraps. */
#define NN_GEMM_BODY(T, ACC)                                                                                   \
    for (int64_t i = 0; i < M; i++)                                                                            \
        for (int64_t j = 0; j < N; j++) {                                                                      \
            ACC acc = 0;                                                                                       \
            for (int64_t k = 0; k < K; k++) acc += (ACC)a[i * sam + k * sak] * (ACC)b[k * sbk + j * sbn];      \
            y[i * N + j] = (T)acc;                                                                             \
        }

void kiln_nn_gemm_f64(int64_t M, int64_t N, int64_t K, const double *a, int64_t sam, int64_t sak, const double *b,
                 int64_t sbk, int64_t sbn, double *y)
{
    NN_GEMM_BODY(double, double)
}

void kiln_nn_gemm_i64(int64_t M, int64_t N, int64_t K, const int64_t *a, int64_t sam, int64_t sak, const int64_t *b,
                 int64_t sbk, int64_t sbn, int64_t *y)
{
    NN_GEMM_BODY(int64_t, uint64_t)
}
