/* kernels_ew.c - float32 element-wise kernels: Add/Sub/Mul/Div over equal shapes, a scalar
 * operand, an operand repeated along the leading dims ([.., K] with [K]) or one value per
 * row ([R, K] with [R, 1]); the unary activations. 4-lane vector loops, parallel in chunks of
 * KILN_CPU_CHUNK elements. Output 0 may be input 0's buffer: every loop loads element i
 * before it stores element i, and nothing else reads it afterwards. */
#include <math.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/threadpool.h"
#include "cpu/vecmath.h"

/* ---- binary ---- */

typedef enum bin_op { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV } bin_op;

/* y = a op b over n elements; vv: both vectors, vs: b one value, sv: a one value. */
typedef void (*bin_vv_fn)(const float *a, const float *b, float *y, int64_t n);
typedef void (*bin_vs_fn)(const float *a, float s, float *y, int64_t n);
typedef void (*bin_sv_fn)(float s, const float *b, float *y, int64_t n);

#define DEF_BIN(NAME, OP)                                                                                    \
    static void NAME##_vv(const float *a, const float *b, float *y, int64_t n)                              \
    {                                                                                                        \
        int64_t i = 0;                                                                                       \
        for (; i + 8 <= n; i += 8) {                                                                         \
            v4f x0 = v4_load(a + i) OP v4_load(b + i), x1 = v4_load(a + i + 4) OP v4_load(b + i + 4);        \
            v4_store(y + i, x0);                                                                             \
            v4_store(y + i + 4, x1);                                                                         \
        }                                                                                                    \
        for (; i < n; i++) y[i] = a[i] OP b[i];                                                              \
    }                                                                                                        \
    static void NAME##_vs(const float *a, float s, float *y, int64_t n)                                     \
    {                                                                                                        \
        v4f s4 = v4_splat(s);                                                                                \
        int64_t i = 0;                                                                                       \
        for (; i + 8 <= n; i += 8) {                                                                         \
            v4f x0 = v4_load(a + i) OP s4, x1 = v4_load(a + i + 4) OP s4;                                    \
            v4_store(y + i, x0);                                                                             \
            v4_store(y + i + 4, x1);                                                                         \
        }                                                                                                    \
        for (; i < n; i++) y[i] = a[i] OP s;                                                                 \
    }                                                                                                        \
    static void NAME##_sv(float s, const float *b, float *y, int64_t n)                                     \
    {                                                                                                        \
        v4f s4 = v4_splat(s);                                                                                \
        int64_t i = 0;                                                                                       \
        for (; i + 8 <= n; i += 8) {                                                                         \
            v4f x0 = s4 OP v4_load(b + i), x1 = s4 OP v4_load(b + i + 4);                                    \
            v4_store(y + i, x0);                                                                             \
            v4_store(y + i + 4, x1);                                                                         \
        }                                                                                                    \
        for (; i < n; i++) y[i] = s OP b[i];                                                                 \
    }

DEF_BIN(add, +)
DEF_BIN(sub, -)
DEF_BIN(mul, *)
DEF_BIN(div, /)

static const bin_vv_fn bin_vv[] = {add_vv, sub_vv, mul_vv, div_vv};
static const bin_vs_fn bin_vs[] = {add_vs, sub_vs, mul_vs, div_vs};
static const bin_sv_fn bin_sv[] = {add_sv, sub_sv, mul_sv, div_sv};

/* How the smaller operand maps onto Y (the full one has Y's shape). */
typedef enum bin_form {
    FORM_SAME,   /* both full */
    FORM_SCALAR, /* small: one value */
    FORM_TRAIL,  /* small: `inner` values, Y's trailing dims, repeated along the leading ones */
    FORM_ROW,    /* small: one value per row of `inner` elements (Y's leading dims, then 1s) */
} bin_form;

typedef struct bin_job {
    bin_op op;
    bin_form form;
    bool small_a;        /* the smaller operand is A (input 0), else B */
    const float *a, *b;  /* A and B */
    float *y;            /* [numel] */
    int64_t numel, inner;
} bin_job;

static void bin_chunks(void *ctx, int64_t begin, int64_t end)
{
    const bin_job *j = ctx;
    int64_t i = begin * KILN_CPU_CHUNK, e = end * KILN_CPU_CHUNK < j->numel ? end * KILN_CPU_CHUNK : j->numel;
    const float *full = j->small_a ? j->b : j->a, *small = j->small_a ? j->a : j->b;
    switch (j->form) {
    case FORM_SAME:
        bin_vv[j->op](j->a + i, j->b + i, j->y + i, e - i);
        break;
    case FORM_SCALAR:
        if (j->small_a) bin_sv[j->op](small[0], full + i, j->y + i, e - i);
        else bin_vs[j->op](full + i, small[0], j->y + i, e - i);
        break;
    case FORM_TRAIL:
        while (i < e) {
            int64_t k = i % j->inner, len = j->inner - k < e - i ? j->inner - k : e - i;
            if (j->small_a) bin_vv[j->op](small + k, full + i, j->y + i, len);
            else bin_vv[j->op](full + i, small + k, j->y + i, len);
            i += len;
        }
        break;
    case FORM_ROW:
        while (i < e) {
            int64_t r = i / j->inner, len = (r + 1) * j->inner - i < e - i ? (r + 1) * j->inner - i : e - i;
            if (j->small_a) bin_sv[j->op](small[r], full + i, j->y + i, len);
            else bin_vs[j->op](full + i, small[r], j->y + i, len);
            i += len;
        }
        break;
    }
}

/* Classifies how s (broadcast to Y, s->numel < Y->numel) maps onto Y; false: not covered. */
static bool bin_classify(const kiln_value *s, const kiln_value *Y, bin_form *form, int64_t *inner)
{
    if (s->numel == 1) {
        *form = FORM_SCALAR;
        return true;
    }
    if (s->rank > Y->rank) return false;
    int off = Y->rank - s->rank;
    int k = Y->rank - 1;
    /* trailing: s's dims equal Y's from some axis on, 1 (or absent) before it */
    while (k >= off && s->dims[k - off] == Y->dims[k]) k--;
    bool ones = true;
    for (int q = k; q >= off; q--) ones = ones && s->dims[q - off] == 1;
    if (ones) {
        *form = FORM_TRAIL;
        *inner = s->numel;
        return true;
    }
    /* per row: s's dims are Y's (all of them, none absent) up to some axis, 1 after it */
    if (off) return false;
    k = 0;
    while (k < Y->rank && s->dims[k] == Y->dims[k]) k++;
    for (int q = k; q < Y->rank; q++)
        if (s->dims[q] != 1) return false;
    *form = FORM_ROW;
    *inner = Y->numel / s->numel;
    return true;
}

static kiln_status bin_run(kiln_run_ctx *c, bin_op op)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || !A || !B || A->dtype != KILN_DTYPE_FLOAT32 || B->dtype != KILN_DTYPE_FLOAT32 ||
        Y->dtype != KILN_DTYPE_FLOAT32)
        return kiln_cpu_reference(c);
    if (!Y->numel) return KILN_OK;
    /* run-time inference has checked that A and B broadcast to Y: an operand with Y's element
     * count has Y's layout */
    bin_job j = {.op = op, .a = A->data, .b = B->data, .y = Y->data, .numel = Y->numel, .inner = 1};
    if (A->numel == Y->numel && B->numel == Y->numel) j.form = FORM_SAME;
    else if (A->numel == Y->numel) {
        if (!bin_classify(B, Y, &j.form, &j.inner)) return kiln_cpu_reference(c);
    } else if (B->numel == Y->numel) {
        j.small_a = true;
        if (!bin_classify(A, Y, &j.form, &j.inner)) return kiln_cpu_reference(c);
    } else return kiln_cpu_reference(c);
    kiln_threadpool_parallel_for(kiln_run_threadpool(c), (Y->numel + KILN_CPU_CHUNK - 1) / KILN_CPU_CHUNK,
                                 bin_chunks, &j);
    return KILN_OK;
}

static kiln_status add_run(kiln_run_ctx *c) { return bin_run(c, BIN_ADD); }
static kiln_status sub_run(kiln_run_ctx *c) { return bin_run(c, BIN_SUB); }
static kiln_status mul_run(kiln_run_ctx *c) { return bin_run(c, BIN_MUL); }
static kiln_status div_run(kiln_run_ctx *c) { return bin_run(c, BIN_DIV); }

/* ---- unary ---- */

typedef void (*unary_fn)(const float *x, float *y, int64_t n);

#define DEF_UNARY_V4(NAME, VEXPR)                                                                     \
    static void NAME(const float *x, float *y, int64_t n)                                                    \
    {                                                                                                        \
        int64_t i = 0;                                                                                       \
        for (; i + 4 <= n; i += 4) {                                                                         \
            v4f v = v4_load(x + i);                                                                          \
            v4_store(y + i, VEXPR);                                                                          \
        }                                                                                                    \
        if (i < n) { /* the tail through one padded vector */                                               \
            float t[4] = {0, 0, 0, 0};                                                                       \
            memcpy(t, x + i, (size_t)(n - i) * sizeof *t);                                                   \
            v4f v = v4_load(t);                                                                              \
            v4_store(t, VEXPR);                                                                              \
            memcpy(y + i, t, (size_t)(n - i) * sizeof *t);                                                   \
        }                                                                                                    \
    }

#define DEF_UNARY_SCALAR(NAME, SEXPR)                                                                        \
    static void NAME(const float *x, float *y, int64_t n)                                                    \
    {                                                                                                        \
        for (int64_t i = 0; i < n; i++) {                                                                    \
            float v = x[i];                                                                                  \
            y[i] = SEXPR;                                                                                    \
        }                                                                                                    \
    }

/* Relu keeps NaN as the reference (x < 0 ? 0 : x) does */
DEF_UNARY_V4(relu_f32, (v4f)((v4i)v & ~(v < v4_splat(0.0f))))
DEF_UNARY_V4(exp_f32, v4_exp(v))
DEF_UNARY_V4(sigmoid_f32, v4_sigmoid(v))
DEF_UNARY_V4(tanh_f32, v4_tanh(v))
/* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
DEF_UNARY_V4(gelu_tanh_f32,
             v4_splat(0.5f) * v *
                 (v4_splat(1.0f) + v4_tanh(v4_splat(0.7978845608028654f) * (v + v4_splat(0.044715f) * v * v * v))))
DEF_UNARY_V4(erf_f32, v4_erf(v))
DEF_UNARY_SCALAR(sqrt_f32, sqrtf(v))

/* 0.5 x (1 + erf(x / sqrt 2)); below x / sqrt 2 = -2 (erf < -0.995) the sum cancels, and those
 * lanes take 0.5 x erfc(-x / sqrt 2) instead */
static inline v4f v4_gelu_erf(v4f v)
{
    v4f z = v * v4_splat(0.70710678118654752f);
    v4i low = z < v4_splat(-2.0f);
    v4f r = v4_splat(0.5f) * v * (v4_splat(1.0f) + v4_erf(z));
    if ((low[0] | low[1]) | (low[2] | low[3]))
        for (int k = 0; k < 4; k++)
            if (low[k]) r[k] = 0.5f * v[k] * erfcf(-z[k]);
    return r;
}

DEF_UNARY_V4(gelu_erf_f32, v4_gelu_erf(v))

typedef struct unary_job {
    unary_fn f;
    const float *x;
    float *y;
    int64_t numel;
} unary_job;

static void unary_chunks(void *ctx, int64_t begin, int64_t end)
{
    const unary_job *j = ctx;
    int64_t i = begin * KILN_CPU_CHUNK, e = end * KILN_CPU_CHUNK < j->numel ? end * KILN_CPU_CHUNK : j->numel;
    j->f(j->x + i, j->y + i, e - i);
}

static kiln_status unary_run(kiln_run_ctx *c, unary_fn f)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || !X || X->dtype != KILN_DTYPE_FLOAT32 || Y->dtype != KILN_DTYPE_FLOAT32 || X->numel != Y->numel)
        return kiln_cpu_reference(c);
    unary_job j = {f, X->data, Y->data, Y->numel};
    kiln_threadpool_parallel_for(kiln_run_threadpool(c), (Y->numel + KILN_CPU_CHUNK - 1) / KILN_CPU_CHUNK,
                                 unary_chunks, &j);
    return KILN_OK;
}

static kiln_status relu_run(kiln_run_ctx *c) { return unary_run(c, relu_f32); }
static kiln_status exp_run(kiln_run_ctx *c) { return unary_run(c, exp_f32); }
static kiln_status sigmoid_run(kiln_run_ctx *c) { return unary_run(c, sigmoid_f32); }
static kiln_status tanh_run(kiln_run_ctx *c) { return unary_run(c, tanh_f32); }
static kiln_status sqrt_run(kiln_run_ctx *c) { return unary_run(c, sqrt_f32); }
static kiln_status erf_run(kiln_run_ctx *c) { return unary_run(c, erf_f32); }
static kiln_status gelu_run(kiln_run_ctx *c) { return unary_run(c, gelu_erf_f32); }
static kiln_status gelu_tanh_run(kiln_run_ctx *c) { return unary_run(c, gelu_tanh_f32); }

kiln_kernel_fn kiln_cpu_select_ew(const kiln_node *n)
{
    if (*n->domain || n->n_in < 1 || n->n_out < 1 || !kiln_cpu_is_f32(n->in[0]) || !kiln_cpu_is_f32(n->out[0]))
        return NULL;
    const char *t = n->op_type;
    if (n->n_in == 2 && kiln_cpu_is_f32(n->in[1]) && n->opset >= 7) { /* before 7: legacy broadcast attributes */
        if (!strcmp(t, "Add")) return add_run;
        if (!strcmp(t, "Sub")) return sub_run;
        if (!strcmp(t, "Mul")) return mul_run;
        if (!strcmp(t, "Div")) return div_run;
        return NULL;
    }
    if (n->n_in != 1) return NULL;
    if (!strcmp(t, "Relu")) return relu_run;
    if (!strcmp(t, "Exp")) return exp_run;
    if (!strcmp(t, "Sigmoid")) return sigmoid_run;
    if (!strcmp(t, "Tanh")) return tanh_run;
    if (!strcmp(t, "Sqrt")) return sqrt_run;
    if (!strcmp(t, "Erf")) return erf_run;
    if (!strcmp(t, "Gelu")) {
        const char *approx = kiln_attr_string(n, "approximate", "none");
        return !strcmp(approx, "none") ? gelu_run : !strcmp(approx, "tanh") ? gelu_tanh_run : NULL;
    }
    return NULL;
}
