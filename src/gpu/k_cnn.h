/* k_cnn.h - launchers of the cnn family's GPU kernels (k_cnn.cu): im2col / col2im and the
 * direct depthwise convolution, pooling, Resize and the block moves of DepthToSpace. Plain C
 * types only; dtype arguments are kiln_dtype codes, tensors are contiguous device pointers. */
#ifndef KILN_GPU_K_CNN_H
#define KILN_GPU_K_CNN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/kshape.h"
#include "gpu/rt.h"
#include "ops/resize.h"

/* Most spatial dims the window kernels take. */
#define KILN_GPU_CNN_MAX_SP 3

/* Sliding-window geometry over nsp spatial dims (conv, pool; for ConvTranspose `in` is X's
 * spatial size and `out` Y's). */
typedef struct kiln_gpu_window {
    int nsp;
    int64_t in[KILN_GPU_CNN_MAX_SP], out[KILN_GPU_CNN_MAX_SP], k[KILN_GPU_CNN_MAX_SP];
    int64_t stride[KILN_GPU_CNN_MAX_SP], dil[KILN_GPU_CNN_MAX_SP];
    int64_t pad[KILN_GPU_CNN_MAX_SP], pad_end[KILN_GPU_CNN_MAX_SP]; /* begin and end pads */
} kiln_gpu_window;

/* Pool kinds. */
enum { KILN_GPU_POOL_AVG, KILN_GPU_POOL_MAX, KILN_GPU_POOL_LP };

/* Everything a Resize kernel needs: per-axis sizes and scales as the reference computes them
 * on the host; the source coordinates are computed on the device in the same double
 * arithmetic. An axis is active when the reference interpolates along it. */
typedef struct kiln_gpu_resize {
    int rank;
    int mode, ct, nr;
    bool exclude_outside;
    double cubic_a;
    float extrapolation;    /* the value for linear / cubic outputs */
    uint64_t extrap_bits;   /* the same stored in the element type (nearest) */
    int64_t in[KILN_GPU_MAX_RANK], out[KILN_GPU_MAX_RANK];
    double scale[KILN_GPU_MAX_RANK], lo[KILN_GPU_MAX_RANK], hi[KILN_GPU_MAX_RANK];
    bool active[KILN_GPU_MAX_RANK];
} kiln_gpu_resize;

#ifdef __cplusplus
extern "C" {
#endif

/* col [nb, C, k..., out...] from X [nb, C, in...] (zeros where the window reads padding). */
gpuError_t kiln_gpu_cnn_im2col(int dtype, const void *X, void *col, int64_t nb, int64_t C, kiln_gpu_window w,
                               gpuStream_t s);
/* Y [N, M, plane] = B[m]. */
gpuError_t kiln_gpu_cnn_bias_fill(int dtype, void *Y, const void *B, int64_t N, int64_t M, int64_t plane,
                                  gpuStream_t s);
/* Convolution whose groups have one input channel each (depthwise and channel multipliers):
 * X [N, C, in...], W [M, 1, k...], B [M] or NULL, Y [N, M, out...], M a multiple of C. */
gpuError_t kiln_gpu_cnn_conv_direct(int dtype, const void *X, const void *W, const void *B, void *Y, int64_t N,
                                    int64_t C, int64_t M, kiln_gpu_window w, gpuStream_t s);
/* The same for 2-D windows of a square 3x3, 5x5 or 7x7 kernel at stride 1 or 2, dilation 1,
 * tiled through shared memory, with the epilogue of kiln.FusedConv: Y = relu?(conv + B + Z),
 * Z [N, M, out...] or NULL. kiln_gpu_cnn_dw2d_threads: the threads its launch for N * M planes
 * of window w would run (each computes 4 x 4 outputs), 0 where the kernel does not take w. */
int64_t kiln_gpu_cnn_dw2d_threads(const kiln_gpu_window *w, int64_t planes);
gpuError_t kiln_gpu_cnn_conv_dw2d(int dtype, const void *X, const void *W, const void *B, const void *Z, bool relu,
                                  void *Y, int64_t N, int64_t C, int64_t M, kiln_gpu_window w, gpuStream_t s);
/* ConvTranspose's gather: Y [nb, M, out...] = sum of cols [nb, M, k..., in...] over the taps
 * that land on each output element, plus B [M] (or NULL). */
gpuError_t kiln_gpu_cnn_col2im(int dtype, const float *cols, const void *B, void *Y, int64_t nb, int64_t M,
                               kiln_gpu_window w, gpuStream_t s);
/* Pooling of X [planes, in...] into Y [planes, out...]; I (int64, or NULL) gets MaxPool's flat
 * indices into X (spatial part column-major when col_major). */
gpuError_t kiln_gpu_cnn_pool(int dtype, int mode, const void *X, void *Y, int64_t *I, int64_t planes,
                             kiln_gpu_window w, bool include_pad, bool col_major, float p, gpuStream_t s);
/* Y [planes] = average / max / Lp norm of each X [planes, sz] row. */
gpuError_t kiln_gpu_cnn_global_pool(int dtype, int mode, const void *X, void *Y, int64_t planes, int64_t sz,
                                    float p, gpuStream_t s);
/* Device scratch bytes kiln_gpu_cnn_resize needs for r. */
size_t kiln_gpu_cnn_resize_ws_bytes(const kiln_gpu_resize *r);
/* Y = Resize(X) under r; ws is scratch of kiln_gpu_cnn_resize_ws_bytes(r) bytes. Nearest takes
 * any element type (esize bytes); linear and cubic take float32, float16 and bfloat16. */
gpuError_t kiln_gpu_cnn_resize(int dtype, size_t esize, const void *X, void *Y, const kiln_gpu_resize *r,
                               void *ws, gpuStream_t s);
/* Y[i] = X[offset of i under src] for elements of esize bytes: src.dims are Y's dims, its
 * strides X's element strides (any permutation view). */
gpuError_t kiln_gpu_cnn_gather_view(size_t esize, const void *X, void *Y, kiln_gpu_shape src, int64_t n,
                                    gpuStream_t s);

#ifdef __cplusplus
}
#endif

#endif
