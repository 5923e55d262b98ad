/* fuse_quant_matmul.c - the chain onnxruntime.quantization.quantize_dynamic writes for each
 * MatMul becomes one com.microsoft MatMulIntegerToFloat node, as ORT's own fusion does:
 *
 *   MatMulInteger(A, B, a_zp, b_zp) -> Cast(to float) -> Mul(., Mul(x, y)) [-> Add(., bias)]
 *   ==>  MatMulIntegerToFloat(A, B, x, y, a_zp, b_zp, bias)
 *
 * with x a float32 scalar (DynamicQuantizeLinear's scale), y a float32 constant of 1 or N values
 * (the weights' scales), B a constant 2-D 8-bit [K, N] and bias a float32 constant of N values.
 * The fused node computes float(acc) * fl(x * y[j]) (+ bias[j]): the very float32 operations of
 * the chain, in the same order, so the result is bit for bit the chain's. The last node of the
 * chain becomes the fused node and keeps its output (and name); every intermediate must have no
 * other reader and not be a graph output; the scales' Mul stays when something else reads it.
 * DynamicQuantizeLinear is kept: its output usually feeds several MatMulIntegers (Q, K, V) and
 * is quantized once for all of them. CPU sessions only. */
#include <string.h>

#include "core/dtype.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

static bool is_t(const kiln_ir_value *v, kiln_dtype dt)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.dtype == dt;
}

static bool is_8bit(const kiln_ir_value *v) { return is_t(v, KILN_DTYPE_UINT8) || is_t(v, KILN_DTYPE_INT8); }

/* Whether v's static type has one element (rank 0, or rank 1 of dim 1). */
static bool is_scalar(const kiln_ir_value *v)
{
    if (!v || v->type.kind != KILN_VALUE_TENSOR) return false;
    if (v->type.rank == 0) return true;
    return v->type.rank == 1 && kiln_dim_is_const(v->type.dims[0]) && v->type.dims[0].c == 1;
}

/* The node of g producing v as its only output with this op type (default domain), or NULL. */
/* Whether t, a float32 constant, holds 1 or N values along its last axis (rank <= 1). */
static bool per_column(const kiln_value *t, int64_t N, bool allow_one)
{
    return t && t->kind == KILN_VALUE_TENSOR && t->dtype == KILN_DTYPE_FLOAT32 && t->rank <= 1 &&
           ((allow_one && t->numel == 1) || (t->numel == N && (t->rank == 1 || N == 1)));
}

/* Tries the chain from the MatMulInteger m; on a match rewrites its last node and sets *done. */
static kiln_status fuse(kiln_graph *g, kiln_node *m, bool *done, kiln_err *err)
{
    *done = false;
    if (m->n_out != 1 || m->n_in < 2 || m->n_in > 4 || !is_8bit(m->in[0]) || !is_8bit(m->in[1]) ||
        !is_t(m->out[0], KILN_DTYPE_INT32))
        return KILN_OK;
    const kiln_value *B = kiln_ir_constant(m->in[1]);
    if (!B || m->in[1]->producer || B->kind != KILN_VALUE_TENSOR || B->rank != 2) return KILN_OK;
    int64_t N = B->dims[1];
    kiln_ir_value *azp = m->n_in > 2 ? m->in[2] : NULL, *bzp = m->n_in > 3 ? m->in[3] : NULL;
    if (azp && !is_scalar(azp)) return KILN_OK; /* per-row zero points: MatMulIntegerToFloat has none */
    /* the output is [..., N] (rank >= 1, B being 2-D): scales and bias of rank <= 1 never widen it */
    /* Cast(to float), then Mul by the scales' product */
    kiln_node *cast = kiln_passes_only_reader(m->out[0], "Cast");
    if (!cast || cast->n_in != 1 || kiln_attr_int(cast, "to", 0) != KILN_DTYPE_FLOAT32 ||
        !is_t(cast->out[0], KILN_DTYPE_FLOAT32))
        return KILN_OK;
    kiln_node *mul = kiln_passes_only_reader(cast->out[0], "Mul");
    kiln_ir_value *s = mul ? kiln_passes_other_input(mul, cast->out[0]) : NULL;
    kiln_node *sm = kiln_passes_producer(g, s, "Mul");
    if (!sm || sm->n_in != 2 || !is_t(s, KILN_DTYPE_FLOAT32) || !is_t(mul->out[0], KILN_DTYPE_FLOAT32))
        return KILN_OK;
    /* x the scalar, y the constant per-column scales (fl(x * y) == fl(y * x)) */
    kiln_ir_value *x = NULL, *y = NULL;
    for (int side = 0; side < 2 && !x; side++) {
        kiln_ir_value *p = sm->in[side], *q = sm->in[1 - side];
        if (is_t(p, KILN_DTYPE_FLOAT32) && is_scalar(p) && is_t(q, KILN_DTYPE_FLOAT32) &&
            per_column(kiln_ir_constant(q), N, true) && !q->producer)
            x = p, y = q;
    }
    if (!x) return KILN_OK;

    /* an Add of a constant bias [N] after it joins the node */
    kiln_node *last = mul, *add = kiln_passes_only_reader(mul->out[0], "Add");
    kiln_ir_value *bias = NULL;
    if (add) {
        kiln_ir_value *b = kiln_passes_other_input(add, mul->out[0]);
        if (b && !b->producer && per_column(kiln_ir_constant(b), N, false) && is_t(add->out[0], KILN_DTYPE_FLOAT32))
            bias = b, last = add;
    }

    const kiln_op_def *op = kiln_op_lookup("com.microsoft", "MatMulIntegerToFloat", 1);
    if (!op) return KILN_OK;
    kiln_ir_value *in[7] = {m->in[0], m->in[1], x, y, azp, bzp, bias};
    KILN_TRY(kiln_node_set_inputs(last, bias ? 7 : 6, in, err));
    last->op_type = "MatMulIntegerToFloat";
    last->domain = "com.microsoft";
    last->opset = 1;
    last->op = op;
    last->attrs = NULL;
    last->n_attrs = 0;
    *done = true;
    return KILN_OK;
}

kiln_status kiln_pass_fuse_quant_matmul(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    bool any = false;
    for (int k = 0; k < g->n_nodes && !any; k++) any = !*g->nodes[k]->domain && !strcmp(g->nodes[k]->op_type, "MatMulInteger");
    if (!any) return KILN_OK;
    static const char *const pure[] = {"MatMulInteger", "Cast", "Mul"};
    bool *candidate = kiln_passes_mark_ops(g, pure, (int)(sizeof pure / sizeof *pure));
    if (!candidate) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    int n0 = g->n_nodes;
    for (int k = 0; k < n0; k++) {
        kiln_node *n = g->nodes[k];
        if (*n->domain || strcmp(n->op_type, "MatMulInteger")) continue;
        bool done;
        KILN_TRY(fuse(g, n, &done, err));
        *fused += done;
    }
    if (*fused) kiln_passes_sweep(g, candidate);
    return KILN_OK;
}
