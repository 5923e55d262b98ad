/* dynquant.h - the two passes of dynamic uint8 quantization that the CPU provider's int8 kernels
 * share (DynamicQuantizeLinear, DynamicQuantizeMatMul, DynamicQuantizeLSTM's per-step hidden
 * state): the data's range, then every value quantized with the parameters that
 * kiln_dynquant_params (ops/contrib_quant.h) computes from it; the second pass is also
 * QuantizeLinear's (uint8 or int8). AVX-512 and AVX2 where the CPU has
 * them, split over a pool's threads when large; the same results at every level. */
#ifndef KILN_CPU_DYNQUANT_H
#define KILN_CPU_DYNQUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/threadpool.h"

/* *mn = min(0, x...), *mx = max(0, x...); false (and no range) when some x is NaN. pool may be NULL. */
bool kiln_cpu_range_f32(kiln_threadpool *pool, const float *x, int64_t n, float *mn, float *mx);

/* y[i] = rint(x[i] / scale) + zp saturated to uint8 (int8 when y_signed) for i < n: for uint8,
 * kiln_dynquant_one; NaN gives the range's low end (as ORT and the reference). pool may be NULL. */
void kiln_cpu_quantize(kiln_threadpool *pool, const float *x, int64_t n, float scale, int32_t zp, bool y_signed,
                       void *y);

/* out[j] = float(acc[j]) * (a_scale * b_scale[per_col ? j : 0]) (+ bias[j]) for j < n: a row of
 * an int8 GEMM's sums back to float (MatMulIntegerToFloat's epilogue, DynamicQuantizeLSTM's
 * projections and steps), 16 lanes at a time where the CPU has AVX-512, else 4. bias may be
 * NULL; out may be acc's own storage (each element is read before it is written). */
void kiln_cpu_dequant_row(const int32_t *acc, int64_t n, float a_scale, const float *b_scale, bool per_col,
                          const float *bias, float *out);

#endif
