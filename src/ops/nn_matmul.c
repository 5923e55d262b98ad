/* nn_matmul.c - MatMul (numpy semantics), MatMulInteger, QLinearMatMul and Gemm. Float types
 * accumulate in double, integer types exactly in int64 (wrapping like the output type). */
#include <stdlib.h>
#include <string.h>

#include "ops/nn_internal.h"
#include "ops/op.h"
#include "ops/quant_internal.h"
#include "ops/semantics.h"
#include "ops/util.h"

/* Output of A @ B for the inputs ai, bi: broadcast batch dims, then M and N (dropped for 1-D
 * operands); K must agree. */
kiln_status kiln_nn_matmul_shape(kiln_infer_ctx *c, int ai, int bi, kiln_dtype dt)
{
    const kiln_type *a = kiln_infer_in(c, ai), *b = kiln_infer_in(c, bi);
    if (!a || !b) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs A and B");
    if (a->rank < 0 || b->rank < 0) return kiln_infer_set_out_unknown(c, 0, dt);
    if (a->rank == 0 || b->rank == 0) return kiln_infer_fail(c, KILN_ERR_SHAPE, "A and B must not be scalars");
    kiln_dim ka = a->dims[a->rank - 1], kb = b->dims[b->rank == 1 ? 0 : b->rank - 2];
    KILN_TRY(kiln_infer_require_equal(c, ka, kb, "A's last dim (K) and B's second-to-last dim (K)"));
    kiln_type ta = *a, tb = *b;
    ta.rank = a->rank > 2 ? a->rank - 2 : 0;
    tb.rank = b->rank > 2 ? b->rank - 2 : 0;
    const kiln_type *ins[2] = {&ta, &tb};
    int r;
    kiln_dim dims[KILN_MAX_RANK];
    KILN_TRY(kiln_infer_broadcast(c, 2, ins, &r, dims));
    if (a->rank >= 2) dims[r++] = a->dims[a->rank - 2];
    if (b->rank >= 2) dims[r++] = b->dims[b->rank - 1];
    return kiln_infer_set_out(c, 0, dt, r, dims);
}

/* y = a @ b over whole tensors A and B (numpy matmul), elements double or int64 (is_int). */
static void matmul_exec(const kiln_value *A, const kiln_value *B, const void *a, const void *b, void *y,
                        bool is_int)
{
    int64_t ad[KILN_MAX_RANK], bd[KILN_MAX_RANK], od[KILN_MAX_RANK] = {0}, st[2][KILN_MAX_RANK];
    int ar = A->rank, br = B->rank;
    memcpy(ad, A->dims, (size_t)ar * sizeof *ad);
    memcpy(bd, B->dims, (size_t)br * sizeof *bd);
    if (ar == 1) ad[1] = ad[0], ad[0] = 1, ar = 2;
    if (br == 1) bd[1] = 1, br = 2;
    int64_t M = ad[ar - 2], K = ad[ar - 1], N = bd[br - 1];
    int r = (ar > br ? ar : br) - 2, abr = ar - 2, bbr = br - 2;
    int64_t batches = 1;
    for (int i = 0; i < r; i++) {
        int64_t da = i - (r - abr) >= 0 ? ad[i - (r - abr)] : 1,
                db = i - (r - bbr) >= 0 ? bd[i - (r - bbr)] : 1;
        od[i] = da == 1 ? db : da;
        batches *= od[i];
    }
    kiln_bcast_strides(r, od, abr, ad, st[0]);
    kiln_bcast_strides(r, od, bbr, bd, st[1]);
    kiln_iter it;
    kiln_iter_init(&it, r, od, 2, st);
    for (int64_t bi = 0; bi < batches; bi++, kiln_iter_next(&it)) {
        if (is_int)
            kiln_nn_gemm_i64(M, N, K, (const int64_t *)a + it.off[0] * M * K, K, 1,
                        (const int64_t *)b + it.off[1] * K * N, N, 1, (int64_t *)y + bi * M * N);
        else
            kiln_nn_gemm_f64(M, N, K, (const double *)a + it.off[0] * M * K, K, 1,
                        (const double *)b + it.off[1] * K * N, N, 1, (double *)y + bi * M * N);
    }
}

/* 8-byte element buffer for n elements; NULL when out of memory. */
static void *buf_new(int64_t n)
{
    return malloc((size_t)(n > 0 ? n : 1) * 8);
}

kiln_status kiln_nn_matmul_infer(kiln_infer_ctx *c)
{
    const kiln_type *a = kiln_infer_in(c, 0);
    return kiln_nn_matmul_shape(c, 0, 1, a ? a->dtype : KILN_DTYPE_UNDEFINED);
}

kiln_status kiln_nn_matmul_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    bool is_int = kiln_dtype_is_int(A->dtype);
    void *a = kiln_nn_load_num(A, is_int);
    void *b = kiln_nn_load_num(B, is_int);
    void *y = buf_new(Y->numel);
    kiln_status st = KILN_OK;
    if (!a || !b || !y) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    } else {
        matmul_exec(A, B, a, b, y, is_int);
        if (is_int) kiln_nn_store_all_i64(Y, y);
        else kiln_nn_store_all_f64(Y, y);
    }
    free(a), free(b), free(y);
    return st;
}

/* Zero points (and QLinearMatMul scales) of A are per row, of B per column: element e of A
 * ([.., M, K]) uses parameter row(e) mod len; of B ([.., K, N]) column(e) with the batch
 * index for batched parameters. */
static int64_t a_param_index(const kiln_value *A, int64_t e, int64_t len)
{
    return (e / A->dims[A->rank - 1]) % len;
}

static int64_t b_param_index(const kiln_value *B, int64_t e, int64_t len)
{
    int64_t N = B->rank >= 2 ? B->dims[B->rank - 1] : 1,
            KN = B->rank >= 2 ? N * B->dims[B->rank - 2] : B->numel;
    return ((e / (KN ? KN : 1)) * N + e % N) % len;
}

/* Operand v minus its zero point zp (a_side: per-row indexing, else per column), as exact
 * int64 or as double (is_int false: float8 operands). */
static void *load_minus_zp(const kiln_value *v, const kiln_value *zp, bool a_side, bool is_int)
{
    void *p = kiln_nn_load_num(v, is_int);
    if (!p || !zp || !zp->numel) return p;
    for (int64_t e = 0; e < v->numel; e++) {
        int64_t k = a_side ? a_param_index(v, e, zp->numel) : b_param_index(v, e, zp->numel);
        if (is_int) ((int64_t *)p)[e] -= kiln_load_i64(zp->dtype, zp->data, k);
        else ((double *)p)[e] -= kiln_load_f64(zp->dtype, zp->data, k);
    }
    return p;
}

bool kiln_nn_mm_param_ok(const kiln_value *p, const kiln_value *X, bool a_side)
{
    if (!p || p->numel == 1) return true;
    int r = X->rank;
    int64_t rows = r >= 2 ? X->dims[r - 2] : (a_side ? 1 : X->dims[0]),
            cols = r >= 2 ? X->dims[r - 1] : (a_side ? X->dims[0] : 1);
    int64_t batches = rows * cols != 0 ? X->numel / (rows * cols) : 0, len = a_side ? rows : cols;
    return p->numel == len || p->numel == batches * len;
}

/* Fails the run when per-row / per-column parameter p does not fit X (kiln_nn_mm_param_ok). */
static kiln_status check_param(kiln_run_ctx *c, const kiln_value *p, const kiln_value *X, bool a_side,
                               const char *what)
{
    if (kiln_nn_mm_param_ok(p, X, a_side)) return KILN_OK;
    int r = X->rank;
    int64_t rows = r >= 2 ? X->dims[r - 2] : (a_side ? 1 : X->dims[0]),
            cols = r >= 2 ? X->dims[r - 1] : (a_side ? X->dims[0] : 1);
    int64_t batches = rows * cols != 0 ? X->numel / (rows * cols) : 0, len = a_side ? rows : cols;
    return kiln_run_fail(c, KILN_ERR_SHAPE, "%s has %lld elements, expected 1, %lld or %lld", what,
                         (long long)p->numel, (long long)len, (long long)(batches * len));
}

kiln_status kiln_nn_matmul_integer_infer(kiln_infer_ctx *c)
{
    return kiln_nn_matmul_shape(c, 0, 1, KILN_DTYPE_INT32);
}

/* Product of (A - a_zp) and (B - b_zp) into a new buffer *y: exact int64, or double when
 * is_int is false. */
static kiln_status zp_product(kiln_run_ctx *c, const kiln_value *A, const kiln_value *azp, const kiln_value *B,
                              const kiln_value *bzp, int64_t n_out, bool is_int, void **y)
{
    KILN_TRY(check_param(c, azp, A, true, "a_zero_point"));
    KILN_TRY(check_param(c, bzp, B, false, "b_zero_point"));
    void *a = load_minus_zp(A, azp, true, is_int), *b = load_minus_zp(B, bzp, false, is_int);
    *y = buf_new(n_out);
    kiln_status st = KILN_OK;
    if (!a || !b || !*y) {
        free(*y), *y = NULL;
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    } else {
        matmul_exec(A, B, a, b, *y, is_int);
    }
    free(a), free(b);
    return st;
}

kiln_status kiln_nn_matmul_integer_run(kiln_run_ctx *c)
{
    kiln_value *Y = kiln_run_out(c, 0);
    void *y;
    KILN_TRY(zp_product(c, kiln_run_in(c, 0), kiln_run_in(c, 2), kiln_run_in(c, 1), kiln_run_in(c, 3), Y->numel,
                        true, &y));
    kiln_nn_store_all_i64(Y, y);
    free(y);
    return KILN_OK;
}

/* QLinearMatMul inputs: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point.
 * a, b, y are int8/uint8 or (opset 21) 8-bit floats. */
kiln_status kiln_nn_qlinear_matmul_infer(kiln_infer_ctx *c)
{
    const kiln_type *yzp = kiln_infer_in(c, 7);
    if (!yzp) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs input y_zero_point");
    kiln_dtype dt = yzp->dtype;
    if (dt != KILN_DTYPE_UINT8 && dt != KILN_DTYPE_INT8 && !kiln_dtype_is_lowp_float(dt))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "y_zero_point must be int8, uint8 or an 8-bit float");
    return kiln_nn_matmul_shape(c, 0, 3, dt);
}

kiln_status kiln_nn_qlinear_matmul_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *as = kiln_run_in(c, 1), *B = kiln_run_in(c, 3),
                     *bs = kiln_run_in(c, 4);
    const kiln_value *ys = kiln_run_in(c, 6), *yzp = kiln_run_in(c, 7);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!as || !bs || !ys || ys->numel != 1 || yzp->numel != 1)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "needs scales; y_scale and y_zero_point must be scalars");
    KILN_TRY(check_param(c, as, A, true, "a_scale"));
    KILN_TRY(check_param(c, bs, B, false, "b_scale"));
    bool is_int = kiln_dtype_is_int(A->dtype) && kiln_dtype_is_int(B->dtype);
    void *y;
    KILN_TRY(zp_product(c, A, kiln_run_in(c, 2), B, kiln_run_in(c, 5), Y->numel, is_int, &y));
    /* output element (batch, i, j) uses a's scale for row i and b's for column j */
    int64_t M = A->rank >= 2 ? A->dims[A->rank - 2] : 1, N = B->rank >= 2 ? B->dims[B->rank - 1] : 1;
    double ysv = kiln_nn_param_f64(ys, 0);
    for (int64_t e = 0; e < Y->numel; e++) {
        int64_t ai = (e / N) % as->numel, bi = ((e / (M * N)) * N + e % N) % bs->numel;
        double acc = is_int ? (double)((int64_t *)y)[e] : ((double *)y)[e];
        double v = acc * kiln_nn_requant_scale(as->dtype, kiln_nn_param_f64(as, ai), kiln_nn_param_f64(bs, bi), ysv);
        /* 8-bit float outputs take the value plus zero point, rounded and saturated by the store */
        if (kiln_dtype_is_lowp_float(Y->dtype)) kiln_store_f64(Y->dtype, Y->data, e, v + kiln_nn_param_f64(yzp, 0));
        else kiln_nn_store_quantized(Y, e, v, kiln_nn_param_i64(yzp, 0));
    }
    free(y);
    return KILN_OK;
}

/* ---- Gemm: Y = alpha * A' B' + beta * C, C unidirectionally broadcast to [M, N] ---- */

kiln_status kiln_nn_gemm_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *a = kiln_infer_in(c, 0), *b = kiln_infer_in(c, 1), *cc = kiln_infer_in(c, 2);
    if (!a || !b) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs A and B");
    if (a->rank < 0 || b->rank < 0) return kiln_infer_set_out_unknown(c, 0, a->dtype);
    if (a->rank != 2 || b->rank != 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "A and B must be 2-D, have ranks %d and %d", a->rank,
                               b->rank);
    int ta = kiln_attr_int(n, "transA", 0) != 0, tb = kiln_attr_int(n, "transB", 0) != 0;
    kiln_dim dims[2] = {a->dims[ta ? 1 : 0], b->dims[tb ? 0 : 1]};
    KILN_TRY(
        kiln_infer_require_equal(c, a->dims[ta ? 0 : 1], b->dims[tb ? 1 : 0], "inner dims (K) of A and B"));
    if (cc && cc->rank >= 0) {
        if (cc->rank > 2)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "C has rank %d, at most 2 allowed", cc->rank);
        for (int i = 0; i < cc->rank; i++) {
            kiln_dim d = cc->dims[i], want = dims[2 - cc->rank + i];
            if (kiln_dim_is_const(d) && d.c == 1) continue;
            KILN_TRY(kiln_infer_require_equal(c, d, want, "C dim and output dim [M, N]"));
        }
    }
    return kiln_infer_set_out(c, 0, a->dtype, 2, dims);
}

kiln_status kiln_nn_gemm_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *C = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    bool ta = kiln_attr_int(n, "transA", 0) != 0, tb = kiln_attr_int(n, "transB", 0) != 0;
    bool is_int = kiln_dtype_is_int(A->dtype);
    double alpha = kiln_attr_float(n, "alpha", 1), beta = kiln_attr_float(n, "beta", 1);
    int64_t M = Y->dims[0], N = Y->dims[1], K = A->dims[ta ? 0 : 1];
    int64_t sam = ta ? 1 : K, sak = ta ? M : 1, sbk = tb ? 1 : N, sbn = tb ? K : 1;
    void *a = kiln_nn_load_num(A, is_int);
    void *b = kiln_nn_load_num(B, is_int);
    void *y = buf_new(Y->numel);
    kiln_status st = KILN_OK;
    if (!a || !b || !y) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    int64_t cst[2] = {0, 0};
    if (C) {
        int64_t cd[2] = {1, 1};
        for (int i = 0; i < C->rank; i++) cd[2 - C->rank + i] = C->dims[i];
        kiln_bcast_strides(2, Y->dims, 2, cd, cst);
    }
    if (is_int) kiln_nn_gemm_i64(M, N, K, a, sam, sak, b, sbk, sbn, y);
    else kiln_nn_gemm_f64(M, N, K, a, sam, sak, b, sbk, sbn, y);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            int64_t e = i * N + j, ce = i * cst[0] + j * cst[1];
            if (is_int) {
                /* alpha and beta act as values of the integer type */
                uint64_t v = (uint64_t)(int64_t)alpha * (uint64_t)((int64_t *)y)[e];
                if (C) v += (uint64_t)(int64_t)beta * (uint64_t)kiln_load_i64(C->dtype, C->data, ce);
                kiln_store_i64(Y->dtype, Y->data, e, (int64_t)v);
            } else {
                double v = alpha * ((double *)y)[e] + (C ? beta * kiln_load_f64(C->dtype, C->data, ce) : 0);
                kiln_store_f64(Y->dtype, Y->data, e, v);
            }
        }
out_free:
    free(a), free(b), free(y);
    return st;
}
