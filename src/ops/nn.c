/* nn.c - Convolution, pooling, MatMul, Gemm, Einsum, and their integer and quantized variants:
 * the kiln_ops_nn table (the kernels live in nn_*.c). */
#include "ops/nn_internal.h"

static const kiln_op_def defs[] = {
    {"", "Conv", 1, nn_conv_infer, nn_conv_run},
    {"", "ConvTranspose", 1, nn_conv_transpose_infer, nn_conv_transpose_run},
    {"", "ConvInteger", 10, nn_conv_integer_infer, nn_conv_integer_run},
    {"", "QLinearConv", 10, nn_qlinear_conv_infer, nn_qlinear_conv_run},
    {"", "DeformConv", 19, nn_deform_conv_infer, nn_deform_conv_run},
    {"", "AveragePool", 1, nn_pool_infer, nn_average_pool_run},
    {"", "MaxPool", 1, nn_pool_infer, nn_max_pool_run},
    {"", "LpPool", 1, nn_pool_infer, nn_lp_pool_run},
    {"", "GlobalAveragePool", 1, nn_global_pool_infer, nn_global_average_pool_run},
    {"", "GlobalMaxPool", 1, nn_global_pool_infer, nn_global_max_pool_run},
    {"", "GlobalLpPool", 1, nn_global_pool_infer, nn_global_lp_pool_run},
    {"", "MaxUnpool", 9, nn_max_unpool_infer, nn_max_unpool_run},
    {"", "MatMul", 1, nn_matmul_infer, nn_matmul_run},
    {"", "MatMulInteger", 10, nn_matmul_integer_infer, nn_matmul_integer_run},
    {"", "QLinearMatMul", 10, nn_qlinear_matmul_infer, nn_qlinear_matmul_run},
    {"", "Gemm", 1, nn_gemm_infer, nn_gemm_run},
    {"", "Einsum", 12, nn_einsum_infer, nn_einsum_run},
};

const kiln_op_table kiln_ops_nn = {defs, sizeof defs / sizeof defs[0]};
