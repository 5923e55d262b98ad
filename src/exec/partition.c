/* partition.c - which provider runs each node, and the kernel each provider picks for its
 * nodes. Placement is the core's: a device provider is asked about each node of the main
 * graph (supports()), except those that must stay on the host whatever the provider says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "exec/partition.h"

static bool int_vector(const kiln_type *t)
{
    if (t->kind != KILN_VALUE_TENSOR || t->rank < 0 || t->rank > 1) return false;
    switch (t->dtype) {
    case KILN_DTYPE_INT64: case KILN_DTYPE_INT32: case KILN_DTYPE_BOOL: return true;
    default: return false;
    }
}

static bool reads_type_only(const kiln_node *n) { return n->op && (n->op->flags & KILN_OP_READS_TYPE_ONLY); }

kiln_status kiln_partition(kiln_graph *g, const kiln_provider_i *dev, const kiln_provider *dp, int *n_dev,
                           int *n_host, int *n_fallback, kiln_err *err)
{
    *n_dev = *n_host = *n_fallback = 0;
    /* shape-like values: integer constants and what shape arithmetic computes from them */
    bool *shape_like = calloc((size_t)g->n_values + 1, sizeof *shape_like);
    if (!shape_like) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    for (int id = 0; id < g->n_values; id++) {
        const kiln_ir_value *v = g->values[id];
        if (v->init && !v->producer && int_vector(&v->type)) shape_like[id] = true;
    }
    kiln_arena *a = &g->model->arena;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = g->nodes[k];
        char why[160] = "";
        bool all_shape = n->n_in > 0, int_out = n->n_out > 0;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] && !(n->in[i]->graph == g && shape_like[n->in[i]->id])) all_shape = false;
        for (int i = 0; i < n->n_out; i++)
            if (n->out[i] && !int_vector(&n->out[i]->type)) int_out = false;
        bool on_dev = false, shape_only = false;
        /* shape arithmetic (small integer vectors from shapes and constants) stays on the
         * host, where the inference that reads it runs; control flow and its subgraphs too */
        if (!n->op) snprintf(why, sizeof why, "not supported by kiln");
        else if ((shape_only = reads_type_only(n))) snprintf(why, sizeof why, "reads only the input's shape");
        else if ((shape_only = all_shape && int_out)) snprintf(why, sizeof why, "shape computation");
        else if (kiln_node_has_subgraphs(n)) snprintf(why, sizeof why, "control flow runs on the host");
        else if (!dev->supports || dev->supports(dp, n, why, sizeof why)) on_dev = true;
        else if (!*why) snprintf(why, sizeof why, "not covered by the %s kernel", dev->name);
        n->on_device = on_dev;
        n->placement_note = on_dev ? NULL : kiln_arena_strdup(a, why);
        n->host_fallback = !on_dev && !shape_only;
        ++*(on_dev ? n_dev : n_host);
        *n_fallback += n->host_fallback;
        if (!on_dev && (reads_type_only(n) || all_shape) && int_out)
            for (int i = 0; i < n->n_out; i++)
                if (n->out[i]) shape_like[n->out[i]->id] = true;
    }
    free(shape_like);
    return KILN_OK;
}

void kiln_select_kernels(kiln_graph *g, const kiln_provider_i *host, kiln_provider *hp, const kiln_provider_i *dev,
                         kiln_provider *dp)
{
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = g->nodes[k];
        unsigned host_inputs = 0;
        if (n->op) {
            if (dev && n->on_device) n->kernel = dev->select(dp, n, &host_inputs);
            else n->kernel = host->select(hp, n, &host_inputs);
        }
        n->host_inputs = n->on_device ? host_inputs : 0;
        for (int a = 0; a < n->n_attrs; a++) {
            kiln_attr *at = &n->attrs[a];
            if (at->type == KILN_ATTR_GRAPH) kiln_select_kernels(at->g, host, hp, NULL, NULL);
            for (int q = 0; at->type == KILN_ATTR_GRAPHS && q < at->n; q++)
                kiln_select_kernels(at->graphs[q], host, hp, NULL, NULL);
        }
    }
}
