/* kernels_contrib_ew.c - CPU kernels of the com.microsoft element-wise and normalization operators
 * the transformer optimizer and ORT's offline files write (references in src/ops/contrib.c and
 * contrib_norm.c), float32: Gelu, BiasGelu, FastGelu (bias optional) on 4-lane erf/tanh Gelu
 * (vecmath.h), SkipLayerNormalization and SkipSimplifiedLayerNormalization (RMS, no mean; with
 * their optional mean, inv_std and sum outputs); rows spread over the pool from 32K elements. */
#include <math.h>
#include <string.h>

#include "core/threadpool.h"
#include "cpu/kernels.h"
#include "cpu/vecmath.h"

static bool f32_in(const kiln_node *n, int i)
{
    return i < n->n_in && n->in[i] && n->in[i]->type.dtype == KILN_DTYPE_FLOAT32;
}

/* ---- Gelu family: Y = gelu(X + bias), bias [H] over the last dim ---- */

typedef struct gelu_job {
    const float *x, *bias;
    float *y;
    int64_t h;
    bool tanh_form;
} gelu_job;

static void gelu_rows(void *ctx, int64_t r0, int64_t r1)
{
    const gelu_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->h;
        float *y = j->y + r * j->h;
        int64_t k = 0;
        for (; k + 4 <= j->h; k += 4) {
            v4f v = v4_load(x + k);
            if (j->bias) v += v4_load(j->bias + k);
            v4_store(y + k, j->tanh_form ? v4_gelu_tanh(v) : v4_gelu(v));
        }
        for (; k < j->h; k++) {
            float v = x[k] + (j->bias ? j->bias[k] : 0.0f);
            y[k] = j->tanh_form ? 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                                : 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
        }
    }
}

static kiln_status gelu_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *B = n->n_in > 1 ? kiln_run_in(c, 1) : NULL;
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t h = X->rank ? X->dims[X->rank - 1] : 1;
    if (X->dtype != KILN_DTYPE_FLOAT32 || Y->numel != X->numel || (B && (B->dtype != KILN_DTYPE_FLOAT32 || B->numel != h)))
        return n->op->run(c);
    if (!X->numel) return KILN_OK;
    gelu_job j = {X->data, B ? B->data : NULL, Y->data, h, strcmp(n->op_type, "FastGelu") == 0};
    kiln_threadpool_parallel_for(X->numel < (1 << 15) ? NULL : kiln_run_threadpool(c), X->numel / h, gelu_rows, &j);
    return KILN_OK;
}

static kiln_kernel_fn select_gelu(kiln_node *n) { return f32_in(n, 0) ? gelu_run : NULL; }

/* ---- SkipLayerNormalization: Y = LN(X + skip + bias) * gamma + beta, per row of H; the
 * simplified form: Y = (X + skip + bias) / rms * gamma (mean 0, no beta) ---- */

typedef struct sln_job {
    const float *x, *s, *g, *b, *bias;
    float *y, *mean, *inv, *sum; /* [rows, H]; mean, inv [rows] and sum [rows, H] optional */
    int64_t h, s_rows;
    float eps;
    bool center;                 /* false: the simplified form */
} sln_job;

static void sln_rows(void *ctx, int64_t r0, int64_t r1)
{
    const sln_job *j = ctx;
    int64_t h = j->h;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * h, *s = j->s + (r % j->s_rows) * h;
        float *y = j->y + r * h;
        double m = 0, v = 0;
        for (int64_t k = 0; k < h; k++) {
            y[k] = x[k] + s[k] + (j->bias ? j->bias[k] : 0.0f);
            m += y[k];
        }
        m = j->center ? m / (double)h : 0;
        for (int64_t k = 0; k < h; k++) v += ((double)y[k] - m) * ((double)y[k] - m);
        float inv = (float)(1.0 / sqrt(v / (double)h + j->eps)), mf = (float)m;
        if (j->sum) memcpy(j->sum + r * h, y, (size_t)h * sizeof *y);
        if (j->mean) j->mean[r] = mf;
        if (j->inv) j->inv[r] = inv;
        for (int64_t k = 0; k < h; k++) y[k] = (y[k] - mf) * inv * j->g[k] + (j->b ? j->b[k] : 0.0f);
    }
}

static kiln_status sln_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    bool center = strcmp(n->op_type, "SkipSimplifiedLayerNormalization") != 0;
    int bias_in = center ? 4 : 3; /* the simplified form has no beta */
    const kiln_value *X = kiln_run_in(c, 0), *S = kiln_run_in(c, 1), *G = kiln_run_in(c, 2);
    const kiln_value *Bt = center && n->n_in > 3 ? kiln_run_in(c, 3) : NULL;
    const kiln_value *Bi = n->n_in > bias_in ? kiln_run_in(c, bias_in) : NULL;
    kiln_value *Y = kiln_run_out(c, 0), *Mean = kiln_run_out(c, 1), *Inv = kiln_run_out(c, 2), *Sum = kiln_run_out(c, 3);
    int64_t h = X->rank ? X->dims[X->rank - 1] : 0;
    if ((Mean && (Mean->dtype != KILN_DTYPE_FLOAT32 || Mean->numel * h != X->numel)) ||
        (Inv && (Inv->dtype != KILN_DTYPE_FLOAT32 || Inv->numel * h != X->numel)) ||
        (Sum && (Sum->dtype != KILN_DTYPE_FLOAT32 || Sum->numel != X->numel)))
        return n->op->run(c);
    bool vec = G && G->numel == h && G->dtype == KILN_DTYPE_FLOAT32 && (!Bt || (Bt->numel == h && Bt->dtype == KILN_DTYPE_FLOAT32)) &&
               (!Bi || (Bi->numel == h && Bi->dtype == KILN_DTYPE_FLOAT32));
    if ((X->rank != 2 && X->rank != 3) || !h || X->dtype != KILN_DTYPE_FLOAT32 || !S || S->dtype != KILN_DTYPE_FLOAT32 ||
        !vec || S->numel % h || X->numel % S->numel || S->dims[S->rank - 1] != h)
        return n->op->run(c);
    sln_job j = {X->data, S->data, G->data, Bt ? Bt->data : NULL, Bi ? Bi->data : NULL, Y->data,
                 Mean ? Mean->data : NULL, Inv ? Inv->data : NULL, Sum ? Sum->data : NULL, h, S->numel / h,
                 kiln_attr_float(n, "epsilon", 1e-12f), center};
    kiln_threadpool_parallel_for(X->numel < (1 << 15) ? NULL : kiln_run_threadpool(c), X->numel / h, sln_rows, &j);
    return KILN_OK;
}

static kiln_kernel_fn select_sln(kiln_node *n) { return f32_in(n, 0) ? sln_run : NULL; }

#define MS "com.microsoft"
static const kiln_cpu_kernel kernels[] = {
    {MS, "Gelu", select_gelu},
    {MS, "BiasGelu", select_gelu},
    {MS, "FastGelu", select_gelu},
    {MS, "SkipLayerNormalization", select_sln},
    {MS, "SkipSimplifiedLayerNormalization", select_sln},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_contrib_ew, kernels);
