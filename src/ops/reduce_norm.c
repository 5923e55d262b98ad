/* reduce_norm.c - normalizations: Layer, RMS, Group, Instance, Batch, Lp, MeanVariance, LRN.
 * Statistics are computed in double whatever the input type (stash_type only chooses the
 * dtype of LayerNormalization's Mean and InvStdDev outputs). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/reduce_internal.h"
#include "ops/semantics.h"
#include "ops/util.h"

/* Standardizes each of `rows` contiguous rows of `cols` values of x into y:
 * y = (x - mean) * inv with inv = 1 / sqrt(var + eps); without `center`, mean is taken as 0
 * and var is the mean square (RMS normalization). mean/inv (per row) may be NULL. */
static void standardize_rows(const double *x, int64_t rows, int64_t cols, bool center, double eps, double *y,
                             double *mean, double *inv)
{
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * cols;
        double m = 0, v = 0;
        if (center) {
            for (int64_t j = 0; j < cols; j++) m += xr[j];
            m /= (double)cols;
        }
        for (int64_t j = 0; j < cols; j++) v += (xr[j] - m) * (xr[j] - m);
        double s = 1.0 / sqrt(v / (double)cols + eps);
        for (int64_t j = 0; j < cols; j++) y[r * cols + j] = (xr[j] - m) * s;
        if (mean) mean[r] = m;
        if (inv) inv[r] = s;
    }
}

/* Allocates n doubles (at least one); fails the run on no memory. */
static kiln_status alloc_f64(kiln_run_ctx *c, int64_t n, double **out)
{
    *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!*out) return kiln_run_fail(c, KILN_ERR_NOMEM, "no memory for %lld values", (long long)n);
    return KILN_OK;
}

/* y = buf * scale + bias with scale and bias (bias may be NULL) broadcast to x's shape. */
static kiln_status apply_affine(kiln_run_ctx *c, const kiln_value *x, const double *buf, const kiln_value *scale,
                                const kiln_value *bias, kiln_value *y)
{
    if (!kiln_value_bcasts_to(scale, x) || (bias && !kiln_value_bcasts_to(bias, x)))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "Scale (rank %d) or B (rank %d) does not broadcast to X (rank %d)",
                             scale->rank, bias ? bias->rank : 0, x->rank);
    int64_t st[2][KILN_MAX_RANK];
    kiln_bcast_strides(x->rank, x->dims, scale->rank, scale->dims, st[0]);
    if (bias) kiln_bcast_strides(x->rank, x->dims, bias->rank, bias->dims, st[1]);
    else memset(st[1], 0, sizeof st[1]);
    kiln_iter it;
    kiln_iter_init(&it, x->rank, x->dims, 2, st);
    for (int64_t i = 0; i < x->numel; i++, kiln_iter_next(&it)) {
        double v = buf[i] * kiln_load_f64(scale->dtype, scale->data, it.off[0]);
        if (bias) v += kiln_load_f64(bias->dtype, bias->data, it.off[1]);
        kiln_store_f64(y->dtype, y->data, i, v);
    }
    return KILN_OK;
}

/* ---- LayerNormalization, RMSNormalization ---- */

static kiln_status trailing_norm_infer(kiln_infer_ctx *c, bool with_stats)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x || !kiln_infer_in(c, 1)) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs X and Scale");
    KILN_TRY(kiln_infer_same_as_input(c, 0, 0));
    if (!with_stats) return KILN_OK;
    kiln_dtype sdt = (kiln_dtype)kiln_attr_int(n, "stash_type", KILN_DTYPE_FLOAT32);
    if (x->rank < 0) {
        KILN_TRY(kiln_infer_set_out_unknown(c, 1, sdt));
        return kiln_infer_set_out_unknown(c, 2, sdt);
    }
    int64_t a = kiln_attr_int(n, "axis", -1);
    int axis;
    if (!kiln_axis_norm(a, x->rank, &axis))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld out of range for X of rank %d", (long long)a,
                               x->rank);
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0; k < x->rank; k++) dims[k] = k < axis ? x->dims[k] : kiln_dim_const(1);
    KILN_TRY(kiln_infer_set_out(c, 1, sdt, x->rank, dims));
    return kiln_infer_set_out(c, 2, sdt, x->rank, dims);
}

/* Normalizes over the axes from `axis` to the end, then scales (and shifts, with B). */
static kiln_status trailing_norm_run(kiln_run_ctx *c, bool center)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0), *scale = kiln_run_in(c, 1), *bias = center ? kiln_run_in(c, 2) : NULL;
    int64_t a = kiln_attr_int(n, "axis", -1);
    int axis;
    if (!kiln_axis_norm(a, x->rank, &axis))
        return kiln_run_fail(c, KILN_ERR_MODEL, "axis %lld out of range for X of rank %d", (long long)a, x->rank);
    int64_t rows = 1, cols = 1;
    for (int k = 0; k < x->rank; k++) *(k < axis ? &rows : &cols) *= x->dims[k];
    double *xb, *yb = NULL, *stats = NULL;
    kiln_status st;
    KILN_TRY(kiln_reduce_load_all(c, x, &xb));
    if ((st = alloc_f64(c, x->numel, &yb)) || (st = alloc_f64(c, 2 * rows, &stats))) goto out;
    standardize_rows(xb, rows, cols, center, kiln_attr_float(n, "epsilon", 1e-5f), yb, stats, stats + rows);
    if ((st = apply_affine(c, x, yb, scale, bias, kiln_run_out(c, 0)))) goto out;
    for (int o = 1; o <= 2; o++) {
        kiln_value *s = kiln_run_out(c, o);
        if (!center || !s) continue;
        for (int64_t r = 0; r < rows && r < s->numel; r++)
            kiln_store_f64(s->dtype, s->data, r, stats[(o - 1) * rows + r]);
    }
out:
    free(xb);
    free(yb);
    free(stats);
    return st;
}

kiln_status kiln_layernorm_infer(kiln_infer_ctx *c) { return trailing_norm_infer(c, true); }
kiln_status kiln_layernorm_run(kiln_run_ctx *c) { return trailing_norm_run(c, true); }
kiln_status kiln_rmsnorm_infer(kiln_infer_ctx *c) { return trailing_norm_infer(c, false); }
kiln_status kiln_rmsnorm_run(kiln_run_ctx *c) { return trailing_norm_run(c, false); }

/* ---- GroupNormalization, InstanceNormalization ---- */

static kiln_status channel_norm_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x || !kiln_infer_in(c, 1) || !kiln_infer_in(c, 2))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs X, scale and B");
    if (x->rank >= 0 && x->rank < 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must have rank >= 2 ([N, C, ...]), has rank %d", x->rank);
    return kiln_infer_same_as_input(c, 0, 0);
}

/* Normalizes X [N, C, ...] over each group of C / groups channels (and the spatial dims),
 * then applies scale and bias, which hold one value per channel (per_channel) or per group. */
static kiln_status channel_norm_run(kiln_run_ctx *c, int64_t groups, bool per_channel, double eps)
{
    const kiln_value *x = kiln_run_in(c, 0), *scale = kiln_run_in(c, 1), *bias = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    int64_t N = x->dims[0], C = x->dims[1], S = C && N ? x->numel / (N * C) : 0;
    if (groups <= 0 || C % groups)
        return kiln_run_fail(c, KILN_ERR_MODEL, "num_groups %lld does not divide the %lld channels",
                             (long long)groups, (long long)C);
    int64_t np = per_channel ? C : groups;
    if (scale->numel != np || bias->numel != np)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "scale and B need %lld values, have %lld and %lld", (long long)np,
                             (long long)scale->numel, (long long)bias->numel);
    double *xb, *yb;
    KILN_TRY(kiln_reduce_load_all(c, x, &xb));
    if (alloc_f64(c, x->numel, &yb)) {
        free(xb);
        return KILN_ERR_NOMEM;
    }
    if (x->numel) standardize_rows(xb, N * groups, C / groups * S, true, eps, yb, NULL, NULL);
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t ch = i / S % C, p = per_channel ? ch : ch / (C / groups);
        double v = yb[i] * kiln_load_f64(scale->dtype, scale->data, p) + kiln_load_f64(bias->dtype, bias->data, p);
        kiln_store_f64(y->dtype, y->data, i, v);
    }
    free(xb);
    free(yb);
    return KILN_OK;
}

kiln_status kiln_groupnorm_infer(kiln_infer_ctx *c) { return channel_norm_infer(c); }

/* scale and bias are per group in opset 18, per channel from 21 */
kiln_status kiln_groupnorm_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    return channel_norm_run(c, kiln_attr_int(n, "num_groups", 0), kiln_run_opset(c) >= 21,
                            kiln_attr_float(n, "epsilon", 1e-5f));
}

kiln_status kiln_instancenorm_infer(kiln_infer_ctx *c) { return channel_norm_infer(c); }

kiln_status kiln_instancenorm_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    return channel_norm_run(c, x->dims[1], true, kiln_attr_float(kiln_run_node(c), "epsilon", 1e-5f));
}

/* ---- BatchNormalization ---- */

/* Training mode: the training_mode attribute from opset 14; before, the presence of the
 * extra outputs (and is_test = 0 before opset 7). */
static bool batchnorm_training(const kiln_node *n, int opset, bool has_stats_out)
{
    if (opset >= 14) return kiln_attr_int(n, "training_mode", 0) != 0;
    if (opset < 7 && kiln_attr_int(n, "is_test", 0) != 0) return false;
    return has_stats_out;
}

kiln_status kiln_batchnorm_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    for (int i = 0; i < 5; i++)
        if (!kiln_infer_in(c, i))
            return kiln_infer_fail(c, KILN_ERR_MODEL, "needs 5 inputs, input %d is missing", i);
    if (x->rank >= 0 && x->rank < 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must have rank >= 2 ([N, C, ...]), has rank %d", x->rank);
    KILN_TRY(kiln_infer_same_as_input(c, 0, 0));
    /* running mean/var (1, 2) and saved mean/var (3, 4, before opset 14) */
    for (int o = 1; o < 5; o++)
        if (kiln_infer_has_out(c, o)) KILN_TRY(kiln_infer_same_as_input(c, o, o < 3 ? o + 2 : o));
    return KILN_OK;
}

kiln_status kiln_batchnorm_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    int opset = kiln_run_opset(c);
    const kiln_value *x = kiln_run_in(c, 0), *p[4]; /* scale, B, input_mean, input_var */
    for (int i = 0; i < 4; i++) p[i] = kiln_run_in(c, i + 1);
    kiln_value *y = kiln_run_out(c, 0);
    double eps = kiln_attr_float(n, "epsilon", 1e-5f), mom = kiln_attr_float(n, "momentum", 0.9f);
    bool training = batchnorm_training(n, opset, kiln_run_has_out(c, 1));
    int64_t N = x->dims[0], C = x->dims[1], S = C && N ? x->numel / (N * C) : 0;
    if (opset < 9 && kiln_attr_int(n, "spatial", 1) == 0) {
        /* non-spatial: one set of parameters per (channel, position) */
        C *= S;
        S = 1;
    }
    for (int i = 0; i < 4; i++)
        if (p[i]->numel != C)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "input %d has %lld values, X has %lld channels", i + 1,
                                 (long long)p[i]->numel, (long long)C);
    double *stats;
    KILN_TRY(alloc_f64(c, 2 * C, &stats));
    double *mean = stats, *var = stats + C;
    for (int64_t ch = 0; ch < C; ch++) {
        mean[ch] = kiln_load_f64(p[2]->dtype, p[2]->data, ch);
        var[ch] = kiln_load_f64(p[3]->dtype, p[3]->data, ch);
        if (!training || N * S == 0) continue;
        double m = 0, v = 0;
        for (int64_t b = 0; b < N; b++)
            for (int64_t s = 0; s < S; s++) m += kiln_load_f64(x->dtype, x->data, (b * C + ch) * S + s);
        m /= (double)(N * S);
        for (int64_t b = 0; b < N; b++)
            for (int64_t s = 0; s < S; s++) {
                double d = kiln_load_f64(x->dtype, x->data, (b * C + ch) * S + s) - m;
                v += d * d;
            }
        v /= (double)(N * S);
        double run[2] = {mean[ch] * mom + m * (1 - mom), var[ch] * mom + v * (1 - mom)}, cur[2] = {m, v};
        for (int o = 1; o < 5; o++) {
            kiln_value *s = kiln_run_out(c, o);
            if (s && ch < s->numel) kiln_store_f64(s->dtype, s->data, ch, o < 3 ? run[o - 1] : cur[o - 3]);
        }
        mean[ch] = m;
        var[ch] = v;
    }
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t ch = i / S % C;
        double v = (kiln_load_f64(x->dtype, x->data, i) - mean[ch]) / sqrt(var[ch] + eps);
        v = v * kiln_load_f64(p[0]->dtype, p[0]->data, ch) + kiln_load_f64(p[1]->dtype, p[1]->data, ch);
        kiln_store_f64(y->dtype, y->data, i, v);
    }
    free(stats);
    return KILN_OK;
}

/* ---- LpNormalization ---- */

kiln_status kiln_lpnorm_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input 0 (input) is missing");
    int64_t p = kiln_attr_int(n, "p", 2), a = kiln_attr_int(n, "axis", -1);
    int axis;
    if (p != 1 && p != 2) return kiln_infer_fail(c, KILN_ERR_MODEL, "p must be 1 or 2, is %lld", (long long)p);
    if (x->rank >= 0 && !kiln_axis_norm(a, x->rank, &axis))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld out of range for rank %d", (long long)a, x->rank);
    return kiln_infer_same_as_input(c, 0, 0);
}

kiln_status kiln_lpnorm_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int64_t p = kiln_attr_int(nd, "p", 2), a = kiln_attr_int(nd, "axis", -1);
    int axis;
    if (!kiln_axis_norm(a, x->rank, &axis))
        return kiln_run_fail(c, KILN_ERR_MODEL, "axis %lld out of range for rank %d", (long long)a, x->rank);
    int64_t outer = 1, n = x->dims[axis], inner = 1;
    for (int k = 0; k < x->rank; k++) {
        if (k < axis) outer *= x->dims[k];
        else if (k > axis) inner *= x->dims[k];
    }
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * n * inner + i;
            double norm = 0;
            for (int64_t j = 0; j < n; j++) {
                double v = kiln_load_f64(x->dtype, x->data, base + j * inner);
                norm += p == 1 ? fabs(v) : v * v;
            }
            if (p == 2) norm = sqrt(norm);
            for (int64_t j = 0; j < n; j++) {
                double v = kiln_load_f64(x->dtype, x->data, base + j * inner);
                kiln_store_f64(y->dtype, y->data, base + j * inner, norm == 0 ? 0 : v / norm);
            }
        }
    }
    return KILN_OK;
}

/* ---- MeanVarianceNormalization ---- */

static const int64_t mvn_default_axes[] = {0, 2, 3};

/* The reduced axes; false when one is out of range or repeated. */
static bool mvn_axes(const kiln_node *n, int rank, bool *mask)
{
    int na;
    const int64_t *axes = kiln_attr_ints(n, "axes", &na);
    if (!kiln_node_attr(n, "axes")) axes = mvn_default_axes, na = 3;
    memset(mask, 0, (size_t)rank * sizeof *mask);
    for (int i = 0; i < na; i++) {
        int k;
        if (!kiln_axis_norm(axes[i], rank, &k) || mask[k]) return false;
        mask[k] = true;
    }
    return true;
}

kiln_status kiln_mvn_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    bool mask[KILN_MAX_RANK];
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input 0 (X) is missing");
    if (x->rank >= 0 && !mvn_axes(kiln_infer_node(c), x->rank, mask))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axes out of range or repeated for X of rank %d", x->rank);
    return kiln_infer_same_as_input(c, 0, 0);
}

/* y = (x - mean) / (sqrt(var) + 1e-9) over the axes, as the spec's function body. */
kiln_status kiln_mvn_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    bool mask[KILN_MAX_RANK];
    if (!mvn_axes(kiln_run_node(c), x->rank, mask))
        return kiln_run_fail(c, KILN_ERR_MODEL, "axes out of range or repeated for X of rank %d", x->rank);
    int64_t ostr[1][KILN_MAX_RANK], on;
    kiln_reduce_out_strides(x->rank, x->dims, mask, ostr[0], &on);
    if (on == 0) return KILN_OK;
    double count = (double)x->numel / (double)on, *xb, *sums;
    KILN_TRY(kiln_reduce_load_all(c, x, &xb));
    if (alloc_f64(c, 2 * on, &sums)) {
        free(xb);
        return KILN_ERR_NOMEM;
    }
    double *mean = sums, *var = sums + on;
    memset(sums, 0, (size_t)(2 * on) * sizeof(double));
    kiln_iter it;
    kiln_iter_init(&it, x->rank, x->dims, 1, ostr);
    for (int64_t i = 0; i < x->numel; i++, kiln_iter_next(&it)) mean[it.off[0]] += xb[i] / count;
    kiln_iter_init(&it, x->rank, x->dims, 1, ostr);
    for (int64_t i = 0; i < x->numel; i++, kiln_iter_next(&it)) {
        double d = xb[i] - mean[it.off[0]];
        var[it.off[0]] += d * d / count;
    }
    kiln_iter_init(&it, x->rank, x->dims, 1, ostr);
    for (int64_t i = 0; i < x->numel; i++, kiln_iter_next(&it))
        kiln_store_f64(y->dtype, y->data, i, (xb[i] - mean[it.off[0]]) / (sqrt(var[it.off[0]]) + 1e-9));
    free(xb);
    free(sums);
    return KILN_OK;
}

/* ---- LRN ---- */

kiln_status kiln_lrn_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input 0 (X) is missing");
    if (kiln_attr_int(kiln_infer_node(c), "size", 0) <= 0)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "attribute size must be positive");
    if (x->rank >= 0 && x->rank < 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must have rank >= 2 ([N, C, ...]), has rank %d", x->rank);
    return kiln_infer_same_as_input(c, 0, 0);
}

/* y = x / (bias + alpha / size * sum of squares over the channel window)^beta, the window
 * spanning floor((size-1)/2) channels before and ceil((size-1)/2) after. */
kiln_status kiln_lrn_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int64_t size = kiln_attr_int(n, "size", 0), before = (size - 1) / 2, after = size / 2;
    double alpha = kiln_attr_float(n, "alpha", 1e-4f), beta = kiln_attr_float(n, "beta", 0.75f);
    double bias = kiln_attr_float(n, "bias", 1.0f);
    int64_t N = x->dims[0], C = x->dims[1], S = C && N ? x->numel / (N * C) : 0;
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t s = i % S, ch = i / S % C, b = i / (S * C);
        double sq = 0;
        for (int64_t k = ch - before; k <= ch + after; k++) {
            if (k < 0 || k >= C) continue;
            double v = kiln_load_f64(x->dtype, x->data, (b * C + k) * S + s);
            sq += v * v;
        }
        double v = kiln_load_f64(x->dtype, x->data, i) / pow(bias + alpha / (double)size * sq, beta);
        kiln_store_f64(y->dtype, y->data, i, v);
    }
    return KILN_OK;
}
