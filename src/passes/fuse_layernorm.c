/* fuse_layernorm.c - layer normalisation written out as element-wise ops and reductions (as
 * exporters write it below opset 17: PyTorch at opset 14, paddle2onnx, tf2onnx) becomes one
 * LayerNormalization node (opset 17), which the CPU provider runs in one pass per row:
 *
 *   m = ReduceMean(x, axes)   d = Sub(x, m)   v = ReduceMean(Pow(d, 2) or Mul(d, d), axes)
 *   y = Add(Mul(Div(d, Sqrt(Add(v, eps))), gamma), beta)
 *
 * axes the last k axes of x (attribute, or from opset 18 a constant input), keepdims 1; eps a
 * float32 scalar constant (either side of its Add); gamma and beta float32 constants of the
 * normalised dims (either side of their Mul and Add; beta may be absent). x and every
 * intermediate are float32 and the intermediates have no readers outside the pattern. The
 * rewritten node computes with its own rounding (the mean and variance in one pass each), within
 * float32 tolerance of the unfused ops. CPU sessions only. */
#include <string.h>

#include "core/dtype.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

/* Whether v is float32, not a graph output, and read by exactly `readers` nodes. */
static bool inner(const kiln_ir_value *v, int readers)
{
    return kiln_ir_is_f32(v) && !v->is_output && kiln_ir_value_readers(v) == readers;
}

/* kiln_passes_only_reader of a float32 v */
static kiln_node *only_reader(const kiln_ir_value *v, const char *op_type)
{
    return kiln_ir_is_f32(v) ? kiln_passes_only_reader(v, op_type) : NULL;
}

/* A float32 constant with one element: its value in *c. */
static bool scalar(const kiln_ir_value *v, double *c)
{
    const kiln_value *t = v ? kiln_ir_constant(v) : NULL;
    if (!t || v->producer || t->kind != KILN_VALUE_TENSOR || t->dtype != KILN_DTYPE_FLOAT32 || t->numel != 1) return false;
    *c = *(const float *)t->data;
    return true;
}

/* The first axis k of rank-r ReduceMean r reducing exactly axes [k, r) with keepdims 1, or -1. */
static int reduced_from(const kiln_node *rm, int r)
{
    if (kiln_attr_int(rm, "keepdims", 1) != 1 || r < 1) return -1;
    int n = 0;
    const int64_t *axes = NULL;
    if (rm->opset >= 18) {
        if (rm->n_in < 2) return -1; /* no axes: every axis (noop_with_empty_axes aside) */
        const kiln_value *t = kiln_ir_constant(rm->in[1]);
        if (!t || t->dtype != KILN_DTYPE_INT64 || t->rank != 1) return -1;
        axes = t->data, n = (int)t->numel;
    } else {
        axes = kiln_attr_ints(rm, "axes", &n);
    }
    if (!axes || n < 1 || n > r) return -1;
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
        int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
        if (a < r - n || a >= r || seen[a]) return -1;
        seen[a] = true;
    }
    return r - n;
}

/* Whether constant v has exactly the normalised dims of x (axes [k, r)), as LayerNormalization
 * reads Scale and B. */
static bool per_element(const kiln_ir_value *v, const kiln_ir_value *x, int k)
{
    const kiln_value *t = v ? kiln_ir_constant(v) : NULL;
    int r = x->type.rank, n = r - k;
    if (!t || v->producer || t->kind != KILN_VALUE_TENSOR || t->dtype != KILN_DTYPE_FLOAT32 || t->rank != n) return false;
    for (int i = 0; i < n; i++) {
        kiln_dim d = x->type.dims[k + i];
        if (!kiln_dim_is_const(d) || d.c != t->dims[i]) return false;
    }
    return true;
}

/* Tries the pattern from its first ReduceMean m; on a match rewrites its last node into
 * LayerNormalization and sets *done. */
static kiln_status fuse(kiln_graph *g, kiln_node *m, bool *done, kiln_err *err)
{
    *done = false;
    kiln_ir_value *x = m->in[0];
    if (m->n_out != 1 || !kiln_ir_is_f32(x) || x->type.rank < 1) return KILN_OK;
    int r = x->type.rank, k = reduced_from(m, r);
    if (k < 0) return KILN_OK;
    kiln_node *sub = only_reader(m->out[0], "Sub");
    if (!sub || sub->n_in != 2 || sub->in[0] != x || sub->in[1] != m->out[0]) return KILN_OK;
    kiln_ir_value *d = sub->out[0];
    if (!kiln_ir_is_f32(d) || d->is_output || d->n_captured) return KILN_OK;
    /* d's readers: the square (Pow(d, 2), or Mul(d, d): two input slots) and the Div, no other */
    kiln_node *sq = NULL, *div = NULL;
    for (int u = 0; u < d->n_uses; u++) {
        kiln_node *nd = d->uses[u].node;
        double two;
        if (*nd->domain || nd->n_out != 1 || nd->n_in != 2) return KILN_OK;
        if (!strcmp(nd->op_type, "Div") && nd->in[0] == d && nd->in[1] != d && (!div || div == nd)) div = nd;
        else if (!strcmp(nd->op_type, "Pow") && nd->in[0] == d && scalar(nd->in[1], &two) && two == 2.0 && !sq) sq = nd;
        else if (!strcmp(nd->op_type, "Mul") && nd->in[0] == d && nd->in[1] == d && (!sq || sq == nd)) sq = nd;
        else return KILN_OK;
    }
    if (!sq || !div || d->n_uses != (strcmp(sq->op_type, "Mul") ? 2 : 3)) return KILN_OK;
    kiln_node *vm = only_reader(sq->out[0], "ReduceMean");
    if (!vm || vm->in[0] != sq->out[0] || reduced_from(vm, r) != k) return KILN_OK;
    kiln_node *add_eps = only_reader(vm->out[0], "Add");
    double eps;
    if (!add_eps || !scalar(kiln_passes_other_input(add_eps, vm->out[0]), &eps) || !(eps >= 0)) return KILN_OK;
    kiln_node *sqrt = only_reader(add_eps->out[0], "Sqrt");
    if (!sqrt || sqrt->out[0] != div->in[1] || !inner(sqrt->out[0], 1)) return KILN_OK;
    kiln_node *mul = only_reader(div->out[0], "Mul");
    kiln_ir_value *gamma = kiln_passes_other_input(mul, div->out[0]);
    if (!mul || !per_element(gamma, x, k)) return KILN_OK;
    kiln_node *target = mul, *add_b = only_reader(mul->out[0], "Add");
    kiln_ir_value *beta = kiln_passes_other_input(add_b, mul->out[0]);
    if (add_b && per_element(beta, x, k)) target = add_b;
    else beta = NULL;
    if (!kiln_ir_is_f32(target->out[0]) || target->out[0]->type.rank != r || !kiln_op_lookup("", "LayerNormalization", 17))
        return KILN_OK;
    kiln_attr *at = kiln_passes_new_attrs(g, 2);
    if (!at) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    at[0] = (kiln_attr){.name = "axis", .type = KILN_ATTR_INT, .i = k};
    at[1] = (kiln_attr){.name = "epsilon", .type = KILN_ATTR_FLOAT, .f = (float)eps};
    kiln_ir_value *ins[3] = {x, gamma, beta};
    KILN_TRY(kiln_passes_become(target, "LayerNormalization", "", 17, beta ? 3 : 2, ins, at, 2, err));
    *done = true;
    return KILN_OK;
}

kiln_status kiln_pass_fuse_layernorm(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    bool any = false;
    for (int k = 0; k < g->n_nodes && !any; k++) any = !*g->nodes[k]->domain && !strcmp(g->nodes[k]->op_type, "ReduceMean");
    if (!any) return KILN_OK;
    static const char *const pure[] = {"ReduceMean", "Sub", "Pow", "Mul", "Add", "Sqrt", "Div"};
    bool *candidate = kiln_passes_mark_ops(g, pure, (int)(sizeof pure / sizeof *pure));
    if (!candidate) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    int n0 = g->n_nodes;
    for (int k = 0; k < n0; k++) {
        kiln_node *n = g->nodes[k];
        if (*n->domain || strcmp(n->op_type, "ReduceMean") || n->n_in < 1 || !n->in[0]) continue;
        /* the first ReduceMean of a pattern reads x, which its Sub reads too */
        bool done;
        KILN_TRY(fuse(g, n, &done, err));
        *fused += done;
    }
    if (!*fused) return KILN_OK;
    kiln_passes_sweep(g, candidate);
    return KILN_OK;
}
