/* reduce_internal.h - shared pieces of the reduce family (reduce.c, reduce_norm.c,
 * reduce_loss.c): helpers for reductions over axis masks and the op functions of the split
 * files, all registered in reduce.c's table kiln_ops_reduce. */
#ifndef KILN_OPS_REDUCE_INTERNAL_H
#define KILN_OPS_REDUCE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

/* Strides (in elements) into the keepdims-shaped result of reducing `dims` over the axes set
 * in `mask`, for walking the input: 0 along reduced axes. Also gives the result's numel. */
void kiln_reduce_out_strides(int rank, const int64_t *dims, const bool *mask, int64_t *strides,
                             int64_t *out_numel);

/* Reads the whole tensor x as doubles into a new buffer (*buf, free() it); fails on memory. */
kiln_status kiln_reduce_load_all(kiln_run_ctx *c, const kiln_value *x, double **buf);

/* reduce_norm.c */
kiln_status kiln_layernorm_infer(kiln_infer_ctx *c);
kiln_status kiln_layernorm_run(kiln_run_ctx *c);
kiln_status kiln_rmsnorm_infer(kiln_infer_ctx *c);
kiln_status kiln_rmsnorm_run(kiln_run_ctx *c);
kiln_status kiln_groupnorm_infer(kiln_infer_ctx *c);
kiln_status kiln_groupnorm_run(kiln_run_ctx *c);
kiln_status kiln_instancenorm_infer(kiln_infer_ctx *c);
kiln_status kiln_instancenorm_run(kiln_run_ctx *c);
kiln_status kiln_batchnorm_infer(kiln_infer_ctx *c);
kiln_status kiln_batchnorm_run(kiln_run_ctx *c);
kiln_status kiln_lpnorm_infer(kiln_infer_ctx *c);
kiln_status kiln_lpnorm_run(kiln_run_ctx *c);
kiln_status kiln_mvn_infer(kiln_infer_ctx *c);
kiln_status kiln_mvn_run(kiln_run_ctx *c);
kiln_status kiln_lrn_infer(kiln_infer_ctx *c);
kiln_status kiln_lrn_run(kiln_run_ctx *c);

/* reduce_loss.c */
kiln_status kiln_nllloss_infer(kiln_infer_ctx *c);
kiln_status kiln_nllloss_run(kiln_run_ctx *c);
kiln_status kiln_sce_infer(kiln_infer_ctx *c);
kiln_status kiln_sce_run(kiln_run_ctx *c);

#endif
