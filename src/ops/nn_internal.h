/* nn_internal.h - shared pieces of the nn family (conv, pool, matmul, einsum): window geometry,
 * bulk element conversion, and the entry points that nn.c lists in kiln_ops_nn. */
#ifndef KILN_OPS_NN_INTERNAL_H
#define KILN_OPS_NN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

/* Bound on window attributes (sizes, strides, dilations, pads) so that the size arithmetic
 * cannot overflow int64. */
#define NN_ATTR_MAX ((int64_t)1 << 31)

enum { NN_PAD_NOTSET, NN_PAD_SAME_UPPER, NN_PAD_SAME_LOWER, NN_PAD_VALID };

/* Sliding-window geometry of a conv or pool over `nsp` spatial dims. */
typedef struct kiln_nn_geom {
    int nsp;
    int auto_pad; /* NN_PAD_* */
    bool ceil_mode;
    int64_t strides[KILN_MAX_RANK];
    int64_t dilations[KILN_MAX_RANK];
    int64_t pads[2 * KILN_MAX_RANK]; /* begins [0, nsp), ends [nsp, 2*nsp), as the attribute */
    int64_t kernel[KILN_MAX_RANK];   /* filled by the caller (attribute or W's dims) */
} kiln_nn_geom;

/* Reads auto_pad, strides, dilations, pads and ceil_mode of node n for nsp spatial dims.
 * Returns false with a message in msg (size bytes) when an attribute is malformed. */
bool kiln_nn_geom_parse(const kiln_node *n, int nsp, kiln_nn_geom *g, char *msg, int size);
/* Output size of spatial dim i for input size `in` and kernel size `k` (symbolic where they
 * are): floor((in + pads - dilation*(k-1) - 1) / stride) + 1, ceil_mode and auto_pad aware. */
kiln_dim kiln_nn_geom_out_dim(kiln_dimtab *t, const kiln_nn_geom *g, int i, kiln_dim in, kiln_dim k);
/* At run time: output sizes into out[] and, for SAME auto_pad, the actual pads into g->pads.
 * Returns false when a window does not fit the padded input. */
bool kiln_nn_geom_resolve(kiln_nn_geom *g, const int64_t *in, int64_t *out);

/* ConvTranspose's geometry at run time for X, W and Y dims: kiln_nn_geom_parse, then the pads that
 * output_shape or SAME auto_pad imply (Y's dims come from inference). Element (ci, i) of X and
 * kernel tap k land at output position i * stride - pads[begin] + k * dilation. */
bool kiln_nn_conv_transpose_geom(const kiln_node *node, int nsp, const int64_t *xdims, const int64_t *wdims,
                            const int64_t *ydims, kiln_nn_geom *g, char *msg, int size);

/* A pooling node's geometry: kernel_shape (required, one value per spatial dim) into g->kernel,
 * and the other window attributes (kiln_nn_geom_parse). False with a message on malformed ones. */
bool kiln_nn_pool_geom(const kiln_node *n, kiln_nn_geom *g, char *msg, int size);
/* p of LpPool / GlobalLpPool: a float attribute in opset 1, an int later; 2 when absent. */
double kiln_nn_pool_p(const kiln_node *n);

/* Advances a row-major multi-index over dims; false after the last one (idx back to zeros). */
static inline bool kiln_nn_index_next(int n, const int64_t *dims, int64_t *idx)
{
    for (int k = n - 1; k >= 0; k--) {
        if (++idx[k] < dims[k]) return true;
        idx[k] = 0;
    }
    return false;
}

/* Product of n dims (sizes the executor already validated). */
static inline int64_t kiln_nn_prod(int n, const int64_t *d)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++) p *= d[i];
    return p;
}

/* Whole tensor converted to a new malloc'ed array (at least one element); NULL when out of
 * memory. The i64 form keeps integers exact (uint64 as its two's-complement bit pattern). */
double *kiln_nn_load_f64(const kiln_value *v);
int64_t *kiln_nn_load_i64(const kiln_value *v);
/* Writes y[0..Y->numel) into Y, converting to its dtype. */
void kiln_nn_store_all_f64(kiln_value *Y, const double *y);
void kiln_nn_store_all_i64(kiln_value *Y, const int64_t *y);
/* kiln_nn_load_i64 when is_int, else kiln_nn_load_f64: the operand buffers of the exact-integer and the
 * double paths of MatMul, Gemm and Einsum. */
void *kiln_nn_load_num(const kiln_value *v, bool is_int);
/* Element idx of a per-tensor (one element) or per-axis parameter such as a scale. */
double kiln_nn_param_f64(const kiln_value *v, int64_t idx);
int64_t kiln_nn_param_i64(const kiln_value *v, int64_t idx);
/* Whether an optional per-tensor/per-axis parameter v has 1 or `len` elements (NULL is fine). */
bool kiln_nn_param_ok(const kiln_value *v, int64_t len);
/* a_scale * b_scale / y_scale computed in the precision of the scales' dtype dt, as the ONNX
 * reference does (the integer accumulator is then multiplied in double). */
double kiln_nn_requant_scale(kiln_dtype dt, double a_scale, double b_scale, double y_scale);
/* y[i] = round-half-even(v) + zp saturated to the range of y's 8/16-bit integer dtype. */
void kiln_nn_store_quantized(kiln_value *y, int64_t i, double v, int64_t zp);

/* Row-major matrix product y[M x N] = a * b, a and b read through element strides; the i64
 * form wraps modulo 2^64 (exact for every integer type). */
void kiln_nn_gemm_f64(int64_t M, int64_t N, int64_t K, const double *a, int64_t sam, int64_t sak, const double *b,
                 int64_t sbk, int64_t sbn, double *y);
void kiln_nn_gemm_i64(int64_t M, int64_t N, int64_t K, const int64_t *a, int64_t sam, int64_t sak, const int64_t *b,
                 int64_t sbk, int64_t sbn, int64_t *y);

kiln_status kiln_nn_conv_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_conv_run(kiln_run_ctx *c);
kiln_status kiln_nn_conv_transpose_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_conv_transpose_run(kiln_run_ctx *c);
kiln_status kiln_nn_conv_integer_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_conv_integer_run(kiln_run_ctx *c);
kiln_status kiln_nn_qlinear_conv_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_qlinear_conv_run(kiln_run_ctx *c);
kiln_status kiln_nn_deform_conv_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_deform_conv_run(kiln_run_ctx *c);

kiln_status kiln_nn_pool_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_average_pool_run(kiln_run_ctx *c);
kiln_status kiln_nn_max_pool_run(kiln_run_ctx *c);
kiln_status kiln_nn_lp_pool_run(kiln_run_ctx *c);
kiln_status kiln_nn_global_pool_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_global_average_pool_run(kiln_run_ctx *c);
kiln_status kiln_nn_global_max_pool_run(kiln_run_ctx *c);
kiln_status kiln_nn_global_lp_pool_run(kiln_run_ctx *c);
kiln_status kiln_nn_max_unpool_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_max_unpool_run(kiln_run_ctx *c);

/* Output 0 of dtype dt shaped as numpy matmul of inputs ai and bi (K checked equal). */
kiln_status kiln_nn_matmul_shape(kiln_infer_ctx *c, int ai, int bi, kiln_dtype dt);
kiln_status kiln_nn_matmul_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_matmul_run(kiln_run_ctx *c);
kiln_status kiln_nn_matmul_integer_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_matmul_integer_run(kiln_run_ctx *c);
kiln_status kiln_nn_qlinear_matmul_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_qlinear_matmul_run(kiln_run_ctx *c);
kiln_status kiln_nn_gemm_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_gemm_run(kiln_run_ctx *c);

kiln_status kiln_nn_einsum_infer(kiln_infer_ctx *c);
kiln_status kiln_nn_einsum_run(kiln_run_ctx *c);

#endif
