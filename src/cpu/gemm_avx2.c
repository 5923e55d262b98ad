/* gemm_avx2.c - the AVX2+FMA GEMM micro-kernel (6x16: 12 accumulators of 8 floats), compiled for
 * that instruction set here only; gemm.c calls it only where the CPU has AVX2 and FMA. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "cpu/target.h"

KILN_TARGET_BEGIN("avx2,fma")

#include "cpu/avx2_util.h"
#include "cpu/gemm_internal.h"

enum { MR = 6, NR = 16 };

/* An int mask vector selecting the first n (0..8) lanes. */
static inline __m256i lanes(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Column q of the count x 8 block at src (rows src + r*lds, kcount k-lanes) goes to dst + q*ld,
 * the lanes of store; rows past count are zero. */
static inline void transpose_block(float *dst, int64_t ld, __m256i store, const float *src, int64_t lds, int count,
                                   int64_t kcount, float alpha)
{
    __m256 r[8];
    __m256i kmask = lanes(kcount);
    __m256 va = _mm256_set1_ps(alpha);
    for (int i = 0; i < 8; i++) {
        r[i] = i < count ? _mm256_maskload_ps(src + i * lds, kmask) : _mm256_setzero_ps();
        if (alpha != 1.0f) r[i] = _mm256_mul_ps(r[i], va);
    }
    kiln_transpose8(r);
    for (int q = 0; q < kcount; q++) _mm256_maskstore_ps(dst + q * ld, store, r[q]);
}

static void pack_a(float *dst, const float *A, int64_t lda, bool trans, int64_t i0, int64_t m, int64_t p0,
                   int64_t kc, float alpha)
{
    if (trans) {
        kiln_gemm_pack_a_generic(dst, A, lda, trans, i0, m, p0, kc, alpha, MR);
        return;
    }
    const __m256i all = lanes(MR);
    for (int64_t r0 = 0; r0 < m; r0 += MR, dst += kc * MR) {
        int rows = m - r0 < MR ? (int)(m - r0) : MR;
        for (int64_t p = 0; p < kc; p += 8)
            transpose_block(dst + p * MR, MR, all, A + (i0 + r0) * lda + p0 + p, lda, rows, kc - p < 8 ? kc - p : 8,
                            alpha);
    }
}

static void pack_b(float *dst, const float *B, int64_t ldb, bool trans, int64_t p0, int64_t kc, int64_t j0,
                   int64_t n)
{
    const __m256i all = lanes(8);
    for (int64_t c0 = 0; c0 < n; c0 += NR, dst += kc * NR) {
        int cols = n - c0 < NR ? (int)(n - c0) : NR;
        if (trans) {
            for (int64_t p = 0; p < kc; p += 8)
                for (int g = 0; g < 2; g++)
                    transpose_block(dst + p * NR + 8 * g, NR, all, B + (j0 + c0 + 8 * g) * ldb + p0 + p, ldb,
                                    cols - 8 * g, kc - p < 8 ? kc - p : 8, 1.0f);
        } else {
            __m256i m0 = lanes(cols), m1 = lanes(cols > 8 ? cols - 8 : 0);
            for (int64_t p = 0; p < kc; p++) {
                const float *src = B + (p0 + p) * ldb + j0 + c0;
                _mm256_storeu_ps(dst + p * NR, _mm256_maskload_ps(src, m0));
                _mm256_storeu_ps(dst + p * NR + 8, _mm256_maskload_ps(src + 8, m1));
            }
        }
    }
}

#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

static void kernel(int64_t kc, const float *a, const float *b, float *C, int64_t ldc, int mr, int nr,
                   float beta, const kiln_gemm_kepi *e)
{
#define DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
    ROWS(DECL)
#undef DECL
    for (int64_t p = 0; p < kc; p++, a += MR, b += NR) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#define FMA(r)                                                                                        \
    {                                                                                                 \
        __m256 av = _mm256_broadcast_ss(a + r);                                                       \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);                                                   \
        c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);                                                   \
    }
        ROWS(FMA)
#undef FMA
    }
    if (mr == MR && nr == NR) {
        const float *bias = e ? e->col_bias : NULL, *rbias = e ? e->row_bias : NULL, *res = e ? e->res : NULL;
        bool clamp = e && e->clamp;
        __m256 vbeta = _mm256_set1_ps(beta), zero = _mm256_setzero_ps();
        __m256 bias0 = bias ? _mm256_loadu_ps(bias) : zero, bias1 = bias ? _mm256_loadu_ps(bias + 8) : zero;
        __m256 vlo = _mm256_set1_ps(clamp ? e->lo : 0.0f), vhi = _mm256_set1_ps(clamp ? e->hi : 0.0f);
#define STORE(r)                                                                                      \
    {                                                                                                 \
        float *cr = C + r * ldc;                                                                      \
        __m256 v0 = c##r##0, v1 = c##r##1;                                                            \
        if (beta != 0.0f) {                                                                           \
            v0 = _mm256_fmadd_ps(vbeta, _mm256_loadu_ps(cr), v0);                                     \
            v1 = _mm256_fmadd_ps(vbeta, _mm256_loadu_ps(cr + 8), v1);                                 \
        }                                                                                             \
        if (bias) {                                                                                   \
            v0 = _mm256_add_ps(v0, bias0);                                                            \
            v1 = _mm256_add_ps(v1, bias1);                                                            \
        }                                                                                             \
        if (rbias) {                                                                                  \
            __m256 rb = _mm256_broadcast_ss(rbias + r);                                               \
            v0 = _mm256_add_ps(v0, rb);                                                               \
            v1 = _mm256_add_ps(v1, rb);                                                               \
        }                                                                                             \
        if (res) {                                                                                    \
            v0 = _mm256_add_ps(v0, _mm256_loadu_ps(res + r * e->ldr));                                \
            v1 = _mm256_add_ps(v1, _mm256_loadu_ps(res + r * e->ldr + 8));                            \
        }                                                                                             \
        if (clamp) { /* max and min return their second operand for a NaN: a NaN stays */            \
            v0 = _mm256_min_ps(vhi, _mm256_max_ps(vlo, v0));                                          \
            v1 = _mm256_min_ps(vhi, _mm256_max_ps(vlo, v1));                                          \
        }                                                                                             \
        _mm256_storeu_ps(cr, v0);                                                                     \
        _mm256_storeu_ps(cr + 8, v1);                                                                 \
    }
        ROWS(STORE)
#undef STORE
        return;
    }
    float acc[MR * NR] __attribute__((aligned(32)));
#define SPILL(r)                                                                                      \
    _mm256_store_ps(acc + r * NR, c##r##0);                                                           \
    _mm256_store_ps(acc + r * NR + 8, c##r##1);
    ROWS(SPILL)
#undef SPILL
    kiln_gemm_store_tile(acc, NR, mr, nr, C, ldc, beta, e);
}

const kiln_gemm_kernel kiln_gemm_kernel_avx2 = {
    .mr = MR, .mr_max = MR, .nr = NR, .mc = 144, .kc = 256, .nc = 1024,
    .pack_a = pack_a, .pack_b = pack_b, .kernel = kernel,
};

KILN_TARGET_END
#endif
