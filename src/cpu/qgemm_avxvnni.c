/* qgemm_avxvnni.c - the AVX-VNNI int8 GEMM micro-kernel (6x16: 12 accumulators of 8 int32,
 * 256-bit vpdpbusd over groups of 4 bytes), compiled for that instruction set here only; qgemm.c
 * calls it only where the CPU has AVX2 and AVX-VNNI. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu/target.h"

KILN_TARGET_BEGIN("avx2,avxvnni")

#define QGEMM_MAC(c, a, b) ((c) = _mm256_dpbusd_avx_epi32((c), (a), (b)))
#include "cpu/qgemm_avx256.h"
#include "cpu/qgemm_internal.h"

enum { MR = 6, NR = 16, KG = 4 };

static void kernel(int64_t groups, const void *a, int64_t as, const void *b, int32_t *C, int64_t ldc, int mr, int nr,
                   const int32_t *rs, const int32_t *zb, const int32_t *cs, int32_t za)
{
    _Static_assert(MR == 6 && NR == 16 && NR * KG * 1 == 64, "qgemm_avx256.h works on 6x16 tiles of 64-byte groups");
    __m256i acc[MR][2];
    qgemm_rows_6x16(mr, groups, a, as, b, acc);
    qgemm_store_6x16(acc, mr, nr, rs, zb, cs, za, C, ldc);
}

const kiln_qgemm_kernel kiln_qgemm_kernel_avxvnni = {.mr = MR, .nr = NR, .kg = KG, .esize = 1, .kernel = kernel,
    .dot = kiln_qgemm_dot_avx2 /* both have AVX2 */};

KILN_TARGET_END
#endif
