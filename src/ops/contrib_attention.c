/* contrib_attention.c - com.microsoft Attention (input [B, S, Hin] projected by one weight
 * matrix into Q, K, V; mask_index in its 1-D, 2-D, 3-D and 4-D forms; past/present state) and
 * MultiHeadAttention (query/key/value separate, packed QKV [B, S, N, 3, H], packed KV
 * [B, L, N, 2, H] or key/value already [B, N, L, H]; bias; key_padding_mask; attention_bias;
 * past_key/past_value), as ONNX Runtime's CPU kernels define them: masks become an additive
 * mask_filter_value (default -10000) and unidirectional masks the keys after each query's
 * position. Reference kernels in double; the CPU provider runs float32 through
 * src/cpu/kernels_contrib_attn.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/contrib_attn.h"
#include "ops/contrib_internal.h"
#include "ops/util.h"

/* ---- masks (shared with the fast kernel) ---- */

bool kiln_contrib_attn_mask_ok(const kiln_value *m, int64_t B, int64_t S, int64_t P, int64_t T, char *msg, int size)
{
    if (!m) return true;
    if (m->dtype != KILN_DTYPE_INT32) {
        snprintf(msg, (size_t)size, "mask must be int32, is %s", kiln_dtype_name(m->dtype));
        return false;
    }
    bool ok = false;
    switch (m->rank) {
    case 1: ok = m->dims[0] == B || m->dims[0] == 2 * B; break;
    case 2: ok = m->dims[0] == B && m->dims[1] == T; break;
    case 3: ok = m->dims[0] == B && m->dims[1] == S && m->dims[2] == T; break;
    case 4: ok = m->dims[0] == B && m->dims[1] == 1 && m->dims[2] == m->dims[3] && m->dims[3] >= T && P + S <= m->dims[2]; break;
    default: break;
    }
    if (!ok) {
        char d[96] = "";
        int at = 0;
        for (int k = 0; k < m->rank && at < (int)sizeof d - 24; k++)
            at += snprintf(d + at, sizeof d - (size_t)at, "%s%lld", k ? ", " : "", (long long)m->dims[k]);
        snprintf(msg, (size_t)size,
                 "mask is [%s]; expected [%lld] or [%lld] (lengths), [%lld, %lld], [%lld, %lld, %lld] or [%lld, 1, M, M] with M >= %lld",
                 d, (long long)B, (long long)(2 * B), (long long)B, (long long)T, (long long)B, (long long)S, (long long)T,
                 (long long)B, (long long)(P + S > T ? P + S : T));
    }
    return ok;
}

bool kiln_contrib_attn_mask_per_row(const kiln_value *mask, bool causal)
{
    return causal || (mask && mask->rank >= 3);
}

void kiln_contrib_attn_mask_fill(const kiln_value *mask, bool causal, int64_t B, int64_t S, int64_t P, int64_t T,
                            float filter, float *m)
{
    bool rows = kiln_contrib_attn_mask_per_row(mask, causal);
    int64_t R = rows ? S : 1;
    const int32_t *mi = mask ? mask->data : NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < R; s++) {
            float *row = m + (b * R + s) * T;
            for (int64_t t = 0; t < T; t++) {
                bool keep = true;
                if (mask && mask->rank == 1) {
                    keep = t < mi[b];
                    if (mask->dims[0] == 2 * B) keep = keep && t >= mi[B + b];
                } else if (mask && mask->rank == 2) {
                    keep = mi[b * T + t] > 0;
                } else if (mask && mask->rank == 3) {
                    keep = mi[(b * S + s) * T + t] > 0;
                } else if (mask) {
                    int64_t M = mask->dims[3];
                    keep = mi[(b * M + P + s) * M + t] > 0;
                }
                row[t] = keep ? 0.0f : filter;
                /* ONNX Runtime's causal mask: rows 0 .. S-2 mask the keys after P + s */
                if (causal && s < S - 1 && t > P + s) row[t] += filter;
            }
        }
}

/* ---- the attention core, in double ----
 * q [B, N, S, H], k [B, N, T, H], v [B, N, T, Hv]; mask NULL or as kiln_contrib_attn_mask_fill
 * leaves it (per_row: [B, S, T], else [B, T]); bias NULL or [B|1, N|1, S, T] (bb, bn: 0 where
 * broadcast); Y [B, S, N * Hv]; QK (optional) [B, N, S, T] receives the scores before softmax. */
typedef struct attn_core {
    const double *q, *k, *v;
    const float *mask;
    bool mask_rows;
    const kiln_value *bias;
    int64_t B, N, S, T, H, Hv;
    double scale;
} attn_core;

static kiln_status attn_core_run(kiln_run_ctx *c, const attn_core *a, kiln_value *Y, kiln_value *QK)
{
    double *p = malloc((size_t)(a->T ? a->T : 1) * sizeof *p);
    if (!p) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    const kiln_value *bias = a->bias;
    int64_t bb = bias && bias->dims[0] != 1 ? bias->dims[1] * a->S * a->T : 0, bn = bias && bias->dims[1] != 1 ? a->S * a->T : 0;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t n = 0; n < a->N; n++) {
            const double *q = a->q + (b * a->N + n) * a->S * a->H, *k = a->k + (b * a->N + n) * a->T * a->H;
            const double *v = a->v + (b * a->N + n) * a->T * a->Hv;
            for (int64_t s = 0; s < a->S; s++) {
                double mx = -INFINITY;
                for (int64_t t = 0; t < a->T; t++) {
                    double acc = 0;
                    for (int64_t d = 0; d < a->H; d++) acc += q[s * a->H + d] * k[t * a->H + d];
                    acc *= a->scale;
                    if (a->mask) acc += a->mask[(b * (a->mask_rows ? a->S : 1) + (a->mask_rows ? s : 0)) * a->T + t];
                    if (bias) acc += kiln_load_f64(bias->dtype, bias->data, b * bb + n * bn + s * a->T + t);
                    if (QK) kiln_store_f64(QK->dtype, QK->data, ((b * a->N + n) * a->S + s) * a->T + t, acc);
                    p[t] = acc;
                    if (acc > mx) mx = acc;
                }
                double sum = 0;
                for (int64_t t = 0; t < a->T; t++) sum += p[t] = exp(p[t] - mx);
                for (int64_t d = 0; d < a->Hv; d++) {
                    double acc = 0;
                    for (int64_t t = 0; t < a->T; t++) acc += p[t] * v[t * a->Hv + d];
                    kiln_store_f64(Y->dtype, Y->data, (b * a->S + s) * a->N * a->Hv + n * a->Hv + d, acc / sum);
                }
            }
        }
    free(p);
    return KILN_OK;
}

static bool is_float(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_FLOAT64;
}

/* attention_bias (optional) [B|1, N|1, S, T] */
static bool attn_bias_ok(const kiln_value *ab, int64_t B, int64_t N, int64_t S, int64_t T)
{
    return !ab || (ab->rank == 4 && (ab->dims[0] == 1 || ab->dims[0] == B) && (ab->dims[1] == 1 || ab->dims[1] == N) &&
                   ab->dims[2] == S && ab->dims[3] == T && is_float(ab->dtype));
}

double kiln_contrib_attn_scale(const kiln_node *n, int64_t H)
{
    float s = kiln_attr_float(n, "scale", 0.0f);
    return s == 0.0f ? 1.0 / sqrt((double)(float)H) : (double)s;
}

/* ---- com.microsoft Attention ----
 * input [B, S, Hin], weights [Hin, Dq + Dk + Dv], bias? [Dq + Dk + Dv], mask_index?, past?
 * [2, B, N, P, H], attention_bias? [B|1, N|1, S, P + S], past_sequence_length? ->
 * output [B, S, Dv], present? [2, B, N, P + S, H]. */

enum { A_X = KILN_ATTN_X, A_W = KILN_ATTN_W, A_BIAS = KILN_ATTN_BIAS, A_MASK = KILN_ATTN_MASK, A_PAST = KILN_ATTN_PAST,
       A_ABIAS = KILN_ATTN_ABIAS };

/* Dq, Dk, Dv from qkv_hidden_sizes or a third of the weights' columns each. */
static bool attn_sizes(const kiln_node *n, int64_t cols, int64_t *dq, int64_t *dk, int64_t *dv)
{
    int cnt = 0;
    const int64_t *q = kiln_attr_ints(n, "qkv_hidden_sizes", &cnt);
    if (q && cnt) {
        if (cnt != 3) return false;
        *dq = q[0], *dk = q[1], *dv = q[2];
        return *dq > 0 && *dk > 0 && *dv > 0 && *dq == *dk;
    }
    *dq = *dk = *dv = cols / 3;
    return cols % 3 == 0 && cols > 0;
}

static kiln_status contrib_attention_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, A_X), *w = kiln_infer_in(c, A_W), *past = kiln_infer_in(c, A_PAST);
    if (!x || !w) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input and weights");
    int64_t N = kiln_attr_int(n, "num_heads", 0);
    if (N <= 0) return kiln_infer_fail(c, KILN_ERR_MODEL, "num_heads must be positive, is %lld", (long long)N);
    if (kiln_attr_int(n, "do_rotary", 0) || kiln_attr_int(n, "past_present_share_buffer", 0))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "do_rotary and past_present_share_buffer are not supported");
    if (x->dtype && !is_float(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input is %s, expected a float type", kiln_dtype_name(x->dtype));
    if (x->rank >= 0 && x->rank != 3) return kiln_infer_fail(c, KILN_ERR_SHAPE, "input must be 3-D [batch, sequence, hidden], has rank %d", x->rank);
    if (w->rank >= 0 && w->rank != 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "weights must be 2-D, has rank %d", w->rank);
    kiln_dimtab *t = kiln_infer_dims(c);
    kiln_dim B = x->rank == 3 ? x->dims[0] : kiln_infer_fresh(c, "batch"), S = x->rank == 3 ? x->dims[1] : kiln_infer_fresh(c, "sequence");
    if (x->rank == 3 && w->rank == 2) KILN_TRY(kiln_infer_require_equal(c, w->dims[0], x->dims[2], "weights rows and input hidden size"));
    kiln_dim dv, dk;
    int cnt = 0;
    const int64_t *q = kiln_attr_ints(n, "qkv_hidden_sizes", &cnt);
    if (q && cnt) {
        if (cnt != 3 || q[0] <= 0 || q[1] != q[0] || q[2] <= 0)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "qkv_hidden_sizes must be 3 positive sizes with Q's equal to K's");
        if (w->rank == 2) KILN_TRY(kiln_infer_require_equal(c, w->dims[1], kiln_dim_const(q[0] + q[1] + q[2]), "weights columns and the sum of qkv_hidden_sizes"));
        dk = kiln_dim_const(q[1]);
        dv = kiln_dim_const(q[2]);
    } else {
        dk = dv = w->rank == 2 ? kiln_dim_floordiv(t, w->dims[1], kiln_dim_const(3)) : kiln_infer_fresh(c, "hidden");
    }
    kiln_dim y[3] = {B, S, dv};
    KILN_TRY(kiln_infer_set_out(c, 0, x->dtype, 3, y));
    kiln_dim P = past && past->rank == 5 ? past->dims[3] : kiln_dim_const(0);
    if (past && past->rank >= 0 && past->rank != 5) return kiln_infer_fail(c, KILN_ERR_SHAPE, "past must be 5-D [2, batch, heads, past, head_size], has rank %d", past->rank);
    kiln_dim pd[5] = {kiln_dim_const(2), B, kiln_dim_const(N), kiln_dim_add(t, P, S), kiln_dim_floordiv(t, dk, kiln_dim_const(N))};
    return kiln_infer_set_out(c, 1, x->dtype, 5, pd);
}

kiln_status kiln_contrib_attention_check(const kiln_node *n, const kiln_value *X, const kiln_value *W,
                                         const kiln_value *bias, const kiln_value *mask, const kiln_value *past,
                                         const kiln_value *ab, kiln_contrib_attention_dims *d, char *msg, int size)
{
    memset(d, 0, sizeof *d);
    int64_t N = kiln_attr_int(n, "num_heads", 0), Dq, Dk, Dv;
    if (X->rank != 3 || !W || W->rank != 2 || W->dims[0] != X->dims[2]) {
        snprintf(msg, (size_t)size, "input must be [B, S, Hin] and weights [Hin, 3 * hidden] (ranks %d, %d)", X->rank,
                 W ? W->rank : -1);
        return KILN_ERR_SHAPE;
    }
    if (N <= 0 || !attn_sizes(n, W->dims[1], &Dq, &Dk, &Dv) || Dq + Dk + Dv != W->dims[1] || Dq % N || Dv % N) {
        snprintf(msg, (size_t)size, "weights' %lld columns do not split into Q, K, V of num_heads %lld heads",
                 (long long)W->dims[1], (long long)N);
        return KILN_ERR_SHAPE;
    }
    int64_t B = X->dims[0], S = X->dims[1], D = W->dims[1], H = Dq / N, Hv = Dv / N;
    if (bias && (bias->rank != 1 || bias->dims[0] != D)) {
        snprintf(msg, (size_t)size, "bias must be [%lld]", (long long)D);
        return KILN_ERR_SHAPE;
    }
    int64_t P = 0;
    if (past) {
        if (past->rank != 5 || past->dims[0] != 2 || past->dims[1] != B || past->dims[2] != N || past->dims[4] != H || H != Hv) {
            snprintf(msg, (size_t)size, "past must be [2, %lld, %lld, past, %lld] (and Q, K, V of one head size)",
                     (long long)B, (long long)N, (long long)H);
            return KILN_ERR_SHAPE;
        }
        P = past->dims[3];
    }
    int64_t T = P + S;
    if (!kiln_contrib_attn_mask_ok(mask, B, S, P, T, msg, size)) return KILN_ERR_SHAPE;
    if (!attn_bias_ok(ab, B, N, S, T)) {
        snprintf(msg, (size_t)size, "attention_bias must be [%lld or 1, %lld or 1, %lld, %lld]", (long long)B,
                 (long long)N, (long long)S, (long long)T);
        return KILN_ERR_SHAPE;
    }
    *d = (kiln_contrib_attention_dims){.B = B, .S = S, .Hin = X->dims[2], .D = D, .Dq = Dq, .Dk = Dk, .Dv = Dv, .N = N,
                                       .H = H, .Hv = Hv, .P = P, .T = T,
                                       .causal = kiln_attr_int(n, "unidirectional", 0) && S > 1};
    return KILN_OK;
}

static kiln_status contrib_attention_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, A_X), *W = kiln_run_in(c, A_W), *bias = kiln_run_in(c, A_BIAS),
                     *mask = kiln_run_in(c, A_MASK), *past = kiln_run_in(c, A_PAST), *ab = kiln_run_in(c, A_ABIAS);
    kiln_value *Y = kiln_run_out(c, 0), *present = kiln_run_out(c, 1);
    kiln_contrib_attention_dims ad;
    char msg[256];
    kiln_status chk = kiln_contrib_attention_check(n, X, W, bias, mask, past, ab, &ad, msg, sizeof msg);
    if (chk) return kiln_run_fail(c, chk, "%s", msg);
    int64_t B = ad.B, S = ad.S, Hin = ad.Hin, D = ad.D, Dq = ad.Dq, Dk = ad.Dk, N = ad.N, H = ad.H, Hv = ad.Hv, P = ad.P,
            T = ad.T;
    bool causal = ad.causal;
    size_t nq = (size_t)(B * N * S * H), nk = (size_t)(B * N * T * H), nv = (size_t)(B * N * T * Hv);
    double *q = malloc((nq + nk + nv + 1) * sizeof *q);
    float *m = mask || causal ? malloc((size_t)(B * S * T + 1) * sizeof *m) : NULL;
    kiln_status st = KILN_OK;
    if (!q || ((mask || causal) && !m)) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    double *k = q + nq, *v = k + nk;
    /* projection: column j of Q | K | V for token (b, s) */
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t j = 0; j < D; j++) {
                double acc = bias ? kiln_load_f64(bias->dtype, bias->data, j) : 0.0;
                for (int64_t i = 0; i < Hin; i++)
                    acc += kiln_load_f64(X->dtype, X->data, (b * S + s) * Hin + i) * kiln_load_f64(W->dtype, W->data, i * D + j);
                acc = kiln_round_to(X->dtype, acc);
                if (j < Dq) q[((b * N + j / H) * S + s) * H + j % H] = acc;
                else if (j < Dq + Dk) k[((b * N + (j - Dq) / H) * T + P + s) * H + (j - Dq) % H] = acc;
                else v[((b * N + (j - Dq - Dk) / Hv) * T + P + s) * Hv + (j - Dq - Dk) % Hv] = acc;
            }
    for (int64_t bn = 0; bn < B * N; bn++)
        for (int64_t p = 0; p < P; p++)
            for (int64_t d = 0; d < H; d++) {
                k[(bn * T + p) * H + d] = kiln_load_f64(past->dtype, past->data, (bn * P + p) * H + d);
                v[(bn * T + p) * H + d] = kiln_load_f64(past->dtype, past->data, ((B * N + bn) * P + p) * H + d);
            }
    if (present)
        for (size_t i = 0; i < nk; i++) {
            kiln_store_f64(present->dtype, present->data, (int64_t)i, k[i]);
            kiln_store_f64(present->dtype, present->data, (int64_t)(nk + i), v[i]);
        }
    if (m) kiln_contrib_attn_mask_fill(mask, causal, B, S, P, T, kiln_attr_float(n, "mask_filter_value", -10000.0f), m);
    attn_core a = {q, k, v, m, kiln_contrib_attn_mask_per_row(mask, causal), ab, B, N, S, T, H, Hv, kiln_contrib_attn_scale(n, H)};
    st = attn_core_run(c, &a, Y, NULL);
out:
    free(q);
    free(m);
    return st;
}

/* ---- com.microsoft MultiHeadAttention ----
 * query [B, S, D] (or packed QKV [B, S, N, 3, H]), key? [B, L, D] / [B, N, L, H] / packed KV
 * [B, L, N, 2, H], value? [B, L, Dv] / [B, N, L, Hv], bias? [D + D + Dv], key_padding_mask?,
 * attention_bias?, past_key? [B, N, P, H], past_value? [B, N, P, Hv] -> output [B, S, Dv],
 * present_key? [B, N, P + L, H], present_value? [B, N, P + L, Hv], qk? [B, N, S, P + L]. */

enum {
    M_Q = KILN_MHA_Q, M_K = KILN_MHA_K, M_V = KILN_MHA_V, M_BIAS = KILN_MHA_BIAS, M_MASK = KILN_MHA_MASK,
    M_ABIAS = KILN_MHA_ABIAS, M_PK = KILN_MHA_PK, M_PV = KILN_MHA_PV, M_CACHE = KILN_MHA_CACHE
};
#define MHA_QKV KILN_MHA_QKV
#define MHA_PACKED_QKV KILN_MHA_PACKED_QKV
#define MHA_PACKED_KV KILN_MHA_PACKED_KV
#define MHA_KV_BNSH KILN_MHA_KV_BNSH
typedef kiln_contrib_mha_dims mha_dims;

static kiln_status contrib_mha_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *q = kiln_infer_in(c, M_Q), *k = kiln_infer_in(c, M_K), *v = kiln_infer_in(c, M_V),
                    *pk = kiln_infer_in(c, M_PK);
    if (!q) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs query");
    int64_t N = kiln_attr_int(n, "num_heads", 0);
    if (N <= 0) return kiln_infer_fail(c, KILN_ERR_MODEL, "num_heads must be positive, is %lld", (long long)N);
    if (q->dtype && !is_float(q->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "query is %s, expected a float type", kiln_dtype_name(q->dtype));
    if (kiln_infer_in(c, M_CACHE)) return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "cache_indirection (beam search) is not supported");
    if (q->rank < 0 || (k && k->rank < 0) || (v && v->rank < 0)) {
        for (int i = 0; i < 4; i++) KILN_TRY(kiln_infer_set_out_unknown(c, i, q->dtype));
        return KILN_OK;
    }
    kiln_dimtab *t = kiln_infer_dims(c);
    kiln_dim Nd = kiln_dim_const(N), B = q->dims[0], S = q->dims[1], L, H, Hv;
    if (q->rank == 5) { /* packed QKV */
        if (k || v) return kiln_infer_fail(c, KILN_ERR_MODEL, "packed QKV query takes no key or value");
        KILN_TRY(kiln_infer_require_equal(c, q->dims[2], Nd, "packed QKV heads and num_heads"));
        KILN_TRY(kiln_infer_require_equal(c, q->dims[3], kiln_dim_const(3), "packed QKV dim 3"));
        L = S, H = Hv = q->dims[4];
    } else if (q->rank == 3) {
        if (!k) return kiln_infer_fail(c, KILN_ERR_MODEL, "3-D query needs key (and value unless key is packed KV)");
        H = kiln_dim_floordiv(t, q->dims[2], Nd);
        if (k->rank == 5) {
            if (v) return kiln_infer_fail(c, KILN_ERR_MODEL, "packed KV key takes no value");
            L = k->dims[1], Hv = k->dims[4];
        } else if (k->rank == 3 && v && v->rank == 3) {
            L = k->dims[1], Hv = kiln_dim_floordiv(t, v->dims[2], Nd);
            KILN_TRY(kiln_infer_require_equal(c, k->dims[2], q->dims[2], "key and query hidden sizes"));
        } else if (k->rank == 4 && v && v->rank == 4) {
            L = k->dims[2], Hv = v->dims[3];
        } else {
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "key (rank %d) and value (rank %d) must both be 3-D or 4-D, or key packed KV",
                                   k->rank, v ? v->rank : -1);
        }
    } else {
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "query must be 3-D or packed QKV 5-D, has rank %d", q->rank);
    }
    kiln_dim total = pk && pk->rank == 4 ? kiln_dim_add(t, pk->dims[2], L) : L;
    kiln_dim y[3] = {B, S, kiln_dim_mul(t, Nd, Hv)}, pkd[4] = {B, Nd, total, H}, pvd[4] = {B, Nd, total, Hv},
             qk[4] = {B, Nd, S, total};
    KILN_TRY(kiln_infer_set_out(c, 0, q->dtype, 3, y));
    KILN_TRY(kiln_infer_set_out(c, 1, q->dtype, 4, pkd));
    KILN_TRY(kiln_infer_set_out(c, 2, q->dtype, 4, pvd));
    return kiln_infer_set_out(c, 3, q->dtype, 4, qk);
}

/* Element d of head n, position s of the query (which 0), key (1) or value (2) for form f;
 * bias added where ONNX Runtime adds it (not to key/value given as [B, N, L, H]). */
static double mha_load(const mha_dims *m, int which, const kiln_value *x, const kiln_value *bias, int64_t b, int64_t n,
                       int64_t s, int64_t d)
{
    int64_t N = m->N, H = m->H, Hv = m->Hv, hd = which == 2 ? Hv : H, i;
    int64_t len = which == 0 ? m->S : m->L;
    if (m->form == MHA_PACKED_QKV) i = (((b * len + s) * N + n) * 3 + which) * H + d;
    else if (which == 0) i = (b * len + s) * N * H + n * H + d;
    else if (m->form == MHA_PACKED_KV) i = (((b * len + s) * N + n) * 2 + which - 1) * H + d;
    else if (m->form == MHA_KV_BNSH) i = ((b * N + n) * len + s) * hd + d;
    else i = (b * len + s) * N * hd + n * hd + d;
    double y = kiln_load_f64(x->dtype, x->data, i);
    if (bias && m->form != MHA_KV_BNSH) y += kiln_load_f64(bias->dtype, bias->data, (which ? N * H : 0) + (which == 2 ? N * H : 0) + n * hd + d);
    else if (bias && which == 0) y += kiln_load_f64(bias->dtype, bias->data, n * H + d);
    return kiln_round_to(x->dtype, y);
}

kiln_status kiln_contrib_mha_check(const kiln_node *n, const kiln_value *const *in, kiln_contrib_mha_dims *d, char *msg,
                                   int size)
{
    const kiln_value *Q = in[M_Q], *K = in[M_K], *V = in[M_V], *bias = in[M_BIAS], *mask = in[M_MASK], *ab = in[M_ABIAS],
                     *pk = in[M_PK], *pv = in[M_PV];
    mha_dims m = {.N = kiln_attr_int(n, "num_heads", 0), .B = Q->rank >= 1 ? Q->dims[0] : 0,
                  .S = Q->rank >= 2 ? Q->dims[1] : 0};
    int64_t N = m.N;
    bool ok = N > 0;
    if (ok && Q->rank == 5) {
        m.form = MHA_PACKED_QKV, m.L = m.S, m.H = m.Hv = Q->dims[4];
        ok = !K && !V && Q->dims[2] == N && Q->dims[3] == 3;
    } else if (ok && Q->rank == 3 && K && Q->dims[2] % N == 0) {
        m.H = Q->dims[2] / N;
        if (K->rank == 5) {
            m.form = MHA_PACKED_KV, m.L = K->dims[1], m.Hv = K->dims[4];
            ok = !V && K->dims[0] == m.B && K->dims[2] == N && K->dims[3] == 2 && K->dims[4] == m.H;
        } else if (K->rank == 3 && V && V->rank == 3) {
            m.form = MHA_QKV, m.L = K->dims[1], m.Hv = V->dims[2] / N;
            ok = K->dims[0] == m.B && V->dims[0] == m.B && V->dims[1] == m.L && K->dims[2] == Q->dims[2] && V->dims[2] % N == 0;
        } else if (K->rank == 4 && V && V->rank == 4) {
            m.form = MHA_KV_BNSH, m.L = K->dims[2], m.Hv = V->dims[3];
            ok = K->dims[0] == m.B && K->dims[1] == N && K->dims[3] == m.H && V->dims[0] == m.B && V->dims[1] == N &&
                 V->dims[2] == m.L;
        } else {
            ok = false;
        }
    } else {
        ok = false;
    }
    if (!ok) {
        snprintf(msg, (size_t)size,
                 "query (rank %d), key (rank %d) and value (rank %d) fit none of [B, S, D] + [B, L, D] + [B, L, Dv], "
                 "packed QKV [B, S, %lld, 3, H], packed KV [B, L, %lld, 2, H] or key/value [B, %lld, L, H]",
                 Q->rank, K ? K->rank : -1, V ? V->rank : -1, (long long)N, (long long)N, (long long)N);
        return KILN_ERR_SHAPE;
    }
    int64_t B = m.B, S = m.S, L = m.L, H = m.H, Hv = m.Hv;
    if (K && K->dtype != Q->dtype) {
        snprintf(msg, (size_t)size, "key and query dtypes differ");
        return KILN_ERR_MODEL;
    }
    if (bias && (bias->rank != 1 || bias->dims[0] != N * (2 * H + Hv))) {
        snprintf(msg, (size_t)size, "bias must be [%lld]", (long long)(N * (2 * H + Hv)));
        return KILN_ERR_SHAPE;
    }
    if ((pk == NULL) != (pv == NULL)) {
        snprintf(msg, (size_t)size, "past_key and past_value come together");
        return KILN_ERR_MODEL;
    }
    int64_t P = 0;
    if (pk) {
        if (m.form == MHA_KV_BNSH) {
            snprintf(msg, (size_t)size, "past_key with key/value in [B, N, L, H] is not defined");
            return KILN_ERR_MODEL;
        }
        if (pk->rank != 4 || pv->rank != 4 || pk->dims[0] != B || pk->dims[1] != N || pk->dims[3] != H || pv->dims[0] != B ||
            pv->dims[1] != N || pv->dims[2] != pk->dims[2] || pv->dims[3] != Hv) {
            snprintf(msg, (size_t)size, "past_key/past_value must be [%lld, %lld, P, %lld] / [%lld, %lld, P, %lld]",
                     (long long)B, (long long)N, (long long)H, (long long)B, (long long)N, (long long)Hv);
            return KILN_ERR_SHAPE;
        }
        P = pk->dims[2];
    }
    int64_t T = P + L;
    /* the mask's message after "key_padding_" */
    if (size > 12 && !kiln_contrib_attn_mask_ok(mask, B, S, P, T, msg + 12, size - 12)) {
        memcpy(msg, "key_padding_", 12);
        return KILN_ERR_SHAPE;
    }
    if (!attn_bias_ok(ab, B, N, S, T)) {
        snprintf(msg, (size_t)size, "attention_bias must be [%lld or 1, %lld or 1, %lld, %lld]", (long long)B,
                 (long long)N, (long long)S, (long long)T);
        return KILN_ERR_SHAPE;
    }
    m.P = P, m.T = T, m.causal = kiln_attr_int(n, "unidirectional", 0) && S > 1;
    *d = m;
    return KILN_OK;
}

static kiln_status contrib_mha_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *in[M_CACHE + 1];
    for (int i = 0; i <= M_CACHE; i++) in[i] = kiln_run_in(c, i);
    const kiln_value *Q = in[M_Q], *K = in[M_K], *V = in[M_V], *bias = in[M_BIAS], *mask = in[M_MASK], *ab = in[M_ABIAS],
                     *pk = in[M_PK], *pv = in[M_PV];
    kiln_value *Y = kiln_run_out(c, 0), *PK = kiln_run_out(c, 1), *PV = kiln_run_out(c, 2), *QK = kiln_run_out(c, 3);
    mha_dims m;
    char msg[280];
    kiln_status chk = kiln_contrib_mha_check(n, in, &m, msg, sizeof msg);
    if (chk) return kiln_run_fail(c, chk, "%s", msg);
    int64_t B = m.B, S = m.S, N = m.N, H = m.H, Hv = m.Hv, P = m.P, T = m.T;
    bool causal = m.causal;
    size_t nq = (size_t)(B * N * S * H), nk = (size_t)(B * N * T * H), nv = (size_t)(B * N * T * Hv);
    double *q = malloc((nq + nk + nv + 1) * sizeof *q);
    float *mk = mask || causal ? malloc((size_t)(B * S * T + 1) * sizeof *mk) : NULL;
    kiln_status st = KILN_OK;
    if (!q || ((mask || causal) && !mk)) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    double *k = q + nq, *v = k + nk;
    const kiln_value *kx = m.form == MHA_PACKED_QKV ? Q : K, *vx = m.form == MHA_PACKED_QKV || m.form == MHA_PACKED_KV ? kx : V;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < N; h++) {
            int64_t bn = b * N + h;
            for (int64_t s = 0; s < S; s++)
                for (int64_t d = 0; d < H; d++) q[(bn * S + s) * H + d] = mha_load(&m, 0, Q, bias, b, h, s, d);
            for (int64_t t = 0; t < T; t++) {
                for (int64_t d = 0; d < H; d++)
                    k[(bn * T + t) * H + d] = t < P ? kiln_load_f64(pk->dtype, pk->data, (bn * P + t) * H + d)
                                                    : mha_load(&m, 1, kx, bias, b, h, t - P, d);
                for (int64_t d = 0; d < Hv; d++)
                    v[(bn * T + t) * Hv + d] = t < P ? kiln_load_f64(pv->dtype, pv->data, (bn * P + t) * Hv + d)
                                                     : mha_load(&m, 2, vx, bias, b, h, t - P, d);
            }
        }
    for (size_t i = 0; PK && i < nk; i++) kiln_store_f64(PK->dtype, PK->data, (int64_t)i, k[i]);
    for (size_t i = 0; PV && i < nv; i++) kiln_store_f64(PV->dtype, PV->data, (int64_t)i, v[i]);
    if (mk) kiln_contrib_attn_mask_fill(mask, causal, B, S, P, T, kiln_attr_float(n, "mask_filter_value", -10000.0f), mk);
    attn_core a = {q, k, v, mk, kiln_contrib_attn_mask_per_row(mask, causal), ab, B, N, S, T, H, Hv, kiln_contrib_attn_scale(n, H)};
    st = attn_core_run(c, &a, Y, QK);
out:
    free(q);
    free(mk);
    return st;
}

#define MS "com.microsoft"
static const kiln_op_def defs[] = {
    {MS, "Attention", 1, contrib_attention_infer, contrib_attention_run},
    {MS, "MultiHeadAttention", 1, contrib_mha_infer, contrib_mha_run},
};

const kiln_op_table kiln_ops_contrib_attention = {defs, sizeof defs / sizeof defs[0]};
