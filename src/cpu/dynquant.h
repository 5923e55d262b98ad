/* dynquant.h - the two passes of dynamic uint8 quantization that the CPU provider's int8 kernels
 * share (DynamicQuantizeLinear, DynamicQuantizeMatMul, DynamicQuantizeLSTM's per-step hidden
 * state): the data's range, then every value quantized with the parameters that
 * kiln_dynquant_params (ops/contrib_quant.h) computes from it. AVX-512 and AVX2 where the CPU has
 * them, split over a pool's threads when large; the same results at every level. */
#ifndef KILN_CPU_DYNQUANT_H
#define KILN_CPU_DYNQUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/threadpool.h"

/* *mn = min(0, x...), *mx = max(0, x...); false (and no range) when some x is NaN. pool may be NULL. */
bool kiln_cpu_range_f32(kiln_threadpool *pool, const float *x, int64_t n, float *mn, float *mx);

/* y[i] = kiln_dynquant_one(x[i], scale, zp) for i < n. pool may be NULL. */
void kiln_cpu_quantize_u8(kiln_threadpool *pool, const float *x, int64_t n, float scale, int32_t zp, uint8_t *y);

#endif
