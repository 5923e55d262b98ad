/* shape_pad.c - Pad (constant, reflect, edge, wrap; negative pads crop) and CenterCropPad. */
#include <string.h>

#include "ops/shape_ops.h"
#include "ops/util.h"

typedef enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP } pad_mode;

static kiln_status pad_mode_arg(const kiln_shape_side *s, pad_mode *m)
{
    static const char *const names[] = {"constant", "reflect", "edge", "wrap"};
    const char *mode = kiln_attr_string(kiln_shape_node(s), "mode", "constant");
    for (int i = 0; i < 4; i++)
        if (!strcmp(mode, names[i])) {
            *m = (pad_mode)i;
            return KILN_OK;
        }
    return kiln_shape_fail(s, KILN_ERR_MODEL, "unknown mode '%s'", mode);
}

/* Pads at the beginning and end of each axis: attribute `paddings` (opset 1), `pads` (2-10),
 * input 1 from 11, optionally restricted to input 3's axes from 18. fresh[k] marks axes whose
 * pads are unknown at compile time. */
static kiln_status pad_plan(const kiln_shape_side *s, int rank, kiln_dim *begin, kiln_dim *end, bool *fresh)
{
    int opset = kiln_shape_opset(s);
    const kiln_node *node = kiln_shape_node(s);
    kiln_shape_vec pads, axes = {.present = false};
    if (opset < 11)
        kiln_shape_attr_vec(node, opset < 2 ? "paddings" : "pads", &pads);
    else
        kiln_shape_in_vec(s, 1, &pads);
    if (opset >= 18) kiln_shape_in_vec(s, 3, &axes);
    if (!pads.present) return kiln_shape_fail(s, KILN_ERR_MODEL, "pads are missing");
    for (int k = 0; k < rank; k++) {
        begin[k] = end[k] = kiln_dim_const(0);
        fresh[k] = false;
    }
    bool axes_known = !axes.present || axes.known;
    for (int i = 0; axes.present && axes.known && i < axes.n; i++)
        axes_known = axes_known && kiln_dim_is_const(axes.v[i]);
    if (!pads.known || !axes_known) {
        for (int k = 0; k < rank; k++) fresh[k] = !axes_known || !axes.present;
        for (int i = 0; axes.present && axes_known && i < axes.n; i++) {
            int a;
            if (kiln_axis_norm(axes.v[i].c, rank, &a)) fresh[a] = true;
        }
        return KILN_OK;
    }
    int n = axes.present ? axes.n : rank;
    if (pads.n != 2 * n) return kiln_shape_fail(s, KILN_ERR_MODEL, "%d pads for %d axes", pads.n, n);
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
        int a = i;
        if (axes.present && !kiln_axis_norm(axes.v[i].c, rank, &a))
            return kiln_shape_fail(s, KILN_ERR_MODEL, "axis %lld out of range for rank %d",
                                   (long long)axes.v[i].c, rank);
        if (seen[a]) return kiln_shape_fail(s, KILN_ERR_MODEL, "axis %d repeated", a);
        seen[a] = true;
        begin[a] = pads.v[i];
        end[a] = pads.v[n + i];
    }
    return KILN_OK;
}

kiln_status kiln_shape_pad_infer(kiln_infer_ctx *c)
{
    kiln_dimtab *t = kiln_infer_dims(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_side s = {.ic = c};
    pad_mode mode = PAD_CONSTANT;
    KILN_TRY(pad_mode_arg(&s, &mode));
    kiln_dim begin[KILN_MAX_RANK], end[KILN_MAX_RANK], dims[KILN_MAX_RANK];
    bool fresh[KILN_MAX_RANK];
    KILN_TRY(pad_plan(&s, x->rank, begin, end, fresh));
    for (int k = 0; k < x->rank; k++) {
        dims[k] =
            fresh[k] ? kiln_dim_unknown() : kiln_dim_add(t, x->dims[k], kiln_dim_add(t, begin[k], end[k]));
        if (kiln_dim_is_const(dims[k]) && dims[k].c < 0)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "axis %d: pads %lld, %lld make dim %lld negative", k,
                                   (long long)begin[k].c, (long long)end[k].c, (long long)x->dims[k].c);
        if (mode != PAD_CONSTANT && kiln_dim_is_const(x->dims[k]) && x->dims[k].c == 0 &&
            kiln_dim_is_const(dims[k]) && dims[k].c > 0)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "axis %d is empty: nothing to pad from in this mode",
                                   k);
    }
    return kiln_shape_set_out(c, 0, x->dtype, x->rank, dims);
}

/* Fills every element of y with the pad value: input 2 (opset 11+; default zero) or the
 * float attribute `value`. */
static kiln_status pad_fill(kiln_run_ctx *c, kiln_value *y)
{
    const kiln_value *cv = kiln_run_opset(c) >= 11 ? kiln_run_in(c, 2) : NULL;
    unsigned char buf[16] = {0};
    kiln_value one = {.kind = KILN_VALUE_TENSOR, .dtype = y->dtype, .numel = 1, .data = buf};
    if (cv) {
        if (cv->kind != KILN_VALUE_TENSOR || cv->dtype != y->dtype || cv->numel < 1)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "constant_value must be one %s element",
                                 kiln_dtype_name(y->dtype));
    } else {
        float v = kiln_run_opset(c) < 11 ? kiln_attr_float(kiln_run_node(c), "value", 0.0f) : 0.0f;
        if (v == 0.0f || y->dtype == KILN_DTYPE_STRING) return KILN_OK; /* outputs start zeroed */
        kiln_store_f64(y->dtype, buf, 0, v);
        cv = &one;
    }
    return kiln_shape_fill(c, y, cv);
}

/* Source index along an axis of length n for padded position i (i < 0 or >= n). */
static int64_t pad_source(pad_mode mode, int64_t i, int64_t n)
{
    if (mode == PAD_EDGE) return i < 0 ? 0 : n - 1;
    if (mode == PAD_WRAP) return ((i % n) + n) % n;
    if (n == 1) return 0;
    int64_t p = 2 * (n - 1);
    i = ((i % p) + p) % p;
    return i < n ? i : p - i;
}

kiln_status kiln_shape_pad_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    kiln_shape_side s = {.rc = c};
    pad_mode mode = PAD_CONSTANT;
    KILN_TRY(pad_mode_arg(&s, &mode));
    int r = x->rank;
    kiln_dim begin[KILN_MAX_RANK], end[KILN_MAX_RANK];
    bool fresh[KILN_MAX_RANK];
    KILN_TRY(pad_plan(&s, r, begin, end, fresh));
    /* negative pads crop first: x's kept window on axis k is [lo, lo + len), placed at pb; a
     * non-empty window fits in y (pb + len <= y dim) */
    int64_t lo[KILN_MAX_RANK], len[KILN_MAX_RANK], pb[KILN_MAX_RANK], xs[KILN_MAX_RANK], ys[KILN_MAX_RANK];
    int64_t xo = 0, yo = 0;
    bool empty = false;
    kiln_strides(r, x->dims, xs);
    kiln_strides(r, y->dims, ys);
    for (int k = 0; k < r; k++) {
        int64_t d = x->dims[k], b = begin[k].c, e = end[k].c;
        lo[k] = b < 0 ? (b < -d ? d : -b) : 0;
        pb[k] = b > 0 ? b : 0;
        len[k] = d - lo[k] - (e < 0 ? (e < -d ? d : -e) : 0);
        if (len[k] <= 0) {
            len[k] = 0;
            empty = true;
        }
        if (len[k] == 0 && y->dims[k] > 0 && mode != PAD_CONSTANT)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "axis %d is empty: nothing to pad from in this mode", k);
    }
    for (int k = 0; !empty && k < r; k++) {
        xo += lo[k] * xs[k];
        yo += pb[k] * ys[k];
    }
    if (mode == PAD_CONSTANT) {
        KILN_TRY(pad_fill(c, y));
        return empty ? KILN_OK : kiln_shape_copy_view(c, y, yo, ys, x, xo, xs, r, len);
    }
    int64_t idx[KILN_MAX_RANK] = {0};
    for (int64_t i = 0; i < y->numel; i++) {
        int64_t src = 0;
        for (int k = 0; k < r; k++) {
            int64_t j = idx[k] - pb[k];
            if (j < 0 || j >= len[k]) j = pad_source(mode, j, len[k]);
            src += (lo[k] + j) * xs[k];
        }
        KILN_TRY(kiln_shape_copy(c, y, i, x, src, 1));
        for (int k = r - 1; k >= 0 && ++idx[k] == y->dims[k]; k--) idx[k] = 0;
    }
    return KILN_OK;
}

/* ---- CenterCropPad ---- */

/* Target sizes per axis from input 1 (on the axes attribute's axes); fresh when unknown. */
static kiln_status crop_plan(const kiln_shape_side *s, int rank, const kiln_dim *in, kiln_dim *out,
                             bool *fresh)
{
    const kiln_node *node = kiln_shape_node(s);
    kiln_shape_vec shape, axes;
    kiln_shape_in_vec(s, 1, &shape);
    kiln_shape_attr_vec(node, "axes", &axes);
    int n = axes.present ? axes.n : rank;
    for (int k = 0; k < rank; k++) {
        out[k] = in[k];
        fresh[k] = false;
    }
    if (!shape.present) return kiln_shape_fail(s, KILN_ERR_MODEL, "shape is missing");
    if (shape.known && shape.n != n)
        return kiln_shape_fail(s, KILN_ERR_MODEL, "shape has %d entries for %d axes", shape.n, n);
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
        int a = i;
        if (axes.present && !kiln_axis_norm(axes.v[i].c, rank, &a))
            return kiln_shape_fail(s, KILN_ERR_MODEL, "axis %lld out of range for rank %d",
                                   (long long)axes.v[i].c, rank);
        if (a >= rank) return kiln_shape_fail(s, KILN_ERR_MODEL, "%d axes for rank %d", n, rank);
        if (seen[a]) return kiln_shape_fail(s, KILN_ERR_MODEL, "axis %d repeated", a);
        seen[a] = true;
        if (!shape.known) {
            fresh[a] = true;
            continue;
        }
        if (kiln_dim_is_const(shape.v[i]) && shape.v[i].c < 0)
            return kiln_shape_fail(s, KILN_ERR_MODEL, "shape entry %d is %lld", i, (long long)shape.v[i].c);
        out[a] = shape.v[i];
    }
    return KILN_OK;
}

kiln_status kiln_shape_center_crop_pad_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_side s = {.ic = c};
    kiln_dim dims[KILN_MAX_RANK];
    bool fresh[KILN_MAX_RANK];
    KILN_TRY(crop_plan(&s, x->rank, x->dims, dims, fresh));
    for (int k = 0; k < x->rank; k++)
        if (fresh[k]) dims[k] = kiln_dim_unknown();
    return kiln_shape_set_out(c, 0, x->dtype, x->rank, dims);
}

kiln_status kiln_shape_center_crop_pad_run(kiln_run_ctx *c)
{
    /* the output starts zeroed: copy the centred overlap of x and y */
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int64_t xs[KILN_MAX_RANK], ys[KILN_MAX_RANK], n[KILN_MAX_RANK], xo = 0, yo = 0;
    kiln_strides(x->rank, x->dims, xs);
    kiln_strides(y->rank, y->dims, ys);
    for (int k = 0; k < x->rank; k++) {
        int64_t d = x->dims[k], t = y->dims[k];
        if (t < d)
            xo += (d - t) / 2 * xs[k];
        else
            yo += (t - d) / 2 * ys[k];
        n[k] = t < d ? t : d;
    }
    return kiln_shape_copy_view(c, y, yo, ys, x, xo, xs, x->rank, n);
}
