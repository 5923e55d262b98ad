/* cast.c - Cast, CastLike and BitCast, and the family table kiln_ops_cast, which also lists the
 * quantization (cast_quant.c), string (cast_string.c), ai.onnx.ml (cast_ml.c) and random
 * (cast_random.c) operators. */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ops/cast_internal.h"
#include "ops/util.h"

kiln_status kiln_cast_infer_like(kiln_infer_ctx *c, int out, int in, kiln_dtype dt)
{
    const kiln_type *t = kiln_infer_in(c, in);
    if (!t) return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d is missing", in);
    if (t->kind && t->kind != KILN_VALUE_TENSOR)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d must be a tensor", in);
    if (t->rank < 0) return kiln_infer_set_out_unknown(c, out, dt);
    return kiln_infer_set_out(c, out, dt, t->rank, t->dims);
}

/* ---- conversions ---- */

typedef struct cast_opts {
    bool saturate;          /* float8 targets: clamp out-of-range values to the largest finite */
    kiln_e8m0_round round;  /* FLOAT8E8M0 targets */
} cast_opts;

static bool castable(kiln_dtype dt)
{
    return kiln_dtype_valid(dt) && dt != KILN_DTYPE_COMPLEX64 && dt != KILN_DTYPE_COMPLEX128;
}

/* Shortest decimal that reads back as element i of (dt, base): the repr numpy prints, e.g.
 * "0.1", "1.0", "1e-05", "1.5e+16", "nan", "-inf". */
static void format_float(kiln_dtype dt, const void *base, int64_t i, char *out, size_t size)
{
    double v = kiln_load_f64(dt, base, i);
    if (isnan(v)) {
        snprintf(out, size, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(out, size, v < 0 ? "-inf" : "inf");
        return;
    }
    char sci[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, v);
        uint64_t want = 0, got = 0;
        kiln_store_f64(dt, &want, 0, v);
        kiln_store_f64(dt, &got, 0, strtod(sci, NULL));
        if (want == got) break;
    }
    /* sci is "-d.ddde+XX": split into sign, significant digits and exponent */
    const char *s = sci;
    bool neg = *s == '-';
    if (neg) s++;
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (isdigit((unsigned char)*s)) digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int exp10 = atoi(s + 1);
    size_t n = 0;
    char buf[64];
    if (neg) buf[n++] = '-';
    if (v != 0 && (fabs(v) < 1e-4 || fabs(v) >= 1e16)) {
        buf[n++] = digits[0];
        if (nd > 1) {
            buf[n++] = '.';
            for (int k = 1; k < nd; k++) buf[n++] = digits[k];
        }
        snprintf(buf + n, sizeof buf - n, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (exp10 < 0) {
        buf[n++] = '0';
        buf[n++] = '.';
        for (int k = 0; k < -exp10 - 1; k++) buf[n++] = '0';
        for (int k = 0; k < nd; k++) buf[n++] = digits[k];
        buf[n] = '\0';
    } else {
        for (int k = 0; k <= exp10; k++) buf[n++] = k < nd ? digits[k] : '0';
        buf[n++] = '.';
        if (nd <= exp10 + 1) buf[n++] = '0';
        for (int k = exp10 + 1; k < nd; k++) buf[n++] = digits[k];
        buf[n] = '\0';
    }
    snprintf(out, size, "%s", buf);
}

/* Element i of X as text, the way numpy's astype(str) prints it. */
static void format_elem(const kiln_value *X, int64_t i, char *out, size_t size)
{
    kiln_dtype dt = X->dtype;
    if (dt == KILN_DTYPE_BOOL) snprintf(out, size, "%s", ((const uint8_t *)X->data)[i] ? "True" : "False");
    else if (dt == KILN_DTYPE_UINT64) snprintf(out, size, "%" PRIu64, ((const uint64_t *)X->data)[i]);
    else if (kiln_dtype_is_int(dt)) snprintf(out, size, "%" PRId64, kiln_load_i64(dt, X->data, i));
    else format_float(dt, X->data, i, out, size);
}

/* Parses s into element j of (dt, base): integers exactly when s is an integer literal,
 * otherwise through double ("INF", "-inf", "NaN" in any case included). */
static void parse_elem(const char *s, kiln_dtype dt, void *base, int64_t j)
{
    char *end;
    if (kiln_dtype_is_int(dt)) {
        if (kiln_dtype_is_unsigned_int(dt) && *s != '-') {
            uint64_t u = strtoull(s, &end, 10);
            if (end != s && !*end) {
                kiln_store_u64(dt, base, j, u);
                return;
            }
        } else {
            int64_t v = strtoll(s, &end, 10);
            if (end != s && !*end) {
                kiln_store_i64(dt, base, j, v);
                return;
            }
        }
    }
    kiln_store_f64(dt, base, j, strtod(s, NULL));
}

/* Y[j] = X[i] converted to Y's dtype. Both are numeric or bool (strings are handled by the
 * caller). Integer-to-integer conversions stay exact (wrapping as two's complement). */
static void convert_elem(const kiln_value *X, int64_t i, kiln_value *Y, int64_t j, const cast_opts *o)
{
    kiln_dtype sd = X->dtype, dd = Y->dtype;
    bool s_int = kiln_dtype_is_int(sd) || sd == KILN_DTYPE_BOOL;
    bool d_int = kiln_dtype_is_int(dd) || dd == KILN_DTYPE_BOOL;
    if (s_int && d_int) {
        if (sd == KILN_DTYPE_UINT64) kiln_store_u64(dd, Y->data, j, kiln_load_u64(sd, X->data, i));
        else kiln_store_i64(dd, Y->data, j, kiln_load_i64(sd, X->data, i));
        return;
    }
    if (s_int && sd == KILN_DTYPE_UINT64) {
        kiln_store_u64(dd, Y->data, j, kiln_load_u64(sd, X->data, i));
        return;
    }
    double v = kiln_load_f64(sd, X->data, i);
    if (dd == KILN_DTYPE_FLOAT8E8M0)
        ((uint8_t *)Y->data)[j] = kiln_e8m0_from_f32((float)v, o->saturate, o->round);
    else if (kiln_dtype_is_lowp_float(dd))
        ((uint8_t *)Y->data)[j] = kiln_lowp_from_f32(dd, (float)v, o->saturate);
    else kiln_store_f64(dd, Y->data, j, v);
}

/* Converts all of X into Y (same numel). */
static kiln_status convert_all(kiln_run_ctx *c, const kiln_value *X, kiln_value *Y, const cast_opts *o)
{
    char buf[64];
    for (int64_t i = 0; i < X->numel; i++) {
        if (Y->dtype == KILN_DTYPE_STRING) {
            if (X->dtype == KILN_DTYPE_STRING) {
                const char *s = ((char *const *)X->data)[i];
                KILN_TRY(kiln_tensor_set_string(Y, i, s, strlen(s), kiln_run_err(c)));
                continue;
            }
            format_elem(X, i, buf, sizeof buf);
            KILN_TRY(kiln_tensor_set_string(Y, i, buf, strlen(buf), kiln_run_err(c)));
        } else if (X->dtype == KILN_DTYPE_STRING) {
            parse_elem(((char *const *)X->data)[i], Y->dtype, Y->data, i);
        } else {
            convert_elem(X, i, Y, i, o);
        }
    }
    return KILN_OK;
}

static kiln_status cast_opts_of(const kiln_node *n, cast_opts *o)
{
    o->saturate = kiln_attr_int(n, "saturate", 1) != 0;
    const char *mode = kiln_attr_string(n, "round_mode", "up");
    if (!strcmp(mode, "up")) o->round = KILN_E8M0_ROUND_UP;
    else if (!strcmp(mode, "down")) o->round = KILN_E8M0_ROUND_DOWN;
    else if (!strcmp(mode, "nearest")) o->round = KILN_E8M0_ROUND_NEAREST;
    else return KILN_ERR_MODEL;
    return KILN_OK;
}

/* ---- Cast, CastLike ---- */

/* The `to` attribute: a TensorProto.DataType code, or its name ("FLOAT") in Cast-1. */
static kiln_dtype cast_target(const kiln_node *n)
{
    static const char *const names[KILN_DTYPE_COUNT_] = {
        "UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING", "BOOL",
        "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16",
    };
    const kiln_attr *a = kiln_node_attr(n, "to");
    if (!a) return KILN_DTYPE_UNDEFINED;
    if (a->type != KILN_ATTR_STRING) return (kiln_dtype)a->i;
    for (int k = 1; k < KILN_DTYPE_COUNT_; k++)
        if (names[k] && !strcasecmp(a->s, names[k])) return (kiln_dtype)k;
    return KILN_DTYPE_UNDEFINED;
}

static kiln_status cast_check(kiln_infer_ctx *c, kiln_dtype to)
{
    cast_opts o = {0};
    if (cast_opts_of(kiln_infer_node(c), &o))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "round_mode must be up, down or nearest");
    if (!castable(to)) return kiln_infer_fail(c, KILN_ERR_MODEL, "cannot cast to type %d", (int)to);
    const kiln_type *t = kiln_infer_in(c, 0);
    if (t && t->dtype && !castable(t->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "cannot cast from %s", kiln_dtype_name(t->dtype));
    return KILN_OK;
}

static kiln_status cast_infer(kiln_infer_ctx *c)
{
    kiln_dtype to = cast_target(kiln_infer_node(c));
    KILN_TRY(cast_check(c, to));
    KILN_TRY(kiln_cast_infer_like(c, 0, 0, to));
    /* shape vectors stay shape vectors through integer casts */
    const kiln_type *t = kiln_infer_in(c, 0);
    kiln_dim dims[KILN_MAX_RANK];
    int n;
    if (kiln_infer_dims(c) && kiln_dtype_is_int(t->dtype) && kiln_dtype_is_int(to) &&
        kiln_dtype_size(to) >= 4 && kiln_infer_in_dims_value(c, 0, dims, KILN_MAX_RANK, &n))
        KILN_TRY(kiln_infer_set_out_dims_value(c, 0, dims, n));
    return KILN_OK;
}

static kiln_status cast_run(kiln_run_ctx *c)
{
    cast_opts o = {0};
    cast_opts_of(kiln_run_node(c), &o);
    return convert_all(c, kiln_run_in(c, 0), kiln_run_out(c, 0), &o);
}

static kiln_status castlike_infer(kiln_infer_ctx *c)
{
    const kiln_type *like = kiln_infer_in(c, 1);
    if (!like) return kiln_infer_fail(c, KILN_ERR_MODEL, "input 1 (target_type) is missing");
    if (!like->dtype) return kiln_cast_infer_like(c, 0, 0, KILN_DTYPE_UNDEFINED);
    KILN_TRY(cast_check(c, like->dtype));
    return kiln_cast_infer_like(c, 0, 0, like->dtype);
}

/* ---- BitCast ---- */

static kiln_status bitcast_infer(kiln_infer_ctx *c)
{
    kiln_dtype to = (kiln_dtype)kiln_attr_int(kiln_infer_node(c), "to", 0);
    const kiln_type *t = kiln_infer_in(c, 0);
    if (!castable(to) || to == KILN_DTYPE_STRING)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "cannot bit-cast to type %d", (int)to);
    if (t && t->dtype) {
        if (t->dtype == KILN_DTYPE_STRING || !castable(t->dtype))
            return kiln_infer_fail(c, KILN_ERR_MODEL, "cannot bit-cast from %s", kiln_dtype_name(t->dtype));
        if (kiln_dtype_size(t->dtype) != kiln_dtype_size(to))
            return kiln_infer_fail(c, KILN_ERR_MODEL, "bit-cast from %s to %s changes the element width",
                                   kiln_dtype_name(t->dtype), kiln_dtype_name(to));
    }
    return kiln_cast_infer_like(c, 0, 0, to);
}

static kiln_status bitcast_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (X->nbytes) memcpy(Y->data, X->data, X->nbytes);
    if (Y->dtype == KILN_DTYPE_BOOL) /* keep bool bytes 0/1 */
        for (int64_t i = 0; i < Y->numel; i++) ((uint8_t *)Y->data)[i] = ((uint8_t *)Y->data)[i] != 0;
    return KILN_OK;
}

#define ENTRY(domain, op, name) {domain, op, 1, kiln_cast_##name##_infer, kiln_cast_##name##_run}
#define ENTRY_NO_X(domain, op, name) \
    {domain, op, 1, kiln_cast_##name##_infer, kiln_cast_##name##_run, KILN_OP_X_OPTIONAL}
#define ENTRY_RANDOM(domain, op, name, flags) \
    {domain, op, 1, kiln_cast_##name##_infer, kiln_cast_##name##_run, KILN_OP_RANDOM | (flags)}

static const kiln_op_def defs[] = {
    {"", "Cast", 1, cast_infer, cast_run},
    {"", "CastLike", 1, castlike_infer, cast_run},
    {"", "BitCast", 1, bitcast_infer, bitcast_run},
    ENTRY("", "QuantizeLinear", quantize),
    ENTRY("", "DequantizeLinear", dequantize),
    ENTRY("", "DynamicQuantizeLinear", dynquant),
    ENTRY("", "StringNormalizer", strnorm),
    ENTRY("", "StringSplit", strsplit),
    ENTRY("", "StringConcat", strconcat),
    ENTRY("", "RegexFullMatch", regex),
    ENTRY("", "TfIdfVectorizer", tfidf),
    ENTRY("ai.onnx.ml", "LabelEncoder", label_encoder),
    ENTRY("ai.onnx.ml", "ArrayFeatureExtractor", array_feature),
    ENTRY("ai.onnx.ml", "Binarizer", binarizer),
    ENTRY("ai.onnx.ml", "TreeEnsemble", tree_ensemble),
    ENTRY_RANDOM("", "RandomUniform", random_uniform, KILN_OP_X_OPTIONAL),
    ENTRY_RANDOM("", "RandomNormal", random_normal, KILN_OP_X_OPTIONAL),
    ENTRY_RANDOM("", "RandomUniformLike", random_uniform_like, 0),
    ENTRY_RANDOM("", "RandomNormalLike", random_normal_like, 0),
    ENTRY_RANDOM("", "Bernoulli", bernoulli, 0),
    ENTRY_RANDOM("", "Multinomial", multinomial, 0),
};

const kiln_op_table kiln_ops_cast = {defs, sizeof defs / sizeof defs[0]};
