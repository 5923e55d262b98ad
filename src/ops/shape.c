/* shape.c - the shape family's table and shared helpers, and the ops that only change a tensor's
 * shape: Reshape, Flatten, Squeeze, Unsqueeze, Shape, Size. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops/shape_ops.h"
#include "ops/util.h"

/* ---- both sides ---- */

const kiln_node *kiln_shape_node(const kiln_shape_side *s)
{
    return s->ic ? kiln_infer_node(s->ic) : kiln_run_node(s->rc);
}

int kiln_shape_opset(const kiln_shape_side *s)
{
    return s->ic ? kiln_infer_opset(s->ic) : kiln_run_opset(s->rc);
}

kiln_dimtab *kiln_shape_tab(const kiln_shape_side *s)
{
    return s->ic ? kiln_infer_dims(s->ic) : NULL;
}

void kiln_shape_in_vec(const kiln_shape_side *s, int i, kiln_shape_vec *v)
{
    v->present = v->known = false;
    v->n = 0;
    if (s->ic) {
        if (!kiln_infer_in(s->ic, i)) return;
        v->present = true;
        v->known = kiln_infer_in_dims_value(s->ic, i, v->v, KILN_SHAPE_VEC_MAX, &v->n);
        return;
    }
    const kiln_value *x = kiln_run_in(s->rc, i);
    if (!x) return;
    v->present = true;
    if (x->kind != KILN_VALUE_TENSOR || x->rank > 1 || !kiln_dtype_is_int(x->dtype) ||
        x->numel > KILN_SHAPE_VEC_MAX)
        return;
    for (int64_t k = 0; k < x->numel; k++) v->v[k] = kiln_dim_const(kiln_load_i64(x->dtype, x->data, k));
    v->n = (int)x->numel;
    v->known = true;
}

void kiln_shape_attr_vec(const kiln_node *n, const char *name, kiln_shape_vec *v)
{
    const kiln_attr *a = kiln_node_attr_typed(n, name, KILN_ATTR_INTS);
    v->present = a != NULL;
    v->known = a && a->n <= KILN_SHAPE_VEC_MAX;
    v->n = v->known ? a->n : 0;
    for (int k = 0; k < v->n; k++) v->v[k] = kiln_dim_const(a->ints[k]);
}

kiln_status kiln_shape_fail(const kiln_shape_side *s, kiln_status code, const char *fmt, ...)
{
    char msg[KILN_ERR_MSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return s->ic ? kiln_infer_fail(s->ic, code, "%s", msg) : kiln_run_fail(s->rc, code, "%s", msg);
}

/* ---- symbolic dims ---- */

bool kiln_shape_nonneg(kiln_dim d)
{
    if (!d.e) return d.c >= 0;
    const kiln_expr *x = d.e;
    switch (x->kind) {
    case KILN_EXPR_SYM:
        return true;
    case KILN_EXPR_SUM:
        if (x->c < 0) return false;
        for (int i = 0; i < x->n; i++)
            if (x->coef[i] < 0 || !kiln_shape_nonneg(x->args[i])) return false;
        return true;
    case KILN_EXPR_PROD:
    case KILN_EXPR_MIN:
        for (int i = 0; i < x->n; i++)
            if (!kiln_shape_nonneg(x->args[i])) return false;
        return true;
    case KILN_EXPR_FLOORDIV:
        return kiln_shape_nonneg(x->args[0]) && kiln_shape_nonneg(x->args[1]);
    case KILN_EXPR_MOD: /* takes the divisor's sign */
        return kiln_shape_nonneg(x->args[1]);
    case KILN_EXPR_MAX:
        return kiln_shape_nonneg(x->args[0]) || kiln_shape_nonneg(x->args[1]);
    default:
        return false;
    }
}

kiln_dim kiln_shape_min(kiln_dimtab *t, kiln_dim a, kiln_dim b)
{
    if (kiln_dim_is_unknown(a) || kiln_dim_is_unknown(b)) return kiln_dim_unknown();
    if (kiln_shape_nonneg(kiln_dim_sub(t, b, a))) return a;
    if (kiln_shape_nonneg(kiln_dim_sub(t, a, b))) return b;
    return kiln_dim_min(t, a, b);
}

kiln_dim kiln_shape_max(kiln_dimtab *t, kiln_dim a, kiln_dim b)
{
    if (kiln_dim_is_unknown(a) || kiln_dim_is_unknown(b)) return kiln_dim_unknown();
    if (kiln_shape_nonneg(kiln_dim_sub(t, a, b))) return a;
    if (kiln_shape_nonneg(kiln_dim_sub(t, b, a))) return b;
    return kiln_dim_max(t, a, b);
}

kiln_dim kiln_shape_ceildiv(kiln_dimtab *t, kiln_dim a, int64_t b)
{
    if (b <= 0) return kiln_dim_ceildiv(t, a, kiln_dim_const(b));
    return kiln_dim_floordiv(t, kiln_dim_add(t, a, kiln_dim_const(b - 1)), kiln_dim_const(b));
}

kiln_dim kiln_shape_prod(kiln_dimtab *t, int n, const kiln_dim *dims)
{
    kiln_dim p = kiln_dim_const(1);
    for (int k = 0; k < n; k++) p = kiln_dim_mul(t, p, dims[k]);
    return p;
}

/* ---- outputs ---- */

kiln_status kiln_shape_set_out(kiln_infer_ctx *c, int i, kiln_dtype dt, int rank, kiln_dim *dims)
{
    for (int k = 0; k < rank; k++) {
        if (!kiln_dim_is_unknown(dims[k])) continue;
        if (!kiln_infer_dims(c))
            return kiln_infer_fail(
                c, KILN_ERR_SHAPE,
                "output %d: dim %d cannot be computed (an argument is not an integer vector of at "
                "most %d entries, or int64 overflows)",
                i, k, KILN_SHAPE_VEC_MAX);
        dims[k] = kiln_infer_fresh(c, "dim");
    }
    return kiln_infer_set_out(c, i, dt, rank, dims);
}

kiln_status kiln_shape_set_out_fresh(kiln_infer_ctx *c, int i, kiln_dtype dt, int rank)
{
    if (!kiln_infer_dims(c))
        return kiln_infer_fail(c, KILN_ERR_SHAPE,
                               "an argument is not an integer vector of at most %d entries",
                               KILN_SHAPE_VEC_MAX);
    if (rank < 0 || rank > KILN_MAX_RANK) return kiln_infer_set_out_unknown(c, i, dt);
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0; k < rank; k++) dims[k] = kiln_dim_unknown();
    return kiln_shape_set_out(c, i, dt, rank, dims);
}

kiln_status kiln_shape_set_out_vec(kiln_infer_ctx *c, int i, kiln_dtype dt, int n, const kiln_dim *v)
{
    if (!kiln_infer_dims(c) || (dt != KILN_DTYPE_INT64 && dt != KILN_DTYPE_INT32) || n > KILN_SHAPE_VEC_MAX)
        return KILN_OK;
    for (int k = 0; k < n; k++)
        if (kiln_dim_is_unknown(v[k])) return KILN_OK;
    return kiln_infer_set_out_dims_value(c, i, v, n);
}

/* ---- element copies ---- */

kiln_status kiln_shape_copy(kiln_run_ctx *c, kiln_value *y, int64_t yi, const kiln_value *x, int64_t xi,
                            int64_t n)
{
    if (n <= 0) return KILN_OK;
    if (x->dtype == KILN_DTYPE_STRING) {
        const char *const *s = x->data;
        for (int64_t k = 0; k < n; k++) {
            const char *v = s[xi + k] ? s[xi + k] : "";
            KILN_TRY(kiln_tensor_set_string(y, yi + k, v, strlen(v), kiln_run_err(c)));
        }
        return KILN_OK;
    }
    size_t es = kiln_dtype_size(x->dtype);
    memcpy((char *)y->data + (size_t)yi * es, (const char *)x->data + (size_t)xi * es, (size_t)n * es);
    return KILN_OK;
}

/* Copies n elements along one axis: y[yo + i * ys] = x[xo + i * xs]. */
static kiln_status copy_line(kiln_run_ctx *c, kiln_value *y, int64_t yo, int64_t ys, const kiln_value *x,
                             int64_t xo, int64_t xs, int64_t n)
{
    if (xs == 1 && ys == 1) return kiln_shape_copy(c, y, yo, x, xo, n);
    if (x->dtype == KILN_DTYPE_STRING) {
        for (int64_t i = 0; i < n; i++) KILN_TRY(kiln_shape_copy(c, y, yo + i * ys, x, xo + i * xs, 1));
        return KILN_OK;
    }
    int64_t es = (int64_t)kiln_dtype_size(x->dtype);
    char *yb = (char *)y->data + yo * es;
    const char *xb = (const char *)x->data + xo * es;
    /* a memcpy of constant size compiles to one load and one store */
#define COPY_LINE(size) \
    for (int64_t i = 0; i < n; i++) memcpy(yb + i * ys * size, xb + i * xs * size, size)
    switch (es) {
    case 1:
        COPY_LINE(1);
        break;
    case 2:
        COPY_LINE(2);
        break;
    case 4:
        COPY_LINE(4);
        break;
    case 8:
        COPY_LINE(8);
        break;
    default:
        COPY_LINE(es);
        break;
    }
#undef COPY_LINE
    return KILN_OK;
}

kiln_status kiln_shape_copy_view(kiln_run_ctx *c, kiln_value *y, int64_t yo, const int64_t *ys,
                                 const kiln_value *x, int64_t xo, const int64_t *xs, int rank,
                                 const int64_t *dims)
{
    for (int k = 0; k < rank; k++)
        if (dims[k] == 0) return KILN_OK;
    if (rank == 0) return kiln_shape_copy(c, y, yo, x, xo, 1);
    /* walk the outer axes; the last one is copied as a line */
    int64_t idx[KILN_SHAPE_VIEW_RANK] = {0}, n = dims[rank - 1], xl = xs[rank - 1], yl = ys[rank - 1];
    for (;;) {
        KILN_TRY(copy_line(c, y, yo, yl, x, xo, xl, n));
        int k = rank - 2;
        for (; k >= 0; k--) {
            xo += xs[k];
            yo += ys[k];
            if (++idx[k] < dims[k]) break;
            xo -= xs[k] * dims[k];
            yo -= ys[k] * dims[k];
            idx[k] = 0;
        }
        if (k < 0) return KILN_OK;
    }
}

kiln_status kiln_shape_fill(kiln_run_ctx *c, kiln_value *y, const kiln_value *v)
{
    if (y->numel == 0) return KILN_OK;
    KILN_TRY(kiln_shape_copy(c, y, 0, v, 0, 1));
    if (y->dtype == KILN_DTYPE_STRING) {
        for (int64_t i = 1; i < y->numel; i++) KILN_TRY(kiln_shape_copy(c, y, i, y, 0, 1));
        return KILN_OK;
    }
    /* double the filled prefix until it covers y */
    size_t es = kiln_dtype_size(y->dtype);
    for (int64_t have = 1; have < y->numel; have *= 2) {
        int64_t n = have < y->numel - have ? have : y->numel - have;
        memcpy((char *)y->data + (size_t)have * es, y->data, (size_t)n * es);
    }
    return KILN_OK;
}

kiln_status kiln_shape_copy_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    if (y->numel != x->numel)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "output has %lld elements, input %lld", (long long)y->numel,
                             (long long)x->numel);
    if (y->data == x->data) return KILN_OK; /* planned in place: the bytes are already there */
    return kiln_shape_copy(c, y, 0, x, 0, x->numel);
}

/* Sets output 0 to (dt of input 0, rank, dims) and carries input 0's integer content over
 * when the output is a vector or scalar (shape arithmetic through Reshape, Squeeze, ...). */
static kiln_status set_out_keep_content(kiln_infer_ctx *c, int rank, kiln_dim *dims)
{
    kiln_dtype dt = kiln_infer_in(c, 0)->dtype;
    KILN_TRY(kiln_shape_set_out(c, 0, dt, rank, dims));
    kiln_shape_side s = {.ic = c};
    kiln_shape_vec v;
    kiln_shape_in_vec(&s, 0, &v);
    if (rank > 1 || !v.known) return KILN_OK;
    return kiln_shape_set_out_vec(c, 0, dt, v.n, v.v);
}

/* Reads an axes list: the attribute before opset `input_since`, input `in` from it. */
static void axes_arg(kiln_infer_ctx *c, int input_since, int in, kiln_shape_vec *axes)
{
    kiln_shape_side s = {.ic = c};
    if (kiln_infer_opset(c) < input_since)
        kiln_shape_attr_vec(kiln_infer_node(c), "axes", axes);
    else
        kiln_shape_in_vec(&s, in, axes);
}

int kiln_shape_static_len(kiln_infer_ctx *c, int in)
{
    const kiln_type *t = kiln_infer_in(c, in);
    if (!t || t->rank != 1 || !kiln_dim_is_const(t->dims[0]) || t->dims[0].c > KILN_MAX_RANK) return -1;
    return (int)t->dims[0].c;
}

/* Normalizes n axes (constants) against rank into out[], failing on duplicates and range. */
static kiln_status norm_axes(kiln_infer_ctx *c, const kiln_shape_vec *axes, int rank, int *out)
{
    bool seen[KILN_MAX_RANK] = {false};
    for (int k = 0; k < axes->n; k++) {
        if (!kiln_dim_is_const(axes->v[k]) || !kiln_axis_norm(axes->v[k].c, rank, &out[k]))
            return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld out of range for rank %d",
                                   (long long)axes->v[k].c, rank);
        if (seen[out[k]])
            return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld repeated", (long long)axes->v[k].c);
        seen[out[k]] = true;
    }
    return KILN_OK;
}

/* ---- Reshape ---- */

/* A product split into a constant and symbolic factors, for cancelling common factors. */
typedef struct factors {
    int64_t k;
    int n;
    kiln_dim f[4 * KILN_MAX_RANK];
} factors;

static bool factors_add(factors *fs, kiln_dim d)
{
    if (kiln_dim_is_unknown(d)) return false;
    if (!d.e) return !__builtin_mul_overflow(fs->k, d.c, &fs->k);
    const kiln_expr *x = d.e;
    if (x->kind == KILN_EXPR_SUM && x->c == 0 && x->n == 1) {
        if (__builtin_mul_overflow(fs->k, x->coef[0], &fs->k)) return false;
        return factors_add(fs, x->args[0]);
    }
    int n = x->kind == KILN_EXPR_PROD ? x->n : 1;
    if (fs->n + n > (int)(sizeof fs->f / sizeof fs->f[0])) return false;
    for (int i = 0; i < n; i++) fs->f[fs->n++] = x->kind == KILN_EXPR_PROD ? x->args[i] : d;
    return true;
}

/* The -1 entry of a Reshape target: total / known, the products of the input dims and of the
 * other target dims, after cancelling factors they share. */
static kiln_status reshape_rest(kiln_infer_ctx *c, const kiln_type *x, int n, const kiln_dim *dims, int neg,
                                kiln_dim *out)
{
    kiln_dimtab *t = kiln_infer_dims(c);
    factors tot = {.k = 1}, kn = {.k = 1};
    bool ok = true;
    for (int k = 0; k < x->rank; k++) ok = ok && factors_add(&tot, x->dims[k]);
    for (int k = 0; k < n; k++) ok = ok && (k == neg || factors_add(&kn, dims[k]));
    if (!ok) {
        *out = kiln_dim_unknown();
        return KILN_OK;
    }
    for (int i = 0; i < kn.n; i++)
        for (int j = 0; j < tot.n; j++)
            if (kiln_dim_equal(kn.f[i], tot.f[j])) {
                tot.f[j] = tot.f[--tot.n];
                kn.f[i--] = kn.f[--kn.n];
                break;
            }
    if (kn.k == 0) {
        if (!t)
            return kiln_infer_fail(c, KILN_ERR_SHAPE,
                                   "cannot infer the -1 dim: the other dims have product 0");
        *out = kiln_dim_unknown();
        return KILN_OK;
    }
    if (tot.n == 0 && kn.n == 0 && tot.k % kn.k != 0)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "cannot reshape %lld elements: not a multiple of %lld",
                               (long long)tot.k, (long long)kn.k);
    kiln_dim num = kiln_shape_prod(t, tot.n, tot.f), den = kiln_shape_prod(t, kn.n, kn.f);
    if (tot.k % kn.k == 0)
        num = kiln_dim_mul(t, num, kiln_dim_const(tot.k / kn.k));
    else {
        num = kiln_dim_mul(t, num, kiln_dim_const(tot.k));
        den = kiln_dim_mul(t, den, kiln_dim_const(kn.k));
    }
    *out = kiln_dim_floordiv(t, num, den);
    return KILN_OK;
}

static kiln_status reshape_infer(kiln_infer_ctx *c)
{
    const kiln_node *node = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_side s = {.ic = c};
    kiln_shape_vec shape;
    if (kiln_infer_opset(c) < 5)
        kiln_shape_attr_vec(node, "shape", &shape);
    else
        kiln_shape_in_vec(&s, 1, &shape);
    if (!shape.present) return kiln_infer_fail(c, KILN_ERR_MODEL, "the target shape is missing");
    if (!shape.known) return kiln_shape_set_out_fresh(c, 0, x->dtype, kiln_shape_static_len(c, 1));
    if (shape.n > KILN_MAX_RANK)
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "target rank %d exceeds %d", shape.n, KILN_MAX_RANK);
    bool allowzero = kiln_infer_opset(c) >= 14 && kiln_attr_int(node, "allowzero", 0);
    kiln_dim dims[KILN_MAX_RANK];
    int neg = -1;
    bool zero = false;
    int64_t fixed = 1; /* product of the positive constant entries */
    for (int k = 0; k < shape.n; k++) {
        kiln_dim d = shape.v[k];
        dims[k] = d;
        if (!kiln_dim_is_const(d)) continue;
        if (d.c < -1)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "target shape entry %d is %lld", k, (long long)d.c);
        if (d.c > 0 && __builtin_mul_overflow(fixed, d.c, &fixed))
            return kiln_infer_fail(c, KILN_ERR_MODEL, "target shape's element count overflows int64");
        if (d.c == -1) {
            if (neg >= 0) return kiln_infer_fail(c, KILN_ERR_MODEL, "target shape has more than one -1");
            neg = k;
        } else if (d.c == 0 && allowzero) {
            zero = true;
        } else if (d.c == 0) {
            if (k >= x->rank)
                return kiln_infer_fail(c, KILN_ERR_SHAPE,
                                       "target entry %d is 0 (copy) but the input has rank %d", k, x->rank);
            dims[k] = x->dims[k];
        }
    }
    if (zero && neg >= 0)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "allowzero with both 0 and -1 in the target");
    if (neg >= 0) {
        KILN_TRY(reshape_rest(c, x, shape.n, dims, neg, &dims[neg]));
    } else {
        kiln_dim a = kiln_shape_prod(kiln_infer_dims(c), x->rank, x->dims);
        kiln_dim b = kiln_shape_prod(kiln_infer_dims(c), shape.n, dims);
        if (kiln_dim_is_const(a) && kiln_dim_is_const(b) && a.c != b.c)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "cannot reshape %lld elements into %lld",
                                   (long long)a.c, (long long)b.c);
        /* undecided at compile time: checked when inputs bind, before memory is planned for a
         * target shape the input can never fill */
        KILN_TRY(kiln_infer_require_equal(c, a, b, "element count of the reshape target"));
    }
    return set_out_keep_content(c, shape.n, dims);
}

/* ---- Flatten ---- */

static kiln_status flatten_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_dimtab *t = kiln_infer_dims(c);
    int64_t axis = kiln_attr_int(kiln_infer_node(c), "axis", 1);
    if (axis < 0 && kiln_infer_opset(c) >= 11) axis += x->rank;
    if (axis < 0 || axis > x->rank)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld out of range for rank %d", (long long)axis,
                               x->rank);
    kiln_dim dims[2] = {kiln_shape_prod(t, (int)axis, x->dims),
                        kiln_shape_prod(t, x->rank - (int)axis, x->dims + axis)};
    return set_out_keep_content(c, 2, dims);
}

/* ---- Squeeze / Unsqueeze ---- */

static kiln_status squeeze_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_vec axes;
    axes_arg(c, 13, 1, &axes);
    bool drop[KILN_MAX_RANK] = {false};
    if (axes.present && !axes.known) {
        int n = kiln_shape_static_len(c, 1);
        return kiln_shape_set_out_fresh(c, 0, x->dtype, n < 0 ? -1 : x->rank - n);
    }
    if (axes.present) {
        int ax[KILN_SHAPE_VEC_MAX];
        if (axes.n > x->rank)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "%d axes for rank %d", axes.n, x->rank);
        KILN_TRY(norm_axes(c, &axes, x->rank, ax));
        for (int k = 0; k < axes.n; k++) {
            kiln_dim d = x->dims[ax[k]];
            if (kiln_dim_is_const(d) && d.c != 1)
                return kiln_infer_fail(c, KILN_ERR_SHAPE, "cannot squeeze axis %d of size %lld", ax[k],
                                       (long long)d.c);
            drop[ax[k]] = true;
        }
    } else {
        for (int k = 0; k < x->rank; k++) {
            /* a symbolic dim may or may not be 1: the rank is decided at run time */
            if (!kiln_dim_is_const(x->dims[k])) return kiln_infer_set_out_unknown(c, 0, x->dtype);
            drop[k] = x->dims[k].c == 1;
        }
    }
    kiln_dim dims[KILN_MAX_RANK];
    int r = 0;
    for (int k = 0; k < x->rank; k++)
        if (!drop[k]) dims[r++] = x->dims[k];
    return set_out_keep_content(c, r, dims);
}

static kiln_status unsqueeze_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    kiln_shape_vec axes;
    axes_arg(c, 13, 1, &axes);
    if (!axes.present) return kiln_infer_fail(c, KILN_ERR_MODEL, "axes are missing");
    if (!axes.known) {
        int n = kiln_shape_static_len(c, 1);
        return kiln_shape_set_out_fresh(c, 0, x->dtype, n < 0 ? -1 : x->rank + n);
    }
    int r = x->rank + axes.n;
    if (r > KILN_MAX_RANK)
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "output rank %d exceeds %d", r, KILN_MAX_RANK);
    int ax[KILN_SHAPE_VEC_MAX];
    KILN_TRY(norm_axes(c, &axes, r, ax));
    bool ins[KILN_MAX_RANK] = {false};
    for (int k = 0; k < axes.n; k++) ins[ax[k]] = true;
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0, j = 0; k < r; k++) dims[k] = ins[k] ? kiln_dim_const(1) : x->dims[j++];
    return set_out_keep_content(c, r, dims);
}

/* ---- Shape / Size ---- */

/* Shape's [start, end) window of the input dims (attributes from opset 15). */
static void shape_window(int opset, const kiln_node *node, int rank, int *start, int *end)
{
    int64_t s = opset >= 15 ? kiln_attr_int(node, "start", 0) : 0;
    int64_t e = opset >= 15 ? kiln_attr_int(node, "end", rank) : rank;
    if (s < 0) s += rank;
    if (e < 0) e += rank;
    s = s < 0 ? 0 : s > rank ? rank : s;
    e = e < 0 ? 0 : e > rank ? rank : e;
    *start = (int)s;
    *end = e > s ? (int)e : (int)s;
}

static kiln_status shape_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    int s, e;
    shape_window(kiln_infer_opset(c), kiln_infer_node(c), x->rank, &s, &e);
    kiln_dim n = kiln_dim_const(e - s);
    KILN_TRY(kiln_infer_set_out(c, 0, KILN_DTYPE_INT64, 1, &n));
    return kiln_shape_set_out_vec(c, 0, KILN_DTYPE_INT64, e - s, x->dims + s);
}

static kiln_status shape_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    int s, e;
    shape_window(kiln_run_opset(c), kiln_run_node(c), x->rank, &s, &e);
    int64_t *y = kiln_run_out(c, 0)->data;
    for (int k = s; k < e; k++) y[k - s] = x->dims[k];
    return KILN_OK;
}

static kiln_status size_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    KILN_TRY(kiln_infer_set_out(c, 0, KILN_DTYPE_INT64, 0, NULL));
    kiln_dim n = kiln_shape_prod(kiln_infer_dims(c), x->rank, x->dims);
    return kiln_shape_set_out_vec(c, 0, KILN_DTYPE_INT64, 1, &n);
}

static kiln_status size_run(kiln_run_ctx *c)
{
    *(int64_t *)kiln_run_out(c, 0)->data = kiln_run_in(c, 0)->numel;
    return KILN_OK;
}

static const kiln_op_def defs[] = {
    {"", "Reshape", 1, reshape_infer, kiln_shape_copy_run, KILN_OP_INPLACE, KILN_OP_IN(1)},
    {"", "Flatten", 1, flatten_infer, kiln_shape_copy_run, KILN_OP_INPLACE},
    {"", "Squeeze", 1, squeeze_infer, kiln_shape_copy_run, KILN_OP_INPLACE, KILN_OP_IN(1)},
    {"", "Unsqueeze", 1, unsqueeze_infer, kiln_shape_copy_run, KILN_OP_INPLACE, KILN_OP_IN(1)},
    {"", "Shape", 1, shape_infer, shape_run, KILN_OP_READS_TYPE_ONLY},
    {"", "Size", 1, size_infer, size_run, KILN_OP_READS_TYPE_ONLY},
    {"", "Transpose", 1, kiln_shape_transpose_infer, kiln_shape_transpose_run},
    {"", "Concat", 1, kiln_shape_concat_infer, kiln_shape_concat_run},
    {"", "Split", 1, kiln_shape_split_infer, kiln_shape_split_run, 0, KILN_OP_IN(1)},
    {"", "Slice", 1, kiln_shape_slice_infer, kiln_shape_slice_run, 0,
     KILN_OP_IN(1) | KILN_OP_IN(2) | KILN_OP_IN(3) | KILN_OP_IN(4)},
    {"", "Expand", 1, kiln_shape_expand_infer, kiln_shape_expand_run, 0, KILN_OP_IN(1)},
    {"", "Tile", 1, kiln_shape_tile_infer, kiln_shape_tile_run, 0, KILN_OP_IN(1) | KILN_OP_IN(2)},
    {"", "DepthToSpace", 1, kiln_shape_depth_to_space_infer, kiln_shape_depth_to_space_run},
    {"", "SpaceToDepth", 1, kiln_shape_space_to_depth_infer, kiln_shape_space_to_depth_run},
    {"", "Pad", 1, kiln_shape_pad_infer, kiln_shape_pad_run, 0, KILN_OP_IN(1) | KILN_OP_IN(2) | KILN_OP_IN(3)},
    {"", "CenterCropPad", 1, kiln_shape_center_crop_pad_infer, kiln_shape_center_crop_pad_run, 0, KILN_OP_IN(1)},
    {"", "ConstantOfShape", 1, kiln_shape_constant_of_shape_infer, kiln_shape_constant_of_shape_run, 0,
     KILN_OP_IN(0)},
    {"", "Range", 1, kiln_shape_range_infer, kiln_shape_range_run, 0, KILN_OP_IN(0) | KILN_OP_IN(1) | KILN_OP_IN(2)},
    {"", "Trilu", 1, kiln_shape_trilu_infer, kiln_shape_trilu_run, 0, KILN_OP_IN(1)},
    {"", "EyeLike", 1, kiln_shape_eye_like_infer, kiln_shape_eye_like_run},
};

const kiln_op_table kiln_ops_shape = {defs, sizeof defs / sizeof defs[0]};
