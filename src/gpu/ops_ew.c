/* ops_ew.c - GPU provider family 'ew': element-wise unary math and activations, broadcasting
 * arithmetic, comparisons and logic, variadic Sum/Mean/Max/Min, Where, Clip, Cast/CastLike and
 * Identity. Kernels in k_ew.cu; semantics are the reference's (src/ops/elementwise.c,
 * cast.c, basic.c). */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "gpu/gpu.h"
#include "gpu/support.h"
#include "gpu/k_ew.h"
#include "ops/semantics.h"

/* Most operands of one element-wise kernel (Where's condition, X and Y). */
#define EW_MAX_OPS 3

static bool is_float(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16;
}

static bool is_int(kiln_dtype dt) { return dt == KILN_DTYPE_INT32 || dt == KILN_DTYPE_INT64; }

/* Compile-time dtype of input i; UNDEFINED when absent or unknown (checked again at run time). */
static kiln_dtype in_dtype(const kiln_node *n, int i)
{
    return i < n->n_in && n->in[i] ? n->in[i]->type.dtype : KILN_DTYPE_UNDEFINED;
}

/* ======================================================================================
 * Iteration space
 * ====================================================================================== */

/* The iteration space of Y (contiguous) and the element strides of n operands broadcast to it
 * (numpy rules; operand i first gets pads[i] trailing 1-dims: legacy broadcast), with dims of
 * size 1 dropped and neighbouring dims merged wherever every operand allows, into out[0..n).
 * False when more than KILN_GPU_MAX_RANK dims remain or an operand does not fit. */
static bool ew_layout(const kiln_value *Y, int n, const kiln_value *const *xs, const int *pads, kiln_gpu_shape *out)
{
    int R = Y->rank;
    int64_t st[EW_MAX_OPS][KILN_MAX_RANK];
    for (int i = 0; i < n; i++) {
        int r = xs[i]->rank, pad = pads ? pads[i] : 0;
        if (r + pad > R) return false;
        int64_t dims[KILN_MAX_RANK];
        r = kiln_legacy_bcast_dims(r, xs[i]->dims, pad, dims);
        if (!kiln_bcasts_to(r, dims, R, Y->dims)) return false;
        /* the strides along Y's 1-dims are never read: those dims are dropped below */
        kiln_bcast_strides(R, Y->dims, r, dims, st[i]);
    }
    /* merged dims, innermost first */
    int64_t md[KILN_MAX_RANK], ms[EW_MAX_OPS][KILN_MAX_RANK];
    int m = 0;
    for (int k = R - 1; k >= 0; k--) {
        int64_t d = Y->dims[k];
        if (d == 1) continue;
        bool merge = m > 0;
        for (int i = 0; i < n && merge; i++) merge = st[i][k] == ms[i][m - 1] * md[m - 1];
        if (merge) {
            md[m - 1] *= d;
            continue;
        }
        md[m] = d;
        for (int i = 0; i < n; i++) ms[i][m] = st[i][k];
        m++;
    }
    if (m > KILN_GPU_MAX_RANK) return false;
    if (m == 0) { /* a single element */
        md[0] = 1;
        for (int i = 0; i < n; i++) ms[i][0] = 0;
        m = 1;
    }
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].rank = m;
        for (int k = 0; k < m; k++) {
            out[i].dims[k] = md[m - 1 - k];
            out[i].strides[k] = ms[i][m - 1 - k];
        }
    }
    return true;
}

/* ======================================================================================
 * Unary ops
 * ====================================================================================== */

typedef struct ew_unary_def {
    const char *op_type;
    kiln_gpu_ew_unary op;
    bool ints;                /* int32 and int64 too */
    float alpha, beta, gamma; /* attribute defaults, the reference's */
} ew_unary_def;

static const ew_unary_def unary_defs[] = {
    {"Abs", KILN_EW_ABS, true, 0, 0, 0},
    {"Neg", KILN_EW_NEG, true, 0, 0, 0},
    {"Sign", KILN_EW_SIGN, true, 0, 0, 0},
    {"Relu", KILN_EW_RELU, true, 0, 0, 0},
    {"Reciprocal", KILN_EW_RECIPROCAL, false, 0, 0, 0},
    {"Floor", KILN_EW_FLOOR, false, 0, 0, 0},
    {"Ceil", KILN_EW_CEIL, false, 0, 0, 0},
    {"Round", KILN_EW_ROUND, false, 0, 0, 0},
    {"Sqrt", KILN_EW_SQRT, false, 0, 0, 0},
    {"Exp", KILN_EW_EXP, false, 0, 0, 0},
    {"Log", KILN_EW_LOG, false, 0, 0, 0},
    {"Sin", KILN_EW_SIN, false, 0, 0, 0},
    {"Cos", KILN_EW_COS, false, 0, 0, 0},
    {"Tan", KILN_EW_TAN, false, 0, 0, 0},
    {"Asin", KILN_EW_ASIN, false, 0, 0, 0},
    {"Acos", KILN_EW_ACOS, false, 0, 0, 0},
    {"Atan", KILN_EW_ATAN, false, 0, 0, 0},
    {"Sinh", KILN_EW_SINH, false, 0, 0, 0},
    {"Cosh", KILN_EW_COSH, false, 0, 0, 0},
    {"Asinh", KILN_EW_ASINH, false, 0, 0, 0},
    {"Acosh", KILN_EW_ACOSH, false, 0, 0, 0},
    {"Atanh", KILN_EW_ATANH, false, 0, 0, 0},
    {"Erf", KILN_EW_ERF, false, 0, 0, 0},
    {"Sigmoid", KILN_EW_SIGMOID, false, 0, 0, 0},
    {"Tanh", KILN_EW_TANH, false, 0, 0, 0},
    {"LeakyRelu", KILN_EW_LEAKY_RELU, false, 0.01f, 0, 0},
    {"Elu", KILN_EW_ELU, false, 1, 0, 0},
    {"Selu", KILN_EW_SELU, false, 1.67326319217681884765625f, 0, 1.05070102214813232421875f},
    {"Celu", KILN_EW_CELU, false, 1, 0, 0},
    {"HardSigmoid", KILN_EW_HARD_SIGMOID, false, 0.2f, 0.5f, 0},
    {"HardSwish", KILN_EW_HARD_SWISH, false, 0, 0, 0},
    {"Softplus", KILN_EW_SOFTPLUS, false, 0, 0, 0},
    {"Softsign", KILN_EW_SOFTSIGN, false, 0, 0, 0},
    {"ThresholdedRelu", KILN_EW_THRESHOLDED_RELU, false, 1, 0, 0},
    {"Shrink", KILN_EW_SHRINK, false, 0.5f, 0, 0}, /* alpha = lambd, beta = bias */
    {"Gelu", KILN_EW_GELU, false, 0, 0, 0},
    {"Mish", KILN_EW_MISH, false, 0, 0, 0},
    {"Swish", KILN_EW_SWISH, false, 1, 0, 0},
};

static const ew_unary_def *unary_find(const char *op_type)
{
    for (size_t k = 0; k < sizeof unary_defs / sizeof unary_defs[0]; k++)
        if (!strcmp(unary_defs[k].op_type, op_type)) return &unary_defs[k];
    return NULL;
}

static bool unary_dtype_ok(const ew_unary_def *d, kiln_dtype dt) { return is_float(dt) || (d->ints && is_int(dt)); }

static bool unary_supports(const kiln_node *n, char *why, size_t size)
{
    const ew_unary_def *d = unary_find(n->op_type);
    kiln_dtype dt = in_dtype(n, 0);
    if (!d) return kiln_gpu_refuse(why, size, "no GPU kernel");
    if (dt && !unary_dtype_ok(d, dt)) return kiln_gpu_refuse(why, size, "dtype %s", kiln_dtype_name(dt));
    if (d->op == KILN_EW_GELU) {
        const char *approx = kiln_attr_string(n, "approximate", "none");
        if (strcmp(approx, "none") && strcmp(approx, "tanh")) return kiln_gpu_refuse(why, size, "approximate '%s'", approx);
    }
    return true;
}

static kiln_gpu_ew_params unary_params(const kiln_node *n, const ew_unary_def *d)
{
    kiln_gpu_ew_params p = {0};
    if (d->op == KILN_EW_SHRINK) {
        p.alpha = kiln_attr_float(n, "lambd", 0.5f);
        p.beta = kiln_attr_float(n, "bias", 0);
        return p;
    }
    p.alpha = kiln_attr_float(n, "alpha", d->alpha);
    p.beta = kiln_attr_float(n, "beta", d->beta);
    p.gamma = kiln_attr_float(n, "gamma", d->gamma);
    if (d->op == KILN_EW_GELU && !strcmp(kiln_attr_string(n, "approximate", "none"), "tanh")) p.flags = 1;
    return p;
}

static kiln_status unary_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const ew_unary_def *d = unary_find(n->op_type);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!d || !Y || !unary_dtype_ok(d, X->dtype) || Y->numel != X->numel) return kiln_gpu_fallback(c);
    gpuError_t e =
        kiln_gpu_ew_unary_launch(d->op, X->dtype, X->data, Y->data, Y->numel, unary_params(n, d), kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, n->op_type);
}

/* IsNaN, IsInf: floating -> bool; Not: bool -> bool. */
static bool isnan_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_dtype dt = in_dtype(n, 0);
    if (dt && !is_float(dt)) return kiln_gpu_refuse(why, size, "dtype %s", kiln_dtype_name(dt));
    return true;
}

static kiln_status isnan_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || !is_float(X->dtype) || Y->dtype != KILN_DTYPE_BOOL || Y->numel != X->numel) return kiln_gpu_fallback(c);
    kiln_gpu_ew_params p = {0};
    kiln_gpu_ew_unary op = KILN_EW_ISNAN;
    if (!strcmp(n->op_type, "IsInf")) {
        op = KILN_EW_ISINF;
        p.flags = (kiln_attr_int(n, "detect_positive", 1) != 0 ? 1 : 0) |
                  (kiln_attr_int(n, "detect_negative", 1) != 0 ? 2 : 0);
    }
    gpuError_t e = kiln_gpu_ew_unary_launch(op, X->dtype, X->data, Y->data, Y->numel, p, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, n->op_type);
}

static bool not_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_dtype dt = in_dtype(n, 0);
    if (dt && dt != KILN_DTYPE_BOOL) return kiln_gpu_refuse(why, size, "dtype %s", kiln_dtype_name(dt));
    return true;
}

static kiln_status not_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->dtype != KILN_DTYPE_BOOL || Y->numel != X->numel) return kiln_gpu_fallback(c);
    kiln_gpu_ew_params p = {0};
    gpuError_t e = kiln_gpu_ew_unary_launch(KILN_EW_NOT, X->dtype, X->data, Y->data, Y->numel, p, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "Not");
}

/* Clip: bounds are attributes before opset 11, optional scalar inputs (read on the host)
 * after. */
static bool clip_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_dtype dt = in_dtype(n, 0);
    if (dt && !is_float(dt) && !(is_int(dt) && n->opset >= 11)) return kiln_gpu_refuse(why, size, "dtype %s", kiln_dtype_name(dt));
    return true;
}

static kiln_status clip_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    const kiln_value *lo = kiln_run_in(c, 1), *hi = kiln_run_in(c, 2);
    if (!Y || Y->numel != X->numel || !(is_float(X->dtype) || (is_int(X->dtype) && kiln_run_opset(c) >= 11)))
        return kiln_gpu_fallback(c);
    if (lo && lo->numel == 0) lo = NULL;
    if (hi && hi->numel == 0) hi = NULL;
    kiln_gpu_ew_params p = {0};
    p.lo = -INFINITY;
    p.hi = INFINITY;
    if (kiln_run_opset(c) < 11) { /* the schema's defaults: float's lowest and max */
        p.lo = kiln_attr_float(n, "min", -FLT_MAX);
        p.hi = kiln_attr_float(n, "max", FLT_MAX);
    }
    p.ilo = INT64_MIN;
    p.ihi = INT64_MAX;
    if (lo) {
        p.lo = (float)kiln_load_f64(lo->dtype, lo->data, 0);
        p.ilo = kiln_load_i64(lo->dtype, lo->data, 0);
    }
    if (hi) {
        p.hi = (float)kiln_load_f64(hi->dtype, hi->data, 0);
        p.ihi = kiln_load_i64(hi->dtype, hi->data, 0);
    }
    gpuError_t e = kiln_gpu_ew_unary_launch(KILN_EW_CLIP, X->dtype, X->data, Y->data, Y->numel, p, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "Clip");
}

/* ======================================================================================
 * Binary ops
 * ====================================================================================== */

typedef struct ew_binary_def {
    const char *op_type;
    kiln_gpu_ew_binary op;
} ew_binary_def;

static const ew_binary_def binary_defs[] = {
    {"Add", KILN_EW_ADD},     {"Sub", KILN_EW_SUB},          {"Mul", KILN_EW_MUL},     {"Div", KILN_EW_DIV},
    {"Mod", KILN_EW_MOD},     {"Pow", KILN_EW_POW},          {"PRelu", KILN_EW_PRELU}, {"Equal", KILN_EW_EQ},
    {"Less", KILN_EW_LT},     {"LessOrEqual", KILN_EW_LE},   {"Greater", KILN_EW_GT},  {"GreaterOrEqual", KILN_EW_GE},
    {"And", KILN_EW_AND},     {"Or", KILN_EW_OR},            {"Xor", KILN_EW_XOR},
};

static const ew_binary_def *binary_find(const char *op_type)
{
    for (size_t k = 0; k < sizeof binary_defs / sizeof binary_defs[0]; k++)
        if (!strcmp(binary_defs[k].op_type, op_type)) return &binary_defs[k];
    return NULL;
}

/* The dtypes the binary kernels take (k_ew.h); UNDEFINED passes (checked at run time). */
static bool binary_dtypes_ok(kiln_gpu_ew_binary op, kiln_dtype ta, kiln_dtype tb)
{
    if (op >= KILN_EW_AND) return (!ta || ta == KILN_DTYPE_BOOL) && (!tb || tb == KILN_DTYPE_BOOL);
    if (op == KILN_EW_POW && ta && tb && ta != tb) return is_float(ta) && (is_float(tb) || is_int(tb));
    if (ta && tb && ta != tb) return false;
    kiln_dtype t = ta ? ta : tb;
    if (!t || is_float(t) || is_int(t)) return true;
    return op >= KILN_EW_EQ && t == KILN_DTYPE_BOOL;
}

/* Mod's fmod attribute picks FMOD. */
static kiln_gpu_ew_binary binary_code(const kiln_node *n, const ew_binary_def *d)
{
    if (d->op == KILN_EW_MOD && kiln_attr_int(n, "fmod", 0)) return KILN_EW_FMOD;
    return d->op;
}

static bool binary_supports(const kiln_node *n, char *why, size_t size)
{
    const ew_binary_def *d = binary_find(n->op_type);
    if (!d) return kiln_gpu_refuse(why, size, "no GPU kernel");
    int64_t fmod_attr = kiln_attr_int(n, "fmod", 0);
    if (d->op == KILN_EW_MOD && fmod_attr != 0 && fmod_attr != 1) return kiln_gpu_refuse(why, size, "fmod %lld", (long long)fmod_attr);
    kiln_dtype ta = in_dtype(n, 0), tb = in_dtype(n, 1);
    if (!binary_dtypes_ok(d->op, ta, tb))
        return kiln_gpu_refuse(why, size, "dtypes %s, %s", kiln_dtype_name(ta), kiln_dtype_name(tb));
    return true;
}

static kiln_status binary_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const ew_binary_def *d = binary_find(n->op_type);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!d || !Y || !A->dtype || !B->dtype || !binary_dtypes_ok(d->op, A->dtype, B->dtype))
        return kiln_gpu_fallback(c);
    if (!Y->numel) return KILN_OK;
    int pads[2] = {0, 0};
    kiln_gpu_shape s[2];
    const kiln_value *xs[2] = {A, B};
    if (!kiln_legacy_bcast_pad(n, kiln_run_opset(c), A->rank, B->rank, &pads[1]) || !ew_layout(Y, 2, xs, pads, s))
        return kiln_gpu_fallback(c);
    gpuError_t e = kiln_gpu_ew_binary_launch(binary_code(n, d), A->dtype, B->dtype, A->data, s[0], B->data, s[1],
                                             Y->data, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, n->op_type);
}

/* Sum, Mean, Max, Min: a left fold of the (broadcast) inputs into Y, Mean divided at the end. */
static bool variadic_supports(const kiln_node *n, char *why, size_t size)
{
    bool mean = !strcmp(n->op_type, "Mean");
    for (int i = 0; i < n->n_in; i++) {
        kiln_dtype dt = in_dtype(n, i);
        if (dt && !(is_float(dt) || (!mean && is_int(dt)))) return kiln_gpu_refuse(why, size, "dtype %s", kiln_dtype_name(dt));
    }
    return true;
}

static kiln_status variadic_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    bool mean = !strcmp(n->op_type, "Mean");
    kiln_gpu_ew_binary op = !strcmp(n->op_type, "Max") ? KILN_EW_MAX : !strcmp(n->op_type, "Min") ? KILN_EW_MIN
                                                                                                  : KILN_EW_ADD;
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y) return kiln_gpu_fallback(c);
    kiln_dtype dt = Y->dtype;
    if (!(is_float(dt) || (!mean && is_int(dt)))) return kiln_gpu_fallback(c);
    int first = -1, count = 0;
    for (int i = 0; i < kiln_run_n_in(c); i++) {
        const kiln_value *X = kiln_run_in(c, i);
        if (!X) continue;
        kiln_gpu_shape s[2];
        const kiln_value *xs[2] = {Y, X};
        /* every layout is checked before the first launch: a fallback starts from clean inputs */
        if (X->dtype != dt || !ew_layout(Y, 2, xs, NULL, s)) return kiln_gpu_fallback(c);
        if (first < 0) first = i;
        count++;
    }
    if (first < 0) return kiln_gpu_fallback(c);
    if (!Y->numel) return KILN_OK;
    const kiln_value *X0 = kiln_run_in(c, first);
    gpuStream_t st = kiln_gpu_stream(c);
    gpuError_t e = gpuSuccess;
    if (count == 1) { /* Y has X0's shape */
        if (Y->data != X0->data) e = gpuMemcpyAsync(Y->data, X0->data, Y->nbytes, gpuMemcpyDeviceToDevice, st);
        return kiln_gpu_check(c, e, "copy");
    }
    const kiln_value *acc = X0; /* Y = X0 (op) X, then Y = Y (op) X */
    for (int i = first + 1; i < kiln_run_n_in(c) && !e; i++) {
        const kiln_value *X = kiln_run_in(c, i);
        if (!X) continue;
        const kiln_value *xs[2] = {acc, X};
        kiln_gpu_shape s[2];
        ew_layout(Y, 2, xs, NULL, s);
        e = kiln_gpu_ew_binary_launch(op, dt, dt, acc->data, s[0], X->data, s[1], Y->data, st);
        acc = Y;
    }
    if (!e && mean) {
        kiln_gpu_ew_params p = {0};
        p.alpha = (float)count;
        e = kiln_gpu_ew_unary_launch(KILN_EW_DIV_CONST, dt, Y->data, Y->data, Y->numel, p, st);
    }
    return kiln_gpu_check(c, e, n->op_type);
}

/* ======================================================================================
 * Where
 * ====================================================================================== */

static bool where_elem_ok(kiln_dtype dt)
{
    size_t es = kiln_dtype_size(dt);
    return dt != KILN_DTYPE_STRING && (es == 1 || es == 2 || es == 4 || es == 8);
}

static bool where_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_dtype tc = in_dtype(n, 0), tx = in_dtype(n, 1);
    if (tc && tc != KILN_DTYPE_BOOL) return kiln_gpu_refuse(why, size, "condition dtype %s", kiln_dtype_name(tc));
    if (tx && !where_elem_ok(tx)) return kiln_gpu_refuse(why, size, "dtype %s", kiln_dtype_name(tx));
    return true;
}

static kiln_status where_run(kiln_run_ctx *c)
{
    const kiln_value *ins[3] = {kiln_run_in(c, 0), kiln_run_in(c, 1), kiln_run_in(c, 2)};
    kiln_value *Out = kiln_run_out(c, 0);
    if (!Out || ins[0]->dtype != KILN_DTYPE_BOOL || !where_elem_ok(Out->dtype) || ins[1]->dtype != Out->dtype ||
        ins[2]->dtype != Out->dtype)
        return kiln_gpu_fallback(c);
    if (!Out->numel) return KILN_OK;
    kiln_gpu_shape s[3];
    if (!ew_layout(Out, 3, ins, NULL, s)) return kiln_gpu_fallback(c);
    gpuError_t e = kiln_gpu_ew_where_launch(kiln_dtype_size(Out->dtype), ins[0]->data, s[0], ins[1]->data, s[1],
                                            ins[2]->data, s[2], Out->data, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "Where");
}

/* ======================================================================================
 * Cast, CastLike, Identity
 * ====================================================================================== */

static bool cast_dtype_ok(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT32: case KILN_DTYPE_FLOAT16: case KILN_DTYPE_BFLOAT16: case KILN_DTYPE_FLOAT64:
    case KILN_DTYPE_INT32: case KILN_DTYPE_INT64: case KILN_DTYPE_INT8: case KILN_DTYPE_UINT8: case KILN_DTYPE_BOOL:
        return true;
    default: return false;
    }
}

static bool cast_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_dtype from = in_dtype(n, 0), to = n->n_out > 0 && n->out[0] ? n->out[0]->type.dtype : KILN_DTYPE_UNDEFINED;
    if (from && !cast_dtype_ok(from)) return kiln_gpu_refuse(why, size, "from %s", kiln_dtype_name(from));
    if (to && !cast_dtype_ok(to)) return kiln_gpu_refuse(why, size, "to %s", kiln_dtype_name(to));
    return true;
}

static kiln_status cast_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->kind != KILN_VALUE_TENSOR || !cast_dtype_ok(X->dtype) || !cast_dtype_ok(Y->dtype) ||
        Y->numel != X->numel)
        return kiln_gpu_fallback(c);
    gpuStream_t st = kiln_gpu_stream(c);
    gpuError_t e = gpuSuccess;
    if (X->dtype == Y->dtype) {
        if (Y->data != X->data && X->nbytes) e = gpuMemcpyAsync(Y->data, X->data, X->nbytes, gpuMemcpyDeviceToDevice, st);
    } else {
        e = kiln_gpu_ew_cast_launch(X->dtype, Y->dtype, X->data, Y->data, X->numel, st);
    }
    return kiln_gpu_check(c, e, kiln_run_node(c)->op_type);
}

static bool identity_supports(const kiln_node *n, char *why, size_t size)
{
    const kiln_ir_value *x = n->n_in > 0 ? n->in[0] : NULL;
    if (!x || x->type.kind != KILN_VALUE_TENSOR) return kiln_gpu_refuse(why, size, "not a tensor");
    if (x->type.dtype == KILN_DTYPE_STRING) return kiln_gpu_refuse(why, size, "dtype string");
    return true;
}

static kiln_status identity_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->kind != KILN_VALUE_TENSOR || X->dtype == KILN_DTYPE_STRING || Y->nbytes != X->nbytes)
        return kiln_gpu_fallback(c);
    gpuError_t e = gpuSuccess;
    if (Y->data != X->data && X->nbytes)
        e = gpuMemcpyAsync(Y->data, X->data, X->nbytes, gpuMemcpyDeviceToDevice, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "Identity");
}

/* ======================================================================================
 * The table
 * ====================================================================================== */

#define UNARY(name) {"", name, unary_supports, unary_run}
#define BINARY(name) {"", name, binary_supports, binary_run}
#define VARIADIC(name) {"", name, variadic_supports, variadic_run}

static const kiln_gpu_op ops[] = {
    UNARY("Abs"), UNARY("Neg"), UNARY("Sign"), UNARY("Relu"), UNARY("Reciprocal"), UNARY("Floor"),
    UNARY("Ceil"), UNARY("Round"), UNARY("Sqrt"), UNARY("Exp"), UNARY("Log"), UNARY("Sin"), UNARY("Cos"),
    UNARY("Tan"), UNARY("Asin"), UNARY("Acos"), UNARY("Atan"), UNARY("Sinh"), UNARY("Cosh"), UNARY("Asinh"),
    UNARY("Acosh"), UNARY("Atanh"), UNARY("Erf"), UNARY("Sigmoid"), UNARY("Tanh"), UNARY("LeakyRelu"),
    UNARY("Elu"), UNARY("Selu"), UNARY("Celu"), UNARY("HardSigmoid"), UNARY("HardSwish"), UNARY("Softplus"),
    UNARY("Softsign"), UNARY("ThresholdedRelu"), UNARY("Shrink"), UNARY("Gelu"), UNARY("Mish"),
    UNARY("Swish"),
    {"", "IsNaN", isnan_supports, isnan_run},
    {"", "IsInf", isnan_supports, isnan_run},
    {"", "Not", not_supports, not_run},
    {"", "Clip", clip_supports, clip_run},
    BINARY("Add"), BINARY("Sub"), BINARY("Mul"), BINARY("Div"), BINARY("Mod"), BINARY("Pow"), BINARY("PRelu"),
    BINARY("Equal"), BINARY("Less"), BINARY("LessOrEqual"), BINARY("Greater"), BINARY("GreaterOrEqual"),
    BINARY("And"), BINARY("Or"), BINARY("Xor"),
    VARIADIC("Sum"), VARIADIC("Mean"), VARIADIC("Max"), VARIADIC("Min"),
    {"", "Where", where_supports, where_run},
    {"", "Cast", cast_supports, cast_run},
    {"", "CastLike", cast_supports, cast_run},
    {"", "Identity", identity_supports, identity_run},
};

const kiln_gpu_op_table kiln_gpu_ops_ew = {ops, sizeof ops / sizeof ops[0]};
