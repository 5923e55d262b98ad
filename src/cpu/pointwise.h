/* pointwise.h - 1x1 stride-1 float32 convolutions over NCHW (group 1), on AVX-512: the output
 * pixels are the micro-kernel's rows, read straight from X (no packing of the activations), the
 * output channels its columns, against weights packed once when the session is created; each
 * finished 14-pixel x 32-channel tile is transposed in registers and stored into Y [M, pixels]
 * with bias, residual and activation.
 *
 *     kiln_pointwise *pw = kiln_cpu_pointwise_pack(W, M, K);      // W [M, K], K input channels
 *     kiln_cpu_pointwise_run(&ctx, pw, X, N, area, bias, res, act, Y);
 *     kiln_cpu_pointwise_free(pw);
 *
 * Against the packed GEMM with channels as rows this saves packing X per call and the padding
 * of the last 32-pixel panel (196 pixels fill 7 panels of 32 but 14 rows of 14 exactly). */
#ifndef KILN_CPU_POINTWISE_H
#define KILN_CPU_POINTWISE_H

#include <stdint.h>

#include "cpu/gemm.h"
#include "ir/graph.h"

typedef struct kiln_pointwise kiln_pointwise;

/* W [M, K] packed as 32-channel panels. NULL when the CPU lacks AVX-512F, when out of memory
 * or for empty sizes. Immutable: any number of threads may use it. */
kiln_pointwise *kiln_cpu_pointwise_pack(const float *w, int64_t M, int64_t K);
/* NULL is a no-op. */
void kiln_cpu_pointwise_free(kiln_pointwise *pw);
/* Writes W [M, K] back, exactly. */
void kiln_cpu_pointwise_unpack(const kiln_pointwise *pw, float *w);

/* Y [N, M, area] = act(W X + bias + res) with X [N, K, area]; bias [M] and res (Y's layout) may
 * be NULL. Threads from ctx's pool, buffers from its scratch. Errors: KILN_ERR_NOMEM. */
kiln_status kiln_cpu_pointwise_run(const kiln_gemm_ctx *ctx, const kiln_pointwise *pw, const float *x, int64_t N,
                                   int64_t area, const float *bias, const float *res, const kiln_act *act, float *y);

#endif
