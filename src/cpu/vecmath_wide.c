/* vecmath_wide.c - vecmath.h's array functions: vecmath_body.h compiled for 16 lanes under
 * AVX-512F, 8 under AVX2 + FMA and 4 (vecmath.h's own) otherwise, chosen once at run time. */
#include <stdint.h>
#include <string.h>

#include "cpu/gemm.h"
#include "cpu/target.h"
#include "cpu/vecmath.h"

/* y[i] = F(x[i]) over whole vectors of L lanes, the tail through one zero-padded vector */
#define DEF_ARRAY(NAME, P, L, F)                                                                         \
    static void NAME(const float *x, float *y, int64_t n)                                                    \
    {                                                                                                        \
        int64_t i = 0;                                                                                       \
        for (; i + L <= n; i += L) P##_store(y + i, F(P##_load(x + i)));                                     \
        if (i < n) {                                                                                         \
            float t[L] = {0};                                                                                \
            memcpy(t, x + i, (size_t)(n - i) * sizeof *t);                                                   \
            P##_store(t, F(P##_load(t)));                                                                    \
            memcpy(y + i, t, (size_t)(n - i) * sizeof *t);                                                   \
        }                                                                                                    \
    }

/* One LSTM step's cell over L hidden units (kiln_vec_lstm_cell): the gate blocks i, o, f, c of the
 * pre-activations gx + gh (+ bias) lie s floats apart. */
#define DEF_LSTM_LANES(P, L)                                                                              \
    static inline void P##_lstm_lanes(const float *gx, const float *gh, const float *bias, int64_t s, float *c, \
                                      float *h)                                                          \
    {                                                                                                    \
        __typeof__(P##_splat(0.0f)) pre[4];                                                              \
        for (int g = 0; g < 4; g++) {                                                                    \
            pre[g] = P##_load(gx + g * s) + P##_load(gh + g * s);                                        \
            if (bias) pre[g] += P##_load(bias + g * s);                                                  \
        }                                                                                                \
        __typeof__(pre[0]) ct = P##_sigmoid(pre[2]) * P##_load(c) +                                  \
                                P##_sigmoid(pre[0]) * P##_tanh(pre[3]);                              \
        P##_store(c, ct);                                                                                \
        P##_store(h, P##_sigmoid(pre[1]) * P##_tanh(ct));                                                \
    }                                                                                                    \
    static void P##_lstm_cell(const float *gx, const float *gh, const float *bias, float *c, float *h, int64_t H) \
    {                                                                                                    \
        int64_t k = 0;                                                                                   \
        for (; k + L <= H; k += L) P##_lstm_lanes(gx + k, gh + k, bias ? bias + k : NULL, H, c + k, h + k); \
        if (k == H) return;                                                                              \
        /* the last units through zero-padded copies of their four gate blocks */                        \
        float tx[4 * L] = {0}, th[4 * L] = {0}, tb[4 * L] = {0}, tc[L] = {0}, tt[L];                     \
        size_t rest = (size_t)(H - k) * sizeof(float);                                                   \
        for (int g = 0; g < 4; g++) {                                                                    \
            memcpy(tx + g * L, gx + g * H + k, rest);                                                    \
            memcpy(th + g * L, gh + g * H + k, rest);                                                    \
            if (bias) memcpy(tb + g * L, bias + g * H + k, rest);                                        \
        }                                                                                                \
        memcpy(tc, c + k, rest);                                                                         \
        P##_lstm_lanes(tx, th, tb, L, tc, tt);                                                           \
        memcpy(c + k, tc, rest);                                                                         \
        memcpy(h + k, tt, rest);                                                                         \
    }

#define DEF_ARRAYS(P, L)                                                                                 \
    DEF_ARRAY(P##_exp_array, P, L, P##_exp)                                                              \
    DEF_ARRAY(P##_sigmoid_array, P, L, P##_sigmoid)                                                      \
    DEF_ARRAY(P##_tanh_array, P, L, P##_tanh)                                                            \
    DEF_ARRAY(P##_erf_array, P, L, P##_erf)                                                              \
    DEF_ARRAY(P##_gelu_tanh_array, P, L, P##_gelu_tanh)                                                  \
    DEF_LSTM_LANES(P, L)

DEF_ARRAYS(v4, 4)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_WIDE 1

KILN_TARGET_BEGIN("avx2,fma")
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
#define VF v8f
#define VI v8i
#define VU v8u
#define VM_LANES 8
#define VM(name) v8_##name
#include "cpu/vecmath_body.h"
DEF_ARRAYS(v8, 8)
KILN_TARGET_END

KILN_TARGET_BEGIN("avx512f")
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
#define VF v16f
#define VI v16i
#define VU v16u
#define VM_LANES 16
#define VM(name) v16_##name
#include "cpu/vecmath_body.h"
DEF_ARRAYS(v16, 16)
KILN_TARGET_END
#endif

typedef void (*array_fn)(const float *x, float *y, int64_t n);

/* 0: 4 lanes, 1: AVX2, 2: AVX-512 (kiln_gemm_level_detect reads the CPU's flags, once probed) */
static int width(void)
{
    kiln_gemm_level g = kiln_gemm_level_detect();
    return g == KILN_GEMM_LEVEL_AVX512 ? 2 : g == KILN_GEMM_LEVEL_AVX2 ? 1 : 0;
}

#ifdef HAVE_WIDE
#define DISPATCH(NAME)                                                                                       \
    void kiln_vec_##NAME(const float *x, float *y, int64_t n)                                                \
    {                                                                                                        \
        static const array_fn fns[3] = {v4_##NAME##_array, v8_##NAME##_array, v16_##NAME##_array};          \
        fns[width()](x, y, n);                                                                               \
    }
#else
#define DISPATCH(NAME)                                                                                       \
    void kiln_vec_##NAME(const float *x, float *y, int64_t n)                                                \
    {                                                                                                        \
        (void)width;                                                                                         \
        v4_##NAME##_array(x, y, n);                                                                          \
    }
#endif

DISPATCH(exp)
DISPATCH(sigmoid)
DISPATCH(tanh)
DISPATCH(erf)
DISPATCH(gelu_tanh)

typedef void (*lstm_fn)(const float *gx, const float *gh, const float *bias, float *c, float *h, int64_t H);

void kiln_vec_lstm_cell(const float *gx, const float *gh, const float *bias, float *c, float *h, int64_t H)
{
#ifdef HAVE_WIDE
    static const lstm_fn fns[3] = {v4_lstm_cell, v8_lstm_cell, v16_lstm_cell};
    fns[width()](gx, gh, bias, c, h, H);
#else
    v4_lstm_cell(gx, gh, bias, c, h, H);
#endif
}
