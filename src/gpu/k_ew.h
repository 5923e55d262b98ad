/* k_ew.h - launchers of the element-wise GPU kernels (k_ew.cu): unary math and activations,
 * broadcasting binary arithmetic, comparisons and logic, Where and Cast. Plain C types only;
 * dtypes are kiln_dtype codes, pointers are device pointers, every launch goes on `s` and
 * returns the launch error. Empty tensors (n == 0) launch nothing. */
#ifndef KILN_GPU_K_EW_H
#define KILN_GPU_K_EW_H

#include <stdint.h>

#include "gpu/kshape.h"
#include "gpu/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Unary ops. Floating types (float32, float16, bfloat16) take all of them; int32 and int64
 * take ABS, NEG, SIGN, RELU and CLIP; ISNAN and ISINF write bool; NOT takes and writes bool. */
#define KILN_EW_UNARY_OPS(X)                                                                  \
    X(ABS) X(NEG) X(SIGN) X(RELU) X(RECIPROCAL) X(FLOOR) X(CEIL) X(ROUND) X(SQRT) X(EXP)        \
    X(LOG) X(SIN) X(COS) X(TAN) X(ASIN) X(ACOS) X(ATAN) X(SINH) X(COSH) X(ASINH) X(ACOSH)       \
    X(ATANH) X(ERF) X(SIGMOID) X(TANH) X(LEAKY_RELU) X(ELU) X(SELU) X(CELU) X(HARD_SIGMOID)    \
    X(HARD_SWISH) X(SOFTPLUS) X(SOFTSIGN) X(THRESHOLDED_RELU) X(SHRINK) X(GELU) X(MISH)         \
    X(SWISH) X(CLIP) X(DIV_CONST) X(ISNAN) X(ISINF) X(NOT)

/* Binary ops over broadcast operands. Arithmetic (ADD..PRELU) on float32, float16,
 * bfloat16, int32, int64 with A and B of one dtype, except POW, whose floating base takes an
 * exponent of any of those dtypes. Comparisons (EQ..GE) on those and bool, writing bool.
 * AND, OR, XOR on bool. Integer semantics are the reference's (src/ops/elementwise.c):
 * wrapping arithmetic, division truncating toward zero, division or mod by 0 (or -1) as there. */
#define KILN_EW_BINARY_OPS(X)                                                                 \
    X(ADD) X(SUB) X(MUL) X(DIV) X(MOD) X(FMOD) X(POW) X(MAX) X(MIN) X(PRELU) X(EQ) X(LT) X(LE)   \
    X(GT) X(GE) X(AND) X(OR) X(XOR)

#define KILN_EW_ENUM_(name) KILN_EW_##name,
typedef enum kiln_gpu_ew_unary { KILN_EW_UNARY_OPS(KILN_EW_ENUM_) KILN_EW_UNARY_COUNT_ } kiln_gpu_ew_unary;
typedef enum kiln_gpu_ew_binary { KILN_EW_BINARY_OPS(KILN_EW_ENUM_) KILN_EW_BINARY_COUNT_ } kiln_gpu_ew_binary;
#undef KILN_EW_ENUM_

/* A unary op's attributes (the reference's defaults filled in by the caller). */
typedef struct kiln_gpu_ew_params {
    float alpha, beta, gamma; /* activations; SHRINK: alpha = lambd, beta = bias; DIV_CONST: alpha = divisor */
    int flags;                /* GELU: 1 = tanh approximation; ISINF: 1 = detect positive, 2 = negative */
    float lo, hi;             /* CLIP bounds, floating types */
    int64_t ilo, ihi;         /* CLIP bounds, integer types */
} kiln_gpu_ew_params;

/* Y[i] = op(X[i]) for i < n; X and Y contiguous, dtype dt (Y bool for ISNAN/ISINF). Y may be X. */
gpuError_t kiln_gpu_ew_unary_launch(kiln_gpu_ew_unary op, kiln_dtype dt, const void *X, void *Y, int64_t n,
                                    kiln_gpu_ew_params p, gpuStream_t s);

/* Y = op(A, B) over the iteration space of sa/sb (same rank and dims; per-operand element
 * strides, 0 along broadcast dims); Y is contiguous with those dims. Y may be A when A is
 * read contiguously. ta/tb: dtypes of A and B; Y's is ta, or bool for comparisons. */
gpuError_t kiln_gpu_ew_binary_launch(kiln_gpu_ew_binary op, kiln_dtype ta, kiln_dtype tb, const void *A,
                                     kiln_gpu_shape sa, const void *B, kiln_gpu_shape sb, void *Y,
                                     gpuStream_t s);

/* Out = cond ? X : Y over the iteration space of the shapes (as for the binary launcher);
 * cond is bool, X, Y and Out have elements of `elem_size` bytes (1, 2, 4 or 8). */
gpuError_t kiln_gpu_ew_where_launch(size_t elem_size, const void *cond, kiln_gpu_shape sc, const void *X,
                                    kiln_gpu_shape sx, const void *Y, kiln_gpu_shape sy, void *Out,
                                    gpuStream_t s);

/* Y[i] = X[i] converted from `from` to `to` (float32, float16, bfloat16, float64, int32,
 * int64, int8, uint8, bool) with the reference's rules: float to integer truncates toward
 * zero through int64 (NaN gives 0, out of range saturates there, then wraps to the width),
 * to bool is `!= 0`, float64 to 16-bit floats rounds through float32. */
gpuError_t kiln_gpu_ew_cast_launch(kiln_dtype from, kiln_dtype to, const void *X, void *Y, int64_t n,
                                   gpuStream_t s);

#ifdef __cplusplus
}
#endif

#endif
