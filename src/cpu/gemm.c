/* gemm.c - the sgemm driver: argument checks, CPU dispatch, cache blocking, packing and the
 * split of C into tiles run on a thread pool (BLIS-style loops around a level's micro-kernel). */
#include "cpu/gemm.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/pages.h"
#include "core/scratch.h"
#include "cpu/gemm_internal.h"

enum {
    ALIGN = 64,                  /* bytes, of each packing buffer */
    PA_TILE_FLOATS = 200 * 1024, /* of a prepacked A depth block one tile reads (800 KB: in L2) */
};

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
    const float *packed_b; /* prepacked op(B) (kiln_gemm_packed_b) or NULL: pack per tile */
    const float *packed_a; /* prepacked A (kiln_gemm_packed_a) or NULL: pack per tile */
    int64_t m_pad;         /* M rounded up to MR: column length of a prepacked A depth block */
    int64_t n_pad;         /* N rounded up to NR: row length of a prepacked depth block */
    int64_t lda, ldb, ldc;
    float *C;
    kiln_gemm_kepi epi;  /* the whole matrix's: col_bias [N], row_bias [M] */
    bool has_epi;
    kiln_gemm_pack_fn pack_b; /* implicit op(B), or NULL */
    void *pack_ctx;
    bool b_panels;            /* pack_b called per micro-panel (kiln_gemm_ctx.pack_b_panels) */
    kiln_gemm_tile_fn tile;     /* caller's epilogue, or NULL */
    void *tile_ctx;
    int64_t kc;          /* depth block */
    int64_t pm, pn;      /* micro-panels across M (of MR rows) and N (of NR columns) */
    int64_t tiles_m, tiles_n, n_tiles; /* tile i spans panels [i*pm/tiles_m, (i+1)*pm/tiles_m) */
    float *work;         /* [slots][slot_floats], 64-byte aligned */
    int64_t slot_floats; /* packed A (tile rows x kc) then packed B (kc x tile columns), each 64-byte aligned */
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
        const float *b_tile = Bp;
        if (g->packed_b) b_tile = g->packed_b + p0 * g->n_pad + j0 * kc; /* j0 is a multiple of NR */
        else if (g->pack_b && !g->b_panels) g->pack_b(g->pack_ctx, Bp, p0, kc, j0, n, k->nr);
        else if (!g->pack_b) k->pack_b(Bp, g->B, g->ldb, g->trans_b, p0, kc, j0, n);
        const float *a_tile = Ap;
        if (g->packed_a) a_tile = g->packed_a + p0 * g->m_pad + i0 * kc; /* i0 is a multiple of MR */
        else k->pack_a(Ap, g->A, g->lda, g->trans_a, i0, m, p0, kc, g->alpha);
        for (int64_t jr = 0; jr < n; jr += k->nr) {
            int nr = (int)min64(k->nr, n - jr);
            kiln_gemm_kepi e = g->epi;
            if (e.col_bias) e.col_bias += j0 + jr;
            const float *b = b_tile + jr * kc;
            if (g->b_panels) g->pack_b(g->pack_ctx, Bp, p0, kc, j0 + jr, nr, k->nr), b = Bp;
            int mr;
            for (int64_t ir = 0; ir < m; ir += mr) {
                /* the last rows in one call where the kernel takes them (M = 16: 14 + 2) */
                mr = (int)(m - ir <= k->mr_max ? m - ir : min64(k->mr, m - ir));
                float *c = g->C + (i0 + ir) * g->ldc + j0 + jr;
                if (e.row_bias) e.row_bias = g->epi.row_bias + i0 + ir;
                if (e.res) e.res = g->epi.res + (i0 + ir) * e.ldr + j0 + jr;
                k->kernel(kc, a_tile + ir * kc, b, c, g->ldc, mr, nr, beta, last && g->has_epi ? &e : NULL);
                if (last && g->tile) g->tile(g->tile_ctx, c, g->ldc, i0 + ir, mr, j0 + jr, nr);
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
        int64_t ti = t / g->tiles_n, tj = t % g->tiles_n;
        int64_t i0 = ti * g->pm / g->tiles_m * g->k->mr, i1 = min64(g->M, (ti + 1) * g->pm / g->tiles_m * g->k->mr);
        int64_t j0 = tj * g->pn / g->tiles_n * g->k->nr, j1 = min64(g->N, (tj + 1) * g->pn / g->tiles_n * g->k->nr);
        run_tile(g, Ap, Bp, i0, i1 - i0, j0, j1 - j0);
    }
}

/* C = beta*C, then the epilogue: alpha == 0 or K == 0. */
static void scale_only(int64_t M, int64_t N, float beta, float *C, int64_t ldc, const kiln_gemm_kepi *e)
{
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        for (int64_t j = 0; j < N; j++) {
            float v = beta == 0.0f ? 0.0f : beta * c[j];
            if (e->col_bias) v += e->col_bias[j];
            if (e->row_bias) v += e->row_bias[i];
            if (e->res) v += e->res[i * e->ldr + j];
            if (e->clamp) { /* NaN stays NaN */
                v = v < e->lo ? e->lo : v;
                v = v > e->hi ? e->hi : v;
            }
            c[j] = v;
        }
    }
}

/* The kernels' epilogue of the whole matrix for ep (NULL: none); false for an unknown act. */
static bool epi_of(const kiln_gemm_epilogue *ep, kiln_gemm_kepi *e)
{
    *e = (kiln_gemm_kepi){0};
    if (!ep) return true;
    e->col_bias = ep->bias;
    e->row_bias = ep->row_bias;
    e->res = ep->residual;
    e->ldr = ep->ldr;
    switch (ep->act) {
    case KILN_GEMM_ACT_NONE: return true;
    case KILN_GEMM_ACT_RELU: e->lo = 0.0f, e->hi = INFINITY, e->clamp = true; return true;
    case KILN_GEMM_ACT_CLIP: e->lo = ep->lo, e->hi = ep->hi, e->clamp = true; return true;
    default: return false;
    }
}

/* The common start of a call with beta 0: checks C and the epilogue into *epi; *done when
 * there is nothing to multiply (C is then the epilogue of zeros). */
static kiln_status start_beta0(int64_t M, int64_t N, int64_t K, float *C, int64_t ldc, const kiln_gemm_epilogue *ep,
                               kiln_gemm_kepi *epi, bool *done)
{
    *done = M == 0 || N == 0;
    if (*done) return KILN_OK;
    if (!C || ldc < N || !epi_of(ep, epi)) return KILN_ERR_INVALID_ARG;
    *done = K == 0;
    if (*done) {
        scale_only(M, N, 0.0f, C, ldc, epi);
        if (ep && ep->tile) ep->tile(ep->tile_ctx, C, ldc, 0, M, 0, N);
    }
    return KILN_OK;
}

/* Prepacked op(B) [K, N]: for each depth block p0 (KC deep, the last one shorter), the NR-column
 * micro-panels of all of N, each [kc][NR]: block p0 starts at p0 * n_pad. */
struct kiln_gemm_packed_b {
    kiln_gemm_level level; /* the kernels it was packed for */
    bool trans_b;          /* packed from B [N, K] (else [K, N]) */
    int64_t K, N, n_pad;
    float *data; /* [K][n_pad] in the layout above, 64-byte aligned */
    void *raw;
};

/* Prepacked A [M, K]: for each depth block p0 (KC deep, the last one shorter), the MR-row
 * micro-panels of all of M, each [kc][MR]: block p0 starts at p0 * m_pad. */
struct kiln_gemm_packed_a {
    kiln_gemm_level level; /* the kernels it was packed for */
    int64_t M, K, m_pad;
    float *data; /* [K][m_pad] in the layout above, 64-byte aligned */
    void *raw;
    kiln_scratch *scratch; /* where raw came from (kiln_gemm_packed_a_create_from), or NULL: malloc */
};

/* An unfilled packed A [M, K] for the kernels of level, its data from scratch when given. */
static kiln_status packed_a_new(kiln_gemm_level level, kiln_scratch *scratch, int64_t M, int64_t K,
                                kiln_gemm_packed_a **out)
{
    const kiln_gemm_kernel *k = kernel_for(level);
    kiln_gemm_packed_a *pa = calloc(1, sizeof *pa);
    if (!pa) return KILN_ERR_NOMEM;
    pa->level = level;
    pa->M = M;
    pa->K = K;
    pa->m_pad = round_up(M, k->mr);
    pa->scratch = scratch;
    size_t bytes = (size_t)(K * pa->m_pad) * sizeof(float) + ALIGN;
    if ((uint64_t)K * (uint64_t)pa->m_pad > (SIZE_MAX - ALIGN) / sizeof(float) ||
        !(pa->raw = scratch ? kiln_scratch_get(scratch, bytes) : kiln_pages_alloc(bytes))) {
        free(pa);
        return KILN_ERR_NOMEM;
    }
    pa->data = (float *)(((uintptr_t)pa->raw + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1));
    *out = pa;
    return KILN_OK;
}

/* What A is packed from: a pack function, or a stored op(A) scaled by alpha. */
typedef struct a_source {
    kiln_gemm_pack_fn pack;
    void *pack_ctx;
    const float *A;
    int64_t lda;
    bool trans;
    float alpha;
} a_source;

/* One K block of a whole packed A: chunks of MR-row panels. */
typedef struct pack_a_job {
    const kiln_gemm_kernel *k;
    const a_source *src;
    float *dst; /* the block: panel i at dst + i * kc * MR */
    int64_t p0, kc, M, per_chunk;
} pack_a_job;

static void pack_a_chunks(void *ctx, int64_t begin, int64_t end)
{
    const pack_a_job *j = ctx;
    int64_t mr = j->k->mr, i0 = begin * j->per_chunk * mr, i1 = min64(j->M, end * j->per_chunk * mr);
    if (i1 <= i0) return;
    if (j->src->pack) j->src->pack(j->src->pack_ctx, j->dst + i0 * j->kc, j->p0, j->kc, i0, i1 - i0, (int)mr);
    else j->k->pack_a(j->dst + i0 * j->kc, j->src->A, j->src->lda, j->src->trans, i0, i1 - i0, j->p0, j->kc,
                      j->src->alpha);
}

/* Fills pa (packed_a_new's, for k) from src, the panels of each K block spread over the pool. */
static void pack_a_whole(const kiln_gemm_kernel *k, kiln_threadpool *pool, const a_source *src, kiln_gemm_packed_a *pa)
{
    int64_t panels = pa->m_pad / k->mr, chunks = min64(panels, 8 * (int64_t)kiln_threadpool_size(pool));
    for (int64_t p0 = 0; p0 < pa->K && pa->M > 0; p0 += k->kc) {
        pack_a_job j = {k, src, pa->data + p0 * pa->m_pad, p0, min64(k->kc, pa->K - p0), pa->M,
                        (panels + chunks - 1) / chunks};
        kiln_threadpool_parallel_for(pool, (panels + j.per_chunk - 1) / j.per_chunk, pack_a_chunks, &j);
    }
}

/* The checked arguments of one call, run on the pool: tiles of C over the threads. */
static kiln_status gemm_run(const kiln_gemm_kernel *k, const kiln_gemm_ctx *ctx, bool trans_a, bool trans_b,
                            int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                            const float *B, int64_t ldb, const kiln_gemm_packed_b *packed, float beta, float *C,
                            int64_t ldc, const kiln_gemm_kepi *epi, const kiln_gemm_epilogue *ep,
                            kiln_gemm_pack_fn pack_b, void *pack_ctx, const kiln_gemm_packed_a *pa)
{
    kiln_threadpool *pool = ctx ? ctx->pool : NULL;
    kiln_scratch *scratch = ctx ? ctx->scratch : NULL;
    /* under about 256K multiply-adds (a few microseconds on one core) the pool costs more than it
     * saves, and a worker that answers late doubles the call: the TTS-like encoder at 16 tokens
     * 0.91 of its time on two threads, at 128 tokens 0.99; from 512K, slower at 128 tokens */
    if ((double)M * (double)N * (double)K < (double)(1 << 18)) pool = NULL;
    int threads = kiln_threadpool_size(pool);

    /* Tiles of C, of whole micro-panels and balanced to within one panel: at most MC x NC each,
     * then split until every thread has two (and their count is a multiple of the threads). Each
     * tile packs its rows of A and its columns of B, so more column tiles repack A (tiles_n * M *
     * K floats in all) and more row tiles repack B (tiles_m * K * N; a prepacked operand is read
     * again instead): split the side that adds less traffic. */
    int64_t pm = (M + k->mr - 1) / k->mr, pn = (N + k->nr - 1) / k->nr;
    /* row panels per tile: a prepacked A is read in place, not packed per tile, so taller tiles
     * (up to 4 MC, and PA_TILE_FLOATS of a depth block: still within L2) pack each block of B
     * for fewer of them */
    int64_t mcp = (pa ? min64(4 * k->mc, PA_TILE_FLOATS / k->kc) : k->mc) / k->mr;
    if (mcp < 1) mcp = 1;
    int64_t tm = (pm + mcp - 1) / mcp, tn = (pn + k->nc / k->nr - 1) / (k->nc / k->nr);
    int64_t want = threads > 1 ? 2 * (int64_t)threads : 1;
    for (int grow = 0; grow < 64; grow++) {
        if (tm * tn >= want && (tm * tn) % threads == 0) break;
        int64_t step_m = tm * tn >= want ? 1 : tm, step_n = tm * tn >= want ? 1 : tn; /* then round up */
        bool can_m = tm + step_m <= pm, can_n = tn + step_n <= pn;
        /* an extra tile across N packs its rows of A again, or re-reads them when A is prepacked
         * (from memory: a layer's weights rarely stay in cache), at about half the cost; the same
         * for B across M */
        double cost_n = (pa ? 0.5 : 1.0) * (double)step_n * (double)M;
        double cost_m = (packed ? 0.5 : 1.0) * (double)step_m * (double)N;
        if (can_n && (!can_m || cost_n < cost_m)) tn += step_n;
        else if (can_m) tm += step_m;
        else break;
    }
    /* every column tile would pack the same rows of A again: pack them once, in parallel */
    kiln_gemm_packed_a *own_a = NULL;
    if (!pa && !pack_b && packed && tn > 1) {
        KILN_TRY(packed_a_new(packed->level, scratch, M, K, &own_a));
        a_source src = {.A = A, .lda = lda, .trans = trans_a, .alpha = alpha};
        pack_a_whole(k, pool, &src, own_a);
        pa = own_a;
    }
    gemm_job g = {
        .k = k, .trans_a = trans_a, .trans_b = trans_b, .M = M, .N = N, .K = K, .alpha = alpha,
        .beta = beta, .A = A, .B = B, .packed_b = packed ? packed->data : NULL,
        .n_pad = packed ? packed->n_pad : 0, .packed_a = pa ? pa->data : NULL, .m_pad = pa ? pa->m_pad : 0,
        .lda = lda, .ldb = ldb, .ldc = ldc, .C = C, .epi = *epi,
        .has_epi = epi->col_bias || epi->row_bias || epi->res || epi->clamp, .pack_b = pack_b, .pack_ctx = pack_ctx,
        .b_panels = pack_b && ctx && ctx->pack_b_panels,
        .tile = ep ? ep->tile : NULL,
        .tile_ctx = ep ? ep->tile_ctx : NULL, .kc = min64(k->kc, K), .pm = pm, .pn = pn, .tiles_m = tm, .tiles_n = tn, .n_tiles = tm * tn,
    };
    int64_t mt = (pm + tm - 1) / tm * k->mr, nt = (pn + tn - 1) / tn * k->nr; /* the largest tile */
    g.a_floats = pa ? 0 : round_up(mt * g.kc, ALIGN / (int64_t)sizeof(float));
    g.slot_floats = g.a_floats;
    if (!packed) g.slot_floats += round_up((g.b_panels ? k->nr : nt) * g.kc, ALIGN / (int64_t)sizeof(float));
    int64_t slots = min64(threads, g.n_tiles);
    /* 64-byte aligned; one float when both operands are prepacked */
    g.work = kiln_scratch_get(scratch, (size_t)(slots * g.slot_floats + 1) * sizeof(float));
    if (g.work) {
        atomic_init(&g.next_tile, 0);
        kiln_threadpool_parallel_for(pool, slots, run_slots, &g);
        kiln_scratch_put(scratch, g.work);
    }
    kiln_gemm_packed_a_free(own_a);
    return g.work ? KILN_OK : KILN_ERR_NOMEM;
}

/* Resolves ctx's level (AUTO: the best; a forced one must be supported). */
static kiln_status resolve_level(const kiln_gemm_ctx *ctx, kiln_gemm_level *level)
{
    *level = ctx ? ctx->level : KILN_GEMM_LEVEL_AUTO;
    if (!kiln_gemm_level_supported(*level)) return KILN_ERR_INVALID_ARG;
    if (*level == KILN_GEMM_LEVEL_AUTO) *level = kiln_gemm_level_detect();
    return KILN_OK;
}

kiln_status kiln_sgemm_ex(const kiln_gemm_ctx *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N,
                          int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                          int64_t ldb, float beta, float *C, int64_t ldc, const kiln_gemm_epilogue *ep)
{
    if (M < 0 || N < 0 || K < 0) return KILN_ERR_INVALID_ARG;
    kiln_gemm_level level;
    if (resolve_level(ctx, &level) != KILN_OK) return KILN_ERR_INVALID_ARG;
    if (M == 0 || N == 0) return KILN_OK;
    if (!C || ldc < N) return KILN_ERR_INVALID_ARG;
    kiln_gemm_kepi epi;
    if (!epi_of(ep, &epi)) return KILN_ERR_INVALID_ARG;
    if (K == 0 || alpha == 0.0f) {
        scale_only(M, N, beta, C, ldc, &epi);
        if (ep && ep->tile) ep->tile(ep->tile_ctx, C, ldc, 0, M, 0, N);
        return KILN_OK;
    }
    if (!A || !B || lda < (trans_a ? M : K) || ldb < (trans_b ? K : N)) return KILN_ERR_INVALID_ARG;
    return gemm_run(kernel_for(level), ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb,
                    NULL, beta, C, ldc, &epi, ep, NULL, NULL, NULL);
}

kiln_status kiln_gemm_packed_b_create(const kiln_gemm_ctx *ctx, bool trans_b, int64_t K, int64_t N,
                                      const float *B, int64_t ldb, kiln_gemm_packed_b **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (K < 0 || N < 0 || (K > 0 && N > 0 && (!B || ldb < (trans_b ? K : N)))) return KILN_ERR_INVALID_ARG;
    kiln_gemm_level level;
    if (resolve_level(ctx, &level) != KILN_OK) return KILN_ERR_INVALID_ARG;
    const kiln_gemm_kernel *k = kernel_for(level);
    kiln_gemm_packed_b *pb = calloc(1, sizeof *pb);
    if (!pb) return KILN_ERR_NOMEM;
    pb->level = level;
    pb->trans_b = trans_b;
    pb->K = K;
    pb->N = N;
    pb->n_pad = round_up(N, k->nr);
    if ((uint64_t)K * (uint64_t)pb->n_pad > (SIZE_MAX - ALIGN) / sizeof(float)) goto fail_pb;
    pb->raw = kiln_pages_alloc((size_t)(K * pb->n_pad) * sizeof(float) + ALIGN);
    if (!pb->raw) goto fail_pb;
    pb->data = (float *)(((uintptr_t)pb->raw + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1));
    for (int64_t p0 = 0; p0 < K; p0 += k->kc) {
        int64_t kc = min64(k->kc, K - p0);
        if (N > 0) k->pack_b(pb->data + p0 * pb->n_pad, B, ldb, trans_b, p0, kc, 0, N);
    }
    *out = pb;
    return KILN_OK;

fail_pb:
    free(pb);
    return KILN_ERR_NOMEM;
}

void kiln_gemm_packed_b_free(kiln_gemm_packed_b *pb)
{
    if (!pb) return;
    free(pb->raw);
    free(pb);
}

void kiln_gemm_packed_b_unpack(const kiln_gemm_packed_b *pb, float *B)
{
    const kiln_gemm_kernel *k = kernel_for(pb->level);
    int64_t nr = k->nr;
    for (int64_t p0 = 0; p0 < pb->K; p0 += k->kc) {
        int64_t kc = min64(k->kc, pb->K - p0);
        const float *blk = pb->data + p0 * pb->n_pad;
        for (int64_t p = 0; p < kc; p++)
            for (int64_t j = 0; j < pb->N; j++) {
                float v = blk[(j / nr) * kc * nr + p * nr + j % nr];
                if (pb->trans_b) B[j * pb->K + p0 + p] = v;
                else B[(p0 + p) * pb->N + j] = v;
            }
    }
}

size_t kiln_gemm_packed_b_bytes(const kiln_gemm_packed_b *pb)
{
    return pb ? (size_t)(pb->K * pb->n_pad) * sizeof(float) : 0;
}

kiln_status kiln_sgemm_packed(const kiln_gemm_ctx *ctx, bool trans_a, int64_t M, float alpha, const float *A,
                              int64_t lda, const kiln_gemm_packed_b *B, float beta, float *C, int64_t ldc,
                              const kiln_gemm_epilogue *ep)
{
    if (!B || M < 0) return KILN_ERR_INVALID_ARG;
    kiln_gemm_level level;
    if (resolve_level(ctx, &level) != KILN_OK) return KILN_ERR_INVALID_ARG;
    if (ctx && ctx->level != KILN_GEMM_LEVEL_AUTO && ctx->level != B->level) return KILN_ERR_INVALID_ARG;
    int64_t N = B->N, K = B->K;
    if (M == 0 || N == 0) return KILN_OK;
    if (!C || ldc < N) return KILN_ERR_INVALID_ARG;
    kiln_gemm_kepi epi;
    if (!epi_of(ep, &epi)) return KILN_ERR_INVALID_ARG;
    if (K == 0 || alpha == 0.0f) {
        scale_only(M, N, beta, C, ldc, &epi);
        if (ep && ep->tile) ep->tile(ep->tile_ctx, C, ldc, 0, M, 0, N);
        return KILN_OK;
    }
    if (!A || lda < (trans_a ? M : K)) return KILN_ERR_INVALID_ARG;
    return gemm_run(kernel_for(B->level), ctx, trans_a, false, M, N, K, alpha, A, lda, NULL, 0,
                    B, beta, C, ldc, &epi, ep, NULL, NULL, NULL);
}

kiln_status kiln_sgemm_implicit_b(const kiln_gemm_ctx *ctx, int64_t M, int64_t N, int64_t K, const float *A,
                                  int64_t lda, kiln_gemm_pack_fn pack_b, void *pack_ctx, float *C, int64_t ldc,
                                  const kiln_gemm_epilogue *ep)
{
    if (M < 0 || N < 0 || K < 0 || !pack_b) return KILN_ERR_INVALID_ARG;
    kiln_gemm_level level;
    if (resolve_level(ctx, &level) != KILN_OK) return KILN_ERR_INVALID_ARG;
    kiln_gemm_kepi epi;
    bool done;
    KILN_TRY(start_beta0(M, N, K, C, ldc, ep, &epi, &done));
    if (done) return KILN_OK;
    if (!A || lda < K) return KILN_ERR_INVALID_ARG;
    return gemm_run(kernel_for(level), ctx, false, false, M, N, K, 1.0f, A, lda, NULL, 0, NULL,
                    0.0f, C, ldc, &epi, ep, pack_b, pack_ctx, NULL);
}

kiln_status kiln_sgemm(kiln_threadpool *pool, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc)
{
    kiln_gemm_ctx ctx = {.pool = pool, .level = KILN_GEMM_LEVEL_AUTO};
    return kiln_sgemm_ex(&ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

kiln_status kiln_gemm_packed_a_create(const kiln_gemm_ctx *ctx, int64_t M, int64_t K, const float *A, int64_t lda,
                                      kiln_gemm_packed_a **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (M < 0 || K < 0 || (M > 0 && K > 0 && (!A || lda < K))) return KILN_ERR_INVALID_ARG;
    kiln_gemm_level level;
    if (resolve_level(ctx, &level) != KILN_OK) return KILN_ERR_INVALID_ARG;
    kiln_gemm_packed_a *pa;
    KILN_TRY(packed_a_new(level, NULL, M, K, &pa));
    const kiln_gemm_kernel *k = kernel_for(pa->level);
    for (int64_t p0 = 0; p0 < K && M > 0; p0 += k->kc)
        k->pack_a(pa->data + p0 * pa->m_pad, A, lda, false, 0, M, p0, min64(k->kc, K - p0), 1.0f);
    *out = pa;
    return KILN_OK;
}

void kiln_gemm_packed_a_free(kiln_gemm_packed_a *pa)
{
    if (!pa) return;
    if (pa->scratch) kiln_scratch_put(pa->scratch, pa->raw);
    else free(pa->raw);
    free(pa);
}

void kiln_gemm_packed_a_unpack(const kiln_gemm_packed_a *pa, float *A)
{
    const kiln_gemm_kernel *k = kernel_for(pa->level);
    int64_t mr = k->mr;
    for (int64_t p0 = 0; p0 < pa->K; p0 += k->kc) {
        int64_t kc = min64(k->kc, pa->K - p0);
        const float *blk = pa->data + p0 * pa->m_pad;
        for (int64_t i = 0; i < pa->M; i++)
            for (int64_t p = 0; p < kc; p++) A[i * pa->K + p0 + p] = blk[(i / mr) * kc * mr + p * mr + i % mr];
    }
}

kiln_status kiln_sgemm_packed_a(const kiln_gemm_ctx *ctx, const kiln_gemm_packed_a *A, int64_t N, const float *B,
                                int64_t ldb, kiln_gemm_pack_fn pack_b, void *pack_ctx, float *C, int64_t ldc,
                                const kiln_gemm_epilogue *ep)
{
    if (!A || N < 0 || (!B && !pack_b)) return KILN_ERR_INVALID_ARG;
    kiln_gemm_level level;
    if (resolve_level(ctx, &level) != KILN_OK) return KILN_ERR_INVALID_ARG;
    if (ctx && ctx->level != KILN_GEMM_LEVEL_AUTO && ctx->level != A->level) return KILN_ERR_INVALID_ARG;
    int64_t M = A->M, K = A->K;
    if (M == 0 || N == 0) return KILN_OK;
    if (!C || ldc < N || (!pack_b && ldb < N)) return KILN_ERR_INVALID_ARG;
    kiln_gemm_kepi epi;
    if (!epi_of(ep, &epi)) return KILN_ERR_INVALID_ARG;
    if (K == 0) {
        scale_only(M, N, 0.0f, C, ldc, &epi);
        if (ep && ep->tile) ep->tile(ep->tile_ctx, C, ldc, 0, M, 0, N);
        return KILN_OK;
    }
    return gemm_run(kernel_for(A->level), ctx, false, false, M, N, K, 1.0f, NULL, K, B, ldb, NULL,
                    0.0f, C, ldc, &epi, ep, pack_b, pack_ctx, A);
}

kiln_status kiln_gemm_packed_a_create_from(const kiln_gemm_ctx *ctx, int64_t M, int64_t K, kiln_gemm_pack_fn pack,
                                           void *pack_ctx, kiln_gemm_packed_a **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (M < 0 || K < 0 || !pack) return KILN_ERR_INVALID_ARG;
    kiln_gemm_level level;
    if (resolve_level(ctx, &level) != KILN_OK) return KILN_ERR_INVALID_ARG;
    kiln_gemm_packed_a *pa;
    KILN_TRY(packed_a_new(level, ctx ? ctx->scratch : NULL, M, K, &pa));
    a_source src = {.pack = pack, .pack_ctx = pack_ctx};
    pack_a_whole(kernel_for(pa->level), ctx ? ctx->pool : NULL, &src, pa);
    *out = pa;
    return KILN_OK;
}

kiln_status kiln_sgemm_packed_ab(const kiln_gemm_ctx *ctx, const kiln_gemm_packed_a *A, const kiln_gemm_packed_b *B,
                                 float *C, int64_t ldc, const kiln_gemm_epilogue *ep)
{
    if (!A || !B || A->K != B->K || A->level != B->level) return KILN_ERR_INVALID_ARG;
    if (ctx && ctx->level != KILN_GEMM_LEVEL_AUTO && ctx->level != A->level) return KILN_ERR_INVALID_ARG;
    int64_t M = A->M, N = B->N, K = A->K;
    kiln_gemm_kepi epi;
    bool done;
    KILN_TRY(start_beta0(M, N, K, C, ldc, ep, &epi, &done));
    if (done) return KILN_OK;
    return gemm_run(kernel_for(A->level), ctx, false, false, M, N, K, 1.0f, NULL, K, NULL, 0, B,
                    0.0f, C, ldc, &epi, ep, NULL, NULL, A);
}
