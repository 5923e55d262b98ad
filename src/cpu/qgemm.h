/* qgemm.h - 8-bit integer GEMM for the CPU provider: C int32 [M, N] = (A - a_zp) (B - b_zp) with
 * A [M, K] and B [K, N] each uint8 or int8, exact in wrapping int32 arithmetic (as the ONNX
 * integer ops define it), micro-kernels chosen at run time (AVX-512 VNNI, AVX-VNNI, AVX2,
 * portable C), threads from a pool.
 *
 * The kernels multiply unsigned by signed bytes (vpdpbusd's operands): a signed A is shifted to
 * unsigned (a + 128), an unsigned B to signed (b - 128), and the shifts are folded into the zero
 * points, whose effect is corrected with A's row sums and B's column sums:
 *   sum_k (a - za)(b - zb) = sum_k a'b' - zb' sum_k a' - za' (sum_k b' - K zb'). */
#ifndef KILN_CPU_QGEMM_H
#define KILN_CPU_QGEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "kiln.h"

/* Instruction-set level of the micro-kernels. */
typedef enum kiln_qgemm_level {
    KILN_QGEMM_LEVEL_AUTO = 0,    /* the best level this CPU supports */
    KILN_QGEMM_LEVEL_BASELINE,    /* portable C */
    KILN_QGEMM_LEVEL_AVX2,        /* AVX2: bytes widened to int16, vpmaddwd (exact, no vpmaddubsw) */
    KILN_QGEMM_LEVEL_AVXVNNI,     /* AVX-VNNI: 256-bit vpdpbusd */
    KILN_QGEMM_LEVEL_AVX512VNNI,  /* AVX-512 VNNI: 512-bit vpdpbusd */
    KILN_QGEMM_LEVEL_COUNT
} kiln_qgemm_level;

/* How a call runs. Plain data, owned by the caller, shareable between threads. */
typedef struct kiln_qgemm_ctx {
    kiln_threadpool *pool;        /* borrowed; NULL runs on the calling thread */
    struct kiln_scratch *scratch; /* borrowed: packing buffers (core/scratch.h); NULL: the C library */
    kiln_qgemm_level level;       /* AUTO, or a level to force (tests, benchmarks) */
} kiln_qgemm_ctx;

/* A caller's epilogue over one finished block of C: rows [i0, i0+m), columns [j0, j0+n) at
 * c = &C[i0][j0] (row stride ldc), called once per block from any of the pool's threads while
 * the block is in cache; blocks never overlap. */
typedef void (*kiln_qgemm_tile_fn)(void *ctx, int32_t *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n);

/* The best level this CPU (and OS) supports. */
kiln_qgemm_level kiln_qgemm_level_detect(void);
/* Whether this CPU can run the level (AUTO and BASELINE: always). */
bool kiln_qgemm_level_supported(kiln_qgemm_level level);
/* "auto", "baseline", "avx2", "avxvnni", "avx512vnni". Static string. */
const char *kiln_qgemm_level_name(kiln_qgemm_level level);

/* B [K, N] packed once for one level's kernels, with its column sums: constant weights skip the
 * packing of every call. Immutable once made (and its zero points bound, if they are), shareable
 * across threads. */
typedef struct kiln_qgemm_packed_b kiln_qgemm_packed_b;

/* Packs B [K, N] (row stride ldb bytes; int8 when b_signed, else uint8) at ctx's level (AUTO:
 * the best). The caller owns *out; B may be freed afterwards. O(K * N) time and bytes.
 * Errors: KILN_ERR_INVALID_ARG (negative sizes, ldb < N, NULL B with non-empty sizes, a level
 * the CPU lacks), KILN_ERR_NOMEM. */
kiln_status kiln_qgemm_packed_b_create(const kiln_qgemm_ctx *ctx, int64_t K, int64_t N, const void *B, int64_t ldb,
                                       bool b_signed, kiln_qgemm_packed_b **out);
/* NULL is a no-op. */
void kiln_qgemm_packed_b_free(kiln_qgemm_packed_b *pb);
/* Binds zero points to pb (b_zp: n_bzp of them, 1 or N; NULL with 0: zero), before pb is
 * shared: calls with b_zp_bound take them and the per-column terms derived from them here, once
 * (a recurrent GEMV of constant weights skips an O(N) pass a step). Errors:
 * KILN_ERR_INVALID_ARG (a count neither 1 nor N), KILN_ERR_NOMEM. */
kiln_status kiln_qgemm_packed_b_bind_zp(kiln_qgemm_packed_b *pb, const int32_t *b_zp, int64_t n_bzp);
/* The inverse of the packing: writes B [K, N] densely, bytewise as it was given. O(K * N). */
void kiln_qgemm_packed_b_unpack(const kiln_qgemm_packed_b *pb, void *B);
/* K, N and signedness it was packed with. */
void kiln_qgemm_packed_b_shape(const kiln_qgemm_packed_b *pb, int64_t *K, int64_t *N, bool *b_signed);

/* One call's operands. B is either pb (prepacked; then K, N come from it and B, ldb, b_signed
 * are ignored) or B [K, N] with row stride ldb bytes. b_zp holds n_bzp zero points: 1 (per
 * tensor) or N (per column), or is NULL (zero). A is [M, K] with row stride lda bytes. */
typedef struct kiln_qgemm_args {
    int64_t M, N, K;
    const void *A;
    int64_t lda;
    bool a_signed;
    int32_t a_zp;
    const void *B;
    int64_t ldb;
    bool b_signed;
    const kiln_qgemm_packed_b *pb;
    const int32_t *b_zp;
    int64_t n_bzp;
    bool b_zp_bound; /* the zero points bound to pb (kiln_qgemm_packed_b_bind_zp): b_zp and n_bzp ignored */
    int32_t *C; /* [M, ldc] */
    int64_t ldc;
    kiln_qgemm_tile_fn tile; /* optional epilogue */
    void *tile_ctx;
} kiln_qgemm_args;

/* C = (A - a_zp)(B - b_zp), then the tile epilogue. ctx's level must be AUTO or pb's. Allocates
 * O(M * K + N) bytes of packing from ctx's scratch (plus O(K * N) when B is not prepacked).
 * Errors: KILN_ERR_INVALID_ARG (negative sizes, short strides, NULL pointers with non-empty
 * sizes, n_bzp neither 1 nor N, a level the CPU lacks or not pb's), KILN_ERR_NOMEM; on error C
 * is unchanged. */
kiln_status kiln_qgemm(const kiln_qgemm_ctx *ctx, const kiln_qgemm_args *args);

/* The plain reference the kernels are tested against: one int32 multiply-add at a time. */
void kiln_qgemm_reference(const kiln_qgemm_args *args);

#endif
