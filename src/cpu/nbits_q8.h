/* nbits_q8.h - MatMulNBits' 4-bit weights against A quantized to int8 per block (accuracy_level
 * 4, ONNX Runtime's CompInt8): exact integer dot products per block, then per block the float
 * scales of A and of the weights. The weights are read in MatMulNBits' own layout (nothing is
 * repacked at load; from 4 rows of A each call unpacks panels of them into scratch for its GEMM);
 * the instruction-set level is the CPU's best or forced (tests, benchmarks). */
#ifndef KILN_CPU_NBITS_Q8_H
#define KILN_CPU_NBITS_Q8_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"

struct kiln_threadpool;
struct kiln_scratch;

typedef enum kiln_nbits_q8_level {
    KILN_NBITS_Q8_AUTO = 0,     /* the best level this CPU supports */
    KILN_NBITS_Q8_BASELINE,     /* portable C */
    KILN_NBITS_Q8_AVX2,         /* AVX2: vpmaddubsw, vpmaddwd */
    KILN_NBITS_Q8_AVX512VNNI,   /* AVX-512 VNNI: vpdpbusd */
    KILN_NBITS_Q8_LEVELS
} kiln_nbits_q8_level;

/* Below this many multiply-adds (M * N * K) a GEMV runs on the calling thread: a worker's
 * wake-up and the hand-back cost more than the work (tens of microseconds on a virtual machine). */
#define KILN_NBITS_MIN_PARALLEL_MACS ((double)(1 << 18))

kiln_nbits_q8_level kiln_nbits_q8_level_detect(void);
/* Whether this CPU can run the level (AUTO and BASELINE: always). */
bool kiln_nbits_q8_level_supported(kiln_nbits_q8_level level);
const char *kiln_nbits_q8_level_name(kiln_nbits_q8_level level);

/* The weights, borrowed: B as MatMulNBits stores it, per block a scale, and the zero points:
 * one byte per block, or one integer for every block. */
typedef struct kiln_nbits_q8_w {
    int64_t K, N, block_size;   /* block_size: a power of 2 in [16, 256] */
    const uint8_t *q;           /* [N, ceil(K / block_size), block_size / 2] */
    const float *scale;         /* [N, ns] per block */
    const uint8_t *zp;          /* [N, ns] per block (0 to 15), or NULL: every zero point is `zero` */
    int32_t zero;               /* 0 to 15, with zp NULL (8 where MatMulNBits has no zero_points) */
    int64_t ns;                 /* row stride of scale and zp: at least ceil(K / block_size) */
} kiln_nbits_q8_w;

/* Y [M, N] = quant8(A) [M, K] x W^T + bias (bias [N] or NULL), A quantized per block by
 * kiln_nbits_quantize_a; columns spread over pool (NULL: this thread). A's quantized rows live
 * in scratch during the call. Errors: KILN_ERR_INVALID_ARG (sizes, a stride below
 * the blocks, a zero point outside 0..15, a level this CPU lacks), KILN_ERR_NOMEM; Y is undefined after an error. */
kiln_status kiln_nbits_q8_gemm(kiln_nbits_q8_level level, struct kiln_threadpool *pool, struct kiln_scratch *scratch,
                               const kiln_nbits_q8_w *w, int64_t M, const float *A, const float *bias, float *Y);

#endif
