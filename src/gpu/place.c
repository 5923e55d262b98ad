/* place.c - which nodes run on the GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "gpu/gpu.h"
#include "gpu/place.h"

static bool int_vector(const kiln_type *t)
{
    if (t->kind != KILN_VALUE_TENSOR || t->rank < 0 || t->rank > 1) return false;
    switch (t->dtype) {
    case KILN_DTYPE_INT64: case KILN_DTYPE_INT32: case KILN_DTYPE_BOOL: return true;
    default: return false;
    }
}

static bool is_type_op(const kiln_node *n)
{
    return !*n->domain && (!strcmp(n->op_type, "Shape") || !strcmp(n->op_type, "Size"));
}

kiln_status kiln_gpu_place(kiln_graph *g, int *n_gpu, int *n_cpu, kiln_err *err)
{
    *n_gpu = *n_cpu = 0;
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
        const kiln_gpu_op *o = NULL;
        if (!n->op) snprintf(why, sizeof why, "not supported by kiln");
        else if (is_type_op(n)) snprintf(why, sizeof why, "reads only the input's shape");
        else if (all_shape && int_out) snprintf(why, sizeof why, "shape computation");
        else if (kiln_node_has_subgraphs(n)) snprintf(why, sizeof why, "control flow runs on the CPU");
        else if (!(o = kiln_gpu_op_lookup(n->domain, n->op_type, n->opset)))
            snprintf(why, sizeof why, "no GPU kernel for %s%s%s", n->domain, *n->domain ? "." : "", n->op_type);
        else if (o->supports && !o->supports(n, why, sizeof why)) {
            if (!*why) snprintf(why, sizeof why, "not covered by the GPU kernel");
            o = NULL;
        }
        if (o) {
            if (n->kernel_state_free) n->kernel_state_free(n->kernel_state);
            n->kernel_state = NULL;
            n->kernel_state_free = NULL;
            n->on_gpu = true;
            n->kernel = o->run;
            n->host_inputs = o->host_inputs;
            n->placement_note = NULL;
            ++*n_gpu;
            continue;
        }
        n->on_gpu = false;
        n->placement_note = kiln_arena_strdup(a, why);
        ++*n_cpu;
        if ((is_type_op(n) || all_shape) && int_out)
            for (int i = 0; i < n->n_out; i++)
                if (n->out[i]) shape_like[n->out[i]->id] = true;
    }
    free(shape_like);
    return KILN_OK;
}
