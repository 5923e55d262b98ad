/* winograd.h - 3x3 stride-1 float32 convolutions by Winograd's minimal filtering F(2x2, 3x3):
 * each 2x2 output tile comes from a 4x4 input tile with 16 multiplies per channel pair instead
 * of 36, as 16 GEMMs (one per point of the transformed tile) against weights transformed and
 * packed once, when the session is created.
 *
 *     kiln_winograd *w = kiln_cpu_winograd_pack(W, mg, cg);        // W [mg, cg, 3, 3]
 *     kiln_cpu_winograd_run(&ctx, w, P, hq, wq, oh, ow, bias, res, act, Y);
 *     kiln_cpu_winograd_free(w);
 *
 * The caller gives the input as a zero-bordered copy whose columns are split into their even
 * and odd halves (kernels_conv.c's stride-phase copy with strides 1 x 2), so that every tile
 * reads in bounds and every read is contiguous. */
#ifndef KILN_CPU_WINOGRAD_H
#define KILN_CPU_WINOGRAD_H

#include <stdint.h>

#include "cpu/gemm.h"
#include "ops/fused.h"

typedef struct kiln_winograd kiln_winograd;

#define KILN_WINOGRAD_SLACK 32

/* The 16 transformed weight matrices U_xi [mg, cg] of W [mg, cg, 3, 3], packed as the GEMM's A.
 * NULL when out of memory (or for empty sizes). Immutable: any number of threads may use it. */
kiln_winograd *kiln_cpu_winograd_pack(const float *w, int64_t mg, int64_t cg);
/* NULL is a no-op. */
void kiln_cpu_winograd_free(kiln_winograd *wg);

/* Y [mg, oh, ow] = act(conv3x3(X) + bias + res) for one image. P is the padded input
 * [cg][2][hq][wq]: padded row r, padded column 2k + e at P[((c * 2 + e) * hq + r) * wq + k],
 * zero outside the input, with hq >= 2 * ceil(oh / 2) + 2 and wq >= ceil(ow / 2) + 1 (padded
 * row 0 and column 0 are those of output pixel (0, 0)'s top-left tap), followed by at least
 * KILN_WINOGRAD_SLACK readable floats (vectors read past the last tile). bias [mg] and res
 * [mg, oh, ow] may be NULL. Threads from ctx's pool, buffers from its scratch.
 * Errors: KILN_ERR_NOMEM. */
kiln_status kiln_cpu_winograd_run(const kiln_gemm_ctx *ctx, const kiln_winograd *wg, const float *P, int64_t hq,
                                  int64_t wq, int64_t oh, int64_t ow, const float *bias, const float *res,
                                  const kiln_act *act, float *y);

#endif
