/* ops_llm.c - GPU provider family 'llm': com.microsoft MatMulNBits (4 and 8 bits, every block
 * size, zero points packed, typed or absent, bias; a dequant-GEMV for up to 8 rows of A, else the
 * weight dequantized into workspace and multiplied on cuBLAS), GroupQueryAttention (every case
 * kiln_gqa_prepare resolves, head size up to 256), com.microsoft RotaryEmbedding,
 * SimplifiedLayerNormalization (default domain and com.microsoft) and
 * SkipSimplifiedLayerNormalization with all its outputs, kiln.SiluMul (a gated MLP's activation).
 * float32 and float16 (the normalizations, rotary and SiluMul also bfloat16). The checks the reference makes run here too (the
 * shared helpers of ops/llm.h); a case a kernel does not cover goes to the reference. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "gpu/blas.h"
#include "gpu/gpu.h"
#include "gpu/support.h"
#include "gpu/k_llm.h"
#include "ops/fused.h"
#include "ops/llm.h"
#include "ops/util.h"

#define MS "com.microsoft"

/* Input i (when present, or when required) is a tensor of one of the dtypes in ok (ending in
 * UNDEFINED); else says why. */
static bool input_is(const kiln_node *n, int i, bool required, const kiln_dtype *ok, char *why, size_t size)
{
    const kiln_type *t = kiln_gpu_in_type(n, i);
    if (!t) {
        if (required) snprintf(why, size, "input %d is missing", i);
        return !required;
    }
    if (t->kind != KILN_VALUE_TENSOR) {
        snprintf(why, size, "input %d is not a tensor", i);
        return false;
    }
    for (int k = 0; ok[k] != KILN_DTYPE_UNDEFINED; k++)
        if (t->dtype == ok[k]) return true;
    snprintf(why, size, "input %d dtype %s", i, kiln_dtype_name(t->dtype));
    return false;
}

static const kiln_dtype f32_f16[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT16, KILN_DTYPE_UNDEFINED};
static const kiln_dtype floats[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT16, KILN_DTYPE_BFLOAT16, KILN_DTYPE_UNDEFINED};

/* Input i, when present, has input 0's dtype. */
/* ---- MatMulNBits ---- */

static bool nbits_supports(const kiln_node *n, char *why, size_t size)
{
    static const kiln_dtype u8[] = {KILN_DTYPE_UINT8, KILN_DTYPE_UNDEFINED};
    if (!input_is(n, NB_A, true, f32_f16, why, size) || !input_is(n, NB_B, true, u8, why, size) ||
        !input_is(n, NB_SCALES, true, f32_f16, why, size) || !kiln_gpu_same_dtype(n, NB_BIAS, 0, why, size))
        return false;
    if (kiln_gpu_in_type(n, NB_GIDX)) {
        snprintf(why, size, "g_idx");
        return false;
    }
    const kiln_type *z = kiln_gpu_in_type(n, NB_ZP), *s = kiln_gpu_in_type(n, NB_SCALES);
    if (z && z->dtype != KILN_DTYPE_UINT8 && z->dtype != s->dtype) {
        snprintf(why, size, "zero_points dtype %s", kiln_dtype_name(z->dtype));
        return false;
    }
    return true;
}

static kiln_status nbits_run(kiln_run_ctx *c)
{
    const kiln_nbits_params *p = kiln_run_node(c)->params;
    KILN_TRY(kiln_nbits_check(c, p));
    const kiln_value *A = kiln_run_in(c, NB_A), *B = kiln_run_in(c, NB_B), *S = kiln_run_in(c, NB_SCALES);
    const kiln_value *zp = kiln_run_in(c, NB_ZP), *bias = kiln_run_in(c, NB_BIAS);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || Y->dtype != A->dtype || kiln_run_in(c, NB_GIDX) || ((uintptr_t)B->data & 3)) return kiln_gpu_fallback(c);
    kiln_gpu_nbits a = {
        .dtype = A->dtype, .s_dtype = S->dtype, .A = A->data, .B = B->data, .scales = S->data,
        .zp = zp ? zp->data : NULL, .bias = bias ? bias->data : NULL, .Y = Y->data,
        .M = A->numel / p->K, .N = p->N, .K = p->K, .bits = p->bits, .block_size = p->block_size,
        .n_blocks = p->n_blocks, .blob = p->blob, .sm_count = kiln_gpu_sm_count(c),
    };
    const kiln_node *node = kiln_run_node(c);
    a.const_weights = kiln_ir_constant(node->in[NB_B]) && kiln_ir_constant(node->in[NB_SCALES]) &&
                      (!zp || kiln_ir_constant(node->in[NB_ZP]));
    a.zp_mode = !zp ? KILN_GPU_ZP_NONE : zp->dtype == KILN_DTYPE_UINT8 ? KILN_GPU_ZP_PACKED : KILN_GPU_ZP_TYPED;
    if (!Y->numel) return KILN_OK;
    gpuStream_t st = kiln_gpu_stream(c);
    if (a.M <= KILN_GPU_NBITS_GEMV_MAX_M) {
        int splits = kiln_gpu_nbits_splits(&a);
        void *part;
        KILN_TRY(kiln_gpu_workspace(c, (size_t)splits * (size_t)a.M * (size_t)a.N * sizeof(float), &part));
        return kiln_gpu_check(c, kiln_gpu_nbits_gemv(st, &a, splits, part), "MatMulNBits GEMV");
    }
    /* Y^T (N x M, column-major) = W^T (W [N, K] row-major read as K x N, transposed) A^T */
    if (a.M > INT_MAX || a.N > INT_MAX || a.K > INT_MAX) return kiln_gpu_fallback(c);
    size_t es = kiln_dtype_size(A->dtype);
    void *W, *hv;
    KILN_TRY(kiln_gpu_workspace(c, (size_t)a.N * (size_t)a.K * es, &W));
    KILN_TRY(kiln_gpu_check(c, kiln_gpu_nbits_dequant(st, &a, W), "MatMulNBits dequantization"));
    KILN_TRY(kiln_gpu_blas(c, &hv));
    gpuDataType_t t = A->dtype == KILN_DTYPE_FLOAT16 ? GPU_R_16F : GPU_R_32F;
    float alpha = 1.0f, beta = 0.0f;
    gpublasStatus_t bs = gpublasGemmStridedBatchedEx((gpublasHandle_t)hv, GPUBLAS_OP_T, GPUBLAS_OP_N, (int)a.N, (int)a.M,
                                                     (int)a.K, &alpha, W, t, (int)a.K, 0, A->data, t, (int)a.K, 0, &beta,
                                                     Y->data, t, (int)a.N, 0, 1, GPUBLAS_COMPUTE_32F,
                                                     GPUBLAS_GEMM_DEFAULT);
    if (bs != GPUBLAS_STATUS_SUCCESS)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "cuBLAS GemmStridedBatchedEx (MatMulNBits m %lld, n %lld, k %lld): %s",
                             (long long)a.N, (long long)a.M, (long long)a.K, gpublasGetStatusString(bs));
    return kiln_gpu_check(c, kiln_gpu_nbits_bias(st, &a), "MatMulNBits bias");
}

/* ---- GroupQueryAttention ---- */

static bool gqa_supports(const kiln_node *n, char *why, size_t size)
{
    if (!input_is(n, GQA_Q, true, f32_f16, why, size)) return false;
    const kiln_gqa_params *p = n->params;
    const kiln_type *q = kiln_gpu_in_type(n, GQA_Q);
    if (p && q->rank == 3 && kiln_dim_is_const(q->dims[2])) {
        int64_t heads = kiln_gpu_in_type(n, GQA_K) ? p->num_heads : p->num_heads + 2 * p->kv_num_heads;
        if (heads > 0 && q->dims[2].c / heads > KILN_GPU_GQA_MAX_HEAD) {
            snprintf(why, size, "head size %lld > %d", (long long)(q->dims[2].c / heads), KILN_GPU_GQA_MAX_HEAD);
            return false;
        }
    }
    if (n->n_out > 3 && n->out[3]) {
        snprintf(why, size, "output_qk");
        return false;
    }
    return true;
}

/* Unless KILN_GPU_GQA_DECODE=0 in the environment (read once, an A/B): decode steps of up to
 * KILN_GPU_GQA_DECODE_MAX_G query heads a KV head take the one-kernel path (k_llm.h). */
static bool gqa_decode_enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("KILN_GPU_GQA_DECODE");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

/* 256-byte steps in the workspace. */
static size_t ws_align(size_t n) { return (n + 255) / 256 * 256; }

static kiln_status gqa_run(kiln_run_ctx *c)
{
    kiln_gqa_call g;
    KILN_TRY(kiln_gqa_prepare(c, &g));
    int64_t L = g.present_len;
    size_t es = kiln_dtype_size(g.q->dtype);
    bool aliased = g.past_k && ((g.present_k && g.present_k->data == g.past_k->data) ||
                                (g.present_v && g.present_v->data == g.past_v->data));
    if (g.H > KILN_GPU_GQA_MAX_HEAD || g.N > 65535 || g.B > 65535 || (g.shared && g.past_len != L) ||
        (aliased && !g.shared))
        return kiln_gpu_fallback(c);
    /* workspace: [K cache][V cache] (for absent present outputs), seqlens_k, position_ids */
    size_t kv = (size_t)(g.B * g.Nkv * L * g.H) * es;
    size_t at_k = 0, at_v = g.present_k ? 0 : ws_align(kv), at_sl = at_v + (g.present_v ? 0 : ws_align(kv));
    size_t at_pos = at_sl + ws_align((size_t)g.B * sizeof(int32_t));
    size_t pos_bytes = g.pos ? (size_t)(g.B * g.S) * sizeof(int64_t) : 0;
    /* split keys: the partial softmax states (a run is 16 keys and more of the buffer) */
    bool decode = g.S == 1 && g.N % g.Nkv == 0 && g.N / g.Nkv <= KILN_GPU_GQA_DECODE_MAX_G && gqa_decode_enabled();
    int splits = kiln_gpu_gqa_splits(decode ? g.B * g.Nkv : g.B * g.S * g.N, L, kiln_gpu_sm_count(c));
    int32_t *tickets = NULL;
    if (decode && splits > 1) {
        KILN_TRY(kiln_gpu_tickets(c, g.B * g.Nkv, &tickets));
        if (!tickets) splits = kiln_gpu_gqa_splits(g.B * g.S * g.N, L, kiln_gpu_sm_count(c)), decode = false;
    }
    size_t at_part = ws_align(at_pos + pos_bytes);
    size_t part_bytes = splits > 1 ? (size_t)(g.B * g.N * g.S * splits * (g.H + 2)) * sizeof(float) : 0;
    unsigned char *ws;
    KILN_TRY(kiln_gpu_workspace(c, at_part + part_bytes, (void **)&ws));
    const int32_t *seqlens = (const int32_t *)(ws + at_sl);
    const int64_t *pos = g.pos && g.rd ? (const int64_t *)(ws + at_pos) : NULL;
    int32_t *bad = NULL, code = 0;
    if (g.rows_on_device) { /* read there, checked by the kernels */
        seqlens = g.seqlens;
        pos = g.pos && g.rd ? g.pos->data : NULL;
        KILN_TRY(kiln_gpu_check_word(c, &bad, &code));
    } else {
        KILN_TRY(kiln_gpu_upload(c, ws + at_sl, g.seqlens, (size_t)g.B * sizeof(int32_t)));
        if (pos) KILN_TRY(kiln_gpu_upload(c, ws + at_pos, g.pos->data, pos_bytes));
    }
    kiln_gpu_gqa a = {
        .dtype = g.q->dtype, .q = g.q->data, .k = g.packed ? NULL : g.k->data, .v = g.packed ? NULL : g.v->data,
        .past_k = g.past_k ? g.past_k->data : NULL, .past_v = g.past_v ? g.past_v->data : NULL,
        .kc = g.present_k ? g.present_k->data : ws + at_k, .vc = g.present_v ? g.present_v->data : ws + at_v,
        .y = g.y->data, .seqlens = seqlens, .pos = pos, .bad = bad, .bad_code = code,
        .rot_rows = g.rd ? g.cos->dims[0] : 0,
        .cos = g.rd ? g.cos->data : NULL, .sin = g.rd ? g.sin->data : NULL, .bias = g.bias ? g.bias->data : NULL,
        .sink = g.sink ? g.sink->data : NULL, .bias_b = g.bias_b, .bias_h = g.bias_h, .bias_s = g.bias_s,
        .B = g.B, .S = g.S, .N = g.N, .Nkv = g.Nkv, .H = g.H, .past_len = g.past_len, .L = L, .rd = g.rd,
        .window = g.window, .scale = g.scale, .softcap = g.softcap, .packed = g.packed, .first_prompt = g.first_prompt,
        .has_past = g.past_k != NULL, .shared = g.shared, .interleaved = g.interleaved, .smooth = g.smooth,
        .splits = splits, .part = splits > 1 ? (float *)(ws + at_part) : NULL, .decode = decode, .tickets = tickets,
    };
    return kiln_gpu_check(c, kiln_gpu_gqa_run(kiln_gpu_stream(c), &a), "GroupQueryAttention");
}

/* ---- com.microsoft RotaryEmbedding ---- */

static bool rotary_supports(const kiln_node *n, char *why, size_t size)
{
    if (!input_is(n, 0, true, floats, why, size) || !kiln_gpu_same_dtype(n, 2, 0, why, size) || !kiln_gpu_same_dtype(n, 3, 0, why, size))
        return false;
    if (kiln_attr_int(n, "is_packed_batching", 0)) {
        snprintf(why, size, "is_packed_batching");
        return false;
    }
    return true;
}

/* Resolves the call as the reference does; anything it would refuse goes to it. */
static kiln_status rotary_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *pos = kiln_run_in(c, 1), *cosv = kiln_run_in(c, 2), *sinv = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || !pos || !cosv || !sinv || (X->rank != 3 && X->rank != 4) || cosv->rank != 2 || sinv->rank != 2 ||
        sinv->dims[0] != cosv->dims[0] || sinv->dims[1] != cosv->dims[1] || cosv->dtype != X->dtype ||
        sinv->dtype != X->dtype || !kiln_dtype_is_int(pos->dtype))
        return kiln_gpu_fallback(c);
    bool rank3 = X->rank == 3, interleaved = kiln_attr_int(n, "interleaved", 0) != 0;
    int64_t B = X->dims[0], S = rank3 ? X->dims[1] : X->dims[2], rd = kiln_attr_int(n, "rotary_embedding_dim", 0);
    int64_t H, Nh = kiln_attr_int(n, "num_heads", 0);
    if (rank3) {
        if (rd == 0) H = 2 * cosv->dims[1], Nh = H ? X->dims[2] / H : 0;
        else H = Nh > 0 ? X->dims[2] / Nh : 0;
        if (H <= 0 || Nh <= 0 || Nh * H != X->dims[2]) return kiln_gpu_fallback(c);
    } else {
        Nh = X->dims[1], H = X->dims[3];
    }
    if (rd == 0) rd = H;
    if (rd > H || rd % 2 || cosv->dims[1] != rd / 2) return kiln_gpu_fallback(c);
    bool offset = pos->numel == 1;
    if (!offset && (pos->rank != 2 || pos->dims[0] != B || pos->dims[1] != S)) return kiln_gpu_fallback(c);
    /* positions on the host: checked against the caches, uploaded as int64 */
    int64_t first = offset ? kiln_load_i64(pos->dtype, pos->data, 0) : 0;
    for (int64_t k = 0; k < (offset ? S : pos->numel); k++) {
        int64_t p = offset ? first + k : kiln_load_i64(pos->dtype, pos->data, k);
        if (p < 0 || p >= cosv->dims[0]) return kiln_gpu_fallback(c); /* the reference reports it */
    }
    if (!Y->numel) return KILN_OK;
    int64_t *dpos = NULL;
    if (!offset) {
        if (pos->dtype != KILN_DTYPE_INT64) return kiln_gpu_fallback(c);
        KILN_TRY(kiln_gpu_workspace(c, (size_t)pos->numel * sizeof(int64_t), (void **)&dpos));
        KILN_TRY(kiln_gpu_upload(c, dpos, pos->data, (size_t)pos->numel * sizeof(int64_t)));
    }
    gpuError_t e = kiln_gpu_rotary(kiln_gpu_stream(c), X->dtype, X->data, Y->data, B, S, Nh, H, rd, rank3, interleaved,
                                   dpos, first, cosv->data, sinv->data);
    return kiln_gpu_check(c, e, "RotaryEmbedding");
}

/* ---- SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization ---- */

static bool sln_supports(const kiln_node *n, char *why, size_t size)
{
    return input_is(n, 0, true, floats, why, size) && input_is(n, 1, true, floats, why, size) &&
           kiln_gpu_same_dtype(n, 1, 0, why, size);
}

static kiln_status sln_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *Sc = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0), *Inv = kiln_run_out(c, 1);
    int axis;
    if (!Y || !Sc || !kiln_axis_norm(kiln_attr_int(n, "axis", -1), X->rank, &axis) || Sc->dtype != X->dtype ||
        (Inv && Inv->dtype != KILN_DTYPE_FLOAT32))
        return kiln_gpu_fallback(c);
    int64_t h = 1;
    for (int i = axis; i < X->rank; i++) h *= X->dims[i];
    bool fits = Sc->rank <= X->rank - axis;
    for (int i = 0; fits && i < Sc->rank; i++) fits = Sc->dims[i] == X->dims[X->rank - Sc->rank + i];
    if (!fits || !Sc->numel || h % Sc->numel) return kiln_gpu_fallback(c);
    if (!X->numel) return KILN_OK;
    gpuError_t e = kiln_gpu_rms_rows(kiln_gpu_stream(c), X->dtype, X->data, NULL, 0, NULL, Sc->data, Sc->numel, Y->data,
                                     NULL, NULL, Inv ? Inv->data : NULL, X->numel / h, h,
                                     kiln_attr_float(n, "epsilon", 1e-5f));
    return kiln_gpu_check(c, e, "SimplifiedLayerNormalization");
}

static bool skip_sln_supports(const kiln_node *n, char *why, size_t size)
{
    for (int i = 0; i < 4; i++)
        if (!input_is(n, i, i < 3, floats, why, size) || !kiln_gpu_same_dtype(n, i, 0, why, size)) return false;
    return true;
}

/* inputs: input [.., H] (rank 2 or 3), skip (input's shape or its last dims), gamma [H], bias
 * [H]?; outputs: output, mean (zeros), inv_std_var, input_skip_bias_sum. */
static kiln_status skip_sln_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *S = kiln_run_in(c, 1), *G = kiln_run_in(c, 2), *bias = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0), *Mean = kiln_run_out(c, 1), *Inv = kiln_run_out(c, 2), *Sum = kiln_run_out(c, 3);
    if (!Y || !S || !G || (X->rank != 2 && X->rank != 3)) return kiln_gpu_fallback(c);
    int64_t h = X->dims[X->rank - 1];
    bool ok = G->rank == 1 && G->dims[0] == h && (!bias || (bias->rank == 1 && bias->dims[0] == h)) && S->rank >= 2 &&
              S->rank <= X->rank && S->dtype == X->dtype && G->dtype == X->dtype && (!bias || bias->dtype == X->dtype) &&
              (!Mean || Mean->dtype == KILN_DTYPE_FLOAT32) && (!Inv || Inv->dtype == KILN_DTYPE_FLOAT32) &&
              (!Sum || Sum->dtype == X->dtype);
    for (int k = 0; ok && k < S->rank; k++) {
        int64_t d = S->dims[S->rank - 1 - k], want = X->dims[X->rank - 1 - k];
        ok = d == want || (k == 2 && d == 1);
    }
    if (!ok || (X->numel && !S->numel)) return kiln_gpu_fallback(c);
    if (!X->numel) return KILN_OK;
    float eps = kiln_attr_float(kiln_run_node(c), "epsilon", 1e-12f);
    gpuError_t e = kiln_gpu_rms_rows(kiln_gpu_stream(c), X->dtype, X->data, S->data, S->numel, bias ? bias->data : NULL,
                                     G->data, h, Y->data, Sum ? Sum->data : NULL, Mean ? Mean->data : NULL,
                                     Inv ? Inv->data : NULL, X->numel / h, h, eps);
    return kiln_gpu_check(c, e, "SkipSimplifiedLayerNormalization");
}

/* ---- kiln.SiluMul (the GPU passes' gated-MLP activation, src/passes/fuse_silu_mul.c) ---- */

static bool silu_mul_supports(const kiln_node *n, char *why, size_t size)
{
    return input_is(n, 0, true, floats, why, size) && (n->n_in < 2 || (input_is(n, 1, true, floats, why, size) &&
                                                                        kiln_gpu_same_dtype(n, 1, 0, why, size)));
}

static kiln_status silu_mul_run(kiln_run_ctx *c)
{
    const kiln_value *G = kiln_run_in(c, 0), *U = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_silu_mul_rows r;
    if (!Y || Y->dtype != G->dtype || !kiln_silu_mul_rows_of(G, U, Y, &r)) return kiln_gpu_fallback(c);
    return kiln_gpu_check(c, kiln_gpu_silu_mul(kiln_gpu_stream(c), G->dtype, r.g, r.u, Y->data, r.total, r.n, r.stride),
                          "SiluMul");
}

/* ---- the table ---- */

static const kiln_gpu_op ops[] = {
    {MS, "MatMulNBits", nbits_supports, nbits_run},
    {MS, "GroupQueryAttention", gqa_supports, gqa_run, KILN_OP_IN(GQA_SEQLENS) | KILN_OP_IN(GQA_POS)},
    {MS, "RotaryEmbedding", rotary_supports, rotary_run},
    {"", "SimplifiedLayerNormalization", sln_supports, sln_run},
    {MS, "SimplifiedLayerNormalization", sln_supports, sln_run},
    {MS, "SkipSimplifiedLayerNormalization", skip_sln_supports, skip_sln_run},
    {"kiln", "SiluMul", silu_mul_supports, silu_mul_run},
};

const kiln_gpu_op_table kiln_gpu_ops_llm = {ops, sizeof ops / sizeof ops[0]};
