/* gemm_internal.h - what the GEMM driver (gemm.c) needs from each instruction-set file: packing
 * routines and a micro-kernel behind one table per level. */
#ifndef KILN_CPU_GEMM_INTERNAL_H
#define KILN_CPU_GEMM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a micro-kernel adds to its tile at the last depth block, after acc + beta*C:
 * C[r][j] = clamp(v + col_bias[j] + row_bias[r] + res[r][j], lo, hi), the clamp as max then
 * min (a NaN stays NaN). */
typedef struct kiln_gemm_kepi {
    const float *col_bias; /* [nr] of this tile, or NULL */
    const float *row_bias; /* [mr] of this tile, or NULL */
    const float *res;      /* [mr][ldr] of this tile, or NULL */
    int64_t ldr;
    float lo, hi;
    bool clamp;
} kiln_gemm_kepi;

/* One level's kernels and its cache blocking.
 *
 * Packed A: ceil(m/MR) micro-panels, each [kc][MR] (k-major, rows past m zero), scaled by alpha.
 * Packed B: ceil(n/NR) micro-panels, each [kc][NR] (columns past n zero). */
typedef struct kiln_gemm_kernel {
    int mr, nr;     /* micro-tile: rows of A, columns of B */
    int mr_max;     /* rows the kernel takes in one call (>= mr): rows past mr are the first of the
                     * next A panel, kc * mr floats on */
    int mc, kc, nc; /* cache blocks: rows of packed A (L2), depth, columns of packed B */
    /* Packs op(A)[i0 : i0+m, p0 : p0+kc] (op(A)[i][p] = trans ? A[p*lda + i] : A[i*lda + p]). */
    void (*pack_a)(float *dst, const float *A, int64_t lda, bool trans, int64_t i0, int64_t m,
                   int64_t p0, int64_t kc, float alpha);
    /* Packs op(B)[p0 : p0+kc, j0 : j0+n] (op(B)[p][j] = trans ? B[j*ldb + p] : B[p*ldb + j]). */
    void (*pack_b)(float *dst, const float *B, int64_t ldb, bool trans, int64_t p0, int64_t kc,
                   int64_t j0, int64_t n);
    /* C[0:mr, 0:nr] = acc + beta*C then the epilogue e (NULL: none), with acc = a-panel x
     * b-panel over kc; beta == 0 never reads C. mr <= mr_max, nr <= NR. */
    void (*kernel)(int64_t kc, const float *a, const float *b, float *C, int64_t ldc, int mr, int nr,
                   float beta, const kiln_gemm_kepi *e);
} kiln_gemm_kernel;

extern const kiln_gemm_kernel kiln_gemm_kernel_baseline;
#if defined(__x86_64__)
extern const kiln_gemm_kernel kiln_gemm_kernel_avx2;
extern const kiln_gemm_kernel kiln_gemm_kernel_avx512;
#endif

/* Shared packing and edge code, inlined into each level's file so it is compiled for that level's
 * instruction set with constant MR/NR. */
static inline void kiln_gemm_pack_a_generic(float *dst, const float *A, int64_t lda, bool trans, int64_t i0,
                                            int64_t m, int64_t p0, int64_t kc, float alpha, const int MR)
{
    for (int64_t r0 = 0; r0 < m; r0 += MR, dst += kc * MR) {
        int rows = m - r0 < MR ? (int)(m - r0) : MR;
        if (trans) {
            for (int64_t p = 0; p < kc; p++) {
                const float *src = A + (p0 + p) * lda + i0 + r0;
                float *d = dst + p * MR;
                int r = 0;
                if (alpha == 1.0f)
                    for (; r < rows; r++) d[r] = src[r];
                else
                    for (; r < rows; r++) d[r] = alpha * src[r];
                for (; r < MR; r++) d[r] = 0.0f;
            }
        } else {
            for (int r = 0; r < rows; r++) {
                const float *src = A + (i0 + r0 + r) * lda + p0;
                if (alpha == 1.0f)
                    for (int64_t p = 0; p < kc; p++) dst[p * MR + r] = src[p];
                else
                    for (int64_t p = 0; p < kc; p++) dst[p * MR + r] = alpha * src[p];
            }
            for (int r = rows; r < MR; r++)
                for (int64_t p = 0; p < kc; p++) dst[p * MR + r] = 0.0f;
        }
    }
}

static inline void kiln_gemm_pack_b_generic(float *dst, const float *B, int64_t ldb, bool trans, int64_t p0,
                                            int64_t kc, int64_t j0, int64_t n, const int NR)
{
    for (int64_t c0 = 0; c0 < n; c0 += NR, dst += kc * NR) {
        int cols = n - c0 < NR ? (int)(n - c0) : NR;
        if (trans) {
            for (int c = 0; c < cols; c++) {
                const float *src = B + (j0 + c0 + c) * ldb + p0;
                for (int64_t p = 0; p < kc; p++) dst[p * NR + c] = src[p];
            }
            for (int c = cols; c < NR; c++)
                for (int64_t p = 0; p < kc; p++) dst[p * NR + c] = 0.0f;
        } else if (cols == NR) {
            for (int64_t p = 0; p < kc; p++) {
                const float *src = B + (p0 + p) * ldb + j0 + c0;
                float *d = dst + p * NR;
                for (int c = 0; c < NR; c++) d[c] = src[c];
            }
        } else {
            for (int64_t p = 0; p < kc; p++) {
                const float *src = B + (p0 + p) * ldb + j0 + c0;
                float *d = dst + p * NR;
                int c = 0;
                for (; c < cols; c++) d[c] = src[c];
                for (; c < NR; c++) d[c] = 0.0f;
            }
        }
    }
}

/* Writes an accumulator tile acc[mr][ld] to C with the epilogue (the partial-tile path). */
static inline void kiln_gemm_store_tile(const float *acc, int ld, int mr, int nr, float *C, int64_t ldc,
                                        float beta, const kiln_gemm_kepi *e)
{
    const float *bias = e ? e->col_bias : NULL, *rbias = e ? e->row_bias : NULL;
    for (int r = 0; r < mr; r++) {
        float *c = C + r * ldc;
        const float *a = acc + r * ld;
        for (int j = 0; j < nr; j++) {
            float v = a[j];
            if (beta != 0.0f) v += beta * c[j];
            if (bias) v += bias[j];
            if (rbias) v += rbias[r];
            if (e && e->res) v += e->res[r * e->ldr + j];
            if (e && e->clamp) { /* NaN stays NaN */
                v = v < e->lo ? e->lo : v;
                v = v > e->hi ? e->hi : v;
            }
            c[j] = v;
        }
    }
}

#endif
