/* cast_quant.c - QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear: per-tensor,
 * per-axis and blocked scales; integer targets round half to even and saturate, float8/float4
 * targets convert like Cast. */
#include <math.h>
#include <string.h>

#include "ops/cast_internal.h"
#include "ops/quant_internal.h"
#include "ops/util.h"

int64_t kiln_qmap_index(const kiln_qmap *m, int64_t i)
{
    if (m->kind == KILN_QMAP_TENSOR) return 0;
    int64_t a = (i / m->inner) % m->D;
    if (m->kind == KILN_QMAP_AXIS) return a;
    int64_t o = i / (m->inner * m->D), r = i % m->inner;
    int64_t nb = (m->D + m->block - 1) / m->block;
    return (o * nb + a / m->block) * m->inner + r;
}

static bool is_per_tensor(const kiln_type *s)
{
    return s->rank == 0 || (s->rank == 1 && kiln_dim_is_const(s->dims[0]) && s->dims[0].c == 1);
}

/* Checks the shapes of scale (and zero point, input 2, when present) against x for the
 * granularity that axis / block_size select. */
static kiln_status check_params(kiln_infer_ctx *c, const char *scale_name)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0), *s = kiln_infer_in(c, 1), *zp = kiln_infer_in(c, 2);
    if (!x || !s) return kiln_infer_fail(c, KILN_ERR_MODEL, "inputs x and %s are required", scale_name);
    int64_t block = kiln_attr_int(n, "block_size", 0);
    if (block < 0) return kiln_infer_fail(c, KILN_ERR_MODEL, "block_size %lld is negative", (long long)block);
    if (zp && zp->rank >= 0 && s->rank >= 0 && !(is_per_tensor(zp) && is_per_tensor(s))) {
        if (zp->rank != s->rank)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "zero point rank %d differs from %s rank %d", zp->rank,
                                   scale_name, s->rank);
        for (int k = 0; k < s->rank; k++)
            KILN_TRY(kiln_infer_require_equal(c, zp->dims[k], s->dims[k], "zero point and scale dims"));
    }
    if (x->rank < 0 || s->rank < 0 || (block == 0 && is_per_tensor(s))) return KILN_OK;
    int axis;
    if (!kiln_axis_norm(kiln_attr_int(n, "axis", 1), x->rank, &axis))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld is out of range for rank %d",
                               (long long)kiln_attr_int(n, "axis", 1), x->rank);
    if (block == 0) {
        if (s->rank != 1)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "%s must be a scalar or 1-D without block_size, has rank %d",
                                   scale_name, s->rank);
        return kiln_infer_require_equal(c, s->dims[0], x->dims[axis], "per-axis scale length and x dim at axis");
    }
    if (s->rank != x->rank)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "blocked %s rank %d differs from x rank %d", scale_name, s->rank,
                               x->rank);
    for (int k = 0; k < x->rank; k++) {
        kiln_dim want = k == axis ? kiln_dim_ceildiv(kiln_infer_dims(c), x->dims[k], kiln_dim_const(block))
                                  : x->dims[k];
        KILN_TRY(kiln_infer_require_equal(c, s->dims[k], want, "blocked scale dims"));
    }
    return KILN_OK;
}

void kiln_qmap_of(const kiln_node *n, const kiln_value *x, const kiln_value *s, kiln_qmap *m)
{
    int64_t block = kiln_attr_int(n, "block_size", 0);
    m->kind = block == 0 && s->numel == 1 ? KILN_QMAP_TENSOR : block == 0 ? KILN_QMAP_AXIS : KILN_QMAP_BLOCKED;
    m->block = block;
    int axis = 0;
    kiln_axis_norm(kiln_attr_int(n, "axis", 1), x->rank, &axis);
    m->D = x->rank ? x->dims[axis] : 1;
    m->inner = 1;
    for (int k = axis + 1; k < x->rank; k++) m->inner *= x->dims[k];
    if (m->D == 0 || m->inner == 0) m->kind = KILN_QMAP_TENSOR; /* x is empty: nothing is read */
}

/* v rounded to the precision of float type dt, as if computed in that type */
static double round_to(kiln_dtype dt, double v)
{
    uint64_t tmp = 0;
    kiln_store_f64(dt, &tmp, 0, v);
    return kiln_load_f64(dt, &tmp, 0);
}

bool kiln_quant_int_range(kiln_dtype dt, int64_t *lo, int64_t *hi)
{
    switch (dt) {
    case KILN_DTYPE_UINT8: *lo = 0, *hi = 255; return true;
    case KILN_DTYPE_INT8: *lo = -128, *hi = 127; return true;
    case KILN_DTYPE_UINT16: *lo = 0, *hi = 65535; return true;
    case KILN_DTYPE_INT16: *lo = -32768, *hi = 32767; return true;
    case KILN_DTYPE_UINT4: *lo = 0, *hi = 15; return true;
    case KILN_DTYPE_INT4: *lo = -8, *hi = 7; return true;
    case KILN_DTYPE_UINT2: *lo = 0, *hi = 3; return true;
    case KILN_DTYPE_INT2: *lo = -2, *hi = 1; return true;
    default: return false;
    }
}

static bool quant_float_target(kiln_dtype dt)
{
    return kiln_dtype_is_lowp_float(dt) && dt != KILN_DTYPE_FLOAT8E8M0;
}

/* ---- QuantizeLinear ---- */

kiln_status kiln_cast_quantize_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    KILN_TRY(check_params(c, "y_scale"));
    const kiln_type *zp = kiln_infer_in(c, 2);
    kiln_dtype attr = (kiln_dtype)kiln_attr_int(n, "output_dtype", 0);
    kiln_dtype dt = zp ? zp->dtype : attr ? attr : KILN_DTYPE_UINT8;
    if (zp && attr && zp->dtype && zp->dtype != attr)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "output_dtype %s differs from y_zero_point type %s",
                               kiln_dtype_name(attr), kiln_dtype_name(zp->dtype));
    int64_t lo, hi;
    if (dt && !kiln_quant_int_range(dt, &lo, &hi) && !quant_float_target(dt))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "%s is not a quantized type", kiln_dtype_name(dt));
    kiln_dtype prec = (kiln_dtype)kiln_attr_int(n, "precision", 0);
    if (prec && !kiln_dtype_is_float(prec))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "precision %s is not a float type", kiln_dtype_name(prec));
    return kiln_cast_infer_like(c, 0, 0, dt);
}

kiln_status kiln_cast_quantize_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0), *s = kiln_run_in(c, 1), *zp = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    kiln_qmap m;
    kiln_qmap_of(n, x, s, &m);
    bool saturate = kiln_attr_int(n, "saturate", 1) != 0;
    kiln_dtype prec = (kiln_dtype)kiln_attr_int(n, "precision", 0);
    if (!prec) prec = s->dtype;
    int64_t lo = 0, hi = 0;
    bool int_target = kiln_quant_int_range(y->dtype, &lo, &hi);
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t p = kiln_qmap_index(&m, i);
        double q = round_to(prec, round_to(prec, kiln_load_f64(x->dtype, x->data, i)) /
                                      round_to(prec, kiln_load_f64(s->dtype, s->data, p)));
        if (int_target) {
            double r = rint(q) + (zp ? (double)kiln_load_i64(zp->dtype, zp->data, p) : 0);
            if (isnan(r)) r = (double)lo; /* ORT's saturation takes NaN to the low end */
            kiln_store_i64(y->dtype, y->data, i, (int64_t)fmin(fmax(r, (double)lo), (double)hi));
            continue;
        }
        /* ONNX's reference adds float4 zero points (turning -0 into +0) and ignores float8 ones */
        if (zp && y->dtype == KILN_DTYPE_FLOAT4E2M1) q += kiln_load_f64(zp->dtype, zp->data, p);
        ((uint8_t *)y->data)[i] = kiln_lowp_from_f32(y->dtype, (float)q, saturate);
    }
    return KILN_OK;
}

/* ---- DequantizeLinear ---- */

kiln_status kiln_cast_dequantize_infer(kiln_infer_ctx *c)
{
    KILN_TRY(check_params(c, "x_scale"));
    const kiln_type *x = kiln_infer_in(c, 0), *s = kiln_infer_in(c, 1), *zp = kiln_infer_in(c, 2);
    if (zp && x->dtype && zp->dtype && zp->dtype != x->dtype)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "x_zero_point type %s differs from x type %s",
                               kiln_dtype_name(zp->dtype), kiln_dtype_name(x->dtype));
    kiln_dtype dt = (kiln_dtype)kiln_attr_int(kiln_infer_node(c), "output_dtype", 0);
    if (!dt) dt = s->dtype;
    if (dt && !kiln_dtype_is_float(dt))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "output type %s is not a float type", kiln_dtype_name(dt));
    return kiln_cast_infer_like(c, 0, 0, dt);
}

kiln_status kiln_cast_dequantize_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *s = kiln_run_in(c, 1), *zp = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    kiln_qmap m;
    kiln_qmap_of(kiln_run_node(c), x, s, &m);
    /* float8 zero points are zero by definition; float4 ones are ignored like ONNX's reference */
    bool use_zp = zp && !kiln_dtype_is_float(x->dtype);
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t p = kiln_qmap_index(&m, i);
        double d = kiln_load_f64(x->dtype, x->data, i);
        if (use_zp) d = (double)(kiln_load_i64(x->dtype, x->data, i) - kiln_load_i64(zp->dtype, zp->data, p));
        kiln_store_f64(y->dtype, y->data, i, d * kiln_load_f64(s->dtype, s->data, p));
    }
    return KILN_OK;
}

/* ---- DynamicQuantizeLinear: uint8 with scale and zero point from the data's range ---- */

kiln_status kiln_cast_dynquant_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (x && x->dtype && x->dtype != KILN_DTYPE_FLOAT32)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "x must be float32, is %s", kiln_dtype_name(x->dtype));
    KILN_TRY(kiln_cast_infer_like(c, 0, 0, KILN_DTYPE_UINT8));
    KILN_TRY(kiln_infer_set_out(c, 1, KILN_DTYPE_FLOAT32, 0, NULL));
    return kiln_infer_set_out(c, 2, KILN_DTYPE_UINT8, 0, NULL);
}

/* Follows ONNX's reference step by step in float32 arithmetic. */
kiln_status kiln_cast_dynquant_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    const float *X = x->data;
    float maxx = 0, minx = 0;
    for (int64_t i = 0; i < x->numel; i++) {
        maxx = fmaxf(maxx, X[i]);
        minx = fminf(minx, X[i]);
    }
    float scale = (maxx == minx ? 1.0f : maxx - minx) / 255.0f;
    float zp = rintf(fminf(255.0f, fmaxf(0.0f, 0.0f - minx / scale)));
    kiln_value *y = kiln_run_out(c, 0), *ys = kiln_run_out(c, 1), *yzp = kiln_run_out(c, 2);
    for (int64_t i = 0; i < x->numel; i++) {
        float q = rintf(X[i] / scale) + zp;
        ((uint8_t *)y->data)[i] = (uint8_t)fminf(255.0f, fmaxf(0.0f, q));
    }
    if (ys) ((float *)ys->data)[0] = scale;
    if (yzp) ((uint8_t *)yzp->data)[0] = (uint8_t)zp;
    return KILN_OK;
}
