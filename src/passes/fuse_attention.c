/* fuse_attention.c - scaled dot-product attention written out as ops becomes one ONNX Attention
 * node (opset 23), which the CPU provider runs in one pass (src/cpu/kernels_attn.c):
 *
 *   MatMul(Q, K^T) -> Mul/Div by a constant (optional) -> Add mask (optional)
 *   -> Softmax(last axis) -> MatMul(., V)
 *
 * with K^T as key_of reads it, or MatMul(Q * c, K^T * c') (scale c c'), or com.microsoft
 * FusedMatMul(Q, K^T, alpha) (scale alpha), and on the CPU a causal Where(keep, scores, -big)
 * for the mask Add;
 * on float32 [B, H, S, D] tensors (the GPU's form, kiln_pass_fuse_attention_gpu: float16 and
 * bfloat16 of head size 32 or 64, the scale and mask of that dtype). When Q, K and V are themselves
 * Transpose([0,2,1,3]) of Reshapes of [B, S, H*D] tensors and the result goes through Transpose([0,2,1,3]) and a Reshape
 * back to [B, S, H*D], the 3-D form of Attention (q_num_heads) reads and writes those directly
 * and the transposes go. Intermediates must have no other readers. One difference: a query row
 * whose mask is -inf for every key gives zeros (Attention) instead of NaN (Softmax). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "ops/eval.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

/* The node of g producing v with this op type (default domain, one output), or NULL. */
/* The com.microsoft FusedMatMul of g producing v without transposes (ORT's offline files fold
 * the scores' scale into its alpha), or NULL. */
static kiln_node *ms_scaled_matmul(const kiln_graph *g, const kiln_ir_value *v)
{
    kiln_node *p = v ? v->producer : NULL;
    if (!p || p->graph != g || strcmp(p->domain, "com.microsoft") || strcmp(p->op_type, "FusedMatMul") ||
        p->n_in != 2 || p->n_out != 1 || p->out[0] != v)
        return NULL;
    static const char *const trans[] = {"transA", "transB", "transBatchA", "transBatchB"};
    for (size_t i = 0; i < sizeof trans / sizeof *trans; i++)
        if (kiln_attr_int(p, trans[i], 0)) return NULL;
    return p;
}

/* Whether v, the scores before the mask, comes from Q K^T (its MatMul, or the scale after it). */
static bool scores_of_product(const kiln_graph *g, const kiln_ir_value *v)
{
    return kiln_passes_producer(g, v, "Mul") || kiln_passes_producer(g, v, "Div") ||
           kiln_passes_producer(g, v, "MatMul") || ms_scaled_matmul(g, v);
}

static bool single_use(const kiln_graph *g, const kiln_ir_value *v)
{
    (void)g;
    return !v->is_output && kiln_ir_value_readers(v) == 1;
}

static bool has_perm(const kiln_node *t, int64_t a, int64_t b, int64_t c, int64_t d)
{
    int n;
    const int64_t *p = kiln_attr_ints(t, "perm", &n);
    return p && n == 4 && p[0] == a && p[1] == b && p[2] == c && p[3] == d;
}

/* The scalar constant v holds, if it is one of dtype dt. */
static bool scalar_const(const kiln_ir_value *v, kiln_dtype dt, float *out)
{
    const kiln_value *t = kiln_ir_constant(v);
    if (!t || t->kind != KILN_VALUE_TENSOR || t->dtype != dt || t->numel != 1 || !t->data) return false;
    *out = (float)kiln_load_f64(dt, t->data, 0);
    return true;
}

/* Whether v is a tensor of dtype dt by its compile-time type. */
static bool is_dt(const kiln_ir_value *v, kiln_dtype dt)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.dtype == dt;
}

static bool rank4(const kiln_ir_value *v, kiln_dtype dt) { return is_dt(v, dt) && v->type.rank == 4; }

/* x = Transpose(Reshape(x3 [B, S, H*D]) -> [B, S, H, D], perm) with constant H and D: x3, else
 * NULL. perm [0,2,1,3] gives the heads [B, H, S, D]; [0,2,3,1] gives them transposed, [B, H, D, S]
 * (the TorchScript exporter folds K's two transposes into that one). */
static kiln_ir_value *heads_source_perm(const kiln_graph *g, const kiln_ir_value *x, kiln_dtype dt, bool transposed)
{
    kiln_node *t = kiln_passes_producer(g, x, "Transpose");
    if (!t || !(transposed ? has_perm(t, 0, 2, 3, 1) : has_perm(t, 0, 2, 1, 3))) return NULL;
    kiln_node *r = kiln_passes_producer(g, t->in[0], "Reshape");
    if (!r || !r->in[0] || !rank4(r->out[0], dt)) return NULL;
    kiln_ir_value *x3 = r->in[0];
    const kiln_dim *rd = r->out[0]->type.dims, *d3 = x3->type.dims;
    if (!is_dt(x3, dt) || x3->type.rank != 3 || !kiln_dim_is_const(rd[2]) || !kiln_dim_is_const(rd[3]) ||
        !kiln_dim_is_const(d3[2]) || d3[2].c != rd[2].c * rd[3].c || !kiln_dim_equal(d3[0], rd[0]) ||
        !kiln_dim_equal(d3[1], rd[1]))
        return NULL;
    return x3;
}

static kiln_ir_value *heads_source(const kiln_graph *g, const kiln_ir_value *x, kiln_dtype dt)
{
    return heads_source_perm(g, x, dt, false);
}

static bool dims_are(const kiln_ir_value *v, const kiln_dim *a, const kiln_dim *b, const kiln_dim *c, const kiln_dim *d)
{
    const kiln_dim *want[4] = {a, b, c, d};
    for (int i = 0; i < v->type.rank; i++)
        if (!kiln_dim_equal(v->type.dims[i], *want[i])) return false;
    return true;
}

/* K^T [B, H, D, S] as the second operand of Q K^T: K [B, H, S, D] when kt is
 *  - Transpose(K, [0,1,3,2]), or
 *  - Reshape(Transpose(Reshape(K) -> [B*H, S, D], [0,2,1]) -> [B, H, D, S]) (the dynamo
 *    exporter's scaled_dot_product_attention), the dims proven equal by inference;
 * NULL otherwise (*k3 then set when kt is heads_source_perm's transposed form, which has no
 * [B, H, S, D] value: only the 3-D form of Attention can read it). */
static kiln_ir_value *key_of(const kiln_graph *g, const kiln_ir_value *kt, kiln_dtype dt, kiln_ir_value **k3)
{
    *k3 = NULL;
    kiln_node *t = kiln_passes_producer(g, kt, "Transpose");
    if (t && has_perm(t, 0, 1, 3, 2)) return rank4(t->in[0], dt) ? t->in[0] : NULL;
    if (t) {
        *k3 = heads_source_perm(g, kt, dt, true);
        return NULL;
    }
    kiln_node *r2 = kiln_passes_producer(g, kt, "Reshape");
    kiln_node *t3 = r2 ? kiln_passes_producer(g, r2->in[0], "Transpose") : NULL;
    kiln_node *r1 = t3 ? kiln_passes_producer(g, t3->in[0], "Reshape") : NULL;
    if (!r1 || !single_use(g, r2->in[0]) || !single_use(g, t3->in[0]) || !rank4(r1->in[0], dt))
        return NULL;
    int n;
    const int64_t *p = kiln_attr_ints(t3, "perm", &n);
    const kiln_ir_value *k = r1->in[0], *m = t3->in[0];
    const kiln_dim *kd = k->type.dims;
    if (!p || n != 3 || p[0] != 0 || p[1] != 2 || p[2] != 1 || !is_dt(m, dt) || m->type.rank != 3 ||
        !kiln_dim_equal(m->type.dims[1], kd[2]) || !kiln_dim_equal(m->type.dims[2], kd[3]) ||
        !dims_are(kt, &kd[0], &kd[1], &kd[3], &kd[2]))
        return NULL;
    return r1->in[0];
}

/* x = Mul(x0, c) or Mul(c, x0) with c a scalar constant of dtype dt: x0 and *c, else NULL. */
static kiln_ir_value *scaled_by(const kiln_graph *g, const kiln_ir_value *x, kiln_dtype dt, float *c)
{
    kiln_node *mul = kiln_passes_producer(g, x, "Mul");
    if (!mul || !single_use(g, x)) return NULL;
    int side = scalar_const(mul->in[1], dt, c) ? 1 : scalar_const(mul->in[0], dt, c) ? 0 : -1;
    return side >= 0 && rank4(mul->in[1 - side], dt) ? mul->in[1 - side] : NULL;
}

/* Whether mask m may be Attention's attn_mask for scores a [B, H, Sq, Skv]: its dims, aligned
 * right, are a's or 1 (the key dim a's only) where they are constants. A dim inference cannot
 * tell (an exporter's mask built by Expand from data-dependent shapes has dims of its own) is
 * taken: a valid model's mask broadcasts into the scores without widening them, and one that
 * does not fails in the Attention kernel with a message instead of widening the Softmax. */
static bool mask_fits(const kiln_ir_value *m, const kiln_ir_value *a)
{
    const kiln_dim *md = m->type.dims, *ad = a->type.dims;
    for (int i = 0; i < m->type.rank; i++) {
        kiln_dim x = md[m->type.rank - 1 - i], y = ad[3 - i];
        if (kiln_dim_equal(x, y) || !kiln_dim_is_const(x)) continue;
        if (x.c != 1 || i == 0) return false; /* another size, or 1 over the keys */
    }
    return true;
}

/* Whether a, masked by m, are the scores of Q K^T: from its product or scale, [B, H, Sq, Skv]
 * of dtype dt read by nothing else, and m of rank 1 to 4 fits as Attention's mask. */
static bool masked_scores(const kiln_graph *g, const kiln_ir_value *a, const kiln_ir_value *m, kiln_dtype dt)
{
    return m->type.rank >= 1 && m->type.rank <= 4 && scores_of_product(g, a) && rank4(a, dt) && single_use(g, a) &&
           mask_fits(m, a);
}

/* Where(keep, scores, fill) becomes the additive mask Where(keep, 0, fill) of keep's shape, into
 * *mask (the node's output, retyped). */
static kiln_status where_to_mask(kiln_graph *g, kiln_node *wh, kiln_dtype dt, kiln_ir_value **mask, kiln_err *err)
{
    char name[512];
    kiln_value *zero = NULL;
    KILN_TRY(kiln_tensor_new(dt, 0, NULL, &zero, err));
    if (kiln_model_own_value(g->model, zero, err)) return err->code;
    snprintf(name, sizeof name, "%s/mask_zero", wh->name);
    kiln_ir_value *zv = kiln_graph_new_value(g, name, err);
    if (!zv) return err->code;
    kiln_ir_value_set_constant(zv, zero);
    kiln_ir_value *in[3] = {wh->in[0], zv, wh->in[2]};
    KILN_TRY(kiln_node_set_inputs(wh, 3, in, err));
    kiln_type t = wh->in[0]->type;
    t.dtype = dt;
    wh->out[0]->type = t;
    KILN_TRY(kiln_node_bind(wh, err));
    *mask = wh->out[0];
    return KILN_OK;
}

/* Tries the pattern ending in the Softmax sm; on a match rewrites the graph (dead nodes stay
 * for the sweep) and sets *done. */
static kiln_status fuse(kiln_graph *g, kiln_node *sm, kiln_dtype dt, bool gpu16, bool *done, kiln_err *err)
{
    *done = false;
    if (sm->n_in != 1 || sm->n_out != 1 || !sm->out[0] || !rank4(sm->in[0], dt)) return KILN_OK;
    int64_t axis = kiln_attr_int(sm, "axis", sm->opset < 13 ? 1 : -1);
    if (axis != -1 && axis != 3) return KILN_OK;
    kiln_ir_value *scores = sm->in[0], *mask = NULL;
    if (!single_use(g, scores)) return KILN_OK;
    kiln_node *add = kiln_passes_producer(g, scores, "Add");
    kiln_ir_value *x = scores;
    /* Where(keep, scores, fill), fill a float32 constant of -1e30 or less (GPT-2's causal mask):
     * the additive mask Where(keep, 0, fill) as far as a Softmax can tell (a finite fill swallows
     * the score it is added to). The CPU's only: the GPU's decode steps have not been measured
     * on its Attention. */
    kiln_node *wh = gpu16 ? NULL : kiln_passes_producer(g, scores, "Where");
    float fill;
    if (wh && wh->n_in == 3 && wh->in[0] && wh->in[1] && is_dt(wh->in[0], KILN_DTYPE_BOOL) &&
        scalar_const(wh->in[2], dt, &fill) && fill <= -1e30f && masked_scores(g, wh->in[1], wh->in[0], dt))
        x = wh->in[1];
    else
        wh = NULL;
    if (add) {
        /* one side is the scaled Q K^T, the other the mask; the mask must not widen the scores */
        for (int side = 0; side < 2 && !mask; side++) {
            kiln_ir_value *a = add->in[side], *m = add->in[1 - side];
            if (!a || !m || !is_dt(m, dt) || !masked_scores(g, a, m, dt)) continue;
            mask = m;
            x = a;
        }
        if (!mask) return KILN_OK;
    }
    float scale = 1.0f, c;
    bool scaled = false;
    kiln_node *sc = kiln_passes_producer(g, x, "Mul");
    if (!sc) sc = kiln_passes_producer(g, x, "Div");
    if (sc) {
        bool div = !strcmp(sc->op_type, "Div");
        int side = scalar_const(sc->in[1], dt, &c) ? 1 : (!div && scalar_const(sc->in[0], dt, &c) ? 0 : -1);
        if (side < 0 || (div && c == 0.0f) || !single_use(g, sc->in[1 - side]) || !rank4(sc->in[1 - side], dt))
            return KILN_OK;
        scale = div ? 1.0f / c : c;
        scaled = true;
        x = sc->in[1 - side];
    }
    kiln_node *qk = kiln_passes_producer(g, x, "MatMul");
    if (!qk && !scaled && (qk = ms_scaled_matmul(g, x))) {
        scale = kiln_attr_float(qk, "alpha", 1.0f);
        scaled = true;
    }
    if (!qk || !rank4(qk->in[0], dt) || !rank4(qk->in[1], dt) || !single_use(g, qk->in[1])) return KILN_OK;
    kiln_ir_value *q = qk->in[0], *kt = qk->in[1], *q0, *kt0;
    float cq, ck;
    if (!scaled && (q0 = scaled_by(g, q, dt, &cq)) && (kt0 = scaled_by(g, kt, dt, &ck))) {
        /* Q and K^T each scaled (by sqrt(scale): the dynamo exporter's decomposition) */
        scale = cq * ck;
        scaled = true;
        q = q0, kt = kt0;
    }
    kiln_ir_value *k3t = NULL, *k = key_of(g, kt, dt, &k3t);
    if (!k && !k3t) return KILN_OK;
    kiln_node *av = kiln_passes_only_reader(sm->out[0], "MatMul");
    if (!av || av->in[0] != sm->out[0] || av->in[1] == sm->out[0] || !rank4(av->in[1], dt) || !rank4(av->out[0], dt))
        return KILN_OK;
    kiln_ir_value *v = av->in[1];
    /* Q [B, H, Sq, D], K [B, H, Skv, D] (K^T's dims swapped back), V [B, H, Skv, Dv]: no
     * broadcasting between them */
    const kiln_dim *ktd = kt->type.dims;
    const kiln_dim kd[4] = {ktd[0], ktd[1], ktd[3], ktd[2]};
    const kiln_dim *qd = q->type.dims, *vd = v->type.dims;
    for (int i = 0; i < 2; i++)
        if (!kiln_dim_equal(qd[i], kd[i]) || !kiln_dim_equal(qd[i], vd[i])) return KILN_OK;
    if (!kiln_dim_equal(qd[3], kd[3]) || !kiln_dim_equal(kd[2], vd[2])) return KILN_OK;
    if (!kiln_dim_is_const(qd[1]) || qd[1].c <= 0) return KILN_OK;
    if (gpu16 && (!kiln_dim_is_const(qd[3]) || (qd[3].c != 32 && qd[3].c != 64) || !kiln_dim_equal(qd[3], vd[3])))
        return KILN_OK;
    int64_t heads = qd[1].c;

    /* the 3-D form: Q, K, V from [B, S, H*D] and the output back into that layout. The merging
     * Reshape's [B, Sq, ?] keeps the element count, so its last dim is H*Dv even where inference
     * cannot tell (the exporters' [B, S, -1] after a mask of dims of its own) */
    kiln_node *target = av;
    kiln_ir_value *q3 = heads_source(g, q, dt), *k3 = k ? heads_source(g, k, dt) : k3t, *v3 = heads_source(g, v, dt);
    kiln_node *ot = kiln_passes_only_reader(av->out[0], "Transpose"), *orr = NULL;
    if (ot && has_perm(ot, 0, 2, 1, 3)) orr = kiln_passes_only_reader(ot->out[0], "Reshape");
    bool three = q3 && k3 && v3 && orr && orr->in[0] == ot->out[0] && orr->out[0] && is_dt(orr->out[0], dt) &&
                 orr->out[0]->type.rank == 3 && kiln_dim_is_const(vd[3]) &&
                 kiln_dim_equal(orr->out[0]->type.dims[0], qd[0]) && kiln_dim_equal(orr->out[0]->type.dims[1], qd[2]) &&
                 (!kiln_dim_is_const(orr->out[0]->type.dims[2]) || orr->out[0]->type.dims[2].c == heads * vd[3].c);
    if (three) target = orr;
    else if (!k) return KILN_OK;

    kiln_ir_value *in[4];
    kiln_attr *at = kiln_passes_new_attrs(g, 3);
    if (!at) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    in[0] = three ? q3 : q;
    in[1] = three ? k3 : k;
    in[2] = three ? v3 : v;
    in[3] = mask;
    at[0] = (kiln_attr){.name = "scale", .type = KILN_ATTR_FLOAT, .f = scaled ? scale : 1.0f};
    at[1] = (kiln_attr){.name = "q_num_heads", .type = KILN_ATTR_INT, .i = heads};
    at[2] = (kiln_attr){.name = "kv_num_heads", .type = KILN_ATTR_INT, .i = heads};
    if (!kiln_op_lookup("", "Attention", 23)) return KILN_OK;
    if (wh) KILN_TRY(where_to_mask(g, wh, dt, &in[3], err));
    KILN_TRY(kiln_node_set_inputs(target, in[3] ? 4 : 3, in, err));
    target->op_type = "Attention";
    target->domain = "";
    target->opset = 23;
    target->attrs = at;
    target->n_attrs = three ? 3 : 1;
    KILN_TRY(kiln_node_bind(target, err));
    *done = true;
    return KILN_OK;
}

/* The pattern over the Softmax inputs of float32 (the CPU's), or of float16 and bfloat16 with
 * head sizes of 32 or 64 (gpu16: the calls the GPU's tensor-core Attention takes, k_attn.h; its
 * other kernels are slower than the unfused products on cuBLAS). */
static kiln_status fuse_all(kiln_graph *g, bool gpu16, int *fused, kiln_err *err)
{
    *fused = 0;
    bool any = false;
    for (int k = 0; k < g->n_nodes && !any; k++) any = !strcmp(g->nodes[k]->op_type, "Softmax");
    if (!any) return KILN_OK;
    /* the types the pattern checks are the compile's inference, which runs before the CPU's passes */
    static const char *const pure[] = {"MatMul", "Mul", "Div", "Add", "Softmax", "Transpose", "Reshape"};
    bool *candidate = kiln_passes_mark_ops(g, pure, (int)(sizeof pure / sizeof *pure));
    if (!candidate) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    int n0 = g->n_nodes;
    for (int k = 0; k < n0; k++) {
        kiln_node *n = g->nodes[k];
        if (*n->domain || strcmp(n->op_type, "Softmax") || n->n_in < 1 || !n->in[0]) continue;
        kiln_dtype dt = n->in[0]->type.dtype;
        if (gpu16 ? dt != KILN_DTYPE_FLOAT16 && dt != KILN_DTYPE_BFLOAT16 : dt != KILN_DTYPE_FLOAT32) continue;
        bool done;
        KILN_TRY(fuse(g, n, dt, gpu16, &done, err));
        *fused += done;
    }
    if (!*fused) return KILN_OK;
    kiln_passes_sweep(g, candidate);
    return KILN_OK;
}

kiln_status kiln_pass_fuse_attention(kiln_graph *g, int *fused, kiln_err *err) { return fuse_all(g, false, fused, err); }

kiln_status kiln_pass_fuse_attention_gpu(kiln_graph *g, int *fused, kiln_err *err) { return fuse_all(g, true, fused, err); }
