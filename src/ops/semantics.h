/* semantics.h - ONNX-semantics rules shared by the reference kernels (src/ops/), the CPU
 * kernels (src/cpu/) and the C side of the GPU provider (src/gpu/ops_*.c): one copy of each rule
 * the spec states about broadcasting, slicing, legacy broadcast, SAME padding, scatter
 * reductions and reduced axes, so that every provider computes what the reference computes.
 * Plain C over int64 dims; nothing here allocates or fails on model input except by returning
 * false. */
#ifndef KILN_OPS_SEMANTICS_H
#define KILN_OPS_SEMANTICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/op.h"

/* ---- broadcasting ---- */

/* Strides (in elements) to read a contiguous tensor of (in_rank, in_dims) broadcast to the
 * output shape (out_rank, out_dims), numpy rules with right-aligned dims: 0 along the axes the
 * input lacks or has as 1 where the output's dim is not 1. Requires out_rank >= in_rank. */
void kiln_bcast_strides(int out_rank, const int64_t *out_dims, int in_rank, const int64_t *in_dims,
                        int64_t *strides);

/* Whether (rank, dims) broadcasts unidirectionally to (to_rank, to_dims): right-aligned, every
 * dim equal to the target's or 1 (LayerNormalization's Scale and B, Expand-like reads). */
bool kiln_bcasts_to(int rank, const int64_t *dims, int to_rank, const int64_t *to_dims);
/* Whether tensor v broadcasts unidirectionally to tensor x's shape. */
static inline bool kiln_value_bcasts_to(const kiln_value *v, const kiln_value *x)
{
    return kiln_bcasts_to(v->rank, v->dims, x->rank, x->dims);
}

/* Opsets before 7: a binary op broadcasts B onto A only with broadcast=1, aligning B's dims at
 * attribute `axis` (without it: trailing, which is numpy's rule), and PRelu's 1-D slope runs along
 * the channel axis 1. *pad receives the number of trailing 1-dims to append to B's dims so that
 * numpy broadcasting gives that alignment (0 from opset 7 on). False when axis does not fit
 * (axis + rank_b > rank_a, or axis outside [-rank_a, rank_a)). */
bool kiln_legacy_bcast_pad(const kiln_node *n, int opset, int rank_a, int rank_b, int *pad);
/* B's dims as broadcasting reads them after kiln_legacy_bcast_pad: dims[0..rank) then pad 1-dims,
 * into out (room for rank + pad); returns rank + pad. */
int kiln_legacy_bcast_dims(int rank, const int64_t *dims, int pad, int64_t *out);

/* ---- Slice ---- */

/* Slice's start/end clamping on a dim of size d with step (non-zero), as Python's
 * slice(start, end, step).indices(d) does (numpy and the ONNX reference implementation):
 * negative values count from the end; then start and end are clamped to [0, d] for step > 0
 * and to [-1, d-1] for step < 0 (values past either end, INT64_MIN/MAX included, saturate).
 * *first receives the first index taken and *count the number of elements first,
 * first+step, ... */
void kiln_slice_clamp(int64_t d, int64_t start, int64_t end, int64_t step, int64_t *first, int64_t *count);

/* ---- SAME padding ---- */

/* auto_pad SAME_UPPER / SAME_LOWER split of `total` padding over one spatial dim: the extra one
 * of an odd total goes at the end for SAME_UPPER, at the beginning for SAME_LOWER. A negative
 * total (ConvTranspose with an output_shape smaller than the full result) is split the same way
 * with floor division: begin = floor(total/2) for SAME_UPPER. */
void kiln_same_pads(int64_t total, bool upper, int64_t *begin, int64_t *end);

/* ---- ScatterElements, ScatterND: the `reduction` attribute ---- */

typedef enum kiln_scatter_reduction {
    KILN_SCATTER_NONE, KILN_SCATTER_ADD, KILN_SCATTER_MUL, KILN_SCATTER_MAX, KILN_SCATTER_MIN,
} kiln_scatter_reduction;

/* n's reduction attribute ("none" when absent) as a kiln_scatter_reduction; -1 when it is not
 * one ONNX defines. */
int kiln_scatter_reduction_of(const kiln_node *n);

/* ---- Reduce* ---- */

/* The Reduce* ops, in this order (the GPU kernels' KILN_GPU_RK_* follow it). */
typedef enum kiln_reduce_op {
    KILN_REDUCE_SUM, KILN_REDUCE_MEAN, KILN_REDUCE_MAX, KILN_REDUCE_MIN, KILN_REDUCE_PROD,
    KILN_REDUCE_L1, KILN_REDUCE_L2, KILN_REDUCE_LOGSUM, KILN_REDUCE_LOGSUMEXP, KILN_REDUCE_SUMSQ,
} kiln_reduce_op;

/* The Reduce* op of n's op type; KILN_REDUCE_SUM for other op types. */
kiln_reduce_op kiln_reduce_op_of(const kiln_node *n);

/* Whether n's axes come from input 1 at this opset (ReduceSum from 13, the others from 18)
 * rather than from the `axes` attribute. */
bool kiln_reduce_axes_from_input(const kiln_node *n, int opset);

/* Sets mask[0..rank) to the axes node n reduces at this opset: from the `axes` attribute, or
 * from axes_v (input 1's content; NULL when absent) where kiln_reduce_axes_from_input. Negative
 * axes count from the end. Empty axes reduce every axis, or none with noop_with_empty_axes=1
 * (input-axes opsets only). Returns false on invalid axes (out of range, repeated, or axes_v not
 * a 1-D integer tensor of at most rank values), with a message in msg (size bytes; msg may be
 * NULL when size is 0). */
bool kiln_reduce_axes(const kiln_node *n, int opset, const kiln_value *axes_v, int rank, bool *mask, char *msg,
                      size_t size);

#endif
