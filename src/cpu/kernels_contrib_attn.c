/* kernels_contrib_attn.c - com.microsoft Attention and MultiHeadAttention on float32: the QKV
 * projection on the packed sgemm (weights packed at compile time, bias in its epilogue), the
 * masks made additive once per call (kiln_contrib_attn_mask_fill, as the reference does), and the
 * attention core on the ONNX Attention kernel (kiln_cpu_attn_f32) reading Q, K and V in place
 * through strides. Covered: no past state, no present or qk outputs; anything else, and every
 * shape the reference would refuse, runs the reference kernel. */
#include <math.h>
#include <string.h>

#include "core/scratch.h"
#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "ops/contrib_attn.h"
#include "ops/util.h"

/* Q, K or V of one head as the attention kernel reads it: (b, h, s, 0) at p + b*sb + h*sh + s*ss. */
typedef struct view {
    const float *p;
    int64_t sb, sh, ss;
} view;

/* The additive mask (and attention_bias) as kiln_cpu_attn wants it, in scratch (*buf, to put
 * back), its strides into a. ab is [B|1, N|1, S, T] or NULL. */
static kiln_status mask_prepare(kiln_run_ctx *c, const kiln_value *mask, bool causal, const kiln_value *ab, int64_t B,
                                int64_t N, int64_t S, int64_t T, float filter, kiln_cpu_attn *a, float **buf)
{
    *buf = NULL;
    if (!mask && !causal && !ab) return KILN_OK;
    bool rows = kiln_contrib_attn_mask_per_row(mask, causal);
    int64_t R = rows ? S : 1;
    size_t nm = (size_t)(B * R * T), nb = ab ? (size_t)(B * N * S * T) : 0;
    float *m = kiln_scratch_get(kiln_run_scratch(c), (nm + nb + 1) * sizeof *m);
    if (!m) return KILN_ERR_NOMEM;
    *buf = m;
    if (mask || causal) kiln_contrib_attn_mask_fill(mask, causal, B, S, 0, T, filter, m);
    if (!ab) {
        a->mask = m, a->m_b = R * T, a->m_h = 0, a->m_s = rows ? T : 0, a->m_len = T;
        return KILN_OK;
    }
    /* bias + mask, [B, N, S, T] */
    float *f = m + nm;
    const float *x = ab->data;
    int64_t bb = ab->dims[0] != 1 ? ab->dims[1] * S * T : 0, bn = ab->dims[1] != 1 ? S * T : 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < N; h++)
            for (int64_t s = 0; s < S; s++) {
                float *o = f + ((b * N + h) * S + s) * T;
                const float *src = x + b * bb + h * bn + s * T, *mr = mask || causal ? m + (b * R + (rows ? s : 0)) * T : NULL;
                for (int64_t t = 0; t < T; t++) o[t] = src[t] + (mr ? mr[t] : 0.0f);
            }
    a->mask = f, a->m_b = N * S * T, a->m_h = S * T, a->m_s = T, a->m_len = T;
    return KILN_OK;
}

static float scale_of(const kiln_node *n, int64_t H)
{
    float s = kiln_attr_float(n, "scale", 0.0f);
    return s == 0.0f ? 1.0f / sqrtf((float)H) : s;
}

static void set_views(kiln_cpu_attn *a, view q, view k, view v)
{
    a->q = q.p, a->q_b = q.sb, a->q_h = q.sh, a->q_s = q.ss;
    a->k = k.p, a->k_b = k.sb, a->k_h = k.sh, a->k_s = k.ss;
    a->v = v.p, a->v_b = v.sb, a->v_h = v.sh, a->v_s = v.ss;
}

static bool f32(const kiln_value *v) { return !v || v->dtype == KILN_DTYPE_FLOAT32; }

/* attention_bias [B|1, N|1, S, T] float32, or absent */
static bool ab_ok(const kiln_value *ab, int64_t B, int64_t N, int64_t S, int64_t T)
{
    return !ab || (ab->dtype == KILN_DTYPE_FLOAT32 && ab->rank == 4 && (ab->dims[0] == 1 || ab->dims[0] == B) &&
                   (ab->dims[1] == 1 || ab->dims[1] == N) && ab->dims[2] == S && ab->dims[3] == T);
}

/* ---- Attention: input [B, S, Hin] x weights [Hin, Dq + Dk + Dv] + bias, then the core ---- */
static kiln_status attention_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1), *bias = kiln_run_in(c, 2), *mask = kiln_run_in(c, 3),
                     *ab = kiln_run_in(c, 5);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t N = kiln_attr_int(n, "num_heads", 0);
    const kiln_gemm_packed_b *pb = n->kernel_state && W == n->in[1]->init ? n->kernel_state : NULL;
    if (!Y || kiln_run_in(c, 4) || kiln_run_has_out(c, 1) || X->rank != 3 || !W || W->rank != 2 || W->dims[0] != X->dims[2] ||
        !f32(X) || !f32(W) || !f32(bias) || N <= 0 || (bias && (bias->rank != 1 || bias->dims[0] != W->dims[1])))
        return kiln_cpu_reference(c);
    int cnt = 0;
    const int64_t *qkv = kiln_attr_ints(n, "qkv_hidden_sizes", &cnt);
    int64_t D = W->dims[1], Dq = D / 3, Dv = D / 3;
    if (qkv && cnt) {
        if (cnt != 3 || qkv[0] != qkv[1] || qkv[0] + qkv[1] + qkv[2] != D) return kiln_cpu_reference(c);
        Dq = qkv[0], Dv = qkv[2];
    } else if (D % 3) {
        return kiln_cpu_reference(c);
    }
    int64_t B = X->dims[0], S = X->dims[1], Hin = X->dims[2];
    if (Dq <= 0 || Dv <= 0 || Dq % N || Dv % N || !ab_ok(ab, B, N, S, S)) return kiln_cpu_reference(c);
    char msg[256];
    if (!kiln_contrib_attn_mask_ok(mask, B, S, 0, S, msg, sizeof msg)) return kiln_cpu_reference(c);
    if (!Y->numel) return KILN_OK;
    int64_t H = Dq / N, Hv = Dv / N;
    struct kiln_scratch *scr = kiln_run_scratch(c);
    float *qkvb = kiln_scratch_get(scr, (size_t)(B * S * D) * sizeof *qkvb), *mbuf = NULL;
    if (!qkvb) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    kiln_gemm_ctx g = {.pool = kiln_run_threadpool(c), .scratch = scr};
    kiln_gemm_epilogue ep = {.bias = bias ? bias->data : NULL};
    kiln_status st = pb ? kiln_sgemm_packed(&g, false, B * S, 1.0f, X->data, Hin, pb, 0.0f, qkvb, D, &ep)
                        : kiln_sgemm_ex(&g, false, false, B * S, D, Hin, 1.0f, X->data, Hin, W->data, D, 0.0f, qkvb, D, &ep);
    kiln_cpu_attn a = {.y = Y->data, .B = B, .Hq = N, .Hkv = N, .Sq = S, .total = S, .Dk = H, .Dv = Hv,
                       .y_b = S * N * Hv, .y_h = Hv, .y_s = N * Hv, .scale = scale_of(n, H)};
    set_views(&a, (view){qkvb, S * D, H, D}, (view){qkvb + Dq, S * D, H, D}, (view){qkvb + 2 * Dq, S * D, Hv, D});
    if (!st)
        st = mask_prepare(c, mask, kiln_attr_int(n, "unidirectional", 0) && S > 1, ab, B, N, S, S,
                          kiln_attr_float(n, "mask_filter_value", -10000.0f), &a, &mbuf);
    if (!st) st = kiln_cpu_attn_f32(c, &a);
    kiln_scratch_put(scr, mbuf);
    kiln_scratch_put(scr, qkvb);
    return st ? kiln_run_fail(c, st, "attention failed (%s)", kiln_status_name(st)) : KILN_OK;
}

/* ---- MultiHeadAttention: Q, K, V read in place (separate [B, S, D], packed QKV or KV, or K/V
 * [B, N, L, H]); with a bias, first copied with it added ---- */

/* dst [B, len, N, hd] = src view + bias[off + n*hd + d] */
static void copy_bias(float *dst, view src, const float *bias, int64_t B, int64_t len, int64_t N, int64_t hd)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < len; s++)
            for (int64_t h = 0; h < N; h++) {
                const float *x = src.p + b * src.sb + h * src.sh + s * src.ss;
                float *y = dst + ((b * len + s) * N + h) * hd;
                for (int64_t d = 0; d < hd; d++) y[d] = x[d] + (bias ? bias[h * hd + d] : 0.0f);
            }
}

static kiln_status mha_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *Q = kiln_run_in(c, 0), *K = kiln_run_in(c, 1), *V = kiln_run_in(c, 2), *bias = kiln_run_in(c, 3),
                     *mask = kiln_run_in(c, 4), *ab = kiln_run_in(c, 5);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t N = kiln_attr_int(n, "num_heads", 0);
    if (!Y || kiln_run_in(c, 6) || kiln_run_in(c, 7) || kiln_run_has_out(c, 1) || kiln_run_has_out(c, 2) ||
        kiln_run_has_out(c, 3) || N <= 0 || !f32(Q) || !f32(K) || !f32(V) || !f32(bias))
        return kiln_cpu_reference(c);
    int64_t B = Q->dims[0], S = Q->rank >= 2 ? Q->dims[1] : 0, L, H, Hv;
    view q, k, v;
    bool bnsh = false;
    if (Q->rank == 5 && !K && !V && Q->dims[2] == N && Q->dims[3] == 3) {
        L = S, H = Hv = Q->dims[4];
        int64_t ss = N * 3 * H;
        q = (view){Q->data, S * ss, 3 * H, ss}, k = (view){q.p + H, S * ss, 3 * H, ss}, v = (view){q.p + 2 * H, S * ss, 3 * H, ss};
    } else if (Q->rank == 3 && K && Q->dims[2] % N == 0) {
        H = Q->dims[2] / N;
        q = (view){Q->data, S * N * H, H, N * H};
        if (K->rank == 5 && !V && K->dims[0] == B && K->dims[2] == N && K->dims[3] == 2 && K->dims[4] == H) {
            L = K->dims[1], Hv = H;
            int64_t ss = N * 2 * H;
            k = (view){K->data, L * ss, 2 * H, ss}, v = (view){k.p + H, L * ss, 2 * H, ss};
        } else if (K->rank == 3 && V && V->rank == 3 && K->dims[0] == B && V->dims[0] == B && K->dims[1] == V->dims[1] &&
                   K->dims[2] == N * H && V->dims[2] % N == 0) {
            L = K->dims[1], Hv = V->dims[2] / N;
            k = (view){K->data, L * N * H, H, N * H}, v = (view){V->data, L * N * Hv, Hv, N * Hv};
        } else if (K->rank == 4 && V && V->rank == 4 && K->dims[0] == B && K->dims[1] == N && K->dims[3] == H &&
                   V->dims[0] == B && V->dims[1] == N && V->dims[2] == K->dims[2]) {
            L = K->dims[2], Hv = V->dims[3], bnsh = true;
            k = (view){K->data, N * L * H, L * H, H}, v = (view){V->data, N * L * Hv, L * Hv, Hv};
        } else {
            return kiln_cpu_reference(c);
        }
    } else {
        return kiln_cpu_reference(c);
    }
    char msg[256];
    if ((bias && (bias->rank != 1 || bias->dims[0] != N * (2 * H + Hv))) || !ab_ok(ab, B, N, S, L) ||
        !kiln_contrib_attn_mask_ok(mask, B, S, 0, L, msg, sizeof msg))
        return kiln_cpu_reference(c);
    if (!Y->numel) return KILN_OK;
    if (!L || !H) return kiln_cpu_reference(c);
    struct kiln_scratch *scr = kiln_run_scratch(c);
    float *tmp = NULL, *mbuf = NULL;
    if (bias) { /* Q (and K, V unless [B, N, L, H]) with the bias added, as [B, len, N, hd] */
        size_t nq = (size_t)(B * S * N * H), nk = bnsh ? 0 : (size_t)(B * L * N * H), nv = bnsh ? 0 : (size_t)(B * L * N * Hv);
        tmp = kiln_scratch_get(scr, (nq + nk + nv + 1) * sizeof *tmp);
        if (!tmp) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        const float *bs = bias->data;
        copy_bias(tmp, q, bs, B, S, N, H);
        q = (view){tmp, S * N * H, H, N * H};
        if (!bnsh) {
            copy_bias(tmp + nq, k, bs + N * H, B, L, N, H);
            copy_bias(tmp + nq + nk, v, bs + 2 * N * H, B, L, N, Hv);
            k = (view){tmp + nq, L * N * H, H, N * H}, v = (view){tmp + nq + nk, L * N * Hv, Hv, N * Hv};
        }
    }
    kiln_cpu_attn a = {.y = Y->data, .B = B, .Hq = N, .Hkv = N, .Sq = S, .total = L, .Dk = H, .Dv = Hv,
                       .y_b = S * N * Hv, .y_h = Hv, .y_s = N * Hv, .scale = scale_of(n, H)};
    set_views(&a, q, k, v);
    kiln_status st = mask_prepare(c, mask, kiln_attr_int(n, "unidirectional", 0) && S > 1, ab, B, N, S, L,
                                  kiln_attr_float(n, "mask_filter_value", -10000.0f), &a, &mbuf);
    if (!st) st = kiln_cpu_attn_f32(c, &a);
    kiln_scratch_put(scr, mbuf);
    kiln_scratch_put(scr, tmp);
    return st ? kiln_run_fail(c, st, "attention failed (%s)", kiln_status_name(st)) : KILN_OK;
}

static void packed_free(void *p) { kiln_gemm_packed_b_free(p); }

static kiln_kernel_fn select_mha(kiln_node *n) { return n->n_in >= 1 && kiln_ir_is_f32(n->in[0]) ? mha_run : NULL; }

static kiln_kernel_fn select_attention(kiln_node *n)
{
    if (n->n_in < 2 || !kiln_ir_is_f32(n->in[0])) return NULL;
    /* constant weights packed once (kept: the reference and `kiln verify` read them too) */
    const kiln_value *w = kiln_ir_constant(n->in[1]);
    if (w && w->dtype == KILN_DTYPE_FLOAT32 && w->rank == 2 && w->numel && !n->kernel_state) {
        kiln_gemm_ctx g = {0};
        kiln_gemm_packed_b *pb = NULL;
        if (!kiln_gemm_packed_b_create(&g, false, w->dims[0], w->dims[1], w->data, w->dims[1], &pb)) {
            n->kernel_state = pb;
            n->kernel_state_free = packed_free;
        }
    }
    return attention_run;
}

static const kiln_cpu_kernel kernels[] = {
    {"com.microsoft", "MultiHeadAttention", select_mha},
    {"com.microsoft", "Attention", select_attention},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_contrib_attn, kernels);
