/* qgemm_avx512vnni.c - the AVX-512 VNNI int8 GEMM micro-kernel (8x32: 16 accumulators of 16
 * int32, vpdpbusd over groups of 4 bytes), compiled for that instruction set here only; qgemm.c
 * calls it only where the CPU has AVX-512F and AVX-512 VNNI. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vnni")
#endif

#include "cpu/qgemm_internal.h"

enum { MR = 8, NR = 32, KG = 4 };

static inline __m512i bcast4(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

static void kernel(int64_t groups, const void *a_, int64_t as, const void *b_, int32_t *C, int64_t ldc, int mr,
                   int nr, const int32_t *rs, const int32_t *zb, const int32_t *cs, int32_t za)
{
    const uint8_t *a = a_;
    const int8_t *b = b_;
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    const uint8_t *a0 = a, *a1 = a + as, *a2 = a + 2 * as, *a3 = a + 3 * as, *a4 = a + 4 * as, *a5 = a + 5 * as,
                  *a6 = a + 6 * as, *a7 = a + 7 * as;
    for (int64_t g = 0; g < groups; g++, b += NR * KG) {
        __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 64);
        int64_t o = g * KG;
        __m512i v;
        v = bcast4(a0 + o), c00 = _mm512_dpbusd_epi32(c00, v, b0), c01 = _mm512_dpbusd_epi32(c01, v, b1);
        v = bcast4(a1 + o), c10 = _mm512_dpbusd_epi32(c10, v, b0), c11 = _mm512_dpbusd_epi32(c11, v, b1);
        v = bcast4(a2 + o), c20 = _mm512_dpbusd_epi32(c20, v, b0), c21 = _mm512_dpbusd_epi32(c21, v, b1);
        v = bcast4(a3 + o), c30 = _mm512_dpbusd_epi32(c30, v, b0), c31 = _mm512_dpbusd_epi32(c31, v, b1);
        v = bcast4(a4 + o), c40 = _mm512_dpbusd_epi32(c40, v, b0), c41 = _mm512_dpbusd_epi32(c41, v, b1);
        v = bcast4(a5 + o), c50 = _mm512_dpbusd_epi32(c50, v, b0), c51 = _mm512_dpbusd_epi32(c51, v, b1);
        v = bcast4(a6 + o), c60 = _mm512_dpbusd_epi32(c60, v, b0), c61 = _mm512_dpbusd_epi32(c61, v, b1);
        v = bcast4(a7 + o), c70 = _mm512_dpbusd_epi32(c70, v, b0), c71 = _mm512_dpbusd_epi32(c71, v, b1);
    }
    __m512i acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                          {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
    __m512i zb0 = _mm512_loadu_si512(zb), zb1 = _mm512_loadu_si512(zb + 16);
    __m512i vza = _mm512_set1_epi32(za);
    __m512i t0 = _mm512_mullo_epi32(vza, _mm512_loadu_si512(cs)), t1 = _mm512_mullo_epi32(vza, _mm512_loadu_si512(cs + 16));
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xFFFF : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
    for (int r = 0; r < mr; r++) {
        __m512i vr = _mm512_set1_epi32(rs[r]);
        __m512i y0 = _mm512_sub_epi32(_mm512_sub_epi32(acc[r][0], _mm512_mullo_epi32(zb0, vr)), t0);
        __m512i y1 = _mm512_sub_epi32(_mm512_sub_epi32(acc[r][1], _mm512_mullo_epi32(zb1, vr)), t1);
        _mm512_mask_storeu_epi32(C + r * ldc, m0, y0);
        _mm512_mask_storeu_epi32(C + r * ldc + 16, m1, y1);
    }
}

const kiln_qgemm_kernel kiln_qgemm_kernel_avx512vnni = {.mr = MR, .nr = NR, .kg = KG, .esize = 1, .kernel = kernel};

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
