/* fold_constants.c - nodes whose every input is a constant are evaluated once, when the
 * session is compiled, with the reference kernel: their outputs become constants and the nodes
 * leave the graph. A Constant node's tensor becomes its output without a copy. */
#include <stdlib.h>
#include <string.h>

#include "ops/eval.h"
#include "ops/op.h"
#include "passes/passes.h"

/* Folded outputs may outgrow their inputs by this much (ConstantOfShape, Expand, Range). */
#define GROWTH_BYTES ((size_t)1 << 20)

/* Ops whose result is not a function of their inputs (a registry flag). */
static bool is_random(const kiln_node *n) { return n->op && (n->op->flags & KILN_OP_RANDOM); }

/* Whether n may be folded, with the bytes its inputs hold. */
static bool foldable(const kiln_node *n, size_t *in_bytes)
{
    *in_bytes = 0;
    if (*n->domain || !n->op || !n->op->run || n->kernel || is_random(n) || kiln_node_has_subgraphs(n) || !n->n_out) return false;
    for (int i = 0; i < n->n_in; i++) {
        const kiln_ir_value *v = n->in[i];
        if (!v) continue;
        /* an initializer that is also a graph input can be fed: not a constant */
        if (!v->init || v->producer || v->is_input || v->init->kind != KILN_VALUE_TENSOR) return false;
        *in_bytes += v->init->nbytes;
    }
    for (int i = 0; i < n->n_out; i++)
        if (n->out[i] && n->out[i]->is_output) return false; /* the caller gets a fresh value */
    return true;
}

static kiln_status fold(kiln_graph *g, kiln_node *n, bool *done, kiln_err *err)
{
    *done = false;
    size_t in_bytes;
    if (!foldable(n, &in_bytes)) return KILN_OK;
    /* Constant's tensor attribute: the model owns it already */
    if (!strcmp(n->op_type, "Constant") && n->n_attrs == 1 && !strcmp(n->attrs[0].name, "value") && n->attrs[0].t &&
        n->n_out == 1 && n->out[0]) {
        kiln_ir_value_set_constant(n->out[0], n->attrs[0].t);
        *done = true;
        return KILN_OK;
    }
    kiln_value **out = calloc((size_t)n->n_out, sizeof *out);
    if (!out) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    kiln_err ignored = {0}; /* a node that fails now fails at run time too, with its context */
    size_t out_bytes = 0;
    bool ok = !kiln_node_evaluate(n, in_bytes + GROWTH_BYTES, out, &ignored);
    for (int i = 0; ok && i < n->n_out; i++) {
        if (!n->out[i]) continue;
        if (!out[i] || out[i]->kind != KILN_VALUE_TENSOR) ok = false;
        else out_bytes += out[i]->nbytes;
    }
    kiln_status st = KILN_OK;
    for (int i = 0; i < n->n_out; i++) {
        if (!out[i]) continue;
        if (!ok || out_bytes > in_bytes + GROWTH_BYTES || st) kiln_value_free(out[i]);
        else if (!(st = kiln_model_own_value(g->model, out[i], err))) /* frees out[i] when it fails */
            kiln_ir_value_set_constant(n->out[i], out[i]);
    }
    *done = ok && out_bytes <= in_bytes + GROWTH_BYTES && !st;
    free(out);
    return st;
}

kiln_status kiln_pass_fold_constants(kiln_graph *g, int *folded, kiln_err *err)
{
    *folded = 0;
    int kept = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = g->nodes[k];
        bool done;
        KILN_TRY(fold(g, n, &done, err));
        if (done) {
            kiln_node_unlink(n);
            (*folded)++;
            continue;
        }
        g->nodes[kept] = n;
        n->index = kept++;
    }
    g->n_nodes = kept;
    return KILN_OK;
}
