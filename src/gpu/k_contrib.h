/* k_contrib.h - launchers of the 'contrib' family's GPU kernels (k_contrib.cu): the com.microsoft
 * operators of ONNX Runtime's transformer optimizer and offline files. The Gelu family and
 * BiasAdd, SkipLayerNormalization and EmbedLayerNormalization (a block per row, statistics in
 * fp32), the activation epilogue of FusedGemm / FusedConv, and the attention core of Attention
 * and MultiHeadAttention (K and V gathered into [B, N, T, H], then a block per query row). Plain
 * C types; dtypes are kiln_dtype codes (float32 or float16, computing in float); pointers are
 * device pointers. Every launcher queues its work on stream s, returns gpuGetLastError() (or an
 * invalid-value error for a dtype it does not take) and launches nothing for empty work. */
#ifndef KILN_GPU_K_CONTRIB_H
#define KILN_GPU_K_CONTRIB_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The Gelu family's activations. */
enum {
    KILN_GPU_GELU_ERF,   /* 0.5 x (1 + erf(x / sqrt 2)): Gelu, BiasGelu */
    KILN_GPU_GELU_TANH,  /* the tanh approximation: FastGelu */
    KILN_GPU_GELU_QUICK, /* x sigmoid(alpha x): QuickGelu */
};

/* y[i] = f(x[i] + bias[i % h]), the sum rounded to dtype first (bias NULL: f(x[i])); n elements. */
gpuError_t kiln_gpu_contrib_gelu(gpuStream_t s, int dtype, int kind, const void *x, const void *bias, void *y, int64_t n,
                                 int64_t h, float alpha);

/* BiasAdd: y[i] = x[i] + bias[i % C] + skip[i], n elements. */
gpuError_t kiln_gpu_contrib_bias_add(gpuStream_t s, int dtype, const void *x, const void *bias, const void *skip, void *y,
                                     int64_t n, int64_t C);

/* SkipLayerNormalization over rows x [rows, h]: v = x + skip[(r * h + j) % skip_n] (+ bias[j]),
 * rounded to dtype (written to sum when not NULL); y = (v - mean) / sqrt(var + eps) * gamma[j]
 * (+ beta[j]); mean and inv (float [rows], each may be NULL) receive the mean and 1 / sqrt(var +
 * eps). Every tensor of dtype but mean and inv. */
gpuError_t kiln_gpu_contrib_skip_ln(gpuStream_t s, int dtype, const void *x, const void *skip, int64_t skip_n,
                                    const void *bias, const void *gamma, const void *beta, void *y, void *sum, float *mean,
                                    float *inv, int64_t rows, int64_t h, float eps);

/* One EmbedLayerNormalization call: B * S rows of H. ids, seg ([B, S]) and pos ([B, S], or [1,
 * S] when pos_one_batch; NULL: position s) are int32 or int64 (ids_64, seg_64, pos_64); the
 * embeddings word [V, H], pos_emb [P, H], seg_emb [G, H] (NULL with seg), gamma, beta [H], y and
 * sum ([B, S, H], sum may be NULL) of dtype. An id out of its table's range adds nothing (the
 * host cannot see device ids without a sync; the reference fails there). */
typedef struct kiln_gpu_embed {
    int dtype;
    const void *ids, *seg, *pos;
    bool ids_64, seg_64, pos_64, pos_one_batch;
    const void *word, *pos_emb, *seg_emb, *gamma, *beta;
    void *y, *sum;
    int64_t B, S, H, V, P, G;
    float eps;
} kiln_gpu_embed;

gpuError_t kiln_gpu_contrib_embed_ln(gpuStream_t s, const kiln_gpu_embed *a);

/* mask_index: mi[b] = the number of ones in mask row b of [B, S] (int32 or int64: mask_64); mask
 * NULL: zeros. */
gpuError_t kiln_gpu_contrib_mask_index(gpuStream_t s, const void *mask, bool mask_64, int32_t *mi, int64_t B, int64_t S);

/* The activations of FusedGemm / FusedConv (kiln_contrib_act_kind, ops/contrib_internal.h). */
enum {
    KILN_GPU_ACT_NONE,
    KILN_GPU_ACT_RELU,
    KILN_GPU_ACT_TANH,
    KILN_GPU_ACT_SIGMOID,
    KILN_GPU_ACT_SOFTSIGN,
    KILN_GPU_ACT_SOFTPLUS,
    KILN_GPU_ACT_LEAKY_RELU,
    KILN_GPU_ACT_HARD_SIGMOID,
    KILN_GPU_ACT_ELU,
    KILN_GPU_ACT_SELU,
    KILN_GPU_ACT_THRESHOLDED_RELU,
    KILN_GPU_ACT_SCALED_TANH,
    KILN_GPU_ACT_PARAMETRIC_SOFTPLUS,
    KILN_GPU_ACT_CLIP,
};

/* y[i] = act(y[i] + z[i]) in place (z NULL: act(y[i])), n elements. */
gpuError_t kiln_gpu_contrib_act(gpuStream_t s, int dtype, void *y, const void *z, int64_t n, int kind, float alpha,
                                float beta, float gamma);

/* Q, K or V of one head as a kernel reads it: element (b, n, s, d) at p + b * sb + n * sn + s * ss
 * + d (elements); bias NULL or its element n * hd + d added (the sum rounded to dtype). */
typedef struct kiln_gpu_attn_view {
    const void *p;
    int64_t sb, sn, ss;
    const void *bias;
} kiln_gpu_attn_view;

/* dst [B, N, P + L, hd] = past [B, N, P, hd] (rows t < P; past NULL when P is 0) then src's rows
 * 0 .. L-1. Also bfloat16 (ONNX Attention's present outputs, ops_attn.c). */
gpuError_t kiln_gpu_contrib_kv(gpuStream_t s, int dtype, void *dst, const void *past, kiln_gpu_attn_view src, int64_t B,
                               int64_t N, int64_t P, int64_t L, int64_t hd);

/* One attention call: y [B, S, N * Hv] = softmax(q k^T * scale + mask + bias) v per (b, n, s), q
 * read through its view, k [B, N, T, H] and v [B, N, T, Hv] contiguous. mask: int32 in one of
 * kiln_contrib_attn_mask_ok's forms (mask_rank 1: [mask_d0] lengths, B or 2B; 2: [B, T]; 3: [B,
 * S, T]; 4: [B, 1, mask_M, mask_M]) or NULL; masked keys add `filter`, and causal keys past P + s
 * add it again, as kiln_contrib_attn_mask_fill does. ab: attention_bias [.., S, T] of dtype at
 * strides ab_b, ab_n (0: broadcast) or NULL. qk [B, N, S, T] (or NULL) receives the scores
 * before softmax. Needs (H + T + 32) floats of shared memory: KILN_GPU_ATTN_MAX_SMEM bytes at
 * most. */
#define KILN_GPU_ATTN_MAX_SMEM 49152
typedef struct kiln_gpu_attn {
    int dtype;
    kiln_gpu_attn_view q;
    const void *k, *v;
    const int32_t *mask;
    int mask_rank;
    int64_t mask_d0, mask_M;
    const void *ab;
    int64_t ab_b, ab_n;
    void *y, *qk;
    int64_t B, N, S, T, P, H, Hv;
    float scale, filter;
    bool causal;
} kiln_gpu_attn;

gpuError_t kiln_gpu_contrib_attn(gpuStream_t s, const kiln_gpu_attn *a);

#ifdef __cplusplus
}
#endif

#endif
