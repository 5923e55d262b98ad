/* kernels.h - the CPU provider's kernel families (kernels_*.c), each a table of kiln_cpu_kernel
 * keyed by the registry operator it serves, and the helpers they share. A selected kernel
 * falls back to the reference kernel on any case it does not cover. */
#ifndef KILN_CPU_KERNELS_H
#define KILN_CPU_KERNELS_H

#include <math.h>

#include "ops/fused.h"
#include "ops/op.h"

/* One CPU kernel: the registry operator it serves (domain and op type, every since-version of
 * it) and the function choosing the kernel for a node of it from the node's compile-time types
 * and attributes, or NULL to leave the node to its reference kernel. */
typedef struct kiln_cpu_kernel {
    const char *domain, *op_type;
    kiln_kernel_fn (*select)(kiln_node *n);
} kiln_cpu_kernel;

/* A kernel family's table (one per kernels_*.c file), listed once in provider.c. */
typedef struct kiln_cpu_kernel_table {
    const kiln_cpu_kernel *k;
    int n;
} kiln_cpu_kernel_table;
#define KILN_CPU_KERNEL_TABLE(name, entries) \
    const kiln_cpu_kernel_table name = {entries, (int)(sizeof entries / sizeof entries[0])}

/* The entry of t serving registry entry op, or NULL. O(entries). */
const kiln_cpu_kernel *kiln_cpu_kernel_find(const kiln_cpu_kernel_table *t, const kiln_op_def *op);

/* The families: element-wise (Add, Sub, Mul, Div from opset 7, Relu, Sigmoid, Tanh, Erf, Gelu,
 * Exp, Sqrt), normalisation (Softmax, LayerNormalization, ReduceMean), layout (Transpose,
 * Concat), conv-net ops (BatchNormalization in inference, Clip, MaxPool/AveragePool 2-D,
 * GlobalAveragePool/GlobalMaxPool), Attention (opset 23: no past, not causal, Y only),
 * com.microsoft Attention and MultiHeadAttention, the int8 ops on the int8 GEMM (MatMulInteger,
 * QLinearMatMul, DynamicQuantizeLinear, Cast int32 -> float, DequantizeLinear, com.microsoft
 * MatMulIntegerToFloat and DynamicQuantizeMatMul), int8 convolutions (ConvInteger, QLinearConv:
 * 1-D, 2-D, groups), per-tensor QuantizeLinear and 8-bit MaxPool (kernels_qdq.c), Conv 1-D/2-D,
 * kiln.FusedConv and
 * ConvTranspose (kernels_conv.c), nearest and linear Resize / Upsample (kernels_resize.c), and
 * the blocked-layout kernels (kernels_nchwc.c). All float32
 * but Concat and the int8 ops. */
extern const kiln_cpu_kernel_table kiln_cpu_kernels_ew, kiln_cpu_kernels_norm, kiln_cpu_kernels_layout,
    kiln_cpu_kernels_cnn, kiln_cpu_kernels_attn, kiln_cpu_kernels_contrib_attn, kiln_cpu_kernels_quant,
    kiln_cpu_kernels_qconv, kiln_cpu_kernels_qdq, kiln_cpu_kernels_conv, kiln_cpu_kernels_nchwc,
    kiln_cpu_kernels_ort_nchwc, kiln_cpu_kernels_dqlstm, kiln_cpu_kernels_qattn, kiln_cpu_kernels_lstm,
    kiln_cpu_kernels_contrib_ew, kiln_cpu_kernels_qlinear_ew, kiln_cpu_kernels_ew_more,
    kiln_cpu_kernels_conv1d, kiln_cpu_kernels_qmatmul_batched, kiln_cpu_kernels_nbits, kiln_cpu_kernels_gqa,
    kiln_cpu_kernels_resize;

/* Elements per parallel chunk of a streaming loop. */
#define KILN_CPU_CHUNK 4096

/* rint(v) (round half to even) for |v| < 2^22, by adding and taking away 1.5 * 2^23: no SSE4.1 or
 * libm call, so requantization loops stay inline (IEEE rules keep the compiler from folding the
 * two away). */
static inline float kiln_rint_small(float v)
{
    const float magic = 12582912.0f;
    return (v + magic) - magic;
}

/* min(max(v, lo), hi) as fminf(fmaxf(v, lo), hi) computes it (NaN gives lo), inline */
static inline float kiln_clampf(float v, float lo, float hi)
{
    v = v > lo ? v : lo;
    return v < hi ? v : hi;
}

/* On a function whose loops are written for the auto-vectoriser, which -O2 leaves off under GCC. */
#if defined(__GNUC__) && !defined(__clang__)
#define KILN_VECTORIZE __attribute__((optimize("O3")))
#else
#define KILN_VECTORIZE
#endif

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
/* Depthwise 2-D Conv (group == C == M, W [C, 1, kh, kw]) over X [N, C, H, W] into Y [N, C, oh, ow]
 * with the resolved geometry g and an optional bias [C]; spread over the N*C planes. */
struct kiln_nn_geom;
kiln_status kiln_cpu_conv_depthwise(kiln_run_ctx *c, const struct kiln_nn_geom *g, const float *x, const float *w,
                                    const float *bias, const kiln_act *act, float *y, int64_t N, int64_t C,
                                    int64_t H, int64_t W, int64_t oh, int64_t ow);
/* The kernel of a node that reads or writes a value blocked by 16 channels (kernels_nchwc.c):
 * kiln_cpu_kernels_nchwc's for Conv (packing its weights into n->kernel_state), MaxPool,
 * AveragePool, GlobalAveragePool, GlobalMaxPool, Add, Sub, Mul, Div, kiln.FusedAdd, Resize and
 * Upsample, or one that fails with a message for any other op; NULL for ops that read only types
 * (Shape), for the element-wise nodes whose own kernels run on the bytes as they lie
 * (kiln_pass_nchwc_flat_input) and for nodes without blocked values. */
kiln_kernel_fn kiln_cpu_select_nchwc(kiln_node *n);
/* The blocked kernels' Conv / kiln.FusedConv (either side blocked or plain; src/cpu/nchwc.h),
 * its weights packed into n->kernel_state. */
kiln_kernel_fn kiln_cpu_nchwc_select_conv(kiln_node *n);
/* The arithmetic of Add, Sub, Mul and Div. */
typedef enum kiln_bin_op { KILN_BIN_ADD, KILN_BIN_SUB, KILN_BIN_MUL, KILN_BIN_DIV } kiln_bin_op;
/* Y = act(A op B) of float32 tensors A and B broadcast to Y (the caller has checked that they
 * do), as the Add/Sub/Mul/Div and kiln.FusedAdd kernels compute it (kernels_ew.c); act NULL or
 * none for the plain ops. Threads from pool (NULL: the calling thread). False, with nothing
 * computed, for a broadcast of more dims than kiln_bcast_rows merges (those kernels leave it to
 * the reference). */
bool kiln_cpu_binary_f32(kiln_threadpool *pool, kiln_bin_op op, const kiln_value *A, const kiln_value *B, kiln_value *Y,
                         const kiln_act *act);
/* y[i] = Gelu(x[i]) (exact, erf form) for i < n; y may be x. AVX-512 where the CPU has it
 * (kernels_ew.c). */
void kiln_cpu_gelu(const float *x, float *y, int64_t n);
/* y[i] = act(y[i] + bias) for i < n (kernels_conv.c). */
void kiln_cpu_act_apply(const kiln_act *act, float *y, int64_t n, float bias);
/* y[i] = act(y[i] + bias + res[i]) for i < n; res may be NULL (kernels_conv.c; 16 lanes from 16
 * values where the CPU has AVX-512, act_wide.c's kiln_cpu_act_apply_sum_avx512). */
void kiln_cpu_act_apply_sum(const kiln_act *act, float *y, const float *res, int64_t n, float bias);
void kiln_cpu_act_apply_sum_avx512(const kiln_act *act, float *y, const float *res, int64_t n, float bias);
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
