/* index_layout.c - Index ops that place elements by position: OneHot, ReverseSequence, Col2Im. */
#include <string.h>

#include "ops/index_internal.h"
#include "ops/util.h"

/* ---- OneHot: Y has a new axis of size depth; Y[..., d, ...] = values[indices[...] == d] ---- */

/* The depth input as an integer (it may hold a float). */
static int64_t depth_of(const kiln_value *v)
{
    if (kiln_dtype_is_float(v->dtype)) return (int64_t)kiln_load_f64(v->dtype, v->data, 0);
    return kiln_load_i64(v->dtype, v->data, 0);
}

static bool numeric(kiln_dtype dt) { return kiln_dtype_is_int(dt) || kiln_dtype_is_float(dt); }

kiln_status kiln_index_onehot_infer(kiln_infer_ctx *c)
{
    const kiln_type *ind = kiln_infer_in(c, 0), *depth = kiln_infer_in(c, 1), *vals = kiln_infer_in(c, 2);
    const kiln_value *dv = kiln_infer_in_value(c, 1);
    if (!ind || !depth || !vals) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs indices, depth and values");
    if (vals->rank != 1)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "values must be 1-D [off, on], has rank %d", vals->rank);
    KILN_TRY(kiln_infer_require_equal(c, vals->dims[0], kiln_dim_const(2), "values length"));
    if (depth->rank > 1)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "depth must be a scalar or 1-element vector");
    if (!numeric(ind->dtype) || !numeric(depth->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "indices (%s) and depth (%s) must be numeric",
                               kiln_dtype_name(ind->dtype), kiln_dtype_name(depth->dtype));
    int axis;
    KILN_TRY(kiln_index_infer_axis(c, -1, ind->rank + 1, &axis));
    kiln_dim d[1];
    int nd = 0;
    if (dv && dv->numel == 1)
        d[0] = kiln_dim_const(depth_of(dv));
    else if (!kiln_infer_in_dims_value(c, 1, d, 1, &nd) || nd != 1)
        d[0] = kiln_infer_fresh(c, "depth");
    if (kiln_dim_is_const(d[0]) && d[0].c < 0)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "depth %lld is negative", (long long)d[0].c);
    kiln_dim dims[KILN_MAX_RANK + 1];
    for (int k = 0, j = 0; k <= ind->rank; k++) dims[k] = k == axis ? d[0] : ind->dims[j++];
    return kiln_infer_set_out(c, 0, vals->dtype, ind->rank + 1, dims);
}

kiln_status kiln_index_onehot_run(kiln_run_ctx *c)
{
    const kiln_value *ind = kiln_run_in(c, 0), *depth = kiln_run_in(c, 1), *vals = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    if (depth->numel != 1)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "depth has %lld elements, not 1", (long long)depth->numel);
    int axis = kiln_index_run_axis(c, -1, ind->rank + 1);
    int64_t d = depth_of(depth), outer = kiln_index_prod(ind->dims, 0, axis);
    int64_t inner = kiln_index_prod(ind->dims, axis, ind->rank);
    bool float_ind = kiln_dtype_is_float(ind->dtype);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t e = 0; e < inner; e++) {
            int64_t i = o * inner + e;
            /* out-of-range indices give a row of all `off` */
            int64_t hot = float_ind ? (int64_t)kiln_load_f64(ind->dtype, ind->data, i)
                                    : kiln_load_i64(ind->dtype, ind->data, i);
            if (hot < 0) hot += d;
            for (int64_t k = 0; k < d; k++)
                KILN_TRY(kiln_index_copy(y, (o * d + k) * inner + e, vals, k == hot, 1, kiln_run_err(c)));
        }
    return KILN_OK;
}

/* ---- ReverseSequence: reverses the first sequence_lens[b] steps of each batch entry ---- */

kiln_status kiln_index_reverse_sequence_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *lens = kiln_infer_in(c, 1);
    const kiln_node *n = kiln_infer_node(c);
    int64_t ba = kiln_attr_int(n, "batch_axis", 1), ta = kiln_attr_int(n, "time_axis", 0);
    if (!x || !lens) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input and sequence_lens");
    if (x->rank < 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "input needs rank >= 2, has %d", x->rank);
    if (!((ba == 0 && ta == 1) || (ba == 1 && ta == 0)))
        return kiln_infer_fail(c, KILN_ERR_MODEL,
                               "batch_axis %lld and time_axis %lld must be 0 and 1 in some order",
                               (long long)ba, (long long)ta);
    if (lens->rank != 1 || !kiln_dtype_is_int(lens->dtype))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "sequence_lens must be a 1-D integer tensor");
    KILN_TRY(kiln_infer_require_equal(c, lens->dims[0], x->dims[ba], "sequence_lens length and batch size"));
    return kiln_infer_same_as_input(c, 0, 0);
}

kiln_status kiln_index_reverse_sequence_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *lens = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    bool time_first = kiln_attr_int(kiln_run_node(c), "time_axis", 0) == 0;
    int64_t nb = x->dims[time_first ? 1 : 0], nt = x->dims[time_first ? 0 : 1];
    int64_t inner = kiln_index_prod(x->dims, 2, x->rank);
    for (int64_t b = 0; b < nb; b++) {
        int64_t len = kiln_load_i64(lens->dtype, lens->data, b);
        if (len < 0 || len > nt)
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "sequence_lens[%lld] = %lld is outside [0, %lld]",
                                 (long long)b, (long long)len, (long long)nt);
        for (int64_t t = 0; t < nt; t++) {
            int64_t s = t < len ? len - 1 - t : t;
            int64_t dst = time_first ? t * nb + b : b * nt + t, src = time_first ? s * nb + b : b * nt + s;
            KILN_TRY(kiln_index_copy(y, dst * inner, x, src * inner, inner, kiln_run_err(c)));
        }
    }
    return KILN_OK;
}

/* ---- Col2Im: input [N, C * prod(block_shape), L] -> [N, C, *image_shape], summing the
 * column entries that land on the same image element ---- */

enum { COL2IM_MAX = KILN_MAX_RANK - 2 };

/* strides, dilations (defaults 1) and pads (default 0) for s spatial dims. */
static bool col2im_attrs(const kiln_node *n, int s, int64_t *strides, int64_t *dil, int64_t *pads)
{
    int ns, nd, np;
    const int64_t *as = kiln_attr_ints(n, "strides", &ns), *ad = kiln_attr_ints(n, "dilations", &nd);
    const int64_t *ap = kiln_attr_ints(n, "pads", &np);
    if ((as && ns != s) || (ad && nd != s) || (ap && np != 2 * s)) return false;
    for (int k = 0; k < s; k++) {
        strides[k] = as ? as[k] : 1;
        dil[k] = ad ? ad[k] : 1;
        pads[k] = ap ? ap[k] : 0;
        pads[s + k] = ap ? ap[s + k] : 0;
        if (strides[k] < 1 || dil[k] < 1 || pads[k] < 0 || pads[s + k] < 0) return false;
    }
    return true;
}

kiln_status kiln_index_col2im_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *img = kiln_infer_in(c, 1), *blk = kiln_infer_in(c, 2);
    kiln_dimtab *tab = kiln_infer_dims(c);
    if (!x || !img || !blk)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input, image_shape and block_shape");
    if (x->rank != 3)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "input must be [N, C*K, L], has rank %d", x->rank);
    if (img->rank != 1 || blk->rank != 1 || !kiln_dim_is_const(img->dims[0]))
        return kiln_infer_fail(c, KILN_ERR_SHAPE,
                               "image_shape and block_shape must be 1-D of a known length");
    if (!kiln_dtype_is_int(img->dtype) || !kiln_dtype_is_int(blk->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "image_shape and block_shape must be integer tensors");
    int s = (int)img->dims[0].c;
    int64_t strides[COL2IM_MAX], dil[COL2IM_MAX], pads[2 * COL2IM_MAX];
    if (s < 1 || s > COL2IM_MAX) return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "%d spatial dims", s);
    KILN_TRY(kiln_infer_require_equal(c, blk->dims[0], img->dims[0], "block_shape and image_shape lengths"));
    if (!col2im_attrs(kiln_infer_node(c), s, strides, dil, pads))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "strides, dilations or pads have a wrong length or value");
    kiln_dim dims[KILN_MAX_RANK], blocks[COL2IM_MAX];
    int n;
    dims[0] = x->dims[0];
    dims[1] = kiln_infer_fresh(c, "channels");
    if (kiln_infer_in_dims_value(c, 2, blocks, COL2IM_MAX, &n) && n == s) {
        kiln_dim k = kiln_dim_const(1);
        for (int j = 0; j < s; j++) k = kiln_dim_mul(tab, k, blocks[j]);
        if (kiln_dim_is_const(k) && k.c < 1)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "block_shape has a dim < 1");
        dims[1] = kiln_dim_floordiv(tab, x->dims[1], k);
    }
    if (!kiln_infer_in_dims_value(c, 1, dims + 2, COL2IM_MAX, &n) || n != s)
        for (int j = 0; j < s; j++) dims[2 + j] = kiln_infer_fresh(c, "image");
    return kiln_infer_set_out(c, 0, x->dtype, 2 + s, dims);
}

kiln_status kiln_index_col2im_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *img = kiln_run_in(c, 1), *blk = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    int s = (int)img->numel;
    int64_t strides[COL2IM_MAX], dil[COL2IM_MAX], pads[2 * COL2IM_MAX], im[COL2IM_MAX], bl[COL2IM_MAX];
    int64_t cols[COL2IM_MAX], kernel = 1, n_cols = 1, image = 1;
    col2im_attrs(kiln_run_node(c), s, strides, dil, pads);
    for (int j = 0; j < s; j++) {
        im[j] = kiln_load_i64(img->dtype, img->data, j);
        bl[j] = kiln_load_i64(blk->dtype, blk->data, j);
        if (bl[j] < 1 || im[j] < 0)
            return kiln_run_fail(c, KILN_ERR_SHAPE,
                                 "block dim %lld or image dim %lld at spatial axis %d is invalid",
                                 (long long)bl[j], (long long)im[j], j);
        cols[j] = (im[j] + pads[j] + pads[s + j] - dil[j] * (bl[j] - 1) - 1) / strides[j] + 1;
        if (cols[j] < 1)
            return kiln_run_fail(c, KILN_ERR_SHAPE,
                                 "block %lld does not fit image dim %lld (+ pads) at spatial axis %d",
                                 (long long)bl[j], (long long)im[j], j);
        kernel *= bl[j];
        n_cols *= cols[j];
        image *= im[j];
    }
    int64_t batch = x->dims[0], ch = y->dims[1];
    if (x->dims[1] != ch * kernel || x->dims[2] != n_cols)
        return kiln_run_fail(c, KILN_ERR_SHAPE,
                             "input [%lld, %lld, %lld] does not match %lld channels x %lld kernel "
                             "elements and %lld blocks",
                             (long long)x->dims[0], (long long)x->dims[1], (long long)x->dims[2],
                             (long long)ch, (long long)kernel, (long long)n_cols);
    for (int64_t nc = 0; nc < batch * ch; nc++)
        for (int64_t kc = 0; kc < kernel; kc++)
            for (int64_t col = 0; col < n_cols; col++) {
                /* image position of kernel element kc in block col, spatial dims row-major */
                int64_t yi = 0, kr = kc, cr = col, scale = 1;
                bool inside = true;
                for (int j = s - 1; j >= 0; j--) {
                    int64_t p = cr % cols[j] * strides[j] - pads[j] + kr % bl[j] * dil[j];
                    inside = inside && p >= 0 && p < im[j];
                    yi += p * scale;
                    scale *= im[j];
                    kr /= bl[j];
                    cr /= cols[j];
                }
                if (!inside) continue;
                int64_t xi = (nc * kernel + kc) * n_cols + col;
                yi += nc * image;
                kiln_store_f64(y->dtype, y->data, yi,
                               kiln_load_f64(y->dtype, y->data, yi) + kiln_load_f64(x->dtype, x->data, xi));
            }
    return KILN_OK;
}
