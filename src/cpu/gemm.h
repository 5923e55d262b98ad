/* gemm.h - single-precision GEMM for the CPU provider: packed panels, register-blocked
 * micro-kernels chosen at run time (AVX-512, AVX2+FMA, portable C), threads from a pool. */
#ifndef KILN_CPU_GEMM_H
#define KILN_CPU_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "kiln.h"

/* Instruction-set level of the micro-kernels. */
typedef enum kiln_gemm_level {
    KILN_GEMM_LEVEL_AUTO = 0,  /* the best level this CPU supports */
    KILN_GEMM_LEVEL_BASELINE,  /* portable C (whatever the compiler's baseline is) */
    KILN_GEMM_LEVEL_AVX2,      /* AVX2 + FMA, 6x16 micro-kernel */
    KILN_GEMM_LEVEL_AVX512,    /* AVX-512F, 14x32 micro-kernel (8x32, 4x32 for short panels) */
} kiln_gemm_level;

/* Activation applied after the biases, element-wise, as the last step. */
typedef enum kiln_gemm_act {
    KILN_GEMM_ACT_NONE = 0,
    KILN_GEMM_ACT_RELU, /* max(x, 0) */
    KILN_GEMM_ACT_CLIP, /* min(max(x, lo), hi) */
} kiln_gemm_act;

/* How a GEMM runs: which threads and which kernels. Plain data, owned by the caller; one
 * context may be used by any number of threads at once. */
typedef struct kiln_gemm_ctx {
    kiln_threadpool *pool; /* borrowed; NULL runs on the calling thread only */
    struct kiln_scratch *scratch; /* borrowed: where packing buffers come from and go back to
                                   * (core/scratch.h); NULL: the C library */
    kiln_gemm_level level; /* AUTO, or a level to force (tests, benchmarks) */
    bool pack_b_panels;    /* an implicit op(B) (kiln_gemm_pack_fn) packed one micro-panel [kc, NR] at a
                            * time, just before the micro-kernels read it, while it is in L2; else a
                            * tile's columns at once (up to [kc, NC]: 4 MB on AVX-512, read back from L3) */
} kiln_gemm_ctx;

/* A caller's epilogue over one finished block of C: rows [i0, i0+m), columns [j0, j0+n), at
 * c = &C[i0][j0] with row stride ldc. Called once per block, after bias and act, from any of the
 * pool's threads (blocks never overlap), while the block is still in cache. */
typedef void (*kiln_gemm_tile_fn)(void *ctx, float *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n);

/* Fused epilogue, applied by the micro-kernels to each element after alpha*A*B + beta*C:
 *   C[i][j] = act(C[i][j] + bias[j] + row_bias[i] + residual[i][j]) (a NaN stays NaN), then
 * tile over each block. */
typedef struct kiln_gemm_epilogue {
    const float *bias;     /* [N], one value per column; NULL for none */
    const float *row_bias; /* [M], one value per row (a convolution's, its rows being channels); NULL */
    const float *residual; /* [M][ldr], added element by element (a fused shortcut); NULL */
    int64_t ldr;
    kiln_gemm_act act;
    float lo, hi;          /* KILN_GEMM_ACT_CLIP's bounds */
    kiln_gemm_tile_fn tile; /* NULL for none */
    void *tile_ctx;
} kiln_gemm_epilogue;

/* The best level this CPU (and OS) supports. */
kiln_gemm_level kiln_gemm_level_detect(void);
/* Whether this CPU can run the level (AUTO and BASELINE: always). */
bool kiln_gemm_level_supported(kiln_gemm_level level);
/* "baseline", "avx2", "avx512" ("auto" for AUTO). Static string. */
const char *kiln_gemm_level_name(kiln_gemm_level level);

/* Row-major C = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T, then the epilogue (ep may
 * be NULL). op(A) is [M, K], op(B) is [K, N], C is [M, N]; lda, ldb, ldc are row strides in
 * elements (A is [M, lda] untransposed, [K, lda] transposed; likewise B). As in BLAS, beta == 0
 * means C is only written, never read (NaNs in C do not propagate). Allocates packing buffers
 * per call (O(threads * (MC*KC + KC*NC)) floats). Errors: KILN_ERR_INVALID_ARG (negative sizes,
 * strides too small, NULL pointers with non-empty sizes, a level the CPU lacks),
 * KILN_ERR_NOMEM. On error C is unchanged. */
kiln_status kiln_sgemm_ex(const kiln_gemm_ctx *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N,
                          int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                          int64_t ldb, float beta, float *C, int64_t ldc, const kiln_gemm_epilogue *ep);

/* op(B) [K, N] packed once for the kernels of one level: constant weights skip the packing that
 * every kiln_sgemm_ex call does. Immutable after creation, so any number of threads may use one. */
typedef struct kiln_gemm_packed_b kiln_gemm_packed_b;

/* Packs op(B) (B is [K, ldb], or [N, ldb] when trans_b) at ctx's level (AUTO: the best). The
 * caller owns *out (kiln_gemm_packed_b_free); B may be freed afterwards. O(K * N) time and
 * floats. Errors: KILN_ERR_INVALID_ARG (negative sizes, ldb too small, NULL B with non-empty
 * sizes, a level the CPU lacks), KILN_ERR_NOMEM. */
kiln_status kiln_gemm_packed_b_create(const kiln_gemm_ctx *ctx, bool trans_b, int64_t K, int64_t N,
                                      const float *B, int64_t ldb, kiln_gemm_packed_b **out);
/* NULL is a no-op. */
void kiln_gemm_packed_b_free(kiln_gemm_packed_b *pb);
/* The inverse of the packing: writes the B it was packed from, densely (B [K, N], or [N, K]
 * when packed with trans_b), bitwise. Lets a caller free the original weights and rebuild them
 * for the rare call that needs that layout. O(K * N). */
void kiln_gemm_packed_b_unpack(const kiln_gemm_packed_b *pb, float *B);
/* Bytes of packed data (0 for NULL). */
size_t kiln_gemm_packed_b_bytes(const kiln_gemm_packed_b *pb);

/* kiln_sgemm_ex with op(B) prepacked: C [M, N] = alpha * op(A) [M, K] * B + beta * C, then ep;
 * N and K are B's. Results are bitwise those of kiln_sgemm_ex at the same level. ctx's level
 * must be AUTO or B's level (KILN_ERR_INVALID_ARG otherwise); its pool is used. */
kiln_status kiln_sgemm_packed(const kiln_gemm_ctx *ctx, bool trans_a, int64_t M, float alpha, const float *A,
                              int64_t lda, const kiln_gemm_packed_b *B, float beta, float *C, int64_t ldc,
                              const kiln_gemm_epilogue *ep);

/* Packs an operand that is never stored (an implicit im2col matrix) for the micro-kernels:
 * columns [j0, j0+n) of its rows [p0, p0+kc) as ceil(n/w) micro-panels, each [kc][w] (k-major,
 * columns past n zero), into dst. For op(B) [K, N] the columns are B's (w = NR); for op(A)
 * [M, K] they are A's rows, i.e. the columns of op(A)^T (w = MR). Called from any of the
 * pool's threads. */
typedef void (*kiln_gemm_pack_fn)(void *ctx, float *dst, int64_t p0, int64_t kc, int64_t j0, int64_t n, int w);

/* kiln_sgemm_ex with op(A) = A [M, K] (row stride lda), beta 0, and op(B) [K, N] never stored:
 * pack_b produces each block of it when a tile needs it (an implicit im2col matrix). */
kiln_status kiln_sgemm_implicit_b(const kiln_gemm_ctx *ctx, int64_t M, int64_t N, int64_t K, const float *A,
                                  int64_t lda, kiln_gemm_pack_fn pack_b, void *pack_ctx, float *C, int64_t ldc,
                                  const kiln_gemm_epilogue *ep);

/* A [M, K] (row stride lda) packed once for the kernels of one level (ctx's; AUTO: the best):
 * constant weights on the left (convolutions) skip the packing of every call. The caller owns
 * *out (kiln_gemm_packed_a_free); A may be freed afterwards. Immutable, shareable across
 * threads. O(M * K) time and floats. Errors: KILN_ERR_INVALID_ARG, KILN_ERR_NOMEM. */
typedef struct kiln_gemm_packed_a kiln_gemm_packed_a;
kiln_status kiln_gemm_packed_a_create(const kiln_gemm_ctx *ctx, int64_t M, int64_t K, const float *A, int64_t lda,
                                      kiln_gemm_packed_a **out);
/* NULL is a no-op. */
void kiln_gemm_packed_a_free(kiln_gemm_packed_a *pa);
/* The inverse of the packing: writes the A it was packed from, densely (A [M, K]), bitwise.
 * O(M * K). */
void kiln_gemm_packed_a_unpack(const kiln_gemm_packed_a *pa, float *A);

/* C [M, N] = A [M, K] * B [K, N], beta 0, then ep; M and K are A's. B is either stored (row
 * stride ldb) or, when pack_b is given, implicit as in kiln_sgemm_implicit_b (B unused). ctx's
 * level must be AUTO or A's. Errors as kiln_sgemm_ex; on error C is unchanged. */
kiln_status kiln_sgemm_packed_a(const kiln_gemm_ctx *ctx, const kiln_gemm_packed_a *A, int64_t N, const float *B,
                                int64_t ldb, kiln_gemm_pack_fn pack_b, void *pack_ctx, float *C, int64_t ldc,
                                const kiln_gemm_epilogue *ep);

/* A [M, K] made by pack (columns [i0, i0+m) of A^T, w = MR: rows of an implicit im2col^T, the
 * output pixels of a convolution) and packed for ctx's level, the pack calls spread over ctx's
 * pool: the operand is gathered once, not once per tile. Its memory comes from ctx's scratch
 * (and goes back there when freed). Otherwise as kiln_gemm_packed_a_create. */
kiln_status kiln_gemm_packed_a_create_from(const kiln_gemm_ctx *ctx, int64_t M, int64_t K, kiln_gemm_pack_fn pack,
                                           void *pack_ctx, kiln_gemm_packed_a **out);

/* C [M, N] = A [M, K] * B [K, N], both prepacked at one level (A's K must be B's), beta 0, then
 * ep. ctx's level must be AUTO or theirs. Errors as kiln_sgemm_ex; on error C is unchanged. */
kiln_status kiln_sgemm_packed_ab(const kiln_gemm_ctx *ctx, const kiln_gemm_packed_a *A, const kiln_gemm_packed_b *B,
                                 float *C, int64_t ldc, const kiln_gemm_epilogue *ep);

/* kiln_sgemm_ex on the given pool, at the best level, with no epilogue. */
kiln_status kiln_sgemm(kiln_threadpool *pool, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc);

#endif
