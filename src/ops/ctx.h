/* ctx.h - the inference and run contexts behind src/ops/op.h's accessors (src/ops/ctx.c,
 * src/ops/infer.c). The executor (src/exec/run.c) fills them for every node it runs; compile
 * time fills them for inference over the IR and for folding constants (src/ops/evaluate.c).
 * Kernels never read these fields: they use the accessors. */
#ifndef KILN_OPS_CTX_H
#define KILN_OPS_CTX_H

#include <stddef.h>

#include "ops/op.h"

struct kiln_frame;        /* the executor's values of one graph execution (src/exec/ctx.h) */
struct kiln_provider_run; /* a device provider's run context (src/exec/provider.h) */

struct kiln_infer_ctx {
    const kiln_node *node;
    kiln_dimtab *tab;             /* NULL at run time */
    const kiln_type *const *in;   /* n_in entries, NULL for absent */
    const kiln_value *const *in_val;
    kiln_type *out;               /* n_out entries */
    kiln_ir_value *const *out_ir; /* compile time: the node's outputs; NULL at run time */
    kiln_err *err;
};

/* Runs subgraph g of c's node with inputs in (borrowed) into out[0..g->n_outputs) (owned by
 * the caller): how the executor gives control-flow kernels their bodies (kiln_run_subgraph). */
typedef kiln_status (*kiln_subgraph_fn)(struct kiln_run_ctx *c, const kiln_graph *g, const kiln_value *const *in,
                                        kiln_value **out);

struct kiln_run_ctx {
    const kiln_node *node;
    const struct kiln_frame *frame; /* opaque here: the executor's, NULL at compile time */
    kiln_threadpool *pool;
    struct kiln_scratch *scratch;
    const kiln_value *const *in;
    kiln_value **out;               /* n_out entries, owned */
    kiln_err *err;
    struct kiln_provider_run *dev;  /* the run's device context when the node runs on the device */
    kiln_subgraph_fn subgraph;      /* NULL: the node's subgraphs cannot run here */
    size_t alloc_limit;             /* bytes one output kiln_run_alloc_out makes may take (0: no limit) */
};

/* Runtime type of a value (constant dims). */
void kiln_type_of_value(const kiln_value *v, kiln_type *t);

#endif
