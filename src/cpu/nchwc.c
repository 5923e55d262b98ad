/* nchwc.c - convolutions, pooling and nearest resizing over activations blocked by 16 channels
 * (see nchwc.h).
 *
 * A convolution task is a run of output pixels of one row, of one image, for a group of up to
 * four 16-channel output blocks. Its tiles are up to six consecutive pixels by those blocks: 24
 * accumulators, each step one input channel of each pixel broadcast against the 16 weights of
 * each block, all input blocks and taps accumulated in registers and stored once as whole
 * vectors (a large 1x1 layer: accumulated over passes of input blocks, the partial sums of a
 * task's tiles kept on its stack between passes). Blocked input: taps above or below it are
 * skipped per row, taps left or right of it read a vector of zeros. Plain input (a network's
 * image) is first copied with its pads as zeros, so every tap of every tile lands. A row's
 * pixels are cut into tiles of nearly equal size (7 = 4 + 3, not 6 + 1: a one-pixel tile is a
 * chain of dependent multiply-adds). A 1x1 stride-1 layer without pads is one long row per image
 * (its pixels are consecutive in both layouts). A 3x3 stride-1 layer with blocked input runs
 * by Winograd's F(2x2, 3x3) or F(4x4, 3x3) instead, from 6x6 outputs up (nchwc_winograd.c). Measured and not
 * kept: the wide layers at the end of a CNN (256-2048 channels at 5x5-10x10) as a GEMM of output
 * pixels by W^T prepacked as B, the input gathered per tap as 16-channel vectors into the packed
 * A: 1x1 chains 0.94-0.99 of these tiles, 3x3 at 5x5 and 10x10 1.03-1.13, ResNet-50 end to end
 * 0.99-1.04 (and wider tiles, 2 blocks by 12 pixels, for those planes: 1.10). */
#include "cpu/nchwc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/pages.h"
#include "core/scratch.h"
#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "cpu/nchwc_winograd.h"
#include "cpu/target.h"

/* tiles: up to 4 output blocks by up to 6 pixels, or up to 2 blocks by up to 12 (24
 * accumulators); tasks: up to 8 tiles */
enum { BLK = KILN_NCHWC_BLOCK, GROUP_BLOCKS = 4, TILE_PX = 6, WIDE_PX = 12, CHUNK_TILES = 8 };
/* weights fetched ahead of the multiply-adds, in floats: 4 KB on (a deep layer's weights come
 * from memory on a group's first tile and from L2 on the others; ResNet-50's 7x7 512-channel
 * 3x3 layer with cold caches about 10% faster). A tile also fetches its pixels of the next input
 * block while it sums the current one: the blocks lie a plane apart, where the hardware's
 * prefetchers do not follow, and half of them were written by the other thread (MobileNetV2's
 * 1x1 layers after a depthwise one split by channels); MobileNetV2 0.96 / 0.98 / 0.98 at 160 /
 * 224 / 288, ResNet-50 0.97 / 0.98 at 160 / 224 (two threads, in-process alternation). */
enum { PF_AHEAD = 4 * KILN_NCHWC_BLOCK * KILN_NCHWC_BLOCK };
/* 3x3 stride-1 layers of blocked input (or plain input of 16k channels, blocked for them) run
 * by Winograd (nchwc_winograd.h) from 36 output pixels (6x6) up, when they have at most
 * WINO_MAX_MC output x input channels (their
 * transformed weights, 16/9 of W, made when packing, up to 4 MB). Per layer of ResNet-50 at
 * 224x224, two threads, in the model: 56x56 64 channels 0.73 -> 0.54 ms, 28x28 128 channels 0.75
 * -> 0.58, 14x14 256 channels 0.78 -> 0.69-0.76; at 7x7 (512 channels) 1.0 -> 1.4 ms: its 16
 * tiles (64 outputs for 49) do not pay for streaming 16 MB of transformed weights. ResNet-50 at
 * 224 holds 29 MB more. From 100 pixels (its 10x10 layers at 160x160): 1.00 end to end. The
 * threshold was 144 pixels: down to 36, single layers at batch 1, two threads, plain in and out
 * (the reorder included), ms: 16 -> 16 channels at 7x7 0.0050 -> 0.0040, 64 -> 64 at 6x8
 * 0.040 -> 0.023, 96 -> 24 at 7x7 0.035 -> 0.016, 128 -> 128 at 7x7 0.10-0.16 -> 0.06, 256 ->
 * 256 at 10x12 0.72 -> 0.37; the small ResNet family (16 channels at 9x12, 32 at 5x6, blocked)
 * 0.0606 -> 0.0565 ms end to end, one thread.
 * Layers of up to WINO4_MAX_MC channel pairs also get F(4x4, 3x3)'s weights (36/9 of W) and run
 * by it where its products (36 per 4x4 tile) are at most 2/3 of F(2x2, 3x3)'s (16 per 2x2 tile):
 * planes that 4x4 tiles cover with little waste (56x56, 28x28, 20x20, 12x12, not 14x14 or
 * 18x18). ResNet-50's 3x3 layers at 224x224, one thread: 56x56 1.00 -> 0.72 ms, 28x28 0.99 ->
 * 0.75; at 14x14 (16 tiles of 4x4 for 49 of 2x2) 1.25 -> 1.55, so those stay on F(2x2, 3x3), and
 * 256-channel layers (9.4 MB of F(4x4, 3x3) weights each) do not get them. */
enum { WINO_MIN_PX = 36, WINO_MAX_MC = KILN_NCHWC_WINO_MAX_MC, WINO4_MAX_MC = 128 * 128 };
/* input passes of a large 1x1 layer (see kiln_cpu_nchwc_conv_run) */
enum { PASS_KB = 32, PASS_MIN_KB = 128 };

struct kiln_nchwc_conv {
    int64_t M, C, kh, kw, MB, CB;
    bool depthwise;
    float *w;    /* see nchwc.h; 64-byte aligned */
    float *wino2; /* a 3x3 layer's F(2x2, 3x3) weights (nchwc_winograd.h), or NULL */
    float *wino4; /* its F(4x4, 3x3) weights, or NULL */
};

bool kiln_cpu_nchwc_available(void) { return kiln_gemm_level_detect() == KILN_GEMM_LEVEL_AVX512; }

void kiln_cpu_nchwc_conv_free(kiln_nchwc_conv *w)
{
    if (!w) return;
    free(w->w);
    free(w->wino2);
    free(w->wino4);
    free(w);
}

/* Index of W [m, c, i, j] in the packed weights. */
static int64_t packed_at(const kiln_nchwc_conv *p, int64_t m, int64_t c, int64_t i, int64_t j)
{
    if (p->depthwise) return ((m / BLK * p->kh + i) * p->kw + j) * BLK + m % BLK;
    int64_t ob0 = m / BLK / GROUP_BLOCKS * GROUP_BLOCKS, fb = p->MB - ob0 < GROUP_BLOCKS ? p->MB - ob0 : GROUP_BLOCKS;
    int64_t ib = c / BLK, cn = p->C - ib * BLK < BLK ? p->C - ib * BLK : BLK; /* channels of input block ib */
    int64_t at = ((i * p->kw + j) * p->C + ib * BLK) * fb + (m / BLK - ob0) * cn + c % BLK;
    return (ob0 * p->C * p->kh * p->kw + at) * BLK + m % BLK;
}

kiln_nchwc_conv *kiln_cpu_nchwc_conv_pack(const float *w, int64_t M, int64_t C, int64_t kh, int64_t kw,
                                          bool depthwise)
{
    if (M <= 0 || C <= 0 || kh <= 0 || kw <= 0 || !kiln_cpu_nchwc_available() || (depthwise && C != 1)) return NULL;
    kiln_nchwc_conv *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    *p = (kiln_nchwc_conv){M, C, kh, kw, (M + BLK - 1) / BLK, (C + BLK - 1) / BLK, depthwise, NULL, NULL, NULL};
    size_t floats = (size_t)(p->MB * kh * kw * BLK) * (depthwise ? 1 : (size_t)C);
    p->w = kiln_pages_alloc(floats * sizeof(float));
    if (!p->w) {
        free(p);
        return NULL;
    }
    memset(p->w, 0, floats * sizeof(float));
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++) p->w[packed_at(p, m, c, i, j)] = w[((m * C + c) * kh + i) * kw + j];
    if (kh == 3 && kw == 3 && !depthwise && M * C <= WINO_MAX_MC) {
        p->wino2 = kiln_cpu_nchwc_wino_pack(w, M, C, 2);
        if (M * C <= WINO4_MAX_MC) p->wino4 = kiln_cpu_nchwc_wino_pack(w, M, C, 4);
    }
    return p;
}

bool kiln_cpu_nchwc_conv_shape(const kiln_nchwc_conv *p, int64_t *M, int64_t *C, int64_t *kh, int64_t *kw)
{
    *M = p->M, *C = p->C, *kh = p->kh, *kw = p->kw;
    return p->depthwise;
}

void kiln_cpu_nchwc_conv_unpack(const kiln_nchwc_conv *p, float *dst)
{
    for (int64_t m = 0; m < p->M; m++)
        for (int64_t c = 0; c < p->C; c++)
            for (int64_t i = 0; i < p->kh; i++)
                for (int64_t j = 0; j < p->kw; j++) dst[((m * p->C + c) * p->kh + i) * p->kw + j] = p->w[packed_at(p, m, c, i, j)];
}

/* x [N, C, area] plain into y blocked (to_blocked) or back, an element at a time: where the CPU
 * lacks AVX-512 (ONNX Runtime's reorder nodes run on any CPU). */
static void reorder_scalar(const float *x, float *y, int64_t N, int64_t C, int64_t area, bool to_blocked)
{
    for (int64_t b = 0; b < N; b++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < area; i++) {
                int64_t plain = (b * C + c) * area + i, blocked = (b * C + c / BLK * BLK) * area + i * BLK + c % BLK;
                if (to_blocked) y[blocked] = x[plain];
                else y[plain] = x[blocked];
            }
}

static void reorder(kiln_threadpool *pool, const float *x, float *y, int64_t N, int64_t C, int64_t area, bool to_blocked);

void kiln_cpu_nchwc_block(kiln_threadpool *pool, const float *x, float *y, int64_t N, int64_t C, int64_t area)
{
    if (kiln_cpu_nchwc_available()) reorder(pool, x, y, N, C, area, true);
    else reorder_scalar(x, y, N, C, area, true);
}

void kiln_cpu_nchwc_unblock(kiln_threadpool *pool, const float *x, float *y, int64_t N, int64_t C, int64_t area)
{
    if (kiln_cpu_nchwc_available()) reorder(pool, x, y, N, C, area, false);
    else reorder_scalar(x, y, N, C, area, false);
}

#if defined(__x86_64__)

KILN_TARGET_BEGIN("avx512f")

#include "cpu/act512.h"
#include "cpu/avx512_util.h"

static const float zeros16[BLK] __attribute__((aligned(64)));

/* One call of a convolution: strides in floats of X and Y, and how the output is cut. */
typedef struct conv_job {
    const kiln_nchwc_conv *p;
    const kiln_nchwc_conv_io *io;
    int64_t x_img, x_blk, x_ic, x_row;        /* X's strides: image, 16-channel block, channel, row */
    int64_t y_img, y_plane;                   /* Y's image and plane (oh * ow) */
    int64_t rows, cols;                       /* of the output as the tasks see it (plain X, 1x1: 1, oh * ow) */
    int64_t H, W, sh, sw, dh, dw, pt, pl;     /* the input as the taps see it */
    int64_t tiles, chunks, groups;            /* per row; per row; of output blocks per image */
    int64_t group_blocks;                     /* output blocks per task: GROUP_BLOCKS, or 2 (see plan_tasks) */
    int64_t pass_blocks;                      /* blocked X: input blocks summed per pass over a task's tiles */
    bool pixels_first;                        /* task order: output groups vary fastest (see kiln_cpu_nchwc_conv_run) */
    bool pointwise;                           /* blocked X, 1x1, stride 1, no pads: a tile's pixels are consecutive in X */
    bool clamp;
    float lo, hi;
} conv_job;

/* Stores tile acc (FB blocks from ob0 by P pixels from plane pixel px) with bias already in it:
 * whole vectors into a blocked Y, each channel's P pixels into a plain one. */
#define STORE_TILE(FB, P)                                                                                   \
    do {                                                                                                    \
        __m512 vlo = _mm512_set1_ps(j->lo), vhi = _mm512_set1_ps(j->hi);                                    \
        const bool clamp = j->clamp, y_blocked = io->y_blocked; /* read once, not after every store */       \
        float *const y_at = io->y;                                                                          \
        const float *const res_at = io->res;                                                                \
        _Pragma("GCC unroll 4") for (int f = 0; f < (FB); f++)                                             \
        {                                                                                                   \
            int64_t ob = ob0 + f;                                                                           \
            if (y_blocked) {                                                                                \
                int64_t at = b * j->y_img + ob * j->y_plane * BLK + px * BLK;                               \
                float *y = y_at + at;                                                                       \
                const float *res = res_at ? res_at + at : NULL;                                             \
                _Pragma("GCC unroll 12") for (int q = 0; q < (P); q++)                                     \
                {                                                                                           \
                    __m512 v = acc[f][q];                                                                   \
                    if (res) v = _mm512_add_ps(v, _mm512_loadu_ps(res + q * BLK));                          \
                    v = clamp ? _mm512_min_ps(vhi, _mm512_max_ps(vlo, v)) : kiln_act512(io->act, v);        \
                    _mm512_storeu_ps(y + q * BLK, v);                                                       \
                }                                                                                           \
            } else {                                                                                        \
                __m512 r[BLK];                                                                              \
                _Pragma("GCC unroll 16") for (int q = 0; q < BLK; q++) r[q] = q < (P) ? acc[f][q] : _mm512_setzero_ps(); \
                kiln_transpose16(r);                                                                        \
                int64_t n = p->M - ob * BLK < BLK ? p->M - ob * BLK : BLK;                                  \
                __mmask16 keep = kiln_lanes(P);                                                             \
                for (int64_t c = 0; c < n; c++) {                                                           \
                    int64_t at = b * j->y_img + (ob * BLK + c) * j->y_plane + px;                           \
                    const float *res = res_at ? res_at + at : NULL;                                         \
                    __m512 v = r[c];                                                                        \
                    if (res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, res));                        \
                    v = clamp ? _mm512_min_ps(vhi, _mm512_max_ps(vlo, v)) : kiln_act512(io->act, v);        \
                    _mm512_mask_storeu_ps(y_at + at, keep, v);                                              \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
    } while (0)

#define INIT_ACC(FB, P)                                                                                     \
    _Pragma("GCC unroll 4") for (int f = 0; f < (FB); f++)                                                 \
    {                                                                                                       \
        __m512 bv = _mm512_setzero_ps();                                                                    \
        if (io->bias) bv = _mm512_maskz_loadu_ps(kiln_lanes(p->M - (ob0 + f) * BLK), io->bias + (ob0 + f) * BLK); \
        _Pragma("GCC unroll 12") for (int q = 0; q < (P); q++) acc[f][q] = bv;                             \
    }

/* One input channel c of every pixel against FB blocks of 16 output channels (weights at wp, CN
 * channels per block). */
#define STEP(FB, P, XAT, CN)                                                                                \
    do {                                                                                                    \
        __m512 wv[4];                                                                                       \
        _Pragma("GCC unroll 4") for (int f = 0; f < (FB); f++) wv[f] = _mm512_load_ps(wp + (f * (CN) + c) * BLK); \
        _Pragma("GCC unroll 12") for (int q = 0; q < (P); q++)                                             \
        {                                                                                                   \
            __m512 xv = _mm512_set1_ps(XAT);                                                                \
            _Pragma("GCC unroll 4") for (int f = 0; f < (FB); f++) acc[f][q] = _mm512_fmadd_ps(xv, wv[f], acc[f][q]); \
        }                                                                                                   \
    } while (0)

/* Blocked X: tile of P consecutive pixels of the output plane (rows may wrap) from px, blocks
 * [ob0, ob0 + FB), image b, summing input blocks [cb0, cb1): from the bias when cb0 is 0, else
 * from the partial sums in part ([FB][P][16]), which it overwrites unless cb1 ends the input
 * (then it stores the tile). Each pixel reads its tap through its own pointer, the zero vector
 * where the tap falls outside the input; a tap outside for every pixel is skipped. A pointwise
 * layer's pixels are consecutive in X too: one pointer reaches them all at fixed offsets (twelve
 * pointers set up per tile cost about as much as a 16-channel input's multiply-adds). */
static inline __attribute__((always_inline)) void blocked_tile(const conv_job *j, int64_t b, int64_t ob0, int64_t px,
                                                                int64_t cb0, int64_t cb1, float *part, int FB, int P)
{
    const kiln_nchwc_conv *p = j->p;
    const kiln_nchwc_conv_io *io = j->io;
    const int64_t KH = p->kh, KW = p->kw, CB = p->CB;
    __m512 acc[4][WIDE_PX];
    if (cb0 == 0) {
        INIT_ACC(FB, P);
    } else {
        _Pragma("GCC unroll 4") for (int f = 0; f < FB; f++)
        _Pragma("GCC unroll 12") for (int q = 0; q < P; q++) acc[f][q] = _mm512_load_ps(part + (f * P + q) * BLK);
    }
    /* the FB blocks may be part of a packed group of up to GROUP_BLOCKS (gfb of them, from gob0):
     * each input block's weights are the group's, the FB blocks' from block ob0 - gob0 */
    const int64_t gob0 = ob0 / GROUP_BLOCKS * GROUP_BLOCKS, gfb = p->MB - gob0 < GROUP_BLOCKS ? p->MB - gob0 : GROUP_BLOCKS;
    const float *x = io->x + b * j->x_img + cb0 * j->x_blk;
    const float *wg = p->w + gob0 * p->C * KH * KW * BLK + (ob0 - gob0) * BLK * BLK;
    if (j->pointwise) { /* one pointer, each pixel at a fixed offset from it */
        const float *xq = x + px * BLK, *wp = wg + cb0 * gfb * BLK * BLK;
        for (int64_t ib = cb0; ib < cb1; ib++, xq += j->x_blk, wp += gfb * BLK * BLK) {
            if (ib + 1 < cb1)
#pragma GCC unroll 12
                for (int q = 0; q < P; q++) _mm_prefetch((const char *)(xq + j->x_blk + q * BLK), _MM_HINT_T0);
#pragma GCC unroll 1
            for (int c = 0; c < BLK; c++) {
#pragma GCC unroll 4
                for (int f = 0; f < FB; f++) _mm_prefetch((const char *)(wp + PF_AHEAD + (f * BLK + c) * BLK), _MM_HINT_T0);
                STEP(FB, P, xq[q * BLK + c], BLK);
            }
        }
    } else {
        int64_t iy0[WIDE_PX], ix0[WIDE_PX], oy = px / io->ow, ox = px % io->ow; /* one division per tile */
        for (int q = 0; q < P; q++) {
            iy0[q] = oy * j->sh - j->pt, ix0[q] = ox * j->sw - j->pl;
            if (++ox == io->ow) ox = 0, oy++;
        }
        for (int64_t i = 0; i < KH; i++)
            for (int64_t k = 0; k < KW; k++) {
                const float *xp[WIDE_PX];
                int64_t step[WIDE_PX];
                bool any = false;
#pragma GCC unroll 12
                for (int q = 0; q < P; q++) {
                    int64_t iy = iy0[q] + i * j->dh, ix = ix0[q] + k * j->dw;
                    bool in = iy >= 0 && iy < j->H && ix >= 0 && ix < j->W;
                    xp[q] = in ? x + (iy * j->W + ix) * BLK : zeros16;
                    step[q] = in ? j->x_blk : 0;
                    any |= in;
                }
                if (!any) continue;
                const float *wp = wg + ((i * KW + k) * CB + cb0) * gfb * BLK * BLK;
                for (int64_t ib = cb0; ib < cb1; ib++, wp += gfb * BLK * BLK) {
                    if (ib + 1 < cb1)
#pragma GCC unroll 12
                        for (int q = 0; q < P; q++) _mm_prefetch((const char *)(xp[q] + step[q]), _MM_HINT_T0);
#pragma GCC unroll 1
                    for (int c = 0; c < BLK; c++) {
#pragma GCC unroll 4
                        for (int f = 0; f < FB; f++)
                            _mm_prefetch((const char *)(wp + PF_AHEAD + (f * BLK + c) * BLK), _MM_HINT_T0);
                        STEP(FB, P, xp[q][c], BLK);
                    }
#pragma GCC unroll 12
                    for (int q = 0; q < P; q++) xp[q] += step[q];
                }
            }
    }
    if (cb1 < CB) {
        _Pragma("GCC unroll 4") for (int f = 0; f < FB; f++)
        _Pragma("GCC unroll 12") for (int q = 0; q < P; q++) _mm512_store_ps(part + (f * P + q) * BLK, acc[f][q]);
        return;
    }
    STORE_TILE(FB, P);
}

/* Plain X (without pads: see kiln_cpu_nchwc_conv_run): tile [ox0, ox0 + P) of row oy (of the
 * rows and columns conv_job describes), blocks [ob0, ob0 + FB), image b. */
static inline __attribute__((always_inline)) void plain_tile(const conv_job *j, int64_t b, int64_t ob0, int64_t oy,
                                                              int64_t ox0, int FB, int P)
{
    const kiln_nchwc_conv *p = j->p;
    const kiln_nchwc_conv_io *io = j->io;
    const int64_t KH = p->kh, KW = p->kw, CB = p->CB;
    __m512 acc[4][WIDE_PX];
    INIT_ACC(FB, P);
    const float *x = io->x + b * j->x_img + oy * j->sh * j->x_row + ox0 * j->sw, *wg = p->w + ob0 * p->C * KH * KW * BLK;
    for (int64_t i = 0; i < KH; i++)
        for (int64_t k = 0; k < KW; k++) {
            const float *xr = x + i * j->dh * j->x_row + k * j->dw;
            for (int64_t ib = 0; ib < CB; ib++) {
                const float *wp = wg + ((i * KW + k) * p->C + ib * BLK) * FB * BLK;
                const float *xb = xr + ib * j->x_blk;
                int64_t icn = p->C - ib * BLK < BLK ? p->C - ib * BLK : BLK;
                for (int64_t c = 0; c < icn; c++, xb += j->x_ic) STEP(FB, P, xb[q * j->sw], icn);
            }
        }
    int64_t px = oy * j->cols + ox0;
    STORE_TILE(FB, P);
}

typedef void (*blocked_tile_fn)(const conv_job *j, int64_t b, int64_t ob0, int64_t px, int64_t cb0, int64_t cb1,
                                float *part);
typedef void (*plain_tile_fn)(const conv_job *j, int64_t b, int64_t ob0, int64_t oy, int64_t ox0);
#define BLOCKED_FN(FB, P)                                                                                   \
    static void blocked_##FB##_##P(const conv_job *j, int64_t b, int64_t ob0, int64_t px, int64_t cb0, int64_t cb1, \
                                   float *part)                                                             \
    {                                                                                                       \
        blocked_tile(j, b, ob0, px, cb0, cb1, part, FB, P);                                                 \
    }
#define PLAIN_FN(FB, P)                                                                                     \
    static void plain_##FB##_##P(const conv_job *j, int64_t b, int64_t ob0, int64_t oy, int64_t ox0)       \
    {                                                                                                       \
        plain_tile(j, b, ob0, oy, ox0, FB, P);                                                              \
    }
#define SIX(X, FB) X(FB, 1) X(FB, 2) X(FB, 3) X(FB, 4) X(FB, 5) X(FB, 6)
#define TWELVE(X, FB) SIX(X, FB) X(FB, 7) X(FB, 8) X(FB, 9) X(FB, 10) X(FB, 11) X(FB, 12)
TWELVE(BLOCKED_FN, 1)
TWELVE(BLOCKED_FN, 2)
SIX(BLOCKED_FN, 3)
SIX(BLOCKED_FN, 4)
TWELVE(PLAIN_FN, 1)
TWELVE(PLAIN_FN, 2)
SIX(PLAIN_FN, 3)
SIX(PLAIN_FN, 4)
#define SIX_ROW(X, FB) X##_##FB##_1, X##_##FB##_2, X##_##FB##_3, X##_##FB##_4, X##_##FB##_5, X##_##FB##_6
#define TWELVE_ROW(X, FB) SIX_ROW(X, FB), X##_##FB##_7, X##_##FB##_8, X##_##FB##_9, X##_##FB##_10, X##_##FB##_11, X##_##FB##_12
/* [FB - 1][P - 1]; P past 6 only for FB up to 2 */
static const blocked_tile_fn blocked_tiles[4][WIDE_PX] = {{TWELVE_ROW(blocked, 1)}, {TWELVE_ROW(blocked, 2)},
                                                          {SIX_ROW(blocked, 3)}, {SIX_ROW(blocked, 4)}};
static const plain_tile_fn plain_tiles[4][WIDE_PX] = {{TWELVE_ROW(plain, 1)}, {TWELVE_ROW(plain, 2)},
                                                      {SIX_ROW(plain, 3)}, {SIX_ROW(plain, 4)}};

/* Tile t of a run of n pixels cut into `tiles` nearly equal ones: its first pixel and size. */
static void tile_span(int64_t n, int64_t tiles, int64_t t, int64_t *x0, int64_t *px)
{
    int64_t base = n / tiles, extra = n % tiles; /* the first `extra` tiles get one more */
    *x0 = t * base + (t < extra ? t : extra);
    *px = base + (t < extra);
}

/* A task: chunk `chunk` of the tiles of row oy (blocked X: of the whole plane), FB output
 * blocks from ob0, image b; tiles [t0, t0 + n_tiles) of the row. */
typedef struct conv_task {
    int64_t chunk, oy, ob0, b, t0, n_tiles;
    int FB;
} conv_task;

static conv_task task_at(const conv_job *j, int64_t t)
{
    conv_task k;
    int64_t g;
    if (j->pixels_first) {
        int64_t px_task = t / j->groups;
        g = t % j->groups, k.chunk = px_task % j->chunks, k.oy = px_task / j->chunks % j->rows;
        k.b = px_task / (j->chunks * j->rows);
    } else {
        k.chunk = t % j->chunks, k.oy = t / j->chunks % j->rows, g = t / (j->chunks * j->rows) % j->groups;
        k.b = t / (j->chunks * j->rows * j->groups);
    }
    k.ob0 = g * j->group_blocks;
    k.FB = (int)(j->p->MB - k.ob0 < j->group_blocks ? j->p->MB - k.ob0 : j->group_blocks);
    tile_span(j->tiles, j->chunks, k.chunk, &k.t0, &k.n_tiles);
    return k;
}

/* Task t's multiply-adds per input channel and tap: its output channels by its pixels. */
static double task_cost(void *ctx, int64_t t)
{
    const conv_job *j = ctx;
    conv_task k = task_at(j, t);
    int64_t x0, x1, n;
    tile_span(j->cols, j->tiles, k.t0, &x0, &n);
    tile_span(j->cols, j->tiles, k.t0 + k.n_tiles - 1, &x1, &n);
    return (double)k.FB * (double)(x1 + n - x0);
}

static int64_t conv_task_count(const conv_job *j) { return j->io->N * j->groups * j->rows * j->chunks; }

/* Cuts blocked X's output into tasks: groups of GROUP_BLOCKS output blocks (2 for a layer of up
 * to 32 channels, with wider tiles) by chunks of up to CHUNK_TILES tiles. Where few tasks would
 * leave threads idle (MobileNetV2's 960 -> 160 at 5x5: 3 tasks of 4, 4 and 2 blocks), the
 * chunks get fewer tiles and the groups, if need be, 2 blocks, until the pool shares the
 * tasks evenly (kiln_threadpool_balance at least BALANCED), or as evenly as they can be. */
static void plan_tasks(conv_job *j, kiln_threadpool *pool)
{
    enum { FEW_TASKS_PER_THREAD = 8 };
    const double BALANCED = 0.95;
    int64_t MB = j->p->MB, threads = kiln_threadpool_size(pool);
    conv_job best = *j;
    double best_balance = -1.0;
    for (int64_t gb = MB <= 2 ? 2 : GROUP_BLOCKS; gb >= 2; gb /= 2) { /* blocks per group: 4, then 2 */
        int64_t tile_px = gb <= 2 ? WIDE_PX : TILE_PX;
        j->group_blocks = gb;
        j->tiles = (j->cols + tile_px - 1) / tile_px;
        j->groups = (MB + gb - 1) / gb;
        for (j->chunks = (j->tiles + CHUNK_TILES - 1) / CHUNK_TILES; j->chunks <= j->tiles; j->chunks++) {
            int64_t n = conv_task_count(j);
            double balance = n >= FEW_TASKS_PER_THREAD * threads ? 1.0 : kiln_threadpool_balance(pool, n, task_cost, j);
            if (balance > best_balance) best = *j, best_balance = balance;
            if (best_balance >= BALANCED) {
                *j = best;
                return;
            }
        }
    }
    *j = best;
}

/* Task t (task_at). */
static void conv_tasks(void *ctx, int64_t begin, int64_t end)
{
    const conv_job *j = ctx;
    for (int64_t t = begin; t < end; t++) {
        conv_task k = task_at(j, t);
        int64_t b = k.b, ob0 = k.ob0, oy = k.oy, t0 = k.t0, n_tiles = k.n_tiles;
        int FB = k.FB;
        if (j->io->x_blocked) {
            float part[CHUNK_TILES][4 * TILE_PX * BLK] __attribute__((aligned(64)));
            for (int64_t cb0 = 0; cb0 < j->p->CB; cb0 += j->pass_blocks) {
                int64_t cb1 = cb0 + j->pass_blocks < j->p->CB ? cb0 + j->pass_blocks : j->p->CB;
                for (int64_t ti = t0; ti < t0 + n_tiles; ti++) {
                    int64_t ox0, P;
                    tile_span(j->cols, j->tiles, ti, &ox0, &P);
                    blocked_tiles[FB - 1][P - 1](j, b, ob0, ox0, cb0, cb1, part[ti - t0]);
                }
            }
            continue;
        }
        for (int64_t ti = t0; ti < t0 + n_tiles; ti++) {
            int64_t ox0, P;
            tile_span(j->cols, j->tiles, ti, &ox0, &P);
            plain_tiles[FB - 1][P - 1](j, b, ob0, oy, ox0);
        }
    }
}

static kiln_status nchwc_dw_run(kiln_threadpool *pool, const kiln_nchwc_conv *p, const kiln_nchwc_conv_io *io);

/* X [N, C, H, W] plain into dst [N, C, Hp, Wp] with pt rows and pl columns of zeros before each
 * plane's, and zeros after up to Hp and Wp (or only the rows and columns that fit). */
typedef struct pad_job {
    const float *x;
    float *dst;
    int64_t H, W, pt, pl, Hp, Wp;
} pad_job;

/* Task t: row t of the padded planes. */
static void pad_rows(void *ctx, int64_t begin, int64_t end)
{
    const pad_job *j = ctx;
    int64_t w = j->W < j->Wp - j->pl ? j->W : j->Wp - j->pl; /* the columns kept */
    for (int64_t t = begin; t < end; t++) {
        float *d = j->dst + t * j->Wp;
        int64_t plane = t / j->Hp, i = t % j->Hp - j->pt;
        if (i < 0 || i >= j->H || w <= 0) {
            memset(d, 0, (size_t)j->Wp * sizeof *d);
            continue;
        }
        memset(d, 0, (size_t)j->pl * sizeof *d);
        memcpy(d + j->pl, j->x + (plane * j->H + i) * j->W, (size_t)w * sizeof *d);
        memset(d + j->pl + w, 0, (size_t)(j->Wp - j->pl - w) * sizeof *d);
    }
}

kiln_status kiln_cpu_nchwc_conv_run(kiln_threadpool *pool, const kiln_nchwc_conv *p, const kiln_nchwc_conv_io *io)
{
    if (p->depthwise) return nchwc_dw_run(pool, p, io);
    if ((io->x_blocked && p->C % BLK) || (io->y_blocked && p->M % BLK)) return KILN_ERR_INVALID_ARG;
    if (io->N <= 0 || io->oh <= 0 || io->ow <= 0) return KILN_OK;
    if (p->wino2 && io->strides[0] == 1 && io->strides[1] == 1 && io->dilations[0] == 1 && io->dilations[1] == 1 &&
        io->oh * io->ow >= WINO_MIN_PX) {
        int64_t tiles2 = (io->oh + 1) / 2 * ((io->ow + 1) / 2), tiles4 = (io->oh + 3) / 4 * ((io->ow + 3) / 4);
        /* a plain X (its channels a multiple of 16: a Concat of narrower values before the layer)
         * is blocked into scratch first, as ONNX Runtime's ReorderInput does */
        kiln_nchwc_conv_io blocked_io = *io;
        float *xb = NULL;
        if (!io->x_blocked) {
            xb = kiln_scratch_get(io->scratch, (size_t)(io->N * p->C * io->H * io->W) * sizeof *xb);
            if (!xb) return KILN_ERR_NOMEM;
            kiln_cpu_nchwc_block(pool, io->x, xb, io->N, p->C, io->H * io->W);
            blocked_io.x = xb, blocked_io.x_blocked = true;
        }
        kiln_status st = p->wino4 && 36 * tiles4 * 3 <= 16 * tiles2 * 2
                             ? kiln_cpu_nchwc_wino_run(pool, p->wino4, 4, p->M, p->C, &blocked_io)
                             : kiln_cpu_nchwc_wino_run(pool, p->wino2, 2, p->M, p->C, &blocked_io);
        kiln_scratch_put(io->scratch, xb);
        return st;
    }
    /* a plain X with pads (a network's image into its stem) runs from a copy with the pads as
     * zeros, exactly the rows and columns the taps reach: every tile then runs whole, all its
     * taps inside (at the edges they would go pixel by pixel) */
    kiln_nchwc_conv_io padded_io = *io;
    float *padded = NULL;
    if (!io->x_blocked && (io->pads[0] || io->pads[1])) {
        int64_t Hp = (io->oh - 1) * io->strides[0] + (p->kh - 1) * io->dilations[0] + 1;
        int64_t Wp = (io->ow - 1) * io->strides[1] + (p->kw - 1) * io->dilations[1] + 1;
        padded = kiln_scratch_get(io->scratch, (size_t)(io->N * p->C * Hp * Wp) * sizeof *padded);
        if (!padded) return KILN_ERR_NOMEM;
        pad_job pj = {io->x, padded, io->H, io->W, io->pads[0], io->pads[1], Hp, Wp};
        int64_t rows = io->N * p->C * Hp;
        kiln_threadpool_parallel_for(rows * Wp >= (1 << 16) ? pool : NULL, rows, pad_rows, &pj);
        padded_io.x = padded, padded_io.H = Hp, padded_io.W = Wp, padded_io.pads[0] = padded_io.pads[1] = 0;
        io = &padded_io;
    }
    int64_t area = io->H * io->W;
    conv_job j = {.p = p, .io = io, .x_img = p->C * area, .x_blk = BLK * area, .x_ic = io->x_blocked ? 1 : area,
                  .x_row = io->x_blocked ? BLK * io->W : io->W, .y_img = p->M * io->oh * io->ow,
                  .y_plane = io->oh * io->ow, .rows = io->oh, .cols = io->ow, .H = io->H, .W = io->W,
                  .sh = io->strides[0], .sw = io->strides[1], .dh = io->dilations[0], .dw = io->dilations[1],
                  .pt = io->pads[0], .pl = io->pads[1]};
    if (io->x_blocked) {
        j.rows = 1, j.cols = j.y_plane; /* tiles run over the whole plane */
        j.pointwise = p->kh == 1 && p->kw == 1 && j.sh == 1 && j.sw == 1 && io->oh == io->H && io->ow == io->W;
    } else if (p->kh == 1 && p->kw == 1 && j.sh == 1 && j.sw == 1 && io->oh == io->H && io->ow == io->W) {
        j.rows = 1, j.cols = area, j.H = 1, j.W = area, j.x_row = 0; /* one row of all the pixels */
    }
    j.clamp = kiln_cpu_act_clamp(io->act, &j.lo, &j.hi);
    /* the pool hands each thread a contiguous share of the tasks. Where the activations outweigh
     * the weights (ResNet-50 down to 28x28), the share is a range of pixels for all output
     * channels, so a thread mostly reads what it wrote in the layer before (from its own L2) and
     * the next layer finds its pixels there too; where the weights outweigh them (14x14 and 7x7),
     * it is a range of output channels, so each thread streams only its part of the weights.
     * ResNet-50 at 224: the 28x28 1x1 layers 10-20% faster in the model, 4% end to end (5% at
     * 288; best of 20 runs, alternating processes). */
    double w_floats = (double)(p->M * p->C * p->kh * p->kw);
    double act_floats = (double)io->N * (double)(p->C * area + p->M * j.y_plane);
    j.pixels_first = act_floats >= 2 * w_floats;
    double macs = (double)io->N * (double)j.y_plane * (double)p->M * (double)p->C * (double)(p->kh * p->kw);
    /* under about 256K multiply-adds (a microsecond or two) waking the pool costs more */
    if (macs < (double)(1 << 18)) pool = NULL;
    plan_tasks(&j, io->x_blocked ? pool : NULL);
    /* a 1x1 layer with over PASS_MIN_KB of weights per group (ResNet-50's 1024 -> 256, whose
     * weights would stream from L2 into every tile) sums its input in passes of PASS_KB of
     * weights, which stay in L1 across the task's tiles: about 20% faster per layer with cold
     * activations, 6% in a chain of them; no gain with less weight, a loss for 3x3 layers */
    int64_t block_kb = p->MB < j.group_blocks ? p->MB : j.group_blocks; /* one input block of a group */
    j.pass_blocks = p->kh * p->kw == 1 && p->CB * block_kb > PASS_MIN_KB ? PASS_KB / block_kb : p->CB;
    kiln_threadpool_parallel_for(pool, conv_task_count(&j), conv_tasks, &j);
    kiln_scratch_put(io->scratch, padded);
    return KILN_OK;
}

/* ---- depthwise: each 16-channel block's pixels, one vector per pixel and tap ---- */

typedef struct dw_job {
    const kiln_nchwc_conv *p;
    const kiln_nchwc_conv_io *io;
    int64_t plane_in, plane_out;
    bool rows_first; /* task order: rows vary fastest (see dw_tasks) */
    bool clamp;
    float lo, hi;
} dw_job;

/* tiles: up to DW_PX pixels; a 3x3 or 5x5 layer's (dwk_tile), up to DWK_PX */
enum { DW_PX = 8, DWK_PX = 16 };

/* Stores a depthwise tile: n pixels of acc at y (res: the residual at the same place, or NULL),
 * the clamp and the residual decided once for the tile, not per pixel. */
static inline __attribute__((always_inline)) void dw_store(const dw_job *j, __m512 *acc, int n, float *y,
                                                            const float *res)
{
    if (!j->clamp) {
#pragma GCC unroll 16
        for (int q = 0; q < n; q++) {
            __m512 v = res ? _mm512_add_ps(acc[q], _mm512_loadu_ps(res + q * BLK)) : acc[q];
            _mm512_storeu_ps(y + q * BLK, kiln_act512(j->io->act, v));
        }
        return;
    }
    __m512 vlo = _mm512_set1_ps(j->lo), vhi = _mm512_set1_ps(j->hi);
    if (res)
#pragma GCC unroll 16
        for (int q = 0; q < n; q++) acc[q] = _mm512_add_ps(acc[q], _mm512_loadu_ps(res + q * BLK));
#pragma GCC unroll 16
    for (int q = 0; q < n; q++) _mm512_storeu_ps(y + q * BLK, _mm512_min_ps(vhi, _mm512_max_ps(vlo, acc[q])));
}

/* One output row of one block, as a task sees it. */
typedef struct dw_row {
    const float *x, *w; /* the input plane, the block's weights */
    float *y;           /* the output row */
    const float *res;   /* the residual row, or NULL */
    __m512 bias;
    int64_t iy0, i_lo, i_hi; /* the input row of tap row 0; the tap rows that land */
} dw_row;

/* P pixels from ox0 whose taps all land inside the row: each tap read at a fixed offset. */
static inline __attribute__((always_inline)) void dw_tile(const dw_job *j, const dw_row *r, int64_t ox0, int P)
{
    const kiln_nchwc_conv_io *io = j->io;
    const int64_t KW = j->p->kw, W = io->W, sw = io->strides[1], dw = io->dilations[1];
    __m512 acc[DW_PX];
    for (int q = 0; q < P; q++) acc[q] = r->bias;
    for (int64_t i = r->i_lo; i < r->i_hi; i++) {
        const float *xr = r->x + ((r->iy0 + i * io->dilations[0]) * W + ox0 * sw - io->pads[1]) * BLK;
        for (int64_t k = 0; k < KW; k++) {
            __m512 wv = _mm512_load_ps(r->w + (i * KW + k) * BLK);
            const float *xp = xr + k * dw * BLK;
#pragma GCC unroll 8
            for (int q = 0; q < P; q++) acc[q] = _mm512_fmadd_ps(_mm512_loadu_ps(xp + q * sw * BLK), wv, acc[q]);
        }
    }
    dw_store(j, acc, P, r->y + ox0 * BLK, r->res ? r->res + ox0 * BLK : NULL);
}

typedef void (*dw_tile_fn)(const dw_job *j, const dw_row *r, int64_t ox0);
#define DW_FN(P)                                                                                            \
    static void dw_tile_##P(const dw_job *j, const dw_row *r, int64_t ox0) { dw_tile(j, r, ox0, P); }
DW_FN(1) DW_FN(2) DW_FN(3) DW_FN(4) DW_FN(5) DW_FN(6) DW_FN(7) DW_FN(8)
static const dw_tile_fn dw_tiles[DW_PX] = {dw_tile_1, dw_tile_2, dw_tile_3, dw_tile_4,
                                           dw_tile_5, dw_tile_6, dw_tile_7, dw_tile_8};

/* A KxK layer's (3x3 or 5x5) P pixels from ox0 at stride S (all constants): the input columns
 * they read (from ox0 S - pad) each loaded once into a register and multiplied into every pixel
 * it is a tap of; lo / hi: how many of the first / last of those columns lie outside the row (at
 * most the pad), so the tiles cover a whole row, edges included. The generic tiles (taps, strides
 * and stores decided at run time, 8 pixels, each tap a load of its own, the edges pixel by pixel)
 * ran MobileNetV2's 3x3 layers at a third of the multiply-add rate, with the data in L1 as in L2.
 * One thread, blocked layers alone: 32 channels at 80x80 69 -> 34 us, 144 at 40x40 88 -> 52, 576
 * at 10x10 23 -> 12, 960 at 5x5 13 -> 7.5 (96 at 80x80, 2.4 MB each way, stays memory-bound: 213
 * -> 202); MobileNetV2 0.95 / 0.95 / 0.96 at 160 / 224 / 288 (two threads, alternating
 * processes). */
static inline __attribute__((always_inline)) void dwk_tile(const dw_job *j, const dw_row *r, int64_t ox0, int lo,
                                                            int hi, int P, int S, int K)
{
    const kiln_nchwc_conv_io *io = j->io;
    __m512 acc[DWK_PX];
#pragma GCC unroll 16
    for (int q = 0; q < P; q++) acc[q] = r->bias;
    const float *x0 = r->x + (r->iy0 * io->W + ox0 * S - io->pads[1]) * BLK;
    const int cols = (P - 1) * S + K;
    for (int64_t i = r->i_lo; i < r->i_hi; i++) {
        const float *xr = x0 + i * io->W * BLK, *w = r->w + i * K * BLK;
        __m512 wk[5];
#pragma GCC unroll 5
        for (int k = 0; k < K; k++) wk[k] = _mm512_load_ps(w + k * BLK);
        /* column m is tap m - S q of pixel q */
#pragma GCC unroll 36
        for (int m = 0; m < cols; m++) {
            if (m < lo || m >= cols - hi) continue;
            __m512 xv = _mm512_loadu_ps(xr + m * BLK);
            __asm__("" : "+v"(xv)); /* kept in a register for its taps, not loaded again by each */
#pragma GCC unroll 5
            for (int k = 0; k < K; k++) {
                int q = (m - k) / S;
                if (m - k >= 0 && (m - k) % S == 0 && q < P) acc[q] = _mm512_fmadd_ps(xv, wk[k], acc[q]);
            }
        }
    }
    dw_store(j, acc, P, r->y + ox0 * BLK, r->res ? r->res + ox0 * BLK : NULL);
}

typedef void (*dwk_tile_fn)(const dw_job *j, const dw_row *r, int64_t ox0, int lo, int hi);
#define DWK_FN(P, S, K)                                                                                     \
    static void dwk_tile_##P##_##S##_##K(const dw_job *j, const dw_row *r, int64_t ox0, int lo, int hi)     \
    {                                                                                                       \
        dwk_tile(j, r, ox0, lo, hi, P, S, K);                                                               \
    }
#define DWK_P(P) DWK_FN(P, 1, 3) DWK_FN(P, 2, 3) DWK_FN(P, 1, 5) DWK_FN(P, 2, 5)
DWK_P(1) DWK_P(2) DWK_P(3) DWK_P(4) DWK_P(5) DWK_P(6) DWK_P(7) DWK_P(8)
DWK_P(9) DWK_P(10) DWK_P(11) DWK_P(12) DWK_P(13) DWK_P(14) DWK_P(15) DWK_P(16)
#define DWK_ROW(S, K)                                                                                       \
    {dwk_tile_1_##S##_##K, dwk_tile_2_##S##_##K, dwk_tile_3_##S##_##K, dwk_tile_4_##S##_##K,                \
     dwk_tile_5_##S##_##K, dwk_tile_6_##S##_##K, dwk_tile_7_##S##_##K, dwk_tile_8_##S##_##K,                \
     dwk_tile_9_##S##_##K, dwk_tile_10_##S##_##K, dwk_tile_11_##S##_##K, dwk_tile_12_##S##_##K,             \
     dwk_tile_13_##S##_##K, dwk_tile_14_##S##_##K, dwk_tile_15_##S##_##K, dwk_tile_16_##S##_##K}
/* [K == 5][stride - 1][P - 1] */
static const dwk_tile_fn dwk_tiles[2][2][DWK_PX] = {{DWK_ROW(1, 3), DWK_ROW(2, 3)}, {DWK_ROW(1, 5), DWK_ROW(2, 5)}};

/* Output pixel ox with only the taps that land inside the row. */
static void dw_edge(const dw_job *j, const dw_row *r, int64_t ox)
{
    const kiln_nchwc_conv_io *io = j->io;
    const int64_t KW = j->p->kw, W = io->W, dw = io->dilations[1], ix0 = ox * io->strides[1] - io->pads[1];
    __m512 acc = r->bias;
    for (int64_t i = r->i_lo; i < r->i_hi; i++) {
        const float *xr = r->x + (r->iy0 + i * io->dilations[0]) * W * BLK;
        for (int64_t k = 0; k < KW; k++)
            if (ix0 + k * dw >= 0 && ix0 + k * dw < W)
                acc = _mm512_fmadd_ps(_mm512_load_ps(xr + (ix0 + k * dw) * BLK), _mm512_load_ps(r->w + (i * KW + k) * BLK), acc);
    }
    dw_store(j, &acc, 1, r->y + ox * BLK, r->res ? r->res + ox * BLK : NULL);
}

/* Task t: output row oy of block cb of image b: the pixels whose taps all land inside the row
 * in tiles of up to DW_PX (nearly equal), the others (the edges) one by one. A thread's share
 * of the tasks is what the 1x1 layers around a depthwise one take as theirs (see
 * kiln_cpu_nchwc_conv_run): where the input plane has at least as many pixels as channels, a
 * band of rows (blocks vary fastest), else a range of blocks (rows vary fastest), so a thread
 * mostly reads what it wrote. */
static void dw_tasks(void *ctx, int64_t begin, int64_t end)
{
    const dw_job *j = ctx;
    const kiln_nchwc_conv *p = j->p;
    const kiln_nchwc_conv_io *io = j->io;
    const int64_t KH = p->kh, KW = p->kw, ow = io->ow, sw = io->strides[1];
    /* [in_lo, in_hi): the output columns whose taps all land inside the row */
    int64_t in_lo = (io->pads[1] + sw - 1) / sw, span = io->W - (KW - 1) * io->dilations[1] + io->pads[1];
    int64_t in_hi = span > 0 ? (span - 1) / sw + 1 : 0;
    if (in_hi > ow) in_hi = ow;
    if (in_lo > in_hi) in_lo = in_hi;
    /* a 3x3 or 5x5 layer without dilation, stride 1 or 2, whose rows reach at most half the
     * kernel past either end: whole rows in dwk tiles (a later tile starts at least 8 pixels in,
     * past any pad) */
    int64_t over = (ow - 1) * sw - io->pads[1] + KW - io->W; /* columns past the right end */
    bool kk = KH == KW && (KW == 3 || KW == 5) && io->dilations[0] == 1 && io->dilations[1] == 1 &&
              (sw == 1 || sw == 2) && io->pads[1] <= KW / 2 && over <= KW / 2;
    int64_t tiles = kk ? (ow + DWK_PX - 1) / DWK_PX : (in_hi - in_lo + DW_PX - 1) / DW_PX;
    /* the task's block, row and image: decoded once, then stepped (a small plane's row costs
     * about as much as the divisions that would decode it) */
    int64_t cb = begin % p->MB, oy = begin / p->MB % io->oh, b = begin / (io->oh * p->MB);
    if (j->rows_first) oy = begin % io->oh, cb = begin / io->oh % p->MB;
    const int64_t base = kk ? ow / tiles : 0, extra = kk ? ow % tiles : 0; /* tile_span's, for whole rows */
    const dwk_tile_fn *row_tiles = kk ? dwk_tiles[KW == 5][sw - 1] : NULL;
    const int lo = kk ? (int)io->pads[1] : 0, hi = kk && over > 0 ? (int)over : 0;
    for (int64_t t = begin; t < end; t++) {
        if (t > begin && j->rows_first) {
            if (++oy == io->oh) oy = 0, cb++;
            if (cb == p->MB) cb = 0, b++;
        } else if (t > begin) {
            if (++cb == p->MB) cb = 0, oy++;
            if (oy == io->oh) oy = 0, b++;
        }
        int64_t plane = b * p->MB + cb;
        dw_row r = {.x = io->x + plane * j->plane_in, .w = p->w + cb * KH * KW * BLK,
                    .y = io->y + plane * j->plane_out + oy * ow * BLK,
                    .res = io->res ? io->res + plane * j->plane_out + oy * ow * BLK : NULL,
                    .bias = io->bias ? _mm512_loadu_ps(io->bias + cb * BLK) : _mm512_setzero_ps(),
                    .iy0 = oy * io->strides[0] - io->pads[0], .i_lo = 0, .i_hi = KH};
        while (r.i_lo < KH && r.iy0 + r.i_lo * io->dilations[0] < 0) r.i_lo++;
        while (r.i_hi > r.i_lo && r.iy0 + (r.i_hi - 1) * io->dilations[0] >= io->H) r.i_hi--;
        if (kk) {
            for (int64_t ti = 0, ox0 = 0; ti < tiles; ti++) {
                int64_t n = base + (ti < extra);
                row_tiles[n - 1](j, &r, ox0, ti == 0 ? lo : 0, ti == tiles - 1 ? hi : 0);
                ox0 += n;
            }
            continue;
        }
        for (int64_t ox = 0; ox < in_lo; ox++) dw_edge(j, &r, ox);
        for (int64_t ti = 0; ti < tiles; ti++) {
            int64_t ox0, n;
            tile_span(in_hi - in_lo, tiles, ti, &ox0, &n);
            dw_tiles[n - 1](j, &r, in_lo + ox0);
        }
        for (int64_t ox = in_hi; ox < ow; ox++) dw_edge(j, &r, ox);
    }
}

static kiln_status nchwc_dw_run(kiln_threadpool *pool, const kiln_nchwc_conv *p, const kiln_nchwc_conv_io *io)
{
    if (!io->x_blocked || !io->y_blocked || p->M % BLK) return KILN_ERR_INVALID_ARG;
    if (io->N <= 0 || io->oh <= 0 || io->ow <= 0) return KILN_OK;
    /* MobileNetV2 at 160x160, two threads: the 10x10 and 5x5 layers (and 10x10 -> 5x5) 0.61-0.73
     * of the time with rows first, the 20x20 -> 10x10 one 1.24 and 40x40 -> 20x20 1.31 */
    dw_job j = {.p = p, .io = io, .plane_in = io->H * io->W * BLK, .plane_out = io->oh * io->ow * BLK,
                .rows_first = io->H * io->W < p->M};
    j.clamp = kiln_cpu_act_clamp(io->act, &j.lo, &j.hi);
    int64_t tasks = io->N * p->MB * io->oh;
    double work = (double)tasks * (double)io->ow * (double)(p->kh * p->kw) * BLK;
    kiln_threadpool_parallel_for(work >= (double)(1 << 16) ? pool : NULL, tasks, dw_tasks, &j);
    return KILN_OK;
}

/* ---- pooling ---- */

/* NaN-propagating max step (as the plain kernels): v replaces m where larger or NaN, unless m is NaN. */
static inline __m512 max_step16(__m512 m, __m512 v)
{
    __mmask16 take = (_mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) &
                     _mm512_cmp_ps_mask(m, m, _CMP_ORD_Q);
    return _mm512_mask_blend_ps(take, m, v);
}

/* Task t: output row oy of block cb of image b. */
static void pool_tasks(void *ctx, int64_t begin, int64_t end)
{
    const kiln_nchwc_pool_io *io = ctx;
    int64_t KH = io->kernel[0], KW = io->kernel[1], H = io->H, W = io->W;
    for (int64_t t = begin; t < end; t++) {
        int64_t oy = t % io->oh, plane = t / io->oh;
        const float *x = io->x + plane * H * W * BLK;
        float *y = io->y + (plane * io->oh + oy) * io->ow * BLK;
        int64_t iy0 = oy * io->strides[0] - io->pads[0], ny = 0, cy = 0;
        for (int64_t i = 0; i < KH; i++) {
            int64_t iy = iy0 + i * io->dilations[0];
            cy += iy < H + io->pads[2];
            ny += iy >= 0 && iy < H;
        }
        for (int64_t ox = 0; ox < io->ow; ox++) {
            int64_t ix0 = ox * io->strides[1] - io->pads[1], nx = 0, cx = 0;
            __m512 m = _mm512_set1_ps(-INFINITY), s = _mm512_setzero_ps();
            for (int64_t k = 0; k < KW; k++) {
                int64_t ix = ix0 + k * io->dilations[1];
                cx += ix < W + io->pads[3];
                if (ix < 0 || ix >= W) continue;
                nx++;
                for (int64_t i = 0; i < KH; i++) {
                    int64_t iy = iy0 + i * io->dilations[0];
                    if (iy < 0 || iy >= H) continue;
                    __m512 v = _mm512_loadu_ps(x + (iy * W + ix) * BLK);
                    if (io->max) m = max_step16(m, v);
                    else s = _mm512_add_ps(s, v);
                }
            }
            if (io->max) _mm512_storeu_ps(y + ox * BLK, ny && nx ? m : _mm512_setzero_ps());
            else {
                float cnt = (float)(io->count_include_pad ? cy * cx : ny * nx), a[BLK];
                _mm512_storeu_ps(a, s);
                for (int l = 0; l < BLK; l++) y[ox * BLK + l] = (float)((double)a[l] / (double)cnt);
            }
        }
    }
}

void kiln_cpu_nchwc_pool_run(kiln_threadpool *pool, const kiln_nchwc_pool_io *io)
{
    int64_t tasks = io->N * (io->C / BLK) * io->oh;
    if (tasks <= 0 || io->ow <= 0) return;
    double work = (double)tasks * (double)io->ow * (double)(io->kernel[0] * io->kernel[1]) * BLK;
    kiln_threadpool_parallel_for(work >= (double)(1 << 16) ? pool : NULL, tasks, pool_tasks, (void *)io);
}

typedef struct gavg_job {
    const float *x;
    float *y;
    int64_t area;
} gavg_job;

/* Task t: block t of all images: the sum of its pixels in double, then the mean. */
static void gavg_tasks(void *ctx, int64_t begin, int64_t end)
{
    const gavg_job *j = ctx;
    for (int64_t t = begin; t < end; t++) {
        const float *x = j->x + t * j->area * BLK;
        __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
        for (int64_t i = 0; i < j->area; i++) {
            __m512 v = _mm512_loadu_ps(x + i * BLK);
            lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
            hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
        }
        __m512d n = _mm512_set1_pd((double)j->area);
        __m256 a = _mm512_cvtpd_ps(_mm512_div_pd(lo, n)), b = _mm512_cvtpd_ps(_mm512_div_pd(hi, n));
        _mm256_storeu_ps(j->y + t * BLK, a);
        _mm256_storeu_ps(j->y + t * BLK + 8, b);
    }
}

/* Task t: block t of all images: its pixels in order through max_step16 (one chain, so the
 * first NaN of each channel is kept, as the plain kernel keeps it). */
static void gmax_tasks(void *ctx, int64_t begin, int64_t end)
{
    const gavg_job *j = ctx;
    for (int64_t t = begin; t < end; t++) {
        const float *x = j->x + t * j->area * BLK;
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int64_t i = 0; i < j->area; i++) m = max_step16(m, _mm512_loadu_ps(x + i * BLK));
        _mm512_storeu_ps(j->y + t * BLK, m);
    }
}

void kiln_cpu_nchwc_global_pool(kiln_threadpool *pool, const float *x, float *y, int64_t N, int64_t C, int64_t area,
                                bool max)
{
    gavg_job j = {x, y, area};
    int64_t tasks = N * (C / BLK);
    kiln_threadpool_parallel_for(tasks * area * BLK >= (1 << 16) ? pool : NULL, tasks, max ? gmax_tasks : gavg_tasks,
                                 &j);
}

/* ---- nearest resize ---- */

/* Task t: output row oy of block cb of image b (t = (b * C / 16 + cb) * oh + oy): a row whose
 * source row is the previous output row's, in the same task range, is a copy of that row (an
 * upsampling by 2 copies every other row whole). */
static void resize_tasks(void *ctx, int64_t begin, int64_t end)
{
    const kiln_nchwc_resize_io *io = ctx;
    const int64_t ow = io->ow, row = ow * BLK;
    for (int64_t t = begin; t < end; t++) {
        int64_t oy = t % io->oh, plane = t / io->oh;
        float *y = io->y + t * row;
        if (t > begin && oy > 0 && io->iy[oy] == io->iy[oy - 1]) {
            memcpy(y, y - row, (size_t)row * sizeof *y);
            continue;
        }
        const float *x = io->x + (plane * io->H + io->iy[oy]) * io->W * BLK;
        for (int64_t ox = 0; ox < ow; ox++) _mm512_storeu_ps(y + ox * BLK, _mm512_loadu_ps(x + io->ix[ox] * BLK));
    }
}

void kiln_cpu_nchwc_resize_nearest(kiln_threadpool *pool, const kiln_nchwc_resize_io *io)
{
    int64_t tasks = io->N * (io->C / BLK) * io->oh;
    if (tasks <= 0 || io->ow <= 0) return;
    double work = (double)tasks * (double)io->ow * BLK;
    kiln_threadpool_parallel_for(work >= (double)(1 << 16) ? pool : NULL, tasks, resize_tasks, (void *)io);
}

/* ---- layout reorders: 16 channels by 16 pixels at a time, turned over in registers ---- */

enum { REORDER_PX = 256 }; /* pixels per task */

typedef struct reorder_job {
    const float *x;
    float *y;
    int64_t C, area, chunks; /* chunks: tasks per 16-channel block */
    bool to_blocked;
} reorder_job;

/* Task t: pixels [REORDER_PX * chunk, ...) of one block of 16 channels of one image. */
static void reorder_tasks(void *ctx, int64_t begin, int64_t end)
{
    const reorder_job *j = ctx;
    for (int64_t t = begin; t < end; t++) {
        int64_t blk = t / j->chunks, p0 = t % j->chunks * REORDER_PX;
        int64_t p1 = p0 + REORDER_PX < j->area ? p0 + REORDER_PX : j->area;
        const float *x = j->x + blk * BLK * j->area; /* the block's 16 planes, or its [area][16] */
        float *y = j->y + blk * BLK * j->area;
        for (int64_t i = p0; i < p1; i += BLK) {
            int n = p1 - i < BLK ? (int)(p1 - i) : BLK;
            __mmask16 keep = kiln_lanes(n);
            __m512 r[BLK];
            if (j->to_blocked) {
                for (int c = 0; c < BLK; c++) r[c] = _mm512_maskz_loadu_ps(keep, x + c * j->area + i);
                kiln_transpose16(r); /* r[q]: pixel i + q's 16 channels */
                for (int q = 0; q < n; q++) _mm512_storeu_ps(y + (i + q) * BLK, r[q]);
            } else {
                for (int q = 0; q < BLK; q++) r[q] = q < n ? _mm512_loadu_ps(x + (i + q) * BLK) : _mm512_setzero_ps();
                kiln_transpose16(r); /* r[c]: channel c's pixels i .. i + 15 */
                for (int c = 0; c < BLK; c++) _mm512_mask_storeu_ps(y + c * j->area + i, keep, r[c]);
            }
        }
    }
}

static void reorder(kiln_threadpool *pool, const float *x, float *y, int64_t N, int64_t C, int64_t area, bool to_blocked)
{
    if (N <= 0 || C <= 0 || area <= 0) return;
    reorder_job j = {x, y, C, area, (area + REORDER_PX - 1) / REORDER_PX, to_blocked};
    double floats = (double)N * (double)C * (double)area;
    kiln_threadpool_parallel_for(floats >= (double)(1 << 16) ? pool : NULL, N * (C / BLK) * j.chunks, reorder_tasks, &j);
}

KILN_TARGET_END

#else /* not x86-64: kiln_cpu_nchwc_available() is false, nothing is packed */

static void reorder(kiln_threadpool *pool, const float *x, float *y, int64_t N, int64_t C, int64_t area, bool to_blocked)
{
    (void)pool;
    reorder_scalar(x, y, N, C, area, to_blocked);
}

kiln_status kiln_cpu_nchwc_conv_run(kiln_threadpool *pool, const kiln_nchwc_conv *p, const kiln_nchwc_conv_io *io)
{
    (void)pool, (void)p, (void)io;
    return KILN_ERR_INVALID_ARG;
}

void kiln_cpu_nchwc_pool_run(kiln_threadpool *pool, const kiln_nchwc_pool_io *io) { (void)pool, (void)io; }

void kiln_cpu_nchwc_global_pool(kiln_threadpool *pool, const float *x, float *y, int64_t N, int64_t C, int64_t area,
                                bool max)
{
    (void)pool, (void)x, (void)y, (void)N, (void)C, (void)area, (void)max;
}

void kiln_cpu_nchwc_resize_nearest(kiln_threadpool *pool, const kiln_nchwc_resize_io *io) { (void)pool, (void)io; }

#endif
