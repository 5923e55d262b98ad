/* passes.h - graph transformations run when an optimised session is compiled, each a kiln_pass
 * (pass.h) run by kiln_passes_run. Each keeps what the graph computes (up to float rounding) and
 * leaves the IR consistent: node order, producers, consumer lists (the runner then rebuilds the
 * release lists). They use src/ir and the op registry (src/ops), never the executor. The
 * reference (unoptimized) configuration runs none of them. */
#ifndef KILN_PASSES_PASSES_H
#define KILN_PASSES_PASSES_H

#include "core/error.h"
#include "ir/graph.h"

/* Evaluates each node whose inputs are all constants (not random, no subgraphs, outputs no
 * larger than its inputs plus 1 MiB, none a graph output) with its reference kernel: its outputs
 * become constants and it leaves the graph (fold_constants.c). Every provider's sessions.
 * *folded receives the count. */
kiln_status kiln_pass_fold_constants(kiln_graph *g, int *folded, kiln_err *err);

/* Folds an inference-mode BatchNormalization that is the only reader of a Conv's output, with
 * constant float32 weights and statistics, into that Conv's weights and bias, and likewise a Mul,
 * Div, Add or Sub of the Conv's output by a constant per output channel; the Conv then produces
 * the folded node's output. *folded receives the count. */
kiln_status kiln_pass_fold_conv_bn(kiln_graph *g, int *folded, kiln_err *err);

/* Fuses an activation (Relu, Clip with constant bounds, Sigmoid, HardSigmoid, HardSwish,
 * LeakyRelu, Gelu) that is the only reader of a float32 Conv's (2-D), Gemm's or MatMul's (by
 * constant 2-D weights) output, or of their kiln fused forms', into that node: it becomes
 * kiln.FusedConv / FusedGemm / FusedMatMul (src/ops/fused.h) with the activation as attributes
 * and produces the activation's output. CPU sessions. *fused receives the count. */
kiln_status kiln_pass_fuse_activation(kiln_graph *g, int *fused, kiln_err *err);
/* The GPU provider's form: a Relu (any float dtype) joins the Conv it reads (cuDNN's epilogue). */
kiln_status kiln_pass_fuse_activation_gpu(kiln_graph *g, int *fused, kiln_err *err);
/* Mul(Mul(g, Sigmoid(g)), u) -> kiln.SiluMul(g, u) for float g and u of equal dims, the inner
 * nodes read by nothing else (fuse_silu_mul.c). GPU sessions. *fused receives the count. */
kiln_status kiln_pass_fuse_silu_mul(kiln_graph *g, int *fused, kiln_err *err);
/* kiln.SiluMul(MatMulNBits(A, gate), MatMulNBits(A, up)) -> kiln.SiluMul(MatMulNBits(A, [gate; up]))
 * for constant weights and equal attributes (fuse_gate_up.c). GPU sessions, after fuse_silu_mul. */
kiln_status kiln_pass_fuse_gate_up(kiln_graph *g, int *fused, kiln_err *err);
/* com.microsoft FusedConv -> kiln.FusedConv where the activation is one kiln fuses (adopt_ms_fused_conv.c). */
kiln_status kiln_pass_adopt_ms_fused_conv(kiln_graph *g, int *changed, kiln_err *err);

/* Fuses a float32 Add of two same-shaped tensors into the group-1 Conv producing one of them
 * (its only reader): the Conv becomes kiln.FusedConv with the other as its residual input Z
 * (added before any activation) and moves to the Add's place. Run before
 * kiln_pass_fuse_activation. */
kiln_status kiln_pass_fuse_residual(kiln_graph *g, int *fused, kiln_err *err);
/* The GPU provider's form: float16 and bfloat16 as well, any group. */
kiln_status kiln_pass_fuse_residual_gpu(kiln_graph *g, int *fused, kiln_err *err);

/* Scaled dot-product attention written out as MatMul -> scale -> mask Add -> Softmax -> MatMul
 * (float32, 4-D) becomes one Attention node (opset 23), in its 3-D form when the heads are split
 * from and merged back into [B, S, H*D] by Reshape/Transpose (fuse_attention.c). CPU sessions
 * only. *fused receives the count. */
kiln_status kiln_pass_fuse_attention(kiln_graph *g, int *fused, kiln_err *err);
/* The same over float16 and bfloat16 of head size 32 or 64 (the GPU pipeline's, the calls its
 * tensor-core Attention takes; not with KILN_GPU_FLASH=0). */
kiln_status kiln_pass_fuse_attention_gpu(kiln_graph *g, int *fused, kiln_err *err);

/* Gelu written out as x * 0.5 * (1 + Erf(x / sqrt 2)), or with the tanh approximation, in any
 * association (float32, constants to a relative 1e-4, intermediates read by nothing else)
 * becomes one Gelu node (opset 20), and x * Clip(x + 3, 0, 6) / 6 one HardSwish (opset 14)
 * (fuse_gelu.c). CPU sessions only. *fused receives the count. */
kiln_status kiln_pass_fuse_gelu(kiln_graph *g, int *fused, kiln_err *err);

/* A float32 constant bias [N] added to the output of a MatMul by constant weights [K, N] (the
 * MatMul's only reader, not widening it): the MatMul becomes kiln.FusedMatMul(A, W, bias); the
 * Add goes (fuse_matmul_bias.c). The CPU pipeline's. *fused receives the count. */
kiln_status kiln_pass_fuse_matmul_bias(kiln_graph *g, int *fused, kiln_err *err);
/* The same for float32, float16 and bfloat16 (A, W, bias and Y of one type): the GPU pipeline's
 * (the bias in cuBLASLt's epilogue). */
kiln_status kiln_pass_fuse_matmul_bias_gpu(kiln_graph *g, int *fused, kiln_err *err);

/* MatMulInteger -> Cast -> Mul(scale product) [-> Add(bias)], what quantize_dynamic writes,
 * becomes one com.microsoft MatMulIntegerToFloat computing the same float32 operations
 * (fuse_quant_matmul.c). CPU sessions only. *fused receives the count. */
kiln_status kiln_pass_fuse_quant_matmul(kiln_graph *g, int *fused, kiln_err *err);

/* QDQ groups (DequantizeLinear -> Conv / MatMul -> QuantizeLinear) become QLinearConv /
 * QLinearMatMul, and DQ -> MaxPool, Reshape, Transpose, ... -> Q with equal parameters run on
 * the 8-bit values, as ONNX Runtime's QDQ transformer does (fuse_qdq.c). Runs before constant
 * folding, in optimised sessions whose first provider is the CPU. *fused receives the count. */
kiln_status kiln_pass_fuse_qdq(kiln_graph *g, int *fused, kiln_err *err);

/* Connected element-wise nodes (float unary and binary ops, Cast, Clip, Where) whose values
 * are read only inside the group become one kiln.FusedElementwise node computing the same
 * program (fuse_elementwise.c). The GPU provider's pass, run last. *fused receives the count
 * of groups. */
kiln_status kiln_pass_fuse_elementwise(kiln_graph *g, int *fused, kiln_err *err);

/* Blocks by 16 channels (kiln_layout NCHW16C) the float32 activations that convolutions and
 * pooling pass to each other, where every reader and the producer have a blocked kernel
 * (layout_nchwc.c). CPU sessions whose CPU runs src/cpu/nchwc.h's kernels only; run last.
 * *blocked receives the count of blocked values. */
/* Layer normalisation written out (ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, Mul
 * gamma, Add beta) becomes one LayerNormalization (fuse_layernorm.c). *fused receives the count. */
kiln_status kiln_pass_fuse_layernorm(kiln_graph *g, int *fused, kiln_err *err);
kiln_status kiln_pass_layout_nchwc(kiln_graph *g, int *blocked, kiln_err *err);
/* The input of node n that an element-wise kernel may read blocked because output element i
 * depends on its element i alone, or -1: a default-domain unary op (kiln_ops_unary_code) or Clip
 * with constant or absent bounds on float32 [N, C, H, W], or Add/Sub/Mul/Div of such a value and
 * a one-element float32 constant (either side). */
int kiln_pass_nchwc_flat_input(const kiln_node *n);

#endif
