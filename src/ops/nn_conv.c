/* nn_conv.c - Conv, ConvTranspose, ConvInteger, QLinearConv and DeformConv over any number of
 * spatial dims: X [N, C, D1..Dn], W [M, C/group, k1..kn] (ConvTranspose: [C, M/group, k..]). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/nn_internal.h"
#include "ops/op.h"
#include "ops/semantics.h"
#include "ops/util.h"

/* Kernel sizes for inference: the kernel_shape attribute (checked against W) or W's dims;
 * *known is false when neither is available. */
static kiln_status infer_kernel(kiln_infer_ctx *c, const kiln_type *w, int nsp, kiln_dim *k, bool *known)
{
    int nk;
    const int64_t *ks = kiln_attr_ints(kiln_infer_node(c), "kernel_shape", &nk);
    *known = true;
    if (ks) {
        if (nk != nsp)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "kernel_shape has %d values, expected %d", nk, nsp);
        for (int i = 0; i < nsp; i++) {
            if (ks[i] < 1 || ks[i] > NN_ATTR_MAX)
                return kiln_infer_fail(c, KILN_ERR_MODEL, "kernel_shape[%d] = %lld", i, (long long)ks[i]);
            k[i] = kiln_dim_const(ks[i]);
            if (w->rank >= 0)
                KILN_TRY(kiln_infer_require_equal(c, w->dims[2 + i], k[i], "W spatial dim and kernel_shape"));
        }
        return KILN_OK;
    }
    if (w->rank < 0) {
        *known = false;
        return KILN_OK;
    }
    for (int i = 0; i < nsp; i++) k[i] = w->dims[2 + i];
    return KILN_OK;
}

/* Rank shared by X and W (-1 when both unknown); fails when they differ or are below 3. */
static kiln_status infer_rank(kiln_infer_ctx *c, const kiln_type *x, const kiln_type *w, int *rank)
{
    if (!x || !w) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs X and W");
    if (x->rank >= 0 && w->rank >= 0 && x->rank != w->rank)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X has rank %d but W has rank %d", x->rank, w->rank);
    *rank = x->rank >= 0 ? x->rank : w->rank;
    if (*rank >= 0 && *rank < 3)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X and W need rank >= 3, have %d", *rank);
    return KILN_OK;
}

static kiln_status infer_geom(kiln_infer_ctx *c, int nsp, kiln_nn_geom *g, int64_t *group)
{
    char msg[160];
    if (!kiln_nn_geom_parse(kiln_infer_node(c), nsp, g, msg, sizeof msg))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    *group = kiln_attr_int(kiln_infer_node(c), "group", 1);
    if (*group < 1) return kiln_infer_fail(c, KILN_ERR_MODEL, "group = %lld", (long long)*group);
    return KILN_OK;
}

/* Checks that the optional 1-D input bi (bias or per-channel parameter) has len elements. */
static kiln_status infer_channel_vector(kiln_infer_ctx *c, int bi, kiln_dim len, const char *what)
{
    const kiln_type *b = bi >= 0 ? kiln_infer_in(c, bi) : NULL;
    if (!b || b->rank < 0) return KILN_OK;
    if (b->rank != 1) return kiln_infer_fail(c, KILN_ERR_SHAPE, "%s must be 1-D, has rank %d", what, b->rank);
    return kiln_infer_require_equal(c, b->dims[0], len, what);
}

/* Output [N, M, out...] of a forward convolution with X at input xi, W at wi, bias at bi. */
static kiln_status conv_like_infer(kiln_infer_ctx *c, int xi, int wi, int bi, kiln_dtype dt)
{
    const kiln_type *x = kiln_infer_in(c, xi), *w = kiln_infer_in(c, wi);
    kiln_dimtab *t = kiln_infer_dims(c);
    int rank = -1;
    KILN_TRY(infer_rank(c, x, w, &rank));
    if (rank < 0) return kiln_infer_set_out_unknown(c, 0, dt);
    int nsp = rank - 2;
    kiln_nn_geom g;
    int64_t group = 1;
    KILN_TRY(infer_geom(c, nsp, &g, &group));
    kiln_dim k[KILN_MAX_RANK], dims[KILN_MAX_RANK];
    bool k_known;
    KILN_TRY(infer_kernel(c, w, nsp, k, &k_known));
    dims[0] = x->rank >= 0 ? x->dims[0] : kiln_infer_fresh(c, "N");
    dims[1] = w->rank >= 0 ? w->dims[0] : kiln_infer_fresh(c, "M");
    if (x->rank >= 0 && w->rank >= 0)
        KILN_TRY(kiln_infer_require_equal(c, x->dims[1], kiln_dim_mul(t, w->dims[1], kiln_dim_const(group)),
                                          "X channels (dim 1) and W dim 1 * group"));
    if (kiln_dim_is_const(dims[1]) && dims[1].c % group)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "W has %lld output channels, not divisible by group %lld",
                               (long long)dims[1].c, (long long)group);
    KILN_TRY(infer_channel_vector(c, bi, dims[1], "B length and W dim 0"));
    for (int i = 0; i < nsp; i++) {
        if (x->rank < 0 || !k_known) {
            dims[2 + i] = kiln_infer_fresh(c, "conv");
            continue;
        }
        dims[2 + i] = kiln_nn_geom_out_dim(t, &g, i, x->dims[2 + i], k[i]);
        if (kiln_dim_is_const(dims[2 + i]) && dims[2 + i].c < 1)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "spatial dim %d: window larger than the padded input", i);
    }
    return kiln_infer_set_out(c, 0, dt, rank, dims);
}

/* Run-time geometry of a forward convolution: kernel from W, resolved pads and output sizes. */
static kiln_status run_geom(kiln_run_ctx *c, const kiln_value *X, const kiln_value *W, kiln_nn_geom *g, int64_t *out)
{
    char msg[160];
    if (!kiln_nn_geom_parse(kiln_run_node(c), X->rank - 2, g, msg, sizeof msg))
        return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    memcpy(g->kernel, W->dims + 2, (size_t)g->nsp * sizeof(int64_t));
    if (!kiln_nn_geom_resolve(g, X->dims + 2, out))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "window larger than the padded input");
    return KILN_OK;
}

/* Y[n, m, o] = b[m] + sum over c of m's group and kernel offsets q of
 * X[n, c, o*stride - pad + q*dilation] * W[m, c, q]; taps in the padding read zero. */
static void conv_f64(const kiln_nn_geom *g, int64_t group, const int64_t *xd, const int64_t *wd, const int64_t *od,
                     const double *x, const double *w, const double *b, double *y)
{
    int nsp = g->nsp;
    int64_t N = xd[0], C = xd[1], M = wd[0], Cg = wd[1], Mg = M / group;
    int64_t in_sz = kiln_nn_prod(nsp, xd + 2), k_sz = kiln_nn_prod(nsp, wd + 2), out_sz = kiln_nn_prod(nsp, od + 2);
    int64_t o[KILN_MAX_RANK] = {0}, q[KILN_MAX_RANK] = {0}; /* both wrap back to zeros after a full sweep */
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            const double *wm = w + m * Cg * k_sz;
            const double *xg = x + (n * C + (m / Mg) * Cg) * in_sz;
            double *ym = y + (n * M + m) * out_sz;
            for (int64_t op = 0; op < out_sz; op++, kiln_nn_index_next(nsp, od + 2, o)) {
                double acc = b ? b[m] : 0;
                for (int64_t kp = 0; kp < k_sz; kp++, kiln_nn_index_next(nsp, wd + 2, q)) {
                    int64_t off = 0;
                    bool inside = true;
                    for (int i = 0; i < nsp && inside; i++) {
                        int64_t p = o[i] * g->strides[i] - g->pads[i] + q[i] * g->dilations[i];
                        inside = p >= 0 && p < xd[2 + i];
                        off = off * xd[2 + i] + p;
                    }
                    if (!inside) continue;
                    for (int64_t ci = 0; ci < Cg; ci++) acc += xg[ci * in_sz + off] * wm[ci * k_sz + kp];
                }
                ym[op] = acc;
            }
        }
}

/* Runs conv_f64 over prepared operands, the output into Y through a double buffer. */
static kiln_status conv_exec(kiln_run_ctx *c, const kiln_nn_geom *g, const kiln_value *X, const kiln_value *W,
                             const double *x, const double *w, const double *b, double **yout)
{
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t group = kiln_attr_int(kiln_run_node(c), "group", 1);
    double *y = malloc((size_t)(Y->numel > 0 ? Y->numel : 1) * sizeof *y);
    if (!y) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    conv_f64(g, group, X->dims, W->dims, Y->dims, x, w, b, y);
    *yout = y;
    return KILN_OK;
}

kiln_status kiln_nn_conv_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    return conv_like_infer(c, 0, 1, 2, x ? x->dtype : KILN_DTYPE_UNDEFINED);
}

kiln_status kiln_nn_conv_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1), *B = kiln_run_in(c, 2);
    kiln_nn_geom g;
    int64_t od[KILN_MAX_RANK];
    KILN_TRY(run_geom(c, X, W, &g, od));
    double *x = kiln_nn_load_f64(X), *w = kiln_nn_load_f64(W), *b = B ? kiln_nn_load_f64(B) : NULL, *y = NULL;
    kiln_status st = KILN_ERR_NOMEM;
    if (x && w && (b || !B)) st = conv_exec(c, &g, X, W, x, w, b, &y);
    else kiln_run_fail(c, st, "out of memory");
    if (st == KILN_OK) kiln_nn_store_all_f64(kiln_run_out(c, 0), y);
    free(x), free(w), free(b), free(y);
    return st;
}

/* Operand v minus its zero point zp (scalar, or per index along `axis` of v) as doubles. */
static double *load_minus_zp(const kiln_value *v, const kiln_value *zp, int axis)
{
    double *p = malloc((size_t)(v->numel > 0 ? v->numel : 1) * sizeof *p);
    if (!p) return NULL;
    int64_t inner = kiln_nn_prod(v->rank - axis - 1, v->dims + axis + 1);
    for (int64_t i = 0; i < v->numel; i++)
        p[i] = (double)(kiln_load_i64(v->dtype, v->data, i) - kiln_nn_param_i64(zp, (i / inner) % v->dims[axis]));
    return p;
}

/* Checks the zero points of x (scalar) and w (scalar or one per output channel). */
static kiln_status check_zero_points(kiln_run_ctx *c, const kiln_value *xzp, const kiln_value *W,
                                     const kiln_value *wzp)
{
    if (!kiln_nn_param_ok(xzp, 1)) return kiln_run_fail(c, KILN_ERR_SHAPE, "x zero point must be a scalar");
    if (!kiln_nn_param_ok(wzp, W->dims[0]))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "w zero point has %lld elements, expected 1 or %lld",
                             (long long)wzp->numel, (long long)W->dims[0]);
    return KILN_OK;
}

kiln_status kiln_nn_conv_integer_infer(kiln_infer_ctx *c)
{
    return conv_like_infer(c, 0, 1, -1, KILN_DTYPE_INT32);
}

kiln_status kiln_nn_conv_integer_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1);
    const kiln_value *xzp = kiln_run_in(c, 2), *wzp = kiln_run_in(c, 3);
    kiln_nn_geom g;
    int64_t od[KILN_MAX_RANK];
    KILN_TRY(run_geom(c, X, W, &g, od));
    KILN_TRY(check_zero_points(c, xzp, W, wzp));
    /* The 8-bit operands give products below 2^16: double sums are exact far past any real size. */
    double *x = load_minus_zp(X, xzp, 0), *w = load_minus_zp(W, wzp, 0), *y = NULL;
    kiln_status st = KILN_ERR_NOMEM;
    if (x && w) st = conv_exec(c, &g, X, W, x, w, NULL, &y);
    else kiln_run_fail(c, st, "out of memory");
    if (st == KILN_OK) kiln_nn_store_all_f64(kiln_run_out(c, 0), y);
    free(x), free(w), free(y);
    return st;
}

/* QLinearConv inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
 * y_zero_point, B (int32). */
kiln_status kiln_nn_qlinear_conv_infer(kiln_infer_ctx *c)
{
    const kiln_type *yzp = kiln_infer_in(c, 7), *x = kiln_infer_in(c, 0);
    kiln_dtype dt = yzp ? yzp->dtype : x ? x->dtype : KILN_DTYPE_UNDEFINED;
    return conv_like_infer(c, 0, 3, 8, dt);
}

kiln_status kiln_nn_qlinear_conv_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *xs = kiln_run_in(c, 1), *xzp = kiln_run_in(c, 2);
    const kiln_value *W = kiln_run_in(c, 3), *ws = kiln_run_in(c, 4), *wzp = kiln_run_in(c, 5);
    const kiln_value *ys = kiln_run_in(c, 6), *yzp = kiln_run_in(c, 7), *B = kiln_run_in(c, 8);
    kiln_nn_geom g;
    int64_t od[KILN_MAX_RANK];
    KILN_TRY(run_geom(c, X, W, &g, od));
    KILN_TRY(check_zero_points(c, xzp, W, wzp));
    if (!xs || !ws || !ys || !kiln_nn_param_ok(xs, 1) || !kiln_nn_param_ok(ys, 1) || !kiln_nn_param_ok(yzp, 1) ||
        !kiln_nn_param_ok(ws, W->dims[0]))
        return kiln_run_fail(c, KILN_ERR_SHAPE,
                             "scales must be scalars (w_scale: scalar or one per output channel)");
    double *x = load_minus_zp(X, xzp, 0), *w = load_minus_zp(W, wzp, 0), *b = B ? kiln_nn_load_f64(B) : NULL,
           *y = NULL;
    kiln_status st = KILN_ERR_NOMEM;
    if (x && w && (b || !B)) st = conv_exec(c, &g, X, W, x, w, b, &y);
    else kiln_run_fail(c, st, "out of memory");
    if (st == KILN_OK) {
        kiln_value *Y = kiln_run_out(c, 0);
        int64_t M = Y->dims[1], plane = kiln_nn_prod(Y->rank - 2, Y->dims + 2);
        double xsv = kiln_nn_param_f64(xs, 0), ysv = kiln_nn_param_f64(ys, 0);
        int64_t z = kiln_nn_param_i64(yzp, 0);
        /* float32 scales: float(sum) times the float32 multiplier, rounded once, as ONNX Runtime does */
        bool f32 = xs->dtype == KILN_DTYPE_FLOAT32;
        for (int64_t i = 0; i < Y->numel; i++) {
            double s = kiln_nn_requant_scale(xs->dtype, xsv, kiln_nn_param_f64(ws, (i / plane) % M), ysv);
            kiln_nn_store_quantized(Y, i, f32 ? (double)((float)y[i] * (float)s) : y[i] * s, z);
        }
    }
    free(x), free(w), free(b), free(y);
    return st;
}

/* ---- ConvTranspose ---- */

/* The output_shape attribute's spatial part (its last nsp values), or NULL. */
static const int64_t *transpose_output_shape(const kiln_node *n, int nsp)
{
    int k;
    const int64_t *os = kiln_attr_ints(n, "output_shape", &k);
    return os && k >= nsp ? os + (k - nsp) : NULL;
}

kiln_status kiln_nn_conv_transpose_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0), *w = kiln_infer_in(c, 1);
    kiln_dimtab *t = kiln_infer_dims(c);
    int rank = -1;
    KILN_TRY(infer_rank(c, x, w, &rank));
    if (rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    int nsp = rank - 2;
    kiln_nn_geom g;
    int64_t group = 1, opad[KILN_MAX_RANK] = {0};
    KILN_TRY(infer_geom(c, nsp, &g, &group));
    int nop;
    const int64_t *op = kiln_attr_ints(n, "output_padding", &nop);
    if (op && nop != nsp)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "output_padding has %d values, expected %d", nop, nsp);
    for (int i = 0; op && i < nsp; i++) opad[i] = op[i];
    const int64_t *os = transpose_output_shape(n, nsp);
    int nos;
    if (kiln_attr_ints(n, "output_shape", &nos) && nos != nsp && nos != nsp + 2)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "output_shape has %d values, expected %d or %d", nos, nsp,
                               nsp + 2);
    for (int i = 0; os && i < nsp; i++)
        if (os[i] < 0 || os[i] > NN_ATTR_MAX)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "output_shape value %lld is out of range",
                                   (long long)os[i]);
    for (int i = 0; i < nsp; i++)
        if (opad[i] < 0 || opad[i] > NN_ATTR_MAX)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "output_padding value %lld is out of range",
                                   (long long)opad[i]);
    kiln_dim k[KILN_MAX_RANK], dims[KILN_MAX_RANK];
    bool k_known;
    KILN_TRY(infer_kernel(c, w, nsp, k, &k_known));
    dims[0] = x->rank >= 0 ? x->dims[0] : kiln_infer_fresh(c, "N");
    dims[1] = w->rank >= 0 ? kiln_dim_mul(t, w->dims[1], kiln_dim_const(group)) : kiln_infer_fresh(c, "M");
    if (x->rank >= 0 && w->rank >= 0)
        KILN_TRY(kiln_infer_require_equal(c, x->dims[1], w->dims[0], "X channels and W dim 0"));
    if (w->rank >= 0 && kiln_dim_is_const(w->dims[0]) && w->dims[0].c % group)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "W dim 0 (%lld) not divisible by group %lld",
                               (long long)w->dims[0].c, (long long)group);
    KILN_TRY(infer_channel_vector(c, 2, dims[1], "B length and output channels"));
    for (int i = 0; i < nsp; i++) {
        kiln_dim s = kiln_dim_const(g.strides[i]);
        if (os) dims[2 + i] = kiln_dim_const(os[i]);
        else if (x->rank < 0 || !k_known) dims[2 + i] = kiln_infer_fresh(c, "convt");
        else if (g.auto_pad == NN_PAD_SAME_UPPER || g.auto_pad == NN_PAD_SAME_LOWER)
            dims[2 + i] = kiln_dim_mul(t, x->dims[2 + i], s);
        else {
            /* stride*(in-1) + output_padding + dilation*(k-1) + 1 - pads */
            kiln_dim span =
                kiln_dim_mul(t, kiln_dim_const(g.dilations[i]), kiln_dim_sub(t, k[i], kiln_dim_const(1)));
            kiln_dim d = kiln_dim_mul(t, s, kiln_dim_sub(t, x->dims[2 + i], kiln_dim_const(1)));
            d = kiln_dim_add(t, d, span);
            dims[2 + i] = kiln_dim_add(t, d, kiln_dim_const(opad[i] + 1 - g.pads[i] - g.pads[nsp + i]));
        }
        if (kiln_dim_is_const(dims[2 + i]) && dims[2 + i].c < 0)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "spatial dim %d of the output is negative", i);
    }
    return kiln_infer_set_out(c, 0, x->dtype, rank, dims);
}

bool kiln_nn_conv_transpose_geom(const kiln_node *node, int nsp, const int64_t *xdims, const int64_t *wdims,
                            const int64_t *ydims, kiln_nn_geom *g, char *msg, int size)
{
    if (!kiln_nn_geom_parse(node, nsp, g, msg, size)) return false;
    int64_t opad[KILN_MAX_RANK] = {0};
    int nop;
    const int64_t *op = kiln_attr_ints(node, "output_padding", &nop);
    for (int i = 0; op && i < nsp && i < nop; i++) opad[i] = op[i];
    /* pads derived from the output size when it is given or SAME; SAME_UPPER puts the odd one at the end */
    if (transpose_output_shape(node, nsp) || g->auto_pad == NN_PAD_SAME_UPPER || g->auto_pad == NN_PAD_SAME_LOWER)
        for (int i = 0; i < nsp; i++) {
            int64_t total = g->strides[i] * (xdims[2 + i] - 1) + opad[i] + g->dilations[i] * (wdims[2 + i] - 1) + 1 -
                            ydims[2 + i];
            kiln_same_pads(total, g->auto_pad == NN_PAD_SAME_UPPER, &g->pads[i], &g->pads[nsp + i]);
        }
    return true;
}

kiln_status kiln_nn_conv_transpose_run(kiln_run_ctx *c)
{
    const kiln_node *node = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1), *B = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_nn_geom g;
    char msg[160];
    int nsp = X->rank - 2;
    if (!kiln_nn_conv_transpose_geom(node, nsp, X->dims, W->dims, Y->dims, &g, msg, sizeof msg))
        return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    int64_t group = kiln_attr_int(node, "group", 1);
    int64_t N = X->dims[0], C = X->dims[1], Mg = W->dims[1], M = Y->dims[1], Cg = C / group;
    int64_t in_sz = kiln_nn_prod(nsp, X->dims + 2), k_sz = kiln_nn_prod(nsp, W->dims + 2),
            out_sz = kiln_nn_prod(nsp, Y->dims + 2);
    double *x = kiln_nn_load_f64(X), *w = kiln_nn_load_f64(W),
           *y = calloc((size_t)(Y->numel > 0 ? Y->numel : 1), sizeof *y);
    kiln_status st = KILN_OK;
    if (!x || !w || !y) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    int64_t ii[KILN_MAX_RANK] = {0}, q[KILN_MAX_RANK] = {0};
    for (int64_t n = 0; n < N; n++)
        for (int64_t ip = 0; ip < in_sz; ip++, kiln_nn_index_next(nsp, X->dims + 2, ii))
            for (int64_t kp = 0; kp < k_sz; kp++, kiln_nn_index_next(nsp, W->dims + 2, q)) {
                int64_t off = 0;
                bool inside = true;
                for (int i = 0; i < nsp && inside; i++) {
                    int64_t p = ii[i] * g.strides[i] - g.pads[i] + q[i] * g.dilations[i];
                    inside = p >= 0 && p < Y->dims[2 + i];
                    off = off * Y->dims[2 + i] + p;
                }
                if (!inside) continue;
                for (int64_t ch = 0; ch < C; ch++) {
                    double xv = x[(n * C + ch) * in_sz + ip];
                    int64_t m0 = (ch / Cg) * Mg;
                    for (int64_t m = 0; m < Mg; m++)
                        y[(n * M + m0 + m) * out_sz + off] += xv * w[(ch * Mg + m) * k_sz + kp];
                }
            }
    for (int64_t i = 0; i < Y->numel; i++)
        kiln_store_f64(Y->dtype, Y->data, i,
                       y[i] + (B ? kiln_load_f64(B->dtype, B->data, (i / out_sz) % M) : 0));
out_free:
    free(x), free(w), free(y);
    return st;
}

/* ---- DeformConv: inputs X, W, offset [N, og*K*nsp, out..], B, mask [N, og*K, out..] ---- */

kiln_status kiln_nn_deform_conv_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (kiln_attr_int(kiln_infer_node(c), "offset_group", 1) < 1)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "offset_group must be >= 1");
    return conv_like_infer(c, 0, 1, 3, x ? x->dtype : KILN_DTYPE_UNDEFINED);
}

/* Multilinear interpolation of plane x (dims d) at real position p; outside reads zero. */
static double sample(int nsp, const int64_t *d, const double *x, const double *p)
{
    double acc = 0;
    for (int corner = 0; corner < (1 << nsp); corner++) {
        double wt = 1;
        int64_t off = 0;
        for (int i = 0; i < nsp && wt != 0; i++) {
            double fl = floor(p[i]);
            if (!(fl >= -1 && fl < (double)d[i])) {
                wt = 0; /* far outside, infinite or NaN (offsets are data): reads zero, no int conversion */
                break;
            }
            int up = (corner >> i) & 1;
            int64_t at = (int64_t)fl + up;
            wt *= up ? p[i] - fl : 1 - (p[i] - fl);
            if (at < 0 || at >= d[i]) wt = 0;
            off = off * d[i] + at;
        }
        if (wt != 0) acc += wt * x[off];
    }
    return acc;
}

static kiln_status deform_check(kiln_run_ctx *c, const kiln_value *X, const kiln_value *W,
                                const kiln_value *off, const kiln_value *mask, const kiln_value *Y, int64_t og)
{
    int nsp = X->rank - 2;
    int64_t K = kiln_nn_prod(nsp, W->dims + 2);
    const kiln_value *v[2] = {off, mask};
    int64_t ch[2] = {og * K * nsp, og * K};
    if (X->dims[1] % og) return kiln_run_fail(c, KILN_ERR_SHAPE, "X channels not divisible by offset_group");
    for (int j = 0; j < 2; j++) {
        if (!v[j]) continue;
        bool ok = v[j]->rank == Y->rank && v[j]->dims[0] == Y->dims[0] && v[j]->dims[1] == ch[j];
        for (int i = 2; ok && i < Y->rank; i++) ok = v[j]->dims[i] == Y->dims[i];
        if (!ok)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "%s must have shape [N, %lld, output spatial dims]",
                                 j ? "mask" : "offset", (long long)ch[j]);
    }
    return KILN_OK;
}

kiln_status kiln_nn_deform_conv_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1), *OFF = kiln_run_in(c, 2);
    const kiln_value *B = kiln_run_in(c, 3), *MASK = kiln_run_in(c, 4);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t group = kiln_attr_int(kiln_run_node(c), "group", 1),
            og = kiln_attr_int(kiln_run_node(c), "offset_group", 1);
    kiln_nn_geom g;
    int64_t od[KILN_MAX_RANK];
    KILN_TRY(run_geom(c, X, W, &g, od));
    if (!OFF) return kiln_run_fail(c, KILN_ERR_MODEL, "needs input offset");
    KILN_TRY(deform_check(c, X, W, OFF, MASK, Y, og));
    int nsp = g.nsp;
    int64_t N = X->dims[0], C = X->dims[1], M = W->dims[0], Cg = W->dims[1], Mg = M / group, Cog = C / og;
    int64_t in_sz = kiln_nn_prod(nsp, X->dims + 2), K = kiln_nn_prod(nsp, W->dims + 2),
            out_sz = kiln_nn_prod(nsp, Y->dims + 2);
    double *x = kiln_nn_load_f64(X), *w = kiln_nn_load_f64(W), *off = kiln_nn_load_f64(OFF),
           *mask = MASK ? kiln_nn_load_f64(MASK) : NULL;
    kiln_status st = KILN_OK;
    if (!x || !w || !off || (MASK && !mask)) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    int64_t o[KILN_MAX_RANK] = {0}, q[KILN_MAX_RANK] = {0};
    double p[KILN_MAX_RANK];
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t op = 0; op < out_sz; op++, kiln_nn_index_next(nsp, Y->dims + 2, o)) {
                double acc = B ? kiln_load_f64(B->dtype, B->data, m) : 0;
                for (int64_t ci = 0; ci < Cg; ci++) {
                    int64_t ch = (m / Mg) * Cg + ci, grp = ch / Cog;
                    for (int64_t kp = 0; kp < K; kp++, kiln_nn_index_next(nsp, W->dims + 2, q)) {
                        for (int i = 0; i < nsp; i++)
                            p[i] = (double)(o[i] * g.strides[i] - g.pads[i] + q[i] * g.dilations[i]) +
                                   off[((n * og + grp) * K * nsp + kp * nsp + i) * out_sz + op];
                        double mv = mask ? mask[((n * og + grp) * K + kp) * out_sz + op] : 1;
                        acc += w[(m * Cg + ci) * K + kp] * mv *
                               sample(nsp, X->dims + 2, x + (n * C + ch) * in_sz, p);
                    }
                }
                kiln_store_f64(Y->dtype, Y->data, (n * M + m) * out_sz + op, acc);
            }
out_free:
    free(x), free(w), free(off), free(mask);
    return st;
}
