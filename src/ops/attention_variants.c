/* attention_variants.c - LinearAttention, FlexAttention (ai.onnx.preview), CausalConvWithState. */
#include "ops/op.h"
#include "ops/util.h"

static const kiln_op_def defs[] = {
    {NULL, NULL, 0, NULL, NULL},
};

const kiln_op_table kiln_ops_attention_variants = {defs, 0};
