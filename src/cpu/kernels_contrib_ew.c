/* kernels_contrib_ew.c - CPU kernels of the com.microsoft element-wise and normalization operators
 * the transformer optimizer and ORT's offline files write (references in src/ops/contrib.c and
 * contrib_norm.c), float32: Gelu, BiasGelu, FastGelu (bias optional) on the wide erf/tanh Gelu
 * (vecmath.h), SkipLayerNormalization and SkipSimplifiedLayerNormalization (RMS, no mean; with
 * their optional mean, inv_std and sum outputs), SimplifiedLayerNormalization over the last
 * dim (the same rows without a skip), EmbedLayerNormalization and
 * QEmbedLayerNormalization (its 8-bit tables dequantized once, when the session is compiled);
 * rows spread over the pool from 32K elements; the layer norms 16 lanes wide under AVX-512. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "cpu/target.h"
#include "cpu/vecmath.h"
#include "ops/contrib_internal.h"
#include "ops/util.h"

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

/* rows [r0, r1): the bias added in place, then the 16- or 8-lane Gelu over the row */
KILN_VECTORIZE static void gelu_rows(void *ctx, int64_t r0, int64_t r1)
{
    const gelu_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->h;
        float *y = j->y + r * j->h;
        if (j->bias) {
            for (int64_t k = 0; k < j->h; k++) y[k] = x[k] + j->bias[k];
            x = y;
        }
        if (j->tanh_form) kiln_vec_gelu_tanh(x, y, j->h);
        else kiln_cpu_gelu(x, y, j->h);
    }
}

static kiln_status gelu_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *B = n->n_in > 1 ? kiln_run_in(c, 1) : NULL;
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t h = X->rank ? X->dims[X->rank - 1] : 1;
    if (X->dtype != KILN_DTYPE_FLOAT32 || Y->numel != X->numel || (B && (B->dtype != KILN_DTYPE_FLOAT32 || B->numel != h)))
        return kiln_cpu_reference(c);
    if (!X->numel) return KILN_OK;
    gelu_job j = {X->data, B ? B->data : NULL, Y->data, h, strcmp(n->op_type, "FastGelu") == 0};
    kiln_threadpool_parallel_for(X->numel < (1 << 15) ? NULL : kiln_run_threadpool(c), X->numel / h, gelu_rows, &j);
    return KILN_OK;
}

static kiln_kernel_fn select_gelu(kiln_node *n) { return f32_in(n, 0) ? gelu_run : NULL; }

/* ---- SkipLayerNormalization: Y = LN(X + skip + bias) * gamma + beta, per row of H; the
 * simplified form: Y = (X + skip + bias) / rms * gamma (mean 0, no beta) ---- */

typedef struct sln_job {
    const float *x, *s, *g, *b, *bias; /* s (skip) NULL: SimplifiedLayerNormalization */
    float *y, *mean, *inv, *sum; /* [rows, H]; mean, inv [rows] and sum [rows, H] optional */
    int64_t h, s_rows;
    float eps;
    bool center;                 /* false: the simplified form */
} sln_job;

typedef double v4d __attribute__((vector_size(32)));

/* The sum over k < h of y[k] - m, or of its square, in double: four chains (one is bound by
 * the add's latency). */
static inline double row_sum(const float *y, int64_t h, double m, bool square)
{
    v4d acc = {0};
    int64_t k = 0;
    for (; k + 4 <= h; k += 4) {
        v4d d = {(double)y[k] - m, (double)y[k + 1] - m, (double)y[k + 2] - m, (double)y[k + 3] - m};
        acc += square ? d * d : d;
    }
    double s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (; k < h; k++) s += square ? ((double)y[k] - m) * ((double)y[k] - m) : (double)y[k] - m;
    return s;
}

static void sln_rows(void *ctx, int64_t r0, int64_t r1)
{
    const sln_job *j = ctx;
    int64_t h = j->h;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * h, *s = j->s ? j->s + (r % j->s_rows) * h : NULL;
        float *y = j->y + r * h;
        if (s || j->bias)
            for (int64_t k = 0; k < h; k++) y[k] = x[k] + (s ? s[k] : 0.0f) + (j->bias ? j->bias[k] : 0.0f);
        else if (y != x)
            memcpy(y, x, (size_t)h * sizeof *y);
        double m = j->center ? row_sum(y, h, 0.0, false) / (double)h : 0.0, v = row_sum(y, h, m, true);
        float inv = (float)(1.0 / sqrt(v / (double)h + j->eps)), mf = (float)m;
        if (j->sum) memcpy(j->sum + r * h, y, (size_t)h * sizeof *y);
        if (j->mean) j->mean[r] = mf;
        if (j->inv) j->inv[r] = inv;
        for (int64_t k = 0; k < h; k++) y[k] = (y[k] - mf) * inv * j->g[k] + (j->b ? j->b[k] : 0.0f);
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SLN16 1
KILN_TARGET_BEGIN("avx512f")
#include "cpu/avx512_util.h"

/* The sum over k < h of y[k] - m, or of its square, in double, 16 floats a step. */
static inline double row_sum16(const float *y, int64_t h, double m, bool square)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd(), mv = _mm512_set1_pd(m);
    for (int64_t k = 0; k < h; k += 16) {
        __mmask16 live = kiln_lanes(h - k);
        __m512 v = _mm512_maskz_loadu_ps(live, y + k);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v)),
                hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        lo = _mm512_maskz_sub_pd((__mmask8)live, lo, mv), hi = _mm512_maskz_sub_pd((__mmask8)(live >> 8), hi, mv);
        a0 = square ? _mm512_fmadd_pd(lo, lo, a0) : _mm512_add_pd(a0, lo);
        a1 = square ? _mm512_fmadd_pd(hi, hi, a1) : _mm512_add_pd(a1, hi);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

/* sln_rows on 16 lanes (the same sums in double; the last bits of the scaled output may differ,
 * FMA contracted) */
static void sln_rows16(void *ctx, int64_t r0, int64_t r1)
{
    const sln_job *j = ctx;
    int64_t h = j->h;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * h, *s = j->s ? j->s + (r % j->s_rows) * h : NULL;
        float *y = j->y + r * h;
        for (int64_t k = 0; k < h; k += 16) {
            __mmask16 live = kiln_lanes(h - k);
            __m512 v = _mm512_maskz_loadu_ps(live, x + k);
            if (s) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(live, s + k));
            if (j->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(live, j->bias + k));
            _mm512_mask_storeu_ps(y + k, live, v);
        }
        double m = j->center ? row_sum16(y, h, 0.0, false) / (double)h : 0.0, var = row_sum16(y, h, m, true);
        float inv = (float)(1.0 / sqrt(var / (double)h + j->eps)), mf = (float)m;
        if (j->sum) memcpy(j->sum + r * h, y, (size_t)h * sizeof *y);
        if (j->mean) j->mean[r] = mf;
        if (j->inv) j->inv[r] = inv;
        __m512 mv = _mm512_set1_ps(mf), iv = _mm512_set1_ps(inv);
        for (int64_t k = 0; k < h; k += 16) {
            __mmask16 live = kiln_lanes(h - k);
            __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, y + k), mv), iv),
                                     _mm512_maskz_loadu_ps(live, j->g + k));
            if (j->b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(live, j->b + k));
            _mm512_mask_storeu_ps(y + k, live, v);
        }
    }
}

KILN_TARGET_END
#endif

/* The row function for this CPU. */
static kiln_parallel_fn sln_fn(void)
{
#if HAVE_SLN16
    if (kiln_gemm_level_detect() == KILN_GEMM_LEVEL_AVX512) return sln_rows16;
#endif
    return sln_rows;
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
        return kiln_cpu_reference(c);
    bool vec = G && G->numel == h && G->dtype == KILN_DTYPE_FLOAT32 && (!Bt || (Bt->numel == h && Bt->dtype == KILN_DTYPE_FLOAT32)) &&
               (!Bi || (Bi->numel == h && Bi->dtype == KILN_DTYPE_FLOAT32));
    if ((X->rank != 2 && X->rank != 3) || !h || X->dtype != KILN_DTYPE_FLOAT32 || !S || S->dtype != KILN_DTYPE_FLOAT32 ||
        !vec || S->numel % h || X->numel % S->numel || S->dims[S->rank - 1] != h)
        return kiln_cpu_reference(c);
    sln_job j = {X->data, S->data, G->data, Bt ? Bt->data : NULL, Bi ? Bi->data : NULL, Y->data,
                 Mean ? Mean->data : NULL, Inv ? Inv->data : NULL, Sum ? Sum->data : NULL, h, S->numel / h,
                 kiln_attr_float(n, "epsilon", 1e-12f), center};
    kiln_threadpool_parallel_for(X->numel < (1 << 15) ? NULL : kiln_run_threadpool(c), X->numel / h, sln_fn(), &j);
    return KILN_OK;
}

static kiln_kernel_fn select_sln(kiln_node *n) { return f32_in(n, 0) ? sln_run : NULL; }

/* SimplifiedLayerNormalization over the last dim (src/ops/llm_norm.c): the skip form's rows
 * without a skip; other axes, scales and types run the reference. */
static kiln_status rms_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *G = n->n_in > 1 ? kiln_run_in(c, 1) : NULL;
    kiln_value *Y = kiln_run_out(c, 0), *Inv = kiln_run_out(c, 1);
    int64_t h = X->rank ? X->dims[X->rank - 1] : 0, axis = kiln_attr_int(n, "axis", -1);
    if (!h || (axis != -1 && axis != X->rank - 1) || X->dtype != KILN_DTYPE_FLOAT32 || !G ||
        G->dtype != KILN_DTYPE_FLOAT32 || G->rank > 1 || G->numel != h ||
        (Inv && (Inv->dtype != KILN_DTYPE_FLOAT32 || Inv->numel * h != X->numel)))
        return kiln_cpu_reference(c);
    sln_job j = {X->data, NULL, G->data, NULL, NULL, Y->data, NULL, Inv ? Inv->data : NULL, NULL, h, 1,
                 kiln_attr_float(n, "epsilon", 1e-5f), false};
    kiln_threadpool_parallel_for(X->numel < (1 << 15) ? NULL : kiln_run_threadpool(c), X->numel / h, sln_fn(), &j);
    return KILN_OK;
}

static kiln_kernel_fn select_rms(kiln_node *n) { return f32_in(n, 0) ? rms_run : NULL; }

/* ---- EmbedLayerNormalization / QEmbedLayerNormalization: the reference's arithmetic (the sum of
 * the embeddings rounded to float, mean and variance in double) on typed float rows ---- */

enum { QE_SCALES = 8, QE_ZPS = 13 }; /* QEmbedLayerNormalization's scales and zero points of inputs 2..6 */

typedef struct embed_state {
    kiln_value *t[5]; /* the dequantized word, position, segment tables, gamma, beta */
} embed_state;

static void embed_state_free(void *p)
{
    embed_state *s = p;
    if (!s) return;
    for (int i = 0; i < 5; i++) kiln_value_free(s->t[i]);
    free(s);
}

typedef struct embed_job {
    const kiln_value *ids, *seg, *pos;
    const float *we, *pe, *se, *g, *b;
    float *y, *sum;
    int64_t S, H;
    double eps;
} embed_job;

static void embed_rows(void *ctx, int64_t t0, int64_t t1)
{
    const embed_job *j = ctx;
    int64_t H = j->H;
    for (int64_t t = t0; t < t1; t++) {
        int64_t w = kiln_load_i64(j->ids->dtype, j->ids->data, t);
        int64_t p = j->pos ? kiln_load_i64(j->pos->dtype, j->pos->data, j->pos->dims[0] == 1 ? t % j->S : t) : t % j->S;
        const float *we = j->we + w * H, *pe = j->pe + p * H;
        const float *se = j->se ? j->se + kiln_load_i64(j->seg->dtype, j->seg->data, t) * H : NULL;
        float *y = j->y + t * H;
        double m = 0, v = 0;
        for (int64_t k = 0; k < H; k++) {
            y[k] = (float)((double)we[k] + (double)pe[k] + (se ? (double)se[k] : 0.0));
            m += y[k];
        }
        m /= (double)H;
        for (int64_t k = 0; k < H; k++) v += ((double)y[k] - m) * ((double)y[k] - m);
        double inv = 1.0 / sqrt(v / (double)H + j->eps);
        if (j->sum) memcpy(j->sum + t * H, y, (size_t)H * sizeof *y);
        for (int64_t k = 0; k < H; k++) y[k] = (float)(((double)y[k] - m) * inv * j->g[k] + j->b[k]);
    }
}

static kiln_status embed_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const embed_state *st = n->kernel_state;
    const kiln_value *in[KILN_EMBED_N_IN];
    for (int i = 0; i < KILN_EMBED_N_IN; i++) in[i] = i < n->n_in && (!st || i < KILN_EMBED_POSIDS) ? kiln_run_in(c, i) : NULL;
    for (int i = 0; st && i < 5; i++)
        if (in[KILN_EMBED_WORD + i]) in[KILN_EMBED_WORD + i] = st->t[i];
    kiln_value *Y = kiln_run_out(c, 0), *MI = kiln_run_out(c, 1), *Sum = kiln_run_out(c, 2);
    char msg[192];
    if (kiln_contrib_embed_check(in, msg, sizeof msg)) return kiln_cpu_reference(c); /* it reports */
    const kiln_value *ids = in[KILN_EMBED_IDS], *seg = in[KILN_EMBED_SEG], *pos = in[KILN_EMBED_POSIDS];
    const kiln_value *we = in[KILN_EMBED_WORD], *pe = in[KILN_EMBED_POS], *se = in[KILN_EMBED_SEGEMB];
    for (int i = KILN_EMBED_WORD; i <= KILN_EMBED_BETA; i++)
        if (in[i] && in[i]->dtype != KILN_DTYPE_FLOAT32) return kiln_cpu_reference(c);
    if (!Y || Y->dtype != KILN_DTYPE_FLOAT32 || (Sum && Sum->dtype != KILN_DTYPE_FLOAT32)) return kiln_cpu_reference(c);
    int64_t B = ids->dims[0], S = ids->dims[1], H = we->dims[1], T = B * S;
    /* every id in range, else the reference names the token */
    for (int64_t t = 0; t < T; t++) {
        int64_t w = kiln_load_i64(ids->dtype, ids->data, t);
        int64_t p = pos ? kiln_load_i64(pos->dtype, pos->data, pos->dims[0] == 1 ? t % S : t) : t % S;
        int64_t sg = seg ? kiln_load_i64(seg->dtype, seg->data, t) : 0;
        if (w < 0 || w >= we->dims[0] || p < 0 || p >= pe->dims[0] || (se && (sg < 0 || sg >= se->dims[0])))
            return kiln_cpu_reference(c);
    }
    if (!H || !T) return kiln_cpu_reference(c);
    embed_job j = {ids, seg, pos, we->data, pe->data, se ? se->data : NULL, in[KILN_EMBED_GAMMA]->data,
                   in[KILN_EMBED_BETA]->data, Y->data, Sum ? Sum->data : NULL, S, H,
                   kiln_attr_float(n, "epsilon", 1e-12f)};
    kiln_threadpool_parallel_for(T * H < (1 << 15) ? NULL : kiln_run_threadpool(c), T, embed_rows, &j);
    const kiln_value *mask = in[KILN_EMBED_MASK];
    for (int64_t bi = 0; MI && bi < B; bi++) { /* mask_index: per batch row, the mask's ones */
        int64_t cnt = 0;
        for (int64_t k = 0; mask && k < S; k++) cnt += kiln_load_i64(mask->dtype, mask->data, bi * S + k) == 1;
        kiln_store_i64(MI->dtype, MI->data, bi, cnt);
    }
    return KILN_OK;
}

static kiln_kernel_fn select_embed(kiln_node *n) { return f32_in(n, KILN_EMBED_WORD) ? embed_run : NULL; }

/* QEmbedLayerNormalization: its five tables dequantized now ((q - zp) * scale, as its reference),
 * when they and their parameters are constants. */
static kiln_kernel_fn select_qembed(kiln_node *n)
{
    if (n->kernel_state) return embed_run;
    if (n->n_in < QE_SCALES + 5) return NULL;
    embed_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    for (int i = 0; i < 5; i++) {
        const kiln_value *q = kiln_ir_constant(n->in[KILN_EMBED_WORD + i]);
        const kiln_value *sc = kiln_ir_constant(n->in[QE_SCALES + i]);
        const kiln_value *zp = n->n_in > QE_ZPS + i ? kiln_ir_constant(n->in[QE_ZPS + i]) : NULL;
        if (!n->in[KILN_EMBED_WORD + i]) continue; /* no segment table */
        bool q8 = q && (q->dtype == KILN_DTYPE_UINT8 || q->dtype == KILN_DTYPE_INT8);
        if (!q8 || !sc || sc->dtype != KILN_DTYPE_FLOAT32 || sc->numel != 1 ||
            (n->n_in > QE_ZPS + i && n->in[QE_ZPS + i] && (!zp || zp->dtype != q->dtype || zp->numel != 1))) {
            embed_state_free(s);
            return NULL;
        }
        kiln_err e = {0};
        if (kiln_tensor_new(KILN_DTYPE_FLOAT32, q->rank, q->dims, &s->t[i], &e)) {
            embed_state_free(s);
            return NULL;
        }
        int z = zp ? (int)kiln_load_i64(zp->dtype, zp->data, 0) : 0;
        float scale = *(const float *)sc->data, *y = s->t[i]->data;
        for (int64_t k = 0; k < q->numel; k++) y[k] = (float)((int)kiln_load_i64(q->dtype, q->data, k) - z) * scale;
    }
    n->kernel_state = s;
    n->kernel_state_free = embed_state_free;
    return embed_run;
}

#define MS "com.microsoft"
static const kiln_cpu_kernel kernels[] = {
    {MS, "Gelu", select_gelu},
    {MS, "BiasGelu", select_gelu},
    {MS, "FastGelu", select_gelu},
    {MS, "SkipLayerNormalization", select_sln},
    {MS, "SkipSimplifiedLayerNormalization", select_sln},
    {"", "SimplifiedLayerNormalization", select_rms},
    {MS, "SimplifiedLayerNormalization", select_rms},
    {MS, "EmbedLayerNormalization", select_embed},
    {MS, "QEmbedLayerNormalization", select_qembed},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_contrib_ew, kernels);
