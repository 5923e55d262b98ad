/* op.h - the operator interface: one registry entry per (domain, op type, since-version) with
 * its shape/type inference and its reference CPU kernel. Every file under src/ops/ exports a
 * table of kiln_op_def and is listed once in src/ops/registry.c.
 *
 * Inference runs twice with the same function:
 *  - at compile time over symbolic dims (kiln_infer_dims(c) != NULL). Input contents are known
 *    only for constants (initializers, Constant nodes) and for shape vectors (the symbolic
 *    output of Shape and what is computed from it). When something needed is not known,
 *    inference must not fail: it gives outputs fresh dims (kiln_infer_fresh) or an unknown
 *    rank (kiln_infer_set_out_unknown).
 *  - at run time, just before the kernel, with constant dims and every input's content known
 *    (kiln_infer_dims(c) == NULL). Here it must produce the exact output types; an output whose
 *    dims come out unknown (data-dependent sizes) is allocated by the kernel instead.
 * Inference also validates: a violated constraint (mismatched dims, bad attribute) returns
 * kiln_infer_fail(c, KILN_ERR_SHAPE or KILN_ERR_MODEL, ...), naming the inputs and dims.
 *
 * Kernels read inputs with kiln_run_in and write the outputs that the executor allocated from
 * the run-time inference (kiln_run_out); other outputs (unknown dims, sequences, optionals)
 * they create with kiln_run_alloc_out or hand over with kiln_run_set_out. */
#ifndef KILN_OPS_OP_H
#define KILN_OPS_OP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/value.h"
#include "ir/dim.h"
#include "ir/graph.h"
#include "kiln.h"

typedef struct kiln_infer_ctx kiln_infer_ctx;
typedef struct kiln_run_ctx kiln_run_ctx;
typedef struct kiln_threadpool kiln_threadpool;

/* A kernel: computes a node's outputs from its inputs (see the run context below). */
typedef kiln_status (*kiln_kernel_fn)(kiln_run_ctx *c);

/* Output 0 may share input 0's buffer: the kernel writes every element of output 0, and
 * element i of it depends on element i of input 0 only, which it reads before writing. The
 * planner uses it when input 0 has the same byte size and this node is its last reader. */
#define KILN_OP_INPLACE 1u
/* Input 0 may be absent (the op has no inputs, or its first input is optional). Without this
 * flag, binding rejects a node whose input 0 is absent, so kernels may rely on it. */
#define KILN_OP_X_OPTIONAL 2u
/* The kernel reads only its inputs' types (dtype and dims), never their elements (Shape,
 * Size): a device value it reads needs no host copy, and partitioning keeps it on the host. */
#define KILN_OP_READS_TYPE_ONLY 4u
/* A kiln fused operator (src/ops/fused.h): its parsed attributes (kiln_node.params) are a
 * kiln_fused. */
#define KILN_OP_FUSED 8u
/* The outputs are not a function of the inputs (random generators, Dropout, which is random in
 * training mode): passes never replace the node by a constant. */
#define KILN_OP_RANDOM 16u
/* Moves its input between host and device memory (kiln.MemcpyToDevice, kiln.MemcpyToHost:
 * copy nodes the partitioner inserts, src/exec/partition.c): the executor runs it through the
 * device provider's copies; its reference kernel is a plain copy. */
#define KILN_OP_COPY 32u

/* Bit i of kiln_op_def.host_inputs: input i. */
#define KILN_OP_IN(i) (1u << (i))

struct kiln_op_def {
    const char *domain;  /* "" for the default ONNX domain, "ai.onnx.ml", ... */
    const char *op_type;
    int since_version;   /* entry applies to opsets >= this, up to the next entry's version */
    kiln_status (*infer)(kiln_infer_ctx *c);
    kiln_status (*run)(kiln_run_ctx *c);
    unsigned flags;      /* KILN_OP_* */
    /* Inputs whose contents are read on the host whatever provider runs the node (KILN_OP_IN
     * bits, over every input the op has at any opset of this entry): the shape-like arguments
     * that run-time inference reads (Reshape's shape, Slice's starts/ends/axes/steps, Resize's
     * scales and sizes, input axes of reductions) and the scalar arguments a kernel takes by
     * value (Clip's min and max, OneHot's depth and values, Range's start, limit and delta).
     * A device provider hands them to its kernels in host memory (kiln_provider_i.select). */
    unsigned host_inputs;
    /* Optional: parses a node's attributes into the op's typed struct of params_size bytes,
     * once at compile time (kiln_node_bind: n->params); the kernels read that struct instead
     * of looking attributes up by name on every call. Fails (kiln_errf, KILN_ERR_MODEL) on a
     * bad attribute. */
    kiln_status (*parse)(const kiln_node *n, void *params, kiln_err *err);
    size_t params_size;
};

/* A family's table; `n` entries. */
typedef struct kiln_op_table {
    const kiln_op_def *defs;
    int n;
} kiln_op_table;

/* Looks up the entry for domain/op_type at the given opset version; NULL if none. */
const kiln_op_def *kiln_op_lookup(const char *domain, const char *op_type, int64_t opset);
/* The newest since_version among the entries of domain ("" or "ai.onnx": ONNX); 0 when kiln has
 * no operator in that domain. The version a node of a domain its model does not import runs at. */
int kiln_op_domain_latest(const char *domain);

/* ---- inference context ---- */
const kiln_node *kiln_infer_node(const kiln_infer_ctx *c);
int kiln_infer_opset(const kiln_infer_ctx *c);
/* The symbolic dim table at compile time; NULL at run time. Pass it to kiln_dim_* arithmetic. */
kiln_dimtab *kiln_infer_dims(const kiln_infer_ctx *c);
int kiln_infer_n_in(const kiln_infer_ctx *c);
int kiln_infer_n_out(const kiln_infer_ctx *c);
/* Type of input i; NULL when the input is absent (optional, empty name) or i >= n_in. */
const kiln_type *kiln_infer_in(const kiln_infer_ctx *c, int i);
/* Content of input i when known (always at run time for present inputs), else NULL. */
const kiln_value *kiln_infer_in_value(const kiln_infer_ctx *c, int i);
/* Content of a 0-D or 1-D integer input as dims (from its value, or symbolic from a shape
 * computation); returns false when unknown. *n receives the element count (<= max). */
bool kiln_infer_in_dims_value(const kiln_infer_ctx *c, int i, kiln_dim *dims, int max, int *n);
/* The type set for output i so far (by kiln_infer_set_out...), or NULL when i is absent. */
const kiln_type *kiln_infer_out(const kiln_infer_ctx *c, int i);
/* Whether output i is wanted (present in the node). */
bool kiln_infer_has_out(const kiln_infer_ctx *c, int i);
/* Sets output i to a tensor type. No-op for absent outputs. */
kiln_status kiln_infer_set_out(kiln_infer_ctx *c, int i, kiln_dtype dt, int rank,
                               const kiln_dim *dims);
/* Sets output i to any type (sequences, optionals). */
kiln_status kiln_infer_set_out_type(kiln_infer_ctx *c, int i, const kiln_type *t);
/* Output i is a tensor of dtype dt (may be UNDEFINED) and unknown rank: decided at run time. */
kiln_status kiln_infer_set_out_unknown(kiln_infer_ctx *c, int i, kiln_dtype dt);
/* Records the symbolic content of output i, a 1-D integer vector of n elements (for Shape and
 * shape arithmetic); ignored at run time. */
kiln_status kiln_infer_set_out_dims_value(kiln_infer_ctx *c, int i, const kiln_dim *dims, int n);
/* Records that output i has constant content v (borrowed: v must outlive the model, e.g. an
 * attribute tensor); ignored at run time. */
kiln_status kiln_infer_set_out_const(kiln_infer_ctx *c, int i, const kiln_value *v);
/* A fresh symbol for a data-dependent size (compile time) or the unknown placeholder. */
kiln_dim kiln_infer_fresh(kiln_infer_ctx *c, const char *hint);
/* Fails with a message prefixed by the node's name and op type. */
kiln_status kiln_infer_fail(kiln_infer_ctx *c, kiln_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Requires a == b; fails with KILN_ERR_SHAPE naming `what` when they provably differ. */
kiln_status kiln_infer_require_equal(kiln_infer_ctx *c, kiln_dim a, kiln_dim b, const char *what);
/* Numpy-style multidirectional broadcast of the present inputs' shapes into (rank, dims).
 * Fails with KILN_ERR_SHAPE on incompatible dims. Any input of unknown rank gives rank -1. */
kiln_status kiln_infer_broadcast(kiln_infer_ctx *c, int n, const kiln_type *const *ins,
                                 int *rank, kiln_dim *dims);
/* Output i gets the type of input j. */
kiln_status kiln_infer_same_as_input(kiln_infer_ctx *c, int out, int in);

/* ---- run context ---- */
const kiln_node *kiln_run_node(const kiln_run_ctx *c);
int kiln_run_opset(const kiln_run_ctx *c);
int kiln_run_n_in(const kiln_run_ctx *c);
int kiln_run_n_out(const kiln_run_ctx *c);
/* Input i, or NULL when absent. Borrowed, read-only. */
const kiln_value *kiln_run_in(const kiln_run_ctx *c, int i);
/* Runs fn on this node as c would, but with input i read as v (borrowed): how a kernel hands a
 * temporary copy of an input to another kernel. Allocates (O(n_in)); for rare paths only. */
kiln_status kiln_run_with_in(kiln_run_ctx *c, int i, const kiln_value *v, kiln_status (*fn)(kiln_run_ctx *c));
/* Output tensor i as allocated from run-time inference (data zeroed), or NULL when the node
 * does not produce output i or its shape was left to the kernel. */
kiln_value *kiln_run_out(kiln_run_ctx *c, int i);
bool kiln_run_has_out(const kiln_run_ctx *c, int i);
/* Allocates output i as a tensor (replacing any pre-allocated one); *out may be NULL. */
kiln_status kiln_run_alloc_out(kiln_run_ctx *c, int i, kiln_dtype dt, int rank,
                               const int64_t *dims, kiln_value **out);
/* Hands value v over as output i (ownership taken, also on failure). */
kiln_status kiln_run_set_out(kiln_run_ctx *c, int i, kiln_value *v);
/* Error slot for helpers that take a kiln_err (kiln_tensor_new, ...). */
kiln_err *kiln_run_err(kiln_run_ctx *c);
/* The session's thread pool for intra-op parallel loops, or NULL (run on this thread). */
kiln_threadpool *kiln_run_threadpool(const kiln_run_ctx *c);
/* The session's reused temporary blocks (core/scratch.h; NULL is valid there). */
struct kiln_scratch *kiln_run_scratch(const kiln_run_ctx *c);
/* Fails with a message prefixed by the node's name and op type. */
kiln_status kiln_run_fail(kiln_run_ctx *c, kiln_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Runs subgraph g (an attribute graph of this node) with the given inputs (borrowed); on
 * success out[0..g->n_outputs) receive new values owned by the caller. Outer-scope values
 * the subgraph reads come from the current run. */
kiln_status kiln_run_subgraph(kiln_run_ctx *c, const kiln_graph *g, int n_in,
                              const kiln_value *const *in, kiln_value **out);

#endif
