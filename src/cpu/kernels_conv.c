/* kernels_conv.c - float32 2-D convolution on the packed sgemm: Y[m, p] = sum_k W[m, k] *
 * cols[k, p] per image and group, where cols is X itself for 1x1 convolutions and otherwise an
 * im2col matrix that is never stored: the GEMM asks for each [kc x nr] panel of it as it packs
 * (kiln_sgemm_implicit_b), so it only ever lives in cache. Bias and the node's fused activation
 * (kiln_node.act) are applied to each output tile right after the GEMM writes it. Depthwise
 * convolutions go to kernels_cnn.c. Every case not covered runs the reference kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "cpu/threadpool.h"
#include "cpu/vecmath.h"
#include "ops/nn_internal.h"
#include "ops/util.h"

/* ---- fused activations ---- */

static inline v4f v4_clamp01(v4f v)
{
    v = v4_sel(v < v4_splat(0.0f), v4_splat(0.0f), v);
    return v4_sel(v > v4_splat(1.0f), v4_splat(1.0f), v);
}

static inline v4f act_v4(const kiln_act *a, v4f v)
{
    switch (a->kind) {
    case KILN_ACT_NONE: return v;
    case KILN_ACT_RELU: return v4_sel(v < v4_splat(0.0f), v4_splat(0.0f), v);
    case KILN_ACT_CLIP:
        v = v4_sel(v < v4_splat(a->alpha), v4_splat(a->alpha), v);
        return v4_sel(v > v4_splat(a->beta), v4_splat(a->beta), v);
    case KILN_ACT_SIGMOID: return v4_sigmoid(v);
    case KILN_ACT_HARD_SIGMOID: return v4_clamp01(v * v4_splat(a->alpha) + v4_splat(a->beta));
    case KILN_ACT_HARD_SWISH: return v * v4_clamp01(v * v4_splat(1.0f / 6.0f) + v4_splat(0.5f));
    case KILN_ACT_LEAKY_RELU: return v4_sel(v < v4_splat(0.0f), v * v4_splat(a->alpha), v);
    }
    return v;
}

static inline float act_1(const kiln_act *a, float v)
{
    v4f r = act_v4(a, v4_splat(v));
    return r[0];
}

void kiln_cpu_act_apply(const kiln_act *a, float *y, int64_t n, float bias)
{
    if (a->kind == KILN_ACT_NONE && bias == 0.0f) return;
    v4f b4 = v4_splat(bias);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) v4_store(y + i, act_v4(a, v4_load(y + i) + b4));
    for (; i < n; i++) y[i] = act_1(a, y[i] + bias);
}

typedef struct act_job {
    const kiln_act *act;
    float *y;
    int64_t n;
} act_job;

static void act_chunks(void *ctx, int64_t begin, int64_t end)
{
    const act_job *j = ctx;
    int64_t i = begin * KILN_CPU_CHUNK, e = end * KILN_CPU_CHUNK < j->n ? end * KILN_CPU_CHUNK : j->n;
    kiln_cpu_act_apply(j->act, j->y + i, e - i, 0.0f);
}

kiln_status kiln_cpu_reference_act(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    KILN_TRY(kiln_cpu_reference(c));
    kiln_value *Y = kiln_run_out(c, 0);
    if (n->act.kind == KILN_ACT_NONE || !Y || !Y->numel) return KILN_OK;
    if (Y->dtype != KILN_DTYPE_FLOAT32)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "fused activation on a non-float32 output");
    act_job j = {&n->act, Y->data, Y->numel};
    kiln_threadpool_parallel_for(kiln_run_threadpool(c), (j.n + KILN_CPU_CHUNK - 1) / KILN_CPU_CHUNK, act_chunks, &j);
    return KILN_OK;
}

/* Per-row bias ([M] of this group, or NULL) and activation over a finished GEMM block. */
typedef struct conv_epi {
    const float *bias;
    const kiln_act *act;
} conv_epi;

static void conv_tile(void *ctx, float *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n)
{
    const conv_epi *e = ctx;
    for (int64_t r = 0; r < m; r++) kiln_cpu_act_apply(e->act, c + r * ldc, n, e->bias ? e->bias[i0 + r] : 0.0f);
}

void kiln_cpu_act_tile(void *ctx, float *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n)
{
    for (int64_t r = 0; r < m; r++) kiln_cpu_act_apply(ctx, c + r * ldc, n, 0.0f);
}

/* ---- the implicit im2col matrix ---- */

typedef struct im2col_src {
    const float *x; /* one image's channels of this group: [cg, H, W] */
    int64_t H, W, kh, kw, oh, ow;
    int64_t sy, sx, dy, dx, py, px;
} im2col_src;

/* Packs rows [p0, p0+kc) (row p = (ci, ky, kx)) and columns [j0, j0+n) (column q = oy*ow + ox)
 * of the im2col matrix as nr-wide k-major panels. */
static void im2col_pack(void *ctx, float *dst, int64_t p0, int64_t kc, int64_t j0, int64_t n, int nr)
{
    const im2col_src *s = ctx;
    for (int64_t c0 = 0; c0 < n; c0 += nr, dst += kc * nr) {
        int64_t cols = n - c0 < nr ? n - c0 : nr;
        int64_t q0 = j0 + c0, oy0 = q0 / s->ow, ox0 = q0 % s->ow;
        for (int64_t p = 0; p < kc; p++) {
            int64_t r = p0 + p, ci = r / (s->kh * s->kw), ky = (r / s->kw) % s->kh, kx = r % s->kw;
            const float *xc = s->x + ci * s->H * s->W;
            float *d = dst + p * nr;
            int64_t c = 0, oy = oy0, ox = ox0;
            while (c < cols) {
                int64_t seg = s->ow - ox < cols - c ? s->ow - ox : cols - c; /* this output row */
                int64_t iy = oy * s->sy - s->py + ky * s->dy;
                if (iy < 0 || iy >= s->H) {
                    memset(d + c, 0, (size_t)seg * sizeof *d);
                } else {
                    const float *xr = xc + iy * s->W;
                    int64_t off = kx * s->dx - s->px; /* ix = ox * sx + off */
                    int64_t k = 0;
                    /* left padding */
                    for (; k < seg && (ox + k) * s->sx + off < 0; k++) d[c + k] = 0.0f;
                    int64_t hi = k;
                    while (hi < seg && (ox + hi) * s->sx + off < s->W) hi++;
                    if (s->sx == 1) {
                        memcpy(d + c + k, xr + ox + k + off, (size_t)(hi - k) * sizeof *d);
                    } else {
                        for (int64_t t = k; t < hi; t++) d[c + t] = xr[(ox + t) * s->sx + off];
                    }
                    for (k = hi; k < seg; k++) d[c + k] = 0.0f;
                }
                c += seg;
                ox += seg;
                if (ox == s->ow) ox = 0, oy++;
            }
            for (; c < nr; c++) d[c] = 0.0f;
        }
    }
}

/* ---- Conv ---- */

static kiln_status gemm_fail(kiln_run_ctx *c, kiln_status st)
{
    return kiln_run_fail(c, st, "sgemm failed (%s)", kiln_status_name(st));
}

static kiln_status conv_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *Wt = kiln_run_in(c, 1), *Bv = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->rank != 4 || Wt->rank != 4 || Y->rank != 4 || X->dtype != KILN_DTYPE_FLOAT32 ||
        Wt->dtype != KILN_DTYPE_FLOAT32 || Y->dtype != KILN_DTYPE_FLOAT32 ||
        (Bv && (Bv->dtype != KILN_DTYPE_FLOAT32 || Bv->numel != Wt->dims[0])))
        return kiln_cpu_reference_act(c);
    nn_geom g;
    char msg[128];
    if (!nn_geom_parse(n, 2, &g, msg, sizeof msg)) return kiln_cpu_reference_act(c);
    g.kernel[0] = Wt->dims[2];
    g.kernel[1] = Wt->dims[3];
    int64_t out_hw[2];
    int64_t group = kiln_attr_int(n, "group", 1);
    int64_t Nb = X->dims[0], C = X->dims[1], H = X->dims[2], W = X->dims[3], M = Wt->dims[0];
    if (group < 1 || C % group || M % group || Wt->dims[1] != C / group || !nn_geom_resolve(&g, X->dims + 2, out_hw) ||
        out_hw[0] != Y->dims[2] || out_hw[1] != Y->dims[3] || Y->dims[1] != M || Y->dims[0] != Nb)
        return kiln_cpu_reference_act(c);
    int64_t cg = C / group, mg = M / group, kh = g.kernel[0], kw = g.kernel[1], oh = out_hw[0], ow = out_hw[1];
    int64_t kdim = cg * kh * kw, area = oh * ow;
    if (!Y->numel) return KILN_OK;
    if (!X->numel || !Wt->numel) return kiln_cpu_reference_act(c); /* no channels: the output is the bias */
    if (group == C && M == C) /* depthwise: W [C, 1, kh, kw] */
        return kiln_cpu_conv_depthwise(c, &g, X->data, Wt->data, Bv ? Bv->data : NULL, &n->act, Y->data, Nb, C, H,
                                       W, oh, ow);
    bool direct = kh == 1 && kw == 1 && g.strides[0] == 1 && g.strides[1] == 1 && !g.pads[0] && !g.pads[1] &&
                  !g.pads[2] && !g.pads[3]; /* 1x1: X itself is the column matrix */
    kiln_gemm_ctx ctx = {.pool = kiln_run_threadpool(c)};
    const float *x = X->data, *w = Wt->data, *bias = Bv ? Bv->data : NULL;
    float *y = Y->data;
    for (int64_t b = 0; b < Nb; b++)
        for (int64_t gi = 0; gi < group; gi++) {
            const float *xg = x + (b * C + gi * cg) * H * W;
            float *yg = y + (b * M + gi * mg) * area;
            conv_epi epi = {bias ? bias + gi * mg : NULL, &n->act};
            kiln_gemm_epilogue ep = {.tile = conv_tile, .tile_ctx = &epi};
            kiln_status st;
            if (direct) {
                st = kiln_sgemm_ex(&ctx, false, false, mg, area, kdim, 1.0f, w + gi * mg * kdim, kdim, xg, area, 0.0f,
                                   yg, area, &ep);
            } else {
                im2col_src src = {xg, H, W, kh, kw, oh, ow, g.strides[0], g.strides[1], g.dilations[0],
                                  g.dilations[1], g.pads[0], g.pads[1]};
                st = kiln_sgemm_implicit_b(&ctx, mg, area, kdim, w + gi * mg * kdim, kdim, im2col_pack, &src, yg,
                                           area, &ep);
            }
            if (st) return gemm_fail(c, st);
        }
    return KILN_OK;
}

kiln_kernel_fn kiln_cpu_select_conv(const kiln_node *n)
{
    if (*n->domain || strcmp(n->op_type, "Conv") || n->n_in < 2 || n->n_out < 1 || !kiln_cpu_is_f32(n->in[0]) ||
        !kiln_cpu_is_f32(n->in[1]) || n->in[0]->type.rank != 4 || n->in[1]->type.rank != 4)
        return NULL;
    return conv_run;
}
