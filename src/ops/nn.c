/* nn.c - Convolution, pooling, MatMul, Gemm, Einsum, and their integer and quantized variants:
 * the kiln_ops_nn table (the kernels live in nn_*.c). */
#include "ops/nn_internal.h"

static const kiln_op_def defs[] = {
    {"", "Conv", 1, kiln_nn_conv_infer, kiln_nn_conv_run},
    {"", "ConvTranspose", 1, kiln_nn_conv_transpose_infer, kiln_nn_conv_transpose_run},
    {"", "ConvInteger", 10, kiln_nn_conv_integer_infer, kiln_nn_conv_integer_run},
    {"", "QLinearConv", 10, kiln_nn_qlinear_conv_infer, kiln_nn_qlinear_conv_run},
    {"", "DeformConv", 19, kiln_nn_deform_conv_infer, kiln_nn_deform_conv_run},
    {"", "AveragePool", 1, kiln_nn_pool_infer, kiln_nn_average_pool_run},
    {"", "MaxPool", 1, kiln_nn_pool_infer, kiln_nn_max_pool_run},
    {"", "LpPool", 1, kiln_nn_pool_infer, kiln_nn_lp_pool_run},
    {"", "GlobalAveragePool", 1, kiln_nn_global_pool_infer, kiln_nn_global_average_pool_run},
    {"", "GlobalMaxPool", 1, kiln_nn_global_pool_infer, kiln_nn_global_max_pool_run},
    {"", "GlobalLpPool", 1, kiln_nn_global_pool_infer, kiln_nn_global_lp_pool_run},
    {"", "MaxUnpool", 9, kiln_nn_max_unpool_infer, kiln_nn_max_unpool_run, 0, KILN_OP_IN(2)},
    {"", "MatMul", 1, kiln_nn_matmul_infer, kiln_nn_matmul_run},
    {"", "MatMulInteger", 10, kiln_nn_matmul_integer_infer, kiln_nn_matmul_integer_run},
    {"", "QLinearMatMul", 10, kiln_nn_qlinear_matmul_infer, kiln_nn_qlinear_matmul_run},
    {"", "Gemm", 1, kiln_nn_gemm_infer, kiln_nn_gemm_run},
    {"", "Einsum", 12, kiln_nn_einsum_infer, kiln_nn_einsum_run},
};

const kiln_op_table kiln_ops_nn = {defs, sizeof defs / sizeof defs[0]};
