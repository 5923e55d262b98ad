/* nn_pool.c - AveragePool, MaxPool (with Indices), LpPool, their Global forms, and MaxUnpool over
 * X [N, C, D1..Dn]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/nn_internal.h"
#include "ops/op.h"
#include "ops/util.h"

enum { POOL_AVG, POOL_MAX, POOL_LP };

/* Validates p where the op has one. */
static kiln_status check_p(kiln_infer_ctx *c)
{
    double p = kiln_nn_pool_p(kiln_infer_node(c));
    if (!(p > 0) || p > 1e6) return kiln_infer_fail(c, KILN_ERR_MODEL, "p = %g must be positive", p);
    return KILN_OK;
}

kiln_status kiln_nn_pool_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_nn_geom g;
    char msg[160];
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input X");
    if (x->dtype && !kiln_dtype_is_float(x->dtype) && !kiln_dtype_is_int(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "X has dtype %s, not a number", kiln_dtype_name(x->dtype));
    if (!kiln_nn_pool_geom(n, &g, msg, sizeof msg)) return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    KILN_TRY(check_p(c));
    if (kiln_attr_int(n, "storage_order", 0) & ~1LL)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "storage_order must be 0 or 1");
    if (x->rank < 0) {
        KILN_TRY(kiln_infer_set_out_unknown(c, 0, x->dtype));
        return kiln_infer_set_out_unknown(c, 1, KILN_DTYPE_INT64);
    }
    if (x->rank != g.nsp + 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X has rank %d but kernel_shape has %d values", x->rank,
                               g.nsp);
    kiln_dim dims[KILN_MAX_RANK];
    dims[0] = x->dims[0], dims[1] = x->dims[1];
    for (int i = 0; i < g.nsp; i++) {
        dims[2 + i] = kiln_nn_geom_out_dim(kiln_infer_dims(c), &g, i, x->dims[2 + i], kiln_dim_const(g.kernel[i]));
        if (kiln_dim_is_const(dims[2 + i]) && dims[2 + i].c < 1)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "spatial dim %d: window larger than the padded input", i);
    }
    KILN_TRY(kiln_infer_set_out(c, 0, x->dtype, x->rank, dims));
    return kiln_infer_set_out(c, 1, KILN_DTYPE_INT64, x->rank, dims);
}

/* Flat index of spatial position p in X's [N, C, ...] for MaxPool's Indices: row-major over
 * the whole tensor, or with the spatial part column-major when storage_order is 1. */
static int64_t max_index(int nsp, const int64_t *sd, const int64_t *p, int64_t plane_base, bool col_major)
{
    int64_t off = 0;
    if (col_major)
        for (int i = nsp - 1; i >= 0; i--) off = off * sd[i] + p[i];
    else
        for (int i = 0; i < nsp; i++) off = off * sd[i] + p[i];
    return plane_base + off;
}

static kiln_status pool_run(kiln_run_ctx *c, int mode)
{
    const kiln_node *node = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0), *I = kiln_run_out(c, 1);
    kiln_nn_geom g;
    char msg[160];
    int64_t od[KILN_MAX_RANK];
    if (!kiln_nn_pool_geom(node, &g, msg, sizeof msg)) return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    if (!kiln_nn_geom_resolve(&g, X->dims + 2, od))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "window larger than the padded input");
    int nsp = g.nsp;
    bool include_pad = kiln_attr_int(node, "count_include_pad", 0) != 0;
    bool col_major = kiln_attr_int(node, "storage_order", 0) == 1;
    double pw = kiln_nn_pool_p(node);
    const int64_t *sd = X->dims + 2;
    int64_t in_sz = kiln_nn_prod(nsp, sd), out_sz = kiln_nn_prod(nsp, od), k_sz = kiln_nn_prod(nsp, g.kernel);
    double *x = kiln_nn_load_f64(X);
    if (!x) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    int64_t o[KILN_MAX_RANK] = {0}, q[KILN_MAX_RANK] = {0}, p[KILN_MAX_RANK], best_p[KILN_MAX_RANK] = {0};
    for (int64_t plane = 0; plane < X->dims[0] * X->dims[1]; plane++) {
        const double *xp = x + plane * in_sz;
        for (int64_t op = 0; op < out_sz; op++, kiln_nn_index_next(nsp, od, o)) {
            double acc = 0, best = 0;
            int64_t n_in = 0, n_counted = 0;
            bool found = false;
            for (int64_t kp = 0; kp < k_sz; kp++, kiln_nn_index_next(nsp, g.kernel, q)) {
                bool inside = true, counted = true;
                int64_t off = 0;
                for (int i = 0; i < nsp; i++) {
                    p[i] = o[i] * g.strides[i] - g.pads[i] + q[i] * g.dilations[i];
                    inside = inside && p[i] >= 0 && p[i] < sd[i];
                    counted = counted && p[i] < sd[i] + g.pads[nsp + i];
                    off = off * sd[i] + p[i];
                }
                n_counted += counted;
                if (!inside) continue;
                double v = xp[off];
                n_in++;
                if (mode == POOL_AVG) acc += v;
                else if (mode == POOL_LP) acc += pow(fabs(v), pw);
                else if (!found || v > best || (isnan(v) && !isnan(best))) {
                    best = v, found = true;
                    memcpy(best_p, p, (size_t)nsp * sizeof *p);
                }
            }
            int64_t yi = plane * out_sz + op;
            double r = mode == POOL_MAX  ? best
                       : mode == POOL_LP ? pow(acc, 1 / pw)
                                         : acc / (double)(include_pad ? n_counted : n_in);
            kiln_store_f64(Y->dtype, Y->data, yi, r);
            if (I) ((int64_t *)I->data)[yi] = max_index(nsp, sd, best_p, plane * in_sz, col_major);
        }
    }
    free(x);
    return KILN_OK;
}

kiln_status kiln_nn_average_pool_run(kiln_run_ctx *c)
{
    return pool_run(c, POOL_AVG);
}
kiln_status kiln_nn_max_pool_run(kiln_run_ctx *c)
{
    return pool_run(c, POOL_MAX);
}
kiln_status kiln_nn_lp_pool_run(kiln_run_ctx *c)
{
    return pool_run(c, POOL_LP);
}

kiln_status kiln_nn_global_pool_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input X");
    if (x->dtype && !kiln_dtype_is_float(x->dtype) && !kiln_dtype_is_int(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "X has dtype %s, not a number", kiln_dtype_name(x->dtype));
    KILN_TRY(check_p(c));
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    if (x->rank < 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X needs rank >= 2, has %d", x->rank);
    kiln_dim dims[KILN_MAX_RANK];
    for (int i = 0; i < x->rank; i++) dims[i] = i < 2 ? x->dims[i] : kiln_dim_const(1);
    return kiln_infer_set_out(c, 0, x->dtype, x->rank, dims);
}

static kiln_status global_pool_run(kiln_run_ctx *c, int mode)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    double pw = kiln_nn_pool_p(kiln_run_node(c));
    int64_t planes = X->dims[0] * X->dims[1], sz = planes ? X->numel / planes : 0;
    for (int64_t pl = 0; pl < planes; pl++) {
        double acc = mode == POOL_MAX ? -INFINITY : 0;
        for (int64_t i = 0; i < sz; i++) {
            double v = kiln_load_f64(X->dtype, X->data, pl * sz + i);
            if (mode == POOL_AVG) acc += v;
            else if (mode == POOL_LP) acc += pow(fabs(v), pw);
            else if (v > acc || isnan(v)) acc = v;
        }
        double r = mode == POOL_MAX ? acc : mode == POOL_LP ? pow(acc, 1 / pw) : acc / (double)sz;
        kiln_store_f64(Y->dtype, Y->data, pl, r);
    }
    return KILN_OK;
}

kiln_status kiln_nn_global_average_pool_run(kiln_run_ctx *c)
{
    return global_pool_run(c, POOL_AVG);
}
kiln_status kiln_nn_global_max_pool_run(kiln_run_ctx *c)
{
    return global_pool_run(c, POOL_MAX);
}
kiln_status kiln_nn_global_lp_pool_run(kiln_run_ctx *c)
{
    return global_pool_run(c, POOL_LP);
}

/* ---- MaxUnpool: X, I (int64, same shape), optional output_shape ---- */

/* The default output size of spatial dim i: (in-1)*stride + kernel - pads. */
static kiln_dim unpool_dim(kiln_dimtab *t, const kiln_nn_geom *g, int i, kiln_dim in)
{
    kiln_dim d = kiln_dim_mul(t, kiln_dim_sub(t, in, kiln_dim_const(1)), kiln_dim_const(g->strides[i]));
    return kiln_dim_add(t, d, kiln_dim_const(g->kernel[i] - g->pads[i] - g->pads[g->nsp + i]));
}

kiln_status kiln_nn_max_unpool_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *ind = kiln_infer_in(c, 1);
    kiln_nn_geom g;
    char msg[160];
    if (!x || !ind) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs X and I");
    if (!kiln_nn_pool_geom(kiln_infer_node(c), &g, msg, sizeof msg))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    if (x->rank >= 0 && x->rank != g.nsp + 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X has rank %d but kernel_shape has %d values", x->rank,
                               g.nsp);
    if (x->rank >= 0 && ind->rank >= 0) {
        if (ind->rank != x->rank) return kiln_infer_fail(c, KILN_ERR_SHAPE, "I and X ranks differ");
        for (int i = 0; i < x->rank; i++)
            KILN_TRY(kiln_infer_require_equal(c, x->dims[i], ind->dims[i], "X and I dims"));
    }
    int rank = g.nsp + 2, n;
    kiln_dim dims[KILN_MAX_RANK];
    if (kiln_infer_in(c, 2)) {
        if (!kiln_infer_in_dims_value(c, 2, dims, KILN_MAX_RANK, &n)) {
            for (int i = 0; i < rank; i++) dims[i] = kiln_infer_fresh(c, "unpool");
        } else if (n != rank) {
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "output_shape has %d values, expected %d", n, rank);
        }
        return kiln_infer_set_out(c, 0, x->dtype, rank, dims);
    }
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    dims[0] = x->dims[0], dims[1] = x->dims[1];
    for (int i = 0; i < g.nsp; i++) dims[2 + i] = unpool_dim(kiln_infer_dims(c), &g, i, x->dims[2 + i]);
    return kiln_infer_set_out(c, 0, x->dtype, rank, dims);
}

/* Indices address the default-size output; an explicit output_shape embeds that block at the
 * origin of a larger zero tensor (as the ONNX reference does). */
kiln_status kiln_nn_max_unpool_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *I = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_nn_geom g;
    char msg[160];
    if (!kiln_nn_pool_geom(kiln_run_node(c), &g, msg, sizeof msg)) return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    if (I->dtype != KILN_DTYPE_INT64) return kiln_run_fail(c, KILN_ERR_MODEL, "I must be int64");
    int rank = X->rank;
    int64_t dd[KILN_MAX_RANK], total = 1;
    for (int i = 0; i < rank; i++) {
        dd[i] = i < 2 ? X->dims[i] : unpool_dim(NULL, &g, i - 2, kiln_dim_const(X->dims[i])).c;
        total *= dd[i];
    }
    size_t es = kiln_dtype_size(X->dtype);
    for (int64_t e = 0; e < X->numel; e++) {
        int64_t idx = ((const int64_t *)I->data)[e], rest = idx, off = 0, stride = 1;
        if (idx < 0 || idx >= total)
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "index %lld out of range [0, %lld)", (long long)idx,
                                 (long long)total);
        for (int i = rank - 1; i >= 0; i--) {
            int64_t coord = rest % dd[i];
            rest /= dd[i];
            if (coord >= Y->dims[i])
                return kiln_run_fail(c, KILN_ERR_SHAPE, "index %lld falls outside output_shape",
                                     (long long)idx);
            off += coord * stride;
            stride *= Y->dims[i];
        }
        memcpy((char *)Y->data + (size_t)off * es, (const char *)X->data + (size_t)e * es, es);
    }
    return KILN_OK;
}
