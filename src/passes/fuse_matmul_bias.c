/* fuse_matmul_bias.c - a constant bias added to a MatMul by constant weights (the dense layers
 * of transformers: MatMul(A [..., K], W [K, N]) -> Add(., B [N])) becomes part of the MatMul
 * (kiln_node.bias): the CPU provider adds it while each GEMM tile is in cache, and the Add's
 * pass over memory disappears. The MatMul's output must have no other reader, the bias must not
 * widen it by broadcasting (N values, leading dims 1, rank at most the output's). CPU sessions
 * only: the reference MatMul kernel does not know about the bias. */
#include <string.h>

#include "core/dtype.h"
#include "passes/passes.h"

/* Readers of v in g: node inputs, subgraph captures, graph outputs. */
static int readers(const kiln_graph *g, const kiln_ir_value *v)
{
    int n = v->is_output;
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *nd = g->nodes[k];
        if (!nd) continue; /* removed by this pass */
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

/* The constant float32 2-D weights [K, N] of a MatMul that can take a bias, else NULL. */
static const kiln_value *weights(const kiln_graph *g, const kiln_node *m)
{
    if (m->graph != g || *m->domain || strcmp(m->op_type, "MatMul") || m->n_in != 2 || m->n_out != 1 ||
        !m->out[0] || m->bias || m->act.kind != KILN_ACT_NONE || !is_f32(m->in[0]) || !is_f32(m->out[0]) ||
        m->in[0]->type.rank < 1 || m->out[0]->type.rank < 1)
        return NULL;
    const kiln_ir_value *w = m->in[1];
    const kiln_value *t = kiln_ir_constant(w);
    if (!t || w->producer || t->kind != KILN_VALUE_TENSOR || t->dtype != KILN_DTYPE_FLOAT32 || t->rank != 2)
        return NULL;
    return t;
}

/* Whether b is a float32 constant of n values that broadcasts onto a rank-r output [..., n]
 * without widening it. */
static bool bias_fits(const kiln_ir_value *b, int64_t n, int r)
{
    const kiln_value *t = kiln_ir_constant(b);
    if (!t || b->producer || t->kind != KILN_VALUE_TENSOR || t->dtype != KILN_DTYPE_FLOAT32 || t->rank < 1 ||
        t->rank > r || t->numel != n || t->dims[t->rank - 1] != n)
        return false;
    return true;
}

kiln_status kiln_pass_fuse_matmul_bias(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *a = g->nodes[k];
        if (*a->domain || strcmp(a->op_type, "Add") || a->n_in != 2 || a->n_out != 1 || !a->out[0] || a->opset < 7 ||
            !is_f32(a->out[0]))
            continue;
        for (int side = 0; side < 2; side++) {
            kiln_ir_value *x = a->in[side], *b = a->in[1 - side];
            kiln_node *m = x ? x->producer : NULL;
            const kiln_value *w = m ? weights(g, m) : NULL;
            if (!w || m->out[0] != x || x->is_output || readers(g, x) != 1) continue;
            if (!bias_fits(b, w->dims[1], x->type.rank) || a->out[0]->type.rank != x->type.rank) continue;
            /* the MatMul now yields what the Add yielded; the Add leaves the graph */
            kiln_ir_value *y = a->out[0];
            x->producer = NULL;
            y->producer = m;
            m->out[0] = y;
            m->bias = b;
            g->nodes[k] = NULL;
            (*fused)++;
            break;
        }
    }
    if (!*fused) return KILN_OK;
    int kept = 0;
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k]) {
            g->nodes[kept] = g->nodes[k];
            g->nodes[kept]->index = kept;
            kept++;
        }
    g->n_nodes = kept;
    return kiln_graph_plan_releases(g, err);
}
