/* qgemm_avx2.c - the AVX2 int8 GEMM micro-kernel (6x16: 12 accumulators of 8 int32) on bytes
 * widened to int16 at packing time and vpmaddwd over depth pairs: exact, unlike vpmaddubsw, whose
 * int16 sums of two u8 x s8 products saturate. Compiled for AVX2 here only; qgemm.c calls it
 * only where the CPU has AVX2. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu/target.h"

KILN_TARGET_BEGIN("avx2")

#define QGEMM_MAC(c, a, b) ((c) = _mm256_add_epi32((c), _mm256_madd_epi16((a), (b))))
#include "cpu/qgemm_avx256.h"
#include "cpu/qgemm_internal.h"

enum { MR = 6, NR = 16, KG = 2 };

static void kernel(int64_t groups, const void *a, int64_t as, const void *b, int32_t *C, int64_t ldc, int mr, int nr,
                   const int32_t *rs, const int32_t *zb, const int32_t *cs, int32_t za)
{
    _Static_assert(MR == 6 && NR == 16 && NR * KG * 2 == 64, "qgemm_avx256.h works on 6x16 tiles of 64-byte groups");
    __m256i acc[MR][2];
    qgemm_rows_6x16(mr, groups, a, as, b, acc);
    qgemm_store_6x16(acc, mr, nr, rs, zb, cs, za, C, ldc);
}

/* 16 depths at a time, both operands as int16 (exact: |a - za| and |b| below 2^9) through vpmaddwd */
void kiln_qgemm_dot_avx2(const int16_t *b, int64_t K, const uint8_t *a, int64_t lda, bool a_signed, int32_t za,
                         int64_t m, int32_t *C, int64_t ldc)
{
    const __m256i vza = _mm256_set1_epi16((int16_t)za);
    for (int64_t i = 0; i < m; i++) {
        const uint8_t *ar = a + i * lda;
        __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
        int64_t k = 0;
        for (; k + 32 <= K; k += 32) {
            __m128i x0 = _mm_loadu_si128((const __m128i *)(ar + k)), x1 = _mm_loadu_si128((const __m128i *)(ar + k + 16));
            __m256i a0 = a_signed ? _mm256_cvtepi8_epi16(x0) : _mm256_cvtepu8_epi16(x0);
            __m256i a1 = a_signed ? _mm256_cvtepi8_epi16(x1) : _mm256_cvtepu8_epi16(x1);
            acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_sub_epi16(a0, vza),
                                                            _mm256_loadu_si256((const __m256i *)(b + k))));
            acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_sub_epi16(a1, vza),
                                                            _mm256_loadu_si256((const __m256i *)(b + k + 16))));
        }
        int32_t lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi32(acc0, acc1));
        uint32_t s = 0;
        for (int q = 0; q < 8; q++) s += (uint32_t)lanes[q];
        for (; k < K; k++) s += (uint32_t)(((a_signed ? (int32_t)(int8_t)ar[k] : ar[k]) - za) * b[k]);
        C[i * ldc] = (int32_t)s;
    }
}

const kiln_qgemm_kernel kiln_qgemm_kernel_avx2 = {
    .mr = MR, .nr = NR, .kg = KG, .esize = 2, .kernel = kernel, .dot = kiln_qgemm_dot_avx2};

KILN_TARGET_END
#endif
