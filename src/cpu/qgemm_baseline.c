/* qgemm_baseline.c - the portable int8 GEMM micro-kernel (plain C, 4x16, bytes in groups of 4),
 * for CPUs without AVX2. */
#include <stdint.h>

#include "cpu/qgemm_internal.h"

enum { MR = 4, NR = 16, KG = 4 };

static void kernel(int64_t groups, const void *a_, int64_t as, const void *b_, int32_t *C, int64_t ldc, int mr,
                   int nr, const int32_t *rs, const int32_t *zb, const int32_t *cs, int32_t za)
{
    const uint8_t *a = a_;
    const int8_t *b = b_;
    uint32_t acc[MR][NR] = {{0}};
    for (int64_t g = 0; g < groups; g++, b += NR * KG)
        for (int r = 0; r < MR; r++) {
            const uint8_t *ar = a + r * as + g * KG;
            for (int j = 0; j < NR; j++) {
                int32_t s = 0;
                for (int t = 0; t < KG; t++) s += (int32_t)ar[t] * b[j * KG + t];
                acc[r][j] += (uint32_t)s;
            }
        }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++)
            C[r * ldc + j] = (int32_t)(acc[r][j] - (uint32_t)zb[j] * (uint32_t)rs[r] - (uint32_t)za * (uint32_t)cs[j]);
}

void kiln_qgemm_dot_baseline(const int16_t *b, int64_t K, const uint8_t *a, int64_t lda, bool a_signed, int32_t za,
                             int64_t m, int32_t *C, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        const uint8_t *ar = a + i * lda;
        uint32_t s = 0;
        for (int64_t k = 0; k < K; k++) s += (uint32_t)(((a_signed ? (int32_t)(int8_t)ar[k] : ar[k]) - za) * b[k]);
        C[i * ldc] = (int32_t)s;
    }
}

const kiln_qgemm_kernel kiln_qgemm_kernel_baseline = {
    .mr = MR, .nr = NR, .kg = KG, .esize = 1, .kernel = kernel, .dot = kiln_qgemm_dot_baseline};
