/* gemm_avx512.c - the AVX-512F GEMM micro-kernels (14x32: 28 accumulators of 16 floats; 16x32
 * with two rows accumulated in memory; 8x32 and 4x32 for short panels; masked column edges),
 * compiled for that instruction set here only;
 * gemm.c calls them only where the CPU has AVX-512F. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "cpu/target.h"

KILN_TARGET_BEGIN("avx512f")

#include "cpu/avx512_util.h"
#include "cpu/gemm_internal.h"

enum { MR = 14, NR = 32 };
#ifndef PF
#define PF (32 * NR)
#endif

/* dst[q*ld + 0 : q*ld + 16) (masked by store) = column q of the rows[count] x 16 block at src
 * (rows src + r*lds, k-lanes masked by kmask), for q < kcount; rows past count are zero. */
static inline void transpose_block(float *dst, int64_t ld, __mmask16 store, const float *src, int64_t lds,
                                   int count, int64_t kcount, float alpha)
{
    __m512 r[16];
    __mmask16 kmask = kiln_lanes(kcount);
    __m512 va = _mm512_set1_ps(alpha);
    for (int i = 0; i < 16; i++) {
        r[i] = i < count ? _mm512_maskz_loadu_ps(kmask, src + i * lds) : _mm512_setzero_ps();
        if (alpha != 1.0f) r[i] = _mm512_mul_ps(r[i], va);
    }
    kiln_transpose16(r);
    for (int q = 0; q < kcount; q++) _mm512_mask_storeu_ps(dst + q * ld, store, r[q]);
}

static void pack_a(float *dst, const float *A, int64_t lda, bool trans, int64_t i0, int64_t m, int64_t p0,
                   int64_t kc, float alpha)
{
    const __mmask16 all = (__mmask16)((1u << MR) - 1);
    __m512 va = _mm512_set1_ps(alpha);
    for (int64_t r0 = 0; r0 < m; r0 += MR, dst += kc * MR) {
        int rows = m - r0 < MR ? (int)(m - r0) : MR;
        if (trans) {
            __mmask16 rm = kiln_lanes(rows);
            for (int64_t p = 0; p < kc; p++) {
                __m512 v = _mm512_maskz_loadu_ps(rm, A + (p0 + p) * lda + i0 + r0);
                if (alpha != 1.0f) v = _mm512_mul_ps(v, va);
                _mm512_mask_storeu_ps(dst + p * MR, all, v);
            }
        } else {
            for (int64_t p = 0; p < kc; p += 16)
                transpose_block(dst + p * MR, MR, all, A + (i0 + r0) * lda + p0 + p, lda, rows,
                                kc - p < 16 ? kc - p : 16, alpha);
        }
    }
}

static void pack_b(float *dst, const float *B, int64_t ldb, bool trans, int64_t p0, int64_t kc, int64_t j0,
                   int64_t n)
{
    for (int64_t c0 = 0; c0 < n; c0 += NR, dst += kc * NR) {
        int cols = n - c0 < NR ? (int)(n - c0) : NR;
        if (trans) {
            for (int64_t p = 0; p < kc; p += 16)
                for (int g = 0; g < 2; g++)
                    transpose_block(dst + p * NR + 16 * g, NR, 0xffff, B + (j0 + c0 + 16 * g) * ldb + p0 + p, ldb,
                                    cols - 16 * g, kc - p < 16 ? kc - p : 16, 1.0f);
        } else {
            __mmask16 m0 = kiln_lanes(cols), m1 = kiln_lanes(cols > 16 ? cols - 16 : 0);
            for (int64_t p = 0; p < kc; p++) {
                const float *src = B + (p0 + p) * ldb + j0 + c0;
                _mm512_storeu_ps(dst + p * NR, _mm512_maskz_loadu_ps(m0, src));
                _mm512_storeu_ps(dst + p * NR + 16, _mm512_maskz_loadu_ps(m1, src + 16));
            }
        }
    }
}

/* Micro-kernels over the first 14, 8 or 4 rows of a packed A panel (stride MR either way): a
 * partial panel of mr rows runs the shortest that covers it, so M = 16 or 130 wastes little.
 * (M = 16 as one call of two 8-row passes per 128-deep chunk, B from L1 in the second: 134
 * against 130 GFLOP/s with B in cache, one thread, and no change over BERT-base's weights
 * streamed from memory.) */
#define ROWS14(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define ROWS8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ROWS4(X) X(0) X(1) X(2) X(3)

#define DECL(r) __m512 c##r##_0 = _mm512_setzero_ps(), c##r##_1 = _mm512_setzero_ps();
#define FMA(r)                                                                                        \
    {                                                                                                 \
        __m512 av = _mm512_set1_ps(a[r]);                                                             \
        c##r##_0 = _mm512_fmadd_ps(av, b0, c##r##_0);                                                 \
        c##r##_1 = _mm512_fmadd_ps(av, b1, c##r##_1);                                                 \
    }
#define STORE(r)                                                                                      \
    if (r < mr) {                                                                                     \
        float *cr = C + r * ldc;                                                                      \
        __m512 v0 = c##r##_0, v1 = c##r##_1;                                                          \
        if (beta != 0.0f) {                                                                           \
            v0 = _mm512_fmadd_ps(vbeta, _mm512_maskz_loadu_ps(m0, cr), v0);                           \
            v1 = _mm512_fmadd_ps(vbeta, _mm512_maskz_loadu_ps(m1, cr + 16), v1);                      \
        }                                                                                             \
        if (bias) {                                                                                   \
            v0 = _mm512_add_ps(v0, bias0);                                                            \
            v1 = _mm512_add_ps(v1, bias1);                                                            \
        }                                                                                             \
        if (rbias) {                                                                                  \
            __m512 rb = _mm512_set1_ps(rbias[r]);                                                     \
            v0 = _mm512_add_ps(v0, rb);                                                               \
            v1 = _mm512_add_ps(v1, rb);                                                               \
        }                                                                                             \
        if (res) {                                                                                    \
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, res + r * e->ldr));                      \
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, res + r * e->ldr + 16));                 \
        }                                                                                             \
        if (clamp) { /* max and min return their second operand for a NaN: a NaN stays */            \
            v0 = _mm512_min_ps(vhi, _mm512_max_ps(vlo, v0));                                          \
            v1 = _mm512_min_ps(vhi, _mm512_max_ps(vlo, v1));                                          \
        }                                                                                             \
        _mm512_mask_storeu_ps(cr, m0, v0);                                                            \
        _mm512_mask_storeu_ps(cr + 16, m1, v1);                                                       \
    }
/* The residual rows are read at the end, each from another plane: fetch them while the tile is
 * computed. */
#define PREFETCH_RES                                                                                  \
    if (e && e->res)                                                                                  \
        for (int r = 0; r < mr; r++) {                                                                \
            _mm_prefetch((const char *)(e->res + r * e->ldr), _MM_HINT_T0);                           \
            _mm_prefetch((const char *)(e->res + r * e->ldr + 16), _MM_HINT_T0);                      \
        }
#define PREFETCH_B                                                                                    \
    _mm_prefetch((const char *)(b + PF), _MM_HINT_T0);                                                \
    _mm_prefetch((const char *)(b + PF + 16), _MM_HINT_T0);                                           \
    _mm_prefetch((const char *)(b + 4 * PF), _MM_HINT_T1);                                            \
    _mm_prefetch((const char *)(b + 4 * PF + 16), _MM_HINT_T1);
/* What STORE reads: the column masks and the epilogue's operands. */
#define EPILOGUE_SETUP                                                                                \
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);                        \
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;     \
    const float *bias = e ? e->col_bias : NULL, *rbias = e ? e->row_bias : NULL;                      \
    const float *res = e ? e->res : NULL;                                                             \
    bool clamp = e && e->clamp;                                                                       \
    __m512 vbeta = _mm512_set1_ps(beta), zero = _mm512_setzero_ps();                                  \
    __m512 bias0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : zero;                                     \
    __m512 bias1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : zero;                                \
    __m512 vlo = _mm512_set1_ps(clamp ? e->lo : 0.0f), vhi = _mm512_set1_ps(clamp ? e->hi : 0.0f);
#define DEFINE_KERNEL(name, ROWS)                                                                     \
    static void name(int64_t kc, const float *a, const float *b, float *C, int64_t ldc, int mr, int nr, \
                     float beta, const kiln_gemm_kepi *e)                                             \
    {                                                                                                 \
        ROWS(DECL)                                                                                    \
        PREFETCH_RES                                                                                  \
        for (int64_t p = 0; p < kc; p++, a += MR, b += NR) {                                          \
            PREFETCH_B                                                                                \
            __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);                             \
            ROWS(FMA)                                                                                 \
        }                                                                                             \
        EPILOGUE_SETUP                                                                                \
        ROWS(STORE)                                                                                   \
    }

DEFINE_KERNEL(kernel14, ROWS14)
DEFINE_KERNEL(kernel8, ROWS8)
DEFINE_KERNEL(kernel4, ROWS4)

/* 15 or 16 rows in one pass over the B panel (a second pass for the last 2 rows of M = 16 cost
 * 0.35x of the first: B again from L2 for 4 multiply-adds per step): rows 0-13 from this A panel
 * in registers, rows 14 and 15 (the first two of the next panel, kc * MR floats on) accumulated
 * in memory, where a load and a store per step cost less than a second pass. 28 accumulators,
 * the two B vectors and a broadcast fill the 32 registers. */
static void kernel16(int64_t kc, const float *a, const float *b, float *C, int64_t ldc, int mr, int nr, float beta,
                     const kiln_gemm_kepi *e)
{
    ROWS14(DECL)
    float ext[4][16] __attribute__((aligned(64)));
    volatile __m512 *x = (volatile __m512 *)ext; /* volatile: kept in memory, not in registers */
    x[0] = x[1] = x[2] = x[3] = _mm512_setzero_ps();
    const float *a2 = a + kc * MR;
    PREFETCH_RES
    for (int64_t p = 0; p < kc; p++, a += MR, a2 += MR, b += NR) {
        PREFETCH_B
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        ROWS14(FMA)
        x[0] = _mm512_fmadd_ps(_mm512_set1_ps(a2[0]), b0, x[0]);
        x[1] = _mm512_fmadd_ps(_mm512_set1_ps(a2[0]), b1, x[1]);
        x[2] = _mm512_fmadd_ps(_mm512_set1_ps(a2[1]), b0, x[2]);
        x[3] = _mm512_fmadd_ps(_mm512_set1_ps(a2[1]), b1, x[3]);
    }
    EPILOGUE_SETUP
    ROWS14(STORE)
    __m512 c14_0 = x[0], c14_1 = x[1], c15_0 = x[2], c15_1 = x[3];
    STORE(14)
    STORE(15)
}

static void kernel(int64_t kc, const float *a, const float *b, float *C, int64_t ldc, int mr, int nr,
                   float beta, const kiln_gemm_kepi *e)
{
    if (mr > 14) kernel16(kc, a, b, C, ldc, mr, nr, beta, e);
    else if (mr > 8) kernel14(kc, a, b, C, ldc, mr, nr, beta, e);
    else if (mr > 4) kernel8(kc, a, b, C, ldc, mr, nr, beta, e);
    else kernel4(kc, a, b, C, ldc, mr, nr, beta, e);
}

const kiln_gemm_kernel kiln_gemm_kernel_avx512 = {
    /* depth blocks of 1024: the B micro-panel (128 KB) streams from L2 with the A panel, and C
     * is read back fewer times; 5-12% faster than 256 on transformer and square shapes */
    .mr = MR, .mr_max = 16, .nr = NR, .mc = 196, .kc = 1024, .nc = 1024,
    .pack_a = pack_a, .pack_b = pack_b, .kernel = kernel,
};

KILN_TARGET_END
#endif
