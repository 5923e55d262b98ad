/* image_signal.c - signal ops: DFT (17, 20), STFT (17), HannWindow, HammingWindow,
 * BlackmanWindow and MelWeightMatrix (17). Transforms are direct O(n^2) sums in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/image_internal.h"
#include "ops/util.h"

/* e^{sign * 2 pi i * km / n} for km in [0, n): callers keep k * m reduced modulo n, which keeps
 * the angle exact for long transforms */
static void twiddle(int64_t km, int64_t n, int sign, double *re, double *im)
{
    double a = 2.0 * M_PI * (double)km / (double)n;
    *re = cos(a);
    *im = sign * sin(a);
}

/* ---- DFT ---- */

typedef struct dft_attrs {
    bool inverse, onesided;
    int axis; /* normalized; -1 when not known (opset 20 axis input not constant) */
} dft_attrs;

/* Axis of the transform; accepted range [-r, -2] U [0, r-2]. */
static bool dft_axis(int64_t axis, int rank, int *out)
{
    if (axis < 0) axis += rank;
    if (axis < 0 || axis > rank - 2) return false;
    *out = (int)axis;
    return true;
}

kiln_status kiln_dft_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input is missing");
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    if (x->dtype && !kiln_image_real(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "unsupported element type %d", (int)x->dtype);
    if (x->rank < 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "input rank %d is below 2", x->rank);
    int r = x->rank;
    kiln_dim last = x->dims[r - 1];
    if (kiln_dim_is_const(last) && last.c != 1 && last.c != 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "last input dim is %lld, expected 1 (real) or 2 (complex)",
                               (long long)last.c);
    dft_attrs a = {kiln_attr_int(n, "inverse", 0) != 0, kiln_attr_int(n, "onesided", 0) != 0, -1};
    int64_t axis = kiln_attr_int(n, "axis", 1), len;
    bool axis_known = true;
    if (kiln_infer_opset(c) >= 20) {
        axis = -2;
        if (kiln_infer_in(c, 2)) axis_known = kiln_image_scalar_i64(kiln_infer_in_value(c, 2), &axis);
    }
    if (!axis_known && kiln_infer_in_value(c, 2))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis must be an integer scalar");
    if (axis_known && !dft_axis(axis, r, &a.axis))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld is out of range for rank %d", (long long)axis,
                               r);
    kiln_dim out[KILN_MAX_RANK];
    for (int k = 0; k < r - 1; k++) out[k] = axis_known ? x->dims[k] : kiln_infer_fresh(c, "dft");
    out[r - 1] = kiln_dim_const(a.inverse && a.onesided ? 1 : 2);
    if (!axis_known) return kiln_infer_set_out(c, 0, x->dtype, r, out);
    kiln_dim d = x->dims[a.axis], L;
    kiln_dimtab *tab = kiln_infer_dims(c);
    if (kiln_infer_in(c, 1)) {
        if (!kiln_image_scalar_i64(kiln_infer_in_value(c, 1), &len)) {
            if (kiln_infer_in_value(c, 1))
                return kiln_infer_fail(c, KILN_ERR_MODEL, "dft_length must be an integer scalar");
            out[a.axis] = kiln_infer_fresh(c, "dft");
            return kiln_infer_set_out(c, 0, x->dtype, r, out);
        }
        if (len < 1)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "dft_length %lld must be positive", (long long)len);
        L = kiln_dim_const(len);
    } else {
        L = a.inverse && a.onesided
                ? kiln_dim_mul(tab, kiln_dim_sub(tab, d, kiln_dim_const(1)), kiln_dim_const(2))
                : d;
    }
    if (kiln_dim_is_const(L) && L.c < 1)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "the DFT length along axis %d would be %lld", a.axis,
                               (long long)L.c);
    out[a.axis] = a.onesided && !a.inverse
                      ? kiln_dim_add(tab, kiln_dim_floordiv(tab, L, kiln_dim_const(2)), kiln_dim_const(1))
                      : L;
    return kiln_infer_set_out(c, 0, x->dtype, r, out);
}

kiln_status kiln_dft_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    if (!y) return KILN_OK;
    bool inverse = kiln_attr_int(n, "inverse", 0) != 0, onesided = kiln_attr_int(n, "onesided", 0) != 0;
    int64_t axis_v = kiln_run_opset(c) >= 20 ? -2 : kiln_attr_int(n, "axis", 1);
    if (kiln_run_opset(c) >= 20 && kiln_run_in(c, 2)) kiln_image_scalar_i64(kiln_run_in(c, 2), &axis_v);
    int r = x->rank, axis = 0;
    dft_axis(axis_v, r, &axis); /* validated by inference */
    int64_t d = x->dims[axis], out_n = y->dims[axis], in_c = x->dims[r - 1], out_c = y->dims[r - 1];
    int64_t L = inverse && onesided ? 2 * (d - 1) : d;
    if (kiln_run_in(c, 1)) kiln_image_scalar_i64(kiln_run_in(c, 1), &L);
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < axis; k++) outer *= x->dims[k];
    for (int k = axis + 1; k < r - 1; k++) inner *= x->dims[k];
    /* irfft reads the half spectrum and extends it by conjugate symmetry */
    int64_t used = inverse && onesided ? (d < L / 2 + 1 ? d : L / 2 + 1) : (d < L ? d : L);
    double *re = malloc((size_t)(L + 1) * sizeof *re), *im = malloc((size_t)(L + 1) * sizeof *im);
    if (!re || !im) {
        free(re);
        free(im);
        return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            for (int64_t m = 0; m < L; m++) re[m] = im[m] = 0;
            for (int64_t m = 0; m < used; m++) {
                int64_t e = ((o * d + m) * inner + i) * in_c;
                re[m] = kiln_load_f64(x->dtype, x->data, e);
                im[m] = in_c == 2 ? kiln_load_f64(x->dtype, x->data, e + 1) : 0;
            }
            if (inverse && onesided)
                for (int64_t m = L / 2 + 1; m < L; m++) re[m] = re[L - m], im[m] = -im[L - m];
            for (int64_t k = 0; k < out_n; k++) {
                double sr = 0, si = 0;
                for (int64_t m = 0, km = 0; m < L; m++, km = (km + k) % L) {
                    double wr, wi;
                    twiddle(km, L, inverse ? 1 : -1, &wr, &wi);
                    sr += re[m] * wr - im[m] * wi;
                    si += re[m] * wi + im[m] * wr;
                }
                if (inverse) sr /= (double)L, si /= (double)L;
                int64_t e = ((o * out_n + k) * inner + i) * out_c;
                kiln_store_f64(y->dtype, y->data, e, sr);
                if (out_c == 2) kiln_store_f64(y->dtype, y->data, e + 1, si);
            }
        }
    free(re);
    free(im);
    return KILN_OK;
}

/* ---- STFT ---- */

kiln_status kiln_stft_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *window = kiln_infer_in(c, 2);
    if (!x || !kiln_infer_in(c, 1)) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs signal and frame_step");
    bool onesided = kiln_attr_int(kiln_infer_node(c), "onesided", 1) != 0;
    if (x->dtype && !kiln_image_real(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "unsupported signal element type %d", (int)x->dtype);
    if (x->rank >= 0 && x->rank != 3)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "signal has rank %d, expected 3", x->rank);
    if (x->rank == 3 && kiln_dim_is_const(x->dims[2]) && x->dims[2].c != 1 && x->dims[2].c != 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "last signal dim is %lld, expected 1 or 2",
                               (long long)x->dims[2].c);
    if (window && window->rank >= 0 && window->rank != 1)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "window has rank %d, expected 1", window->rank);
    int64_t step, fl_v;
    bool step_known = kiln_image_scalar_i64(kiln_infer_in_value(c, 1), &step);
    bool fl_given = kiln_infer_in(c, 3) != NULL;
    bool fl_known = fl_given && kiln_image_scalar_i64(kiln_infer_in_value(c, 3), &fl_v);
    if (!kiln_infer_dims(c) && (!step_known || fl_given != fl_known))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "frame_step and frame_length must be integer scalars");
    if (step_known && step < 1)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "frame_step %lld must be positive", (long long)step);
    kiln_dim out[4] = {x->rank == 3 ? x->dims[0] : kiln_infer_fresh(c, "batch"),
                       kiln_infer_fresh(c, "frames"), kiln_infer_fresh(c, "bins"), kiln_dim_const(2)};
    if (x->rank != 3 || fl_given != fl_known || (!fl_given && window && window->rank != 1))
        return kiln_infer_set_out(c, 0, x->dtype, 4, out);
    /* frame length: the frame_length input, else the window's length, else the signal length */
    kiln_dim fl = fl_known ? kiln_dim_const(fl_v) : window ? window->dims[0] : x->dims[1];
    if (kiln_dim_is_const(fl) && fl.c < 1)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "frame_length %lld must be positive", (long long)fl.c);
    if (window && window->rank == 1)
        KILN_TRY(kiln_infer_require_equal(c, window->dims[0], fl, "window length and frame_length"));
    kiln_dimtab *tab = kiln_infer_dims(c);
    kiln_dim span = kiln_dim_sub(tab, x->dims[1], fl);
    if (kiln_dim_is_const(span) && span.c < 0)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "frame_length exceeds the signal length");
    out[2] =
        onesided ? kiln_dim_add(tab, kiln_dim_floordiv(tab, fl, kiln_dim_const(2)), kiln_dim_const(1)) : fl;
    if (step_known)
        out[1] = kiln_dim_add(tab, kiln_dim_floordiv(tab, span, kiln_dim_const(step)), kiln_dim_const(1));
    return kiln_infer_set_out(c, 0, x->dtype, 4, out);
}

kiln_status kiln_stft_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *window = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    if (!y) return KILN_OK;
    int64_t step = 1, B = y->dims[0], frames = y->dims[1], bins = y->dims[2], len = x->dims[1],
            in_c = x->dims[2];
    int64_t L = window ? window->dims[0] : len;
    kiln_image_scalar_i64(kiln_run_in(c, 1), &step);
    if (kiln_run_in(c, 3)) kiln_image_scalar_i64(kiln_run_in(c, 3), &L);
    for (int64_t b = 0; b < B; b++)
        for (int64_t f = 0; f < frames; f++)
            for (int64_t k = 0; k < bins; k++) {
                double sr = 0, si = 0;
                for (int64_t m = 0, km = 0; m < L && f * step + m < len; m++, km = (km + k) % L) {
                    int64_t e = (b * len + f * step + m) * in_c;
                    double w = window ? kiln_load_f64(window->dtype, window->data, m) : 1.0, wr, wi;
                    double xr = w * kiln_load_f64(x->dtype, x->data, e);
                    double xi = in_c == 2 ? w * kiln_load_f64(x->dtype, x->data, e + 1) : 0;
                    twiddle(km, L, -1, &wr, &wi);
                    sr += xr * wr - xi * wi;
                    si += xr * wi + xi * wr;
                }
                int64_t e = ((b * frames + f) * bins + k) * 2;
                kiln_store_f64(y->dtype, y->data, e, sr);
                kiln_store_f64(y->dtype, y->data, e + 1, si);
            }
    return KILN_OK;
}

/* ---- HannWindow, HammingWindow, BlackmanWindow ---- */

static kiln_dtype output_datatype(const kiln_node *n)
{
    return (kiln_dtype)kiln_attr_int(n, "output_datatype", KILN_DTYPE_FLOAT32);
}

static bool output_datatype_ok(kiln_dtype dt)
{
    return kiln_dtype_valid(dt) && (kiln_dtype_is_float(dt) || kiln_dtype_is_int(dt)) &&
           !kiln_dtype_is_lowp_float(dt);
}

kiln_status kiln_window_infer(kiln_infer_ctx *c)
{
    kiln_dtype dt = output_datatype(kiln_infer_node(c));
    if (!output_datatype_ok(dt))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "unsupported output_datatype %d", (int)dt);
    int64_t size;
    kiln_dim d = kiln_infer_fresh(c, "window");
    bool known = kiln_image_scalar_i64(kiln_infer_in_value(c, 0), &size);
    if (!known && !kiln_infer_dims(c))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "size must be an integer scalar");
    if (known) {
        if (size < 0) return kiln_infer_fail(c, KILN_ERR_MODEL, "size %lld is negative", (long long)size);
        d = kiln_dim_const(size);
    }
    return kiln_infer_set_out(c, 0, dt, 1, &d);
}

kiln_status kiln_window_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    kiln_value *y = kiln_run_out(c, 0);
    if (!y) return KILN_OK;
    int64_t size = y->dims[0];
    double N = kiln_attr_int(n, "periodic", 1) ? (double)size : (double)(size - 1);
    for (int64_t i = 0; i < size; i++) {
        double a = 2.0 * M_PI * (double)i / N, v;
        if (N == 0)
            v = 1.0; /* a symmetric window of one point */
        else if (!strcmp(n->op_type, "HannWindow"))
            v = 0.5 - 0.5 * cos(a);
        else if (!strcmp(n->op_type, "HammingWindow"))
            v = 25.0 / 46.0 - 21.0 / 46.0 * cos(a);
        else
            v = 0.42 - 0.5 * cos(a) + 0.08 * cos(2 * a);
        kiln_store_f64(y->dtype, y->data, i, v);
    }
    return KILN_OK;
}

/* ---- MelWeightMatrix ---- */

kiln_status kiln_melweight_infer(kiln_infer_ctx *c)
{
    kiln_dtype dt = output_datatype(kiln_infer_node(c));
    if (!output_datatype_ok(dt))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "unsupported output_datatype %d", (int)dt);
    int64_t bins, len;
    kiln_dim out[2] = {kiln_infer_fresh(c, "spectrogram_bins"), kiln_infer_fresh(c, "mel_bins")};
    if (!kiln_infer_dims(c) && !(kiln_image_scalar_i64(kiln_infer_in_value(c, 0), &bins) &&
                                 kiln_image_scalar_i64(kiln_infer_in_value(c, 1), &len)))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "num_mel_bins and dft_length must be integer scalars");
    if (kiln_image_scalar_i64(kiln_infer_in_value(c, 1), &len)) {
        if (len < 1)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "dft_length %lld must be positive", (long long)len);
        out[0] = kiln_dim_const(len / 2 + 1);
    }
    if (kiln_image_scalar_i64(kiln_infer_in_value(c, 0), &bins)) {
        if (bins < 1)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "num_mel_bins %lld must be positive", (long long)bins);
        out[1] = kiln_dim_const(bins);
    }
    return kiln_infer_set_out(c, 0, dt, 2, out);
}

/* mel(f) = 2595 log10(1 + f / 700); the log1p part in float like the reference */
static double hz_to_mel(double hz)
{
    return (double)(2595.0f * log1pf((float)hz / 700.0f)) / log(10.0);
}

kiln_status kiln_melweight_run(kiln_run_ctx *c)
{
    kiln_value *y = kiln_run_out(c, 0);
    if (!y) return KILN_OK;
    int64_t n_mel = y->dims[1], n_spec = y->dims[0], len = 0, rate = 0;
    kiln_image_scalar_i64(kiln_run_in(c, 1), &len);
    if (!kiln_image_scalar_i64(kiln_run_in(c, 2), &rate) || rate <= 0)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "sample_rate must be a positive integer scalar");
    const kiln_value *lo_v = kiln_run_in(c, 3), *hi_v = kiln_run_in(c, 4);
    if (lo_v->numel != 1 || hi_v->numel != 1 || !kiln_dtype_is_float(lo_v->dtype) ||
        !kiln_dtype_is_float(hi_v->dtype))
        return kiln_run_fail(c, KILN_ERR_SHAPE,
                             "lower_edge_hertz and upper_edge_hertz must be float scalars");
    double lo = hz_to_mel(kiln_load_f64(lo_v->dtype, lo_v->data, 0));
    double hi = hz_to_mel(kiln_load_f64(hi_v->dtype, hi_v->data, 0));
    double step = (hi - lo) / (double)(n_mel + 2);
    int64_t *bin = malloc((size_t)(n_mel + 2) * sizeof *bin);
    if (!bin) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    /* triangle edges: mel-spaced points mapped to spectrogram bins */
    for (int64_t i = 0; i < n_mel + 2; i++) {
        double hz = 700.0 * expm1(((double)i * step + lo) / 2595.0 * log(10.0));
        bin[i] = (int64_t)floor((double)(len + 1) * hz / (double)rate);
    }
    for (int64_t i = 0; i < n_mel; i++) {
        int64_t left = bin[i], center = bin[i + 1], right = bin[i + 2];
        for (int64_t j = left; j <= right; j++) {
            double v;
            if (j < 0 || j >= n_spec) continue;
            if (j < center)
                v = (double)(j - left) / (double)(center - left);
            else if (j == center)
                v = 1.0;
            else
                v = (double)(right - j) / (double)(right - center);
            kiln_store_f64(y->dtype, y->data, j * n_mel + i, v);
        }
    }
    free(bin);
    return KILN_OK;
}
