/* kernels_ew_more.c - CPU kernels of the standard element-wise ops the ORT-forms families spend
 * their time in without one (a TTS model's length regulator: Cast bool -> int64, GreaterOrEqual
 * over [F, 1] x [1, T], ReduceSum of int64 over an axis; GPT-2's causal Where and x^3 Pow;
 * LeakyRelu): typed loops over numpy broadcasting instead of the reference's per-element type
 * dispatch, the same operations (Pow in double as the reference; x^2 and x^3 by products). Other
 * dtypes take the reference kernel. */
#include <math.h>
#include <string.h>

#include "cpu/kernels.h"
#include "ops/semantics.h"
#include "ops/util.h"

/* element strides of x broadcast to y's dims */
static void bstrides(const kiln_value *y, const kiln_value *x, int64_t *s)
{
    kiln_bcast_strides(y->rank, y->dims, x->rank, x->dims, s);
}

static bool ir_dt(const kiln_ir_value *v, kiln_dtype dt) { return v && v->type.dtype == dt; }

/* ---- Cast among bool, int32, int64, float32 (float -> integer excluded) ---- */

static double load(kiln_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case KILN_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    case KILN_DTYPE_INT32: return ((const int32_t *)p)[i];
    case KILN_DTYPE_INT64: return (double)((const int64_t *)p)[i];
    default: return ((const float *)p)[i];
    }
}

static bool castable(kiln_dtype from, kiln_dtype to)
{
    bool fi = from == KILN_DTYPE_BOOL || from == KILN_DTYPE_INT32 || from == KILN_DTYPE_INT64;
    bool ti = to == KILN_DTYPE_BOOL || to == KILN_DTYPE_INT32 || to == KILN_DTYPE_INT64;
    return (fi || from == KILN_DTYPE_FLOAT32) && (ti || to == KILN_DTYPE_FLOAT32) && !(from == KILN_DTYPE_FLOAT32 && ti && to != KILN_DTYPE_BOOL);
}

KILN_VECTORIZE static kiln_status cast_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!castable(X->dtype, Y->dtype) || X->numel != Y->numel) return kiln_cpu_reference(c);
    int64_t n = X->numel;
    const void *x = X->data;
    if (X->dtype == KILN_DTYPE_INT64 && Y->dtype != KILN_DTYPE_FLOAT32) { /* exact integer paths */
        const int64_t *s = x;
        for (int64_t i = 0; i < n; i++)
            if (Y->dtype == KILN_DTYPE_BOOL) ((uint8_t *)Y->data)[i] = s[i] != 0;
            else if (Y->dtype == KILN_DTYPE_INT32) ((int32_t *)Y->data)[i] = (int32_t)(uint32_t)(uint64_t)s[i];
            else ((int64_t *)Y->data)[i] = s[i];
        return KILN_OK;
    }
    switch (Y->dtype) {
    case KILN_DTYPE_BOOL:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)Y->data)[i] = load(X->dtype, x, i) != 0;
        break;
    case KILN_DTYPE_INT32:
        for (int64_t i = 0; i < n; i++) ((int32_t *)Y->data)[i] = (int32_t)load(X->dtype, x, i);
        break;
    case KILN_DTYPE_INT64:
        if (X->dtype == KILN_DTYPE_BOOL)
            for (int64_t i = 0; i < n; i++) ((int64_t *)Y->data)[i] = ((const uint8_t *)x)[i] != 0;
        else
            for (int64_t i = 0; i < n; i++) ((int64_t *)Y->data)[i] = (int64_t)((const int32_t *)x)[i];
        break;
    default:
        if (X->dtype == KILN_DTYPE_INT64)
            for (int64_t i = 0; i < n; i++) ((float *)Y->data)[i] = (float)(double)((const int64_t *)x)[i]; /* via double, as the reference */
        else
            for (int64_t i = 0; i < n; i++) ((float *)Y->data)[i] = (float)load(X->dtype, x, i);
        break;
    }
    return KILN_OK;
}

static kiln_kernel_fn select_cast(kiln_node *n)
{
    return n->n_in == 1 && n->in[0] && n->out[0] && castable(n->in[0]->type.dtype, n->out[0]->type.dtype) ? cast_run : NULL;
}

/* ---- comparisons of int64, int32 or float32 into bool ---- */

typedef enum { CMP_GT, CMP_GE, CMP_LT, CMP_LE, CMP_EQ } cmp_op;

static cmp_op cmp_of(const char *op)
{
    return !strcmp(op, "Greater") ? CMP_GT : !strcmp(op, "GreaterOrEqual") ? CMP_GE : !strcmp(op, "Less") ? CMP_LT
           : !strcmp(op, "LessOrEqual")                                     ? CMP_LE
                                                                            : CMP_EQ;
}

/* the last dim as an inner loop (strides sa, sb of A and B along it), the others by the iterator */
#define CMP_LOOP(T)                                                                                            \
    do {                                                                                                       \
        const T *a = A->data, *b = B->data;                                                                    \
        for (int64_t o = 0; o < outer; o++, kiln_iter_next(&it)) {                                             \
            const T *pa = a + it.off[1], *pb = b + it.off[2];                                                  \
            uint8_t *py = y + it.off[0];                                                                       \
            switch (op) {                                                                                      \
            case CMP_GT: for (int64_t i = 0; i < inner; i++) py[i] = pa[i * sa] > pb[i * sb]; break;           \
            case CMP_GE: for (int64_t i = 0; i < inner; i++) py[i] = pa[i * sa] >= pb[i * sb]; break;          \
            case CMP_LT: for (int64_t i = 0; i < inner; i++) py[i] = pa[i * sa] < pb[i * sb]; break;           \
            case CMP_LE: for (int64_t i = 0; i < inner; i++) py[i] = pa[i * sa] <= pb[i * sb]; break;          \
            default: for (int64_t i = 0; i < inner; i++) py[i] = pa[i * sa] == pb[i * sb]; break;              \
            }                                                                                                  \
        }                                                                                                      \
    } while (0)

KILN_VECTORIZE static kiln_status cmp_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (A->dtype != B->dtype || Y->dtype != KILN_DTYPE_BOOL) return kiln_cpu_reference(c);
    if (!Y->numel) return KILN_OK;
    cmp_op op = cmp_of(n->op_type);
    int64_t st[3][KILN_MAX_RANK];
    kiln_strides(Y->rank, Y->dims, st[0]);
    bstrides(Y, A, st[1]);
    bstrides(Y, B, st[2]);
    int r = Y->rank;
    int64_t inner = r ? Y->dims[r - 1] : 1, outer = Y->numel / inner, sa = r ? st[1][r - 1] : 0, sb = r ? st[2][r - 1] : 0;
    kiln_iter it;
    kiln_iter_init(&it, r ? r - 1 : 0, Y->dims, 3, st);
    uint8_t *y = Y->data;
    if (A->dtype == KILN_DTYPE_INT64) CMP_LOOP(int64_t);
    else if (A->dtype == KILN_DTYPE_INT32) CMP_LOOP(int32_t);
    else if (A->dtype == KILN_DTYPE_FLOAT32) CMP_LOOP(float);
    else return kiln_cpu_reference(c);
    return KILN_OK;
}

static bool cmp_type(const kiln_ir_value *v)
{
    return ir_dt(v, KILN_DTYPE_INT64) || ir_dt(v, KILN_DTYPE_INT32) || ir_dt(v, KILN_DTYPE_FLOAT32);
}

static kiln_kernel_fn select_cmp(kiln_node *n)
{
    return n->n_in == 2 && cmp_type(n->in[0]) && n->in[1] && n->in[1]->type.dtype == n->in[0]->type.dtype && n->opset >= 7
               ? cmp_run
               : NULL;
}

/* ---- Where(bool, X, Y) of 4- or 8-byte elements ---- */

static kiln_status where_run(kiln_run_ctx *c)
{
    const kiln_value *C = kiln_run_in(c, 0), *X = kiln_run_in(c, 1), *Yv = kiln_run_in(c, 2);
    kiln_value *O = kiln_run_out(c, 0);
    size_t es = kiln_dtype_size(X->dtype);
    if (C->dtype != KILN_DTYPE_BOOL || X->dtype != Yv->dtype || O->dtype != X->dtype || (es != 4 && es != 8))
        return kiln_cpu_reference(c);
    if (!O->numel) return KILN_OK;
    int64_t st[4][KILN_MAX_RANK];
    kiln_strides(O->rank, O->dims, st[0]);
    bstrides(O, C, st[1]);
    bstrides(O, X, st[2]);
    bstrides(O, Yv, st[3]);
    /* the last dim as an inner loop, the others by the iterator */
    int r = O->rank;
    int64_t inner = r ? O->dims[r - 1] : 1, outer = O->numel / inner;
    int64_t sc = r ? st[1][r - 1] : 0, sx = r ? st[2][r - 1] : 0, sy = r ? st[3][r - 1] : 0;
    kiln_iter it;
    kiln_iter_init(&it, r ? r - 1 : 0, O->dims, 4, st);
    const uint8_t *cd = C->data;
    for (int64_t o = 0; o < outer; o++, kiln_iter_next(&it)) {
        const uint8_t *pc = cd + it.off[1];
        if (es == 4) {
            const uint32_t *px = (const uint32_t *)X->data + it.off[2], *py = (const uint32_t *)Yv->data + it.off[3];
            uint32_t *po = (uint32_t *)O->data + it.off[0];
            for (int64_t i = 0; i < inner; i++) po[i] = pc[i * sc] ? px[i * sx] : py[i * sy];
        } else {
            const uint64_t *px = (const uint64_t *)X->data + it.off[2], *py = (const uint64_t *)Yv->data + it.off[3];
            uint64_t *po = (uint64_t *)O->data + it.off[0];
            for (int64_t i = 0; i < inner; i++) po[i] = pc[i * sc] ? px[i * sx] : py[i * sy];
        }
    }
    return KILN_OK;
}

static kiln_kernel_fn select_where(kiln_node *n)
{
    return n->n_in == 3 && ir_dt(n->in[0], KILN_DTYPE_BOOL) && n->in[1] && n->in[2] ? where_run : NULL;
}

/* ---- LeakyRelu, Pow of float32 ---- */

static kiln_status leaky_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    float alpha = kiln_attr_float(kiln_run_node(c), "alpha", 0.01f);
    const float *x = X->data;
    float *y = Y->data;
    for (int64_t i = 0; i < X->numel; i++) y[i] = x[i] < 0 ? alpha * x[i] : x[i];
    return KILN_OK;
}

static kiln_kernel_fn select_leaky(kiln_node *n)
{
    return n->n_in == 1 && ir_dt(n->in[0], KILN_DTYPE_FLOAT32) && n->opset >= 6 ? leaky_run : NULL;
}

static kiln_status pow_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (A->dtype != KILN_DTYPE_FLOAT32 || B->dtype != KILN_DTYPE_FLOAT32 || Y->numel != A->numel || B->numel != 1)
        return kiln_cpu_reference(c);
    const float *a = A->data;
    float *y = Y->data;
    double e = ((const float *)B->data)[0];
    if (e == 2.0) /* x * x in double is exact: pow's value */
        for (int64_t i = 0; i < A->numel; i++) y[i] = (float)((double)a[i] * a[i]);
    else if (e == 3.0) /* x^3 rounded once to double (pow's own error is no smaller), then to float */
        for (int64_t i = 0; i < A->numel; i++) y[i] = (float)((double)a[i] * a[i] * a[i]);
    else
        for (int64_t i = 0; i < A->numel; i++) y[i] = (float)pow((double)a[i], e);
    return KILN_OK;
}

static kiln_kernel_fn select_pow(kiln_node *n)
{
    return n->n_in == 2 && ir_dt(n->in[0], KILN_DTYPE_FLOAT32) && ir_dt(n->in[1], KILN_DTYPE_FLOAT32) ? pow_run : NULL;
}

/* ---- ReduceSum of int64 / int32 over one axis (opset 13: axes input) ---- */

/* y[o * inner + i] = sum over l of x[(o * len + l) * inner + i], wrapping; a last axis (inner 1)
 * summed along its contiguous rows */
#define RSUM_LOOP(T)                                                                                                   \
    do {                                                                                                               \
        const T *restrict x = X->data;                                                                                 \
        T *restrict y = Y->data;                                                                                       \
        if (inner == 1) {                                                                                              \
            for (int64_t o = 0; o < outer; o++) {                                                                      \
                T s = 0;                                                                                               \
                for (int64_t l = 0; l < len; l++) s += x[o * len + l];                                                 \
                y[o] = s;                                                                                              \
            }                                                                                                          \
            break;                                                                                                     \
        }                                                                                                              \
        memset(y, 0, (size_t)Y->numel * sizeof *y);                                                                    \
        for (int64_t o = 0; o < outer; o++)                                                                            \
            for (int64_t l = 0; l < len; l++)                                                                          \
                for (int64_t i = 0; i < inner; i++) y[o * inner + i] += x[(o * len + l) * inner + i];                  \
    } while (0)

KILN_VECTORIZE static kiln_status rsum_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *ax = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    int axis;
    if (!ax || ax->numel != 1 || (ax->dtype != KILN_DTYPE_INT64) || X->dtype != Y->dtype || X->rank < 1 ||
        !kiln_axis_norm(((const int64_t *)ax->data)[0], X->rank, &axis) || kiln_attr_int(n, "noop_with_empty_axes", 0))
        return kiln_cpu_reference(c);
    int64_t outer = 1, len = X->dims[axis], inner = 1;
    for (int k = 0; k < axis; k++) outer *= X->dims[k];
    for (int k = axis + 1; k < X->rank; k++) inner *= X->dims[k];
    if (Y->numel != outer * inner) return kiln_cpu_reference(c);
    if (X->dtype == KILN_DTYPE_INT64) RSUM_LOOP(uint64_t); /* wrapping sums, as the reference's integer accumulation */
    else RSUM_LOOP(uint32_t);
    return KILN_OK;
}

static kiln_kernel_fn select_rsum(kiln_node *n)
{
    return n->opset >= 13 && n->n_in == 2 && (ir_dt(n->in[0], KILN_DTYPE_INT64) || ir_dt(n->in[0], KILN_DTYPE_INT32)) ? rsum_run
                                                                                                                        : NULL;
}

static const kiln_cpu_kernel kernels[] = {
    {"", "Cast", select_cast},
    {"", "Greater", select_cmp},
    {"", "GreaterOrEqual", select_cmp},
    {"", "Less", select_cmp},
    {"", "LessOrEqual", select_cmp},
    {"", "Equal", select_cmp},
    {"", "Where", select_where},
    {"", "LeakyRelu", select_leaky},
    {"", "Pow", select_pow},
    {"", "ReduceSum", select_rsum},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_ew_more, kernels);
