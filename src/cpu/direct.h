/* direct.h - float32 convolutions (group 1) computed directly from the input, on AVX-512: the
 * output pixels are the micro-kernel's rows, each tap broadcast from the input in place (no
 * im2col, no packing of the activations per call), the output channels its columns against
 * weights packed once when the session is created; each finished tile of 14 pixels of one
 * output row by 32 channels is transposed in registers and stored into Y [M, oh, ow] with bias,
 * residual and activation. A layer of fewer than 16 output channels runs narrow tiles instead:
 * 16 consecutive pixels of a row per vector, each channel's weight broadcast (direct.c).
 *
 *     kiln_direct *d = kiln_cpu_direct_pack(W, M, K);   // W [M, K]: K = C * kh * kw taps
 *     kiln_direct_src src = {X, image, off, pitch, oh, ow};
 *     kiln_cpu_direct_run(&ctx, d, &src, N, bias, res, act, Y);
 *     kiln_cpu_direct_free(d);
 *
 * A 1x1 stride-1 layer reads X itself (tap k of pixel i at X + k * area + i); other kernels read
 * a zero-bordered copy split into stride phases (kernels_conv.c's copy_phases), where the 14
 * pixels of each tap are contiguous too (the narrow tiles read no pixel past a row). Against the packed GEMM this saves packing the input
 * on every call and the padding of the last 32-pixel panel (196 pixels fill 7 panels of 32 but
 * 14 tiles of 14 exactly). */
#ifndef KILN_CPU_DIRECT_H
#define KILN_CPU_DIRECT_H

#include <stdint.h>

#include "cpu/gemm.h"
#include "ops/fused.h"

/* Pixels per tile: the micro-kernel's rows. */
#define KILN_DIRECT_ROWS 14

typedef struct kiln_direct kiln_direct;

/* Where one call's taps are: tap k of output pixel (oy, ox) of image b is at
 * x[b * image + off[k] + oy * pitch + ox]. Each tile reads KILN_DIRECT_ROWS consecutive pixels
 * of a row from its first one, so with ow < KILN_DIRECT_ROWS the reads run past the row's last
 * pixel, and the buffer must have those floats. */
typedef struct kiln_direct_src {
    const float *x;
    int64_t image;
    const int64_t *off; /* [K] */
    int64_t pitch, oh, ow;
} kiln_direct_src;

/* W [M, K] packed as 32-channel panels. NULL when the CPU lacks AVX-512F, when out of memory
 * or for empty sizes. Immutable: any number of threads may use it. */
kiln_direct *kiln_cpu_direct_pack(const float *w, int64_t M, int64_t K);
/* NULL is a no-op. */
void kiln_cpu_direct_free(kiln_direct *d);
/* Writes W [M, K] back, exactly. */
void kiln_cpu_direct_unpack(const kiln_direct *d, float *w);

/* Y [N, M, oh, ow] = act(conv + bias + res) with the taps of src; bias [M] and res (Y's layout)
 * may be NULL. Threads from ctx's pool. Errors: none yet (KILN_OK). */
kiln_status kiln_cpu_direct_run(const kiln_gemm_ctx *ctx, const kiln_direct *d, const kiln_direct_src *src, int64_t N,
                                const float *bias, const float *res, const kiln_act *act, float *y);

#endif
