/* bench_gemm.c - GFLOP/s of kiln_sgemm on square and model shapes, next to the machine's measured
 * FMA peak and numpy's matmul (OpenBLAS) timed in the same run. A benchmark, not a test.
 *
 *   bench_gemm [--threads N] [--level baseline|avx2|avx512] [--no-numpy]
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/gemm.h"

typedef struct {
    const char *name;
    int64_t M, N, K;
    bool tb;
} shape;

static const shape SHAPES[] = {
    {"square 256", 256, 256, 256, false},
    {"square 512", 512, 512, 512, false},
    {"square 1024", 1024, 1024, 1024, false},
    {"bert qkv/out 128x768x768", 128, 768, 768, false},
    {"bert qkv, B^T (Gemm)", 128, 768, 768, true},
    {"bert ffn up 128x3072x768", 128, 3072, 768, false},
    {"bert ffn down 128x768x3072", 128, 768, 3072, false},
    {"minilm 16x384x384", 16, 384, 384, false},
    {"bert seq 16 ffn up 16x3072x768", 16, 3072, 768, false},
    {"bert seq 16 ffn down 16x768x3072", 16, 768, 3072, false},
    {"conv3x3 56x56 64->64 (im2col)", 3136, 64, 576, false},
    {"conv1x1 56x56 64->256", 3136, 256, 64, false},
    {"resnet conv3x3 56x56 as run (Cout x pixels x K)", 64, 3136, 576, false},
    {"resnet conv3x3 14x14 as run", 256, 196, 2304, false},
    {"resnet conv3x3 7x7 as run", 512, 49, 4608, false},
    {"resnet conv1x1 7x7 512->2048 as run", 2048, 49, 512, false},
    {"resnet conv3x3 7x7, pixels as M", 49, 512, 4608, false},
    {"resnet conv1x1 7x7 512->2048, pixels as M", 49, 2048, 512, false},
    {"resnet conv3x3 14x14, pixels as M", 196, 256, 2304, false},
};
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0] };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best-of GFLOP/s over repeated calls for at least ~0.3 s; packed: B prepacked once, untimed. */
static double bench_kiln(const kiln_gemm_ctx *ctx, const shape *s, bool packed)
{
    int64_t M = s->M, N = s->N, K = s->K;
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N));
    float *C = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) A[i] = (float)(i % 7) * 0.1f - 0.3f;
    for (int64_t i = 0; i < K * N; i++) B[i] = (float)(i % 5) * 0.1f - 0.2f;
    double flops = 2.0 * (double)M * (double)N * (double)K, best = 1e30;
    int64_t ldb = s->tb ? K : N;
    kiln_gemm_packed_b *pb = NULL;
    bool failed = packed && kiln_gemm_packed_b_create(ctx, s->tb, K, N, B, ldb, &pb) != KILN_OK;
    double start = now();
    for (int it = 0; it < 10000 && !failed && (it < 6 || now() - start < 0.3); it++) {
        double t0 = now();
        if (pb) kiln_sgemm_packed(ctx, false, M, 1.0f, A, K, pb, 0.0f, C, N, NULL);
        else kiln_sgemm_ex(ctx, false, s->tb, M, N, K, 1.0f, A, K, B, ldb, 0.0f, C, N, NULL);
        double t = now() - t0;
        if (t < best && it > 0) best = t; /* the first call warms up */
    }
    kiln_gemm_packed_b_free(pb);
    free(A);
    free(B);
    free(C);
    return failed ? 0.0 : flops / best * 1e-9;
}

/* One core's FMA throughput at this level: 12 (or 24) independent accumulator chains, best of 3. */
#define FMA12(f, acc, x, y)                                                                           \
    acc##0 = f(acc##0, x, y), acc##1 = f(acc##1, x, y), acc##2 = f(acc##2, x, y),                     \
    acc##3 = f(acc##3, x, y), acc##4 = f(acc##4, x, y), acc##5 = f(acc##5, x, y),                     \
    acc##6 = f(acc##6, x, y), acc##7 = f(acc##7, x, y), acc##8 = f(acc##8, x, y),                     \
    acc##9 = f(acc##9, x, y), acc##10 = f(acc##10, x, y), acc##11 = f(acc##11, x, y)
#define SUM12(acc) (acc##0 + acc##1 + acc##2 + acc##3 + acc##4 + acc##5 + acc##6 + acc##7 + acc##8 + acc##9 + acc##10 + acc##11)

__attribute__((target("avx512f"))) static double fma_peak_avx512(void)
{
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
#define S(i) _mm512_set1_ps(0.01f * (float)(i))
        /* distinct starting values, so the compiler cannot merge the chains */
        __m512 a0 = S(0), a1 = S(1), a2 = S(2), a3 = S(3), a4 = S(4), a5 = S(5), a6 = S(6), a7 = S(7), a8 = S(8),
               a9 = S(9), a10 = S(10), a11 = S(11);
        __m512 b0 = S(12), b1 = S(13), b2 = S(14), b3 = S(15), b4 = S(16), b5 = S(17), b6 = S(18), b7 = S(19),
               b8 = S(20), b9 = S(21), b10 = S(22), b11 = S(23);
#undef S
        int64_t iters = 10000000;
        double t0 = now();
        for (int64_t it = 0; it < iters; it++) {
            FMA12(_mm512_fmadd_ps, a, x, y);
            FMA12(_mm512_fmadd_ps, b, x, y);
        }
        double t = now() - t0;
        __m512 sum = _mm512_add_ps(SUM12(a), SUM12(b));
        if (_mm512_reduce_add_ps(sum) == 12345.0f) printf(" ");
        double g = (double)iters * 24 * 16 * 2 / t * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

__attribute__((target("avx2,fma"))) static double fma_peak_avx2(void)
{
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
#define S(i) _mm256_set1_ps(0.01f * (float)(i))
        __m256 a0 = S(0), a1 = S(1), a2 = S(2), a3 = S(3), a4 = S(4), a5 = S(5), a6 = S(6), a7 = S(7), a8 = S(8),
               a9 = S(9), a10 = S(10), a11 = S(11);
#undef S
        int64_t iters = 20000000;
        double t0 = now();
        for (int64_t it = 0; it < iters; it++) FMA12(_mm256_fmadd_ps, a, x, y);
        double t = now() - t0;
        float buf[8];
        _mm256_storeu_ps(buf, SUM12(a));
        if (buf[0] == 12345.0f) printf(" ");
        double g = (double)iters * 12 * 8 * 2 / t * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

static double cpuinfo_mhz(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    double mhz = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "cpu MHz", 7) == 0 && mhz == 0) sscanf(strchr(line, ':') + 1, "%lf", &mhz);
    if (f) fclose(f);
    return mhz;
}

/* numpy.matmul GFLOP/s per shape, OpenBLAS's own kernel choice (OPENBLAS_CORETYPE unset). */
static int bench_numpy(int threads, double *out)
{
    char cmd[4096];
    int n = snprintf(cmd, sizeof cmd,
                     "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d "
                     "python3 -c '\n"
                     "import numpy as np, time, sys\n"
                     "try:\n"
                     "    import threadpoolctl\n"
                     "    for i in threadpoolctl.threadpool_info():\n"
                     "        sys.stderr.write(\"numpy BLAS: %%s %%s core=%%s threads=%%s\\n\" %% (i.get(\"internal_api\"), "
                     "i.get(\"version\"), i.get(\"architecture\"), i.get(\"num_threads\")))\n"
                     "except Exception:\n"
                     "    import ctypes, glob, os\n"
                     "    for l in glob.glob(os.path.join(os.path.dirname(np.__file__), \"..\", \"numpy.libs\", \"*openblas*\")):\n"
                     "        f = getattr(ctypes.CDLL(l), \"scipy_openblas_get_corename64_\", None)\n"
                     "        if f: f.restype = ctypes.c_char_p; sys.stderr.write(\"numpy %%s BLAS: OpenBLAS core=%%s \"\n"
                     "            \"threads=%d\\n\" %% (np.__version__, f().decode()))\n"
                     "for (M, N, K, tb) in [",
                     threads, threads, threads);
    for (int i = 0; i < N_SHAPES; i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, "(%lld,%lld,%lld,%d),", (long long)SHAPES[i].M,
                      (long long)SHAPES[i].N, (long long)SHAPES[i].K, SHAPES[i].tb);
    snprintf(cmd + n, sizeof cmd - (size_t)n,
             "]:\n"
             "    a = np.random.rand(M, K).astype(np.float32)\n"
             "    b = np.random.rand(N, K).astype(np.float32).T if tb else np.random.rand(K, N).astype(np.float32)\n"
             "    c = np.empty((M, N), np.float32)\n"
             "    np.matmul(a, b, out=c)\n"
             "    best = 1e30; t_end = time.perf_counter() + 0.3; it = 0\n"
             "    while it < 5 or time.perf_counter() < t_end:\n"
             "        t0 = time.perf_counter(); np.matmul(a, b, out=c); best = min(best, time.perf_counter() - t0); it += 1\n"
             "    print(2.0 * M * N * K / best * 1e-9)\n"
             "'");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    int got = 0;
    while (got < N_SHAPES && fscanf(p, "%lf", &out[got]) == 1) got++;
    pclose(p);
    return got == N_SHAPES ? 0 : -1;
}

int main(int argc, char **argv)
{
    int threads = 0;
    bool numpy = true;
    kiln_gemm_level level = KILN_GEMM_LEVEL_AUTO;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-numpy")) numpy = false;
        else if (!strcmp(argv[i], "--level") && i + 1 < argc) {
            const char *l = argv[++i];
            level = !strcmp(l, "baseline") ? KILN_GEMM_LEVEL_BASELINE
                    : !strcmp(l, "avx2")   ? KILN_GEMM_LEVEL_AVX2
                                           : KILN_GEMM_LEVEL_AVX512;
        } else {
            fprintf(stderr, "usage: %s [--threads N] [--level baseline|avx2|avx512] [--no-numpy]\n", argv[0]);
            return 2;
        }
    }
    kiln_threadpool *pool = NULL;
    if (kiln_threadpool_create(threads, &pool) != KILN_OK) return 1;
    threads = kiln_threadpool_size(pool);
    if (level == KILN_GEMM_LEVEL_AUTO) level = kiln_gemm_level_detect();
    if (!kiln_gemm_level_supported(level)) {
        fprintf(stderr, "level %s not supported here\n", kiln_gemm_level_name(level));
        return 1;
    }
    kiln_gemm_ctx one = {.pool = NULL, .level = level}, all = {.pool = pool, .level = level};

    int lanes = level == KILN_GEMM_LEVEL_AVX512 ? 16 : level == KILN_GEMM_LEVEL_AVX2 ? 8 : 4;
    double mhz = cpuinfo_mhz();
    double nominal = threads * lanes * 2.0 /* FMA units */ * 2.0 /* flops per FMA */ * mhz * 1e-3;
    double measured = level == KILN_GEMM_LEVEL_AVX512 ? fma_peak_avx512()
                      : level == KILN_GEMM_LEVEL_AVX2 ? fma_peak_avx2()
                                                      : 0.0;
    printf("level %s, %d threads; peak: nominal %.1f GFLOP/s (%d cores x %d lanes x 2 FMA units x 2 x %.0f MHz), "
           "measured FMA loop %.1f GFLOP/s per core\n",
           kiln_gemm_level_name(level), threads, nominal, threads, lanes, mhz, measured);
    double np_gf[N_SHAPES] = {0};
    bool have_np = numpy && bench_numpy(threads, np_gf) == 0;
    if (numpy && !have_np) fprintf(stderr, "numpy benchmark failed; numpy column left empty\n");
    printf("\n| shape (M x N x K) | kiln 1 thread | kiln %d threads | kiln %d threads, B prepacked | numpy/OpenBLAS "
           "%d threads | peak %d threads (measured) | kiln %% of peak |\n|---|---|---|---|---|---|---|\n",
           threads, threads, threads, threads);
    for (int i = 0; i < N_SHAPES; i++) {
        const shape *s = &SHAPES[i];
        double g1 = bench_kiln(&one, s, false), gn = threads > 1 ? bench_kiln(&all, s, false) : g1;
        double gp = bench_kiln(&all, s, true);
        double peak = measured > 0 ? measured * threads : nominal;
        printf("| %s (%lld x %lld x %lld) | %.1f | %.1f | %.1f | ", s->name, (long long)s->M, (long long)s->N,
               (long long)s->K, g1, gn, gp);
        if (have_np) printf("%.1f | ", np_gf[i]);
        else printf("- | ");
        printf("%.1f | %.0f%% |\n", peak, 100.0 * gn / peak);
        fflush(stdout);
    }
    kiln_threadpool_free(pool);
    return 0;
}
