/* nchwc_winograd.c - Winograd F(2x2, 3x3) and F(4x4, 3x3) between blocked activations (see
 * nchwc_winograd.h).
 *
 * With d an n x n input tile (each element a vector of 16 channels, n = m + 2), g a 3x3 kernel,
 * the m x m output tile is A^T [sum over input channels of (G g G^T) * (B^T d B)] A. F(2x2, 3x3):
 *     B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
 *     A^T = [1 1 1 0; 0 1 -1 -1]
 * (additions only; 16 multiplies per 4 outputs). F(4x4, 3x3), interpolation points 0, 1, -1,
 * 2, -2 and infinity: B^T and A^T at bt6 and at6 below, G = [1/4 0 0; -1/6 -1/6 -1/6;
 * -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1] (36 multiplies per 16 outputs; the
 * transforms read and write 2.25 vectors per output instead of 4). The sum is n^2 independent
 * products (one per point of the tile) of the tiles' transformed inputs [tiles x C] by the
 * transformed weights [C x M]. Those run as the direct kernels' tiles do (nchwc.c): up to 4
 * output blocks by up to 6 tiles, 24 accumulators, each step one input channel of each tile
 * broadcast against 16 weights of each block. */
#include "cpu/nchwc_winograd.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/pages.h"
#include "core/scratch.h"
#include "cpu/kernels.h"
#include "cpu/target.h"

/* points of a transformed tile (at most); output blocks per task; tiles per product tile */
enum { BLK = KILN_NCHWC_BLOCK, PTS_MAX = 36, GROUP_BLOCKS = 4, SUB_TILES = 6 };
/* tiles per task: an image of up to BATCH_MAX tiles is one batch, so each group's weights (1 MB
 * for 256 channels in and out) stream from memory once (ResNet-50's 14x14 256-channel layer 0.79
 * ms in batches of 24 or 48 tiles, 0.62 ms in one of 49); larger images in equal batches of up
 * to BATCH_TILES (six whole product tiles), whose transformed inputs stay in L2 */
enum { BATCH_TILES = 36, BATCH_MAX = 64 };

float *kiln_cpu_nchwc_wino_pack(const float *w, int64_t M, int64_t C, int m)
{
    if (M <= 0 || C <= 0 || C % BLK || (m != 2 && m != 4)) return NULL;
    static const double G2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    static const double G4[6][3] = {{1.0 / 4, 0, 0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                    {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
    const double(*G)[3] = m == 2 ? G2 : G4;
    int n = m + 2, pts = n * n;
    int64_t MB = (M + BLK - 1) / BLK;
    float *u = kiln_pages_alloc((size_t)(pts * C * MB * BLK) * sizeof *u);
    if (!u) return NULL;
    for (int64_t ob0 = 0; ob0 < MB; ob0 += GROUP_BLOCKS) {
        int64_t fb = MB - ob0 < GROUP_BLOCKS ? MB - ob0 : GROUP_BLOCKS;
        float *ug = u + ob0 * pts * C * BLK;
        for (int64_t c = 0; c < C; c++) /* each point's [C][fb][16] written in order */
            for (int64_t mi = 0; mi < fb * BLK; mi++) {
                static const float none[9];
                const float *g = ob0 * BLK + mi < M ? w + ((ob0 * BLK + mi) * C + c) * 9 : none; /* zeros past M */
                double t[6][3]; /* G g */
                for (int i = 0; i < n; i++)
                    for (int k = 0; k < 3; k++) t[i][k] = G[i][0] * g[k] + G[i][1] * g[3 + k] + G[i][2] * g[6 + k];
                for (int i = 0; i < n; i++)
                    for (int k = 0; k < n; k++)
                        ug[((i * n + k) * C + c) * fb * BLK + mi] = (float)(t[i][0] * G[k][0] + t[i][1] * G[k][1] + t[i][2] * G[k][2]);
            }
    }
    return u;
}

#if defined(__x86_64__)

KILN_TARGET_BEGIN("avx512f")

#include "cpu/act512.h"
#include "cpu/avx512_util.h"

typedef struct wino_job {
    const float *u;
    const kiln_nchwc_conv_io *io;
    int64_t M, C, MB, CB;               /* MB: output blocks, the last one partial where M is not a multiple of 16 */
    int m, pts;                         /* outputs per tile side (2 or 4); points of a transformed tile */
    int64_t tw, tiles, batches, groups; /* tiles: per output row, per image; batches (tasks) per image; output groups */
    int64_t x_img, y_img, plane;        /* floats of X's image, Y's image, one output plane of one channel */
    float *work;                        /* [slots][slot_floats]: V then the products of one product tile */
    int64_t slot_floats, v_floats;
    atomic_int_fast64_t next; /* the next task */
    bool clamp;               /* act as a clamp to [lo, hi] in the store */
    float lo, hi;
} wino_job;

/* Product tile s of a batch of nt tiles: its first tile and size. They are whole ones of
 * SUB_TILES (24 accumulators) but the last, or the last two when that would be one or two tiles
 * (7 = 4 + 3, 8 = 4 + 4: a one-tile product is four chains of dependent multiply-adds). */
static void sub_span(int64_t nt, int64_t s, int64_t *q0, int64_t *P)
{
    int64_t subs = (nt + SUB_TILES - 1) / SUB_TILES, r = nt % SUB_TILES;
    *q0 = s * SUB_TILES;
    *P = nt - *q0 < SUB_TILES ? nt - *q0 : SUB_TILES;
    if (r == 0 || r >= 3 || subs == 1 || s < subs - 2) return;
    int64_t first = (SUB_TILES + r + 1) / 2; /* the last two share SUB_TILES + r */
    if (s == subs - 2) *P = first;
    else *q0 = (subs - 2) * SUB_TILES + first, *P = SUB_TILES + r - first;
}

/* The taps of tiles [t0, t0 + nt): each point's offset in an input plane (of blocks), and all
 * lanes where it falls inside X, none where outside. */
static void tile_taps(const wino_job *j, int64_t t0, int64_t nt, int64_t off[][PTS_MAX], __mmask16 keep[][PTS_MAX])
{
    const kiln_nchwc_conv_io *io = j->io;
    int n = j->m + 2;
    for (int64_t ti = 0; ti < nt; ti++) {
        int64_t ty = (t0 + ti) / j->tw, tx = (t0 + ti) % j->tw;
        for (int r = 0; r < n; r++)
            for (int s = 0; s < n; s++) {
                int64_t iy = j->m * ty - io->pads[0] + r, ix = j->m * tx - io->pads[1] + s;
                bool in = iy >= 0 && iy < io->H && ix >= 0 && ix < io->W;
                off[ti][r * n + s] = in ? (iy * io->W + ix) * BLK : 0;
                keep[ti][r * n + s] = in ? (__mmask16)0xffff : 0;
            }
    }
}

/* B^T d B of one 4x4 tile d (F(2x2, 3x3)) into its 16 points, point k at v + k * pstride. */
static inline __attribute__((always_inline)) void tile_in2(const __m512 *d, float *v, int64_t pstride)
{
    __m512 e[16];
    for (int s = 0; s < 4; s++) { /* B^T d */
        e[s] = _mm512_sub_ps(d[s], d[8 + s]);
        e[4 + s] = _mm512_add_ps(d[4 + s], d[8 + s]);
        e[8 + s] = _mm512_sub_ps(d[8 + s], d[4 + s]);
        e[12 + s] = _mm512_sub_ps(d[4 + s], d[12 + s]);
    }
    for (int r = 0; r < 4; r++) { /* (B^T d) B */
        _mm512_store_ps(v + (r * 4 + 0) * pstride, _mm512_sub_ps(e[r * 4], e[r * 4 + 2]));
        _mm512_store_ps(v + (r * 4 + 1) * pstride, _mm512_add_ps(e[r * 4 + 1], e[r * 4 + 2]));
        _mm512_store_ps(v + (r * 4 + 2) * pstride, _mm512_sub_ps(e[r * 4 + 2], e[r * 4 + 1]));
        _mm512_store_ps(v + (r * 4 + 3) * pstride, _mm512_sub_ps(e[r * 4 + 1], e[r * 4 + 3]));
    }
}

/* B^T x for F(4x4, 3x3) (x six vectors at stride xs): B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0;
 * 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1], into r at stride rs. */
static inline __attribute__((always_inline)) void bt6(const __m512 *x, int xs, __m512 *r, int rs)
{
    const __m512 four = _mm512_set1_ps(4.0f), five = _mm512_set1_ps(5.0f), two = _mm512_set1_ps(2.0f);
    __m512 t1 = _mm512_fnmadd_ps(four, x[2 * xs], x[4 * xs]); /* x4 - 4 x2 */
    __m512 t2 = _mm512_fnmadd_ps(four, x[1 * xs], x[3 * xs]); /* x3 - 4 x1 */
    __m512 t3 = _mm512_sub_ps(x[4 * xs], x[2 * xs]);
    __m512 t4 = _mm512_mul_ps(two, _mm512_sub_ps(x[3 * xs], x[1 * xs]));
    r[0] = _mm512_fnmadd_ps(five, x[2 * xs], _mm512_fmadd_ps(four, x[0], x[4 * xs]));
    r[1 * rs] = _mm512_add_ps(t1, t2);
    r[2 * rs] = _mm512_sub_ps(t1, t2);
    r[3 * rs] = _mm512_add_ps(t3, t4);
    r[4 * rs] = _mm512_sub_ps(t3, t4);
    r[5 * rs] = _mm512_fnmadd_ps(five, x[3 * xs], _mm512_fmadd_ps(four, x[1 * xs], x[5 * xs]));
}

/* B^T d B of one 6x6 tile d (F(4x4, 3x3)) into its 36 points, point k at v + k * pstride. */
static inline __attribute__((always_inline)) void tile_in4(const __m512 *d, float *v, int64_t pstride)
{
    __m512 e[36], r[6];
    for (int s = 0; s < 6; s++) bt6(d + s, 6, e + s, 6); /* B^T d, column by column */
    for (int i = 0; i < 6; i++) {                        /* (B^T d) B, row by row */
        bt6(e + i * 6, 1, r, 1);
        for (int k = 0; k < 6; k++) _mm512_store_ps(v + (i * 6 + k) * pstride, r[k]);
    }
}

/* V [points][CB][nt][16] = B^T d B of tiles [t0, t0 + nt) of image b, every input block; taps
 * outside X read zeros. */
static void input_tiles(const wino_job *j, int64_t b, int64_t t0, int64_t nt, float *V)
{
    const kiln_nchwc_conv_io *io = j->io;
    int64_t off[BATCH_MAX][PTS_MAX];
    __mmask16 keep[BATCH_MAX][PTS_MAX];
    tile_taps(j, t0, nt, off, keep);
    int64_t pstride = j->CB * nt * BLK;
    const float *x = io->x + b * j->x_img;
    for (int64_t cb = 0; cb < j->CB; cb++, x += BLK * io->H * io->W)
        for (int64_t ti = 0; ti < nt; ti++) {
            __m512 d[PTS_MAX];
            for (int k = 0; k < j->pts; k++) d[k] = _mm512_maskz_loadu_ps(keep[ti][k], x + off[ti][k]);
            float *v = V + (cb * nt + ti) * BLK;
            if (j->m == 2) tile_in2(d, v, pstride);
            else tile_in4(d, v, pstride);
        }
}

/* Output block ob's bias (zero past M), or zeros. */
static inline __m512 bias_of(const wino_job *j, int64_t ob)
{
    return j->io->bias ? _mm512_maskz_loadu_ps(kiln_lanes(j->M - ob * BLK), j->io->bias + ob * BLK) : _mm512_setzero_ps();
}

/* The activation (or clamp) of v. */
static inline __m512 act_px(const wino_job *j, __m512 v)
{
    if (j->clamp) return _mm512_min_ps(_mm512_set1_ps(j->hi), _mm512_max_ps(_mm512_set1_ps(j->lo), v));
    return kiln_act512(j->io->act, v);
}

/* The rows x cols outputs of one tile of output block ob (from pixel oy, ox of image b), px[4 i
 * + k] the 16 channels of its pixel (i, k) with the bias in them: the residual added, the
 * activation applied and each pixel stored whole into a blocked Y, or, into a plain one, the
 * tile turned into one vector per channel (pixel (i, k) at lane 4 i + k) and each row of each
 * of the block's channels below M stored as up to 4 floats. */
static void store_tile(const wino_job *j, int64_t b, int64_t ob, int64_t oy, int64_t ox, int rows, int cols, __m512 *px)
{
    const kiln_nchwc_conv_io *io = j->io;
    if (io->y_blocked) {
        int64_t at = b * j->y_img + ob * j->plane * BLK + (oy * io->ow + ox) * BLK;
        for (int i = 0; i < rows; i++, at += io->ow * BLK)
            for (int k = 0; k < cols; k++) {
                __m512 v = px[4 * i + k];
                if (io->res) v = _mm512_add_ps(v, _mm512_loadu_ps(io->res + at + k * BLK));
                _mm512_storeu_ps(io->y + at + k * BLK, act_px(j, v));
            }
        return;
    }
    kiln_transpose16(px);
    __mmask16 cm = (__mmask16)((1u << cols) - 1); /* a row's columns, in lanes 0-3 (AVX-512F has no 4-lane masks) */
    int64_t n = j->M - ob * BLK < BLK ? j->M - ob * BLK : BLK;
    for (int64_t c = 0; c < n; c++) {
        float *y = io->y + b * j->y_img + (ob * BLK + c) * j->plane + oy * io->ow + ox;
        const float *res = io->res ? io->res + (y - io->y) : NULL;
        __m512 v = px[c];
        if (res) {
            __m512 r = _mm512_setzero_ps();
#define ROW_IN(I) _mm512_insertf32x4(r, _mm512_castps512_ps128(_mm512_maskz_loadu_ps(cm, res + (I) * io->ow)), I)
            r = ROW_IN(0);
            if (rows > 1) r = ROW_IN(1);
            if (rows > 2) r = ROW_IN(2);
            if (rows > 3) r = ROW_IN(3);
#undef ROW_IN
            v = _mm512_add_ps(v, r);
        }
        v = act_px(j, v);
#define ROW_OUT(I) _mm512_mask_storeu_ps(y + (I) * io->ow, cm, _mm512_castps128_ps512(_mm512_extractf32x4_ps(v, I)))
        ROW_OUT(0);
        if (rows > 1) ROW_OUT(1);
        if (rows > 2) ROW_OUT(2);
        if (rows > 3) ROW_OUT(3);
#undef ROW_OUT
    }
}

/* Point pt of product tile [q0, q0 + P) of the task's nt tiles by output blocks [ob0, ob0 + FB):
 * the sum over every input channel into Mb [points][FB][nt][16]. */
static inline __attribute__((always_inline)) void product_tile(const wino_job *j, int64_t ob0, int pt, int64_t nt,
                                                                const float *V, int64_t q0, float *Mb, int FB, int P)
{
    __m512 acc[GROUP_BLOCKS][SUB_TILES];
    _Pragma("GCC unroll 4") for (int f = 0; f < FB; f++)
    _Pragma("GCC unroll 6") for (int q = 0; q < P; q++) acc[f][q] = _mm512_setzero_ps();
    const float *wp = j->u + (ob0 * j->pts * j->C + pt * j->C * FB) * BLK;
    const float *vp = V + (pt * j->CB * nt + q0) * BLK;
    for (int64_t cb = 0; cb < j->CB; cb++, vp += nt * BLK) {
#pragma GCC unroll 2
        for (int c = 0; c < BLK; c++, wp += FB * BLK) {
            __m512 wv[GROUP_BLOCKS];
            _Pragma("GCC unroll 4") for (int f = 0; f < FB; f++) wv[f] = _mm512_load_ps(wp + f * BLK);
            _Pragma("GCC unroll 6") for (int q = 0; q < P; q++)
            {
                __m512 xv = _mm512_set1_ps(vp[q * BLK + c]);
                _Pragma("GCC unroll 4") for (int f = 0; f < FB; f++) acc[f][q] = _mm512_fmadd_ps(xv, wv[f], acc[f][q]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int f = 0; f < FB; f++)
    _Pragma("GCC unroll 6") for (int q = 0; q < P; q++) _mm512_store_ps(Mb + ((pt * FB + f) * nt + q0 + q) * BLK, acc[f][q]);
}

/* Each of the task's nt tiles (from t0, image b) by output blocks [ob0, ob0 + FB): A^T m A
 * (F(2x2, 3x3)) from Mb [16][FB][nt][16] into Y. */
static void output_tiles2(const wino_job *j, int64_t b, int64_t ob0, int FB, int64_t t0, int64_t nt, const float *Mb)
{
    const kiln_nchwc_conv_io *io = j->io;
    for (int64_t q = 0; q < nt; q++) {
        int64_t tile = t0 + q, oy = tile / j->tw * 2, ox = tile % j->tw * 2;
        bool two_rows = oy + 1 < io->oh, two_cols = ox + 1 < io->ow;
        for (int f = 0; f < FB; f++) {
            __m512 m[16], z[8];
            for (int k = 0; k < 16; k++) m[k] = _mm512_load_ps(Mb + ((k * FB + f) * nt + q) * BLK);
            for (int s = 0; s < 4; s++) { /* A^T m */
                z[s] = _mm512_add_ps(_mm512_add_ps(m[s], m[4 + s]), m[8 + s]);
                z[4 + s] = _mm512_sub_ps(_mm512_sub_ps(m[4 + s], m[8 + s]), m[12 + s]);
            }
            __m512 bias = bias_of(j, ob0 + f), px[16];
            for (int k = 0; k < 16; k++) px[k] = _mm512_setzero_ps();
            for (int i = 0; i < 2; i++) { /* (A^T m) A */
                const __m512 *zi = z + 4 * i;
                px[4 * i] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(zi[0], zi[1]), zi[2]), bias);
                px[4 * i + 1] = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(zi[1], zi[2]), zi[3]), bias);
            }
            store_tile(j, b, ob0 + f, oy, ox, two_rows ? 2 : 1, two_cols ? 2 : 1, px);
        }
    }
}

/* A^T x for F(4x4, 3x3) (x six vectors at stride xs): A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0;
 * 0 1 1 4 4 0; 0 1 -1 8 -8 1], into r at stride rs. */
static inline __attribute__((always_inline)) void at6(const __m512 *x, int xs, __m512 *r, int rs)
{
    __m512 a = _mm512_add_ps(x[1 * xs], x[2 * xs]), b = _mm512_sub_ps(x[1 * xs], x[2 * xs]);
    __m512 c = _mm512_add_ps(x[3 * xs], x[4 * xs]), d = _mm512_sub_ps(x[3 * xs], x[4 * xs]);
    r[0] = _mm512_add_ps(_mm512_add_ps(x[0], a), c);
    r[1 * rs] = _mm512_fmadd_ps(_mm512_set1_ps(2.0f), d, b);
    r[2 * rs] = _mm512_fmadd_ps(_mm512_set1_ps(4.0f), c, a);
    r[3 * rs] = _mm512_add_ps(_mm512_fmadd_ps(_mm512_set1_ps(8.0f), d, b), x[5 * xs]);
}

/* Each of the task's nt tiles by output blocks [ob0, ob0 + FB): A^T m A (F(4x4, 3x3)) from
 * Mb [36][FB][nt][16] into Y, the rows and columns past the output left out. */
static void output_tiles4(const wino_job *j, int64_t b, int64_t ob0, int FB, int64_t t0, int64_t nt, const float *Mb)
{
    const kiln_nchwc_conv_io *io = j->io;
    for (int64_t q = 0; q < nt; q++) {
        int64_t tile = t0 + q, oy = tile / j->tw * 4, ox = tile % j->tw * 4;
        int rows = io->oh - oy < 4 ? (int)(io->oh - oy) : 4, cols = io->ow - ox < 4 ? (int)(io->ow - ox) : 4;
        for (int f = 0; f < FB; f++) {
            __m512 m[36], z[24], y[4];
            for (int k = 0; k < 36; k++) m[k] = _mm512_load_ps(Mb + ((k * FB + f) * nt + q) * BLK);
            for (int s = 0; s < 6; s++) at6(m + s, 6, z + s, 6); /* A^T m: z [4][6] */
            __m512 bias = bias_of(j, ob0 + f), px[16];
            for (int k = 0; k < 16; k++) px[k] = _mm512_setzero_ps();
            for (int i = 0; i < rows; i++) { /* (A^T m) A */
                at6(z + i * 6, 1, y, 1);
                for (int k = 0; k < 4; k++) px[4 * i + k] = _mm512_add_ps(y[k], bias);
            }
            store_tile(j, b, ob0 + f, oy, ox, rows, cols, px);
        }
    }
}

typedef void (*product_fn)(const wino_job *j, int64_t ob0, int pt, int64_t nt, const float *V, int64_t q0,
                           float *Mb);
#define PRODUCT_FN(FB, P)                                                                                   \
    static void product_##FB##_##P(const wino_job *j, int64_t ob0, int pt, int64_t nt, const float *V,     \
                                   int64_t q0, float *Mb)                                                   \
    {                                                                                                       \
        product_tile(j, ob0, pt, nt, V, q0, Mb, FB, P);                                                     \
    }
#define SIX(FB) PRODUCT_FN(FB, 1) PRODUCT_FN(FB, 2) PRODUCT_FN(FB, 3) PRODUCT_FN(FB, 4) PRODUCT_FN(FB, 5) PRODUCT_FN(FB, 6)
SIX(1)
SIX(2)
SIX(3)
SIX(4)
#define SIX_ROW(FB) product_##FB##_1, product_##FB##_2, product_##FB##_3, product_##FB##_4, product_##FB##_5, product_##FB##_6
/* [FB - 1][P - 1] */
static const product_fn products[GROUP_BLOCKS][SUB_TILES] = {{SIX_ROW(1)}, {SIX_ROW(2)}, {SIX_ROW(3)}, {SIX_ROW(4)}};

/* A pool chunk [begin, end) of buffer slots: each slot takes tasks (group, image, batch of
 * tiles; groups outermost, so a thread's next task mostly reuses the weights in its L2) until
 * none are left. */
static void wino_slots(void *ctx, int64_t begin, int64_t end)
{
    (void)end;
    wino_job *j = ctx;
    float *V = j->work + begin * j->slot_floats, *Mb = V + j->v_floats;
    int64_t tasks = j->groups * j->io->N * j->batches;
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= tasks) break;
        int64_t batch = t % j->batches, b = t / j->batches % j->io->N, ob0 = t / (j->batches * j->io->N) * GROUP_BLOCKS;
        int FB = (int)(j->MB - ob0 < GROUP_BLOCKS ? j->MB - ob0 : GROUP_BLOCKS);
        int64_t t0 = batch * j->tiles / j->batches, nt = (batch + 1) * j->tiles / j->batches - t0;
        input_tiles(j, b, t0, nt, V);
        int64_t subs = (nt + SUB_TILES - 1) / SUB_TILES;
        for (int pt = 0; pt < j->pts; pt++) /* a point's weights stay in L1 across the product tiles */
            for (int64_t s = 0; s < subs; s++) {
                int64_t q0, P;
                sub_span(nt, s, &q0, &P);
                products[FB - 1][P - 1](j, ob0, pt, nt, V, q0, Mb);
            }
        if (j->m == 2) output_tiles2(j, b, ob0, FB, t0, nt, Mb);
        else output_tiles4(j, b, ob0, FB, t0, nt, Mb);
    }
}

kiln_status kiln_cpu_nchwc_wino_run(kiln_threadpool *pool, const float *u, int m, int64_t M, int64_t C,
                                    const kiln_nchwc_conv_io *io)
{
    if (io->N <= 0 || io->oh <= 0 || io->ow <= 0) return KILN_OK;
    wino_job j = {.u = u, .io = io, .M = M, .C = C, .MB = (M + BLK - 1) / BLK, .CB = C / BLK, .m = m, .pts = (m + 2) * (m + 2),
                  .tw = (io->ow + m - 1) / m, .x_img = C * io->H * io->W, .y_img = M * io->oh * io->ow,
                  .plane = io->oh * io->ow};
    j.tiles = j.tw * ((io->oh + m - 1) / m);
    j.groups = (j.MB + GROUP_BLOCKS - 1) / GROUP_BLOCKS;
    j.batches = j.tiles <= BATCH_MAX ? 1 : (j.tiles + BATCH_TILES - 1) / BATCH_TILES;
    int64_t threads = kiln_threadpool_size(pool), per_batch = j.groups * io->N; /* tasks per batch of each image */
    /* few tasks: as many for every thread (ResNet-50 at 160x160: F(4x4, 3x3)'s 100 tiles of a
     * 40x40 plane in 4 batches of 25, not 36 + 36 + 28 on two threads) */
    while (per_batch * j.batches < 4 * threads && (per_batch * j.batches) % threads &&
           j.tiles / (j.batches + 1) >= SUB_TILES)
        j.batches++;
    j.clamp = kiln_cpu_act_clamp(io->act, &j.lo, &j.hi);
    j.v_floats = j.pts * C * BATCH_MAX;
    j.slot_floats = j.v_floats + j.pts * GROUP_BLOCKS * BATCH_MAX * BLK;
    int64_t tasks = per_batch * j.batches;
    int64_t slots = tasks < threads ? tasks : threads;
    j.work = kiln_scratch_get(io->scratch, (size_t)(slots * j.slot_floats) * sizeof(float));
    if (!j.work) return KILN_ERR_NOMEM;
    atomic_init(&j.next, 0);
    kiln_threadpool_parallel_for(pool, slots, wino_slots, &j);
    kiln_scratch_put(io->scratch, j.work);
    return KILN_OK;
}

KILN_TARGET_END

#else /* not x86-64: kiln_cpu_nchwc_available() is false, nothing runs here */

kiln_status kiln_cpu_nchwc_wino_run(kiln_threadpool *pool, const float *u, int m, int64_t M, int64_t C,
                                    const kiln_nchwc_conv_io *io)
{
    (void)pool, (void)u, (void)m, (void)M, (void)C, (void)io;
    return KILN_ERR_INVALID_ARG;
}

#endif
