/* contrib_nchwc.c - the com.microsoft.nchwc operators ONNX Runtime writes into files saved at
 * ORT_ENABLE_ALL: ReorderInput, ReorderOutput, Conv, MaxPool, AveragePool, GlobalAveragePool,
 * GlobalMaxPool, Upsample. A blocked value has the dims [N, Cp, H, W] (Cp the channels rounded up
 * to the block B) and the bytes [N][Cp / B][H][W][B]. B is MLAS's block of the machine that saved
 * the file (8 or 16); it is read off the file at compile time (kiln_nchwc_block): the B that every
 * nchwc Conv's output channels divide and its input channels too, unless fewer than B (a Conv
 * reads X as plain NCHW when X has fewer channels than B, as ORT's kernel does); where 8 and 16
 * both fit, the one MLAS picks on this CPU (16 with AVX-512F). Blocked values may also pass
 * through standard operators (ORT reshapes them to [N, Cp / B, H, W, B] for an Add).
 * Conv's filters come reordered by ORT: [Mp / B][Cp / B][kh][kw][B in][B out] for a blocked
 * input, [Mp / B][C][kh][kw][B out] for a plain one and for depthwise layers; an optional fourth
 * input (Sum, blocked like Y) is added before the activation (FusedConv's attributes). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/contrib_internal.h"
#include "ops/contrib_nchwc.h"
#include "ops/nn_internal.h"
#include "ops/op.h"
#include "ops/util.h"

#define NCHWC "com.microsoft.nchwc"

static bool is_nchwc(const kiln_node *n) { return n && n->domain && !strcmp(n->domain, NCHWC); }

static int preferred_block(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return __builtin_cpu_supports("avx512f") ? 16 : 8;
#else
    return 8;
#endif
}

/* Whether block b fits every nchwc Conv of g (see the file comment). */
static bool block_fits(const kiln_graph *g, int64_t b)
{
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        if (!is_nchwc(n) || strcmp(n->op_type, "Conv") || n->n_in < 2 || !n->in[0] || !n->in[1]) continue;
        const kiln_type *w = &n->in[1]->type;
        if (w->rank != 4 || !kiln_dim_is_const(w->dims[0]) || !kiln_dim_is_const(w->dims[1])) continue;
        int64_t M = w->dims[0].c, C = w->dims[1].c, group = kiln_attr_int(n, "group", 1);
        /* a Conv reads X plain when X has fewer channels than the block, else blocked */
        if (M % b || (group == 1 && C >= b && C % b)) return false;
    }
    return true;
}

int kiln_nchwc_block(const kiln_graph *g)
{
    int pref = preferred_block(), other = pref == 16 ? 8 : 16;
    if (block_fits(g, pref)) return pref;
    if (block_fits(g, other)) return other;
    return 0;
}

typedef struct nchwc_params {
    int64_t block;
} nchwc_params;

static kiln_status nchwc_parse(const kiln_node *n, void *params, kiln_err *err)
{
    nchwc_params *p = params;
    p->block = kiln_nchwc_block(n->graph);
    if (!p->block)
        return kiln_errf(err, KILN_ERR_MODEL, "%s: the com.microsoft.nchwc channel counts fit neither block 8 nor 16", n->name);
    return KILN_OK;
}

static const nchwc_params *params_of(const kiln_node *n) { return n->params; }

/* The fused activation; none without the attribute (FusedConv requires it, nchwc.Conv does not). */
static bool conv_act(const kiln_node *n, kiln_contrib_act *a, char *msg, int size)
{
    if (!kiln_node_attr(n, "activation")) {
        memset(a, 0, sizeof *a);
        a->kind = KILN_CONTRIB_ACT_NONE;
        return true;
    }
    return kiln_contrib_act_parse(n, true, a, msg, size);
}

static int64_t round_up(int64_t x, int64_t b) { return (x + b - 1) / b * b; }

/* offset of element (b, c, pix) of a blocked [N, Cp, P] tensor */
static inline int64_t boff(int64_t B, int64_t Cp, int64_t P, int64_t n, int64_t c, int64_t pix)
{
    return ((n * (Cp / B) + c / B) * P + pix) * B + c % B;
}

/* ---- ReorderInput: X [N, C, H, W] (channels_last: [N, H, W, C]) -> [N, Cp, H, W] blocked ---- */

static kiln_status reorder_in_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X");
    if (x->dtype && x->dtype != KILN_DTYPE_FLOAT32) return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "X must be float32");
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, KILN_DTYPE_FLOAT32);
    if (x->rank != 4) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must be 4-D, is %d-D", x->rank);
    bool last = kiln_attr_int(n, "channels_last", 0) != 0;
    kiln_dim ch = x->dims[last ? 3 : 1];
    if (!kiln_dim_is_const(ch)) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X's channel dim must be a constant");
    kiln_dim d[4] = {x->dims[0], kiln_dim_const(round_up(ch.c, params_of(n)->block)), x->dims[last ? 1 : 2],
                     x->dims[last ? 2 : 3]};
    return kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 4, d);
}

static kiln_status reorder_in_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t B = params_of(n)->block;
    bool last = kiln_attr_int(n, "channels_last", 0) != 0;
    int64_t N = X->dims[0], C = X->dims[last ? 3 : 1], P = X->dims[last ? 1 : 2] * X->dims[last ? 2 : 3], Cp = Y->dims[1];
    const float *x = X->data;
    float *y = Y->data;
    memset(y, 0, (size_t)Y->numel * sizeof *y);
    for (int64_t b = 0; b < N; b++)
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t p = 0; p < P; p++)
                y[boff(B, Cp, P, b, ch, p)] = last ? x[(b * P + p) * C + ch] : x[(b * C + ch) * P + p];
    return KILN_OK;
}

/* ---- ReorderOutput: blocked [N, Cp, H, W] -> [N, channels, H, W] (or [N, H, W, channels]) ---- */

static kiln_status reorder_out_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    int64_t ch = kiln_attr_int(n, "channels", -1);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X");
    if (ch < 1) return kiln_infer_fail(c, KILN_ERR_MODEL, "attribute channels must be positive");
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, KILN_DTYPE_FLOAT32);
    if (x->rank != 4) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must be 4-D, is %d-D", x->rank);
    if (kiln_dim_is_const(x->dims[1]) && (x->dims[1].c < ch || x->dims[1].c % params_of(n)->block))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X has %lld channels, not a block multiple >= %lld", (long long)x->dims[1].c,
                               (long long)ch);
    bool last = kiln_attr_int(n, "channels_last", 0) != 0;
    kiln_dim d[4] = {x->dims[0], kiln_dim_const(ch), x->dims[2], x->dims[3]};
    kiln_dim dl[4] = {x->dims[0], x->dims[2], x->dims[3], kiln_dim_const(ch)};
    return kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 4, last ? dl : d);
}

static kiln_status reorder_out_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t B = params_of(n)->block, ch = kiln_attr_int(n, "channels", 1);
    bool last = kiln_attr_int(n, "channels_last", 0) != 0;
    int64_t N = X->dims[0], Cp = X->dims[1], P = X->dims[2] * X->dims[3];
    if (Cp % B || Cp < ch) return kiln_run_fail(c, KILN_ERR_SHAPE, "X's channels %lld do not fit block %lld", (long long)Cp, (long long)B);
    const float *x = X->data;
    float *y = Y->data;
    for (int64_t b = 0; b < N; b++)
        for (int64_t k = 0; k < ch; k++)
            for (int64_t p = 0; p < P; p++) {
                float v = x[boff(B, Cp, P, b, k, p)];
                if (last) y[(b * P + p) * ch + k] = v;
                else y[(b * ch + k) * P + p] = v;
            }
    return KILN_OK;
}

/* ---- Conv: X, W (reordered), B?, Sum? -> Y blocked [N, Mp, oh, ow] ---- */

static kiln_status conv_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0), *w = kiln_infer_in(c, 1);
    kiln_nn_geom g;
    char msg[160];
    kiln_contrib_act a;
    if (!x || !w) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X and W");
    if (!conv_act(n, &a, msg, sizeof msg)) return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    if (x->rank < 0 || w->rank < 0) return kiln_infer_set_out_unknown(c, 0, KILN_DTYPE_FLOAT32);
    if (x->rank != 4 || w->rank != 4) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X and W must be 4-D");
    if (!kiln_nn_geom_parse(n, 2, &g, msg, sizeof msg)) return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    int64_t B = params_of(n)->block, group = kiln_attr_int(n, "group", 1);
    if (!kiln_dim_is_const(w->dims[0]) || w->dims[0].c % B)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "W's output channels must be a multiple of the block %lld", (long long)B);
    if (group != 1 && (!kiln_dim_is_const(w->dims[1]) || w->dims[1].c != 1 || group != w->dims[0].c))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "group %lld: only group 1 and depthwise layers", (long long)group);
    kiln_dim d[4] = {x->dims[0], w->dims[0]};
    for (int i = 0; i < 2; i++) d[2 + i] = kiln_nn_geom_out_dim(kiln_infer_dims(c), &g, i, x->dims[2 + i], w->dims[2 + i]);
    return kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 4, d);
}

static kiln_status conv_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const nchwc_params *pr = params_of(n);
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1), *Bv = kiln_run_in(c, 2), *S = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_nn_geom g;
    char msg[160];
    kiln_contrib_act a;
    if (!conv_act(n, &a, msg, sizeof msg) || !kiln_nn_geom_parse(n, 2, &g, msg, sizeof msg))
        return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    int64_t B = pr->block, N = X->dims[0], C = X->dims[1], H = X->dims[2], Wd = X->dims[3];
    int64_t M = W->dims[0], Cw = W->dims[1], kh = W->dims[2], kw = W->dims[3];
    bool dw = kiln_attr_int(n, "group", 1) != 1, xb = dw || C >= B; /* as ORT: fewer channels than a block is plain */
    g.kernel[0] = kh, g.kernel[1] = kw;
    int64_t in[2] = {H, Wd}, out[2];
    if (!kiln_nn_geom_resolve(&g, in, out)) return kiln_run_fail(c, KILN_ERR_SHAPE, "the window does not fit the padded input");
    if (Y->dims[2] != out[0] || Y->dims[3] != out[1]) return kiln_run_fail(c, KILN_ERR_SHAPE, "output size mismatch");
    if (dw ? C != M || C % B : Cw != C || (xb && C % B))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "X has %lld channels for W [%lld, %lld, %lld, %lld]", (long long)C, (long long)M,
                             (long long)Cw, (long long)kh, (long long)kw);
    if ((Bv && Bv->numel != M) || (S && S->numel != Y->numel))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "B must hold %lld values and Sum Y's shape", (long long)M);
    const float *x = X->data, *w = W->data, *bias = Bv ? Bv->data : NULL, *sum = S ? S->data : NULL;
    float *y = Y->data;
    int64_t oh = out[0], ow = out[1], P = H * Wd, OP = oh * ow;
    for (int64_t b = 0; b < N; b++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++) {
                    double acc = bias ? bias[m] : 0.0;
                    int64_t c0 = dw ? m : 0, c1 = dw ? m + 1 : C;
                    for (int64_t ci = c0; ci < c1; ci++)
                        for (int64_t i = 0; i < kh; i++) {
                            int64_t iy = oy * g.strides[0] - g.pads[0] + i * g.dilations[0];
                            if (iy < 0 || iy >= H) continue;
                            for (int64_t j = 0; j < kw; j++) {
                                int64_t ix = ox * g.strides[1] - g.pads[1] + j * g.dilations[1];
                                if (ix < 0 || ix >= Wd) continue;
                                float xv = xb ? x[boff(B, C, P, b, ci, iy * Wd + ix)] : x[((b * C + ci) * H + iy) * Wd + ix];
                                int64_t wi;
                                if (dw) wi = (((m / B) * kh + i) * kw + j) * B + m % B;
                                else if (xb)
                                    wi = ((((m / B) * (C / B) + ci / B) * kh + i) * kw + j) * B * B + (ci % B) * B + m % B;
                                else wi = ((((m / B) * C + ci) * kh + i) * kw + j) * B + m % B;
                                acc += (double)xv * w[wi];
                            }
                        }
                    int64_t yi = boff(B, M, OP, b, m, oy * ow + ox);
                    if (sum) acc += sum[yi];
                    y[yi] = (float)kiln_contrib_act_eval(&a, acc);
                }
    return KILN_OK;
}

/* ---- pools: blocked [N, Cp, H, W] -> blocked [N, Cp, oh, ow] ---- */

static bool is_global(const kiln_node *n) { return !strncmp(n->op_type, "Global", 6); }
static bool is_max(const kiln_node *n) { return strstr(n->op_type, "Max") != NULL; }

static kiln_status pool_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X");
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, KILN_DTYPE_FLOAT32);
    if (x->rank != 4) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must be 4-D");
    kiln_dim d[4] = {x->dims[0], x->dims[1], kiln_dim_const(1), kiln_dim_const(1)};
    if (!is_global(n)) {
        kiln_nn_geom g;
        char msg[160];
        if (!kiln_nn_pool_geom(n, &g, msg, sizeof msg)) return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
        if (g.nsp != 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "kernel_shape must have 2 values");
        for (int i = 0; i < 2; i++)
            d[2 + i] = kiln_nn_geom_out_dim(kiln_infer_dims(c), &g, i, x->dims[2 + i], kiln_dim_const(g.kernel[i]));
    }
    return kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 4, d);
}

static kiln_status pool_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t B = params_of(n)->block, N = X->dims[0], C = X->dims[1], H = X->dims[2], Wd = X->dims[3];
    if (C % B) return kiln_run_fail(c, KILN_ERR_SHAPE, "X's channels %lld are not a multiple of the block", (long long)C);
    kiln_nn_geom g;
    char msg[160];
    int64_t out[2] = {1, 1};
    bool mx = is_max(n), incl = kiln_attr_int(n, "count_include_pad", 0) != 0;
    if (is_global(n)) {
        memset(&g, 0, sizeof g);
        g.nsp = 2, g.kernel[0] = H, g.kernel[1] = Wd, g.strides[0] = g.strides[1] = 1, g.dilations[0] = g.dilations[1] = 1;
    } else {
        int64_t in[2] = {H, Wd};
        if (!kiln_nn_pool_geom(n, &g, msg, sizeof msg)) return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
        if (!kiln_nn_geom_resolve(&g, in, out)) return kiln_run_fail(c, KILN_ERR_SHAPE, "the window does not fit the padded input");
    }
    if (Y->dims[2] != out[0] || Y->dims[3] != out[1]) return kiln_run_fail(c, KILN_ERR_SHAPE, "output size mismatch");
    if (!H || !Wd) return kiln_run_fail(c, KILN_ERR_SHAPE, "X has an empty image");
    const float *x = X->data;
    float *y = Y->data;
    int64_t P = H * Wd, OP = out[0] * out[1];
    for (int64_t b = 0; b < N; b++)
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t oy = 0; oy < out[0]; oy++)
                for (int64_t ox = 0; ox < out[1]; ox++) {
                    double acc = mx ? -INFINITY : 0.0;
                    int64_t cnt = 0, cnt_pad = 0;
                    for (int64_t i = 0; i < g.kernel[0]; i++) {
                        int64_t iy = oy * g.strides[0] - g.pads[0] + i * g.dilations[0];
                        for (int64_t j = 0; j < g.kernel[1]; j++) {
                            int64_t ix = ox * g.strides[1] - g.pads[1] + j * g.dilations[1];
                            if (iy < H + g.pads[2] && ix < Wd + g.pads[3]) cnt_pad++;
                            if (iy < 0 || iy >= H || ix < 0 || ix >= Wd) continue;
                            float v = x[boff(B, C, P, b, ch, iy * Wd + ix)];
                            acc = mx ? (v > acc ? v : acc) : acc + v;
                            cnt++;
                        }
                    }
                    int64_t div = incl ? cnt_pad : cnt;
                    y[boff(B, C, OP, b, ch, oy * out[1] + ox)] = (float)(mx ? acc : div ? acc / (double)div : 0.0);
                }
    return KILN_OK;
}

/* ---- Upsample: blocked [N, Cp, H, W] -> [N, Cp, H * sh, W * sw]; scales (ints) [1, 1, sh, sw] ---- */

static bool upsample_scales(const kiln_node *n, int64_t *sh, int64_t *sw)
{
    int ns;
    const int64_t *s = kiln_attr_ints(n, "scales", &ns);
    if (!s || ns != 4 || s[0] != 1 || s[1] != 1 || s[2] < 1 || s[3] < 1) return false;
    *sh = s[2], *sw = s[3];
    return true;
}

static kiln_status upsample_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    int64_t sh, sw;
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X");
    if (!upsample_scales(n, &sh, &sw)) return kiln_infer_fail(c, KILN_ERR_MODEL, "scales must be [1, 1, sh, sw], positive");
    const char *mode = kiln_attr_string(n, "mode", "nearest");
    if (strcmp(mode, "nearest") && strcmp(mode, "linear"))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "mode '%s'", mode);
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, KILN_DTYPE_FLOAT32);
    if (x->rank != 4) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must be 4-D");
    kiln_dimtab *t = kiln_infer_dims(c);
    kiln_dim d[4] = {x->dims[0], x->dims[1], kiln_dim_mul(t, x->dims[2], kiln_dim_const(sh)),
                     kiln_dim_mul(t, x->dims[3], kiln_dim_const(sw))};
    return kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 4, d);
}

/* source coordinate of output index o for scale s over n inputs (linear mode) */
static double src_coord(const char *ctm, int64_t o, int64_t s, int64_t n)
{
    if (!strcmp(ctm, "align_corners")) return n * s > 1 ? (double)o * (double)(n - 1) / (double)(n * s - 1) : 0.0;
    if (!strcmp(ctm, "asymmetric")) return (double)o / (double)s;
    double v = ((double)o + 0.5) / (double)s - 0.5; /* half_pixel */
    return v < 0 ? 0 : v;
}

static kiln_status upsample_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t sh, sw, B = params_of(n)->block, N = X->dims[0], C = X->dims[1], H = X->dims[2], Wd = X->dims[3];
    if (!upsample_scales(n, &sh, &sw) || C % B) return kiln_run_fail(c, KILN_ERR_SHAPE, "bad scales or channels");
    bool nearest = !strcmp(kiln_attr_string(n, "mode", "nearest"), "nearest");
    const char *ctm = kiln_attr_string(n, "coordinate_transformation_mode", "asymmetric");
    int64_t oh = H * sh, ow = Wd * sw, P = H * Wd, OP = oh * ow;
    const float *x = X->data;
    float *y = Y->data;
    for (int64_t b = 0; b < N; b++)
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++) {
                    float v;
                    if (nearest) {
                        v = x[boff(B, C, P, b, ch, (oy / sh) * Wd + ox / sw)];
                    } else {
                        double fy = src_coord(ctm, oy, sh, H), fx = src_coord(ctm, ox, sw, Wd);
                        int64_t y0 = (int64_t)fy, x0 = (int64_t)fx;
                        y0 = y0 > H - 1 ? H - 1 : y0, x0 = x0 > Wd - 1 ? Wd - 1 : x0;
                        int64_t y1 = y0 + 1 < H ? y0 + 1 : H - 1, x1 = x0 + 1 < Wd ? x0 + 1 : Wd - 1;
                        double dy = fy - (double)y0, dx = fx - (double)x0;
                        dy = dy > 1 ? 1 : dy, dx = dx > 1 ? 1 : dx;
                        double a = x[boff(B, C, P, b, ch, y0 * Wd + x0)], bb = x[boff(B, C, P, b, ch, y0 * Wd + x1)];
                        double cc = x[boff(B, C, P, b, ch, y1 * Wd + x0)], dd = x[boff(B, C, P, b, ch, y1 * Wd + x1)];
                        v = (float)((a * (1 - dx) + bb * dx) * (1 - dy) + (cc * (1 - dx) + dd * dx) * dy);
                    }
                    y[boff(B, C, OP, b, ch, oy * ow + ox)] = v;
                }
    return KILN_OK;
}

#define ENTRY(op, infer, run) {NCHWC, op, 1, infer, run, 0, 0, nchwc_parse, sizeof(nchwc_params)}
static const kiln_op_def defs[] = {
    ENTRY("ReorderInput", reorder_in_infer, reorder_in_run),
    ENTRY("ReorderOutput", reorder_out_infer, reorder_out_run),
    ENTRY("Conv", conv_infer, conv_run),
    ENTRY("MaxPool", pool_infer, pool_run),
    ENTRY("AveragePool", pool_infer, pool_run),
    ENTRY("GlobalAveragePool", pool_infer, pool_run),
    ENTRY("GlobalMaxPool", pool_infer, pool_run),
    ENTRY("Upsample", upsample_infer, upsample_run),
};

const kiln_op_table kiln_ops_contrib_nchwc = {defs, sizeof defs / sizeof defs[0]};
