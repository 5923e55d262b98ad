/* kernels.h - the CPU provider's kernels besides MatMul/Gemm/Conv (float32 but for Concat): element-wise ops
 * (kernels_ew.c), Softmax/LayerNormalization/ReduceMean (kernels_norm.c), Transpose and Concat
 * (kernels_layout.c) and the conv-net ops (kernels_cnn.c). Each selector returns the kernel for
 * node n or NULL (reference kernel); a selected kernel falls back to the reference kernel on any
 * case it does not cover. */
#ifndef KILN_CPU_KERNELS_H
#define KILN_CPU_KERNELS_H

#include <math.h>

#include "ops/op.h"

/* Elements per parallel chunk of a streaming loop. */
#define KILN_CPU_CHUNK 4096

/* Add, Sub, Mul, Div (opset >= 7), Relu, Sigmoid, Tanh, Erf, Gelu, Exp, Sqrt on float32. */
kiln_kernel_fn kiln_cpu_select_ew(const kiln_node *n);
/* Softmax, LayerNormalization, ReduceMean on float32. */
kiln_kernel_fn kiln_cpu_select_norm(const kiln_node *n);
/* Attention (opset 23) on float32: no past, not causal, Y only (kernels_attn.c). */
kiln_kernel_fn kiln_cpu_select_attn(const kiln_node *n);
/* MatMulInteger, QLinearMatMul, DynamicQuantizeLinear, com.microsoft MatMulIntegerToFloat and
 * DynamicQuantizeMatMul on the int8 GEMM, packing a constant B into n->kernel_state
 * (kernels_quant.c). */
kiln_kernel_fn kiln_cpu_select_quant(kiln_node *n);
/* ConvInteger and QLinearConv (1-D, 2-D, groups) on the int8 GEMM, packing a constant W into
 * n->kernel_state; depthwise by a direct loop (kernels_qconv.c). */
kiln_kernel_fn kiln_cpu_select_qconv(kiln_node *n);
/* Per-tensor QuantizeLinear of float32 and 2-D MaxPool on 8-bit values (kernels_qdq.c). */
kiln_kernel_fn kiln_cpu_select_qdq(const kiln_node *n);
/* Transpose on float32. */
kiln_kernel_fn kiln_cpu_select_layout(const kiln_node *n);
/* BatchNormalization (inference), Clip, MaxPool/AveragePool 2-D, GlobalAveragePool/GlobalMaxPool
 * on float32 (kernels_cnn.c). */
kiln_kernel_fn kiln_cpu_select_cnn(const kiln_node *n);
/* Depthwise 2-D Conv (group == C == M, W [C, 1, kh, kw]) over X [N, C, H, W] into Y [N, C, oh, ow]
 * with the resolved geometry g and an optional bias [C]; spread over the N*C planes. */
struct nn_geom;
kiln_status kiln_cpu_conv_depthwise(kiln_run_ctx *c, const struct nn_geom *g, const float *x, const float *w,
                                    const float *bias, const kiln_act *act, float *y, int64_t N, int64_t C,
                                    int64_t H, int64_t W, int64_t oh, int64_t ow);
/* The kernel of a node that reads or writes a value blocked by 16 channels (kernels_nchwc.c):
 * Conv (packing its weights into n->kernel_state), MaxPool, AveragePool, GlobalAveragePool, or
 * one that fails with a message for any other op; NULL for Shape and for nodes without blocked
 * values. */
kiln_kernel_fn kiln_cpu_select_nchwc(kiln_node *n);
/* 2-D Conv on float32 with the node's fused activation (kernels_conv.c). */
/* Packs constant weights into n->kernel_state. */
kiln_kernel_fn kiln_cpu_select_conv(kiln_node *n);
/* y[i] = Gelu(x[i]) (exact, erf form) for i < n; y may be x. AVX-512 where the CPU has it
 * (kernels_ew.c). */
void kiln_cpu_gelu(const float *x, float *y, int64_t n);
/* y[i] = act(y[i] + bias) for i < n (kernels_conv.c). */
void kiln_cpu_act_apply(const kiln_act *act, float *y, int64_t n, float bias);
/* y[i] = act(y[i] + bias + res[i]) for i < n; res may be NULL (kernels_conv.c). */
void kiln_cpu_act_apply_sum(const kiln_act *act, float *y, const float *res, int64_t n, float bias);
/* Whether act is applied as a clamp of y + res to [lo, hi] (none, Relu, Clip), which a kernel
 * folds into its store; else it runs kiln_cpu_act_apply_sum after the store. */
static inline bool kiln_cpu_act_clamp(const kiln_act *act, float *lo, float *hi)
{
    *lo = act->kind == KILN_ACT_RELU ? 0.0f : act->kind == KILN_ACT_CLIP ? act->alpha : -INFINITY;
    *hi = act->kind == KILN_ACT_CLIP ? act->beta : INFINITY;
    return act->kind == KILN_ACT_NONE || act->kind == KILN_ACT_RELU || act->kind == KILN_ACT_CLIP;
}
/* A kiln_gemm_tile_fn applying the kiln_act at ctx to each element of the block. */
void kiln_cpu_act_tile(void *ctx, float *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n);
/* The reference kernel, then the node's fused activation (kiln_node.act) over output 0. */
kiln_status kiln_cpu_reference_act(kiln_run_ctx *c);

/* The node's reference kernel, for the cases a provider kernel leaves to it: zeroes the
 * outputs first, as the reference kernels expect (provider kernels get them unzeroed). */
kiln_status kiln_cpu_reference(kiln_run_ctx *c);

/* Whether v is a float32 tensor (by its compile-time type). */
static inline bool kiln_cpu_is_f32(const kiln_ir_value *v)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.dtype == KILN_DTYPE_FLOAT32;
}

#endif
