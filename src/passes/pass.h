/* pass.h - the pass pipeline: a pass is a named pure IR -> IR function over one graph, and a
 * pipeline an array of them run in order by kiln_passes_run (pipeline.c). The session runs the
 * generic pipeline before inference and the first provider's own (kiln_provider_i.passes)
 * after it; each pass is in passes.h and has a unit test (tests/unit/test_passes.c). */
#ifndef KILN_PASSES_PASS_H
#define KILN_PASSES_PASS_H

#include "core/error.h"
#include "ir/graph.h"

typedef struct kiln_pass {
    const char *name;
    /* Rewrites g, keeping what it computes (up to float rounding); *changed receives the
     * count of rewrites (0: g untouched). Reads consumer lists (kiln_ir_value.uses, fresh when
     * the runner calls it) and rewires through the graph.h helpers, which keep them. */
    kiln_status (*run)(kiln_graph *g, int *changed, kiln_err *err);
} kiln_pass;

/* Runs passes[0..n) over g in order: before each, rebuilds g's consumer lists; after one that
 * changed g, its release lists (kiln_graph_plan_releases). changed (may be NULL) receives the
 * total count of rewrites. A pass's failure is prefixed with its name. */
kiln_status kiln_passes_run(kiln_graph *g, const kiln_pass *passes, int n, int *changed, kiln_err *err);

/* Every session's pipeline over the bound, not yet inferred main graph of an optimised
 * session: constant folding, then Conv + BatchNormalization folding. */
extern const kiln_pass kiln_passes_generic[];
extern const int kiln_passes_generic_n;

#endif
