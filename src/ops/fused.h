/* fused.h - kiln's fused operators (domain "kiln", src/ops/fused.c): what the CPU provider's
 * fusion passes (src/passes/fuse_*.c) rewrite a chain of ONNX nodes into. Each is an operator
 * like any other, with inference and a reference kernel computing exactly the unfused chain,
 * so the oracle and `kiln verify` check a fused node against a reference of the same node.
 *
 *   kiln.FusedConv(X, W, B?, Z?)  = act(Conv(X, W, B) + Z)  Conv's attributes; Z the shape of Y
 *   kiln.FusedGemm(A, B, C?)      = act(Gemm(A, B, C))       Gemm's attributes
 *   kiln.FusedMatMul(A, B, bias?) = act(MatMul(A, B) + bias) bias [N] (leading 1s) along Y's last axis
 *   kiln.FusedAdd(A, B)           = act(Add(A, B))           Add's broadcasting
 *   kiln.ChannelLookup(X, T)      = T[c][X[n, c, ...]]      X 8-bit [N, C, ...], T [C, 256] of Y's
 *                                   8-bit type: a QDQ chain per channel, tabulated (fuse_qdq.c)
 *   kiln.SiluMul(G, U)            = G * Sigmoid(G) * U       G and U of one float type and shape:
 *                                   a gated MLP's activation (fuse_silu_mul.c)
 *
 * with two attributes of their own: activation (STRING, absent: none) one of Relu, Clip,
 * Sigmoid, HardSigmoid, HardSwish, LeakyRelu, Gelu, GeluTanh (Gelu's tanh form), Tanh, and
 * activation_params (FLOATS): Clip's [min, max], HardSigmoid's [alpha, beta], LeakyRelu's
 * [alpha]. A fused node's opset is the ONNX opset of the op it extends (the pass keeps it). */
#ifndef KILN_OPS_FUSED_H
#define KILN_OPS_FUSED_H

#include <stdbool.h>

#include "ir/graph.h"
#include "ops/op.h"

/* An element-wise activation applied to a fused node's output 0, last. */
typedef enum kiln_act_kind {
    KILN_ACT_NONE = 0,
    KILN_ACT_RELU,         /* x < 0 ? 0 : x */
    KILN_ACT_CLIP,         /* min(max(x, alpha), beta), NaN kept */
    KILN_ACT_SIGMOID,      /* 1 / (1 + e^-x) */
    KILN_ACT_HARD_SIGMOID, /* clamp(alpha * x + beta, 0, 1) */
    KILN_ACT_HARD_SWISH,   /* x * clamp(x / 6 + 0.5, 0, 1) */
    KILN_ACT_LEAKY_RELU,   /* x < 0 ? alpha * x : x */
    KILN_ACT_GELU,         /* 0.5 x (1 + erf(x / sqrt 2)) */
    KILN_ACT_GELU_TANH,    /* 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */
    KILN_ACT_TANH,         /* tanh x */
} kiln_act_kind;

typedef struct kiln_act {
    kiln_act_kind kind;
    float alpha, beta;
} kiln_act;

/* A fused operator's typed attributes (kiln_node.params), parsed once at compile time. */
typedef struct kiln_fused {
    kiln_act act;
    int residual; /* FusedConv: the input index of Z (3) when present, else 0 */
    int bias;     /* FusedMatMul: the input index of bias (2) when present, else 0 */
} kiln_fused;

/* n's fusion: its parsed attributes when n is a kiln fused operator, else the empty fusion
 * (KILN_ACT_NONE, no residual, no bias). Never NULL. */
const kiln_fused *kiln_fused_of(const kiln_node *n);
/* Whether n is the kiln fused form of the ONNX op `op_type` ("Conv", "Gemm", "MatMul", "Add"). */
bool kiln_node_is_fused(const kiln_node *n, const char *op_type);
/* The kiln fused operator extending op_type ("FusedConv" for "Conv"...), or NULL. */
const char *kiln_fused_op_type(const char *op_type);
/* The activation attribute's spelling of k ("" for none). */
const char *kiln_act_name(kiln_act_kind k);

/* The reference kernel's formula of the unary float op op_type (Relu, Sigmoid, HardSigmoid,
 * HardSwish, LeakyRelu, Gelu) applied in place to the float tensor y, with attributes alpha
 * and beta and Gelu's tanh form (src/ops/elementwise.c). False when op_type is not one. */
bool kiln_ops_unary_reference(const char *op_type, double alpha, double beta, bool gelu_tanh, kiln_value *y);
/* The ONNX binary element-wise ops' inference and reference kernel (src/ops/elementwise.c), for
 * a node whose op_type is one of them or the kiln fused form of one (kiln.FusedAdd: Add's). */
kiln_status kiln_ops_binary_infer(kiln_infer_ctx *c);
kiln_status kiln_ops_binary_run(kiln_run_ctx *c);

#endif
