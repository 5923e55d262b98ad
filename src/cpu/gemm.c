/* gemm.c - the sgemm driver: argument checks, CPU dispatch, cache blocking, packing and the
 * split of C into tiles run on a thread pool (BLIS-style loops around a level's micro-kernel). */
#include "cpu/gemm.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/gemm_internal.h"

enum { ALIGN = 64 /* bytes, of each packing buffer */ };

kiln_gemm_level kiln_gemm_level_detect(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return KILN_GEMM_LEVEL_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KILN_GEMM_LEVEL_AVX2;
#endif
    return KILN_GEMM_LEVEL_BASELINE;
}

bool kiln_gemm_level_supported(kiln_gemm_level level)
{
    switch (level) {
    case KILN_GEMM_LEVEL_AUTO:
    case KILN_GEMM_LEVEL_BASELINE: return true;
    case KILN_GEMM_LEVEL_AVX2: return kiln_gemm_level_detect() >= KILN_GEMM_LEVEL_AVX2;
    case KILN_GEMM_LEVEL_AVX512: return kiln_gemm_level_detect() >= KILN_GEMM_LEVEL_AVX512;
    }
    return false;
}

const char *kiln_gemm_level_name(kiln_gemm_level level)
{
    switch (level) {
    case KILN_GEMM_LEVEL_AUTO: return "auto";
    case KILN_GEMM_LEVEL_BASELINE: return "baseline";
    case KILN_GEMM_LEVEL_AVX2: return "avx2";
    case KILN_GEMM_LEVEL_AVX512: return "avx512";
    }
    return "?";
}

static const kiln_gemm_kernel *kernel_for(kiln_gemm_level level)
{
#if defined(__x86_64__)
    if (level == KILN_GEMM_LEVEL_AVX512) return &kiln_gemm_kernel_avx512;
    if (level == KILN_GEMM_LEVEL_AVX2) return &kiln_gemm_kernel_avx2;
#endif
    return &kiln_gemm_kernel_baseline;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* One sgemm call, shared by the threads that run its tiles. */
typedef struct gemm_job {
    const kiln_gemm_kernel *k;
    bool trans_a, trans_b;
    int64_t M, N, K;
    float alpha, beta;
    const float *A, *B;
    int64_t lda, ldb, ldc;
    float *C;
    const float *bias;
    int relu;
    int64_t mt, nt, kc;  /* tile of C per task (rows, columns), depth block */
    int64_t tiles_n;     /* tiles across N */
    int64_t n_tiles;
    float *work;         /* [slots][slot_floats], 64-byte aligned */
    int64_t slot_floats; /* packed A (mt x kc) then packed B (kc x nt), each rounded to ALIGN */
    int64_t a_floats;
    atomic_int_fast64_t next_tile;
} gemm_job;

/* C[i0 : i0+m, j0 : j0+n] over all of K: pack, then the micro-kernel over every micro-tile. */
static void run_tile(const gemm_job *g, float *Ap, float *Bp, int64_t i0, int64_t m, int64_t j0, int64_t n)
{
    const kiln_gemm_kernel *k = g->k;
    for (int64_t p0 = 0; p0 < g->K; p0 += g->kc) {
        int64_t kc = min64(g->kc, g->K - p0);
        bool first = p0 == 0, last = p0 + kc == g->K;
        float beta = first ? g->beta : 1.0f;
        k->pack_b(Bp, g->B, g->ldb, g->trans_b, p0, kc, j0, n);
        k->pack_a(Ap, g->A, g->lda, g->trans_a, i0, m, p0, kc, g->alpha);
        for (int64_t jr = 0; jr < n; jr += k->nr) {
            int nr = (int)min64(k->nr, n - jr);
            const float *bias = last && g->bias ? g->bias + j0 + jr : NULL;
            const float *b = Bp + jr * kc;
            for (int64_t ir = 0; ir < m; ir += k->mr) {
                int mr = (int)min64(k->mr, m - ir);
                k->kernel(kc, Ap + ir * kc, b, g->C + (i0 + ir) * g->ldc + j0 + jr, g->ldc, mr, nr, beta,
                          bias, last && g->relu);
            }
        }
    }
}

/* A pool chunk [begin, end) of packing slots: each slot takes tiles until none are left. */
static void run_slots(void *ctx, int64_t begin, int64_t end)
{
    gemm_job *g = ctx;
    float *Ap = g->work + begin * g->slot_floats;
    float *Bp = Ap + g->a_floats;
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&g->next_tile, 1, memory_order_relaxed);
        if (t >= g->n_tiles) break;
        int64_t i0 = t / g->tiles_n * g->mt, j0 = t % g->tiles_n * g->nt;
        run_tile(g, Ap, Bp, i0, min64(g->mt, g->M - i0), j0, min64(g->nt, g->N - j0));
    }
}

/* C = beta*C, then the epilogue: alpha == 0 or K == 0. */
static void scale_only(int64_t M, int64_t N, float beta, float *C, int64_t ldc, const float *bias, int relu)
{
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        for (int64_t j = 0; j < N; j++) {
            float v = beta == 0.0f ? 0.0f : beta * c[j];
            if (bias) v += bias[j];
            if (relu && v < 0.0f) v = 0.0f;
            c[j] = v;
        }
    }
}

kiln_status kiln_sgemm_ex(const kiln_gemm_ctx *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N,
                          int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                          int64_t ldb, float beta, float *C, int64_t ldc, const kiln_gemm_epilogue *ep)
{
    if (M < 0 || N < 0 || K < 0) return KILN_ERR_INVALID_ARG;
    kiln_gemm_level level = ctx ? ctx->level : KILN_GEMM_LEVEL_AUTO;
    if (!kiln_gemm_level_supported(level)) return KILN_ERR_INVALID_ARG;
    if (M == 0 || N == 0) return KILN_OK;
    if (!C || ldc < N) return KILN_ERR_INVALID_ARG;
    const float *bias = ep ? ep->bias : NULL;
    int relu = ep && ep->act == KILN_GEMM_ACT_RELU;
    if (ep && ep->act != KILN_GEMM_ACT_NONE && ep->act != KILN_GEMM_ACT_RELU) return KILN_ERR_INVALID_ARG;
    if (K == 0 || alpha == 0.0f) {
        scale_only(M, N, beta, C, ldc, bias, relu);
        return KILN_OK;
    }
    if (!A || !B || lda < (trans_a ? M : K) || ldb < (trans_b ? K : N)) return KILN_ERR_INVALID_ARG;
    if (level == KILN_GEMM_LEVEL_AUTO) level = kiln_gemm_level_detect();
    const kiln_gemm_kernel *k = kernel_for(level);
    kiln_threadpool *pool = ctx ? ctx->pool : NULL;
    int threads = kiln_threadpool_size(pool);

    /* Tiles of C: one MC x NC block each, halved (N first) until every thread has a few. */
    int64_t mt = min64(k->mc, round_up(M, k->mr)), nt = min64(k->nc, round_up(N, k->nr));
    int64_t want = threads > 1 ? 3 * (int64_t)threads : 1;
    for (;;) {
        int64_t tiles = ((M + mt - 1) / mt) * ((N + nt - 1) / nt);
        if (tiles >= want) break;
        if (nt >= 4 * k->nr && nt >= mt / 2) nt = round_up(nt / 2, k->nr);
        else if (mt >= 2 * k->mr) mt = round_up(mt / 2, k->mr);
        else if (nt >= 2 * k->nr) nt = round_up(nt / 2, k->nr);
        else break;
    }
    gemm_job g = {
        .k = k, .trans_a = trans_a, .trans_b = trans_b, .M = M, .N = N, .K = K, .alpha = alpha,
        .beta = beta, .A = A, .B = B, .lda = lda, .ldb = ldb, .ldc = ldc, .C = C, .bias = bias,
        .relu = relu, .mt = mt, .nt = nt, .kc = min64(k->kc, K),
    };
    g.tiles_n = (N + nt - 1) / nt;
    g.n_tiles = ((M + mt - 1) / mt) * g.tiles_n;
    g.a_floats = round_up(round_up(mt, k->mr) * g.kc, ALIGN / (int64_t)sizeof(float));
    g.slot_floats = g.a_floats + round_up(round_up(nt, k->nr) * g.kc, ALIGN / (int64_t)sizeof(float));
    int64_t slots = min64(threads, g.n_tiles);
    void *raw = malloc((size_t)(slots * g.slot_floats) * sizeof(float) + ALIGN);
    if (!raw) return KILN_ERR_NOMEM;
    g.work = (float *)(((uintptr_t)raw + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1));
    atomic_init(&g.next_tile, 0);
    kiln_threadpool_parallel_for(pool, slots, run_slots, &g);
    free(raw);
    return KILN_OK;
}

kiln_status kiln_sgemm(kiln_threadpool *pool, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc)
{
    kiln_gemm_ctx ctx = {.pool = pool, .level = KILN_GEMM_LEVEL_AUTO};
    return kiln_sgemm_ex(&ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}
