/* act_wide.c - kiln_cpu_act_apply_sum's AVX-512 loop (kernels.h): 16 lanes of act512.h, the
 * tail masked. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <stdint.h>

#include "cpu/target.h"

KILN_TARGET_BEGIN("avx512f")

#include "cpu/act512.h"
#include "cpu/avx512_util.h"
#include "cpu/kernels.h"

/* y = act(y + bias + res) over whole vectors, then the tail masked (masked stores are slow on
 * some cores: Zen 4's every one cost the 16-lane Tanh about 10%), one kind per loop (the switch
 * folds away) */
#define ACT_LOOP(KIND)                                                                                                 \
    do {                                                                                                               \
        const kiln_act k = {KIND, a->alpha, a->beta};                                                                  \
        int64_t i = 0;                                                                                                 \
        for (; i + 16 <= n; i += 16) {                                                                                 \
            __m512 v = _mm512_add_ps(_mm512_loadu_ps(y + i), vb);                                                      \
            if (res) v = _mm512_add_ps(v, _mm512_loadu_ps(res + i));                                                   \
            _mm512_storeu_ps(y + i, kiln_act512(&k, v));                                                               \
        }                                                                                                              \
        if (i < n) {                                                                                                   \
            __mmask16 m = kiln_lanes(n - i);                                                                           \
            __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), vb);                                             \
            if (res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, res + i));                                          \
            _mm512_mask_storeu_ps(y + i, m, kiln_act512(&k, v));                                                       \
        }                                                                                                              \
    } while (0)

void kiln_cpu_act_apply_sum_avx512(const kiln_act *a, float *y, const float *res, int64_t n, float bias)
{
    const __m512 vb = _mm512_set1_ps(bias);
    switch (a->kind) {
    case KILN_ACT_NONE: ACT_LOOP(KILN_ACT_NONE); return;
    case KILN_ACT_RELU: ACT_LOOP(KILN_ACT_RELU); return;
    case KILN_ACT_CLIP: ACT_LOOP(KILN_ACT_CLIP); return;
    case KILN_ACT_SIGMOID: ACT_LOOP(KILN_ACT_SIGMOID); return;
    case KILN_ACT_HARD_SIGMOID: ACT_LOOP(KILN_ACT_HARD_SIGMOID); return;
    case KILN_ACT_HARD_SWISH: ACT_LOOP(KILN_ACT_HARD_SWISH); return;
    case KILN_ACT_LEAKY_RELU: ACT_LOOP(KILN_ACT_LEAKY_RELU); return;
    case KILN_ACT_GELU: ACT_LOOP(KILN_ACT_GELU); return;
    case KILN_ACT_GELU_TANH: ACT_LOOP(KILN_ACT_GELU_TANH); return;
    case KILN_ACT_TANH: ACT_LOOP(KILN_ACT_TANH); return;
    }
}

KILN_TARGET_END
#endif
