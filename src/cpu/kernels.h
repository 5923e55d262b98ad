/* kernels.h - the CPU provider's float32 kernels besides MatMul/Gemm/Conv: element-wise ops
 * (kernels_ew.c), Softmax/LayerNormalization/ReduceMean (kernels_norm.c) and Transpose
 * (kernels_layout.c). Each selector returns the kernel for node n or NULL (reference kernel);
 * a selected kernel falls back to the reference kernel on any case it does not cover. */
#ifndef KILN_CPU_KERNELS_H
#define KILN_CPU_KERNELS_H

#include "ops/op.h"

/* Elements per parallel chunk of a streaming loop. */
#define KILN_CPU_CHUNK 4096

/* Add, Sub, Mul, Div (opset >= 7), Relu, Sigmoid, Tanh, Erf, Gelu, Exp, Sqrt on float32. */
kiln_kernel_fn kiln_cpu_select_ew(const kiln_node *n);
/* Softmax, LayerNormalization, ReduceMean on float32. */
kiln_kernel_fn kiln_cpu_select_norm(const kiln_node *n);
/* Transpose on float32. */
kiln_kernel_fn kiln_cpu_select_layout(const kiln_node *n);

/* The node's reference kernel. */
static inline kiln_status kiln_cpu_reference(kiln_run_ctx *c) { return kiln_run_node(c)->op->run(c); }

/* Whether v is a float32 tensor (by its compile-time type). */
static inline bool kiln_cpu_is_f32(const kiln_ir_value *v)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.dtype == KILN_DTYPE_FLOAT32;
}

#endif
