/* index.c - Indexing ops: Gather, GatherElements, GatherND, Scatter, ScatterElements, ScatterND,
 * TensorScatter, the family's shared helpers and its registry table (the other ops live in
 * index_select.c and index_layout.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/index_internal.h"
#include "ops/semantics.h"
#include "ops/util.h"

/* ---- shared helpers ---- */

kiln_status kiln_index_copy(kiln_value *dst, int64_t di, const kiln_value *src, int64_t si, int64_t n,
                            kiln_err *err)
{
    if (n <= 0) return KILN_OK;
    if (dst->dtype == KILN_DTYPE_STRING) {
        const char *const *s = src->data;
        for (int64_t k = 0; k < n; k++)
            KILN_TRY(kiln_tensor_set_string(dst, di + k, s[si + k], strlen(s[si + k]), err));
        return KILN_OK;
    }
    size_t es = kiln_dtype_size(dst->dtype);
    memcpy((char *)dst->data + (size_t)di * es, (const char *)src->data + (size_t)si * es, (size_t)n * es);
    return KILN_OK;
}

bool kiln_index_at(const kiln_value *t, int64_t i, int64_t size, int64_t *pos)
{
    int64_t v = kiln_load_i64(t->dtype, t->data, i);
    if (v < -size || v >= size) return false;
    *pos = v < 0 ? v + size : v;
    return true;
}

kiln_status kiln_index_bad(kiln_run_ctx *c, const char *what, const kiln_value *t, int64_t i, int64_t size)
{
    return kiln_run_fail(c, KILN_ERR_RUNTIME, "%s value %lld (element %lld) is out of range [%lld, %lld]",
                         what, (long long)kiln_load_i64(t->dtype, t->data, i), (long long)i, (long long)-size,
                         (long long)size - 1);
}

int kiln_index_cmp(const kiln_value *a, int64_t i, const kiln_value *b, int64_t j)
{
    kiln_dtype dt = a->dtype;
    if (dt == KILN_DTYPE_STRING) {
        int r = strcmp(((const char *const *)a->data)[i], ((const char *const *)b->data)[j]);
        return (r > 0) - (r < 0);
    }
    if (kiln_dtype_is_float(dt)) {
        double x = kiln_load_f64(dt, a->data, i), y = kiln_load_f64(dt, b->data, j);
        if (isnan(x) || isnan(y)) return isnan(y) ? (isnan(x) ? 0 : -1) : 1;
        return (x > y) - (x < y);
    }
    if (kiln_dtype_is_unsigned_int(dt) || dt == KILN_DTYPE_BOOL) {
        uint64_t x = kiln_load_u64(dt, a->data, i), y = kiln_load_u64(dt, b->data, j);
        return (x > y) - (x < y);
    }
    int64_t x = kiln_load_i64(dt, a->data, i), y = kiln_load_i64(dt, b->data, j);
    return (x > y) - (x < y);
}

void kiln_index_sort(int64_t *idx, int64_t *tmp, int64_t n, int (*cmp)(const void *ctx, int64_t x, int64_t y),
                     const void *ctx)
{
    /* bottom-up merge sort: stable, no recursion */
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi) tmp[o++] = cmp(ctx, idx[b], idx[a]) < 0 ? idx[b++] : idx[a++];
            while (a < mid) tmp[o++] = idx[a++];
            while (b < hi) tmp[o++] = idx[b++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

int64_t kiln_index_prod(const int64_t *dims, int from, int to)
{
    int64_t p = 1;
    for (int k = from; k < to; k++) p *= dims[k];
    return p;
}

kiln_status kiln_index_out(kiln_run_ctx *c, int i, kiln_dtype dt, int rank, const int64_t *dims,
                           kiln_value **y)
{
    *y = kiln_run_out(c, i);
    if (*y) return KILN_OK;
    return kiln_run_alloc_out(c, i, dt, rank, dims, y);
}

kiln_status kiln_index_infer_axis(kiln_infer_ctx *c, int64_t def, int rank, int *axis)
{
    int64_t a = kiln_attr_int(kiln_infer_node(c), "axis", def);
    if (!kiln_axis_norm(a, rank, axis))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld is out of range for rank %d", (long long)a,
                               rank);
    return KILN_OK;
}

int kiln_index_run_axis(kiln_run_ctx *c, int64_t def, int rank)
{
    int axis = 0;
    kiln_axis_norm(kiln_attr_int(kiln_run_node(c), "axis", def), rank, &axis);
    return axis;
}

/* The two required inputs of a data/indices op, with an integer indices dtype. */
static kiln_status data_indices(kiln_infer_ctx *c, const kiln_type **x, const kiln_type **ind)
{
    *x = kiln_infer_in(c, 0);
    *ind = kiln_infer_in(c, 1);
    if (!*x || !*ind) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs data and indices inputs");
    if ((*ind)->dtype != KILN_DTYPE_INT32 && (*ind)->dtype != KILN_DTYPE_INT64)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "indices must be int32 or int64, not %s",
                               kiln_dtype_name((*ind)->dtype));
    return KILN_OK;
}

/* Output 0 starts as a copy of input 0 (scatter ops update it in place). */
static kiln_status copy_data(kiln_run_ctx *c, kiln_value **y)
{
    const kiln_value *x = kiln_run_in(c, 0);
    KILN_TRY(kiln_index_out(c, 0, x->dtype, x->rank, x->dims, y));
    return kiln_index_copy(*y, 0, x, 0, x->numel, kiln_run_err(c));
}

/* ---- Gather ---- */

/* Compile time: data is a shape vector with known (maybe symbolic) contents and the indices
 * are constant, so the gathered dims are known too (Shape -> Gather -> ... stays symbolic). */
static kiln_status gather_shape_value(kiln_infer_ctx *c, const kiln_type *ind)
{
    enum { MAX = 64 };
    kiln_dim src[MAX], dst[MAX];
    int n;
    const kiln_value *iv = kiln_infer_in_value(c, 1);
    if (!kiln_infer_dims(c) || !iv || ind->rank > 1 || iv->numel > MAX) return KILN_OK;
    if (!kiln_infer_in_dims_value(c, 0, src, MAX, &n)) return KILN_OK;
    for (int64_t k = 0; k < iv->numel; k++) {
        int64_t p;
        if (!kiln_index_at(iv, k, n, &p)) return KILN_OK; /* the kernel reports it */
        dst[k] = src[p];
    }
    return kiln_infer_set_out_dims_value(c, 0, dst, (int)iv->numel);
}

static kiln_status gather_infer(kiln_infer_ctx *c)
{
    const kiln_type *x, *ind;
    int axis;
    KILN_TRY(data_indices(c, &x, &ind));
    if (x->rank < 1) return kiln_infer_fail(c, KILN_ERR_SHAPE, "data must have rank >= 1");
    KILN_TRY(kiln_index_infer_axis(c, 0, x->rank, &axis));
    kiln_dim dims[2 * KILN_MAX_RANK];
    int r = 0;
    for (int k = 0; k < axis; k++) dims[r++] = x->dims[k];
    for (int k = 0; k < ind->rank; k++) dims[r++] = ind->dims[k];
    for (int k = axis + 1; k < x->rank; k++) dims[r++] = x->dims[k];
    KILN_TRY(kiln_infer_set_out(c, 0, x->dtype, r, dims));
    return gather_shape_value(c, ind);
}

static kiln_status gather_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *ind = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    int axis = kiln_index_run_axis(c, 0, x->rank);
    int64_t outer = kiln_index_prod(x->dims, 0, axis), n = x->dims[axis];
    int64_t inner = kiln_index_prod(x->dims, axis + 1, x->rank), m = ind->numel;
    for (int64_t j = 0; j < m; j++) {
        int64_t p;
        if (!kiln_index_at(ind, j, n, &p)) return kiln_index_bad(c, "indices", ind, j, n);
        for (int64_t o = 0; o < outer; o++)
            KILN_TRY(kiln_index_copy(y, (o * m + j) * inner, x, (o * n + p) * inner, inner, kiln_run_err(c)));
    }
    return KILN_OK;
}

/* ---- GatherElements ---- */

static kiln_status gather_elements_infer(kiln_infer_ctx *c)
{
    const kiln_type *x, *ind;
    int axis;
    KILN_TRY(data_indices(c, &x, &ind));
    if (x->rank < 1 || ind->rank != x->rank)
        return kiln_infer_fail(c, KILN_ERR_SHAPE,
                               "data (rank %d) and indices (rank %d) need the same rank >= 1", x->rank,
                               ind->rank);
    KILN_TRY(kiln_index_infer_axis(c, 0, x->rank, &axis));
    return kiln_infer_set_out(c, 0, x->dtype, ind->rank, ind->dims);
}

/* Checks that indices (shape of `ind`) address data x everywhere but along axis; fills the
 * data strides with the axis stride moved to *axis_stride and zeroed in strides. */
static kiln_status elements_layout(kiln_run_ctx *c, const kiln_value *x, const kiln_value *ind, int axis,
                                   int64_t (*strides)[KILN_MAX_RANK], int64_t *axis_stride)
{
    for (int k = 0; k < x->rank; k++)
        if (k != axis && ind->dims[k] > x->dims[k])
            return kiln_run_fail(c, KILN_ERR_SHAPE, "indices dim %lld exceeds data dim %lld at axis %d",
                                 (long long)ind->dims[k], (long long)x->dims[k], k);
    kiln_strides(x->rank, x->dims, strides[0]);
    *axis_stride = strides[0][axis];
    strides[0][axis] = 0;
    return KILN_OK;
}

static kiln_status gather_elements_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *ind = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    int axis = kiln_index_run_axis(c, 0, x->rank);
    int64_t strides[1][KILN_MAX_RANK], as = 0;
    KILN_TRY(elements_layout(c, x, ind, axis, strides, &as));
    kiln_iter it;
    kiln_iter_init(&it, ind->rank, ind->dims, 1, strides);
    for (int64_t j = 0; j < ind->numel; j++, kiln_iter_next(&it)) {
        int64_t p;
        if (!kiln_index_at(ind, j, x->dims[axis], &p))
            return kiln_index_bad(c, "indices", ind, j, x->dims[axis]);
        KILN_TRY(kiln_index_copy(y, j, x, it.off[0] + p * as, 1, kiln_run_err(c)));
    }
    return KILN_OK;
}

/* ---- GatherND ---- */

static kiln_status gather_nd_infer(kiln_infer_ctx *c)
{
    const kiln_type *x, *ind;
    KILN_TRY(data_indices(c, &x, &ind));
    int64_t b = kiln_attr_int(kiln_infer_node(c), "batch_dims", 0);
    int r = x->rank, q = ind->rank;
    if (r < 1 || q < 1) return kiln_infer_fail(c, KILN_ERR_SHAPE, "data and indices need rank >= 1");
    if (b < 0 || b >= r || b >= q)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "batch_dims %lld must be below both ranks (%d, %d)",
                               (long long)b, r, q);
    for (int k = 0; k < b; k++)
        KILN_TRY(kiln_infer_require_equal(c, x->dims[k], ind->dims[k], "batch dims of data and indices"));
    kiln_dim last = ind->dims[q - 1];
    if (!kiln_dim_is_const(last)) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    if (last.c < 1 || last.c > r - b)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "last indices dim %lld must be in [1, %lld]",
                               (long long)last.c, (long long)(r - b));
    kiln_dim dims[2 * KILN_MAX_RANK];
    int n = 0;
    for (int k = 0; k < q - 1; k++) dims[n++] = ind->dims[k];
    for (int k = (int)(b + last.c); k < r; k++) dims[n++] = x->dims[k];
    return kiln_infer_set_out(c, 0, x->dtype, n, dims);
}

static kiln_status gather_nd_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *ind = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    int b = (int)kiln_attr_int(kiln_run_node(c), "batch_dims", 0), r = x->rank, q = ind->rank;
    int last = (int)ind->dims[q - 1];
    int64_t strides[KILN_MAX_RANK];
    kiln_strides(r, x->dims, strides);
    int64_t batches = kiln_index_prod(x->dims, 0, b), batch_size = kiln_index_prod(x->dims, b, r);
    int64_t tuples = kiln_index_prod(ind->dims, b, q - 1), slice = kiln_index_prod(x->dims, b + last, r);
    for (int64_t bi = 0; bi < batches; bi++)
        for (int64_t t = 0; t < tuples; t++) {
            int64_t row = bi * tuples + t, off = bi * batch_size;
            for (int k = 0; k < last; k++) {
                int64_t p, e = row * last + k;
                if (!kiln_index_at(ind, e, x->dims[b + k], &p))
                    return kiln_index_bad(c, "indices", ind, e, x->dims[b + k]);
                off += p * strides[b + k];
            }
            KILN_TRY(kiln_index_copy(y, row * slice, x, off, slice, kiln_run_err(c)));
        }
    return KILN_OK;
}

/* ---- ScatterElements, Scatter, ScatterND: reductions ---- */

static kiln_status infer_reduction(kiln_infer_ctx *c, kiln_dtype dt)
{
    int red = kiln_scatter_reduction_of(kiln_infer_node(c));
    if (red < 0)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "unknown reduction '%s'",
                               kiln_attr_string(kiln_infer_node(c), "reduction", ""));
    if (red != KILN_SCATTER_NONE && dt == KILN_DTYPE_STRING)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "reduction on string data");
    return KILN_OK;
}

static double reduce_f64(kiln_scatter_reduction red, double a, double b)
{
    switch (red) {
    case KILN_SCATTER_ADD: return a + b;
    case KILN_SCATTER_MUL: return a * b;
    case KILN_SCATTER_MAX: return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
    case KILN_SCATTER_MIN: return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
    default: return b;
    }
}

/* Unsigned arithmetic wraps like the fixed-width types do; signed values pass through it for
 * add and mul (two's complement) and compare signed for max/min. */
static uint64_t reduce_bits(kiln_scatter_reduction red, uint64_t a, uint64_t b, bool is_signed)
{
    bool gt = is_signed ? (int64_t)a > (int64_t)b : a > b;
    switch (red) {
    case KILN_SCATTER_ADD: return a + b;
    case KILN_SCATTER_MUL: return a * b;
    case KILN_SCATTER_MAX: return gt ? a : b;
    case KILN_SCATTER_MIN: return gt ? b : a;
    default: return b;
    }
}

/* y[yi] = red(y[yi], u[ui]). */
static kiln_status scatter_put(kiln_value *y, int64_t yi, const kiln_value *u, int64_t ui, kiln_scatter_reduction red,
                               kiln_err *err)
{
    kiln_dtype dt = y->dtype;
    if (red == KILN_SCATTER_NONE) return kiln_index_copy(y, yi, u, ui, 1, err);
    if (kiln_dtype_is_float(dt)) {
        double a = kiln_load_f64(dt, y->data, yi), b = kiln_load_f64(dt, u->data, ui);
        kiln_store_f64(dt, y->data, yi, reduce_f64(red, a, b));
    } else if (kiln_dtype_is_signed_int(dt)) {
        uint64_t a = (uint64_t)kiln_load_i64(dt, y->data, yi), b = (uint64_t)kiln_load_i64(dt, u->data, ui);
        kiln_store_i64(dt, y->data, yi, (int64_t)reduce_bits(red, a, b, true));
    } else {
        uint64_t a = kiln_load_u64(dt, y->data, yi), b = kiln_load_u64(dt, u->data, ui);
        kiln_store_u64(dt, y->data, yi, reduce_bits(red, a, b, false));
    }
    return KILN_OK;
}

/* ---- ScatterElements, Scatter ---- */

static kiln_status scatter_elements_infer(kiln_infer_ctx *c)
{
    const kiln_type *x, *ind, *u = kiln_infer_in(c, 2);
    int axis;
    KILN_TRY(data_indices(c, &x, &ind));
    if (!u) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs an updates input");
    if (x->rank < 1 || ind->rank != x->rank || u->rank != x->rank)
        return kiln_infer_fail(c, KILN_ERR_SHAPE,
                               "data, indices and updates need the same rank >= 1 (%d, %d, %d)", x->rank,
                               ind->rank, u->rank);
    if (u->dtype != x->dtype)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "updates dtype differs from data dtype");
    for (int k = 0; k < x->rank; k++)
        KILN_TRY(kiln_infer_require_equal(c, ind->dims[k], u->dims[k], "indices and updates dims"));
    KILN_TRY(kiln_index_infer_axis(c, 0, x->rank, &axis));
    KILN_TRY(infer_reduction(c, x->dtype));
    return kiln_infer_same_as_input(c, 0, 0);
}

static kiln_status scatter_elements_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *ind = kiln_run_in(c, 1), *u = kiln_run_in(c, 2);
    kiln_scatter_reduction red = (kiln_scatter_reduction)kiln_scatter_reduction_of(kiln_run_node(c));
    int axis = kiln_index_run_axis(c, 0, x->rank);
    kiln_value *y;
    int64_t strides[1][KILN_MAX_RANK], as = 0;
    KILN_TRY(elements_layout(c, x, ind, axis, strides, &as));
    KILN_TRY(copy_data(c, &y));
    kiln_iter it;
    kiln_iter_init(&it, ind->rank, ind->dims, 1, strides);
    for (int64_t j = 0; j < ind->numel; j++, kiln_iter_next(&it)) {
        int64_t p;
        if (!kiln_index_at(ind, j, x->dims[axis], &p))
            return kiln_index_bad(c, "indices", ind, j, x->dims[axis]);
        KILN_TRY(scatter_put(y, it.off[0] + p * as, u, j, red, kiln_run_err(c)));
    }
    return KILN_OK;
}

/* ---- ScatterND ---- */

static kiln_status scatter_nd_infer(kiln_infer_ctx *c)
{
    const kiln_type *x, *ind, *u = kiln_infer_in(c, 2);
    KILN_TRY(data_indices(c, &x, &ind));
    if (!u) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs an updates input");
    if (u->dtype != x->dtype)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "updates dtype differs from data dtype");
    int r = x->rank, q = ind->rank;
    if (r < 1 || q < 1) return kiln_infer_fail(c, KILN_ERR_SHAPE, "data and indices need rank >= 1");
    KILN_TRY(infer_reduction(c, x->dtype));
    kiln_dim last = ind->dims[q - 1];
    if (kiln_dim_is_const(last)) {
        if (last.c > r)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "last indices dim %lld exceeds data rank %d",
                                   (long long)last.c, r);
        if (u->rank != q - 1 + r - last.c)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "updates rank %d, expected %lld", u->rank,
                                   (long long)(q - 1 + r - last.c));
        for (int k = 0; k < q - 1; k++)
            KILN_TRY(kiln_infer_require_equal(c, u->dims[k], ind->dims[k], "updates and indices dims"));
        for (int k = (int)last.c; k < r; k++)
            KILN_TRY(kiln_infer_require_equal(c, u->dims[q - 1 + k - last.c], x->dims[k],
                                              "updates and data dims"));
    }
    return kiln_infer_same_as_input(c, 0, 0);
}

static kiln_status scatter_nd_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *ind = kiln_run_in(c, 1), *u = kiln_run_in(c, 2);
    kiln_scatter_reduction red = (kiln_scatter_reduction)kiln_scatter_reduction_of(kiln_run_node(c));
    int r = x->rank, q = ind->rank, last = (int)ind->dims[q - 1];
    int64_t strides[KILN_MAX_RANK];
    kiln_strides(r, x->dims, strides);
    int64_t tuples = kiln_index_prod(ind->dims, 0, q - 1), slice = kiln_index_prod(x->dims, last, r);
    if (u->numel != tuples * slice)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "updates has %lld elements, expected %lld",
                             (long long)u->numel, (long long)(tuples * slice));
    kiln_value *y;
    KILN_TRY(copy_data(c, &y));
    for (int64_t t = 0; t < tuples; t++) {
        int64_t off = 0;
        for (int k = 0; k < last; k++) {
            int64_t p, e = t * last + k;
            if (!kiln_index_at(ind, e, x->dims[k], &p))
                return kiln_index_bad(c, "indices", ind, e, x->dims[k]);
            off += p * strides[k];
        }
        for (int64_t e = 0; e < slice; e++)
            KILN_TRY(scatter_put(y, off + e, u, t * slice + e, red, kiln_run_err(c)));
    }
    return KILN_OK;
}

/* ---- TensorScatter: writes `update` into a copy of the cache along the sequence axis ---- */

static bool circular_mode(const kiln_node *n)
{
    return !strcmp(kiln_attr_string(n, "mode", "linear"), "circular");
}

static kiln_status tensor_scatter_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *u = kiln_infer_in(c, 1), *w = kiln_infer_in(c, 2);
    const char *mode = kiln_attr_string(kiln_infer_node(c), "mode", "linear");
    int axis;
    if (!x || !u) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs past_cache and update inputs");
    if (strcmp(mode, "linear") && strcmp(mode, "circular"))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "unknown mode '%s'", mode);
    if (x->rank < 2 || u->rank != x->rank)
        return kiln_infer_fail(c, KILN_ERR_SHAPE,
                               "past_cache (rank %d) and update (rank %d) need the same rank >= 2", x->rank,
                               u->rank);
    if (u->dtype != x->dtype)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "update dtype differs from past_cache dtype");
    KILN_TRY(kiln_index_infer_axis(c, -2, x->rank, &axis));
    if (axis == 0) return kiln_infer_fail(c, KILN_ERR_MODEL, "axis must not be the batch axis 0");
    for (int k = 0; k < x->rank; k++)
        if (k != axis)
            KILN_TRY(kiln_infer_require_equal(c, x->dims[k], u->dims[k], "past_cache and update dims"));
    if (w && (w->rank != 1 || !kiln_dtype_is_int(w->dtype)))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "write_indices must be a 1-D integer tensor");
    if (w)
        KILN_TRY(kiln_infer_require_equal(c, w->dims[0], x->dims[0], "write_indices length and batch size"));
    return kiln_infer_same_as_input(c, 0, 0);
}

static kiln_status tensor_scatter_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *u = kiln_run_in(c, 1), *w = kiln_run_in(c, 2);
    bool circular = circular_mode(kiln_run_node(c));
    int axis = kiln_index_run_axis(c, -2, x->rank);
    int64_t prefix = kiln_index_prod(x->dims, 0, axis), per_batch = kiln_index_prod(x->dims, 1, axis);
    int64_t max_len = x->dims[axis], len = u->dims[axis], inner = kiln_index_prod(x->dims, axis + 1, x->rank);
    if (len > max_len)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "update sequence length %lld exceeds cache length %lld",
                             (long long)len, (long long)max_len);
    kiln_value *y;
    KILN_TRY(copy_data(c, &y));
    for (int64_t p = 0; p < prefix; p++) {
        int64_t start = w ? kiln_load_i64(w->dtype, w->data, p / per_batch) : 0;
        for (int64_t s = 0; s < len; s++) {
            int64_t pos = start + s;
            if (circular)
                pos = (pos % max_len + max_len) % max_len;
            else if (pos < 0 || pos >= max_len)
                return kiln_run_fail(c, KILN_ERR_RUNTIME,
                                     "write index %lld + %lld is outside the cache length %lld",
                                     (long long)start, (long long)s, (long long)max_len);
            KILN_TRY(kiln_index_copy(y, (p * max_len + pos) * inner, u, (p * len + s) * inner, inner,
                                     kiln_run_err(c)));
        }
    }
    return KILN_OK;
}

static const kiln_op_def defs[] = {
    {"", "Gather", 1, gather_infer, gather_run},
    {"", "GatherElements", 1, gather_elements_infer, gather_elements_run},
    {"", "GatherND", 1, gather_nd_infer, gather_nd_run},
    {"", "Scatter", 1, scatter_elements_infer, scatter_elements_run},
    {"", "ScatterElements", 1, scatter_elements_infer, scatter_elements_run},
    {"", "ScatterND", 1, scatter_nd_infer, scatter_nd_run},
    {"", "TensorScatter", 1, tensor_scatter_infer, tensor_scatter_run},
    {"", "NonZero", 1, kiln_index_nonzero_infer, kiln_index_nonzero_run},
    {"", "Compress", 1, kiln_index_compress_infer, kiln_index_compress_run},
    {"", "Unique", 1, kiln_index_unique_infer, kiln_index_unique_run},
    {"", "TopK", 1, kiln_index_topk_infer, kiln_index_topk_run},
    {"", "ArgMax", 1, kiln_index_arg_infer, kiln_index_argmax_run},
    {"", "ArgMin", 1, kiln_index_arg_infer, kiln_index_argmin_run},
    {"", "OneHot", 1, kiln_index_onehot_infer, kiln_index_onehot_run, 0, KILN_OP_IN(1) | KILN_OP_IN(2)},
    {"", "ReverseSequence", 1, kiln_index_reverse_sequence_infer, kiln_index_reverse_sequence_run},
    {"", "Col2Im", 1, kiln_index_col2im_infer, kiln_index_col2im_run, 0, KILN_OP_IN(1) | KILN_OP_IN(2)},
};

const kiln_op_table kiln_ops_index = {defs, sizeof defs / sizeof defs[0]};
