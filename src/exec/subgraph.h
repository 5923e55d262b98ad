/* subgraph.h - If/Loop/Scan bodies compiled with the session: per subgraph its memory and
 * shape program, the shape constraints its inference recorded, and its plans cached per
 * binding; and the binding of one call of a subgraph. */
#ifndef KILN_EXEC_SUBGRAPH_H
#define KILN_EXEC_SUBGRAPH_H

#include "exec/plan.h"

typedef struct kiln_subprog {
    const kiln_graph *g;
    kiln_memprog memprog;
    kiln_plan_cache plans;
    int n_constraints;
    int *constraints; /* indices in the model's constraints of those whose node is in g */
} kiln_subprog;

/* Compiles every subgraph of g (any depth) into its graph's `prog`; plan caches of
 * `cache_size` plans each. Call after the passes, once the node lists are final. */
kiln_status kiln_subgraphs_compile(kiln_graph *g, int cache_size, kiln_err *err);
/* Frees what kiln_subgraphs_compile made (NULL progs are skipped). */
void kiln_subgraphs_release(kiln_graph *g);

/* Binds one call of sp's graph: syms[0..n_syms) holds the enclosing graph's binding on entry;
 * the symbols of the subgraph's declared input types are bound from in[] (NULL: the inputs'
 * initializers) and its constraints checked. Returns false when the call cannot take the
 * compile-time shapes (an input disagrees with its declared type, a symbol would take another
 * value than the enclosing binding gave it, a constraint fails): it then runs with inference
 * at run time, which reports any error. O(inputs' dims + constraints). */
bool kiln_subgraph_bind(const kiln_subprog *sp, const kiln_value *const *in, int64_t *syms, int n_syms);

#endif
