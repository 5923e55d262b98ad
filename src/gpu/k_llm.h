/* k_llm.h - launchers of the 'llm' family's GPU kernels (k_llm.cu): MatMulNBits (dequant-GEMV
 * for a few rows, dequantization of the weight for cuBLAS otherwise), GroupQueryAttention (the
 * KV cache write and the attention), com.microsoft RotaryEmbedding and the RMS normalizations
 * (SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization). Plain C types; dtypes are
 * kiln_dtype codes (float32, float16, bfloat16 where noted), computing in float. Every launcher
 * queues its work on stream s, returns gpuGetLastError() and launches nothing for empty work. */
#ifndef KILN_GPU_K_LLM_H
#define KILN_GPU_K_LLM_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/kshape.h"
#include "gpu/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of A the GEMV kernel takes in one pass (larger M goes through cuBLAS). */
#define KILN_GPU_NBITS_GEMV_MAX_M 8
/* Largest head size of the attention kernel (8 values per lane of a warp). */
#define KILN_GPU_GQA_MAX_HEAD 256
/* Most query heads a KV head of the decode kernel (a warp each). */
#define KILN_GPU_GQA_DECODE_MAX_G 8

/* Zero points of MatMulNBits. */
enum {
    KILN_GPU_ZP_NONE,   /* 2^(bits-1) */
    KILN_GPU_ZP_PACKED, /* uint8 [N * ceil(n_blocks * bits / 8)] */
    KILN_GPU_ZP_TYPED,  /* scales' dtype [N * n_blocks] */
};

/* One MatMulNBits call: Y [M, N] = A [M, K] x dequant(B)^T (+ bias [N]). B is uint8 [N,
 * n_blocks, blob] (blob = block_size * bits / 8 bytes, 4-byte aligned), scales [N * n_blocks]
 * of s_dtype (float32 or float16). A, Y and bias are of dtype (float32 or float16). */
typedef struct kiln_gpu_nbits {
    int dtype, s_dtype, zp_mode;
    const void *A;
    const uint8_t *B;
    const void *scales, *zp, *bias;
    void *Y;
    int64_t M, N, K, bits, block_size, n_blocks, blob;
    int sm_count; /* the device's multiprocessors (the staged GEMV's grid) */
    /* B, scales and zero points are session constants: the tensor-core GEMV loads its first
     * weights before the kernel ahead of it has finished (programmatic dependent launch) */
    bool const_weights;
} kiln_gpu_nbits;

/* Split of the GEMV over K for a.N columns on a device of a->sm_count multiprocessors: 1 when
 * the columns alone fill the device. Its float workspace is splits * M * N floats. */
int kiln_gpu_nbits_splits(const kiln_gpu_nbits *a);
/* a->M <= KILN_GPU_NBITS_GEMV_MAX_M: partial sums of each K split into part (float [splits, M,
 * N]), then Y = their sum + bias; with one split the GEMV writes Y itself (part unused). */
gpuError_t kiln_gpu_nbits_gemv(gpuStream_t s, const kiln_gpu_nbits *a, int splits, float *part);
/* W [N, K] of a->dtype = dequant(B) (the cuBLAS path's weight). */
gpuError_t kiln_gpu_nbits_dequant(gpuStream_t s, const kiln_gpu_nbits *a, void *W);
/* Y [M, N] += bias [N] (after the cuBLAS product); dtype as in a. */
gpuError_t kiln_gpu_nbits_bias(gpuStream_t s, const kiln_gpu_nbits *a);

/* One GroupQueryAttention call, as kiln_gqa_prepare resolved it (ops/llm.h), with device
 * pointers. q [B, S, N*H] (packed: [B, S, (N + 2*Nkv)*H], k and v NULL), k and v [B, S, Nkv*H];
 * past_k/past_v [B, Nkv, past_len, H] or NULL; kc/vc [B, Nkv, L, H]: where the present K and V
 * go (the present outputs, or workspace); shared: kc/vc are the past buffers (past_len == L)
 * and only the new rows are written; otherwise every element of kc/vc is (past rows, new rows,
 * zeros). seqlens int32 [B]; pos int64 [B, S] or NULL; cos/sin [max_pos, rd/2] when rd > 0;
 * bias [.., S, bias_s] at strides bias_b, bias_h, bias_s; sink [N] or NULL. y [B, S, N*H].
 * dtype float32 or float16; H <= KILN_GPU_GQA_MAX_HEAD. */
typedef struct kiln_gpu_gqa {
    int dtype;
    const void *q, *k, *v, *past_k, *past_v;
    void *kc, *vc, *y;
    const int32_t *seqlens; /* device memory, as pos */
    const int64_t *pos;
    const void *cos, *sin, *bias, *sink;
    int64_t bias_b, bias_h, bias_s;
    int64_t B, S, N, Nkv, H, past_len, L, rd, window;
    int64_t rot_rows;       /* rows of cos and sin */
    /* the run's check word (kiln_gpu_check_word) and this node's code: a batch row whose
     * seqlens_k or positions are out of range is skipped (zeros out) and reported; NULL when
     * the host checked them */
    int32_t *bad;
    int32_t bad_code;
    float scale, softcap;
    bool packed, first_prompt, has_past, shared, interleaved, smooth;
    /* keys of each query row split over `splits` blocks (1: one block a row), their partial
     * softmax states in part (float [B, N, S, splits, H + 2]) combined by a second kernel */
    int splits;
    float *part;
    /* S = 1 with N / Nkv <= KILN_GPU_GQA_DECODE_MAX_G: one kernel (the new row written, the query
     * heads of a KV head together, the runs of keys combined by the last of them to finish);
     * tickets (kiln_gpu_tickets, B * Nkv of them) when splits > 1 */
    bool decode;
    int32_t *tickets;
} kiln_gpu_gqa;

/* The key splits for a call (decode: few rows, so the keys of a row spread over blocks): 1 when
 * the rows alone fill sm_count multiprocessors twice over. */
int kiln_gpu_gqa_splits(int64_t rows, int64_t L, int sm_count);

/* Writes the present K/V (rotary applied to K), then the attention output. */
gpuError_t kiln_gpu_gqa_run(gpuStream_t s, const kiln_gpu_gqa *a);

/* com.microsoft RotaryEmbedding: x and y [B, S, Nh, H] (rank3) or [B, Nh, S, H]; the first rd
 * dims of each head rotated by cos/sin [max_pos, rd/2] at position pos[b * S + s] (pos NULL:
 * offset + s). dtype float32, float16 or bfloat16. */
gpuError_t kiln_gpu_rotary(gpuStream_t s, int dtype, const void *x, void *y, int64_t B, int64_t S, int64_t Nh,
                           int64_t H, int64_t rd, bool rank3, bool interleaved, const int64_t *pos, int64_t offset,
                           const void *cos, const void *sin);

/* RMS normalization of rows x [rows, h] (+ skip at (r * h + j) % skip_n, + bias [h]; the sum
 * rounded to dtype, written to sum when not NULL): y = v / sqrt(mean(v^2) + eps) * scale[j %
 * scale_n]; inv (float [rows]) receives 1 / sqrt(...), mean (float [rows]) zeros; each may be
 * NULL. skip and bias NULL: SimplifiedLayerNormalization. Every tensor of dtype (float32,
 * float16, bfloat16) but mean and inv. */
gpuError_t kiln_gpu_rms_rows(gpuStream_t s, int dtype, const void *x, const void *skip, int64_t skip_n,
                             const void *bias, const void *scale, int64_t scale_n, void *y, void *sum, float *mean,
                             float *inv, int64_t rows, int64_t h, float eps);

/* kiln.SiluMul: y = g * sigmoid(g) * u over `total` elements of dtype (float32, float16,
 * bfloat16), rows of n, row r of g and u at r * stride (two tensors: stride n; the packed form:
 * stride 2n, u = g + n). */
gpuError_t kiln_gpu_silu_mul(gpuStream_t s, int dtype, const void *g, const void *u, void *y, int64_t total, int64_t n,
                             int64_t stride);

#ifdef __cplusplus
}
#endif

#endif
