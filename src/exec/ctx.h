/* ctx.h - the inference and run contexts behind src/ops/op.h, shared by compile and run. */
#ifndef KILN_EXEC_CTX_H
#define KILN_EXEC_CTX_H

#include "exec/exec.h"
#include "exec/provider.h"
#include "ops/op.h"

struct kiln_infer_ctx {
    const kiln_node *node;
    kiln_dimtab *tab;             /* NULL at run time */
    const kiln_type *const *in;   /* n_in entries, NULL for absent */
    const kiln_value *const *in_val;
    kiln_type *out;               /* n_out entries */
    kiln_ir_value *const *out_ir; /* compile time: the node's outputs; NULL at run time */
    kiln_err *err;
};

struct kiln_run_ctx {
    const kiln_node *node;
    const kiln_frame *frame;
    kiln_threadpool *pool;
    struct kiln_scratch *scratch;
    const kiln_value *const *in;
    kiln_value **out;             /* n_out entries, owned */
    kiln_err *err;
    kiln_provider_run *dev;       /* the run's device context when the node runs on the device */
};

/* Values of one graph execution; parent holds the enclosing graph's. */
struct kiln_frame {
    const kiln_graph *g;
    const kiln_frame *parent;
    kiln_value **vals;            /* by value id */
    bool *owned;                  /* vals[i] is freed by the frame */
    kiln_value **alt;             /* device runs: vals[i] copied to the other side (owned), or NULL */
    const kiln_run_env *env;      /* the main graph's run environment, NULL in subgraphs */
    size_t alloc_limit;           /* kiln_node_evaluate: bytes one output may take (0: no limit) */
    /* this call's binding: the arena slots of the graph's values (NULL: all on the heap), the
     * plan whose shapes the nodes take instead of inference (NULL: inference at run time), and
     * the symbols' values (syms[0..n_syms), NULL when unbound) */
    kiln_arena_view *mem;
    const struct kiln_plan *plan;
    const int64_t *syms;
    int n_syms;
    struct kiln_threadpool *pool; /* the main graph's run's, for every frame */
    struct kiln_scratch *scratch;
    void *block;                  /* vals, owned and alt in one block from scratch */
};

/* Runtime type of a value (constant dims). */
void kiln_type_of_value(const kiln_value *v, kiln_type *t);

#endif
