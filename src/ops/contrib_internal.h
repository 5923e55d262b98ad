/* contrib_internal.h - shared pieces of the com.microsoft family (ONNX Runtime's contrib
 * operators): the activations FusedGemm and FusedConv name by attribute, and the entry points
 * that contrib.c lists in kiln_ops_contrib. */
#ifndef KILN_OPS_CONTRIB_INTERNAL_H
#define KILN_OPS_CONTRIB_INTERNAL_H

#include <math.h>
#include <stdbool.h>

#include "ops/op.h"

/* An activation FusedGemm (attributes activation, activation_alpha/beta/gamma) or FusedConv
 * (activation, activation_params) applies to its output, as ONNX Runtime defines them. */
typedef enum kiln_contrib_act_kind {
    KILN_CONTRIB_ACT_NONE = 0,
    KILN_CONTRIB_ACT_RELU,
    KILN_CONTRIB_ACT_TANH,
    KILN_CONTRIB_ACT_SIGMOID,
    KILN_CONTRIB_ACT_SOFTSIGN,            /* x / (1 + |x|) */
    KILN_CONTRIB_ACT_SOFTPLUS,            /* ln(1 + e^x) */
    KILN_CONTRIB_ACT_LEAKY_RELU,          /* x < 0 ? alpha x : x */
    KILN_CONTRIB_ACT_HARD_SIGMOID,        /* clamp(alpha x + beta, 0, 1) */
    KILN_CONTRIB_ACT_ELU,                 /* x < 0 ? alpha (e^x - 1) : x */
    KILN_CONTRIB_ACT_SELU,                /* gamma (x <= 0 ? alpha (e^x - 1) : x) */
    KILN_CONTRIB_ACT_THRESHOLDED_RELU,    /* x > alpha ? x : 0 */
    KILN_CONTRIB_ACT_SCALED_TANH,         /* alpha tanh(beta x) */
    KILN_CONTRIB_ACT_PARAMETRIC_SOFTPLUS, /* alpha ln(1 + e^(beta x)) */
    KILN_CONTRIB_ACT_CLIP,                /* min(max(x, alpha), beta) */
} kiln_contrib_act_kind;

typedef struct kiln_contrib_act {
    kiln_contrib_act_kind kind;
    double alpha, beta, gamma;
} kiln_contrib_act;

/* The activation of a FusedGemm (conv false) or FusedConv (conv true) node. Returns false
 * with a message in msg (size bytes) for an unknown name or missing or miscounted parameters,
 * the cases ONNX Runtime refuses. */
bool kiln_contrib_act_parse(const kiln_node *n, bool conv, kiln_contrib_act *a, char *msg, int size);

/* act(x) in double. */
static inline double kiln_contrib_act_eval(const kiln_contrib_act *a, double x)
{
    switch (a->kind) {
    case KILN_CONTRIB_ACT_NONE: return x;
    case KILN_CONTRIB_ACT_RELU: return x < 0 ? 0 : x;
    case KILN_CONTRIB_ACT_TANH: return tanh(x);
    case KILN_CONTRIB_ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case KILN_CONTRIB_ACT_SOFTSIGN: return x / (1.0 + fabs(x));
    case KILN_CONTRIB_ACT_SOFTPLUS: return x > 30 ? x : log1p(exp(x));
    case KILN_CONTRIB_ACT_LEAKY_RELU: return x < 0 ? a->alpha * x : x;
    case KILN_CONTRIB_ACT_HARD_SIGMOID: return fmin(fmax(a->alpha * x + a->beta, 0.0), 1.0);
    case KILN_CONTRIB_ACT_ELU: return x < 0 ? a->alpha * expm1(x) : x;
    case KILN_CONTRIB_ACT_SELU: return a->gamma * (x <= 0 ? a->alpha * expm1(x) : x);
    case KILN_CONTRIB_ACT_THRESHOLDED_RELU: return x > a->alpha ? x : 0;
    case KILN_CONTRIB_ACT_SCALED_TANH: return a->alpha * tanh(a->beta * x);
    case KILN_CONTRIB_ACT_PARAMETRIC_SOFTPLUS: {
        double t = a->beta * x;
        return a->alpha * (t > 30 ? t : log1p(exp(t)));
    }
    case KILN_CONTRIB_ACT_CLIP: return isnan(x) ? x : fmin(fmax(x, a->alpha), a->beta);
    }
    return x;
}

/* ---- run-time checks the reference kernels make, shared with the GPU kernels (src/gpu/
 * ops_contrib.c) so both refuse alike: each returns KILN_OK, or the error code with a message in
 * msg (size bytes) that the reference reports ---- */

/* Gelu family: the optional bias b (input 1; required when need_bias) is 1-D of X's last dim,
 * *last. */
kiln_status kiln_contrib_bias_check(const kiln_value *X, const kiln_value *b, bool need_bias, int64_t *last, char *msg,
                                    int size);
/* BiasAdd: X and skip [N, S, C], bias [C]. */
kiln_status kiln_contrib_bias_add_check(const kiln_value *X, const kiln_value *b, const kiln_value *S, char *msg, int size);
/* SkipLayerNormalization (beta present or not) and the simplified form (beta NULL): input X [.., h]
 * of rank 2 or 3, gamma, beta and bias [h] (*h), skip X's shape or its last dims ([S, h], [1, S,
 * h]). */
kiln_status kiln_contrib_skip_check(const kiln_value *X, const kiln_value *S, const kiln_value *G, const kiln_value *beta,
                                    const kiln_value *bias, int64_t *h, char *msg, int size);

/* EmbedLayerNormalization's inputs (and their indices). */
enum { KILN_EMBED_IDS, KILN_EMBED_SEG, KILN_EMBED_WORD, KILN_EMBED_POS, KILN_EMBED_SEGEMB, KILN_EMBED_GAMMA,
       KILN_EMBED_BETA, KILN_EMBED_MASK, KILN_EMBED_POSIDS, KILN_EMBED_N_IN };
/* EmbedLayerNormalization: in[KILN_EMBED_*] (NULL when absent). input_ids [B, S], segment_ids
 * and mask [B, S], position_ids [B, S] or [1, S], embeddings 2-D of one hidden size H, gamma and
 * beta [H]. The ids' values are not checked here (the reference checks each). */
kiln_status kiln_contrib_embed_check(const kiln_value *const *in, char *msg, int size);

/* contrib.c: activations and element-wise ops */
kiln_status kiln_contrib_gelu_infer(kiln_infer_ctx *c);
kiln_status kiln_contrib_gelu_run(kiln_run_ctx *c);
kiln_status kiln_contrib_fast_gelu_run(kiln_run_ctx *c);
kiln_status kiln_contrib_bias_gelu_run(kiln_run_ctx *c);
kiln_status kiln_contrib_quick_gelu_run(kiln_run_ctx *c);
kiln_status kiln_contrib_bias_add_infer(kiln_infer_ctx *c);
kiln_status kiln_contrib_bias_add_run(kiln_run_ctx *c);

/* contrib_norm.c */
kiln_status kiln_contrib_skip_ln_infer(kiln_infer_ctx *c);
kiln_status kiln_contrib_skip_ln_run(kiln_run_ctx *c);
kiln_status kiln_contrib_skip_sln_infer(kiln_infer_ctx *c);
kiln_status kiln_contrib_skip_sln_run(kiln_run_ctx *c);
kiln_status kiln_contrib_embed_ln_infer(kiln_infer_ctx *c);
kiln_status kiln_contrib_embed_ln_run(kiln_run_ctx *c);

/* contrib_matmul.c */
kiln_status kiln_contrib_fused_matmul_infer(kiln_infer_ctx *c);
kiln_status kiln_contrib_fused_matmul_run(kiln_run_ctx *c);
kiln_status kiln_contrib_fused_gemm_infer(kiln_infer_ctx *c);
kiln_status kiln_contrib_fused_gemm_run(kiln_run_ctx *c);
kiln_status kiln_contrib_fused_conv_infer(kiln_infer_ctx *c);
kiln_status kiln_contrib_fused_conv_run(kiln_run_ctx *c);

/* FusedMatMul's operand views: the logical matrix of batch index b (over the output's batch
 * dims) of A or B starts at element off and reads element (r, k) at off + r * rs + k * cs. */
typedef struct kiln_contrib_mm_view {
    int yb;                          /* batch rank of the output */
    int64_t ydims[KILN_MAX_RANK];    /* output batch dims */
    int64_t M, N, K;
    int64_t a_bs[KILN_MAX_RANK], b_bs[KILN_MAX_RANK]; /* element strides per output batch dim */
    int64_t a_rs, a_cs, b_rs, b_cs;  /* strides of A's [M, K] and B's [K, N] */
} kiln_contrib_mm_view;

/* Resolves FusedMatMul's transA/transB/transBatchA/transBatchB and broadcasting for A and B;
 * false with a message when the shapes do not multiply. */
bool kiln_contrib_mm_resolve(const kiln_node *n, const kiln_value *A, const kiln_value *B, kiln_contrib_mm_view *v, char *msg,
                        int size);

#endif
