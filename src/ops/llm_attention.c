/* llm_attention.c - com.microsoft GroupQueryAttention (ONNX Runtime's semantics: separate or
 * packed QKV, BNSH past/present with a shared max_length buffer, seqlens_k and
 * total_sequence_length, first prompt / subsequent prompt / decode, rotary with cos/sin caches,
 * position_ids, attention_bias, local_window_size, softcap, smooth_softmax and head_sink) and
 * com.microsoft RotaryEmbedding. The reference kernels compute in double and store in the
 * input's type; the CPU provider's float32 kernel is in src/cpu/kernels_llm.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/llm.h"
#include "ops/util.h"

static bool is_float(kiln_dtype dt) { return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16; }

static kiln_status gqa_parse(const kiln_node *n, void *params, kiln_err *err)
{
    kiln_gqa_params *p = params;
    p->num_heads = kiln_attr_int(n, "num_heads", 0);
    p->kv_num_heads = kiln_attr_int(n, "kv_num_heads", 0);
    p->local_window_size = kiln_attr_int(n, "local_window_size", -1);
    p->scale = kiln_attr_float(n, "scale", 0.0f);
    p->softcap = kiln_attr_float(n, "softcap", 0.0f);
    p->do_rotary = kiln_attr_int(n, "do_rotary", 0) == 1;
    p->interleaved = kiln_attr_int(n, "rotary_interleaved", 0) == 1;
    p->smooth_softmax = kiln_attr_int(n, "smooth_softmax", 0) == 1;
    if (p->num_heads <= 0 || p->kv_num_heads <= 0 || p->num_heads % p->kv_num_heads)
        return kiln_errf(err, KILN_ERR_MODEL, "%s (GroupQueryAttention): num_heads %lld must be a positive multiple of "
                         "kv_num_heads %lld", n->name, (long long)p->num_heads, (long long)p->kv_num_heads);
    if (p->local_window_size < -1 || kiln_attr_int(n, "qk_output", 0) != 0)
        return kiln_errf(err, KILN_ERR_MODEL, "%s (GroupQueryAttention): local_window_size %lld (>= -1) or qk_output "
                         "(only 0) not supported", n->name, (long long)p->local_window_size);
    return KILN_OK;
}

/* Symbolic shapes: output [B, S, N*H], present [B, Nkv, max(total, P), H]. */
static kiln_status gqa_infer(kiln_infer_ctx *c)
{
    const kiln_gqa_params *p = kiln_infer_node(c)->params;
    kiln_dimtab *t = kiln_infer_dims(c);
    const kiln_type *q = kiln_infer_in(c, GQA_Q), *k = kiln_infer_in(c, GQA_K), *v = kiln_infer_in(c, GQA_V);
    const kiln_type *pk = kiln_infer_in(c, GQA_PK), *sl = kiln_infer_in(c, GQA_SEQLENS);
    if (!q || !sl || !kiln_infer_in(c, GQA_TOTAL))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs query, seqlens_k and total_sequence_length");
    if ((k == NULL) != (v == NULL)) return kiln_infer_fail(c, KILN_ERR_MODEL, "key and value come together");
    if (q->dtype && !is_float(q->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "query is %s, expected float32 or float16", kiln_dtype_name(q->dtype));
    if (sl->dtype && sl->dtype != KILN_DTYPE_INT32)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "seqlens_k is %s, expected int32", kiln_dtype_name(sl->dtype));
    if (q->rank < 0) {
        for (int i = 0; i < 3; i++) KILN_TRY(kiln_infer_set_out_unknown(c, i, q->dtype));
        return KILN_OK;
    }
    if (q->rank != 3) return kiln_infer_fail(c, KILN_ERR_SHAPE, "query must be 3-D [batch, seq, hidden], has rank %d", q->rank);
    kiln_dim N = kiln_dim_const(p->num_heads), Nkv = kiln_dim_const(p->kv_num_heads), H;
    if (k) {
        H = kiln_dim_floordiv(t, q->dims[2], N);
        if (k->rank >= 0 && k->rank != 3) return kiln_infer_fail(c, KILN_ERR_SHAPE, "key must be 3-D, has rank %d", k->rank);
        if (k->rank == 3) {
            KILN_TRY(kiln_infer_require_equal(c, k->dims[0], q->dims[0], "key and query batch"));
            KILN_TRY(kiln_infer_require_equal(c, k->dims[1], q->dims[1], "key and query sequence"));
            KILN_TRY(kiln_infer_require_equal(c, k->dims[2], kiln_dim_mul(t, Nkv, H), "key hidden size and kv_num_heads * head_size"));
        }
    } else {
        H = kiln_dim_floordiv(t, q->dims[2], kiln_dim_const(p->num_heads + 2 * p->kv_num_heads));
    }
    kiln_dim y[3] = {q->dims[0], q->dims[1], kiln_dim_mul(t, N, H)};
    KILN_TRY(kiln_infer_set_out(c, 0, q->dtype, 3, y));
    kiln_dim total;
    int cnt = 0;
    bool known = kiln_infer_in_dims_value(c, GQA_TOTAL, &total, 1, &cnt) && cnt == 1;
    kiln_dim len;
    if (pk && pk->rank >= 0) {
        if (pk->rank != 4) return kiln_infer_fail(c, KILN_ERR_SHAPE, "past_key must be 4-D BNSH, has rank %d", pk->rank);
        len = known ? kiln_dim_max(t, total, pk->dims[2]) : kiln_infer_fresh(c, "present_len");
    } else {
        len = known ? total : kiln_infer_fresh(c, "present_len");
    }
    kiln_dim pd[4] = {q->dims[0], Nkv, len, H};
    KILN_TRY(kiln_infer_set_out(c, 1, q->dtype, 4, pd));
    return kiln_infer_set_out(c, 2, q->dtype, 4, pd);
}

static bool dims_are(const kiln_value *v, int rank, const int64_t *d)
{
    if (v->rank != rank) return false;
    for (int i = 0; i < rank; i++)
        if (v->dims[i] != d[i]) return false;
    return true;
}

kiln_status kiln_gqa_prepare(kiln_run_ctx *c, kiln_gqa_call *g)
{
    const kiln_gqa_params *p = kiln_run_node(c)->params;
    memset(g, 0, sizeof *g);
    g->q = kiln_run_in(c, GQA_Q), g->k = kiln_run_in(c, GQA_K), g->v = kiln_run_in(c, GQA_V);
    g->past_k = kiln_run_in(c, GQA_PK), g->past_v = kiln_run_in(c, GQA_PV);
    const kiln_value *sl = kiln_run_in(c, GQA_SEQLENS), *tot = kiln_run_in(c, GQA_TOTAL);
    g->y = kiln_run_out(c, 0), g->present_k = kiln_run_out(c, 1), g->present_v = kiln_run_out(c, 2);
    if (!sl || !tot) return kiln_run_fail(c, KILN_ERR_MODEL, "needs seqlens_k and total_sequence_length");
    if (!g->y) return kiln_run_fail(c, KILN_ERR_MODEL, "output 0 is required");
    if (kiln_run_has_out(c, 3)) return kiln_run_fail(c, KILN_ERR_MODEL, "output_qk is not supported");
    const kiln_value *q = g->q;
    kiln_dtype dt = q->dtype;
    if (!is_float(dt) || q->rank != 3)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "query must be a 3-D float32/float16 tensor (rank %d, %s)", q->rank,
                             kiln_dtype_name(dt));
    g->B = q->dims[0], g->S = q->dims[1], g->N = p->num_heads, g->Nkv = p->kv_num_heads;
    g->packed = !g->k;
    if ((g->k == NULL) != (g->v == NULL)) return kiln_run_fail(c, KILN_ERR_MODEL, "key and value come together");
    int64_t heads = g->packed ? g->N + 2 * g->Nkv : g->N;
    if (q->dims[2] % heads)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "query hidden size %lld is not a multiple of %lld heads", (long long)q->dims[2],
                             (long long)heads);
    g->H = q->dims[2] / heads;
    if (!g->packed) {
        int64_t kd[3] = {g->B, g->S, g->Nkv * g->H};
        if (!dims_are(g->k, 3, kd) || !dims_are(g->v, 3, kd) || g->k->dtype != dt || g->v->dtype != dt)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "key and value must be %s [%lld, %lld, %lld]", kiln_dtype_name(dt),
                                 (long long)kd[0], (long long)kd[1], (long long)kd[2]);
    }
    if ((g->past_k == NULL) != (g->past_v == NULL))
        return kiln_run_fail(c, KILN_ERR_MODEL, "past_key and past_value come together");
    if (g->past_k) {
        int64_t pd[4] = {g->B, g->Nkv, g->past_k->rank == 4 ? g->past_k->dims[2] : -1, g->H};
        if (!dims_are(g->past_k, 4, pd) || !dims_are(g->past_v, 4, pd) || g->past_k->dtype != dt || g->past_v->dtype != dt)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "past_key and past_value must be %s [%lld, %lld, past, %lld] (BNSH)",
                                 kiln_dtype_name(dt), (long long)g->B, (long long)g->Nkv, (long long)g->H);
        g->past_len = pd[2];
    }
    if (sl->dtype != KILN_DTYPE_INT32 || sl->rank != 1 || sl->dims[0] != g->B)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "seqlens_k must be int32 [%lld]", (long long)g->B);
    if (tot->dtype != KILN_DTYPE_INT32 || tot->numel != 1 || tot->rank > 1)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "total_sequence_length must be an int32 scalar");
    g->seqlens = sl->data;
    g->rows_on_device = sl->on_device;
    g->total = ((const int32_t *)tot->data)[0];
    if (g->total < 1) return kiln_run_fail(c, KILN_ERR_SHAPE, "total_sequence_length %lld < 1", (long long)g->total);
    g->present_len = g->total > g->past_len ? g->total : g->past_len;
    g->first_prompt = g->S == g->total;
    if (!g->first_prompt && g->S > 1 && g->B != 1 && !g->past_k)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "sequence %lld != total_sequence_length %lld needs a past", (long long)g->S,
                             (long long)g->total);
    int64_t pres[4] = {g->B, g->Nkv, g->present_len, g->H};
    if ((g->present_k && !dims_are(g->present_k, 4, pres)) || (g->present_v && !dims_are(g->present_v, 4, pres)))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "present_key/present_value are not [%lld, %lld, %lld, %lld]", (long long)pres[0],
                             (long long)pres[1], (long long)pres[2], (long long)pres[3]);
    g->shared = g->past_k && g->present_k && g->present_v && g->past_k->data == g->present_k->data &&
                g->past_v->data == g->present_v->data;
    for (int64_t b = 0; b < g->B && !g->rows_on_device; b++) {
        int64_t s = g->seqlens[b];
        if (s < 0 || s >= g->present_len)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "seqlens_k[%lld] = %lld is out of range [0, %lld)", (long long)b,
                                 (long long)s, (long long)g->present_len);
        if (!g->first_prompt && s + 1 < g->S)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "seqlens_k[%lld] = %lld is too small for sequence length %lld",
                                 (long long)b, (long long)s, (long long)g->S);
        int64_t rows = kiln_gqa_past_rows(g, b);
        if (rows > g->past_len || rows + g->S > g->present_len)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "seqlens_k[%lld] = %lld needs %lld past rows (past has %lld, present %lld)",
                                 (long long)b, (long long)s, (long long)rows, (long long)g->past_len, (long long)g->present_len);
    }
    g->scale = p->scale == 0.0f ? 1.0f / sqrtf((float)g->H) : p->scale;
    g->softcap = p->softcap, g->window = p->local_window_size;
    g->interleaved = p->interleaved, g->smooth = p->smooth_softmax;
    g->pos = kiln_run_in(c, GQA_POS);
    if (p->do_rotary) {
        g->cos = kiln_run_in(c, GQA_COS), g->sin = kiln_run_in(c, GQA_SIN);
        if (!g->cos || !g->sin || g->cos->rank != 2 || !dims_are(g->sin, 2, g->cos->dims) || g->cos->dtype != dt ||
            g->sin->dtype != dt)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "do_rotary needs cos_cache and sin_cache %s [max_pos, rotary_dim/2]",
                                 kiln_dtype_name(dt));
        g->rd = 2 * g->cos->dims[1];
        if (g->rd > g->H || g->rd <= 0)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "rotary dim %lld (2 * cos_cache dim 1) exceeds head size %lld",
                                 (long long)g->rd, (long long)g->H);
        if (g->pos) {
            int64_t pd[2] = {g->B, g->S};
            if (g->pos->dtype != KILN_DTYPE_INT64 || !dims_are(g->pos, 2, pd))
                return kiln_run_fail(c, KILN_ERR_SHAPE, "position_ids must be int64 [%lld, %lld]", (long long)g->B,
                                     (long long)g->S);
            if (g->pos->on_device != g->rows_on_device)
                return kiln_run_fail(c, KILN_ERR_RUNTIME, "internal: seqlens_k and position_ids on different sides");
        }
        for (int64_t b = 0; b < g->B && !g->rows_on_device; b++)
            for (int64_t s = 0; s < g->S; s++) {
                int64_t ps = kiln_gqa_position(g, b, s);
                if (ps < 0 || ps >= g->cos->dims[0])
                    return kiln_run_fail(c, KILN_ERR_SHAPE, "position %lld of batch row %lld is outside the rotary caches' %lld rows",
                                         (long long)ps, (long long)b, (long long)g->cos->dims[0]);
            }
    }
    g->bias = kiln_run_in(c, GQA_BIAS);
    if (g->bias) {
        const kiln_value *ab = g->bias;
        int64_t need = 0;
        for (int64_t b = 0; b < g->B && !g->rows_on_device; b++) need = g->seqlens[b] + 1 > need ? g->seqlens[b] + 1 : need;
        if (ab->dtype != dt || ab->rank != 4 || (ab->dims[0] != 1 && ab->dims[0] != g->B) ||
            (ab->dims[1] != 1 && ab->dims[1] != g->N) || ab->dims[2] != g->S || ab->dims[3] < need)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "attention_bias must be %s [%lld|1, %lld|1, %lld, >= %lld]",
                                 kiln_dtype_name(dt), (long long)g->B, (long long)g->N, (long long)g->S, (long long)need);
        g->bias_s = ab->dims[3];
        g->bias_h = ab->dims[1] == 1 ? 0 : g->S * ab->dims[3];
        g->bias_b = ab->dims[0] == 1 ? 0 : ab->dims[1] * g->S * ab->dims[3];
    }
    g->sink = kiln_run_in(c, GQA_SINK);
    if (g->sink && (g->sink->dtype != dt || g->sink->numel != g->N || g->sink->rank != 1))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "head_sink must be %s [%lld]", kiln_dtype_name(dt), (long long)g->N);
    return KILN_OK;
}

int64_t kiln_gqa_position(const kiln_gqa_call *g, int64_t b, int64_t s)
{
    if (g->pos) return ((const int64_t *)g->pos->data)[b * g->S + s];
    if (g->first_prompt) return s;
    return (int64_t)g->seqlens[b] + 1 - g->S + s;
}

void kiln_gqa_window(const kiln_gqa_call *g, int64_t b, int64_t i, int64_t *start, int64_t *len)
{
    int64_t total = (int64_t)g->seqlens[b] + 1;
    int64_t causal = (g->past_k && !g->first_prompt ? total - g->S : 0) + i + 1;
    if (causal > total) causal = total; /* padding rows of a right-padded prompt */
    if (g->window >= 0 && causal > g->window) {
        *start = causal - g->window, *len = g->window;
    } else {
        *start = 0, *len = causal;
    }
}

/* Element (b, head hd, s, d) of Q (hd < N), K (N <= hd < N + Nkv) or V (hd >= N + Nkv) as given. */
static double qkv_at(const kiln_gqa_call *g, int64_t b, int64_t hd, int64_t s, int64_t d)
{
    const kiln_value *x = g->q;
    int64_t heads = g->N, h = hd;
    if (g->packed) {
        heads = g->N + 2 * g->Nkv;
    } else if (hd >= g->N + g->Nkv) {
        x = g->v, heads = g->Nkv, h = hd - g->N - g->Nkv;
    } else if (hd >= g->N) {
        x = g->k, heads = g->Nkv, h = hd - g->N;
    }
    return kiln_load_f64(x->dtype, x->data, ((b * g->S + s) * heads + h) * g->H + d);
}

/* Row (b, hd, s) of Q/K/V with the rotary embedding applied to Q and K (rounded to the dtype as
 * ONNX Runtime stores the rotated tensors). */
static void qkv_row(const kiln_gqa_call *g, int64_t b, int64_t hd, int64_t s, double *out, double *x)
{
    kiln_dtype dt = g->q->dtype;
    for (int64_t d = 0; d < g->H; d++) out[d] = qkv_at(g, b, hd, s, d);
    if (!g->rd || hd >= g->N + g->Nkv) return;
    int64_t half = g->rd / 2, row = kiln_gqa_position(g, b, s) * half;
    memcpy(x, out, (size_t)g->rd * sizeof *x);
    for (int64_t i = 0; i < g->rd; i++) {
        int64_t j = g->interleaved ? i / 2 : i % half;
        double cs = kiln_load_f64(dt, g->cos->data, row + j), sn = kiln_load_f64(dt, g->sin->data, row + j);
        double r;
        if (g->interleaved) r = i % 2 ? x[i] * cs + x[i - 1] * sn : x[i] * cs - x[i + 1] * sn;
        else r = i < half ? x[i] * cs - x[i + half] * sn : x[i] * cs + x[i - half] * sn;
        out[i] = kiln_round_to(dt, r);
    }
}

static kiln_status gqa_run(kiln_run_ctx *c)
{
    kiln_gqa_call g;
    KILN_TRY(kiln_gqa_prepare(c, &g));
    kiln_dtype dt = g.q->dtype;
    int64_t B = g.B, S = g.S, N = g.N, Nkv = g.Nkv, H = g.H, L = g.present_len, group = N / Nkv;
    /* present K and V (also when the node does not output them), [B, Nkv, L, H] in double */
    size_t nkv = (size_t)(B * Nkv * L * H);
    double *kc = calloc(2 * nkv + (size_t)(L + 2 * H + 1), sizeof *kc);
    if (!kc) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    double *vc = kc + nkv, *p = vc + nkv, *row = p + L, *tmp = row + H;
    for (int64_t b = 0; b < B; b++) {
        int64_t past = kiln_gqa_past_rows(&g, b);
        for (int64_t h = 0; h < Nkv; h++) {
            double *kh = kc + (b * Nkv + h) * L * H, *vh = vc + (b * Nkv + h) * L * H;
            int64_t base = (b * Nkv + h) * g.past_len * H;
            for (int64_t t = 0; g.shared && t < L * H; t++) { /* the shared buffer keeps its other rows */
                kh[t] = kiln_load_f64(dt, g.past_k->data, base + t);
                vh[t] = kiln_load_f64(dt, g.past_v->data, base + t);
            }
            for (int64_t t = 0; t < past * H; t++) {
                kh[t] = kiln_load_f64(dt, g.past_k->data, base + t);
                vh[t] = kiln_load_f64(dt, g.past_v->data, base + t);
            }
            for (int64_t s = 0; s < S; s++) {
                qkv_row(&g, b, N + h, s, kh + (past + s) * H, tmp);
                qkv_row(&g, b, N + Nkv + h, s, vh + (past + s) * H, tmp);
            }
        }
    }
    double *qr = row;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < N; h++) {
            const double *kh = kc + (b * Nkv + h / group) * L * H, *vh = vc + (b * Nkv + h / group) * L * H;
            double sink = g.sink ? kiln_load_f64(dt, g.sink->data, h) : 0.0;
            for (int64_t i = 0; i < S; i++) {
                qkv_row(&g, b, h, i, qr, tmp);
                int64_t start, len;
                kiln_gqa_window(&g, b, i, &start, &len);
                double mx = g.sink || g.smooth ? sink : -INFINITY, sum = 0;
                for (int64_t j = start; j < start + len; j++) {
                    double acc = 0;
                    for (int64_t d = 0; d < H; d++) acc += qr[d] * kh[j * H + d];
                    acc *= g.scale;
                    if (g.softcap > 0) acc = g.softcap * tanh(acc / g.softcap);
                    if (g.bias) acc += kiln_load_f64(dt, g.bias->data, b * g.bias_b + h * g.bias_h + i * g.bias_s + j);
                    p[j] = acc;
                    if (acc > mx) mx = acc;
                }
                for (int64_t j = start; j < start + len; j++) sum += p[j] = exp(p[j] - mx);
                if (g.sink || g.smooth) sum += exp(sink - mx);
                for (int64_t d = 0; d < H; d++) {
                    double acc = 0;
                    for (int64_t j = start; j < start + len; j++) acc += p[j] * vh[j * H + d];
                    kiln_store_f64(dt, g.y->data, ((b * S + i) * N + h) * H + d, sum > 0 ? acc / sum : 0.0);
                }
            }
        }
    for (int64_t t = 0; t < (int64_t)nkv; t++) {
        if (g.present_k) kiln_store_f64(dt, g.present_k->data, t, kc[t]);
        if (g.present_v) kiln_store_f64(dt, g.present_v->data, t, vc[t]);
    }
    free(kc);
    return KILN_OK;
}

/* ---- com.microsoft RotaryEmbedding: input [B, S, hidden] or [B, N, S, H], position_ids [B, S]
 * or a 1-element offset, caches [max_pos, rd/2] ---- */

static kiln_status ms_rotary_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x || !kiln_infer_in(c, 1) || !kiln_infer_in(c, 2) || !kiln_infer_in(c, 3))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input, position_ids, cos_cache and sin_cache");
    if (x->dtype && !is_float(x->dtype) && x->dtype != KILN_DTYPE_BFLOAT16)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input is %s, expected a float type", kiln_dtype_name(x->dtype));
    if (x->rank >= 0 && x->rank != 3 && x->rank != 4)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "input must be 3-D or 4-D, is %d-D", x->rank);
    return kiln_infer_same_as_input(c, 0, 0);
}

static kiln_status ms_rotary_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *pos = kiln_run_in(c, 1), *cosv = kiln_run_in(c, 2), *sinv = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0);
    bool rank3 = X->rank == 3, interleaved = kiln_attr_int(n, "interleaved", 0) != 0;
    if (kiln_attr_int(n, "is_packed_batching", 0))
        return kiln_run_fail(c, KILN_ERR_MODEL, "is_packed_batching is not supported");
    if (cosv->rank != 2 || !dims_are(sinv, 2, cosv->dims) || cosv->dtype != X->dtype || sinv->dtype != X->dtype)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "cos_cache and sin_cache must be [max_pos, rotary_dim/2] of input's type");
    int64_t B = X->dims[0], S = rank3 ? X->dims[1] : X->dims[2], rd = kiln_attr_int(n, "rotary_embedding_dim", 0);
    int64_t H, Nh = kiln_attr_int(n, "num_heads", 0);
    if (rank3) {
        if (rd == 0) H = 2 * cosv->dims[1], Nh = H ? X->dims[2] / H : 0;
        else H = Nh > 0 ? X->dims[2] / Nh : 0;
        if (H <= 0 || Nh <= 0 || Nh * H != X->dims[2])
            return kiln_run_fail(c, KILN_ERR_SHAPE, "hidden size %lld does not split into heads (num_heads %lld)",
                                 (long long)X->dims[2], (long long)Nh);
    } else {
        Nh = X->dims[1], H = X->dims[3];
    }
    if (rd == 0) rd = H;
    if (rd > H || rd % 2 || cosv->dims[1] != rd / 2)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "rotary_embedding_dim %lld must be even, <= head size %lld and twice "
                             "cos_cache's dim 1 (%lld)", (long long)rd, (long long)H, (long long)cosv->dims[1]);
    bool offset = pos->numel == 1;
    if (!kiln_dtype_is_int(pos->dtype) || (!offset && (pos->rank != 2 || pos->dims[0] != B || pos->dims[1] != S)))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "position_ids must be one offset or [%lld, %lld] integers", (long long)B,
                             (long long)S);
    kiln_dtype dt = X->dtype;
    int64_t half = rd / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) {
            int64_t p = offset ? kiln_load_i64(pos->dtype, pos->data, 0) + s : kiln_load_i64(pos->dtype, pos->data, b * S + s);
            if (p < 0 || p >= cosv->dims[0])
                return kiln_run_fail(c, KILN_ERR_SHAPE, "position %lld outside the caches' %lld rows", (long long)p,
                                     (long long)cosv->dims[0]);
            for (int64_t h = 0; h < Nh; h++) {
                int64_t base = rank3 ? ((b * S + s) * Nh + h) * H : ((b * Nh + h) * S + s) * H;
                for (int64_t i = 0; i < H; i++) {
                    double x = kiln_load_f64(dt, X->data, base + i), r = x;
                    if (i < rd) {
                        int64_t j = interleaved ? i / 2 : i % half;
                        double cs = kiln_load_f64(dt, cosv->data, p * half + j), sn = kiln_load_f64(dt, sinv->data, p * half + j);
                        if (interleaved) r = i % 2 ? x * cs + kiln_load_f64(dt, X->data, base + i - 1) * sn
                                                   : x * cs - kiln_load_f64(dt, X->data, base + i + 1) * sn;
                        else r = i < half ? x * cs - kiln_load_f64(dt, X->data, base + i + half) * sn
                                          : x * cs + kiln_load_f64(dt, X->data, base + i - half) * sn;
                    }
                    kiln_store_f64(dt, Y->data, base + i, r);
                }
            }
        }
    return KILN_OK;
}

static const kiln_op_def defs[] = {
    {"com.microsoft", "GroupQueryAttention", 1, gqa_infer, gqa_run, 0,
     KILN_OP_IN(GQA_SEQLENS) | KILN_OP_IN(GQA_TOTAL) | KILN_OP_IN(GQA_POS), gqa_parse, sizeof(kiln_gqa_params)},
    {"com.microsoft", "RotaryEmbedding", 1, ms_rotary_infer, ms_rotary_run, 0, KILN_OP_IN(1)},
};

const kiln_op_table kiln_ops_llm_attention = {defs, sizeof defs / sizeof defs[0]};
