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

/* Fuses an activation (Relu, Clip with constant bounds, Sigmoid, HardSigmoid, HardSwish,
 * LeakyRelu) that is the only reader of a float32 Conv's (2-D) or Gemm's output into that node:
 * the node's act is set and it produces the activation's output. Only for sessions whose Conv and
 * Gemm nodes the CPU provider runs (its kernels apply act; the reference kernels do not). *fused
 * receives the count. */
kiln_status kiln_pass_fuse_activation(kiln_graph *g, int *fused, kiln_err *err);

/* Scaled dot-product attention written out as MatMul -> scale -> mask Add -> Softmax -> MatMul
 * (float32, 4-D) becomes one Attention node (opset 23), in its 3-D form when the heads are split
 * from and merged back into [B, S, H*D] by Reshape/Transpose (fuse_attention.c). CPU sessions
 * only. *fused receives the count. */
kiln_status kiln_pass_fuse_attention(kiln_graph *g, int *fused, kiln_err *err);

#endif
