/* contrib_attn.h - what the com.microsoft Attention and MultiHeadAttention reference kernels
 * (contrib_attention.c) share with the CPU provider's fast kernel (src/cpu/kernels_contrib_attn.c):
 * ONNX Runtime's mask semantics (mask_index / key_padding_mask forms made into one additive
 * mask), so both paths mask alike. */
#ifndef KILN_OPS_CONTRIB_ATTN_H
#define KILN_OPS_CONTRIB_ATTN_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

/* Checks mask (int32) against the forms ONNX Runtime's CPU kernels take: [B] (keys at or past
 * mask[b] masked), [2B] (also keys before mask[B + b]), [B, T] (0/1 per key), [B, S, T] (0/1
 * per query and key), [B, 1, M, M] with M >= T (rows P + s, keys 0..T). NULL mask passes.
 * On failure, writes a message naming the dims into msg. */
bool kiln_contrib_attn_mask_ok(const kiln_value *mask, int64_t B, int64_t S, int64_t P, int64_t T, char *msg, int size);

/* Whether the prepared mask varies with the query row (3-D and 4-D masks, or causal). */
bool kiln_contrib_attn_mask_per_row(const kiln_value *mask, bool causal);

/* The additive mask of a checked mask and causality into m: [B, S, T] floats when
 * kiln_contrib_attn_mask_per_row, else [B, T]; 0 where attended, filter where masked (causal:
 * keys past P + s of query s, when S > 1, as ONNX Runtime). */
void kiln_contrib_attn_mask_fill(const kiln_value *mask, bool causal, int64_t B, int64_t S, int64_t P, int64_t T,
                            float filter, float *m);

/* The softmax scale: the scale attribute, or 1 / sqrt(H) when it is 0 or absent. */
double kiln_contrib_attn_scale(const kiln_node *n, int64_t H);

/* com.microsoft Attention's inputs, and its call as the checks resolve it. */
enum { KILN_ATTN_X, KILN_ATTN_W, KILN_ATTN_BIAS, KILN_ATTN_MASK, KILN_ATTN_PAST, KILN_ATTN_ABIAS, KILN_ATTN_PASTLEN };
typedef struct kiln_contrib_attention_dims {
    int64_t B, S, Hin;   /* input [B, S, Hin] */
    int64_t D, Dq, Dk, Dv; /* weights [Hin, D = Dq + Dk + Dv] */
    int64_t N, H, Hv;    /* heads, head sizes of Q/K and V */
    int64_t P, T;        /* past length, P + S */
    bool causal;         /* unidirectional and S > 1 */
} kiln_contrib_attention_dims;

/* The run-time checks of the reference Attention kernel (X, W, bias, mask_index, past,
 * attention_bias; NULL when absent): KILN_OK with *d filled, or the error code with a message in
 * msg. */
kiln_status kiln_contrib_attention_check(const kiln_node *n, const kiln_value *X, const kiln_value *W,
                                         const kiln_value *bias, const kiln_value *mask, const kiln_value *past,
                                         const kiln_value *ab, kiln_contrib_attention_dims *d, char *msg, int size);

/* MultiHeadAttention's inputs; the layouts of query, key and value. */
enum { KILN_MHA_Q, KILN_MHA_K, KILN_MHA_V, KILN_MHA_BIAS, KILN_MHA_MASK, KILN_MHA_ABIAS, KILN_MHA_PK, KILN_MHA_PV,
       KILN_MHA_PASTLEN, KILN_MHA_CACHE };
typedef enum kiln_contrib_mha_form {
    KILN_MHA_QKV,        /* query [B, S, N*H], key [B, L, N*H], value [B, L, N*Hv] */
    KILN_MHA_PACKED_QKV, /* query [B, S, N, 3, H] */
    KILN_MHA_PACKED_KV,  /* key [B, L, N, 2, H] */
    KILN_MHA_KV_BNSH,    /* key [B, N, L, H], value [B, N, L, Hv] (no bias added to them) */
} kiln_contrib_mha_form;
typedef struct kiln_contrib_mha_dims {
    kiln_contrib_mha_form form;
    int64_t B, S, L, N, H, Hv;
    int64_t P, T; /* past length, P + L */
    bool causal;  /* unidirectional and S > 1 */
} kiln_contrib_mha_dims;

/* The run-time checks of the reference MultiHeadAttention kernel (in[KILN_MHA_*], NULL when
 * absent): KILN_OK with *d filled, or the error code with a message in msg. */
kiln_status kiln_contrib_mha_check(const kiln_node *n, const kiln_value *const *in, kiln_contrib_mha_dims *d, char *msg,
                                   int size);

#endif
