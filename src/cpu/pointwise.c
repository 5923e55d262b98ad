/* pointwise.c - 1x1 stride-1 convolutions with the pixels as the micro-kernel's rows (see
 * pointwise.h).
 *
 * A task is one tile: 14 consecutive pixels of one image (the last tile of a row of pixels is
 * moved back to end at the image's last pixel, so every read stays inside X) by one 32-channel
 * panel of the weights, over the whole depth K: 28 accumulators, each step one pixel broadcast
 * from X's row p against 32 packed weights. Tasks run with the channel panels innermost, so a
 * thread's 14 columns of X stay in L1 while it goes through the weights (which stay in L2). */
#include "cpu/pointwise.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "cpu/kernels.h"

enum { PW_ROWS = 14, PW_COLS = 32 };
/* rows of X fetched ahead of the FMAs: the tile's 14 pixels of each row are one or two cache
 * lines a row stride apart, which the hardware prefetchers do not follow (without it, ResNet-50's
 * 256 -> 64 layers at 56x56 ran 1.5x slower) */
enum { PW_AHEAD = 16 };

struct kiln_pointwise {
    int64_t M, K;
    float *w; /* [ceil(M / 32)][K][32], channels past M zero; 64-byte aligned */
};

void kiln_cpu_pointwise_free(kiln_pointwise *pw)
{
    if (!pw) return;
    free(pw->w);
    free(pw);
}

kiln_pointwise *kiln_cpu_pointwise_pack(const float *w, int64_t M, int64_t K)
{
    if (M <= 0 || K <= 0 || kiln_gemm_level_detect() != KILN_GEMM_LEVEL_AVX512) return NULL;
    int64_t panels = (M + PW_COLS - 1) / PW_COLS;
    size_t bytes = (size_t)(panels * K * PW_COLS) * sizeof(float);
    kiln_pointwise *pw = calloc(1, sizeof *pw);
    float *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!pw || !p) {
        free(pw);
        free(p);
        return NULL;
    }
    memset(p, 0, bytes);
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) p[(m / PW_COLS * K + k) * PW_COLS + m % PW_COLS] = w[m * K + k];
    pw->M = M, pw->K = K, pw->w = p;
    return pw;
}

void kiln_cpu_pointwise_unpack(const kiln_pointwise *pw, float *w)
{
    for (int64_t m = 0; m < pw->M; m++)
        for (int64_t k = 0; k < pw->K; k++) w[m * pw->K + k] = pw->w[(m / PW_COLS * pw->K + k) * PW_COLS + m % PW_COLS];
}

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif

#include "cpu/avx512_util.h"

/* One call: the tiles of every image, and what their stores apply. */
typedef struct pw_job {
    const kiln_pointwise *pw;
    const float *x;
    int64_t xs;    /* X's row stride: area, or 16 in the zero-padded copy of an image under 14 pixels */
    int64_t ximg;  /* floats of one image of x */
    int64_t area, tiles, panels; /* tiles: of 14 pixels per image; panels: of 32 channels */
    bool panels_outer;   /* the weights are larger than an image: each panel goes through all its tiles */
    const float *bias, *res;
    float *y;
    const kiln_act *act; /* applied after the store when it is not a clamp */
    bool clamp;          /* the act is none, Relu or Clip: [lo, hi] in the store */
    float lo, hi;
} pw_job;

/* Stores the transposed half-tile t (t[q]: channel ch0 + q's 14 pixels in lanes 0-13) for n
 * channels, the pixel lanes in `keep`, at pixel i0 of image y (and res). */
static inline void store_half(const pw_job *j, __m512 t[16], int64_t ch0, int n, float *y, const float *res,
                              int64_t i0, __mmask16 keep, int skip)
{
    __m512 vlo = _mm512_set1_ps(j->lo), vhi = _mm512_set1_ps(j->hi);
    for (int q = 0; q < n; q++) {
        int64_t at = (ch0 + q) * j->area + i0;
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
#define GATHER0(r) t[r] = c##r##_0;
#define GATHER1(r) t[r] = c##r##_1;

/* Tile `task`: image b, pixels [i0, i0 + 14) (stored: lanes in keep), channel panel jp. */
static void pw_tile(const pw_job *j, int64_t task)
{
    const kiln_pointwise *pw = j->pw;
    int64_t b = task / (j->panels * j->tiles), jp, it;
    if (j->panels_outer) jp = task / j->tiles % j->panels, it = task % j->tiles;
    else jp = task % j->panels, it = task / j->panels % j->tiles;
    int64_t i0 = it * PW_ROWS, skip = 0;
    __mmask16 keep = (__mmask16)((1u << PW_ROWS) - 1);
    if (j->xs != j->area) keep = kiln_lanes(j->area); /* the padded copy: one tile */
    else if (i0 + PW_ROWS > j->area) skip = i0 - (j->area - PW_ROWS), i0 -= skip, keep &= (__mmask16)(0xffffu << skip);
    const float *a = j->x + b * j->ximg + i0, *w = pw->w + jp * pw->K * PW_COLS;
    int n = pw->M - jp * PW_COLS < PW_COLS ? (int)(pw->M - jp * PW_COLS) : PW_COLS;
    int64_t K = pw->K, xs = j->xs;
    ROWS(DECL)
    if (n > 16)
        for (int64_t p = 0; p < K; p++, a += xs, w += PW_COLS) {
            _mm_prefetch((const char *)(a + PW_AHEAD * xs), _MM_HINT_T0);
            _mm_prefetch((const char *)(a + PW_AHEAD * xs + PW_ROWS - 1), _MM_HINT_T0);
            __m512 b0 = _mm512_load_ps(w), b1 = _mm512_load_ps(w + 16);
            ROWS(FMA2)
        }
    else
        for (int64_t p = 0; p < K; p++, a += xs, w += PW_COLS) {
            _mm_prefetch((const char *)(a + PW_AHEAD * xs), _MM_HINT_T0);
            _mm_prefetch((const char *)(a + PW_AHEAD * xs + PW_ROWS - 1), _MM_HINT_T0);
            __m512 b0 = _mm512_load_ps(w);
            ROWS(FMA1)
        }
    float *y = j->y + b * pw->M * j->area;
    const float *res = j->res ? j->res + b * pw->M * j->area : NULL;
    __m512 t[16];
    t[14] = t[15] = _mm512_setzero_ps();
    ROWS(GATHER0)
    kiln_transpose16(t);
    store_half(j, t, jp * PW_COLS, n < 16 ? n : 16, y, res, i0, keep, (int)skip);
    if (n > 16) {
        ROWS(GATHER1)
        kiln_transpose16(t);
        store_half(j, t, jp * PW_COLS + 16, n - 16, y, res, i0, keep, (int)skip);
    }
}

static void pw_tasks(void *ctx, int64_t begin, int64_t end)
{
    for (int64_t t = begin; t < end; t++) pw_tile(ctx, t);
}

kiln_status kiln_cpu_pointwise_run(const kiln_gemm_ctx *ctx, const kiln_pointwise *pw, const float *x, int64_t N,
                                   int64_t area, const float *bias, const float *res, const kiln_act *act, float *y)
{
    if (N <= 0 || area <= 0) return KILN_OK;
    pw_job j = {.pw = pw, .x = x, .xs = area, .ximg = pw->K * area, .area = area,
                .tiles = (area + PW_ROWS - 1) / PW_ROWS, .panels = (pw->M + PW_COLS - 1) / PW_COLS,
                .bias = bias, .res = res, .y = y, .act = act, .lo = -INFINITY, .hi = INFINITY};
    j.clamp = act->kind == KILN_ACT_NONE || act->kind == KILN_ACT_RELU || act->kind == KILN_ACT_CLIP;
    if (act->kind == KILN_ACT_RELU) j.lo = 0.0f;
    if (act->kind == KILN_ACT_CLIP) j.lo = act->alpha, j.hi = act->beta;
    float *pad = NULL;
    if (area < PW_ROWS) { /* too few pixels for one tile: a zero-padded copy, rows of 16 */
        pad = kiln_scratch_get(ctx->scratch, (size_t)(N * pw->K * 16) * sizeof *pad);
        if (!pad) return KILN_ERR_NOMEM;
        for (int64_t r = 0; r < N * pw->K; r++) {
            memcpy(pad + r * 16, x + r * area, (size_t)area * sizeof *pad);
            memset(pad + r * 16 + area, 0, (size_t)(16 - area) * sizeof *pad);
        }
        j.x = pad, j.xs = 16, j.ximg = pw->K * 16;
    }
    j.panels_outer = pw->M > area;
    int64_t tasks = N * j.tiles * j.panels;
    /* under about 256K multiply-adds (a microsecond or two) waking the pool costs more */
    bool wide = (double)N * (double)area * (double)pw->M * (double)pw->K >= (double)(1 << 18);
    kiln_threadpool_parallel_for(wide ? ctx->pool : NULL, tasks, pw_tasks, &j);
    kiln_scratch_put(ctx->scratch, pad);
    return KILN_OK;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else /* pack returns NULL where there is no AVX-512: nothing to run */

kiln_status kiln_cpu_pointwise_run(const kiln_gemm_ctx *ctx, const kiln_pointwise *pw, const float *x, int64_t N,
                                   int64_t area, const float *bias, const float *res, const kiln_act *act, float *y)
{
    (void)ctx, (void)pw, (void)x, (void)N, (void)area, (void)bias, (void)res, (void)act, (void)y;
    return KILN_ERR_INVALID_ARG;
}

#endif
