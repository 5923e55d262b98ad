/* nchwc.h - float32 convolutions, pooling and nearest resizing over activations blocked by 16
 * channels (NCHW16c: a [N, C, H, W] tensor stored as [N][C / 16][H][W][16], C a multiple of 16),
 * on AVX-512. A CNN whose activations stay blocked from one layer to the next (the layout pass,
 * src/passes/layout_nchwc.c) has each kernel read its input and write its output as whole
 * 16-channel vectors: a convolution's micro-kernel broadcasts one input channel of a pixel
 * against 16 output channels of packed weights and stores its accumulators as they are, with no
 * im2col, no packing of the activations and no transposed store.
 *
 *     kiln_nchwc_conv *w = kiln_cpu_nchwc_conv_pack(W, M, C, kh, kw);  // W [M, C, kh, kw]
 *     kiln_nchwc_conv_io io = {...};  // X and Y, each plain NCHW or blocked
 *     kiln_cpu_nchwc_conv_run(pool, w, &io);
 *     kiln_cpu_nchwc_conv_free(w);
 *
 * The convolution's input may be plain NCHW (any C: a network's 3-channel image) and its output
 * plain NCHW (any M), so a blocked region begins and ends at a convolution without a separate
 * reorder. */
#ifndef KILN_CPU_NCHWC_H
#define KILN_CPU_NCHWC_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "core/threadpool.h"
#include "ops/fused.h"

/* Channels per block. */
#define KILN_NCHWC_BLOCK 16

/* Output x input channels up to which a 3x3 layer gets Winograd weights (kiln_cpu_nchwc_conv_pack). */
#define KILN_NCHWC_WINO_MAX_MC (256 * 256)

/* Whether this CPU runs the kernels here (AVX-512F). */
bool kiln_cpu_nchwc_available(void);

typedef struct kiln_nchwc_conv kiln_nchwc_conv;

/* W [M, C, kh, kw] (group 1) packed, per group of up to 4 blocks of 16 output channels, as
 * [kh][kw][ceil(C / 16)][blocks of the group][cn in][16 out], cn the channels of that input
 * block (16, or C % 16 for a last partial one: a 3-channel image's weights stay dense), zero
 * past M; or, for a depthwise layer (C = 1, group M), [M / 16][kh][kw][16]. A 3x3 layer of at
 * most KILN_NCHWC_WINO_MAX_MC output x input channels (C a multiple of 16) also gets its Winograd
 * weights (nchwc_winograd.h: those of F(2x2, 3x3), and up to 128 x 128 channels those of
 * F(4x4, 3x3) as well). NULL
 * when the CPU lacks AVX-512F, when out of memory or for empty sizes. Immutable: any number of
 * threads may use it. */
kiln_nchwc_conv *kiln_cpu_nchwc_conv_pack(const float *w, int64_t M, int64_t C, int64_t kh, int64_t kw,
                                          bool depthwise);
/* NULL is a no-op. */
void kiln_cpu_nchwc_conv_free(kiln_nchwc_conv *w);
/* Its sizes: W [M, C, kh, kw]; true for a depthwise layer (C = 1). */
bool kiln_cpu_nchwc_conv_shape(const kiln_nchwc_conv *w, int64_t *M, int64_t *C, int64_t *kh, int64_t *kw);
/* Writes W back, exactly. */
void kiln_cpu_nchwc_conv_unpack(const kiln_nchwc_conv *w, float *dst);

/* One convolution: Y [N, M, oh, ow] = act(conv(X [N, C, H, W]) + bias + res). X and Y (and res,
 * which has Y's layout) are plain NCHW or blocked; a blocked one has C (or M) a multiple of 16;
 * a depthwise layer's are both blocked. bias [M] and res may be NULL. */
typedef struct kiln_nchwc_conv_io {
    const float *x;
    bool x_blocked;
    int64_t N, H, W;
    float *y;
    bool y_blocked;
    int64_t oh, ow;
    const float *bias, *res;
    const kiln_act *act;
    int64_t strides[2], dilations[2], pads[2]; /* pads: top, left */
    struct kiln_scratch *scratch; /* a plain X with pads is copied with them as zeros (NULL: malloc) */
} kiln_nchwc_conv_io;

/* Threads from pool (NULL: the calling thread). Errors: KILN_ERR_INVALID_ARG for a layout the
 * sizes do not allow (blocked with a channel count not a multiple of 16, depthwise not blocked);
 * KILN_ERR_NOMEM when the padded copy of a plain X cannot be had. */
kiln_status kiln_cpu_nchwc_conv_run(kiln_threadpool *pool, const kiln_nchwc_conv *w, const kiln_nchwc_conv_io *io);

/* Pooling of a blocked X [N, C, H, W] into a blocked Y [N, C, oh, ow] as the CPU provider's
 * plain kernels compute it: max (NaN propagating; 0 for a window wholly in the padding), or
 * average over the taps inside X, or with count_include_pad over those before the end pads.
 * kernel, strides, dilations and pads (top, left, bottom, right) as ONNX's resolved attributes. */
typedef struct kiln_nchwc_pool_io {
    const float *x;
    float *y;
    int64_t N, C, H, W, oh, ow;
    int64_t kernel[2], strides[2], dilations[2], pads[4];
    bool max, count_include_pad;
} kiln_nchwc_pool_io;
void kiln_cpu_nchwc_pool_run(kiln_threadpool *pool, const kiln_nchwc_pool_io *io);

/* Y [N, C] = the mean (GlobalAveragePool) or, with max, the max (GlobalMaxPool) of each channel
 * of a blocked X [N, C, H, W] over its `area` pixels; the plain output [N, C, 1, 1] is the same
 * bytes as a blocked one. The max as the plain kernel computes it: the first NaN of a channel is
 * its max, -inf for an empty plane. */
void kiln_cpu_nchwc_global_pool(kiln_threadpool *pool, const float *x, float *y, int64_t N, int64_t C, int64_t area,
                                bool max);

/* Nearest resize of H and W between blocked values: Y [N, C, oh, ow] with each pixel's 16-channel
 * vectors copied whole, y[n][c][oy][ox] = x[n][c][iy[oy]][ix[ox]], iy [oh] and ix [ow] source
 * rows and columns inside X [N, C, H, W]. */
typedef struct kiln_nchwc_resize_io {
    const float *x;
    float *y;
    int64_t N, C, H, W, oh, ow;
    const int64_t *iy, *ix;
} kiln_nchwc_resize_io;
void kiln_cpu_nchwc_resize_nearest(kiln_threadpool *pool, const kiln_nchwc_resize_io *io);

/* Layout conversions of [N, C, area] with C a multiple of 16 (plain <-> blocked), on any CPU
 * (16 x 16 transposes in registers where it has AVX-512F). Threads from pool (NULL: the calling
 * thread). */
void kiln_cpu_nchwc_block(kiln_threadpool *pool, const float *x, float *y, int64_t N, int64_t C, int64_t area);
void kiln_cpu_nchwc_unblock(kiln_threadpool *pool, const float *x, float *y, int64_t N, int64_t C, int64_t area);

#endif
