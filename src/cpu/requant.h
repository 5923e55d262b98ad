/* requant.h - the int8 ops' requantization of int32 sums as ONNX Runtime computes it (QLinearConv,
 * QLinearMatMul): float(acc) times the float32 multiplier x_scale * w_scale / y_scale, clamped to
 * the output range less the zero point, rounded half to even, plus the zero point; 16 lanes at a
 * time where the CPU has AVX-512 (the same float32 operations: vcvtps2dq's default rounding is
 * rintf's). */
#ifndef KILN_CPU_REQUANT_H
#define KILN_CPU_REQUANT_H

#include <stdint.h>

#include "cpu/kernels.h"

/* One value; lo and hi are the output range less zp. */
static inline uint8_t kiln_cpu_requant_one(int32_t acc, float mult, float lo, float hi, int32_t zp)
{
    return (uint8_t)(int32_t)(kiln_rint_small(kiln_clampf((float)acc * mult, lo, hi)) + (float)zp);
}

/* t[i * ldt + j] = requant(c[i * ldc + j] + bias[j], mult[j]) for i < m, j < n (bias may be NULL). */
void kiln_cpu_requant_rows(const int32_t *c, int64_t ldc, int64_t m, int64_t n, const float *mult, const int32_t *bias,
                           float lo, float hi, int32_t zp, uint8_t *t, int64_t ldt);
/* y[i] = requant(s[i] + bias, mult) for i < n, the sums s int32 (c) or integral floats (yf, the
 * other NULL). */
void kiln_cpu_requant_line(const float *yf, const int32_t *c, int64_t n, uint32_t bias, float mult, float lo, float hi,
                           int32_t zp, uint8_t *y);

#endif
