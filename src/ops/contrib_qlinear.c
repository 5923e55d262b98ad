/* contrib_qlinear.c - com.microsoft quantized element-wise and pooling operators that
 * quantize_static (QOperator format) writes: QLinearAdd, QLinearMul (8-bit, numpy broadcast),
 * QLinearSigmoid, QLinearLeakyRelu (256-entry lookup tables), QLinearConcat (inputs
 * requantized to Y's parameters) and QLinearGlobalAveragePool. The float steps follow ONNX
 * Runtime's MLAS kernels on x86 in float32, operation by operation, so the integers come out
 * bit for bit as ORT's: dequantize (x - zp) * scale, quantize clamp(round_half_even(clamp(x /
 * scale, lo - zp, hi - zp)) + zp), sigmoid by MLAS's rational approximation (with FMA),
 * QLinearAdd by its AVX2 kernel's fused multiply-adds, QLinearMul by its SSE2 kernel (no FMA). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/contrib_internal.h"
#include "ops/quant_internal.h"
#include "ops/semantics.h"
#include "ops/util.h"

static bool is_q8(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

/* lo, hi of an 8-bit type */
static void q8_range(kiln_dtype dt, int *lo, int *hi)
{
    *lo = dt == KILN_DTYPE_INT8 ? -128 : 0;
    *hi = dt == KILN_DTYPE_INT8 ? 127 : 255;
}

static int q8_load(kiln_dtype dt, const void *p, int64_t i)
{
    return dt == KILN_DTYPE_INT8 ? ((const int8_t *)p)[i] : ((const uint8_t *)p)[i];
}

static void q8_store(kiln_dtype dt, void *p, int64_t i, int v)
{
    if (dt == KILN_DTYPE_INT8) ((int8_t *)p)[i] = (int8_t)v;
    else ((uint8_t *)p)[i] = (uint8_t)v;
}

/* MLAS's QuantizeLinear of one float */
static int quantize(float x, float scale, int zp, int lo, int hi)
{
    float v = x / scale;
    float a = (float)(lo - zp), b = (float)(hi - zp);
    v = v < a ? a : v; /* NaN: stays, rounds to the integer indefinite, then clamps */
    v = v > b ? b : v;
    long r = lrintf(v) + zp;
    return r < lo ? lo : r > hi ? hi : (int)r;
}

/* A scale (float32 scalar) and an optional zero point (scalar of dtype dt) */
static bool qparams_ok(const kiln_value *s, const kiln_value *z, kiln_dtype dt)
{
    if (!s || s->dtype != KILN_DTYPE_FLOAT32 || s->numel != 1) return false;
    return !z || (z->dtype == dt && z->numel == 1);
}

static bool qparams(const kiln_value *s, const kiln_value *z, kiln_dtype dt, float *scale, int *zp)
{
    if (!qparams_ok(s, z, dt)) return false;
    *scale = *(const float *)s->data;
    *zp = z ? q8_load(dt, z->data, 0) : 0;
    return true;
}

bool kiln_contrib_q8_params_ok(const kiln_value *s, const kiln_value *z, kiln_dtype dt)
{
    return is_q8(dt) && qparams_ok(s, z, dt);
}

bool kiln_contrib_q8_params(const kiln_value *s, const kiln_value *z, kiln_dtype dt, float *scale, int *zp)
{
    return is_q8(dt) && qparams(s, z, dt, scale, zp);
}

static kiln_status qparams_fail(kiln_run_ctx *c, const char *what, kiln_dtype dt)
{
    return kiln_run_fail(c, KILN_ERR_SHAPE, "%s: scale must be a float32 scalar and the zero point a %s scalar", what,
                         kiln_dtype_name(dt));
}

/* ---- QLinearAdd / QLinearMul: A, A_scale, A_zp?, B, B_scale, B_zp?, C_scale, C_zp? -> C ---- */

static kiln_status binary_infer(kiln_infer_ctx *c)
{
    const kiln_type *a = kiln_infer_in(c, 0), *b = kiln_infer_in(c, 3);
    if (!a || !b || !kiln_infer_in(c, 1) || !kiln_infer_in(c, 4) || !kiln_infer_in(c, 6))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs A, A_scale, B, B_scale and C_scale");
    if (a->dtype && (!is_q8(a->dtype) || (b->dtype && b->dtype != a->dtype)))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "A and B must both be uint8 or both int8 (A %s, B %s)",
                               kiln_dtype_name(a->dtype), kiln_dtype_name(b->dtype));
    const kiln_type *ins[2] = {a, b};
    int rank;
    kiln_dim dims[KILN_MAX_RANK];
    KILN_TRY(kiln_infer_broadcast(c, 2, ins, &rank, dims));
    if (rank < 0) return kiln_infer_set_out_unknown(c, 0, a->dtype);
    return kiln_infer_set_out(c, 0, a->dtype, rank, dims);
}

bool kiln_contrib_qbinary_swaps(const kiln_value *A, const kiln_value *C)
{
    int k = C->rank - 1;
    while (k >= 0 && C->dims[k] == 1) k--;
    int ka = k - (C->rank - A->rank);
    return k < 0 || ka < 0 || A->dims[ka] == 1;
}

static kiln_status binary_run(kiln_run_ctx *c, bool mul)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 3);
    kiln_value *C = kiln_run_out(c, 0);
    kiln_dtype dt = A->dtype;
    float sa, sb, sc;
    int za, zb, zc, lo, hi;
    if (B->dtype != dt || !is_q8(dt)) return kiln_run_fail(c, KILN_ERR_MODEL, "A and B must be one 8-bit type");
    if (!qparams(kiln_run_in(c, 1), kiln_run_in(c, 2), dt, &sa, &za)) return qparams_fail(c, "A", dt);
    if (!qparams(kiln_run_in(c, 4), kiln_run_in(c, 5), dt, &sb, &zb)) return qparams_fail(c, "B", dt);
    if (!qparams(kiln_run_in(c, 6), kiln_run_in(c, 7), dt, &sc, &zc)) return qparams_fail(c, "C", dt);
    q8_range(dt, &lo, &hi);
    int64_t st[2][KILN_MAX_RANK];
    kiln_bcast_strides(C->rank, C->dims, A->rank, A->dims, st[0]);
    kiln_bcast_strides(C->rank, C->dims, B->rank, B->dims, st[1]);
    kiln_iter it;
    kiln_iter_init(&it, C->rank, C->dims, 2, st);
    /* x, y: ORT's kernel's first and second operand, A and B or exchanged; its fixed part of Add's
     * sum as GCC contracts it, fma(rx, zx, ry * zy) */
    bool swap = kiln_contrib_qbinary_swaps(A, C);
    float sx = swap ? sb : sa, sy = swap ? sa : sb;
    int zx = swap ? zb : za, zy = swap ? za : zb;
    float rx = sx / sc, ry = sy / sc, rmul = sa * sb / sc;
    float fixed = (float)zc - fmaf(rx, (float)zx, ry * (float)zy);
    for (int64_t i = 0; i < C->numel; i++, kiln_iter_next(&it)) {
        int a = q8_load(dt, A->data, it.off[0]), b = q8_load(dt, B->data, it.off[1]);
        int x = swap ? b : a, y = swap ? a : b;
        /* Mul: a product, then a sum (not fused: no FMA on baseline x86-64); Add: two fused multiply-adds */
        float v = mul ? (float)((x - zx) * (y - zy)) * rmul + (float)zc : fmaf((float)x, rx, fmaf((float)y, ry, fixed));
        v = v > (float)(lo - 1) ? v : (float)(lo - 1); /* NaN: the low end */
        v = v < (float)(hi + 1) ? v : (float)(hi + 1);
        long q = lrintf(v);
        q8_store(dt, C->data, i, q < lo ? lo : q > hi ? hi : (int)q);
    }
    return KILN_OK;
}

static kiln_status qadd_run(kiln_run_ctx *c) { return binary_run(c, false); }
static kiln_status qmul_run(kiln_run_ctx *c) { return binary_run(c, true); }

/* ---- lookup-table ops: X, X_scale, X_zp?, Y_scale, Y_zp? -> Y ---- */

static kiln_status unary_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x || !kiln_infer_in(c, 1) || !kiln_infer_in(c, 3))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X, X_scale and Y_scale");
    if (x->dtype && !is_q8(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "X is %s, expected uint8 or int8", kiln_dtype_name(x->dtype));
    return kiln_infer_same_as_input(c, 0, 0);
}

/* MLAS's logistic (logistic.cpp / its FMA3 kernel): a rational approximation on [-18, 18] */
static float mlas_logistic(float x)
{
    x = x < -18.0f ? -18.0f : x > 18.0f ? 18.0f : x;
    float x2 = x * x;
    float p = fmaf(x2, 4.37031012579801e-11f, 1.15627324459942e-07f);
    p = fmaf(x2, p, 6.08574864600143e-05f);
    p = fmaf(x2, p, 8.51377133304701e-03f);
    p = fmaf(x2, p, 2.48287947061529e-01f);
    float q = fmaf(x2, 6.10247389755681e-13f, 5.76102136993427e-09f);
    q = fmaf(x2, q, 6.29106785017040e-06f);
    q = fmaf(x2, q, 1.70198817374094e-03f);
    q = fmaf(x2, q, 1.16817656904453e-01f);
    q = fmaf(x2, q, 9.93151921023180e-01f);
    float y = x * p / q + 0.5f;
    return y < 0.0f ? 0.0f : y;
}

typedef float (*lut_fn)(float x, float alpha);
static float lut_sigmoid(float x, float alpha) { (void)alpha; return mlas_logistic(x); }
static float lut_leaky(float x, float alpha) { return x >= 0 ? x : x * alpha; }
static float lut_identity(float x, float alpha) { (void)alpha; return x; }

/* table[v - lo] = quantize(f(dequantize(v))) for every 8-bit v */
static void lut_build(uint8_t table[256], kiln_dtype dt, float xs, int xz, float ys, int yz, lut_fn f, float alpha)
{
    int lo, hi;
    q8_range(dt, &lo, &hi);
    for (int v = lo; v <= hi; v++) {
        int q = quantize(f((float)(v - xz) * xs, alpha), ys, yz, lo, hi);
        table[v - lo] = (uint8_t)(q - lo);
    }
}

static void lut_apply(const uint8_t table[256], kiln_dtype dt, const void *x, void *y, int64_t n)
{
    int lo, hi;
    q8_range(dt, &lo, &hi);
    for (int64_t i = 0; i < n; i++) q8_store(dt, y, i, table[q8_load(dt, x, i) - lo] + lo);
}

bool kiln_contrib_q8_unary_table(const kiln_node *n, kiln_dtype dt, const kiln_value *xs, const kiln_value *xz,
                                 const kiln_value *ys, const kiln_value *yz, uint8_t table[256])
{
    float xsv, ysv;
    int xzv, yzv;
    if (!is_q8(dt) || !qparams(xs, xz, dt, &xsv, &xzv) || !qparams(ys, yz, dt, &ysv, &yzv)) return false;
    if (!strcmp(n->op_type, "QLinearLeakyRelu")) lut_build(table, dt, xsv, xzv, ysv, yzv, lut_leaky, kiln_attr_float(n, "alpha", 0.01f));
    else lut_build(table, dt, xsv, xzv, ysv, yzv, lut_sigmoid, 0.0f);
    return true;
}

/* QLinearSigmoid, QLinearLeakyRelu */
static kiln_status lut_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!is_q8(X->dtype)) return kiln_run_fail(c, KILN_ERR_MODEL, "X must be uint8 or int8");
    if (!qparams_ok(kiln_run_in(c, 1), kiln_run_in(c, 2), X->dtype)) return qparams_fail(c, "X", X->dtype);
    if (!qparams_ok(kiln_run_in(c, 3), kiln_run_in(c, 4), X->dtype)) return qparams_fail(c, "Y", X->dtype);
    uint8_t table[256];
    kiln_contrib_q8_unary_table(kiln_run_node(c), X->dtype, kiln_run_in(c, 1), kiln_run_in(c, 2), kiln_run_in(c, 3),
                                kiln_run_in(c, 4), table);
    lut_apply(table, X->dtype, X->data, Y->data, X->numel);
    return KILN_OK;
}

/* ---- QLinearConcat: Y_scale, Y_zp, then (X, X_scale, X_zp) per input -> Y ---- */

static kiln_status qconcat_infer(kiln_infer_ctx *c)
{
    int n = kiln_infer_n_in(c);
    if (n < 5 || (n - 2) % 3) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs Y_scale, Y_zero_point and (X, scale, zero point) triples, has %d inputs", n);
    const kiln_type *x0 = kiln_infer_in(c, 2);
    if (!x0) return kiln_infer_fail(c, KILN_ERR_MODEL, "first input is absent");
    int rank = x0->rank;
    int64_t axis = kiln_attr_int(kiln_infer_node(c), "axis", 0);
    if (rank < 0) return kiln_infer_set_out_unknown(c, 0, x0->dtype);
    int ax;
    if (!kiln_axis_norm(axis, rank, &ax)) return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld out of range for rank %d", (long long)axis, rank);
    kiln_dim dims[KILN_MAX_RANK];
    memcpy(dims, x0->dims, (size_t)rank * sizeof *dims);
    for (int i = 5; i < n; i += 3) {
        const kiln_type *x = kiln_infer_in(c, i);
        if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d is absent", i);
        if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x0->dtype);
        if (x->rank != rank) return kiln_infer_fail(c, KILN_ERR_SHAPE, "input %d has rank %d, the first %d", i, x->rank, rank);
        if (x->dtype && x0->dtype && x->dtype != x0->dtype) return kiln_infer_fail(c, KILN_ERR_MODEL, "inputs of different types");
        for (int k = 0; k < rank; k++) {
            if (k == ax) dims[k] = kiln_dim_add(kiln_infer_dims(c), dims[k], x->dims[k]);
            else KILN_TRY(kiln_infer_require_equal(c, x->dims[k], x0->dims[k], "concatenated dims off the axis"));
        }
    }
    return kiln_infer_set_out(c, 0, x0->dtype, rank, dims);
}

static kiln_status qconcat_run(kiln_run_ctx *c)
{
    int n = kiln_run_n_in(c);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_dtype dt = Y->dtype;
    float ys;
    int yz, ax;
    if (!is_q8(dt) || !qparams(kiln_run_in(c, 0), kiln_run_in(c, 1), dt, &ys, &yz)) return qparams_fail(c, "Y", dt);
    if (!kiln_axis_norm(kiln_attr_int(kiln_run_node(c), "axis", 0), Y->rank, &ax))
        return kiln_run_fail(c, KILN_ERR_MODEL, "axis out of range");
    int64_t outer = 1, inner = 1, at = 0;
    for (int k = 0; k < ax; k++) outer *= Y->dims[k];
    for (int k = ax + 1; k < Y->rank; k++) inner *= Y->dims[k];
    for (int i = 2; i < n; i += 3) {
        const kiln_value *X = kiln_run_in(c, i);
        float xs;
        int xz;
        if (!X || X->dtype != dt || X->rank != Y->rank) return kiln_run_fail(c, KILN_ERR_SHAPE, "input %d does not match Y", i);
        if (!qparams(kiln_run_in(c, i + 1), kiln_run_in(c, i + 2), dt, &xs, &xz)) return qparams_fail(c, "input", dt);
        int64_t len = X->dims[ax] * inner;
        bool same = xs == ys && xz == yz;
        uint8_t table[256];
        if (!same) lut_build(table, dt, xs, xz, ys, yz, lut_identity, 0.0f);
        for (int64_t o = 0; o < outer; o++) {
            const uint8_t *src = (const uint8_t *)X->data + o * len;
            uint8_t *dst = (uint8_t *)Y->data + o * Y->dims[ax] * inner + at;
            if (same) memcpy(dst, src, (size_t)len);
            else lut_apply(table, dt, src, dst, len);
        }
        at += len;
    }
    return KILN_OK;
}

/* ---- QLinearGlobalAveragePool: X, x_scale, x_zp, y_scale, y_zp -> Y, NCHW or channels_last ---- */

static kiln_status qgap_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x || !kiln_infer_in(c, 1) || !kiln_infer_in(c, 3)) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X, x_scale and y_scale");
    if (x->dtype && !is_q8(x->dtype)) return kiln_infer_fail(c, KILN_ERR_MODEL, "X must be uint8 or int8");
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    if (x->rank < 3) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must have rank >= 3, has %d", x->rank);
    bool last = kiln_attr_int(kiln_infer_node(c), "channels_last", 0) != 0;
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0; k < x->rank; k++) {
        bool spatial = last ? (k >= 1 && k < x->rank - 1) : k >= 2;
        dims[k] = spatial ? kiln_dim_const(1) : x->dims[k];
    }
    return kiln_infer_set_out(c, 0, x->dtype, x->rank, dims);
}

static kiln_status qgap_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_dtype dt = X->dtype;
    float xs, ys;
    int xz, yz, lo, hi;
    if (!is_q8(dt)) return kiln_run_fail(c, KILN_ERR_MODEL, "X must be uint8 or int8");
    if (!qparams(kiln_run_in(c, 1), kiln_run_in(c, 2), dt, &xs, &xz)) return qparams_fail(c, "x", dt);
    if (!qparams(kiln_run_in(c, 3), kiln_run_in(c, 4), dt, &ys, &yz)) return qparams_fail(c, "y", dt);
    q8_range(dt, &lo, &hi);
    bool last = kiln_attr_int(kiln_run_node(c), "channels_last", 0) != 0;
    int64_t N = X->dims[0], C = last ? X->dims[X->rank - 1] : X->dims[1], img = 1;
    for (int k = last ? 1 : 2; k < (last ? X->rank - 1 : X->rank); k++) img *= X->dims[k];
    if (!img) return kiln_run_fail(c, KILN_ERR_SHAPE, "X has an empty image");
    /* MLAS: an int32 sum less zp * size, scaled by x_scale / (y_scale * size) */
    float scale = xs / (ys * (float)img);
    for (int64_t b = 0; b < N; b++)
        for (int64_t ch = 0; ch < C; ch++) {
            int64_t acc = -(int64_t)xz * img;
            for (int64_t p = 0; p < img; p++)
                acc += q8_load(dt, X->data, last ? (b * img + p) * C + ch : (b * C + ch) * img + p);
            q8_store(dt, Y->data, b * C + ch, quantize((float)(int32_t)acc * scale, 1.0f, yz, lo, hi));
        }
    return KILN_OK;
}

#define MS "com.microsoft"
#define UNARY_HOST (KILN_OP_IN(1) | KILN_OP_IN(2) | KILN_OP_IN(3) | KILN_OP_IN(4))
static const kiln_op_def defs[] = {
    {MS, "QLinearAdd", 1, binary_infer, qadd_run},
    {MS, "QLinearMul", 1, binary_infer, qmul_run},
    /* the scales and zero points on the host: a device provider builds the table there */
    {MS, "QLinearSigmoid", 1, unary_infer, lut_run, 0, UNARY_HOST},
    {MS, "QLinearLeakyRelu", 1, unary_infer, lut_run, 0, UNARY_HOST},
    {MS, "QLinearConcat", 1, qconcat_infer, qconcat_run},
    {MS, "QLinearGlobalAveragePool", 1, qgap_infer, qgap_run},
};

const kiln_op_table kiln_ops_contrib_qlinear = {defs, sizeof defs / sizeof defs[0]};
