/* kernels_norm.c - float32 row kernels over contiguous trailing axes: Softmax (the normalised
 * axes are the last ones), LayerNormalization (Scale and B over exactly the normalised axes),
 * ReduceMean (one contiguous run of axes: rows when it is the last ones, else columns of each
 * outer slice). Rows are spread over the thread pool; sums
 * and means accumulate in double, variances and softmax sums in float partial sums per block of
 * 256 added in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "cpu/kernels.h"
#include "cpu/target.h"
#include "cpu/vecmath.h"
#include "ops/util.h"

/* Rows per parallel chunk so that a chunk holds about KILN_CPU_CHUNK elements. */
static int64_t rows_per_chunk(int64_t cols) { return cols >= KILN_CPU_CHUNK ? 1 : KILN_CPU_CHUNK / (cols ? cols : 1); }

/* A loop over `rows` rows of `cols` elements: row(j, r) for each, in chunks of per_chunk rows. */
typedef struct row_job {
    void (*row)(const struct row_job *j, int64_t r);
    int64_t rows, cols, per_chunk;
    const float *x, *scale, *bias;
    float *y, *mean, *inv;
    double eps;
} row_job;

static void row_chunks(void *ctx, int64_t begin, int64_t end)
{
    const row_job *j = ctx;
    int64_t r1 = end * j->per_chunk < j->rows ? end * j->per_chunk : j->rows;
    for (int64_t r = begin * j->per_chunk; r < r1; r++) j->row(j, r);
}

static void run_rows(kiln_run_ctx *c, row_job *j)
{
    j->per_chunk = rows_per_chunk(j->cols);
    kiln_threadpool_parallel_for(kiln_run_threadpool(c), (j->rows + j->per_chunk - 1) / j->per_chunk, row_chunks, j);
}

/* Sum of x[0..n) in double (four chains: the rows' means must hold for large offsets). */
static double sum_f64(const float *x, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += x[i];
        s1 += x[i + 1];
        s2 += x[i + 2];
        s3 += x[i + 3];
    }
    for (; i < n; i++) s0 += x[i];
    return (s0 + s1) + (s2 + s3);
}

/* ---- Softmax: y = e^(x - max) / sum over each row ---- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SOFTMAX16 1
KILN_TARGET_BEGIN("avx512f")
#include "cpu/act512.h"
#include "cpu/avx512_util.h"

/* The maximum of x[0..n) on 16 lanes, the tail masked (-inf lanes); NaN skipped, as softmax_row's
 * scalar comparison skips it (vmaxps returns its second operand, the running maximum, when the
 * first is NaN). */
static float max_row16(const float *x, int64_t n)
{
    __m512 v = _mm512_set1_ps(-INFINITY);
    for (int64_t k = 0; k < n; k += 16)
        v = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), kiln_lanes(n - k), x + k), v);
    return _mm512_reduce_max_ps(v);
}

/* softmax_row's exponentials and sum on 16 lanes, the tail masked (-inf lanes add 0); the sum of
 * each 256 values in float, of the blocks in double, as the 4-lane loop */
static void softmax_row16(const float *x, float *y, int64_t n, float mx)
{
    const __m512 m = _mm512_set1_ps(mx);
    double sum = 0;
    for (int64_t i = 0; i < n; i += 256) {
        int64_t e = n - i > 256 ? i + 256 : n;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t k = i; k < e; k += 16) {
            __mmask16 l = kiln_lanes(e - k);
            __m512 v = _mm512_sub_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), l, x + k), m);
            v = (__m512)kiln_a16_exp_flush((kiln_a16f)v);
            _mm512_mask_storeu_ps(y + k, l, v);
            acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(l, v));
        }
        sum += _mm512_reduce_add_ps(acc);
    }
    const __m512 s = _mm512_set1_ps((float)(1.0 / sum));
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 l = kiln_lanes(n - k);
        _mm512_mask_storeu_ps(y + k, l, _mm512_mul_ps(_mm512_maskz_loadu_ps(l, y + k), s));
    }
}
KILN_TARGET_END
#endif

static void softmax_row(const row_job *j, int64_t r)
{
    const float *x = j->x + r * j->cols;
    float *y = j->y + r * j->cols;
    int64_t n = j->cols, i = 0;
    float mx = -INFINITY;
#if HAVE_SOFTMAX16
    bool wide = n >= 16 && __builtin_cpu_supports("avx512f");
    if (wide) mx = max_row16(x, n);
    else
#endif
        for (int64_t k = 0; k < n; k++) mx = x[k] > mx ? x[k] : mx;
    if (mx == INFINITY) { /* the reference's arithmetic: e^(inf - inf) makes the row NaN */
        for (int64_t k = 0; k < n; k++) y[k] = NAN;
        return;
    }
#if HAVE_SOFTMAX16
    if (wide) {
        softmax_row16(x, y, n, mx);
        return;
    }
#endif
    v4f m4 = v4_splat(mx);
    double sum = 0;
    while (i < n) {
        int64_t e = n - i > 256 ? i + 256 : n;
        v4f acc = v4_splat(0.0f);
        for (; i + 4 <= e; i += 4) {
            v4f v = v4_exp_flush(v4_load(x + i) - m4);
            v4_store(y + i, v);
            acc += v;
        }
        float t = v4_hsum(acc);
        if (i < e) {
            float b[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
            memcpy(b, x + i, (size_t)(e - i) * sizeof *b);
            v4f v = v4_exp_flush(v4_load(b) - m4);
            v4_store(b, v);
            memcpy(y + i, b, (size_t)(e - i) * sizeof *b);
            t += v4_hsum(v);
            i = e;
        }
        sum += t;
    }
    v4f s4 = v4_splat((float)(1.0 / sum));
    for (i = 0; i + 4 <= n; i += 4) v4_store(y + i, v4_load(y + i) * s4);
    for (; i < n; i++) y[i] *= s4[0];
}

static kiln_status softmax_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    int opset = kiln_run_opset(c), axis;
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || Y->numel != X->numel ||
        !kiln_axis_norm(kiln_attr_int(nd, "axis", opset < 13 ? 1 : -1), X->rank, &axis))
        return kiln_cpu_reference(c);
    /* from opset 13 the one axis; before, X coerced to 2-D at axis: all trailing axes */
    for (int k = axis + 1; k < X->rank && opset >= 13; k++)
        if (X->dims[k] != 1) return kiln_cpu_reference(c);
    int64_t cols = 1;
    for (int k = axis; k < X->rank; k++) cols *= X->dims[k];
    if (!X->numel) return KILN_OK;
    row_job j = {.row = softmax_row, .rows = X->numel / cols, .cols = cols, .x = X->data, .y = Y->data};
    run_rows(c, &j);
    return KILN_OK;
}

/* ---- LayerNormalization over the axes from `axis` on ---- */

static void layernorm_row(const row_job *j, int64_t r)
{
    const float *x = j->x + r * j->cols;
    float *y = j->y + r * j->cols;
    int64_t n = j->cols, i;
    double m = sum_f64(x, n) / (double)n, v = 0;
    /* x - m as (x - mh) - ml with m = mh + ml: exact enough when the mean is large */
    float mh = (float)m, ml = (float)(m - mh);
    v4f mh4 = v4_splat(mh), ml4 = v4_splat(ml);
    for (i = 0; i < n;) { /* two passes like the reference: the mean, then the squares about it */
        int64_t e = n - i > 256 ? i + 256 : n;
        v4f acc = v4_splat(0.0f);
        for (; i + 4 <= e; i += 4) {
            v4f d = (v4_load(x + i) - mh4) - ml4;
            acc += d * d;
        }
        float t = v4_hsum(acc);
        for (; i < e; i++) t += ((x[i] - mh) - ml) * ((x[i] - mh) - ml);
        v += t;
    }
    double s = 1.0 / sqrt(v / (double)n + j->eps);
    float sf = (float)s;
    v4f s4 = v4_splat(sf);
    const float *g = j->scale, *b = j->bias;
    for (i = 0; i + 4 <= n; i += 4) {
        v4f o = ((v4_load(x + i) - mh4) - ml4) * s4 * v4_load(g + i);
        if (b) o += v4_load(b + i);
        v4_store(y + i, o);
    }
    for (; i < n; i++) y[i] = ((x[i] - mh) - ml) * sf * g[i] + (b ? b[i] : 0.0f);
    if (j->mean) j->mean[r] = (float)m;
    if (j->inv) j->inv[r] = sf;
}

/* Whether v holds exactly X's dims from `axis` on (leading 1s allowed): one value per column. */
static bool per_column(const kiln_value *v, const kiln_value *X, int axis, int64_t cols)
{
    if (!v || v->dtype != KILN_DTYPE_FLOAT32 || v->numel != cols || v->rank > X->rank) return false;
    for (int k = 0; k < v->rank; k++) {
        int p = X->rank - v->rank + k;
        if (v->dims[k] != (p >= axis ? X->dims[p] : 1)) return false;
    }
    return true;
}

static kiln_status layernorm_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *S = kiln_run_in(c, 1), *B = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0), *M = kiln_run_out(c, 1), *I = kiln_run_out(c, 2);
    int axis;
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || !X->numel || Y->numel != X->numel ||
        !kiln_axis_norm(kiln_attr_int(nd, "axis", -1), X->rank, &axis))
        return kiln_cpu_reference(c);
    int64_t cols = 1;
    for (int k = axis; k < X->rank; k++) cols *= X->dims[k];
    int64_t rows = X->numel / cols;
    if (!per_column(S, X, axis, cols) || (B && !per_column(B, X, axis, cols)) ||
        (M && (M->dtype != KILN_DTYPE_FLOAT32 || M->numel != rows)) ||
        (I && (I->dtype != KILN_DTYPE_FLOAT32 || I->numel != rows)) || kiln_run_has_out(c, 1) != !!M ||
        kiln_run_has_out(c, 2) != !!I)
        return kiln_cpu_reference(c);
    row_job j = {.row = layernorm_row, .rows = rows, .cols = cols, .x = X->data, .scale = S->data,
                 .bias = B ? B->data : NULL, .y = Y->data, .mean = M ? M->data : NULL, .inv = I ? I->data : NULL,
                 .eps = kiln_attr_float(nd, "epsilon", 1e-5f)};
    run_rows(c, &j);
    return KILN_OK;
}

/* ---- ReduceMean over one contiguous run of axes ---- */

static void mean_row(const row_job *j, int64_t r) { j->y[r] = (float)(sum_f64(j->x + r * j->cols, j->cols) / (double)j->cols); }

/* Mean over a middle block of axes: X [outer, r, inner] -> Y [outer, inner], summed in double
 * like the reference, one outer slice per task. */
typedef struct mid_job {
    const float *x;
    float *y;
    int64_t r, inner;
    kiln_status st;
} mid_job;

static void mean_mid(void *ctx, int64_t begin, int64_t end)
{
    mid_job *j = ctx;
    double *acc = malloc((size_t)j->inner * sizeof *acc);
    if (!acc) {
        __atomic_store_n(&j->st, KILN_ERR_NOMEM, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t o = begin; o < end; o++) {
        const float *x = j->x + o * j->r * j->inner;
        for (int64_t i = 0; i < j->inner; i++) acc[i] = 0.0;
        for (int64_t q = 0; q < j->r; q++)
            for (int64_t i = 0; i < j->inner; i++) acc[i] += x[q * j->inner + i];
        for (int64_t i = 0; i < j->inner; i++) j->y[o * j->inner + i] = (float)(acc[i] / (double)j->r);
    }
    free(acc);
}

static kiln_status reduce_mean_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *A = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || !X->numel) return kiln_cpu_reference(c);
    bool mask[KILN_MAX_RANK] = {false};
    int na = 0;
    const int64_t *attr = NULL;
    if (kiln_run_opset(c) >= 18) {
        if (!A || A->kind != KILN_VALUE_TENSOR || A->rank != 1 || A->dtype != KILN_DTYPE_INT64)
            return kiln_cpu_reference(c);
        na = (int)A->numel;
        attr = A->data;
    } else {
        attr = kiln_attr_ints(nd, "axes", &na);
    }
    if (na < 1 || na > X->rank) return kiln_cpu_reference(c); /* all axes, or an error to report */
    for (int i = 0; i < na; i++) {
        int k;
        if (!kiln_axis_norm(attr[i], X->rank, &k) || mask[k]) return kiln_cpu_reference(c);
        mask[k] = true;
    }
    /* the reduced axes must be one contiguous run [a0, a1] */
    int a0 = 0;
    while (!mask[a0]) a0++;
    int a1 = a0 + na - 1;
    for (int k = a0; k <= a1; k++)
        if (!mask[k]) return kiln_cpu_reference(c);
    int64_t outer = 1, cols = 1, inner = 1;
    for (int k = 0; k < a0; k++) outer *= X->dims[k];
    for (int k = a0; k <= a1; k++) cols *= X->dims[k];
    for (int k = a1 + 1; k < X->rank; k++) inner *= X->dims[k];
    if (!cols || Y->numel != outer * inner || Y->dtype != KILN_DTYPE_FLOAT32) return kiln_cpu_reference(c);
    if (inner == 1) {
        row_job j = {.row = mean_row, .rows = Y->numel, .cols = cols, .x = X->data, .y = Y->data};
        run_rows(c, &j);
        return KILN_OK;
    }
    mid_job j = {X->data, Y->data, cols, inner, KILN_OK};
    kiln_threadpool_parallel_for(kiln_run_threadpool(c), outer, mean_mid, &j);
    return j.st ? kiln_run_fail(c, j.st, "out of memory") : KILN_OK;
}

static bool norm_f32(const kiln_node *n)
{
    return n->n_in >= 1 && n->n_out >= 1 && kiln_ir_is_f32(n->in[0]) && kiln_ir_is_f32(n->out[0]);
}

static kiln_kernel_fn select_softmax(kiln_node *n) { return norm_f32(n) ? softmax_run : NULL; }
static kiln_kernel_fn select_reduce_mean(kiln_node *n) { return norm_f32(n) ? reduce_mean_run : NULL; }
static kiln_kernel_fn select_layernorm(kiln_node *n)
{
    return norm_f32(n) && n->n_in >= 2 && kiln_ir_is_f32(n->in[1]) ? layernorm_run : NULL;
}

static const kiln_cpu_kernel kernels[] = {
    {"", "Softmax", select_softmax},
    {"", "LayerNormalization", select_layernorm},
    {"", "ReduceMean", select_reduce_mean},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_norm, kernels);
