/* contrib.c - the com.microsoft operators of ONNX Runtime that its transformer optimizer and
 * exporters emit (float forms): the kiln_ops_contrib table, the Gelu family and BiasAdd here,
 * layer normalizations in contrib_norm.c, FusedMatMul/FusedGemm/FusedConv in
 * contrib_matmul.c; QuantizeLinear/DequantizeLinear share the ONNX kernels (cast_quant.c).
 * Element-wise math runs in double, stored in the input's float type. */
#include <math.h>
#include <stdio.h>

#include "ops/cast_internal.h"
#include "ops/contrib_internal.h"
#include "ops/util.h"

static bool is_float(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16 ||
           dt == KILN_DTYPE_FLOAT64;
}

/* X's type for output 0, with an optional bias (input 1) of X's last dim. */
kiln_status kiln_contrib_gelu_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *b = kiln_infer_in(c, 1);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input X");
    if (x->dtype && !is_float(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "X is %s, expected a float type", kiln_dtype_name(x->dtype));
    if (b && b->dtype && x->dtype && b->dtype != x->dtype)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "bias is %s, X is %s", kiln_dtype_name(b->dtype),
                               kiln_dtype_name(x->dtype));
    if (b && b->rank >= 0) {
        if (b->rank != 1) return kiln_infer_fail(c, KILN_ERR_SHAPE, "bias must be 1-D, has rank %d", b->rank);
        if (x->rank == 0) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must have rank >= 1 with a bias");
        if (x->rank > 0) KILN_TRY(kiln_infer_require_equal(c, b->dims[0], x->dims[x->rank - 1], "bias length and X's last dim"));
    }
    return kiln_infer_same_as_input(c, 0, 0);
}

typedef double (*unary_fn)(double x, double alpha);

static double gelu_erf(double x, double alpha)
{
    (void)alpha;
    return 0.5 * x * (1.0 + erf(x * M_SQRT1_2));
}

static double gelu_tanh(double x, double alpha)
{
    (void)alpha;
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double quick_gelu(double x, double alpha)
{
    return x / (1.0 + exp(-alpha * x));
}

kiln_status kiln_contrib_bias_check(const kiln_value *X, const kiln_value *b, bool need_bias, int64_t *last, char *msg,
                                    int size)
{
    if (need_bias && !b) {
        snprintf(msg, (size_t)size, "needs input B (the bias)");
        return KILN_ERR_MODEL;
    }
    *last = X->rank ? X->dims[X->rank - 1] : 1;
    if (b && (b->rank != 1 || b->dims[0] != *last)) {
        snprintf(msg, (size_t)size, "bias has %lld elements (rank %d), X's last dim is %lld", (long long)b->numel, b->rank,
                 (long long)*last);
        return KILN_ERR_SHAPE;
    }
    return KILN_OK;
}

/* Y = f(X + bias) with bias (input 1, optional unless `need_bias`) along X's last dim. */
static kiln_status unary_bias_run(kiln_run_ctx *c, unary_fn f, double alpha, bool need_bias)
{
    const kiln_value *X = kiln_run_in(c, 0), *b = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t last;
    char msg[160];
    kiln_status st = kiln_contrib_bias_check(X, b, need_bias, &last, msg, sizeof msg);
    if (st) return kiln_run_fail(c, st, "%s", msg);
    for (int64_t i = 0; i < X->numel; i++) {
        double x = kiln_load_f64(X->dtype, X->data, i);
        /* the sum is held in X's type, as ONNX Runtime adds before it activates */
        if (b) x = kiln_round_to(X->dtype, x + kiln_load_f64(b->dtype, b->data, i % last));
        kiln_store_f64(Y->dtype, Y->data, i, f(x, alpha));
    }
    return KILN_OK;
}

kiln_status kiln_contrib_gelu_run(kiln_run_ctx *c) { return unary_bias_run(c, gelu_erf, 0, false); }
kiln_status kiln_contrib_fast_gelu_run(kiln_run_ctx *c) { return unary_bias_run(c, gelu_tanh, 0, false); }
kiln_status kiln_contrib_bias_gelu_run(kiln_run_ctx *c) { return unary_bias_run(c, gelu_erf, 0, true); }

kiln_status kiln_contrib_quick_gelu_run(kiln_run_ctx *c)
{
    return unary_bias_run(c, quick_gelu, kiln_attr_float(kiln_run_node(c), "alpha", 1.702f), false);
}

/* ---- BiasAdd: Y = X + bias + skip, X and skip [N, S, C], bias [C] ---- */

kiln_status kiln_contrib_bias_add_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *b = kiln_infer_in(c, 1), *s = kiln_infer_in(c, 2);
    if (!x || !b || !s) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs X, bias and skip");
    if (x->rank >= 0 && x->rank != 3) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must be 3-D, has rank %d", x->rank);
    if (b->rank >= 0 && b->rank != 1) return kiln_infer_fail(c, KILN_ERR_SHAPE, "bias must be 1-D, has rank %d", b->rank);
    if (s->rank >= 0 && s->rank != 3) return kiln_infer_fail(c, KILN_ERR_SHAPE, "skip must be 3-D, has rank %d", s->rank);
    if (x->rank == 3 && b->rank == 1) KILN_TRY(kiln_infer_require_equal(c, b->dims[0], x->dims[2], "bias length and X's C"));
    if (x->rank == 3 && s->rank == 3)
        for (int i = 0; i < 3; i++) KILN_TRY(kiln_infer_require_equal(c, s->dims[i], x->dims[i], "skip and X dims"));
    return kiln_infer_same_as_input(c, 0, 0);
}

kiln_status kiln_contrib_bias_add_check(const kiln_value *X, const kiln_value *b, const kiln_value *S, char *msg, int size)
{
    if (!b || !S) {
        snprintf(msg, (size_t)size, "needs inputs X, bias and skip");
        return KILN_ERR_MODEL;
    }
    bool ok = X->rank == 3 && b->rank == 1 && S->rank == 3 && b->dims[0] == X->dims[2];
    for (int i = 0; ok && i < 3; i++) ok = S->dims[i] == X->dims[i];
    if (!ok) {
        snprintf(msg, (size_t)size, "X (rank %d), bias (rank %d) and skip (rank %d) are not [N, S, C], [C], [N, S, C]",
                 X->rank, b->rank, S->rank);
        return KILN_ERR_SHAPE;
    }
    return KILN_OK;
}

kiln_status kiln_contrib_bias_add_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *b = kiln_run_in(c, 1), *S = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    char msg[160];
    kiln_status st = kiln_contrib_bias_add_check(X, b, S, msg, sizeof msg);
    if (st) return kiln_run_fail(c, st, "%s", msg);
    int64_t C = X->dims[2];
    for (int64_t i = 0; i < X->numel; i++)
        kiln_store_f64(Y->dtype, Y->data, i,
                       kiln_load_f64(X->dtype, X->data, i) + kiln_load_f64(b->dtype, b->data, i % C) +
                           kiln_load_f64(S->dtype, S->data, i));
    return KILN_OK;
}

#define MS "com.microsoft"
static const kiln_op_def defs[] = {
    {MS, "Gelu", 1, kiln_contrib_gelu_infer, kiln_contrib_gelu_run, KILN_OP_INPLACE},
    {MS, "FastGelu", 1, kiln_contrib_gelu_infer, kiln_contrib_fast_gelu_run},
    {MS, "BiasGelu", 1, kiln_contrib_gelu_infer, kiln_contrib_bias_gelu_run},
    {MS, "QuickGelu", 1, kiln_contrib_gelu_infer, kiln_contrib_quick_gelu_run, KILN_OP_INPLACE},
    {MS, "BiasAdd", 1, kiln_contrib_bias_add_infer, kiln_contrib_bias_add_run},
    {MS, "SkipLayerNormalization", 1, kiln_contrib_skip_ln_infer, kiln_contrib_skip_ln_run},
    {MS, "SkipSimplifiedLayerNormalization", 1, kiln_contrib_skip_sln_infer, kiln_contrib_skip_sln_run},
    {MS, "EmbedLayerNormalization", 1, kiln_contrib_embed_ln_infer, kiln_contrib_embed_ln_run},
    {MS, "FusedMatMul", 1, kiln_contrib_fused_matmul_infer, kiln_contrib_fused_matmul_run},
    {MS, "FusedGemm", 1, kiln_contrib_fused_gemm_infer, kiln_contrib_fused_gemm_run},
    {MS, "FusedConv", 1, kiln_contrib_fused_conv_infer, kiln_contrib_fused_conv_run},
    {MS, "QuantizeLinear", 1, kiln_cast_quantize_infer, kiln_cast_quantize_run},
    {MS, "DequantizeLinear", 1, kiln_cast_dequantize_infer, kiln_cast_dequantize_run},
};

const kiln_op_table kiln_ops_contrib = {defs, sizeof defs / sizeof defs[0]};
