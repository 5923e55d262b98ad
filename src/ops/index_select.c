/* index_select.c - Selection ops of the index family: NonZero, Compress, Unique (data-dependent
 * output sizes), TopK, ArgMax and ArgMin. */
#include <stdlib.h>
#include <string.h>

#include "ops/index_internal.h"
#include "ops/util.h"

static bool elem_nonzero(const kiln_value *t, int64_t i)
{
    if (t->dtype == KILN_DTYPE_STRING) return ((const char *const *)t->data)[i][0] != '\0';
    if (kiln_dtype_is_float(t->dtype)) return kiln_load_f64(t->dtype, t->data, i) != 0.0;
    return kiln_load_u64(t->dtype, t->data, i) != 0;
}

static int64_t count_nonzero(const kiln_value *t)
{
    int64_t n = 0;
    for (int64_t i = 0; i < t->numel; i++) n += elem_nonzero(t, i);
    return n;
}

/* ---- NonZero: Y[rank, nnz] int64; a scalar counts as a 1-element vector ---- */

kiln_status kiln_index_nonzero_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    const kiln_value *v = kiln_infer_in_value(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs an input");
    kiln_dim dims[2] = {kiln_dim_const(x->rank ? x->rank : 1), kiln_infer_fresh(c, "nnz")};
    if (v && kiln_infer_dims(c)) dims[1] = kiln_dim_const(count_nonzero(v));
    return kiln_infer_set_out(c, 0, KILN_DTYPE_INT64, 2, dims);
}

kiln_status kiln_index_nonzero_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    int rows = x->rank ? x->rank : 1;
    int64_t dims[2] = {rows, count_nonzero(x)}, strides[KILN_MAX_RANK], col = 0;
    kiln_value *y;
    KILN_TRY(kiln_index_out(c, 0, KILN_DTYPE_INT64, 2, dims, &y));
    kiln_strides(x->rank, x->dims, strides);
    int64_t *out = y->data;
    for (int64_t i = 0; i < x->numel; i++) {
        if (!elem_nonzero(x, i)) continue;
        for (int k = 0; k < x->rank; k++) out[k * dims[1] + col] = i / strides[k] % x->dims[k];
        if (!x->rank) out[col] = 0;
        col++;
    }
    return KILN_OK;
}

/* ---- Compress: slices of input along axis (or elements of the flattened input) where
 * condition is true; a condition shorter than the axis drops the rest ---- */

kiln_status kiln_index_compress_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *cond = kiln_infer_in(c, 1);
    const kiln_value *cv = kiln_infer_in_value(c, 1);
    const kiln_node *n = kiln_infer_node(c);
    if (!x || !cond) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input and condition");
    if (cond->rank != 1)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "condition must be 1-D, has rank %d", cond->rank);
    kiln_dim count = cv ? kiln_dim_const(count_nonzero(cv)) : kiln_infer_fresh(c, "n");
    if (!kiln_node_attr(n, "axis")) return kiln_infer_set_out(c, 0, x->dtype, 1, &count);
    int axis;
    KILN_TRY(kiln_index_infer_axis(c, 0, x->rank, &axis));
    kiln_dim dims[KILN_MAX_RANK];
    memcpy(dims, x->dims, (size_t)x->rank * sizeof *dims);
    dims[axis] = count;
    return kiln_infer_set_out(c, 0, x->dtype, x->rank, dims);
}

kiln_status kiln_index_compress_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *cond = kiln_run_in(c, 1);
    const kiln_node *node = kiln_run_node(c);
    bool flat = !kiln_node_attr(node, "axis");
    int axis = flat ? 0 : kiln_index_run_axis(c, 0, x->rank);
    int64_t outer = flat ? 1 : kiln_index_prod(x->dims, 0, axis), n = flat ? x->numel : x->dims[axis];
    int64_t inner = flat ? 1 : kiln_index_prod(x->dims, axis + 1, x->rank), count = 0;
    for (int64_t k = 0; k < cond->numel; k++) {
        if (!elem_nonzero(cond, k)) continue;
        if (k >= n)
            return kiln_run_fail(c, KILN_ERR_RUNTIME,
                                 "condition is true at %lld, beyond the %lld selectable slices", (long long)k,
                                 (long long)n);
        count++;
    }
    int64_t dims[KILN_MAX_RANK] = {count};
    if (!flat) {
        memcpy(dims, x->dims, (size_t)x->rank * sizeof *dims);
        dims[axis] = count;
    }
    kiln_value *y;
    KILN_TRY(kiln_index_out(c, 0, x->dtype, flat ? 1 : x->rank, dims, &y));
    for (int64_t o = 0, j = 0; o < outer; o++)
        for (int64_t k = 0; k < cond->numel && k < n; k++)
            if (elem_nonzero(cond, k))
                KILN_TRY(kiln_index_copy(y, j++ * inner, x, (o * n + k) * inner, inner, kiln_run_err(c)));
    return KILN_OK;
}

/* ---- Unique: items are the elements of the flattened input, or its slices along axis ---- */

kiln_status kiln_index_unique_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    const kiln_node *n = kiln_infer_node(c);
    kiln_dimtab *tab = kiln_infer_dims(c);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs an input");
    kiln_dim u = kiln_infer_fresh(c, "unique"), items = kiln_dim_const(1);
    if (kiln_node_attr(n, "axis")) {
        int axis;
        KILN_TRY(kiln_index_infer_axis(c, 0, x->rank, &axis));
        kiln_dim dims[KILN_MAX_RANK];
        memcpy(dims, x->dims, (size_t)x->rank * sizeof *dims);
        dims[axis] = u;
        items = x->dims[axis];
        KILN_TRY(kiln_infer_set_out(c, 0, x->dtype, x->rank, dims));
    } else {
        for (int k = 0; k < x->rank; k++) items = kiln_dim_mul(tab, items, x->dims[k]);
        KILN_TRY(kiln_infer_set_out(c, 0, x->dtype, 1, &u));
    }
    KILN_TRY(kiln_infer_set_out(c, 1, KILN_DTYPE_INT64, 1, &u));
    KILN_TRY(kiln_infer_set_out(c, 2, KILN_DTYPE_INT64, 1, &items));
    return kiln_infer_set_out(c, 3, KILN_DTYPE_INT64, 1, &u);
}

/* Item i is x[o, i, e] for o < outer, e < inner, with n items. */
typedef struct item_set {
    const kiln_value *x;
    int64_t outer, n, inner;
} item_set;

/* Lexicographic comparison of two items. */
static int item_cmp(const void *ctx, int64_t i, int64_t j)
{
    const item_set *it = ctx;
    for (int64_t o = 0; o < it->outer; o++)
        for (int64_t e = 0; e < it->inner; e++) {
            int r = kiln_index_cmp(it->x, (o * it->n + i) * it->inner + e, it->x,
                                   (o * it->n + j) * it->inner + e);
            if (r) return r;
        }
    return 0;
}

static int first_cmp(const void *ctx, int64_t a, int64_t b)
{
    const int64_t *first = ctx;
    return (first[a] > first[b]) - (first[a] < first[b]);
}

/* Writes Y, indices, inverse_indices and counts for u unique items: group g (in output order)
 * starts at item first[g] and occurs count[g] times; item i belongs to group group_of[i]. */
static kiln_status unique_write(kiln_run_ctx *c, const item_set *it, int axis, bool flat, int64_t u,
                                const int64_t *first, const int64_t *count, const int64_t *group_of)
{
    const kiln_value *x = it->x;
    int64_t dims[KILN_MAX_RANK] = {u};
    if (!flat) {
        memcpy(dims, x->dims, (size_t)x->rank * sizeof *dims);
        dims[axis] = u;
    }
    kiln_value *y, *ind, *inv, *cnt;
    KILN_TRY(kiln_index_out(c, 0, x->dtype, flat ? 1 : x->rank, dims, &y));
    for (int64_t g = 0; g < u; g++)
        for (int64_t o = 0; o < it->outer; o++)
            KILN_TRY(kiln_index_copy(y, (o * u + g) * it->inner, x, (o * it->n + first[g]) * it->inner,
                                     it->inner, kiln_run_err(c)));
    int n_out = kiln_run_n_out(c);
    if (n_out > 1) {
        KILN_TRY(kiln_index_out(c, 1, KILN_DTYPE_INT64, 1, &u, &ind));
        if (u) memcpy(ind->data, first, (size_t)u * sizeof *first);
    }
    if (n_out > 2) {
        KILN_TRY(kiln_index_out(c, 2, KILN_DTYPE_INT64, 1, &it->n, &inv));
        if (it->n) memcpy(inv->data, group_of, (size_t)it->n * sizeof *group_of);
    }
    if (n_out > 3) {
        KILN_TRY(kiln_index_out(c, 3, KILN_DTYPE_INT64, 1, &u, &cnt));
        if (u) memcpy(cnt->data, count, (size_t)u * sizeof *count);
    }
    return KILN_OK;
}

kiln_status kiln_index_unique_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    const kiln_node *node = kiln_run_node(c);
    bool flat = !kiln_node_attr(node, "axis"), sorted = kiln_attr_int(node, "sorted", 1) != 0;
    int axis = flat ? 0 : kiln_index_run_axis(c, 0, x->rank);
    item_set it = {x, 1, x->numel, 1};
    if (!flat)
        it = (item_set){x, kiln_index_prod(x->dims, 0, axis), x->dims[axis],
                        kiln_index_prod(x->dims, axis + 1, x->rank)};
    int64_t n = it.n, u = 0;
    /* perm, tmp, first, count, group_of, order: n each (one more keeps malloc(0) away) */
    int64_t *buf = malloc(6 * ((size_t)n + 1) * sizeof *buf);
    if (!buf) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for %lld items", (long long)n);
    int64_t *perm = buf, *tmp = perm + n + 1, *first = tmp + n + 1, *count = first + n + 1;
    int64_t *group_of = count + n + 1, *order = group_of + n + 1;
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    kiln_index_sort(perm, tmp, n, item_cmp, &it);
    /* equal items are adjacent and, the sort being stable, in input order */
    for (int64_t p = 0; p < n; p++) {
        if (!p || item_cmp(&it, perm[p - 1], perm[p])) {
            first[u] = perm[p];
            count[u++] = 0;
        }
        count[u - 1]++;
        group_of[perm[p]] = u - 1;
    }
    if (!sorted) {
        /* renumber groups by first occurrence (tmp and perm serve as scratch again) */
        for (int64_t g = 0; g < u; g++) order[g] = g;
        kiln_index_sort(order, tmp, u, first_cmp, first);
        for (int64_t g = 0; g < u; g++) tmp[order[g]] = g;
        for (int64_t i = 0; i < n; i++) group_of[i] = tmp[group_of[i]];
        for (int64_t g = 0; g < u; g++) {
            tmp[g] = first[order[g]];
            perm[g] = count[order[g]];
        }
        memcpy(first, tmp, (size_t)u * sizeof *first);
        memcpy(count, perm, (size_t)u * sizeof *count);
    }
    kiln_status st = unique_write(c, &it, axis, flat, u, first, count, group_of);
    free(buf);
    return st;
}

/* ---- TopK ---- */

kiln_status kiln_index_topk_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    const kiln_node *n = kiln_infer_node(c);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs an input");
    int axis;
    KILN_TRY(kiln_index_infer_axis(c, -1, x->rank, &axis));
    kiln_dim k[1];
    int nk = 0;
    if (kiln_infer_opset(c) < 10) {
        if (!kiln_node_attr(n, "k")) return kiln_infer_fail(c, KILN_ERR_MODEL, "missing attribute k");
        k[0] = kiln_dim_const(kiln_attr_int(n, "k", 0));
    } else if (!kiln_infer_in(c, 1)) {
        return kiln_infer_fail(c, KILN_ERR_MODEL, "missing input K");
    } else if (!kiln_infer_in_dims_value(c, 1, k, 1, &nk) || nk != 1) {
        k[0] = kiln_infer_fresh(c, "k");
    }
    if (kiln_dim_is_const(k[0]) && kiln_dim_is_const(x->dims[axis]) &&
        (k[0].c < 0 || k[0].c > x->dims[axis].c))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "k = %lld is outside [0, %lld] (dim %d of X)",
                               (long long)k[0].c, (long long)x->dims[axis].c, axis);
    kiln_dim dims[KILN_MAX_RANK];
    memcpy(dims, x->dims, (size_t)x->rank * sizeof *dims);
    dims[axis] = k[0];
    KILN_TRY(kiln_infer_set_out(c, 0, x->dtype, x->rank, dims));
    return kiln_infer_set_out(c, 1, KILN_DTYPE_INT64, x->rank, dims);
}

/* A row of n elements at x[base + j * stride]; `sign` -1 orders largest first. */
typedef struct row {
    const kiln_value *x;
    int64_t base, stride;
    int sign;
} row;

static int row_cmp(const void *ctx, int64_t i, int64_t j)
{
    const row *r = ctx;
    return r->sign * kiln_index_cmp(r->x, r->base + i * r->stride, r->x, r->base + j * r->stride);
}

kiln_status kiln_index_topk_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *kt = kiln_run_in(c, 1);
    const kiln_node *node = kiln_run_node(c);
    int axis = kiln_index_run_axis(c, -1, x->rank);
    int64_t n = x->dims[axis], k = kiln_attr_int(node, "k", 0);
    if (kiln_run_opset(c) >= 10) {
        if (kt->numel != 1 || !kiln_dtype_is_int(kt->dtype))
            return kiln_run_fail(c, KILN_ERR_SHAPE, "K must hold one integer, has %lld elements",
                                 (long long)kt->numel);
        k = kiln_load_i64(kt->dtype, kt->data, 0);
    }
    if (k < 0 || k > n)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "k = %lld is outside [0, %lld] (dim %d of X)", (long long)k,
                             (long long)n, axis);
    int64_t dims[KILN_MAX_RANK];
    memcpy(dims, x->dims, (size_t)x->rank * sizeof *dims);
    dims[axis] = k;
    kiln_value *vals, *inds;
    KILN_TRY(kiln_index_out(c, 0, x->dtype, x->rank, dims, &vals));
    KILN_TRY(kiln_index_out(c, 1, KILN_DTYPE_INT64, x->rank, dims, &inds));
    int64_t outer = kiln_index_prod(x->dims, 0, axis), inner = kiln_index_prod(x->dims, axis + 1, x->rank);
    int64_t *buf = malloc(2 * ((size_t)n + 1) * sizeof *buf);
    if (!buf) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    row r = {x, 0, inner, kiln_attr_int(node, "largest", 1) ? -1 : 1};
    /* the stable sort keeps the lower index first among equal values */
    for (int64_t o = 0; o < outer; o++)
        for (int64_t e = 0; e < inner; e++) {
            r.base = o * n * inner + e;
            for (int64_t j = 0; j < n; j++) buf[j] = j;
            kiln_index_sort(buf, buf + n + 1, n, row_cmp, &r);
            for (int64_t j = 0; j < k; j++) {
                int64_t yi = (o * k + j) * inner + e;
                ((int64_t *)inds->data)[yi] = buf[j];
                kiln_status st = kiln_index_copy(vals, yi, x, r.base + buf[j] * inner, 1, kiln_run_err(c));
                if (st) {
                    free(buf);
                    return st;
                }
            }
        }
    free(buf);
    return KILN_OK;
}

/* ---- ArgMax, ArgMin ---- */

kiln_status kiln_index_arg_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    const kiln_node *n = kiln_infer_node(c);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs an input");
    if (x->dtype == KILN_DTYPE_STRING) return kiln_infer_fail(c, KILN_ERR_MODEL, "string input");
    int axis;
    KILN_TRY(kiln_index_infer_axis(c, 0, x->rank, &axis));
    kiln_dim dims[KILN_MAX_RANK];
    int r = 0;
    for (int k = 0; k < x->rank; k++) {
        if (k != axis)
            dims[r++] = x->dims[k];
        else if (kiln_attr_int(n, "keepdims", 1))
            dims[r++] = kiln_dim_const(1);
    }
    return kiln_infer_set_out(c, 0, KILN_DTYPE_INT64, r, dims);
}

/* Index of the extreme along axis: sign 1 for the largest, -1 for the smallest. */
static kiln_status arg_run(kiln_run_ctx *c, int sign)
{
    const kiln_value *x = kiln_run_in(c, 0);
    const kiln_node *node = kiln_run_node(c);
    kiln_value *y = kiln_run_out(c, 0);
    int axis = kiln_index_run_axis(c, 0, x->rank);
    bool last = kiln_attr_int(node, "select_last_index", 0) != 0;
    int64_t outer = kiln_index_prod(x->dims, 0, axis), n = x->dims[axis];
    int64_t inner = kiln_index_prod(x->dims, axis + 1, x->rank);
    if (n == 0 && outer * inner > 0)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "reducing an empty axis %d", axis);
    row r = {x, 0, inner, sign};
    for (int64_t o = 0; o < outer; o++)
        for (int64_t e = 0; e < inner; e++) {
            r.base = o * n * inner + e;
            int64_t best = 0;
            for (int64_t j = 1; j < n; j++) {
                int cmp = row_cmp(&r, j, best);
                if (cmp > 0 || (last && cmp == 0)) best = j;
            }
            ((int64_t *)y->data)[o * inner + e] = best;
        }
    return KILN_OK;
}

kiln_status kiln_index_argmax_run(kiln_run_ctx *c) { return arg_run(c, 1); }
kiln_status kiln_index_argmin_run(kiln_run_ctx *c) { return arg_run(c, -1); }
