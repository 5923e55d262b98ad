/* attention.c - Attention family: Attention (opsets 23-25: GQA, KV cache, masks, causal and
 * sliding-window masking, softcap, qk_matmul_output modes), RotaryEmbedding, SwiGLU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op.h"
#include "ops/util.h"

/* Symbolic shapes: Y, present_key, present_value, qk_matmul_output. */
static kiln_status attention_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *q = kiln_infer_in(c, 0), *k = kiln_infer_in(c, 1), *v = kiln_infer_in(c, 2);
    const kiln_type *pk = kiln_infer_in(c, 4);
    if (!q || !k || !v) return kiln_infer_fail(c, KILN_ERR_MODEL, "Q, K and V are required");
    if (q->rank != k->rank || q->rank != v->rank || (q->rank != 3 && q->rank != 4))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "Q, K, V must all be 3-D or all 4-D (ranks %d, %d, %d)", q->rank,
                               k->rank, v->rank);
    kiln_dimtab *t = kiln_infer_dims(c);
    kiln_dim batch = q->dims[0], sq, skv, hq, hkv, dv;
    if (q->rank == 3) {
        int64_t qh = kiln_attr_int(n, "q_num_heads", 0), kh = kiln_attr_int(n, "kv_num_heads", 0);
        if (qh <= 0 || kh <= 0)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "3-D inputs need q_num_heads and kv_num_heads attributes");
        sq = q->dims[1];
        skv = k->dims[1];
        hq = kiln_dim_const(qh);
        hkv = kiln_dim_const(kh);
        dv = kiln_dim_floordiv(t, v->dims[2], hkv);
    } else {
        hq = q->dims[1];
        hkv = k->dims[1];
        sq = q->dims[2];
        skv = k->dims[2];
        dv = v->dims[3];
    }
    kiln_dim dk = q->rank == 3 ? kiln_dim_floordiv(t, k->dims[2], hkv) : k->dims[3];
    kiln_dim total = skv;
    if (pk && pk->rank == 4) total = kiln_dim_add(t, pk->dims[2], skv);
    kiln_dtype dt = q->dtype;
    if (q->rank == 3) {
        kiln_dim y[3] = {batch, sq, kiln_dim_mul(t, hq, dv)};
        KILN_TRY(kiln_infer_set_out(c, 0, dt, 3, y));
    } else {
        kiln_dim y[4] = {batch, hq, sq, dv};
        KILN_TRY(kiln_infer_set_out(c, 0, dt, 4, y));
    }
    kiln_dim pkd[4] = {batch, hkv, total, dk}, pvd[4] = {batch, hkv, total, dv}, qkd[4] = {batch, hq, sq, total};
    KILN_TRY(kiln_infer_set_out(c, 1, k->dtype, 4, pkd));
    KILN_TRY(kiln_infer_set_out(c, 2, v->dtype, 4, pvd));
    return kiln_infer_set_out(c, 3, dt, 4, qkd);
}

/* Element (b, h, s, d) of a [B, S, H*D] or [B, H, S, D] tensor. */
static double load_bhsd(const kiln_value *x, bool rank3, int64_t heads, int64_t b, int64_t h, int64_t s, int64_t d,
                        int64_t dsize)
{
    int64_t i;
    if (rank3) i = ((b * x->dims[1] + s) * heads + h) * dsize + d;
    else i = ((b * x->dims[1] + h) * x->dims[2] + s) * dsize + d;
    return kiln_load_f64(x->dtype, x->data, i);
}

/* Additive mask value at (b, h, i, j): 0 or -inf for bool masks, the value for float ones;
 * positions past the mask's last dim are masked (the spec pads with -inf / false). */
static double mask_at(const kiln_value *m, int64_t b, int64_t h, int64_t i, int64_t j)
{
    if (j >= m->dims[m->rank - 1]) return -INFINITY;
    int64_t idx4[4] = {b, h, i, j};
    int64_t off = 0, stride = 1;
    for (int k = m->rank - 1; k >= 0; k--) {
        int64_t coord = idx4[4 - m->rank + k];
        if (m->dims[k] == 1) coord = 0;
        off += coord * stride;
        stride *= m->dims[k];
    }
    if (m->dtype == KILN_DTYPE_BOOL) return ((const uint8_t *)m->data)[off] ? 0.0 : -INFINITY;
    return kiln_load_f64(m->dtype, m->data, off);
}

/* The computation, following the ONNX reference step by step (roundings included). */
static kiln_status attention_compute(kiln_run_ctx *c, const kiln_value *Q, const kiln_value *K, const kiln_value *V,
                                     const kiln_value *mask, const kiln_value *past_k, const kiln_value *past_v,
                                     const kiln_value *nonpad, kiln_value *Y, kiln_value *PK, kiln_value *PV,
                                     kiln_value *QK)
{
    const kiln_node *n = kiln_run_node(c);
    bool rank3 = Q->rank == 3;
    int64_t B = Q->dims[0], Hq = QK->dims[1], Hkv = PK->dims[1];
    int64_t Sq = QK->dims[2], total = QK->dims[3], Dk = PK->dims[3], Dv = PV->dims[3];
    int64_t Skv = rank3 ? K->dims[1] : K->dims[2], past = total - Skv;
    int64_t Dq = rank3 ? Q->dims[2] / Hq : Q->dims[3];
    if (Hkv <= 0 || Hq % Hkv)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "q heads %lld are not a multiple of kv heads %lld", (long long)Hq,
                             (long long)Hkv);
    if (Dq != Dk)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "Q head size %lld != K head size %lld", (long long)Dq, (long long)Dk);
    if (K->dims[0] != B || V->dims[0] != B)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "batch sizes differ: Q %lld, K %lld, V %lld", (long long)B,
                             (long long)K->dims[0], (long long)V->dims[0]);
    if (past_k && (past_k->rank != 4 || past_k->dims[0] != B || past_k->dims[1] != Hkv || past_k->dims[3] != Dk ||
                   past_v->rank != 4 || past_v->dims[2] != past_k->dims[2] || past_v->dims[3] != Dv))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "past_key/past_value do not match [batch, kv_heads, past, head_size]");
    if (mask) {
        if (mask->rank < 1 || mask->rank > 4)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "attn_mask must have rank 1 to 4, has %d", mask->rank);
        int64_t want[4] = {B, Hq, Sq, total};
        for (int k = 0; k < mask->rank; k++) {
            int64_t d = mask->dims[k], w = want[4 - mask->rank + k];
            if (k == mask->rank - 1 ? d > w : (d != 1 && d != w))
                return kiln_run_fail(c, KILN_ERR_SHAPE, "attn_mask dim %d is %lld, does not fit %lld", k, (long long)d,
                                     (long long)w);
        }
    }
    if (nonpad && (nonpad->rank != 1 || nonpad->dims[0] != B))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "nonpad_kv_seqlen must have shape [batch]");
    kiln_dtype dt = Q->dtype;
    /* present key/value: past then new */
    for (int which = 0; which < 2; which++) {
        const kiln_value *prev = which ? past_v : past_k, *cur = which ? V : K;
        kiln_value *out = which ? PV : PK;
        int64_t D = which ? Dv : Dk;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hkv; h++)
                for (int64_t t = 0; t < total; t++)
                    for (int64_t d = 0; d < D; d++) {
                        double x = t < past ? kiln_load_f64(prev->dtype, prev->data, ((b * Hkv + h) * past + t) * D + d)
                                            : load_bhsd(cur, rank3, Hkv, b, h, t - past, d, D);
                        kiln_store_f64(out->dtype, out->data, ((b * Hkv + h) * total + t) * D + d, x);
                    }
    }
    const kiln_attr *scale_attr = kiln_node_attr(n, "scale");
    double scale = scale_attr ? scale_attr->f : 1.0 / sqrt((double)Dq);
    double s = kiln_round_to(dt, sqrt(scale));
    const kiln_attr *softcap_attr = kiln_node_attr(n, "softcap");
    double softcap = softcap_attr ? softcap_attr->f : 0.0;
    bool causal = kiln_attr_int(n, "is_causal", 0) != 0;
    int64_t mode = kiln_attr_int(n, "qk_matmul_output_mode", 0);
    int64_t left = kiln_attr_int(n, "left_window_size", -1), right = kiln_attr_int(n, "right_window_size", -1);
    kiln_dtype sm_dt = (kiln_dtype)kiln_attr_int(n, "softmax_precision", dt);
    double *qk = malloc((size_t)(total ? total : 1) * sizeof *qk), *bias = malloc((size_t)(total ? total : 1) * sizeof *bias);
    if (!qk || !bias) {
        free(qk);
        free(bias);
        return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    }
    int64_t group = Hq / Hkv;
    for (int64_t b = 0; b < B; b++) {
        /* causal and window frontiers: query i sits at absolute position i + offset */
        int64_t offset = past;
        if (!past_k && nonpad) offset = kiln_load_i64(nonpad->dtype, nonpad->data, b) - Sq;
        int64_t valid = nonpad ? kiln_load_i64(nonpad->dtype, nonpad->data, b) : total;
        for (int64_t h = 0; h < Hq; h++) {
            int64_t hk = h / group;
            for (int64_t i = 0; i < Sq; i++) {
                bool all_masked = true;
                double row_max = -INFINITY;
                for (int64_t j = 0; j < total; j++) {
                    double bj = mask ? kiln_round_to(dt, mask_at(mask, b, h, i, j)) : 0.0;
                    if (causal && j > i + offset) bj = -INFINITY;
                    if (left >= 0 && (i + offset) - j > left) bj = -INFINITY;
                    if (right >= 0 && j - (i + offset) > right) bj = -INFINITY;
                    if (j >= valid) bj = -INFINITY;
                    bias[j] = bj;
                    if (!(isinf(bj) && bj < 0)) all_masked = false;
                    double acc = 0;
                    for (int64_t d = 0; d < Dk; d++) {
                        double qv = kiln_round_to(dt, load_bhsd(Q, rank3, Hq, b, h, i, d, Dq) * s);
                        double kv = kiln_round_to(dt, kiln_load_f64(dt, PK->data, ((b * Hkv + hk) * total + j) * Dk + d) * s);
                        acc += qv * kv;
                    }
                    acc = kiln_round_to(dt, acc);
                    if (softcap > 0) acc = kiln_round_to(dt, softcap * tanh(acc / softcap));
                    int64_t qi = ((b * Hq + h) * Sq + i) * total + j;
                    if (mode == 0 || mode == 1) kiln_store_f64(dt, QK->data, qi, acc);
                    qk[j] = kiln_round_to(dt, acc + bj);
                    if (mode == 2) kiln_store_f64(dt, QK->data, qi, qk[j]);
                    qk[j] = kiln_round_to(sm_dt, qk[j]);
                    if (qk[j] > row_max) row_max = qk[j];
                }
                /* softmax in the softmax precision, each step rounded as numpy does; a row with
                 * no attendable key gives zeros */
                double sum = 0;
                for (int64_t j = 0; j < total; j++) {
                    double e = kiln_round_to(sm_dt, qk[j] - (isinf(row_max) ? 0 : row_max));
                    qk[j] = all_masked ? 0.0 : kiln_round_to(sm_dt, exp(e));
                    /* numpy reduces bfloat16 (an ml_dtypes type) with a bfloat16 accumulator */
                    sum = sm_dt == KILN_DTYPE_BFLOAT16 ? kiln_round_to(sm_dt, sum + qk[j]) : sum + qk[j];
                }
                sum = kiln_round_to(sm_dt, sum);
                for (int64_t j = 0; j < total; j++) {
                    qk[j] = kiln_round_to(dt, kiln_round_to(sm_dt, sum > 0 ? qk[j] / sum : 0.0));
                    if (mode == 3) kiln_store_f64(dt, QK->data, ((b * Hq + h) * Sq + i) * total + j, qk[j]);
                }
                for (int64_t d = 0; d < Dv; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < total; j++)
                        acc += qk[j] * kiln_load_f64(PV->dtype, PV->data, ((b * Hkv + hk) * total + j) * Dv + d);
                    int64_t yi = rank3 ? ((b * Sq + i) * Hq + h) * Dv + d : ((b * Hq + h) * Sq + i) * Dv + d;
                    kiln_store_f64(dt, Y->data, yi, acc);
                }
            }
        }
    }
    free(qk);
    free(bias);
    return KILN_OK;
}

static kiln_status attention_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *Q = kiln_run_in(c, 0), *K = kiln_run_in(c, 1), *V = kiln_run_in(c, 2);
    const kiln_value *mask = kiln_run_in(c, 3), *past_k = kiln_run_in(c, 4), *past_v = kiln_run_in(c, 5);
    const kiln_value *nonpad = kiln_run_in(c, 6);
    if ((past_k == NULL) != (past_v == NULL))
        return kiln_run_fail(c, KILN_ERR_MODEL, "past_key and past_value must be given together");
    if (!K || !V) return kiln_run_fail(c, KILN_ERR_MODEL, "K and V are required");
    if (nonpad && past_k) /* opset 24: the cache is K and V themselves (TensorScatter writes it) */
        return kiln_run_fail(c, KILN_ERR_MODEL, "nonpad_kv_seqlen cannot be combined with past_key/past_value");
    /* the kernel indexes K, V and the pasts with Q's layout: check every dim it relies on */
    if ((Q->rank != 3 && Q->rank != 4) || K->rank != Q->rank || V->rank != Q->rank)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "Q, K, V must all be 3-D or all 4-D (ranks %d, %d, %d)", Q->rank,
                             K->rank, V->rank);
    if (K->dtype != Q->dtype || (past_k && past_k->dtype != K->dtype) || (past_v && past_v->dtype != V->dtype))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "K and past_key must have Q's dtype, past_value V's");
    if (Q->rank == 3) {
        int64_t hq = kiln_attr_int(n, "q_num_heads", 1), hkv = kiln_attr_int(n, "kv_num_heads", 1);
        if (hq <= 0 || hkv <= 0 || Q->dims[2] % hq || K->dims[2] % hkv || V->dims[2] % hkv)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "q_num_heads %lld / kv_num_heads %lld do not divide the hidden "
                                 "sizes %lld, %lld, %lld", (long long)hq, (long long)hkv, (long long)Q->dims[2],
                                 (long long)K->dims[2], (long long)V->dims[2]);
    } else if (V->dims[1] != K->dims[1]) {
        return kiln_run_fail(c, KILN_ERR_SHAPE, "K has %lld heads, V %lld", (long long)K->dims[1],
                             (long long)V->dims[1]);
    }
    if (K->dims[Q->rank - 2] != V->dims[Q->rank - 2])
        return kiln_run_fail(c, KILN_ERR_SHAPE, "K has %lld positions, V %lld", (long long)K->dims[Q->rank - 2],
                             (long long)V->dims[Q->rank - 2]);
    if (past_k && (past_k->rank != 4 || past_v->rank != 4 || past_v->dims[0] != past_k->dims[0] ||
                   past_v->dims[1] != past_k->dims[1]))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "past_value does not match past_key's batch and heads");
    bool rank3 = Q->rank == 3;
    int64_t B = Q->dims[0];
    int64_t Hq = rank3 ? kiln_attr_int(n, "q_num_heads", 1) : Q->dims[1];
    int64_t Hkv = rank3 ? kiln_attr_int(n, "kv_num_heads", 1) : K->dims[1];
    int64_t Sq = rank3 ? Q->dims[1] : Q->dims[2], Skv = rank3 ? K->dims[1] : K->dims[2];
    int64_t Dk = rank3 ? K->dims[2] / Hkv : K->dims[3];
    int64_t Dv = rank3 ? V->dims[2] / Hkv : V->dims[3];
    int64_t past = past_k ? past_k->dims[2] : 0, total = past + Skv;
    /* outputs the node does not list are still computed: keep them in scratch tensors */
    kiln_value *Y = kiln_run_out(c, 0), *scratch[3] = {NULL, NULL, NULL};
    int64_t pkd[4] = {B, Hkv, total, Dk}, pvd[4] = {B, Hkv, total, Dv}, qkd[4] = {B, Hq, Sq, total};
    const int64_t *sd[3] = {pkd, pvd, qkd};
    kiln_dtype st[3] = {K->dtype, V->dtype, Q->dtype};
    kiln_value *outs[3];
    for (int i = 0; i < 3; i++) {
        outs[i] = kiln_run_out(c, i + 1);
        if (!outs[i]) {
            kiln_status r = kiln_tensor_new(st[i], 4, sd[i], &scratch[i], kiln_run_err(c));
            if (r) {
                for (int k = 0; k < i; k++) kiln_value_free(scratch[k]);
                return r;
            }
            outs[i] = scratch[i];
        }
    }
    kiln_status rc = attention_compute(c, Q, K, V, mask, past_k, past_v, nonpad, Y, outs[0], outs[1], outs[2]);
    for (int i = 0; i < 3; i++) kiln_value_free(scratch[i]);
    return rc;
}


/* ---- RotaryEmbedding ---- */

static kiln_status rotary_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x || !kiln_infer_in(c, 1) || !kiln_infer_in(c, 2))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input, cos_cache and sin_cache are required");
    if (x->rank != 3 && x->rank != 4) return kiln_infer_fail(c, KILN_ERR_SHAPE, "input must be 3-D or 4-D, is %d-D", x->rank);
    return kiln_infer_same_as_input(c, 0, 0);
}

/* Rotates the first rotary_embedding_dim features of each head: pairs (x1, x2) from the two
 * halves (or from even/odd positions when interleaved) become (cos x1 - sin x2, sin x1 + cos x2),
 * with cos/sin taken at the token's position. */
static kiln_status rotary_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *cosv = kiln_run_in(c, 1), *sinv = kiln_run_in(c, 2);
    const kiln_value *pos = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0);
    bool rank3 = X->rank == 3, interleaved = kiln_attr_int(n, "interleaved", 0) != 0;
    int64_t B = X->dims[0], S = rank3 ? X->dims[1] : X->dims[2];
    int64_t H = rank3 ? kiln_attr_int(n, "num_heads", 0) : X->dims[1];
    if (H <= 0 || (rank3 && X->dims[2] % H))
        return kiln_run_fail(c, KILN_ERR_MODEL, "3-D input needs num_heads dividing the hidden size %lld",
                             (long long)X->dims[2]);
    int64_t D = rank3 ? X->dims[2] / H : X->dims[3];
    int64_t rd = kiln_attr_int(n, "rotary_embedding_dim", 0);
    if (rd == 0) rd = D;
    if (rd < 0 || rd > D || rd % 2)
        return kiln_run_fail(c, KILN_ERR_MODEL, "rotary_embedding_dim %lld must be even and at most the head size %lld",
                             (long long)rd, (long long)D);
    int64_t half = rd / 2;
    if (cosv->dims[cosv->rank - 1] != half || sinv->dims[sinv->rank - 1] != half || cosv->rank != sinv->rank)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "cos/sin caches must end in rotary_embedding_dim/2 = %lld", (long long)half);
    if (pos ? (cosv->rank != 2 || pos->rank != 2 || pos->dims[0] != B || pos->dims[1] != S)
            : (cosv->rank != 3 || cosv->dims[0] != B || cosv->dims[1] != S))
        return kiln_run_fail(c, KILN_ERR_SHAPE,
                             "caches must be [max_position, dim/2] with position_ids [batch, seq], or [batch, seq, dim/2]");
    kiln_dtype dt = X->dtype;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) {
            int64_t row;
            if (pos) {
                int64_t p = kiln_load_i64(pos->dtype, pos->data, b * S + s);
                if (p < 0 || p >= cosv->dims[0] || p >= sinv->dims[0])
                    return kiln_run_fail(c, KILN_ERR_RUNTIME, "position id %lld outside the caches' %lld rows", (long long)p,
                                         (long long)cosv->dims[0]);
                row = p * half;
            } else {
                row = (b * S + s) * half;
            }
            for (int64_t h = 0; h < H; h++) {
                int64_t base = rank3 ? ((b * S + s) * H + h) * D : ((b * H + h) * S + s) * D;
                for (int64_t d = rd; d < D; d++) kiln_store_f64(dt, Y->data, base + d, kiln_load_f64(dt, X->data, base + d));
                for (int64_t i = 0; i < half; i++) {
                    int64_t i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
                    double cs = kiln_load_f64(cosv->dtype, cosv->data, row + i);
                    double sn = kiln_load_f64(sinv->dtype, sinv->data, row + i);
                    double x1 = kiln_load_f64(dt, X->data, base + i1), x2 = kiln_load_f64(dt, X->data, base + i2);
                    kiln_store_f64(dt, Y->data, base + i1, kiln_round_to(dt, kiln_round_to(dt, cs * x1) - kiln_round_to(dt, sn * x2)));
                    kiln_store_f64(dt, Y->data, base + i2, kiln_round_to(dt, kiln_round_to(dt, sn * x1) + kiln_round_to(dt, cs * x2)));
                }
            }
        }
    return KILN_OK;
}

/* ---- SwiGLU: Y = A * sigmoid(alpha * A) * B, A and B of one shape ---- */

static kiln_status swiglu_infer(kiln_infer_ctx *c)
{
    const kiln_type *a = kiln_infer_in(c, 0), *b = kiln_infer_in(c, 1);
    if (!a || !b) return kiln_infer_fail(c, KILN_ERR_MODEL, "A and B are required");
    if (a->rank != b->rank) return kiln_infer_fail(c, KILN_ERR_SHAPE, "A and B ranks differ (%d vs %d)", a->rank, b->rank);
    for (int k = 0; k < a->rank; k++) KILN_TRY(kiln_infer_require_equal(c, a->dims[k], b->dims[k], "A and B dims"));
    return kiln_infer_same_as_input(c, 0, 0);
}

static kiln_status swiglu_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (A->dtype != B->dtype) return kiln_run_fail(c, KILN_ERR_MODEL, "A and B dtypes differ");
    double alpha = kiln_attr_float(kiln_run_node(c), "alpha", 1.0f);
    kiln_dtype dt = A->dtype;
    for (int64_t i = 0; i < A->numel; i++) {
        double a = kiln_load_f64(dt, A->data, i);
        double sw = kiln_round_to(dt, a * kiln_round_to(dt, 1.0 / (1.0 + exp(-alpha * a))));
        kiln_store_f64(dt, Y->data, i, sw * kiln_load_f64(dt, B->data, i));
    }
    return KILN_OK;
}

static const kiln_op_def defs[] = {
    {"", "Attention", 23, attention_infer, attention_run},
    {"", "RotaryEmbedding", 23, rotary_infer, rotary_run},
    {"", "SwiGLU", 28, swiglu_infer, swiglu_run},
};

const kiln_op_table kiln_ops_attention = {defs, sizeof defs / sizeof defs[0]};
