/* contrib_qattn.c - com.microsoft QAttention and QEmbedLayerNormalization, the 8-bit forms of
 * Attention and EmbedLayerNormalization that quantize_dynamic writes into a model the transformer
 * optimizer fused. Each dequantizes its 8-bit operands ((q - zp) * scale, per tensor, QAttention's
 * weights also per column) into float32 and runs the float operator's reference kernel on them,
 * which is ONNX Runtime's arithmetic up to float rounding (its integer GEMM sums exactly what the
 * dequantized product sums).
 *
 * QAttention: input [B, S, Hin], weight [Hin, 3 D], bias [3 D], input_scale, weight_scale ([] or
 * [3 D]), mask_index?, input_zero_point?, weight_zero_point?, past? -> output [B, S, D], present?
 * QEmbedLayerNormalization: Embed LayerNormalization's inputs 0..7 with 8-bit tables, then the
 * scales (8..12) and zero points (13..17) of word, position, segment embeddings, gamma and beta. */
#include <stdlib.h>
#include <string.h>

#include "ops/contrib_internal.h"
#include "ops/ctx.h"
#include "ops/op.h"
#include "ops/util.h"

static bool is_q8(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

static int q8_load(kiln_dtype dt, const void *p, int64_t i)
{
    return dt == KILN_DTYPE_INT8 ? ((const int8_t *)p)[i] : ((const uint8_t *)p)[i];
}

/* q dequantized into a new float32 tensor of q's shape; scale and zp hold 1 value, or `cols`
 * values for the last dim (zp may be NULL: 0). */
static kiln_status dequant(kiln_run_ctx *c, const kiln_value *q, const kiln_value *scale, const kiln_value *zp,
                           kiln_value **out)
{
    *out = NULL;
    if (!q || !is_q8(q->dtype)) return kiln_run_fail(c, KILN_ERR_MODEL, "a quantized operand must be uint8 or int8");
    int64_t cols = q->rank ? q->dims[q->rank - 1] : 1;
    if (!scale || scale->dtype != KILN_DTYPE_FLOAT32 || (scale->numel != 1 && scale->numel != cols) ||
        (zp && (zp->dtype != q->dtype || (zp->numel != 1 && zp->numel != cols))))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "scale must be float32 and zero point of the operand's type, 1 or %lld values",
                             (long long)cols);
    KILN_TRY(kiln_tensor_new(KILN_DTYPE_FLOAT32, q->rank, q->dims, out, kiln_run_err(c)));
    const float *s = scale->data;
    float *y = (*out)->data;
    for (int64_t i = 0; i < q->numel; i++) {
        int64_t j = cols ? i % cols : 0;
        int z = zp ? q8_load(zp->dtype, zp->data, zp->numel == 1 ? 0 : j) : 0;
        y[i] = (float)(q8_load(q->dtype, q->data, i) - z) * s[scale->numel == 1 ? 0 : j];
    }
    return KILN_OK;
}

/* Runs the float operator's kernel `fn` on this node with inputs in[0..n) (the rest absent). */
static kiln_status run_as(kiln_run_ctx *c, const kiln_value **in, int n, kiln_status (*fn)(kiln_run_ctx *c))
{
    int total = c->node->n_in;
    const kiln_value **all = calloc((size_t)(total > n ? total : n) + 1, sizeof *all);
    if (!all) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    memcpy(all, in, (size_t)n * sizeof *all);
    kiln_run_ctx c2 = *c; /* outputs, errors and the pool are shared with c */
    c2.in = all;
    kiln_status st = fn(&c2);
    free(all);
    return st;
}

static kiln_status (*float_kernel(kiln_run_ctx *c, const char *op))(kiln_run_ctx *)
{
    const kiln_op_def *d = kiln_op_lookup("com.microsoft", op, 1);
    if (!d || !d->run) {
        kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "needs com.microsoft.%s", op);
        return NULL;
    }
    return d->run;
}

/* ---- QAttention ---- */

enum { Q_X, Q_W, Q_BIAS, Q_XS, Q_WS, Q_MASK, Q_XZ, Q_WZ, Q_PAST };

static kiln_status qattn_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, Q_X), *w = kiln_infer_in(c, Q_W), *past = kiln_infer_in(c, Q_PAST);
    int64_t N = kiln_attr_int(n, "num_heads", 0);
    if (!x || !w || !kiln_infer_in(c, Q_BIAS) || !kiln_infer_in(c, Q_XS) || !kiln_infer_in(c, Q_WS))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input, weight, bias, input_scale and weight_scale");
    if ((x->dtype && !is_q8(x->dtype)) || (w->dtype && !is_q8(w->dtype)))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input and weight must be 8-bit");
    if (N <= 0) return kiln_infer_fail(c, KILN_ERR_MODEL, "num_heads must be positive");
    if (kiln_node_attr(n, "qkv_hidden_sizes"))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "qkv_hidden_sizes (Q, K, V of one width only)");
    if (x->rank < 0 || w->rank < 0) return kiln_infer_set_out_unknown(c, 0, KILN_DTYPE_FLOAT32);
    if (x->rank != 3 || w->rank != 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "input must be 3-D and weight 2-D");
    KILN_TRY(kiln_infer_require_equal(c, x->dims[2], w->dims[0], "input's hidden size vs weight's rows"));
    if (!kiln_dim_is_const(w->dims[1]) || w->dims[1].c % (3 * N))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "weight's columns must be a constant multiple of 3 * num_heads");
    int64_t D = w->dims[1].c / 3;
    kiln_dim d[3] = {x->dims[0], x->dims[1], kiln_dim_const(D)};
    KILN_TRY(kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 3, d));
    if (kiln_infer_n_out(c) < 2) return KILN_OK;
    kiln_dim P = past && past->rank == 5 ? past->dims[3] : kiln_dim_const(0);
    kiln_dim pd[5] = {kiln_dim_const(2), x->dims[0], kiln_dim_const(N), kiln_dim_add(kiln_infer_dims(c), P, x->dims[1]),
                      kiln_dim_const(D / N)};
    return kiln_infer_set_out(c, 1, KILN_DTYPE_FLOAT32, 5, pd);
}

static kiln_status qattn_run(kiln_run_ctx *c)
{
    kiln_status (*attn)(kiln_run_ctx *) = float_kernel(c, "Attention");
    if (!attn) return KILN_ERR_UNSUPPORTED;
    const kiln_value *X = kiln_run_in(c, Q_X), *W = kiln_run_in(c, Q_W), *xs = kiln_run_in(c, Q_XS);
    if (!xs || xs->numel != 1) return kiln_run_fail(c, KILN_ERR_SHAPE, "input_scale must be a scalar");
    const kiln_value *xz = kiln_run_in(c, Q_XZ);
    if (xz && xz->numel != 1) return kiln_run_fail(c, KILN_ERR_SHAPE, "input_zero_point must be a scalar");
    kiln_value *Xf = NULL, *Wf = NULL;
    kiln_status st = dequant(c, X, xs, xz, &Xf);
    if (st == KILN_OK) st = dequant(c, W, kiln_run_in(c, Q_WS), kiln_run_in(c, Q_WZ), &Wf);
    if (st == KILN_OK) {
        /* Attention's inputs: input, weights, bias, mask_index, past */
        const kiln_value *in[5] = {Xf, Wf, kiln_run_in(c, Q_BIAS), kiln_run_in(c, Q_MASK), kiln_run_in(c, Q_PAST)};
        st = run_as(c, in, 5, attn);
    }
    kiln_value_free(Xf);
    kiln_value_free(Wf);
    return st;
}

/* ---- QEmbedLayerNormalization ---- */

enum { E_WORD = 2, E_SEGEMB = 4, E_BETA = 6, E_MASK = 7, E_SCALES = 8, E_ZPS = 13 };

static kiln_status qembed_infer(kiln_infer_ctx *c)
{
    for (int i = E_WORD; i <= E_BETA; i++) {
        const kiln_type *t = kiln_infer_in(c, i);
        if (t && t->dtype && !is_q8(t->dtype)) return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d must be 8-bit", i);
        if (t && !kiln_infer_in(c, E_SCALES + i - E_WORD)) return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d has no scale", i);
    }
    KILN_TRY(kiln_contrib_embed_ln_infer(c));
    const kiln_type *y = kiln_infer_out(c, 0);
    if (!y) return KILN_OK;
    kiln_type t = *y;
    if (t.rank < 0) return kiln_infer_set_out_unknown(c, 0, KILN_DTYPE_FLOAT32);
    return kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, t.rank, t.dims);
}

static kiln_status qembed_run(kiln_run_ctx *c)
{
    kiln_value *f[5] = {0};
    kiln_status st = KILN_OK;
    for (int i = 0; i < 5 && st == KILN_OK; i++) {
        const kiln_value *q = kiln_run_in(c, E_WORD + i);
        if (q) st = dequant(c, q, kiln_run_in(c, E_SCALES + i), kiln_run_in(c, E_ZPS + i), &f[i]);
    }
    if (st == KILN_OK) {
        const kiln_value *in[8] = {kiln_run_in(c, 0), kiln_run_in(c, 1), f[0], f[1], f[2], f[3], f[4], kiln_run_in(c, E_MASK)};
        st = run_as(c, in, 8, kiln_contrib_embed_ln_run);
    }
    for (int i = 0; i < 5; i++) kiln_value_free(f[i]);
    return st;
}

#define MS "com.microsoft"
static const kiln_op_def defs[] = {
    {MS, "QAttention", 1, qattn_infer, qattn_run},
    {MS, "QEmbedLayerNormalization", 1, qembed_infer, qembed_run},
};

const kiln_op_table kiln_ops_contrib_qattn = {defs, sizeof defs / sizeof defs[0]};
