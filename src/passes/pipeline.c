/* pipeline.c - the pass runner and the generic pipeline (pass.h). */
#include <string.h>

#include "core/arena.h"
#include "ops/eval.h"
#include "passes/pass.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

const kiln_pass kiln_passes_generic[] = {
    {"fold_constants", kiln_pass_fold_constants},
    {"fold_conv_bn", kiln_pass_fold_conv_bn},
};
const int kiln_passes_generic_n = sizeof kiln_passes_generic / sizeof *kiln_passes_generic;

kiln_status kiln_passes_run(kiln_graph *g, const kiln_pass *passes, int n, int *changed, kiln_err *err)
{
    if (changed) *changed = 0;
    for (int p = 0; p < n; p++) {
        int count = 0;
        KILN_TRY(kiln_graph_index_uses(g, err));
        if (passes[p].run(g, &count, err)) return kiln_err_prefix(err, "pass %s", passes[p].name);
        if (count) KILN_TRY(kiln_graph_plan_releases(g, err));
        if (changed) *changed += count;
    }
    return KILN_OK;
}

void kiln_passes_sweep(kiln_graph *g, const bool *candidate)
{
    for (bool again = true; again;) {
        again = false;
        for (int k = g->n_nodes - 1; k >= 0; k--) {
            kiln_node *n = g->nodes[k];
            if (!n || !candidate[k]) continue;
            bool dead = true;
            for (int o = 0; o < n->n_out && dead; o++) dead = !n->out[o] || kiln_ir_value_readers(n->out[o]) == 0;
            if (!dead) continue;
            kiln_node_unlink(n);
            g->nodes[k] = NULL;
            again = true;
        }
    }
    kiln_graph_compact(g);
}

kiln_attr *kiln_passes_new_attrs(kiln_graph *g, int n)
{
    return kiln_arena_calloc(&g->model->arena, (size_t)n, sizeof(kiln_attr));
}

kiln_ir_value *kiln_passes_other_input(const kiln_node *b, const kiln_ir_value *known)
{
    if (!b || b->n_in != 2) return NULL;
    return b->in[0] == known ? b->in[1] : b->in[1] == known ? b->in[0] : NULL;
}

kiln_node *kiln_passes_producer(const kiln_graph *g, const kiln_ir_value *v, const char *op_type)
{
    kiln_node *p = v ? v->producer : NULL;
    return p && p->graph == g && !*p->domain && !strcmp(p->op_type, op_type) && p->n_out == 1 && p->out[0] == v ? p
                                                                                                                : NULL;
}

kiln_node *kiln_passes_only_reader(const kiln_ir_value *v, const char *op_type)
{
    kiln_node *nd = v && !v->is_output ? kiln_ir_value_only_reader(v) : NULL;
    return nd && !*nd->domain && !strcmp(nd->op_type, op_type) && nd->n_out == 1 && nd->out[0] ? nd : NULL;
}

bool *kiln_passes_mark_ops(kiln_graph *g, const char *const *ops, int n)
{
    bool *candidate = kiln_arena_calloc(&g->model->arena, (size_t)g->n_nodes + 1, sizeof *candidate);
    if (!candidate) return NULL;
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *nd = g->nodes[k];
        for (int i = 0; i < n && !candidate[k]; i++) candidate[k] = !*nd->domain && !strcmp(nd->op_type, ops[i]);
    }
    return candidate;
}

kiln_status kiln_passes_become(kiln_node *nd, const char *op_type, const char *domain, int opset, int n_in,
                               kiln_ir_value *const *in, kiln_attr *at, int n_attrs, kiln_err *err)
{
    KILN_TRY(kiln_node_set_inputs(nd, n_in, in, err));
    nd->op_type = op_type;
    nd->domain = domain;
    nd->opset = opset;
    nd->attrs = at;
    nd->n_attrs = n_attrs;
    return kiln_node_bind(nd, err);
}
