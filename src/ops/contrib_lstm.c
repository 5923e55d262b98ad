/* contrib_lstm.c - com.microsoft DynamicQuantizeLSTM, the LSTM that quantize_dynamic writes: W
 * [dirs, input, 4H] and R [dirs, H, 4H] are 8-bit (transposed against ONNX's LSTM) with per-tensor
 * or per-column scales and zero points; activations are quantized to uint8 dynamically, as ONNX
 * Runtime's CPU kernel does it: the whole input sequence once (one scale for X W), the hidden state
 * once per step over the whole batch (one scale for H R). Gate order i, o, f, c; peepholes, clip,
 * input_forget, sequence_lens and the activations attributes as in LSTM. Float math in float32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/contrib_quant.h"
#include "ops/op.h"
#include "ops/util.h"

enum { IN_X, IN_W, IN_R, IN_B, IN_LENS, IN_H0, IN_C0, IN_P, IN_WS, IN_WZ, IN_RS, IN_RZ };

static int dirs_of(const kiln_node *n)
{
    return !strcmp(kiln_attr_string(n, "direction", "forward"), "bidirectional") ? 2 : 1;
}

/* Y [seq, dirs, batch, H]; Y_h, Y_c [dirs, batch, H] */
static kiln_status dqlstm_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, IN_X), *w = kiln_infer_in(c, IN_W), *r = kiln_infer_in(c, IN_R);
    if (!x || !w || !r || !kiln_infer_in(c, IN_WS) || !kiln_infer_in(c, IN_WZ) || !kiln_infer_in(c, IN_RS) ||
        !kiln_infer_in(c, IN_RZ))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X, W, R and the scales and zero points of W and R");
    if (x->rank != 3 || w->rank != 3 || r->rank != 3)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X, W, R must be 3-D (ranks %d, %d, %d)", x->rank, w->rank, r->rank);
    if (w->dtype && w->dtype != KILN_DTYPE_INT8 && w->dtype != KILN_DTYPE_UINT8)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "W is %s, expected int8 or uint8", kiln_dtype_name(w->dtype));
    kiln_dim dirs = kiln_dim_const(dirs_of(n)), hidden = r->dims[1];
    int64_t hs = kiln_attr_int(n, "hidden_size", -1);
    if (hs > 0) {
        KILN_TRY(kiln_infer_require_equal(c, r->dims[1], kiln_dim_const(hs), "R's second dim vs hidden_size"));
        hidden = kiln_dim_const(hs);
    }
    KILN_TRY(kiln_infer_require_equal(c, w->dims[0], dirs, "W's first dim vs number of directions"));
    KILN_TRY(kiln_infer_require_equal(c, w->dims[1], x->dims[2], "W's input size vs X's"));
    kiln_dim y[4] = {x->dims[0], dirs, x->dims[1], hidden}, h[3] = {dirs, x->dims[1], hidden};
    KILN_TRY(kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 4, y));
    KILN_TRY(kiln_infer_set_out(c, 1, KILN_DTYPE_FLOAT32, 3, h));
    return kiln_infer_set_out(c, 2, KILN_DTYPE_FLOAT32, 3, h);
}

typedef enum { ACT_SIGMOID, ACT_TANH, ACT_RELU } act_kind;

static float act(act_kind k, float x)
{
    if (k == ACT_SIGMOID) return 1.0f / (1.0f + expf(-x));
    if (k == ACT_TANH) return tanhf(x);
    return x > 0 ? x : 0;
}

static kiln_status read_acts(kiln_run_ctx *c, int dirs, act_kind *a)
{
    const kiln_attr *list = kiln_node_attr(kiln_run_node(c), "activations");
    for (int i = 0; i < 3 * dirs; i++) {
        a[i] = i % 3 ? ACT_TANH : ACT_SIGMOID;
        if (!list) continue;
        if (list->type != KILN_ATTR_STRINGS || (list->n != 3 * dirs && list->n != 3))
            return kiln_run_fail(c, KILN_ERR_MODEL, "activations must list 3 or %d functions", 3 * dirs);
        const char *f = list->strings[i % list->n];
        if (!strcmp(f, "Sigmoid")) a[i] = ACT_SIGMOID;
        else if (!strcmp(f, "Tanh")) a[i] = ACT_TANH;
        else if (!strcmp(f, "Relu")) a[i] = ACT_RELU;
        else return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "activation '%s'", f);
    }
    return KILN_OK;
}

/* Per-column (or per-tensor) scale and zero point of direction d's weight: n values of [dirs, n]
 * or one per direction [dirs] (or a scalar). */
static bool wparams(const kiln_value *s, const kiln_value *z, kiln_dtype wdt, int dirs, int64_t n, int d, int64_t col,
                    float *scale, int32_t *zp)
{
    int64_t is = s->numel == dirs * n ? d * n + col : s->numel == dirs ? d : s->numel == 1 ? 0 : -1;
    int64_t iz = z->numel == dirs * n ? d * n + col : z->numel == dirs ? d : z->numel == 1 ? 0 : -1;
    if (is < 0 || iz < 0 || s->dtype != KILN_DTYPE_FLOAT32 || z->dtype != wdt) return false;
    *scale = ((const float *)s->data)[is];
    *zp = wdt == KILN_DTYPE_INT8 ? ((const int8_t *)z->data)[iz] : ((const uint8_t *)z->data)[iz];
    return true;
}

static int32_t w_at(kiln_dtype dt, const void *p, int64_t i)
{
    return dt == KILN_DTYPE_INT8 ? ((const int8_t *)p)[i] : ((const uint8_t *)p)[i];
}

/* out [M, N] (+)= float(quant(A) (B - zp)) * a_scale * b_scale[col]: A [M, K] float quantized to
 * uint8 over all M * K values, B [K, N] of direction d. */
static void qgemm_f(const float *A, int64_t M, int64_t K, const void *B, kiln_dtype bdt, int64_t N, const float *bs,
                    const int32_t *bz, uint8_t *qa, float *out, bool accumulate)
{
    float mn = 0.0f, mx = 0.0f, as;
    int32_t az;
    for (int64_t i = 0; i < M * K; i++) {
        mn = fminf(mn, A[i]);
        mx = fmaxf(mx, A[i]);
    }
    kiln_dynquant_params(mn, mx, &as, &az);
    for (int64_t i = 0; i < M * K; i++) qa[i] = kiln_dynquant_one(A[i], as, az);
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < N; j++) {
            int32_t acc = 0;
            for (int64_t k = 0; k < K; k++) acc += ((int32_t)qa[m * K + k] - az) * (w_at(bdt, B, k * N + j) - bz[j]);
            float v = (float)acc * (as * bs[j]);
            out[m * N + j] = accumulate ? out[m * N + j] + v : v;
        }
}

static float clipf(float x, float clip) { return clip > 0 ? fmaxf(-clip, fminf(clip, x)) : x; }

static kiln_status dqlstm_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, IN_X), *W = kiln_run_in(c, IN_W), *R = kiln_run_in(c, IN_R);
    const kiln_value *Bv = kiln_run_in(c, IN_B), *lens = kiln_run_in(c, IN_LENS), *H0 = kiln_run_in(c, IN_H0);
    const kiln_value *C0 = kiln_run_in(c, IN_C0), *P = kiln_run_in(c, IN_P);
    const kiln_value *Ws = kiln_run_in(c, IN_WS), *Wz = kiln_run_in(c, IN_WZ), *Rs = kiln_run_in(c, IN_RS),
                     *Rz = kiln_run_in(c, IN_RZ);
    kiln_value *Y = kiln_run_out(c, 0), *Yh = kiln_run_out(c, 1), *Yc = kiln_run_out(c, 2);
    int dirs = dirs_of(n);
    if (X->dtype != KILN_DTYPE_FLOAT32) return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "X must be float32");
    int64_t S = X->dims[0], Bn = X->dims[1], I = X->dims[2], Hs = R->dims[1], G = 4 * Hs;
    if (W->dims[0] != dirs || W->dims[1] != I || W->dims[2] != G || R->dims[0] != dirs || R->dims[2] != G ||
        R->dtype != W->dtype)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "W must be [%d, %lld, %lld] and R [%d, %lld, %lld] of one type", dirs,
                             (long long)I, (long long)G, dirs, (long long)Hs, (long long)G);
    if (Bv && (Bv->dtype != KILN_DTYPE_FLOAT32 || Bv->numel != dirs * 2 * G))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "B must be float32 [%d, %lld]", dirs, (long long)(2 * G));
    if (lens && (lens->numel != Bn)) return kiln_run_fail(c, KILN_ERR_SHAPE, "sequence_lens must be [%lld]", (long long)Bn);
    if ((H0 && (H0->dtype != KILN_DTYPE_FLOAT32 || H0->numel != dirs * Bn * Hs)) ||
        (C0 && (C0->dtype != KILN_DTYPE_FLOAT32 || C0->numel != dirs * Bn * Hs)))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "initial_h and initial_c must be float32 [%d, %lld, %lld]", dirs,
                             (long long)Bn, (long long)Hs);
    if (P && (P->dtype != KILN_DTYPE_FLOAT32 || P->numel != dirs * 3 * Hs))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "P must be float32 [%d, %lld]", dirs, (long long)(3 * Hs));
    act_kind acts[6];
    KILN_TRY(read_acts(c, dirs, acts));
    float clip = kiln_attr_float(n, "clip", 0.0f);
    bool input_forget = kiln_attr_int(n, "input_forget", 0) != 0;
    bool reverse_only = !strcmp(kiln_attr_string(n, "direction", "forward"), "reverse");
    int64_t qn = S * Bn * I > Bn * Hs ? S * Bn * I : Bn * Hs;
    float *gx = malloc((size_t)(S * Bn * G + 1) * sizeof *gx), *gh = malloc((size_t)(Bn * G + 1) * sizeof *gh);
    float *h = malloc((size_t)(Bn * Hs + 1) * sizeof *h), *cs = malloc((size_t)(Bn * Hs + 1) * sizeof *cs);
    float *ws = malloc((size_t)(2 * G) * sizeof *ws);
    int32_t *wz = malloc((size_t)(2 * G) * sizeof *wz);
    uint8_t *qa = malloc((size_t)qn + 1);
    int64_t *len = malloc((size_t)(Bn + 1) * sizeof *len);
    kiln_status st = KILN_OK;
    if (!gx || !gh || !h || !cs || !ws || !wz || !qa || !len) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int64_t b = 0; b < Bn; b++) {
        len[b] = lens ? kiln_load_i64(lens->dtype, lens->data, b) : S;
        if (len[b] < 0 || len[b] > S) {
            st = kiln_run_fail(c, KILN_ERR_RUNTIME, "sequence_lens[%lld] = %lld outside [0, %lld]", (long long)b,
                               (long long)len[b], (long long)S);
            goto out;
        }
    }
    if (Y) memset(Y->data, 0, (size_t)Y->numel * sizeof(float));
    const float *x = X->data;
    for (int d = 0; d < dirs; d++) {
        bool rev = reverse_only || d == 1;
        const act_kind *a = &acts[3 * d];
        for (int64_t j = 0; j < G; j++)
            if (!wparams(Ws, Wz, W->dtype, dirs, G, d, j, &ws[j], &wz[j]) ||
                !wparams(Rs, Rz, R->dtype, dirs, G, d, j, &ws[G + j], &wz[G + j])) {
                st = kiln_run_fail(c, KILN_ERR_SHAPE, "W/R scales and zero points must be [%d] or [%d, %lld] of W's type",
                                   dirs, dirs, (long long)G);
                goto out;
            }
        const int8_t *wd = (const int8_t *)W->data + d * I * G, *rd = (const int8_t *)R->data + d * Hs * G;
        qgemm_f(x, S * Bn, I, wd, W->dtype, G, ws, wz, qa, gx, false);
        for (int64_t i = 0; i < Bn * Hs; i++) {
            h[i] = H0 ? ((const float *)H0->data)[d * Bn * Hs + i] : 0.0f;
            cs[i] = C0 ? ((const float *)C0->data)[d * Bn * Hs + i] : 0.0f;
        }
        const float *bw = Bv ? (const float *)Bv->data + d * 2 * G : NULL, *p = P ? (const float *)P->data + d * 3 * Hs : NULL;
        for (int64_t step = 0; step < S; step++) {
            qgemm_f(h, Bn, Hs, rd, R->dtype, G, ws + G, wz + G, qa, gh, false);
            for (int64_t b = 0; b < Bn; b++) {
                if (step >= len[b]) continue;
                int64_t t = rev ? len[b] - 1 - step : step;
                const float *gxt = gx + (t * Bn + b) * G, *ght = gh + b * G;
                float *hb = h + b * Hs, *cb = cs + b * Hs;
                for (int64_t k = 0; k < Hs; k++) {
                    float pre[4];
                    for (int q = 0; q < 4; q++) {
                        int64_t j = q * Hs + k;
                        pre[q] = gxt[j] + ght[j] + (bw ? bw[j] + bw[G + j] : 0.0f);
                    }
                    float ig = act(a[0], clipf(pre[0] + (p ? p[k] * cb[k] : 0.0f), clip));
                    float fg = input_forget ? 1.0f - ig : act(a[0], clipf(pre[2] + (p ? p[2 * Hs + k] * cb[k] : 0.0f), clip));
                    float cg = act(a[1], clipf(pre[3], clip));
                    float cn = fg * cb[k] + ig * cg;
                    float og = act(a[0], clipf(pre[1] + (p ? p[Hs + k] * cn : 0.0f), clip));
                    cb[k] = cn;
                    hb[k] = og * act(a[2], cn);
                }
                if (Y) memcpy((float *)Y->data + ((t * dirs + d) * Bn + b) * Hs, hb, (size_t)Hs * sizeof(float));
            }
        }
        if (Yh) memcpy((float *)Yh->data + d * Bn * Hs, h, (size_t)(Bn * Hs) * sizeof(float));
        if (Yc) memcpy((float *)Yc->data + d * Bn * Hs, cs, (size_t)(Bn * Hs) * sizeof(float));
    }
out:
    free(gx);
    free(gh);
    free(h);
    free(cs);
    free(ws);
    free(wz);
    free(qa);
    free(len);
    return st;
}

static const kiln_op_def defs[] = {
    {"com.microsoft", "DynamicQuantizeLSTM", 1, dqlstm_infer, dqlstm_run},
};

const kiln_op_table kiln_ops_contrib_lstm = {defs, sizeof defs / sizeof defs[0]};
