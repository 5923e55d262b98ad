/* ops_core.h - the base computations one GPU family lends another: the fused com.microsoft
 * operators (ops_contrib.c) compute their MatMul, Gemm and Conv as ops_blas.c and ops_cnn.c do,
 * then their own epilogue. Each takes the run context of the node being run and reports through
 * *done whether it covered the call; when it did not (false, KILN_OK), it has queued nothing and
 * the caller hands the node to its reference kernel (kiln_gpu_fallback). QAttention (ops_quant.c)
 * runs com.microsoft Attention's core (ops_contrib.c) after its integer projection. */
#ifndef KILN_GPU_OPS_CORE_H
#define KILN_GPU_OPS_CORE_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/gpu.h"
#include "ops/contrib_attn.h"

/* Y = alpha * A @ B + beta * Y over broadcast batches, on cuBLAS. Y is contiguous [ydims..., M,
 * N]; A's element (m, k) of batch index i is at sum_j i_j * a_bs[j] + m * a_m + k * a_k, B's
 * (k, n) likewise with b_bs, b_k, b_n (a stride 0: broadcast). dtype float32, float16 or
 * bfloat16 for A, B and Y. */
typedef struct kiln_gpu_mm {
    kiln_dtype dtype;
    const void *A, *B;
    void *Y;
    int64_t M, N, K;
    int64_t a_m, a_k, b_k, b_n;
    int yb;                       /* batch rank, <= KILN_MAX_RANK */
    const int64_t *ydims, *a_bs, *b_bs; /* [yb] each */
    float alpha, beta;
} kiln_gpu_mm;

kiln_status kiln_gpu_matmul_run(kiln_run_ctx *c, const kiln_gpu_mm *m, bool *done);

/* Gemm (inputs A, B, C; attributes alpha, beta, transA, transB) of the running node into its
 * output 0. */
kiln_status kiln_gpu_gemm_core(kiln_run_ctx *c, bool *done);

/* What a fused Conv asks kiln_gpu_conv_core to apply after the convolution and its bias: Z (a
 * device tensor of Y's shape and dtype, or NULL) added, then ReLU. The core sets applied when it
 * did both in its epilogue (cuDNN's); else the caller applies them. */
typedef struct kiln_gpu_conv_epi {
    const void *Z;
    bool relu;
    bool applied;
} kiln_gpu_conv_epi;

/* Conv (inputs X, W, B; Conv's attributes) of the running node into its output 0, and the
 * epilogue epi asks for where it can (epi NULL: none). */
kiln_status kiln_gpu_conv_core(kiln_run_ctx *c, kiln_gpu_conv_epi *epi, bool *done);

/* com.microsoft Attention after its projection, for the running node (its attributes: scale,
 * mask_filter_value; d from kiln_contrib_attention_check): qkv [B, S, D] (dtype dt, float32 or
 * float16, device), K and V (past rows first) into present's halves, or into kv_ws
 * (kiln_gpu_attention_kv_bytes of workspace) without present, then softmax(Q K^T) V into Y.
 * mask (int32), past and ab (attention_bias) NULL when absent. Covers what
 * kiln_gpu_attention_fits says. */
size_t kiln_gpu_attention_kv_bytes(const kiln_contrib_attention_dims *d, kiln_dtype dt, bool present);
bool kiln_gpu_attention_fits(const kiln_contrib_attention_dims *d);
kiln_status kiln_gpu_attention_core(kiln_run_ctx *c, const kiln_contrib_attention_dims *d, kiln_dtype dt, const void *qkv,
                                    void *kv_ws, const kiln_value *mask, const kiln_value *past, const kiln_value *ab,
                                    kiln_value *Y, kiln_value *present);

#endif
