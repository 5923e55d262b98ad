/* resize.h - Resize/Upsample attributes, output planning and nearest source indices, shared by
 * the reference kernel (src/ops/image.c), the GPU kernel (src/gpu/ops_cnn.c), the CPU's kernels
 * (src/cpu/kernels_resize.c, the blocked one in src/cpu/kernels_nchwc.c) and the layout pass
 * (src/passes/layout_nchwc.c), which must resize identically.
 * The mode enums also reach kernel sources (C++): they are plain constants. */
#ifndef KILN_OPS_RESIZE_H
#define KILN_OPS_RESIZE_H

enum { KILN_RESIZE_NEAREST, KILN_RESIZE_LINEAR, KILN_RESIZE_CUBIC };
/* coordinate_transformation_mode */
enum {
    KILN_RESIZE_CT_HALF_PIXEL,
    KILN_RESIZE_CT_HALF_PIXEL_SYM,
    KILN_RESIZE_CT_PYTORCH_HALF_PIXEL,
    KILN_RESIZE_CT_ALIGN_CORNERS,
    KILN_RESIZE_CT_ASYMMETRIC,
    KILN_RESIZE_CT_TF_HALF_PIXEL_NN,
    KILN_RESIZE_CT_TF_CROP
};
/* nearest_mode */
enum { KILN_RESIZE_NR_PREFER_FLOOR, KILN_RESIZE_NR_PREFER_CEIL, KILN_RESIZE_NR_FLOOR, KILN_RESIZE_NR_CEIL };
/* keep_aspect_ratio_policy */
enum { KILN_RESIZE_KA_STRETCH, KILN_RESIZE_KA_NOT_LARGER, KILN_RESIZE_KA_NOT_SMALLER };

#ifndef __cplusplus
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/op.h"

typedef struct kiln_resize_attrs {
    int mode, ct, nr, ka;
    double cubic_a, extrapolation;
    bool exclude_outside, antialias;
    int n_axes;
    int axes[KILN_MAX_RANK];         /* resized axes, in the order of scales / sizes / roi entries */
    int scales_in, sizes_in, roi_in; /* input indices; -1: not an input of this version */
    const float *scales_attr;        /* Upsample-7: scales as attribute */
    int n_scales_attr;
} kiln_resize_attrs;

/* Reads the attributes of Resize/Upsample at `opset` for an input of rank `rank` (rank < 0:
 * unknown, the axes are not read); on a bad attribute writes a message to msg and returns
 * false. */
bool kiln_resize_parse(const kiln_node *n, int opset, int rank, kiln_resize_attrs *a, char *msg, size_t msz);
/* Exact output dims and per-axis scales for input dims `in`. scales / sizes: the values of
 * those inputs (the one in use; both NULL for Upsample-7's attribute). */
kiln_status kiln_resize_plan(const kiln_resize_attrs *a, int rank, const int64_t *in, const kiln_value *scales,
                             const kiln_value *sizes, int64_t *out, double *scale, char *msg, size_t msz);
/* The source index of each output index along one axis of a nearest resize other than
 * tf_crop_and_resize, as the reference kernel gathers it: idx [out_n] from in_n input indices at
 * the axis' scale (kiln_resize_plan's); j itself where out_n == in_n and scale is 1 (the axis
 * is left as it is). */
void kiln_resize_nearest_index(const kiln_resize_attrs *a, double scale, int64_t in_n, int64_t out_n, int64_t *idx);
/* The two taps of each output index along one axis of a linear resize (not antialiased, not
 * tf_crop_and_resize), as the reference kernel weighs them: source indices i0, i1 (clamped into
 * the input) and weights w0, w1, each [out_n]. */
void kiln_resize_linear_taps(const kiln_resize_attrs *a, double scale, int64_t in_n, int64_t out_n, int64_t *i0,
                             int64_t *i1, float *w0, float *w1);
#endif

#endif
