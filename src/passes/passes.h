/* passes.h - graph transformations run when an optimised session is compiled. Each keeps what
 * the graph computes (up to float rounding) and leaves the IR consistent: node order, producers,
 * release lists. The reference (unoptimized) configuration runs none of them. */
#ifndef KILN_PASSES_PASSES_H
#define KILN_PASSES_PASSES_H

#include "core/error.h"
#include "ir/graph.h"

/* Folds an inference-mode BatchNormalization that is the only reader of a Conv's output, with
 * constant float32 weights and statistics, into that Conv's weights and bias; the Conv then
 * produces the BatchNormalization's output. *folded receives the count. */
kiln_status kiln_pass_fold_conv_bn(kiln_graph *g, int *folded, kiln_err *err);

#endif
