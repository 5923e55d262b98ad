/* image_sample.c - sampling and box ops: GridSample (16, 20), AffineGrid (20), RoiAlign (10,
 * 16) and NonMaxSuppression (10, 11). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/image_internal.h"
#include "ops/util.h"

/* ---- GridSample ---- */

enum { GS_NEAREST, GS_LINEAR, GS_CUBIC };
enum { GS_ZEROS, GS_BORDER, GS_REFLECTION };

typedef struct gs_attrs {
    int mode, padding;
    bool align_corners;
} gs_attrs;

static bool gs_parse(const kiln_node *n, gs_attrs *a)
{
    const char *mode = kiln_attr_string(n, "mode", "bilinear");
    const char *pad = kiln_attr_string(n, "padding_mode", "zeros");
    /* opset 16 names the modes bilinear/bicubic, opset 20 linear/cubic */
    if (!strcmp(mode, "nearest"))
        a->mode = GS_NEAREST;
    else if (!strcmp(mode, "bilinear") || !strcmp(mode, "linear"))
        a->mode = GS_LINEAR;
    else if (!strcmp(mode, "bicubic") || !strcmp(mode, "cubic"))
        a->mode = GS_CUBIC;
    else
        return false;
    if (!strcmp(pad, "zeros"))
        a->padding = GS_ZEROS;
    else if (!strcmp(pad, "border"))
        a->padding = GS_BORDER;
    else if (!strcmp(pad, "reflection"))
        a->padding = GS_REFLECTION;
    else
        return false;
    a->align_corners = kiln_attr_int(n, "align_corners", 0) != 0;
    return true;
}

kiln_status kiln_gridsample_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *grid = kiln_infer_in(c, 1);
    gs_attrs a;
    if (!x || !grid) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs X and grid");
    if (!gs_parse(kiln_infer_node(c), &a))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "unsupported mode or padding_mode");
    if ((x->dtype && !kiln_image_real(x->dtype)) || (grid->dtype && !kiln_dtype_is_float(grid->dtype)))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "unsupported element types %d, %d", (int)x->dtype,
                               (int)grid->dtype);
    int rank = x->rank >= 0 ? x->rank : grid->rank;
    if (rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    if (rank < 3 || (x->rank >= 0 && grid->rank >= 0 && x->rank != grid->rank))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X (rank %d) and grid (rank %d) need equal ranks >= 3",
                               x->rank, grid->rank);
    kiln_dim out[KILN_MAX_RANK];
    out[0] = x->rank >= 0 ? x->dims[0] : grid->dims[0];
    out[1] = x->rank >= 0 ? x->dims[1] : kiln_infer_fresh(c, "channels");
    for (int k = 2; k < rank; k++) out[k] = grid->rank >= 0 ? grid->dims[k - 1] : kiln_infer_fresh(c, "grid");
    if (x->rank >= 0 && grid->rank >= 0) {
        KILN_TRY(kiln_infer_require_equal(c, x->dims[0], grid->dims[0], "batch of X and grid"));
        KILN_TRY(kiln_infer_require_equal(c, grid->dims[rank - 1], kiln_dim_const(rank - 2),
                                          "last dim of grid and the spatial rank of X"));
    }
    return kiln_infer_set_out(c, 0, x->dtype, rank, out);
}

/* Folds x into [lo, hi] by reflecting at the borders (PyTorch's reflect_coordinates). */
static double gs_reflect(double x, double lo, double hi)
{
    double rng = hi - lo;
    if (!(rng > 0)) return lo;
    if (x < lo || x > hi) {
        double dx = x < lo ? lo - x : x - hi;
        double n = floor(dx / rng), r = dx - n * rng;
        bool even = fmod(n, 2) == 0;
        if (x < lo) return even ? lo + r : hi - r;
        return even ? hi - r : lo + r;
    }
    return x;
}

typedef struct gs_image {
    const kiln_value *x;
    int64_t base;        /* element offset of the [n, c] image */
    int r;               /* spatial rank */
    const int64_t *dims; /* [r] */
    int64_t strides[KILN_MAX_RANK];
    double lo[KILN_MAX_RANK], hi[KILN_MAX_RANK]; /* borders per dim */
    int padding;
} gs_image;

/* Pixel at integer index idx[0..r) with the padding mode applied. */
static double gs_pixel(const gs_image *im, const int64_t *idx)
{
    int64_t off = im->base;
    for (int s = 0; s < im->r; s++) {
        int64_t i = idx[s], d = im->dims[s];
        if (i < 0 || i >= d) {
            if (im->padding == GS_ZEROS) return 0;
            if (im->padding == GS_REFLECTION) i = (int64_t)gs_reflect((double)i, im->lo[s], im->hi[s]);
            i = i < 0 ? 0 : i >= d ? d - 1 : i;
        }
        off += i * im->strides[s];
    }
    return kiln_load_f64(im->x->dtype, im->x->data, off);
}

static void gs_cubic_coeffs(double t, double *w)
{
    const double A = -0.75;
    double x[4] = {t + 1, t, 1 - t, 2 - t};
    for (int k = 0; k < 4; k++) {
        double v = fabs(x[k]);
        w[k] = v <= 1 ? ((A + 2) * v - (A + 3)) * v * v + 1 : ((A * v - 5 * A) * v + 8 * A) * v - 4 * A;
    }
}

/* Interpolates at real coordinates xs[0..r) with n taps per dim starting at floor(x) + first. */
static double gs_interp(const gs_image *im, const double *xs, int mode)
{
    int taps = mode == GS_LINEAR ? 2 : 4, first = mode == GS_LINEAR ? 0 : -1;
    double w[KILN_MAX_RANK][4];
    int64_t x0[KILN_MAX_RANK], idx[KILN_MAX_RANK];
    int64_t total = 1;
    for (int s = 0; s < im->r; s++) {
        double f = floor(xs[s]), t = xs[s] - f;
        x0[s] = (int64_t)f + first;
        if (mode == GS_LINEAR)
            w[s][0] = 1 - t, w[s][1] = t;
        else
            gs_cubic_coeffs(t, w[s]);
        total *= taps;
    }
    double acc = 0;
    for (int64_t m = 0; m < total; m++) {
        int64_t rest = m;
        double wt = 1;
        for (int s = im->r - 1; s >= 0; s--) {
            int k = (int)(rest % taps);
            rest /= taps;
            idx[s] = x0[s] + k;
            wt *= w[s][k];
        }
        if (wt != 0) acc += wt * gs_pixel(im, idx);
    }
    return acc;
}

kiln_status kiln_gridsample_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *grid = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    gs_attrs a;
    gs_parse(kiln_run_node(c), &a);
    int r = x->rank - 2;
    if (!y) return KILN_OK;
    if (r > 6) return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "spatial rank %d exceeds 6", r);
    if (!y || y->numel == 0) return KILN_OK;
    gs_image im = {.x = x, .r = r, .dims = x->dims + 2, .padding = a.padding};
    kiln_strides(r, im.dims, im.strides);
    for (int s = 0; s < r; s++) {
        im.lo[s] = a.align_corners ? 0 : -0.5;
        im.hi[s] = a.align_corners ? (double)im.dims[s] - 1 : (double)im.dims[s] - 0.5;
    }
    int64_t N = x->dims[0], C = x->dims[1], npos = 1, img = 1;
    for (int s = 0; s < r; s++) npos *= grid->dims[1 + s], img *= im.dims[s];
    for (int64_t n = 0; n < N; n++)
        for (int64_t p = 0; p < npos; p++) {
            /* grid's last axis lists coordinates innermost dim first (x, y, z) */
            double xs[KILN_MAX_RANK];
            int64_t g = (n * npos + p) * r;
            for (int s = 0; s < r; s++) {
                double gv = kiln_load_f64(grid->dtype, grid->data, g + (r - 1 - s));
                double d = (double)im.dims[s];
                /* kept in float like the reference, so nearest rounding ties match */
                float v = (float)(a.align_corners ? (gv + 1) / 2.0 * (d - 1) : ((gv + 1) * d - 1) / 2.0);
                if (a.mode == GS_NEAREST) v = nearbyintf(v);
                if (v < im.lo[s] || v > im.hi[s]) {
                    if (a.padding == GS_BORDER)
                        v = v < 0 ? 0 : v > d - 1 ? (float)(d - 1) : v;
                    else if (a.padding == GS_REFLECTION)
                        v = (float)gs_reflect(v, im.lo[s], im.hi[s]);
                }
                /* beyond 4 pixels outside every tap reads padding: clamping there keeps the
                 * integer conversions defined for huge, infinite or NaN coordinates */
                xs[s] = fmin(fmax(v, -4.0), d + 4.0);
            }
            for (int64_t ch = 0; ch < C; ch++) {
                im.base = (n * C + ch) * img;
                double v;
                if (a.mode == GS_NEAREST) {
                    int64_t idx[KILN_MAX_RANK];
                    for (int s = 0; s < r; s++) idx[s] = (int64_t)xs[s];
                    v = gs_pixel(&im, idx);
                } else {
                    v = gs_interp(&im, xs, a.mode);
                }
                kiln_store_f64(y->dtype, y->data, (n * C + ch) * npos + p, v);
            }
        }
    return KILN_OK;
}

/* ---- AffineGrid ---- */

kiln_status kiln_affinegrid_infer(kiln_infer_ctx *c)
{
    const kiln_type *theta = kiln_infer_in(c, 0), *size = kiln_infer_in(c, 1);
    if (!theta || !size) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs theta and size");
    kiln_dim sz[6];
    int n = 0;
    bool known = kiln_infer_in_dims_value(c, 1, sz, 6, &n);
    if (!kiln_infer_dims(c) && !known)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "size must be a 1-D integer tensor of 4 or 5 elements");
    if (theta->dtype && !kiln_dtype_is_float(theta->dtype))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "unsupported theta element type %d",
                               (int)theta->dtype);
    if (!known && size->rank == 1 && kiln_dim_is_const(size->dims[0]))
        n = (int)size->dims[0].c;
    else if (!known && theta->rank == 3 && kiln_dim_is_const(theta->dims[1]))
        n = (int)theta->dims[1].c + 2;
    if (n == 0) return kiln_infer_set_out_unknown(c, 0, theta->dtype);
    if (n != 4 && n != 5)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "size has %d elements, expected 4 or 5", n);
    int r = n - 2;
    if (theta->rank >= 0) {
        if (theta->rank != 3)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "theta has rank %d, expected 3", theta->rank);
        KILN_TRY(kiln_infer_require_equal(c, theta->dims[1], kiln_dim_const(r), "theta dim 1"));
        KILN_TRY(kiln_infer_require_equal(c, theta->dims[2], kiln_dim_const(r + 1), "theta dim 2"));
        if (known) KILN_TRY(kiln_infer_require_equal(c, theta->dims[0], sz[0], "theta dim 0 and size[0]"));
    }
    kiln_dim out[5];
    out[0] = known ? sz[0] : theta->rank >= 0 ? theta->dims[0] : kiln_infer_fresh(c, "batch");
    for (int k = 0; k < r; k++) out[1 + k] = known ? sz[2 + k] : kiln_infer_fresh(c, "grid");
    out[r + 1] = kiln_dim_const(r);
    return kiln_infer_set_out(c, 0, theta->dtype, r + 2, out);
}

kiln_status kiln_affinegrid_run(kiln_run_ctx *c)
{
    const kiln_value *theta = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    bool align = kiln_attr_int(kiln_run_node(c), "align_corners", 0) != 0;
    if (!y) return KILN_OK;
    int r = y->rank - 2;
    int64_t N = y->dims[0], npos = 1;
    for (int k = 0; k < r; k++) npos *= y->dims[1 + k];
    for (int64_t n = 0; n < N; n++)
        for (int64_t p = 0; p < npos; p++) {
            /* homogeneous source point: (x, y[, z], 1), x along the innermost dim */
            double pt[4];
            int64_t rest = p;
            for (int k = r - 1; k >= 0; k--) {
                int64_t d = y->dims[1 + k], i = rest % d;
                rest /= d;
                double v = align ? (d == 1 ? -1.0 : -1.0 + 2.0 * (double)i / (double)(d - 1))
                                 : -1.0 + (2.0 * (double)i + 1.0) / (double)d;
                pt[r - 1 - k] = v;
            }
            pt[r] = 1;
            for (int row = 0; row < r; row++) {
                double acc = 0;
                for (int q = 0; q <= r; q++)
                    acc += kiln_load_f64(theta->dtype, theta->data, (n * r + row) * (r + 1) + q) * pt[q];
                kiln_store_f64(y->dtype, y->data, (n * npos + p) * r + row, acc);
            }
        }
    return KILN_OK;
}

/* ---- RoiAlign ---- */

kiln_status kiln_roialign_infer(kiln_infer_ctx *c)
{
    const kiln_node *nd = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0), *rois = kiln_infer_in(c, 1), *bi = kiln_infer_in(c, 2);
    if (!x || !rois || !bi)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs X, rois and batch_indices");
    const char *mode = kiln_attr_string(nd, "mode", "avg");
    const char *ct = kiln_attr_string(nd, "coordinate_transformation_mode", "half_pixel");
    if ((strcmp(mode, "avg") && strcmp(mode, "max")) ||
        (strcmp(ct, "half_pixel") && strcmp(ct, "output_half_pixel")))
        return kiln_infer_fail(c, KILN_ERR_MODEL,
                               "unsupported mode '%s' or coordinate_transformation_mode '%s'", mode, ct);
    int64_t oh = kiln_attr_int(nd, "output_height", 1), ow = kiln_attr_int(nd, "output_width", 1);
    if (oh < 1 || ow < 1) return kiln_infer_fail(c, KILN_ERR_MODEL, "output_height/width must be >= 1");
    if ((x->dtype && !kiln_dtype_is_float(x->dtype)) || (rois->dtype && !kiln_dtype_is_float(rois->dtype)) ||
        (bi->dtype && !kiln_dtype_is_int(bi->dtype)))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "unsupported element types");
    if ((x->rank >= 0 && x->rank != 4) || (rois->rank >= 0 && rois->rank != 2) ||
        (bi->rank >= 0 && bi->rank != 1))
        return kiln_infer_fail(c, KILN_ERR_SHAPE,
                               "X must be 4-D, rois 2-D and batch_indices 1-D (ranks %d, %d, %d)", x->rank,
                               rois->rank, bi->rank);
    if (rois->rank == 2)
        KILN_TRY(kiln_infer_require_equal(c, rois->dims[1], kiln_dim_const(4), "rois dim 1"));
    if (rois->rank == 2 && bi->rank == 1)
        KILN_TRY(
            kiln_infer_require_equal(c, rois->dims[0], bi->dims[0], "rois dim 0 and batch_indices dim 0"));
    kiln_dim out[4] = {
        bi->rank == 1     ? bi->dims[0]
        : rois->rank == 2 ? rois->dims[0]
                          : kiln_infer_fresh(c, "rois"),
        x->rank == 4 ? x->dims[1] : kiln_infer_fresh(c, "channels"),
        kiln_dim_const(oh),
        kiln_dim_const(ow),
    };
    return kiln_infer_set_out(c, 0, x->dtype, 4, out);
}

/* One bilinear sample point of a bin: four source offsets and weights (all zero outside). */
typedef struct roi_sample {
    int64_t pos[4];
    float w[4];
} roi_sample;

static roi_sample roi_sample_at(float y, float x, int64_t height, int64_t width)
{
    roi_sample s = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    if (!(y >= -1.0f && y <= (float)height && x >= -1.0f && x <= (float)width)) return s;
    if (y <= 0) y = 0;
    if (x <= 0) x = 0;
    int64_t y_lo = (int64_t)y, x_lo = (int64_t)x, y_hi, x_hi;
    if (y_lo >= height - 1)
        y_hi = y_lo = height - 1, y = (float)y_lo;
    else
        y_hi = y_lo + 1;
    if (x_lo >= width - 1)
        x_hi = x_lo = width - 1, x = (float)x_lo;
    else
        x_hi = x_lo + 1;
    float ly = y - (float)y_lo, lx = x - (float)x_lo, hy = 1.0f - ly, hx = 1.0f - lx;
    s.pos[0] = y_lo * width + x_lo, s.w[0] = hy * hx;
    s.pos[1] = y_lo * width + x_hi, s.w[1] = hy * lx;
    s.pos[2] = y_hi * width + x_lo, s.w[2] = ly * hx;
    s.pos[3] = y_hi * width + x_hi, s.w[3] = ly * lx;
    return s;
}

kiln_status kiln_roialign_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0), *rois = kiln_run_in(c, 1), *bi = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    bool is_max = !strcmp(kiln_attr_string(nd, "mode", "avg"), "max");
    /* opset 10 has no attribute and behaves as output_half_pixel */
    const char *ct = kiln_attr_string(nd, "coordinate_transformation_mode",
                                      kiln_run_opset(c) < 16 ? "output_half_pixel" : "half_pixel");
    bool half_pixel = !strcmp(ct, "half_pixel");
    int64_t sampling = kiln_attr_int(nd, "sampling_ratio", 0);
    float spatial_scale = kiln_attr_float(nd, "spatial_scale", 1.0f);
    if (!y) return KILN_OK;
    int64_t R = y->dims[0], C = y->dims[1], PH = y->dims[2], PW = y->dims[3];
    int64_t H = x->dims[2], W = x->dims[3];
    for (int64_t n = 0; n < R; n++) {
        int64_t b = kiln_load_i64(bi->dtype, bi->data, n);
        if (b < 0 || b >= x->dims[0])
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "batch_indices[%lld] = %lld is out of range [0, %lld)",
                                 (long long)n, (long long)b, (long long)x->dims[0]);
        float offset = half_pixel ? 0.5f : 0.0f, roi[4];
        for (int k = 0; k < 4; k++)
            roi[k] = (float)kiln_load_f64(rois->dtype, rois->data, n * 4 + k) * spatial_scale - offset;
        float roi_w = roi[2] - roi[0], roi_h = roi[3] - roi[1];
        if (!half_pixel) {
            /* force malformed rois to 1x1 */
            roi_w = fmaxf(roi_w, 1.0f);
            roi_h = fmaxf(roi_h, 1.0f);
        }
        float bin_h = roi_h / (float)PH, bin_w = roi_w / (float)PW;
        double gh = sampling > 0 ? (double)sampling : ceilf(roi_h / (float)PH);
        double gw = sampling > 0 ? (double)sampling : ceilf(roi_w / (float)PW);
        if (!(gh <= 1 << 16 && gw <= 1 << 16))
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "roi %lld is not finite or needs too many samples",
                                 (long long)n);
        int64_t grid_h = gh > 0 ? (int64_t)gh : 0, grid_w = gw > 0 ? (int64_t)gw : 0;
        int64_t count = grid_h * grid_w > 1 ? grid_h * grid_w : 1;
        for (int64_t ch = 0; ch < C && H > 0 && W > 0; ch++) {
            int64_t base = (b * x->dims[1] + ch) * H * W;
            for (int64_t ph = 0; ph < PH; ph++)
                for (int64_t pw = 0; pw < PW; pw++) {
                    double acc = 0;
                    bool first = true;
                    for (int64_t iy = 0; iy < grid_h; iy++) {
                        float yy = roi[1] + (float)ph * bin_h + ((float)iy + 0.5f) * bin_h / (float)grid_h;
                        for (int64_t ix = 0; ix < grid_w; ix++) {
                            float xx =
                                roi[0] + (float)pw * bin_w + ((float)ix + 0.5f) * bin_w / (float)grid_w;
                            roi_sample s = roi_sample_at(yy, xx, H, W);
                            double v[4];
                            for (int k = 0; k < 4; k++)
                                v[k] = s.w[k] * kiln_load_f64(x->dtype, x->data, base + s.pos[k]);
                            if (!is_max) {
                                acc += v[0] + v[1] + v[2] + v[3];
                                continue;
                            }
                            /* max mode takes the largest weighted corner, as the reference does */
                            double m = fmax(fmax(v[0], v[1]), fmax(v[2], v[3]));
                            acc = first || m > acc ? m : acc;
                            first = false;
                        }
                    }
                    if (!is_max) acc /= (double)count;
                    kiln_store_f64(y->dtype, y->data, ((n * C + ch) * PH + ph) * PW + pw, acc);
                }
        }
    }
    return KILN_OK;
}

/* ---- NonMaxSuppression ---- */

kiln_status kiln_nms_infer(kiln_infer_ctx *c)
{
    const kiln_type *boxes = kiln_infer_in(c, 0), *scores = kiln_infer_in(c, 1);
    if (!boxes || !scores) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs boxes and scores");
    if ((boxes->rank >= 0 && boxes->rank != 3) || (scores->rank >= 0 && scores->rank != 3))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "boxes and scores must be 3-D (ranks %d, %d)", boxes->rank,
                               scores->rank);
    if (boxes->rank == 3)
        KILN_TRY(kiln_infer_require_equal(c, boxes->dims[2], kiln_dim_const(4), "boxes dim 2"));
    if (boxes->rank == 3 && scores->rank == 3) {
        KILN_TRY(kiln_infer_require_equal(c, boxes->dims[0], scores->dims[0], "batches of boxes and scores"));
        KILN_TRY(
            kiln_infer_require_equal(c, boxes->dims[1], scores->dims[2], "box counts of boxes and scores"));
    }
    if ((boxes->dtype && !kiln_dtype_is_float(boxes->dtype)) ||
        (scores->dtype && !kiln_dtype_is_float(scores->dtype)))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "boxes and scores must be float tensors");
    int64_t cpb = kiln_attr_int(kiln_infer_node(c), "center_point_box", 0);
    if (cpb != 0 && cpb != 1) return kiln_infer_fail(c, KILN_ERR_MODEL, "center_point_box must be 0 or 1");
    kiln_dim out[2] = {kiln_infer_fresh(c, "selected"), kiln_dim_const(3)};
    return kiln_infer_set_out(c, 0, KILN_DTYPE_INT64, 2, out);
}

typedef struct nms_cand {
    float score;
    int64_t idx;
} nms_cand;

/* descending score, then ascending box index */
static int nms_cand_cmp(const void *pa, const void *pb)
{
    const nms_cand *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

/* Corners [y_min, x_min, y_max, x_max] of box i (either format). */
static void nms_corners(const float *box, bool center, float *k)
{
    if (center) {
        float hw = box[2] / 2, hh = box[3] / 2;
        k[0] = box[1] - hh, k[1] = box[0] - hw, k[2] = box[1] + hh, k[3] = box[0] + hw;
    } else {
        k[0] = fminf(box[0], box[2]), k[1] = fminf(box[1], box[3]);
        k[2] = fmaxf(box[0], box[2]), k[3] = fmaxf(box[1], box[3]);
    }
}

/* Whether IoU(a, b) > threshold, in float like the reference implementations. */
static bool nms_suppress(const float *a, const float *b, bool center, float threshold)
{
    float p[4], q[4];
    nms_corners(a, center, p);
    nms_corners(b, center, q);
    float ix0 = fmaxf(p[1], q[1]), ix1 = fminf(p[3], q[3]);
    if (ix1 <= ix0) return false;
    float iy0 = fmaxf(p[0], q[0]), iy1 = fminf(p[2], q[2]);
    if (iy1 <= iy0) return false;
    float inter = (ix1 - ix0) * (iy1 - iy0);
    float area1 = (p[3] - p[1]) * (p[2] - p[0]), area2 = (q[3] - q[1]) * (q[2] - q[0]);
    float uni = area1 + area2 - inter;
    if (inter <= 0 || area1 <= 0 || area2 <= 0 || uni <= 0) return false;
    return inter / uni > threshold;
}

kiln_status kiln_nms_run(kiln_run_ctx *c)
{
    const kiln_value *boxes = kiln_run_in(c, 0), *scores = kiln_run_in(c, 1);
    const kiln_value *max_v = kiln_run_in(c, 2), *iou_v = kiln_run_in(c, 3), *score_v = kiln_run_in(c, 4);
    bool center = kiln_attr_int(kiln_run_node(c), "center_point_box", 0) == 1;
    int64_t max_out = 0;
    float iou_th = 0, score_th = 0;
    bool use_score = score_v && score_v->numel > 0;
    if (max_v && max_v->numel > 0) max_out = kiln_load_i64(max_v->dtype, max_v->data, 0);
    if (iou_v && iou_v->numel > 0) iou_th = (float)kiln_load_f64(iou_v->dtype, iou_v->data, 0);
    if (use_score) score_th = (float)kiln_load_f64(score_v->dtype, score_v->data, 0);
    int64_t B = boxes->dims[0], NB = boxes->dims[1], NC = scores->dims[1];
    float *bx = malloc((size_t)(boxes->numel + 1) * sizeof *bx);
    nms_cand *cand = malloc((size_t)(NB + 1) * sizeof *cand);
    int64_t *sel = malloc((size_t)(NB + 1) * sizeof *sel);
    int64_t *out = NULL, n_out = 0, cap = 0;
    kiln_status st = KILN_OK;
    if (!bx || !cand || !sel) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto free_all;
    }
    for (int64_t i = 0; i < boxes->numel; i++) bx[i] = (float)kiln_load_f64(boxes->dtype, boxes->data, i);
    for (int64_t b = 0; b < B; b++)
        for (int64_t cl = 0; cl < NC; cl++) {
            int64_t n_cand = 0, n_sel = 0;
            for (int64_t i = 0; i < NB; i++) {
                float s = (float)kiln_load_f64(scores->dtype, scores->data, (b * NC + cl) * NB + i);
                if (!use_score || s > score_th) cand[n_cand++] = (nms_cand){s, i};
            }
            qsort(cand, (size_t)n_cand, sizeof *cand, nms_cand_cmp);
            for (int64_t k = 0; k < n_cand && n_sel < max_out; k++) {
                const float *box = bx + (b * NB + cand[k].idx) * 4;
                bool keep = true;
                for (int64_t q = 0; q < n_sel && keep; q++)
                    keep = !nms_suppress(box, bx + (b * NB + sel[q]) * 4, center, iou_th);
                if (!keep) continue;
                sel[n_sel++] = cand[k].idx;
                if (n_out == cap) {
                    cap = cap ? 2 * cap : 64;
                    int64_t *grown = realloc(out, (size_t)cap * 3 * sizeof *out);
                    if (!grown) {
                        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
                        goto free_all;
                    }
                    out = grown;
                }
                out[n_out * 3] = b, out[n_out * 3 + 1] = cl, out[n_out * 3 + 2] = cand[k].idx;
                n_out++;
            }
        }
    int64_t dims[2] = {n_out, 3};
    kiln_value *y;
    st = kiln_run_alloc_out(c, 0, KILN_DTYPE_INT64, 2, dims, &y);
    if (!st && n_out) memcpy(y->data, out, (size_t)n_out * 3 * sizeof *out);
free_all:
    free(bx);
    free(cand);
    free(sel);
    free(out);
    return st;
}
