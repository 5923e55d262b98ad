/* quant_internal.h - the quantized operators' parameter rules that the references (cast_quant.c,
 * nn_matmul.c, contrib_quant.c, contrib_qops.c) share with the GPU provider's kernels
 * (gpu/ops_quant.c): one definition of how a scale maps onto its tensor and of what a run
 * accepts, so that a GPU kernel takes exactly the cases the reference takes. */
#ifndef KILN_OPS_QUANT_INTERNAL_H
#define KILN_OPS_QUANT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/op.h"

/* How scale (and zero point) elements map onto x: x viewed as [outer, D, inner] around the
 * axis; the parameter of x[o, a, r] is at 0 (per tensor), a (per axis) or
 * (o * ceil(D / block) + a / block) * inner + r (blocked). */
typedef struct kiln_qmap {
    enum { KILN_QMAP_TENSOR, KILN_QMAP_AXIS, KILN_QMAP_BLOCKED } kind;
    int64_t D, inner, block;
} kiln_qmap;

/* The map of QuantizeLinear / DequantizeLinear node n (axis, block_size) for x and scale s. */
void kiln_qmap_of(const kiln_node *n, const kiln_value *x, const kiln_value *s, kiln_qmap *m);
int64_t kiln_qmap_index(const kiln_qmap *m, int64_t i);

/* The value range of integer quantized type dt (8, 16, 4 and 2 bits); false for other types. */
bool kiln_quant_int_range(kiln_dtype dt, int64_t *lo, int64_t *hi);

/* MatMulInteger / QLinearMatMul: whether per-row (a_side: of A [.., M, K]) or per-column (of B
 * [.., K, N]) parameter p (NULL: absent) has 1, one per row/column, or one per row/column of
 * every batch element. */
bool kiln_nn_mm_param_ok(const kiln_value *p, const kiln_value *X, bool a_side);

/* MatMulIntegerToFloat / DynamicQuantizeMatMul: whether the per-column parameters of B [.., K, N]
 * are valid (b_scale float32 with 1 or N elements, b_zero_point B's dtype with 1 or N, bias
 * float32 [N]); on false writes the reason. */
bool kiln_contrib_qmm_b_params_ok(const kiln_value *B, const kiln_value *bs, const kiln_value *bzp,
                                  const kiln_value *bias, char *msg, size_t size);

/* QGemm's checked arguments (inputs A, a_scale, a_zp, B, b_scale, b_zp, C?, y_scale?, y_zp?). */
typedef struct kiln_qgemm_args {
    bool ta, tb;
    int64_t M, N, K;
    float alpha, a_scale, y_scale; /* y_scale 1 without y_scale */
    int a_zp, y_zp, lo, hi;        /* lo, hi: the output range when requantized */
} kiln_qgemm_args;

/* Checks QGemm's run-time inputs in[0..8] (NULL where absent) and output Y as the reference does
 * and reads its host-side facts (dims, attributes); the scalars a_scale, a_zp, y_scale and y_zp
 * are read from in[] only when read_scalars (host memory). On false writes the reason. */
bool kiln_contrib_qgemm_check(const kiln_node *n, const kiln_value *const *in, const kiln_value *Y, bool read_scalars,
                              kiln_qgemm_args *a, char *msg, size_t size);

/* The com.microsoft QLinear element-wise operators: whether scale s is a float32 scalar and zero
 * point z (NULL: absent) a scalar of 8-bit dtype dt, as the reference (contrib_qlinear.c) takes them. */
bool kiln_contrib_q8_params_ok(const kiln_value *s, const kiln_value *z, kiln_dtype dt);

#endif
