/* test_nbits_f32.c - kiln_nbits_f32_pack (MatMulNBits' weights dequantized into the sgemm's
 * micro-panels) against the weights computed here in double precision: every instruction-set
 * level this build has, forced one by one (a level the CPU lacks is skipped, saying so), 4 and
 * 8 bits, block sizes 16 to 256, K not a multiple of the block (and below one block), depth
 * blocks that start anywhere (a multiple of 32, of 8, neither) and end anywhere, odd column
 * ranges and panel widths, zero points per block as bytes, as floats or one for all, padded
 * rows of scales, random data (never zeros). Each weight is one or two roundings from
 * (q - z) * s: |got - want| <= 2^-22 * (|q s| + |z s|), a bound that does not depend on the CPU;
 * columns past the range must be zero. Then the sgemm with the weights as its implicit op(B),
 * packed per tile and per micro-panel (kiln_gemm_ctx.pack_b_panels), against a double-precision
 * product: M of 1, 2, 3, 17 and 40, odd N, K past one depth block and not a multiple of the
 * block. */
#include <math.h>
#include <stdlib.h>

#include "core/threadpool.h"
#include "cpu/nbits_f32.h"
#define UNIT_SEED 0x2545f4914f6cdd1dull
#include "unit.h"

static int cases_run;

/* zkind 0: one zero point for all, 1: a byte per block, 2: floats (-z * s given) */
static void one_case(kiln_gemm_level level, int bits, int64_t K, int64_t N, int64_t bs, int zkind, int64_t pad,
                     int64_t p0, int64_t kc, int64_t j0, int64_t n, int width)
{
    int64_t nb = (K + bs - 1) / bs, ns = nb + pad, blob = bs * bits / 8;
    uint8_t *q = malloc((size_t)(N * nb * blob)), *zp = malloc((size_t)(N * ns));
    float *scale = malloc((size_t)(N * ns) * sizeof *scale), *off = malloc((size_t)(N * ns) * sizeof *off);
    int64_t panels = (n + width - 1) / width;
    float *dst = malloc((size_t)(panels * kc * width) * sizeof *dst);
    for (int64_t i = 0; i < N * nb * blob; i++) q[i] = (uint8_t)(unit_rnd() >> 32);
    for (int64_t i = 0; i < N * ns; i++) {
        scale[i] = unit_unif(0.01f, 0.2f);
        zp[i] = (uint8_t)(unit_rnd() % (1u << bits));
        off[i] = -unit_unif(0.0f, (float)((1 << bits) - 1)) * scale[i];
    }
    for (int64_t i = 0; i < panels * kc * width; i++) dst[i] = NAN;
    int32_t zero = (int32_t)(unit_rnd() % (1u << bits));
    kiln_nbits_f32_w w = {K, N, bs, bits, q, scale, zkind == 2 ? off : NULL, zkind == 1 ? zp : NULL, zero, ns};
    kiln_nbits_f32_pack(level, &w, dst, p0, kc, j0, n, width);
    bool ok = true;
    for (int64_t c = 0; c < panels * width && ok; c++)
        for (int64_t k = 0; k < kc && ok; k++) {
            double got = dst[(c / width) * kc * width + k * width + c % width], want = 0.0, mag = 0.0;
            if (c < n) {
                int64_t col = j0 + c, e = p0 + k, b = e / bs, i = col * ns + b, in = e % bs;
                const uint8_t *qb = q + (col * nb + b) * blob;
                int v = bits == 8 ? qb[in] : (qb[in / 2] >> (4 * (in & 1))) & 15;
                /* -z * s as the float the kernel adds (given, or rounded once from z and s) */
                double o = zkind == 2 ? off[i] : (double)(-(float)(zkind == 1 ? zp[i] : zero) * scale[i]);
                want = v * (double)scale[i] + o, mag = fabs(v * (double)scale[i]) + fabs(o);
            }
            if (!(fabs(got - want) <= 0x1p-22 * mag)) {
                fprintf(stderr, "%s bits=%d K=%lld N=%lld bs=%lld z=%d p0=%lld kc=%lld j0=%lld n=%lld width=%d: "
                        "[k %lld, column %lld] = %.9g, want %.9g\n", kiln_gemm_level_name(level), bits, (long long)K,
                        (long long)N, (long long)bs, zkind, (long long)p0, (long long)kc, (long long)j0, (long long)n,
                        width, (long long)k, (long long)c, got, want);
                ok = false;
            }
        }
    CHECK(ok);
    cases_run++;
    free(q), free(zp), free(scale), free(off), free(dst);
}

typedef struct pack_src {
    const kiln_nbits_f32_w *w;
    kiln_gemm_level level;
} pack_src;

static void pack_w(void *ctx, float *dst, int64_t p0, int64_t kc, int64_t j0, int64_t n, int width)
{
    const pack_src *s = ctx;
    kiln_nbits_f32_pack(s->level, s->w, dst, p0, kc, j0, n, width);
}

/* Y [M, N] = A [M, K] x W^T through kiln_sgemm_packed_a, W 4-bit with a zero point per block */
static void gemm_case(kiln_gemm_level level, kiln_threadpool *pool, int64_t M, int64_t K, int64_t N, int64_t bs,
                      bool panels)
{
    int64_t nb = (K + bs - 1) / bs, blob = bs / 2;
    uint8_t *q = malloc((size_t)(N * nb * blob)), *zp = malloc((size_t)(N * nb));
    float *scale = malloc((size_t)(N * nb) * sizeof *scale), *A = malloc((size_t)(M * K) * sizeof *A);
    float *Y = malloc((size_t)(M * N) * sizeof *Y);
    for (int64_t i = 0; i < N * nb * blob; i++) q[i] = (uint8_t)(unit_rnd() >> 32);
    for (int64_t i = 0; i < N * nb; i++) scale[i] = unit_unif(0.01f, 0.2f), zp[i] = (uint8_t)(unit_rnd() % 16);
    for (int64_t i = 0; i < M * K; i++) A[i] = unit_unif(-2.0f, 2.0f);
    kiln_nbits_f32_w w = {K, N, bs, 4, q, scale, NULL, zp, 8, nb};
    pack_src src = {&w, level};
    kiln_gemm_ctx g = {.pool = pool, .level = level, .pack_b_panels = panels};
    kiln_gemm_packed_a *pa = NULL;
    CHECK(kiln_gemm_packed_a_create(&g, M, K, A, K, &pa) == KILN_OK);
    CHECK(kiln_sgemm_packed_a(&g, pa, N, NULL, 0, pack_w, &src, Y, N, NULL) == KILN_OK);
    bool ok = true;
    for (int64_t m = 0; m < M && ok; m++)
        for (int64_t n = 0; n < N && ok; n++) {
            double want = 0.0, mag = 0.0;
            for (int64_t k = 0; k < K; k++) {
                int64_t b = k / bs, in = k % bs;
                int v = (q[(n * nb + b) * blob + in / 2] >> (4 * (in & 1))) & 15;
                double t = (double)A[m * K + k] * (v - (double)zp[n * nb + b]) * scale[n * nb + b];
                want += t, mag += fabs(t);
            }
            if (!(fabs(Y[m * N + n] - want) <= 1e-5 * mag + 1e-6)) {
                fprintf(stderr, "%s sgemm M=%lld K=%lld N=%lld bs=%lld panels=%d: Y[%lld, %lld] = %.9g, want %.9g\n",
                        kiln_gemm_level_name(level), (long long)M, (long long)K, (long long)N, (long long)bs, panels,
                        (long long)m, (long long)n, Y[m * N + n], want);
                ok = false;
            }
        }
    CHECK(ok);
    cases_run++;
    kiln_gemm_packed_a_free(pa);
    free(q), free(zp), free(scale), free(A), free(Y);
}

int main(void)
{
    kiln_threadpool *pool = NULL;
    CHECK(kiln_threadpool_create(2, &pool) == KILN_OK);
    printf("detected level: %s\n", kiln_gemm_level_name(kiln_gemm_level_detect()));
    static const int widths[] = {4, 16, 32, 24};
    for (int lv = KILN_GEMM_LEVEL_BASELINE; lv <= KILN_GEMM_LEVEL_AVX512; lv++) {
        if (!kiln_gemm_level_supported((kiln_gemm_level)lv)) {
            printf("skipping %s: this CPU lacks it\n", kiln_gemm_level_name((kiln_gemm_level)lv));
            continue;
        }
        int before = cases_run;
        for (int bits = 4; bits <= 8; bits += 4)
            for (int64_t bs = 16; bs <= 256; bs *= 2) {
                int64_t Ks[] = {bs / 2 + 3, bs + 5, 3 * bs, 1000 + bs / 2 + 1, 2048};
                for (int ki = 0; ki < 5; ki++)
                    for (int t = 0; t < 4; t++) {
                        int64_t K = Ks[ki], N = 1 + (int64_t)(unit_rnd() % 70);
                        /* depth blocks from 0, a multiple of 32 or 8, or anywhere; to K or short of it */
                        int64_t starts[] = {0, K / 64 * 32, K / 16 * 8, (int64_t)(unit_rnd() % (uint64_t)K)};
                        int64_t p0 = starts[unit_rnd() % 4], kc = K - p0;
                        if (unit_rnd() & 1) kc = 1 + (int64_t)(unit_rnd() % (uint64_t)kc);
                        int64_t j0 = (int64_t)(unit_rnd() % (uint64_t)N), n = 1 + (int64_t)(unit_rnd() % (uint64_t)(N - j0));
                        if (unit_rnd() & 1) j0 = 0, n = N;
                        one_case((kiln_gemm_level)lv, bits, K, N, bs, (int)(unit_rnd() % 3), (int64_t)(unit_rnd() % 3), p0, kc,
                                 j0, n, widths[unit_rnd() % 4]);
                    }
            }
        one_case((kiln_gemm_level)lv, 4, 2048, 96, 128, 1, 0, 1024, 1024, 32, 64, 32); /* a prompt's tile */
        one_case((kiln_gemm_level)lv, 4, 4096, 48, 32, 0, 0, 0, 1024, 0, 48, 16);
        static const int64_t Ms[] = {1, 2, 3, 17, 40}, Ns[] = {1, 17, 33, 70};
        for (int t = 0; t < 16; t++) {
            int64_t bs = (int64_t)16 << (unit_rnd() % 5), K = t & 1 ? 3 * bs + 5 : 1100 + (int64_t)(unit_rnd() % 40);
            gemm_case((kiln_gemm_level)lv, t & 2 ? pool : NULL, Ms[unit_rnd() % 5], K, Ns[unit_rnd() % 4], bs, t & 4);
        }
        printf("%s: %d cases\n", kiln_gemm_level_name((kiln_gemm_level)lv), cases_run - before);
    }
    kiln_threadpool_free(pool);
    return unit_report("test_nbits_f32");
}
