/* bench_nbits_q8.c - GB/s of MatMulNBits' int8 GEMV (accuracy_level 4, M = 1 by default: an LLM's
 * decode step) on model shapes, next to a plain AVX-512 load loop over as many bytes on the same pool.
 * Each shape is cycled over enough copies of its weights (~256 MB) that every call streams them
 * from memory; the figure is the weights' bytes (4-bit values, float scales, byte zero points)
 * over the median time per call of several passes. A benchmark, not a test.
 *
 *   bench_nbits_q8 [--threads N] [--level baseline|avx2|avx512vnni] [--passes N] [--rows M]
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "cpu/nbits_q8.h"

enum { TOTAL_MB = 256, MAX_PASSES = 64 };

typedef struct {
    const char *name;
    int64_t K, N, bs;
} shape;

static const shape SHAPES[] = {
    {"2048 x 2048, block 128", 2048, 2048, 128},
    {"2048 x 5632, block 128", 2048, 5632, 128},
    {"5632 x 2048, block 128", 5632, 2048, 128},
    {"2048 x 2048, block 32", 2048, 2048, 32},
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const uint8_t *p;
    int64_t chunk, bytes;
    __m512i sum[256]; /* per chunk, so nothing is optimised away */
} load_job;

__attribute__((target("avx512f"))) static void load_task(void *ctx, int64_t c0, int64_t c1)
{
    load_job *j = ctx;
    for (int64_t c = c0; c < c1; c++) {
        __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
        const uint8_t *p = j->p + c * j->chunk;
        for (int64_t o = 0; o < j->chunk; o += 256) {
            s0 = _mm512_add_epi32(s0, _mm512_load_si512(p + o));
            s1 = _mm512_add_epi32(s1, _mm512_load_si512(p + o + 64));
            s2 = _mm512_add_epi32(s2, _mm512_load_si512(p + o + 128));
            s3 = _mm512_add_epi32(s3, _mm512_load_si512(p + o + 192));
        }
        j->sum[c % 256] = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
    }
}

/* A plain load loop's GB/s over TOTAL_MB on the pool, median of passes. */
static double bench_load(kiln_threadpool *pool, int passes)
{
    static load_job j;
    int64_t bytes = (int64_t)TOTAL_MB << 20;
    uint8_t *buf = aligned_alloc(64, (size_t)bytes);
    if (!buf) return 0;
    memset(buf, 1, (size_t)bytes);
    j.p = buf, j.chunk = 64 << 10, j.bytes = bytes;
    double t[MAX_PASSES];
    for (int i = 0; i <= passes; i++) {
        double t0 = now();
        kiln_threadpool_parallel_for(pool, bytes / j.chunk, load_task, &j);
        if (i) t[i - 1] = now() - t0; /* the first pass warms up */
    }
    qsort(t, (size_t)passes, sizeof *t, cmp_double);
    free(buf);
    return (double)bytes / t[passes / 2] * 1e-9;
}

/* One shape's GB/s: copies of random weights (per-block zero points), a call per copy. */
static double bench_shape(kiln_nbits_q8_level level, kiln_threadpool *pool, kiln_scratch *scr, const shape *s,
                          int64_t M, int passes)
{
    int64_t nb = (s->K + s->bs - 1) / s->bs, qb = s->N * nb * s->bs / 2, sb = s->N * nb;
    int64_t per = qb + sb * 5, copies = ((int64_t)TOTAL_MB << 20) / per + 1;
    uint8_t *q = malloc((size_t)(qb * copies)), *zp = malloc((size_t)(sb * copies));
    float *scale = malloc((size_t)(sb * copies) * sizeof *scale), *A = malloc((size_t)(M * s->K) * sizeof *A);
    float *Y = malloc((size_t)(M * s->N) * sizeof *Y);
    double t[MAX_PASSES], gbs = 0;
    if (!q || !zp || !scale || !A || !Y) goto out;
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < qb * copies; i++) r = r * 6364136223846793005ull + 1, q[i] = (uint8_t)(r >> 56);
    for (int64_t i = 0; i < sb * copies; i++) zp[i] = (uint8_t)(i % 16), scale[i] = 0.01f + 0.001f * (float)(i % 7);
    for (int64_t k = 0; k < M * s->K; k++) A[k] = (float)(k % 13) * 0.1f - 0.6f;
    for (int i = 0; i <= passes; i++) {
        double t0 = now();
        for (int64_t c = 0; c < copies; c++) {
            kiln_nbits_q8_w w = {s->K, s->N, s->bs, q + c * qb, scale + c * sb, zp + c * sb, 8, nb};
            if (kiln_nbits_q8_gemm(level, pool, scr, &w, M, A, NULL, Y) != KILN_OK) goto out;
        }
        if (i) t[i - 1] = (now() - t0) / (double)copies;
    }
    qsort(t, (size_t)passes, sizeof *t, cmp_double);
    gbs = (double)per / t[passes / 2] * 1e-9;
    printf("%-26s %8.1f us  %6.1f GB/s\n", s->name, t[passes / 2] * 1e6, gbs);
out:
    free(q);
    free(zp);
    free(scale);
    free(A);
    free(Y);
    return gbs;
}

int main(int argc, char **argv)
{
    int threads = 2, passes = 9;
    int64_t M = 1;
    kiln_nbits_q8_level level = KILN_NBITS_Q8_AUTO;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc) passes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) M = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--level") && i + 1 < argc) {
            const char *v = argv[++i];
            for (int l = KILN_NBITS_Q8_BASELINE; l < KILN_NBITS_Q8_LEVELS; l++)
                if (!strcmp(v, kiln_nbits_q8_level_name((kiln_nbits_q8_level)l))) level = (kiln_nbits_q8_level)l;
        } else {
            fprintf(stderr, "usage: %s [--threads N] [--level baseline|avx2|avx512vnni] [--passes N] [--rows M]\n",
                    argv[0]);
            return 2;
        }
    }
    if (passes < 1 || passes > MAX_PASSES) passes = 9;
    if (M < 1) M = 1;
    if (!kiln_nbits_q8_level_supported(level)) {
        fprintf(stderr, "this CPU lacks level %s\n", kiln_nbits_q8_level_name(level));
        return 1;
    }
    kiln_threadpool *pool = NULL;
    kiln_scratch *scr = kiln_scratch_create();
    if (kiln_threadpool_create(threads, &pool) != KILN_OK || !scr) return 1;
    printf("level %s, %d threads, %lld rows of A, %d MB of weights per shape, median of %d passes\n",
           kiln_nbits_q8_level_name(level == KILN_NBITS_Q8_AUTO ? kiln_nbits_q8_level_detect() : level), threads,
           (long long)M, TOTAL_MB, passes);
    if (kiln_nbits_q8_level_supported(KILN_NBITS_Q8_AVX512VNNI))
        printf("%-26s %20.1f GB/s\n", "plain load loop", bench_load(pool, passes));
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) bench_shape(level, pool, scr, &SHAPES[i], M, passes);
    kiln_threadpool_free(pool);
    kiln_scratch_free(scr);
    return 0;
}
