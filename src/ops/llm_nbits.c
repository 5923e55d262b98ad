/* llm_nbits.c - com.microsoft MatMulNBits: Y = A x dequant(B)^T + bias with B quantized to 4 or
 * 8 bits in blocks of block_size along K (per block a scale, and a zero point packed, unpacked
 * or the default 2^(bits-1); optional g_idx). accuracy_level 4 on constant 4-bit weights (zero
 * points packed or absent) quantizes A to int8 per block first, as ONNX Runtime's CPU kernel does (kiln_nbits_quantize_a); every other
 * form computes in float. The reference dequantizes the whole weight and multiplies in double;
 * the fast kernels are src/cpu/kernels_nbits.c and src/cpu/nbits_q8.c. */
#include <math.h>
#include <stdlib.h>

#include "ops/llm.h"
#include "ops/util.h"

static kiln_status nbits_parse(const kiln_node *n, void *params, kiln_err *err)
{
    kiln_nbits_params *p = params;
    p->K = kiln_attr_int(n, "K", 0), p->N = kiln_attr_int(n, "N", 0);
    p->bits = kiln_attr_int(n, "bits", 4), p->block_size = kiln_attr_int(n, "block_size", 0);
    p->accuracy_level = kiln_attr_int(n, "accuracy_level", 0);
    int64_t bs = p->block_size;
    if (p->K <= 0 || p->N <= 0 || (p->bits != 4 && p->bits != 8) || bs < 16 || bs > 256 || (bs & (bs - 1)))
        return kiln_errf(err, KILN_ERR_MODEL, "%s (MatMulNBits): K %lld, N %lld, bits %lld (4 or 8), block_size %lld "
                         "(a power of 2 in [16, 256]) not supported", n->name, (long long)p->K, (long long)p->N,
                         (long long)p->bits, (long long)bs);
    p->n_blocks = (p->K + bs - 1) / bs;
    p->blob = bs * p->bits / 8;
    return KILN_OK;
}

static kiln_status nbits_infer(kiln_infer_ctx *c)
{
    const kiln_nbits_params *p = kiln_infer_node(c)->params;
    const kiln_type *a = kiln_infer_in(c, NB_A), *b = kiln_infer_in(c, NB_B), *s = kiln_infer_in(c, NB_SCALES);
    if (!a || !b || !s) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs A, B and scales");
    if (a->dtype && a->dtype != KILN_DTYPE_FLOAT32 && a->dtype != KILN_DTYPE_FLOAT16)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "A is %s, expected float32 or float16", kiln_dtype_name(a->dtype));
    if (b->dtype && b->dtype != KILN_DTYPE_UINT8)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "B is %s, expected uint8", kiln_dtype_name(b->dtype));
    if (a->rank < 0) return kiln_infer_set_out_unknown(c, 0, a->dtype);
    if (a->rank < 1) return kiln_infer_fail(c, KILN_ERR_SHAPE, "A must have rank >= 1");
    KILN_TRY(kiln_infer_require_equal(c, a->dims[a->rank - 1], kiln_dim_const(p->K), "A's last dim and K"));
    kiln_dim d[KILN_MAX_RANK];
    for (int i = 0; i < a->rank; i++) d[i] = a->dims[i];
    d[a->rank - 1] = kiln_dim_const(p->N);
    return kiln_infer_set_out(c, 0, a->dtype, a->rank, d);
}

kiln_status kiln_nbits_check(kiln_run_ctx *c, const kiln_nbits_params *p)
{
    const kiln_value *A = kiln_run_in(c, NB_A), *B = kiln_run_in(c, NB_B), *S = kiln_run_in(c, NB_SCALES);
    const kiln_value *zp = kiln_run_in(c, NB_ZP), *gi = kiln_run_in(c, NB_GIDX), *bias = kiln_run_in(c, NB_BIAS);
    if (!B || !S) return kiln_run_fail(c, KILN_ERR_MODEL, "needs B and scales");
    int64_t nb = p->N * p->n_blocks;
    if (A->rank < 1 || A->dims[A->rank - 1] != p->K)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "A's last dim must be K = %lld", (long long)p->K);
    if (B->dtype != KILN_DTYPE_UINT8 || B->numel != nb * p->blob || B->rank < 2 || B->dims[0] != p->N)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "B must be uint8 [%lld, %lld, %lld]", (long long)p->N,
                             (long long)p->n_blocks, (long long)p->blob);
    if ((S->dtype != KILN_DTYPE_FLOAT32 && S->dtype != KILN_DTYPE_FLOAT16) || S->numel != nb)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "scales must be float32/float16 with N * n_blocks = %lld elements", (long long)nb);
    if (zp) {
        int64_t packed = p->N * ((p->n_blocks * p->bits + 7) / 8);
        if (!(zp->dtype == KILN_DTYPE_UINT8 && zp->numel == packed) && !(zp->dtype == S->dtype && zp->numel == nb))
            return kiln_run_fail(c, KILN_ERR_SHAPE, "zero_points must be uint8 [%lld] (packed) or %s [%lld]", (long long)packed,
                                 kiln_dtype_name(S->dtype), (long long)nb);
    }
    if (gi) {
        if (zp && zp->dtype == KILN_DTYPE_UINT8)
            return kiln_run_fail(c, KILN_ERR_MODEL, "g_idx with packed zero points is not supported");
        if (gi->dtype != KILN_DTYPE_INT32 || gi->numel != p->K)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "g_idx must be int32 [%lld]", (long long)p->K);
        for (int64_t k = 0; k < p->K; k++) {
            int32_t g = ((const int32_t *)gi->data)[k];
            if (g < 0 || g >= p->n_blocks)
                return kiln_run_fail(c, KILN_ERR_SHAPE, "g_idx[%lld] = %d is outside [0, %lld)", (long long)k, g,
                                     (long long)p->n_blocks);
        }
    }
    if (bias && (bias->numel != p->N || bias->dtype != A->dtype))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "bias must be %s [%lld]", kiln_dtype_name(A->dtype), (long long)p->N);
    return KILN_OK;
}

bool kiln_nbits_quantizes_a(const kiln_node *n, bool float_zero_points)
{
    const kiln_nbits_params *p = n->params;
    bool has_gidx = n->n_in > NB_GIDX && n->in[NB_GIDX];
    return p->accuracy_level == 4 && p->bits == 4 && !float_zero_points && !has_gidx && kiln_ir_constant(n->in[NB_B]);
}

float kiln_nbits_quantize_a(const float *a, int64_t n, int8_t *q)
{
    /* comparisons rather than fmaxf/fminf (library calls at -O2), with their NaN behaviour */
    float amax = 0;
    for (int64_t i = 0; i < n; i++) {
        float t = fabsf(a[i]);
        amax = t > amax ? t : amax;
    }
    float inv = amax > 0 ? 127.0f / amax : 0.0f;
    /* adding and taking away 1.5 * 2^23 rounds half to even (|x| <= 127), as nearbyintf in the
     * default rounding mode does, without a library call */
    for (int64_t i = 0; i < n; i++) {
        float v = a[i] * inv;
        v = v >= -127.0f ? (v <= 127.0f ? v : 127.0f) : -127.0f;
        q[i] = (int8_t)((v + 0x1.8p23f) - 0x1.8p23f);
    }
    return amax / 127.0f;
}

void kiln_nbits_block(const kiln_nbits_params *p, const kiln_value *scales, const kiln_value *zp, int64_t n,
                      int64_t blk, float *scale, float *zero)
{
    int64_t i = n * p->n_blocks + blk;
    *scale = (float)kiln_load_f64(scales->dtype, scales->data, i);
    if (!zp) {
        *zero = (float)(1 << (p->bits - 1));
    } else if (zp->dtype == KILN_DTYPE_UINT8) {
        const uint8_t *z = zp->data;
        if (p->bits == 8) {
            *zero = z[i];
        } else {
            uint8_t byte = z[n * ((p->n_blocks + 1) / 2) + blk / 2];
            *zero = (float)((byte >> (4 * (blk & 1))) & 15);
        }
    } else {
        *zero = (float)kiln_load_f64(zp->dtype, zp->data, i);
    }
}

float kiln_nbits_weight(const kiln_nbits_params *p, const kiln_value *B, const kiln_value *scales,
                        const kiln_value *zp, const kiln_value *gidx, int64_t n, int64_t k)
{
    int64_t blk = k / p->block_size, in = k % p->block_size;
    const uint8_t *row = (const uint8_t *)B->data + (n * p->n_blocks + blk) * p->blob;
    int q = p->bits == 8 ? row[in] : (row[in / 2] >> (4 * (in & 1))) & 15;
    float s, z;
    kiln_nbits_block(p, scales, zp, n, gidx ? ((const int32_t *)gidx->data)[k] : blk, &s, &z);
    return ((float)q - z) * s;
}

static kiln_status nbits_run(kiln_run_ctx *c)
{
    const kiln_nbits_params *p = kiln_run_node(c)->params;
    KILN_TRY(kiln_nbits_check(c, p));
    const kiln_value *A = kiln_run_in(c, NB_A), *B = kiln_run_in(c, NB_B), *S = kiln_run_in(c, NB_SCALES);
    const kiln_value *zp = kiln_run_in(c, NB_ZP), *gi = kiln_run_in(c, NB_GIDX), *bias = kiln_run_in(c, NB_BIAS);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t K = p->K, N = p->N, M = A->numel / K;
    float *w = malloc((size_t)(N * K + K) * sizeof *w + (size_t)p->block_size);
    if (!w) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    float *a = w + N * K; /* one row of A as the dot products see it */
    int8_t *q = (int8_t *)(a + K);
    bool quant = kiln_nbits_quantizes_a(kiln_run_node(c), zp && zp->dtype != KILN_DTYPE_UINT8);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) w[n * K + k] = kiln_nbits_weight(p, B, S, zp, gi, n, k);
    for (int64_t m = 0; m < M; m++) {
        for (int64_t k = 0; k < K; k++) a[k] = (float)kiln_load_f64(A->dtype, A->data, m * K + k);
        for (int64_t k0 = 0; quant && k0 < K; k0 += p->block_size) {
            int64_t len = K - k0 < p->block_size ? K - k0 : p->block_size;
            float sa = kiln_nbits_quantize_a(a + k0, len, q);
            for (int64_t i = 0; i < len; i++) a[k0 + i] = (float)q[i] * sa;
        }
        for (int64_t n = 0; n < N; n++) {
            double acc = bias ? kiln_load_f64(bias->dtype, bias->data, n) : 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)a[k] * w[n * K + k];
            kiln_store_f64(Y->dtype, Y->data, m * N + n, acc);
        }
    }
    free(w);
    return KILN_OK;
}

static const kiln_op_def defs[] = {
    {"com.microsoft", "MatMulNBits", 1, nbits_infer, nbits_run, 0, 0, nbits_parse, sizeof(kiln_nbits_params)},
};

const kiln_op_table kiln_ops_llm_nbits = {defs, sizeof defs / sizeof defs[0]};
