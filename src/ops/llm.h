/* llm.h - what the reference kernels of the LLM operators (llm_attention.c, llm_nbits.c) share
 * with the CPU provider's fast kernels: a GroupQueryAttention call validated and resolved once
 * (every index read from data bounds-checked), and MatMulNBits' attributes and weight decoding. */
#ifndef KILN_OPS_LLM_H
#define KILN_OPS_LLM_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

/* ---- com.microsoft GroupQueryAttention ----
 * inputs: query [B, S, N*H] (or packed [B, S, (N + 2*Nkv)*H] with key and value absent), key and
 * value [B, S, Nkv*H], past_key / past_value [B, Nkv, P, H] (BNSH), seqlens_k int32 [B] (total
 * length - 1 per batch row), total_sequence_length int32 scalar, cos_cache / sin_cache
 * [max_pos, rd/2], position_ids int64 [B, S], attention_bias [B|1, N|1, S, >= total], head_sink
 * [N]; outputs: output [B, S, N*H], present_key / present_value [B, Nkv, max(total, P), H]. */
enum { GQA_Q, GQA_K, GQA_V, GQA_PK, GQA_PV, GQA_SEQLENS, GQA_TOTAL, GQA_COS, GQA_SIN, GQA_POS, GQA_BIAS, GQA_SINK };

/* The node's attributes (kiln_node.params), parsed once. */
typedef struct kiln_gqa_params {
    int64_t num_heads, kv_num_heads, local_window_size;
    float scale, softcap; /* scale 0: 1/sqrt(H) */
    bool do_rotary, interleaved, smooth_softmax;
} kiln_gqa_params;

typedef struct kiln_gqa_call {
    int64_t B, S, N, Nkv, H;
    int64_t past_len;    /* P: past_key's dim 2 (0 without a past) */
    int64_t present_len; /* present's dim 2: max(total, P) */
    int64_t total;       /* total_sequence_length */
    int64_t rd;          /* rotary dims (2 * cos_cache's dim 1), 0 without do_rotary */
    bool packed, first_prompt, shared; /* shared: present_key's buffer is past_key's */
    bool interleaved, smooth;
    int64_t window;      /* local_window_size, -1: none */
    float scale, softcap;
    const kiln_value *q, *k, *v, *past_k, *past_v, *cos, *sin, *pos, *bias, *sink;
    const int32_t *seqlens;
    /* seqlens_k (and position_ids, when given) are in device memory (a device kernel that reads
     * them there): the checks of their contents are that kernel's, and the helpers below that
     * read them are not for such a call */
    bool rows_on_device;
    kiln_value *y, *present_k, *present_v;
    int64_t bias_b, bias_h, bias_s; /* element strides of attention_bias (0 where broadcast) */
} kiln_gqa_call;

/* Reads and validates a call's inputs and outputs (shapes, dtypes, seqlens_k and position ids
 * against the buffers, unless they are in device memory: rows_on_device); fails naming the node
 * on anything out of range. */
kiln_status kiln_gqa_prepare(kiln_run_ctx *c, kiln_gqa_call *g);
/* Rows of past_key copied to present before the new ones, i.e. where the new rows go. */
static inline int64_t kiln_gqa_past_rows(const kiln_gqa_call *g, int64_t b)
{
    return !g->past_k || g->first_prompt ? 0 : (int64_t)g->seqlens[b] + 1 - g->S;
}
/* Rotary position of query/key row s of batch row b (validated by kiln_gqa_prepare). */
int64_t kiln_gqa_position(const kiln_gqa_call *g, int64_t b, int64_t s);
/* Keys [*start, *start + *len) that query row i of batch row b attends to. */
void kiln_gqa_window(const kiln_gqa_call *g, int64_t b, int64_t i, int64_t *start, int64_t *len);

/* ---- com.microsoft MatMulNBits: Y [..., N] = A [..., K] x dequant(B)^T + bias ----
 * B uint8 [N, n_blocks, block_size * bits / 8], scales [N * n_blocks], zero_points packed uint8
 * [N * ceil(n_blocks * bits / 8)] or of scales' dtype [N * n_blocks] or absent (2^(bits-1)),
 * g_idx int32 [K] (block of each k) or absent, bias [N]. */
enum { NB_A, NB_B, NB_SCALES, NB_ZP, NB_GIDX, NB_BIAS };

typedef struct kiln_nbits_params {
    int64_t K, N, bits, block_size, accuracy_level;
    int64_t n_blocks; /* ceil(K / block_size) */
    int64_t blob;     /* bytes per block: block_size * bits / 8 */
} kiln_nbits_params;

/* Checks B, scales, zero_points, g_idx and bias against the attributes. */
kiln_status kiln_nbits_check(kiln_run_ctx *c, const kiln_nbits_params *p);
/* Weight (n, k) dequantized: (q - zero point) * scale, block g_idx[k] or k / block_size. */
float kiln_nbits_weight(const kiln_nbits_params *p, const kiln_value *B, const kiln_value *scales,
                        const kiln_value *zp, const kiln_value *gidx, int64_t n, int64_t k);
/* Whether the node quantizes A to int8 per block (ONNX Runtime's CompInt8): accuracy_level 4 on
 * constant 4-bit weights (ONNX Runtime prepacks only those) with uint8 (packed) or no zero points
 * and no g_idx. Every other form computes in float, as ONNX Runtime's CPU kernel does. */
bool kiln_nbits_quantizes_a(const kiln_node *n, bool float_zero_points);
/* One block of A, a[n], quantized as accuracy_level 4 does: q[i] = round-half-even(a[i] * 127 / amax)
 * in float, clamped to [-127, 127]; returns the scale amax / 127 (0 for a block of zeros). */
float kiln_nbits_quantize_a(const float *a, int64_t n, int8_t *q);
/* Scale and zero point (as a float) of block blk of row n. */
void kiln_nbits_block(const kiln_nbits_params *p, const kiln_value *scales, const kiln_value *zp, int64_t n,
                      int64_t blk, float *scale, float *zero);

#endif
