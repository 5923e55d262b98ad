/* test_nbits_q8.c - kiln_nbits_q8_gemm (MatMulNBits at accuracy_level 4) against a double-precision
 * reference of the same arithmetic (A quantized per block by kiln_nbits_quantize_a, weights
 * (q - z) * s): every instruction-set level this build has, forced one by one (a level the CPU
 * lacks is skipped, saying so), block sizes 16 to 256, K not a multiple of the block (and below
 * one block), odd N, M of 1 and more, zero points per block, bias or none, with and without a
 * pool, random data (never zeros). The integer dots are exact, so each level is within float
 * rounding of the reference: |got - want| <= 1e-5 * sum of |terms| (a bound that does not
 * depend on the CPU). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "cpu/nbits_q8.h"
#include "ops/llm.h"
#define UNIT_SEED 0x9e3779b97f4a7c15ull
#include "unit.h"

static int cases_run;

static void one_case(kiln_nbits_q8_level level, kiln_threadpool *pool, kiln_scratch *scratch, int64_t M, int64_t K,
                     int64_t N, int64_t bs, bool bias_on, bool per_block_zp, int64_t pad)
{
    int64_t nb = (K + bs - 1) / bs, ns = nb + pad, blob = bs / 2;
    int32_t zero = (int32_t)(unit_rnd() % 16);
    uint8_t *q = malloc((size_t)(N * nb * blob));
    float *scale = calloc((size_t)(N * ns), sizeof *scale);
    uint8_t *zp = calloc((size_t)(N * ns), 1);
    float *A = malloc((size_t)(M * K) * sizeof *A), *bias = malloc((size_t)N * sizeof *bias);
    float *Y = malloc((size_t)(M * N) * sizeof *Y);
    int8_t *qa = malloc((size_t)K);
    float *sa = malloc((size_t)nb * sizeof *sa);
    for (int64_t i = 0; i < N * nb * blob; i++) q[i] = (uint8_t)(unit_rnd() >> 32);
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++) {
            scale[n * ns + b] = unit_unif(0.01f, 0.2f);
            zp[n * ns + b] = (uint8_t)(unit_rnd() % 16);
        }
    for (int64_t i = 0; i < M * K; i++) A[i] = unit_unif(-2.0f, 2.0f);
    for (int64_t n = 0; n < N; n++) bias[n] = unit_unif(-1.0f, 1.0f);
    kiln_nbits_q8_w w = {K, N, bs, q, scale, per_block_zp ? zp : NULL, zero, ns};
    CHECK(kiln_nbits_q8_gemm(level, pool, scratch, &w, M, A, bias_on ? bias : NULL, Y) == KILN_OK);
    bool ok = true;
    for (int64_t m = 0; m < M && ok; m++) {
        for (int64_t b = 0; b < nb; b++) {
            int64_t len = K - b * bs < bs ? K - b * bs : bs;
            sa[b] = kiln_nbits_quantize_a(A + m * K + b * bs, len, qa + b * bs);
        }
        for (int64_t n = 0; n < N && ok; n++) {
            double want = bias_on ? bias[n] : 0.0, mag = fabs(want);
            for (int64_t k = 0; k < K; k++) {
                int64_t b = k / bs, in = k % bs;
                int v = (q[(n * nb + b) * blob + in / 2] >> (4 * (in & 1))) & 15;
                double s = scale[n * ns + b], z = per_block_zp ? zp[n * ns + b] : zero;
                double t = (double)sa[b] * s * ((double)v - z) * qa[k];
                want += t, mag += fabs(t);
            }
            double got = Y[m * N + n];
            if (!(fabs(got - want) <= 1e-5 * mag + 1e-6)) {
                fprintf(stderr, "%s M=%lld K=%lld N=%lld bs=%lld: Y[%lld, %lld] = %.9g, want %.9g\n",
                        kiln_nbits_q8_level_name(level), (long long)M, (long long)K, (long long)N, (long long)bs,
                        (long long)m, (long long)n, got, want);
                ok = false;
            }
        }
    }
    CHECK(ok);
    cases_run++;
    free(q), free(scale), free(zp), free(A), free(bias), free(Y), free(qa), free(sa);
}

int main(void)
{
    kiln_threadpool *pool = NULL;
    CHECK(kiln_threadpool_create(2, &pool) == KILN_OK);
    kiln_scratch *scratch = kiln_scratch_create();
    printf("detected level: %s\n", kiln_nbits_q8_level_name(kiln_nbits_q8_level_detect()));
    static const int64_t Ms[] = {1, 2, 3, 5, 9, 40, 130}, Ns[] = {1, 3, 7, 9, 17, 33};
    for (int lv = KILN_NBITS_Q8_BASELINE; lv < KILN_NBITS_Q8_LEVELS; lv++) {
        if (!kiln_nbits_q8_level_supported((kiln_nbits_q8_level)lv)) {
            printf("skipping %s: this CPU lacks it\n", kiln_nbits_q8_level_name((kiln_nbits_q8_level)lv));
            continue;
        }
        int before = cases_run;
        for (int64_t bs = 16; bs <= 256; bs *= 2) {
            /* below one block, one block and a bit, a step of 128 and a bit, many steps and a tail */
            int64_t Ks[] = {bs / 2 + 3, bs + 5, 3 * bs, 128 + 9, 1000 + bs / 2 + 1, 4096};
            for (int k = 0; k < 6; k++)
                for (int t = 0; t < 3; t++) {
                    unsigned f = (unsigned)unit_rnd();
                    one_case((kiln_nbits_q8_level)lv, f & 1 ? pool : NULL, scratch, Ms[unit_rnd() % 7], Ks[k], Ns[unit_rnd() % 6],
                             bs, f & 2, f & 4, f & 8 ? 3 : 0);
                }
        }
        /* one row of A (a decode step's kernels) at every block size and kind of zero point: K
         * with a partial last step of 128, an odd number of steps, an even one */
        for (int64_t bs = 16; bs <= 256; bs *= 2)
            for (int k = 0; k < 3; k++) {
                int64_t K = k == 0 ? 896 + bs / 2 + 1 : k == 1 ? 640 : 4096;
                one_case((kiln_nbits_q8_level)lv, pool, scratch, 1, K, 9, bs, k & 1, false, 0);
                one_case((kiln_nbits_q8_level)lv, pool, scratch, 1, K, 9, bs, !(k & 1), true, 2);
            }
        one_case((kiln_nbits_q8_level)lv, pool, scratch, 1, 2048, 1000, 32, true, true, 0); /* split over the pool */
        one_case((kiln_nbits_q8_level)lv, pool, scratch, 7, 2048, 1000, 128, false, false, 0);
        one_case((kiln_nbits_q8_level)lv, pool, scratch, 0, 64, 5, 32, false, true, 0); /* no rows */
        printf("%s: %d cases\n", kiln_nbits_q8_level_name((kiln_nbits_q8_level)lv), cases_run - before);
    }
    /* the blocked GEMM (4 rows or more) gives the same bits at every level: its integer sums are
     * exact and its float operations the same, in the same order */
    {
        static const int64_t gM[] = {4, 5, 7, 8, 13, 130}, gK[] = {16 * 7 + 3, 200, 1000, 2048 + 17}, gN[] = {1, 15, 17, 33, 51};
        int compared = 0;
        for (int t = 0; t < 24; t++) {
            int64_t M = gM[unit_rnd() % 6], K = gK[unit_rnd() % 4], N = gN[unit_rnd() % 5], bs = (int64_t)16 << (unit_rnd() % 5);
            bool per_block = unit_rnd() & 1, has_bias = unit_rnd() & 1;
            int64_t nb = (K + bs - 1) / bs, ns = nb + (int64_t)(unit_rnd() % 3), blob = bs / 2;
            uint8_t *q = malloc((size_t)(N * nb * blob)), *zp = malloc((size_t)(N * ns));
            float *scale = malloc((size_t)(N * ns) * sizeof *scale), *A = malloc((size_t)(M * K) * sizeof *A);
            float *bias = malloc((size_t)N * sizeof *bias), *Y0 = malloc((size_t)(M * N) * sizeof *Y0);
            float *Y1 = malloc((size_t)(M * N) * sizeof *Y1);
            for (int64_t i = 0; i < N * nb * blob; i++) q[i] = (uint8_t)(unit_rnd() >> 32);
            for (int64_t i = 0; i < N * ns; i++) scale[i] = unit_unif(0.01f, 0.2f), zp[i] = (uint8_t)(unit_rnd() % 16);
            for (int64_t i = 0; i < M * K; i++) A[i] = unit_unif(-2.0f, 2.0f);
            for (int64_t n = 0; n < N; n++) bias[n] = unit_unif(-1.0f, 1.0f);
            kiln_nbits_q8_w w = {K, N, bs, q, scale, per_block ? zp : NULL, (int32_t)(unit_rnd() % 16), ns};
            CHECK(kiln_nbits_q8_gemm(KILN_NBITS_Q8_BASELINE, NULL, scratch, &w, M, A, has_bias ? bias : NULL, Y0) == KILN_OK);
            for (int lv = KILN_NBITS_Q8_BASELINE + 1; lv < KILN_NBITS_Q8_LEVELS; lv++) {
                if (!kiln_nbits_q8_level_supported((kiln_nbits_q8_level)lv)) continue;
                CHECK(kiln_nbits_q8_gemm((kiln_nbits_q8_level)lv, t & 1 ? pool : NULL, scratch, &w, M, A,
                                         has_bias ? bias : NULL, Y1) == KILN_OK);
                bool same = memcmp(Y0, Y1, (size_t)(M * N) * sizeof *Y0) == 0;
                if (!same)
                    fprintf(stderr, "%s M=%lld K=%lld N=%lld bs=%lld: the blocked GEMM differs from baseline\n",
                            kiln_nbits_q8_level_name((kiln_nbits_q8_level)lv), (long long)M, (long long)K, (long long)N,
                            (long long)bs);
                CHECK(same);
                compared++;
            }
            free(q), free(zp), free(scale), free(A), free(bias), free(Y0), free(Y1);
        }
        printf("blocked GEMM: %d comparisons with baseline, bit for bit\n", compared);
    }
    /* A's quantization bit for bit at every level: column n holds a single weight 1 (zero point
     * 0, scale 1) at element n, so Y[m, n] is one exact product qa[n] * sa of its block */
    for (int64_t bs = 16; bs <= 256; bs *= 2) {
        int64_t K = 3 * bs + 7, M = 3, nb = (K + bs - 1) / bs, ns = nb;
        uint8_t *q = calloc((size_t)(K * nb * bs / 2), 1);
        float *scale = calloc((size_t)(K * ns), sizeof *scale);
        float *A = malloc((size_t)(M * K) * sizeof *A), *Y = malloc((size_t)(M * K) * sizeof *Y), sa[64];
        int8_t *qa = malloc((size_t)K);
        for (int64_t n = 0; n < K; n++) {
            q[(n * nb + n / bs) * (bs / 2) + (n % bs) / 2] = (uint8_t)(1 << (4 * (n & 1)));
            for (int64_t b = 0; b < nb; b++) scale[n * ns + b] = 1.0f;
        }
        for (int64_t i = 0; i < M * K; i++) A[i] = unit_unif(-3.0f, 3.0f) * (i % 5 ? 1.0f : 1e-3f);
        kiln_nbits_q8_w w = {K, K, bs, q, scale, NULL, 0, ns};
        for (int lv = KILN_NBITS_Q8_BASELINE; lv < KILN_NBITS_Q8_LEVELS; lv++) {
            if (!kiln_nbits_q8_level_supported((kiln_nbits_q8_level)lv)) continue;
            CHECK(kiln_nbits_q8_gemm((kiln_nbits_q8_level)lv, pool, scratch, &w, M, A, NULL, Y) == KILN_OK);
            bool same = true;
            for (int64_t m = 0; m < M; m++) {
                for (int64_t b = 0; b < nb; b++) {
                    int64_t len = K - b * bs < bs ? K - b * bs : bs;
                    sa[b] = kiln_nbits_quantize_a(A + m * K + b * bs, len, qa + b * bs);
                }
                for (int64_t n = 0; n < K; n++) same = same && Y[m * K + n] == (float)qa[n] * sa[n / bs];
            }
            if (!same) fprintf(stderr, "%s bs=%lld: quantized A differs\n", kiln_nbits_q8_level_name((kiln_nbits_q8_level)lv), (long long)bs);
            CHECK(same);
        }
        free(q), free(scale), free(A), free(Y), free(qa);
    }
    /* refused: a scale stride below the blocks, a zero point past 15, a level beyond the enum */
    {
        uint8_t q[32] = {0}, z[2] = {0};
        float s[32] = {0}, a[64] = {0}, y[1];
        kiln_nbits_q8_w w = {64, 1, 32, q, s, z, 0, 1};
        CHECK(kiln_nbits_q8_gemm(KILN_NBITS_Q8_BASELINE, NULL, scratch, &w, 1, a, NULL, y) == KILN_ERR_INVALID_ARG);
        w.ns = 2, w.zp = NULL, w.zero = 16;
        CHECK(kiln_nbits_q8_gemm(KILN_NBITS_Q8_BASELINE, NULL, scratch, &w, 1, a, NULL, y) == KILN_ERR_INVALID_ARG);
        w.zero = 8;
        CHECK(kiln_nbits_q8_gemm(KILN_NBITS_Q8_LEVELS, NULL, scratch, &w, 1, a, NULL, y) == KILN_ERR_INVALID_ARG);
        CHECK(kiln_nbits_q8_gemm(KILN_NBITS_Q8_BASELINE, NULL, scratch, &w, 1, a, NULL, y) == KILN_OK);
    }
    kiln_scratch_free(scratch);
    kiln_threadpool_free(pool);
    return unit_report("test_nbits_q8");
}
