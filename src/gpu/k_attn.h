/* k_attn.h - launchers of the 'attn' family's GPU kernels (k_attn.cu): the default-domain
 * Attention (opsets 23 and 24), RotaryEmbedding (opset 23) and TensorScatter (opset 24). Plain C
 * types; dtypes are kiln_dtype codes (float32, float16, bfloat16 for the float kernels, computing
 * in float); pointers are device pointers. Every launcher queues its work on stream s, returns
 * gpuGetLastError() (or an invalid-value error for a dtype or a size it does not take) and
 * launches nothing for empty work. */
#ifndef KILN_GPU_K_ATTN_H
#define KILN_GPU_K_ATTN_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/k_contrib.h"
#include "gpu/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest Q/K and V head size of the attention kernel (shared memory: (Dk + Dv + 64) floats). */
#define KILN_GPU_ONNX_ATTN_MAX_HEAD 4096

/* What attn_mask is. */
enum {
    KILN_GPU_ONNX_MASK_NONE,
    KILN_GPU_ONNX_MASK_BOOL,  /* uint8: nonzero keeps the key, zero adds -inf */
    KILN_GPU_ONNX_MASK_FLOAT, /* the attention's dtype: added (rounded to it) */
};

/* One ONNX Attention call, as ops/attention.c computes it: per (b, h, i) of [B, Hq, Sq], the
 * scores x_j = round(round(q * qs) . round(k_j * qs)) (qs = sqrt(scale) rounded to dtype; each
 * product and the dot rounded to dtype), softcapped when softcap > 0, plus the bias (the mask's
 * value at (b, h, i, j), -inf past its last dim mask_T; -inf for causal keys j > i + offset, keys
 * outside the window, keys j >= valid), then y = softmax(x) v in float (online over key tiles: any
 * T), a row whose every key is masked giving zeros. offset is `past`, or nonpad[b] - Sq with
 * nonpad; valid is nonpad[b] (int32 or int64: nonpad_64), or T without it.
 * q (b, h, i, d) and y (b, h, i, d) through their views (d contiguous); k and v (b, hk, j, d),
 * hk = h / (Hq / Hkv), likewise. qk [B, Hq, Sq, T] (or NULL) receives per qk_mode: 0 and 1 the
 * scores before the bias, 2 after it, 3 the softmax. */
typedef struct kiln_gpu_onnx_attn {
    int dtype;
    kiln_gpu_attn_view q, k, v; /* bias fields unused */
    void *y;
    int64_t y_sb, y_sh, y_ss;
    void *qk;
    int qk_mode;
    const void *mask;
    int mask_kind;
    int64_t m_sb, m_sh, m_ss, mask_T; /* element strides over b, h, i (0: broadcast); j contiguous */
    const void *nonpad;
    bool nonpad_64;
    int64_t B, Hq, Hkv, Sq, T, Dk, Dv, past;
    int64_t left, right; /* window sizes, -1: none */
    float qscale, softcap;
    bool causal;
    /* the tensor-core kernel (kiln_gpu_onnx_attn_flash_takes says when it may) with the score
     * scale applied in float to the dot products */
    bool flash;
    float scale;
} kiln_gpu_onnx_attn;

/* Whether the tensor-core kernel takes call a (flash aside): float16 or bfloat16, head sizes
 * Dk = Dv of 32 or 64, at least 16 query rows, no qk output, softcap, window or nonpad, and 16-byte
 * aligned rows (views' strides multiples of 8 elements). It computes the scores in float from
 * the inputs as they are (the reference rounds q and k scaled by qscale, and the dot, to the
 * dtype): results agree within the dtype's rounding, not bit for bit. CUDA only. */
bool kiln_gpu_onnx_attn_flash_takes(const kiln_gpu_onnx_attn *a);

gpuError_t kiln_gpu_onnx_attn_run(gpuStream_t s, const kiln_gpu_onnx_attn *a);

/* ONNX RotaryEmbedding: x and y [B, S, H, D] (rank3) or [B, H, S, D]; the first rd (even) dims
 * of each head rotated (pairs from the halves, or even/odd when interleaved) by cos/sin rows of
 * rd / 2 values: row pos[b * S + s] of [rows, rd / 2] caches (pos int32 or int64: pos_64), or row
 * b * S + s of [B, S, rd / 2] caches when pos is NULL. Products and sums rounded to dtype as the
 * reference does. A position outside [0, rows) leaves its elements unwritten and sets *bad to
 * bad_code (atomicCAS from 0). */
typedef struct kiln_gpu_onnx_rotary {
    int dtype;
    const void *x, *cos, *sin;
    void *y;
    const void *pos;
    bool pos_64, rank3, interleaved;
    int64_t B, S, H, D, rd, rows;
    int32_t *bad;
    int32_t bad_code;
} kiln_gpu_onnx_rotary;

gpuError_t kiln_gpu_onnx_rotary_run(gpuStream_t s, const kiln_gpu_onnx_rotary *a);

/* TensorScatter after y holds a copy of the cache: for every prefix row p of [prefix, max_len,
 * inner] (prefix = the dims before the axis; per_batch of them per batch row), update's rows s
 * of [prefix, len, inner] go to row start + s, start = w[p / per_batch] (int32 or int64: w_64;
 * w NULL: 0), wrapped modulo max_len when circular. A linear row outside [0, max_len) is not
 * written and sets *bad to bad_code. esize: element bytes (1, 2, 4 or 8). */
typedef struct kiln_gpu_tensor_scatter {
    const void *u, *w;
    void *y;
    bool w_64, circular;
    int esize;
    int64_t prefix, per_batch, max_len, len, inner;
    int32_t *bad;
    int32_t bad_code;
} kiln_gpu_tensor_scatter;

gpuError_t kiln_gpu_tensor_scatter_run(gpuStream_t s, const kiln_gpu_tensor_scatter *a);

#ifdef __cplusplus
}
#endif

#endif
