/* qgemm_internal.h - what the int8 GEMM driver (qgemm.c) needs from each instruction-set file:
 * one micro-kernel and its tile geometry per level.
 *
 * Packed B: ceil(N/NR) panels, each [Kp/KG][NR][KG] elements (KG consecutive depths of one
 * column together; columns past N and depths past K zero), signed (B - 128 when B is uint8).
 * Packed A: rows of Kp elements (depths past K zero; rows past M zero up to a multiple of MR),
 * unsigned (A + 128 when A is int8). Elements are bytes (ESIZE 1) or int16 (ESIZE 2). */
#ifndef KILN_CPU_QGEMM_INTERNAL_H
#define KILN_CPU_QGEMM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kiln_qgemm_kernel {
    int mr, nr;  /* micro-tile: rows of A, columns of B */
    int kg;      /* depths per group (4: vpdpbusd's bytes, 2: vpmaddwd's int16 pairs) */
    int esize;   /* bytes per packed element */
    /* C[r][j] = acc[r][j] - zb[j] * rs[r] - za * cs[j] (wrapping int32) for r < mr, j < nr, with
     * acc the product of the MR packed rows at a (a_stride bytes apart) and the panel b over
     * `groups` depth groups. rs has MR entries, zb and cs NR. */
    void (*kernel)(int64_t groups, const void *a, int64_t a_stride, const void *b, int32_t *C, int64_t ldc,
                   int mr, int nr, const int32_t *rs, const int32_t *zb, const int32_t *cs, int32_t za);
    /* The narrow-B path (a few columns, where a tile would compute mostly padding): C[i * ldc] =
     * sum_k (a[i][k] - za) * b[k] (wrapping int32) for i < m, with A's rows lda bytes apart
     * (signed or unsigned bytes), za in [-128, 255] and b one column minus its zero point. */
    void (*dot)(const int16_t *b, int64_t K, const uint8_t *a, int64_t lda, bool a_signed, int32_t za, int64_t m,
                int32_t *C, int64_t ldc);
    /* Optional: packs the panel of columns [j0, j0 + n) of B (n <= NR, all K depths, rows ldb
     * bytes apart) at dst and the sums of its stored values into colsum[0..NR), as qgemm.c's
     * element loop (taken when this is NULL) does. */
    void (*pack_b)(void *dst, const uint8_t *B, int64_t ldb, bool b_signed, int64_t K, int64_t j0, int n,
                   int32_t *colsum);
} kiln_qgemm_kernel;

void kiln_qgemm_dot_baseline(const int16_t *b, int64_t K, const uint8_t *a, int64_t lda, bool a_signed, int32_t za,
                             int64_t m, int32_t *C, int64_t ldc);
#if defined(__x86_64__)
void kiln_qgemm_dot_avx2(const int16_t *b, int64_t K, const uint8_t *a, int64_t lda, bool a_signed, int32_t za,
                         int64_t m, int32_t *C, int64_t ldc);
#endif

extern const kiln_qgemm_kernel kiln_qgemm_kernel_baseline;
#if defined(__x86_64__)
extern const kiln_qgemm_kernel kiln_qgemm_kernel_avx2;
extern const kiln_qgemm_kernel kiln_qgemm_kernel_avxvnni;
extern const kiln_qgemm_kernel kiln_qgemm_kernel_avx512vnni;
#endif

#endif
