/* eval.h - what compile time does with the op registry over an IR graph, with no executor:
 * binding each node to its registry entry (and parsing its typed attributes), symbolic
 * inference, and evaluating one node's reference kernel on constant inputs (constant folding).
 * Used by the session's compile pipeline (src/exec/session.c) and by the passes. */
#ifndef KILN_OPS_EVAL_H
#define KILN_OPS_EVAL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"
#include "ir/graph.h"

/* Looks up n's registry entry from its domain, op type and opset (n->op, NULL when kiln has
 * none) and, when the entry has a parser, parses n's attributes once into n->params (in the
 * model's arena). Passes call it again after changing a node's op or attributes. A parser's
 * failure (a bad attribute) is KILN_ERR_MODEL naming the node. */
kiln_status kiln_node_bind(kiln_node *n, kiln_err *err);
/* Binds every node (subgraphs included, src/ops/infer.c). Unsupported nodes keep op == NULL;
 * the first is reported in err with KILN_ERR_UNSUPPORTED when `strict`. */
kiln_status kiln_bind_ops(kiln_graph *g, bool strict, kiln_err *err);
/* Compile-time shape and type inference over g and its subgraphs. Failures of an op's
 * inference leave its outputs unknown (decided at run time); the first such message is
 * kept in `note` when not NULL. */
kiln_status kiln_graph_infer(kiln_graph *g, kiln_err *note);
/* Runs node n with its op's reference kernel, every input read from its constant content
 * (n has no subgraphs and no provider kernel; src/ops/evaluate.c). out[i] receives an owned
 * value for each output n has (NULL for absent ones). An output larger than max_bytes (0: no
 * limit) fails before it is allocated. No thread pool: O(the op's reference cost). */
kiln_status kiln_node_evaluate(const kiln_node *n, size_t max_bytes, kiln_value **out, kiln_err *err);

#endif
