/* subgraph.c - compiling If/Loop/Scan bodies with the session (memory and shape programs,
 * constraints, plan caches) and binding a call of one to the symbols (see subgraph.h). */
#include "exec/subgraph.h"

#include <stdlib.h>
#include <string.h>


static kiln_status compile_one(kiln_graph *sg, int cache_size, kiln_err *err)
{
    kiln_subprog *sp = calloc(1, sizeof *sp);
    if (!sp) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    sp->g = sg;
    kiln_plan_cache_init(&sp->plans, cache_size);
    sg->prog = sp;
    KILN_TRY(kiln_memprog_build(sg, false, &sp->memprog, err));
    const kiln_model *m = sg->model;
    sp->constraints = calloc((size_t)m->n_constraints + 1, sizeof *sp->constraints);
    if (!sp->constraints) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < m->n_constraints; i++)
        if (m->constraints[i].node->graph == sg) sp->constraints[sp->n_constraints++] = i;
    return KILN_OK;
}

kiln_status kiln_subgraphs_compile(kiln_graph *g, int cache_size, kiln_err *err)
{
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        for (int a = 0; a < n->n_attrs; a++)
            for (int q = 0; q < kiln_attr_graph_count(&n->attrs[a]); q++) {
                kiln_graph *sg = (kiln_graph *)kiln_attr_graph_at(&n->attrs[a], q);
                if (!sg->prog) KILN_TRY(compile_one(sg, cache_size, err));
                KILN_TRY(kiln_subgraphs_compile(sg, cache_size, err));
            }
    }
    return KILN_OK;
}

void kiln_subgraphs_release(kiln_graph *g)
{
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        for (int a = 0; a < n->n_attrs; a++)
            for (int q = 0; q < kiln_attr_graph_count(&n->attrs[a]); q++) {
                kiln_graph *sg = (kiln_graph *)kiln_attr_graph_at(&n->attrs[a], q);
                kiln_subgraphs_release(sg);
                kiln_subprog *sp = sg->prog;
                if (!sp) continue;
                kiln_memprog_release(&sp->memprog);
                kiln_plan_cache_release(&sp->plans);
                free(sp->constraints);
                free(sp);
                sg->prog = NULL;
            }
    }
}

bool kiln_subgraph_bind(const kiln_subprog *sp, const kiln_value *const *in, int64_t *syms, int n_syms)
{
    const kiln_graph *g = sp->g;
    /* plain symbols first, then compound dims against the whole binding */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g->n_inputs; i++) {
            const kiln_ir_value *v = g->inputs[i];
            const kiln_value *x = in && in[i] ? in[i] : v->init;
            const kiln_type *t = &v->type;
            if (sp->memprog.rank[v->id] < 0) continue; /* no compile-time shape read from it */
            if (!x || x->kind != KILN_VALUE_TENSOR || x->dtype != t->dtype || x->rank != t->rank) return false;
            for (int k = 0; k < t->rank; k++) {
                kiln_dim d = t->dims[k];
                int64_t want;
                if (kiln_dim_is_const(d)) {
                    if (d.c != x->dims[k]) return false;
                } else if (d.e->kind == KILN_EXPR_SYM && d.e->sym_index >= 0 && d.e->sym_index < n_syms) {
                    int64_t *s = &syms[d.e->sym_index];
                    if (pass == 0 && *s < 0) *s = x->dims[k];
                    else if (*s != x->dims[k]) return false;
                } else if (pass == 1 && (!kiln_dim_eval(d, syms, n_syms, &want) || want != x->dims[k])) {
                    return false;
                }
            }
        }
    const kiln_model *m = g->model;
    for (int i = 0; i < sp->n_constraints; i++) {
        const kiln_constraint *c = &m->constraints[sp->constraints[i]];
        int64_t a, b;
        if (!kiln_dim_eval(c->a, syms, n_syms, &a) || !kiln_dim_eval(c->b, syms, n_syms, &b)) continue;
        if (a != b && !(c->broadcast && (a == 1 || b == 1))) return false;
    }
    return true;
}
