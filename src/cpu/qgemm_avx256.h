/* qgemm_avx256.h - what the two 256-bit int8 GEMM micro-kernels (qgemm_avx2.c, qgemm_avxvnni.c)
 * share: the 4-byte broadcast of A and the zero-point correction and store of a 6x16 int32
 * tile. Included by those files only, after their target pragmas, so these compile for the
 * instruction set of each. */
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
