/* qgemm_avxvnni.c - the AVX-VNNI int8 GEMM micro-kernel (6x16: 12 accumulators of 8 int32,
 * 256-bit vpdpbusd over groups of 4 bytes), compiled for that instruction set here only; qgemm.c
 * calls it only where the CPU has AVX2 and AVX-VNNI. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,avxvnni")
#endif

#include "cpu/qgemm_avx256.h"
#include "cpu/qgemm_internal.h"

enum { MR = 6, NR = 16, KG = 4 };

static void kernel(int64_t groups, const void *a_, int64_t as, const void *b_, int32_t *C, int64_t ldc, int mr,
                   int nr, const int32_t *rs, const int32_t *zb, const int32_t *cs, int32_t za)
{
    const uint8_t *a = a_;
    const int8_t *b = b_;
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const uint8_t *a0 = a, *a1 = a + as, *a2 = a + 2 * as, *a3 = a + 3 * as, *a4 = a + 4 * as, *a5 = a + 5 * as;
    for (int64_t g = 0; g < groups; g++, b += NR * KG) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)b), b1 = _mm256_loadu_si256((const __m256i *)(b + 32));
        int64_t o = g * KG;
        __m256i v;
        v = qgemm_bcast4(a0 + o), c00 = _mm256_dpbusd_avx_epi32(c00, v, b0), c01 = _mm256_dpbusd_avx_epi32(c01, v, b1);
        v = qgemm_bcast4(a1 + o), c10 = _mm256_dpbusd_avx_epi32(c10, v, b0), c11 = _mm256_dpbusd_avx_epi32(c11, v, b1);
        v = qgemm_bcast4(a2 + o), c20 = _mm256_dpbusd_avx_epi32(c20, v, b0), c21 = _mm256_dpbusd_avx_epi32(c21, v, b1);
        v = qgemm_bcast4(a3 + o), c30 = _mm256_dpbusd_avx_epi32(c30, v, b0), c31 = _mm256_dpbusd_avx_epi32(c31, v, b1);
        v = qgemm_bcast4(a4 + o), c40 = _mm256_dpbusd_avx_epi32(c40, v, b0), c41 = _mm256_dpbusd_avx_epi32(c41, v, b1);
        v = qgemm_bcast4(a5 + o), c50 = _mm256_dpbusd_avx_epi32(c50, v, b0), c51 = _mm256_dpbusd_avx_epi32(c51, v, b1);
    }
    _Static_assert(MR == 6 && NR == 16, "qgemm_store_6x16 stores 6x16 tiles");
    __m256i acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    qgemm_store_6x16(acc, mr, nr, rs, zb, cs, za, C, ldc);
}

const kiln_qgemm_kernel kiln_qgemm_kernel_avxvnni = {.mr = MR, .nr = NR, .kg = KG, .esize = 1, .kernel = kernel};

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
