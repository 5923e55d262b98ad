/* kernels_ew.c - float32 element-wise kernels: Add/Sub/Mul/Div over equal shapes, a scalar
 * operand, an operand repeated along the leading dims ([.., K] with [K]), one value per
 * row ([R, K] with [R, 1]) or any other broadcast (both operands smaller than Y, as
 * [B, S, 1, H] + [B, 1, S, H]), row by row, kiln.FusedAdd applying its activation to each chunk
 * while it is in cache; the unary activations (HardSwish through the Conv
 * epilogue's loop). 4-lane vector loops, parallel in chunks of
 * KILN_CPU_CHUNK elements. Output 0 may be input 0's buffer: every loop loads element i
 * before it stores element i, and nothing else reads it afterwards. */
#include <math.h>
#include <string.h>

#include "cpu/bcast.h"
#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "core/threadpool.h"
#include "cpu/vecmath.h"
#include "ops/fused.h"

/* ---- binary ---- */

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
    FORM_GENERAL, /* any broadcast (neither operand need be full): Y's rows (bcast.h) */
} bin_form;

typedef struct bin_job {
    kiln_bin_op op;
    bin_form form;
    bool small_a;        /* the smaller operand is A (input 0), else B */
    const float *a, *b;  /* A and B */
    float *y;            /* [numel] */
    int64_t numel, inner;
    kiln_bcast_rows bc;          /* FORM_GENERAL's rows */
    int64_t rows_per_chunk; /* FORM_GENERAL: rows per parallel chunk */
    const kiln_act *act;    /* kiln.FusedAdd's activation over each chunk once computed, or NULL */
} bin_job;

/* rows [r0, r1) of the general form, each as vector op vector, vector op value or value op vector */
static void bin_general(const bin_job *j, int64_t r0, int64_t r1)
{
    const kiln_bcast_rows *bc = &j->bc;
    int last = bc->rank - 1;
    int64_t L = bc->inner;
    for (int64_t r = r0; r < r1; r++) {
        int64_t oa, ob;
        kiln_bcast_rows_at(bc, r, &oa, &ob);
        const float *a = j->a + oa, *b = j->b + ob;
        float *y = j->y + r * L;
        if (bc->sa[last] && bc->sb[last]) bin_vv[j->op](a, b, y, L);
        else if (bc->sb[last]) bin_sv[j->op](a[0], b, y, L);
        else if (bc->sa[last]) bin_vs[j->op](a, b[0], y, L);
        else {
            bin_vs[j->op](a, b[0], y, 1);
            for (int64_t k = 1; k < L; k++) y[k] = y[0];
        }
    }
}

static void bin_chunks(void *ctx, int64_t begin, int64_t end)
{
    const bin_job *j = ctx;
    int64_t i = begin * KILN_CPU_CHUNK, e = end * KILN_CPU_CHUNK < j->numel ? end * KILN_CPU_CHUNK : j->numel;
    int64_t i0 = i;
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
    case FORM_GENERAL: {
        int64_t r0 = begin * j->rows_per_chunk, r1 = end * j->rows_per_chunk;
        if (r1 > j->bc.rows) r1 = j->bc.rows;
        bin_general(j, r0, r1);
        i0 = r0 * j->bc.inner, e = r1 * j->bc.inner;
        break;
    }
    }
    if (j->act) kiln_cpu_act_apply(j->act, j->y + i0, e - i0, 0.0f); /* while the chunk is in cache */
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

bool kiln_cpu_binary_f32(kiln_threadpool *pool, kiln_bin_op op, const kiln_value *A, const kiln_value *B, kiln_value *Y,
                         const kiln_act *act)
{
    if (!Y->numel) return true;
    /* run-time inference has checked that A and B broadcast to Y: an operand with Y's element
     * count has Y's layout */
    bin_job j = {.op = op, .a = A->data, .b = B->data, .y = Y->data, .numel = Y->numel, .inner = 1,
                 .act = act && act->kind != KILN_ACT_NONE ? act : NULL};
    bool classified;
    if (A->numel == Y->numel && B->numel == Y->numel) j.form = FORM_SAME, classified = true;
    else if (A->numel == Y->numel) classified = bin_classify(B, Y, &j.form, &j.inner);
    else if (B->numel == Y->numel) j.small_a = true, classified = bin_classify(A, Y, &j.form, &j.inner);
    else classified = false;
    if (!classified) {
        j.form = FORM_GENERAL, j.small_a = false;
        if (!kiln_bcast_rows_setup(&j.bc, A, B, Y)) return false;
        /* rows in chunks of about KILN_CPU_CHUNK elements */
        j.rows_per_chunk = KILN_CPU_CHUNK / j.bc.inner > 1 ? KILN_CPU_CHUNK / j.bc.inner : 1;
        kiln_threadpool_parallel_for(pool, (j.bc.rows + j.rows_per_chunk - 1) / j.rows_per_chunk, bin_chunks, &j);
        return true;
    }
    kiln_threadpool_parallel_for(pool, (Y->numel + KILN_CPU_CHUNK - 1) / KILN_CPU_CHUNK, bin_chunks, &j);
    return true;
}

static kiln_status bin_run(kiln_run_ctx *c, kiln_bin_op op, const kiln_act *act)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || !A || !B || A->dtype != KILN_DTYPE_FLOAT32 || B->dtype != KILN_DTYPE_FLOAT32 ||
        Y->dtype != KILN_DTYPE_FLOAT32)
        return kiln_cpu_reference(c);
    return kiln_cpu_binary_f32(kiln_run_threadpool(c), op, A, B, Y, act) ? KILN_OK : kiln_cpu_reference(c);
}

static kiln_status add_run(kiln_run_ctx *c) { return bin_run(c, KILN_BIN_ADD, NULL); }
static kiln_status sub_run(kiln_run_ctx *c) { return bin_run(c, KILN_BIN_SUB, NULL); }
static kiln_status mul_run(kiln_run_ctx *c) { return bin_run(c, KILN_BIN_MUL, NULL); }
static kiln_status div_run(kiln_run_ctx *c) { return bin_run(c, KILN_BIN_DIV, NULL); }
/* kiln.FusedAdd: act(A + B) */
static kiln_status fused_add_run(kiln_run_ctx *c) { return bin_run(c, KILN_BIN_ADD, &kiln_fused_of(kiln_run_node(c))->act); }

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
DEF_UNARY_SCALAR(sqrt_f32, sqrtf(v))

DEF_UNARY_V4(gelu_v4, v4_gelu(v))

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f")))

/* Gelu on 16 lanes: 0.5 x (1 + erf(z)), z = x / sqrt 2, erf the rational of v4_erf with FMAs;
 * where z < -2 (the sum cancels) 0.5 x erfc(-z), erfc(a) = e^(-a^2) / a R(1 / a^2) (Cephes
 * erfcf, relative error 3e-8 on [2, 10]) with a^2 and e^(-a^2) carried to near float precision. */
static inline AVX512 __m512 gelu16(__m512 x)
{
    const __m512 c = _mm512_set1_ps(0.70710678118654752f), c_lo = _mm512_set1_ps(1.2101617e-8f); /* 1/sqrt 2 - c */
    __m512 z = _mm512_mul_ps(x, c);
    __m512 e = _mm512_min_ps(_mm512_max_ps(z, _mm512_set1_ps(-4.0f)), _mm512_set1_ps(4.0f));
    __m512 e2 = _mm512_mul_ps(e, e);
    __m512 p = _mm512_set1_ps(-2.72614225801306e-10f), q = _mm512_set1_ps(-1.45660718464996e-05f);
    p = _mm512_fmadd_ps(p, e2, _mm512_set1_ps(2.77068142495902e-08f));
    p = _mm512_fmadd_ps(p, e2, _mm512_set1_ps(-2.10102402082508e-06f));
    p = _mm512_fmadd_ps(p, e2, _mm512_set1_ps(-5.69250639462346e-05f));
    p = _mm512_fmadd_ps(p, e2, _mm512_set1_ps(-7.34990630326855e-04f));
    p = _mm512_fmadd_ps(p, e2, _mm512_set1_ps(-2.95459980854025e-03f));
    p = _mm512_fmadd_ps(p, e2, _mm512_set1_ps(-1.60960333262415e-02f));
    q = _mm512_fmadd_ps(q, e2, _mm512_set1_ps(-2.13374055278905e-04f));
    q = _mm512_fmadd_ps(q, e2, _mm512_set1_ps(-1.68282697438203e-03f));
    q = _mm512_fmadd_ps(q, e2, _mm512_set1_ps(-7.37332916720468e-03f));
    q = _mm512_fmadd_ps(q, e2, _mm512_set1_ps(-1.42647390514189e-02f));
    __m512 erf = _mm512_div_ps(_mm512_mul_ps(e, p), q);
    __m512 hx = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
    __m512 y = _mm512_fmadd_ps(hx, erf, hx);
    __mmask16 low = _mm512_cmp_ps_mask(z, _mm512_set1_ps(-2.0f), _CMP_LT_OQ);
    if (!low) return y;
    /* a = -z = ah + al; a^2 = s + r; e^(-a^2) = e^(-s) (1 - r) */
    __m512 ah = _mm512_sub_ps(_mm512_setzero_ps(), z);
    __m512 al = _mm512_fmsub_ps(x, _mm512_sub_ps(_mm512_setzero_ps(), c), ah); /* -x c - ah, exact */
    al = _mm512_fnmadd_ps(x, c_lo, al);
    __m512 s = _mm512_mul_ps(ah, ah);
    __m512 r = _mm512_fmsub_ps(ah, ah, s);
    r = _mm512_fmadd_ps(_mm512_add_ps(ah, ah), al, r);
    /* e^(-s): the Cephes polynomial, 0 below ln FLT_MIN */
    __m512 t = _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), s), _mm512_set1_ps(-88.0f));
    __mmask16 tiny = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-87.33f), _CMP_LT_OQ);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 u = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), t);
    u = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), u);
    __m512 ex = _mm512_set1_ps(1.9875691500e-4f);
    ex = _mm512_fmadd_ps(ex, u, _mm512_set1_ps(1.3981999507e-3f));
    ex = _mm512_fmadd_ps(ex, u, _mm512_set1_ps(8.3334519073e-3f));
    ex = _mm512_fmadd_ps(ex, u, _mm512_set1_ps(4.1665795894e-2f));
    ex = _mm512_fmadd_ps(ex, u, _mm512_set1_ps(1.6666665459e-1f));
    ex = _mm512_fmadd_ps(ex, u, _mm512_set1_ps(5.0000001201e-1f));
    ex = _mm512_fmadd_ps(_mm512_mul_ps(ex, u), u, _mm512_add_ps(u, _mm512_set1_ps(1.0f)));
    ex = _mm512_maskz_mov_ps(~tiny, _mm512_scalef_ps(ex, n));
    ex = _mm512_fnmadd_ps(ex, r, ex);
    /* R(1 / a^2) */
    __m512 w = _mm512_div_ps(_mm512_set1_ps(1.0f), s);
    __m512 R = _mm512_set1_ps(-1.047766399936249e+1f);
    R = _mm512_fmadd_ps(R, w, _mm512_set1_ps(1.297719955372516e+1f));
    R = _mm512_fmadd_ps(R, w, _mm512_set1_ps(-7.495518717768503e+0f));
    R = _mm512_fmadd_ps(R, w, _mm512_set1_ps(2.921019019210786e+0f));
    R = _mm512_fmadd_ps(R, w, _mm512_set1_ps(-1.015265279202700e+0f));
    R = _mm512_fmadd_ps(R, w, _mm512_set1_ps(4.218463358204948e-1f));
    R = _mm512_fmadd_ps(R, w, _mm512_set1_ps(-2.820767439740514e-1f));
    R = _mm512_fmadd_ps(R, w, _mm512_set1_ps(5.641895067754075e-1f));
    __m512 tail = _mm512_mul_ps(hx, _mm512_div_ps(_mm512_mul_ps(ex, R), ah));
    return _mm512_mask_mov_ps(y, low, tail);
}

static AVX512 void gelu_avx512(const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = i + 16 <= n ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, k, gelu16(_mm512_maskz_loadu_ps(k, x + i)));
    }
}
#undef AVX512
#define HAVE_AVX512_GELU 1
#endif

void kiln_cpu_gelu(const float *x, float *y, int64_t n)
{
#ifdef HAVE_AVX512_GELU
    static int level = -1; /* 1: AVX-512; benign race, every thread computes the same value */
    int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (l < 0) {
        l = kiln_gemm_level_detect() == KILN_GEMM_LEVEL_AVX512;
        __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    }
    if (l) {
        gelu_avx512(x, y, n);
        return;
    }
#endif
    gelu_v4(x, y, n);
}

static void gelu_erf_f32(const float *x, float *y, int64_t n) { kiln_cpu_gelu(x, y, n); }

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

/* HardSwish as the Conv epilogue's activation loop computes it, in place on a copy */
static void hard_swish_f32(const float *x, float *y, int64_t n)
{
    static const kiln_act act = {.kind = KILN_ACT_HARD_SWISH};
    if (x != y) memcpy(y, x, (size_t)n * sizeof *y);
    kiln_cpu_act_apply(&act, y, n, 0.0f);
}

static kiln_status relu_run(kiln_run_ctx *c) { return unary_run(c, relu_f32); }
static kiln_status hard_swish_run(kiln_run_ctx *c) { return unary_run(c, hard_swish_f32); }
static kiln_status exp_run(kiln_run_ctx *c) { return unary_run(c, kiln_vec_exp); }
static kiln_status sigmoid_run(kiln_run_ctx *c) { return unary_run(c, kiln_vec_sigmoid); }
static kiln_status tanh_run(kiln_run_ctx *c) { return unary_run(c, kiln_vec_tanh); }
static kiln_status sqrt_run(kiln_run_ctx *c) { return unary_run(c, sqrt_f32); }
static kiln_status erf_run(kiln_run_ctx *c) { return unary_run(c, kiln_vec_erf); }
static kiln_status gelu_run(kiln_run_ctx *c) { return unary_run(c, gelu_erf_f32); }
static kiln_status gelu_tanh_run(kiln_run_ctx *c) { return unary_run(c, kiln_vec_gelu_tanh); }

static bool ew_f32(const kiln_node *n)
{
    return n->n_in >= 1 && n->n_out >= 1 && kiln_ir_is_f32(n->in[0]) && kiln_ir_is_f32(n->out[0]);
}

/* kiln.SiluMul (src/ops/fused.h): y = g * Sigmoid(g) * u as the CPU's Sigmoid and Mul kernels
 * compute the chain (kiln_vec_sigmoid, then two float products), so fusing changes no bit; over
 * the op's rows (kiln_silu_mul_rows), in pieces within a row. */
typedef struct silu_mul_job {
    kiln_silu_mul_rows r;
    float *y;
} silu_mul_job;

static void silu_mul_chunks(void *ctx, int64_t begin, int64_t end)
{
    const silu_mul_job *j = ctx;
    const kiln_silu_mul_rows *r = &j->r;
    float s[256];
    for (int64_t i = begin * KILN_CPU_CHUNK, e = end * KILN_CPU_CHUNK < r->total ? end * KILN_CPU_CHUNK : r->total;
         i < e;) {
        int64_t row = i / r->n, c = i - row * r->n, len = r->n - c;
        if (len > e - i) len = e - i;
        if (len > 256) len = 256;
        const float *g = (const float *)r->g + row * r->stride + c, *u = (const float *)r->u + row * r->stride + c;
        float *y = j->y + i;
        kiln_vec_sigmoid(g, s, len);
        for (int64_t k = 0; k < len; k++) {
            float t = g[k] * s[k];
            y[k] = t * u[k];
        }
        i += len;
    }
}

static kiln_status silu_mul_run(kiln_run_ctx *c)
{
    const kiln_value *G = kiln_run_in(c, 0), *U = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    silu_mul_job j = {.y = Y ? Y->data : NULL};
    if (!Y || G->dtype != KILN_DTYPE_FLOAT32 || Y->dtype != KILN_DTYPE_FLOAT32 || !kiln_silu_mul_rows_of(G, U, Y, &j.r))
        return kiln_cpu_reference(c);
    if (!j.r.total) return KILN_OK;
    kiln_threadpool_parallel_for(kiln_run_threadpool(c), (j.r.total + KILN_CPU_CHUNK - 1) / KILN_CPU_CHUNK,
                                 silu_mul_chunks, &j);
    return KILN_OK;
}

static kiln_kernel_fn select_silu_mul(kiln_node *n) { return ew_f32(n) ? silu_mul_run : NULL; }

/* before opset 7, binary ops broadcast by legacy attributes: the reference runs them */
static bool ew_binary(const kiln_node *n) { return ew_f32(n) && n->n_in == 2 && kiln_ir_is_f32(n->in[1]) && n->opset >= 7; }
static bool ew_unary(const kiln_node *n) { return ew_f32(n) && n->n_in == 1; }

#define SELECT(name, test, run) \
    static kiln_kernel_fn select_##name(kiln_node *n) { return test(n) ? run : NULL; }
SELECT(add, ew_binary, add_run)
SELECT(fused_add, ew_binary, fused_add_run)
SELECT(sub, ew_binary, sub_run)
SELECT(mul, ew_binary, mul_run)
SELECT(div, ew_binary, div_run)
SELECT(relu, ew_unary, relu_run)
SELECT(exp, ew_unary, exp_run)
SELECT(sigmoid, ew_unary, sigmoid_run)
SELECT(tanh, ew_unary, tanh_run)
SELECT(sqrt, ew_unary, sqrt_run)
SELECT(erf, ew_unary, erf_run)
SELECT(hard_swish, ew_unary, hard_swish_run)
#undef SELECT

static kiln_kernel_fn select_gelu(kiln_node *n)
{
    if (!ew_unary(n)) return NULL;
    const char *approx = kiln_attr_string(n, "approximate", "none");
    return !strcmp(approx, "none") ? gelu_run : !strcmp(approx, "tanh") ? gelu_tanh_run : NULL;
}

static const kiln_cpu_kernel kernels[] = {
    {"", "Add", select_add},         {"kiln", "FusedAdd", select_fused_add},
    {"", "Sub", select_sub},         {"", "Mul", select_mul},
    {"", "Div", select_div},         {"", "Relu", select_relu}, {"", "Exp", select_exp},
    {"", "Sigmoid", select_sigmoid}, {"", "Tanh", select_tanh}, {"", "Sqrt", select_sqrt},
    {"", "Erf", select_erf},         {"", "Gelu", select_gelu}, {"", "HardSwish", select_hard_swish},
    {"kiln", "SiluMul", select_silu_mul},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_ew, kernels);
