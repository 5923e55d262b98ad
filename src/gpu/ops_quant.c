/* ops_quant.c - GPU provider family 'quant': the quantization operators of ONNX Runtime's
 * quantizer (quantize_dynamic, quantize_static QDQ and QOperator). QuantizeLinear and
 * DequantizeLinear (ONNX and com.microsoft; per tensor, per axis, blocked; float32, float16 and
 * bfloat16 values and scales; 8- and 16-bit integers, int32 into DequantizeLinear),
 * DynamicQuantizeLinear (the min/max reduction and the scale and zero point on the device),
 * MatMulInteger, com.microsoft MatMulIntegerToFloat and DynamicQuantizeMatMul, QLinearMatMul and
 * com.microsoft QGemm (uint8/int8 operands, every zero point and scale form the reference takes,
 * numpy batching), ConvInteger and QLinearConv (1 to 3 spatial dims, groups: im2col padded
 * with x's zero point): an exact int32 product, then the reference's epilogue in its own float
 * operations; com.microsoft QLinearAdd and QLinearMul (broadcasting) in ONNX Runtime's float32
 * formulas; QLinearSigmoid, QLinearLeakyRelu and QLinearSoftmax through the reference's own
 * tables (built on the host from the scales, which the registry hands over in host memory, and
 * uploaded); QLinearConcat, QLinearGlobalAveragePool and QLinearAveragePool (NCHW and
 * channels_last) in the reference's float32 steps; QAttention (the integer projection, then
 * com.microsoft Attention's core, ops_core.h). 4-bit, 2-bit and 8-bit float quantized types are
 * refused (they run on the CPU), and so is DynamicQuantizeLSTM (the provider has no LSTM: its
 * sequential recurrence stays on the CPU, with the reason in supports).
 * The run-time rules are the reference's own (ops/quant_internal.h): a case it would refuse goes
 * to it (kiln_gpu_fallback), which reports it. Kernels in k_quant.cu. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "gpu/gpu.h"
#include "gpu/support.h"
#include "gpu/k_quant.h"
#include "gpu/kshape.h"
#include "gpu/ops_core.h"
#include "ops/nn_internal.h"
#include "ops/quant_internal.h"
#include "ops/util.h"

#define MS "com.microsoft"

static const kiln_dtype floats[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT16, KILN_DTYPE_BFLOAT16, KILN_DTYPE_UNDEFINED};
static const kiln_dtype f32[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_UNDEFINED};
static const kiln_dtype q8[] = {KILN_DTYPE_UINT8, KILN_DTYPE_INT8, KILN_DTYPE_UNDEFINED};
static const kiln_dtype q16[] = {KILN_DTYPE_UINT8, KILN_DTYPE_INT8, KILN_DTYPE_UINT16, KILN_DTYPE_INT16,
                                 KILN_DTYPE_UNDEFINED};
static const kiln_dtype q16_i32[] = {KILN_DTYPE_UINT8, KILN_DTYPE_INT8,  KILN_DTYPE_UINT16,
                                     KILN_DTYPE_INT16, KILN_DTYPE_INT32, KILN_DTYPE_UNDEFINED};
static const kiln_dtype i32[] = {KILN_DTYPE_INT32, KILN_DTYPE_UNDEFINED};

/* Output 0 is of one of the dtypes in ok. */
static bool output_is(const kiln_node *n, const kiln_dtype *ok, char *why, size_t size)
{
    if (n->n_out < 1 || !n->out[0]) return kiln_gpu_refuse(why, size, "no output");
    kiln_dtype dt = n->out[0]->type.dtype;
    if (dt == KILN_DTYPE_UNDEFINED || kiln_gpu_dtype_in(dt, ok)) return true;
    return kiln_gpu_refuse(why, size, "output dtype %s", kiln_dtype_name(dt));
}

static const void *data_of(const kiln_value *v) { return v ? v->data : NULL; }

/* 256-byte steps in the workspace. */
static size_t ws_align(size_t n) { return (n + 255) / 256 * 256; }

static kiln_gpu_qmap gpu_qmap(const kiln_node *n, const kiln_value *x, const kiln_value *s)
{
    kiln_qmap m;
    kiln_qmap_of(n, x, s, &m);
    kiln_gpu_qmap g = {.kind = m.kind == KILN_QMAP_TENSOR ? 0 : m.kind == KILN_QMAP_AXIS ? 1 : 2,
                       .D = m.D, .inner = m.inner, .block = m.block};
    return g;
}

/* ---- QuantizeLinear: x, y_scale, y_zero_point? -> y ---- */

static bool quantize_supports(const kiln_node *n, char *why, size_t size)
{
    if (!kiln_gpu_input_is(n, 0, true, floats, why, size) || !kiln_gpu_input_is(n, 1, true, floats, why, size)) return false;
    if (!output_is(n, q16, why, size)) return false;
    kiln_dtype prec = (kiln_dtype)kiln_attr_int(n, "precision", 0);
    if (prec && !kiln_gpu_dtype_in(prec, floats)) return kiln_gpu_refuse(why, size, "precision %s", kiln_dtype_name(prec));
    return true;
}

static kiln_status quantize_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0), *s = kiln_run_in(c, 1), *zp = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    kiln_dtype prec = (kiln_dtype)kiln_attr_int(n, "precision", 0);
    if (!prec) prec = s->dtype;
    if (!y || !kiln_gpu_dtype_in(x->dtype, floats) || !kiln_gpu_dtype_in(s->dtype, floats) || !kiln_gpu_dtype_in(y->dtype, q16) ||
        !kiln_gpu_dtype_in(prec, floats) || (zp && zp->dtype != y->dtype) || y->numel != x->numel)
        return kiln_gpu_fallback(c);
    gpuError_t e = kiln_gpu_quant_quantize(kiln_gpu_stream(c), x->dtype, x->data, s->dtype, s->data, data_of(zp), y->dtype,
                                           y->data, x->numel, gpu_qmap(n, x, s), prec);
    return kiln_gpu_check(c, e, "QuantizeLinear");
}

/* ---- DequantizeLinear: x, x_scale, x_zero_point? -> y ---- */

static bool dequantize_supports(const kiln_node *n, char *why, size_t size)
{
    if (!kiln_gpu_input_is(n, 0, true, q16_i32, why, size) || !kiln_gpu_input_is(n, 1, true, floats, why, size)) return false;
    return output_is(n, floats, why, size);
}

static kiln_status dequantize_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0), *s = kiln_run_in(c, 1), *zp = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    if (!y || !kiln_gpu_dtype_in(x->dtype, q16_i32) || !kiln_gpu_dtype_in(s->dtype, floats) || !kiln_gpu_dtype_in(y->dtype, floats) ||
        (zp && zp->dtype != x->dtype) || y->numel != x->numel)
        return kiln_gpu_fallback(c);
    gpuError_t e = kiln_gpu_quant_dequantize(kiln_gpu_stream(c), x->dtype, x->data, data_of(zp), s->dtype, s->data,
                                             y->dtype, y->data, x->numel, gpu_qmap(n, x, s));
    return kiln_gpu_check(c, e, "DequantizeLinear");
}

/* ---- DynamicQuantizeLinear: x float32 -> y uint8, y_scale, y_zero_point ---- */

static bool dynquant_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_input_is(n, 0, true, f32, why, size);
}

static kiln_status dynquant_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0), *ys = kiln_run_out(c, 1), *yzp = kiln_run_out(c, 2);
    if (x->dtype != KILN_DTYPE_FLOAT32 || (y && (y->dtype != KILN_DTYPE_UINT8 || y->numel != x->numel)) ||
        (ys && (ys->dtype != KILN_DTYPE_FLOAT32 || ys->numel != 1)) ||
        (yzp && (yzp->dtype != KILN_DTYPE_UINT8 || yzp->numel != 1)))
        return kiln_gpu_fallback(c);
    void *ws;
    KILN_TRY(kiln_gpu_workspace(c, kiln_gpu_quant_dynamic_ws(x->numel), &ws));
    gpuError_t e = kiln_gpu_quant_dynamic(kiln_gpu_stream(c), x->data, x->numel, 0, y ? y->data : NULL,
                                          ys ? ys->data : NULL, yzp ? yzp->data : NULL, ws);
    return kiln_gpu_check(c, e, "DynamicQuantizeLinear");
}

/* ---- the integer matrix products ---- */

/* The product of A and B (numpy matmul, both contiguous) into y [batches, M, N]; false when the
 * shapes do not fit (the reference reports it) or the batch rank exceeds the kernel's. */
static bool qmm_setup(const kiln_value *A, const kiln_value *B, const kiln_value *Y, int32_t *y, kiln_gpu_qmm *m)
{
    int ar = A->rank, br = B->rank;
    if (ar < 1 || br < 1) return false;
    int64_t M = ar >= 2 ? A->dims[ar - 2] : 1, K = A->dims[ar - 1];
    int64_t KB = br >= 2 ? B->dims[br - 2] : B->dims[0], N = br >= 2 ? B->dims[br - 1] : 1;
    int abr = ar >= 2 ? ar - 2 : 0, bbr = br >= 2 ? br - 2 : 0, yb = abr > bbr ? abr : bbr;
    if (K != KB || yb > KILN_GPU_QMM_MAX_BATCH) return false;
    memset(m, 0, sizeof *m);
    m->a_dt = A->dtype, m->b_dt = B->dtype, m->A = A->data, m->B = B->data, m->y = y;
    m->M = M, m->N = N, m->K = K, m->a_m = K, m->a_k = 1, m->b_k = N, m->b_n = 1, m->yb = yb;
    m->a_mat = M * K, m->b_mat = K * N;
    int64_t sa = M * K, sb = K * N, batches = 1;
    for (int k = yb - 1; k >= 0; k--) {
        int ka = k - (yb - abr), kb = k - (yb - bbr);
        int64_t da = ka >= 0 ? A->dims[ka] : 1, db = kb >= 0 ? B->dims[kb] : 1, d = da == 1 ? db : da;
        if ((da != 1 && da != d) || (db != 1 && db != d)) return false;
        m->ydims[k] = d;
        m->a_bs[k] = da == 1 ? 0 : sa;
        m->b_bs[k] = db == 1 ? 0 : sb;
        sa *= da, sb *= db, batches *= d;
    }
    return Y->numel == batches * M * N;
}

static void qmm_zero_points(kiln_gpu_qmm *m, const kiln_value *azp, const kiln_value *bzp)
{
    if (azp && azp->numel) m->azp = azp->data, m->azp_dt = azp->dtype, m->azp_len = azp->numel;
    if (bzp && bzp->numel) m->bzp = bzp->data, m->bzp_dt = bzp->dtype, m->bzp_len = bzp->numel;
}

static kiln_status qmm_launch(kiln_run_ctx *c, const kiln_gpu_qmm *m, const char *what)
{
    return kiln_gpu_check(c, kiln_gpu_quant_matmul(kiln_gpu_stream(c), m), what);
}

/* MatMulInteger: A, B, a_zero_point?, b_zero_point? -> Y int32 */
static bool mmi_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_input_is(n, 0, true, q8, why, size) && kiln_gpu_input_is(n, 1, true, q8, why, size) &&
           kiln_gpu_input_is(n, 2, false, q8, why, size) && kiln_gpu_input_is(n, 3, false, q8, why, size) && output_is(n, i32, why, size);
}

static kiln_status mmi_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *azp = kiln_run_in(c, 2), *bzp = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_gpu_qmm m;
    if (!Y || Y->dtype != KILN_DTYPE_INT32 || !kiln_gpu_dtype_in(A->dtype, q8) || !kiln_gpu_dtype_in(B->dtype, q8) ||
        (azp && !kiln_gpu_dtype_in(azp->dtype, q8)) || (bzp && !kiln_gpu_dtype_in(bzp->dtype, q8)) || !kiln_nn_mm_param_ok(azp, A, true) ||
        !kiln_nn_mm_param_ok(bzp, B, false) || !qmm_setup(A, B, Y, Y->data, &m))
        return kiln_gpu_fallback(c);
    qmm_zero_points(&m, azp, bzp);
    return qmm_launch(c, &m, "MatMulInteger");
}

/* MatMulIntegerToFloat: A, B, a_scale, b_scale, a_zero_point?, b_zero_point?, bias? -> Y float32 */
static bool mmf_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_input_is(n, 0, true, q8, why, size) && kiln_gpu_input_is(n, 1, true, q8, why, size) &&
           kiln_gpu_input_is(n, 2, true, f32, why, size) && kiln_gpu_input_is(n, 3, true, f32, why, size) &&
           kiln_gpu_input_is(n, 4, false, q8, why, size) && kiln_gpu_input_is(n, 5, false, q8, why, size) &&
           kiln_gpu_input_is(n, 6, false, f32, why, size);
}

static kiln_status mmf_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *as = kiln_run_in(c, 2), *bs = kiln_run_in(c, 3);
    const kiln_value *azp = kiln_run_in(c, 4), *bzp = kiln_run_in(c, 5), *bias = kiln_run_in(c, 6);
    kiln_value *Y = kiln_run_out(c, 0);
    char msg[160];
    kiln_gpu_qmm m;
    if (!Y || Y->dtype != KILN_DTYPE_FLOAT32 || !kiln_gpu_dtype_in(A->dtype, q8) || !kiln_gpu_dtype_in(B->dtype, q8) ||
        as->dtype != KILN_DTYPE_FLOAT32 || as->numel != 1 || (azp && (azp->numel != 1 || azp->dtype != A->dtype)) ||
        !kiln_contrib_qmm_b_params_ok(B, bs, bzp, bias, msg, sizeof msg))
        return kiln_gpu_fallback(c);
    if (!Y->numel) return KILN_OK;
    int32_t *acc;
    KILN_TRY(kiln_gpu_workspace(c, (size_t)Y->numel * sizeof *acc, (void **)&acc));
    if (!qmm_setup(A, B, Y, acc, &m)) return kiln_gpu_fallback(c);
    qmm_zero_points(&m, azp, bzp);
    KILN_TRY(qmm_launch(c, &m, "MatMulIntegerToFloat"));
    gpuError_t e = kiln_gpu_quant_to_float(kiln_gpu_stream(c), acc, Y->data, Y->numel / m.N, m.N, as->data, bs->data,
                                           bs->numel, data_of(bias));
    return kiln_gpu_check(c, e, "MatMulIntegerToFloat epilogue");
}

/* DynamicQuantizeMatMul: A float32, B, b_scale, b_zero_point?, bias? -> Y float32 */
static bool dqmm_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_input_is(n, 0, true, f32, why, size) && kiln_gpu_input_is(n, 1, true, q8, why, size) &&
           kiln_gpu_input_is(n, 2, true, f32, why, size) && kiln_gpu_input_is(n, 3, false, q8, why, size) &&
           kiln_gpu_input_is(n, 4, false, f32, why, size);
}

static kiln_status dqmm_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *bs = kiln_run_in(c, 2), *bzp = kiln_run_in(c, 3),
                     *bias = kiln_run_in(c, 4);
    kiln_value *Y = kiln_run_out(c, 0);
    char msg[160];
    kiln_gpu_qmm m;
    if (!Y || Y->dtype != KILN_DTYPE_FLOAT32 || A->dtype != KILN_DTYPE_FLOAT32 || !kiln_gpu_dtype_in(B->dtype, q8) ||
        !kiln_contrib_qmm_b_params_ok(B, bs, bzp, bias, msg, sizeof msg))
        return kiln_gpu_fallback(c);
    if (!Y->numel) return KILN_OK;
    /* workspace: acc int32 [Y], A quantized uint8 [A], scale float, zero point uint8, reduction */
    size_t at_q = ws_align((size_t)Y->numel * 4), at_s = at_q + ws_align((size_t)A->numel + 1), at_z = at_s + 256,
           at_r = at_z + 256, total = at_r + kiln_gpu_quant_dynamic_ws(A->numel);
    unsigned char *ws;
    KILN_TRY(kiln_gpu_workspace(c, total, (void **)&ws));
    kiln_value Aq = *A;
    Aq.dtype = KILN_DTYPE_UINT8, Aq.data = ws + at_q;
    if (!qmm_setup(&Aq, B, Y, (int32_t *)ws, &m)) return kiln_gpu_fallback(c);
    gpuStream_t s = kiln_gpu_stream(c);
    KILN_TRY(kiln_gpu_check(c, kiln_gpu_quant_dynamic(s, A->data, A->numel, 1, ws + at_q, (float *)(ws + at_s), ws + at_z,
                                                      ws + at_r),
                            "DynamicQuantizeMatMul quantize"));
    m.azp = ws + at_z, m.azp_dt = KILN_DTYPE_UINT8, m.azp_len = 1;
    if (bzp && bzp->numel) m.bzp = bzp->data, m.bzp_dt = bzp->dtype, m.bzp_len = bzp->numel;
    KILN_TRY(qmm_launch(c, &m, "DynamicQuantizeMatMul"));
    gpuError_t e = kiln_gpu_quant_to_float(s, (const int32_t *)ws, Y->data, Y->numel / m.N, m.N, (const float *)(ws + at_s),
                                           bs->data, bs->numel, data_of(bias));
    return kiln_gpu_check(c, e, "DynamicQuantizeMatMul epilogue");
}

/* The largest K whose int32 sums cannot overflow (|a - zp|, |b - zp| <= 255): QLinearMatMul's
 * reference sums in int64. */
#define QMM_EXACT_K 33025

/* QLinearMatMul: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point -> y */
static bool qlmm_supports(const kiln_node *n, char *why, size_t size)
{
    if (!kiln_gpu_input_is(n, 0, true, q8, why, size) || !kiln_gpu_input_is(n, 3, true, q8, why, size) ||
        !kiln_gpu_input_is(n, 1, true, floats, why, size) || !kiln_gpu_input_is(n, 4, true, floats, why, size) ||
        !kiln_gpu_input_is(n, 6, true, floats, why, size) || !kiln_gpu_input_is(n, 2, false, q8, why, size) ||
        !kiln_gpu_input_is(n, 5, false, q8, why, size) || !kiln_gpu_input_is(n, 7, true, q8, why, size))
        return false;
    return output_is(n, q8, why, size);
}

static kiln_status qlmm_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *as = kiln_run_in(c, 1), *azp = kiln_run_in(c, 2), *B = kiln_run_in(c, 3),
                     *bs = kiln_run_in(c, 4), *bzp = kiln_run_in(c, 5), *ys = kiln_run_in(c, 6), *yzp = kiln_run_in(c, 7);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_gpu_qmm m;
    if (!Y || !as || !bs || !ys || !yzp || ys->numel != 1 || yzp->numel != 1 || !kiln_gpu_dtype_in(Y->dtype, q8) ||
        yzp->dtype != Y->dtype || !kiln_gpu_dtype_in(A->dtype, q8) || !kiln_gpu_dtype_in(B->dtype, q8) || !kiln_gpu_dtype_in(as->dtype, floats) ||
        bs->dtype != as->dtype || ys->dtype != as->dtype || !as->numel || !bs->numel ||
        (azp && !kiln_gpu_dtype_in(azp->dtype, q8)) || (bzp && !kiln_gpu_dtype_in(bzp->dtype, q8)) || !kiln_nn_mm_param_ok(as, A, true) ||
        !kiln_nn_mm_param_ok(bs, B, false) || !kiln_nn_mm_param_ok(azp, A, true) || !kiln_nn_mm_param_ok(bzp, B, false))
        return kiln_gpu_fallback(c);
    if (!Y->numel) return KILN_OK;
    int32_t *acc;
    KILN_TRY(kiln_gpu_workspace(c, (size_t)Y->numel * sizeof *acc, (void **)&acc));
    if (!qmm_setup(A, B, Y, acc, &m) || m.K > QMM_EXACT_K) return kiln_gpu_fallback(c);
    qmm_zero_points(&m, azp, bzp);
    KILN_TRY(qmm_launch(c, &m, "QLinearMatMul"));
    gpuError_t e = kiln_gpu_quant_requant_mm(kiln_gpu_stream(c), acc, Y->dtype, Y->data, yzp->data, Y->numel, m.M, m.N,
                                             as->dtype, as->data, as->numel, bs->data, bs->numel, ys->data);
    return kiln_gpu_check(c, e, "QLinearMatMul epilogue");
}

/* QGemm: A, a_scale, a_zp, B, b_scale, b_zp, C?, y_scale?, y_zp? -> Y (float32, or 8-bit with y_scale) */
static bool qgemm_supports(const kiln_node *n, char *why, size_t size)
{
    static const kiln_dtype outs[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_UINT8, KILN_DTYPE_INT8, KILN_DTYPE_UNDEFINED};
    return kiln_gpu_input_is(n, 0, true, q8, why, size) && kiln_gpu_input_is(n, 3, true, q8, why, size) &&
           kiln_gpu_input_is(n, 6, false, i32, why, size) && output_is(n, outs, why, size);
}

static kiln_status qgemm_run(kiln_run_ctx *c)
{
    const kiln_value *in[9];
    for (int i = 0; i < 9; i++) in[i] = i < kiln_run_n_in(c) ? kiln_run_in(c, i) : NULL;
    const kiln_value *A = in[0], *B = in[3], *C = in[6], *ys = in[7];
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_qgemm_args g;
    char msg[160];
    if (!Y || !A || !B || !in[1] || !in[4] || !in[5] || !kiln_gpu_dtype_in(A->dtype, q8) || !kiln_gpu_dtype_in(B->dtype, q8) ||
        A->rank != 2 || B->rank != 2 || !kiln_contrib_qgemm_check(kiln_run_node(c), in, Y, false, &g, msg, sizeof msg) ||
        Y->numel != g.M * g.N || Y->dtype != (ys ? in[8]->dtype : KILN_DTYPE_FLOAT32))
        return kiln_gpu_fallback(c);
    if (!Y->numel) return KILN_OK;
    int32_t *acc;
    KILN_TRY(kiln_gpu_workspace(c, (size_t)Y->numel * sizeof *acc, (void **)&acc));
    kiln_gpu_qmm m = {
        .a_dt = A->dtype, .b_dt = B->dtype, .A = A->data, .B = B->data, .y = acc, .M = g.M, .N = g.N, .K = g.K,
        .a_m = g.ta ? 1 : g.K, .a_k = g.ta ? g.M : 1, .b_k = g.tb ? 1 : g.N, .b_n = g.tb ? g.K : 1,
    };
    qmm_zero_points(&m, in[2], in[5]);
    KILN_TRY(qmm_launch(c, &m, "QGemm"));
    gpuError_t e = kiln_gpu_quant_qgemm_out(kiln_gpu_stream(c), acc, C ? C->data : NULL, C ? C->numel : 0, g.M, g.N, g.alpha,
                                            in[1]->data, in[4]->data, in[4]->numel, ys ? ys->data : NULL,
                                            ys ? in[8]->data : NULL, Y->dtype, Y->data);
    return kiln_gpu_check(c, e, "QGemm epilogue");
}

/* ---- ConvInteger, QLinearConv: im2col (padding with x's zero point), then the integer product
 * per (image, group) ---- */

/* The reference's run-time geometry (ops/nn_internal.h) and the GEMM of W [M, Cg * ksz] (per
 * group) with the columns; false for what the kernels do not take (the reference reports the
 * errors). */
typedef struct qconv {
    kiln_gpu_qwindow w;
    int64_t N, C, M, G, Cg, K, osz;
} qconv;

static bool qconv_setup(const kiln_node *n, const kiln_value *X, const kiln_value *W, const kiln_value *Y, qconv *q)
{
    int nsp = X->rank - 2;
    kiln_nn_geom g;
    char msg[160];
    int64_t od[KILN_MAX_RANK];
    if (nsp < 1 || nsp > 3 || W->rank != X->rank || Y->rank != X->rank || !kiln_nn_geom_parse(n, nsp, &g, msg, sizeof msg))
        return false;
    memcpy(g.kernel, W->dims + 2, (size_t)nsp * sizeof(int64_t));
    if (!kiln_nn_geom_resolve(&g, X->dims + 2, od)) return false;
    memset(q, 0, sizeof *q);
    q->G = kiln_attr_int(n, "group", 1);
    q->N = X->dims[0], q->C = X->dims[1], q->M = W->dims[0], q->Cg = W->dims[1];
    if (q->G < 1 || q->C != q->G * q->Cg || q->M % q->G || Y->dims[0] != q->N || Y->dims[1] != q->M) return false;
    q->w.nsp = nsp;
    q->K = q->Cg, q->osz = 1;
    for (int i = 0; i < nsp; i++) {
        if (Y->dims[2 + i] != od[i]) return false;
        q->w.in[i] = X->dims[2 + i], q->w.out[i] = od[i], q->w.k[i] = g.kernel[i], q->w.stride[i] = g.strides[i];
        q->w.pad[i] = g.pads[i], q->w.dil[i] = g.dilations[i];
        q->K *= g.kernel[i], q->osz *= od[i];
    }
    return q->K <= QMM_EXACT_K;
}

/* Y or acc [N, M, osz] (int32) = conv of X and W with their zero points. */
static kiln_status qconv_product(kiln_run_ctx *c, const qconv *q, const kiln_value *X, const kiln_value *xzp,
                                 const kiln_value *W, const kiln_value *wzp, int32_t *y, unsigned char *col)
{
    gpuStream_t s = kiln_gpu_stream(c);
    KILN_TRY(kiln_gpu_check(c, kiln_gpu_quant_im2col(s, X->data, col, q->N, q->C, q->w, data_of(xzp), X->dtype),
                            "quantized conv im2col"));
    int64_t Mg = q->M / q->G;
    kiln_gpu_qmm m = {
        .a_dt = W->dtype, .b_dt = X->dtype, .A = W->data, .B = col, .y = y, .M = Mg, .N = q->osz, .K = q->K,
        .a_m = q->K, .a_k = 1, .b_k = q->osz, .b_n = 1, .yb = 2, .ydims = {q->N, q->G}, .a_bs = {0, Mg * q->K},
        .b_bs = {q->G * q->K * q->osz, q->K * q->osz}, .a_mat = Mg * q->K, .b_mat = q->K * q->osz,
    };
    /* row i of group g (batch (n, g)) takes w_zero_point[g * Mg + i]; every column x_zero_point,
     * which the padding holds too, so that padded taps add nothing */
    qmm_zero_points(&m, wzp, xzp);
    return qmm_launch(c, &m, "quantized conv");
}

static bool conv_rank_ok(const kiln_node *n, char *why, size_t size)
{
    const kiln_type *x = kiln_gpu_in_type(n, 0);
    if (x && x->rank >= 0 && (x->rank < 3 || x->rank > 5)) return kiln_gpu_refuse(why, size, "rank %d (1 to 3 spatial dims)", x->rank);
    return true;
}

/* ConvInteger: x, w, x_zero_point?, w_zero_point? -> y int32 */
static bool conv_int_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_input_is(n, 0, true, q8, why, size) && kiln_gpu_input_is(n, 1, true, q8, why, size) &&
           kiln_gpu_input_is(n, 2, false, q8, why, size) && kiln_gpu_input_is(n, 3, false, q8, why, size) && output_is(n, i32, why, size) &&
           conv_rank_ok(n, why, size);
}

static kiln_status conv_int_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1), *xzp = kiln_run_in(c, 2), *wzp = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0);
    qconv q;
    if (!Y || !W || Y->dtype != KILN_DTYPE_INT32 || !kiln_gpu_dtype_in(X->dtype, q8) || !kiln_gpu_dtype_in(W->dtype, q8) ||
        (xzp && xzp->dtype != X->dtype) || (wzp && wzp->dtype != W->dtype) || !kiln_nn_param_ok(xzp, 1) ||
        !qconv_setup(kiln_run_node(c), X, W, Y, &q) || !kiln_nn_param_ok(wzp, q.M))
        return kiln_gpu_fallback(c);
    if (!Y->numel) return KILN_OK;
    unsigned char *col;
    KILN_TRY(kiln_gpu_workspace(c, (size_t)(q.N * q.C * (q.K / q.Cg) * q.osz), (void **)&col));
    return qconv_product(c, &q, X, xzp, W, wzp, Y->data, col);
}

/* QLinearConv: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B? -> y */
static bool qlconv_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_input_is(n, 0, true, q8, why, size) && kiln_gpu_input_is(n, 3, true, q8, why, size) &&
           kiln_gpu_input_is(n, 1, true, floats, why, size) && kiln_gpu_input_is(n, 4, true, floats, why, size) &&
           kiln_gpu_input_is(n, 6, true, floats, why, size) && kiln_gpu_input_is(n, 2, false, q8, why, size) &&
           kiln_gpu_input_is(n, 5, false, q8, why, size) && kiln_gpu_input_is(n, 7, false, q8, why, size) &&
           kiln_gpu_input_is(n, 8, false, i32, why, size) && output_is(n, q8, why, size) && conv_rank_ok(n, why, size);
}

static kiln_status qlconv_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *xs = kiln_run_in(c, 1), *xzp = kiln_run_in(c, 2), *W = kiln_run_in(c, 3),
                     *ws = kiln_run_in(c, 4), *wzp = kiln_run_in(c, 5), *ys = kiln_run_in(c, 6), *yzp = kiln_run_in(c, 7),
                     *B = kiln_run_n_in(c) > 8 ? kiln_run_in(c, 8) : NULL;
    kiln_value *Y = kiln_run_out(c, 0);
    qconv q;
    if (!Y || !W || !xs || !ws || !ys || !kiln_gpu_dtype_in(Y->dtype, q8) || (yzp && yzp->dtype != Y->dtype) ||
        !kiln_gpu_dtype_in(X->dtype, q8) || !kiln_gpu_dtype_in(W->dtype, q8) || (xzp && xzp->dtype != X->dtype) ||
        (wzp && wzp->dtype != W->dtype) || !kiln_gpu_dtype_in(xs->dtype, floats) || ws->dtype != xs->dtype ||
        ys->dtype != xs->dtype || !kiln_nn_param_ok(xzp, 1) || !kiln_nn_param_ok(xs, 1) || !kiln_nn_param_ok(ys, 1) ||
        !kiln_nn_param_ok(yzp, 1) || !xs->numel || !ys->numel || !ws->numel || !qconv_setup(kiln_run_node(c), X, W, Y, &q) ||
        !kiln_nn_param_ok(wzp, q.M) || !kiln_nn_param_ok(ws, q.M) ||
        (B && (B->dtype != KILN_DTYPE_INT32 || B->numel != q.M)))
        return kiln_gpu_fallback(c);
    if (!Y->numel) return KILN_OK;
    size_t at_col = ws_align((size_t)Y->numel * 4);
    unsigned char *wsp;
    KILN_TRY(kiln_gpu_workspace(c, at_col + (size_t)(q.N * q.C * (q.K / q.Cg) * q.osz), (void **)&wsp));
    KILN_TRY(qconv_product(c, &q, X, xzp, W, wzp, (int32_t *)wsp, wsp + at_col));
    gpuError_t e = kiln_gpu_quant_requant_conv(kiln_gpu_stream(c), (const int32_t *)wsp, B ? B->data : NULL, Y->dtype,
                                               Y->data, data_of(yzp), Y->numel, q.M, q.osz, xs->dtype, xs->data, ws->data,
                                               ws->numel, ys->data);
    return kiln_gpu_check(c, e, "QLinearConv epilogue");
}

/* ---- QLinearAdd, QLinearMul: A, A_scale, A_zp?, B, B_scale, B_zp?, C_scale, C_zp? -> C ---- */

static bool qbinary_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_input_is(n, 0, true, q8, why, size) && kiln_gpu_input_is(n, 3, true, q8, why, size) &&
           kiln_gpu_input_is(n, 1, true, f32, why, size) && kiln_gpu_input_is(n, 4, true, f32, why, size) &&
           kiln_gpu_input_is(n, 6, true, f32, why, size) && output_is(n, q8, why, size);
}

static kiln_status qbinary_run(kiln_run_ctx *c)
{
    const kiln_value *in[8];
    for (int i = 0; i < 8; i++) in[i] = i < kiln_run_n_in(c) ? kiln_run_in(c, i) : NULL;
    const kiln_value *A = in[0], *B = in[3];
    kiln_value *C = kiln_run_out(c, 0);
    kiln_dtype dt = A->dtype;
    if (!C || !B || B->dtype != dt || C->dtype != dt || !kiln_contrib_q8_params_ok(in[1], in[2], dt) ||
        !kiln_contrib_q8_params_ok(in[4], in[5], dt) || !kiln_contrib_q8_params_ok(in[6], in[7], dt) ||
        C->rank > KILN_GPU_MAX_RANK)
        return kiln_gpu_fallback(c);
    kiln_gpu_shape sa, sb;
    kiln_gpu_shape_broadcast(&sa, C->rank, C->dims, A->rank, A->dims);
    kiln_gpu_shape_broadcast(&sb, C->rank, C->dims, B->rank, B->dims);
    bool swap = kiln_contrib_qbinary_swaps(A, C);
    gpuError_t e = kiln_gpu_quant_qlinear_binary(kiln_gpu_stream(c), !strcmp(kiln_run_node(c)->op_type, "QLinearMul"), dt,
                                                 A->data, sa, B->data, sb, C->data, C->numel, in[1]->data, data_of(in[2]),
                                                 in[4]->data, data_of(in[5]), in[6]->data, data_of(in[7]), swap);
    return kiln_gpu_check(c, e, kiln_run_node(c)->op_type);
}

/* ---- QLinearSigmoid, QLinearLeakyRelu: X, X_scale, X_zp?, Y_scale, Y_zp? -> Y, the reference's
 * 256-entry table built on the host (its scales are host inputs) and uploaded ---- */

static bool q8_unary_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_input_is(n, 0, true, q8, why, size) && kiln_gpu_input_is(n, 1, true, f32, why, size) &&
           kiln_gpu_input_is(n, 3, true, f32, why, size) && output_is(n, q8, why, size);
}

static kiln_status q8_lut_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    uint8_t table[256];
    if (!Y || Y->dtype != X->dtype || Y->numel != X->numel ||
        !kiln_contrib_q8_unary_table(kiln_run_node(c), X->dtype, kiln_run_in(c, 1), kiln_run_in(c, 2), kiln_run_in(c, 3),
                                     kiln_run_in(c, 4), table))
        return kiln_gpu_fallback(c);
    if (!X->numel) return KILN_OK;
    void *t;
    KILN_TRY(kiln_gpu_workspace(c, sizeof table, &t));
    KILN_TRY(kiln_gpu_upload(c, t, table, sizeof table));
    gpuError_t e = kiln_gpu_quant_lut(kiln_gpu_stream(c), X->dtype, t, X->data, Y->data, X->numel);
    return kiln_gpu_check(c, e, kiln_run_node(c)->op_type);
}

/* ---- QLinearConcat: Y_scale, Y_zp, then (X, X_scale, X_zp) per input -> Y; each input copied
 * or requantized on the device (its scales stay there) ---- */

static bool qconcat_supports(const kiln_node *n, char *why, size_t size)
{
    if (n->n_in < 5 || (n->n_in - 2) % 3) return kiln_gpu_refuse(why, size, "%d inputs", n->n_in);
    if (!kiln_gpu_input_is(n, 0, true, f32, why, size) || !output_is(n, q8, why, size)) return false;
    for (int i = 2; i < n->n_in; i += 3)
        if (!kiln_gpu_input_is(n, i, true, q8, why, size) || !kiln_gpu_input_is(n, i + 1, true, f32, why, size)) return false;
    return true;
}

static kiln_status qconcat_run(kiln_run_ctx *c)
{
    int n = kiln_run_n_in(c), ax;
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || !kiln_contrib_q8_params_ok(kiln_run_in(c, 0), kiln_run_in(c, 1), Y->dtype) ||
        !kiln_axis_norm(kiln_attr_int(kiln_run_node(c), "axis", 0), Y->rank, &ax))
        return kiln_gpu_fallback(c);
    int64_t outer = 1, inner = 1, total = 0;
    for (int k = 0; k < ax; k++) outer *= Y->dims[k];
    for (int k = ax + 1; k < Y->rank; k++) inner *= Y->dims[k];
    for (int i = 2; i < n; i += 3) {
        const kiln_value *X = kiln_run_in(c, i);
        if (!X || X->dtype != Y->dtype || X->rank != Y->rank ||
            !kiln_contrib_q8_params_ok(kiln_run_in(c, i + 1), kiln_run_in(c, i + 2), Y->dtype))
            return kiln_gpu_fallback(c);
        for (int k = 0; k < Y->rank; k++)
            if (k != ax && X->dims[k] != Y->dims[k]) return kiln_gpu_fallback(c);
        total += X->dims[ax];
    }
    if (total != Y->dims[ax]) return kiln_gpu_fallback(c);
    gpuStream_t s = kiln_gpu_stream(c);
    int64_t at = 0;
    for (int i = 2; i < n; i += 3) {
        const kiln_value *X = kiln_run_in(c, i);
        int64_t len = X->dims[ax] * inner;
        KILN_TRY(kiln_gpu_check(c,
                                kiln_gpu_quant_qconcat(s, Y->dtype, X->data, outer, len, Y->data, Y->dims[ax] * inner, at,
                                                       kiln_run_in(c, i + 1)->data, data_of(kiln_run_in(c, i + 2)),
                                                       kiln_run_in(c, 0)->data, data_of(kiln_run_in(c, 1))),
                                "QLinearConcat"));
        at += len;
    }
    return KILN_OK;
}

/* ---- QLinearGlobalAveragePool, QLinearAveragePool: X, x_scale, x_zp?, y_scale, y_zp? -> Y ---- */

static bool qpool_supports(const kiln_node *n, char *why, size_t size)
{
    if (!kiln_gpu_input_is(n, 0, true, q8, why, size) || !kiln_gpu_input_is(n, 1, true, f32, why, size) ||
        !kiln_gpu_input_is(n, 3, true, f32, why, size) || !output_is(n, q8, why, size))
        return false;
    const kiln_type *x = kiln_gpu_in_type(n, 0);
    if (!strcmp(n->op_type, "QLinearAveragePool") && x->rank >= 0 && (x->rank < 3 || x->rank > 5))
        return kiln_gpu_refuse(why, size, "rank %d (1 to 3 spatial dims)", x->rank);
    return true;
}

/* The parameters of X and Y (inputs 1..4) as the reference takes them. */
static bool qpool_params_ok(kiln_run_ctx *c, const kiln_value *X, const kiln_value *Y)
{
    return Y && Y->dtype == X->dtype && kiln_contrib_q8_params_ok(kiln_run_in(c, 1), kiln_run_in(c, 2), X->dtype) &&
           kiln_contrib_q8_params_ok(kiln_run_in(c, 3), kiln_run_in(c, 4), X->dtype);
}

static kiln_status qgap_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!qpool_params_ok(c, X, Y) || X->rank < 3) return kiln_gpu_fallback(c);
    bool last = kiln_attr_int(kiln_run_node(c), "channels_last", 0) != 0;
    int64_t N = X->dims[0], C = last ? X->dims[X->rank - 1] : X->dims[1], img = 1;
    for (int k = last ? 1 : 2; k < (last ? X->rank - 1 : X->rank); k++) img *= X->dims[k];
    if (!img || Y->numel != N * C) return kiln_gpu_fallback(c);
    gpuError_t e = kiln_gpu_quant_qgap(kiln_gpu_stream(c), X->dtype, X->data, Y->data, N, C, img, last,
                                       kiln_run_in(c, 1)->data, data_of(kiln_run_in(c, 2)), kiln_run_in(c, 3)->data,
                                       data_of(kiln_run_in(c, 4)));
    return kiln_gpu_check(c, e, "QLinearGlobalAveragePool");
}

static kiln_status qavgpool_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_qpool_geom g;
    char msg[160];
    if (!qpool_params_ok(c, X, Y) || kiln_contrib_qavgpool_geom(kiln_run_node(c), X, Y, &g, msg, sizeof msg))
        return kiln_gpu_fallback(c);
    kiln_gpu_qpool p = {.N = g.N, .C = g.C, .channels_last = g.channels_last, .count_include_pad = g.count_include_pad};
    memcpy(p.k, g.k, sizeof p.k), memcpy(p.s, g.s, sizeof p.s), memcpy(p.pb, g.pb, sizeof p.pb);
    memcpy(p.pe, g.pe, sizeof p.pe), memcpy(p.in, g.in, sizeof p.in), memcpy(p.out, g.out, sizeof p.out);
    if (Y->numel != p.N * p.C * p.out[0] * p.out[1] * p.out[2]) return kiln_gpu_fallback(c);
    gpuError_t e = kiln_gpu_quant_qavgpool(kiln_gpu_stream(c), X->dtype, X->data, Y->data, p, kiln_run_in(c, 1)->data,
                                           data_of(kiln_run_in(c, 2)), kiln_run_in(c, 3)->data, data_of(kiln_run_in(c, 4)));
    return kiln_gpu_check(c, e, "QLinearAveragePool");
}

/* ---- QLinearSoftmax: X, X_scale, X_zp?, Y_scale, Y_zp? -> Y; the reference's exp table built on
 * the host (its scales are host inputs) and uploaded ---- */

static bool qsoftmax_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_input_is(n, 0, true, q8, why, size) && kiln_gpu_input_is(n, 1, true, f32, why, size) &&
           kiln_gpu_input_is(n, 3, true, f32, why, size) && output_is(n, q8, why, size);
}

static kiln_status qsoftmax_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_qsoftmax_args a;
    char msg[160];
    if (!Y || Y->dtype != X->dtype || Y->numel != X->numel ||
        kiln_contrib_qsoftmax_prepare(kiln_run_node(c), X, kiln_run_in(c, 1), kiln_run_in(c, 3), kiln_run_in(c, 4), &a, msg,
                                      sizeof msg))
        return kiln_gpu_fallback(c);
    if (!X->numel) return KILN_OK;
    void *t;
    KILN_TRY(kiln_gpu_workspace(c, sizeof a.table, &t));
    KILN_TRY(kiln_gpu_upload(c, t, a.table, sizeof a.table));
    gpuError_t e = kiln_gpu_quant_qsoftmax(kiln_gpu_stream(c), X->dtype, X->data, Y->data, t, a.outer, a.d, a.inner,
                                           a.yscale, a.yz);
    return kiln_gpu_check(c, e, "QLinearSoftmax");
}

/* ---- QAttention: input, weight, bias, input_scale, weight_scale, mask_index?, input_zero_point?,
 * weight_zero_point?, past? -> output, present?: the exact integer product of input and weight
 * less their zero points, scaled by input_scale * weight_scale[j] plus bias (MatMulIntegerToFloat's
 * epilogue), then com.microsoft Attention's core in float32 ---- */

enum { QA_X, QA_W, QA_BIAS, QA_XS, QA_WS, QA_MASK, QA_XZ, QA_WZ, QA_PAST };

static bool qattn_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_input_is(n, QA_X, true, q8, why, size) && kiln_gpu_input_is(n, QA_W, true, q8, why, size) &&
           kiln_gpu_input_is(n, QA_BIAS, true, f32, why, size) && kiln_gpu_input_is(n, QA_XS, true, f32, why, size) &&
           kiln_gpu_input_is(n, QA_WS, true, f32, why, size) && kiln_gpu_input_is(n, QA_MASK, false, i32, why, size) &&
           kiln_gpu_input_is(n, QA_XZ, false, q8, why, size) && kiln_gpu_input_is(n, QA_WZ, false, q8, why, size) &&
           kiln_gpu_input_is(n, QA_PAST, false, f32, why, size);
}

static kiln_status qattn_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, QA_X), *W = kiln_run_in(c, QA_W), *bias = kiln_run_in(c, QA_BIAS),
                     *xs = kiln_run_in(c, QA_XS), *ws = kiln_run_in(c, QA_WS), *mask = kiln_run_in(c, QA_MASK),
                     *xz = kiln_run_in(c, QA_XZ), *wz = kiln_run_in(c, QA_WZ), *past = kiln_run_in(c, QA_PAST);
    kiln_value *Y = kiln_run_out(c, 0), *present = kiln_run_out(c, 1);
    kiln_contrib_attention_dims d;
    char msg[256];
    /* the reference's checks: dequantize's (input_scale and input_zero_point scalars, the weight's
     * 1 or 3 D per column), then Attention's on the dequantized shapes */
    if (!Y || !W || !bias || !kiln_gpu_dtype_in(X->dtype, q8) || !kiln_gpu_dtype_in(W->dtype, q8) || xs->dtype != KILN_DTYPE_FLOAT32 ||
        xs->numel != 1 || (xz && (xz->dtype != X->dtype || xz->numel != 1)) || W->rank != 2 ||
        !kiln_contrib_qmm_b_params_ok(W, ws, wz, bias, msg, sizeof msg) || Y->dtype != KILN_DTYPE_FLOAT32 ||
        (mask && mask->dtype != KILN_DTYPE_INT32) || (past && past->dtype != KILN_DTYPE_FLOAT32) ||
        (present && present->dtype != KILN_DTYPE_FLOAT32) ||
        kiln_contrib_attention_check(n, X, W, bias, mask, past, NULL, &d, msg, sizeof msg) ||
        !kiln_gpu_attention_fits(&d) || d.Hin > QMM_EXACT_K)
        return kiln_gpu_fallback(c);
    if (!Y->numel && !(present && present->numel)) return KILN_OK;
    int64_t rows = d.B * d.S;
    size_t at_qkv = ws_align((size_t)(rows * d.D) * 4), at_kv = at_qkv + ws_align((size_t)(rows * d.D) * 4);
    unsigned char *wsp;
    KILN_TRY(kiln_gpu_workspace(c, at_kv + kiln_gpu_attention_kv_bytes(&d, KILN_DTYPE_FLOAT32, present), (void **)&wsp));
    kiln_gpu_qmm m = {
        .a_dt = X->dtype, .b_dt = W->dtype, .A = X->data, .B = W->data, .y = (int32_t *)wsp, .M = rows, .N = d.D,
        .K = d.Hin, .a_m = d.Hin, .a_k = 1, .b_k = d.D, .b_n = 1,
    };
    qmm_zero_points(&m, xz, wz);
    if (rows) {
        KILN_TRY(qmm_launch(c, &m, "QAttention"));
        KILN_TRY(kiln_gpu_check(c,
                                kiln_gpu_quant_to_float(kiln_gpu_stream(c), (const int32_t *)wsp, (float *)(wsp + at_qkv),
                                                        rows, d.D, xs->data, ws->data, ws->numel, bias->data),
                                "QAttention dequantize"));
    }
    return kiln_gpu_attention_core(c, &d, KILN_DTYPE_FLOAT32, wsp + at_qkv, wsp + at_kv, mask, past, NULL, Y, present);
}

/* ---- DynamicQuantizeLSTM: refused ---- */

static bool dqlstm_supports(const kiln_node *n, char *why, size_t size)
{
    return kiln_gpu_refuse(why, size, "no GPU LSTM (ONNX LSTM has none either): the recurrence, each step's hidden state "
                             "quantized into an integer GEMM, runs on the CPU");
}

static kiln_status dqlstm_run(kiln_run_ctx *c) { return kiln_gpu_fallback(c); }

/* ---- the table ---- */

static const kiln_gpu_op ops[] = {
    {"", "QuantizeLinear", quantize_supports, quantize_run},
    {"", "DequantizeLinear", dequantize_supports, dequantize_run},
    {MS, "QuantizeLinear", quantize_supports, quantize_run},
    {MS, "DequantizeLinear", dequantize_supports, dequantize_run},
    {"", "DynamicQuantizeLinear", dynquant_supports, dynquant_run},
    {"", "MatMulInteger", mmi_supports, mmi_run},
    {MS, "MatMulIntegerToFloat", mmf_supports, mmf_run},
    {MS, "DynamicQuantizeMatMul", dqmm_supports, dqmm_run},
    {"", "QLinearMatMul", qlmm_supports, qlmm_run},
    {MS, "QGemm", qgemm_supports, qgemm_run},
    {"", "ConvInteger", conv_int_supports, conv_int_run},
    {"", "QLinearConv", qlconv_supports, qlconv_run},
    {MS, "QLinearAdd", qbinary_supports, qbinary_run},
    {MS, "QLinearMul", qbinary_supports, qbinary_run},
    {MS, "QLinearSigmoid", q8_unary_supports, q8_lut_run},
    {MS, "QLinearLeakyRelu", q8_unary_supports, q8_lut_run},
    {MS, "QLinearConcat", qconcat_supports, qconcat_run},
    {MS, "QLinearGlobalAveragePool", qpool_supports, qgap_run},
    {MS, "QLinearAveragePool", qpool_supports, qavgpool_run},
    {MS, "QLinearSoftmax", qsoftmax_supports, qsoftmax_run},
    {MS, "QAttention", qattn_supports, qattn_run},
    {MS, "DynamicQuantizeLSTM", dqlstm_supports, dqlstm_run},
};

const kiln_gpu_op_table kiln_gpu_ops_quant = {ops, sizeof ops / sizeof ops[0]};
