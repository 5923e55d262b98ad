/* kernels_cnn.c - float32 kernels of conv nets: BatchNormalization (inference), Clip, MaxPool
 * (2-D, no Indices), AveragePool (2-D), GlobalAveragePool / GlobalMaxPool and the depthwise 2-D
 * Conv that provider.c's conv_run hands over. Work is spread over the N*C planes; window
 * geometry comes from nn_geom_* exactly as in the reference kernels. Every case not covered
 * runs the reference kernel. */
#include <float.h>
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "core/threadpool.h"
#include "cpu/vecmath.h"
#include "ops/nn_internal.h"
#include "ops/util.h"

/* Planes per parallel chunk so that a chunk holds about KILN_CPU_CHUNK elements. */
static int64_t planes_per_chunk(int64_t sz) { return sz >= KILN_CPU_CHUNK ? 1 : KILN_CPU_CHUNK / (sz ? sz : 1); }

typedef struct plane_job {
    void (*plane)(const struct plane_job *j, int64_t p);
    int64_t planes, per_chunk, C;
    int64_t in_sz, out_sz;        /* elements per input / output plane */
    int64_t H, W, oh, ow;         /* 2-D windows */
    const kiln_nn_geom *g;
    bool include_pad;
    bool wide;                    /* AveragePool: the CPU has AVX-512 (avg_row_avx512) */
    const float *x, *w, *bias;    /* bias: per channel (depthwise conv) */
    const kiln_act *act;          /* depthwise conv: fused activation */
    const float *a, *b;           /* BatchNormalization: y = x * a[c] + b[c] */
    float *y;
} plane_job;

static void plane_chunks(void *ctx, int64_t begin, int64_t end)
{
    const plane_job *j = ctx;
    int64_t p1 = end * j->per_chunk < j->planes ? end * j->per_chunk : j->planes;
    for (int64_t p = begin * j->per_chunk; p < p1; p++) j->plane(j, p);
}

static void run_planes(kiln_run_ctx *c, plane_job *j)
{
    j->per_chunk = planes_per_chunk(j->in_sz > j->out_sz ? j->in_sz : j->out_sz);
    kiln_threadpool_parallel_for(kiln_run_threadpool(c), (j->planes + j->per_chunk - 1) / j->per_chunk, plane_chunks,
                                 j);
}

/* ---- BatchNormalization, inference: y = (x - mean) * scale / sqrt(var + eps) + B ---- */

static void bn_plane(const plane_job *j, int64_t p)
{
    int64_t ch = p % j->C, n = j->in_sz, i = 0;
    const float *x = j->x + p * n;
    float *y = j->y + p * n;
    float a = j->a[ch], b = j->b[ch];
    v4f a4 = v4_splat(a), b4 = v4_splat(b);
    for (; i + 8 <= n; i += 8) {
        v4f x0 = v4_load(x + i) * a4 + b4, x1 = v4_load(x + i + 4) * a4 + b4;
        v4_store(y + i, x0);
        v4_store(y + i + 4, x1);
    }
    for (; i < n; i++) y[i] = x[i] * a + b;
}

static kiln_status batchnorm_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *P[4];
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || X->rank < 2 || Y->numel != X->numel || kiln_run_n_in(c) != 5)
        return kiln_cpu_reference(c);
    for (int o = 1; o < kiln_run_n_out(c); o++)
        if (kiln_run_has_out(c, o)) return kiln_cpu_reference(c); /* training, or statistics asked for */
    int64_t N = X->dims[0], C = X->dims[1];
    for (int i = 0; i < 4; i++) {
        P[i] = kiln_run_in(c, i + 1);
        if (!P[i] || P[i]->kind != KILN_VALUE_TENSOR || P[i]->dtype != KILN_DTYPE_FLOAT32 || P[i]->numel != C)
            return kiln_cpu_reference(c);
    }
    if (!X->numel) return KILN_OK;
    double eps = kiln_attr_float(nd, "epsilon", 1e-5f);
    float *ab = malloc((size_t)(2 * C) * sizeof *ab);
    if (!ab) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    const float *scale = P[0]->data, *bias = P[1]->data, *mean = P[2]->data, *var = P[3]->data;
    for (int64_t ch = 0; ch < C; ch++) {
        double a = (double)scale[ch] / sqrt((double)var[ch] + eps);
        ab[ch] = (float)a;
        ab[C + ch] = (float)((double)bias[ch] - (double)mean[ch] * a);
    }
    plane_job j = {.plane = bn_plane, .planes = N * C, .C = C, .in_sz = X->numel / (N * C), .out_sz = 0,
                   .x = X->data, .y = Y->data, .a = ab, .b = ab + C};
    run_planes(c, &j);
    free(ab);
    return KILN_OK;
}

/* ---- Clip: y = min(max(x, lo), hi), NaN kept; NaN bounds ignored (fmin/fmax) ---- */

typedef struct clip_job {
    const float *x;
    float *y;
    int64_t n;
    float lo, hi;
} clip_job;

static void clip_chunks(void *ctx, int64_t begin, int64_t end)
{
    const clip_job *j = ctx;
    int64_t i = begin * KILN_CPU_CHUNK, e = end * KILN_CPU_CHUNK < j->n ? end * KILN_CPU_CHUNK : j->n;
    v4f lo = v4_splat(j->lo), hi = v4_splat(j->hi);
    for (; i + 4 <= e; i += 4) {
        v4f v = v4_load(j->x + i);
        v = v4_sel(v < lo, lo, v);
        v = v4_sel(v > hi, hi, v);
        v4_store(j->y + i, v);
    }
    for (; i < e; i++) {
        float v = j->x[i];
        v = v < j->lo ? j->lo : v;
        j->y[i] = v > j->hi ? j->hi : v;
    }
}

/* Bound i (1: min, 2: max) as a float: false when it is not a float32 scalar. */
static bool clip_bound(kiln_run_ctx *c, int i, float *out)
{
    const kiln_value *v = kiln_run_in(c, i);
    if (!v || (v->kind == KILN_VALUE_TENSOR && v->numel == 0)) return true;
    if (v->kind != KILN_VALUE_TENSOR || v->dtype != KILN_DTYPE_FLOAT32 || v->numel != 1) return false;
    float f = *(const float *)v->data;
    if (!isnan(f)) *out = f;
    return true;
}

static kiln_status clip_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || Y->dtype != KILN_DTYPE_FLOAT32 || Y->numel != X->numel)
        return kiln_cpu_reference(c);
    clip_job j = {.x = X->data, .y = Y->data, .n = X->numel, .lo = -INFINITY, .hi = INFINITY};
    if (kiln_run_opset(c) < 11) {
        float lo = kiln_attr_float(nd, "min", -FLT_MAX), hi = kiln_attr_float(nd, "max", FLT_MAX);
        if (isnan(lo) || isnan(hi) || kiln_run_n_in(c) > 1) return kiln_cpu_reference(c);
        j.lo = lo, j.hi = hi;
    } else if (!clip_bound(c, 1, &j.lo) || !clip_bound(c, 2, &j.hi)) {
        return kiln_cpu_reference(c);
    }
    if (!j.n) return KILN_OK;
    kiln_threadpool_parallel_for(kiln_run_threadpool(c), (j.n + KILN_CPU_CHUNK - 1) / KILN_CPU_CHUNK, clip_chunks, &j);
    return KILN_OK;
}

/* ---- 2-D MaxPool / AveragePool ---- */

/* Lanes 0, 2, 4, 6 of the 8 floats at p (a stride-2 load). */
static inline v4f v4_load_even(const float *p)
{
#if defined(__clang__)
    return __builtin_shufflevector(v4_load(p), v4_load(p + 4), 0, 2, 4, 6);
#else
    return __builtin_shuffle(v4_load(p), v4_load(p + 4), (v4i){0, 2, 4, 6});
#endif
}

/* Output columns [lo, hi) whose window column kx lies inside [0, W): ox*s - pad + kx*d in range. */
static void col_range(int64_t W, int64_t ow, int64_t s, int64_t off, int64_t *lo, int64_t *hi)
{
    /* ix = ox*s + off; need 0 <= ix < W */
    int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t h = W - off <= 0 ? 0 : (W - off + s - 1) / s;
    if (h > ow) h = ow;
    if (l > h) l = h;
    *lo = l, *hi = h;
}

/* NaN-propagating max step of the reference: v replaces m when larger or NaN, unless m is NaN. */
static inline float max_step(float m, float v) { return (v > m || v != v) && m == m ? v : m; }

static inline v4f v4_max_step(v4f m, v4f v)
{
    return v4_sel(((v > m) | (v != v)) & (m == m), v, m);
}

/* One output of the window at (oy, ox) with bounds checked per tap; 0 when no tap is inside. */
static float max_point(const plane_job *j, const float *x, int64_t oy, int64_t ox)
{
    const kiln_nn_geom *g = j->g;
    float m = -INFINITY;
    bool seen = false;
    for (int64_t ky = 0; ky < g->kernel[0]; ky++) {
        int64_t iy = oy * g->strides[0] - g->pads[0] + ky * g->dilations[0];
        if (iy < 0 || iy >= j->H) continue;
        for (int64_t kx = 0; kx < g->kernel[1]; kx++) {
            int64_t ix = ox * g->strides[1] - g->pads[1] + kx * g->dilations[1];
            if (ix < 0 || ix >= j->W) continue;
            m = max_step(m, x[iy * j->W + ix]);
            seen = true;
        }
    }
    return seen ? m : 0.0f;
}

static void maxpool_plane(const plane_job *j, int64_t p)
{
    const kiln_nn_geom *g = j->g;
    const float *x = j->x + p * j->in_sz;
    float *y = j->y + p * j->out_sz;
    int64_t sy = g->strides[0], sx = g->strides[1], dy = g->dilations[0], dx = g->dilations[1];
    int64_t kh = g->kernel[0], kw = g->kernel[1], ow = j->ow, W = j->W;
    int64_t off0 = -g->pads[1], offl = off0 + (kw - 1) * dx, cx0, cx1, t0, t1;
    col_range(W, ow, sx, off0, &cx0, &t0);
    col_range(W, ow, sx, offl, &t1, &cx1);
    if (cx1 < cx0) cx1 = cx0;
    int64_t vx1 = cx0;
    if (sx == 1 || sx == 2)
        while (vx1 + 4 <= cx1 && (vx1 + 3) * sx + offl + sx - 1 < W) vx1 += 4;
    for (int64_t oy = 0; oy < j->oh; oy++) {
        float *yr = y + oy * ow;
        int64_t iy0 = oy * sy - g->pads[0], kyl = 0, kyh = kh, ox = 0;
        while (kyl < kh && iy0 + kyl * dy < 0) kyl++;
        while (kyh > kyl && iy0 + (kyh - 1) * dy >= j->H) kyh--;
        if (kyl == kyh) { /* the whole row of windows in the padding */
            for (; ox < ow; ox++) yr[ox] = max_point(j, x, oy, ox);
            continue;
        }
        for (; ox < cx0 && ox < ow; ox++) yr[ox] = max_point(j, x, oy, ox);
        const float *xr = x + iy0 * W + off0;
        if (sx == 1 || sx == 2) {
            for (; ox < vx1; ox += 4) {
                v4f m = v4_splat(-INFINITY);
                for (int64_t ky = kyl; ky < kyh; ky++) {
                    const float *xk = xr + ky * dy * W + ox * sx;
                    for (int64_t kx = 0; kx < kw; kx++)
                        m = v4_max_step(m, sx == 1 ? v4_load(xk + kx * dx) : v4_load_even(xk + kx * dx));
                }
                v4_store(yr + ox, m);
            }
        }
        for (; ox < cx1; ox++) {
            float m = -INFINITY;
            for (int64_t ky = kyl; ky < kyh; ky++) {
                const float *xk = xr + ky * dy * W + ox * sx;
                for (int64_t kx = 0; kx < kw; kx++) m = max_step(m, xk[kx * dx]);
            }
            yr[ox] = m;
        }
        for (; ox < ow; ox++) yr[ox] = max_point(j, x, oy, ox);
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
enum { MAXPOOL3_ROW = 4096 }; /* floats of the padded row buffer (on the stack) */

/* The reference's max step, 16 wide: a NaN, once met, stays. */
__attribute__((target("avx512f"))) static inline __m512 max16_step(__m512 m, __m512 v)
{
    return _mm512_mask_mov_ps(_mm512_max_ps(m, v), _mm512_cmp_ps_mask(m, m, _CMP_UNORD_Q), m);
}

/* Whether maxpool3_plane_avx512 covers the pooling: a 3x3 window at stride 1 or 2 in both
 * directions, no dilation, pads of at most 1 (every window then holds an element of X), no
 * ceil_mode, and a padded row that fits the stack buffer. */
static bool maxpool3_fits(const plane_job *j)
{
    const kiln_nn_geom *g = j->g;
    int64_t s = g->strides[0];
    return g->kernel[0] == 3 && g->kernel[1] == 3 && s == g->strides[1] && (s == 1 || s == 2) &&
           g->dilations[0] == 1 && g->dilations[1] == 1 && !g->ceil_mode && g->pads[0] <= 1 && g->pads[1] <= 1 &&
           g->pads[2] <= 1 && g->pads[3] <= 1 && (j->ow + 15) / 16 * 16 * s + 32 <= MAXPOOL3_ROW &&
           j->W + 2 <= MAXPOOL3_ROW && kiln_gemm_level_detect() == KILN_GEMM_LEVEL_AVX512;
}

/* 3x3 MaxPool of one plane, separably: the max of each output row's (up to) three input rows
 * into a row padded with -inf, then of three neighbours along it. */
__attribute__((target("avx512f"))) static void maxpool3_plane_avx512(const plane_job *j, int64_t p)
{
    const kiln_nn_geom *g = j->g;
    int64_t s = g->strides[0], pt = g->pads[0], pl = g->pads[1], H = j->H, W = j->W, ow = j->ow;
    const float *x = j->x + p * j->in_sz;
    float *y = j->y + p * j->out_sz;
    float vp[MAXPOOL3_ROW] __attribute__((aligned(64)));
    __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < MAXPOOL3_ROW; i += 16) _mm512_store_ps(vp + i, ninf);
    __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int64_t oy = 0; oy < j->oh; oy++) {
        int64_t iy0 = oy * s - pt, ky0 = iy0 < 0 ? -iy0 : 0, ky1 = H - iy0 < 3 ? H - iy0 : 3;
        for (int64_t ix = 0; ix < W; ix += 16) {
            __mmask16 m = W - ix >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (W - ix)) - 1);
            __m512 v = _mm512_maskz_loadu_ps(m, x + (iy0 + ky0) * W + ix);
            for (int64_t ky = ky0 + 1; ky < ky1; ky++) v = max16_step(v, _mm512_maskz_loadu_ps(m, x + (iy0 + ky) * W + ix));
            _mm512_mask_storeu_ps(vp + pl + ix, m, v);
        }
        float *yr = y + oy * ow;
        for (int64_t ox = 0; ox < ow; ox += 16) {
            __m512 t0, t1, t2;
            if (s == 1) {
                t0 = _mm512_loadu_ps(vp + ox), t1 = _mm512_loadu_ps(vp + ox + 1), t2 = _mm512_loadu_ps(vp + ox + 2);
            } else {
                __m512 u0 = _mm512_loadu_ps(vp + 2 * ox), u1 = _mm512_loadu_ps(vp + 2 * ox + 16);
                __m512 u2 = _mm512_loadu_ps(vp + 2 * ox + 2), u3 = _mm512_loadu_ps(vp + 2 * ox + 18);
                t0 = _mm512_permutex2var_ps(u0, even, u1);
                t1 = _mm512_permutex2var_ps(u0, odd, u1);
                t2 = _mm512_permutex2var_ps(u2, even, u3);
            }
            __mmask16 m = ow - ox >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ow - ox)) - 1);
            _mm512_mask_storeu_ps(yr + ox, m, max16_step(max16_step(t0, t1), t2));
        }
    }
}
#endif

/* The taps [*k0, *k1) of a window starting at i0 (stride dilation d, k taps) that fall inside
 * [0, n), and how many fall before n + pad_end (count_include_pad's count). */
static void window_taps(int64_t i0, int64_t d, int64_t k, int64_t n, int64_t pad_end, int64_t *k0, int64_t *k1,
                        int64_t *counted)
{
    int64_t a = 0, b = 0, c = 0;
    for (int64_t t = 0; t < k; t++) {
        int64_t i = i0 + t * d;
        if (i < 0) a = t + 1;
        if (i < n) b = t + 1;
        if (i < n + pad_end) c = t + 1;
    }
    *k0 = a, *k1 = b > a ? b : a, *counted = c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* Outputs [ox0, ox1) of one row whose windows lie wholly inside the row (columns kx 0 .. kw - 1
 * at stride 1 or 2, no column dilation), 16 at a time: each lane sums its taps in avgpool_plane's
 * order (columns outer, rows inner, from 0) and divides in double, so the lanes are its scalar
 * bits. Returns the first output it left (the rest of a 16-wide step). */
__attribute__((target("avx512f"))) static int64_t avg_row_avx512(const float *x, int64_t W, int64_t iy0, int64_t ky0,
                                                                  int64_t ky1, int64_t dy, int64_t kw, int64_t sx,
                                                                  int64_t pl, int64_t ox0, int64_t ox1, int64_t cnt,
                                                                  float *y)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512d dc = _mm512_set1_pd((double)cnt);
    int64_t ox = ox0;
    for (; ox + 16 <= ox1; ox += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t kx = 0; kx < kw; kx++) {
            const float *col = x + (iy0 + ky0 * dy) * W + ox * sx - pl + kx;
            for (int64_t ky = ky0; ky < ky1; ky++, col += dy * W)
                acc = _mm512_add_ps(acc, sx == 1 ? _mm512_loadu_ps(col)
                                                 : _mm512_permutex2var_ps(_mm512_loadu_ps(col), even,
                                                                          _mm512_loadu_ps(col + 16)));
        }
        __m512d lo = _mm512_div_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(acc)), dc);
        __m512d hi = _mm512_div_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1))), dc);
        _mm256_storeu_ps(y + ox, _mm512_cvtpd_ps(lo));
        _mm256_storeu_ps(y + ox + 8, _mm512_cvtpd_ps(hi));
    }
    return ox;
}
#endif

/* The taps of each output row and column found once per row and column (not per element); each
 * output sums its taps in float32 (columns outer, rows inner, from 0: the reference sums in
 * double, within float32 rounding of this) and divides in double. Runs of outputs whose windows
 * lie inside the row take 16 at a time where the CPU has AVX-512 (stride 1 or 2, no column
 * dilation), each lane the scalar path's bits. */
static void avgpool_plane(const plane_job *j, int64_t p)
{
    const kiln_nn_geom *g = j->g;
    const float *x = j->x + p * j->in_sz;
    float *y = j->y + p * j->out_sz;
    int64_t sy = g->strides[0], sx = g->strides[1], dy = g->dilations[0], dx = g->dilations[1];
    int64_t kh = g->kernel[0], kw = g->kernel[1], ow = j->ow, H = j->H, W = j->W, pl = g->pads[1];
    /* the outputs whose windows lie inside the row: ox * sx - pl >= 0 and ox * sx - pl + kw - 1 < W
     * (a stride-2 step reads 32 floats from its first tap: up to 2 * 15 + kw - 1 past it) */
    int64_t in0 = 0, in1 = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (j->wide && dx == 1 && (sx == 1 || sx == 2) && W - kw + pl >= 0) {
        in0 = (pl + sx - 1) / sx;
        in1 = (W - kw + pl) / sx + 1; /* past the last ox with ox * sx - pl + kw - 1 <= W - 1 */
        if (sx == 2) { /* a step from s reads 32 floats from its last tap: s * 2 - pl + kw + 30 <= W - 1 */
            int64_t room = W - 31 - kw + pl;
            int64_t load1 = room >= 0 ? room / 2 + 16 : 0;
            if (in1 > load1) in1 = load1;
        }
        if (in1 > ow) in1 = ow;
        if (in1 < in0) in1 = in0;
    }
#endif
    for (int64_t oy = 0; oy < j->oh; oy++) {
        int64_t iy0 = oy * sy - g->pads[0], ky0, ky1, cy;
        window_taps(iy0, dy, kh, H, g->pads[2], &ky0, &ky1, &cy);
        for (int64_t ox = 0; ox < ow; ox++) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
            if (ox == in0 && in1 - in0 >= 16) {
                int64_t cnt = j->include_pad ? cy * kw : (ky1 - ky0) * kw;
                ox = avg_row_avx512(x, W, iy0, ky0, ky1, dy, kw, sx, pl, in0, in1, cnt, y + oy * ow);
                if (ox >= ow) break;
            }
#endif
            int64_t ix0 = ox * sx - pl, kx0, kx1, cx;
            window_taps(ix0, dx, kw, W, g->pads[3], &kx0, &kx1, &cx);
            float acc = 0.0f;
            for (int64_t kx = kx0; kx < kx1; kx++) {
                const float *col = x + (iy0 + ky0 * dy) * W + ix0 + kx * dx;
                for (int64_t ky = ky0; ky < ky1; ky++, col += dy * W) acc += *col;
            }
            int64_t cntv = j->include_pad ? cy * cx : (ky1 - ky0) * (kx1 - kx0);
            y[oy * ow + ox] = (float)((double)acc / (double)cntv);
        }
    }
}

static kiln_status pool2d_run(kiln_run_ctx *c, bool is_max)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || Y->dtype != KILN_DTYPE_FLOAT32 || X->rank != 4 || Y->rank != 4 ||
        (is_max && kiln_run_n_out(c) > 1 && kiln_run_has_out(c, 1)))
        return kiln_cpu_reference(c);
    int nk;
    const int64_t *ks = kiln_attr_ints(nd, "kernel_shape", &nk);
    kiln_nn_geom g;
    char msg[160];
    if (!ks || nk != 2 || !kiln_nn_geom_parse(nd, 2, &g, msg, sizeof msg)) return kiln_cpu_reference(c);
    for (int i = 0; i < 2; i++) {
        if (ks[i] < 1 || ks[i] > NN_ATTR_MAX) return kiln_cpu_reference(c);
        g.kernel[i] = ks[i];
    }
    int64_t od[2];
    if (!kiln_nn_geom_resolve(&g, X->dims + 2, od) || od[0] != Y->dims[2] || od[1] != Y->dims[3] ||
        Y->dims[0] != X->dims[0] || Y->dims[1] != X->dims[1])
        return kiln_cpu_reference(c);
    if (!Y->numel) return KILN_OK;
    plane_job j = {.plane = is_max ? maxpool_plane : avgpool_plane, .planes = X->dims[0] * X->dims[1],
                   .in_sz = X->dims[2] * X->dims[3], .out_sz = od[0] * od[1], .H = X->dims[2], .W = X->dims[3],
                   .oh = od[0], .ow = od[1], .g = &g, .x = X->data, .y = Y->data,
                   .include_pad = kiln_attr_int(nd, "count_include_pad", 0) != 0,
                   .wide = kiln_gemm_level_detect() == KILN_GEMM_LEVEL_AVX512};
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (is_max && maxpool3_fits(&j)) j.plane = maxpool3_plane_avx512;
#endif
    run_planes(c, &j);
    return KILN_OK;
}

static kiln_status maxpool_run(kiln_run_ctx *c) { return pool2d_run(c, true); }
static kiln_status avgpool_run(kiln_run_ctx *c) { return pool2d_run(c, false); }

/* ---- GlobalAveragePool / GlobalMaxPool ---- */

static void gavg_plane(const plane_job *j, int64_t p)
{
    const float *x = j->x + p * j->in_sz;
    int64_t n = j->in_sz, i = 0;
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += x[i];
        s1 += x[i + 1];
        s2 += x[i + 2];
        s3 += x[i + 3];
    }
    for (; i < n; i++) s0 += x[i];
    j->y[p] = (float)(((s0 + s1) + (s2 + s3)) / (double)n);
}

/* The largest element, or the first NaN. 8 lanes run ahead while no NaN shows; a plane with one
 * is read again from the start by the scalar loop (its payload is the first NaN's). */
static void gmax_plane(const plane_job *j, int64_t p)
{
    const float *x = j->x + p * j->in_sz;
    float m = -INFINITY;
    int64_t i = 0;
    if (j->in_sz >= 8) {
        v4f m0 = v4_splat(-INFINITY), m1 = m0;
        v4i nan = {0, 0, 0, 0};
        for (; i + 8 <= j->in_sz; i += 8) {
            v4f a = v4_load(x + i), b = v4_load(x + i + 4);
            nan |= (a != a) | (b != b);
            m0 = v4_sel(a > m0, a, m0);
            m1 = v4_sel(b > m1, b, m1);
        }
        if (nan[0] | nan[1] | nan[2] | nan[3]) {
            i = 0;
        } else {
            m0 = v4_sel(m1 > m0, m1, m0);
            for (int k = 0; k < 4; k++) m = m0[k] > m ? m0[k] : m;
        }
    }
    for (; i < j->in_sz; i++) {
        float v = x[i];
        if (v != v) {
            m = v;
            break;
        }
        m = v > m ? v : m;
    }
    j->y[p] = m;
}

static kiln_status global_pool_run(kiln_run_ctx *c, bool is_max)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || Y->dtype != KILN_DTYPE_FLOAT32 || X->rank < 2)
        return kiln_cpu_reference(c);
    int64_t planes = X->dims[0] * X->dims[1];
    if (Y->numel != planes) return kiln_cpu_reference(c);
    if (!planes) return KILN_OK;
    plane_job j = {.plane = is_max ? gmax_plane : gavg_plane, .planes = planes, .in_sz = X->numel / planes,
                   .out_sz = 1, .x = X->data, .y = Y->data};
    run_planes(c, &j);
    return KILN_OK;
}

static kiln_status gavg_run(kiln_run_ctx *c) { return global_pool_run(c, false); }
static kiln_status gmax_run(kiln_run_ctx *c) { return global_pool_run(c, true); }

/* ---- depthwise 2-D Conv: one kh x kw filter per channel ---- */

/* One output of the window at (oy, ox) with the row and column bounds checked per tap. */
static float dw_point(const plane_job *j, const float *x, const float *w, float b, int64_t oy, int64_t ox)
{
    const kiln_nn_geom *g = j->g;
    int64_t kh = g->kernel[0], kw = g->kernel[1];
    float acc = b;
    for (int64_t ky = 0; ky < kh; ky++) {
        int64_t iy = oy * g->strides[0] - g->pads[0] + ky * g->dilations[0];
        if (iy < 0 || iy >= j->H) continue;
        for (int64_t kx = 0; kx < kw; kx++) {
            int64_t ix = ox * g->strides[1] - g->pads[1] + kx * g->dilations[1];
            if (ix >= 0 && ix < j->W) acc += w[ky * kw + kx] * x[iy * j->W + ix];
        }
    }
    return acc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_DW16 1
typedef float dw16f __attribute__((vector_size(64)));

/* dwconv_plane's stride-1 interior on 16 lanes (two chains where 32 fit): outputs [ox, end) of
 * row yr in whole vectors; returns the first not done. xr is the window's top-left tap for ox 0. */
__attribute__((target("avx512f"))) static int64_t dw_row16(const float *xr, int64_t W, int64_t dy, int64_t dx,
                                                            const float *w, int64_t kw, int64_t kyl, int64_t kyh,
                                                            float b, float *yr, int64_t ox, int64_t end)
{
    for (; ox + 16 <= end; ox += ox + 32 <= end ? 32 : 16) {
        bool two = ox + 32 <= end;
        dw16f acc0 = (dw16f){0} + b, acc1 = acc0;
        for (int64_t ky = kyl; ky < kyh; ky++) {
            const float *xk = xr + ky * dy * W + ox;
            for (int64_t kx = 0; kx < kw; kx++) {
                dw16f v0, v1, wk = (dw16f){0} + w[ky * kw + kx];
                memcpy(&v0, xk + kx * dx, sizeof v0);
                acc0 += wk * v0;
                if (two) {
                    memcpy(&v1, xk + kx * dx + 16, sizeof v1);
                    acc1 += wk * v1;
                }
            }
        }
        memcpy(yr + ox, &acc0, sizeof acc0);
        if (two) memcpy(yr + ox + 16, &acc1, sizeof acc1);
    }
    return ox;
}
#endif

static void dwconv_plane(const plane_job *j, int64_t p)
{
    const kiln_nn_geom *g = j->g;
    int64_t ch = p % j->C, kh = g->kernel[0], kw = g->kernel[1], ow = j->ow, W = j->W;
    int64_t sy = g->strides[0], sx = g->strides[1], dy = g->dilations[0], dx = g->dilations[1];
    const float *x = j->x + p * j->in_sz, *w = j->w + ch * kh * kw;
    float *y = j->y + p * j->out_sz;
    float b = j->bias ? j->bias[ch] : 0.0f;
    /* interior columns [cx0, cx1): every tap's column inside X */
    int64_t off0 = -g->pads[1], offl = off0 + (kw - 1) * dx, cx0, cx1, t0, t1;
    col_range(W, ow, sx, off0, &cx0, &t0);
    col_range(W, ow, sx, offl, &t1, &cx1);
    if (cx1 < cx0) cx1 = cx0;
    /* vector loads read up to column ox*sx + offl + 4*sx - 1 (stride 2: one past the last tap) */
    int64_t vx1 = cx0, vx16 = cx0;
    if (sx == 1 || sx == 2)
        while (vx1 + 4 <= cx1 && (vx1 + 3) * sx + offl + sx - 1 < W) vx1 += 4;
#if HAVE_DW16
    if (sx == 1 && __builtin_cpu_supports("avx512f"))
        while (vx16 + 16 <= cx1) vx16 += 16; /* every tap of those columns inside X */
#endif
    for (int64_t oy = 0; oy < j->oh; oy++) {
        float *yr = y + oy * ow;
        int64_t ox = 0;
        for (; ox < cx0 && ox < ow; ox++) yr[ox] = dw_point(j, x, w, b, oy, ox);
        /* window rows [kyl, kyh) inside X */
        int64_t iy0 = oy * sy - g->pads[0], kyl = 0, kyh = kh;
        while (kyl < kh && iy0 + kyl * dy < 0) kyl++;
        while (kyh > kyl && iy0 + (kyh - 1) * dy >= j->H) kyh--;
        const float *xr = x + iy0 * W + off0;
        if (sx == 1) {
#if HAVE_DW16
            if (vx16 > ox) ox = dw_row16(xr, W, dy, dx, w, kw, kyl, kyh, b, yr, ox, vx16);
#endif
            for (; ox + 8 <= vx1; ox += 8) { /* two chains of adds */
                v4f acc0 = v4_splat(b), acc1 = acc0;
                for (int64_t ky = kyl; ky < kyh; ky++) {
                    const float *xk = xr + ky * dy * W + ox;
                    for (int64_t kx = 0; kx < kw; kx++) {
                        v4f w4 = v4_splat(w[ky * kw + kx]);
                        acc0 += w4 * v4_load(xk + kx * dx);
                        acc1 += w4 * v4_load(xk + kx * dx + 4);
                    }
                }
                v4_store(yr + ox, acc0);
                v4_store(yr + ox + 4, acc1);
            }
            for (; ox < vx1; ox += 4) {
                v4f acc = v4_splat(b);
                for (int64_t ky = kyl; ky < kyh; ky++) {
                    const float *xk = xr + ky * dy * W + ox;
                    for (int64_t kx = 0; kx < kw; kx++) acc += v4_splat(w[ky * kw + kx]) * v4_load(xk + kx * dx);
                }
                v4_store(yr + ox, acc);
            }
        } else if (sx == 2) {
            for (; ox + 8 <= vx1; ox += 8) {
                v4f acc0 = v4_splat(b), acc1 = acc0;
                for (int64_t ky = kyl; ky < kyh; ky++) {
                    const float *xk = xr + ky * dy * W + 2 * ox;
                    for (int64_t kx = 0; kx < kw; kx++) {
                        v4f w4 = v4_splat(w[ky * kw + kx]);
                        acc0 += w4 * v4_load_even(xk + kx * dx);
                        acc1 += w4 * v4_load_even(xk + kx * dx + 8);
                    }
                }
                v4_store(yr + ox, acc0);
                v4_store(yr + ox + 4, acc1);
            }
            for (; ox < vx1; ox += 4) {
                v4f acc = v4_splat(b);
                for (int64_t ky = kyl; ky < kyh; ky++) {
                    const float *xk = xr + ky * dy * W + 2 * ox;
                    for (int64_t kx = 0; kx < kw; kx++) acc += v4_splat(w[ky * kw + kx]) * v4_load_even(xk + kx * dx);
                }
                v4_store(yr + ox, acc);
            }
        }
        for (; ox < cx1; ox++) {
            float acc = b;
            for (int64_t ky = kyl; ky < kyh; ky++) {
                const float *xk = xr + ky * dy * W + ox * sx;
                for (int64_t kx = 0; kx < kw; kx++) acc += w[ky * kw + kx] * xk[kx * dx];
            }
            yr[ox] = acc;
        }
        for (; ox < ow; ox++) yr[ox] = dw_point(j, x, w, b, oy, ox);
        kiln_cpu_act_apply(j->act, yr, ow, 0.0f); /* the row is still in cache */
    }
}

/* ---- depthwise 3x3, dilation 1, stride 1 or 2: each plane is copied into a zero-bordered
 * buffer once, so every window is in bounds and the rows run as 8- or 16-wide vectors with no
 * edge cases; the border is zeroed once per chunk, since every plane writes the same inside. ---- */

typedef float v8f __attribute__((vector_size(32)));

typedef int32_t v8i __attribute__((vector_size(32)));
/* max(a, v) and min(a, v) that keep a NaN v (as Clip does) */
#define V8_MAX(a, v) ((v8f)(((v8i)(a) & ((v) < (a))) | ((v8i)(v) & ~((v) < (a)))))
#define V8_MIN(a, v) ((v8f)(((v8i)(a) & ((v) > (a))) | ((v8i)(v) & ~((v) > (a)))))
/* Macros, not functions: a 32-byte vector argument or result would change the ABI of functions
 * compiled without AVX. */
#define V8_LOAD(v, p) memcpy(&(v), (p), sizeof(v8f))
#if defined(__clang__)
#define V8_EVEN(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14)
#define V8_ODD(a, b) __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15)
#else
#define V8_EVEN(a, b) __builtin_shuffle(a, b, (v8i){0, 2, 4, 6, 8, 10, 12, 14})
#define V8_ODD(a, b) __builtin_shuffle(a, b, (v8i){1, 3, 5, 7, 9, 11, 13, 15})
#endif

/* Geometry of the padded copy of one plane: X[iy][ix] sits at buf[(iy + pt) * wp + ix + pl]. */
typedef struct dw3_geom {
    int64_t hp, wp, pt, pl;
} dw3_geom;

static bool dw3_fits(const plane_job *j, dw3_geom *d)
{
    const kiln_nn_geom *g = j->g;
    int64_t s = g->strides[0];
    if (g->kernel[0] != 3 || g->kernel[1] != 3 || g->dilations[0] != 1 || g->dilations[1] != 1 || s != g->strides[1] ||
        (s != 1 && s != 2) || g->pads[0] > 2 || g->pads[1] > 2 || j->oh > 4096 || j->ow > 4096 || j->H > 8192 ||
        j->W > 8192)
        return false;
    d->pt = g->pads[0];
    d->pl = g->pads[1];
    d->hp = (j->oh - 1) * s + 3; /* rows the windows read */
    int64_t ow16 = (j->ow + 15) / 16 * 16;
    d->wp = (ow16 - 1) * s + 3 + 16 * s; /* columns the vector loads read (8- or 16-wide; stride 2: twice) */
    return true;
}

/* Taps ky of the 8 outputs at column ox (stride S) of row r into acc. */
#define DW3_TAPS(S, r, ky)                                                                             \
    do {                                                                                               \
        v8f t0, t1, t2;                                                                                \
        if ((S) == 1) {                                                                                \
            V8_LOAD(t0, (r) + ox), V8_LOAD(t1, (r) + ox + 1), V8_LOAD(t2, (r) + ox + 2);               \
        } else {                                                                                       \
            v8f u0, u1, u2, u3;                                                                        \
            V8_LOAD(u0, (r) + 2 * ox), V8_LOAD(u1, (r) + 2 * ox + 8);                                  \
            V8_LOAD(u2, (r) + 2 * ox + 2), V8_LOAD(u3, (r) + 2 * ox + 10);                             \
            t0 = V8_EVEN(u0, u1), t1 = V8_ODD(u0, u1), t2 = V8_EVEN(u2, u3);                           \
        }                                                                                              \
        acc += wk##ky##0 * t0 + wk##ky##1 * t1 + wk##ky##2 * t2;                                       \
    } while (0)

/* Output rows of one plane from its padded copy: y = clamp(bias + taps, lo, hi). */
#define DW3_ROWS(NAME, ATTR, S)                                                                        \
    ATTR static void NAME(const float *buf, int64_t wp, const float *w, float b, float lo, float hi,   \
                          float *y, int64_t oh, int64_t ow)                                            \
    {                                                                                                  \
        v8f z = {0}, bb = z + b, vlo = z + lo, vhi = z + hi;                                           \
        v8f wk00 = z + w[0], wk01 = z + w[1], wk02 = z + w[2], wk10 = z + w[3], wk11 = z + w[4];        \
        v8f wk12 = z + w[5], wk20 = z + w[6], wk21 = z + w[7], wk22 = z + w[8];                        \
        for (int64_t oy = 0; oy < oh; oy++) {                                                          \
            const float *r0 = buf + oy * (S) * wp, *r1 = r0 + wp, *r2 = r1 + wp;                       \
            float *yr = y + oy * ow;                                                                   \
            for (int64_t ox = 0; ox < ow; ox += 8) {                                                   \
                v8f acc = bb;                                                                          \
                DW3_TAPS(S, r0, 0);                                                                    \
                DW3_TAPS(S, r1, 1);                                                                    \
                DW3_TAPS(S, r2, 2);                                                                    \
                acc = V8_MAX(vlo, acc); /* NaN kept, as in Clip */                                     \
                acc = V8_MIN(vhi, acc);                                                                \
                if (ox + 8 <= ow) memcpy(yr + ox, &acc, sizeof acc);                                   \
                else memcpy(yr + ox, &acc, (size_t)(ow - ox) * sizeof(float));                         \
            }                                                                                          \
        }                                                                                              \
    }

DW3_ROWS(dw3_rows1_base, , 1)
DW3_ROWS(dw3_rows2_base, , 2)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
DW3_ROWS(dw3_rows1_avx2, __attribute__((target("avx2,fma"))), 1)
DW3_ROWS(dw3_rows2_avx2, __attribute__((target("avx2,fma"))), 2)
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The same, 16 wide. max/min return their second operand for a NaN: a NaN sum stays. */
#define DW3_ROWS16(NAME, S)                                                                            \
    __attribute__((target("avx512f"))) static void NAME(const float *buf, int64_t wp, const float *w,  \
                                                        float b, float lo, float hi, float *y,          \
                                                        int64_t oh, int64_t ow)                         \
    {                                                                                                  \
        __m512 wk[9];                                                                                  \
        for (int k = 0; k < 9; k++) wk[k] = _mm512_set1_ps(w[k]);                                      \
        __m512 bb = _mm512_set1_ps(b), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);             \
        __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);   \
        __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);    \
        (void)even, (void)odd;                                                                         \
        for (int64_t oy = 0; oy < oh; oy++) {                                                          \
            const float *r0 = buf + oy * (S) * wp;                                                     \
            float *yr = y + oy * ow;                                                                   \
            for (int64_t ox = 0; ox < ow; ox += 16) {                                                  \
                __m512 acc = bb;                                                                       \
                for (int ky = 0; ky < 3; ky++) {                                                       \
                    const float *r = r0 + ky * wp;                                                     \
                    __m512 t0, t1, t2;                                                                 \
                    if ((S) == 1) {                                                                    \
                        t0 = _mm512_loadu_ps(r + ox), t1 = _mm512_loadu_ps(r + ox + 1);                \
                        t2 = _mm512_loadu_ps(r + ox + 2);                                              \
                    } else {                                                                           \
                        __m512 u0 = _mm512_loadu_ps(r + 2 * ox), u1 = _mm512_loadu_ps(r + 2 * ox + 16); \
                        __m512 u2 = _mm512_loadu_ps(r + 2 * ox + 2);                                   \
                        __m512 u3 = _mm512_loadu_ps(r + 2 * ox + 18);                                  \
                        t0 = _mm512_permutex2var_ps(u0, even, u1);                                     \
                        t1 = _mm512_permutex2var_ps(u0, odd, u1);                                      \
                        t2 = _mm512_permutex2var_ps(u2, even, u3);                                     \
                    }                                                                                  \
                    acc = _mm512_fmadd_ps(wk[3 * ky], t0, acc);                                        \
                    acc = _mm512_fmadd_ps(wk[3 * ky + 1], t1, acc);                                    \
                    acc = _mm512_fmadd_ps(wk[3 * ky + 2], t2, acc);                                    \
                }                                                                                      \
                acc = _mm512_min_ps(vhi, _mm512_max_ps(vlo, acc));                                     \
                __mmask16 m = ow - ox >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ow - ox)) - 1);  \
                _mm512_mask_storeu_ps(yr + ox, m, acc);                                                \
            }                                                                                          \
        }                                                                                              \
    }
DW3_ROWS16(dw3_rows1_avx512, 1)
DW3_ROWS16(dw3_rows2_avx512, 2)
#endif

typedef void (*dw3_rows_fn)(const float *buf, int64_t wp, const float *w, float b, float lo, float hi, float *y,
                            int64_t oh, int64_t ow);

static dw3_rows_fn dw3_rows_pick(int64_t s)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return s == 1 ? dw3_rows1_avx512 : dw3_rows2_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return s == 1 ? dw3_rows1_avx2 : dw3_rows2_avx2;
#endif
    return s == 1 ? dw3_rows1_base : dw3_rows2_base;
}

static void dw3_chunks(void *ctx, int64_t begin, int64_t end)
{
    const plane_job *j = ctx;
    int64_t p0 = begin * j->per_chunk, p1 = end * j->per_chunk < j->planes ? end * j->per_chunk : j->planes;
    dw3_geom d = {0};
    dw3_fits(j, &d);
    float *buf = calloc((size_t)(d.hp * d.wp), sizeof *buf);
    if (!buf) { /* the bounds-checked kernel needs no buffer */
        for (int64_t p = p0; p < p1; p++) dwconv_plane(j, p);
        return;
    }
    int64_t s = j->g->strides[0];
    dw3_rows_fn rows = dw3_rows_pick(s);
    /* Relu and Clip are the clamp the rows apply; other activations run over each finished plane */
    float lo = -INFINITY, hi = INFINITY;
    bool clamp = j->act->kind == KILN_ACT_RELU || j->act->kind == KILN_ACT_CLIP;
    if (j->act->kind == KILN_ACT_RELU) lo = 0.0f;
    if (j->act->kind == KILN_ACT_CLIP) lo = j->act->alpha, hi = j->act->beta;
    /* X rows [0, ih) and columns [0, cw) land inside the buffer */
    int64_t ih = j->H < d.hp - d.pt ? j->H : d.hp - d.pt, cw = j->W < d.wp - d.pl ? j->W : d.wp - d.pl;
    for (int64_t p = p0; p < p1; p++) {
        const float *x = j->x + p * j->in_sz;
        int64_t ch = p % j->C;
        for (int64_t iy = 0; iy < ih; iy++)
            memcpy(buf + (iy + d.pt) * d.wp + d.pl, x + iy * j->W, (size_t)cw * sizeof *buf);
        float *y = j->y + p * j->out_sz;
        rows(buf, d.wp, j->w + ch * 9, j->bias ? j->bias[ch] : 0.0f, lo, hi, y, j->oh, j->ow);
        if (!clamp && j->act->kind != KILN_ACT_NONE) kiln_cpu_act_apply(j->act, y, j->out_sz, 0.0f);
    }
    free(buf);
}

kiln_status kiln_cpu_conv_depthwise(kiln_run_ctx *c, const kiln_nn_geom *g, const float *x, const float *w,
                                    const float *bias, const kiln_act *act, float *y, int64_t N, int64_t C,
                                    int64_t H, int64_t W, int64_t oh, int64_t ow)
{
    plane_job j = {.plane = dwconv_plane, .planes = N * C, .C = C, .in_sz = H * W, .out_sz = oh * ow, .H = H, .W = W,
                   .oh = oh, .ow = ow, .g = g, .x = x, .w = w, .bias = bias, .act = act, .y = y};
    dw3_geom d = {0};
    if (dw3_fits(&j, &d)) {
        j.per_chunk = planes_per_chunk(j.in_sz > j.out_sz ? j.in_sz : j.out_sz);
        /* under about 32K taps (a few microseconds) waking the pool costs more than it saves; a
         * bound of 256K kept MobileNetV2's last layers (576 and 960 channels at 7x7) on one
         * thread: the model at 160x160 on two threads went from 3.44 to 3.20 ms with this one */
        kiln_threadpool *pool = j.planes * j.out_sz * 9 < (1 << 15) ? NULL : kiln_run_threadpool(c);
        kiln_threadpool_parallel_for(pool, (j.planes + j.per_chunk - 1) / j.per_chunk, dw3_chunks, &j);
        return KILN_OK;
    }
    run_planes(c, &j);
    return KILN_OK;
}

static bool cnn_f32(const kiln_node *n)
{
    return n->n_in >= 1 && n->n_out >= 1 && kiln_ir_is_f32(n->in[0]) && kiln_ir_is_f32(n->out[0]);
}

static kiln_kernel_fn select_batchnorm(kiln_node *n)
{
    return cnn_f32(n) && n->opset >= 9 && n->n_in == 5 && n->n_out == 1 &&
                   (n->opset < 14 || kiln_attr_int(n, "training_mode", 0) == 0)
               ? batchnorm_run
               : NULL;
}
static kiln_kernel_fn select_clip(kiln_node *n) { return cnn_f32(n) && n->opset >= 6 ? clip_run : NULL; }
static kiln_kernel_fn select_maxpool(kiln_node *n) { return cnn_f32(n) && n->opset >= 8 && n->n_out == 1 ? maxpool_run : NULL; }
static kiln_kernel_fn select_avgpool(kiln_node *n) { return cnn_f32(n) && n->opset >= 7 ? avgpool_run : NULL; }
static kiln_kernel_fn select_gavg(kiln_node *n) { return cnn_f32(n) ? gavg_run : NULL; }
static kiln_kernel_fn select_gmax(kiln_node *n) { return cnn_f32(n) ? gmax_run : NULL; }

static const kiln_cpu_kernel kernels[] = {
    {"", "BatchNormalization", select_batchnorm},
    {"", "Clip", select_clip},
    {"", "MaxPool", select_maxpool},
    {"", "AveragePool", select_avgpool},
    {"", "GlobalAveragePool", select_gavg},
    {"", "GlobalMaxPool", select_gmax},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_cnn, kernels);
