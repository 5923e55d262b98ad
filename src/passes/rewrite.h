/* rewrite.h - what the pattern-matching passes share beyond src/ir/graph.h's rewiring helpers. */
#ifndef KILN_PASSES_REWRITE_H
#define KILN_PASSES_REWRITE_H

#include <stdbool.h>

#include "ir/graph.h"

/* Drops the nodes k of g with candidate[k] none of whose outputs has a reader (the pure ops a
 * rewrite left behind), repeatedly, unlinking each (consumer lists kept); then compacts g. */
void kiln_passes_sweep(kiln_graph *g, const bool *candidate);
/* n zeroed attributes in g's model arena (NULL when out of memory), for a rewritten node. */
kiln_attr *kiln_passes_new_attrs(kiln_graph *g, int n);

#endif
