/* kernels_ort_nchwc.c - CPU kernels of the com.microsoft.nchwc operators (src/ops/contrib_nchwc.c)
 * when the file's block is 16 and this CPU has AVX-512F: ORT's NCHW16c bytes are kiln's blocked
 * layout (src/cpu/nchwc.h), so Conv runs on kiln's blocked convolutions (ORT's reordered filter
 * unpacked and packed once at compile time, Sum as the residual), MaxPool, AveragePool and
 * GlobalAveragePool on its blocked pools, GlobalMaxPool and nearest Upsample by 16-vectors, ReorderInput/ReorderOutput of NCHW with whole blocks on
 * its layout conversions. Anything else (block 8, channels_last, an activation kiln's blocked
 * kernels lack) keeps the reference kernel. */
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "cpu/kernels.h"
#include "cpu/nchwc.h"
#include "ops/contrib_nchwc.h"
#include "ops/nn_internal.h"

#define B16 KILN_NCHWC_BLOCK

static bool block16(const kiln_node *n) { return kiln_cpu_nchwc_available() && kiln_nchwc_block(n->graph) == B16; }

/* ---- Conv ---- */

typedef struct ort_conv {
    kiln_nchwc_conv *w;
    kiln_act act;
    bool x_blocked;
} ort_conv;

static void ort_conv_free(void *p)
{
    ort_conv *s = p;
    if (s) kiln_cpu_nchwc_conv_free(s->w);
    free(s);
}

/* activation and activation_params as kiln's blocked kernels apply them; false for others */
static bool act_of(const kiln_node *n, kiln_act *a)
{
    const char *f = kiln_attr_string(n, "activation", NULL);
    int np;
    const float *p = kiln_attr_floats(n, "activation_params", &np);
    memset(a, 0, sizeof *a);
    if (!f) return true;
    if (!strcmp(f, "Relu")) a->kind = KILN_ACT_RELU;
    else if (!strcmp(f, "Sigmoid")) a->kind = KILN_ACT_SIGMOID;
    else if (!strcmp(f, "Clip") && np == 2) a->kind = KILN_ACT_CLIP, a->alpha = p[0], a->beta = p[1];
    else if (!strcmp(f, "LeakyRelu")) a->kind = KILN_ACT_LEAKY_RELU, a->alpha = np >= 1 ? p[0] : 0.01f;
    else if (!strcmp(f, "HardSigmoid"))
        a->kind = KILN_ACT_HARD_SIGMOID, a->alpha = np >= 1 ? p[0] : 0.2f, a->beta = np >= 2 ? p[1] : 0.5f;
    else return false;
    return true;
}

static kiln_status conv_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const ort_conv *s = n->kernel_state;
    const kiln_value *X = kiln_run_in(c, 0), *Bv = kiln_run_in(c, 2), *S = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t M, C, kh, kw;
    bool dw = kiln_cpu_nchwc_conv_shape(s->w, &M, &C, &kh, &kw);
    if (dw) C = M;
    if (X->rank != 4 || X->dims[1] != C || Y->dims[1] != M || (Bv && Bv->numel != M) || (S && S->numel != Y->numel))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "X must have %lld channels, B %lld values and Sum Y's shape", (long long)C,
                             (long long)M);
    kiln_nn_geom g;
    char msg[160];
    if (!kiln_nn_geom_parse(n, 2, &g, msg, sizeof msg)) return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    g.kernel[0] = kh, g.kernel[1] = kw;
    int64_t out[2];
    if (!kiln_nn_geom_resolve(&g, X->dims + 2, out) || out[0] != Y->dims[2] || out[1] != Y->dims[3])
        return kiln_run_fail(c, KILN_ERR_SHAPE, "the window does not fit X");
    if (!Y->numel) return KILN_OK;
    kiln_nchwc_conv_io io = {.x = X->data, .x_blocked = s->x_blocked, .N = X->dims[0], .H = X->dims[2], .W = X->dims[3],
                             .y = Y->data, .y_blocked = true, .oh = out[0], .ow = out[1], .bias = Bv ? Bv->data : NULL,
                             .res = S ? S->data : NULL, .act = &s->act, .strides = {g.strides[0], g.strides[1]},
                             .dilations = {g.dilations[0], g.dilations[1]}, .pads = {g.pads[0], g.pads[1]},
                             .scratch = kiln_run_scratch(c)};
    kiln_status st = kiln_cpu_nchwc_conv_run(kiln_run_threadpool(c), s->w, &io);
    return st ? kiln_run_fail(c, st, "blocked convolution failed (layout or memory)") : KILN_OK;
}

/* ORT's reordered filter [Mp, Cw, kh, kw] back to plain OIHW (see contrib_nchwc.c) */
static void unreorder(const float *src, float *dst, int64_t M, int64_t C, int64_t kh, int64_t kw, bool dw)
{
    const int64_t B = B16;
    for (int64_t m = 0; m < M; m++)
        for (int64_t ci = 0; ci < C; ci++)
            for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++) {
                    int64_t si;
                    if (dw) si = (((m / B) * kh + i) * kw + j) * B + m % B;
                    else if (C >= B) si = ((((m / B) * (C / B) + ci / B) * kh + i) * kw + j) * B * B + (ci % B) * B + m % B;
                    else si = ((((m / B) * C + ci) * kh + i) * kw + j) * B + m % B;
                    dst[((m * C + ci) * kh + i) * kw + j] = src[si];
                }
}

static kiln_kernel_fn select_conv(kiln_node *n)
{
    const kiln_value *w = n->n_in > 1 ? kiln_ir_constant(n->in[1]) : NULL;
    kiln_act act;
    if (!block16(n) || !w || w->dtype != KILN_DTYPE_FLOAT32 || w->rank != 4 || !act_of(n, &act)) return NULL;
    int64_t M = w->dims[0], C = w->dims[1], kh = w->dims[2], kw = w->dims[3], group = kiln_attr_int(n, "group", 1);
    bool dw = group != 1;
    if (M % B16 || (dw && (C != 1 || group != M)) || (!dw && C >= B16 && C % B16)) return NULL;
    if (!n->kernel_state) {
        ort_conv *s = calloc(1, sizeof *s);
        float *plain = malloc((size_t)(w->numel ? w->numel : 1) * sizeof *plain);
        if (s && plain) {
            unreorder(w->data, plain, M, C, kh, kw, dw);
            s->w = kiln_cpu_nchwc_conv_pack(plain, M, C, kh, kw, dw);
            s->act = act;
            s->x_blocked = dw || C >= B16;
        }
        free(plain);
        if (!s || !s->w) {
            ort_conv_free(s);
            return NULL;
        }
        n->kernel_state = s;
        n->kernel_state_free = ort_conv_free;
    }
    return conv_run;
}

/* ---- pools ---- */

static kiln_status pool_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_nn_geom g;
    char msg[160];
    if (X->rank != 4 || X->dims[1] % B16) return kiln_run_fail(c, KILN_ERR_SHAPE, "X must be [N, C, H, W], C a multiple of 16");
    if (!kiln_nn_pool_geom(n, &g, msg, sizeof msg)) return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    int64_t out[2];
    if (g.nsp != 2 || !kiln_nn_geom_resolve(&g, X->dims + 2, out) || out[0] != Y->dims[2] || out[1] != Y->dims[3])
        return kiln_run_fail(c, KILN_ERR_SHAPE, "the window does not fit X");
    kiln_nchwc_pool_io io = {.x = X->data, .y = Y->data, .N = X->dims[0], .C = X->dims[1], .H = X->dims[2], .W = X->dims[3],
                             .oh = out[0], .ow = out[1], .kernel = {g.kernel[0], g.kernel[1]},
                             .strides = {g.strides[0], g.strides[1]}, .dilations = {g.dilations[0], g.dilations[1]},
                             .pads = {g.pads[0], g.pads[1], g.pads[2], g.pads[3]}, .max = !strcmp(n->op_type, "MaxPool"),
                             .count_include_pad = kiln_attr_int(n, "count_include_pad", 0) != 0};
    kiln_cpu_nchwc_pool_run(kiln_run_threadpool(c), &io);
    return KILN_OK;
}

/* GlobalAveragePool and GlobalMaxPool over blocked X [N, C, H, W] into blocked Y [N, C, 1, 1]
 * (nchwc.h; the max NaN propagating, as the plain kernel) */
static kiln_status global_pool_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (X->rank != 4 || X->dims[1] % B16 || X->dims[2] == 0 || X->dims[3] == 0)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "X must be a non-empty [N, C, H, W], C a multiple of 16");
    kiln_cpu_nchwc_global_pool(kiln_run_threadpool(c), X->data, Y->data, X->dims[0], X->dims[1],
                               X->dims[2] * X->dims[3], !strcmp(kiln_run_node(c)->op_type, "GlobalMaxPool"));
    return KILN_OK;
}

/* Upsample, nearest, integer scales: source row oy / sh and column ox / sw, 16-vectors copied by
 * the blocked resize (nchwc.h) */
static kiln_status upsample_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    int ns;
    const int64_t *sc = kiln_attr_ints(n, "scales", &ns);
    if (X->rank != 4 || X->dims[1] % B16 || !sc || ns != 4 || sc[2] < 1 || sc[3] < 1)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "X must be [N, C, H, W], C a multiple of 16, scales [1, 1, sh, sw]");
    int64_t H = X->dims[2], W = X->dims[3], sh = sc[2], sw = sc[3], oh = H * sh, ow = W * sw;
    if (Y->dims[2] != oh || Y->dims[3] != ow) return kiln_run_fail(c, KILN_ERR_SHAPE, "output size mismatch");
    if (!Y->numel) return KILN_OK;
    kiln_scratch *scratch = kiln_run_scratch(c);
    int64_t *iy = kiln_scratch_get(scratch, (size_t)(oh + ow) * sizeof *iy);
    if (!iy) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for the upsampling's index tables");
    for (int64_t i = 0; i < oh; i++) iy[i] = i / sh;
    for (int64_t i = 0; i < ow; i++) iy[oh + i] = i / sw;
    kiln_nchwc_resize_io io = {.x = X->data, .y = Y->data, .N = X->dims[0], .C = X->dims[1], .H = H, .W = W,
                               .oh = oh, .ow = ow, .iy = iy, .ix = iy + oh};
    kiln_cpu_nchwc_resize_nearest(kiln_run_threadpool(c), &io);
    kiln_scratch_put(scratch, iy);
    return KILN_OK;
}


static kiln_kernel_fn select_upsample(kiln_node *n)
{
    return block16(n) && !strcmp(kiln_attr_string(n, "mode", "nearest"), "nearest") ? upsample_run : NULL;
}

static kiln_kernel_fn select_pool(kiln_node *n) { return block16(n) ? pool_run : NULL; }
static kiln_kernel_fn select_global_pool(kiln_node *n) { return block16(n) ? global_pool_run : NULL; }

/* ---- reorders of NCHW with whole blocks ---- */

static kiln_status reorder_in_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (X->rank != 4 || X->dims[1] % B16 || Y->dims[1] != X->dims[1])
        return kiln_run_fail(c, KILN_ERR_SHAPE, "X must be [N, C, H, W], C a multiple of 16");
    kiln_cpu_nchwc_block(kiln_run_threadpool(c), X->data, Y->data, X->dims[0], X->dims[1], X->dims[2] * X->dims[3]);
    return KILN_OK;
}

static kiln_status reorder_out_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (X->rank != 4 || X->dims[1] % B16 || Y->dims[1] != X->dims[1])
        return kiln_run_fail(c, KILN_ERR_SHAPE, "X must be [N, C, H, W], C a multiple of 16 and every channel kept");
    kiln_cpu_nchwc_unblock(kiln_run_threadpool(c), X->data, Y->data, X->dims[0], X->dims[1], X->dims[2] * X->dims[3]);
    return KILN_OK;
}

static kiln_kernel_fn select_reorder_in(kiln_node *n)
{
    const kiln_type *x = &n->in[0]->type;
    bool whole = x->rank == 4 && kiln_dim_is_const(x->dims[1]) && x->dims[1].c % B16 == 0;
    return block16(n) && whole && !kiln_attr_int(n, "channels_last", 0) ? reorder_in_run : NULL;
}

static kiln_kernel_fn select_reorder_out(kiln_node *n)
{
    bool whole = kiln_attr_int(n, "channels", 0) % B16 == 0;
    return block16(n) && whole && !kiln_attr_int(n, "channels_last", 0) ? reorder_out_run : NULL;
}

#define NCHWC "com.microsoft.nchwc"
static const kiln_cpu_kernel kernels[] = {
    {NCHWC, "Conv", select_conv},
    {NCHWC, "MaxPool", select_pool},
    {NCHWC, "AveragePool", select_pool},
    {NCHWC, "GlobalAveragePool", select_global_pool},
    {NCHWC, "GlobalMaxPool", select_global_pool},
    {NCHWC, "Upsample", select_upsample},
    {NCHWC, "ReorderInput", select_reorder_in},
    {NCHWC, "ReorderOutput", select_reorder_out},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_ort_nchwc, kernels);
