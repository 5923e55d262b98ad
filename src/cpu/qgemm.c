/* qgemm.c - the int8 GEMM driver: argument checks, CPU dispatch, packing of A (per call) and B
 * (per call or once), zero-point corrections and the split of C into tiles run on a thread pool
 * around a level's micro-kernel (qgemm_*.c). */
#include "cpu/qgemm.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "core/pages.h"
#include "core/scratch.h"
#include "cpu/qgemm_internal.h"

enum {
    ALIGN = 64,                /* bytes, of each packing buffer */
    TILE_A_BYTES = 256 * 1024, /* packed A rows one tile reads per panel of B (in L2) */
    TILE_PANELS = 8,           /* panels of B per tile at most */
};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* AVX-VNNI (CPUID leaf 7 subleaf 1, EAX bit 4), read directly: clang before 15 has no
 * "avxvnni" for __builtin_cpu_supports. The AVX state the OS saves is checked with avx2. */
static bool has_avxvnni(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
}
#endif

kiln_qgemm_level kiln_qgemm_level_detect(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni")) return KILN_QGEMM_LEVEL_AVX512VNNI;
    if (__builtin_cpu_supports("avx2") && has_avxvnni()) return KILN_QGEMM_LEVEL_AVXVNNI;
    if (__builtin_cpu_supports("avx2")) return KILN_QGEMM_LEVEL_AVX2;
#endif
    return KILN_QGEMM_LEVEL_BASELINE;
}

bool kiln_qgemm_level_supported(kiln_qgemm_level level)
{
    switch (level) {
    case KILN_QGEMM_LEVEL_AUTO:
    case KILN_QGEMM_LEVEL_BASELINE: return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case KILN_QGEMM_LEVEL_AVX2: __builtin_cpu_init(); return __builtin_cpu_supports("avx2");
    case KILN_QGEMM_LEVEL_AVXVNNI:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && has_avxvnni();
    case KILN_QGEMM_LEVEL_AVX512VNNI:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
#endif
    default: return false;
    }
}

const char *kiln_qgemm_level_name(kiln_qgemm_level level)
{
    switch (level) {
    case KILN_QGEMM_LEVEL_AUTO: return "auto";
    case KILN_QGEMM_LEVEL_BASELINE: return "baseline";
    case KILN_QGEMM_LEVEL_AVX2: return "avx2";
    case KILN_QGEMM_LEVEL_AVXVNNI: return "avxvnni";
    case KILN_QGEMM_LEVEL_AVX512VNNI: return "avx512vnni";
    default: return "?";
    }
}

static const kiln_qgemm_kernel *kernel_for(kiln_qgemm_level level)
{
#if defined(__x86_64__)
    if (level == KILN_QGEMM_LEVEL_AVX512VNNI) return &kiln_qgemm_kernel_avx512vnni;
    if (level == KILN_QGEMM_LEVEL_AVXVNNI) return &kiln_qgemm_kernel_avxvnni;
    if (level == KILN_QGEMM_LEVEL_AVX2) return &kiln_qgemm_kernel_avx2;
#endif
    return &kiln_qgemm_kernel_baseline;
}

static kiln_status resolve_level(const kiln_qgemm_ctx *ctx, kiln_qgemm_level *level)
{
    *level = ctx ? ctx->level : KILN_QGEMM_LEVEL_AUTO;
    if (!kiln_qgemm_level_supported(*level)) return KILN_ERR_INVALID_ARG;
    if (*level == KILN_QGEMM_LEVEL_AUTO) *level = kiln_qgemm_level_detect();
    return KILN_OK;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static void *align_up(void *p) { return (void *)(((uintptr_t)p + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1)); }

/* Packs columns [j0, j0+n) of B (all K depths) as one panel at dst (see qgemm_internal.h) and
 * the sums of its stored values into colsum[0..NR) (zero past n). */
static void pack_b_panel(const kiln_qgemm_kernel *k, void *dst, const uint8_t *B, int64_t ldb, bool b_signed,
                         int64_t K, int64_t j0, int64_t n, int32_t *colsum)
{
    int nr = k->nr, kg = k->kg;
    if (k->pack_b) {
        k->pack_b(dst, B, ldb, b_signed, K, j0, (int)n, colsum);
        return;
    }
    int64_t groups = (K + kg - 1) / kg;
    uint8_t flip = b_signed ? 0 : 0x80;
    for (int c = 0; c < nr; c++) colsum[c] = 0;
    for (int64_t g = 0; g < groups; g++)
        for (int c = 0; c < nr; c++)
            for (int t = 0; t < kg; t++) {
                int64_t kk = g * kg + t, e = (g * nr + c) * kg + t;
                int8_t v = kk < K && c < n ? (int8_t)(B[kk * ldb + j0 + c] ^ flip) : 0;
                colsum[c] += v;
                if (k->esize == 1) ((int8_t *)dst)[e] = v;
                else ((int16_t *)dst)[e] = v;
            }
}

/* Packs rows [i0, i0+m) of A into rows of Kp elements at dst (stride Kp * esize bytes), rows up
 * to `rows` zero, and their sums into rs[0..rows). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3"))) /* the copy-and-sum loops vectorised (-O2 leaves them scalar) */
#endif
static void pack_a_rows(const kiln_qgemm_kernel *k, void *dst, const uint8_t *A, int64_t lda, bool a_signed,
                        int64_t K, int64_t Kp, int64_t i0, int64_t m, int64_t rows, int32_t *rs)
{
    uint8_t flip = a_signed ? 0x80 : 0;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *src = A + (i0 + r) * lda;
        int32_t s = 0;
        if (k->esize == 1) {
            uint8_t *d = (uint8_t *)dst + r * Kp;
            if (r < m) {
                for (int64_t p = 0; p < K; p++) {
                    uint8_t v = src[p] ^ flip;
                    d[p] = v;
                    s += v;
                }
                memset(d + K, 0, (size_t)(Kp - K));
            } else {
                memset(d, 0, (size_t)Kp);
            }
        } else {
            int16_t *d = (int16_t *)dst + r * Kp;
            int64_t p = 0;
            if (r < m)
                for (; p < K; p++) {
                    uint8_t v = src[p] ^ flip;
                    d[p] = v;
                    s += v;
                }
            for (; p < Kp; p++) d[p] = 0;
        }
        rs[r] = s;
    }
}

struct kiln_qgemm_packed_b {
    kiln_qgemm_level level;
    bool b_signed;
    int64_t K, N, Kp, n_pad;
    int64_t panel_bytes; /* Kp * NR * esize */
    uint8_t *data;       /* panel p at data + p * panel_bytes, 64-byte aligned */
    int32_t *colsum;     /* [n_pad] sums of the stored (signed) values per column */
    void *raw;
    /* zero points bound by kiln_qgemm_packed_b_bind_zp, or NULL: a copy of them (zp, n_zp), and
     * the kernels' per-column terms kiln_qgemm derives from them (zb, cs: [n_pad] each) */
    int32_t *zp, *zb, *cs;
    int64_t n_zp;
};

/* The sizes of a packed B for kernel k; false on overflow. */
static bool packed_b_sizes(const kiln_qgemm_kernel *k, int64_t K, int64_t N, int64_t *Kp, int64_t *n_pad,
                           int64_t *panel_bytes, size_t *total)
{
    *Kp = round_up(K, k->kg);
    *n_pad = round_up(N, k->nr);
    if ((uint64_t)*Kp > (uint64_t)INT64_MAX / 64 / (uint64_t)k->nr) return false;
    *panel_bytes = *Kp * k->nr * k->esize;
    uint64_t panels = (uint64_t)(*n_pad / k->nr);
    if (panels && (uint64_t)*panel_bytes > (SIZE_MAX / 2) / panels) return false;
    *total = (size_t)panels * (size_t)*panel_bytes + (size_t)*n_pad * sizeof(int32_t) + 2 * ALIGN;
    return true;
}

kiln_status kiln_qgemm_packed_b_create(const kiln_qgemm_ctx *ctx, int64_t K, int64_t N, const void *B, int64_t ldb,
                                       bool b_signed, kiln_qgemm_packed_b **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (K < 0 || N < 0 || (K > 0 && N > 0 && (!B || ldb < N))) return KILN_ERR_INVALID_ARG;
    kiln_qgemm_level level;
    if (resolve_level(ctx, &level)) return KILN_ERR_INVALID_ARG;
    const kiln_qgemm_kernel *k = kernel_for(level);
    kiln_qgemm_packed_b *pb = calloc(1, sizeof *pb);
    if (!pb) return KILN_ERR_NOMEM;
    size_t total;
    if (!packed_b_sizes(k, K, N, &pb->Kp, &pb->n_pad, &pb->panel_bytes, &total) || !(pb->raw = kiln_pages_alloc(total))) {
        free(pb);
        return KILN_ERR_NOMEM;
    }
    pb->level = level;
    pb->b_signed = b_signed;
    pb->K = K;
    pb->N = N;
    pb->data = align_up(pb->raw);
    pb->colsum = align_up(pb->data + (size_t)(pb->n_pad / k->nr) * (size_t)pb->panel_bytes);
    for (int64_t j0 = 0; j0 < N; j0 += k->nr)
        pack_b_panel(k, pb->data + (j0 / k->nr) * pb->panel_bytes, B, ldb, b_signed, K, j0, min64(k->nr, N - j0),
                     pb->colsum + j0);
    *out = pb;
    return KILN_OK;
}

/* zb = the zero points as the kernels subtract them (per column, or the first for every column,
 * padding columns included; shifted by 128 for unsigned B), cs = colsum - K zb (wrapping). */
static void zero_terms(const int32_t *b_zp, int64_t n_bzp, bool b_signed, int64_t K, int64_t N, int64_t n_pad,
                       const int32_t *colsum, int32_t *zb, int32_t *cs)
{
    /* (two loops without a branch inside, as a step of a recurrent GEMV runs this for every call) */
    int32_t shift_b = b_signed ? 0 : 128, zb0 = (b_zp ? b_zp[0] : 0) - shift_b;
    int64_t c = 0;
    if (b_zp && n_bzp != 1)
        for (; c < N; c++) zb[c] = b_zp[c] - shift_b;
    for (; c < n_pad; c++) zb[c] = zb0;
    /* 4 lanes at a time (n_pad is a multiple of the panel width) */
    typedef uint32_t u32x4 __attribute__((vector_size(16)));
    for (c = 0; c + 4 <= n_pad; c += 4) {
        u32x4 sv, z;
        memcpy(&sv, colsum + c, sizeof sv);
        memcpy(&z, zb + c, sizeof z);
        sv -= (uint32_t)K * z;
        memcpy(cs + c, &sv, sizeof sv);
    }
    for (; c < n_pad; c++) cs[c] = (int32_t)((uint32_t)colsum[c] - (uint32_t)K * (uint32_t)zb[c]);
}

kiln_status kiln_qgemm_packed_b_bind_zp(kiln_qgemm_packed_b *pb, const int32_t *b_zp, int64_t n_bzp)
{
    if (!pb || (b_zp && n_bzp != 1 && n_bzp != pb->N) || (!b_zp && n_bzp)) return KILN_ERR_INVALID_ARG;
    int64_t n = b_zp ? n_bzp : 0;
    int32_t *buf = malloc((size_t)(n + 2 * pb->n_pad + 1) * sizeof *buf);
    if (!buf) return KILN_ERR_NOMEM;
    free(pb->zp);
    pb->zp = buf, pb->zb = buf + n, pb->cs = pb->zb + pb->n_pad, pb->n_zp = n;
    if (n) memcpy(pb->zp, b_zp, (size_t)n * sizeof *buf);
    zero_terms(n ? pb->zp : NULL, n, pb->b_signed, pb->K, pb->N, pb->n_pad, pb->colsum, pb->zb, pb->cs);
    return KILN_OK;
}

void kiln_qgemm_packed_b_free(kiln_qgemm_packed_b *pb)
{
    if (!pb) return;
    free(pb->raw);
    free(pb->zp);
    free(pb);
}

/* The stored (signed) value of B's element (kk, j) in pb, packed for kernel k. */
static int8_t packed_at(const kiln_qgemm_kernel *k, const kiln_qgemm_packed_b *pb, int64_t kk, int64_t j)
{
    const uint8_t *panel = pb->data + (j / k->nr) * pb->panel_bytes;
    int64_t e = ((kk / k->kg) * k->nr + j % k->nr) * k->kg + kk % k->kg;
    return k->esize == 1 ? ((const int8_t *)panel)[e] : (int8_t)((const int16_t *)panel)[e];
}

void kiln_qgemm_packed_b_unpack(const kiln_qgemm_packed_b *pb, void *B)
{
    const kiln_qgemm_kernel *k = kernel_for(pb->level);
    uint8_t flip = pb->b_signed ? 0 : 0x80, *dst = B;
    for (int64_t kk = 0; kk < pb->K; kk++)
        for (int64_t j = 0; j < pb->N; j++) dst[kk * pb->N + j] = (uint8_t)packed_at(k, pb, kk, j) ^ flip;
}

void kiln_qgemm_packed_b_shape(const kiln_qgemm_packed_b *pb, int64_t *K, int64_t *N, bool *b_signed)
{
    if (K) *K = pb->K;
    if (N) *N = pb->N;
    if (b_signed) *b_signed = pb->b_signed;
}

/* ---- narrow B: each column against A's rows (kernel->dot) ---- */

enum { DOT_MAX_N = 4, DOT_ROWS = 64 /* rows per parallel chunk */ };

typedef struct dot_job {
    const kiln_qgemm_kernel *k;
    const kiln_qgemm_args *args;
    const int16_t *cols; /* [N][K]: column minus its zero point */
    int32_t za;
} dot_job;

static void dot_chunks(void *ctx, int64_t begin, int64_t end)
{
    const dot_job *j = ctx;
    const kiln_qgemm_args *g = j->args;
    const uint8_t *A = g->A;
    for (int64_t ch = begin; ch < end; ch++) {
        int64_t i0 = ch * DOT_ROWS, m = min64(DOT_ROWS, g->M - i0);
        for (int64_t c = 0; c < g->N; c++)
            j->k->dot(j->cols + c * g->K, g->K, A + i0 * g->lda, g->lda, g->a_signed, j->za, m, g->C + i0 * g->ldc + c,
                      g->ldc);
        if (g->tile) g->tile(g->tile_ctx, g->C + i0 * g->ldc, g->ldc, i0, m, 0, g->N);
    }
}

/* C for N <= DOT_MAX_N; false when the zero points are outside the bytes' range (the tiles run). */
static bool narrow(const kiln_qgemm_kernel *k, kiln_threadpool *pool, kiln_scratch *scratch, const kiln_qgemm_args *g,
                   kiln_status *st)
{
    int64_t N = g->N, K = g->K;
    if (g->a_zp < -128 || g->a_zp > 255) return false;
    for (int64_t c = 0; c < (g->b_zp ? g->n_bzp : 0); c++)
        if (g->b_zp[c] < -128 || g->b_zp[c] > 255) return false;
    int16_t *cols = kiln_scratch_get(scratch, (size_t)(N * K + 1) * sizeof *cols);
    if (!cols) {
        *st = KILN_ERR_NOMEM;
        return true;
    }
    const kiln_qgemm_packed_b *pb = g->pb;
    const uint8_t *B = g->B;
    for (int64_t c = 0; c < N; c++) {
        int32_t zb = g->b_zp ? g->b_zp[g->n_bzp == 1 ? 0 : c] : 0;
        for (int64_t kk = 0; kk < K; kk++) {
            int32_t v;
            if (pb) /* the stored value is B shifted to signed (qgemm_internal.h) */
                v = packed_at(k, pb, kk, c) + (pb->b_signed ? 0 : 128);
            else v = g->b_signed ? (int8_t)B[kk * g->ldb + c] : B[kk * g->ldb + c];
            cols[c * K + kk] = (int16_t)(v - zb);
        }
    }
    dot_job j = {.k = k, .args = g, .cols = cols, .za = g->a_zp};
    kiln_threadpool_parallel_for(pool, (g->M + DOT_ROWS - 1) / DOT_ROWS, dot_chunks, &j);
    kiln_scratch_put(scratch, cols);
    *st = KILN_OK;
    return true;
}

/* One call, shared by the threads that run its tiles. */
typedef struct qjob {
    const kiln_qgemm_kernel *k;
    const kiln_qgemm_args *args;
    const uint8_t *bdata; /* packed panels */
    int64_t panel_bytes;
    const void *B; /* unpacked B being packed (pack_b_job) */
    int32_t *colsum;
    uint8_t *apack; /* [m_pad][Kp] elements */
    int32_t *rs;    /* [m_pad] */
    int32_t *zb, *cs; /* [n_pad] corrected zero points and column sums */
    int32_t za;
    int64_t Kp, m_pad, groups;
    int64_t pm, pn, tm, tn; /* row blocks (of MR), panels, tiles across each */
    int64_t rows_per_chunk; /* of A packing */
} qjob;

static void pack_a_chunks(void *ctx, int64_t begin, int64_t end)
{
    const qjob *j = ctx;
    const kiln_qgemm_args *g = j->args;
    int64_t r0 = begin * j->rows_per_chunk, r1 = min64(j->m_pad, end * j->rows_per_chunk);
    int64_t m = min64(g->M, r1) - r0;
    pack_a_rows(j->k, j->apack + r0 * j->Kp * j->k->esize, g->A, g->lda, g->a_signed, g->K, j->Kp, r0,
                m < 0 ? 0 : m, r1 - r0, j->rs + r0);
}

static void pack_b_chunks(void *ctx, int64_t begin, int64_t end)
{
    const qjob *j = ctx;
    const kiln_qgemm_args *g = j->args;
    int nr = j->k->nr;
    for (int64_t p = begin; p < end; p++)
        pack_b_panel(j->k, (uint8_t *)j->bdata + p * j->panel_bytes, g->B, g->ldb, g->b_signed, g->K, p * nr,
                     min64(nr, g->N - p * nr), j->colsum + p * nr);
}

static void run_tiles(void *ctx, int64_t begin, int64_t end)
{
    const qjob *j = ctx;
    const kiln_qgemm_kernel *k = j->k;
    const kiln_qgemm_args *g = j->args;
    int64_t a_stride = j->Kp * k->esize;
    for (int64_t t = begin; t < end; t++) {
        int64_t ti = t / j->tn, tj = t % j->tn;
        int64_t b0 = ti * j->pm / j->tm, b1 = (ti + 1) * j->pm / j->tm; /* row blocks */
        int64_t p0 = tj * j->pn / j->tn, p1 = (tj + 1) * j->pn / j->tn; /* panels */
        for (int64_t p = p0; p < p1; p++) {
            int64_t jc = p * k->nr;
            int nr = (int)min64(k->nr, g->N - jc);
            const uint8_t *b = j->bdata + p * j->panel_bytes;
            for (int64_t rb = b0; rb < b1; rb++) {
                int64_t i = rb * k->mr;
                int mr = (int)min64(k->mr, g->M - i);
                k->kernel(j->groups, j->apack + i * a_stride, a_stride, b, g->C + i * g->ldc + jc, g->ldc, mr, nr,
                          j->rs + i, j->zb + jc, j->cs + jc, j->za);
            }
        }
        if (g->tile) {
            int64_t i0 = b0 * k->mr, j0 = p0 * k->nr;
            g->tile(g->tile_ctx, g->C + i0 * g->ldc + j0, g->ldc, i0, min64(g->M, b1 * k->mr) - i0, j0,
                    min64(g->N, p1 * k->nr) - j0);
        }
    }
}

kiln_status kiln_qgemm(const kiln_qgemm_ctx *ctx, const kiln_qgemm_args *a)
{
    if (!a || a->M < 0) return KILN_ERR_INVALID_ARG;
    kiln_qgemm_level level;
    if (resolve_level(ctx, &level)) return KILN_ERR_INVALID_ARG;
    const kiln_qgemm_packed_b *pb = a->pb;
    if (pb && ctx && ctx->level != KILN_QGEMM_LEVEL_AUTO && ctx->level != pb->level) return KILN_ERR_INVALID_ARG;
    if (pb) level = pb->level;
    kiln_qgemm_args g = *a;
    if (pb) g.K = pb->K, g.N = pb->N, g.b_signed = pb->b_signed;
    if (g.b_zp_bound) {
        if (!pb || !pb->zb) return KILN_ERR_INVALID_ARG;
        g.b_zp = pb->n_zp ? pb->zp : NULL, g.n_bzp = pb->n_zp;
    }
    int64_t M = g.M, N = g.N, K = g.K;
    if (N < 0 || K < 0) return KILN_ERR_INVALID_ARG;
    if (M == 0 || N == 0) return KILN_OK;
    if (!g.C || g.ldc < N || (g.n_bzp != 1 && g.n_bzp != N && g.b_zp) || (g.b_zp && g.n_bzp < 1))
        return KILN_ERR_INVALID_ARG;
    if (K > 0 && (!g.A || g.lda < K || (!pb && (!g.B || g.ldb < N)))) return KILN_ERR_INVALID_ARG;
    const kiln_qgemm_kernel *k = kernel_for(level);
    kiln_threadpool *pool = ctx ? ctx->pool : NULL;
    kiln_scratch *scratch = ctx ? ctx->scratch : NULL;
    /* under about 1M multiply-adds (a few microseconds on one core) the pool costs more than it saves */
    if ((double)M * (double)N * (double)K < (double)(1 << 20)) pool = NULL;
    kiln_status narrow_st;
    if (N <= DOT_MAX_N && narrow(k, pool, scratch, &g, &narrow_st)) return narrow_st;
    int threads = kiln_threadpool_size(pool);

    qjob j = {.k = k, .args = &g};
    int64_t n_pad, panel_bytes;
    size_t b_bytes = 0;
    if (!packed_b_sizes(k, K, N, &j.Kp, &n_pad, &panel_bytes, &b_bytes)) return KILN_ERR_NOMEM;
    j.m_pad = round_up(M, k->mr);
    j.groups = j.Kp / k->kg;
    j.panel_bytes = panel_bytes;
    if ((uint64_t)j.m_pad > (SIZE_MAX / 4) / (uint64_t)(j.Kp * k->esize + 16)) return KILN_ERR_NOMEM;
    size_t a_bytes = (size_t)(j.m_pad * j.Kp * k->esize) + ALIGN;
    /* row sums, then the per-column terms unless the zero points are bound (pb has them) */
    size_t side = (size_t)(j.m_pad + (g.b_zp_bound ? 0 : 2 * n_pad)) * sizeof(int32_t) + ALIGN;
    size_t total = a_bytes + side + (pb ? 0 : b_bytes);
    void *work = kiln_scratch_get(scratch, total);
    if (!work) return KILN_ERR_NOMEM;
    j.apack = align_up(work);
    j.rs = align_up(j.apack + a_bytes - ALIGN);
    if (g.b_zp_bound) {
        j.zb = pb->zb, j.cs = pb->cs; /* derived once, when bound */
    } else {
        j.zb = j.rs + j.m_pad, j.cs = j.zb + n_pad;
    }
    if (pb) {
        j.bdata = pb->data;
        j.colsum = pb->colsum;
    } else {
        j.bdata = align_up((uint8_t *)(j.rs + j.m_pad + 2 * n_pad)); /* not bound: pb is NULL */
        j.colsum = (int32_t *)align_up((uint8_t *)j.bdata + (size_t)(n_pad / k->nr) * (size_t)panel_bytes);
        kiln_threadpool_parallel_for(pool, n_pad / k->nr, pack_b_chunks, &j);
    }
    /* the operands as the kernels multiply them: A unsigned, B signed; the zero points shifted alike */
    j.za = g.a_zp + (g.a_signed ? 128 : 0);
    if (!g.b_zp_bound) zero_terms(g.b_zp, g.n_bzp, g.b_signed, K, N, n_pad, j.colsum, j.zb, j.cs);
    int64_t chunks = threads > 1 ? min64(j.m_pad / k->mr, 4 * (int64_t)threads) : 1;
    j.rows_per_chunk = round_up((j.m_pad + chunks - 1) / chunks, k->mr);
    kiln_threadpool_parallel_for(pool, (j.m_pad + j.rows_per_chunk - 1) / j.rows_per_chunk, pack_a_chunks, &j);

    j.pm = j.m_pad / k->mr;
    j.pn = n_pad / k->nr;
    int64_t blocks_per_tile = TILE_A_BYTES / ((j.Kp ? j.Kp : 1) * k->esize * k->mr);
    if (blocks_per_tile < 1) blocks_per_tile = 1;
    j.tm = (j.pm + blocks_per_tile - 1) / blocks_per_tile;
    j.tn = (j.pn + TILE_PANELS - 1) / TILE_PANELS;
    int64_t want = threads > 1 ? 4 * (int64_t)threads : 1;
    while (j.tm * j.tn < want && (j.tn < j.pn || j.tm < j.pm)) {
        if (j.tn < j.pn && (j.tn <= j.tm || j.tm >= j.pm)) j.tn++;
        else j.tm++;
    }
    kiln_threadpool_parallel_for(pool, j.tm * j.tn, run_tiles, &j);
    kiln_scratch_put(scratch, work);
    return KILN_OK;
}

void kiln_qgemm_reference(const kiln_qgemm_args *a)
{
    const kiln_qgemm_packed_b *pb = a->pb;
    int64_t K = pb ? pb->K : a->K, N = pb ? pb->N : a->N;
    bool b_signed = pb ? pb->b_signed : a->b_signed;
    uint8_t *unpacked = NULL;
    const uint8_t *B = a->B;
    int64_t ldb = a->ldb;
    if (pb) {
        unpacked = malloc((size_t)(K * N) + 1);
        if (!unpacked) return;
        kiln_qgemm_packed_b_unpack(pb, unpacked);
        B = unpacked;
        ldb = N;
    }
    const uint8_t *A = a->A;
    for (int64_t i = 0; i < a->M; i++)
        for (int64_t j = 0; j < N; j++) {
            int32_t zb = a->b_zp ? a->b_zp[a->n_bzp == 1 ? 0 : j] : 0;
            uint32_t s = 0;
            for (int64_t p = 0; p < K; p++) {
                int32_t av = a->a_signed ? (int8_t)A[i * a->lda + p] : A[i * a->lda + p];
                int32_t bv = b_signed ? (int8_t)B[p * ldb + j] : B[p * ldb + j];
                s += (uint32_t)((av - a->a_zp) * (bv - zb));
            }
            a->C[i * a->ldc + j] = (int32_t)s;
        }
    if (a->tile) a->tile(a->tile_ctx, a->C, a->ldc, 0, a->M, 0, N);
    free(unpacked);
}
