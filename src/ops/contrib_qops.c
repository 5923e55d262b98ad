/* contrib_qops.c - the com.microsoft quantized operators quantize_static's QOperator format writes
 * beyond contrib_qlinear.c: QGemm (8-bit Gemm with an int32 bias, requantized or float output),
 * QLinearSoftmax (ONNX Runtime's lookup-table softmax) and QLinearAveragePool (dequantized
 * average, requantized). Float steps in float32 in ORT's order, so the integers match its CPU
 * kernels: QGemm requantizes as MLAS does (acc * scale clamped to [lo - zp, hi - zp], rounded half
 * to even, plus zp) with scale = alpha * a_scale * b_scale[col] / y_scale. */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/nn_internal.h"
#include "ops/op.h"
#include "ops/quant_internal.h"
#include "ops/util.h"

static bool is_q8(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

static int q8_load(kiln_dtype dt, const void *p, int64_t i)
{
    return dt == KILN_DTYPE_INT8 ? ((const int8_t *)p)[i] : ((const uint8_t *)p)[i];
}

static void q8_store(kiln_dtype dt, void *p, int64_t i, int v)
{
    if (dt == KILN_DTYPE_INT8) ((int8_t *)p)[i] = (int8_t)v;
    else ((uint8_t *)p)[i] = (uint8_t)v;
}

static void q8_range(kiln_dtype dt, int *lo, int *hi)
{
    *lo = dt == KILN_DTYPE_INT8 ? -128 : 0;
    *hi = dt == KILN_DTYPE_INT8 ? 127 : 255;
}

/* v (already divided by the output scale) clamped, rounded half to even, plus zp: MLAS's requantize */
static int requant(float v, int zp, int lo, int hi)
{
    float a = (float)(lo - zp), b = (float)(hi - zp);
    v = v < a ? a : v;
    v = v > b ? b : v;
    long r = lrintf(v) + zp;
    return r < lo ? lo : r > hi ? hi : (int)r;
}

static bool scalar_f32(const kiln_value *v, float *out)
{
    if (!v || v->dtype != KILN_DTYPE_FLOAT32 || v->numel != 1) return false;
    *out = *(const float *)v->data;
    return true;
}

static bool scalar_q8(const kiln_value *v, kiln_dtype dt, int *out)
{
    if (!v) {
        *out = 0;
        return true;
    }
    if (v->dtype != dt || v->numel != 1) return false;
    *out = q8_load(dt, v->data, 0);
    return true;
}

/* ---- QGemm: A, a_scale, a_zp, B, b_scale, b_zp, C?, y_scale?, y_zp? -> Y [M, N] ---- */

static kiln_status qgemm_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *a = kiln_infer_in(c, 0), *b = kiln_infer_in(c, 3), *yz = kiln_infer_in(c, 8);
    if (!a || !b || !kiln_infer_in(c, 1) || !kiln_infer_in(c, 2) || !kiln_infer_in(c, 4) || !kiln_infer_in(c, 5))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs A, a_scale, a_zero_point, B, b_scale and b_zero_point");
    if ((a->dtype && !is_q8(a->dtype)) || (b->dtype && !is_q8(b->dtype)))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "A and B must be 8-bit");
    if (!!kiln_infer_in(c, 7) != !!yz) return kiln_infer_fail(c, KILN_ERR_MODEL, "y_scale and y_zero_point go together");
    kiln_dtype dt = yz ? yz->dtype : KILN_DTYPE_FLOAT32;
    if (a->rank < 0 || b->rank < 0) return kiln_infer_set_out_unknown(c, 0, dt);
    if (a->rank != 2 || b->rank != 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "A and B must be 2-D (ranks %d, %d)", a->rank, b->rank);
    int ta = kiln_attr_int(n, "transA", 0) != 0, tb = kiln_attr_int(n, "transB", 0) != 0;
    KILN_TRY(kiln_infer_require_equal(c, a->dims[ta ? 0 : 1], b->dims[tb ? 1 : 0], "A's K vs B's K"));
    kiln_dim dims[2] = {a->dims[ta ? 1 : 0], b->dims[tb ? 0 : 1]};
    return kiln_infer_set_out(c, 0, dt, 2, dims);
}

bool kiln_contrib_qgemm_check(const kiln_node *n, const kiln_value *const *in, const kiln_value *Y, bool read_scalars,
                              kiln_qgemm_args *g, char *msg, size_t size)
{
    const kiln_value *A = in[0], *as = in[1], *az = in[2], *B = in[3], *bs = in[4], *bz = in[5], *C = in[6], *ys = in[7],
                     *yzv = in[8];
    memset(g, 0, sizeof *g);
    g->ta = kiln_attr_int(n, "transA", 0) != 0, g->tb = kiln_attr_int(n, "transB", 0) != 0;
    g->alpha = kiln_attr_float(n, "alpha", 1.0f), g->y_scale = 1.0f;
    bool ok = as && as->dtype == KILN_DTYPE_FLOAT32 && as->numel == 1 && (!az || (az->dtype == A->dtype && az->numel == 1));
    if (ok && read_scalars) {
        scalar_f32(as, &g->a_scale);
        scalar_q8(az, A->dtype, &g->a_zp);
    }
    if (!ok)
        return snprintf(msg, size, "a_scale must be a float32 scalar and a_zero_point a scalar of A's type"), false;
    int64_t M = A->dims[g->ta ? 1 : 0], K = A->dims[g->ta ? 0 : 1], N = B->dims[g->tb ? 0 : 1];
    g->M = M, g->N = N, g->K = K;
    if (B->dims[g->tb ? 1 : 0] != K)
        return snprintf(msg, size, "A's K %lld vs B's %lld", (long long)K, (long long)B->dims[g->tb ? 1 : 0]), false;
    if (bs->dtype != KILN_DTYPE_FLOAT32 || (bs->numel != 1 && bs->numel != N) || bz->dtype != B->dtype ||
        bz->numel != bs->numel)
        return snprintf(msg, size, "b_scale and b_zero_point must both hold 1 or N = %lld values", (long long)N), false;
    if (C && (C->dtype != KILN_DTYPE_INT32 ||
              !(C->numel == 1 || C->numel == N * M || (C->numel == N && C->dims[C->rank - 1] == N) ||
                (C->numel == M && C->rank == 2 && C->dims[1] == 1))))
        return snprintf(msg, size, "C must be int32 broadcastable to [%lld, %lld]", (long long)M, (long long)N), false;
    if (ys) {
        if (ys->dtype != KILN_DTYPE_FLOAT32 || ys->numel != 1 || !yzv || !is_q8(yzv->dtype) || yzv->numel != 1)
            return snprintf(msg, size, "y_scale must be a float32 scalar and y_zero_point an 8-bit scalar"), false;
        if (read_scalars) {
            scalar_f32(ys, &g->y_scale);
            scalar_q8(yzv, yzv->dtype, &g->y_zp);
        }
        q8_range(Y->dtype, &g->lo, &g->hi);
    }
    return true;
}

static kiln_status qgemm_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *in[9];
    for (int i = 0; i < 9; i++) in[i] = kiln_run_in(c, i);
    const kiln_value *A = in[0], *B = in[3], *bs = in[4], *bz = in[5], *C = in[6], *ys = in[7];
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_qgemm_args g;
    char msg[160];
    if (!kiln_contrib_qgemm_check(n, in, Y, true, &g, msg, sizeof msg)) return kiln_run_fail(c, KILN_ERR_SHAPE, "%s", msg);
    int ta = g.ta, tb = g.tb, az = g.a_zp, yz = g.y_zp, lo = g.lo, hi = g.hi;
    int64_t M = g.M, K = g.K, N = g.N;
    float alpha = g.alpha, as = g.a_scale, ysv = g.y_scale;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            int32_t acc = 0;
            if (C) {
                int64_t ci = C->numel == 1 ? 0 : C->numel == M * N ? i * N + j : C->numel == N ? j : i;
                acc = ((const int32_t *)C->data)[ci];
            }
            int64_t q = bs->numel == 1 ? 0 : j;
            int zb = q8_load(B->dtype, bz->data, q);
            uint32_t sum = 0; /* wraps as the int32 accumulator does */
            for (int64_t k = 0; k < K; k++) {
                int a = q8_load(A->dtype, A->data, ta ? k * M + i : i * K + k) - az;
                int b = q8_load(B->dtype, B->data, tb ? j * K + k : k * N + j) - zb;
                sum += (uint32_t)(a * b);
            }
            acc = (int32_t)((uint32_t)acc + sum);
            float scale = alpha * as * ((const float *)bs->data)[q];
            if (ys) {
                scale /= ysv;
                q8_store(Y->dtype, Y->data, i * N + j, requant((float)acc * scale, yz, lo, hi));
            } else {
                ((float *)Y->data)[i * N + j] = (float)acc * scale;
            }
        }
    return KILN_OK;
}

/* ---- QLinearSoftmax: X, X_scale, X_zp?, Y_scale, Y_zp? -> Y; attributes axis, opset ---- */

static kiln_status qsoftmax_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x || !kiln_infer_in(c, 1) || !kiln_infer_in(c, 3)) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X, X_scale and Y_scale");
    if (x->dtype && !is_q8(x->dtype)) return kiln_infer_fail(c, KILN_ERR_MODEL, "X must be uint8 or int8");
    if (!kiln_node_attr(kiln_infer_node(c), "opset")) return kiln_infer_fail(c, KILN_ERR_MODEL, "attribute opset is required");
    return kiln_infer_same_as_input(c, 0, 0);
}

/* ORT's table of exp over the 256 codes for rows of d values: float32 entries of
 * exp((i - 255 + shift) * x_scale), shift keeping the row sums below FLT_MAX; signed inputs
 * index it by the byte (i - 128). */
static void softmax_table(float *t, float xs, int64_t d, bool is_signed)
{
    double shift = log((double)(FLT_MAX / (float)d));
    shift = fmax(0.0, shift - 5.0) / xs;
    for (int i = 0; i < 256; i++) t[(uint8_t)(is_signed ? i - 128 : i)] = (float)exp(((double)i - 255 + shift) * (double)xs);
}

kiln_status kiln_contrib_qsoftmax_prepare(const kiln_node *n, const kiln_value *X, const kiln_value *xsv,
                                          const kiln_value *ysv, const kiln_value *yzv, kiln_qsoftmax_args *a, char *msg,
                                          size_t size)
{
    kiln_dtype dt = X->dtype;
    float xs, ys;
    int ax;
    memset(a, 0, offsetof(kiln_qsoftmax_args, table));
    if (!is_q8(dt)) return snprintf(msg, size, "X must be uint8 or int8"), KILN_ERR_MODEL;
    if (!scalar_f32(xsv, &xs) || !scalar_f32(ysv, &ys) || !scalar_q8(yzv, dt, &a->yz))
        return snprintf(msg, size, "scales must be float32 scalars and Y_zero_point a scalar of X's type"), KILN_ERR_SHAPE;
    int64_t opset = kiln_attr_int(n, "opset", 13);
    if (!kiln_axis_norm(kiln_attr_int(n, "axis", opset < 13 ? 1 : -1), X->rank, &ax))
        return snprintf(msg, size, "axis out of range for rank %d", X->rank), KILN_ERR_MODEL;
    /* opset < 13: rows are everything from axis on; 13: the axis alone (rows strided by inner) */
    a->outer = a->d = a->inner = 1;
    for (int k = 0; k < ax; k++) a->outer *= X->dims[k];
    if (opset < 13) {
        for (int k = ax; k < X->rank; k++) a->d *= X->dims[k];
    } else {
        a->d = X->dims[ax];
        for (int k = ax + 1; k < X->rank; k++) a->inner *= X->dims[k];
    }
    a->yscale = floorf(1.0f / ys);
    if (X->numel) softmax_table(a->table, xs, a->d, dt == KILN_DTYPE_INT8);
    return KILN_OK;
}

static kiln_status qsoftmax_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_dtype dt = X->dtype;
    kiln_qsoftmax_args a;
    char msg[160];
    kiln_status st = kiln_contrib_qsoftmax_prepare(kiln_run_node(c), X, kiln_run_in(c, 1), kiln_run_in(c, 3), kiln_run_in(c, 4),
                                                   &a, msg, sizeof msg);
    if (st) return kiln_run_fail(c, st, "%s", msg);
    if (!X->numel) return KILN_OK;
    int64_t outer = a.outer, d = a.d, inner = a.inner;
    int yz = a.yz;
    bool sg = dt == KILN_DTYPE_INT8;
    float yscale = a.yscale;
    const float *table = a.table;
    const uint8_t *x = X->data;
    uint8_t *y = Y->data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            int64_t base = o * d * inner + in;
            int xmax = -1000;
            for (int64_t k = 0; k < d; k++) {
                int v = q8_load(dt, x, base + k * inner);
                xmax = v > xmax ? v : xmax;
            }
            /* the code of each element in the table: x + 255 - xmax (unsigned), x + 127 - xmax (signed) */
            int adj = sg ? 127 - xmax : 255 - xmax;
            float sum = 0.0f;
            for (int64_t k = 0; k < d; k++) sum += table[(uint8_t)(q8_load(dt, x, base + k * inner) + adj)];
            /* ORT leaves the rest of its block unwritten; kiln's output stays as allocated. Not reached: the
             * row's maximum indexes an entry >= 1, so the sum is at least 1 or NaN */
            if (sum == 0.0f) return KILN_OK;
            for (int64_t k = 0; k < d; k++) {
                float vt = table[(uint8_t)(q8_load(dt, x, base + k * inner) + adj)];
                /* float32 as ORT; a one-element row's product overflows float, where ORT's build
                 * still yields the quotient: that one in double */
                float prod = vt * yscale;
                float qf = isinf(prod) ? (float)((double)vt * yscale / sum) : prod / sum;
                int32_t vq = (int32_t)nearbyintf(qf) + yz;
                int hi = sg ? 127 : 255, lo = sg ? -128 : 0;
                q8_store(dt, y, base + k * inner, vq > hi ? hi : vq < lo ? lo : vq);
            }
        }
    return KILN_OK;
}

/* ---- QLinearAveragePool: X, x_scale, x_zp?, y_scale, y_zp? -> Y; NCHW or channels_last ---- */

static kiln_status qavgpool_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_nn_geom g;
    char msg[160];
    if (!x || !kiln_infer_in(c, 1) || !kiln_infer_in(c, 3)) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X, x_scale and y_scale");
    if (x->dtype && !is_q8(x->dtype)) return kiln_infer_fail(c, KILN_ERR_MODEL, "X must be uint8 or int8");
    if (!kiln_nn_pool_geom(n, &g, msg, sizeof msg)) return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    if (x->rank != g.nsp + 2 || g.nsp > 3)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X has rank %d but kernel_shape has %d values (1 to 3)", x->rank, g.nsp);
    int sp0 = kiln_attr_int(n, "channels_last", 0) ? 1 : 2;
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0; k < x->rank; k++) dims[k] = x->dims[k];
    for (int i = 0; i < g.nsp; i++) {
        dims[sp0 + i] = kiln_nn_geom_out_dim(kiln_infer_dims(c), &g, i, x->dims[sp0 + i], kiln_dim_const(g.kernel[i]));
        if (kiln_dim_is_const(dims[sp0 + i]) && dims[sp0 + i].c < 1)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "spatial dim %d: window larger than the padded input", i);
    }
    return kiln_infer_set_out(c, 0, x->dtype, x->rank, dims);
}

kiln_status kiln_contrib_qavgpool_geom(const kiln_node *n, const kiln_value *X, const kiln_value *Y,
                                       kiln_qpool_geom *g, char *msg, size_t size)
{
    memset(g, 0, sizeof *g);
    g->channels_last = kiln_attr_int(n, "channels_last", 0) != 0;
    g->count_include_pad = kiln_attr_int(n, "count_include_pad", 0) != 0;
    int sp0 = g->channels_last ? 1 : 2;
    kiln_nn_geom gm;
    int64_t in[KILN_MAX_RANK], out[KILN_MAX_RANK];
    if (!kiln_nn_pool_geom(n, &gm, msg, (int)size)) return KILN_ERR_MODEL;
    if (gm.nsp != X->rank - 2 || gm.nsp > 3) return snprintf(msg, size, "X's rank does not match kernel_shape"), KILN_ERR_SHAPE;
    for (int i = 0; i < gm.nsp; i++) in[i] = X->dims[sp0 + i];
    if (!kiln_nn_geom_resolve(&gm, in, out)) return snprintf(msg, size, "a window does not fit the padded input"), KILN_ERR_SHAPE;
    for (int i = 0; i < 3; i++) {
        bool on = i < gm.nsp;
        g->k[i] = on ? gm.kernel[i] : 1, g->s[i] = on ? gm.strides[i] : 1, g->in[i] = on ? in[i] : 1;
        g->out[i] = on ? out[i] : 1, g->pb[i] = on ? gm.pads[i] : 0, g->pe[i] = on ? gm.pads[gm.nsp + i] : 0;
        if (on && Y->dims[sp0 + i] != out[i]) return snprintf(msg, size, "output spatial dim %d mismatch", i), KILN_ERR_SHAPE;
    }
    g->N = X->dims[0], g->C = g->channels_last ? X->dims[X->rank - 1] : X->dims[1];
    return KILN_OK;
}

static kiln_status qavgpool_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_dtype dt = X->dtype;
    float xs, ysv;
    int xz, yz, lo, hi;
    if (!is_q8(dt)) return kiln_run_fail(c, KILN_ERR_MODEL, "X must be uint8 or int8");
    if (!scalar_f32(kiln_run_in(c, 1), &xs) || !scalar_q8(kiln_run_in(c, 2), dt, &xz) ||
        !scalar_f32(kiln_run_in(c, 3), &ysv) || !scalar_q8(kiln_run_in(c, 4), dt, &yz))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "scales must be float32 scalars and zero points scalars of X's type");
    q8_range(dt, &lo, &hi);
    kiln_qpool_geom g;
    char why[160];
    kiln_status st = kiln_contrib_qavgpool_geom(n, X, Y, &g, why, sizeof why);
    if (st) return kiln_run_fail(c, st, "%s", why);
    bool last = g.channels_last, incl = g.count_include_pad;
    int64_t N = g.N, C = g.C;
    int64_t ipix = g.in[0] * g.in[1] * g.in[2], opix = g.out[0] * g.out[1] * g.out[2];
    for (int64_t b = 0; b < N; b++)
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t o = 0; o < opix; o++) {
                int64_t od[3] = {o / (g.out[1] * g.out[2]), (o / g.out[2]) % g.out[1], o % g.out[2]}, lo_[3], hi_[3];
                int64_t cnt = 1;
                for (int i = 0; i < 3; i++) {
                    int64_t s0 = od[i] * g.s[i] - g.pb[i], e0 = s0 + g.k[i];
                    int64_t e_pad = e0 < g.in[i] + g.pe[i] ? e0 : g.in[i] + g.pe[i];
                    lo_[i] = s0 < 0 ? 0 : s0;
                    hi_[i] = e0 < g.in[i] ? e0 : g.in[i];
                    cnt *= incl ? e_pad - s0 : hi_[i] - lo_[i];
                }
                float sum = 0.0f;
                for (int64_t p0 = lo_[0]; p0 < hi_[0]; p0++)
                    for (int64_t p1 = lo_[1]; p1 < hi_[1]; p1++)
                        for (int64_t p2 = lo_[2]; p2 < hi_[2]; p2++) {
                            int64_t pix = (p0 * g.in[1] + p1) * g.in[2] + p2;
                            int64_t xi = last ? (b * ipix + pix) * C + ch : (b * C + ch) * ipix + pix;
                            sum += (float)(q8_load(dt, X->data, xi) - xz) * xs;
                        }
                int64_t yi = last ? (b * opix + o) * C + ch : (b * C + ch) * opix + o;
                float avg = cnt > 0 ? sum / (float)cnt : 0.0f;
                q8_store(dt, Y->data, yi, requant(avg / ysv, yz, lo, hi));
            }
    return KILN_OK;
}

#define MS "com.microsoft"
static const kiln_op_def defs[] = {
    {MS, "QGemm", 1, qgemm_infer, qgemm_run},
    /* the scales and Y's zero point on the host: a device provider builds the table there */
    {MS, "QLinearSoftmax", 1, qsoftmax_infer, qsoftmax_run, 0, KILN_OP_IN(1) | KILN_OP_IN(3) | KILN_OP_IN(4)},
    {MS, "QLinearAveragePool", 1, qavgpool_infer, qavgpool_run},
};

const kiln_op_table kiln_ops_contrib_qops = {defs, sizeof defs / sizeof defs[0]};
