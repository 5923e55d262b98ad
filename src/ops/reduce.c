/* reduce.c - Reductions, softmax family, cumulative ops, Dropout, Det, and the family's table
 * (normalizations live in reduce_norm.c, losses in reduce_loss.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op.h"
#include "ops/reduce_internal.h"
#include "ops/semantics.h"
#include "ops/util.h"

void kiln_reduce_out_strides(int rank, const int64_t *dims, const bool *mask, int64_t *strides,
                             int64_t *out_numel)
{
    int64_t s = 1;
    for (int k = rank - 1; k >= 0; k--) {
        strides[k] = mask[k] ? 0 : s;
        if (!mask[k]) s *= dims[k];
    }
    *out_numel = s;
}

kiln_status kiln_reduce_load_all(kiln_run_ctx *c, const kiln_value *x, double **buf)
{
    *buf = malloc((size_t)(x->numel > 0 ? x->numel : 1) * sizeof(double));
    if (!*buf) return kiln_run_fail(c, KILN_ERR_NOMEM, "no memory for %lld elements", (long long)x->numel);
    for (int64_t i = 0; i < x->numel; i++) (*buf)[i] = kiln_load_f64(x->dtype, x->data, i);
    return KILN_OK;
}

/* ---- Reduce* ---- */

static kiln_status reduce_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input 0 (data) is missing");
    bool keep = kiln_attr_int(n, "keepdims", 1) != 0;
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    kiln_dim dims[KILN_MAX_RANK];
    int r = 0;
    const kiln_type *at = kiln_infer_in(c, 1);
    const kiln_value *av = kiln_infer_in_value(c, 1);
    if (kiln_reduce_axes_from_input(n, kiln_infer_opset(c)) && at && !av) {
        /* axes known only at run time: with keepdims the rank stays, else it shrinks by the
         * (non-zero) number of axes when that is known */
        if (keep) {
            for (int k = 0; k < x->rank; k++) dims[k] = kiln_infer_fresh(c, "reduced");
            return kiln_infer_set_out(c, 0, x->dtype, x->rank, dims);
        }
        if (at->rank == 1 && kiln_dim_is_const(at->dims[0]) && at->dims[0].c > 0 && at->dims[0].c <= x->rank) {
            r = x->rank - (int)at->dims[0].c;
            for (int k = 0; k < r; k++) dims[k] = kiln_infer_fresh(c, "reduced");
            return kiln_infer_set_out(c, 0, x->dtype, r, dims);
        }
        return kiln_infer_set_out_unknown(c, 0, x->dtype);
    }
    bool mask[KILN_MAX_RANK];
    char msg[160];
    if (!kiln_reduce_axes(n, kiln_infer_opset(c), av, x->rank, mask, msg, sizeof msg))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    for (int k = 0; k < x->rank; k++) {
        if (!mask[k]) dims[r++] = x->dims[k];
        else if (keep) dims[r++] = kiln_dim_const(1);
    }
    return kiln_infer_set_out(c, 0, x->dtype, r, dims);
}

/* Float path (also integer inputs of L2, LogSum, LogSumExp): accumulates in double. */
static kiln_status reduce_run_f64(kiln_run_ctx *c, kiln_reduce_op kind, const kiln_value *x, kiln_value *y,
                                  int64_t (*ostr)[KILN_MAX_RANK], int64_t on, int64_t count)
{
    double *acc = malloc((size_t)on * 2 * sizeof(double)), *mx;
    if (!acc) return kiln_run_fail(c, KILN_ERR_NOMEM, "no memory for %lld results", (long long)on);
    mx = acc + on;
    double init = kind == KILN_REDUCE_PROD  ? 1.0
                  : kind == KILN_REDUCE_MAX ? -INFINITY
                  : kind == KILN_REDUCE_MIN ? INFINITY
                                            : 0.0;
    for (int64_t o = 0; o < on; o++) acc[o] = init, mx[o] = -INFINITY;
    kiln_iter it;
    if (kind == KILN_REDUCE_LOGSUMEXP) {
        kiln_iter_init(&it, x->rank, x->dims, 1, ostr);
        for (int64_t i = 0; i < x->numel; i++, kiln_iter_next(&it)) {
            double v = kiln_load_f64(x->dtype, x->data, i);
            if (v > mx[it.off[0]]) mx[it.off[0]] = v;
        }
    }
    kiln_iter_init(&it, x->rank, x->dims, 1, ostr);
    for (int64_t i = 0; i < x->numel; i++, kiln_iter_next(&it)) {
        double v = kiln_load_f64(x->dtype, x->data, i), *a = &acc[it.off[0]];
        switch (kind) {
        case KILN_REDUCE_SUM: case KILN_REDUCE_MEAN: case KILN_REDUCE_LOGSUM: *a += v; break;
        case KILN_REDUCE_PROD: *a *= v; break;
        case KILN_REDUCE_MAX: if (v > *a || isnan(v)) *a = v; break;
        case KILN_REDUCE_MIN: if (v < *a || isnan(v)) *a = v; break;
        case KILN_REDUCE_L1: *a += fabs(v); break;
        case KILN_REDUCE_L2: case KILN_REDUCE_SUMSQ: *a += v * v; break;
        case KILN_REDUCE_LOGSUMEXP: *a += exp(v - mx[it.off[0]]); break;
        }
    }
    for (int64_t o = 0; o < on; o++) {
        double v = acc[o];
        if (kind == KILN_REDUCE_MEAN) v /= (double)count;
        else if (kind == KILN_REDUCE_L2) v = sqrt(v);
        else if (kind == KILN_REDUCE_LOGSUM) v = log(v);
        else if (kind == KILN_REDUCE_LOGSUMEXP) v = isinf(mx[o]) ? mx[o] : mx[o] + log(v);
        kiln_store_f64(y->dtype, y->data, o, v);
    }
    free(acc);
    return KILN_OK;
}

/* Integer and bool path: exact 64-bit arithmetic (sums and products wrap like the C types). */
static kiln_status reduce_run_int(kiln_run_ctx *c, kiln_reduce_op kind, const kiln_value *x, kiln_value *y,
                                  int64_t (*ostr)[KILN_MAX_RANK], int64_t on, int64_t count)
{
    kiln_dtype dt = x->dtype;
    bool uns = kiln_dtype_is_unsigned_int(dt);
    int bits = dt == KILN_DTYPE_BOOL ? 1 : (int)kiln_dtype_size(dt) * 8;
    /* identities of max and min: the type's lowest and highest values (signed ones held as
     * their two's complement bits, as the loads give them) */
    uint64_t lo = 0, hi = 1;
    if (uns) hi = bits == 64 ? UINT64_MAX : (UINT64_C(1) << bits) - 1;
    else if (dt != KILN_DTYPE_BOOL) lo = 0 - (UINT64_C(1) << (bits - 1)), hi = (UINT64_C(1) << (bits - 1)) - 1;
    uint64_t *acc = malloc((size_t)on * sizeof(uint64_t));
    if (!acc) return kiln_run_fail(c, KILN_ERR_NOMEM, "no memory for %lld results", (long long)on);
    uint64_t init = kind == KILN_REDUCE_PROD ? 1 : kind == KILN_REDUCE_MAX ? lo : kind == KILN_REDUCE_MIN ? hi : 0;
    for (int64_t o = 0; o < on; o++) acc[o] = init;
    kiln_iter it;
    kiln_iter_init(&it, x->rank, x->dims, 1, ostr);
    for (int64_t i = 0; i < x->numel; i++, kiln_iter_next(&it)) {
        uint64_t v = uns ? kiln_load_u64(dt, x->data, i) : (uint64_t)kiln_load_i64(dt, x->data, i);
        uint64_t *a = &acc[it.off[0]];
        bool less = uns ? v < *a : (int64_t)v < (int64_t)*a;
        bool greater = uns ? v > *a : (int64_t)v > (int64_t)*a;
        switch (kind) {
        case KILN_REDUCE_SUM: case KILN_REDUCE_MEAN: *a += v; break;
        case KILN_REDUCE_PROD: *a *= v; break;
        case KILN_REDUCE_MAX: if (greater) *a = v; break;
        case KILN_REDUCE_MIN: if (less) *a = v; break;
        case KILN_REDUCE_L1: *a += (!uns && (int64_t)v < 0) ? -v : v; break;
        default: *a += v * v; break; /* KILN_REDUCE_SUMSQ */
        }
    }
    for (int64_t o = 0; o < on; o++) {
        uint64_t v = acc[o];
        if (kind == KILN_REDUCE_MEAN && count > 0) v = uns ? v / (uint64_t)count : (uint64_t)((int64_t)v / count);
        if (uns) kiln_store_u64(dt, y->data, o, v);
        else kiln_store_i64(dt, y->data, o, (int64_t)v);
    }
    free(acc);
    return KILN_OK;
}

static kiln_status reduce_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    bool mask[KILN_MAX_RANK];
    char msg[160];
    if (!kiln_reduce_axes(n, kiln_run_opset(c), kiln_run_in(c, 1), x->rank, mask, msg, sizeof msg))
        return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    int64_t ostr[1][KILN_MAX_RANK], on, count = 1;
    kiln_reduce_out_strides(x->rank, x->dims, mask, ostr[0], &on);
    for (int k = 0; k < x->rank; k++)
        if (mask[k]) count *= x->dims[k];
    if (on == 0) return KILN_OK;
    kiln_reduce_op kind = kiln_reduce_op_of(n);
    if (x->dtype == KILN_DTYPE_STRING || x->dtype == KILN_DTYPE_COMPLEX64 || x->dtype == KILN_DTYPE_COMPLEX128)
        return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "element type %d not supported", (int)x->dtype);
    if (kiln_dtype_is_float(x->dtype) || kind == KILN_REDUCE_L2 || kind == KILN_REDUCE_LOGSUM ||
        kind == KILN_REDUCE_LOGSUMEXP)
        return reduce_run_f64(c, kind, x, y, ostr, on, count);
    return reduce_run_int(c, kind, x, y, ostr, on, count);
}

/* ---- Softmax, LogSoftmax, Hardmax ---- */

/* Splits x's dims into [outer, n, inner] around the op's axis: before opset 13 the input is
 * coerced to 2-D at `axis` (n spans the trailing dims), from 13 n is the one axis. */
static bool softmax_geometry(int opset, int64_t axis_attr, int rank, const int64_t *dims, int64_t *outer,
                             int64_t *n, int64_t *inner)
{
    int axis;
    if (!kiln_axis_norm(axis_attr, rank, &axis)) return false;
    *outer = *n = *inner = 1;
    for (int k = 0; k < rank; k++) {
        if (k < axis) *outer *= dims[k];
        else if (k == axis || opset < 13) *n *= dims[k];
        else *inner *= dims[k];
    }
    return true;
}

static int64_t softmax_axis(const kiln_node *n, int opset)
{
    return kiln_attr_int(n, "axis", opset < 13 ? 1 : -1);
}

static kiln_status softmax_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input 0 (input) is missing");
    int64_t axis = softmax_axis(kiln_infer_node(c), kiln_infer_opset(c));
    int k;
    if (x->rank >= 0 && !kiln_axis_norm(axis, x->rank, &k))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld out of range for input of rank %d", (long long)axis,
                               x->rank);
    return kiln_infer_same_as_input(c, 0, 0);
}

static kiln_status softmax_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int64_t outer, n, inner;
    if (!softmax_geometry(kiln_run_opset(c), softmax_axis(nd, kiln_run_opset(c)), x->rank, x->dims, &outer, &n,
                          &inner))
        return kiln_run_fail(c, KILN_ERR_MODEL, "axis out of range for input of rank %d", x->rank);
    char op = nd->op_type[0]; /* 'S'oftmax, 'L'ogSoftmax, 'H'ardmax */
    double *v;
    KILN_TRY(kiln_reduce_load_all(c, x, &v));
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * n * inner + i, arg = 0;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < n; j++) {
                if (v[base + j * inner] > mx) mx = v[base + j * inner], arg = j;
            }
            if (op == 'H') {
                if (n > 0) kiln_store_f64(y->dtype, y->data, base + arg * inner, 1.0);
                continue;
            }
            for (int64_t j = 0; j < n; j++) sum += exp(v[base + j * inner] - mx);
            for (int64_t j = 0; j < n; j++) {
                double d = v[base + j * inner] - mx;
                kiln_store_f64(y->dtype, y->data, base + j * inner, op == 'L' ? d - log(sum) : exp(d) / sum);
            }
        }
    }
    free(v);
    return KILN_OK;
}

/* ---- CumSum, CumProd ---- */

static bool cum_axis(const kiln_value *a, int rank, int *axis)
{
    if (!a || a->kind != KILN_VALUE_TENSOR || a->numel != 1 || a->rank > 1 || !kiln_dtype_is_int(a->dtype))
        return false;
    return kiln_axis_norm(kiln_load_i64(a->dtype, a->data, 0), rank, axis);
}

static kiln_status cum_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    const kiln_value *a = kiln_infer_in_value(c, 1);
    int axis;
    if (!x || !kiln_infer_in(c, 1)) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs x and axis");
    if (a && x->rank >= 0 && !cum_axis(a, x->rank, &axis))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis must be one integer in range for input of rank %d",
                               x->rank);
    return kiln_infer_same_as_input(c, 0, 0);
}

static kiln_status cum_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int axis;
    if (!cum_axis(kiln_run_in(c, 1), x->rank, &axis))
        return kiln_run_fail(c, KILN_ERR_MODEL, "axis must be one integer in range for input of rank %d", x->rank);
    bool prod = !strcmp(nd->op_type, "CumProd");
    bool excl = kiln_attr_int(nd, "exclusive", 0) != 0, rev = kiln_attr_int(nd, "reverse", 0) != 0;
    bool flt = kiln_dtype_is_float(x->dtype), uns = kiln_dtype_is_unsigned_int(x->dtype);
    if (!flt && !kiln_dtype_is_int(x->dtype))
        return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "element type %d not supported", (int)x->dtype);
    int64_t outer = 1, n = x->dims[axis], inner = 1;
    for (int k = 0; k < x->rank; k++) {
        if (k < axis) outer *= x->dims[k];
        else if (k > axis) inner *= x->dims[k];
    }
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            double fa = prod ? 1 : 0;
            uint64_t ia = prod ? 1 : 0; /* integers: exact, wrapping like the C types */
            for (int64_t s = 0; s < n; s++) {
                int64_t idx = o * n * inner + (rev ? n - 1 - s : s) * inner + i;
                if (flt) {
                    double v = kiln_load_f64(x->dtype, x->data, idx), before = fa;
                    fa = prod ? fa * v : fa + v;
                    kiln_store_f64(y->dtype, y->data, idx, excl ? before : fa);
                } else {
                    uint64_t v = uns ? kiln_load_u64(x->dtype, x->data, idx)
                                     : (uint64_t)kiln_load_i64(x->dtype, x->data, idx), before = ia;
                    ia = prod ? ia * v : ia + v;
                    if (uns) kiln_store_u64(y->dtype, y->data, idx, excl ? before : ia);
                    else kiln_store_i64(y->dtype, y->data, idx, (int64_t)(excl ? before : ia));
                }
            }
        }
    }
    return KILN_OK;
}

/* ---- Dropout ---- */

/* MT19937 as numpy's legacy RandomState: the conformance data draws the training mask with
 * np.random.seed(seed); np.random.uniform(0, 1, shape) >= ratio. */
typedef struct mt19937 {
    uint32_t s[624];
    int i;
} mt19937;

static void mt_seed(mt19937 *m, uint32_t seed)
{
    m->s[0] = seed;
    for (int k = 1; k < 624; k++) m->s[k] = 1812433253u * (m->s[k - 1] ^ (m->s[k - 1] >> 30)) + (uint32_t)k;
    m->i = 624;
}

static uint32_t mt_next(mt19937 *m)
{
    if (m->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
            m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1) ? 0x9908b0dfu : 0);
        }
        m->i = 0;
    }
    uint32_t y = m->s[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

/* A double in [0, 1) from 53 random bits, as numpy's random_sample. */
static double mt_uniform(mt19937 *m)
{
    uint32_t a = mt_next(m) >> 5, b = mt_next(m) >> 6;
    return (a * 67108864.0 + b) / 9007199254740992.0;
}

static kiln_status dropout_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input 0 (data) is missing");
    /* T is a float type: the kernel copies and scales elements (a string's are pointers) */
    if (x->kind && kiln_dtype_valid(x->dtype) && !kiln_dtype_is_float(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input 0 (data) is %s, not a float type", kiln_dtype_name(x->dtype));
    KILN_TRY(kiln_infer_same_as_input(c, 0, 0));
    /* the mask is bool from opset 10, of the input's type before */
    kiln_dtype mdt = kiln_infer_opset(c) >= 10 ? KILN_DTYPE_BOOL : x->dtype;
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 1, mdt);
    return kiln_infer_set_out(c, 1, mdt, x->rank, x->dims);
}

static kiln_status dropout_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    int opset = kiln_run_opset(c);
    const kiln_value *x = kiln_run_in(c, 0), *r = kiln_run_in(c, 1), *t = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0), *mask = kiln_run_out(c, 1);
    /* before opset 12 the mode is the runtime's choice: kiln infers */
    double ratio = r && r->numel >= 1 ? kiln_load_f64(r->dtype, r->data, 0) : 0.5;
    bool training = opset >= 12 && t && t->numel >= 1 && kiln_load_i64(t->dtype, t->data, 0) != 0;
    if (training && !(ratio >= 0 && ratio < 1))
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "ratio %g is not in [0, 1)", ratio);
    if (!training || ratio == 0) {
        if (x->nbytes) memcpy(y->data, x->data, x->nbytes);
        if (mask)
            for (int64_t i = 0; i < mask->numel; i++) kiln_store_f64(mask->dtype, mask->data, i, 1.0);
        return KILN_OK;
    }
    mt19937 *m = malloc(sizeof *m);
    if (!m) return kiln_run_fail(c, KILN_ERR_NOMEM, "no memory for the random generator");
    mt_seed(m, (uint32_t)kiln_attr_int(nd, "seed", 0));
    double scale = 1.0 / (1.0 - ratio);
    for (int64_t i = 0; i < x->numel; i++) {
        bool keep = mt_uniform(m) >= ratio;
        kiln_store_f64(y->dtype, y->data, i, keep ? kiln_load_f64(x->dtype, x->data, i) * scale : 0.0);
        if (mask) kiln_store_f64(mask->dtype, mask->data, i, keep ? 1.0 : 0.0);
    }
    free(m);
    return KILN_OK;
}

/* ---- Det ---- */

static kiln_status det_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input 0 (X) is missing");
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    if (x->rank < 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must have rank >= 2, has rank %d", x->rank);
    KILN_TRY(kiln_infer_require_equal(c, x->dims[x->rank - 2], x->dims[x->rank - 1], "X's last two dims"));
    return kiln_infer_set_out(c, 0, x->dtype, x->rank - 2, x->dims);
}

/* Determinant of the m x m matrix a (destroyed) by LU with partial pivoting. */
static double det_lu(double *a, int64_t m)
{
    double det = 1;
    for (int64_t k = 0; k < m; k++) {
        int64_t p = k;
        for (int64_t i = k + 1; i < m; i++)
            if (fabs(a[i * m + k]) > fabs(a[p * m + k])) p = i;
        if (a[p * m + k] == 0) return 0;
        if (p != k) {
            for (int64_t j = 0; j < m; j++) {
                double t = a[k * m + j];
                a[k * m + j] = a[p * m + j];
                a[p * m + j] = t;
            }
            det = -det;
        }
        det *= a[k * m + k];
        for (int64_t i = k + 1; i < m; i++) {
            double f = a[i * m + k] / a[k * m + k];
            for (int64_t j = k; j < m; j++) a[i * m + j] -= f * a[k * m + j];
        }
    }
    return det;
}

static kiln_status det_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int64_t m = x->dims[x->rank - 1], mm = m * m;
    double *a;
    KILN_TRY(kiln_reduce_load_all(c, x, &a));
    for (int64_t b = 0; b < y->numel; b++) kiln_store_f64(y->dtype, y->data, b, det_lu(a + b * mm, m));
    free(a);
    return KILN_OK;
}

static const kiln_op_def defs[] = {
    {"", "ReduceSum", 1, reduce_infer, reduce_run, 0, KILN_OP_IN(1)},
    {"", "ReduceMean", 1, reduce_infer, reduce_run, 0, KILN_OP_IN(1)},
    {"", "ReduceMax", 1, reduce_infer, reduce_run, 0, KILN_OP_IN(1)},
    {"", "ReduceMin", 1, reduce_infer, reduce_run, 0, KILN_OP_IN(1)},
    {"", "ReduceProd", 1, reduce_infer, reduce_run, 0, KILN_OP_IN(1)},
    {"", "ReduceL1", 1, reduce_infer, reduce_run, 0, KILN_OP_IN(1)},
    {"", "ReduceL2", 1, reduce_infer, reduce_run, 0, KILN_OP_IN(1)},
    {"", "ReduceLogSum", 1, reduce_infer, reduce_run, 0, KILN_OP_IN(1)},
    {"", "ReduceLogSumExp", 1, reduce_infer, reduce_run, 0, KILN_OP_IN(1)},
    {"", "ReduceSumSquare", 1, reduce_infer, reduce_run, 0, KILN_OP_IN(1)},
    {"", "Softmax", 1, softmax_infer, softmax_run},
    {"", "LogSoftmax", 1, softmax_infer, softmax_run},
    {"", "Hardmax", 1, softmax_infer, softmax_run},
    {"", "CumSum", 11, cum_infer, cum_run, 0, KILN_OP_IN(1)},
    {"", "CumProd", 26, cum_infer, cum_run},
    {"", "Dropout", 1, dropout_infer, dropout_run, KILN_OP_RANDOM},
    {"", "Det", 11, det_infer, det_run},
    {"", "LayerNormalization", 17, kiln_layernorm_infer, kiln_layernorm_run},
    {"", "RMSNormalization", 23, kiln_rmsnorm_infer, kiln_rmsnorm_run},
    {"", "GroupNormalization", 18, kiln_groupnorm_infer, kiln_groupnorm_run},
    {"", "InstanceNormalization", 1, kiln_instancenorm_infer, kiln_instancenorm_run},
    {"", "BatchNormalization", 1, kiln_batchnorm_infer, kiln_batchnorm_run},
    {"", "LpNormalization", 1, kiln_lpnorm_infer, kiln_lpnorm_run},
    {"", "MeanVarianceNormalization", 1, kiln_mvn_infer, kiln_mvn_run},
    {"", "LRN", 1, kiln_lrn_infer, kiln_lrn_run},
    {"", "NegativeLogLikelihoodLoss", 12, kiln_nllloss_infer, kiln_nllloss_run},
    {"", "SoftmaxCrossEntropyLoss", 12, kiln_sce_infer, kiln_sce_run},
};

const kiln_op_table kiln_ops_reduce = {defs, sizeof defs / sizeof defs[0]};
