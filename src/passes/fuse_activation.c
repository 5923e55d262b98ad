/* fuse_activation.c - an element-wise activation that is the only reader of a float32 Conv's,
 * Gemm's or MatMul's (by constant 2-D weights) output becomes part of that node (kiln_node.act):
 * the CPU provider applies it while the output tile is still in cache, and the activation's pass
 * over memory disappears. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "passes/passes.h"

/* Readers of v in g: node inputs, subgraph captures, graph outputs. */
static int readers(const kiln_graph *g, const kiln_ir_value *v)
{
    int n = v->is_output;
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *nd = g->nodes[k];
        for (int i = 0; i < nd->n_in; i++) n += nd->in[i] == v;
        for (int a = 0; a < nd->n_attrs; a++)
            for (int q = 0; q < kiln_attr_graph_count(&nd->attrs[a]); q++) {
                const kiln_graph *sg = kiln_attr_graph_at(&nd->attrs[a], q);
                for (int r = 0; r < sg->n_captures; r++) n += sg->captures[r] == v;
            }
    }
    return n;
}

static bool is_f32(const kiln_ir_value *v)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.dtype == KILN_DTYPE_FLOAT32;
}

/* The constant float32 scalar at input i of n into *out; true also when the input is absent. */
static bool const_scalar(const kiln_node *n, int i, float *out)
{
    const kiln_ir_value *v = i < n->n_in ? n->in[i] : NULL;
    if (!v) return true;
    const kiln_value *t = kiln_ir_constant(v);
    if (v->producer || !t) return false;
    if (t->kind != KILN_VALUE_TENSOR || t->dtype != KILN_DTYPE_FLOAT32 || t->numel != 1) return false;
    float f = *(const float *)t->data;
    if (!isnan(f)) *out = f; /* a NaN bound is ignored, as the Clip kernels do */
    return true;
}

/* The activation node `a` computes, or KILN_ACT_NONE when it is not one this pass fuses. */
static kiln_act activation(const kiln_node *a)
{
    kiln_act act = {KILN_ACT_NONE, 0.0f, 0.0f};
    if (*a->domain || a->n_out != 1 || !a->out[0] || a->n_in < 1 || !a->in[0] || !is_f32(a->out[0])) return act;
    const char *op = a->op_type;
    if (!strcmp(op, "Relu") && a->n_in == 1) {
        act.kind = KILN_ACT_RELU;
    } else if (!strcmp(op, "Sigmoid") && a->n_in == 1) {
        act.kind = KILN_ACT_SIGMOID;
    } else if (!strcmp(op, "HardSigmoid") && a->n_in == 1) {
        act = (kiln_act){KILN_ACT_HARD_SIGMOID, kiln_attr_float(a, "alpha", 0.2f), kiln_attr_float(a, "beta", 0.5f)};
    } else if (!strcmp(op, "HardSwish") && a->n_in == 1) {
        act.kind = KILN_ACT_HARD_SWISH;
    } else if (!strcmp(op, "LeakyRelu") && a->n_in == 1) {
        act = (kiln_act){KILN_ACT_LEAKY_RELU, kiln_attr_float(a, "alpha", 0.01f), 0.0f};
    } else if (!strcmp(op, "Gelu") && a->n_in == 1) {
        const char *approx = kiln_attr_string(a, "approximate", "none");
        if (!strcmp(approx, "none")) act.kind = KILN_ACT_GELU;
        else if (!strcmp(approx, "tanh")) act.kind = KILN_ACT_GELU_TANH;
    } else if (!strcmp(op, "Clip")) {
        float lo = -INFINITY, hi = INFINITY;
        if (a->opset < 11) {
            if (a->n_in != 1) return act;
            lo = kiln_attr_float(a, "min", -FLT_MAX);
            hi = kiln_attr_float(a, "max", FLT_MAX);
            if (isnan(lo) || isnan(hi)) return act;
        } else if (!const_scalar(a, 1, &lo) || !const_scalar(a, 2, &hi)) {
            return act;
        }
        act = (kiln_act){KILN_ACT_CLIP, lo, hi};
    }
    return act;
}

/* Whether n is a node whose CPU kernel applies a fused activation. */
static bool fusable(const kiln_node *n)
{
    if (*n->domain || n->n_out != 1 || !n->out[0] || n->act.kind != KILN_ACT_NONE || n->n_in < 2 ||
        !is_f32(n->in[0]) || !is_f32(n->in[1]) || !is_f32(n->out[0]))
        return false;
    if (!strcmp(n->op_type, "Conv")) return n->in[0]->type.rank == 4 && n->in[1]->type.rank == 4;
    if (!strcmp(n->op_type, "Gemm")) return n->opset >= 11;
    if (!strcmp(n->op_type, "MatMul")) { /* by constant 2-D weights: one GEMM over all rows */
        const kiln_value *w = kiln_ir_constant(n->in[1]);
        return n->n_in == 2 && w && !n->in[1]->producer && w->kind == KILN_VALUE_TENSOR && w->rank == 2 &&
               w->dtype == KILN_DTYPE_FLOAT32 && n->in[0]->type.rank >= 1;
    }
    return false;
}

kiln_status kiln_pass_fuse_activation(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    int kept = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *a = g->nodes[k];
        kiln_act act = activation(a);
        kiln_node *p = act.kind ? a->in[0]->producer : NULL;
        if (p && p->graph == g && fusable(p) && p->out[0] == a->in[0] && readers(g, a->in[0]) == 1) {
            /* the producer now yields what the activation yielded */
            kiln_ir_value *old = p->out[0], *y = a->out[0];
            old->producer = NULL;
            y->producer = p;
            p->out[0] = y;
            p->act = act;
            (*fused)++;
            continue; /* the activation leaves the graph */
        }
        g->nodes[kept] = a;
        a->index = kept++;
    }
    g->n_nodes = kept;
    return *fused ? kiln_graph_plan_releases(g, err) : KILN_OK;
}
