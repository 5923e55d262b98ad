/* qgemm_avx256.h - what the two 256-bit int8 GEMM micro-kernels (qgemm_avx2.c, qgemm_avxvnni.c)
 * share: the 4-byte broadcast of A, the 6x16 tile's sums and the zero-point correction and store
 * of the tile. Both pack a depth group as 4 bytes of A and 64 bytes of B (16 columns of 4 bytes:
 * 4 depths of bytes or 2 of int16). Included by those files only, after their target pragmas and
 * a definition of QGEMM_MAC(c, a, b) (c += the group's products of the broadcast a and b, per
 * 32-bit lane), so these compile for the instruction set of each. */
#ifndef KILN_CPU_QGEMM_AVX256_H
#define KILN_CPU_QGEMM_AVX256_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* Bytes p[0..4) in every 32-bit lane. */
static inline __m256i qgemm_bcast4(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* acc[r] = the sums of row r < R (R <= 6, a constant once inlined) over `groups` depth groups:
 * rows past mr are not computed, so a GEMV does one row's work. One or two rows split the
 * groups between two accumulator sets, so that more than two chains are in flight. */
static inline __attribute__((always_inline)) void qgemm_sums_6x16(const int R, int64_t groups, const uint8_t *a,
                                                                  int64_t as, const uint8_t *b, __m256i acc[6][2])
{
    const int split = R <= 2 ? 2 : 1;
    __m256i c[2][6][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) c[0][r][0] = c[0][r][1] = c[1][r][0] = c[1][r][1] = _mm256_setzero_si256();
    int64_t g = 0;
    for (; g + split <= groups; g += split)
#pragma GCC unroll 2
        for (int s = 0; s < split; s++) {
            const uint8_t *bg = b + (g + s) * 64;
            __m256i b0 = _mm256_loadu_si256((const __m256i *)bg), b1 = _mm256_loadu_si256((const __m256i *)(bg + 32));
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                __m256i v = qgemm_bcast4(a + r * as + (g + s) * 4);
                QGEMM_MAC(c[s][r][0], v, b0);
                QGEMM_MAC(c[s][r][1], v, b1);
            }
        }
    for (; g < groups; g++) {
        const uint8_t *bg = b + g * 64;
        __m256i b0 = _mm256_loadu_si256((const __m256i *)bg), b1 = _mm256_loadu_si256((const __m256i *)(bg + 32));
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256i v = qgemm_bcast4(a + r * as + g * 4);
            QGEMM_MAC(c[0][r][0], v, b0);
            QGEMM_MAC(c[0][r][1], v, b1);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        acc[r][0] = split == 2 ? _mm256_add_epi32(c[0][r][0], c[1][r][0]) : c[0][r][0];
        acc[r][1] = split == 2 ? _mm256_add_epi32(c[0][r][1], c[1][r][1]) : c[0][r][1];
    }
}

/* The sums of the tile's mr rows (qgemm_sums_6x16 with R a constant) */
static inline __attribute__((always_inline)) void qgemm_rows_6x16(int mr, int64_t groups, const uint8_t *a,
                                                                  int64_t as, const uint8_t *b, __m256i acc[6][2])
{
    switch (mr) {
    case 1: qgemm_sums_6x16(1, groups, a, as, b, acc); break;
    case 2: qgemm_sums_6x16(2, groups, a, as, b, acc); break;
    case 3: qgemm_sums_6x16(3, groups, a, as, b, acc); break;
    case 4: qgemm_sums_6x16(4, groups, a, as, b, acc); break;
    case 5: qgemm_sums_6x16(5, groups, a, as, b, acc); break;
    default: qgemm_sums_6x16(6, groups, a, as, b, acc); break;
    }
}

/* C[r][0..nr) = acc[r] - zb * rs[r] - za * cs for r < mr: the tile's sums corrected for the
 * zero points (zb, cs: 16 columns; rs: mr rows), stored with row stride ldc. */
static inline void qgemm_store_6x16(__m256i acc[6][2], int mr, int nr, const int32_t *rs, const int32_t *zb,
                                    const int32_t *cs, int32_t za, int32_t *C, int64_t ldc)
{
    __m256i zb0 = _mm256_loadu_si256((const __m256i *)zb), zb1 = _mm256_loadu_si256((const __m256i *)(zb + 8));
    __m256i vza = _mm256_set1_epi32(za);
    __m256i t0 = _mm256_mullo_epi32(vza, _mm256_loadu_si256((const __m256i *)cs));
    __m256i t1 = _mm256_mullo_epi32(vza, _mm256_loadu_si256((const __m256i *)(cs + 8)));
    for (int r = 0; r < mr; r++) {
        __m256i vr = _mm256_set1_epi32(rs[r]);
        __m256i y0 = _mm256_sub_epi32(_mm256_sub_epi32(acc[r][0], _mm256_mullo_epi32(zb0, vr)), t0);
        __m256i y1 = _mm256_sub_epi32(_mm256_sub_epi32(acc[r][1], _mm256_mullo_epi32(zb1, vr)), t1);
        if (nr == 16) {
            _mm256_storeu_si256((__m256i *)(C + r * ldc), y0);
            _mm256_storeu_si256((__m256i *)(C + r * ldc + 8), y1);
        } else {
            int32_t tmp[16];
            _mm256_storeu_si256((__m256i *)tmp, y0);
            _mm256_storeu_si256((__m256i *)(tmp + 8), y1);
            memcpy(C + r * ldc, tmp, (size_t)nr * sizeof *tmp);
        }
    }
}

#endif
