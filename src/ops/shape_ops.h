/* shape_ops.h - internals of the shape family (src/ops/shape*.c): element copies over strided
 * views, integer-vector arguments read the same way at compile and run time, symbolic-dim
 * helpers, and the ops each file contributes to the table in shape.c. */
#ifndef KILN_OPS_SHAPE_OPS_H
#define KILN_OPS_SHAPE_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

/* Longest integer vector (shape, starts, pads, ...) whose content is tracked. */
#define KILN_SHAPE_VEC_MAX 64
/* Highest rank of a strided copy: ops view their tensors with up to two axes per dim. */
#define KILN_SHAPE_VIEW_RANK (2 * KILN_MAX_RANK)

/* Content of an integer vector argument: each entry constant or (compile time) symbolic. */
typedef struct kiln_shape_vec {
    bool present; /* the input/attribute is given */
    bool known;   /* its content is known (at run time: unless it is not a valid vector) */
    int n;
    kiln_dim v[KILN_SHAPE_VEC_MAX];
} kiln_shape_vec;

/* Either side of an op: ic at compile/run-time inference, rc in the kernel (exactly one set).
 * Lets argument parsing be written once for inference and kernel. */
typedef struct kiln_shape_side {
    kiln_infer_ctx *ic;
    kiln_run_ctx *rc;
} kiln_shape_side;

const kiln_node *kiln_shape_node(const kiln_shape_side *s);
int kiln_shape_opset(const kiln_shape_side *s);
/* The symbolic dim table at compile time; NULL at run time and in kernels. */
kiln_dimtab *kiln_shape_tab(const kiln_shape_side *s);
/* Integer content of input i (0-D or 1-D). Absent input: present = false. A non-integer or
 * over-long input: known = false. */
void kiln_shape_in_vec(const kiln_shape_side *s, int i, kiln_shape_vec *v);
/* Integer list attribute `name` as a vector (present = false when absent). */
void kiln_shape_attr_vec(const kiln_node *n, const char *name, kiln_shape_vec *v);
/* Length of 1-D input `in` from its static type (at most KILN_MAX_RANK), or -1. */
int kiln_shape_static_len(kiln_infer_ctx *c, int in);
/* Fails on either side with a message prefixed by the node. */
kiln_status kiln_shape_fail(const kiln_shape_side *s, kiln_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Provably >= 0: constants >= 0 and expressions built from symbols (which are dims) with
 * non-negative coefficients. */
bool kiln_shape_nonneg(kiln_dim d);
/* kiln_dim_min / kiln_dim_max that also simplify when the difference is provably signed. */
kiln_dim kiln_shape_min(kiln_dimtab *t, kiln_dim a, kiln_dim b);
kiln_dim kiln_shape_max(kiln_dimtab *t, kiln_dim a, kiln_dim b);
/* ceil(a / b) for a constant b > 0, in the form floor((a + b - 1) / b) (which keeps a
 * non-negative a visibly non-negative). */
kiln_dim kiln_shape_ceildiv(kiln_dimtab *t, kiln_dim a, int64_t b);
/* Product of dims[0..n). */
kiln_dim kiln_shape_prod(kiln_dimtab *t, int n, const kiln_dim *dims);

/* kiln_infer_set_out, with dims that symbolic arithmetic could not express replaced by fresh
 * symbols at compile time. */
kiln_status kiln_shape_set_out(kiln_infer_ctx *c, int i, kiln_dtype dt, int rank, kiln_dim *dims);
/* For arguments whose content is unknown: at compile time output i gets dtype dt, the given
 * rank (unknown when < 0) and fresh dims; at run time (where content is always known, so the
 * argument is invalid) it fails. */
kiln_status kiln_shape_set_out_fresh(kiln_infer_ctx *c, int i, kiln_dtype dt, int rank);
/* Records output i's content when it is an integer vector of known entries (shape arithmetic);
 * a no-op otherwise and at run time. */
kiln_status kiln_shape_set_out_vec(kiln_infer_ctx *c, int i, kiln_dtype dt, int n, const kiln_dim *v);

/* Copies n contiguous elements x[xi..] to y[yi..] (strings are duplicated). */
kiln_status kiln_shape_copy(kiln_run_ctx *c, kiln_value *y, int64_t yi, const kiln_value *x, int64_t xi,
                            int64_t n);
/* Copies the block `dims` (rank <= KILN_SHAPE_VIEW_RANK): element at multi-index i goes from
 * x[xo + sum(i * xs)] to y[yo + sum(i * ys)]. Strides in elements; x strides may be 0 or
 * negative. */
kiln_status kiln_shape_copy_view(kiln_run_ctx *c, kiln_value *y, int64_t yo, const int64_t *ys,
                                 const kiln_value *x, int64_t xo, const int64_t *xs, int rank,
                                 const int64_t *dims);
/* Sets every element of y to element 0 of v (same dtype). */
kiln_status kiln_shape_fill(kiln_run_ctx *c, kiln_value *y, const kiln_value *v);
/* Kernel of ops whose output is the input's elements in order (Reshape, Squeeze, ...). */
kiln_status kiln_shape_copy_run(kiln_run_ctx *c);

#define KILN_SHAPE_OP(name)                                   \
    kiln_status kiln_shape_##name##_infer(kiln_infer_ctx *c); \
    kiln_status kiln_shape_##name##_run(kiln_run_ctx *c);

/* shape_move.c */
KILN_SHAPE_OP(transpose)
KILN_SHAPE_OP(concat)
KILN_SHAPE_OP(split)
KILN_SHAPE_OP(slice)
KILN_SHAPE_OP(expand)
KILN_SHAPE_OP(tile)
KILN_SHAPE_OP(depth_to_space)
KILN_SHAPE_OP(space_to_depth)
/* shape_pad.c */
KILN_SHAPE_OP(pad)
KILN_SHAPE_OP(center_crop_pad)
/* shape_gen.c */
KILN_SHAPE_OP(constant_of_shape)
KILN_SHAPE_OP(range)
KILN_SHAPE_OP(trilu)
KILN_SHAPE_OP(eye_like)

#undef KILN_SHAPE_OP

#endif
