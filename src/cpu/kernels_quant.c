/* kernels_quant.c - the CPU provider's int8 kernels on the int8 GEMM (qgemm.c): MatMulInteger,
 * QLinearMatMul, DynamicQuantizeLinear and com.microsoft MatMulIntegerToFloat and
 * DynamicQuantizeMatMul, the Cast int32 -> float32 after a MatMulInteger and per-tensor DequantizeLinear. A constant 2-D B is packed once at compile time (n->kernel_state).
 * Every case not covered (batched B, per-row A zero points, 8-bit floats) runs the reference. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "cpu/dynquant.h"
#include "cpu/kernels.h"
#include "cpu/requant.h"
#include "cpu/qgemm.h"
#include "ops/contrib_quant.h"
#include "ops/nn_internal.h"
#include "ops/util.h"


static bool is_8bit(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

static bool ir_is(const kiln_ir_value *v, kiln_dtype dt)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.dtype == dt;
}

static bool ir_8bit(const kiln_ir_value *v)
{
    return ir_is(v, KILN_DTYPE_UINT8) || ir_is(v, KILN_DTYPE_INT8);
}

static kiln_status dynquant_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0), *ys = kiln_run_out(c, 1), *yzp = kiln_run_out(c, 2);
    float mn, mx;
    kiln_threadpool *pool = kiln_run_threadpool(c);
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || !kiln_cpu_range_f32(pool, X->data, X->numel, &mn, &mx))
        return kiln_cpu_reference(c);
    /* the reference's formula (cast_quant.c), step by step */
    float scale = (mx == mn ? 1.0f : mx - mn) / 255.0f;
    float zp = rintf(fminf(255.0f, fmaxf(0.0f, 0.0f - mn / scale)));
    kiln_cpu_quantize(pool, X->data, X->numel, scale, (int32_t)zp, false, Y->data);
    if (ys) ((float *)ys->data)[0] = scale;
    if (yzp) ((uint8_t *)yzp->data)[0] = (uint8_t)zp;
    return KILN_OK;
}

/* ---- the matmuls ---- */

static void packed_free(void *p) { kiln_qgemm_packed_b_free(p); }

/* Packs input `bi` when it is a constant 2-D 8-bit B (the original stays: int8 weights are small). */
static void pack_b(kiln_node *n, int bi)
{
    const kiln_value *w = kiln_ir_constant(n->in[bi]);
    if (!w || !is_8bit(w->dtype) || w->rank != 2 || !w->numel) return;
    kiln_qgemm_ctx ctx = {0};
    kiln_qgemm_packed_b *pb = NULL;
    if (kiln_qgemm_packed_b_create(&ctx, w->dims[0], w->dims[1], w->data, w->dims[1], w->dtype == KILN_DTYPE_INT8, &pb))
        return; /* runs unpacked */
    n->kernel_state = pb;
    n->kernel_state_free = packed_free;
}

/* What every quantized matmul kernel shares: C = (A - a_zp)(B - b_zp) over A's rows. */
typedef struct qmm {
    int64_t rows, N, K;
    kiln_qgemm_args args;
    int32_t bzp[1];    /* a scalar zero point's value; per-column ones live in bzp_buf */
    int32_t *bzp_buf;  /* [N] from scratch, or NULL */
} qmm;

/* Sets q up for A [.., M, K] (8-bit, quantized values a with zero point azp) times B [K, N] (input bi)
 * with zero points bzp (NULL, 1 or N values); false when this case is the reference's. */
static bool qmm_setup(kiln_run_ctx *c, qmm *q, const kiln_value *A, const void *a, bool a_signed, int32_t azp,
                      const kiln_value *B, int bi, const kiln_value *bzp)
{
    const kiln_node *n = kiln_run_node(c);
    if (A->rank < 1 || B->rank != 2 || !is_8bit(B->dtype) || A->dims[A->rank - 1] != B->dims[0]) return false;
    int64_t K = B->dims[0], N = B->dims[1];
    if (bzp && (bzp->dtype != B->dtype || (bzp->numel != 1 && bzp->numel != N))) return false;
    memset(q, 0, sizeof *q);
    q->K = K, q->N = N;
    q->rows = K ? A->numel / K : 0;
    const kiln_qgemm_packed_b *pb = n->kernel_state && B == n->in[bi]->init ? n->kernel_state : NULL;
    q->args = (kiln_qgemm_args){.M = q->rows, .N = N, .K = K, .A = a, .lda = K, .a_signed = a_signed, .a_zp = azp,
                                .B = B->data, .ldb = N, .b_signed = B->dtype == KILN_DTYPE_INT8, .pb = pb};
    if (bzp && bzp->numel == N && N > 1) {
        q->bzp_buf = kiln_scratch_get(kiln_run_scratch(c), (size_t)N * sizeof(int32_t));
        if (!q->bzp_buf) return false;
        for (int64_t j = 0; j < N; j++) q->bzp_buf[j] = (int32_t)kiln_load_i64(bzp->dtype, bzp->data, j);
        q->args.b_zp = q->bzp_buf, q->args.n_bzp = N;
    } else if (bzp) {
        q->bzp[0] = (int32_t)kiln_load_i64(bzp->dtype, bzp->data, 0);
        q->args.b_zp = q->bzp, q->args.n_bzp = 1;
    }
    return true;
}

static kiln_status qmm_run(kiln_run_ctx *c, qmm *q, int32_t *C, kiln_qgemm_tile_fn tile, void *tile_ctx)
{
    q->args.C = C;
    q->args.ldc = q->N;
    q->args.tile = tile;
    q->args.tile_ctx = tile_ctx;
    kiln_qgemm_ctx ctx = {.pool = kiln_run_threadpool(c), .scratch = kiln_run_scratch(c)};
    kiln_status st = q->rows && q->N ? kiln_qgemm(&ctx, &q->args) : KILN_OK;
    kiln_scratch_put(kiln_run_scratch(c), q->bzp_buf);
    if (st)
        return kiln_run_fail(c, st, "int8 GEMM [%lld x %lld] x [%lld x %lld] failed (%s)", (long long)q->rows,
                             (long long)q->K, (long long)q->K, (long long)q->N, kiln_status_name(st));
    return KILN_OK;
}

/* A scalar zero point's value (0 when absent); false when it has more than one element. */
static bool scalar_zp(const kiln_value *zp, kiln_dtype dt, int32_t *v)
{
    *v = 0;
    if (!zp) return true;
    if (zp->numel != 1 || zp->dtype != dt) return false;
    *v = (int32_t)kiln_load_i64(zp->dtype, zp->data, 0);
    return true;
}

static kiln_status matmul_integer_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    int32_t azp;
    qmm q = {0};
    if (!Y || !is_8bit(A->dtype) || !scalar_zp(kiln_run_in(c, 2), A->dtype, &azp) ||
        !qmm_setup(c, &q, A, A->data, A->dtype == KILN_DTYPE_INT8, azp, B, 1, kiln_run_in(c, 3)))
        return kiln_cpu_reference(c);
    return qmm_run(c, &q, Y->data, NULL, NULL);
}

/* The float epilogue: y = float(c) * (a_scale * b_scale[j]) + bias[j], in place over C. */
typedef struct to_float {
    float as;
    const float *bs; /* [1] or [N] */
    bool bs_per_col;
    const float *bias; /* [N] or NULL */
} to_float;

static void to_float_tile(void *ctx, int32_t *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n)
{
    const to_float *t = ctx;
    for (int64_t i = 0; i < m; i++)
        kiln_cpu_dequant_row(c + i * ldc, n, t->as, t->bs + (t->bs_per_col ? j0 : 0), t->bs_per_col,
                             t->bias ? t->bias + j0 : NULL, (float *)(c + i * ldc));
}

/* Whether b_scale and bias fit B [K, N] (float32; 1 or N scales, N biases). */
static bool float_params(const kiln_value *bs, const kiln_value *bias, int64_t N, to_float *t)
{
    if (!bs || bs->dtype != KILN_DTYPE_FLOAT32 || (bs->numel != 1 && bs->numel != N)) return false;
    if (bias && (bias->dtype != KILN_DTYPE_FLOAT32 || bias->numel != N)) return false;
    t->bs = bs->data;
    t->bs_per_col = bs->numel != 1;
    t->bias = bias ? bias->data : NULL;
    return true;
}

static kiln_status matmul_integer_to_float_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *as = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    int32_t azp;
    qmm q = {0};
    to_float t;
    if (!Y || !is_8bit(A->dtype) || !as || as->dtype != KILN_DTYPE_FLOAT32 || as->numel != 1 ||
        !scalar_zp(kiln_run_in(c, 4), A->dtype, &azp) ||
        !qmm_setup(c, &q, A, A->data, A->dtype == KILN_DTYPE_INT8, azp, B, 1, kiln_run_in(c, 5)) ||
        !float_params(kiln_run_in(c, 3), kiln_run_in(c, 6), q.N, &t)) {
        if (q.bzp_buf) kiln_scratch_put(kiln_run_scratch(c), q.bzp_buf);
        return kiln_cpu_reference(c);
    }
    t.as = ((const float *)as->data)[0];
    return qmm_run(c, &q, Y->data, to_float_tile, &t);
}

static kiln_status dynamic_quantize_matmul_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    float mn, mx, scale;
    int32_t zp;
    kiln_threadpool *pool = kiln_run_threadpool(c);
    if (!Y || A->dtype != KILN_DTYPE_FLOAT32 || !kiln_cpu_range_f32(pool, A->data, A->numel, &mn, &mx))
        return kiln_cpu_reference(c);
    kiln_dynquant_params(mn, mx, &scale, &zp);
    kiln_scratch *s = kiln_run_scratch(c);
    uint8_t *a = kiln_scratch_get(s, (size_t)A->numel + 1);
    if (!a) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory quantizing A (%lld elements)", (long long)A->numel);
    qmm q = {0};
    to_float t;
    if (!qmm_setup(c, &q, A, a, false, zp, B, 1, kiln_run_in(c, 3)) ||
        !float_params(kiln_run_in(c, 2), kiln_run_in(c, 4), q.N, &t)) {
        if (q.bzp_buf) kiln_scratch_put(s, q.bzp_buf);
        kiln_scratch_put(s, a);
        return kiln_cpu_reference(c);
    }
    kiln_cpu_quantize(pool, A->data, A->numel, scale, zp, false, a);
    t.as = scale;
    kiln_status st = qmm_run(c, &q, Y->data, to_float_tile, &t);
    kiln_scratch_put(s, a);
    return st;
}

/* QLinearMatMul's requantization as ONNX Runtime does it: multiplier (a_scale * b_scale[j]) /
 * y_scale in float32, float(c) times it, rounded half to even, plus y_zero_point, saturated. */
typedef struct requant {
    float as, ys;
    const float *bs;
    bool bs_per_col;
    int32_t yzp, lo, hi;
    void *y; /* [rows, N] uint8 or int8 */
    int64_t N;
} requant;

static void requant_tile(void *ctx, int32_t *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n)
{
    const requant *r = ctx;
    float lo = (float)(r->lo - r->yzp), hi = (float)(r->hi - r->yzp);
    enum { COLS = 256 };
    float mult[COLS];
    for (int64_t jb = 0; jb < n; jb += COLS) {
        int64_t nb = n - jb < COLS ? n - jb : COLS;
        for (int64_t j = 0; j < nb; j++) mult[j] = r->as * r->bs[r->bs_per_col ? j0 + jb + j : 0] / r->ys;
        kiln_cpu_requant_rows(c + jb, ldc, m, nb, mult, NULL, lo, hi, r->yzp, (uint8_t *)r->y + i0 * r->N + j0 + jb, r->N);
    }
}

static kiln_status qlinear_matmul_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *as = kiln_run_in(c, 1), *B = kiln_run_in(c, 3), *bs = kiln_run_in(c, 4);
    const kiln_value *ys = kiln_run_in(c, 6), *yzp = kiln_run_in(c, 7);
    kiln_value *Y = kiln_run_out(c, 0);
    int32_t azp, yz;
    qmm q = {0};
    if (!Y || !is_8bit(A->dtype) || !is_8bit(Y->dtype) || !as || as->dtype != KILN_DTYPE_FLOAT32 || as->numel != 1 ||
        !ys || ys->dtype != KILN_DTYPE_FLOAT32 || ys->numel != 1 || !scalar_zp(kiln_run_in(c, 2), A->dtype, &azp) ||
        !yzp || !scalar_zp(yzp, Y->dtype, &yz) || !bs || bs->dtype != KILN_DTYPE_FLOAT32 ||
        !qmm_setup(c, &q, A, A->data, A->dtype == KILN_DTYPE_INT8, azp, B, 3, kiln_run_in(c, 5)) ||
        (bs->numel != 1 && bs->numel != q.N)) {
        if (q.bzp_buf) kiln_scratch_put(kiln_run_scratch(c), q.bzp_buf);
        return kiln_cpu_reference(c);
    }
    requant r = {.as = ((const float *)as->data)[0], .ys = ((const float *)ys->data)[0], .bs = bs->data,
                 .bs_per_col = bs->numel != 1, .yzp = yz, .lo = Y->dtype == KILN_DTYPE_INT8 ? -128 : 0,
                 .hi = Y->dtype == KILN_DTYPE_INT8 ? 127 : 255, .y = Y->data, .N = q.N};
    kiln_scratch *s = kiln_run_scratch(c);
    int32_t *acc = kiln_scratch_get(s, (size_t)(Y->numel + 1) * sizeof *acc);
    if (!acc) {
        if (q.bzp_buf) kiln_scratch_put(s, q.bzp_buf);
        return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for %lld accumulators", (long long)Y->numel);
    }
    kiln_status st = qmm_run(c, &q, acc, requant_tile, &r);
    kiln_scratch_put(s, acc);
    return st;
}

/* Cast int32 -> float32, what follows each MatMulInteger in a dynamically quantized model
 * (round to nearest, as the reference's conversion). */
KILN_VECTORIZE static kiln_status cast_i32_f32_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->dtype != KILN_DTYPE_INT32 || Y->dtype != KILN_DTYPE_FLOAT32 || X->numel != Y->numel)
        return kiln_cpu_reference(c);
    const int32_t *x = X->data;
    float *y = Y->data;
    for (int64_t i = 0; i < X->numel; i++) y[i] = (float)x[i];
    return KILN_OK;
}

/* DequantizeLinear of 8-bit x with one scale (float32) and zero point: y = (x - zp) * scale in
 * float32, which is the reference's double product rounded once (both are exact before it). */
typedef struct dequant_job {
    const void *x;
    float *y;
    int64_t n;
    int32_t zp;
    float scale;
    bool x_signed;
} dequant_job;

enum { DQ_CHUNK = 1 << 15 };

KILN_VECTORIZE static void dequant_chunks(void *ctx, int64_t begin, int64_t end)
{
    const dequant_job *j = ctx;
    int64_t i0 = begin * DQ_CHUNK, i1 = end * DQ_CHUNK < j->n ? end * DQ_CHUNK : j->n;
    float *y = j->y, scale = j->scale;
    int32_t z = j->zp;
    if (j->x_signed) {
        const int8_t *x = j->x;
        for (int64_t i = i0; i < i1; i++) y[i] = (float)((int32_t)x[i] - z) * scale;
    } else {
        const uint8_t *x = j->x;
        for (int64_t i = i0; i < i1; i++) y[i] = (float)((int32_t)x[i] - z) * scale;
    }
}

static kiln_status dequant_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *s = kiln_run_in(c, 1), *zp = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    int32_t z;
    if (!Y || !is_8bit(X->dtype) || Y->dtype != KILN_DTYPE_FLOAT32 || !s || s->dtype != KILN_DTYPE_FLOAT32 ||
        s->numel != 1 || !scalar_zp(zp, X->dtype, &z) || X->numel != Y->numel)
        return kiln_cpu_reference(c);
    dequant_job j = {.x = X->data, .y = Y->data, .n = X->numel, .zp = z, .scale = ((const float *)s->data)[0],
                     .x_signed = X->dtype == KILN_DTYPE_INT8};
    kiln_threadpool_parallel_for(j.n <= DQ_CHUNK ? NULL : kiln_run_threadpool(c), (j.n + DQ_CHUNK - 1) / DQ_CHUNK,
                                 dequant_chunks, &j);
    return KILN_OK;
}

static kiln_kernel_fn select_dynquant(kiln_node *n) { return ir_is(n->in[0], KILN_DTYPE_FLOAT32) ? dynquant_run : NULL; }

/* Cast int32 -> float32 (MatMulInteger's result, where it is not fused) */
static kiln_kernel_fn select_cast(kiln_node *n)
{
    return n->n_in == 1 && ir_is(n->in[0], KILN_DTYPE_INT32) && n->n_out == 1 && ir_is(n->out[0], KILN_DTYPE_FLOAT32)
               ? cast_i32_f32_run
               : NULL;
}

static kiln_kernel_fn select_dequant(kiln_node *n)
{
    return n->n_in >= 2 && ir_8bit(n->in[0]) && ir_is(n->in[1], KILN_DTYPE_FLOAT32) && n->n_out == 1 &&
                   ir_is(n->out[0], KILN_DTYPE_FLOAT32)
               ? dequant_run
               : NULL;
}

static kiln_kernel_fn select_matmul_integer(kiln_node *n)
{
    if (n->n_in < 2 || !ir_8bit(n->in[0]) || !ir_8bit(n->in[1])) return NULL;
    pack_b(n, 1);
    return matmul_integer_run;
}

static kiln_kernel_fn select_qlinear_matmul(kiln_node *n)
{
    if (n->n_in < 8 || !ir_8bit(n->in[0]) || !ir_8bit(n->in[3])) return NULL;
    pack_b(n, 3);
    return qlinear_matmul_run;
}

static kiln_kernel_fn select_matmul_integer_to_float(kiln_node *n)
{
    if (n->n_in < 2 || !ir_8bit(n->in[0]) || !ir_8bit(n->in[1])) return NULL;
    pack_b(n, 1);
    return matmul_integer_to_float_run;
}

static kiln_kernel_fn select_dynamic_quantize_matmul(kiln_node *n)
{
    if (n->n_in < 2 || !ir_is(n->in[0], KILN_DTYPE_FLOAT32) || !ir_8bit(n->in[1])) return NULL;
    pack_b(n, 1);
    return dynamic_quantize_matmul_run;
}

static const kiln_cpu_kernel kernels[] = {
    {"", "DynamicQuantizeLinear", select_dynquant},
    {"", "Cast", select_cast},
    {"", "DequantizeLinear", select_dequant},
    {"", "MatMulInteger", select_matmul_integer},
    {"", "QLinearMatMul", select_qlinear_matmul},
    {"com.microsoft", "MatMulIntegerToFloat", select_matmul_integer_to_float},
    {"com.microsoft", "DynamicQuantizeMatMul", select_dynamic_quantize_matmul},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_quant, kernels);
