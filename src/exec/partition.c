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

/* ---- copy nodes ---- */

/* Where the bytes of main-graph value v live during a run: on the device (its producer runs
 * there), on the host, or unknown until the run (a graph input: the caller's host or device
 * tensor, or uploaded by a recorded run). */
typedef enum { HOME_HOST, HOME_DEVICE, HOME_INPUT } home_side;

static home_side home_of(const kiln_ir_value *v)
{
    if (!v->producer) return HOME_INPUT;
    return v->producer->on_device ? HOME_DEVICE : HOME_HOST;
}

/* Values that may need a copy: tensors (or of a kind decided at run time) of g that are not
 * constants (the device provider uploads those once, prepare()). */
static bool copyable(const kiln_graph *g, const kiln_ir_value *v)
{
    return v && v->graph == g && !kiln_ir_constant(v) &&
           (v->type.kind == KILN_VALUE_TENSOR || v->type.kind == 0);
}

typedef struct copy_state {
    kiln_graph *g;
    const kiln_provider_i *dev;
    kiln_ir_value **copy; /* [2 * n_values]: v's host copy at 2 * id, its device copy at 2 * id + 1 */
    kiln_node **order;    /* the new node order */
    int n_order;
} copy_state;

/* v's copy on the device (to_device) or the host, made and appended to the node order the first
 * time it is asked for. */
static kiln_status copy_of(copy_state *cs, kiln_ir_value *v, bool to_device, kiln_ir_value **out, kiln_err *err)
{
    kiln_ir_value **slot = &cs->copy[2 * v->id + to_device];
    if (*slot) {
        *out = *slot;
        return KILN_OK;
    }
    kiln_graph *g = cs->g;
    kiln_arena *a = &g->model->arena;
    const char *op_type = to_device ? "MemcpyToDevice" : "MemcpyToHost";
    char name[256];
    snprintf(name, sizeof name, "%s/to_%s", v->name, to_device ? cs->dev->name : "host");
    kiln_ir_value *c = kiln_graph_new_value(g, name, err);
    kiln_node *n = kiln_arena_calloc(a, 1, sizeof *n);
    kiln_ir_value **in = kiln_arena_calloc(a, 1, sizeof *in), **o = kiln_arena_calloc(a, 1, sizeof *o);
    if (!c || !n || !in || !o || !(n->name = kiln_arena_strdup(a, name)))
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    c->type = v->type;
    c->layout = v->layout;
    c->producer = n;
    in[0] = v;
    o[0] = c;
    n->op_type = op_type;
    n->domain = "kiln";
    n->opset = 1;
    n->op = kiln_op_lookup("kiln", op_type, 1);
    if (!n->op) return kiln_errf(err, KILN_ERR_RUNTIME, "internal: no kiln.%s operator", op_type);
    n->n_in = n->n_out = 1;
    n->in = in;
    n->out = o;
    n->graph = g;
    n->released_in = -1;
    n->on_device = to_device;
    n->placement_note = to_device ? NULL : "copies a value to the host";
    cs->order[cs->n_order++] = n;
    *out = *slot = c;
    return KILN_OK;
}

/* Replaces outer value from by to in subgraph sg and the graphs nested in it: node inputs,
 * graph outputs and captures. */
static void rewire_captured(kiln_graph *sg, const kiln_ir_value *from, kiln_ir_value *to)
{
    for (int r = 0; r < sg->n_captures; r++)
        if (sg->captures[r] == from) sg->captures[r] = to;
    for (int j = 0; j < sg->n_outputs; j++)
        if (sg->outputs[j] == from) sg->outputs[j] = to;
    for (int k = 0; k < sg->n_nodes; k++) {
        kiln_node *n = sg->nodes[k];
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] == from) n->in[i] = to;
        for (int a = 0; a < n->n_attrs; a++)
            for (int q = 0; q < kiln_attr_graph_count(&n->attrs[a]); q++)
                rewire_captured((kiln_graph *)kiln_attr_graph_at(&n->attrs[a], q), from, to);
    }
}

/* The copies node n needs, appended before it: inputs it reads on the other side than the one
 * they live on, and the values its subgraphs (run on the host) capture from the device. */
static kiln_status copies_for(copy_state *cs, kiln_node *n, kiln_err *err)
{
    kiln_graph *g = cs->g;
    if (n->op && (n->op->flags & KILN_OP_COPY)) return KILN_OK; /* a copy reads its side's value */
    bool type_only = n->op && (n->op->flags & KILN_OP_READS_TYPE_ONLY);
    for (int i = 0; i < n->n_in; i++) {
        kiln_ir_value *v = n->in[i];
        if (!copyable(g, v) || (!n->on_device && type_only)) continue;
        bool device = n->on_device && !(n->host_inputs & (1u << i));
        home_side h = home_of(v);
        if (h != HOME_INPUT && (h == HOME_DEVICE) == device) continue;
        KILN_TRY(copy_of(cs, v, device, &n->in[i], err));
    }
    if (n->on_device) return KILN_OK;
    for (int a = 0; a < n->n_attrs; a++)
        for (int q = 0; q < kiln_attr_graph_count(&n->attrs[a]); q++) {
            kiln_graph *sg = (kiln_graph *)kiln_attr_graph_at(&n->attrs[a], q);
            for (int r = 0; r < sg->n_captures; r++) {
                kiln_ir_value *v = sg->captures[r];
                if (!copyable(g, v) || home_of(v) == HOME_HOST) continue;
                kiln_ir_value *c;
                KILN_TRY(copy_of(cs, v, false, &c, err));
                rewire_captured(sg, v, c);
            }
        }
    return KILN_OK;
}

kiln_status kiln_insert_copies(kiln_graph *g, const kiln_provider_i *dev, kiln_err *err)
{
    /* at most one copy per value and side */
    size_t cap = (size_t)g->n_nodes + 2 * (size_t)g->n_values + 1;
    copy_state cs = {.g = g, .dev = dev};
    cs.copy = calloc(2 * (size_t)g->n_values + 1, sizeof *cs.copy);
    cs.order = kiln_arena_calloc(&g->model->arena, cap, sizeof *cs.order);
    kiln_status st = !cs.copy || !cs.order ? kiln_errf(err, KILN_ERR_NOMEM, "out of memory") : KILN_OK;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        kiln_node *n = g->nodes[k];
        st = copies_for(&cs, n, err);
        if (!st) cs.order[cs.n_order++] = n;
    }
    free(cs.copy);
    if (st) return st;
    g->nodes = cs.order;
    g->n_nodes = cs.n_order;
    for (int k = 0; k < g->n_nodes; k++) g->nodes[k]->index = k;
    return kiln_graph_plan_releases(g, err);
}
