/* elementwise.c - element-wise ops: unary math and activations, arithmetic, comparison, logic and
 * bitwise ops with numpy broadcasting, variadic Sum/Mean/Max/Min, Where, Clip. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "ops/fused.h"
#include "ops/op.h"
#include "ops/semantics.h"
#include "ops/util.h"

/* How an element type computes: floats in double, integers exactly in 64 bits. bool counts as
 * unsigned (0/1). */
typedef enum ew_class { EW_FLOAT, EW_INT, EW_UINT } ew_class;

static ew_class ew_class_of(kiln_dtype dt)
{
    if (kiln_dtype_is_float(dt)) return EW_FLOAT;
    return kiln_dtype_is_signed_int(dt) ? EW_INT : EW_UINT;
}

static bool is_numeric(kiln_dtype dt) { return kiln_dtype_is_float(dt) || kiln_dtype_is_int(dt); }

static kiln_status bad_dtype(kiln_infer_ctx *c, const char *input, kiln_dtype dt)
{
    return kiln_infer_fail(c, KILN_ERR_MODEL, "input %s has unsupported dtype %s", input, kiln_dtype_name(dt));
}

/* Fails unless present inputs first..n-1 have input `first`'s dtype (unknown dtypes pass). */
static kiln_status require_same_dtype(kiln_infer_ctx *c, int first, int n)
{
    const kiln_type *a = kiln_infer_in(c, first);
    for (int i = first + 1; i < n; i++) {
        const kiln_type *b = kiln_infer_in(c, i);
        if (!a || !b || !a->dtype || !b->dtype || a->dtype == b->dtype) continue;
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d has dtype %s but input %d has %s", first,
                               kiln_dtype_name(a->dtype), i, kiln_dtype_name(b->dtype));
    }
    return KILN_OK;
}

/* ======================================================================================
 * Unary ops
 * ====================================================================================== */

/* Attributes of the activations, read once per node. */
typedef struct ew_params {
    double alpha, beta, gamma, lambd, bias;
    bool gelu_tanh;
} ew_params;

static double relu_f(double x, const ew_params *p) { return x < 0 ? 0 : x; }
static double abs_f(double x, const ew_params *p) { return fabs(x); }
static double neg_f(double x, const ew_params *p) { return -x; }
static double reciprocal_f(double x, const ew_params *p) { return 1 / x; }
static double floor_f(double x, const ew_params *p) { return floor(x); }
static double ceil_f(double x, const ew_params *p) { return ceil(x); }
static double round_f(double x, const ew_params *p) { return nearbyint(x); } /* half to even */
static double sqrt_f(double x, const ew_params *p) { return sqrt(x); }
static double exp_f(double x, const ew_params *p) { return exp(x); }
static double log_f(double x, const ew_params *p) { return log(x); }
static double sin_f(double x, const ew_params *p) { return sin(x); }
static double cos_f(double x, const ew_params *p) { return cos(x); }
static double tan_f(double x, const ew_params *p) { return tan(x); }
static double asin_f(double x, const ew_params *p) { return asin(x); }
static double acos_f(double x, const ew_params *p) { return acos(x); }
static double atan_f(double x, const ew_params *p) { return atan(x); }
static double sinh_f(double x, const ew_params *p) { return sinh(x); }
static double cosh_f(double x, const ew_params *p) { return cosh(x); }
static double asinh_f(double x, const ew_params *p) { return asinh(x); }
static double acosh_f(double x, const ew_params *p) { return acosh(x); }
static double atanh_f(double x, const ew_params *p) { return atanh(x); }
static double erf_f(double x, const ew_params *p) { return erf(x); }
static double tanh_f(double x, const ew_params *p) { return tanh(x); }
static double sign_f(double x, const ew_params *p) { return isnan(x) ? x : (x > 0) - (x < 0); }
static double sigmoid_f(double x, const ew_params *p) { return 1 / (1 + exp(-x)); }
static double leaky_relu_f(double x, const ew_params *p) { return x < 0 ? p->alpha * x : x; }
static double elu_f(double x, const ew_params *p) { return x < 0 ? p->alpha * expm1(x) : x; }
static double selu_f(double x, const ew_params *p) { return p->gamma * (x <= 0 ? p->alpha * expm1(x) : x); }
static double celu_f(double x, const ew_params *p) { return x > 0 ? x : p->alpha * expm1(x / p->alpha); }
/* clamp into [0, 1], NaN passing through like numpy's minimum/maximum */
static double clamp01(double v) { return v < 0 ? 0 : v > 1 ? 1 : v; }
static double hard_sigmoid_f(double x, const ew_params *p) { return clamp01(p->alpha * x + p->beta); }
static double hard_swish_f(double x, const ew_params *p) { return x * clamp01(x / 6 + 0.5); }
/* log(1 + e^x) without overflow for large x */
static double softplus_f(double x, const ew_params *p) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double softsign_f(double x, const ew_params *p) { return x / (1 + fabs(x)); }
static double thresholded_relu_f(double x, const ew_params *p) { return x > p->alpha ? x : 0; }
static double mish_f(double x, const ew_params *p) { return x * tanh(softplus_f(x, p)); }
static double swish_f(double x, const ew_params *p) { return x / (1 + exp(-p->alpha * x)); }

static double shrink_f(double x, const ew_params *p)
{
    return x < -p->lambd ? x + p->bias : x > p->lambd ? x - p->bias : 0;
}

static double gelu_f(double x, const ew_params *p)
{
    if (p->gelu_tanh) return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    return 0.5 * x * (1 + erf(x / sqrt(2)));
}

/* Integer variants (two's complement wrap, as numpy). */
static int64_t abs_i(int64_t x) { return x < 0 ? (int64_t)(0 - (uint64_t)x) : x; }
static int64_t neg_i(int64_t x) { return (int64_t)(0 - (uint64_t)x); }
static int64_t sign_i(int64_t x) { return (x > 0) - (x < 0); }
static int64_t relu_i(int64_t x) { return x < 0 ? 0 : x; }
static uint64_t ident_u(uint64_t x) { return x; }
static uint64_t neg_u(uint64_t x) { return 0 - x; }
static uint64_t sign_u(uint64_t x) { return x != 0; }

typedef struct unary_op {
    const char *op_type;
    double (*f)(double x, const ew_params *p);
    int64_t (*fi)(int64_t x);  /* signed integers; NULL: float types only */
    uint64_t (*fu)(uint64_t x); /* unsigned integers */
    float alpha, beta, gamma;   /* attribute defaults */
} unary_op;

static const unary_op unary_ops[] = {
    {"Abs", abs_f, abs_i, ident_u, 0, 0, 0},
    {"Neg", neg_f, neg_i, neg_u, 0, 0, 0},
    {"Sign", sign_f, sign_i, sign_u, 0, 0, 0},
    {"Relu", relu_f, relu_i, ident_u, 0, 0, 0},
    {"Reciprocal", reciprocal_f, NULL, NULL, 0, 0, 0},
    {"Floor", floor_f, NULL, NULL, 0, 0, 0},
    {"Ceil", ceil_f, NULL, NULL, 0, 0, 0},
    {"Round", round_f, NULL, NULL, 0, 0, 0},
    {"Sqrt", sqrt_f, NULL, NULL, 0, 0, 0},
    {"Exp", exp_f, NULL, NULL, 0, 0, 0},
    {"Log", log_f, NULL, NULL, 0, 0, 0},
    {"Sin", sin_f, NULL, NULL, 0, 0, 0},
    {"Cos", cos_f, NULL, NULL, 0, 0, 0},
    {"Tan", tan_f, NULL, NULL, 0, 0, 0},
    {"Asin", asin_f, NULL, NULL, 0, 0, 0},
    {"Acos", acos_f, NULL, NULL, 0, 0, 0},
    {"Atan", atan_f, NULL, NULL, 0, 0, 0},
    {"Sinh", sinh_f, NULL, NULL, 0, 0, 0},
    {"Cosh", cosh_f, NULL, NULL, 0, 0, 0},
    {"Asinh", asinh_f, NULL, NULL, 0, 0, 0},
    {"Acosh", acosh_f, NULL, NULL, 0, 0, 0},
    {"Atanh", atanh_f, NULL, NULL, 0, 0, 0},
    {"Erf", erf_f, NULL, NULL, 0, 0, 0},
    {"Sigmoid", sigmoid_f, NULL, NULL, 0, 0, 0},
    {"Tanh", tanh_f, NULL, NULL, 0, 0, 0},
    {"LeakyRelu", leaky_relu_f, NULL, NULL, 0.01f, 0, 0},
    {"Elu", elu_f, NULL, NULL, 1, 0, 0},
    {"Selu", selu_f, NULL, NULL, 1.67326319217681884765625f, 0, 1.05070102214813232421875f},
    {"Celu", celu_f, NULL, NULL, 1, 0, 0},
    {"HardSigmoid", hard_sigmoid_f, NULL, NULL, 0.2f, 0.5f, 0},
    {"HardSwish", hard_swish_f, NULL, NULL, 0, 0, 0},
    {"Softplus", softplus_f, NULL, NULL, 0, 0, 0},
    {"Softsign", softsign_f, NULL, NULL, 0, 0, 0},
    {"ThresholdedRelu", thresholded_relu_f, NULL, NULL, 1, 0, 0},
    {"Shrink", shrink_f, NULL, NULL, 0, 0, 0},
    {"Gelu", gelu_f, NULL, NULL, 0, 0, 0},
    {"Mish", mish_f, NULL, NULL, 0, 0, 0},
    {"Swish", swish_f, NULL, NULL, 1, 0, 0},
};

static const unary_op *unary_find(const kiln_node *n)
{
    for (size_t k = 0; k < sizeof unary_ops / sizeof unary_ops[0]; k++)
        if (!strcmp(unary_ops[k].op_type, n->op_type)) return &unary_ops[k];
    return NULL;
}

static bool unary_params(const kiln_node *n, const unary_op *op, ew_params *p)
{
    p->alpha = kiln_attr_float(n, "alpha", op->alpha);
    p->beta = kiln_attr_float(n, "beta", op->beta);
    p->gamma = kiln_attr_float(n, "gamma", op->gamma);
    p->lambd = kiln_attr_float(n, "lambd", 0.5f);
    p->bias = kiln_attr_float(n, "bias", 0);
    const char *approx = kiln_attr_string(n, "approximate", "none");
    p->gelu_tanh = !strcmp(approx, "tanh");
    return p->gelu_tanh || !strcmp(approx, "none");
}

static kiln_status unary_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const unary_op *op = unary_find(n);
    const kiln_type *x = kiln_infer_in(c, 0);
    ew_params p;
    if (!op || !x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input X");
    if (!unary_params(n, op, &p))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "attribute approximate must be 'none' or 'tanh'");
    if (x->dtype && !kiln_dtype_is_float(x->dtype) && !(op->fi && kiln_dtype_is_int(x->dtype)))
        return bad_dtype(c, "X", x->dtype);
    /* a stray second input was broadcast into Y (an empty one left Y empty while X was not: the
     * fuzzer's find) */
    KILN_TRY(kiln_infer_max_inputs(c, 1));
    return kiln_infer_same_as_input(c, 0, 0);
}

static kiln_status unary_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const unary_op *op = unary_find(n);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    ew_params p;
    unary_params(n, op, &p);
    ew_class cls = ew_class_of(x->dtype);
    kiln_dtype dt = x->dtype;
    for (int64_t i = 0; i < x->numel; i++) {
        if (cls == EW_FLOAT) kiln_store_f64(dt, y->data, i, op->f(kiln_load_f64(dt, x->data, i), &p));
        else if (cls == EW_INT) kiln_store_i64(dt, y->data, i, op->fi(kiln_load_i64(dt, x->data, i)));
        else kiln_store_u64(dt, y->data, i, op->fu(kiln_load_u64(dt, x->data, i)));
    }
    return KILN_OK;
}

bool kiln_ops_unary_reference(const char *op_type, double alpha, double beta, bool gelu_tanh, kiln_value *y)
{
    const unary_op *op = NULL;
    for (size_t k = 0; k < sizeof unary_ops / sizeof unary_ops[0] && !op; k++)
        if (!strcmp(unary_ops[k].op_type, op_type)) op = &unary_ops[k];
    if (!op || ew_class_of(y->dtype) != EW_FLOAT) return false;
    ew_params p = {.alpha = alpha, .beta = beta, .gelu_tanh = gelu_tanh};
    for (int64_t i = 0; i < y->numel; i++) kiln_store_f64(y->dtype, y->data, i, op->f(kiln_load_f64(y->dtype, y->data, i), &p));
    return true;
}

int kiln_ops_unary_code(const kiln_node *n, double params[4])
{
    for (size_t k = 0; k < sizeof unary_ops / sizeof unary_ops[0]; k++) {
        ew_params p;
        if (strcmp(unary_ops[k].op_type, n->op_type) || !unary_params(n, &unary_ops[k], &p)) continue;
        if (!strcmp(n->op_type, "Shrink")) return -1; /* its lambd and bias do not fit params */
        params[0] = p.alpha, params[1] = p.beta, params[2] = p.gamma, params[3] = p.gelu_tanh;
        return (int)k;
    }
    return -1;
}

const char *kiln_ops_unary_name(int code)
{
    return code >= 0 && code < (int)(sizeof unary_ops / sizeof unary_ops[0]) ? unary_ops[code].op_type : NULL;
}

double kiln_ops_unary_eval(int code, double x, const double params[4])
{
    ew_params p = {.alpha = params[0], .beta = params[1], .gamma = params[2], .gelu_tanh = params[3] != 0};
    return unary_ops[code].f(x, &p);
}

/* IsNaN, IsInf: float -> bool. */
static kiln_status isnan_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input X");
    if (x->dtype && !kiln_dtype_is_float(x->dtype)) return bad_dtype(c, "X", x->dtype);
    KILN_TRY(kiln_infer_max_inputs(c, 1));
    return kiln_infer_elementwise(c, KILN_DTYPE_BOOL);
}

static kiln_status isnan_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    for (int64_t i = 0; i < x->numel; i++) ((uint8_t *)y->data)[i] = isnan(kiln_load_f64(x->dtype, x->data, i));
    return KILN_OK;
}

static kiln_status isinf_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    bool pos = kiln_attr_int(n, "detect_positive", 1) != 0, neg = kiln_attr_int(n, "detect_negative", 1) != 0;
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    for (int64_t i = 0; i < x->numel; i++) {
        double v = kiln_load_f64(x->dtype, x->data, i);
        ((uint8_t *)y->data)[i] = isinf(v) && (v > 0 ? pos : neg);
    }
    return KILN_OK;
}

/* Not (bool) and BitwiseNot (integers): flip every bit, stored back into the type's width. */
static kiln_status not_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    bool bitwise = !strcmp(kiln_infer_node(c)->op_type, "BitwiseNot");
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input X");
    if (x->dtype && (bitwise ? !kiln_dtype_is_int(x->dtype) : x->dtype != KILN_DTYPE_BOOL))
        return bad_dtype(c, "X", x->dtype);
    KILN_TRY(kiln_infer_max_inputs(c, 1));
    return kiln_infer_elementwise(c, KILN_DTYPE_UNDEFINED);
}

static kiln_status not_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    for (int64_t i = 0; i < x->numel; i++) {
        uint64_t v = kiln_load_u64(x->dtype, x->data, i);
        kiln_store_u64(y->dtype, y->data, i, x->dtype == KILN_DTYPE_BOOL ? !v : ~v);
    }
    return KILN_OK;
}

/* ======================================================================================
 * Binary ops (numpy broadcasting) and the variadic folds built on them
 * ====================================================================================== */

typedef enum bin_code {
    B_ADD, B_SUB, B_MUL, B_DIV, B_MOD, B_FMOD, B_POW, B_PRELU, B_SHL, B_SHR, B_AND, B_OR, B_XOR,
    B_MAX, B_MIN, B_EQ, B_LT, B_LE, B_GT, B_GE,
} bin_code;

typedef struct binary_op {
    const char *op_type;
    bin_code code;
    bool to_bool;  /* comparison: output is bool */
    bool any_type; /* inputs may differ in dtype (Pow) */
} binary_op;

static const binary_op binary_ops[] = {
    {"Add", B_ADD, false, false},        {"Sub", B_SUB, false, false},
    {"Mul", B_MUL, false, false},        {"Div", B_DIV, false, false},
    {"Mod", B_MOD, false, false},        {"Pow", B_POW, false, true},
    {"PRelu", B_PRELU, false, false},    {"BitShift", B_SHL, false, false},
    {"And", B_AND, false, false},        {"Or", B_OR, false, false},
    {"Xor", B_XOR, false, false},        {"BitwiseAnd", B_AND, false, false},
    {"BitwiseOr", B_OR, false, false},   {"BitwiseXor", B_XOR, false, false},
    {"Equal", B_EQ, true, false},        {"Less", B_LT, true, false},
    {"LessOrEqual", B_LE, true, false},  {"Greater", B_GT, true, false},
    {"GreaterOrEqual", B_GE, true, false},
};

/* n's op, or the one its kiln fused form extends (kiln.FusedAdd: Add) */
static const binary_op *binary_find(const kiln_node *n)
{
    const char *op_type = kiln_node_is_fused(n, "Add") ? "Add" : n->op_type;
    for (size_t k = 0; k < sizeof binary_ops / sizeof binary_ops[0]; k++)
        if (!strcmp(binary_ops[k].op_type, op_type)) return &binary_ops[k];
    return NULL;
}

/* The node's code after its attributes: Mod's fmod, BitShift's direction. */
static bool binary_code(const kiln_node *n, const binary_op *op, bin_code *code)
{
    *code = op->code;
    if (op->code == B_MOD) {
        int64_t fmod_attr = kiln_attr_int(n, "fmod", 0);
        if (fmod_attr) *code = B_FMOD;
        return fmod_attr == 0 || fmod_attr == 1;
    }
    if (op->code == B_SHL) {
        const char *dir = kiln_attr_string(n, "direction", "");
        if (!strcmp(dir, "RIGHT")) *code = B_SHR;
        return !strcmp(dir, "RIGHT") || !strcmp(dir, "LEFT");
    }
    return true;
}

/* numpy's floating mod: the result takes the sign of the divisor. */
static double py_mod(double a, double b)
{
    double m = fmod(a, b);
    if (b == 0 || isnan(m)) return m;
    if (m == 0) return copysign(0, b);
    if ((b < 0) != (m < 0)) m += b;
    return m;
}

static double bin_f(bin_code op, double a, double b)
{
    switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_MOD: return py_mod(a, b);
    case B_FMOD: return fmod(a, b);
    case B_POW: return pow(a, b);
    case B_PRELU: return a < 0 ? a * b : a;
    case B_MAX: return isnan(a) || isnan(b) ? NAN : fmax(a, b);
    case B_MIN: return isnan(a) || isnan(b) ? NAN : fmin(a, b);
    case B_EQ: return a == b;
    case B_LT: return a < b;
    case B_LE: return a <= b;
    case B_GT: return a > b;
    case B_GE: return a >= b;
    default: return 0; /* bitwise ops never reach float types */
    }
}

int kiln_ops_binary_code(const kiln_node *n)
{
    if ((!strcmp(n->op_type, "Max") || !strcmp(n->op_type, "Min")) && !*n->domain && n->n_in == 2)
        return !strcmp(n->op_type, "Max") ? B_MAX : B_MIN;
    const binary_op *op = binary_find(n);
    bin_code code;
    if (!op || op->to_bool || !binary_code(n, op, &code)) return -1;
    return code == B_ADD || code == B_SUB || code == B_MUL || code == B_DIV || code == B_POW || code == B_MAX ||
                   code == B_MIN || code == B_PRELU || code == B_MOD || code == B_FMOD
               ? (int)code
               : -1;
}

double kiln_ops_binary_eval(int code, double a, double b) { return bin_f((bin_code)code, a, b); }

/* a ** b in wrapping unsigned arithmetic (b >= 0). */
static uint64_t ipow(uint64_t a, uint64_t b)
{
    uint64_t r = 1;
    for (; b; b >>= 1, a *= a)
        if (b & 1) r *= a;
    return r;
}

/* Signed integer ops on a `bits`-wide type: wrap like numpy, division truncates toward zero
 * (ONNX reference), division or mod by zero gives 0. */
static int64_t bin_i(bin_code op, int64_t a, int64_t b, int bits)
{
    uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
    switch (op) {
    case B_ADD: return (int64_t)(ua + ub);
    case B_SUB: return (int64_t)(ua - ub);
    case B_MUL: return (int64_t)(ua * ub);
    case B_DIV: return b == 0 ? 0 : b == -1 ? (int64_t)(0 - ua) : a / b;
    case B_FMOD: return b == 0 || b == -1 ? 0 : a % b;
    case B_MOD: {
        if (b == 0 || b == -1) return 0;
        int64_t m = a % b;
        return m != 0 && (m < 0) != (b < 0) ? m + b : m;
    }
    case B_POW:
        if (b >= 0) return (int64_t)ipow(ua, ub);
        return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;
    case B_PRELU: return a < 0 ? (int64_t)(ua * ub) : a;
    case B_SHL: return b < 0 || b >= bits ? 0 : (int64_t)(ua << b);
    case B_SHR:
        if (b < 0 || b >= bits) return a < 0 ? -1 : 0;
        return a < 0 ? ~(~a >> b) : a >> b;
    case B_AND: return a & b;
    case B_OR: return a | b;
    case B_XOR: return a ^ b;
    case B_MAX: return a > b ? a : b;
    case B_MIN: return a < b ? a : b;
    case B_EQ: return a == b;
    case B_LT: return a < b;
    case B_LE: return a <= b;
    case B_GT: return a > b;
    case B_GE: return a >= b;
    }
    return 0;
}

static uint64_t bin_u(bin_code op, uint64_t a, uint64_t b, int bits)
{
    switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return b ? a / b : 0;
    case B_MOD:
    case B_FMOD: return b ? a % b : 0;
    case B_POW: return ipow(a, b);
    case B_PRELU: return a;
    case B_SHL: return b >= (uint64_t)bits ? 0 : a << b;
    case B_SHR: return b >= (uint64_t)bits ? 0 : a >> b;
    case B_AND: return a & b;
    case B_OR: return a | b;
    case B_XOR: return a ^ b;
    case B_MAX: return a > b ? a : b;
    case B_MIN: return a < b ? a : b;
    case B_EQ: return a == b;
    case B_LT: return a < b;
    case B_LE: return a <= b;
    case B_GT: return a > b;
    case B_GE: return a >= b;
    }
    return 0;
}

/* y = op(a, b) over y's shape; sa/sb: element strides of a and b broadcast to y (a may be y
 * itself with its own strides: each element reads only its own position). */
static void bin_apply(bin_code op, kiln_value *y, const kiln_value *a, const int64_t *sa, const kiln_value *b,
                      const int64_t *sb)
{
    int64_t strides[3][KILN_MAX_RANK];
    int rank = y->rank;
    kiln_strides(rank, y->dims, strides[0]);
    if (rank) {
        memcpy(strides[1], sa, (size_t)rank * sizeof *sa);
        memcpy(strides[2], sb, (size_t)rank * sizeof *sb);
    }
    kiln_iter it;
    kiln_iter_init(&it, rank, y->dims, 3, strides);
    /* Pow with an integer base and a float exponent computes in floats */
    ew_class cls = ew_class_of(a->dtype);
    if (kiln_dtype_is_float(b->dtype)) cls = EW_FLOAT;
    int bits = (int)kiln_dtype_size(a->dtype) * 8;
    kiln_dtype ta = a->dtype, tb = b->dtype, ty = y->dtype;
    for (int64_t i = 0; i < y->numel; i++, kiln_iter_next(&it)) {
        const void *pa = a->data, *pb = b->data;
        int64_t iy = it.off[0], ia = it.off[1], ib = it.off[2];
        if (cls == EW_FLOAT) {
            kiln_store_f64(ty, y->data, iy, bin_f(op, kiln_load_f64(ta, pa, ia), kiln_load_f64(tb, pb, ib)));
        } else if (cls == EW_INT) {
            int64_t va = kiln_load_i64(ta, pa, ia), vb = kiln_load_i64(tb, pb, ib);
            kiln_store_i64(ty, y->data, iy, bin_i(op, va, vb, bits));
        } else {
            uint64_t va = kiln_load_u64(ta, pa, ia), vb = kiln_load_u64(tb, pb, ib);
            kiln_store_u64(ty, y->data, iy, bin_u(op, va, vb, bits));
        }
    }
}

/* Shape arithmetic at compile time: both inputs known as dims (Shape -> Add -> Reshape). */
static kiln_status binary_dims_value(kiln_infer_ctx *c, bin_code op)
{
    kiln_dimtab *tab = kiln_infer_dims(c);
    kiln_dim a[KILN_MAX_RANK], b[KILN_MAX_RANK], y[KILN_MAX_RANK];
    int na, nb;
    if (!tab || !kiln_infer_in_dims_value(c, 0, a, KILN_MAX_RANK, &na) ||
        !kiln_infer_in_dims_value(c, 1, b, KILN_MAX_RANK, &nb))
        return KILN_OK;
    if (na != nb && na != 1 && nb != 1) return KILN_OK;
    int n = na == 1 ? nb : na;
    for (int k = 0; k < n; k++) {
        kiln_dim x = a[na == 1 ? 0 : k], z = b[nb == 1 ? 0 : k];
        switch (op) {
        case B_ADD: y[k] = kiln_dim_add(tab, x, z); break;
        case B_SUB: y[k] = kiln_dim_sub(tab, x, z); break;
        case B_MUL: y[k] = kiln_dim_mul(tab, x, z); break;
        case B_MAX: y[k] = kiln_dim_max(tab, x, z); break;
        case B_MIN: y[k] = kiln_dim_min(tab, x, z); break;
        case B_DIV:
            /* integer Div truncates: exact for constants, floor for (non-negative) sizes */
            if (kiln_dim_is_const(x) && kiln_dim_is_const(z)) y[k] = kiln_dim_const(bin_i(B_DIV, x.c, z.c, 64));
            else y[k] = kiln_dim_floordiv(tab, x, z);
            break;
        default: return KILN_OK;
        }
        if (kiln_dim_is_unknown(y[k])) return KILN_OK;
    }
    return kiln_infer_set_out_dims_value(c, 0, y, n);
}

static bool binary_dtype_ok(const binary_op *op, bin_code code, kiln_dtype dt)
{
    if (!dt) return true; /* unknown until run time */
    if (!strcmp(op->op_type, "And") || !strcmp(op->op_type, "Or") || !strcmp(op->op_type, "Xor"))
        return dt == KILN_DTYPE_BOOL;
    if (code >= B_SHL && code <= B_XOR) return kiln_dtype_is_int(dt);
    if (code == B_EQ) return is_numeric(dt) || dt == KILN_DTYPE_BOOL || dt == KILN_DTYPE_STRING;
    if (op->to_bool) return is_numeric(dt) || dt == KILN_DTYPE_BOOL;
    return is_numeric(dt);
}

kiln_status kiln_ops_binary_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const binary_op *op = binary_find(n);
    const kiln_type *a = kiln_infer_in(c, 0), *b = kiln_infer_in(c, 1);
    bin_code code;
    if (!op || !a || !b) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs A and B");
    if (!binary_code(n, op, &code))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "bad attribute (fmod must be 0/1, direction LEFT/RIGHT)");
    if (!op->any_type) KILN_TRY(require_same_dtype(c, 0, 2));
    kiln_dtype dt = a->dtype;
    if (!binary_dtype_ok(op, code, dt) || (op->any_type && b->dtype && !is_numeric(b->dtype)))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "inputs have unsupported dtypes %s, %s", kiln_dtype_name(dt),
                               kiln_dtype_name(b->dtype));
    kiln_dtype out_dt = op->to_bool ? KILN_DTYPE_BOOL : dt;
    int pad = 0;
    if (a->rank >= 0 && b->rank >= 0 && !kiln_legacy_bcast_pad(n, kiln_infer_opset(c), a->rank, b->rank, &pad))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "axis does not place B (rank %d) inside A (rank %d)", b->rank,
                               a->rank);
    if (pad) {
        kiln_type bp = *b;
        for (int k = 0; k < pad; k++) bp.dims[bp.rank++] = kiln_dim_const(1);
        const kiln_type *ins[2] = {a, &bp};
        int rank;
        kiln_dim dims[KILN_MAX_RANK];
        KILN_TRY(kiln_infer_broadcast(c, 2, ins, &rank, dims));
        return kiln_infer_set_out(c, 0, out_dt, rank, dims);
    }
    KILN_TRY(kiln_infer_elementwise(c, out_dt));
    if (!op->to_bool && dt && kiln_dtype_is_int(dt)) return binary_dims_value(c, code);
    return KILN_OK;
}

/* Broadcast strides of x read as y's shape; pad trailing 1-dims first (legacy broadcast). */
static void operand_strides(const kiln_value *y, const kiln_value *x, int pad, int64_t *strides)
{
    int64_t dims[KILN_MAX_RANK];
    int rank = kiln_legacy_bcast_dims(x->rank, x->dims, pad, dims);
    kiln_bcast_strides(y->rank, y->dims, rank, dims, strides);
}

static kiln_status equal_strings(const kiln_value *a, const int64_t *sa, const kiln_value *b, const int64_t *sb,
                                 kiln_value *y)
{
    int64_t strides[3][KILN_MAX_RANK];
    kiln_strides(y->rank, y->dims, strides[0]);
    if (y->rank) {
        memcpy(strides[1], sa, (size_t)y->rank * sizeof *sa);
        memcpy(strides[2], sb, (size_t)y->rank * sizeof *sb);
    }
    kiln_iter it;
    kiln_iter_init(&it, y->rank, y->dims, 3, strides);
    const char *const *as = a->data, *const *bs = b->data;
    for (int64_t i = 0; i < y->numel; i++, kiln_iter_next(&it)) {
        const char *sa_ = as[it.off[1]], *sb_ = bs[it.off[2]];
        ((uint8_t *)y->data)[it.off[0]] = !strcmp(sa_ ? sa_ : "", sb_ ? sb_ : "");
    }
    return KILN_OK;
}

kiln_status kiln_ops_binary_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const binary_op *op = binary_find(n);
    const kiln_value *a = kiln_run_in(c, 0), *b = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    bin_code code;
    int pad;
    binary_code(n, op, &code);
    kiln_legacy_bcast_pad(n, kiln_run_opset(c), a->rank, b->rank, &pad);
    int64_t sa[KILN_MAX_RANK], sb[KILN_MAX_RANK];
    operand_strides(y, a, 0, sa);
    operand_strides(y, b, pad, sb);
    if (a->dtype == KILN_DTYPE_STRING) return equal_strings(a, sa, b, sb, y);
    bin_apply(code, y, a, sa, b, sb);
    return KILN_OK;
}

/* Sum, Mean, Max, Min: a left fold of the (broadcast) inputs into Y. */
static kiln_status variadic_infer(kiln_infer_ctx *c)
{
    const char *name = kiln_infer_node(c)->op_type;
    int n = kiln_infer_n_in(c);
    if (n < 1 || !kiln_infer_in(c, 0)) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs at least one input");
    KILN_TRY(require_same_dtype(c, 0, n));
    kiln_dtype dt = kiln_infer_in(c, 0)->dtype;
    if (dt && (!is_numeric(dt) || (!strcmp(name, "Mean") && !kiln_dtype_is_float(dt))))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "inputs have unsupported dtype %s", kiln_dtype_name(dt));
    KILN_TRY(kiln_infer_elementwise(c, KILN_DTYPE_UNDEFINED));
    if (n == 2 && dt && kiln_dtype_is_int(dt) && (!strcmp(name, "Max") || !strcmp(name, "Min")))
        return binary_dims_value(c, name[1] == 'a' ? B_MAX : B_MIN);
    return KILN_OK;
}

static kiln_status variadic_run(kiln_run_ctx *c)
{
    const char *name = kiln_run_node(c)->op_type;
    bin_code code = !strcmp(name, "Max") ? B_MAX : !strcmp(name, "Min") ? B_MIN : B_ADD;
    kiln_value *y = kiln_run_out(c, 0);
    int64_t sy[KILN_MAX_RANK], sx[KILN_MAX_RANK];
    kiln_strides(y->rank, y->dims, sy);
    int n = kiln_run_n_in(c), count = 0;
    for (int i = 0; i < n; i++) {
        const kiln_value *x = kiln_run_in(c, i);
        if (!x) continue;
        operand_strides(y, x, 0, sx);
        /* the first input is copied in as max(x, x) == x */
        if (count) bin_apply(code, y, y, sy, x, sx);
        else bin_apply(B_MAX, y, x, sx, x, sx);
        count++;
    }
    if (!strcmp(name, "Mean"))
        for (int64_t i = 0; i < y->numel; i++)
            kiln_store_f64(y->dtype, y->data, i, kiln_load_f64(y->dtype, y->data, i) / count);
    return KILN_OK;
}

/* ======================================================================================
 * Where, Clip
 * ====================================================================================== */

static kiln_status where_infer(kiln_infer_ctx *c)
{
    const kiln_type *cond = kiln_infer_in(c, 0), *x = kiln_infer_in(c, 1), *y = kiln_infer_in(c, 2);
    if (!cond || !x || !y) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs condition, X and Y");
    if (cond->dtype && cond->dtype != KILN_DTYPE_BOOL) return bad_dtype(c, "condition", cond->dtype);
    KILN_TRY(require_same_dtype(c, 1, 3));
    KILN_TRY(kiln_infer_max_inputs(c, 3));
    return kiln_infer_elementwise(c, x->dtype);
}

static kiln_status where_run(kiln_run_ctx *c)
{
    const kiln_value *ins[3] = {kiln_run_in(c, 0), kiln_run_in(c, 1), kiln_run_in(c, 2)};
    kiln_value *out = kiln_run_out(c, 0);
    int64_t strides[4][KILN_MAX_RANK];
    kiln_strides(out->rank, out->dims, strides[0]);
    for (int k = 0; k < 3; k++) operand_strides(out, ins[k], 0, strides[k + 1]);
    kiln_iter it;
    kiln_iter_init(&it, out->rank, out->dims, 4, strides);
    size_t es = kiln_dtype_size(out->dtype);
    for (int64_t i = 0; i < out->numel; i++, kiln_iter_next(&it)) {
        int src = ((const uint8_t *)ins[0]->data)[it.off[1]] ? 1 : 2;
        int64_t off = it.off[src + 1];
        if (out->dtype == KILN_DTYPE_STRING) {
            const char *s = ((char *const *)ins[src]->data)[off];
            KILN_TRY(kiln_tensor_set_string(out, it.off[0], s ? s : "", s ? strlen(s) : 0, kiln_run_err(c)));
        } else {
            memcpy((char *)out->data + it.off[0] * es, (const char *)ins[src]->data + off * es, es);
        }
    }
    return KILN_OK;
}

/* Clip: bounds are attributes min/max before opset 11, optional scalar inputs after. */
static kiln_status clip_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input input");
    if (x->dtype && !is_numeric(x->dtype)) return bad_dtype(c, "input", x->dtype);
    KILN_TRY(require_same_dtype(c, 0, 3));
    KILN_TRY(kiln_infer_max_inputs(c, 3));
    for (int i = 1; i < 3; i++) {
        const kiln_value *v = kiln_infer_in_value(c, i);
        if (v && v->numel > 1)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "%s must be a scalar, has %lld elements",
                                   i == 1 ? "min" : "max", (long long)v->numel);
    }
    /* Y has X's shape: the bounds are scalars (an empty one is no bound), never broadcast into
     * it (a [6, 2, 0, 2] min made Y empty while X was not: the fuzzer's find) */
    return kiln_infer_same_as_input(c, 0, 0);
}

static kiln_status clip_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    const kiln_value *lo = kiln_run_in(c, 1), *hi = kiln_run_in(c, 2);
    if (lo && lo->numel == 0) lo = NULL;
    if (hi && hi->numel == 0) hi = NULL;
    ew_class cls = ew_class_of(x->dtype);
    if (kiln_run_opset(c) < 11 || cls == EW_FLOAT) {
        double flo = -INFINITY, fhi = INFINITY;
        if (kiln_run_opset(c) < 11) { /* the schema's defaults: float's lowest and max */
            flo = kiln_attr_float(n, "min", -FLT_MAX);
            fhi = kiln_attr_float(n, "max", FLT_MAX);
        }
        if (lo) flo = kiln_load_f64(lo->dtype, lo->data, 0);
        if (hi) fhi = kiln_load_f64(hi->dtype, hi->data, 0);
        for (int64_t i = 0; i < x->numel; i++) {
            double v = kiln_load_f64(x->dtype, x->data, i);
            if (!isnan(v)) v = fmin(fmax(v, flo), fhi);
            kiln_store_f64(y->dtype, y->data, i, v);
        }
    } else if (cls == EW_INT) {
        int64_t ilo = lo ? kiln_load_i64(lo->dtype, lo->data, 0) : INT64_MIN;
        int64_t ihi = hi ? kiln_load_i64(hi->dtype, hi->data, 0) : INT64_MAX;
        for (int64_t i = 0; i < x->numel; i++) {
            int64_t v = kiln_load_i64(x->dtype, x->data, i);
            v = v < ilo ? ilo : v; /* then the upper bound: min > max gives max, as np.clip */
            kiln_store_i64(y->dtype, y->data, i, v > ihi ? ihi : v);
        }
    } else {
        uint64_t ulo = lo ? kiln_load_u64(lo->dtype, lo->data, 0) : 0;
        uint64_t uhi = hi ? kiln_load_u64(hi->dtype, hi->data, 0) : UINT64_MAX;
        for (int64_t i = 0; i < x->numel; i++) {
            uint64_t v = kiln_load_u64(x->dtype, x->data, i);
            v = v < ulo ? ulo : v;
            kiln_store_u64(y->dtype, y->data, i, v > uhi ? uhi : v);
        }
    }
    return KILN_OK;
}

#define UNARY(name) {"", name, 1, unary_infer, unary_run, KILN_OP_INPLACE}
#define BINARY(name) {"", name, 1, kiln_ops_binary_infer, kiln_ops_binary_run, KILN_OP_INPLACE}

static const kiln_op_def defs[] = {
    UNARY("Abs"), UNARY("Neg"), UNARY("Sign"), UNARY("Relu"), UNARY("Reciprocal"), UNARY("Floor"),
    UNARY("Ceil"), UNARY("Round"), UNARY("Sqrt"), UNARY("Exp"), UNARY("Log"), UNARY("Sin"), UNARY("Cos"),
    UNARY("Tan"), UNARY("Asin"), UNARY("Acos"), UNARY("Atan"), UNARY("Sinh"), UNARY("Cosh"), UNARY("Asinh"),
    UNARY("Acosh"), UNARY("Atanh"), UNARY("Erf"), UNARY("Sigmoid"), UNARY("Tanh"), UNARY("LeakyRelu"),
    UNARY("Elu"), UNARY("Selu"), UNARY("Celu"), UNARY("HardSigmoid"), UNARY("HardSwish"), UNARY("Softplus"),
    UNARY("Softsign"), UNARY("ThresholdedRelu"), UNARY("Shrink"), UNARY("Gelu"), UNARY("Mish"),
    UNARY("Swish"),
    {"", "IsNaN", 1, isnan_infer, isnan_run},
    {"", "IsInf", 1, isnan_infer, isinf_run},
    {"", "Not", 1, not_infer, not_run},
    {"", "BitwiseNot", 1, not_infer, not_run},
    BINARY("Add"), BINARY("Sub"), BINARY("Mul"), BINARY("Div"), BINARY("Mod"), BINARY("Pow"), BINARY("PRelu"),
    BINARY("BitShift"), BINARY("And"), BINARY("Or"), BINARY("Xor"), BINARY("BitwiseAnd"), BINARY("BitwiseOr"),
    BINARY("BitwiseXor"), BINARY("Equal"), BINARY("Less"), BINARY("LessOrEqual"), BINARY("Greater"),
    BINARY("GreaterOrEqual"),
    {"", "Sum", 1, variadic_infer, variadic_run},
    {"", "Mean", 1, variadic_infer, variadic_run},
    {"", "Max", 1, variadic_infer, variadic_run},
    {"", "Min", 1, variadic_infer, variadic_run},
    {"", "Where", 1, where_infer, where_run},
    {"", "Clip", 1, clip_infer, clip_run, KILN_OP_INPLACE, KILN_OP_IN(1) | KILN_OP_IN(2)},
};

const kiln_op_table kiln_ops_elementwise = {defs, sizeof defs / sizeof defs[0]};
