/* nbits_f32.h - MatMulNBits' quantized weights dequantized to float32 straight into the sgemm's
 * micro-panels: W^T as the implicit op(B) of a prompt's GEMM (accuracy_level below 4), no [N, K]
 * float copy written out and packed again. The instruction-set level is the CPU's best or
 * forced (tests, benchmarks). */
#ifndef KILN_CPU_NBITS_F32_H
#define KILN_CPU_NBITS_F32_H

#include <stdint.h>

#include "cpu/gemm.h"

/* The weights, borrowed: B as MatMulNBits stores it, per block a scale, and the zero points as
 * -z * scale (float zero points), one byte per block, or one integer for every block. */
typedef struct kiln_nbits_f32_w {
    int64_t K, N, block_size;   /* block_size: a power of 2 in [16, 256] */
    int bits;                   /* 4 or 8 */
    const uint8_t *q;           /* [N, ceil(K / block_size), block_size * bits / 8] */
    const float *scale;         /* [N, ns] per block */
    const float *off;           /* [N, ns] -z * scale per block, or NULL */
    const uint8_t *zp;          /* [N, ns] per block, or NULL (with off NULL too: every zero point is zero) */
    int32_t zero;
    int64_t ns;                 /* row stride of scale, off and zp: at least ceil(K / block_size) */
} kiln_nbits_f32_w;

/* Element i of a block's bytes q at bits 4 or 8. */
static inline int kiln_nbits_q_at(const uint8_t *q, int64_t i, int bits)
{
    return bits == 8 ? q[i] : (q[i / 2] >> (4 * (i & 1))) & 15;
}

/* Rows [p0, p0 + kc) of W^T [K, N], columns [j0, j0 + n), as ceil(n / width) micro-panels
 * [kc][width] (k-major, columns past n zero) into dst: a kiln_gemm_pack_fn for `level`'s
 * kernels (width its NR). Each weight is fma(q, scale, -z * scale) or, in the tails the vector
 * code leaves, q * scale + -z * scale: levels agree to within one rounding. AUTO is the CPU's
 * best; a level the CPU lacks (kiln_gemm_level_supported) is the caller's error. */
void kiln_nbits_f32_pack(kiln_gemm_level level, const kiln_nbits_f32_w *w, float *dst, int64_t p0, int64_t kc,
                         int64_t j0, int64_t n, int width);

#endif
