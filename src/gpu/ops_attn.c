/* ops_attn.c - GPU provider family 'attn': the default-domain attention operators of opsets
 * 23 and 24. Attention (3-D [B, S, H*D] and 4-D [B, H, S, D] inputs, grouped KV heads, attn_mask
 * bool or of Q's dtype in any broadcast rank, past_key/past_value and the present outputs,
 * is_causal with the past's diagonal offset, sliding windows, scale, softcap, every
 * qk_matmul_output_mode with the qk_matmul_output output, opset 24's nonpad_kv_seqlen), float32,
 * float16 and bfloat16 with float accumulation and softmax (softmax_precision is not followed:
 * the softmax is always float32); RotaryEmbedding (3-D with num_heads and 4-D, position_ids or
 * batch caches, interleaved, partial rotary dims); TensorScatter (linear and circular, any axis
 * but 0, every fixed-size dtype). The run-time checks are the reference's (ops/attention.c,
 * ops/index.c): whatever it would refuse goes to it (kiln_gpu_fallback), which reports it.
 * Kernels in k_attn.cu; the present K/V are gathered by the contrib family's kernel. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "gpu/gpu.h"
#include "gpu/k_attn.h"
#include "gpu/k_contrib.h"
#include "gpu/support.h"
#include "ops/util.h"

static const kiln_dtype floats[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT16, KILN_DTYPE_BFLOAT16, KILN_DTYPE_UNDEFINED};
static const kiln_dtype ints[] = {KILN_DTYPE_INT32, KILN_DTYPE_INT64, KILN_DTYPE_UNDEFINED};

/* Input i, when present and of known dtype, has input ref's dtype. */
static bool same_as(const kiln_node *n, int i, int ref, char *why, size_t size)
{
    const kiln_type *t = kiln_gpu_in_type(n, i);
    return (t && t->dtype == KILN_DTYPE_UNDEFINED) || kiln_gpu_same_dtype(n, i, ref, why, size);
}

/* A constant dim d (when it is one) is at most max. */
static bool dim_at_most(kiln_dim d, int64_t max) { return !kiln_dim_is_const(d) || d.c <= max; }

static const void *data_of(const kiln_value *v) { return v ? v->data : NULL; }

/* 256-byte steps in the workspace. */
static size_t ws_align(size_t n) { return (n + 255) / 256 * 256; }

/* ---- Attention: inputs Q, K, V, attn_mask?, past_key?, past_value?, nonpad_kv_seqlen?;
 * outputs Y, present_key?, present_value?, qk_matmul_output? ---- */

enum { AT_Q, AT_K, AT_V, AT_MASK, AT_PK, AT_PV, AT_NONPAD };

static bool attention_supports(const kiln_node *n, char *why, size_t size)
{
    if (!kiln_gpu_input_is(n, AT_Q, true, floats, why, size) || !kiln_gpu_input_is(n, AT_K, true, floats, why, size) ||
        !kiln_gpu_input_is(n, AT_V, true, floats, why, size) || !kiln_gpu_input_is(n, AT_NONPAD, false, ints, why, size))
        return false;
    static const int alike[] = {AT_K, AT_V, AT_PK, AT_PV};
    for (size_t k = 0; k < sizeof alike / sizeof alike[0]; k++)
        if (!same_as(n, alike[k], AT_Q, why, size)) return false;
    const kiln_type *q = kiln_gpu_in_type(n, AT_Q), *m = kiln_gpu_in_type(n, AT_MASK);
    if (q->rank >= 0 && q->rank != 3 && q->rank != 4) return kiln_gpu_refuse(why, size, "Q of rank %d", q->rank);
    if (m && m->dtype != KILN_DTYPE_BOOL && m->dtype != KILN_DTYPE_UNDEFINED && m->dtype != q->dtype)
        return kiln_gpu_refuse(why, size, "attn_mask dtype %s (bool or Q's %s)", kiln_dtype_name(m->dtype),
                               kiln_dtype_name(q->dtype));
    int64_t mode = kiln_attr_int(n, "qk_matmul_output_mode", 0);
    if (mode < 0 || mode > 3) return kiln_gpu_refuse(why, size, "qk_matmul_output_mode %lld", (long long)mode);
    if (q->rank == 3 && (kiln_attr_int(n, "q_num_heads", 0) <= 0 || kiln_attr_int(n, "kv_num_heads", 0) <= 0))
        return kiln_gpu_refuse(why, size, "3-D inputs without q_num_heads / kv_num_heads");
    /* head sizes the kernel's shared memory holds (known ones only; the run checks again) */
    const kiln_type *k = kiln_gpu_in_type(n, AT_K), *v = kiln_gpu_in_type(n, AT_V);
    int64_t max = KILN_GPU_ONNX_ATTN_MAX_HEAD;
    if (q->rank == 4 && k->rank == 4 && v->rank == 4 &&
        (!dim_at_most(q->dims[3], max) || !dim_at_most(k->dims[3], max) || !dim_at_most(v->dims[3], max)))
        return kiln_gpu_refuse(why, size, "head size over %lld", (long long)max);
    if (q->rank == 3 && kiln_dim_is_const(q->dims[2]) && q->dims[2].c / kiln_attr_int(n, "q_num_heads", 1) > max)
        return kiln_gpu_refuse(why, size, "head size over %lld", (long long)max);
    return true;
}

/* The reference's shape checks (ops/attention.c) and the dims of a call it accepts. */
typedef struct attn_dims {
    bool rank3;
    int64_t B, Hq, Hkv, Sq, Skv, Dq, Dk, Dv, past, total;
} attn_dims;

static bool attention_dims(const kiln_node *n, const kiln_value *Q, const kiln_value *K, const kiln_value *V,
                           const kiln_value *mask, const kiln_value *pk, const kiln_value *pv, const kiln_value *nonpad,
                           attn_dims *d)
{
    if (!Q || !K || !V || (pk == NULL) != (pv == NULL) || (nonpad && pk)) return false;
    if ((Q->rank != 3 && Q->rank != 4) || K->rank != Q->rank || V->rank != Q->rank) return false;
    bool r3 = d->rank3 = Q->rank == 3;
    d->B = Q->dims[0];
    if (r3) {
        d->Hq = kiln_attr_int(n, "q_num_heads", 1), d->Hkv = kiln_attr_int(n, "kv_num_heads", 1);
        if (d->Hq <= 0 || d->Hkv <= 0 || Q->dims[2] % d->Hq || K->dims[2] % d->Hkv || V->dims[2] % d->Hkv) return false;
        d->Sq = Q->dims[1], d->Skv = K->dims[1];
        d->Dq = Q->dims[2] / d->Hq, d->Dk = K->dims[2] / d->Hkv, d->Dv = V->dims[2] / d->Hkv;
    } else {
        if (V->dims[1] != K->dims[1]) return false;
        d->Hq = Q->dims[1], d->Hkv = K->dims[1];
        d->Sq = Q->dims[2], d->Skv = K->dims[2];
        d->Dq = Q->dims[3], d->Dk = K->dims[3], d->Dv = V->dims[3];
    }
    if (K->dims[Q->rank - 2] != V->dims[Q->rank - 2]) return false;
    if (d->Hkv <= 0 || d->Hq % d->Hkv || d->Dq != d->Dk || K->dims[0] != d->B || V->dims[0] != d->B) return false;
    d->past = pk ? pk->dims[2] : 0;
    d->total = d->past + d->Skv;
    if (pk && (pk->rank != 4 || pv->rank != 4 || pk->dims[0] != d->B || pk->dims[1] != d->Hkv || pk->dims[3] != d->Dk ||
               pv->dims[0] != d->B || pv->dims[1] != d->Hkv || pv->dims[2] != pk->dims[2] || pv->dims[3] != d->Dv))
        return false;
    if (mask) {
        if (mask->rank < 1 || mask->rank > 4) return false;
        int64_t want[4] = {d->B, d->Hq, d->Sq, d->total};
        for (int k = 0; k < mask->rank; k++) {
            int64_t m = mask->dims[k], w = want[4 - mask->rank + k];
            if (k == mask->rank - 1 ? m > w : (m != 1 && m != w)) return false;
        }
    }
    if (nonpad && (nonpad->rank != 1 || nonpad->dims[0] != d->B)) return false;
    return true;
}

/* The view of a [B, S, H*D] (rank3) or [B, H, S, D] tensor's (b, h, s, d). */
static kiln_gpu_attn_view bhsd_view(const void *p, bool rank3, int64_t H, int64_t S, int64_t D)
{
    if (rank3) return (kiln_gpu_attn_view){p, S * H * D, D, H * D, NULL};
    return (kiln_gpu_attn_view){p, H * S * D, S * D, D, NULL};
}

bool kiln_gpu_flash_enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("KILN_GPU_FLASH");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

static kiln_status attention_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *Q = kiln_run_in(c, AT_Q), *K = kiln_run_in(c, AT_K), *V = kiln_run_in(c, AT_V),
                     *mask = kiln_run_in(c, AT_MASK), *pk = kiln_run_in(c, AT_PK), *pv = kiln_run_in(c, AT_PV),
                     *nonpad = kiln_run_in(c, AT_NONPAD);
    kiln_value *Y = kiln_run_out(c, 0), *PK = kiln_run_out(c, 1), *PV = kiln_run_out(c, 2), *QK = kiln_run_out(c, 3);
    attn_dims d;
    if (!Y || !attention_dims(n, Q, K, V, mask, pk, pv, nonpad, &d)) return kiln_gpu_fallback(c);
    kiln_dtype dt = Q->dtype;
    int64_t mode = kiln_attr_int(n, "qk_matmul_output_mode", 0), max = KILN_GPU_ONNX_ATTN_MAX_HEAD;
    bool ok = kiln_gpu_dtype_in(dt, floats) && K->dtype == dt && V->dtype == dt && (!pk || pk->dtype == dt) &&
              (!pv || pv->dtype == dt) && Y->dtype == dt && (!PK || PK->dtype == dt) && (!PV || PV->dtype == dt) &&
              (!QK || QK->dtype == dt) && (!mask || mask->dtype == KILN_DTYPE_BOOL || mask->dtype == dt) &&
              (!nonpad || kiln_gpu_dtype_in(nonpad->dtype, ints)) && mode >= 0 && mode <= 3 && d.Dk > 0 && d.Dv > 0 &&
              d.Dk <= max && d.Dv <= max;
    /* the outputs as run-time inference sized them */
    ok = ok && Y->numel == d.B * d.Hq * d.Sq * d.Dv && (!PK || PK->numel == d.B * d.Hkv * d.total * d.Dk) &&
         (!PV || PV->numel == d.B * d.Hkv * d.total * d.Dv) && (!QK || QK->numel == d.B * d.Hq * d.Sq * d.total);
    if (!ok) return kiln_gpu_fallback(c);
    gpuStream_t s = kiln_gpu_stream(c);
    size_t es = kiln_dtype_size(dt);
    size_t nk = (size_t)(d.B * d.Hkv * d.total * d.Dk), nv = (size_t)(d.B * d.Hkv * d.total * d.Dv);
    /* K and V: gathered (past rows, then the new ones) into the present outputs, or into
     * workspace when there is a past but no present output; else read in place */
    bool gk = PK || pk, gv = PV || pv;
    size_t at_v = gk && !PK ? ws_align(nk * es) : 0, total_ws = at_v + (gv && !PV ? ws_align(nv * es) : 0);
    unsigned char *ws = NULL;
    if (total_ws) KILN_TRY(kiln_gpu_workspace(c, total_ws, (void **)&ws));
    kiln_gpu_attn_view kv = bhsd_view(K->data, d.rank3, d.Hkv, d.Skv, d.Dk);
    kiln_gpu_attn_view vv = bhsd_view(V->data, d.rank3, d.Hkv, d.Skv, d.Dv);
    if (gk) {
        void *dst = PK ? PK->data : ws;
        gpuError_t e = kiln_gpu_contrib_kv(s, dt, dst, data_of(pk), kv, d.B, d.Hkv, d.past, d.Skv, d.Dk);
        KILN_TRY(kiln_gpu_check(c, e, "Attention present_key"));
        kv = bhsd_view(dst, false, d.Hkv, d.total, d.Dk);
    }
    if (gv) {
        void *dst = PV ? PV->data : ws + at_v;
        gpuError_t e = kiln_gpu_contrib_kv(s, dt, dst, data_of(pv), vv, d.B, d.Hkv, d.past, d.Skv, d.Dv);
        KILN_TRY(kiln_gpu_check(c, e, "Attention present_value"));
        vv = bhsd_view(dst, false, d.Hkv, d.total, d.Dv);
    }
    const kiln_attr *scale_attr = kiln_node_attr(n, "scale"), *softcap_attr = kiln_node_attr(n, "softcap");
    double scale = scale_attr ? scale_attr->f : 1.0 / sqrt((double)d.Dq);
    kiln_gpu_attn_view yv = bhsd_view(Y->data, d.rank3, d.Hq, d.Sq, d.Dv);
    kiln_gpu_onnx_attn a = {
        .dtype = dt, .q = bhsd_view(Q->data, d.rank3, d.Hq, d.Sq, d.Dq), .k = kv, .v = vv, .y = Y->data,
        .y_sb = yv.sb, .y_sh = yv.sn, .y_ss = yv.ss, .qk = QK ? QK->data : NULL, .qk_mode = (int)mode,
        .nonpad = data_of(nonpad), .nonpad_64 = nonpad && nonpad->dtype == KILN_DTYPE_INT64,
        .B = d.B, .Hq = d.Hq, .Hkv = d.Hkv, .Sq = d.Sq, .T = d.total, .Dk = d.Dk, .Dv = d.Dv, .past = d.past,
        .left = kiln_attr_int(n, "left_window_size", -1), .right = kiln_attr_int(n, "right_window_size", -1),
        .qscale = (float)kiln_round_to(dt, sqrt(scale)), .softcap = softcap_attr ? softcap_attr->f : 0.0f,
        .causal = kiln_attr_int(n, "is_causal", 0) != 0, .flash = kiln_gpu_flash_enabled(), .scale = (float)scale,
    };
    if (mask) {
        /* the mask's dims right-aligned to [B, Hq, Sq, T]; size-1 dims broadcast */
        int64_t md[4] = {1, 1, 1, 1};
        for (int k = 0; k < mask->rank; k++) md[4 - mask->rank + k] = mask->dims[k];
        a.mask = mask->data;
        a.mask_kind = mask->dtype == KILN_DTYPE_BOOL ? KILN_GPU_ONNX_MASK_BOOL : KILN_GPU_ONNX_MASK_FLOAT;
        a.mask_T = md[3];
        a.m_ss = md[2] == 1 ? 0 : md[3];
        a.m_sh = md[1] == 1 ? 0 : md[2] * md[3];
        a.m_sb = md[0] == 1 ? 0 : md[1] * md[2] * md[3];
    }
    return kiln_gpu_check(c, kiln_gpu_onnx_attn_run(s, &a), "Attention");
}

/* ---- RotaryEmbedding: inputs X, cos_cache, sin_cache, position_ids? ---- */

static bool rotary_supports(const kiln_node *n, char *why, size_t size)
{
    if (!kiln_gpu_input_is(n, 0, true, floats, why, size) || !same_as(n, 1, 0, why, size) || !same_as(n, 2, 0, why, size) ||
        !kiln_gpu_input_is(n, 3, false, ints, why, size))
        return false;
    const kiln_type *x = kiln_gpu_in_type(n, 0);
    if (x->rank == 3 && kiln_attr_int(n, "num_heads", 0) <= 0) return kiln_gpu_refuse(why, size, "3-D input without num_heads");
    return true;
}

static kiln_status rotary_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *cs = kiln_run_in(c, 1), *sn = kiln_run_in(c, 2), *pos = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || !X || !cs || !sn || (X->rank != 3 && X->rank != 4) || !kiln_gpu_dtype_in(X->dtype, floats) ||
        cs->dtype != X->dtype || sn->dtype != X->dtype || Y->dtype != X->dtype || Y->numel != X->numel ||
        (pos && !kiln_gpu_dtype_in(pos->dtype, ints)))
        return kiln_gpu_fallback(c);
    bool rank3 = X->rank == 3;
    int64_t B = X->dims[0], S = rank3 ? X->dims[1] : X->dims[2];
    int64_t H = rank3 ? kiln_attr_int(n, "num_heads", 0) : X->dims[1];
    if (H <= 0 || (rank3 && X->dims[2] % H)) return kiln_gpu_fallback(c);
    int64_t D = rank3 ? X->dims[2] / H : X->dims[3], rd = kiln_attr_int(n, "rotary_embedding_dim", 0);
    if (rd == 0) rd = D;
    if (rd < 0 || rd > D || rd % 2) return kiln_gpu_fallback(c);
    int64_t half = rd / 2;
    if (cs->rank != sn->rank || cs->dims[cs->rank - 1] != half || sn->dims[sn->rank - 1] != half) return kiln_gpu_fallback(c);
    if (pos ? (cs->rank != 2 || pos->rank != 2 || pos->dims[0] != B || pos->dims[1] != S)
            : (cs->rank != 3 || cs->dims[0] != B || cs->dims[1] != S || sn->dims[0] != B || sn->dims[1] != S))
        return kiln_gpu_fallback(c);
    if (!Y->numel) return KILN_OK;
    kiln_gpu_onnx_rotary a = {
        .dtype = X->dtype, .x = X->data, .cos = cs->data, .sin = sn->data, .y = Y->data, .pos = data_of(pos),
        .pos_64 = pos && pos->dtype == KILN_DTYPE_INT64, .rank3 = rank3,
        .interleaved = kiln_attr_int(n, "interleaved", 0) != 0, .B = B, .S = S, .H = H, .D = D, .rd = rd,
        .rows = pos ? (cs->dims[0] < sn->dims[0] ? cs->dims[0] : sn->dims[0]) : 0,
    };
    if (pos) KILN_TRY(kiln_gpu_check_word(c, &a.bad, &a.bad_code)); /* positions are read on the device */
    return kiln_gpu_check(c, kiln_gpu_onnx_rotary_run(kiln_gpu_stream(c), &a), "RotaryEmbedding");
}

/* ---- TensorScatter: inputs past_cache, update, write_indices? ---- */

/* The dtypes TensorScatter moves: one element in 1, 2, 4 or 8 bytes. */
static const kiln_dtype scatter_types[] = {
    KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT16, KILN_DTYPE_BFLOAT16, KILN_DTYPE_FLOAT64, KILN_DTYPE_INT8,
    KILN_DTYPE_UINT8, KILN_DTYPE_INT16, KILN_DTYPE_UINT16, KILN_DTYPE_INT32, KILN_DTYPE_UINT32,
    KILN_DTYPE_INT64, KILN_DTYPE_UINT64, KILN_DTYPE_BOOL, KILN_DTYPE_FLOAT8E4M3FN, KILN_DTYPE_FLOAT8E4M3FNUZ,
    KILN_DTYPE_FLOAT8E5M2, KILN_DTYPE_FLOAT8E5M2FNUZ, KILN_DTYPE_UNDEFINED,
};

static bool tensor_scatter_supports(const kiln_node *n, char *why, size_t size)
{
    if (!kiln_gpu_input_is(n, 0, true, scatter_types, why, size) || !same_as(n, 1, 0, why, size) ||
        !kiln_gpu_input_is(n, 2, false, ints, why, size))
        return false;
    const char *mode = kiln_attr_string(n, "mode", "linear");
    if (strcmp(mode, "linear") && strcmp(mode, "circular")) return kiln_gpu_refuse(why, size, "mode '%s'", mode);
    return true;
}

static kiln_status tensor_scatter_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *U = kiln_run_in(c, 1), *W = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || !X || !U || X->rank < 2 || U->rank != X->rank || U->dtype != X->dtype || Y->dtype != X->dtype ||
        Y->nbytes != X->nbytes || !kiln_gpu_dtype_in(X->dtype, scatter_types) ||
        (W && (W->rank != 1 || W->dims[0] != X->dims[0] || !kiln_gpu_dtype_in(W->dtype, ints))))
        return kiln_gpu_fallback(c);
    int64_t axis = kiln_attr_int(n, "axis", -2);
    if (axis < 0) axis += X->rank;
    if (axis <= 0 || axis >= X->rank) return kiln_gpu_fallback(c);
    for (int k = 0; k < X->rank; k++)
        if (k != axis && U->dims[k] != X->dims[k]) return kiln_gpu_fallback(c);
    if (U->dims[axis] > X->dims[axis]) return kiln_gpu_fallback(c);
    gpuStream_t s = kiln_gpu_stream(c);
    if (X->nbytes && Y->data != X->data)
        KILN_TRY(kiln_gpu_check(c, gpuMemcpyAsync(Y->data, X->data, X->nbytes, gpuMemcpyDeviceToDevice, s),
                                "TensorScatter copy"));
    kiln_gpu_tensor_scatter a = {
        .u = U->data, .w = data_of(W), .y = Y->data, .w_64 = W && W->dtype == KILN_DTYPE_INT64,
        .circular = !strcmp(kiln_attr_string(n, "mode", "linear"), "circular"), .esize = (int)kiln_dtype_size(X->dtype),
        .prefix = 1, .per_batch = 1, .max_len = X->dims[axis], .len = U->dims[axis], .inner = 1,
    };
    for (int k = 0; k < axis; k++) a.prefix *= X->dims[k];
    for (int k = 1; k < axis; k++) a.per_batch *= X->dims[k];
    for (int k = (int)axis + 1; k < X->rank; k++) a.inner *= X->dims[k];
    if (!a.prefix || !a.len || !a.inner) return KILN_OK;
    if (W) KILN_TRY(kiln_gpu_check_word(c, &a.bad, &a.bad_code)); /* write indices are read on the device */
    return kiln_gpu_check(c, kiln_gpu_tensor_scatter_run(s, &a), "TensorScatter");
}

/* ---- the table ---- */

static const kiln_gpu_op ops[] = {
    {"", "Attention", attention_supports, attention_run},
    {"", "RotaryEmbedding", rotary_supports, rotary_run},
    {"", "TensorScatter", tensor_scatter_supports, tensor_scatter_run},
};

const kiln_gpu_op_table kiln_gpu_ops_attn = {ops, sizeof ops / sizeof ops[0]};
