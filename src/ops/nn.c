/* nn.c - Convolution, pooling, MatMul, Gemm, Einsum, and their integer and quantized variants. */
#include "ops/op.h"
#include "ops/util.h"

static const kiln_op_def defs[] = {
    {NULL, NULL, 0, NULL, NULL},
};

const kiln_op_table kiln_ops_nn = {defs, 0};
