/* fuse_residual.c - a float32 Add of two same-shaped tensors, one of them the output of a Conv
 * (group 1) that nothing else reads, becomes part of that Conv: the other operand joins the Conv
 * as an extra input (kiln_node.sum_in) that the CPU provider adds to each output tile with the
 * bias, before any fused activation. The residual blocks of ResNets (Conv -> Add(shortcut) ->
 * Relu) then write their output once; fuse_activation, run after this pass, folds the Relu. */
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

/* A float32 tensor of rank 4 with the dims of t. */
static bool same_f32_4d(const kiln_ir_value *v, const kiln_type *t)
{
    if (!v || v->type.kind != KILN_VALUE_TENSOR || v->type.dtype != KILN_DTYPE_FLOAT32 || v->type.rank != 4)
        return false;
    for (int i = 0; i < 4; i++)
        if (kiln_dim_is_unknown(v->type.dims[i]) || !kiln_dim_equal(v->type.dims[i], t->dims[i])) return false;
    return true;
}

/* A Conv of g the CPU provider's kernel adds a residual to: float32, 2-D, group 1, nothing fused. */
static bool conv_fusable(const kiln_graph *g, const kiln_node *n)
{
    return n && n->graph == g && !*n->domain && !strcmp(n->op_type, "Conv") && n->n_out == 1 && n->out[0] &&
           n->n_in >= 2 && n->n_in <= 3 && n->act.kind == KILN_ACT_NONE && !n->sum_in && n->in[0] && n->in[1] &&
           n->in[0]->type.dtype == KILN_DTYPE_FLOAT32 && n->in[0]->type.rank == 4 && n->in[1]->type.rank == 4 &&
           kiln_attr_int(n, "group", 1) == 1 && same_f32_4d(n->out[0], &n->out[0]->type);
}

kiln_status kiln_pass_fuse_residual(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    int kept = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *a = g->nodes[k];
        if (!a) continue; /* a Conv moved to its Add's place */
        kiln_node *p = NULL;
        kiln_ir_value *r = NULL;
        if (!*a->domain && !strcmp(a->op_type, "Add") && a->n_in == 2 && a->n_out == 1 && a->out[0] &&
            a->in[0] && a->in[1] && a->in[0] != a->in[1] && same_f32_4d(a->out[0], &a->out[0]->type))
            for (int i = 0; i < 2 && !p; i++) {
                kiln_node *c = a->in[i]->producer;
                if (conv_fusable(g, c) && c->out[0] == a->in[i] && readers(g, a->in[i]) == 1 &&
                    same_f32_4d(a->in[i], &a->out[0]->type) && same_f32_4d(a->in[1 - i], &a->out[0]->type))
                    p = c, r = a->in[1 - i];
            }
        kiln_ir_value **in = p ? kiln_arena_calloc(&g->model->arena, 4, sizeof *in) : NULL;
        if (!in) {
            g->nodes[kept] = a;
            a->index = kept++;
            continue;
        }
        /* the Conv takes the Add's place (all its inputs are ready by then) and yields its output */
        for (int i = 0; i < p->n_in; i++) in[i] = p->in[i];
        in[3] = r;
        p->in = in;
        p->n_in = 4;
        p->sum_in = 3;
        kiln_ir_value *old = p->out[0], *y = a->out[0];
        old->producer = NULL;
        y->producer = p;
        p->out[0] = y;
        for (int q = 0; q < kept; q++)
            if (g->nodes[q] == p) { /* take it out of the kept prefix */
                memmove(g->nodes + q, g->nodes + q + 1, (size_t)(kept - q - 1) * sizeof *g->nodes);
                kept--;
                for (int t = q; t < kept; t++) g->nodes[t]->index = t;
                break;
            }
        g->nodes[kept] = p;
        p->index = kept++;
        (*fused)++;
    }
    g->n_nodes = kept;
    return *fused ? kiln_graph_plan_releases(g, err) : KILN_OK;
}
