/* kernels_dqlstm.c - the CPU kernel of com.microsoft DynamicQuantizeLSTM (reference: src/ops/rnn.c
 * has the semantics): constant W and R packed once per direction for the int8 GEMM (qgemm.h),
 * the whole sequence's input projection as one GEMM, then per step the hidden state quantized and
 * multiplied by R (the reference's integer products, exactly), the gates in float32 with vector
 * sigmoid and tanh; a bidirectional node's two recurrences on two threads. Sequence lengths,
 * peepholes, clip, input_forget and non-default activations take the reference kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/dynquant.h"
#include "cpu/kernels.h"
#include "cpu/qgemm.h"
#include "cpu/vecmath.h"
#include "core/scratch.h"
#include "ops/contrib_quant.h"

enum { IN_X, IN_W, IN_R, IN_B, IN_LENS, IN_H0, IN_C0, IN_P, IN_WS, IN_WZ, IN_RS, IN_RZ };

typedef struct dqlstm_dir {
    kiln_qgemm_packed_b *w, *r; /* [I, 4H], [H, 4H], their zero points bound */
    float *ws, *rs;             /* [4H] scales */
} dqlstm_dir;

typedef struct dqlstm_state {
    int dirs;
    int64_t I, H;
    dqlstm_dir d[2];
} dqlstm_state;

static void state_free(void *p)
{
    dqlstm_state *s = p;
    if (!s) return;
    for (int d = 0; d < 2; d++) {
        kiln_qgemm_packed_b_free(s->d[d].w);
        kiln_qgemm_packed_b_free(s->d[d].r);
        free(s->d[d].ws);
        free(s->d[d].rs);
    }
    free(s);
}

/* column j's scale and zero point of direction d from [dirs, G], [dirs] or a scalar */
static bool params_at(const kiln_value *s, const kiln_value *z, kiln_dtype dt, int dirs, int64_t G, int d, float *sc,
                      int32_t *zp)
{
    for (int64_t j = 0; j < G; j++) {
        int64_t is = s->numel == dirs * G ? d * G + j : s->numel == dirs ? d : s->numel == 1 ? 0 : -1;
        int64_t iz = z->numel == dirs * G ? d * G + j : z->numel == dirs ? d : z->numel == 1 ? 0 : -1;
        if (is < 0 || iz < 0 || s->dtype != KILN_DTYPE_FLOAT32 || z->dtype != dt) return false;
        sc[j] = ((const float *)s->data)[is];
        zp[j] = dt == KILN_DTYPE_INT8 ? ((const int8_t *)z->data)[iz] : ((const uint8_t *)z->data)[iz];
    }
    return true;
}

/* acc [M, G] int32 -> out [M, G] = acc * (a_scale * scale[j]) */
static void scale_out(const int32_t *acc, int64_t M, int64_t G, float as, const float *sc, float *out)
{
    for (int64_t m = 0; m < M; m++) kiln_cpu_dequant_row(acc + m * G, G, as, sc, true, NULL, out + m * G);
}

/* A [M, K] float quantized to uint8 over all its values, times packed B (its zero points bound
 * to it), into acc [M, G] */
static kiln_status qmul(const kiln_qgemm_ctx *ctx, const float *A, int64_t M, int64_t K, const kiln_qgemm_packed_b *pb,
                        int64_t G, uint8_t *qa, int32_t *acc, float *as)
{
    float mn, mx;
    int32_t az;
    if (!kiln_cpu_range_f32(ctx->pool, A, M * K, &mn, &mx)) { /* the reference's range skips NaN */
        mn = mx = 0.0f;
        for (int64_t i = 0; i < M * K; i++) mn = fminf(mn, A[i]), mx = fmaxf(mx, A[i]);
    }
    kiln_dynquant_params(mn, mx, as, &az);
    kiln_cpu_quantize(ctx->pool, A, M * K, *as, az, false, qa);
    kiln_qgemm_args a = {.M = M, .N = G, .K = K, .A = qa, .lda = K, .a_signed = false, .a_zp = az, .pb = pb,
                         .b_zp_bound = true, .C = acc, .ldc = G};
    return kiln_qgemm(ctx, &a);
}

/* One direction's recurrence over the sequence, its input projection gx [S * Bn, G] done. */
typedef struct dqlstm_job {
    const dqlstm_state *s;
    kiln_scratch *scratch;
    kiln_threadpool *step_pool; /* for a step's GEMM: one direction's large steps only */
    const float *gx[2];          /* per direction [S * Bn, G] */
    const kiln_value *B, *H0, *C0;
    kiln_value *Y, *Yh, *Yc;
    int64_t S, Bn;
    bool reverse_only;
    kiln_status st[2];
} dqlstm_job;

static kiln_status dqlstm_direction(const dqlstm_job *j, int d)
{
    const dqlstm_state *s = j->s;
    const dqlstm_dir *dd = &s->d[d];
    int dirs = s->dirs;
    int64_t S = j->S, Bn = j->Bn, Hs = s->H, G = 4 * Hs;
    bool rev = j->reverse_only || d == 1;
    /* gh [Bn, G], acc [Bn, G], h, c [Bn, H], bias [G]; qa [Bn * H] bytes */
    size_t floats = (size_t)(Bn * G * 2 + Bn * Hs * 2 + G);
    float *work = kiln_scratch_get(j->scratch, floats * sizeof(float) + (size_t)(Bn * Hs) + 64);
    if (!work) return KILN_ERR_NOMEM;
    float *gh = work, *h = gh + Bn * G, *cs = h + Bn * Hs, *bias = cs + Bn * Hs;
    int32_t *acc = (int32_t *)(bias + G);
    uint8_t *qa = (uint8_t *)(acc + Bn * G);
    kiln_qgemm_ctx ctx = {.pool = j->step_pool, .scratch = j->scratch};
    const float *bw = j->B ? (const float *)j->B->data + d * 2 * G : NULL;
    for (int64_t k = 0; k < G; k++) bias[k] = bw ? bw[k] + bw[G + k] : 0.0f;
    for (int64_t i = 0; i < Bn * Hs; i++) {
        h[i] = j->H0 ? ((const float *)j->H0->data)[d * Bn * Hs + i] : 0.0f;
        cs[i] = j->C0 ? ((const float *)j->C0->data)[d * Bn * Hs + i] : 0.0f;
    }
    kiln_status st = KILN_OK;
    for (int64_t step = 0; step < S && !st; step++) {
        int64_t t = rev ? S - 1 - step : step;
        float as;
        if ((st = qmul(&ctx, h, Bn, Hs, dd->r, G, qa, acc, &as))) break;
        scale_out(acc, Bn, G, as, dd->rs, gh);
        for (int64_t b = 0; b < Bn; b++) {
            float *hb = h + b * Hs, *cb = cs + b * Hs;
            kiln_vec_lstm_cell(j->gx[d] + (t * Bn + b) * G, gh + b * G, bias, cb, hb, Hs);
            if (j->Y) memcpy((float *)j->Y->data + ((t * dirs + d) * Bn + b) * Hs, hb, (size_t)Hs * sizeof(float));
        }
    }
    if (!st && j->Yh) memcpy((float *)j->Yh->data + d * Bn * Hs, h, (size_t)(Bn * Hs) * sizeof(float));
    if (!st && j->Yc) memcpy((float *)j->Yc->data + d * Bn * Hs, cs, (size_t)(Bn * Hs) * sizeof(float));
    kiln_scratch_put(j->scratch, work);
    return st;
}

static void dqlstm_directions(void *ctx, int64_t begin, int64_t end)
{
    dqlstm_job *j = ctx;
    for (int64_t d = begin; d < end; d++) j->st[d] = dqlstm_direction(j, (int)d);
}

static kiln_status dqlstm_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const dqlstm_state *s = n->kernel_state;
    const kiln_value *X = kiln_run_in(c, IN_X), *Bv = kiln_run_in(c, IN_B), *H0 = kiln_run_in(c, IN_H0),
                     *C0 = kiln_run_in(c, IN_C0);
    if (kiln_run_in(c, IN_LENS) || kiln_run_in(c, IN_P) || X->dtype != KILN_DTYPE_FLOAT32 || X->rank != 3 ||
        X->dims[2] != s->I)
        return kiln_cpu_reference(c);
    int dirs = s->dirs;
    int64_t S = X->dims[0], Bn = X->dims[1], I = s->I, Hs = s->H, G = 4 * Hs;
    if ((Bv && (Bv->dtype != KILN_DTYPE_FLOAT32 || Bv->numel != dirs * 2 * G)) ||
        (H0 && (H0->dtype != KILN_DTYPE_FLOAT32 || H0->numel != dirs * Bn * Hs)) ||
        (C0 && (C0->dtype != KILN_DTYPE_FLOAT32 || C0->numel != dirs * Bn * Hs)))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "B must be float32 [%d, %lld], initial_h/c [%d, %lld, %lld]", dirs,
                             (long long)(2 * G), dirs, (long long)Bn, (long long)Hs);
    dqlstm_job j = {.s = s, .scratch = kiln_run_scratch(c), .B = Bv, .H0 = H0, .C0 = C0, .Y = kiln_run_out(c, 0),
                    .Yh = kiln_run_out(c, 1), .Yc = kiln_run_out(c, 2), .S = S, .Bn = Bn,
                    .reverse_only = !strcmp(kiln_attr_string(n, "direction", "forward"), "reverse")};
    kiln_qgemm_ctx ctx = {.pool = kiln_run_threadpool(c), .scratch = j.scratch};
    int64_t rows = S * Bn;
    /* two directions run in parallel, each step on its thread; one direction's step GEMM takes
     * the pool when it is large enough to pay for waking it */
    j.step_pool = dirs == 1 && Bn * G * Hs >= (1 << 18) ? ctx.pool : NULL;
    /* the input projections, each one GEMM over the whole sequence */
    float *gx = kiln_scratch_get(j.scratch, (size_t)(dirs * rows * G + 1) * sizeof *gx);
    int32_t *acc = kiln_scratch_get(j.scratch, (size_t)(rows * G + 1) * sizeof *acc);
    uint8_t *qa = kiln_scratch_get(j.scratch, (size_t)(rows * I + 1));
    kiln_status st = KILN_OK;
    if (!gx || !acc || !qa) st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    for (int d = 0; d < dirs && !st; d++) {
        float as;
        j.gx[d] = gx + d * rows * G;
        if ((st = qmul(&ctx, X->data, rows, I, s->d[d].w, G, qa, acc, &as)))
            st = kiln_run_fail(c, st, "int8 GEMM failed");
        else scale_out(acc, rows, G, as, s->d[d].ws, gx + d * rows * G);
    }
    if (!st) {
        /* the recurrences: a bidirectional LSTM's two directions on two threads */
        kiln_threadpool_parallel_for(ctx.pool, dirs, dqlstm_directions, &j);
        for (int d = 0; d < dirs && !st; d++)
            if (j.st[d]) st = kiln_run_fail(c, j.st[d], "direction %d: out of memory or int8 GEMM failed", d);
    }
    kiln_scratch_put(j.scratch, gx);
    kiln_scratch_put(j.scratch, acc);
    kiln_scratch_put(j.scratch, qa);
    return st;
}

static kiln_kernel_fn select_dqlstm(kiln_node *n)
{
    if (n->n_in <= IN_RZ || kiln_node_attr(n, "activations") || kiln_attr_float(n, "clip", 0.0f) > 0 ||
        kiln_attr_int(n, "input_forget", 0))
        return NULL;
    const kiln_value *W = kiln_ir_constant(n->in[IN_W]), *R = kiln_ir_constant(n->in[IN_R]);
    const kiln_value *ws = kiln_ir_constant(n->in[IN_WS]), *wzv = kiln_ir_constant(n->in[IN_WZ]);
    const kiln_value *rs = kiln_ir_constant(n->in[IN_RS]), *rzv = kiln_ir_constant(n->in[IN_RZ]);
    int dirs = !strcmp(kiln_attr_string(n, "direction", "forward"), "bidirectional") ? 2 : 1;
    if (!W || !R || !ws || !wzv || !rs || !rzv || W->rank != 3 || R->rank != 3 || W->dtype != R->dtype ||
        (W->dtype != KILN_DTYPE_INT8 && W->dtype != KILN_DTYPE_UINT8) || W->dims[0] != dirs || R->dims[0] != dirs)
        return NULL;
    int64_t I = W->dims[1], H = R->dims[1], G = 4 * H;
    if (W->dims[2] != G || R->dims[2] != G || H <= 0) return NULL;
    if (n->kernel_state) return dqlstm_run;
    dqlstm_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->dirs = dirs, s->I = I, s->H = H;
    bool sg = W->dtype == KILN_DTYPE_INT8, ok = true;
    kiln_qgemm_ctx ctx = {0};
    int32_t *wz = malloc((size_t)G * sizeof *wz), *rz = malloc((size_t)G * sizeof *rz); /* one direction's */
    ok = wz && rz;
    for (int d = 0; d < dirs && ok; d++) {
        dqlstm_dir *dd = &s->d[d];
        dd->ws = malloc((size_t)G * sizeof *dd->ws), dd->rs = malloc((size_t)G * sizeof *dd->rs);
        ok = dd->ws && dd->rs && params_at(ws, wzv, W->dtype, dirs, G, d, dd->ws, wz) &&
             params_at(rs, rzv, R->dtype, dirs, G, d, dd->rs, rz) &&
             !kiln_qgemm_packed_b_create(&ctx, I, G, (const int8_t *)W->data + d * I * G, G, sg, &dd->w) &&
             !kiln_qgemm_packed_b_create(&ctx, H, G, (const int8_t *)R->data + d * H * G, G, sg, &dd->r) &&
             !kiln_qgemm_packed_b_bind_zp(dd->w, wz, G) && !kiln_qgemm_packed_b_bind_zp(dd->r, rz, G);
    }
    free(wz);
    free(rz);
    if (!ok) {
        state_free(s);
        return NULL;
    }
    n->kernel_state = s;
    n->kernel_state_free = state_free;
    return dqlstm_run;
}

static const kiln_cpu_kernel kernels[] = {
    {"com.microsoft", "DynamicQuantizeLSTM", select_dqlstm},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_dqlstm, kernels);
