/* shape_gen.c - ops that generate tensors from shapes or masks: ConstantOfShape, Range, Trilu,
 * EyeLike. */
#include <math.h>
#include <string.h>

#include "ops/shape_ops.h"
#include "ops/util.h"

/* ---- ConstantOfShape ---- */

kiln_status kiln_shape_constant_of_shape_infer(kiln_infer_ctx *c)
{
    const kiln_value *v = kiln_attr_tensor(kiln_infer_node(c), "value");
    if (v && (v->kind != KILN_VALUE_TENSOR || v->numel != 1))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "value must hold exactly one element");
    kiln_dtype dt = v ? v->dtype : KILN_DTYPE_FLOAT32;
    kiln_shape_side s = {.ic = c};
    kiln_shape_vec shape;
    kiln_shape_in_vec(&s, 0, &shape);
    if (!shape.known) return kiln_shape_set_out_fresh(c, 0, dt, kiln_shape_static_len(c, 0));
    if (shape.n > KILN_MAX_RANK)
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "shape has %d entries, more than %d", shape.n,
                               KILN_MAX_RANK);
    for (int k = 0; k < shape.n; k++)
        if (kiln_dim_is_const(shape.v[k]) && shape.v[k].c < 0)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "shape entry %d is %lld", k, (long long)shape.v[k].c);
    KILN_TRY(kiln_shape_set_out(c, 0, dt, shape.n, shape.v));
    /* a short integer vector (e.g. ones for an Expand shape) keeps its content */
    if (!v || !kiln_dtype_is_int(dt) || shape.n != 1 || !kiln_dim_is_const(shape.v[0]) ||
        shape.v[0].c > KILN_SHAPE_VEC_MAX)
        return KILN_OK;
    kiln_dim vec[KILN_SHAPE_VEC_MAX];
    for (int64_t i = 0; i < shape.v[0].c; i++) vec[i] = kiln_dim_const(kiln_load_i64(dt, v->data, 0));
    return kiln_shape_set_out_vec(c, 0, dt, (int)shape.v[0].c, vec);
}

kiln_status kiln_shape_constant_of_shape_run(kiln_run_ctx *c)
{
    const kiln_value *v = kiln_attr_tensor(kiln_run_node(c), "value");
    kiln_value *y = kiln_run_out(c, 0);
    return v ? kiln_shape_fill(c, y, v) : KILN_OK; /* default: float zeros */
}

/* ---- Range ---- */

static bool is_scalar(const kiln_type *t)
{
    return t && (t->rank == 0 || (t->rank == 1 && kiln_dim_is_const(t->dims[0]) && t->dims[0].c == 1));
}

/* Element count from constant start, limit, delta: max(ceil((limit - start) / delta), 0). */
static kiln_status range_count(kiln_infer_ctx *c, const kiln_value *const *v, int64_t *n)
{
    kiln_dtype dt = v[0]->dtype;
    if (kiln_dtype_is_int(dt)) {
        int64_t s = kiln_load_i64(dt, v[0]->data, 0), l = kiln_load_i64(dt, v[1]->data, 0);
        int64_t d = kiln_load_i64(dt, v[2]->data, 0);
        if (d == 0) return kiln_infer_fail(c, KILN_ERR_RUNTIME, "delta is 0");
        /* spans of int64 operands may overflow int64 but never __int128 */
        __int128 span = (__int128)l - s, q = span / d;
        if (q * d != span && (span < 0) == (d < 0)) q++;
        if (q > INT64_MAX) return kiln_infer_fail(c, KILN_ERR_RUNTIME, "range of more than 2^63 elements");
        *n = q < 0 ? 0 : (int64_t)q;
        return KILN_OK;
    }
    double s = kiln_load_f64(dt, v[0]->data, 0), l = kiln_load_f64(dt, v[1]->data, 0);
    double d = kiln_load_f64(dt, v[2]->data, 0);
    if (d == 0 || !isfinite(s) || !isfinite(l) || !isfinite(d))
        return kiln_infer_fail(c, KILN_ERR_RUNTIME, "start %g, limit %g, delta %g give no finite range", s, l,
                               d);
    double q = ceil((l - s) / d);
    if (q > (double)INT64_MAX / 2) return kiln_infer_fail(c, KILN_ERR_RUNTIME, "range of %g elements", q);
    *n = q < 0 ? 0 : (int64_t)q;
    return KILN_OK;
}

kiln_status kiln_shape_range_infer(kiln_infer_ctx *c)
{
    kiln_dimtab *t = kiln_infer_dims(c);
    const kiln_type *in[3];
    const kiln_value *v[3];
    bool consts = true;
    for (int i = 0; i < 3; i++) {
        in[i] = kiln_infer_in(c, i);
        if (!is_scalar(in[i])) return kiln_infer_fail(c, KILN_ERR_SHAPE, "input %d is not a scalar", i);
        if (!kiln_dtype_is_int(in[i]->dtype) && !kiln_dtype_is_float(in[i]->dtype))
            return kiln_infer_fail(c, KILN_ERR_MODEL, "dtype %s is not numeric",
                                   kiln_dtype_name(in[i]->dtype));
        if (in[i]->dtype != in[0]->dtype)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d has dtype %s, input 0 %s", i,
                                   kiln_dtype_name(in[i]->dtype), kiln_dtype_name(in[0]->dtype));
        v[i] = kiln_infer_in_value(c, i);
        consts = consts && v[i];
    }
    kiln_dtype dt = in[0]->dtype;
    kiln_dim n = kiln_dim_unknown();
    kiln_shape_side s = {.ic = c};
    kiln_shape_vec a[3];
    for (int i = 0; i < 3; i++) kiln_shape_in_vec(&s, i, &a[i]);
    bool sym = a[0].known && a[1].known && a[2].known; /* integer, maybe from shape arithmetic */
    if (consts) {
        int64_t cnt = 0;
        KILN_TRY(range_count(c, v, &cnt));
        n = kiln_dim_const(cnt);
    } else if (sym && kiln_dim_is_const(a[2].v[0]) && a[2].v[0].c != 0) {
        int64_t d = a[2].v[0].c;
        kiln_dim span = d > 0 ? kiln_dim_sub(t, a[1].v[0], a[0].v[0]) : kiln_dim_sub(t, a[0].v[0], a[1].v[0]);
        n = kiln_shape_max(t, kiln_shape_ceildiv(t, span, d > 0 ? d : -d), kiln_dim_const(0));
    }
    KILN_TRY(kiln_shape_set_out(c, 0, dt, 1, &n));
    if (!sym || !kiln_dim_is_const(n) || n.c > KILN_SHAPE_VEC_MAX) return KILN_OK;
    /* a short range (e.g. axes 0..rank) keeps its content */
    kiln_dim vec[KILN_SHAPE_VEC_MAX];
    for (int64_t i = 0; i < n.c; i++)
        vec[i] = kiln_dim_add(t, a[0].v[0], kiln_dim_mul(t, a[2].v[0], kiln_dim_const(i)));
    return kiln_shape_set_out_vec(c, 0, dt, (int)n.c, vec);
}

kiln_status kiln_shape_range_run(kiln_run_ctx *c)
{
    const kiln_value *s = kiln_run_in(c, 0), *d = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    kiln_dtype dt = y->dtype;
    if (kiln_dtype_is_int(dt)) {
        /* wraps like the output type would; the values stay within [start, limit) */
        uint64_t v = (uint64_t)kiln_load_i64(dt, s->data, 0), step = (uint64_t)kiln_load_i64(dt, d->data, 0);
        for (int64_t i = 0; i < y->numel; i++, v += step) kiln_store_i64(dt, y->data, i, (int64_t)v);
        return KILN_OK;
    }
    double start = kiln_load_f64(dt, s->data, 0), step = kiln_load_f64(dt, d->data, 0);
    for (int64_t i = 0; i < y->numel; i++) kiln_store_f64(dt, y->data, i, start + (double)i * step);
    return KILN_OK;
}

/* ---- Trilu / EyeLike ---- */

kiln_status kiln_shape_trilu_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (x->rank < 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "input has rank %d, needs at least 2", x->rank);
    const kiln_type *k = kiln_infer_in(c, 1);
    if (k && (!is_scalar(k) || !kiln_dtype_is_int(k->dtype)))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "k is not an integer scalar");
    return kiln_infer_same_as_input(c, 0, 0);
}

kiln_status kiln_shape_trilu_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *kv = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    bool upper = kiln_attr_int(kiln_run_node(c), "upper", 1) != 0;
    int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1];
    int64_t k = kv && kv->numel ? kiln_load_i64(kv->dtype, kv->data, 0) : 0;
    /* beyond +-(rows + cols) every k keeps all or nothing; clamping avoids overflow */
    if (k > rows + cols) k = rows + cols;
    if (k < -(rows + cols)) k = -(rows + cols);
    int64_t mats = rows > 0 && cols > 0 ? x->numel / (rows * cols) : 0;
    /* y starts zeroed: copy the kept run of each row, [i + k, cols) or [0, i + k] */
    for (int64_t m = 0; m < mats; m++)
        for (int64_t i = 0; i < rows; i++) {
            int64_t lo = upper ? i + k : 0, hi = upper ? cols : i + k + 1;
            if (lo < 0) lo = 0;
            if (hi > cols) hi = cols;
            int64_t at = (m * rows + i) * cols + lo;
            if (hi > lo) KILN_TRY(kiln_shape_copy(c, y, at, x, at, hi - lo));
        }
    return KILN_OK;
}

static kiln_status eye_dtype(const kiln_shape_side *s, kiln_dtype in, kiln_dtype *dt)
{
    int64_t v = kiln_attr_int(kiln_shape_node(s), "dtype", in);
    *dt = (kiln_dtype)v;
    if (!kiln_dtype_valid(*dt) || *dt == KILN_DTYPE_STRING ||
        (!kiln_dtype_is_float(*dt) && !kiln_dtype_is_int(*dt) && *dt != KILN_DTYPE_BOOL))
        return kiln_shape_fail(s, KILN_ERR_MODEL, "dtype %lld is not supported", (long long)v);
    return KILN_OK;
}

kiln_status kiln_shape_eye_like_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_side s = {.ic = c};
    if (x->rank != 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "input has rank %d, expected 2", x->rank);
    kiln_dtype dt;
    KILN_TRY(eye_dtype(&s, x->dtype, &dt));
    kiln_dim dims[2] = {x->dims[0], x->dims[1]};
    return kiln_shape_set_out(c, 0, dt, 2, dims);
}

kiln_status kiln_shape_eye_like_run(kiln_run_ctx *c)
{
    kiln_value *y = kiln_run_out(c, 0);
    int64_t k = kiln_attr_int(kiln_run_node(c), "k", 0), rows = y->dims[0], cols = y->dims[1];
    for (int64_t i = 0; i < rows; i++) {
        /* i + k without overflow: compare against the column range first */
        if (k >= cols - i || k < -i) continue;
        kiln_store_f64(y->dtype, y->data, i * cols + i + k, 1.0);
    }
    return KILN_OK;
}
