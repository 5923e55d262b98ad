/* direct.c - convolutions computed from the taps in place (see direct.h).
 *
 * Wide layers (16 output channels or more): the output pixels are the micro-kernel's rows. A task is one tile: 14 consecutive pixels of one output row (the last tile of a row is moved
 * back to end at the row's last pixel, so reads stay inside the row) by one 32-channel panel of
 * the weights, over all K taps: 28 accumulators, each step one pixel broadcast from the tap's
 * row against 32 packed weights. Tasks run with the channel panels innermost when the weights
 * are smaller than the image (a thread's 14 columns of taps stay in L1 while it goes through
 * the weights, which stay in L2), else with the tiles innermost.
 *
 * Narrow layers (fewer than 16 channels): a tile is up to 6 vectors of 16 consecutive pixels of
 * one output row by a panel of up to 8 channels (at most 24 accumulators: 3 vectors for 5-8
 * channels), each step one tap's vectors loaded (the row's last one masked, so nothing past
 * the row is read) against each channel's weight broadcast; the accumulators are rows of the
 * output, stored without a transpose. A task is a run of up to NARROW_RUN pixels of one row for
 * one panel, panels fastest. */
#include "cpu/direct.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/pages.h"
#include "cpu/kernels.h"
#include "cpu/target.h"

enum { DIRECT_COLS = 32 };
/* narrow layers: channels per panel, pixels per task (a multiple of the tiles' 48 and 96) */
enum { NARROW_CH = 8, NARROW_RUN = 192 };

struct kiln_direct {
    int64_t M, K;
    bool narrow;  /* M < 16 */
    int64_t cols; /* channels per panel: DIRECT_COLS, or NARROW_CH when narrow */
    float *w;     /* [ceil(M / cols)][K][cols], channels past M zero; 64-byte aligned */
};

void kiln_cpu_direct_free(kiln_direct *d)
{
    if (!d) return;
    free(d->w);
    free(d);
}

kiln_direct *kiln_cpu_direct_pack(const float *w, int64_t M, int64_t K)
{
    if (M <= 0 || K <= 0 || kiln_gemm_level_detect() != KILN_GEMM_LEVEL_AVX512) return NULL;
    int64_t cols = M < 16 ? NARROW_CH : DIRECT_COLS, panels = (M + cols - 1) / cols;
    size_t bytes = (size_t)(panels * K * cols) * sizeof(float);
    kiln_direct *d = calloc(1, sizeof *d);
    float *p = kiln_pages_alloc(bytes);
    if (!d || !p) {
        free(d);
        free(p);
        return NULL;
    }
    memset(p, 0, bytes);
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) p[(m / cols * K + k) * cols + m % cols] = w[m * K + k];
    d->M = M, d->K = K, d->narrow = M < 16, d->cols = cols, d->w = p;
    return d;
}

void kiln_cpu_direct_unpack(const kiln_direct *d, float *w)
{
    for (int64_t m = 0; m < d->M; m++)
        for (int64_t k = 0; k < d->K; k++) w[m * d->K + k] = d->w[(m / d->cols * d->K + k) * d->cols + m % d->cols];
}

#if defined(__x86_64__)

KILN_TARGET_BEGIN("avx512f")

#include "cpu/avx512_util.h"

/* taps fetched ahead of the FMAs: a tile's 14 pixels of each tap are one or two cache lines in
 * another row of the input, which the hardware prefetchers do not follow (without it, ResNet-50's
 * 256 -> 64 layers at 56x56 ran 1.5x slower) */
enum { DIRECT_AHEAD = 16 };

/* One call: the tiles of every image, and what their stores apply. */
typedef struct direct_job {
    const kiln_direct *d;
    const kiln_direct_src *src;
    int64_t area;          /* oh * ow */
    int64_t per_row, tiles, panels; /* tiles (narrow: runs): per output row, per image; panels: of d->cols channels */
    bool panels_outer;     /* the weights are larger than an image: each panel goes through all its tiles */
    const float *bias, *res;
    float *y;
    const kiln_act *act; /* applied after the store when it is not a clamp */
    bool clamp;          /* the act is none, Relu or Clip: [lo, hi] in the store */
    float lo, hi;
} direct_job;

/* Stores the transposed half-tile t (t[q]: channel ch0 + q's 14 pixels in lanes 0-13) for n
 * channels, the pixel lanes in `keep`, at pixel i0 of image y (and res). */
static inline void store_half(const direct_job *j, __m512 t[16], int64_t ch0, int n, float *y, const float *res,
                              int64_t i0, __mmask16 keep, int skip)
{
    __m512 vlo = _mm512_set1_ps(j->lo), vhi = _mm512_set1_ps(j->hi);
    for (int q = 0; q < n; q++) {
        int64_t at = (ch0 + q) * j->area + i0; /* i0: the tile's first pixel in its plane */
        __m512 v = t[q];
        if (j->bias) v = _mm512_add_ps(v, _mm512_set1_ps(j->bias[ch0 + q]));
        if (j->clamp) { /* max and min return their second operand for a NaN: a NaN stays */
            if (res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, res + at));
            v = _mm512_min_ps(vhi, _mm512_max_ps(vlo, v));
            _mm512_mask_storeu_ps(y + at, keep, v);
        } else {
            _mm512_mask_storeu_ps(y + at, keep, v);
            int count = __builtin_popcount((unsigned)keep);
            kiln_cpu_act_apply_sum(j->act, y + at + skip, res ? res + at + skip : NULL, count, 0.0f);
        }
    }
}

#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define DECL(r) __m512 c##r##_0 = _mm512_setzero_ps(), c##r##_1 = _mm512_setzero_ps();
#define FMA2(r)                                                                                       \
    {                                                                                                 \
        __m512 av = _mm512_set1_ps(a[r]);                                                             \
        c##r##_0 = _mm512_fmadd_ps(av, b0, c##r##_0);                                                 \
        c##r##_1 = _mm512_fmadd_ps(av, b1, c##r##_1);                                                 \
    }
#define FMA1(r) c##r##_0 = _mm512_fmadd_ps(_mm512_set1_ps(a[r]), b0, c##r##_0);
#define GATHER0(r) t16[r] = c##r##_0;
#define GATHER1(r) t16[r] = c##r##_1;

/* The tap loop: acc += the 14 pixels at a + off[p] x the 32 (or 16) weights of step p. */
#define TAPS(FMA, LOADS)                                                                              \
    for (int64_t p = 0; p < K; p++, w += DIRECT_COLS) {                                               \
        const float *a = x + off[p];                                                                  \
        if (p + DIRECT_AHEAD < K) {                                                                   \
            _mm_prefetch((const char *)(x + off[p + DIRECT_AHEAD]), _MM_HINT_T0);                     \
            _mm_prefetch((const char *)(x + off[p + DIRECT_AHEAD] + KILN_DIRECT_ROWS - 1), _MM_HINT_T0); \
        }                                                                                             \
        LOADS                                                                                         \
        ROWS(FMA)                                                                                     \
    }

/* Tile `task`: image b, output row oy, pixels [ox0, ox0 + 14) (stored: the lanes in keep),
 * channel panel jp. */
static void direct_tile(const direct_job *j, int64_t task)
{
    const kiln_direct *d = j->d;
    const kiln_direct_src *s = j->src;
    int64_t b = task / (j->panels * j->tiles), jp, t;
    if (j->panels_outer) jp = task / j->tiles % j->panels, t = task % j->tiles;
    else jp = task % j->panels, t = task / j->panels % j->tiles;
    int64_t oy = t / j->per_row, ox0 = t % j->per_row * KILN_DIRECT_ROWS, skip = 0;
    __mmask16 keep = (__mmask16)((1u << KILN_DIRECT_ROWS) - 1);
    if (s->ow < KILN_DIRECT_ROWS) keep = kiln_lanes(s->ow);
    else if (ox0 + KILN_DIRECT_ROWS > s->ow)
        skip = ox0 - (s->ow - KILN_DIRECT_ROWS), ox0 -= skip, keep &= (__mmask16)(0xffffu << skip);
    const float *x = s->x + b * s->image + oy * s->pitch + ox0, *w = d->w + jp * d->K * DIRECT_COLS;
    const int64_t *off = s->off;
    int n = d->M - jp * DIRECT_COLS < DIRECT_COLS ? (int)(d->M - jp * DIRECT_COLS) : DIRECT_COLS;
    int64_t K = d->K;
    ROWS(DECL)
    if (n > 16) TAPS(FMA2, __m512 b0 = _mm512_load_ps(w); __m512 b1 = _mm512_load_ps(w + 16);)
    else TAPS(FMA1, __m512 b0 = _mm512_load_ps(w);)
    int64_t i0 = oy * s->ow + ox0;
    float *y = j->y + b * d->M * j->area;
    const float *res = j->res ? j->res + b * d->M * j->area : NULL;
    __m512 t16[16];
    t16[14] = t16[15] = _mm512_setzero_ps();
    ROWS(GATHER0)
    kiln_transpose16(t16);
    store_half(j, t16, jp * DIRECT_COLS, n < 16 ? n : 16, y, res, i0, keep, (int)skip);
    if (n > 16) {
        ROWS(GATHER1)
        kiln_transpose16(t16);
        store_half(j, t16, jp * DIRECT_COLS + 16, n - 16, y, res, i0, keep, (int)skip);
    }
}

static void direct_tasks(void *ctx, int64_t begin, int64_t end)
{
    for (int64_t t = begin; t < end; t++) direct_tile(ctx, t);
}

/* Narrow tile: V vectors of pixels from (oy, ox0) of image b (the last vector's lanes in
 * `last`) by the MP channels of panel jp. */
static inline __attribute__((always_inline)) void narrow_tile(const direct_job *j, int64_t b, int64_t oy, int64_t ox0,
                                                               int64_t jp, __mmask16 last, int MP, int V)
{
    const kiln_direct *d = j->d;
    const kiln_direct_src *s = j->src;
    const float *x = s->x + b * s->image + oy * s->pitch + ox0, *w = d->w + jp * d->K * NARROW_CH;
    const int64_t *off = s->off;
    __m512 acc[NARROW_CH][6];
#pragma GCC unroll 8
    for (int m = 0; m < MP; m++) {
        __m512 bv = j->bias ? _mm512_set1_ps(j->bias[jp * NARROW_CH + m]) : _mm512_setzero_ps();
#pragma GCC unroll 6
        for (int v = 0; v < V; v++) acc[m][v] = bv;
    }
    for (int64_t p = 0; p < d->K; p++, w += NARROW_CH) {
        const float *a = x + off[p];
        __m512 xv[6];
#pragma GCC unroll 6
        for (int v = 0; v < V; v++) xv[v] = v + 1 < V ? _mm512_loadu_ps(a + 16 * v) : _mm512_maskz_loadu_ps(last, a + 16 * v);
#pragma GCC unroll 8
        for (int m = 0; m < MP; m++) {
            __m512 wv = _mm512_set1_ps(w[m]);
#pragma GCC unroll 6
            for (int v = 0; v < V; v++) acc[m][v] = _mm512_fmadd_ps(xv[v], wv, acc[m][v]);
        }
    }
    __m512 vlo = _mm512_set1_ps(j->lo), vhi = _mm512_set1_ps(j->hi);
    int64_t at0 = b * d->M * j->area + oy * s->ow + ox0;
#pragma GCC unroll 8 /* every index constant: acc stays in registers */
    for (int m = 0; m < MP; m++) {
        int64_t at = at0 + (jp * NARROW_CH + m) * j->area;
        float *y = j->y + at;
        const float *res = j->res ? j->res + at : NULL;
#pragma GCC unroll 6
        for (int v = 0; v < V; v++) {
            __mmask16 keep = v + 1 < V ? (__mmask16)0xffff : last;
            __m512 r = acc[m][v];
            if (j->clamp) { /* max and min return their second operand for a NaN: a NaN stays */
                if (res) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(keep, res + 16 * v));
                r = _mm512_min_ps(vhi, _mm512_max_ps(vlo, r));
            }
            _mm512_mask_storeu_ps(y + 16 * v, keep, r);
        }
        if (!j->clamp) kiln_cpu_act_apply_sum(j->act, y, res, 16 * (V - 1) + __builtin_popcount((unsigned)last), 0.0f);
    }
}

typedef void (*narrow_fn)(const direct_job *j, int64_t b, int64_t oy, int64_t ox0, int64_t jp, __mmask16 last);
#define NARROW_FN(MP, V)                                                                                    \
    static void narrow_##MP##_##V(const direct_job *j, int64_t b, int64_t oy, int64_t ox0, int64_t jp, __mmask16 last) \
    {                                                                                                       \
        narrow_tile(j, b, oy, ox0, jp, last, MP, V);                                                        \
    }
#define NARROW_THREE(MP) NARROW_FN(MP, 1) NARROW_FN(MP, 2) NARROW_FN(MP, 3)
#define NARROW_SIX(MP) NARROW_THREE(MP) NARROW_FN(MP, 4) NARROW_FN(MP, 5) NARROW_FN(MP, 6)
NARROW_SIX(1)
NARROW_SIX(2)
NARROW_SIX(3)
NARROW_SIX(4)
NARROW_THREE(5)
NARROW_THREE(6)
NARROW_THREE(7)
NARROW_THREE(8)
#define NARROW_ROW3(MP) narrow_##MP##_1, narrow_##MP##_2, narrow_##MP##_3
#define NARROW_ROW6(MP) {NARROW_ROW3(MP), narrow_##MP##_4, narrow_##MP##_5, narrow_##MP##_6}
/* [MP - 1][V - 1]: up to 6 vectors for up to 4 channels, 3 for more */
static const narrow_fn narrow_tiles[NARROW_CH][6] = {NARROW_ROW6(1),   NARROW_ROW6(2),   NARROW_ROW6(3),   NARROW_ROW6(4),
                                                     {NARROW_ROW3(5)}, {NARROW_ROW3(6)}, {NARROW_ROW3(7)}, {NARROW_ROW3(8)}};

/* Task t: run t / panels % per_row of output row oy of image b, for panel t % panels. */
static void narrow_tasks(void *ctx, int64_t begin, int64_t end)
{
    const direct_job *j = ctx;
    const kiln_direct *d = j->d;
    int64_t ow = j->src->ow;
    for (int64_t t = begin; t < end; t++) {
        int64_t jp = t % j->panels, run = t / j->panels % j->per_row, oy = t / (j->panels * j->per_row) % j->src->oh;
        int64_t b = t / (j->panels * j->tiles);
        int MP = d->M - jp * NARROW_CH < NARROW_CH ? (int)(d->M - jp * NARROW_CH) : NARROW_CH;
        int64_t step = MP <= 4 ? 96 : 48;
        int64_t x1 = (run + 1) * NARROW_RUN < ow ? (run + 1) * NARROW_RUN : ow;
        for (int64_t ox = run * NARROW_RUN; ox < x1; ox += step) {
            int64_t n = x1 - ox < step ? x1 - ox : step;
            int V = (int)((n + 15) / 16);
            narrow_tiles[MP - 1][V - 1](j, b, oy, ox, jp, kiln_lanes(n - 16 * (V - 1)));
        }
    }
}

kiln_status kiln_cpu_direct_run(const kiln_gemm_ctx *ctx, const kiln_direct *d, const kiln_direct_src *src, int64_t N,
                                const float *bias, const float *res, const kiln_act *act, float *y)
{
    if (N <= 0 || src->oh <= 0 || src->ow <= 0) return KILN_OK;
    /* under about 256K multiply-adds (a microsecond or two) waking the pool costs more */
    bool wide = (double)N * (double)src->oh * (double)src->ow * (double)d->M * (double)d->K >= (double)(1 << 18);
    if (d->narrow) {
        int64_t per_row = (src->ow + NARROW_RUN - 1) / NARROW_RUN;
        direct_job j = {.d = d, .src = src, .area = src->oh * src->ow, .per_row = per_row, .tiles = src->oh * per_row,
                        .panels = (d->M + NARROW_CH - 1) / NARROW_CH, .bias = bias, .res = res, .y = y, .act = act};
        j.clamp = kiln_cpu_act_clamp(act, &j.lo, &j.hi);
        kiln_threadpool_parallel_for(wide ? ctx->pool : NULL, N * j.tiles * j.panels, narrow_tasks, &j);
        return KILN_OK;
    }
    int64_t per_row = src->ow < KILN_DIRECT_ROWS ? 1 : (src->ow + KILN_DIRECT_ROWS - 1) / KILN_DIRECT_ROWS;
    direct_job j = {.d = d, .src = src, .area = src->oh * src->ow, .per_row = per_row, .tiles = src->oh * per_row,
                    .panels = (d->M + DIRECT_COLS - 1) / DIRECT_COLS, .bias = bias, .res = res, .y = y, .act = act};
    j.clamp = kiln_cpu_act_clamp(act, &j.lo, &j.hi);
    j.panels_outer = d->M > j.area;
    kiln_threadpool_parallel_for(wide ? ctx->pool : NULL, N * j.tiles * j.panels, direct_tasks, &j);
    return KILN_OK;
}

KILN_TARGET_END

#else /* pack returns NULL where there is no AVX-512: nothing to run */

kiln_status kiln_cpu_direct_run(const kiln_gemm_ctx *ctx, const kiln_direct *d, const kiln_direct_src *src, int64_t N,
                                const float *bias, const float *res, const kiln_act *act, float *y)
{
    (void)ctx, (void)d, (void)src, (void)N, (void)bias, (void)res, (void)act, (void)y;
    return KILN_ERR_INVALID_ARG;
}

#endif
