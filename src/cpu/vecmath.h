/* vecmath.h - 4-lane float vectors (GCC/clang vector extensions, SSE2/NEON width) and the
 * vector exp, tanh, erf and Gelu the float32 kernels share (vecmath_body.h; the 8- and 16-lane
 * array functions of vecmath_wide.c run the same code on AVX2 and AVX-512). Loads and stores go through memcpy:
 * no alignment is assumed, and a store may overwrite the very elements it was loaded from
 * (in-place kernels). */
#ifndef KILN_CPU_VECMATH_H
#define KILN_CPU_VECMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));

#define VF v4f
#define VI v4i
#define VU v4u
#define VM_LANES 4
#define VM(name) v4_##name
#include "cpu/vecmath_body.h"

/* Array functions y[i] = f(x[i]) for i < n, 16 or 8 lanes where the CPU has AVX-512 or AVX2 (FMA
 * contracted there, so the last bits may differ from the 4-lane code), else 4 (vecmath_wide.c).
 * y may be x. */
void kiln_vec_exp(const float *x, float *y, int64_t n);
void kiln_vec_sigmoid(const float *x, float *y, int64_t n);
void kiln_vec_tanh(const float *x, float *y, int64_t n);
void kiln_vec_erf(const float *x, float *y, int64_t n);
void kiln_vec_gelu_tanh(const float *x, float *y, int64_t n);

/* One LSTM step's cell for one batch row, over the gate blocks i, o, f, c of H values each of
 * pre = gx + gh (+ bias; NULL for none), all [4H]: c = f c + i tanh(pre_c), h = o tanh(c), with
 * f, i, o the sigmoids of their blocks; c [H] updated in place, h [H] written. One pass at the
 * widths of the array functions above. */
void kiln_vec_lstm_cell(const float *gx, const float *gh, const float *bias, float *c, float *h, int64_t H);

#endif
