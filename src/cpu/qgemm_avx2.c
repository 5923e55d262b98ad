/* qgemm_avx2.c - the AVX2 int8 GEMM micro-kernel (6x16: 12 accumulators of 8 int32) on bytes
 * widened to int16 at packing time and vpmaddwd over depth pairs: exact, unlike vpmaddubsw, whose
 * int16 sums of two u8 x s8 products saturate. Compiled for AVX2 here only; qgemm.c calls it
 * only where the CPU has AVX2. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif

#include "cpu/qgemm_avx256.h"
#include "cpu/qgemm_internal.h"

enum { MR = 6, NR = 16, KG = 2 };

static void kernel(int64_t groups, const void *a_, int64_t as, const void *b_, int32_t *C, int64_t ldc, int mr,
                   int nr, const int32_t *rs, const int32_t *zb, const int32_t *cs, int32_t za)
{
    const uint8_t *a = a_; /* int16 pairs, addressed in bytes */
    const uint8_t *b = b_;
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const uint8_t *a0 = a, *a1 = a + as, *a2 = a + 2 * as, *a3 = a + 3 * as, *a4 = a + 4 * as, *a5 = a + 5 * as;
    for (int64_t g = 0; g < groups; g++, b += NR * KG * 2) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)b), b1 = _mm256_loadu_si256((const __m256i *)(b + 32));
        int64_t o = g * KG * 2;
        __m256i v;
#define STEP(cx0, cx1, ax)                                                    \
    v = qgemm_bcast4(ax + o);                                                 \
    cx0 = _mm256_add_epi32(cx0, _mm256_madd_epi16(v, b0));                   \
    cx1 = _mm256_add_epi32(cx1, _mm256_madd_epi16(v, b1));
        STEP(c00, c01, a0) STEP(c10, c11, a1) STEP(c20, c21, a2) STEP(c30, c31, a3) STEP(c40, c41, a4)
        STEP(c50, c51, a5)
#undef STEP
    }
    _Static_assert(MR == 6 && NR == 16, "qgemm_store_6x16 stores 6x16 tiles");
    __m256i acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    qgemm_store_6x16(acc, mr, nr, rs, zb, cs, za, C, ldc);
}

const kiln_qgemm_kernel kiln_qgemm_kernel_avx2 = {.mr = MR, .nr = NR, .kg = KG, .esize = 2, .kernel = kernel};

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
