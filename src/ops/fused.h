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
 *   kiln.SiluMul(H)               = the same of G = H[..., :n], U = H[..., n:], n half H's last
 *                                   dim: the output of one product over the stacked gate and up
 *                                   weights (fuse_gate_up.c)
 *   kiln.FusedElementwise(X...)   = a chain of element-wise nodes as one program (kiln_ewp below,
 *                                   fuse_elementwise.c): Y's dims the broadcast of the inputs'
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

/* Where kiln.SiluMul reads, one description for its reference and its CPU and GPU kernels: Y's
 * `total` elements in rows of n, row r of G at g + r * stride elements and of U at u + r *
 * stride. Two inputs: one row, U's own data; the packed form (U NULL): rows of H's last dim, U
 * their second halves. */
typedef struct kiln_silu_mul_rows {
    const void *g, *u;
    int64_t total, n, stride;
} kiln_silu_mul_rows;

/* kiln.SiluMul's rows for inputs G and U (NULL: packed) and output Y; false when they do not
 * fit (U of another dtype or count than G, Y of another count, H's last dim odd). */
bool kiln_silu_mul_rows_of(const kiln_value *G, const kiln_value *U, const kiln_value *Y, kiln_silu_mul_rows *r);

/* ---- kiln.FusedElementwise: its program ----
 *
 * Registers 0..n_in-1 hold the inputs' elements (each input broadcast to Y's dims), register
 * n_in + k instruction k's result, rounded to its dtype as the node it replaces rounded it;
 * Y is the last register. Attributes (written by the pass, parsed into kiln_ewp once):
 *   ops     STRINGS  instruction k's op: a float unary op of elementwise.c (Relu, Sigmoid, Gelu,
 *                    ...), a float binary one (Add, Sub, Mul, Div, Pow, Max, Min, PRelu, Mod),
 *                    Cast, Clip, Where, or Constant
 *   args    INTS     3 per instruction: operand registers (-1: none; Where: cond, X, Y)
 *   params  FLOATS   4 per instruction: the unary op's alpha, beta, gamma and 1 for Gelu's tanh
 *                    form; Clip's min and max; Constant's value
 *   dtypes  INTS     one kiln_dtype per register. Inputs of integer or bool dtypes are read
 *                    only by Cast (to a float type) and, bool, as Where's condition. */
#define KILN_EWP_MAX_IN 16
#define KILN_EWP_MAX_INS 48
#define KILN_EWP_MAX_RANK 8 /* of Y (the GPU kernels' highest rank) */

typedef enum kiln_ewp_kind {
    KILN_EWP_UNARY,  /* code: kiln_ops_unary_code's */
    KILN_EWP_BINARY, /* code: kiln_ops_binary_code's */
    KILN_EWP_CAST,   /* a's value rounded to the result dtype */
    KILN_EWP_CLIP,   /* min(max(a, p[0]), p[1]), NaN kept */
    KILN_EWP_WHERE,  /* a (bool) ? b : c */
    KILN_EWP_CONST,  /* p[0] */
} kiln_ewp_kind;

typedef struct kiln_ewp_ins {
    kiln_ewp_kind kind;
    int code;
    int a, b, c;
    double p[4];
} kiln_ewp_ins;

typedef struct kiln_ewp {
    int n_in, n_ins;
    kiln_dtype dtype[KILN_EWP_MAX_IN + KILN_EWP_MAX_INS]; /* per register */
    kiln_ewp_ins ins[KILN_EWP_MAX_INS];
} kiln_ewp;

/* The float formulas of the ONNX element-wise ops as their reference kernels apply them
 * (src/ops/elementwise.c), one element at a time, for kiln.FusedElementwise: a unary op's code
 * (its attributes, with the op's defaults, into params: alpha, beta, gamma, Gelu's tanh flag)
 * or -1 when n is not a unary float op; a binary float op's code (Max and Min of two inputs
 * included) or -1; and the formulas by code. */
int kiln_ops_unary_code(const kiln_node *n, double params[4]);
const char *kiln_ops_unary_name(int code);
double kiln_ops_unary_eval(int code, double x, const double params[4]);
int kiln_ops_binary_code(const kiln_node *n);
double kiln_ops_binary_eval(int code, double a, double b);

/* The reference kernel's formula of the unary float op op_type (Relu, Sigmoid, HardSigmoid,
 * HardSwish, LeakyRelu, Gelu) applied in place to the float tensor y, with attributes alpha
 * and beta and Gelu's tanh form (src/ops/elementwise.c). False when op_type is not one. */
bool kiln_ops_unary_reference(const char *op_type, double alpha, double beta, bool gelu_tanh, kiln_value *y);
/* The ONNX binary element-wise ops' inference and reference kernel (src/ops/elementwise.c), for
 * a node whose op_type is one of them or the kiln fused form of one (kiln.FusedAdd: Add's). */
kiln_status kiln_ops_binary_infer(kiln_infer_ctx *c);
kiln_status kiln_ops_binary_run(kiln_run_ctx *c);

#endif
