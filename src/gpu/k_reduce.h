/* k_reduce.h - launchers of the reduce family's GPU kernels (k_reduce.cu): Reduce*, ArgMax and
 * ArgMin, Softmax and LogSoftmax, the row normalizations (Layer, RMS, Group, Instance),
 * BatchNormalization (inference) and CumSum. Plain C types; every launcher queues its work on
 * stream s, returns gpuGetLastError() and launches nothing for empty tensors. Floating dtypes
 * (float32, float16, bfloat16) compute in float. */
#ifndef KILN_GPU_K_REDUCE_H
#define KILN_GPU_K_REDUCE_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/kshape.h"
#include "gpu/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reduce* kinds, in the order of the reference's reduce_kind. Integer dtypes (int32, int64)
 * take SUM, MEAN, MAX, MIN, PROD, L1 and SUMSQ (64-bit, wrapping like the reference). */
enum {
    KILN_GPU_RK_SUM, KILN_GPU_RK_MEAN, KILN_GPU_RK_MAX, KILN_GPU_RK_MIN, KILN_GPU_RK_PROD,
    KILN_GPU_RK_L1, KILN_GPU_RK_L2, KILN_GPU_RK_LOGSUM, KILN_GPU_RK_LOGSUMEXP, KILN_GPU_RK_SUMSQ,
};

/* y[o] (o < n_out, contiguous) = reduction over the `count` elements of x at offsets
 * offset(keep, o) + offset(red, r), r < count (offset(s, i): kiln_strided_offset). Empty
 * reductions (count 0) give the identity (MEAN: NaN for floats). */
gpuError_t kiln_gpu_reduce_rows(gpuStream_t s, int kind, kiln_dtype dt, const void *x, void *y, int64_t n_out,
                                kiln_gpu_shape keep, kiln_gpu_shape red, int64_t count);
/* x [outer, n, inner] contiguous reduced over n into y [outer, inner]; for inner > 1. */
gpuError_t kiln_gpu_reduce_cols(gpuStream_t s, int kind, kiln_dtype dt, const void *x, void *y, int64_t outer,
                                int64_t n, int64_t inner);

/* y [outer, inner] (int64) = index of the largest (sign 1) or smallest (sign -1) of x
 * [outer, n, inner] along n (n > 0); NaN counts as the largest; ties take the first index, or
 * the last with select_last. */
gpuError_t kiln_gpu_argext(gpuStream_t s, kiln_dtype dt, const void *x, int64_t *y, int64_t outer, int64_t n,
                           int64_t inner, int sign, bool select_last);

/* Softmax (log_softmax false) or LogSoftmax of x [outer, n, inner] along n into y. */
gpuError_t kiln_gpu_softmax(gpuStream_t s, kiln_dtype dt, const void *x, void *y, int64_t outer, int64_t n,
                            int64_t inner, bool log_softmax);

/* Where a row normalization finds the scale and bias of element j of row r. */
enum {
    KILN_GPU_NP_COL,     /* at j: LayerNormalization with Scale shaped like the normalized dims */
    KILN_GPU_NP_STRIDED, /* at offset(scale_s / bias_s, r * cols + j): any broadcast */
    KILN_GPU_NP_CHANNEL, /* at channel (r % groups) * (C / groups) + j / spatial */
    KILN_GPU_NP_GROUP,   /* at group r % groups */
};

/* Standardizes each of the `rows` contiguous rows of `cols` values of x (dtype dt; y too):
 * y = (x - mean) / sqrt(var + eps) * scale + bias (without center: mean taken as 0, RMS).
 * scale and bias (bias may be NULL) are of the floating dtype pdt (x's or another: mixed
 * precision), placed by pmode (KILN_GPU_NP_*) with groups, C and spatial for the channel
 * modes and scale_s, bias_s for the strided one. mean_out and inv_out (float [rows], may be
 * NULL) receive the statistics. */
gpuError_t kiln_gpu_norm_rows(gpuStream_t s, kiln_dtype dt, kiln_dtype pdt, const void *x, void *y, int64_t rows,
                              int64_t cols, float eps, bool center, const void *scale, const void *bias, int pmode,
                              kiln_gpu_shape scale_s, kiln_gpu_shape bias_s, int64_t groups, int64_t C,
                              int64_t spatial, float *mean_out, float *inv_out);

/* BatchNormalization, inference: x [N, C, spatial] with per-channel scale, bias, mean, var
 * (each of its own floating dtype: pdt[0..4) for scale, bias, mean, var); `work` is device
 * scratch of 3 * C floats. */
gpuError_t kiln_gpu_batchnorm(gpuStream_t s, kiln_dtype dt, const void *x, void *y, int64_t N, int64_t C,
                              int64_t spatial, float eps, const void *const params[4], const kiln_dtype pdt[4],
                              float *work);

/* CumSum of x [outer, n, inner] along n into y, exclusive and/or reverse. */
gpuError_t kiln_gpu_cumsum(gpuStream_t s, kiln_dtype dt, const void *x, void *y, int64_t outer, int64_t n,
                           int64_t inner, bool exclusive, bool reverse);

#ifdef __cplusplus
}
#endif

#endif
