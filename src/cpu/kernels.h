/* kernels.h - the CPU provider's kernels besides MatMul/Gemm/Conv (float32 but for Concat): element-wise ops
 * (kernels_ew.c), Softmax/LayerNormalization/ReduceMean (kernels_norm.c), Transpose and Concat
 * (kernels_layout.c) and the conv-net ops (kernels_cnn.c). Each selector returns the kernel for
 * node n or NULL (reference kernel); a selected kernel falls back to the reference kernel on any
 * case it does not cover. */
#ifndef KILN_CPU_KERNELS_H
#define KILN_CPU_KERNELS_H

#include <math.h>

#include "ops/fused.h"
#include "ops/op.h"

/* Elements per parallel chunk of a streaming loop. */
#define KILN_CPU_CHUNK 4096

/* Add, Sub, Mul, Div (opset >= 7), Relu, Sigmoid, Tanh, Erf, Gelu, Exp, Sqrt on float32. */
kiln_kernel_fn kiln_cpu_select_ew(const kiln_node *n);
/* Softmax, LayerNormalization, ReduceMean on float32. */
kiln_kernel_fn kiln_cpu_select_norm(const kiln_node *n);
/* Attention (opset 23) on float32: no past, not causal, Y only (kernels_attn.c). */
kiln_kernel_fn kiln_cpu_select_attn(const kiln_node *n);
/* softmax(scale Q K^T + mask) V in float32 over strided views, as the Attention kernel runs it
 * (kernels_attn.c): element (b, h, i, 0) of Q at q + b*q_b + h*q_h + i*q_s, d contiguous; K and V
 * likewise by kv head h / (Hq / Hkv); Y likewise; mask NULL or additive, row (b, h, i) at
 * b*m_b + h*m_h + i*m_s (0 strides broadcast), m_len <= total columns (keys past it masked).
 * total and Dk must be positive. */
typedef struct kiln_cpu_attn {
    const float *q, *k, *v, *mask;
    float *y;
    int64_t B, Hq, Hkv, Sq, total, Dk, Dv;
    int64_t q_b, q_h, q_s, k_b, k_h, k_s, v_b, v_h, v_s, y_b, y_h, y_s, m_b, m_h, m_s, m_len;
    float scale;
} kiln_cpu_attn;
kiln_status kiln_cpu_attn_f32(kiln_run_ctx *c, const kiln_cpu_attn *a);
/* com.microsoft Attention and MultiHeadAttention on float32 (kernels_contrib_attn.c). */
kiln_kernel_fn kiln_cpu_select_contrib_attn(kiln_node *n);
/* MatMulInteger, QLinearMatMul, DynamicQuantizeLinear, com.microsoft MatMulIntegerToFloat and
 * DynamicQuantizeMatMul on the int8 GEMM, packing a constant B into n->kernel_state
 * (kernels_quant.c). */
kiln_kernel_fn kiln_cpu_select_quant(kiln_node *n);
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
/* 2-D Conv and kiln.FusedConv (residual and activation applied to each output tile) on
 * float32 (kernels_conv.c). Packs constant weights into n->kernel_state. */
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
/* The node's reference kernel, for the cases a provider kernel leaves to it: zeroes the
 * outputs first, as the reference kernels expect (provider kernels get them unzeroed). */
kiln_status kiln_cpu_reference(kiln_run_ctx *c);


#endif
