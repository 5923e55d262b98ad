/* graph.c - IR helpers: attribute lookup, value creation, consumer lists and rewiring, model
 * release, printing. */
#include "ir/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const kiln_attr *kiln_node_attr(const kiln_node *n, const char *name)
{
    for (int i = 0; i < n->n_attrs; i++)
        if (!strcmp(n->attrs[i].name, name)) return &n->attrs[i];
    return NULL;
}

const kiln_attr *kiln_node_attr_typed(const kiln_node *n, const char *name, kiln_attr_type type)
{
    const kiln_attr *a = kiln_node_attr(n, name);
    return a && a->type == type ? a : NULL;
}

int64_t kiln_attr_int(const kiln_node *n, const char *name, int64_t def)
{
    const kiln_attr *a = kiln_node_attr(n, name);
    return a && a->type == KILN_ATTR_INT ? a->i : def;
}

float kiln_attr_float(const kiln_node *n, const char *name, float def)
{
    const kiln_attr *a = kiln_node_attr(n, name);
    if (!a) return def;
    if (a->type == KILN_ATTR_FLOAT) return a->f;
    if (a->type == KILN_ATTR_INT) return (float)a->i;
    return def;
}

const char *kiln_attr_string(const kiln_node *n, const char *name, const char *def)
{
    const kiln_attr *a = kiln_node_attr(n, name);
    return a && a->type == KILN_ATTR_STRING ? a->s : def;
}

const int64_t *kiln_attr_ints(const kiln_node *n, const char *name, int *count)
{
    const kiln_attr *a = kiln_node_attr(n, name);
    if (!a || a->type != KILN_ATTR_INTS) {
        if (count) *count = 0;
        return NULL;
    }
    if (count) *count = a->n;
    return a->ints;
}

const float *kiln_attr_floats(const kiln_node *n, const char *name, int *count)
{
    const kiln_attr *a = kiln_node_attr(n, name);
    if (!a || a->type != KILN_ATTR_FLOATS) {
        if (count) *count = 0;
        return NULL;
    }
    if (count) *count = a->n;
    return a->floats;
}

const kiln_value *kiln_attr_tensor(const kiln_node *n, const char *name)
{
    const kiln_attr *a = kiln_node_attr(n, name);
    return a && a->type == KILN_ATTR_TENSOR ? a->t : NULL;
}

const kiln_graph *kiln_attr_graph(const kiln_node *n, const char *name)
{
    const kiln_attr *a = kiln_node_attr(n, name);
    return a && a->type == KILN_ATTR_GRAPH ? a->g : NULL;
}

void kiln_ir_value_set_constant(kiln_ir_value *v, const kiln_value *t)
{
    v->producer = NULL;
    v->init = t;
    v->type.kind = KILN_VALUE_TENSOR;
    v->type.dtype = t->dtype;
    v->type.rank = t->rank;
    for (int k = 0; k < t->rank; k++) v->type.dims[k] = kiln_dim_const(t->dims[k]);
}

kiln_status kiln_model_own_value(kiln_model *m, kiln_value *v, kiln_err *err)
{
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        kiln_value **o = realloc(m->owned, (size_t)cap * sizeof *o);
        if (!o) {
            kiln_value_free(v);
            return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        }
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = v;
    return KILN_OK;
}

kiln_status kiln_model_add_constraint(kiln_model *m, const kiln_constraint *c, kiln_err *err)
{
    for (int i = 0; i < m->n_constraints; i++) {
        const kiln_constraint *o = &m->constraints[i];
        /* per graph: a subgraph's are checked against its own calls' bindings */
        if (o->node->graph == c->node->graph && o->broadcast == c->broadcast && ((kiln_dim_equal(o->a, c->a) && kiln_dim_equal(o->b, c->b)) ||
                                             (kiln_dim_equal(o->a, c->b) && kiln_dim_equal(o->b, c->a))))
            return KILN_OK; /* the first node that needs it is the one to name */
    }
    if (m->n_constraints == m->cap_constraints) {
        int cap = m->cap_constraints ? m->cap_constraints * 2 : 16;
        kiln_constraint *v = realloc(m->constraints, (size_t)cap * sizeof *v);
        if (!v) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        m->constraints = v;
        m->cap_constraints = cap;
    }
    m->constraints[m->n_constraints++] = *c;
    return KILN_OK;
}

void kiln_type_unknown(kiln_type *t)
{
    memset(t, 0, sizeof *t);
    t->rank = -1;
}

kiln_ir_value *kiln_graph_new_value(kiln_graph *g, const char *name, kiln_err *err)
{
    kiln_arena *a = &g->model->arena;
    if (g->n_values == g->cap_values) {
        int cap = g->cap_values ? g->cap_values * 2 : 32;
        kiln_ir_value **vs = kiln_arena_calloc(a, (size_t)cap, sizeof *vs);
        if (!vs) {
            kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
            return NULL;
        }
        if (g->n_values) memcpy(vs, g->values, (size_t)g->n_values * sizeof *vs);
        g->values = vs;
        g->cap_values = cap;
    }
    kiln_ir_value *v = kiln_arena_calloc(a, 1, sizeof *v);
    if (!v || !(v->name = kiln_arena_strdup(a, name))) {
        kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        return NULL;
    }
    v->id = g->n_values;
    v->graph = g;
    v->last_use = -1;
    kiln_type_unknown(&v->type);
    g->values[g->n_values++] = v;
    return v;
}

int64_t kiln_model_opset(const kiln_model *m, const char *domain)
{
    if (!domain || !strcmp(domain, "ai.onnx")) domain = "";
    for (int i = 0; i < m->n_opsets; i++) {
        const char *d = m->opsets[i].domain;
        if (!strcmp(d, "ai.onnx")) d = "";
        if (!strcmp(d, domain)) return m->opsets[i].version;
    }
    return -1;
}

/* Whether graph g, one of its nodes other than skip, or a subgraph of them reads v, or another
 * value of g shares v's constant (inference propagates constants through Identity and the like). */
static bool read_elsewhere(const kiln_graph *g, const kiln_ir_value *v, const kiln_node *skip)
{
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return true;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i] && g->values[i] != v && g->values[i]->init == v->init) return true;
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        if (!n) continue; /* dropped by a pass that compacts g later */
        if (n != skip) {
            for (int i = 0; i < n->n_in; i++)
                if (n->in[i] == v) return true;
        }
        for (int a = 0; a < n->n_attrs; a++) {
            const kiln_attr *at = &n->attrs[a];
            for (int q = 0; q < kiln_attr_graph_count(at); q++) {
                const kiln_graph *sg = kiln_attr_graph_at(at, q);
                for (int c = 0; c < sg->n_captures; c++)
                    if (sg->captures[c] == v) return true;
            }
        }
    }
    return false;
}

/* v's constant when v is one whose bytes may be given back: a tensor of the model's, still in
 * host memory, with no release hook, not computed, not a graph input or output; else NULL. */
static kiln_value *releasable(const kiln_ir_value *v)
{
    kiln_value *w = v ? (kiln_value *)v->init : NULL; /* the model owns its constants */
    if (!w || !w->data || w->kind != KILN_VALUE_TENSOR || w->on_device || w->release || v->producer || v->is_input ||
        v->is_output)
        return NULL;
    return w;
}

/* Frees w's owned bytes or gives loader bytes back (release_bytes); w->data NULL when done. */
static bool release_data(kiln_model *m, kiln_value *w)
{
    if (w->owns_data) free(w->data);
    else if (!m->release_bytes || !m->release_bytes(m->source, w->data, w->nbytes)) return false;
    w->data = NULL;
    w->owns_data = false;
    return true;
}

bool kiln_node_release_constant(kiln_node *n, int input)
{
    kiln_ir_value *v = input >= 0 && input < n->n_in ? n->in[input] : NULL;
    kiln_model *m = n->graph ? n->graph->model : NULL;
    kiln_value *w = releasable(v);
    if (!m || !m->release_packed || !w || v->graph != n->graph) return false;
    for (int i = 0; i < n->n_in; i++)
        if (i != input && n->in[i] == v) return false;
    if (read_elsewhere(n->graph, v, n)) return false;
    return release_data(m, w);
}

bool kiln_ir_value_release_unread(kiln_ir_value *v)
{
    kiln_model *m = v->graph ? v->graph->model : NULL;
    kiln_value *w = releasable(v);
    if (!m || !w || read_elsewhere(v->graph, v, NULL)) return false;
    return release_data(m, w);
}

void kiln_model_free(kiln_model *m)
{
    if (!m) return;
    free(m->constraints);
    for (int i = 0; i < m->n_owned; i++) kiln_value_free(m->owned[i]);
    free(m->owned);
    if (m->release_source) m->release_source(m->source);
    kiln_dimtab_free(m->dims);
    kiln_arena_release(&m->arena);
    free(m);
}

char *kiln_type_print(const kiln_type *t, char *buf, size_t size)
{
    size_t at = 0;
    const char *prefix = t->kind == KILN_VALUE_SEQUENCE ? "seq(" : t->kind == KILN_VALUE_OPTIONAL ? "optional(" : "";
    at += (size_t)snprintf(buf + at, at < size ? size - at : 0, "%s%s", prefix,
                           t->kind ? kiln_dtype_name(t->dtype) : "?");
    if (t->rank >= 0) {
        at += (size_t)snprintf(buf + at, at < size ? size - at : 0, "[");
        for (int i = 0; i < t->rank; i++) {
            char d[128];
            kiln_dim_print(t->dims[i], d, sizeof d);
            at += (size_t)snprintf(buf + at, at < size ? size - at : 0, "%s%s", i ? ", " : "", d);
        }
        at += (size_t)snprintf(buf + at, at < size ? size - at : 0, "]");
    }
    if (*prefix) snprintf(buf + at, at < size ? size - at : 0, ")");
    return buf;
}

bool kiln_node_has_subgraphs(const kiln_node *n)
{
    for (int a = 0; a < n->n_attrs; a++)
        if (n->attrs[a].type == KILN_ATTR_GRAPH || n->attrs[a].type == KILN_ATTR_GRAPHS) return true;
    return false;
}

int kiln_attr_graph_count(const kiln_attr *a)
{
    return a->type == KILN_ATTR_GRAPH ? 1 : a->type == KILN_ATTR_GRAPHS ? a->n : 0;
}

const kiln_graph *kiln_attr_graph_at(const kiln_attr *a, int i)
{
    return a->type == KILN_ATTR_GRAPH ? a->g : a->graphs[i];
}

kiln_status kiln_graph_plan_releases(kiln_graph *g, kiln_err *err)
{
    for (int i = 0; i < g->n_values; i++) g->values[i]->last_use = -1;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *nd = g->nodes[k];
        for (int i = 0; i < nd->n_in; i++)
            if (nd->in[i] && nd->in[i]->graph == g) nd->in[i]->last_use = k;
        for (int a = 0; a < nd->n_attrs; a++)
            for (int q = 0; q < kiln_attr_graph_count(&nd->attrs[a]); q++) {
                const kiln_graph *sg = kiln_attr_graph_at(&nd->attrs[a], q);
                for (int r = 0; r < sg->n_captures; r++)
                    if (sg->captures[r]->graph == g) sg->captures[r]->last_use = k;
            }
    }
    int *count = calloc((size_t)g->n_nodes + 1, sizeof *count);
    if (!count) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < g->n_values; i++) {
        kiln_ir_value *v = g->values[i];
        if (v->last_use >= 0 && v->producer && !v->is_output) count[v->last_use]++;
    }
    for (int k = 0; k < g->n_nodes; k++) {
        g->nodes[k]->n_release = 0;
        g->nodes[k]->release = kiln_arena_calloc(&g->model->arena, (size_t)count[k] + 1, sizeof(kiln_ir_value *));
        if (!g->nodes[k]->release) {
            free(count);
            return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        }
    }
    free(count);
    for (int i = 0; i < g->n_values; i++) {
        kiln_ir_value *v = g->values[i];
        if (v->last_use >= 0 && v->producer && !v->is_output) {
            kiln_node *nd = g->nodes[v->last_use];
            nd->release[nd->n_release++] = v;
        }
    }
    return KILN_OK;
}

/* ---- consumer lists ---- */

static kiln_status add_use(kiln_graph *g, kiln_ir_value *v, kiln_node *n, int slot, kiln_err *err)
{
    if (v->n_uses == v->cap_uses) {
        int cap = v->cap_uses ? v->cap_uses * 2 : 4;
        kiln_use *u = kiln_arena_calloc(&g->model->arena, (size_t)cap, sizeof *u);
        if (!u) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        if (v->n_uses) memcpy(u, v->uses, (size_t)v->n_uses * sizeof *u);
        v->uses = u;
        v->cap_uses = cap;
    }
    v->uses[v->n_uses++] = (kiln_use){n, slot};
    return KILN_OK;
}

static void drop_use(kiln_ir_value *v, const kiln_node *n, int slot)
{
    for (int u = 0; u < v->n_uses; u++)
        if (v->uses[u].node == n && v->uses[u].slot == slot) {
            v->uses[u] = v->uses[--v->n_uses];
            return;
        }
}

/* Whether v's consumer list is kept: a value of n's own graph (outer values are captures). */
static bool tracked(const kiln_node *n, const kiln_ir_value *v) { return v && v->graph == n->graph; }

kiln_status kiln_graph_index_uses(kiln_graph *g, kiln_err *err)
{
    for (int i = 0; i < g->n_values; i++) {
        g->values[i]->n_uses = 0;
        g->values[i]->n_captured = 0;
    }
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = g->nodes[k];
        for (int i = 0; i < n->n_in; i++)
            if (tracked(n, n->in[i])) KILN_TRY(add_use(g, n->in[i], n, i, err));
        for (int a = 0; a < n->n_attrs; a++)
            for (int q = 0; q < kiln_attr_graph_count(&n->attrs[a]); q++) {
                const kiln_graph *sg = kiln_attr_graph_at(&n->attrs[a], q);
                for (int r = 0; r < sg->n_captures; r++)
                    if (sg->captures[r]->graph == g) sg->captures[r]->n_captured++;
            }
    }
    return KILN_OK;
}

kiln_node *kiln_ir_value_only_reader(const kiln_ir_value *v)
{
    return kiln_ir_value_readers(v) == 1 && v->n_uses == 1 ? v->uses[0].node : NULL;
}

kiln_status kiln_node_set_input(kiln_node *n, int i, kiln_ir_value *v, kiln_err *err)
{
    if (n->in[i] == v) return KILN_OK;
    if (tracked(n, v)) KILN_TRY(add_use(n->graph, v, n, i, err));
    if (tracked(n, n->in[i])) drop_use(n->in[i], n, i);
    n->in[i] = v;
    return KILN_OK;
}

kiln_status kiln_node_set_inputs(kiln_node *n, int n_in, kiln_ir_value *const *in, kiln_err *err)
{
    kiln_ir_value **a = kiln_arena_calloc(&n->graph->model->arena, (size_t)n_in + 1, sizeof *a);
    if (!a) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_in; i++)
        if (tracked(n, in[i])) KILN_TRY(add_use(n->graph, in[i], n, -1 - i, err)); /* renumbered below */
    for (int i = 0; i < n->n_in; i++)
        if (tracked(n, n->in[i])) drop_use(n->in[i], n, i);
    for (int i = 0; i < n_in; i++) {
        a[i] = in[i];
        if (!tracked(n, in[i])) continue;
        for (int u = 0; u < in[i]->n_uses; u++)
            if (in[i]->uses[u].node == n && in[i]->uses[u].slot == -1 - i) in[i]->uses[u].slot = i;
    }
    n->in = a;
    n->n_in = n_in;
    return KILN_OK;
}

void kiln_node_set_output(kiln_node *n, int i, kiln_ir_value *v)
{
    if (n->out[i] && n->out[i]->producer == n) n->out[i]->producer = NULL;
    n->out[i] = v;
    if (v) v->producer = n;
}

void kiln_node_unlink(kiln_node *n)
{
    for (int i = 0; i < n->n_in; i++)
        if (tracked(n, n->in[i])) drop_use(n->in[i], n, i);
    for (int i = 0; i < n->n_out; i++)
        if (n->out[i] && n->out[i]->producer == n) n->out[i]->producer = NULL;
}

void kiln_graph_compact(kiln_graph *g)
{
    int kept = 0;
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k]) {
            g->nodes[kept] = g->nodes[k];
            g->nodes[kept]->index = kept;
            kept++;
        }
    g->n_nodes = kept;
}

bool kiln_graph_uses_consistent(const kiln_graph *g)
{
    for (int i = 0; i < g->n_values; i++) {
        const kiln_ir_value *v = g->values[i];
        int uses = 0, captured = 0;
        for (int k = 0; k < g->n_nodes; k++) {
            const kiln_node *n = g->nodes[k];
            for (int s = 0; s < n->n_in; s++) {
                if (n->in[s] != v) continue;
                uses++;
                bool listed = false;
                for (int u = 0; u < v->n_uses && !listed; u++) listed = v->uses[u].node == n && v->uses[u].slot == s;
                if (!listed) return false;
            }
            for (int a = 0; a < n->n_attrs; a++)
                for (int q = 0; q < kiln_attr_graph_count(&n->attrs[a]); q++) {
                    const kiln_graph *sg = kiln_attr_graph_at(&n->attrs[a], q);
                    for (int r = 0; r < sg->n_captures; r++) captured += sg->captures[r] == v;
                }
        }
        if (uses != v->n_uses || captured != v->n_captured) return false;
        if (v->producer) {
            bool produces = false;
            for (int o = 0; o < v->producer->n_out; o++) produces = produces || v->producer->out[o] == v;
            if (!produces || v->producer->graph != g || v->producer->index < 0 || v->producer->index >= g->n_nodes ||
                g->nodes[v->producer->index] != v->producer)
                return false;
        }
    }
    return true;
}

kiln_status kiln_node_set_attr(kiln_node *n, const kiln_attr *a, kiln_err *err)
{
    /* a fresh array: the loader may share one between nodes */
    kiln_attr *at = kiln_arena_calloc(&n->graph->model->arena, (size_t)n->n_attrs + 1, sizeof *at);
    if (!at) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    if (n->n_attrs) memcpy(at, n->attrs, (size_t)n->n_attrs * sizeof *at);
    int i = 0;
    while (i < n->n_attrs && strcmp(at[i].name, a->name)) i++;
    at[i] = *a;
    n->attrs = at;
    if (i == n->n_attrs) n->n_attrs++;
    return KILN_OK;
}
