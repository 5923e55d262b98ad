/* util.h - helpers shared by the reference kernels: axes, strides, iteration (the ONNX rules
 * that every provider shares are in semantics.h). */
#ifndef KILN_OPS_UTIL_H
#define KILN_OPS_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

/* Normalizes axis (negative counts from the end) into [0, rank); false when out of range. */
bool kiln_axis_norm(int64_t axis, int rank, int *out);

/* Row-major strides (in elements) of dims. */
void kiln_strides(int rank, const int64_t *dims, int64_t *strides);

/* Multi-index walk over a shape, keeping flat offsets into up to 4 operands.
 *     kiln_iter it; kiln_iter_init(&it, rank, dims, n_ops, strides);
 *     for (int64_t i = 0; i < numel; i++, kiln_iter_next(&it)) use(it.off[0], it.off[1]);
 */
typedef struct kiln_iter {
    int rank, n_ops;
    int64_t dims[KILN_MAX_RANK];
    int64_t idx[KILN_MAX_RANK];
    int64_t strides[4][KILN_MAX_RANK];
    int64_t off[4];
} kiln_iter;

void kiln_iter_init(kiln_iter *it, int rank, const int64_t *dims, int n_ops, int64_t (*strides)[KILN_MAX_RANK]);
void kiln_iter_next(kiln_iter *it);

/* v rounded to the precision of float type dt (float32, float16, bfloat16; others as is),
 * to match a reference that holds an intermediate value in that type. */
double kiln_round_to(kiln_dtype dt, double v);

/* Inference for element-wise ops over the broadcast of all present inputs: output 0 gets the
 * broadcast shape and dtype `dt` (KILN_DTYPE_UNDEFINED: the dtype of input 0). */
kiln_status kiln_infer_elementwise(kiln_infer_ctx *c, kiln_dtype dt);
/* Fails (KILN_ERR_MODEL) when the node has an input present past its op's last, max: ONNX
 * Runtime's schema check refuses such a node, and an element-wise op would broadcast it into Y. */
kiln_status kiln_infer_max_inputs(kiln_infer_ctx *c, int max);

#endif
