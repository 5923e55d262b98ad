/* kernels_lstm.c - the CPU kernel of ONNX LSTM in float32 (the reference, src/ops/rnn.c, has the
 * semantics): constant W and R packed once per direction for the sgemm, the whole sequence's
 * input projection as one GEMM with the summed biases as its epilogue, then per step H R^T and
 * the gates; a bidirectional node's two recurrences on two threads. Layout 0 and 1, initial states; sequence_lens, peepholes, clip, input_forget and
 * non-default activations take the reference kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "cpu/vecmath.h"

typedef struct lstm_state {
    int dirs;
    int64_t I, H;
    kiln_gemm_packed_b *w[2], *r[2]; /* W^T [I, 4H], R^T [H, 4H] */
    float *rt[2];                    /* small H: R^T [H, 4H] plain, for the step's direct loop */
} lstm_state;

/* Up to this many elements of R a step's H R^T runs as a direct loop: the sgemm's dispatch
 * costs more than a product this small (H = 8: 256 multiply-adds) */
enum { DIRECT_R = 64 * 256 };

static void state_free(void *p)
{
    lstm_state *s = p;
    if (!s) return;
    for (int d = 0; d < 2; d++) {
        kiln_gemm_packed_b_free(s->w[d]);
        kiln_gemm_packed_b_free(s->r[d]);
        free(s->rt[d]);
    }
    free(s);
}

/* gh [Bn, G] = h [Bn, H] rt [H, G] */
KILN_VECTORIZE static void small_matmul(const float *h, const float *rt, float *gh, int64_t Bn, int64_t H, int64_t G)
{
    for (int64_t b = 0; b < Bn; b++) {
        float *restrict o = gh + b * G;
        for (int64_t g = 0; g < G; g++) o[g] = 0.0f;
        for (int64_t k = 0; k < H; k++) {
            const float hk = h[b * H + k], *restrict r = rt + k * G;
            for (int64_t g = 0; g < G; g++) o[g] += hk * r[g];
        }
    }
}

/* One direction's recurrence, its input projection gx [S * Bn, G] (biases included) done. */
typedef struct lstm_job {
    const lstm_state *s;
    kiln_scratch *scratch;
    kiln_threadpool *step_pool; /* for a step's GEMM: one direction's large steps only */
    const float *gx[2];
    const kiln_value *H0, *C0;
    kiln_value *Y, *Yh, *Yc;
    int64_t S, Bn, layout;
    bool reverse_only;
    kiln_status st[2];
} lstm_job;

static kiln_status lstm_direction(const lstm_job *j, int d)
{
    const lstm_state *s = j->s;
    int dirs = s->dirs;
    int64_t S = j->S, Bn = j->Bn, Hs = s->H, G = 4 * Hs, layout = j->layout;
    bool rev = j->reverse_only || d == 1;
    /* gh [Bn, G], h, c [Bn, H] */
    float *gh = kiln_scratch_get(j->scratch, (size_t)(Bn * G + 2 * Bn * Hs + 1) * sizeof(float));
    if (!gh) return KILN_ERR_NOMEM;
    float *h = gh + Bn * G, *cs = h + Bn * Hs;
    kiln_gemm_ctx ctx = {.pool = j->step_pool, .scratch = j->scratch};
    for (int64_t b = 0; b < Bn; b++)
        for (int64_t k = 0; k < Hs; k++) {
            int64_t hi = layout ? (b * dirs + d) * Hs + k : (d * Bn + b) * Hs + k;
            h[b * Hs + k] = j->H0 ? ((const float *)j->H0->data)[hi] : 0.0f;
            cs[b * Hs + k] = j->C0 ? ((const float *)j->C0->data)[hi] : 0.0f;
        }
    kiln_status st = KILN_OK;
    for (int64_t step = 0; step < S && !st; step++) {
        int64_t t = rev ? S - 1 - step : step;
        if (s->rt[d]) small_matmul(h, s->rt[d], gh, Bn, Hs, G);
        else if (Bn && (st = kiln_sgemm_packed(&ctx, false, Bn, 1.0f, h, Hs, s->r[d], 0.0f, gh, G, NULL))) break;
        for (int64_t b = 0; b < Bn; b++) {
            float *hb = h + b * Hs, *cb = cs + b * Hs;
            kiln_vec_lstm_cell(j->gx[d] + (t * Bn + b) * G, gh + b * G, NULL, cb, hb, Hs);
            if (j->Y) {
                int64_t yi = layout ? ((b * S + t) * dirs + d) * Hs : ((t * dirs + d) * Bn + b) * Hs;
                memcpy((float *)j->Y->data + yi, hb, (size_t)Hs * sizeof(float));
            }
        }
    }
    for (int64_t b = 0; b < Bn && !st; b++)
        for (int64_t k = 0; k < Hs; k++) {
            int64_t hi = layout ? (b * dirs + d) * Hs + k : (d * Bn + b) * Hs + k;
            if (j->Yh) ((float *)j->Yh->data)[hi] = h[b * Hs + k];
            if (j->Yc) ((float *)j->Yc->data)[hi] = cs[b * Hs + k];
        }
    kiln_scratch_put(j->scratch, gh);
    return st;
}

static void lstm_directions(void *ctx, int64_t begin, int64_t end)
{
    lstm_job *j = ctx;
    for (int64_t d = begin; d < end; d++) j->st[d] = lstm_direction(j, (int)d);
}

static kiln_status lstm_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const lstm_state *s = n->kernel_state;
    const kiln_value *X = kiln_run_in(c, 0), *Bv = kiln_run_in(c, 3), *H0 = kiln_run_in(c, 5), *C0 = kiln_run_in(c, 6);
    int64_t layout = kiln_attr_int(n, "layout", 0);
    if (kiln_run_in(c, 4) || kiln_run_in(c, 7) || X->dtype != KILN_DTYPE_FLOAT32 || X->rank != 3 || X->dims[2] != s->I)
        return kiln_cpu_reference(c);
    int dirs = s->dirs;
    int64_t S = X->dims[layout ? 1 : 0], Bn = X->dims[layout ? 0 : 1], I = s->I, Hs = s->H, G = 4 * Hs;
    if ((Bv && (Bv->dtype != KILN_DTYPE_FLOAT32 || Bv->numel != dirs * 2 * G)) ||
        (H0 && (H0->dtype != KILN_DTYPE_FLOAT32 || H0->numel != dirs * Bn * Hs)) ||
        (C0 && (C0->dtype != KILN_DTYPE_FLOAT32 || C0->numel != dirs * Bn * Hs)))
        return kiln_cpu_reference(c);
    lstm_job j = {.s = s, .scratch = kiln_run_scratch(c), .H0 = H0, .C0 = C0, .Y = kiln_run_out(c, 0),
                  .Yh = kiln_run_out(c, 1), .Yc = kiln_run_out(c, 2), .S = S, .Bn = Bn, .layout = layout,
                  .reverse_only = !strcmp(kiln_attr_string(n, "direction", "forward"), "reverse")};
    kiln_gemm_ctx ctx = {.pool = kiln_run_threadpool(c), .scratch = j.scratch};
    int64_t rows = S * Bn;
    /* two directions run in parallel, each step on its thread; one direction's step GEMM takes
     * the pool when it is large enough to pay for waking it */
    j.step_pool = dirs == 1 && Bn * G * Hs >= (1 << 18) ? ctx.pool : NULL;
    float *gx = kiln_scratch_get(j.scratch, (size_t)(dirs * rows * G + G + 1) * sizeof *gx), *xt = NULL;
    kiln_status st = KILN_OK;
    if (!gx) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    float *bias = gx + dirs * rows * G;
    const float *x = X->data;
    if (layout) { /* [B, S, I] -> [S, B, I] */
        if (!(xt = kiln_scratch_get(j.scratch, (size_t)(rows * I + 1) * sizeof *xt))) {
            st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
            goto out;
        }
        for (int64_t b = 0; b < Bn; b++)
            for (int64_t t = 0; t < S; t++) memcpy(xt + (t * Bn + b) * I, x + (b * S + t) * I, (size_t)I * sizeof *xt);
        x = xt;
    }
    /* the input projections, each one GEMM over the whole sequence with the summed biases */
    for (int d = 0; d < dirs; d++) {
        const float *bw = Bv ? (const float *)Bv->data + d * 2 * G : NULL;
        for (int64_t k = 0; k < G; k++) bias[k] = bw ? bw[k] + bw[G + k] : 0.0f;
        kiln_gemm_epilogue ep = {.bias = bias};
        j.gx[d] = gx + d * rows * G;
        if (rows && (st = kiln_sgemm_packed(&ctx, false, rows, 1.0f, x, I, s->w[d], 0.0f, gx + d * rows * G, G, &ep))) {
            st = kiln_run_fail(c, st, "sgemm failed");
            goto out;
        }
    }
    /* the recurrences: a bidirectional LSTM's two directions on two threads */
    kiln_threadpool_parallel_for(ctx.pool, dirs, lstm_directions, &j);
    for (int d = 0; d < dirs && !st; d++)
        if (j.st[d]) st = kiln_run_fail(c, j.st[d], "direction %d: out of memory or sgemm failed", d);
out:
    kiln_scratch_put(j.scratch, gx);
    kiln_scratch_put(j.scratch, xt);
    return st;
}

static kiln_kernel_fn select_lstm(kiln_node *n)
{
    if (kiln_node_attr(n, "activations") || kiln_attr_float(n, "clip", 0.0f) > 0 || kiln_attr_int(n, "input_forget", 0) ||
        n->n_in < 3)
        return NULL;
    const kiln_value *W = kiln_ir_constant(n->in[1]), *R = kiln_ir_constant(n->in[2]);
    int dirs = !strcmp(kiln_attr_string(n, "direction", "forward"), "bidirectional") ? 2 : 1;
    if (!W || !R || W->dtype != KILN_DTYPE_FLOAT32 || R->dtype != KILN_DTYPE_FLOAT32 || W->rank != 3 || R->rank != 3 ||
        W->dims[0] != dirs || R->dims[0] != dirs)
        return NULL;
    int64_t H = R->dims[2], G = 4 * H, I = W->dims[2];
    if (H <= 0 || I <= 0 || W->dims[1] != G || R->dims[1] != G) return NULL;
    if (n->kernel_state) return lstm_run;
    lstm_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->dirs = dirs, s->I = I, s->H = H;
    kiln_gemm_ctx ctx = {0};
    for (int d = 0; d < dirs; d++) {
        if (kiln_gemm_packed_b_create(&ctx, true, I, G, (const float *)W->data + d * G * I, I, &s->w[d]) ||
            kiln_gemm_packed_b_create(&ctx, true, H, G, (const float *)R->data + d * G * H, H, &s->r[d])) {
            state_free(s);
            return NULL;
        }
        if (H * G <= DIRECT_R) {
            const float *r = (const float *)R->data + d * G * H; /* [G, H] */
            if (!(s->rt[d] = malloc((size_t)(H * G) * sizeof(float)))) {
                state_free(s);
                return NULL;
            }
            for (int64_t g = 0; g < G; g++)
                for (int64_t k = 0; k < H; k++) s->rt[d][k * G + g] = r[g * H + k];
        }
    }
    n->kernel_state = s;
    n->kernel_state_free = state_free;
    return lstm_run;
}

static const kiln_cpu_kernel kernels[] = {
    {"", "LSTM", select_lstm},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_lstm, kernels);
