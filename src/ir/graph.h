/* graph.h - kiln's IR: a model owns graphs of nodes over typed values with symbolic dims,
 * attributes, and constant contents. Built once by the loader (src/onnx), read by inference,
 * passes and the executor. Everything here lives in the model's arena. */
#ifndef KILN_IR_GRAPH_H
#define KILN_IR_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/error.h"
#include "core/value.h"
#include "ir/dim.h"
#include "kiln.h"

typedef struct kiln_graph kiln_graph;
typedef struct kiln_node kiln_node;
typedef struct kiln_op_def kiln_op_def;
struct kiln_run_ctx;

/* Attribute types; values equal ONNX's AttributeProto.AttributeType. */
typedef enum kiln_attr_type {
    KILN_ATTR_UNDEFINED = 0,
    KILN_ATTR_FLOAT = 1,
    KILN_ATTR_INT = 2,
    KILN_ATTR_STRING = 3,
    KILN_ATTR_TENSOR = 4,
    KILN_ATTR_GRAPH = 5,
    KILN_ATTR_FLOATS = 6,
    KILN_ATTR_INTS = 7,
    KILN_ATTR_STRINGS = 8,
    KILN_ATTR_TENSORS = 9,
    KILN_ATTR_GRAPHS = 10,
    KILN_ATTR_SPARSE_TENSOR = 11,
    KILN_ATTR_SPARSE_TENSORS = 12,
    KILN_ATTR_TYPE_PROTO = 13,
    KILN_ATTR_TYPE_PROTOS = 14,
} kiln_attr_type;

typedef struct kiln_attr {
    const char *name;
    kiln_attr_type type;
    float f;
    int64_t i;
    const char *s;      /* STRING: NUL-terminated copy */
    size_t s_len;       /* bytes of s (strings may hold NUL bytes) */
    int n;              /* element count of list types */
    const float *floats;
    const int64_t *ints;
    const char *const *strings;
    const size_t *string_lens;
    kiln_value *t;            /* TENSOR (owned by the model) */
    kiln_value *const *tensors;
    kiln_graph *g;            /* GRAPH */
    kiln_graph *const *graphs;
    kiln_dtype tp_dtype;      /* TYPE_PROTO: element type of the tensor type */
} kiln_attr;

/* Static type of a value. kind 0 means unknown (to be decided at run time). For sequences and
 * optionals, dtype/rank/dims describe the element tensor. */
typedef struct kiln_type {
    kiln_value_kind kind;
    kiln_value_kind elem_kind; /* OPTIONAL: kind of the held value */
    kiln_dtype dtype;          /* UNDEFINED when unknown */
    int rank;                  /* -1 when unknown */
    kiln_dim dims[KILN_MAX_RANK];
} kiln_type;

/* How a value's bytes are laid out in memory. Only optimised CPU sessions block values, and only
 * float32 [N, C, H, W] ones with C a multiple of 16 that no caller sees (src/passes/layout_nchwc.c);
 * every node reading or writing a blocked value runs a kernel that knows it (src/cpu/nchwc.h). */
typedef enum kiln_layout {
    KILN_LAYOUT_PLAIN = 0, /* row-major over the dims */
    KILN_LAYOUT_NCHW16C,   /* [N][C / 16][H][W][16]: 16 channels of a pixel together */
} kiln_layout;

typedef struct kiln_ir_value {
    const char *name;
    int id;                    /* index in graph->values */
    kiln_graph *graph;         /* owning graph */
    kiln_type type;
    const kiln_value *init;    /* constant content (initializer, Constant), or NULL */
    const kiln_dim *shape_value; /* symbolic content of a 1-D integer vector, or NULL */
    int shape_value_n;
    kiln_node *producer;       /* NULL for graph inputs, initializers and outer-scope values */
    bool is_input, is_output;
    int last_use;              /* index of the last node of `graph` reading it (-1: none) */
    kiln_layout layout;
    /* consumer lists, built by kiln_graph_index_uses and kept by the rewiring helpers below:
     * the inputs of nodes of `graph` reading it, and how many subgraphs of those nodes capture it */
    struct kiln_use *uses;
    int n_uses, cap_uses;
    int n_captured;
} kiln_ir_value;

/* One reader of a value: node->in[slot]. */
typedef struct kiln_use {
    kiln_node *node;
    int slot;
} kiln_use;

/* Whether v is a float32 tensor by its compile-time type (passes and kernel selection). */
static inline bool kiln_ir_is_f32(const kiln_ir_value *v)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.dtype == KILN_DTYPE_FLOAT32;
}

/* v's content when it is a constant: its initializer, unless v is also a graph input, whose
 * initializer is only a default that a run may replace by feeding it (ONNX IR 4 and later).
 * Passes, compile-time inference and weight preparation read constants through this. */
static inline const kiln_value *kiln_ir_constant(const kiln_ir_value *v)
{
    return v && !v->is_input ? v->init : NULL;
}

struct kiln_node {
    const char *name;
    const char *op_type;
    const char *domain;        /* "" for the default ONNX domain */
    int opset;                 /* the model's opset version for `domain` */
    const kiln_op_def *op;     /* NULL when kiln has no implementation */
    const void *params;        /* op's typed attributes (kiln_op_def.parse), or NULL */
    /* the kernel a provider selected, or NULL: op->run, the reference kernel; and the data it
     * prepared at compile time (packed weights), released with kernel_state_free */
    kiln_status (*kernel)(struct kiln_run_ctx *c);
    void *kernel_state;
    void (*kernel_state_free)(void *state);
    /* when the provider released the original bytes of the constant input `released_in` after
     * packing it into kernel_state (kiln_node_release_constant: its init->data is then NULL),
     * how to rebuild them for a call that reads that layout: writes init->nbytes bytes into dst.
     * NULL when no input was released. */
    void (*kernel_state_unpack)(const void *state, void *dst);
    int released_in;
    /* placement (src/exec/partition.c, sessions with a device provider): on the device
     * provider, the inputs its kernel reads on the host (bit i: input i), and why a node stays
     * on the host (NULL when on the device or not decided); host_fallback: on the host though
     * it computes tensor data (not shape arithmetic, not a read of types and shapes only), which
     * kiln info and the statistics report as a warning */
    bool on_device;
    unsigned host_inputs;
    const char *placement_note;
    bool host_fallback;
    int index;                 /* position in graph->nodes */
    int n_in, n_out;
    kiln_ir_value **in;        /* in[i] NULL for an absent optional input */
    kiln_ir_value **out;       /* out[i] NULL for an absent optional output */
    int n_attrs;
    kiln_attr *attrs;
    kiln_graph *graph;
    /* values of `graph` whose last reader is this node: freed after it runs */
    int n_release;
    kiln_ir_value **release;
};

struct kiln_graph {
    const char *name;
    kiln_graph *parent;        /* enclosing graph for subgraphs of If/Loop/Scan */
    struct kiln_model *model;
    int n_values, cap_values;
    kiln_ir_value **values;
    int n_nodes;
    kiln_node **nodes;         /* topological order */
    int n_inputs, n_outputs;
    kiln_ir_value **inputs, **outputs;
    /* values of enclosing graphs read anywhere inside this graph (its nested graphs too) */
    int n_captures;
    kiln_ir_value **captures;
    /* subgraphs of an optimised session: what src/exec/subgraph.c compiled for runs of this
     * graph (owned by the session), or NULL */
    struct kiln_subprog *prog;
};

/* A shape constraint inference could not decide at compile time; checked when input shapes
 * bind the symbols, before anything runs. */
typedef struct kiln_constraint {
    const kiln_node *node;
    kiln_dim a, b;
    bool broadcast; /* a and b must broadcast (equal, or one is 1); else a == b */
    const char *what;
} kiln_constraint;

typedef struct kiln_opset_import {
    const char *domain;
    int64_t version;
} kiln_opset_import;

typedef struct kiln_model {
    kiln_arena arena;
    kiln_dimtab *dims;
    kiln_graph *graph;
    int64_t ir_version;
    int n_opsets;
    kiln_opset_import *opsets;
    const char *producer;
    /* ModelProto / main GraphProto metadata, "" when absent (kiln_session_model_meta) */
    const char *producer_version, *domain, *doc_string, *graph_doc_string;
    int64_t model_version;
    int n_props;
    const char **prop_keys, **prop_values; /* [n_props] metadata_props */
    kiln_constraint *constraints;
    int n_constraints, cap_constraints;
    /* values owned by the model (initializers, attribute tensors) */
    kiln_value **owned;
    int n_owned, cap_owned;
    /* what the loader keeps alive while tensors borrow its bytes (the parsed file, mapped
     * external-data files); released with release_source */
    void *source;
    void (*release_source)(void *source);
    /* gives back the bytes the loader lends a constant (data, nbytes): true when they are freed
     * (the caller clears the value's data), false when they stay readable (mapped file pages,
     * dropped from memory and read again on a later touch) or are not the loader's. May be NULL. */
    bool (*release_bytes)(void *source, const void *data, size_t nbytes);
    /* set by the session (optimised CPU sessions): kernels may release the original bytes of the
     * constants they packed (kiln_node_release_constant) */
    bool release_packed;
} kiln_model;

/* ---- attributes ---- */
const kiln_attr *kiln_node_attr(const kiln_node *n, const char *name);
/* The attribute if present with that type, else NULL: list fields of an attribute are only
 * valid for its own type (a model may give any name any type). */
const kiln_attr *kiln_node_attr_typed(const kiln_node *n, const char *name, kiln_attr_type type);
int64_t kiln_attr_int(const kiln_node *n, const char *name, int64_t def);
float kiln_attr_float(const kiln_node *n, const char *name, float def);
/* NUL-terminated string, or def */
const char *kiln_attr_string(const kiln_node *n, const char *name, const char *def);
/* list attributes: pointer to the elements and count in *count (0 and NULL when absent) */
const int64_t *kiln_attr_ints(const kiln_node *n, const char *name, int *count);
const float *kiln_attr_floats(const kiln_node *n, const char *name, int *count);
const kiln_value *kiln_attr_tensor(const kiln_node *n, const char *name);
const kiln_graph *kiln_attr_graph(const kiln_node *n, const char *name);

/* Subgraphs an attribute holds (GRAPH: 1, GRAPHS: n, others: 0), and the i-th of them. */
int kiln_attr_graph_count(const kiln_attr *a);
/* Whether n has a graph attribute (If, Loop, Scan...). */
bool kiln_node_has_subgraphs(const kiln_node *n);
const kiln_graph *kiln_attr_graph_at(const kiln_attr *a, int i);

/* ---- construction (used by the loader and passes) ---- */
/* (Re)computes each value's last reader and each node's release list from the node order;
 * graph outputs are never released early. Run after any change to g's nodes or edges. */
kiln_status kiln_graph_plan_releases(kiln_graph *g, kiln_err *err);
kiln_status kiln_model_own_value(kiln_model *m, kiln_value *v, kiln_err *err);
/* Peak-memory rule for packed weights: once a provider has packed the constant n->in[input]
 * into n->kernel_state, the original bytes are dead weight unless something else reads them.
 * When the model allows it (release_packed) and n is the only reader (input `input` only; no
 * other node of its graph, no subgraph, not a graph input or output), gives the bytes back:
 * owned data is freed, loader bytes go back through release_bytes (parsed protobuf blocks are
 * freed, mapped external data has its pages dropped and stays readable). Returns true when the
 * data is gone (init->data NULL): the caller must then set n->kernel_state_unpack (and
 * released_in = input) so a fallback to the reference kernel can rebuild it. Called once per
 * packed weight, right after packing it, so creation's high-water mark holds one weight twice
 * at most. O(nodes of n's graph). */
bool kiln_node_release_constant(kiln_node *n, int input);
/* A constant that a rewrite left unread (no node, subgraph or output of its graph reads it, no
 * other value shares its tensor, not a graph input) gives its bytes back as
 * kiln_node_release_constant does; returns true when its data is gone (init->data NULL). */
bool kiln_ir_value_release_unread(kiln_ir_value *v);
kiln_ir_value *kiln_graph_new_value(kiln_graph *g, const char *name, kiln_err *err);

/* ---- consumer lists and rewiring (graph passes) ---- */
/* (Re)builds every value's consumer list (uses, n_captured) of g from its nodes. The pass
 * runner calls it before each pass (O(nodes + values)); passes then rewire through the helpers
 * below, which keep the lists. */
kiln_status kiln_graph_index_uses(kiln_graph *g, kiln_err *err);
/* Everything reading v: node inputs, subgraph captures, and being a graph output. O(1). */
static inline int kiln_ir_value_readers(const kiln_ir_value *v)
{
    return v->n_uses + v->n_captured + (v->is_output ? 1 : 0);
}
/* The node reading v when that is v's only reader (one input slot, no capture, not an
 * output), else NULL. */
kiln_node *kiln_ir_value_only_reader(const kiln_ir_value *v);
/* n->in[i] = v (NULL: absent), moving the use. */
kiln_status kiln_node_set_input(kiln_node *n, int i, kiln_ir_value *v, kiln_err *err);
/* Gives n the inputs in[0..n_in) (a new array in the model's arena), moving the uses. */
kiln_status kiln_node_set_inputs(kiln_node *n, int n_in, kiln_ir_value *const *in, kiln_err *err);
/* n->out[i] = v: v's producer becomes n; the value n produced there has none. */
void kiln_node_set_output(kiln_node *n, int i, kiln_ir_value *v);
/* Takes n out of the value graph before a pass drops it from g->nodes: its inputs lose these
 * readers, its outputs their producer. */
void kiln_node_unlink(kiln_node *n);
/* Sets n's attribute a->name to a copy of *a (its arrays and strings are borrowed: they must
 * outlive the model), replacing one of that name or appending (a new array in the arena). */
kiln_status kiln_node_set_attr(kiln_node *n, const kiln_attr *a, kiln_err *err);
/* Drops the NULL entries a pass left in g->nodes and renumbers kiln_node.index. */
void kiln_graph_compact(kiln_graph *g);
/* Whether every consumer list of g matches a recount from its nodes, and every producer
 * produces its value (tests, after a pass). */
bool kiln_graph_uses_consistent(const kiln_graph *g);
/* Makes v a constant holding t (owned by the model), its type t's: graph passes that compute a
 * value when the session is compiled. v loses its producer. */
void kiln_ir_value_set_constant(kiln_ir_value *v, const kiln_value *t);
/* Records a constraint (deduplicated; `what` must outlive the model: a literal or arena). */
kiln_status kiln_model_add_constraint(kiln_model *m, const kiln_constraint *c, kiln_err *err);
/* Sets a type to unknown. */
void kiln_type_unknown(kiln_type *t);
void kiln_model_free(kiln_model *m);
/* Opset version the model imports for domain ("" and "ai.onnx" are the same), or -1. */
int64_t kiln_model_opset(const kiln_model *m, const char *domain);

/* "float32[batch, 3, 2*h]" into buf; returns buf. */
char *kiln_type_print(const kiln_type *t, char *buf, size_t size);

#endif
