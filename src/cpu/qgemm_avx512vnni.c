/* qgemm_avx512vnni.c - the AVX-512 VNNI int8 GEMM micro-kernel (8x32: 16 accumulators of 16
 * int32, vpdpbusd over groups of 4 bytes), compiled for that instruction set here only; qgemm.c
 * calls it only where the CPU has AVX-512F and AVX-512 VNNI. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu/target.h"

KILN_TARGET_BEGIN("avx2,avx512f,avx512vnni")

#include "cpu/qgemm_internal.h"

enum { MR = 8, NR = 32, KG = 4 };

static inline __m512i bcast4(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* The sums of R rows (R <= MR, a constant once inlined): rows past mr are not computed, so a
 * GEMV does one row's work. One or two rows split the depth groups between two accumulator
 * sets, so that more than two vpdpbusd chains are in flight. */
static inline __attribute__((always_inline)) void sums(const int R, int64_t groups, const uint8_t *a, int64_t as,
                                                       const int8_t *b, __m512i acc[MR][2])
{
    const int split = R <= 2 ? 2 : 1;
    __m512i c[2][MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        c[0][r][0] = c[0][r][1] = c[1][r][0] = c[1][r][1] = _mm512_setzero_si512();
    int64_t g = 0;
    for (; g + split <= groups; g += split)
#pragma GCC unroll 2
        for (int s = 0; s < split; s++) {
            const int8_t *bg = b + (g + s) * NR * KG;
            __m512i b0 = _mm512_loadu_si512(bg), b1 = _mm512_loadu_si512(bg + 64);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512i v = bcast4(a + r * as + (g + s) * KG);
                c[s][r][0] = _mm512_dpbusd_epi32(c[s][r][0], v, b0);
                c[s][r][1] = _mm512_dpbusd_epi32(c[s][r][1], v, b1);
            }
        }
    for (; g < groups; g++) {
        const int8_t *bg = b + g * NR * KG;
        __m512i b0 = _mm512_loadu_si512(bg), b1 = _mm512_loadu_si512(bg + 64);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512i v = bcast4(a + r * as + g * KG);
            c[0][r][0] = _mm512_dpbusd_epi32(c[0][r][0], v, b0);
            c[0][r][1] = _mm512_dpbusd_epi32(c[0][r][1], v, b1);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        acc[r][0] = split == 2 ? _mm512_add_epi32(c[0][r][0], c[1][r][0]) : c[0][r][0];
        acc[r][1] = split == 2 ? _mm512_add_epi32(c[0][r][1], c[1][r][1]) : c[0][r][1];
    }
}

static void kernel(int64_t groups, const void *a_, int64_t as, const void *b_, int32_t *C, int64_t ldc, int mr,
                   int nr, const int32_t *rs, const int32_t *zb, const int32_t *cs, int32_t za)
{
    const uint8_t *a = a_;
    const int8_t *b = b_;
    __m512i acc[MR][2];
    switch (mr) {
    case 1: sums(1, groups, a, as, b, acc); break;
    case 2: sums(2, groups, a, as, b, acc); break;
    case 3: sums(3, groups, a, as, b, acc); break;
    case 4: sums(4, groups, a, as, b, acc); break;
    case 5: sums(5, groups, a, as, b, acc); break;
    case 6: sums(6, groups, a, as, b, acc); break;
    case 7: sums(7, groups, a, as, b, acc); break;
    default: sums(8, groups, a, as, b, acc); break;
    }
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

/* One panel: each group of 4 rows of 32 bytes interleaved into 32 columns of 4 bytes by
 * byte then word unpacks (within 128-bit lanes, so lane 0 holds columns 0-7 and lane 1 columns
 * 16-23, put back in order by the lane permutes), unsigned B shifted to signed; the column sums
 * by vpdpbusd of the packed group against bytes of 1. A narrow panel's rows are read through a
 * row of the flip byte, which stores 0 past n. */
static void pack_b(void *dst, const uint8_t *B, int64_t ldb, bool b_signed, int64_t K, int64_t j0, int n,
                   int32_t *colsum)
{
    const char fb = b_signed ? 0 : (char)0x80;
    const __m256i flip = _mm256_set1_epi8(fb);
    uint8_t row[NR];
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    uint8_t *d = dst;
    for (int64_t k = 0; k < K; k += KG, d += NR * KG) {
        __m256i r[KG];
        for (int t = 0; t < KG; t++) {
            const uint8_t *src = B + (k + t) * ldb + j0;
            if (k + t < K && n < NR) {
                memset(row, fb, NR);
                memcpy(row, src, (size_t)n);
                src = row;
            }
            r[t] = k + t < K ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)src), flip) : _mm256_setzero_si256();
        }
        __m256i lo01 = _mm256_unpacklo_epi8(r[0], r[1]), hi01 = _mm256_unpackhi_epi8(r[0], r[1]);
        __m256i lo23 = _mm256_unpacklo_epi8(r[2], r[3]), hi23 = _mm256_unpackhi_epi8(r[2], r[3]);
        __m256i o0 = _mm256_unpacklo_epi16(lo01, lo23), o1 = _mm256_unpackhi_epi16(lo01, lo23);
        __m256i o2 = _mm256_unpacklo_epi16(hi01, hi23), o3 = _mm256_unpackhi_epi16(hi01, hi23);
        __m256i c0 = _mm256_permute2x128_si256(o0, o1, 0x20), c1 = _mm256_permute2x128_si256(o2, o3, 0x20);
        __m256i c2 = _mm256_permute2x128_si256(o0, o1, 0x31), c3 = _mm256_permute2x128_si256(o2, o3, 0x31);
        __m512i g0 = _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);
        __m512i g1 = _mm512_inserti64x4(_mm512_castsi256_si512(c2), c3, 1);
        _mm512_storeu_si512(d, g0);
        _mm512_storeu_si512(d + 64, g1);
        s0 = _mm512_dpbusd_epi32(s0, ones, g0);
        s1 = _mm512_dpbusd_epi32(s1, ones, g1);
    }
    _mm512_storeu_si512(colsum, s0);
    _mm512_storeu_si512(colsum + 16, s1);
}

const kiln_qgemm_kernel kiln_qgemm_kernel_avx512vnni = {.mr = MR, .nr = NR, .kg = KG, .esize = 1, .kernel = kernel,
    .dot = kiln_qgemm_dot_avx2 /* both have AVX2 */, .pack_b = pack_b};

KILN_TARGET_END
#endif
