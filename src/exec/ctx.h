/* ctx.h - the executor's frames; the kernel contexts they fill live in src/ops/ctx.h. */
#ifndef KILN_EXEC_CTX_H
#define KILN_EXEC_CTX_H

#include "exec/exec.h"
#include "ops/provider.h"
#include "ops/ctx.h"

/* Values of one graph execution; parent holds the enclosing graph's. */
struct kiln_frame {
    const kiln_graph *g;
    const kiln_frame *parent;
    kiln_value **vals;            /* by value id */
    bool *owned;                  /* vals[i] is freed by the frame */
    kiln_value **alt;             /* device runs: vals[i] copied to the other side (owned), or NULL */
    const kiln_run_env *env;      /* the main graph's run environment, NULL in subgraphs */
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

#endif
