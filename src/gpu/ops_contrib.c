/* ops_contrib.c - GPU provider family 'contrib': the float com.microsoft operators of ONNX
 * Runtime's transformer optimizer and offline files, float32 and float16 (FusedMatMul, FusedGemm
 * and FusedConv also bfloat16): Gelu, FastGelu, BiasGelu, QuickGelu, BiasAdd,
 * SkipLayerNormalization (every output), EmbedLayerNormalization (mask_index and embedding_sum),
 * FusedMatMul (on ops_blas.c's cuBLAS products), FusedGemm and FusedConv (ops_blas.c's Gemm and
 * ops_cnn.c's Conv, then the activation, FusedConv's Z added first; Z and ReLU in cuDNN's
 * epilogue where it runs; kiln.FusedConv of the GPU passes too), Attention (the packed QKV
 * projection on cuBLAS, every mask_index form, unidirectional, past and present) and
 * MultiHeadAttention (separate, packed QKV and packed KV inputs, key/value as [B, N, L, H],
 * bias, key_padding_mask, attention_bias, past and present, the qk output). The run-time checks
 * are the reference's own (ops/contrib_internal.h, ops/contrib_attn.h): whatever the reference
 * would refuse, and the few cases the kernels do not take, go to it (kiln_gpu_fallback). Kernels
 * in k_contrib.cu. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "gpu/gpu.h"
#include "gpu/support.h"
#include "gpu/k_blas.h"
#include "gpu/k_contrib.h"
#include "gpu/kshape.h"
#include "gpu/ops_core.h"
#include "ops/contrib_attn.h"
#include "ops/contrib_internal.h"
#include "ops/fused.h"

#define MS "com.microsoft"

static const kiln_dtype f32_f16[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT16, KILN_DTYPE_UNDEFINED};
static const kiln_dtype floats[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT16, KILN_DTYPE_BFLOAT16, KILN_DTYPE_UNDEFINED};
static const kiln_dtype ints[] = {KILN_DTYPE_INT32, KILN_DTYPE_INT64, KILN_DTYPE_UNDEFINED};
static const kiln_dtype i32[] = {KILN_DTYPE_INT32, KILN_DTYPE_UNDEFINED};

/* Inputs first..last (those present) are input first's float dtype (one of ok). */
static bool floats_alike(const kiln_node *n, int first, int last, const kiln_dtype *ok, char *why, size_t size)
{
    if (!kiln_gpu_input_is(n, first, true, ok, why, size)) return false;
    for (int i = first + 1; i <= last; i++)
        if (!kiln_gpu_same_dtype(n, i, first, why, size)) return false;
    return true;
}

/* Run time: every present value of vs has dtype dt. */
static bool all_dtype(kiln_dtype dt, int count, const kiln_value *const *vs)
{
    for (int i = 0; i < count; i++)
        if (vs[i] && vs[i]->dtype != dt) return false;
    return true;
}

static const void *data_of(const kiln_value *v) { return v ? v->data : NULL; }

/* 256-byte steps in the workspace. */
static size_t ws_align(size_t n) { return (n + 255) / 256 * 256; }

/* ---- Gelu, FastGelu, BiasGelu, QuickGelu: Y = f(X + bias) ---- */

static bool gelu_supports(const kiln_node *n, char *why, size_t size)
{
    return floats_alike(n, 0, 1, f32_f16, why, size);
}

static kiln_status gelu_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *b = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    bool quick = !strcmp(n->op_type, "QuickGelu"), need_bias = !strcmp(n->op_type, "BiasGelu");
    int64_t last;
    char msg[160];
    const kiln_value *vs[] = {X, b, Y};
    if (kiln_contrib_bias_check(X, b, need_bias, &last, msg, sizeof msg) || !Y || !kiln_gpu_dtype_in(X->dtype, f32_f16) ||
        !all_dtype(X->dtype, 3, vs) || Y->numel != X->numel)
        return kiln_gpu_fallback(c);
    int kind = quick ? KILN_GPU_GELU_QUICK : !strcmp(n->op_type, "FastGelu") ? KILN_GPU_GELU_TANH : KILN_GPU_GELU_ERF;
    float alpha = quick ? kiln_attr_float(n, "alpha", 1.702f) : 0.0f;
    gpuError_t e = kiln_gpu_contrib_gelu(kiln_gpu_stream(c), X->dtype, kind, X->data, data_of(b), Y->data, X->numel, last, alpha);
    return kiln_gpu_check(c, e, n->op_type);
}

/* ---- BiasAdd: Y = X + bias + skip ---- */

static bool bias_add_supports(const kiln_node *n, char *why, size_t size)
{
    return floats_alike(n, 0, 2, f32_f16, why, size);
}

static kiln_status bias_add_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *b = kiln_run_in(c, 1), *S = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    char msg[160];
    const kiln_value *vs[] = {X, b, S, Y};
    if (kiln_contrib_bias_add_check(X, b, S, msg, sizeof msg) || !Y || !kiln_gpu_dtype_in(X->dtype, f32_f16) ||
        !all_dtype(X->dtype, 4, vs))
        return kiln_gpu_fallback(c);
    gpuError_t e = kiln_gpu_contrib_bias_add(kiln_gpu_stream(c), X->dtype, X->data, b->data, S->data, Y->data, X->numel,
                                             X->dims[2]);
    return kiln_gpu_check(c, e, "BiasAdd");
}

/* ---- SkipLayerNormalization: inputs input, skip, gamma, beta?, bias?; outputs output, mean?,
 * inv_std_var? (float32), input_skip_bias_sum? ---- */

static bool skip_ln_supports(const kiln_node *n, char *why, size_t size)
{
    return floats_alike(n, 0, 4, f32_f16, why, size);
}

static kiln_status skip_ln_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *S = kiln_run_in(c, 1), *G = kiln_run_in(c, 2), *beta = kiln_run_in(c, 3),
                     *bias = kiln_run_in(c, 4);
    kiln_value *Y = kiln_run_out(c, 0), *Mean = kiln_run_out(c, 1), *Inv = kiln_run_out(c, 2), *Sum = kiln_run_out(c, 3);
    int64_t h;
    char msg[160];
    const kiln_value *vs[] = {X, S, G, beta, bias, Y, Sum};
    if (kiln_contrib_skip_check(X, S, G, beta, bias, &h, msg, sizeof msg) || !Y || !kiln_gpu_dtype_in(X->dtype, f32_f16) ||
        !all_dtype(X->dtype, 7, vs) || (Mean && Mean->dtype != KILN_DTYPE_FLOAT32) ||
        (Inv && Inv->dtype != KILN_DTYPE_FLOAT32) || (X->numel && !S->numel))
        return kiln_gpu_fallback(c);
    if (!X->numel || !h) return KILN_OK;
    float eps = kiln_attr_float(kiln_run_node(c), "epsilon", 1e-12f);
    gpuError_t e = kiln_gpu_contrib_skip_ln(kiln_gpu_stream(c), X->dtype, X->data, S->data, S->numel, data_of(bias),
                                            G->data, data_of(beta), Y->data, Sum ? Sum->data : NULL,
                                            Mean ? Mean->data : NULL, Inv ? Inv->data : NULL, X->numel / h, h, eps);
    return kiln_gpu_check(c, e, "SkipLayerNormalization");
}

/* ---- EmbedLayerNormalization ---- */

static bool embed_ln_supports(const kiln_node *n, char *why, size_t size)
{
    if (!kiln_gpu_input_is(n, KILN_EMBED_IDS, true, ints, why, size) || !kiln_gpu_input_is(n, KILN_EMBED_SEG, false, ints, why, size) ||
        !kiln_gpu_input_is(n, KILN_EMBED_MASK, false, ints, why, size) || !kiln_gpu_input_is(n, KILN_EMBED_POSIDS, false, ints, why, size) ||
        !kiln_gpu_input_is(n, KILN_EMBED_WORD, true, f32_f16, why, size))
        return false;
    static const int tables[] = {KILN_EMBED_POS, KILN_EMBED_SEGEMB, KILN_EMBED_GAMMA, KILN_EMBED_BETA};
    for (size_t k = 0; k < sizeof tables / sizeof tables[0]; k++)
        if (!kiln_gpu_same_dtype(n, tables[k], KILN_EMBED_WORD, why, size)) return false;
    return true;
}

static kiln_status embed_ln_run(kiln_run_ctx *c)
{
    const kiln_value *in[KILN_EMBED_N_IN];
    for (int i = 0; i < KILN_EMBED_N_IN; i++) in[i] = kiln_run_in(c, i);
    kiln_value *Y = kiln_run_out(c, 0), *MI = kiln_run_out(c, 1), *Sum = kiln_run_out(c, 2);
    char msg[192];
    if (kiln_contrib_embed_check(in, msg, sizeof msg) || !Y) return kiln_gpu_fallback(c);
    const kiln_value *ids = in[KILN_EMBED_IDS], *seg = in[KILN_EMBED_SEG], *we = in[KILN_EMBED_WORD],
                     *pe = in[KILN_EMBED_POS], *se = in[KILN_EMBED_SEGEMB], *mask = in[KILN_EMBED_MASK],
                     *pos = in[KILN_EMBED_POSIDS];
    const kiln_value *tabs[] = {we, pe, se, in[KILN_EMBED_GAMMA], in[KILN_EMBED_BETA], Y, Sum};
    if (!kiln_gpu_dtype_in(we->dtype, f32_f16) || !all_dtype(we->dtype, 7, tabs) || !kiln_gpu_dtype_in(ids->dtype, ints) ||
        (seg && !kiln_gpu_dtype_in(seg->dtype, ints)) || (pos && !kiln_gpu_dtype_in(pos->dtype, ints)) ||
        (mask && !kiln_gpu_dtype_in(mask->dtype, ints)) || (MI && MI->dtype != KILN_DTYPE_INT32))
        return kiln_gpu_fallback(c);
    gpuStream_t s = kiln_gpu_stream(c);
    kiln_gpu_embed a = {
        .dtype = we->dtype, .ids = ids->data, .seg = data_of(seg), .pos = data_of(pos),
        .ids_64 = ids->dtype == KILN_DTYPE_INT64, .seg_64 = seg && seg->dtype == KILN_DTYPE_INT64,
        .pos_64 = pos && pos->dtype == KILN_DTYPE_INT64, .pos_one_batch = pos && pos->dims[0] == 1,
        .word = we->data, .pos_emb = pe->data, .seg_emb = data_of(se), .gamma = in[KILN_EMBED_GAMMA]->data,
        .beta = in[KILN_EMBED_BETA]->data, .y = Y->data, .sum = Sum ? Sum->data : NULL,
        .B = ids->dims[0], .S = ids->dims[1], .H = we->dims[1], .V = we->dims[0], .P = pe->dims[0],
        .G = se ? se->dims[0] : 0, .eps = kiln_attr_float(kiln_run_node(c), "epsilon", 1e-12f),
    };
    KILN_TRY(kiln_gpu_check(c, kiln_gpu_contrib_embed_ln(s, &a), "EmbedLayerNormalization"));
    if (!MI) return KILN_OK;
    gpuError_t e = kiln_gpu_contrib_mask_index(s, data_of(mask), mask && mask->dtype == KILN_DTYPE_INT64, MI->data, a.B, a.S);
    return kiln_gpu_check(c, e, "EmbedLayerNormalization mask_index");
}

/* ---- FusedMatMul: Y = alpha * op(A) @ op(B) ---- */

static bool fused_matmul_supports(const kiln_node *n, char *why, size_t size)
{
    return floats_alike(n, 0, 1, floats, why, size);
}

static kiln_status fused_matmul_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_contrib_mm_view v;
    char msg[160];
    if (!Y || !B || !kiln_contrib_mm_resolve(n, A, B, &v, msg, sizeof msg) || !kiln_gpu_dtype_in(A->dtype, floats) ||
        B->dtype != A->dtype || Y->dtype != A->dtype)
        return kiln_gpu_fallback(c);
    kiln_gpu_mm m = {
        .dtype = A->dtype, .A = A->data, .B = B->data, .Y = Y->data, .M = v.M, .N = v.N, .K = v.K,
        .a_m = v.a_rs, .a_k = v.a_cs, .b_k = v.b_rs, .b_n = v.b_cs, .yb = v.yb, .ydims = v.ydims,
        .a_bs = v.a_bs, .b_bs = v.b_bs, .alpha = kiln_attr_float(n, "alpha", 1.0f), .beta = 0.0f,
    };
    bool done;
    KILN_TRY(kiln_gpu_matmul_run(c, &m, &done));
    return done ? KILN_OK : kiln_gpu_fallback(c);
}

/* ---- FusedGemm, FusedConv: Gemm / Conv (+ Z), then the activation ---- */

static int act_code(kiln_contrib_act_kind k)
{
    switch (k) {
    case KILN_CONTRIB_ACT_NONE: return KILN_GPU_ACT_NONE;
    case KILN_CONTRIB_ACT_RELU: return KILN_GPU_ACT_RELU;
    case KILN_CONTRIB_ACT_TANH: return KILN_GPU_ACT_TANH;
    case KILN_CONTRIB_ACT_SIGMOID: return KILN_GPU_ACT_SIGMOID;
    case KILN_CONTRIB_ACT_SOFTSIGN: return KILN_GPU_ACT_SOFTSIGN;
    case KILN_CONTRIB_ACT_SOFTPLUS: return KILN_GPU_ACT_SOFTPLUS;
    case KILN_CONTRIB_ACT_LEAKY_RELU: return KILN_GPU_ACT_LEAKY_RELU;
    case KILN_CONTRIB_ACT_HARD_SIGMOID: return KILN_GPU_ACT_HARD_SIGMOID;
    case KILN_CONTRIB_ACT_ELU: return KILN_GPU_ACT_ELU;
    case KILN_CONTRIB_ACT_SELU: return KILN_GPU_ACT_SELU;
    case KILN_CONTRIB_ACT_THRESHOLDED_RELU: return KILN_GPU_ACT_THRESHOLDED_RELU;
    case KILN_CONTRIB_ACT_SCALED_TANH: return KILN_GPU_ACT_SCALED_TANH;
    case KILN_CONTRIB_ACT_PARAMETRIC_SOFTPLUS: return KILN_GPU_ACT_PARAMETRIC_SOFTPLUS;
    case KILN_CONTRIB_ACT_CLIP: return KILN_GPU_ACT_CLIP;
    }
    return KILN_GPU_ACT_NONE;
}

/* Y = act(Y + Z) in place (Z NULL: act(Y)). */
static kiln_status act_apply(kiln_run_ctx *c, const kiln_contrib_act *a, kiln_value *Y, const kiln_value *Z)
{
    gpuError_t e = kiln_gpu_contrib_act(kiln_gpu_stream(c), Y->dtype, Y->data, data_of(Z), Y->numel, act_code(a->kind),
                                        (float)a->alpha, (float)a->beta, (float)a->gamma);
    return kiln_gpu_check(c, e, "activation");
}

static bool fused_gemm_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_contrib_act a;
    char msg[160];
    if (!kiln_contrib_act_parse(n, false, &a, msg, sizeof msg)) return kiln_gpu_refuse(why, size, "%s", msg);
    return floats_alike(n, 0, 2, floats, why, size);
}

static kiln_status fused_gemm_run(kiln_run_ctx *c)
{
    kiln_contrib_act a;
    char msg[160];
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *C = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    const kiln_value *vs[] = {A, B, C, Y};
    if (!kiln_contrib_act_parse(kiln_run_node(c), false, &a, msg, sizeof msg) || !Y || !kiln_gpu_dtype_in(A->dtype, floats) ||
        !all_dtype(A->dtype, 4, vs))
        return kiln_gpu_fallback(c);
    bool done;
    KILN_TRY(kiln_gpu_gemm_core(c, &done));
    if (!done) return kiln_gpu_fallback(c);
    return act_apply(c, &a, Y, NULL);
}

static bool fused_conv_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_contrib_act a;
    char msg[160];
    if (!kiln_contrib_act_parse(n, true, &a, msg, sizeof msg)) return kiln_gpu_refuse(why, size, "%s", msg);
    if (!floats_alike(n, 0, 3, floats, why, size)) return false;
    const kiln_type *x = kiln_gpu_in_type(n, 0);
    if (x->rank >= 0 && (x->rank < 3 || x->rank > 5)) return kiln_gpu_refuse(why, size, "rank %d (1 to 3 spatial dims)", x->rank);
    return true;
}

/* Y = act(Conv(X, W, B) + Z) for the running FusedConv (com.microsoft's or kiln's): a ReLU and
 * Z in the convolution's epilogue where the core can, else the activation kernel after it. */
static kiln_status fused_conv(kiln_run_ctx *c, const kiln_contrib_act *a)
{
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1), *B = kiln_run_in(c, 2), *Z = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0);
    const kiln_value *vs[] = {X, W, B, Z, Y};
    if (!Y || !W || !kiln_gpu_dtype_in(X->dtype, floats) || !all_dtype(X->dtype, 5, vs)) return kiln_gpu_fallback(c);
    bool same = !Z || Z->rank == Y->rank;
    for (int i = 0; Z && same && i < Y->rank; i++) same = Z->dims[i] == Y->dims[i];
    if (!same) return kiln_gpu_fallback(c); /* the reference reports it */
    bool done;
    kiln_gpu_conv_epi epi = {.Z = data_of(Z), .relu = a->kind == KILN_CONTRIB_ACT_RELU};
    KILN_TRY(kiln_gpu_conv_core(c, epi.relu ? &epi : NULL, &done));
    if (!done) return kiln_gpu_fallback(c);
    return epi.applied ? KILN_OK : act_apply(c, a, Y, Z);
}

static kiln_status fused_conv_run(kiln_run_ctx *c)
{
    kiln_contrib_act a;
    char msg[160];
    if (!kiln_contrib_act_parse(kiln_run_node(c), true, &a, msg, sizeof msg)) return kiln_gpu_fallback(c);
    return fused_conv(c, &a);
}

/* kiln.FusedConv as the GPU passes make it (src/passes/fuse_residual.c, fuse_activation.c):
 * Z and ReLU or no activation. */
static bool kiln_fused_conv_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_act_kind k = kiln_fused_of(n)->act.kind;
    if (k != KILN_ACT_NONE && k != KILN_ACT_RELU) return kiln_gpu_refuse(why, size, "activation %s", kiln_act_name(k));
    if (!floats_alike(n, 0, 3, floats, why, size)) return false;
    const kiln_type *x = kiln_gpu_in_type(n, 0);
    if (x->rank >= 0 && (x->rank < 3 || x->rank > 5)) return kiln_gpu_refuse(why, size, "rank %d (1 to 3 spatial dims)", x->rank);
    return true;
}

static kiln_status kiln_fused_conv_run(kiln_run_ctx *c)
{
    kiln_act_kind k = kiln_fused_of(kiln_run_node(c))->act.kind;
    if (k != KILN_ACT_NONE && k != KILN_ACT_RELU) return kiln_gpu_fallback(c);
    kiln_contrib_act a = {.kind = k == KILN_ACT_RELU ? KILN_CONTRIB_ACT_RELU : KILN_CONTRIB_ACT_NONE};
    return fused_conv(c, &a);
}

/* ---- attention ---- */

/* The attention core's shared memory for head size H and T keys fits. */
static bool attn_fits(int64_t H, int64_t T)
{
    return T > 0 && H > 0 && (size_t)(H + T + 32) * sizeof(float) <= KILN_GPU_ATTN_MAX_SMEM;
}

/* The mask and attention_bias fields of a (int32 mask in a checked form, bias [B|1, N|1, S, T]). */
static void attn_masks(kiln_gpu_attn *a, const kiln_value *mask, const kiln_value *ab)
{
    if (mask) {
        a->mask = mask->data, a->mask_rank = mask->rank, a->mask_d0 = mask->dims[0];
        a->mask_M = mask->rank == 4 ? mask->dims[3] : 0;
    }
    if (ab) {
        a->ab = ab->data;
        a->ab_b = ab->dims[0] != 1 ? ab->dims[1] * a->S * a->T : 0;
        a->ab_n = ab->dims[1] != 1 ? a->S * a->T : 0;
    }
}

static bool attention_supports(const kiln_node *n, char *why, size_t size)
{
    if (!floats_alike(n, KILN_ATTN_X, KILN_ATTN_BIAS, f32_f16, why, size) ||
        !kiln_gpu_same_dtype(n, KILN_ATTN_PAST, KILN_ATTN_X, why, size) || !kiln_gpu_same_dtype(n, KILN_ATTN_ABIAS, KILN_ATTN_X, why, size) ||
        !kiln_gpu_input_is(n, KILN_ATTN_MASK, false, i32, why, size))
        return false;
    return true;
}

size_t kiln_gpu_attention_kv_bytes(const kiln_contrib_attention_dims *d, kiln_dtype dt, bool present)
{
    size_t es = kiln_dtype_size(dt);
    if (present) return 0;
    return ws_align((size_t)(d->B * d->N * d->T * d->H) * es) + ws_align((size_t)(d->B * d->N * d->T * d->Hv) * es);
}

bool kiln_gpu_attention_fits(const kiln_contrib_attention_dims *d) { return attn_fits(d->H, d->T); }

kiln_status kiln_gpu_attention_core(kiln_run_ctx *c, const kiln_contrib_attention_dims *d, kiln_dtype dt, const void *qkv,
                                    void *kv_ws, const kiln_value *mask, const kiln_value *past, const kiln_value *ab,
                                    kiln_value *Y, kiln_value *present)
{
    const kiln_node *n = kiln_run_node(c);
    gpuStream_t s = kiln_gpu_stream(c);
    size_t es = kiln_dtype_size(dt), nk = (size_t)(d->B * d->N * d->T * d->H);
    unsigned char *kd = present ? present->data : kv_ws;
    unsigned char *vd = present ? (unsigned char *)present->data + nk * es : (unsigned char *)kv_ws + ws_align(nk * es);
    const unsigned char *pk = past ? past->data : NULL, *pv = past ? pk + (size_t)(d->B * d->N * d->P * d->H) * es : NULL;
    const unsigned char *q = qkv;
    kiln_gpu_attn_view qv = {q, d->S * d->D, d->H, d->D, NULL};
    kiln_gpu_attn_view kv = {q + (size_t)d->Dq * es, d->S * d->D, d->H, d->D, NULL};
    kiln_gpu_attn_view vv = {q + (size_t)(d->Dq + d->Dk) * es, d->S * d->D, d->Hv, d->D, NULL};
    KILN_TRY(kiln_gpu_check(c, kiln_gpu_contrib_kv(s, dt, kd, pk, kv, d->B, d->N, d->P, d->S, d->H), "Attention K"));
    KILN_TRY(kiln_gpu_check(c, kiln_gpu_contrib_kv(s, dt, vd, pv, vv, d->B, d->N, d->P, d->S, d->Hv), "Attention V"));
    kiln_gpu_attn a = {
        .dtype = dt, .q = qv, .k = kd, .v = vd, .y = Y->data, .B = d->B, .N = d->N, .S = d->S, .T = d->T, .P = d->P,
        .H = d->H, .Hv = d->Hv, .scale = (float)kiln_contrib_attn_scale(n, d->H),
        .filter = kiln_attr_float(n, "mask_filter_value", -10000.0f), .causal = d->causal,
    };
    attn_masks(&a, mask, ab);
    return kiln_gpu_check(c, kiln_gpu_contrib_attn(s, &a), n->op_type);
}

/* input [B, S, Hin] @ weights [Hin, D] + bias into QKV [B, S, D] (workspace), then the core (K
 * and V with the past rows into present's halves or workspace). */
static kiln_status attention_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, KILN_ATTN_X), *W = kiln_run_in(c, KILN_ATTN_W), *bias = kiln_run_in(c, KILN_ATTN_BIAS),
                     *mask = kiln_run_in(c, KILN_ATTN_MASK), *past = kiln_run_in(c, KILN_ATTN_PAST),
                     *ab = kiln_run_in(c, KILN_ATTN_ABIAS);
    kiln_value *Y = kiln_run_out(c, 0), *present = kiln_run_out(c, 1);
    kiln_contrib_attention_dims d;
    char msg[256];
    const kiln_value *vs[] = {X, W, bias, past, ab, Y, present};
    if (kiln_contrib_attention_check(n, X, W, bias, mask, past, ab, &d, msg, sizeof msg) || !Y ||
        !kiln_gpu_dtype_in(X->dtype, f32_f16) || !all_dtype(X->dtype, 7, vs) || !attn_fits(d.H, d.T))
        return kiln_gpu_fallback(c);
    size_t es = kiln_dtype_size(X->dtype);
    size_t at_kv = ws_align((size_t)(d.B * d.S * d.D) * es);
    unsigned char *ws;
    KILN_TRY(kiln_gpu_workspace(c, at_kv + kiln_gpu_attention_kv_bytes(&d, X->dtype, present), (void **)&ws));
    gpuStream_t s = kiln_gpu_stream(c);
    int64_t rows = d.B * d.S;
    if (bias) {
        int64_t dims[2] = {rows, d.D};
        kiln_gpu_shape bs;
        kiln_gpu_shape_broadcast(&bs, 2, dims, 1, &d.D);
        KILN_TRY(kiln_gpu_check(c, kiln_gpu_blas_bcast_scale(X->dtype, bias->data, bs, 1.0f, ws, s), "Attention bias"));
    }
    kiln_gpu_mm m = {.dtype = X->dtype, .A = X->data, .B = W->data, .Y = ws, .M = rows, .N = d.D, .K = d.Hin,
                     .a_m = d.Hin, .a_k = 1, .b_k = d.D, .b_n = 1, .alpha = 1.0f, .beta = bias ? 1.0f : 0.0f};
    bool done;
    KILN_TRY(kiln_gpu_matmul_run(c, &m, &done));
    if (!done) return kiln_gpu_fallback(c);
    return kiln_gpu_attention_core(c, &d, X->dtype, ws, ws + at_kv, mask, past, ab, Y, present);
}

static bool mha_supports(const kiln_node *n, char *why, size_t size)
{
    if (!kiln_gpu_input_is(n, KILN_MHA_Q, true, f32_f16, why, size) || !kiln_gpu_input_is(n, KILN_MHA_MASK, false, i32, why, size))
        return false;
    static const int alike[] = {KILN_MHA_K, KILN_MHA_V, KILN_MHA_BIAS, KILN_MHA_ABIAS, KILN_MHA_PK, KILN_MHA_PV};
    for (size_t k = 0; k < sizeof alike / sizeof alike[0]; k++)
        if (!kiln_gpu_same_dtype(n, alike[k], KILN_MHA_Q, why, size)) return false;
    return true;
}

/* Query, key and value read in place through views (bias added as they are read); K and V with
 * the past rows gathered into the present outputs or workspace, then the core. */
static kiln_status mha_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *in[KILN_MHA_CACHE + 1];
    for (int i = 0; i <= KILN_MHA_CACHE; i++) in[i] = kiln_run_in(c, i);
    kiln_value *Y = kiln_run_out(c, 0), *PK = kiln_run_out(c, 1), *PV = kiln_run_out(c, 2), *QK = kiln_run_out(c, 3);
    kiln_contrib_mha_dims d;
    char msg[280];
    const kiln_value *Q = in[KILN_MHA_Q], *K = in[KILN_MHA_K], *V = in[KILN_MHA_V], *bias = in[KILN_MHA_BIAS],
                     *pk = in[KILN_MHA_PK], *pv = in[KILN_MHA_PV];
    const kiln_value *vs[] = {Q, K, V, bias, in[KILN_MHA_ABIAS], pk, pv, Y, PK, PV, QK};
    if (in[KILN_MHA_CACHE] || kiln_contrib_mha_check(n, in, &d, msg, sizeof msg) || !Y || !kiln_gpu_dtype_in(Q->dtype, f32_f16) ||
        !all_dtype(Q->dtype, 11, vs) || !attn_fits(d.H, d.T))
        return kiln_gpu_fallback(c);
    int64_t B = d.B, S = d.S, L = d.L, N = d.N, H = d.H, Hv = d.Hv;
    size_t es = kiln_dtype_size(Q->dtype);
    size_t nk = (size_t)(B * N * d.T * H), nv = (size_t)(B * N * d.T * Hv);
    size_t at_v = PK ? 0 : ws_align(nk * es), total = at_v + (PV ? 0 : ws_align(nv * es));
    unsigned char *ws = NULL;
    if (total) KILN_TRY(kiln_gpu_workspace(c, total, (void **)&ws));
    const unsigned char *bp = bias ? bias->data : NULL;
    const void *bq = bp, *bk = bp ? bp + (size_t)(N * H) * es : NULL, *bv = bp ? bp + (size_t)(2 * N * H) * es : NULL;
    kiln_gpu_attn_view qv, kv, vv;
    const unsigned char *q = Q->data;
    switch (d.form) {
    case KILN_MHA_PACKED_QKV: /* [B, S, N, 3, H] */
        qv = (kiln_gpu_attn_view){q, S * N * 3 * H, 3 * H, N * 3 * H, bq};
        kv = (kiln_gpu_attn_view){q + (size_t)H * es, S * N * 3 * H, 3 * H, N * 3 * H, bk};
        vv = (kiln_gpu_attn_view){q + (size_t)(2 * H) * es, S * N * 3 * H, 3 * H, N * 3 * H, bv};
        break;
    case KILN_MHA_PACKED_KV: /* key [B, L, N, 2, H] */
        qv = (kiln_gpu_attn_view){q, S * N * H, H, N * H, bq};
        kv = (kiln_gpu_attn_view){K->data, L * N * 2 * H, 2 * H, N * 2 * H, bk};
        vv = (kiln_gpu_attn_view){(const unsigned char *)K->data + (size_t)H * es, L * N * 2 * H, 2 * H, N * 2 * H, bv};
        break;
    case KILN_MHA_KV_BNSH: /* key [B, N, L, H], value [B, N, L, Hv]: no bias */
        qv = (kiln_gpu_attn_view){q, S * N * H, H, N * H, bq};
        kv = (kiln_gpu_attn_view){K->data, N * L * H, L * H, H, NULL};
        vv = (kiln_gpu_attn_view){V->data, N * L * Hv, L * Hv, Hv, NULL};
        break;
    default: /* query [B, S, N*H], key [B, L, N*H], value [B, L, N*Hv] */
        qv = (kiln_gpu_attn_view){q, S * N * H, H, N * H, bq};
        kv = (kiln_gpu_attn_view){K->data, L * N * H, H, N * H, bk};
        vv = (kiln_gpu_attn_view){V->data, L * N * Hv, Hv, N * Hv, bv};
        break;
    }
    gpuStream_t s = kiln_gpu_stream(c);
    void *kd = PK ? PK->data : ws, *vd = PV ? PV->data : ws + at_v;
    KILN_TRY(kiln_gpu_check(c, kiln_gpu_contrib_kv(s, Q->dtype, kd, data_of(pk), kv, B, N, d.P, L, H), "MultiHeadAttention K"));
    KILN_TRY(kiln_gpu_check(c, kiln_gpu_contrib_kv(s, Q->dtype, vd, data_of(pv), vv, B, N, d.P, L, Hv), "MultiHeadAttention V"));
    kiln_gpu_attn a = {
        .dtype = Q->dtype, .q = qv, .k = kd, .v = vd, .y = Y->data, .qk = QK ? QK->data : NULL, .B = B, .N = N, .S = S,
        .T = d.T, .P = d.P, .H = H, .Hv = Hv, .scale = (float)kiln_contrib_attn_scale(n, H),
        .filter = kiln_attr_float(n, "mask_filter_value", -10000.0f), .causal = d.causal,
    };
    attn_masks(&a, in[KILN_MHA_MASK], in[KILN_MHA_ABIAS]);
    return kiln_gpu_check(c, kiln_gpu_contrib_attn(s, &a), "MultiHeadAttention");
}

/* ---- the table ---- */

static const kiln_gpu_op ops[] = {
    {MS, "Gelu", gelu_supports, gelu_run},
    {MS, "FastGelu", gelu_supports, gelu_run},
    {MS, "BiasGelu", gelu_supports, gelu_run},
    {MS, "QuickGelu", gelu_supports, gelu_run},
    {MS, "BiasAdd", bias_add_supports, bias_add_run},
    {MS, "SkipLayerNormalization", skip_ln_supports, skip_ln_run},
    {MS, "EmbedLayerNormalization", embed_ln_supports, embed_ln_run},
    {MS, "FusedMatMul", fused_matmul_supports, fused_matmul_run},
    {MS, "FusedGemm", fused_gemm_supports, fused_gemm_run},
    {MS, "FusedConv", fused_conv_supports, fused_conv_run},
    {"kiln", "FusedConv", kiln_fused_conv_supports, kiln_fused_conv_run},
    {MS, "Attention", attention_supports, attention_run},
    {MS, "MultiHeadAttention", mha_supports, mha_run},
};

const kiln_gpu_op_table kiln_gpu_ops_contrib = {ops, sizeof ops / sizeof ops[0]};
