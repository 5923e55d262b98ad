/* layout_nchwc.c - chooses the blocked layout (kiln_layout NCHW16C) for the activations a CNN
 * passes from one convolution or pooling to the next, so each kernel reads its input and writes
 * its output as whole 16-channel vectors (src/cpu/nchwc.h).
 *
 * A value is blocked when it is a float32 [N, C, H, W] tensor with C a known multiple of 16,
 * produced by a node of the main graph and read by nodes only (not a graph input or output, not
 * read inside a subgraph), whose producer and every reader have a kernel for it:
 *  - Conv (2-D, constant float32 weights, group 1 or depthwise) reads X and writes Y in either
 *    layout, and so does kiln.FusedConv, except that a depthwise one needs both blocked and
 *    FusedConv's residual Z needs Y's layout;
 *  - MaxPool (without Indices) and AveragePool (2-D) need X and Y in the same layout;
 *  - GlobalAveragePool reads a blocked X (its [N, C, 1, 1] output is the same bytes either way);
 *  - Shape reads the dims only.
 * The first choice blocks every value whose producer and readers qualify; then the pairs that
 * must agree are made to, by unblocking, until nothing changes (blocks only ever go). A
 * convolution with both sides plain keeps the plain kernels. */
#include <string.h>

#include "core/dtype.h"
#include "ops/fused.h"
#include "passes/passes.h"

static bool is_op(const kiln_node *n, const char *op) { return !*n->domain && !strcmp(n->op_type, op); }

static bool is_f32_4d(const kiln_ir_value *v)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.dtype == KILN_DTYPE_FLOAT32 && v->type.rank == 4;
}

/* A Conv the blocked kernels run, either side blocked: 2-D, constant float32 weights [M, C/group,
 * kh, kw] of group 1 or depthwise (group = C = M). */
static bool conv_ok(const kiln_node *n, bool *depthwise)
{
    bool fused = kiln_node_is_fused(n, "Conv");
    if ((!is_op(n, "Conv") && !fused) || n->n_in < 2 || n->n_in > (fused ? 4 : 3) || n->n_out != 1 || !is_f32_4d(n->in[0]) ||
        !is_f32_4d(n->out[0]))
        return false;
    const kiln_value *w = kiln_ir_constant(n->in[1]);
    if (!w || w->dtype != KILN_DTYPE_FLOAT32 || w->rank != 4 || !w->numel) return false;
    if (n->n_in >= 3 && n->in[2] && (n->in[2]->type.dtype != KILN_DTYPE_FLOAT32 || n->in[2]->type.rank != 1))
        return false;
    int64_t group = kiln_attr_int(n, "group", 1);
    *depthwise = group > 1 && group == w->dims[0] && w->dims[1] == 1;
    return group == 1 || *depthwise;
}

/* A 2-D MaxPool without Indices or AveragePool. */
static bool pool_ok(const kiln_node *n)
{
    int nk = 0;
    bool max = is_op(n, "MaxPool") && n->opset >= 8 && (n->n_out == 1 || !n->out[1]);
    bool avg = is_op(n, "AveragePool") && n->opset >= 7 && n->n_out == 1;
    return (max || avg) && kiln_attr_ints(n, "kernel_shape", &nk) && nk == 2 && is_f32_4d(n->in[0]) &&
           is_f32_4d(n->out[0]);
}

/* Whether node n has a kernel that writes v (its output 0) blocked. */
static bool writes_blocked(const kiln_node *n, const kiln_ir_value *v)
{
    bool dw;
    return n->out[0] == v && (conv_ok(n, &dw) || pool_ok(n));
}

/* Whether node n has a kernel that reads v blocked wherever v is among its inputs. */
static bool reads_blocked(const kiln_node *n, const kiln_ir_value *v)
{
    bool dw;
    if (is_op(n, "Shape")) return true;
    if (is_op(n, "GlobalAveragePool")) return n->n_in == 1 && n->n_out == 1 && is_f32_4d(n->out[0]);
    if (pool_ok(n)) return n->n_in == 1;
    if (!conv_ok(n, &dw)) return false;
    for (int i = 1; i < n->n_in; i++)
        if (n->in[i] == v && i != kiln_fused_of(n)->residual) return false; /* as weights or bias */
    return true;
}

/* Whether v may be blocked: see the file's comment. */
static bool candidate(const kiln_graph *g, const kiln_ir_value *v)
{
    kiln_dim c = v->type.dims[1];
    if (!is_f32_4d(v) || v->is_input || v->is_output || v->init || !v->producer || v->producer->graph != g ||
        !kiln_dim_is_const(c) || c.c <= 0 || c.c % 16 || !writes_blocked(v->producer, v))
        return false;
    for (int u = 0; u < v->n_uses; u++)
        if (!reads_blocked(v->uses[u].node, v)) return false;
    return true;
}

static bool has_subgraphs(const kiln_graph *g)
{
    for (int k = 0; k < g->n_nodes; k++)
        for (int a = 0; a < g->nodes[k]->n_attrs; a++)
            if (kiln_attr_graph_count(&g->nodes[k]->attrs[a])) return true;
    return false;
}

static bool blocked(const kiln_ir_value *v) { return v && v->layout == KILN_LAYOUT_NCHW16C; }

/* Makes a and b plain unless both are blocked; true when that changed anything. */
static bool agree(kiln_ir_value *a, kiln_ir_value *b)
{
    if (blocked(a) == blocked(b)) return false;
    if (a) a->layout = KILN_LAYOUT_PLAIN;
    if (b) b->layout = KILN_LAYOUT_PLAIN;
    return true;
}

kiln_status kiln_pass_layout_nchwc(kiln_graph *g, int *blocked_count, kiln_err *err)
{
    (void)err;
    *blocked_count = 0;
    if (has_subgraphs(g)) return KILN_OK; /* their captures would need a reader check of their own */
    for (int i = 0; i < g->n_values; i++)
        if (candidate(g, g->values[i])) g->values[i]->layout = KILN_LAYOUT_NCHW16C;
    for (bool changed = true; changed;) {
        changed = false;
        for (int k = 0; k < g->n_nodes; k++) {
            kiln_node *n = g->nodes[k];
            bool conv = conv_ok(n, &(bool){false}), dw = false;
            if (pool_ok(n) || (conv_ok(n, &dw) && dw)) changed |= agree(n->in[0], n->out[0]);
            int z = kiln_fused_of(n)->residual;
            if (conv && z) changed |= agree(n->in[z], n->out[0]);
        }
    }
    for (int i = 0; i < g->n_values; i++) *blocked_count += blocked(g->values[i]);
    return KILN_OK;
}
