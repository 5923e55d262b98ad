/* gemm_baseline.c - the portable GEMM micro-kernel (plain C, 4x16), for CPUs without AVX2. */
#include "cpu/gemm_internal.h"

enum { MR = 4, NR = 16 };

static void pack_a(float *dst, const float *A, int64_t lda, bool trans, int64_t i0, int64_t m, int64_t p0,
                   int64_t kc, float alpha)
{
    kiln_gemm_pack_a_generic(dst, A, lda, trans, i0, m, p0, kc, alpha, MR);
}

static void pack_b(float *dst, const float *B, int64_t ldb, bool trans, int64_t p0, int64_t kc, int64_t j0,
                   int64_t n)
{
    kiln_gemm_pack_b_generic(dst, B, ldb, trans, p0, kc, j0, n, NR);
}

static void kernel(int64_t kc, const float *a, const float *b, float *C, int64_t ldc, int mr, int nr,
                   float beta, const kiln_gemm_kepi *e)
{
    float acc[MR][NR] = {{0}};
    for (int64_t p = 0; p < kc; p++, a += MR, b += NR)
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NR; j++) acc[r][j] += a[r] * b[j];
    kiln_gemm_store_tile(&acc[0][0], NR, mr, nr, C, ldc, beta, e);
}

const kiln_gemm_kernel kiln_gemm_kernel_baseline = {
    .mr = MR, .mr_max = MR, .nr = NR, .mc = 128, .kc = 256, .nc = 1024,
    .pack_a = pack_a, .pack_b = pack_b, .kernel = kernel,
};
