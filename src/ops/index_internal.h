/* index_internal.h - helpers shared by the index family's files (index*.c) and the ops that
 * index.c registers from its sibling files. */
#ifndef KILN_OPS_INDEX_INTERNAL_H
#define KILN_OPS_INDEX_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

/* Copies n consecutive elements src[si..] into dst[di..]; both tensors have the same dtype.
 * Strings are duplicated. */
kiln_status kiln_index_copy(kiln_value *dst, int64_t di, const kiln_value *src, int64_t si, int64_t n,
                            kiln_err *err);

/* Element i of the integer tensor t as a position along a dim of `size`: negative values count
 * from the end. False when the value lies outside [-size, size). */
bool kiln_index_at(const kiln_value *t, int64_t i, int64_t size, int64_t *pos);

/* The KILN_ERR_RUNTIME failure for element i of t that kiln_index_at rejected. */
kiln_status kiln_index_bad(kiln_run_ctx *c, const char *what, const kiln_value *t, int64_t i, int64_t size);

/* Three-way comparison of a[i] and b[j] (same dtype): numbers by value with NaN after every
 * number and equal to NaN, strings bytewise. */
int kiln_index_cmp(const kiln_value *a, int64_t i, const kiln_value *b, int64_t j);

/* Stable sort of idx[0..n) by cmp(ctx, x, y); tmp has room for n elements. */
void kiln_index_sort(int64_t *idx, int64_t *tmp, int64_t n, int (*cmp)(const void *ctx, int64_t x, int64_t y),
                     const void *ctx);

/* The `axis` attribute (default def) normalized into [0, rank); fails with KILN_ERR_MODEL when
 * out of range. */
kiln_status kiln_index_infer_axis(kiln_infer_ctx *c, int64_t def, int rank, int *axis);
/* The same at run time, where inference has already validated it. */
int kiln_index_run_axis(kiln_run_ctx *c, int64_t def, int rank);

/* Product of dims[from..to). */
int64_t kiln_index_prod(const int64_t *dims, int from, int to);

/* Output i: the tensor the executor allocated from run-time inference, or else a new one of
 * the given shape (for data-dependent sizes). */
kiln_status kiln_index_out(kiln_run_ctx *c, int i, kiln_dtype dt, int rank, const int64_t *dims,
                           kiln_value **y);

/* ---- ops defined in index_select.c ---- */
kiln_status kiln_index_nonzero_infer(kiln_infer_ctx *c);
kiln_status kiln_index_nonzero_run(kiln_run_ctx *c);
kiln_status kiln_index_compress_infer(kiln_infer_ctx *c);
kiln_status kiln_index_compress_run(kiln_run_ctx *c);
kiln_status kiln_index_unique_infer(kiln_infer_ctx *c);
kiln_status kiln_index_unique_run(kiln_run_ctx *c);
kiln_status kiln_index_topk_infer(kiln_infer_ctx *c);
kiln_status kiln_index_topk_run(kiln_run_ctx *c);
kiln_status kiln_index_arg_infer(kiln_infer_ctx *c);
kiln_status kiln_index_argmax_run(kiln_run_ctx *c);
kiln_status kiln_index_argmin_run(kiln_run_ctx *c);

/* ---- ops defined in index_layout.c ---- */
kiln_status kiln_index_onehot_infer(kiln_infer_ctx *c);
kiln_status kiln_index_onehot_run(kiln_run_ctx *c);
kiln_status kiln_index_reverse_sequence_infer(kiln_infer_ctx *c);
kiln_status kiln_index_reverse_sequence_run(kiln_run_ctx *c);
kiln_status kiln_index_col2im_infer(kiln_infer_ctx *c);
kiln_status kiln_index_col2im_run(kiln_run_ctx *c);

#endif
