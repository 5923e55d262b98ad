/* fuse_qdq.c - QDQ-format graphs (onnxruntime.quantization.quantize_static with QuantFormat.QDQ)
 * run as int8 kernels, as ONNX Runtime's QDQ transformer rewrites them:
 *
 *   DQ(x) , DQ(w) [, DQ(b)] -> Conv   -> Q   ==>  QLinearConv(x, .., w, .., y_scale, y_zp [, b])
 *   DQ(a) , DQ(b)           -> MatMul -> Q   ==>  QLinearMatMul(a, .., b, .., y_scale, y_zp)
 *     (b constant weights, or an activation with per-tensor parameters: attention's products)
 *   DQ(a) , DQ(b)           -> Add | Mul -> Q  ==>  com.microsoft QLinearAdd | QLinearMul
 *     (per-tensor parameters, one 8-bit type throughout)
 *   DQ(x) -> MaxPool | Reshape | Transpose | Flatten | Squeeze | Unsqueeze | Resize (nearest) -> Q
 *     ==>  the op on x
 *     (the Q's scale and zero point equal the DQ's: max and data movement commute with the
 *      monotone DQ, and Q(DQ(v)) == v, so this one is exact)
 *   DQ(x) -> BatchNormalization (inference, constant or DQ'd constant parameters) -> Q
 *     ==>  kiln.ChannelLookup(x, T): each channel's 256 outputs tabulated with the reference
 *     kernels' arithmetic (src/ops/cast_quant.c, reduce_norm.c), so this one is exact as well
 *     (ORT runs the three nodes)
 *
 * The fused node takes the Q's place and output (and name). Requirements, those of ORT's
 * selectors: activations' scales and zero points per tensor (constant, scale > 0), weights
 * constant 8-bit with per-tensor or per-output-channel scales (Conv: axis 0; MatMul: per column,
 * axis 1), a Conv bias constant int32 with zero zero point and scale x_scale * w_scale[m] (as
 * quantize_static writes it), every intermediate float read only by the group. The fused result is
 * what ORT computes for the group (int32 sums, its float32 requantization), not the float chain's
 * rounding. Runs before constant folding (which would turn DQ(w) into float weights): optimised
 * sessions whose first provider is the CPU. Infers the graph first. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "ops/eval.h"
#include "ops/op.h"
#include "ops/quant_internal.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

static bool is_op(const kiln_node *n, const char *op_type) { return n && !*n->domain && !strcmp(n->op_type, op_type); }

static bool dt_8bit(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

static const kiln_value *constant(const kiln_ir_value *v)
{
    const kiln_value *t = kiln_ir_constant(v);
    return t && !v->producer && t->kind == KILN_VALUE_TENSOR ? t : NULL;
}

/* A Q or DQ node's parameters: scale and zero point constants. */
typedef struct qparams {
    const kiln_ir_value *scale, *zp; /* the values (inputs 1 and 2) */
    const kiln_value *s, *z;         /* their constants */
} qparams;

/* The parameters of Q/DQ node n when they are constants (scale float32, > 0; zero point 8-bit
 * with `count` elements, 1 or the channel count of `axis`); false otherwise. */
static bool params(const kiln_node *n, qparams *p, int64_t count, int axis)
{
    if (n->n_in != 3 || !n->in[1] || !n->in[2] || n->n_out != 1 || !n->out[0] || kiln_node_attr(n, "block_size"))
        return false;
    p->scale = n->in[1], p->zp = n->in[2];
    p->s = constant(p->scale), p->z = constant(p->zp);
    if (!p->s || !p->z || p->s->dtype != KILN_DTYPE_FLOAT32 || !dt_8bit(p->z->dtype) || p->s->numel != count ||
        p->z->numel != count || p->s->rank > 1 || p->z->rank > 1)
        return false;
    if (count > 1 && kiln_attr_int(n, "axis", 1) != axis) return false;
    for (int64_t i = 0; i < count; i++)
        if (!(((const float *)p->s->data)[i] > 0.0f)) return false;
    return true;
}

/* Whether two per-tensor parameter sets hold the same scale and zero point. */
static bool same_params(const qparams *a, const qparams *b)
{
    return a->z->dtype == b->z->dtype && ((const float *)a->s->data)[0] == ((const float *)b->s->data)[0] &&
           kiln_load_i64(a->z->dtype, a->z->data, 0) == kiln_load_i64(b->z->dtype, b->z->data, 0);
}

/* The DequantizeLinear of g producing v from an 8-bit activation with per-tensor parameters. */
static kiln_node *dq_act(const kiln_graph *g, const kiln_ir_value *v, qparams *p)
{
    kiln_node *d = v ? v->producer : NULL;
    if (!is_op(d, "DequantizeLinear") || d->graph != g || d->out[0] != v || !d->in[0] || !params(d, p, 1, 0)) return NULL;
    const kiln_ir_value *x = d->in[0];
    if (x->type.kind != KILN_VALUE_TENSOR || x->type.dtype != p->z->dtype) return NULL;
    return d;
}

/* The DequantizeLinear of g producing v from constant 8-bit weights, rank `rank`, with 1 or
 * dims[axis] scales along `axis`. */
static kiln_node *dq_weight(const kiln_graph *g, const kiln_ir_value *v, int rank, int axis, qparams *p,
                            const kiln_value **w)
{
    kiln_node *d = v ? v->producer : NULL;
    if (!is_op(d, "DequantizeLinear") || d->graph != g || d->out[0] != v || !d->in[0]) return NULL;
    *w = constant(d->in[0]);
    if (!*w || !dt_8bit((*w)->dtype) || (*w)->rank != rank) return NULL;
    const kiln_value *s = constant(d->n_in > 1 ? d->in[1] : NULL);
    int64_t count = s && s->numel == (*w)->dims[axis] ? (*w)->dims[axis] : 1;
    if (!params(d, p, count, axis) || p->z->dtype != (*w)->dtype) return NULL;
    return d;
}

/* The only reader of v, a QuantizeLinear of g with per-tensor parameters, else NULL. */
static kiln_node *q_after(const kiln_graph *g, const kiln_ir_value *v, qparams *p)
{
    kiln_node *n = v ? kiln_ir_value_only_reader(v) : NULL;
    return n && n->graph == g && n->n_in > 0 && n->in[0] == v && is_op(n, "QuantizeLinear") && params(n, p, 1, 0)
               ? n
               : NULL;
}

/* Rewrites node q into op (domain, opset) over inputs in[0..n_in), keeping q's output and
 * taking `attrs_from`'s attributes. */
static kiln_status become_op(kiln_graph *g, kiln_node *q, const char *domain, const char *op_type, int opset,
                             kiln_ir_value *const *in, int n_in, const kiln_node *attrs_from, bool *done, kiln_err *err)
{
    const kiln_op_def *op = kiln_op_lookup(domain, op_type, opset);
    if (!op) return KILN_OK;
    KILN_TRY(kiln_node_set_inputs(q, n_in, in, err));
    q->op_type = op_type;
    q->domain = domain;
    q->opset = opset;
    q->op = op;
    q->attrs = attrs_from ? attrs_from->attrs : NULL;
    q->n_attrs = attrs_from ? attrs_from->n_attrs : 0;
    *done = true;
    return KILN_OK;
}

static kiln_status become(kiln_graph *g, kiln_node *q, const char *op_type, int opset, kiln_ir_value *const *in,
                          int n_in, const kiln_node *attrs_from, bool *done, kiln_err *err)
{
    return become_op(g, q, "", op_type, opset, in, n_in, attrs_from, done, err);
}

static kiln_status fuse_conv(kiln_graph *g, kiln_node *c, bool *done, kiln_err *err)
{
    qparams px, pw, py;
    const kiln_value *w;
    if (c->n_in < 2 || c->n_in > 3 || c->n_out != 1 || !c->out[0]) return KILN_OK;
    kiln_node *dx = dq_act(g, c->in[0], &px), *dw = dx ? dq_weight(g, c->in[1], c->in[0]->type.rank, 0, &pw, &w) : NULL;
    kiln_node *q = dw ? q_after(g, c->out[0], &py) : NULL;
    if (!q || w->rank < 3) return KILN_OK;
    int64_t M = w->dims[0];
    kiln_ir_value *bias = NULL;
    if (c->n_in == 3 && c->in[2]) {
        /* the bias DQ: int32 [M], zero zero point, scale x_scale * w_scale[m] */
        kiln_node *db = c->in[2]->producer;
        const kiln_value *b = db && is_op(db, "DequantizeLinear") && db->graph == g ? constant(db->in[0]) : NULL;
        if (!b || b->dtype != KILN_DTYPE_INT32 || b->rank != 1 || b->numel != M || db->n_in < 2 || db->n_out != 1)
            return KILN_OK;
        const kiln_value *bs = constant(db->in[1]), *bz = db->n_in > 2 ? constant(db->in[2]) : NULL;
        if (!bs || bs->dtype != KILN_DTYPE_FLOAT32 || (bs->numel != 1 && bs->numel != M) ||
            (bs->numel > 1 && kiln_attr_int(db, "axis", 1) != 0 && kiln_attr_int(db, "axis", 1) != -1))
            return KILN_OK;
        if (db->n_in > 2 && db->in[2] && (!bz || bz->numel != bs->numel || bz->dtype != KILN_DTYPE_INT32)) return KILN_OK;
        float xs = ((const float *)px.s->data)[0];
        for (int64_t m = 0; m < M; m++) {
            float want = xs * ((const float *)pw.s->data)[pw.s->numel == 1 ? 0 : m];
            if (((const float *)bs->data)[bs->numel == 1 ? 0 : m] != want) return KILN_OK;
            if (bz && kiln_load_i64(bz->dtype, bz->data, bz->numel == 1 ? 0 : m)) return KILN_OK;
        }
        bias = db->in[0];
    }
    kiln_ir_value *in[9] = {dx->in[0], dx->in[1], dx->in[2], dw->in[0], dw->in[1], dw->in[2], q->in[1], q->in[2], bias};
    return become(g, q, "QLinearConv", 10, in, bias ? 9 : 8, c, done, err);
}

static kiln_status fuse_matmul(kiln_graph *g, kiln_node *mm, bool *done, kiln_err *err)
{
    qparams pa, pb, py;
    const kiln_value *b;
    if (mm->n_in != 2 || mm->n_out != 1 || !mm->out[0]) return KILN_OK;
    kiln_node *da = dq_act(g, mm->in[0], &pa), *db = da ? dq_weight(g, mm->in[1], 2, 1, &pb, &b) : NULL;
    if (da && !db) db = dq_act(g, mm->in[1], &pb); /* two activations */
    kiln_node *q = db ? q_after(g, mm->out[0], &py) : NULL;
    if (!q) return KILN_OK;
    kiln_ir_value *in[8] = {da->in[0], da->in[1], da->in[2], db->in[0], db->in[1], db->in[2], q->in[1], q->in[2]};
    return become(g, q, "QLinearMatMul", 10, in, 8, NULL, done, err);
}

/* DQ(a), DQ(b) -> Add or Mul -> Q, one 8-bit type: ORT's QLinearAdd / QLinearMul. */
static kiln_status fuse_binary(kiln_graph *g, kiln_node *n, const char *fused, bool *done, kiln_err *err)
{
    qparams pa, pb, py;
    if (n->n_in != 2 || n->n_out != 1 || !n->out[0] || n->in[0] == n->in[1]) return KILN_OK;
    kiln_node *da = dq_act(g, n->in[0], &pa), *db = da ? dq_act(g, n->in[1], &pb) : NULL;
    kiln_node *q = db ? q_after(g, n->out[0], &py) : NULL;
    if (!q || pa.z->dtype != pb.z->dtype || pa.z->dtype != py.z->dtype) return KILN_OK;
    kiln_ir_value *in[8] = {da->in[0], da->in[1], da->in[2], db->in[0], db->in[1], db->in[2], q->in[1], q->in[2]};
    return become_op(g, q, "com.microsoft", fused, 1, in, 8, NULL, done, err);
}

/* DQ -> data movement -> Q with equal parameters: the op runs on the 8-bit values. */
static kiln_status drop_pair(kiln_graph *g, kiln_node *op, int *dropped, kiln_err *err)
{
    qparams pd, pq;
    if (op->n_in < 1 || !op->in[0] || op->n_out < 1 || !op->out[0]) return KILN_OK;
    for (int o = 1; o < op->n_out; o++)
        if (op->out[o]) return KILN_OK; /* MaxPool's Indices */
    kiln_node *d = dq_act(g, op->in[0], &pd);
    kiln_node *q = d ? q_after(g, op->out[0], &pq) : NULL;
    if (!q || !same_params(&pd, &pq)) return KILN_OK;
    if (is_op(op, "MaxPool") && op->opset < 12) return KILN_OK; /* 8-bit MaxPool since opset 12 */
    if (is_op(op, "Resize") && (op->opset < 11 || strcmp(kiln_attr_string(op, "mode", "nearest"), "nearest")))
        return KILN_OK; /* nearest only copies values (opset 11 and later, as quantize_static writes) */
    kiln_ir_value *y = q->out[0];
    KILN_TRY(kiln_node_set_input(op, 0, d->in[0], err));
    kiln_node_unlink(q);
    g->nodes[q->index] = NULL;
    kiln_node_set_output(op, 0, y);
    (*dropped)++;
    return KILN_OK;
}

/* The float32 values [count] of v: a constant, or the DequantizeLinear of constants, evaluated
 * into *owned (freed by the caller). NULL when v is neither. */
static const float *float_param(const kiln_graph *g, const kiln_ir_value *v, int64_t count, kiln_value **owned,
                                kiln_err *err)
{
    *owned = NULL;
    const kiln_value *t = v ? constant(v) : NULL;
    kiln_node *d = v ? v->producer : NULL;
    if (!t && is_op(d, "DequantizeLinear") && d->graph == g && d->n_out == 1) {
        for (int i = 0; i < d->n_in; i++)
            if (d->in[i] && !constant(d->in[i])) return NULL;
        kiln_err e = {0};
        if (kiln_node_evaluate(d, 0, owned, &e)) return NULL;
        t = *owned;
    }
    (void)err;
    return t && t->dtype == KILN_DTYPE_FLOAT32 && t->numel == count && t->rank <= 1 ? t->data : NULL;
}

/* DQ(x) -> BatchNormalization -> Q as a per-channel table of the three reference kernels. */
static kiln_status fuse_bn(kiln_graph *g, kiln_node *bn, bool *done, kiln_err *err)
{
    qparams px, py;
    if (bn->n_in != 5 || bn->n_out != 1 || !bn->out[0] || kiln_attr_int(bn, "training_mode", 0) ||
        (bn->opset < 9 && !kiln_attr_int(bn, "spatial", 1)) || (bn->opset < 7 && !kiln_attr_int(bn, "is_test", 0)))
        return KILN_OK;
    kiln_node *dx = dq_act(g, bn->in[0], &px), *q = dx ? q_after(g, bn->out[0], &py) : NULL;
    const kiln_ir_value *x = dx ? dx->in[0] : NULL;
    if (!q || x->type.rank < 2 || !kiln_dim_is_const(x->type.dims[1]) || x->type.dims[1].c < 1 ||
        x->type.dims[1].c > 4096)
        return KILN_OK;
    int64_t C = x->type.dims[1].c;
    kiln_value *own[4] = {0}, *T = NULL;
    const float *p[4]; /* scale, B, mean, var */
    bool ok = true;
    for (int i = 0; i < 4; i++) ok = (p[i] = float_param(g, bn->in[i + 1], C, &own[i], err)) && ok;
    kiln_status st = KILN_OK;
    if (ok && !(st = kiln_tensor_new(py.z->dtype, 2, (int64_t[]){C, 256}, &T, err))) {
        double eps = kiln_attr_float(bn, "epsilon", 1e-5f);
        float sx = ((const float *)px.s->data)[0], sy = ((const float *)py.s->data)[0];
        int64_t zx = kiln_load_i64(px.z->dtype, px.z->data, 0), zy = kiln_load_i64(py.z->dtype, py.z->data, 0), lo, hi;
        kiln_quant_int_range(py.z->dtype, &lo, &hi);
        for (int64_t c = 0; c < C; c++)
            for (int b = 0; b < 256; b++) {
                int64_t xv = px.z->dtype == KILN_DTYPE_INT8 ? (int8_t)b : b;
                float f = (float)((double)(xv - zx) * (double)sx);                                   /* DQ */
                float v = (float)(((double)f - p[2][c]) / sqrt((double)p[3][c] + eps) * p[0][c] + p[1][c]); /* BN */
                double r = rint((double)(float)((double)v / (double)sy)) + (double)zy;                /* Q */
                if (isnan(r)) r = (double)lo;
                kiln_store_i64(py.z->dtype, T->data, c * 256 + b, (int64_t)fmin(fmax(r, (double)lo), (double)hi));
            }
        char name[512];
        snprintf(name, sizeof name, "%s/lookup", bn->name);
        kiln_ir_value *tv = NULL;
        if (!(st = kiln_model_own_value(g->model, T, err)) && !(tv = kiln_graph_new_value(g, name, err))) st = err->code;
        if (!st) {
            kiln_ir_value_set_constant(tv, T);
            const kiln_op_def *op = kiln_op_lookup("kiln", "ChannelLookup", 1);
            kiln_ir_value *in[2] = {dx->in[0], tv};
            if (op && !(st = kiln_node_set_inputs(q, 2, in, err))) {
                q->op_type = "ChannelLookup", q->domain = "kiln", q->opset = 1, q->op = op;
                q->attrs = NULL, q->n_attrs = 0;
                *done = true;
            }
        }
    }
    for (int i = 0; i < 4; i++) kiln_value_free(own[i]);
    return st;
}

kiln_status kiln_pass_fuse_qdq(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    bool any_q = false, any_dq = false;
    for (int k = 0; k < g->n_nodes; k++) {
        any_q = any_q || is_op(g->nodes[k], "QuantizeLinear");
        any_dq = any_dq || is_op(g->nodes[k], "DequantizeLinear");
    }
    if (!any_q || !any_dq) return KILN_OK;
    KILN_TRY(kiln_graph_infer(g, NULL)); /* the activations' dtypes */
    bool *candidate = kiln_arena_calloc(&g->model->arena, (size_t)g->n_nodes + 1, sizeof *candidate);
    if (!candidate) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    for (int k = 0; k < g->n_nodes; k++) g->nodes[k]->index = k;
    int n0 = g->n_nodes;
    for (int k = 0; k < n0; k++) {
        kiln_node *n = g->nodes[k];
        if (!n) continue;
        bool done = false;
        if (is_op(n, "Conv")) KILN_TRY(fuse_conv(g, n, &done, err));
        else if (is_op(n, "MatMul")) KILN_TRY(fuse_matmul(g, n, &done, err));
        else if (is_op(n, "BatchNormalization")) KILN_TRY(fuse_bn(g, n, &done, err));
        else if (is_op(n, "Add")) KILN_TRY(fuse_binary(g, n, "QLinearAdd", &done, err));
        else if (is_op(n, "Mul")) KILN_TRY(fuse_binary(g, n, "QLinearMul", &done, err));
        else if (is_op(n, "MaxPool") || is_op(n, "Reshape") || is_op(n, "Transpose") || is_op(n, "Flatten") ||
                 is_op(n, "Squeeze") || is_op(n, "Unsqueeze") || is_op(n, "Resize"))
            KILN_TRY(drop_pair(g, n, fused, err));
        *fused += done;
    }
    if (!*fused) return KILN_OK;
    for (int k = 0; k < n0; k++)
        candidate[k] = g->nodes[k] && (is_op(g->nodes[k], "Conv") || is_op(g->nodes[k], "MatMul") ||
                                       is_op(g->nodes[k], "BatchNormalization") || is_op(g->nodes[k], "Add") ||
                                       is_op(g->nodes[k], "Mul") ||
                                       is_op(g->nodes[k], "DequantizeLinear"));
    kiln_passes_sweep(g, candidate);
    return KILN_OK;
}
