/* contrib_quant.c - the com.microsoft quantized matmuls that ONNX Runtime's quantizer and graph
 * optimiser emit: MatMulIntegerToFloat (int8 operands, float output scaled per column, bias)
 * and DynamicQuantizeMatMul (float A quantized to uint8 on the fly, then the same). Schema,
 * inference and reference kernels (exact int64 products, then ORT's float32 epilogue order). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/contrib_quant.h"
#include "ops/nn_internal.h"
#include "ops/op.h"
#include "ops/quant_internal.h"
#include "ops/semantics.h"
#include "ops/util.h"

static bool is_8bit(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

static kiln_status check_types(kiln_infer_ctx *c, int a, int b)
{
    const kiln_type *A = kiln_infer_in(c, a), *B = kiln_infer_in(c, b);
    if (!A || !B) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs A and B");
    if (B->dtype && !is_8bit(B->dtype))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "B must be uint8 or int8, is %s", kiln_dtype_name(B->dtype));
    return KILN_OK;
}

/* MatMulIntegerToFloat: A, B, a_scale, b_scale, a_zero_point?, b_zero_point?, bias? -> Y float32 */
static kiln_status mmf_infer(kiln_infer_ctx *c)
{
    KILN_TRY(check_types(c, 0, 1));
    const kiln_type *A = kiln_infer_in(c, 0), *s = kiln_infer_in(c, 2);
    if (A->dtype && !is_8bit(A->dtype))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "A must be uint8 or int8, is %s", kiln_dtype_name(A->dtype));
    if (!s || !kiln_infer_in(c, 3)) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs a_scale and b_scale");
    if (s->dtype && s->dtype != KILN_DTYPE_FLOAT32)
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "a_scale must be float32, is %s", kiln_dtype_name(s->dtype));
    return kiln_nn_matmul_shape(c, 0, 1, KILN_DTYPE_FLOAT32);
}

/* DynamicQuantizeMatMul: A float32, B, b_scale, b_zero_point?, bias? -> Y float32 */
static kiln_status dqmm_infer(kiln_infer_ctx *c)
{
    KILN_TRY(check_types(c, 0, 1));
    const kiln_type *A = kiln_infer_in(c, 0);
    if (A->dtype && A->dtype != KILN_DTYPE_FLOAT32)
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "A must be float32, is %s", kiln_dtype_name(A->dtype));
    if (!kiln_infer_in(c, 2)) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs b_scale");
    return kiln_nn_matmul_shape(c, 0, 1, KILN_DTYPE_FLOAT32);
}

bool kiln_contrib_qmm_b_params_ok(const kiln_value *B, const kiln_value *bs, const kiln_value *bzp,
                                  const kiln_value *bias, char *msg, size_t size)
{
    int64_t N = B->rank >= 2 ? B->dims[B->rank - 1] : 1;
    if (!bs || bs->dtype != KILN_DTYPE_FLOAT32 || (bs->numel != 1 && bs->numel != N))
        return snprintf(msg, size, "b_scale must be float32 with 1 or %lld elements", (long long)N), false;
    if (bzp && (bzp->dtype != B->dtype || (bzp->numel != 1 && bzp->numel != N)))
        return snprintf(msg, size, "b_zero_point must be %s with 1 or %lld elements", kiln_dtype_name(B->dtype),
                        (long long)N),
               false;
    if (bias && (bias->dtype != KILN_DTYPE_FLOAT32 || bias->numel != N))
        return snprintf(msg, size, "bias must be float32 [%lld], has %lld elements", (long long)N,
                        (long long)bias->numel),
               false;
    return true;
}

/* The checked per-column parameters of B [.., K, N] (kiln_contrib_qmm_b_params_ok). */
static kiln_status check_b_params(kiln_run_ctx *c, const kiln_value *B, const kiln_value *bs, const kiln_value *bzp,
                                  const kiln_value *bias)
{
    char msg[160];
    if (kiln_contrib_qmm_b_params_ok(B, bs, bzp, bias, msg, sizeof msg)) return KILN_OK;
    return kiln_run_fail(c, KILN_ERR_SHAPE, "%s", msg);
}

/* Y = float((A - azp) @ (B - bzp)) * (a_scale * b_scale[j]) + bias[j], numpy matmul batching;
 * A is given as int32 values (already quantized). */
static kiln_status int_to_float(kiln_run_ctx *c, const kiln_value *Av, const int32_t *a, int32_t azp, float as,
                                const kiln_value *B, const kiln_value *bs, const kiln_value *bzp,
                                const kiln_value *bias, kiln_value *Y)
{
    if (!Y->numel) return KILN_OK;
    int ra = Av->rank, rb = B->rank, ry = Y->rank;
    int64_t K = Av->dims[ra - 1], M = ra >= 2 ? Av->dims[ra - 2] : 1, N = rb >= 2 ? B->dims[rb - 1] : 1;
    int yb = ry - (ra >= 2) - (rb >= 2); /* batch rank of Y */
    int64_t sa[KILN_MAX_RANK] = {0}, sb[KILN_MAX_RANK] = {0}, batches = 1;
    kiln_bcast_strides(yb, Y->dims, ra >= 2 ? ra - 2 : 0, Av->dims, sa);
    kiln_bcast_strides(yb, Y->dims, rb >= 2 ? rb - 2 : 0, B->dims, sb);
    for (int k = 0; k < yb; k++) batches *= Y->dims[k];
    float *y = Y->data;
    for (int64_t t = 0; t < batches; t++) {
        int64_t oa = 0, ob = 0, rem = t;
        for (int k = yb - 1; k >= 0; k--) {
            int64_t i = rem % Y->dims[k];
            rem /= Y->dims[k];
            oa += i * sa[k];
            ob += i * sb[k];
        }
        const int32_t *ab = a + oa * M * K;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                int64_t acc = 0;
                for (int64_t p = 0; p < K; p++) {
                    int64_t e = ob * K * N + p * N + j;
                    acc += (int64_t)(ab[i * K + p] - azp) *
                           (kiln_load_i64(B->dtype, B->data, e) - (bzp ? kiln_nn_param_i64(bzp, j) : 0));
                }
                float scale = as * ((const float *)bs->data)[bs->numel == 1 ? 0 : j];
                float v = (float)(int32_t)(uint32_t)(uint64_t)acc * scale;
                if (bias) v += ((const float *)bias->data)[j];
                y[(t * M + i) * N + j] = v;
            }
    }
    return KILN_OK;
}

static kiln_status mmf_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *as = kiln_run_in(c, 2), *bs = kiln_run_in(c, 3);
    const kiln_value *azp = kiln_run_in(c, 4), *bzp = kiln_run_in(c, 5), *bias = kiln_run_in(c, 6);
    kiln_value *Y = kiln_run_out(c, 0);
    if (as->dtype != KILN_DTYPE_FLOAT32 || as->numel != 1)
        return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "a_scale must be a float32 scalar, has %lld elements",
                             (long long)as->numel);
    if (azp && (azp->numel != 1 || azp->dtype != A->dtype))
        return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "a_zero_point must be a %s scalar", kiln_dtype_name(A->dtype));
    KILN_TRY(check_b_params(c, B, bs, bzp, bias));
    int32_t *a = malloc((size_t)A->numel * sizeof *a + 1);
    if (!a) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < A->numel; i++) a[i] = (int32_t)kiln_load_i64(A->dtype, A->data, i);
    kiln_status st = int_to_float(c, A, a, azp ? (int32_t)kiln_nn_param_i64(azp, 0) : 0, ((const float *)as->data)[0], B,
                                  bs, bzp, bias, Y);
    free(a);
    return st;
}

static kiln_status dqmm_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *bs = kiln_run_in(c, 2);
    const kiln_value *bzp = kiln_run_in(c, 3), *bias = kiln_run_in(c, 4);
    kiln_value *Y = kiln_run_out(c, 0);
    KILN_TRY(check_b_params(c, B, bs, bzp, bias));
    const float *x = A->data;
    float mn = 0.0f, mx = 0.0f, scale;
    for (int64_t i = 0; i < A->numel; i++) {
        mn = fminf(mn, x[i]);
        mx = fmaxf(mx, x[i]);
    }
    int32_t zp;
    kiln_dynquant_params(mn, mx, &scale, &zp);
    int32_t *a = malloc((size_t)A->numel * sizeof *a + 1);
    if (!a) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < A->numel; i++) a[i] = kiln_dynquant_one(x[i], scale, zp);
    kiln_status st = int_to_float(c, A, a, zp, scale, B, bs, bzp, bias, Y);
    free(a);
    return st;
}

static const kiln_op_def defs[] = {
    {"com.microsoft", "MatMulIntegerToFloat", 1, mmf_infer, mmf_run},
    {"com.microsoft", "DynamicQuantizeMatMul", 1, dqmm_infer, dqmm_run},
};

const kiln_op_table kiln_ops_contrib_quant = {defs, sizeof defs / sizeof defs[0]};
