/* rnn.c - Recurrent ops: RNN, GRU, LSTM (every direction, layout, sequence_lens, clip,
 * configurable activations, GRU linear_before_reset, LSTM peepholes and input_forget), and
 * com.microsoft DynamicQuantizeLSTM (ONNX Runtime's quantize_dynamic form of LSTM: 8-bit W and
 * R stored [dirs, in, 4H] with per-direction or per-column scales and zero points). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/contrib_quant.h"
#include "ops/op.h"
#include "ops/util.h"

typedef enum rnn_kind { RNN_PLAIN, RNN_GRU, RNN_LSTM } rnn_kind;

static int gate_count(rnn_kind k) { return k == RNN_PLAIN ? 1 : k == RNN_GRU ? 3 : 4; }

static rnn_kind kind_of(const kiln_node *n)
{
    return !strcmp(n->op_type, "GRU")                                             ? RNN_GRU
           : !strcmp(n->op_type, "LSTM") || !strcmp(n->op_type, "DynamicQuantizeLSTM") ? RNN_LSTM
                                                                                  : RNN_PLAIN;
}

static int directions(const kiln_node *n)
{
    return !strcmp(kiln_attr_string(n, "direction", "forward"), "bidirectional") ? 2 : 1;
}

/* Y [seq, dirs, batch, hidden] (layout 1: [batch, seq, dirs, hidden]); Y_h and Y_c
 * [dirs, batch, hidden] (layout 1: [batch, dirs, hidden]). */
static kiln_status rnn_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0), *w = kiln_infer_in(c, 1), *r = kiln_infer_in(c, 2);
    if (!x || !w || !r) return kiln_infer_fail(c, KILN_ERR_MODEL, "X, W and R are required");
    if (x->rank != 3 || w->rank != 3 || r->rank != 3)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X, W, R must be 3-D (ranks %d, %d, %d)", x->rank, w->rank, r->rank);
    int64_t layout = kiln_attr_int(n, "layout", 0);
    kiln_dim seq = x->dims[layout ? 1 : 0], batch = x->dims[layout ? 0 : 1];
    kiln_dim dirs = kiln_dim_const(directions(n));
    kiln_dim hidden = r->dims[2];
    int64_t hs = kiln_attr_int(n, "hidden_size", -1);
    if (hs > 0) {
        KILN_TRY(kiln_infer_require_equal(c, r->dims[2], kiln_dim_const(hs), "R's last dim vs hidden_size"));
        hidden = kiln_dim_const(hs);
    }
    KILN_TRY(kiln_infer_require_equal(c, w->dims[0], dirs, "W's first dim vs number of directions"));
    KILN_TRY(kiln_infer_require_equal(c, w->dims[2], x->dims[2], "W's input size vs X's"));
    kiln_dim y[4] = {seq, dirs, batch, hidden}, yb[4] = {batch, seq, dirs, hidden};
    kiln_dim h[3] = {dirs, batch, hidden}, hb[3] = {batch, dirs, hidden};
    KILN_TRY(kiln_infer_set_out(c, 0, x->dtype, 4, layout ? yb : y));
    KILN_TRY(kiln_infer_set_out(c, 1, x->dtype, 3, layout ? hb : h));
    return kiln_infer_set_out(c, 2, x->dtype, 3, layout ? hb : h);
}

typedef struct act {
    const char *name;
    double alpha, beta;
} act;

static double activate(const act *a, double x)
{
    const char *f = a->name;
    if (!strcmp(f, "Sigmoid")) return 1.0 / (1.0 + exp(-x));
    if (!strcmp(f, "Tanh")) return tanh(x);
    if (!strcmp(f, "Relu")) return x > 0 ? x : 0;
    if (!strcmp(f, "Affine")) return a->alpha * x + a->beta;
    if (!strcmp(f, "LeakyRelu")) return x >= 0 ? x : a->alpha * x;
    if (!strcmp(f, "ThresholdedRelu")) return x > a->alpha ? x : 0;
    if (!strcmp(f, "ScaledTanh")) return a->alpha * tanh(a->beta * x);
    if (!strcmp(f, "HardSigmoid")) return fmax(0, fmin(1, a->alpha * x + a->beta));
    if (!strcmp(f, "Elu")) return x >= 0 ? x : a->alpha * (exp(x) - 1);
    if (!strcmp(f, "Softsign")) return x / (1 + fabs(x));
    return log1p(exp(x)); /* Softplus */
}

static bool known_activation(const char *f)
{
    static const char *const names[] = {"Sigmoid", "Tanh", "Relu", "Affine", "LeakyRelu", "ThresholdedRelu",
                                        "ScaledTanh", "HardSigmoid", "Elu", "Softsign", "Softplus"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(f, names[i])) return true;
    return false;
}

/* default alpha/beta of activations that take them, per the ONNX operator docs */
static void default_params(act *a)
{
    if (!strcmp(a->name, "LeakyRelu")) a->alpha = 0.01;
    else if (!strcmp(a->name, "ThresholdedRelu") || !strcmp(a->name, "Elu") || !strcmp(a->name, "Affine") ||
             !strcmp(a->name, "ScaledTanh"))
        a->alpha = 1.0;
    if (!strcmp(a->name, "HardSigmoid")) {
        a->alpha = 0.2;
        a->beta = 0.5;
    }
}

static bool takes_alpha(const char *f)
{
    return !strcmp(f, "Affine") || !strcmp(f, "LeakyRelu") || !strcmp(f, "ThresholdedRelu") ||
           !strcmp(f, "ScaledTanh") || !strcmp(f, "HardSigmoid") || !strcmp(f, "Elu");
}

static bool takes_beta(const char *f)
{
    return !strcmp(f, "Affine") || !strcmp(f, "ScaledTanh") || !strcmp(f, "HardSigmoid");
}

/* The activations of each direction: attribute list, else the op's defaults. */
static kiln_status read_activations(kiln_run_ctx *c, rnn_kind kind, int dirs, act *acts)
{
    const kiln_node *n = kiln_run_node(c);
    static const char *const defaults[3][3] = {{"Tanh"}, {"Sigmoid", "Tanh"}, {"Sigmoid", "Tanh", "Tanh"}};
    int per = kind == RNN_PLAIN ? 1 : kind == RNN_GRU ? 2 : 3;
    const kiln_attr *list = kiln_node_attr(n, "activations");
    int na, nb;
    const float *alpha = kiln_attr_floats(n, "activation_alpha", &na), *beta = kiln_attr_floats(n, "activation_beta", &nb);
    int ia = 0, ib = 0;
    for (int i = 0; i < per * dirs; i++) {
        const char *name = defaults[kind][i % per];
        if (list && list->type == KILN_ATTR_STRINGS) {
            if (list->n != per * dirs && list->n != per)
                return kiln_run_fail(c, KILN_ERR_MODEL, "activations lists %d functions, %d expected", list->n, per * dirs);
            name = list->strings[i % list->n];
        }
        if (!known_activation(name)) return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "activation '%s'", name);
        acts[i] = (act){name, 0, 0};
        default_params(&acts[i]);
        if (takes_alpha(name) && ia < na) acts[i].alpha = alpha[ia++];
        if (takes_beta(name) && ib < nb) acts[i].beta = beta[ib++];
    }
    return KILN_OK;
}

static double clipped(double x, double clip) { return clip > 0 ? fmax(-clip, fmin(clip, x)) : x; }

/* DynamicQuantizeLSTM's 8-bit weights: Q [dirs, K, 4H] with scale and zero point (optional)
 * per direction or per column. */
typedef struct lstm_q8 {
    const kiln_value *W, *R, *wz, *rz;
    const float *ws, *rs;
    bool ws_col, rs_col;
} lstm_q8;

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* C[M, N] = A[M, K] . B: B float [K, N] (W/R transposed), or with Q the 8-bit Q[d] [K, N] and
 * A quantized to uint8 over its M*K values first, as ONNX Runtime's quantized LSTM GEMM does
 * (int32 sums, then float(sum) * (a_scale * w_scale)). Rows of B run contiguously (n innermost);
 * acc holds N int32 sums. */
static void lstm_gemm(int64_t M, int64_t N, int64_t K, const float *A, const float *B, const kiln_value *Q, int64_t d,
                      const float *qs, bool qs_col, const kiln_value *Z, float *C, uint8_t *aq, int32_t *acc)
{
    if (!Q) {
        for (int64_t m = 0; m < M; m++) {
            float *c = C + m * N;
            memset(c, 0, (size_t)N * sizeof *c);
            for (int64_t k = 0; k < K; k++) {
                float a = A[m * K + k];
                const float *b = B + k * N;
                for (int64_t n = 0; n < N; n++) c[n] += a * b[n];
            }
        }
        return;
    }
    float lo = 0.0f, hi = 0.0f, as;
    int32_t az;
    for (int64_t i = 0; i < M * K; i++) lo = fminf(lo, A[i]), hi = fmaxf(hi, A[i]);
    kiln_dynquant_params(lo, hi, &as, &az);
    for (int64_t i = 0; i < M * K; i++) aq[i] = kiln_dynquant_one(A[i], as, az);
    bool s8 = Q->dtype == KILN_DTYPE_INT8;
    const int8_t *qi = (const int8_t *)Q->data + d * K * N;
    const uint8_t *qu = (const uint8_t *)Q->data + d * K * N;
    for (int64_t m = 0; m < M; m++) {
        /* sum_k (a - az)(q - qz) = sum_k (a - az) q - qz sum_k (a - az) */
        int32_t asum = 0;
        memset(acc, 0, (size_t)N * sizeof *acc);
        for (int64_t k = 0; k < K; k++) {
            int32_t a = (int32_t)aq[m * K + k] - az;
            asum += a;
            if (s8) {
                const int8_t *q = qi + k * N;
                for (int64_t n = 0; n < N; n++) acc[n] += a * q[n];
            } else {
                const uint8_t *q = qu + k * N;
                for (int64_t n = 0; n < N; n++) acc[n] += a * q[n];
            }
        }
        for (int64_t n = 0; n < N; n++) {
            int64_t pi = qs_col ? d * N + n : d;
            int32_t qz = Z ? (int32_t)kiln_load_i64(Z->dtype, Z->data, pi) : 0;
            C[m * N + n] = (float)(acc[n] - qz * asum) * (as * qs[pi]);
        }
    }
}

/* B [N, K] -> out [K, N] */
static void transpose_f32(const float *B, int64_t N, int64_t K, float *out)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) out[k * N + n] = B[n * K + k];
}

static bool all_f32(const kiln_value *const *v, int n)
{
    for (int i = 0; i < n; i++)
        if (v[i] && v[i]->dtype != KILN_DTYPE_FLOAT32) return false;
    return true;
}

/* LSTM over float32 X, B, initial_h/c, P with W, R float32 [dirs, 4H, I|H] or (q) 8-bit: the
 * input projection of every step as one GEMM, then one GEMM per step on the state; gates in
 * float32 (ONNX order i, o, f, c). Rows past their sequence_lens are zeros in Y. */
static kiln_status lstm_f32(kiln_run_ctx *c, const kiln_value *W, const kiln_value *R, const lstm_q8 *q)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *Bv = kiln_run_in(c, 3), *lens = kiln_run_in(c, 4);
    const kiln_value *H0 = kiln_run_in(c, 5), *C0 = kiln_run_in(c, 6), *P = kiln_run_in(c, 7);
    kiln_value *Y = kiln_run_out(c, 0), *Yh = kiln_run_out(c, 1), *Yc = kiln_run_out(c, 2);
    int64_t layout = kiln_attr_int(n, "layout", 0);
    int dirs = directions(n);
    int64_t S = X->dims[layout ? 1 : 0], Bn = X->dims[layout ? 0 : 1], I = X->dims[2], Hs = R->dims[2], G4 = 4 * Hs;
    float clip = kiln_attr_float(n, "clip", 0.0f);
    bool input_forget = kiln_attr_int(n, "input_forget", 0) != 0;
    bool reverse_only = !strcmp(kiln_attr_string(n, "direction", "forward"), "reverse");
    size_t big = (size_t)(S * Bn) * (size_t)(G4 > I ? G4 : I);
    float *xs = malloc((size_t)(S * Bn * I + 1) * sizeof(float)), *gx = malloc((big + 1) * sizeof(float));
    float *h = malloc((size_t)(Bn * Hs + 1) * sizeof(float)), *cs = malloc((size_t)(Bn * Hs + 1) * sizeof(float));
    float *g = malloc((size_t)(Bn * G4 + 1) * sizeof(float));
    uint8_t *aq = malloc(big + (size_t)(Bn * Hs) + 1);
    int32_t *acc = malloc((size_t)(G4 + 1) * sizeof(int32_t));
    /* W and R of one direction transposed to [I, 4H] and [H, 4H] (float LSTMs) */
    float *wt = q ? NULL : malloc((size_t)(G4 * I + 1) * sizeof(float)), *rt = q ? NULL : malloc((size_t)(G4 * Hs + 1) * sizeof(float));
    kiln_status st = KILN_OK;
    if (!xs || !gx || !h || !cs || !g || !aq || !acc || (!q && (!wt || !rt))) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    const float *x = X->data, *bias = Bv ? Bv->data : NULL, *pp = P ? P->data : NULL;
    /* X as [S, B, I] rows */
    for (int64_t t = 0; t < S && I; t++)
        for (int64_t b = 0; b < Bn; b++)
            memcpy(xs + (t * Bn + b) * I, x + (layout ? b * S + t : t * Bn + b) * I, (size_t)I * sizeof(float));
    if (Y && Y->nbytes) memset(Y->data, 0, Y->nbytes); /* an empty Y has no data to clear */
    for (int d = 0; d < dirs; d++) {
        bool rev = reverse_only || d == 1;
        if (!q) {
            transpose_f32((const float *)W->data + d * G4 * I, G4, I, wt);
            transpose_f32((const float *)R->data + d * G4 * Hs, G4, Hs, rt);
        }
        lstm_gemm(S * Bn, G4, I, xs, wt, q ? q->W : NULL, d, q ? q->ws : NULL, q && q->ws_col, q ? q->wz : NULL, gx, aq,
                  acc);
        for (int64_t b = 0; b < Bn; b++)
            for (int64_t k = 0; k < Hs; k++) {
                int64_t hi = layout ? (b * dirs + d) * Hs + k : (d * Bn + b) * Hs + k;
                h[b * Hs + k] = H0 ? ((const float *)H0->data)[hi] : 0.0f;
                cs[b * Hs + k] = C0 ? ((const float *)C0->data)[hi] : 0.0f;
            }
        int64_t maxlen = 0, len[1024];
        if (Bn > 1024) {
            st = kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "batch %lld over 1024", (long long)Bn);
            goto out;
        }
        for (int64_t b = 0; b < Bn; b++) {
            len[b] = lens ? kiln_load_i64(lens->dtype, lens->data, b) : S;
            if (len[b] < 0 || len[b] > S) {
                st = kiln_run_fail(c, KILN_ERR_RUNTIME, "sequence_lens[%lld] = %lld outside [0, %lld]", (long long)b,
                                   (long long)len[b], (long long)S);
                goto out;
            }
            maxlen = len[b] > maxlen ? len[b] : maxlen;
        }
        for (int64_t step = 0; step < maxlen; step++) {
            lstm_gemm(Bn, G4, Hs, h, rt, q ? q->R : NULL, d, q ? q->rs : NULL, q && q->rs_col, q ? q->rz : NULL, g, aq, acc);
            for (int64_t b = 0; b < Bn; b++) {
                if (step >= len[b]) continue;
                int64_t t = rev ? len[b] - 1 - step : step;
                const float *gxr = gx + (t * Bn + b) * G4;
                float *gr = g + b * G4, *hb = h + b * Hs, *cb = cs + b * Hs;
                for (int64_t j = 0; j < G4; j++) {
                    float v = gxr[j] + gr[j];
                    if (bias) v += bias[d * 2 * G4 + j] + bias[d * 2 * G4 + G4 + j];
                    gr[j] = clip > 0 ? fmaxf(-clip, fminf(clip, v)) : v;
                }
                for (int64_t k = 0; k < Hs; k++) {
                    float pi = pp ? pp[d * 3 * Hs + k] : 0.0f, po = pp ? pp[d * 3 * Hs + Hs + k] : 0.0f;
                    float pf = pp ? pp[d * 3 * Hs + 2 * Hs + k] : 0.0f;
                    float ig = sigmoidf_(gr[k] + pi * cb[k]);
                    float fg = input_forget ? 1 - ig : sigmoidf_(gr[2 * Hs + k] + pf * cb[k]);
                    float cn = fg * cb[k] + ig * tanhf(gr[3 * Hs + k]);
                    float og = sigmoidf_(gr[Hs + k] + po * cn);
                    cb[k] = cn;
                    hb[k] = og * tanhf(cn);
                }
                if (Y)
                    for (int64_t k = 0; k < Hs; k++) {
                        int64_t yi = layout ? ((b * S + t) * dirs + d) * Hs + k : ((t * dirs + d) * Bn + b) * Hs + k;
                        ((float *)Y->data)[yi] = hb[k];
                    }
            }
        }
        for (int64_t b = 0; b < Bn; b++)
            for (int64_t k = 0; k < Hs; k++) {
                int64_t hi = layout ? (b * dirs + d) * Hs + k : (d * Bn + b) * Hs + k;
                if (Yh) ((float *)Yh->data)[hi] = h[b * Hs + k];
                if (Yc) ((float *)Yc->data)[hi] = cs[b * Hs + k];
            }
    }
out:
    free(xs);
    free(gx);
    free(h);
    free(cs);
    free(g);
    free(aq);
    free(acc);
    free(wt);
    free(rt);
    return st;
}

/* The default activations (Sigmoid, Tanh, Tanh) and no activation parameters. */
static bool default_lstm_activations(const kiln_node *n)
{
    const kiln_attr *list = kiln_node_attr(n, "activations");
    if (!list) return true;
    if (list->type != KILN_ATTR_STRINGS) return false;
    for (int i = 0; i < list->n; i++)
        if (strcmp(list->strings[i], i % 3 == 0 ? "Sigmoid" : "Tanh")) return false;
    return list->n == 3 || list->n == 6;
}

/* W, R, B, sequence_lens, initial_h/c and P against X, the directions and the gate count. */
static kiln_status rnn_check(kiln_run_ctx *c, const kiln_value *W, const kiln_value *R)
{
    const kiln_node *n = kiln_run_node(c);
    rnn_kind kind = kind_of(n);
    const kiln_value *X = kiln_run_in(c, 0), *Bv = kiln_run_in(c, 3), *lens = kiln_run_in(c, 4), *H0 = kiln_run_in(c, 5);
    const kiln_value *C0 = kind == RNN_LSTM ? kiln_run_in(c, 6) : NULL, *P = kind == RNN_LSTM ? kiln_run_in(c, 7) : NULL;
    int64_t layout = kiln_attr_int(n, "layout", 0);
    int dirs = directions(n), G = gate_count(kind);
    int64_t Bn = X->dims[layout ? 0 : 1], Hs = R->dims[2];
    if (W->dims[1] != G * Hs || R->dims[1] != G * Hs || R->dims[0] != dirs)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "W/R must be [%d, %lld, *] for hidden size %lld", dirs, (long long)(G * Hs),
                             (long long)Hs);
    if (Bv && (Bv->rank != 2 || Bv->dims[0] != dirs || Bv->dims[1] != 2 * G * Hs))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "B must be [%d, %lld]", dirs, (long long)(2 * G * Hs));
    if (lens && (lens->rank != 1 || lens->dims[0] != Bn))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "sequence_lens must be [%lld]", (long long)Bn);
    for (int s = 0; s < 2; s++) {
        const kiln_value *h = s ? C0 : H0;
        if (h && (h->rank != 3 || h->numel != dirs * Bn * Hs))
            return kiln_run_fail(c, KILN_ERR_SHAPE, "%s must hold [%d, %lld, %lld]", s ? "initial_c" : "initial_h", dirs,
                                 (long long)Bn, (long long)Hs);
    }
    if (P && P->numel != dirs * 3 * Hs) return kiln_run_fail(c, KILN_ERR_SHAPE, "P must be [%d, %lld]", dirs, (long long)(3 * Hs));
    return KILN_OK;
}

/* The recurrence over X with W [dirs, G*H, I] and R [dirs, G*H, H] (ONNX's layouts). */
static kiln_status rnn_compute(kiln_run_ctx *c, const kiln_value *W, const kiln_value *R)
{
    const kiln_node *n = kiln_run_node(c);
    rnn_kind kind = kind_of(n);
    const kiln_value *X = kiln_run_in(c, 0), *Bv = kiln_run_in(c, 3);
    const kiln_value *lens = kiln_run_in(c, 4), *H0 = kiln_run_in(c, 5);
    const kiln_value *C0 = kind == RNN_LSTM ? kiln_run_in(c, 6) : NULL, *P = kind == RNN_LSTM ? kiln_run_in(c, 7) : NULL;
    KILN_TRY(rnn_check(c, W, R));
    kiln_value *Y = kiln_run_out(c, 0), *Yh = kiln_run_out(c, 1), *Yc = kiln_run_out(c, 2);
    int64_t layout = kiln_attr_int(n, "layout", 0);
    int dirs = directions(n), G = gate_count(kind);
    int64_t S = X->dims[layout ? 1 : 0], Bn = X->dims[layout ? 0 : 1], I = X->dims[2], Hs = R->dims[2];
    act acts[6];
    KILN_TRY(read_activations(c, kind, dirs, acts));
    double clip = kiln_attr_float(n, "clip", 0.0f);
    bool lbr = kiln_attr_int(n, "linear_before_reset", 0) != 0, input_forget = kiln_attr_int(n, "input_forget", 0) != 0;
    bool reverse_only = !strcmp(kiln_attr_string(n, "direction", "forward"), "reverse");
    kiln_dtype dt = X->dtype;
    int64_t GH = G * Hs;
    double *h = calloc((size_t)(Bn * Hs + 1), sizeof *h), *cst = calloc((size_t)(Bn * Hs + 1), sizeof *cst);
    double *gx = calloc((size_t)(GH + 1), sizeof *gx), *gh = calloc((size_t)(GH + 1), sizeof *gh);
    double *hn = calloc((size_t)(Hs + 1), sizeof *hn), *rg = calloc((size_t)(Hs + 1), sizeof *rg);
    kiln_status st = KILN_OK;
    if (!h || !cst || !gx || !gh || !hn || !rg) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int d = 0; d < dirs; d++) {
        bool rev = reverse_only || d == 1;
        const act *a = &acts[d * (kind == RNN_PLAIN ? 1 : kind == RNN_GRU ? 2 : 3)];
        /* initial state; layout 1 stores it batch-major */
        for (int64_t b = 0; b < Bn; b++)
            for (int64_t k = 0; k < Hs; k++) {
                int64_t hi = layout ? (b * dirs + d) * Hs + k : (d * Bn + b) * Hs + k;
                h[b * Hs + k] = H0 ? kiln_load_f64(H0->dtype, H0->data, hi) : 0.0;
                cst[b * Hs + k] = C0 ? kiln_load_f64(C0->dtype, C0->data, hi) : 0.0;
            }
        for (int64_t b = 0; b < Bn; b++) {
            int64_t len = lens ? kiln_load_i64(lens->dtype, lens->data, b) : S;
            if (len < 0 || len > S) {
                st = kiln_run_fail(c, KILN_ERR_RUNTIME, "sequence_lens[%lld] = %lld outside [0, %lld]", (long long)b,
                                   (long long)len, (long long)S);
                goto out;
            }
            double *hb = h + b * Hs, *cb = cst + b * Hs;
            for (int64_t step = 0; step < len; step++) {
                int64_t t = rev ? len - 1 - step : step;
                /* gate pre-activations from X and from H */
                for (int64_t g = 0; g < GH; g++) {
                    double ax = Bv ? kiln_load_f64(Bv->dtype, Bv->data, d * 2 * GH + g) : 0.0;
                    double ah = Bv ? kiln_load_f64(Bv->dtype, Bv->data, d * 2 * GH + GH + g) : 0.0;
                    for (int64_t i = 0; i < I; i++) {
                        int64_t xi = layout ? (b * S + t) * I + i : (t * Bn + b) * I + i;
                        ax += kiln_load_f64(dt, X->data, xi) * kiln_load_f64(W->dtype, W->data, (d * GH + g) * I + i);
                    }
                    for (int64_t k = 0; k < Hs; k++)
                        ah += hb[k] * kiln_load_f64(R->dtype, R->data, (d * GH + g) * Hs + k);
                    gx[g] = ax;
                    gh[g] = ah;
                }
                if (kind == RNN_GRU)
                    for (int64_t k = 0; k < Hs; k++) rg[k] = activate(&a[0], clipped(gx[Hs + k] + gh[Hs + k], clip));
                for (int64_t k = 0; k < Hs; k++) {
                    if (kind == RNN_PLAIN) {
                        hn[k] = activate(&a[0], clipped(gx[k] + gh[k], clip));
                    } else if (kind == RNN_GRU) {
                        double z = activate(&a[0], clipped(gx[k] + gh[k], clip));
                        double hh;
                        if (lbr) {
                            hh = gx[2 * Hs + k] + rg[k] * gh[2 * Hs + k];
                        } else {
                            /* (r * H) R_h^T + Rb_h: the reset gate applies to the state first */
                            double acc = Bv ? kiln_load_f64(Bv->dtype, Bv->data, d * 2 * GH + GH + 2 * Hs + k) : 0.0;
                            for (int64_t q = 0; q < Hs; q++)
                                acc += rg[q] * hb[q] * kiln_load_f64(R->dtype, R->data, (d * GH + 2 * Hs + k) * Hs + q);
                            hh = gx[2 * Hs + k] + acc;
                        }
                        hh = activate(&a[1], clipped(hh, clip));
                        hn[k] = (1 - z) * hh + z * hb[k];
                    } else {
                        double pi = P ? kiln_load_f64(P->dtype, P->data, d * 3 * Hs + k) : 0.0;
                        double po = P ? kiln_load_f64(P->dtype, P->data, d * 3 * Hs + Hs + k) : 0.0;
                        double pf = P ? kiln_load_f64(P->dtype, P->data, d * 3 * Hs + 2 * Hs + k) : 0.0;
                        double i_g = activate(&a[0], clipped(gx[k] + gh[k] + pi * cb[k], clip));
                        double f_g = input_forget ? 1 - i_g
                                                  : activate(&a[0], clipped(gx[2 * Hs + k] + gh[2 * Hs + k] + pf * cb[k], clip));
                        double c_g = activate(&a[1], clipped(gx[3 * Hs + k] + gh[3 * Hs + k], clip));
                        double cn = f_g * cb[k] + i_g * c_g;
                        double o_g = activate(&a[0], clipped(gx[Hs + k] + gh[Hs + k] + po * cn, clip));
                        cb[k] = cn;
                        hn[k] = o_g * activate(&a[2], cn);
                    }
                }
                memcpy(hb, hn, (size_t)Hs * sizeof *hb);
                if (Y)
                    for (int64_t k = 0; k < Hs; k++) {
                        int64_t yi = layout ? ((b * S + t) * dirs + d) * Hs + k : ((t * dirs + d) * Bn + b) * Hs + k;
                        kiln_store_f64(dt, Y->data, yi, hb[k]);
                    }
            }
            for (int64_t k = 0; k < Hs; k++) {
                int64_t hi = layout ? (b * dirs + d) * Hs + k : (d * Bn + b) * Hs + k;
                if (Yh) kiln_store_f64(dt, Yh->data, hi, hb[k]);
                if (Yc) kiln_store_f64(dt, Yc->data, hi, cb[k]);
            }
        }
    }
out:
    free(h);
    free(cst);
    free(gx);
    free(gh);
    free(hn);
    free(rg);
    return st;
}

/* float32 LSTMs with the default activations take lstm_f32; the rest the generic recurrence */
static bool lstm_fast(kiln_run_ctx *c, const kiln_value *W, const kiln_value *R)
{
    const kiln_node *n = kiln_run_node(c);
    if (kind_of(n) != RNN_LSTM || !default_lstm_activations(n)) return false;
    const kiln_value *v[] = {kiln_run_in(c, 0), W, R, kiln_run_in(c, 3), kiln_run_in(c, 5), kiln_run_in(c, 6),
                             kiln_run_in(c, 7)};
    return all_f32(v, 7);
}

static kiln_status rnn_run(kiln_run_ctx *c)
{
    const kiln_value *W = kiln_run_in(c, 1), *R = kiln_run_in(c, 2);
    if (lstm_fast(c, W, R)) {
        KILN_TRY(rnn_check(c, W, R));
        return lstm_f32(c, W, R, NULL);
    }
    return rnn_compute(c, W, R);
}

/* ---- com.microsoft DynamicQuantizeLSTM ----
 * X [seq, batch, I] float32, W [dirs, I, 4H] and R [dirs, H, 4H] 8-bit, B, sequence_lens,
 * initial_h, initial_c, P as LSTM's (inputs 3..7), W_scale, W_zero_point, R_scale,
 * R_zero_point (inputs 8..11: [dirs] or [dirs, 4H]). Outputs as LSTM's, layout 0. */
static kiln_status dqlstm_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0), *w = kiln_infer_in(c, 1), *r = kiln_infer_in(c, 2);
    if (!x || !w || !r) return kiln_infer_fail(c, KILN_ERR_MODEL, "X, W and R are required");
    if (!kiln_infer_in(c, 8) || !kiln_infer_in(c, 10)) return kiln_infer_fail(c, KILN_ERR_MODEL, "W_scale and R_scale are required");
    if (x->rank != 3 || w->rank != 3 || r->rank != 3)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X, W, R must be 3-D (ranks %d, %d, %d)", x->rank, w->rank, r->rank);
    for (int i = 1; i <= 2; i++) {
        kiln_dtype dt = kiln_infer_in(c, i)->dtype;
        if (dt && dt != KILN_DTYPE_INT8 && dt != KILN_DTYPE_UINT8)
            return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "%s must be int8 or uint8, is %s", i == 1 ? "W" : "R",
                                   kiln_dtype_name(dt));
    }
    kiln_dim dirs = kiln_dim_const(directions(n)), hidden = r->dims[1];
    int64_t hs = kiln_attr_int(n, "hidden_size", -1);
    if (hs > 0) {
        KILN_TRY(kiln_infer_require_equal(c, r->dims[1], kiln_dim_const(hs), "R's second dim vs hidden_size"));
        hidden = kiln_dim_const(hs);
    }
    KILN_TRY(kiln_infer_require_equal(c, w->dims[0], dirs, "W's first dim vs number of directions"));
    KILN_TRY(kiln_infer_require_equal(c, w->dims[1], x->dims[2], "W's input size vs X's"));
    kiln_dim y[4] = {x->dims[0], dirs, x->dims[1], hidden}, h[3] = {dirs, x->dims[1], hidden};
    KILN_TRY(kiln_infer_set_out(c, 0, x->dtype, 4, y));
    KILN_TRY(kiln_infer_set_out(c, 1, x->dtype, 3, h));
    return kiln_infer_set_out(c, 2, x->dtype, 3, h);
}

/* Q [dirs, K, N] 8-bit -> out [dirs, N, K] float32: (q - zero_point) * scale, the scale and
 * zero point per direction ([dirs]) or per column ([dirs, N]). */
static kiln_status dequantize_transposed(kiln_run_ctx *c, const char *what, const kiln_value *Q, const kiln_value *S,
                                         const kiln_value *Z, float *out)
{
    int64_t D = Q->dims[0], K = Q->dims[1], N = Q->dims[2];
    if (!S || S->dtype != KILN_DTYPE_FLOAT32 || (S->numel != D && S->numel != D * N))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "%s_scale must be float32 [%lld] or [%lld, %lld]", what, (long long)D,
                             (long long)D, (long long)N);
    if (Z && (Z->dtype != Q->dtype || Z->numel != S->numel))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "%s_zero_point must be %s with %s_scale's %lld elements", what,
                             kiln_dtype_name(Q->dtype), what, (long long)S->numel);
    const float *s = S->data;
    bool per_col = S->numel == D * N;
    for (int64_t d = 0; d < D; d++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < N; j++) {
                int64_t pi = per_col ? d * N + j : d;
                double q = kiln_load_f64(Q->dtype, Q->data, (d * K + k) * N + j);
                double z = Z ? kiln_load_f64(Z->dtype, Z->data, pi) : 0.0;
                out[(d * N + j) * K + k] = (float)((q - z) * s[pi]);
            }
    return KILN_OK;
}

/* The scales and zero point of one 8-bit weight, checked. */
static kiln_status q8_params(kiln_run_ctx *c, const char *what, const kiln_value *Q, const kiln_value *S,
                             const kiln_value *Z, const float **s, bool *per_col)
{
    int64_t D = Q->dims[0], N = Q->dims[2];
    if (!S || S->dtype != KILN_DTYPE_FLOAT32 || (S->numel != D && S->numel != D * N))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "%s_scale must be float32 [%lld] or [%lld, %lld]", what, (long long)D,
                             (long long)D, (long long)N);
    if (Z && (Z->dtype != Q->dtype || Z->numel != S->numel))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "%s_zero_point must be %s with %s_scale's %lld elements", what,
                             kiln_dtype_name(Q->dtype), what, (long long)S->numel);
    *s = S->data;
    *per_col = S->numel == D * N && N > 1;
    return KILN_OK;
}

/* As ONNX Runtime runs it: X (all steps at once) and the state (every step) quantized to uint8
 * on the fly, int32 products with the 8-bit weights, float32 gates: ORT's results within float
 * rounding at batch 1; at larger batches ORT splits the state's quantization differently, and
 * the two differ by less than ORT's own quantization error. Activations other than the
 * defaults run the generic recurrence on the dequantized weights. */
static kiln_status dqlstm_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1), *R = kiln_run_in(c, 2);
    if (X->dtype != KILN_DTYPE_FLOAT32) return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "X must be float32");
    lstm_q8 q = {W, R, kiln_run_in(c, 9), kiln_run_in(c, 11), NULL, NULL, false, false};
    KILN_TRY(q8_params(c, "W", W, kiln_run_in(c, 8), q.wz, &q.ws, &q.ws_col));
    KILN_TRY(q8_params(c, "R", R, kiln_run_in(c, 10), q.rz, &q.rs, &q.rs_col));
    /* W and R as ONNX's LSTM sees them: [dirs, 4H, I] and [dirs, 4H, H] */
    kiln_value wf = *W, rf = *R;
    wf.dtype = rf.dtype = KILN_DTYPE_FLOAT32;
    wf.dims[1] = W->dims[2], wf.dims[2] = W->dims[1];
    rf.dims[1] = R->dims[2], rf.dims[2] = R->dims[1];
    wf.nbytes = (size_t)W->numel * sizeof(float), rf.nbytes = (size_t)R->numel * sizeof(float);
    wf.owns_data = rf.owns_data = false;
    if (lstm_fast(c, &wf, &rf)) {
        KILN_TRY(rnn_check(c, &wf, &rf));
        return lstm_f32(c, &wf, &rf, &q);
    }
    float *wd = malloc(wf.nbytes + 1), *rd = malloc(rf.nbytes + 1);
    kiln_status st;
    if (!wd || !rd) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    wf.data = wd, rf.data = rd;
    st = dequantize_transposed(c, "W", W, kiln_run_in(c, 8), kiln_run_in(c, 9), wd);
    if (!st) st = dequantize_transposed(c, "R", R, kiln_run_in(c, 10), kiln_run_in(c, 11), rd);
    if (!st) st = rnn_compute(c, &wf, &rf);
out:
    free(wd);
    free(rd);
    return st;
}

static const kiln_op_def defs[] = {
    {"", "RNN", 1, rnn_infer, rnn_run},
    {"", "GRU", 1, rnn_infer, rnn_run},
    {"", "LSTM", 1, rnn_infer, rnn_run},
    {"com.microsoft", "DynamicQuantizeLSTM", 1, dqlstm_infer, dqlstm_run},
};

const kiln_op_table kiln_ops_rnn = {defs, sizeof defs / sizeof defs[0]};
