/* load.c - ModelProto to IR: graphs and subgraphs with outer-scope references, initializers,
 * attributes, symbolic input dims, inlining of model-local functions, topological order. */
#define _GNU_SOURCE
#include "onnx/load.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/strmap.h"
#include "onnx/onnx_pb.h"
#include "onnx/slim.h"
#include "ops/op.h"

#define MAX_INLINE_DEPTH 32
#define MAX_GRAPH_DEPTH 64
#define MAX_WIRE_DEPTH 256 /* nested protobuf messages: a graph level is 3 (node, attribute, graph) */

/* Kept alive by the model: the parsed proto (tensors may borrow from it) and the mappings. */
typedef struct load_source {
    Onnx__ModelProto *proto;
    kiln_mapping *maps;
    /* initializers whose raw_data points into the mapped model file (kiln_onnx_load_file) */
    kiln_raw_cut *cuts;
    size_t n_cuts;
} load_source;

static void release_source(void *p)
{
    load_source *s = p;
    if (!s) return;
    /* raw_data borrowed from the file is not protobuf-c's to free */
    for (size_t i = 0; s->proto && s->proto->graph && i < s->n_cuts; i++) {
        Onnx__TensorProto *tp = s->proto->graph->initializer[s->cuts[i].initializer];
        tp->raw_data.data = NULL;
        tp->raw_data.len = 0;
    }
    free(s->cuts);
    if (s->proto) onnx__model_proto__free_unpacked(s->proto, NULL);
    kiln_mappings_release(s->maps);
    free(s);
}

/* The raw_data field of an initializer of gp or of its subgraphs holding the block at p, or NULL. */
static ProtobufCBinaryData *find_raw(Onnx__GraphProto *gp, const void *p, int depth)
{
    if (!gp || depth > MAX_GRAPH_DEPTH) return NULL;
    for (size_t i = 0; i < gp->n_initializer; i++)
        if (gp->initializer[i]->raw_data.data == p) return &gp->initializer[i]->raw_data;
    for (size_t k = 0; k < gp->n_node; k++)
        for (size_t a = 0; a < gp->node[k]->n_attribute; a++) {
            const Onnx__AttributeProto *at = gp->node[k]->attribute[a];
            ProtobufCBinaryData *b = find_raw(at->g, p, depth + 1);
            for (size_t q = 0; !b && q < at->n_graphs; q++) b = find_raw(at->graphs[q], p, depth + 1);
            if (b) return b;
        }
    return NULL;
}

/* kiln_model.release_bytes: the pages of mapped external data are dropped (the mapping is
 * private and never written, so a later read faults them in again from the file); a
 * raw_data block of the parsed proto is freed and its field cleared, so that
 * free_unpacked does not free it again. O(initializers) per call. */
static bool release_bytes(void *p, const void *data, size_t nbytes)
{
    load_source *s = p;
    if (kiln_mappings_drop(s->maps, data, nbytes)) return false;
    ProtobufCBinaryData *b = s->proto ? find_raw(s->proto->graph, data, 0) : NULL;
    if (!b) return false;
    free(b->data); /* protobuf-c's default allocator is malloc */
    b->data = NULL;
    b->len = 0;
    return true;
}

typedef struct loader {
    kiln_model *m;
    kiln_err *err;
    kiln_tensor_source src;
    const Onnx__ModelProto *mp;
    unsigned counter; /* for unique names of inlined values */
} loader;

/* Names visible while building one graph; parent is the enclosing graph's scope. */
typedef struct scope {
    kiln_graph *g;
    kiln_strmap names;
    struct scope *parent;
    int depth;
} scope;

/* Where a node comes from: the graph itself, or a function body being inlined. */
typedef struct inline_ctx {
    const struct inline_ctx *outer;
    const char *prefix;                 /* for names internal to the body */
    kiln_strmap *formal;                /* formal name -> actual name (char *) */
    const Onnx__NodeProto *caller;      /* for attribute references */
    const Onnx__FunctionProto *fn;
    int depth;
} inline_ctx;

/* A node after inlining: resolved names and where its attributes come from. */
typedef struct flat_node {
    const Onnx__NodeProto *np;
    const inline_ctx *ic;               /* NULL for graph nodes */
    const char **in, **out;
    int opset;
    const char *name;
} flat_node;

typedef struct flat_list {
    flat_node *v;
    int n, cap;
    inline_ctx **ctxs;                  /* owned, released after the graph is built */
    int n_ctx, cap_ctx;
} flat_list;

static kiln_status oom(loader *L) { return kiln_errf(L->err, KILN_ERR_NOMEM, "out of memory"); }

static const char *nz(const char *s) { return s ? s : ""; }

static kiln_ir_value *lookup(const scope *s, const char *name)
{
    for (; s; s = s->parent) {
        kiln_ir_value *v = kiln_strmap_get(&s->names, name);
        if (v) return v;
    }
    return NULL;
}

/* ---- types ---- */

static kiln_status type_from_proto(loader *L, const Onnx__TypeProto *tp, kiln_type *t, bool fresh_dims)
{
    kiln_type_unknown(t);
    if (!tp) return KILN_OK;
    switch (tp->value_case) {
    case ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE: {
        const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
        t->kind = KILN_VALUE_TENSOR;
        t->dtype = tt->has_elem_type ? (kiln_dtype)tt->elem_type : KILN_DTYPE_UNDEFINED;
        if (t->dtype != KILN_DTYPE_UNDEFINED && !kiln_dtype_valid(t->dtype))
            return kiln_errf(L->err, KILN_ERR_MODEL, "unknown element type %d", (int)tt->elem_type);
        if (!tt->shape) return KILN_OK;
        if (tt->shape->n_dim > KILN_MAX_RANK)
            return kiln_errf(L->err, KILN_ERR_UNSUPPORTED, "rank %zu exceeds %d", tt->shape->n_dim, KILN_MAX_RANK);
        t->rank = (int)tt->shape->n_dim;
        for (int i = 0; i < t->rank; i++) {
            const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
            /* a negative dim_value (exporters write -1) is an unknown dim, as ONNX Runtime reads it */
            if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && d->dim_value >= 0)
                t->dims[i] = kiln_dim_const(d->dim_value);
            /* "?" (paddle2onnx's word for a dim it does not know) names no dim: ONNX Runtime
             * binds each one on its own, so ['?', 3, '?', '?'] takes [1, 3, 48, 192] */
            else if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && d->dim_param && *d->dim_param &&
                     strcmp(d->dim_param, "?") != 0)
                t->dims[i] = kiln_dim_sym(L->m->dims, d->dim_param);
            else
                t->dims[i] = fresh_dims ? kiln_dim_sym(L->m->dims, NULL) : kiln_dim_unknown();
        }
        return KILN_OK;
    }
    case ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE: {
        kiln_type elem;
        KILN_TRY(type_from_proto(L, tp->sequence_type->elem_type, &elem, fresh_dims));
        *t = elem;
        t->kind = KILN_VALUE_SEQUENCE;
        return KILN_OK;
    }
    case ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE: {
        kiln_type elem;
        KILN_TRY(type_from_proto(L, tp->optional_type->elem_type, &elem, fresh_dims));
        *t = elem;
        t->elem_kind = elem.kind;
        t->kind = KILN_VALUE_OPTIONAL;
        return KILN_OK;
    }
    case ONNX__TYPE_PROTO__VALUE_MAP_TYPE:
        return kiln_errf(L->err, KILN_ERR_UNSUPPORTED, "map types are not supported");
    case ONNX__TYPE_PROTO__VALUE_SPARSE_TENSOR_TYPE:
        return kiln_errf(L->err, KILN_ERR_UNSUPPORTED, "sparse tensor types are not supported");
    default: return KILN_OK;
    }
}

/* ---- attributes ---- */

static kiln_status load_graph(loader *L, const Onnx__GraphProto *gp, scope *parent, kiln_graph **out);

static kiln_status tensor_owned(loader *L, const Onnx__TensorProto *tp, kiln_value **out)
{
    KILN_TRY(kiln_onnx_tensor(tp, &L->src, out, L->err));
    return kiln_model_own_value(L->m, *out, L->err);
}

static kiln_attr_type attr_type_of(const Onnx__AttributeProto *a)
{
    if (a->has_type && a->type) return (kiln_attr_type)a->type;
    if (a->has_f) return KILN_ATTR_FLOAT;
    if (a->has_i) return KILN_ATTR_INT;
    if (a->has_s) return KILN_ATTR_STRING;
    if (a->t) return KILN_ATTR_TENSOR;
    if (a->g) return KILN_ATTR_GRAPH;
    if (a->n_floats) return KILN_ATTR_FLOATS;
    if (a->n_ints) return KILN_ATTR_INTS;
    if (a->n_strings) return KILN_ATTR_STRINGS;
    if (a->n_tensors) return KILN_ATTR_TENSORS;
    if (a->n_graphs) return KILN_ATTR_GRAPHS;
    return KILN_ATTR_UNDEFINED;
}

static kiln_status convert_attr(loader *L, scope *sc, const Onnx__AttributeProto *ap, const char *name,
                                kiln_attr *a)
{
    kiln_arena *ar = &L->m->arena;
    a->name = kiln_arena_strdup(ar, name);
    if (!a->name) return oom(L);
    a->type = attr_type_of(ap);
    switch (a->type) {
    case KILN_ATTR_FLOAT: a->f = ap->f; break;
    case KILN_ATTR_INT: a->i = ap->i; break;
    case KILN_ATTR_STRING:
        a->s = kiln_arena_strndup(ar, (const char *)ap->s.data, ap->s.len);
        a->s_len = ap->s.len;
        if (!a->s) return oom(L);
        break;
    case KILN_ATTR_TENSOR: {
        if (!ap->t) return kiln_errf(L->err, KILN_ERR_MODEL, "attribute '%s' has no tensor", name);
        KILN_TRY(tensor_owned(L, ap->t, &a->t));
        break;
    }
    case KILN_ATTR_GRAPH:
        if (!ap->g) return kiln_errf(L->err, KILN_ERR_MODEL, "attribute '%s' has no graph", name);
        KILN_TRY(load_graph(L, ap->g, sc, &a->g));
        break;
    case KILN_ATTR_FLOATS: {
        float *f = kiln_arena_calloc(ar, ap->n_floats, sizeof *f);
        if (!f) return oom(L);
        if (ap->n_floats) memcpy(f, ap->floats, ap->n_floats * sizeof *f);
        a->floats = f;
        a->n = (int)ap->n_floats;
        break;
    }
    case KILN_ATTR_INTS: {
        int64_t *v = kiln_arena_calloc(ar, ap->n_ints, sizeof *v);
        if (!v) return oom(L);
        if (ap->n_ints) memcpy(v, ap->ints, ap->n_ints * sizeof *v);
        a->ints = v;
        a->n = (int)ap->n_ints;
        break;
    }
    case KILN_ATTR_STRINGS: {
        const char **s = kiln_arena_calloc(ar, ap->n_strings, sizeof *s);
        size_t *lens = kiln_arena_calloc(ar, ap->n_strings, sizeof *lens);
        if (!s || !lens) return oom(L);
        for (size_t i = 0; i < ap->n_strings; i++) {
            s[i] = kiln_arena_strndup(ar, (const char *)ap->strings[i].data, ap->strings[i].len);
            lens[i] = ap->strings[i].len;
            if (!s[i]) return oom(L);
        }
        a->strings = s;
        a->string_lens = lens;
        a->n = (int)ap->n_strings;
        break;
    }
    case KILN_ATTR_TENSORS: {
        kiln_value **t = kiln_arena_calloc(ar, ap->n_tensors, sizeof *t);
        if (!t) return oom(L);
        for (size_t i = 0; i < ap->n_tensors; i++) KILN_TRY(tensor_owned(L, ap->tensors[i], &t[i]));
        a->tensors = t;
        a->n = (int)ap->n_tensors;
        break;
    }
    case KILN_ATTR_GRAPHS: {
        kiln_graph **g = kiln_arena_calloc(ar, ap->n_graphs, sizeof *g);
        if (!g) return oom(L);
        for (size_t i = 0; i < ap->n_graphs; i++) KILN_TRY(load_graph(L, ap->graphs[i], sc, &g[i]));
        a->graphs = g;
        a->n = (int)ap->n_graphs;
        break;
    }
    case KILN_ATTR_TYPE_PROTO:
        if (ap->tp) {
            kiln_type t;
            KILN_TRY(type_from_proto(L, ap->tp, &t, false));
            a->tp_dtype = t.dtype;
        }
        break;
    default: break; /* sparse tensors and type-proto lists: kept as typed, without content */
    }
    return KILN_OK;
}

/* ---- function inlining ---- */

static const Onnx__FunctionProto *find_function(loader *L, const char *domain, const char *op)
{
    for (size_t i = 0; i < L->mp->n_functions; i++) {
        const Onnx__FunctionProto *f = L->mp->functions[i];
        if (!strcmp(nz(f->name), op) && !strcmp(nz(f->domain), domain)) return f;
    }
    return NULL;
}

/* Name of `name` as seen from the graph, through the chain of inlined bodies. */
static const char *resolve_name(loader *L, const inline_ctx *ic, const char *name)
{
    if (!*name) return name;
    for (; ic; ic = ic->outer) {
        const char *actual = kiln_strmap_get(ic->formal, name);
        if (actual) {
            name = actual;
            continue; /* the caller's name, resolve in the outer context */
        }
        char *buf;
        size_t len = strlen(ic->prefix) + strlen(name) + 2;
        buf = kiln_arena_alloc(&L->m->arena, len);
        if (!buf) return NULL;
        snprintf(buf, len, "%s/%s", ic->prefix, name);
        return buf; /* internal names of a body are unique, no further mapping */
    }
    return name;
}

/* The version of domain imported by ops[0..n), -1 when it is not imported (the first entry
 * counts when a domain is listed twice). */
static int64_t opset_in(const Onnx__OperatorSetIdProto *const *ops, size_t n, const char *domain)
{
    if (!strcmp(domain, "ai.onnx")) domain = "";
    for (size_t i = 0; i < n; i++) {
        const char *d = nz(ops[i]->domain);
        if (!strcmp(d, "ai.onnx")) d = "";
        if (!strcmp(d, domain)) return ops[i]->version;
    }
    return -1;
}

static kiln_status flatten_nodes(loader *L, Onnx__NodeProto *const *nodes, size_t n_nodes,
                                 const inline_ctx *ic, flat_list *fl);

static kiln_status push_ctx(flat_list *fl, inline_ctx *c)
{
    if (fl->n_ctx == fl->cap_ctx) {
        int cap = fl->cap_ctx ? fl->cap_ctx * 2 : 8;
        inline_ctx **v = realloc(fl->ctxs, (size_t)cap * sizeof *v);
        if (!v) return KILN_ERR_NOMEM;
        fl->ctxs = v;
        fl->cap_ctx = cap;
    }
    fl->ctxs[fl->n_ctx++] = c;
    return KILN_OK;
}

static kiln_status inline_call(loader *L, const Onnx__NodeProto *np, const Onnx__FunctionProto *fn,
                               const inline_ctx *outer, flat_list *fl)
{
    int depth = outer ? outer->depth + 1 : 1;
    if (depth > MAX_INLINE_DEPTH)
        return kiln_errf(L->err, KILN_ERR_MODEL, "function '%s' nests deeper than %d (recursive?)",
                         nz(fn->name), MAX_INLINE_DEPTH);
    inline_ctx *c = calloc(1, sizeof *c);
    kiln_strmap *formal = calloc(1, sizeof *formal);
    if (!c || !formal || push_ctx(fl, c)) {
        free(c);
        free(formal);
        return oom(L);
    }
    c->outer = outer;
    c->formal = formal;
    c->caller = np;
    c->fn = fn;
    c->depth = depth;
    char pfx[64];
    snprintf(pfx, sizeof pfx, "%s#%u", nz(fn->name), ++L->counter);
    c->prefix = kiln_arena_strdup(&L->m->arena, pfx);
    if (!c->prefix) return oom(L);
    /* formal inputs/outputs map to the caller's names (resolved in the caller's context) */
    for (size_t i = 0; i < fn->n_input; i++) {
        const char *actual = i < np->n_input ? resolve_name(L, outer, nz(np->input[i])) : "";
        if (!actual || !kiln_strmap_put(formal, fn->input[i], (void *)actual)) return oom(L);
    }
    for (size_t i = 0; i < fn->n_output; i++) {
        const char *actual = i < np->n_output ? resolve_name(L, outer, nz(np->output[i])) : "";
        if (!actual || !kiln_strmap_put(formal, fn->output[i], (void *)actual)) return oom(L);
    }
    /* names were resolved already: the body's context must not map them again */
    c->outer = NULL;
    return flatten_nodes(L, fn->node, fn->n_node, c, fl);
}

static kiln_status flatten_nodes(loader *L, Onnx__NodeProto *const *nodes, size_t n_nodes,
                                 const inline_ctx *ic, flat_list *fl)
{
    for (size_t k = 0; k < n_nodes; k++) {
        const Onnx__NodeProto *np = nodes[k];
        const char *domain = nz(np->domain);
        const char *op = nz(np->op_type);
        /* functions are looked up in the model; a body's nodes use the function's opsets */
        const Onnx__FunctionProto *fn = find_function(L, domain, op);
        if (fn) {
            KILN_TRY(inline_call(L, np, fn, ic, fl));
            continue;
        }
        int64_t opset = ic ? opset_in((const Onnx__OperatorSetIdProto *const *)ic->fn->opset_import,
                                      ic->fn->n_opset_import, domain)
                           : -1;
        if (opset < 0)
            opset = opset_in((const Onnx__OperatorSetIdProto *const *)L->mp->opset_import,
                             L->mp->n_opset_import, domain);
        /* a domain the model does not import runs at the newest version kiln has, as ONNX
         * Runtime runs it at its newest; a domain kiln has no operator of is an error */
        if (opset < 0 && (opset = kiln_op_domain_latest(domain)) <= 0)
            return kiln_errf(L->err, KILN_ERR_MODEL, "node '%s' (%s): domain '%s' is not imported by the model",
                             nz(np->name), op, domain);
        if (opset > INT_MAX)
            return kiln_errf(L->err, KILN_ERR_MODEL, "node '%s' (%s): opset version %lld of domain '%s' is out of range",
                             nz(np->name), op, (long long)opset, domain);
        if (fl->n == fl->cap) {
            int cap = fl->cap ? fl->cap * 2 : 64;
            flat_node *v = realloc(fl->v, (size_t)cap * sizeof *v);
            if (!v) return oom(L);
            fl->v = v;
            fl->cap = cap;
        }
        flat_node *f = &fl->v[fl->n++];
        memset(f, 0, sizeof *f);
        f->np = np;
        f->ic = ic;
        f->opset = (int)opset;
        f->in = kiln_arena_calloc(&L->m->arena, np->n_input + 1, sizeof *f->in);
        f->out = kiln_arena_calloc(&L->m->arena, np->n_output + 1, sizeof *f->out);
        if (!f->in || !f->out) return oom(L);
        for (size_t i = 0; i < np->n_input; i++)
            if (!(f->in[i] = resolve_name(L, ic, nz(np->input[i])))) return oom(L);
        for (size_t i = 0; i < np->n_output; i++)
            if (!(f->out[i] = resolve_name(L, ic, nz(np->output[i])))) return oom(L);
        if (ic) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s/%s", ic->prefix, np->name && *np->name ? np->name : op);
            f->name = kiln_arena_strdup(&L->m->arena, buf);
        } else {
            f->name = kiln_arena_strdup(&L->m->arena, nz(np->name));
        }
        if (!f->name) return oom(L);
    }
    return KILN_OK;
}

static void flat_release(flat_list *fl)
{
    for (int i = 0; i < fl->n_ctx; i++) {
        kiln_strmap_release(fl->ctxs[i]->formal);
        free(fl->ctxs[i]->formal);
        free(fl->ctxs[i]);
    }
    free(fl->ctxs);
    free(fl->v);
}

/* Attributes of a flat node: its own, with references to the caller's attributes replaced. */
static kiln_status node_attrs(loader *L, scope *sc, const flat_node *f, kiln_node *n)
{
    const Onnx__NodeProto *np = f->np;
    n->attrs = kiln_arena_calloc(&L->m->arena, np->n_attribute + 1, sizeof *n->attrs);
    if (!n->attrs) return oom(L);
    for (size_t i = 0; i < np->n_attribute; i++) {
        const Onnx__AttributeProto *ap = np->attribute[i];
        const char *name = nz(ap->name);
        if (ap->ref_attr_name && *ap->ref_attr_name) {
            const Onnx__AttributeProto *src = NULL;
            const char *ref = ap->ref_attr_name;
            if (f->ic)
                for (size_t j = 0; j < f->ic->caller->n_attribute && !src; j++)
                    if (!strcmp(nz(f->ic->caller->attribute[j]->name), ref)) src = f->ic->caller->attribute[j];
            if (!src) continue; /* the caller does not set it: the op's default applies */
            ap = src;
        }
        KILN_TRY(convert_attr(L, sc, ap, name, &n->attrs[n->n_attrs]));
        n->n_attrs++;
    }
    return KILN_OK;
}

/* ---- graphs ---- */

static kiln_status define(loader *L, scope *sc, kiln_ir_value *v)
{
    if (kiln_strmap_get(&sc->names, v->name))
        return kiln_errf(L->err, KILN_ERR_MODEL, "value '%s' is defined twice in graph '%s'", v->name,
                         nz(sc->g->name));
    if (!kiln_strmap_put(&sc->names, v->name, v)) return oom(L);
    return KILN_OK;
}

static kiln_status add_capture(loader *L, kiln_graph *g, kiln_ir_value *v)
{
    for (int i = 0; i < g->n_captures; i++)
        if (g->captures[i] == v) return KILN_OK;
    kiln_ir_value **c = kiln_arena_calloc(&L->m->arena, (size_t)g->n_captures + 1, sizeof *c);
    if (!c) return oom(L);
    if (g->n_captures) memcpy(c, g->captures, (size_t)g->n_captures * sizeof *c);
    c[g->n_captures++] = v;
    g->captures = c;
    return KILN_OK;
}

typedef struct edge_list {
    int *from, *to;
    int n, cap;
} edge_list;

static bool add_edge(edge_list *e, const kiln_graph *g, const kiln_ir_value *v, int consumer)
{
    if (!v || v->graph != g || !v->producer) return true;
    if (e->n == e->cap) {
        int cap = e->cap ? e->cap * 2 : 256;
        int *f = realloc(e->from, (size_t)cap * sizeof *f);
        if (!f) return false;
        e->from = f;
        int *t = realloc(e->to, (size_t)cap * sizeof *t);
        if (!t) return false;
        e->to = t;
        e->cap = cap;
    }
    e->from[e->n] = v->producer->index;
    e->to[e->n++] = consumer;
    return true;
}

/* Kahn's algorithm; a node depends on the producers of its inputs and of the values its
 * subgraphs capture. */
static kiln_status topo_sort(loader *L, kiln_graph *g)
{
    int n = g->n_nodes;
    if (!n) return KILN_OK;
    for (int k = 0; k < n; k++) g->nodes[k]->index = k;
    edge_list e = {0};
    kiln_status st = KILN_OK;
    int *indeg = calloc((size_t)n, sizeof *indeg), *order = calloc((size_t)n, sizeof *order);
    int *start = calloc((size_t)n + 1, sizeof *start), *adj = NULL;
    kiln_node **sorted = kiln_arena_calloc(&L->m->arena, (size_t)n, sizeof *sorted);
    if (!indeg || !order || !start || !sorted) goto nomem;
    for (int k = 0; k < n; k++) {
        const kiln_node *nd = g->nodes[k];
        for (int i = 0; i < nd->n_in; i++)
            if (!add_edge(&e, g, nd->in[i], k)) goto nomem;
        for (int a = 0; a < nd->n_attrs; a++)
            for (int q = 0; q < kiln_attr_graph_count(&nd->attrs[a]); q++) {
                const kiln_graph *sg = kiln_attr_graph_at(&nd->attrs[a], q);
                for (int r = 0; r < sg->n_captures; r++)
                    if (!add_edge(&e, g, sg->captures[r], k)) goto nomem;
            }
    }
    adj = calloc((size_t)e.n + 1, sizeof *adj);
    if (!adj) goto nomem;
    for (int i = 0; i < e.n; i++) {
        start[e.from[i] + 1]++;
        indeg[e.to[i]]++;
    }
    for (int k = 0; k < n; k++) start[k + 1] += start[k];
    int *fill = order; /* reuse as a cursor array before it holds the order */
    memcpy(fill, start, (size_t)n * sizeof *fill);
    for (int i = 0; i < e.n; i++) adj[fill[e.from[i]]++] = e.to[i];
    int head = 0, tail = 0;
    for (int k = 0; k < n; k++)
        if (!indeg[k]) order[tail++] = k;
    while (head < tail) {
        int k = order[head++];
        for (int j = start[k]; j < start[k + 1]; j++)
            if (--indeg[adj[j]] == 0) order[tail++] = adj[j];
    }
    if (tail != n) {
        st = kiln_errf(L->err, KILN_ERR_MODEL, "graph '%s' has a cycle", nz(g->name));
        goto out;
    }
    for (int k = 0; k < n; k++) {
        sorted[k] = g->nodes[order[k]];
        sorted[k]->index = k;
    }
    g->nodes = sorted;
    goto out;
nomem:
    st = oom(L);
out:
    free(e.from);
    free(e.to);
    free(indeg);
    free(order);
    free(start);
    free(adj);
    return st;
}

/* last readers and release lists; graph outputs are never released early */
static kiln_status build_graph(loader *L, const Onnx__GraphProto *gp, scope *sc)
{
    kiln_graph *g = sc->g;
    kiln_arena *ar = &L->m->arena;
    kiln_status st;
    /* initializers */
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        kiln_value *t;
        KILN_TRY(tensor_owned(L, tp, &t));
        kiln_ir_value *v = kiln_graph_new_value(g, nz(tp->name), L->err);
        if (!v) return L->err->code;
        KILN_TRY(define(L, sc, v));
        v->init = t;
        v->type.kind = KILN_VALUE_TENSOR;
        v->type.dtype = t->dtype;
        v->type.rank = t->rank;
        for (int d = 0; d < t->rank; d++) v->type.dims[d] = kiln_dim_const(t->dims[d]);
    }
    if (gp->n_sparse_initializer)
        return kiln_errf(L->err, KILN_ERR_UNSUPPORTED, "sparse initializers are not supported");
    /* inputs (an input with an initializer is an overridable default) */
    g->inputs = kiln_arena_calloc(ar, gp->n_input + 1, sizeof *g->inputs);
    if (!g->inputs) return oom(L);
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        const char *name = nz(vi->name);
        kiln_ir_value *v = kiln_strmap_get(&sc->names, name);
        if (v && v->is_input)
            return kiln_errf(L->err, KILN_ERR_MODEL, "graph input '%s' is listed twice", name);
        if (!v) {
            v = kiln_graph_new_value(g, name, L->err);
            if (!v) return L->err->code;
            KILN_TRY(define(L, sc, v));
            st = type_from_proto(L, vi->type, &v->type, true);
            if (st) return kiln_err_prefix(L->err, "graph input '%s'", name);
        }
        v->is_input = true;
        g->inputs[g->n_inputs++] = v;
    }
    /* nodes: inline functions, then define every output before resolving inputs so that
     * subgraphs can refer to values produced anywhere in this graph */
    flat_list fl = {0};
    st = flatten_nodes(L, gp->node, gp->n_node, NULL, &fl);
    if (st) goto done;
    g->nodes = kiln_arena_calloc(ar, (size_t)fl.n + 1, sizeof *g->nodes);
    if (!g->nodes) {
        st = oom(L);
        goto done;
    }
    for (int k = 0; k < fl.n; k++) {
        const flat_node *f = &fl.v[k];
        kiln_node *n = kiln_arena_alloc(ar, sizeof *n);
        if (!n) {
            st = oom(L);
            goto done;
        }
        n->name = f->name;
        n->op_type = kiln_arena_strdup(ar, nz(f->np->op_type));
        n->domain = kiln_arena_strdup(ar, !strcmp(nz(f->np->domain), "ai.onnx") ? "" : nz(f->np->domain));
        n->opset = f->opset;
        n->graph = g;
        n->n_in = (int)f->np->n_input;
        n->n_out = (int)f->np->n_output;
        n->in = kiln_arena_calloc(ar, (size_t)n->n_in + 1, sizeof *n->in);
        n->out = kiln_arena_calloc(ar, (size_t)n->n_out + 1, sizeof *n->out);
        if (!n->op_type || !n->domain || !n->in || !n->out) {
            st = oom(L);
            goto done;
        }
        for (int i = 0; i < n->n_out; i++) {
            if (!*f->out[i]) continue;
            kiln_ir_value *v = kiln_graph_new_value(g, f->out[i], L->err);
            if (!v) {
                st = L->err->code;
                goto done;
            }
            st = define(L, sc, v);
            if (st) goto done;
            v->producer = n;
            n->out[i] = v;
        }
        g->nodes[g->n_nodes++] = n;
    }
    for (int k = 0; k < fl.n; k++) {
        const flat_node *f = &fl.v[k];
        kiln_node *n = g->nodes[k];
        for (int i = 0; i < n->n_in; i++) {
            if (!*f->in[i]) continue;
            kiln_ir_value *v = lookup(sc, f->in[i]);
            if (!v) {
                st = kiln_errf(L->err, KILN_ERR_MODEL, "node '%s' (%s): input '%s' is not defined", n->name,
                               n->op_type, f->in[i]);
                goto done;
            }
            if (v->graph != g) {
                /* an outer-scope value: every graph between here and its owner captures it */
                for (scope *s = sc; s && s->g != v->graph; s = s->parent) {
                    st = add_capture(L, s->g, v);
                    if (st) goto done;
                }
            }
            n->in[i] = v;
        }
        st = node_attrs(L, sc, f, n);
        if (st) {
            if (L->err->code == st && !strstr(L->err->msg, n->name))
                kiln_err_prefix(L->err, "node '%s' (%s)", n->name, n->op_type);
            goto done;
        }
        /* subgraph captures of values outside this graph propagate here too */
        for (int a = 0; a < n->n_attrs; a++)
            for (int q = 0; q < kiln_attr_graph_count(&n->attrs[a]); q++) {
                const kiln_graph *sgr = kiln_attr_graph_at(&n->attrs[a], q);
                for (int r = 0; r < sgr->n_captures; r++)
                    if (sgr->captures[r]->graph != g) {
                        st = add_capture(L, g, sgr->captures[r]);
                        if (st) goto done;
                    }
            }
    }
    /* outputs */
    g->outputs = kiln_arena_calloc(ar, gp->n_output + 1, sizeof *g->outputs);
    if (!g->outputs) {
        st = oom(L);
        goto done;
    }
    for (size_t i = 0; i < gp->n_output; i++) {
        const Onnx__ValueInfoProto *vi = gp->output[i];
        kiln_ir_value *v = lookup(sc, nz(vi->name));
        if (!v) {
            st = kiln_errf(L->err, KILN_ERR_MODEL, "graph output '%s' is not produced by the graph", nz(vi->name));
            goto done;
        }
        if (v->graph != g) {
            for (scope *s = sc; s && s->g != v->graph; s = s->parent) {
                st = add_capture(L, s->g, v);
                if (st) goto done;
            }
        }
        if (v->graph == g) v->is_output = true;
        if (v->type.kind == 0) {
            st = type_from_proto(L, vi->type, &v->type, false);
            if (st) goto done;
        }
        g->outputs[g->n_outputs++] = v;
    }
    st = topo_sort(L, g);
    if (!st) st = kiln_graph_plan_releases(g, L->err);
done:
    flat_release(&fl);
    return st;
}

static kiln_status load_graph(loader *L, const Onnx__GraphProto *gp, scope *parent, kiln_graph **out)
{
    int depth = parent ? parent->depth + 1 : 0;
    if (depth > MAX_GRAPH_DEPTH)
        return kiln_errf(L->err, KILN_ERR_MODEL, "subgraphs nest deeper than %d", MAX_GRAPH_DEPTH);
    kiln_graph *g = kiln_arena_alloc(&L->m->arena, sizeof *g);
    if (!g) return oom(L);
    g->name = kiln_arena_strdup(&L->m->arena, nz(gp->name));
    g->parent = parent ? parent->g : NULL;
    g->model = L->m;
    scope sc = {.g = g, .parent = parent, .depth = depth};
    kiln_status st = g->name ? build_graph(L, gp, &sc) : oom(L);
    kiln_strmap_release(&sc.names);
    if (!st) *out = g;
    return st;
}

static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return true;
    }
    return false;
}

/* protobuf-c unpacks nested messages recursively and without a depth limit, so a file of a few
 * kilobytes nesting messages thousands deep would overflow the stack. This walks the wire
 * format first with the generated descriptors (O(bytes)) and says false when messages nest
 * deeper than MAX_WIRE_DEPTH; malformed bytes are left for the parser to reject. */
static bool wire_depth_ok(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, int depth)
{
    if (depth > MAX_WIRE_DEPTH) return false;
    const uint8_t *end = p + len;
    while (p < end) {
        uint64_t key, n;
        if (!wire_varint(&p, end, &key)) return true;
        switch (key & 7) {
        case 0:
            if (!wire_varint(&p, end, &n)) return true;
            break;
        case 1:
            if (end - p < 8) return true;
            p += 8;
            break;
        case 5:
            if (end - p < 4) return true;
            p += 4;
            break;
        case 2: {
            if (!wire_varint(&p, end, &n) || n > (uint64_t)(end - p)) return true;
            uint64_t field = key >> 3;
            const ProtobufCFieldDescriptor *f =
                field <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)field) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
                !wire_depth_ok(f->descriptor, p, (size_t)n, depth + 1))
                return false;
            p += n;
            break;
        }
        default: return true;
        }
    }
    return true;
}

/* Points the cut initializers of the parsed slim model at their bytes in the mapped file;
 * false when the parse does not line up with the cuts. */
static bool attach_cuts(Onnx__ModelProto *mp, const unsigned char *file, const kiln_raw_cut *cuts, size_t n)
{
    Onnx__GraphProto *gp = mp->graph;
    for (size_t i = 0; i < n; i++)
        if (!gp || cuts[i].initializer >= gp->n_initializer || gp->initializer[cuts[i].initializer]->has_raw_data)
            return false;
    for (size_t i = 0; i < n; i++) {
        Onnx__TensorProto *tp = gp->initializer[cuts[i].initializer];
        tp->raw_data.data = (uint8_t *)(uintptr_t)(file + cuts[i].offset);
        tp->raw_data.len = cuts[i].len;
        tp->has_raw_data = 1;
    }
    return true;
}

/* kiln_onnx_load; with `file` (a model file mapped read-only, len file_len) and cuts, buf is
 * its slim copy (slim.c) and the model takes over the mapping and cuts on success. */
static kiln_status load_model(const void *buf, size_t len, const char *base_dir, unsigned char *file,
                              size_t file_len, kiln_raw_cut *cuts, size_t n_cuts, kiln_model **out, kiln_err *err)
{
    *out = NULL;
    if (!buf && len) return kiln_errf(err, KILN_ERR_INVALID_ARG, "model buffer is NULL");
    kiln_model *m = calloc(1, sizeof *m);
    load_source *src = calloc(1, sizeof *src);
    if (!m || !src || !(m->dims = kiln_dimtab_create())) {
        free(src);
        if (m) kiln_model_free(m);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    m->source = src;
    m->release_source = release_source;
    m->release_bytes = release_bytes;
    kiln_status st;
    if (!wire_depth_ok(&onnx__model_proto__descriptor, buf, len, 0)) {
        st = kiln_errf(err, KILN_ERR_MODEL, "messages nested more than %d deep", MAX_WIRE_DEPTH);
        goto fail;
    }
    src->proto = onnx__model_proto__unpack(NULL, len, buf);
    if (!src->proto) {
        st = kiln_errf(err, KILN_ERR_MODEL, "not a valid ONNX model (protobuf parse failed on %zu bytes)", len);
        goto fail;
    }
    if (file && !attach_cuts(src->proto, file, cuts, n_cuts)) {
        st = KILN_ERR_RUNTIME; /* not an error of the model: the caller parses the whole file */
        goto fail;
    }
    /* the mapping is listed (copies out of it drop its pages), owned by the model on success */
    if (file && !kiln_mapping_adopt(&src->maps, file, file_len)) {
        st = kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const Onnx__ModelProto *mp = src->proto;
    m->ir_version = mp->ir_version;
    m->producer = kiln_arena_strdup(&m->arena, nz(mp->producer_name));
    m->producer_version = kiln_arena_strdup(&m->arena, nz(mp->producer_version));
    m->domain = kiln_arena_strdup(&m->arena, nz(mp->domain));
    m->doc_string = kiln_arena_strdup(&m->arena, nz(mp->doc_string));
    m->graph_doc_string = kiln_arena_strdup(&m->arena, mp->graph ? nz(mp->graph->doc_string) : "");
    m->model_version = mp->has_model_version ? mp->model_version : 0;
    m->prop_keys = kiln_arena_calloc(&m->arena, mp->n_metadata_props + 1, sizeof *m->prop_keys);
    m->prop_values = kiln_arena_calloc(&m->arena, mp->n_metadata_props + 1, sizeof *m->prop_values);
    m->opsets = kiln_arena_calloc(&m->arena, mp->n_opset_import + 1, sizeof *m->opsets);
    if (!m->producer || !m->producer_version || !m->domain || !m->doc_string || !m->graph_doc_string ||
        !m->prop_keys || !m->prop_values || !m->opsets) {
        st = kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < mp->n_metadata_props; i++) {
        const Onnx__StringStringEntryProto *e = mp->metadata_props[i];
        m->prop_keys[i] = kiln_arena_strdup(&m->arena, nz(e->key));
        m->prop_values[i] = kiln_arena_strdup(&m->arena, nz(e->value));
        if (!m->prop_keys[i] || !m->prop_values[i]) {
            st = kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
            goto fail;
        }
        m->n_props++;
    }
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        m->opsets[i].domain = kiln_arena_strdup(&m->arena, nz(mp->opset_import[i]->domain));
        m->opsets[i].version = mp->opset_import[i]->version;
        m->n_opsets++;
    }
    if (!mp->n_opset_import) { /* ONNX Runtime refuses it too: the ONNX version is unknown */
        st = kiln_errf(err, KILN_ERR_MODEL, "model imports no operator set (opset_import is empty)");
        goto fail;
    }
    if (!mp->graph) {
        st = kiln_errf(err, KILN_ERR_MODEL, "model has no graph");
        goto fail;
    }
    loader L = {.m = m, .err = err, .mp = mp, .src = {.base_dir = base_dir, .maps = &src->maps, .borrow_raw = true}};
    st = load_graph(&L, mp->graph, NULL, &m->graph);
    if (st) goto fail;
    if (file) { /* the model keeps the file mapped: its tensors read it */
        src->cuts = cuts;
        src->n_cuts = n_cuts;
    }
    *out = m;
    return KILN_OK;
fail:
    if (file) kiln_mapping_forget(src->maps, file); /* the caller unmaps it */
    if (file && src->proto && src->proto->graph) /* free_unpacked must not free the file's bytes */
        for (size_t i = 0; i < n_cuts; i++)
            if (cuts[i].initializer < src->proto->graph->n_initializer) {
                Onnx__TensorProto *tp = src->proto->graph->initializer[cuts[i].initializer];
                if (tp->raw_data.data >= file && tp->raw_data.data < file + file_len) tp->raw_data.data = NULL;
            }
    kiln_model_free(m);
    return st;
}

kiln_status kiln_onnx_load(const void *buf, size_t len, const char *base_dir, kiln_model **out, kiln_err *err)
{
    return load_model(buf, len, base_dir, NULL, 0, NULL, 0, out, err);
}

kiln_status kiln_onnx_load_file(const char *path, kiln_model **out, kiln_err *err)
{
    *out = NULL;
    if (!path) return kiln_errf(err, KILN_ERR_INVALID_ARG, "model path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_errf(err, KILN_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return kiln_errf(err, KILN_ERR_IO, "'%s' is not a regular file", path);
    }
    size_t len = (size_t)sb.st_size;
    void *p = NULL;
    if (len) {
        p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return kiln_errf(err, KILN_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
        }
    }
    close(fd);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        if (slash == dir) slash[1] = '\0';
        else *slash = '\0';
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    /* weights of at least a page stay in the mapped file: parsing copies the rest only */
    unsigned char *slim;
    size_t slim_len, n_cuts;
    kiln_raw_cut *cuts;
    kiln_status st = KILN_ERR_RUNTIME;
    if (p && kiln_onnx_slim(p, len, 4096, &slim, &slim_len, &cuts, &n_cuts)) {
        kiln_err quiet = {0};
        st = load_model(slim, slim_len, dir, p, len, cuts, n_cuts, out, &quiet);
        free(slim);
        if (st) free(cuts);
        if (st == KILN_OK) return KILN_OK; /* the model owns the mapping now */
        if (st != KILN_ERR_RUNTIME && err) *err = quiet;
    }
    if (st == KILN_ERR_RUNTIME) st = kiln_onnx_load(p, len, dir, out, err);
    if (p) munmap(p, len);
    if (st) kiln_err_prefix(err, "%s", path);
    return st;
}
