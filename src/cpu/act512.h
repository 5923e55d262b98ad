/* act512.h - kiln.Fused* activations (ops/fused.h) on one AVX-512 register, for the kernels that
 * store 16-channel tiles (nchwc.c, nchwc_winograd.c): applied before the store, not by
 * kiln_cpu_act_apply over a few stored values afterwards. vecmath_body.h's 16-lane math, the
 * formulas of kernels_conv.c's act_v4 (FMA may be contracted here: the last bits can differ).
 * Include it after the file's avx512f target pragma. */
#ifndef KILN_CPU_ACT512_H
#define KILN_CPU_ACT512_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/fused.h"

typedef float kiln_a16f __attribute__((vector_size(64)));
typedef int32_t kiln_a16i __attribute__((vector_size(64)));
typedef uint32_t kiln_a16u __attribute__((vector_size(64)));
#define VF kiln_a16f
#define VI kiln_a16i
#define VU kiln_a16u
#define VM_LANES 16
#define VM(name) kiln_a16_##name
#include "cpu/vecmath_body.h"

/* The clamps keep NaN, as act_v4 and the reference do: vmaxps/vminps return their second
 * operand when either is NaN, so v goes second. */
static inline __m512 kiln_act512_clamp01(__m512 v)
{
    return _mm512_min_ps(_mm512_set1_ps(1.0f), _mm512_max_ps(_mm512_setzero_ps(), v));
}

/* act(v) */
static inline __attribute__((always_inline)) __m512 kiln_act512(const kiln_act *a, __m512 v)
{
    switch (a->kind) {
    case KILN_ACT_NONE: return v;
    case KILN_ACT_RELU: return _mm512_max_ps(_mm512_setzero_ps(), v);
    case KILN_ACT_CLIP: return _mm512_min_ps(_mm512_set1_ps(a->beta), _mm512_max_ps(_mm512_set1_ps(a->alpha), v));
    case KILN_ACT_SIGMOID: return (__m512)kiln_a16_sigmoid((kiln_a16f)v);
    case KILN_ACT_HARD_SIGMOID:
        return kiln_act512_clamp01(_mm512_add_ps(_mm512_mul_ps(v, _mm512_set1_ps(a->alpha)), _mm512_set1_ps(a->beta)));
    case KILN_ACT_HARD_SWISH:
        return _mm512_mul_ps(
            v, kiln_act512_clamp01(_mm512_add_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.0f / 6.0f)), _mm512_set1_ps(0.5f))));
    case KILN_ACT_LEAKY_RELU:
        return _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ), v, _mm512_set1_ps(a->alpha));
    case KILN_ACT_GELU: return (__m512)kiln_a16_gelu((kiln_a16f)v);
    case KILN_ACT_GELU_TANH: return (__m512)kiln_a16_gelu_tanh((kiln_a16f)v);
    case KILN_ACT_TANH: return (__m512)kiln_a16_tanh((kiln_a16f)v);
    }
    return v;
}

#endif
