/* quant_internal.h - the quantized operators' parameter rules that the references (cast_quant.c,
 * nn_matmul.c, contrib_quant.c, contrib_qlinear.c, contrib_qops.c) share with the GPU provider's kernels
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
/* The same check that also reads the scale and zero point (0 when z is absent) in host memory. */
bool kiln_contrib_q8_params(const kiln_value *s, const kiln_value *z, kiln_dtype dt, float *scale, int *zp);
/* QLinearAdd, QLinearMul: whether ONNX Runtime's kernel takes B as its first operand and A as its
 * second: A is one value along C's innermost dim other than 1 (ORT's broadcast spans), or C has one
 * element. QLinearAdd's rounding depends on the order: the reference and every kernel follow it. */
bool kiln_contrib_qbinary_swaps(const kiln_value *A, const kiln_value *C);

/* QLinearSigmoid and QLinearLeakyRelu (by n's op type; alpha from n): the reference's lookup
 * table of X's 8-bit dtype dt, table[v - lo] = the output code less lo for input code v, built
 * from the scales and zero points xs, xz?, ys, yz? (host memory; NULL where absent). False (the
 * table untouched) when the reference refuses the parameters. */
bool kiln_contrib_q8_unary_table(const kiln_node *n, kiln_dtype dt, const kiln_value *xs, const kiln_value *xz,
                                 const kiln_value *ys, const kiln_value *yz, uint8_t table[256]);

/* QLinearSoftmax's checked arguments: rows of d codes, `inner` apart, outer * inner of them (row
 * (o, r) starts at o * d * inner + r); the output is saturate(nearbyint(table[code] * yscale /
 * sum) + yz) with the row's codes shifted so that its maximum indexes the table's largest entry. */
typedef struct kiln_qsoftmax_args {
    int64_t outer, d, inner;
    float yscale; /* floor(1 / Y_scale) */
    int yz;
    float table[256]; /* exp of the codes, indexed by the code's byte */
} kiln_qsoftmax_args;

/* Checks QLinearSoftmax's run-time inputs X, X_scale, Y_scale, Y_zero_point? (the scales and zero
 * point in host memory) as the reference does and fills *a (the table only when X is not empty):
 * KILN_OK, or the reference's error code with the reason in msg. */
kiln_status kiln_contrib_qsoftmax_prepare(const kiln_node *n, const kiln_value *X, const kiln_value *xs,
                                          const kiln_value *ys, const kiln_value *yz, kiln_qsoftmax_args *a, char *msg,
                                          size_t size);

/* QLinearAveragePool's run-time geometry for X and Y (1 to 3 spatial dims, padded to 3 with
 * unit dims): window k, stride s, pads pb (begin) and pe (end), spatial dims in and out. */
typedef struct kiln_qpool_geom {
    int64_t N, C;
    bool channels_last, count_include_pad;
    int64_t k[3], s[3], pb[3], pe[3], in[3], out[3];
} kiln_qpool_geom;

/* Reads QLinearAveragePool node n's geometry for X and checks Y's dims as the reference does:
 * KILN_OK, or the reference's error code with the reason in msg. */
kiln_status kiln_contrib_qavgpool_geom(const kiln_node *n, const kiln_value *X, const kiln_value *Y,
                                       kiln_qpool_geom *g, char *msg, size_t size);

#endif
