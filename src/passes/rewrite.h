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
/* For a node b of two inputs, one of them `known`: the other one; NULL when b is NULL, has not
 * two inputs or does not read `known`. */
kiln_ir_value *kiln_passes_other_input(const kiln_node *b, const kiln_ir_value *known);
/* The node of g that produces v: of the default domain and op_type, with v its one output;
 * NULL otherwise (v NULL, a graph input or constant, another op). */
kiln_node *kiln_passes_producer(const kiln_graph *g, const kiln_ir_value *v, const char *op_type);
/* The one node that reads v, when v is not a graph output (a rewrite may remove it): of the
 * default domain and op_type, with one output; NULL otherwise. */
kiln_node *kiln_passes_only_reader(const kiln_ir_value *v, const char *op_type);
/* candidate[k] for kiln_passes_sweep: whether g's node k (of those it has now) is of the default
 * domain and one of the n op types `ops` (the pure ops a pattern may leave behind). In g's model
 * arena; NULL when out of memory. */
bool *kiln_passes_mark_ops(kiln_graph *g, const char *const *ops, int n);
/* Rewrites node nd in place into op_type (domain, opset) with inputs in[0..n_in) (uses moved)
 * and attributes at[0..n_attrs) (kiln_passes_new_attrs, or NULL), then binds it to the registry. */
kiln_status kiln_passes_become(kiln_node *nd, const char *op_type, const char *domain, int opset, int n_in,
                               kiln_ir_value *const *in, kiln_attr *at, int n_attrs, kiln_err *err);

#endif
