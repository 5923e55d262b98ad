/* image.c - the image family's table (Resize, Upsample, GridSample, AffineGrid, RoiAlign,
 * NonMaxSuppression, DFT, STFT, window functions, MelWeightMatrix) and Resize/Upsample.
 * The other ops live in image_sample.c and image_signal.c. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/image_internal.h"
#include "ops/resize.h"
#include "ops/util.h"

/* ---- helpers shared by the family ---- */

void kiln_image_store_sat(kiln_dtype dt, void *base, int64_t i, double v)
{
    double lo, hi;
    switch (dt) {
    case KILN_DTYPE_INT8: lo = INT8_MIN, hi = INT8_MAX; break;
    case KILN_DTYPE_UINT8: lo = 0, hi = UINT8_MAX; break;
    case KILN_DTYPE_INT16: lo = INT16_MIN, hi = INT16_MAX; break;
    case KILN_DTYPE_UINT16: lo = 0, hi = UINT16_MAX; break;
    case KILN_DTYPE_INT32: lo = INT32_MIN, hi = INT32_MAX; break;
    case KILN_DTYPE_UINT32: lo = 0, hi = UINT32_MAX; break;
    case KILN_DTYPE_INT64: lo = -9223372036854775808.0, hi = 9223372036854774784.0; break;
    case KILN_DTYPE_UINT64: lo = 0, hi = 18446744073709549568.0; break;
    default: kiln_store_f64(dt, base, i, v); return;
    }
    v = nearbyint(v);
    if (isnan(v)) v = 0;
    kiln_store_f64(dt, base, i, v < lo ? lo : v > hi ? hi : v);
}

bool kiln_image_real(kiln_dtype dt)
{
    return kiln_dtype_is_float(dt) || kiln_dtype_is_int(dt);
}

bool kiln_image_scalar_i64(const kiln_value *v, int64_t *out)
{
    if (!v || v->kind != KILN_VALUE_TENSOR || v->numel != 1 || !kiln_dtype_is_int(v->dtype)) return false;
    *out = kiln_load_i64(v->dtype, v->data, 0);
    return true;
}

/* ---- Resize (opsets 10, 11, 13, 18, 19) and Upsample (7, 9) ---- */

static const char *const rs_modes[] = {"nearest", "linear", "cubic"};
static const char *const ct_modes[] = {"half_pixel",        "half_pixel_symmetric", "pytorch_half_pixel",
                                       "align_corners",     "asymmetric",           "tf_half_pixel_for_nn",
                                       "tf_crop_and_resize"};
static const char *const nr_modes[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
static const char *const ka_policies[] = {"stretch", "not_larger", "not_smaller"};

static int name_index(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

bool kiln_resize_parse(const kiln_node *n, int opset, int rank, kiln_resize_attrs *a, char *msg, size_t msz)
{
    bool upsample = !strcmp(n->op_type, "Upsample");
    memset(a, 0, sizeof *a);
    a->scales_in = a->sizes_in = a->roi_in = -1;
    const char *mode = kiln_attr_string(n, "mode", "nearest");
    a->mode = !strcmp(mode, "bilinear") ? KILN_RESIZE_LINEAR : name_index(mode, rs_modes, 3);
    if (a->mode < 0 || (a->mode == KILN_RESIZE_CUBIC && (upsample || opset < 11))) {
        snprintf(msg, msz, "unsupported mode '%s'", mode);
        return false;
    }
    if (upsample || opset < 11) {
        /* Upsample and Resize-10: output = floor(input * scale), asymmetric coordinates and
         * floor rounding, so integer scales repeat elements. */
        a->ct = KILN_RESIZE_CT_ASYMMETRIC;
        a->nr = KILN_RESIZE_NR_FLOOR;
        if (upsample && opset < 9)
            a->scales_attr = kiln_attr_floats(n, "scales", &a->n_scales_attr);
        else
            a->scales_in = 1;
    } else {
        const char *ct = kiln_attr_string(n, "coordinate_transformation_mode", "half_pixel");
        const char *nr = kiln_attr_string(n, "nearest_mode", "round_prefer_floor");
        const char *ka = kiln_attr_string(n, "keep_aspect_ratio_policy", "stretch");
        a->ct = name_index(ct, ct_modes, 7);
        a->nr = name_index(nr, nr_modes, 4);
        a->ka = name_index(ka, ka_policies, 3);
        /* tf_half_pixel_for_nn left the spec at opset 13; ONNX Runtime still runs it (with a
         * deprecation warning), and so does this */
        if (a->ct < 0 || (a->ct == KILN_RESIZE_CT_HALF_PIXEL_SYM && opset < 19)) {
            snprintf(msg, msz, "unsupported coordinate_transformation_mode '%s'", ct);
            return false;
        }
        if (a->nr < 0 || a->ka < 0) {
            snprintf(msg, msz, "unsupported nearest_mode '%s' or keep_aspect_ratio_policy '%s'", nr, ka);
            return false;
        }
        a->roi_in = 1;
        a->scales_in = 2;
        a->sizes_in = 3;
    }
    a->cubic_a = kiln_attr_float(n, "cubic_coeff_a", -0.75f);
    a->extrapolation = kiln_attr_float(n, "extrapolation_value", 0.0f);
    a->exclude_outside = kiln_attr_int(n, "exclude_outside", 0) != 0;
    a->antialias = opset >= 18 && kiln_attr_int(n, "antialias", 0) != 0;
    int n_axes = 0;
    const int64_t *axes = opset >= 18 ? kiln_attr_ints(n, "axes", &n_axes) : NULL;
    if (rank < 0) return true;
    if (!axes) {
        a->n_axes = rank;
        for (int k = 0; k < rank; k++) a->axes[k] = k;
        return true;
    }
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < n_axes; i++) {
        int ax;
        if (n_axes > rank || !kiln_axis_norm(axes[i], rank, &ax) || seen[ax]) {
            snprintf(msg, msz, "axes[%d] = %lld is out of range or repeated for rank %d", i,
                     (long long)axes[i], rank);
            return false;
        }
        seen[ax] = true;
        a->axes[i] = ax;
    }
    a->n_axes = n_axes;
    return true;
}

/* The scales or sizes input this node uses: scales unless absent or empty (opset >= 11). */
static bool resize_uses_sizes(const kiln_resize_attrs *a, const kiln_type *scales, const kiln_type *sizes)
{
    if (a->sizes_in < 0 || !sizes) return false;
    if (!scales) return true;
    return scales->rank == 1 && kiln_dim_is_const(scales->dims[0]) && scales->dims[0].c == 0;
}

/* Exact output dims and per-axis scales for input dims `in` (run time, or compile time with
 * everything constant). scales / sizes: the values of those inputs (the one in use). */
kiln_status kiln_resize_plan(const kiln_resize_attrs *a, int rank, const int64_t *in, const kiln_value *scales,
                               const kiln_value *sizes, int64_t *out, double *scale, char *msg, size_t msz)
{
    for (int k = 0; k < rank; k++) out[k] = in[k], scale[k] = 1.0;
    if (sizes) {
        if (sizes->numel != a->n_axes || !kiln_dtype_is_int(sizes->dtype)) {
            snprintf(msg, msz, "sizes has %lld elements, expected %d", (long long)sizes->numel, a->n_axes);
            return KILN_ERR_SHAPE;
        }
        double s_min = INFINITY, s_max = 0;
        for (int i = 0; i < a->n_axes; i++) {
            int ax = a->axes[i];
            int64_t v = kiln_load_i64(sizes->dtype, sizes->data, i);
            if (v < 0 || (in[ax] == 0 && v != 0)) {
                snprintf(msg, msz, "sizes[%d] = %lld is invalid for input dim %lld", i, (long long)v,
                         (long long)in[ax]);
                return KILN_ERR_SHAPE;
            }
            out[ax] = v;
            scale[ax] = in[ax] ? (double)v / (double)in[ax] : 1.0;
            s_min = fmin(s_min, scale[ax]);
            s_max = fmax(s_max, scale[ax]);
        }
        if (a->ka != KILN_RESIZE_KA_STRETCH) {
            double s = a->ka == KILN_RESIZE_KA_NOT_LARGER ? s_min : s_max;
            for (int i = 0; i < a->n_axes; i++) {
                int ax = a->axes[i];
                scale[ax] = s;
                out[ax] = (int64_t)(s * (double)in[ax] + 0.5);
            }
        }
        return KILN_OK;
    }
    int n = scales ? (int)scales->numel : a->n_scales_attr;
    if (n != a->n_axes || (scales && !kiln_dtype_is_float(scales->dtype))) {
        snprintf(msg, msz, "scales has %d elements, expected %d", n, a->n_axes);
        return KILN_ERR_SHAPE;
    }
    for (int i = 0; i < n; i++) {
        int ax = a->axes[i];
        double s = scales ? kiln_load_f64(scales->dtype, scales->data, i) : a->scales_attr[i];
        double o = floor(s * (double)in[ax]);
        if (!(s > 0) || o > (double)INT64_MAX / 2) {
            snprintf(msg, msz, "scales[%d] = %g is invalid", i, s);
            return KILN_ERR_SHAPE;
        }
        scale[ax] = s;
        out[ax] = (int64_t)o;
    }
    return KILN_OK;
}

static kiln_status resize_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input X is missing");
    if (x->dtype != KILN_DTYPE_UNDEFINED && !kiln_image_real(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "unsupported element type %d", (int)x->dtype);
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    kiln_resize_attrs a;
    char msg[200];
    if (!kiln_resize_parse(n, kiln_infer_opset(c), x->rank, &a, msg, sizeof msg))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    const kiln_type *scales_t = a.scales_in >= 0 ? kiln_infer_in(c, a.scales_in) : NULL;
    const kiln_type *sizes_t = a.sizes_in >= 0 ? kiln_infer_in(c, a.sizes_in) : NULL;
    bool use_sizes = resize_uses_sizes(&a, scales_t, sizes_t);
    if (!use_sizes && !scales_t && !a.scales_attr)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "neither scales nor sizes is given");
    const kiln_value *vals = use_sizes       ? kiln_infer_in_value(c, a.sizes_in)
                             : a.scales_attr ? NULL
                                             : kiln_infer_in_value(c, a.scales_in);
    kiln_dimtab *tab = kiln_infer_dims(c);
    kiln_dim out[KILN_MAX_RANK];
    int64_t in_c[KILN_MAX_RANK], out_c[KILN_MAX_RANK];
    double scale[KILN_MAX_RANK];
    bool all_const = true;
    for (int k = 0; k < x->rank; k++) {
        out[k] = x->dims[k];
        all_const = all_const && kiln_dim_is_const(x->dims[k]);
        in_c[k] = x->dims[k].c;
    }
    if (all_const && (vals || a.scales_attr)) {
        kiln_status st = kiln_resize_plan(&a, x->rank, in_c, use_sizes ? NULL : vals, use_sizes ? vals : NULL,
                                     out_c, scale, msg, sizeof msg);
        if (st) return kiln_infer_fail(c, st, "%s", msg);
        for (int k = 0; k < x->rank; k++) out[k] = kiln_dim_const(out_c[k]);
        return kiln_infer_set_out(c, 0, x->dtype, x->rank, out);
    }
    /* Symbolic input dims or unknown scales/sizes: keep what is exact, fresh dims elsewhere.
     * floor(d * s) is exact as d * s for integer s only. */
    kiln_dim sz[KILN_MAX_RANK];
    int n_sz = 0;
    bool sizes_known = use_sizes && a.ka == KILN_RESIZE_KA_STRETCH &&
                       kiln_infer_in_dims_value(c, a.sizes_in, sz, KILN_MAX_RANK, &n_sz) && n_sz == a.n_axes;
    bool scales_known =
        !use_sizes && ((vals && vals->numel == a.n_axes && kiln_dtype_is_float(vals->dtype)) ||
                       (a.scales_attr && a.n_scales_attr == a.n_axes));
    for (int i = 0; i < a.n_axes; i++) {
        int ax = a.axes[i];
        if (sizes_known) {
            out[ax] = sz[i];
            continue;
        }
        double s = !scales_known ? 0 : vals ? kiln_load_f64(vals->dtype, vals->data, i) : a.scales_attr[i];
        if (scales_known && s > 0 && s == floor(s) && s < 1e9)
            out[ax] = kiln_dim_mul(tab, x->dims[ax], kiln_dim_const((int64_t)s));
        else if (scales_known && s > 0 && kiln_dim_is_const(x->dims[ax]))
            out[ax] = kiln_dim_const((int64_t)floor(s * (double)x->dims[ax].c));
        else
            out[ax] = kiln_infer_fresh(c, "resize");
    }
    return kiln_infer_set_out(c, 0, x->dtype, x->rank, out);
}

static double cubic_weight(double x, double A)
{
    x = fabs(x);
    if (x <= 1) return ((A + 2) * x - (A + 3)) * x * x + 1;
    if (x < 2) return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
    return 0;
}

/* Source coordinate of output index j along one axis (ONNX coordinate_transformation_mode). */
static double resize_coord(const kiln_resize_attrs *a, int64_t j, double scale, int64_t in_n, int64_t out_n,
                           double lo, double hi)
{
    /* the target length before flooring; the reference uses it for align_corners too */
    double out_w = scale * (double)in_n;
    double jd = (double)j;
    switch (a->ct) {
    case KILN_RESIZE_CT_HALF_PIXEL_SYM: {
        double offset = (double)in_n / 2.0 * (1.0 - (double)out_n / out_w);
        return offset + (jd + 0.5) / scale - 0.5;
    }
    case KILN_RESIZE_CT_PYTORCH_HALF_PIXEL: return out_n > 1 ? (jd + 0.5) / scale - 0.5 : 0.0;
    case KILN_RESIZE_CT_ALIGN_CORNERS: return out_n == 1 || out_w == 1.0 ? 0.0 : jd * (double)(in_n - 1) / (out_w - 1.0);
    case KILN_RESIZE_CT_ASYMMETRIC: return jd / scale;
    case KILN_RESIZE_CT_TF_HALF_PIXEL_NN: return (jd + 0.5) / scale;
    case KILN_RESIZE_CT_TF_CROP:
        if (out_n == 1 || out_w == 1.0) return 0.5 * (lo + hi) * (double)(in_n - 1);
        return lo * (double)(in_n - 1) + jd * (hi - lo) * (double)(in_n - 1) / (out_w - 1.0);
    default: return (jd + 0.5) / scale - 0.5;
    }
}

/* The input index nearest to source coordinate x (nearest_mode), clamped into [0, last]. */
static int64_t nearest_index(const kiln_resize_attrs *a, double x, double last)
{
    double f = floor(x), r = x - f, p;
    switch (a->nr) {
    case KILN_RESIZE_NR_PREFER_CEIL: p = r < 0.5 ? f : f + 1; break;
    case KILN_RESIZE_NR_FLOOR: p = f; break;
    case KILN_RESIZE_NR_CEIL: p = ceil(x); break;
    default: p = r <= 0.5 ? f : f + 1; break;
    }
    return (int64_t)fmax(0, fmin(p, last));
}

void kiln_resize_nearest_index(const kiln_resize_attrs *a, double scale, int64_t in_n, int64_t out_n, int64_t *idx)
{
    bool identity = out_n == in_n && scale == 1.0;
    for (int64_t j = 0; j < out_n; j++)
        idx[j] = identity ? j : nearest_index(a, resize_coord(a, j, scale, in_n, out_n, 0, 1), (double)(in_n - 1));
}

void kiln_resize_linear_taps(const kiln_resize_attrs *a, double scale, int64_t in_n, int64_t out_n, int64_t *i0,
                             int64_t *i1, float *w0, float *w1)
{
    double last = (double)(in_n - 1);
    for (int64_t j = 0; j < out_n; j++) {
        double x = resize_coord(a, j, scale, in_n, out_n, 0, 1);
        /* as resize_taps_build: base + ratio = x with ratio in (0, 1] */
        double base = floor(x), ratio = x - base;
        if (ratio == 0) base -= 1, ratio = 1;
        i0[j] = (int64_t)fmax(0, fmin(base, last));
        i1[j] = (int64_t)fmax(0, fmin(base + 1, last));
        w0[j] = (float)fmax(0, 1 - fabs(-ratio));
        w1[j] = (float)fmax(0, 1 - fabs(1 - ratio));
    }
}

/* Interpolation taps along one axis: for each output index, n source indices (clamped into
 * the input) and weights, and whether it is extrapolated (tf_crop_and_resize). */
typedef struct resize_taps {
    int n;
    int64_t *idx; /* [out_n * n] */
    double *w;    /* [out_n * n] */
    bool *extrap; /* [out_n] */
} resize_taps;

static void resize_taps_free(resize_taps *t)
{
    free(t->idx);
    free(t->w);
    free(t->extrap);
}

static kiln_status resize_taps_build(const kiln_resize_attrs *a, double scale, int64_t in_n, int64_t out_n,
                                     double lo, double hi, resize_taps *t, char *msg, size_t msz)
{
    memset(t, 0, sizeof *t);
    /* Kernel support (1 linear, 2 cubic) widened by 1/scale when antialiasing a downsample. */
    double s_eff = a->antialias ? fmin(scale, 1.0) : 1.0;
    double start = 0;
    if (a->mode != KILN_RESIZE_NEAREST) {
        start = floor(-(a->mode == KILN_RESIZE_LINEAR ? 1.0 : 2.0) / s_eff) + 1;
        if (2 - 2 * start > 1 << 20) {
            snprintf(msg, msz, "scale %g needs too many antialiasing taps", scale);
            return KILN_ERR_UNSUPPORTED;
        }
    }
    t->n = a->mode == KILN_RESIZE_NEAREST ? 1 : (int)(2 - 2 * start);
    size_t cnt = (size_t)out_n * (size_t)t->n;
    t->idx = malloc(cnt * sizeof *t->idx + 1);
    t->w = malloc(cnt * sizeof *t->w + 1);
    t->extrap = calloc((size_t)out_n + 1, sizeof *t->extrap);
    if (!t->idx || !t->w || !t->extrap) {
        resize_taps_free(t);
        snprintf(msg, msz, "out of memory");
        return KILN_ERR_NOMEM;
    }
    double last = (double)(in_n - 1);
    for (int64_t j = 0; j < out_n; j++) {
        double x = resize_coord(a, j, scale, in_n, out_n, lo, hi);
        int64_t *idx = t->idx + j * t->n;
        double *w = t->w + j * t->n;
        if (a->ct == KILN_RESIZE_CT_TF_CROP && (x < 0 || x > last)) t->extrap[j] = true;
        if (a->mode == KILN_RESIZE_NEAREST) {
            idx[0] = nearest_index(a, x, last);
            w[0] = 1;
            continue;
        }
        /* base + ratio = x with ratio in (0, 1]: at integer x the left pixel is preferred */
        double base = floor(x), ratio = x - base;
        if (ratio == 0) base -= 1, ratio = 1;
        double sum = 0, kept = 0;
        for (int k = 0; k < t->n; k++) {
            double d = (start + k - ratio) * s_eff;
            w[k] = a->mode == KILN_RESIZE_LINEAR ? fmax(0, 1 - fabs(d)) : cubic_weight(d, a->cubic_a);
            sum += w[k];
        }
        for (int k = 0; k < t->n; k++) {
            double p = base + start + k;
            if (a->antialias) w[k] /= sum;
            if (a->exclude_outside && (p < 0 || p > last)) w[k] = 0;
            kept += w[k];
            idx[k] = (int64_t)fmax(0, fmin(p, last));
        }
        if (a->exclude_outside && kept != 0)
            for (int k = 0; k < t->n; k++) w[k] /= kept;
    }
    return KILN_OK;
}

/* One separable pass: src has dims `dims`, dst the same with dims[axis] = out_n. */
static void resize_pass(const kiln_resize_attrs *a, const resize_taps *t, int rank, const int64_t *dims, int axis,
                        int64_t out_n, const double *src, double *dst)
{
    int64_t outer = 1, inner = 1, in_n = dims[axis];
    for (int k = 0; k < axis; k++) outer *= dims[k];
    for (int k = axis + 1; k < rank; k++) inner *= dims[k];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < out_n; j++) {
            double *d = dst + (o * out_n + j) * inner;
            const int64_t *idx = t->idx + j * t->n;
            const double *w = t->w + j * t->n;
            for (int64_t i = 0; i < inner; i++) {
                double acc = 0;
                for (int k = 0; k < t->n; k++) acc += w[k] * src[(o * in_n + idx[k]) * inner + i];
                d[i] = t->extrap[j] ? a->extrapolation : acc;
            }
        }
}

/* Nearest without extrapolation: every output element is one input element, gathered whole
 * (exact for every dtype, no round trip through double) along rows of the last axis. */
static kiln_status resize_nearest(kiln_run_ctx *c, const kiln_resize_attrs *a, const kiln_value *x, kiln_value *y,
                                  const int64_t *out, const double *scale)
{
    int rank = x->rank;
    int64_t *idx[KILN_MAX_RANK] = {0};
    kiln_status st = KILN_OK;
    for (int k = 0; k < rank && !st; k++) {
        if (!(idx[k] = malloc((size_t)out[k] * sizeof *idx[k] + 1)))
            st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        else
            kiln_resize_nearest_index(a, scale[k], x->dims[k], out[k], idx[k]);
    }
    if (!st) {
        size_t es = kiln_dtype_size(x->dtype);
        int64_t xs[KILN_MAX_RANK], coord[KILN_MAX_RANK] = {0}, rows = 1, w = out[rank - 1];
        xs[rank - 1] = 1;
        for (int k = rank - 2; k >= 0; k--) xs[k] = xs[k + 1] * x->dims[k + 1];
        for (int k = 0; k < rank - 1; k++) rows *= out[k];
        const unsigned char *src = x->data;
        unsigned char *dst = y->data;
        const int64_t *ix = idx[rank - 1];
        for (int64_t r = 0; r < rows; r++, dst += (size_t)w * es) {
            int64_t base = 0;
            for (int k = 0; k < rank - 1; k++) base += idx[k][coord[k]] * xs[k];
            const unsigned char *s = src + (size_t)base * es;
            if (es == 4)
                for (int64_t j = 0; j < w; j++) memcpy(dst + 4 * j, s + 4 * ix[j], 4);
            else
                for (int64_t j = 0; j < w; j++) memcpy(dst + (size_t)j * es, s + (size_t)ix[j] * es, es);
            for (int k = rank - 2; k >= 0 && ++coord[k] == out[k]; k--) coord[k] = 0;
        }
    }
    for (int k = 0; k < rank; k++) free(idx[k]);
    return st;
}

static kiln_status resize_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    kiln_resize_attrs a;
    char msg[200];
    if (!kiln_resize_parse(n, kiln_run_opset(c), x->rank, &a, msg, sizeof msg))
        return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    const kiln_value *scales = a.scales_in >= 0 ? kiln_run_in(c, a.scales_in) : NULL;
    const kiln_value *sizes = a.sizes_in >= 0 ? kiln_run_in(c, a.sizes_in) : NULL;
    if (scales && scales->numel == 0 && sizes) scales = NULL;
    int rank = x->rank;
    int64_t out[KILN_MAX_RANK];
    double scale[KILN_MAX_RANK], lo[KILN_MAX_RANK], hi[KILN_MAX_RANK];
    kiln_status st =
        kiln_resize_plan(&a, rank, x->dims, scales, scales ? NULL : sizes, out, scale, msg, sizeof msg);
    if (st) return kiln_run_fail(c, st, "%s", msg);
    for (int k = 0; k < rank; k++) lo[k] = 0, hi[k] = 1;
    if (a.ct == KILN_RESIZE_CT_TF_CROP) {
        const kiln_value *roi = a.roi_in >= 0 ? kiln_run_in(c, a.roi_in) : NULL;
        if (!roi || roi->numel != 2 * a.n_axes || !kiln_dtype_is_float(roi->dtype))
            return kiln_run_fail(c, KILN_ERR_SHAPE, "tf_crop_and_resize needs roi with %d float elements",
                                 2 * a.n_axes);
        for (int i = 0; i < a.n_axes; i++) {
            lo[a.axes[i]] = kiln_load_f64(roi->dtype, roi->data, i);
            hi[a.axes[i]] = kiln_load_f64(roi->dtype, roi->data, a.n_axes + i);
        }
    }
    if (!y || y->numel == 0) return KILN_OK;
    if (x->numel == 0)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "cannot resize an empty input to a non-empty output");
    if (a.mode == KILN_RESIZE_NEAREST && a.ct != KILN_RESIZE_CT_TF_CROP && x->dtype != KILN_DTYPE_STRING && rank > 0)
        return resize_nearest(c, &a, x, y, out, scale);

    /* Separable: interpolate one axis at a time in double. Peak buffer size is bounded by the
     * largest intermediate shape. */
    int64_t dims[KILN_MAX_RANK], cap = x->numel;
    memcpy(dims, x->dims, sizeof(int64_t) * (size_t)rank);
    for (int k = 0; k < rank; k++) {
        dims[k] = out[k];
        int64_t m = 1;
        for (int q = 0; q < rank; q++) m *= dims[q];
        if (m > cap) cap = m;
    }
    memcpy(dims, x->dims, sizeof(int64_t) * (size_t)rank);
    double *cur = malloc((size_t)cap * sizeof(double)), *next = malloc((size_t)cap * sizeof(double));
    if (!cur || !next) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto free_bufs;
    }
    for (int64_t i = 0; i < x->numel; i++) cur[i] = kiln_load_f64(x->dtype, x->data, i);
    for (int k = 0; k < rank; k++) {
        bool identity =
            out[k] == dims[k] && scale[k] == 1.0 && (a.ct != KILN_RESIZE_CT_TF_CROP || (lo[k] == 0 && hi[k] == 1));
        if (identity) continue;
        resize_taps t;
        st = resize_taps_build(&a, scale[k], dims[k], out[k], lo[k], hi[k], &t, msg, sizeof msg);
        if (st) {
            st = kiln_run_fail(c, st, "%s", msg);
            goto free_bufs;
        }
        resize_pass(&a, &t, rank, dims, k, out[k], cur, next);
        resize_taps_free(&t);
        dims[k] = out[k];
        double *tmp = cur;
        cur = next;
        next = tmp;
    }
    for (int64_t i = 0; i < y->numel; i++) kiln_image_store_sat(y->dtype, y->data, i, cur[i]);
free_bufs:
    free(cur);
    free(next);
    return st;
}

static const kiln_op_def defs[] = {
    {"", "Resize", 10, resize_infer, resize_run, 0, KILN_OP_IN(1) | KILN_OP_IN(2) | KILN_OP_IN(3)},
    {"", "Upsample", 7, resize_infer, resize_run, 0, KILN_OP_IN(1)},
    {"", "GridSample", 16, kiln_gridsample_infer, kiln_gridsample_run},
    {"", "AffineGrid", 20, kiln_affinegrid_infer, kiln_affinegrid_run, 0, KILN_OP_IN(1)},
    {"", "RoiAlign", 10, kiln_roialign_infer, kiln_roialign_run},
    {"", "NonMaxSuppression", 10, kiln_nms_infer, kiln_nms_run},
    {"", "DFT", 17, kiln_dft_infer, kiln_dft_run, 0, KILN_OP_IN(1) | KILN_OP_IN(2)},
    {"", "STFT", 17, kiln_stft_infer, kiln_stft_run, 0, KILN_OP_IN(1) | KILN_OP_IN(3)},
    {"", "HannWindow", 17, kiln_window_infer, kiln_window_run, 0, KILN_OP_IN(0)},
    {"", "HammingWindow", 17, kiln_window_infer, kiln_window_run, 0, KILN_OP_IN(0)},
    {"", "BlackmanWindow", 17, kiln_window_infer, kiln_window_run, 0, KILN_OP_IN(0)},
    {"", "MelWeightMatrix", 17, kiln_melweight_infer, kiln_melweight_run, 0,
     KILN_OP_IN(0) | KILN_OP_IN(1) | KILN_OP_IN(2) | KILN_OP_IN(3) | KILN_OP_IN(4)},
};

const kiln_op_table kiln_ops_image = {defs, sizeof defs / sizeof defs[0]};
