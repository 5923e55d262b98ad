/* shape_move.c - ops that move elements between layouts: Transpose, Concat, Split, Slice,
 * Expand, Tile, DepthToSpace, SpaceToDepth. */
#include <stdio.h>
#include <string.h>

#include "ops/shape_ops.h"
#include "ops/semantics.h"
#include "ops/util.h"

/* Writes y (row-major) as x viewed with dims xdims transposed by perm: y's axis k is x's axis
 * perm[k]. */
static kiln_status permuted_copy(kiln_run_ctx *c, kiln_value *y, const kiln_value *x, int rank,
                                 const int64_t *xdims, const int *perm)
{
    int64_t xs[KILN_MAX_RANK], vs[KILN_MAX_RANK], ys[KILN_MAX_RANK], dims[KILN_MAX_RANK];
    kiln_strides(rank, xdims, xs);
    for (int k = 0; k < rank; k++) {
        dims[k] = xdims[perm[k]];
        vs[k] = xs[perm[k]];
    }
    kiln_strides(rank, dims, ys);
    return kiln_shape_copy_view(c, y, 0, ys, x, 0, vs, rank, dims);
}

/* ---- Transpose ---- */

/* perm attribute (default: reversed axes), checked to be a permutation of [0, rank). */
static kiln_status transpose_perm(const kiln_shape_side *s, int rank, int *perm)
{
    int n;
    const int64_t *p = kiln_attr_ints(kiln_shape_node(s), "perm", &n);
    if (!p) {
        for (int k = 0; k < rank; k++) perm[k] = rank - 1 - k;
        return KILN_OK;
    }
    if (n != rank) return kiln_shape_fail(s, KILN_ERR_MODEL, "perm has %d entries for rank %d", n, rank);
    bool seen[KILN_MAX_RANK] = {false};
    for (int k = 0; k < n; k++) {
        if (p[k] < 0 || p[k] >= rank || seen[p[k]])
            return kiln_shape_fail(s, KILN_ERR_MODEL, "perm is not a permutation of [0, %d)", rank);
        seen[p[k]] = true;
        perm[k] = (int)p[k];
    }
    return KILN_OK;
}

kiln_status kiln_shape_transpose_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_side s = {.ic = c};
    int perm[KILN_MAX_RANK];
    KILN_TRY(transpose_perm(&s, x->rank, perm));
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0; k < x->rank; k++) dims[k] = x->dims[perm[k]];
    return kiln_shape_set_out(c, 0, x->dtype, x->rank, dims);
}

kiln_status kiln_shape_transpose_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_shape_side s = {.rc = c};
    int perm[KILN_MAX_RANK];
    KILN_TRY(transpose_perm(&s, x->rank, perm));
    return permuted_copy(c, kiln_run_out(c, 0), x, x->rank, x->dims, perm);
}

/* ---- Concat / Split ---- */

/* The concatenation axis (default 1 before opset 4), normalized. */
static kiln_status concat_axis(const kiln_shape_side *s, int rank, int *axis)
{
    const kiln_node *n = kiln_shape_node(s);
    if (!kiln_node_attr(n, "axis") && kiln_shape_opset(s) >= 4)
        return kiln_shape_fail(s, KILN_ERR_MODEL, "attribute axis is missing");
    int64_t a = kiln_attr_int(n, "axis", 1);
    if (!kiln_axis_norm(a, rank, axis))
        return kiln_shape_fail(s, KILN_ERR_MODEL, "axis %lld out of range for rank %d", (long long)a, rank);
    return KILN_OK;
}

kiln_status kiln_shape_concat_infer(kiln_infer_ctx *c)
{
    kiln_dimtab *t = kiln_infer_dims(c);
    kiln_shape_side s = {.ic = c};
    const kiln_type *first = NULL;
    for (int i = 0; i < kiln_infer_n_in(c) && !first; i++) first = kiln_infer_in(c, i);
    if (!first) return kiln_infer_fail(c, KILN_ERR_MODEL, "no inputs");
    int axis;
    KILN_TRY(concat_axis(&s, first->rank, &axis));
    kiln_dim dims[KILN_MAX_RANK];
    memcpy(dims, first->dims, (size_t)first->rank * sizeof *dims);
    dims[axis] = kiln_dim_const(0);
    kiln_dim vec[KILN_SHAPE_VEC_MAX];
    int nvec = 0;
    bool vec_known = first->rank == 1;
    for (int i = 0; i < kiln_infer_n_in(c); i++) {
        const kiln_type *x = kiln_infer_in(c, i);
        if (!x) continue;
        if (x->rank != first->rank || x->dtype != first->dtype)
            return kiln_infer_fail(c, KILN_ERR_SHAPE,
                                   "input %d has rank %d and dtype %s, input 0 rank %d and %s", i, x->rank,
                                   kiln_dtype_name(x->dtype), first->rank, kiln_dtype_name(first->dtype));
        for (int k = 0; k < x->rank; k++) {
            if (k == axis) continue;
            char what[64];
            snprintf(what, sizeof what, "input %d dim %d", i, k);
            KILN_TRY(kiln_infer_require_equal(c, dims[k], x->dims[k], what));
            if (!kiln_dim_is_const(dims[k])) dims[k] = x->dims[k];
        }
        dims[axis] = kiln_dim_add(t, dims[axis], x->dims[axis]);
        kiln_shape_vec v;
        kiln_shape_in_vec(&s, i, &v);
        vec_known = vec_known && v.known && nvec + v.n <= KILN_SHAPE_VEC_MAX;
        if (vec_known) memcpy(vec + nvec, v.v, (size_t)v.n * sizeof *vec);
        nvec += v.n;
    }
    KILN_TRY(kiln_shape_set_out(c, 0, first->dtype, first->rank, dims));
    return vec_known ? kiln_shape_set_out_vec(c, 0, first->dtype, nvec, vec) : KILN_OK;
}

/* Elements of dims before axis (outer) and from axis on (block). */
static void split_sizes(const kiln_value *v, int axis, int64_t *outer, int64_t *block)
{
    *outer = 1;
    *block = 1;
    for (int k = 0; k < v->rank; k++) *(k < axis ? outer : block) *= v->dims[k];
}

kiln_status kiln_shape_concat_run(kiln_run_ctx *c)
{
    kiln_value *y = kiln_run_out(c, 0);
    kiln_shape_side s = {.rc = c};
    int axis;
    KILN_TRY(concat_axis(&s, y->rank, &axis));
    int64_t outer, yblock, off = 0;
    split_sizes(y, axis, &outer, &yblock);
    for (int i = 0; i < kiln_run_n_in(c); i++) {
        const kiln_value *x = kiln_run_in(c, i);
        if (!x) continue;
        int64_t xo, xblock;
        split_sizes(x, axis, &xo, &xblock);
        for (int64_t o = 0; o < outer; o++)
            KILN_TRY(kiln_shape_copy(c, y, o * yblock + off, x, o * xblock, xblock));
        off += xblock;
    }
    return KILN_OK;
}

/* The split sizes: attribute `split` before opset 13 (or input 1 in opset 1), input 1 after. */
static void split_arg(const kiln_shape_side *s, kiln_shape_vec *split)
{
    int opset = kiln_shape_opset(s);
    if (opset >= 13) {
        kiln_shape_in_vec(s, 1, split);
        return;
    }
    kiln_shape_attr_vec(kiln_shape_node(s), "split", split);
    if (!split->present && opset < 2) kiln_shape_in_vec(s, 1, split);
}

/* The axis and the n output sizes along it: split sizes when given (unknown entries when not
 * known at compile time), else equal parts (with num_outputs, or uneven constant sizes, chunks
 * of ceil(d / n) and a smaller last one). */
static kiln_status split_plan(const kiln_shape_side *s, const kiln_type *x, int n, int *axis, kiln_dim *size)
{
    kiln_dimtab *t = kiln_shape_tab(s);
    const kiln_node *node = kiln_shape_node(s);
    int64_t a = kiln_attr_int(node, "axis", 0);
    if (!kiln_axis_norm(a, x->rank, axis))
        return kiln_shape_fail(s, KILN_ERR_MODEL, "axis %lld out of range for rank %d", (long long)a,
                               x->rank);
    kiln_shape_vec split;
    split_arg(s, &split);
    const kiln_attr *num = kiln_shape_opset(s) >= 18 ? kiln_node_attr(node, "num_outputs") : NULL;
    if (num && split.present)
        return kiln_shape_fail(s, KILN_ERR_MODEL, "both split and num_outputs are given");
    if (num && num->i != n)
        return kiln_shape_fail(s, KILN_ERR_MODEL, "num_outputs is %lld but the node has %d outputs",
                               (long long)num->i, n);
    if (n > KILN_SHAPE_VEC_MAX)
        return kiln_shape_fail(s, KILN_ERR_UNSUPPORTED, "more than %d outputs", KILN_SHAPE_VEC_MAX);
    kiln_dim d = x->dims[*axis];
    if (split.present && !split.known) {
        for (int i = 0; i < n; i++) size[i] = kiln_dim_unknown();
        return KILN_OK;
    }
    if (split.present) {
        if (split.n != n)
            return kiln_shape_fail(s, KILN_ERR_MODEL, "split has %d entries for %d outputs", split.n, n);
        kiln_dim sum = kiln_dim_const(0);
        for (int i = 0; i < n; i++) {
            if (kiln_dim_is_const(split.v[i]) && split.v[i].c < 0)
                return kiln_shape_fail(s, KILN_ERR_MODEL, "split entry %d is %lld", i,
                                       (long long)split.v[i].c);
            size[i] = split.v[i];
            sum = kiln_dim_add(t, sum, size[i]);
        }
        if (kiln_dim_is_const(sum) && kiln_dim_is_const(d) && sum.c != d.c)
            return kiln_shape_fail(s, KILN_ERR_SHAPE, "split sizes sum to %lld, the axis has %lld",
                                   (long long)sum.c, (long long)d.c);
        return KILN_OK;
    }
    /* ceil(d / n) equals d / n when n divides d, so one form is right whatever d turns out */
    kiln_dim chunk = kiln_shape_ceildiv(t, d, n);
    for (int i = 0; i < n; i++) size[i] = chunk;
    size[n - 1] = kiln_dim_sub(t, d, kiln_dim_mul(t, chunk, kiln_dim_const(n - 1)));
    if (kiln_dim_is_const(size[n - 1]) && size[n - 1].c < 0)
        return kiln_shape_fail(s, KILN_ERR_SHAPE, "cannot split %lld into %d parts", (long long)d.c, n);
    return KILN_OK;
}

kiln_status kiln_shape_split_infer(kiln_infer_ctx *c)
{
    kiln_dimtab *t = kiln_infer_dims(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_side s = {.ic = c};
    int n = kiln_infer_n_out(c), axis;
    kiln_dim size[KILN_SHAPE_VEC_MAX];
    KILN_TRY(split_plan(&s, x, n, &axis, size));
    kiln_shape_vec v;
    kiln_shape_in_vec(&s, 0, &v);
    kiln_dim off = kiln_dim_const(0);
    for (int i = 0; i < n; i++) {
        kiln_dim dims[KILN_MAX_RANK];
        memcpy(dims, x->dims, (size_t)x->rank * sizeof *dims);
        dims[axis] = size[i];
        KILN_TRY(kiln_shape_set_out(c, i, x->dtype, x->rank, dims));
        if (x->rank == 1 && v.known && kiln_dim_is_const(off) && kiln_dim_is_const(size[i]) &&
            off.c + size[i].c <= v.n)
            KILN_TRY(kiln_shape_set_out_vec(c, i, x->dtype, (int)size[i].c, v.v + off.c));
        off = kiln_dim_add(t, off, size[i]);
    }
    return KILN_OK;
}

kiln_status kiln_shape_split_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_shape_side s = {.rc = c};
    kiln_type xt = {.kind = KILN_VALUE_TENSOR, .dtype = x->dtype, .rank = x->rank};
    for (int k = 0; k < x->rank; k++) xt.dims[k] = kiln_dim_const(x->dims[k]);
    int n = kiln_run_n_out(c), axis;
    kiln_dim size[KILN_SHAPE_VEC_MAX];
    KILN_TRY(split_plan(&s, &xt, n, &axis, size));
    int64_t outer, xblock, inner = 1, off = 0;
    split_sizes(x, axis, &outer, &xblock);
    for (int k = axis + 1; k < x->rank; k++) inner *= x->dims[k];
    for (int i = 0; i < n; i++) {
        int64_t yblock = size[i].c * inner;
        kiln_value *y = kiln_run_out(c, i);
        for (int64_t o = 0; y && o < outer; o++)
            KILN_TRY(kiln_shape_copy(c, y, o * yblock, x, o * xblock + off, yblock));
        off += yblock;
    }
    return KILN_OK;
}

/* ---- Slice ---- */

/* Ends at or beyond this are "to the end" whatever the (symbolic) dim: no tensor dim reaches
 * 2^48 elements. */
#define SLICE_END_MAX ((int64_t)1 << 48)

/* One sliced axis: elements start, start + step, ... (count of them). */
typedef struct slice_axis {
    kiln_dim start, count;
    int64_t step;
    bool fresh; /* arguments not known at compile time */
} slice_axis;

/* The element count of kiln_slice_clamp's clamping over symbolic values (the start itself is
 * needed only at run time); false when it cannot be expressed. A symbolic start/end must be provably
 * non-negative (it comes from shape arithmetic). The clamps that cannot change the count are
 * left out: the far side of the start and the near side of the end. */
static bool slice_sym(kiln_dimtab *t, kiln_dim d, kiln_dim s, kiln_dim e, int64_t step, slice_axis *ax)
{
    if (!kiln_shape_nonneg(s) && !kiln_dim_is_const(s)) return false;
    if (!kiln_shape_nonneg(e) && !kiln_dim_is_const(e)) return false;
    bool fwd = step > 0;
    kiln_dim lo = kiln_dim_const(fwd ? 0 : -1), hi = fwd ? d : kiln_dim_sub(t, d, kiln_dim_const(1));
    kiln_dim v[2] = {s, e};
    for (int i = 0; i < 2; i++) {
        bool far = (i == 1) == fwd; /* forward: the end, backward: the start */
        kiln_dim x = v[i];
        if (kiln_dim_is_const(x) && x.c >= SLICE_END_MAX)
            x = hi;
        else if (kiln_dim_is_const(x) && x.c <= -SLICE_END_MAX)
            x = lo;
        else if (kiln_dim_is_const(x) && x.c < 0)
            x = far ? kiln_dim_add(t, d, x) : kiln_shape_max(t, kiln_dim_add(t, d, x), lo);
        else if (far)
            x = kiln_shape_min(t, x, hi);
        v[i] = x;
    }
    kiln_dim span = fwd ? kiln_dim_sub(t, v[1], v[0]) : kiln_dim_sub(t, v[0], v[1]);
    ax->start = kiln_dim_unknown();
    /* a step beyond any dim takes one element of a non-empty span */
    int64_t k = fwd ? step : -step;
    kiln_dim q =
        k >= SLICE_END_MAX ? kiln_shape_min(t, span, kiln_dim_const(1)) : kiln_shape_ceildiv(t, span, k);
    ax->count = kiln_shape_max(t, q, kiln_dim_const(0));
    return !kiln_dim_is_unknown(ax->count);
}

/* Per-axis slice of dims from the starts/ends/axes/steps arguments (attributes before opset
 * 10, inputs 1-4 after). Axes whose arguments are unknown come back fresh. */
static kiln_status slice_plan(const kiln_shape_side *s, int rank, const kiln_dim *dims, slice_axis *ax)
{
    kiln_dimtab *t = kiln_shape_tab(s);
    const kiln_node *node = kiln_shape_node(s);
    kiln_shape_vec starts, ends, axes, steps;
    if (kiln_shape_opset(s) < 10) {
        kiln_shape_attr_vec(node, "starts", &starts);
        kiln_shape_attr_vec(node, "ends", &ends);
        kiln_shape_attr_vec(node, "axes", &axes);
        steps.present = false;
    } else {
        kiln_shape_in_vec(s, 1, &starts);
        kiln_shape_in_vec(s, 2, &ends);
        kiln_shape_in_vec(s, 3, &axes);
        kiln_shape_in_vec(s, 4, &steps);
    }
    for (int k = 0; k < rank; k++) ax[k] = (slice_axis){kiln_dim_const(0), dims[k], 1, false};
    if (!starts.present || !ends.present)
        return kiln_shape_fail(s, KILN_ERR_MODEL, "starts or ends is missing");
    bool axes_known = !axes.present || axes.known;
    for (int k = 0; axes.present && axes.known && k < axes.n; k++)
        axes_known = axes_known && kiln_dim_is_const(axes.v[k]);
    if (!axes_known || !starts.known || !ends.known || (steps.present && !steps.known)) {
        /* compile time only: unknown arguments make the affected axes fresh */
        bool all = !axes_known || !axes.present;
        for (int k = 0; k < rank; k++) ax[k].fresh = all;
        for (int k = 0; !all && k < axes.n; k++) {
            int a;
            if (kiln_axis_norm(axes.v[k].c, rank, &a)) ax[a].fresh = true;
        }
        return KILN_OK;
    }
    int n = starts.n;
    if (ends.n != n || (axes.present && axes.n != n) || (steps.present && steps.n != n))
        return kiln_shape_fail(s, KILN_ERR_MODEL,
                               "starts, ends, axes and steps have %d, %d, %d and %d entries", n, ends.n,
                               axes.present ? axes.n : n, steps.present ? steps.n : n);
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
        int a = i;
        if (axes.present && !kiln_axis_norm(axes.v[i].c, rank, &a))
            return kiln_shape_fail(s, KILN_ERR_MODEL, "axis %lld out of range for rank %d",
                                   (long long)axes.v[i].c, rank);
        if (a >= rank) return kiln_shape_fail(s, KILN_ERR_MODEL, "%d starts for rank %d", n, rank);
        if (seen[a]) return kiln_shape_fail(s, KILN_ERR_MODEL, "axis %d repeated", a);
        seen[a] = true;
        kiln_dim step = steps.present ? steps.v[i] : kiln_dim_const(1);
        if (!kiln_dim_is_const(step)) {
            ax[a].fresh = true;
            continue;
        }
        if (step.c == 0) return kiln_shape_fail(s, KILN_ERR_MODEL, "step %d is 0", i);
        /* |step| beyond any dim selects at most one element: keep it negatable */
        ax[a].step = step.c == INT64_MIN ? -INT64_MAX : step.c;
        if (kiln_dim_is_const(dims[a]) && kiln_dim_is_const(starts.v[i]) && kiln_dim_is_const(ends.v[i])) {
            int64_t st, cn;
            kiln_slice_clamp(dims[a].c, starts.v[i].c, ends.v[i].c, ax[a].step, &st, &cn);
            ax[a].start = kiln_dim_const(st);
            ax[a].count = kiln_dim_const(cn);
        } else {
            ax[a].fresh = !t || !slice_sym(t, dims[a], starts.v[i], ends.v[i], ax[a].step, &ax[a]);
        }
    }
    return KILN_OK;
}

kiln_status kiln_shape_slice_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_side s = {.ic = c};
    slice_axis ax[KILN_MAX_RANK];
    KILN_TRY(slice_plan(&s, x->rank, x->dims, ax));
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0; k < x->rank; k++) dims[k] = ax[k].fresh ? kiln_dim_unknown() : ax[k].count;
    KILN_TRY(kiln_shape_set_out(c, 0, x->dtype, x->rank, dims));
    kiln_shape_vec v;
    kiln_shape_in_vec(&s, 0, &v);
    if (x->rank != 1 || !v.known || !kiln_dim_is_const(ax[0].start) || !kiln_dim_is_const(ax[0].count) ||
        ax[0].count.c > v.n)
        return KILN_OK;
    kiln_dim out[KILN_SHAPE_VEC_MAX];
    for (int64_t i = 0; i < ax[0].count.c; i++) {
        int64_t j = ax[0].start.c + i * ax[0].step;
        if (j < 0 || j >= v.n) return KILN_OK;
        out[i] = v.v[j];
    }
    return kiln_shape_set_out_vec(c, 0, x->dtype, (int)ax[0].count.c, out);
}

kiln_status kiln_shape_slice_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    kiln_shape_side s = {.rc = c};
    kiln_dim xd[KILN_MAX_RANK];
    for (int k = 0; k < x->rank; k++) xd[k] = kiln_dim_const(x->dims[k]);
    slice_axis ax[KILN_MAX_RANK];
    KILN_TRY(slice_plan(&s, x->rank, xd, ax));
    int64_t xs[KILN_MAX_RANK], vs[KILN_MAX_RANK], ys[KILN_MAX_RANK], off = 0;
    kiln_strides(x->rank, x->dims, xs);
    kiln_strides(y->rank, y->dims, ys);
    for (int k = 0; k < x->rank; k++) {
        if (ax[k].count.c != y->dims[k])
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "axis %d: slice has %lld elements, output %lld", k,
                                 (long long)ax[k].count.c, (long long)y->dims[k]);
        if (ax[k].count.c) off += ax[k].start.c * xs[k];
        vs[k] = ax[k].count.c > 1 ? xs[k] * ax[k].step : 0; /* (count - 1) * |step| < dim */
    }
    return kiln_shape_copy_view(c, y, 0, ys, x, off, vs, x->rank, y->dims);
}

/* ---- Expand / Tile ---- */

kiln_status kiln_shape_expand_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_side s = {.ic = c};
    kiln_shape_vec shape;
    kiln_shape_in_vec(&s, 1, &shape);
    if (!shape.present) return kiln_infer_fail(c, KILN_ERR_MODEL, "shape is missing");
    if (!shape.known) {
        int n = kiln_shape_static_len(c, 1);
        return kiln_shape_set_out_fresh(c, 0, x->dtype, n < 0 ? -1 : n > x->rank ? n : x->rank);
    }
    if (shape.n > KILN_MAX_RANK)
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "shape has %d entries, more than %d", shape.n,
                               KILN_MAX_RANK);
    /* numpy broadcast of x's dims with the shape, right-aligned. A constant other than 1
     * decides an axis (the other side must be 1 or equal); two different symbols give their
     * max (one is 1 or they are equal). */
    int rank = shape.n > x->rank ? shape.n : x->rank;
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0; k < rank; k++) {
        int i = k - (rank - x->rank), j = k - (rank - shape.n);
        kiln_dim a = i >= 0 ? x->dims[i] : kiln_dim_const(1), b = j >= 0 ? shape.v[j] : kiln_dim_const(1);
        if (kiln_dim_is_const(b) && b.c < 0)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "shape entry %d is %lld", j, (long long)b.c);
        bool a1 = kiln_dim_is_const(a) && a.c == 1, b1 = kiln_dim_is_const(b) && b.c == 1;
        if (a1 || kiln_dim_equal(a, b))
            dims[k] = b;
        else if (b1)
            dims[k] = a;
        else if (kiln_dim_is_const(a) && kiln_dim_is_const(b))
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "cannot expand dim %lld to %lld at output axis %d",
                                   (long long)a.c, (long long)b.c, k);
        else if (kiln_dim_is_const(a) || kiln_dim_is_const(b))
            dims[k] = kiln_dim_is_const(a) ? a : b;
        else
            dims[k] = kiln_dim_max(kiln_infer_dims(c), a, b);
    }
    return kiln_shape_set_out(c, 0, x->dtype, rank, dims);
}

kiln_status kiln_shape_expand_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int64_t xs[KILN_MAX_RANK], ys[KILN_MAX_RANK];
    kiln_bcast_strides(y->rank, y->dims, x->rank, x->dims, xs);
    kiln_strides(y->rank, y->dims, ys);
    return kiln_shape_copy_view(c, y, 0, ys, x, 0, xs, y->rank, y->dims);
}

kiln_status kiln_shape_tile_infer(kiln_infer_ctx *c)
{
    kiln_dimtab *t = kiln_infer_dims(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_side s = {.ic = c};
    kiln_shape_vec rep;
    if (kiln_infer_opset(c) < 6) {
        /* Tile-1: input 1 repeats along the axis given by input 2 */
        kiln_shape_vec tiles, axis;
        kiln_shape_in_vec(&s, 1, &tiles);
        kiln_shape_in_vec(&s, 2, &axis);
        if (!tiles.known || !axis.known || tiles.n != 1 || axis.n != 1 || !kiln_dim_is_const(axis.v[0]))
            return kiln_shape_set_out_fresh(c, 0, x->dtype, x->rank);
        int a;
        if (!kiln_axis_norm(axis.v[0].c, x->rank, &a))
            return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld out of range for rank %d",
                                   (long long)axis.v[0].c, x->rank);
        rep.present = rep.known = true;
        rep.n = x->rank;
        for (int k = 0; k < x->rank; k++) rep.v[k] = k == a ? tiles.v[0] : kiln_dim_const(1);
    } else {
        kiln_shape_in_vec(&s, 1, &rep);
    }
    if (!rep.known) return kiln_shape_set_out_fresh(c, 0, x->dtype, x->rank);
    if (rep.n != x->rank)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "repeats has %d entries for rank %d", rep.n, x->rank);
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0; k < x->rank; k++) {
        if (kiln_dim_is_const(rep.v[k]) && rep.v[k].c < 0)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "repeats entry %d is %lld", k, (long long)rep.v[k].c);
        dims[k] = kiln_dim_mul(t, x->dims[k], rep.v[k]);
    }
    return kiln_shape_set_out(c, 0, x->dtype, x->rank, dims);
}

kiln_status kiln_shape_tile_run(kiln_run_ctx *c)
{
    /* y viewed as [r0, d0, r1, d1, ...] (r = repeats, d = x dims) reads x with stride 0 on r */
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int r = x->rank;
    int64_t xs[KILN_MAX_RANK], ys[KILN_MAX_RANK];
    int64_t dims[KILN_SHAPE_VIEW_RANK], vxs[KILN_SHAPE_VIEW_RANK], vys[KILN_SHAPE_VIEW_RANK];
    kiln_strides(r, x->dims, xs);
    kiln_strides(r, y->dims, ys);
    for (int k = 0; k < r; k++) {
        dims[2 * k] = x->dims[k] ? y->dims[k] / x->dims[k] : 0;
        dims[2 * k + 1] = x->dims[k];
        vxs[2 * k] = 0;
        vxs[2 * k + 1] = xs[k];
        vys[2 * k] = ys[k] * x->dims[k];
        vys[2 * k + 1] = ys[k];
    }
    return kiln_shape_copy_view(c, y, 0, vys, x, 0, vxs, 2 * r, dims);
}

/* ---- DepthToSpace / SpaceToDepth ---- */

/* blocksize and mode (true for CRD), validated. */
static kiln_status block_args(const kiln_shape_side *s, int64_t *b, bool *crd)
{
    const kiln_node *n = kiln_shape_node(s);
    *b = kiln_attr_int(n, "blocksize", 0);
    if (*b <= 0) return kiln_shape_fail(s, KILN_ERR_MODEL, "blocksize %lld is not positive", (long long)*b);
    const char *mode = kiln_attr_string(n, "mode", "DCR");
    *crd = !strcmp(mode, "CRD");
    if (!*crd && strcmp(mode, "DCR")) return kiln_shape_fail(s, KILN_ERR_MODEL, "unknown mode '%s'", mode);
    return KILN_OK;
}

/* d / by when it divides (symbolic dims: assumed, checked at run time). */
static kiln_status exact_div(kiln_infer_ctx *c, kiln_dim d, int64_t by, int axis, kiln_dim *out)
{
    kiln_dimtab *t = kiln_infer_dims(c);
    kiln_dim r = kiln_dim_mod(t, d, kiln_dim_const(by));
    if (kiln_dim_is_const(r) && r.c != 0)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "dim %d (%lld) is not a multiple of %lld", axis,
                               (long long)d.c, (long long)by);
    *out = kiln_dim_floordiv(t, d, kiln_dim_const(by));
    return KILN_OK;
}

/* Shared inference: to_space moves C / b^2 into H * b and W * b, else the reverse. */
static kiln_status block_infer(kiln_infer_ctx *c, bool to_space)
{
    kiln_dimtab *t = kiln_infer_dims(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_side s = {.ic = c};
    int64_t b;
    bool crd;
    KILN_TRY(block_args(&s, &b, &crd));
    if (x->rank != 4) return kiln_infer_fail(c, KILN_ERR_SHAPE, "input has rank %d, expected 4", x->rank);
    kiln_dim bd = kiln_dim_const(b), dims[4] = {x->dims[0]};
    if (to_space) {
        KILN_TRY(exact_div(c, x->dims[1], b * b, 1, &dims[1]));
        dims[2] = kiln_dim_mul(t, x->dims[2], bd);
        dims[3] = kiln_dim_mul(t, x->dims[3], bd);
    } else {
        dims[1] = kiln_dim_mul(t, x->dims[1], kiln_dim_const(b * b));
        KILN_TRY(exact_div(c, x->dims[2], b, 2, &dims[2]));
        KILN_TRY(exact_div(c, x->dims[3], b, 3, &dims[3]));
    }
    return kiln_shape_set_out(c, 0, x->dtype, 4, dims);
}

kiln_status kiln_shape_depth_to_space_infer(kiln_infer_ctx *c)
{
    return block_infer(c, true);
}
kiln_status kiln_shape_space_to_depth_infer(kiln_infer_ctx *c)
{
    return block_infer(c, false);
}

kiln_status kiln_shape_depth_to_space_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_shape_side s = {.rc = c};
    int64_t b;
    bool crd;
    KILN_TRY(block_args(&s, &b, &crd));
    int64_t n = x->dims[0], cc = x->dims[1] / (b * b), h = x->dims[2], w = x->dims[3];
    /* DCR: [N, b, b, C', H, W] -> [N, C', H, b, W, b]; CRD: [N, C', b, b, H, W] -> same */
    static const int dcr[6] = {0, 3, 4, 1, 5, 2}, crd_perm[6] = {0, 1, 4, 2, 5, 3};
    int64_t dcr_dims[6] = {n, b, b, cc, h, w}, crd_dims[6] = {n, cc, b, b, h, w};
    return permuted_copy(c, kiln_run_out(c, 0), x, 6, crd ? crd_dims : dcr_dims, crd ? crd_perm : dcr);
}

kiln_status kiln_shape_space_to_depth_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_shape_side s = {.rc = c};
    int64_t b;
    bool crd;
    KILN_TRY(block_args(&s, &b, &crd));
    /* [N, C, H', b, W', b] -> DCR: [N, b, b, C, H', W'], CRD: [N, C, b, b, H', W'] */
    static const int dcr[6] = {0, 3, 5, 1, 2, 4}, crd_perm[6] = {0, 1, 3, 5, 2, 4};
    int64_t dims[6] = {x->dims[0], x->dims[1], x->dims[2] / b, b, x->dims[3] / b, b};
    return permuted_copy(c, kiln_run_out(c, 0), x, 6, dims, crd ? crd_perm : dcr);
}
