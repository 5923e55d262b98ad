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

#endif
