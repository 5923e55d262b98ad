/* nchwc_winograd.h - 3x3 stride-1 convolutions between blocked activations (nchwc.h) by
 * Winograd's minimal filtering F(m x m, 3x3): each m x m output tile comes from an (m + 2)^2
 * input tile, with 16 multiplies per channel pair and 2x2 outputs instead of 36 (m = 2), or 36
 * per 4x4 outputs instead of 144 (m = 4). nchwc.c runs a layer here when its weights were
 * transformed at packing time, its input blocked (a plain input of 16k channels is blocked into
 * scratch first); the output is blocked, or plain NCHW of any channel count.
 *
 *     float *u = kiln_cpu_nchwc_wino_pack(W, M, C, m);   // W [M, C, 3, 3], C a multiple of 16
 *     kiln_cpu_nchwc_wino_run(pool, u, m, M, C, &io);    // io as for kiln_cpu_nchwc_conv_run
 *     free(u);
 *
 * A task takes a batch of tiles of one image for one group of up to four 16-channel output
 * blocks: it transforms their input (all channels) into a buffer of its own, runs the (m + 2)^2
 * point-wise products of that batch against the group's transformed weights six tiles at a
 * time, and transforms each product back into m x m outputs with bias, residual and activation
 * (into a plain Y, each tile of a block turned into one vector per channel first). */
#ifndef KILN_CPU_NCHWC_WINOGRAD_H
#define KILN_CPU_NCHWC_WINOGRAD_H

#include <stdint.h>

#include "core/error.h"
#include "cpu/nchwc.h"
#include "core/threadpool.h"

/* The (m + 2)^2 transformed weights G g G^T of F(m x m, 3x3) (m 2 or 4) of W [M, C, 3, 3] per
 * group of up to 4 output blocks, as [point][C][blocks of the group][16 out] (a group's block
 * starting at (m + 2)^2 * 16 * C * its first output block; zeros past M in the last block). NULL
 * when M is not positive, C not a positive multiple of 16, m neither 2 nor 4, or out of memory.
 * Freed with free(). */
float *kiln_cpu_nchwc_wino_pack(const float *w, int64_t M, int64_t C, int m);

/* Y = act(conv3x3(X) + bias + res) at stride 1 and dilation 1 (io's strides and dilations are
 * not read), X blocked, Y (and res) blocked or plain (M a multiple of 16 when blocked). u from
 * kiln_cpu_nchwc_wino_pack(W, M, C, m). Threads from pool (NULL: the calling thread), buffers
 * from io->scratch. Errors: KILN_ERR_NOMEM. */
kiln_status kiln_cpu_nchwc_wino_run(kiln_threadpool *pool, const float *u, int m, int64_t M, int64_t C,
                                    const kiln_nchwc_conv_io *io);

#endif
