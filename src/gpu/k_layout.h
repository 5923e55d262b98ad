/* k_layout.h - launchers of the layout kernels (k_layout.cu): moves of elements between
 * layouts and indexed reads/writes. Most of them move bytes: `esize` is the element size (1, 2,
 * 4 or 8 bytes), so they serve every dtype of that size. Pointers are device pointers; every
 * launcher queues work on `st` and returns the launch error. */
#ifndef KILN_GPU_K_LAYOUT_H
#define KILN_GPU_K_LAYOUT_H

#include <stdint.h>

#include "gpu/kshape.h"
#include "gpu/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pad modes of kiln_gpu_pad_args.mode. */
enum { KILN_GPU_PAD_CONSTANT, KILN_GPU_PAD_REFLECT, KILN_GPU_PAD_EDGE, KILN_GPU_PAD_WRAP };

/* Scatter reductions (ONNX `reduction`). */
enum { KILN_GPU_RED_NONE, KILN_GPU_RED_ADD, KILN_GPU_RED_MUL, KILN_GPU_RED_MAX, KILN_GPU_RED_MIN };

/* Pad: output position idx[k] on axis k reads x's kept window [lo[k], lo[k] + len[k]) at
 * idx[k] - pb[k]; outside it the mode decides (the constant, or a mirrored/clamped/wrapped
 * position in the window). */
typedef struct kiln_gpu_pad_args {
    int rank, mode;
    int64_t ydims[KILN_GPU_MAX_RANK];
    int64_t pb[KILN_GPU_MAX_RANK];   /* elements placed before the window */
    int64_t lo[KILN_GPU_MAX_RANK];   /* first kept element of x */
    int64_t len[KILN_GPU_MAX_RANK];  /* kept elements of x (> 0 unless constant mode) */
    int64_t xs[KILN_GPU_MAX_RANK];   /* x's element strides */
    uint64_t value;                  /* constant mode: the element's bytes (low esize bytes) */
} kiln_gpu_pad_args;

/* y (contiguous, dims s.dims) = x + x_off read with s.strides (any sign, 0 = broadcast). */
gpuError_t kiln_gpu_layout_strided(int esize, void *y, const void *x, int64_t x_off, kiln_gpu_shape s,
                                   gpuStream_t st);
/* Batched 2-D transpose through shared memory: y[b][p][q] = x[b * bstride + q * P + p] for
 * b < B, p < P, q < Q. */
gpuError_t kiln_gpu_layout_transpose(int esize, void *y, const void *x, int64_t B, int64_t P, int64_t Q,
                                     int64_t bstride, gpuStream_t st);
/* rows rows of row_bytes bytes: y + r * y_ld <- x + r * x_ld (all in bytes). */
gpuError_t kiln_gpu_layout_copy2d(void *y, int64_t y_ld, const void *x, int64_t x_ld, int64_t rows,
                                  int64_t row_bytes, gpuStream_t st);
/* Tile: y (dims ys.dims) reads x at coordinate idx[k] % xdims.dims[k], strides ys.strides. */
gpuError_t kiln_gpu_layout_tile(int esize, void *y, const void *x, kiln_gpu_shape ys, kiln_gpu_shape xdims,
                                gpuStream_t st);
/* Pad over y's n elements. */
gpuError_t kiln_gpu_layout_pad(int esize, void *y, const void *x, int64_t n, kiln_gpu_pad_args a,
                               gpuStream_t st);
/* Gather: y[o][j][i] = x[o][ind[j]][i] (o < outer, j < m, i < inner, ind[j] in [-n, n));
 * ind is int64 when idx64, else int32. An out-of-range index gives zeros. */
gpuError_t kiln_gpu_layout_gather(int esize, int idx64, void *y, const void *x, const void *ind,
                                  int64_t outer, int64_t n, int64_t m, int64_t inner, gpuStream_t st);
/* GatherElements over the n elements of ind (dims s.dims, contiguous): y[j] = x[off(j) + p *
 * as] where off uses s.strides (x's strides, 0 on the axis) and p = ind[j] in [-ad, ad). An
 * out-of-range index gives zero. */
gpuError_t kiln_gpu_layout_gather_elements(int esize, int idx64, void *y, const void *x, const void *ind,
                                           kiln_gpu_shape s, int64_t ad, int64_t as, int64_t n,
                                           gpuStream_t st);
/* GatherND: x has dims/strides xs; batch_dims b; each index tuple has `last` entries; y has
 * batches * tuples rows of `slice` elements. An out-of-range index gives a zero row. */
gpuError_t kiln_gpu_layout_gather_nd(int esize, int idx64, void *y, const void *x, const void *ind,
                                     kiln_gpu_shape xs, int b, int last, int64_t tuples, int64_t slice,
                                     int64_t n, gpuStream_t st);
/* ScatterND into y (already a copy of data; dims/strides xs): row t of u (slice elements) goes to
 * the tuple of `last` indices at ind[t]. dtype: a kiln_dtype; reductions other than none take
 * float32/16/64, bfloat16, int32 and int64. Out-of-range tuples are skipped. */
gpuError_t kiln_gpu_layout_scatter_nd(int dtype, int red, int idx64, void *y, const void *ind, const void *u,
                                      kiln_gpu_shape xs, int last, int64_t tuples, int64_t slice,
                                      gpuStream_t st);
/* ScatterElements into y (a copy of data) over the n elements of ind (dims and x strides in s,
 * as in gather_elements): y[off(j) + p * as] op= u[j]. Out-of-range indices are skipped. */
gpuError_t kiln_gpu_layout_scatter_elements(int dtype, int red, int idx64, void *y, const void *ind,
                                            const void *u, kiln_gpu_shape s, int64_t ad, int64_t as, int64_t n,
                                            gpuStream_t st);
/* Range of n elements of dtype: integers start + i * step (wrapping), floats fstart + i *
 * fstep computed in double. */
gpuError_t kiln_gpu_layout_range(int dtype, void *y, int64_t n, int64_t start, int64_t step, double fstart,
                                 double fstep, gpuStream_t st);
/* Trilu over mats matrices [rows, cols]: keeps j >= i + k (upper) or j <= i + k, zeros elsewhere. */
gpuError_t kiln_gpu_layout_trilu(int esize, void *y, const void *x, int64_t mats, int64_t rows, int64_t cols,
                                 int64_t k, int upper, gpuStream_t st);
/* OneHot: y[o][k][e] = k == hot(ind[o * inner + e]) ? on : off, with depth d; ind_dtype
 * int32, int64 or float32 (truncated); negative indices count from d. off/on: element bytes. */
gpuError_t kiln_gpu_layout_onehot(int esize, int ind_dtype, void *y, const void *ind, int64_t outer,
                                  int64_t d, int64_t inner, uint64_t off, uint64_t on, gpuStream_t st);

#ifdef __cplusplus
}
#endif

#endif
