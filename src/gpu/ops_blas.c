/* ops_blas.c - GPU provider family 'blas': MatMul, Gemm and the Einsum equations that are a
 * (transposed, batched) matrix product, on cuBLAS (hipBLAS with KILN_HIP) through one strided
 * batched GEMM call per group of batches. float32 keeps full fp32 arithmetic (no TF32);
 * float16 and bfloat16 accumulate in fp32 and store in their own type.
 *
 * Everything is row-major in kiln and column-major in BLAS: a product Y = A @ B is issued as
 * Y^T = B^T A^T (or, when Y's layout asks for it, as Y = A B read column-major), with each
 * operand's transpose flag and leading dimension taken from its element strides. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/blas.h"
#include "gpu/gpu.h"
#include "gpu/k_blas.h"
#include "gpu/kshape.h"
#include "gpu/ops_core.h"
#include "ir/graph.h"
#include "ops/fused.h"

/* BLAS element type of a kiln dtype; false for the dtypes this family does not take. */
static bool blas_dtype(kiln_dtype dt, gpuDataType_t *t)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT32: *t = GPU_R_32F; return true;
    case KILN_DTYPE_FLOAT16: *t = GPU_R_16F; return true;
    case KILN_DTYPE_BFLOAT16: *t = GPU_R_16BF; return true;
    default: return false;
    }
}

/* supports() helper: input i's dtype is one of blas_dtype's. */
static bool float_input(const kiln_node *n, int i, char *why, size_t size)
{
    gpuDataType_t t;
    if (i >= n->n_in || !n->in[i]) return true;
    kiln_dtype dt = n->in[i]->type.dtype;
    if (blas_dtype(dt, &t)) return true;
    snprintf(why, size, "input %d dtype %d (float32, float16, bfloat16 only)", i, (int)dt);
    return false;
}

/* One product Y = A @ B of row-major-strided operands: per matrix, element strides of its two
 * dims; `batch` products at strides a_b, b_b, y_b (0: operand shared by the batch); the whole
 * repeated over the n_outer dims `outer` at element strides a_o, b_o, y_o (looped on the host,
 * one BLAS call each). All sizes > 0. */
typedef struct mm_desc {
    int64_t M, N, K;
    int64_t a_m, a_k, b_k, b_n, y_m, y_n;
    int64_t batch, a_b, b_b, y_b;
    int n_outer;
    int64_t outer[KILN_MAX_RANK], a_o[KILN_MAX_RANK], b_o[KILN_MAX_RANK], y_o[KILN_MAX_RANK];
} mm_desc;

/* A column-major operand of the BLAS call: rows x cols, element (r, c) at r*sr + c*sc. */
typedef struct blas_mat {
    gpublasOperation_t op;
    int64_t ld;
} blas_mat;

/* How BLAS reads a rows x cols matrix with element strides sr, sc: as stored (op N, unit row
 * stride) or transposed (op T, unit column stride). A size-1 dim's stride does not matter.
 * False when neither stride is 1. */
static bool blas_mat_of(int64_t rows, int64_t sr, int64_t cols, int64_t sc, blas_mat *m)
{
    if (sr == 1 || rows == 1) {
        m->op = GPUBLAS_OP_N;
        m->ld = cols == 1 ? rows : sc;
        return m->ld >= rows && m->ld <= INT_MAX;
    }
    if (sc == 1 || cols == 1) {
        m->op = GPUBLAS_OP_T;
        m->ld = rows == 1 ? cols : sr;
        return m->ld >= cols && m->ld <= INT_MAX;
    }
    return false;
}

/* A planned BLAS call: C (m x n, column-major, ldc) = op(P) (m x k) op(Q) (k x n), P and Q
 * being A and B in one order or the other. */
typedef struct mm_plan {
    bool swap;         /* P = A, Q = B (C = Y read column-major); else P = B, Q = A (C = Y^T) */
    int m, n, k, batch;
    blas_mat p, q;
    int64_t ldc;
    int64_t sp, sq, sc; /* batch strides of P, Q, C */
} mm_plan;

static bool fits_int(int64_t v)
{
    return v >= 0 && v <= INT_MAX;
}

/* Plans d as one BLAS call shape; false when its strides or sizes are beyond BLAS (the caller
 * falls back). */
static bool mm_plan_of(const mm_desc *d, mm_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    if (!fits_int(d->M) || !fits_int(d->N) || !fits_int(d->K) || !fits_int(d->batch)) return false;
    pl->k = (int)d->K, pl->batch = (int)d->batch;
    if (d->y_n == 1 || d->N == 1) {
        /* Y^T (N x M) = B^T (N x K) A^T (K x M) */
        pl->swap = false;
        pl->m = (int)d->N, pl->n = (int)d->M;
        pl->ldc = d->M == 1 ? d->N : d->y_m;
        pl->sp = d->b_b, pl->sq = d->a_b;
        if (!blas_mat_of(d->N, d->b_n, d->K, d->b_k, &pl->p)) return false;
        if (!blas_mat_of(d->K, d->a_k, d->M, d->a_m, &pl->q)) return false;
    } else if (d->y_m == 1 || d->M == 1) {
        /* Y (M x N, column-major) = A (M x K) B (K x N) */
        pl->swap = true;
        pl->m = (int)d->M, pl->n = (int)d->N;
        pl->ldc = d->N == 1 ? d->M : d->y_n;
        pl->sp = d->a_b, pl->sq = d->b_b;
        if (!blas_mat_of(d->M, d->a_m, d->K, d->a_k, &pl->p)) return false;
        if (!blas_mat_of(d->K, d->b_k, d->N, d->b_n, &pl->q)) return false;
    } else {
        return false;
    }
    pl->sc = d->y_b;
    return pl->ldc >= pl->m && pl->ldc <= INT_MAX;
}

#if !defined(KILN_HIP)
/* A product cuBLASLt runs for one call shape: its descriptors and algorithm, kept in the run
 * context's memo shared by the nodes (kiln_gpu_memo_shared_get), so that a repeated shape sets up
 * nothing and the layers of a model share one entry. */
typedef struct lt_mm {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t p, q, c;
    cublasLtMatmulAlgo_t algo;
    bool refused;    /* cuBLASLt declined the shape: cuBLAS */
    bool tuned;      /* the heuristics were asked for this shape; else it runs its class's algorithm (lt_find) */
    int64_t made_in; /* the run (kiln_gpu_run_serial) that made it */
} lt_mm;

static void lt_mm_free(void *v)
{
    lt_mm *l = v;
    if (!l) return;
    if (l->p) kiln_blaslt.layout_destroy(l->p);
    if (l->q) kiln_blaslt.layout_destroy(l->q);
    if (l->c) kiln_blaslt.layout_destroy(l->c);
    if (l->op) kiln_blaslt.desc_destroy(l->op);
    free(l);
}

/* The layout of an operand BLAS reads as rows x cols through m (stored transposed for op T),
 * `batch` of them `stride` elements apart. */
static bool lt_layout(cublasLtMatrixLayout_t *l, gpuDataType_t t, const blas_mat *m, int rows, int cols, int batch,
                      int64_t stride)
{
    bool n = m->op == GPUBLAS_OP_N;
    if (kiln_blaslt.layout_create(l, t, (uint64_t)(n ? rows : cols), (uint64_t)(n ? cols : rows), m->ld))
        return false;
    if (batch == 1) return true;
    int32_t count = batch;
    return !kiln_blaslt.layout_set(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count) &&
           !kiln_blaslt.layout_set(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
}

/* Descriptors for the planned call, with a bias along C's rows (the BIAS epilogue) when asked;
 * no algorithm yet. NULL when cuBLASLt does not take them. */
static lt_mm *lt_make(gpuDataType_t t, const mm_plan *pl, bool bias)
{
    lt_mm *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    cublasOperation_t ta = pl->p.op, tb = pl->q.op;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    if (kiln_blaslt.desc_create(&l->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
        kiln_blaslt.desc_set(l->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
        kiln_blaslt.desc_set(l->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ||
        (bias && kiln_blaslt.desc_set(l->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) ||
        !lt_layout(&l->p, t, &pl->p, pl->m, pl->k, pl->batch, pl->sp) ||
        !lt_layout(&l->q, t, &pl->q, pl->k, pl->n, pl->batch, pl->sq) ||
        !lt_layout(&l->c, t, &(blas_mat){GPUBLAS_OP_N, pl->ldc}, pl->m, pl->n, pl->batch, pl->sc)) {
        lt_mm_free(l);
        return NULL;
    }
    return l;
}

/* The heuristics' first choice for l's call with pointers aligned to `align` bytes and at most
 * ws_max bytes of workspace into l->algo (l->tuned); false when they have none. */
static bool lt_tune(cublasLtHandle_t h, lt_mm *l, uint32_t align, size_t ws_max)
{
    cublasLtMatmulPreference_t pref;
    if (kiln_blaslt.pref_create(&pref)) return false;
    uint64_t wmax = ws_max;
    int found = 0;
    cublasLtMatmulHeuristicResult_t res;
    bool ok = !kiln_blaslt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wmax, sizeof wmax) &&
              !kiln_blaslt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof align) &&
              !kiln_blaslt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof align) &&
              !kiln_blaslt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, sizeof align) &&
              !kiln_blaslt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, sizeof align) &&
              !kiln_blaslt.heuristic(h, l->op, l->p, l->q, l->c, l->c, pref, 1, &res, &found) && found > 0 &&
              res.state == CUBLAS_STATUS_SUCCESS;
    kiln_blaslt.pref_destroy(pref);
    if (ok) l->algo = res.algo, l->tuned = true;
    return ok;
}

/* The largest power of two (up to 256) dividing every address. */
static uint32_t lt_align(const void *const *ptr, int n)
{
    uintptr_t all = 256;
    for (int i = 0; i < n; i++) all |= (uintptr_t)ptr[i];
    return (uint32_t)(all & (~all + 1));
}

/* The cuBLASLt state of the planned call into *out, made on a miss; NULL when cuBLASLt is not
 * there or does not take the call (cuBLAS then). A shape not seen yet first takes the algorithm
 * of the last shape of its class (the same call but for the dims a batch size moves: n, the
 * batch count, their strides), without asking the heuristics: they cost milliseconds for a new
 * shape, which made a first run at a new batch size 4-11x a repeat. A later run asks them, once
 * (a recorded run: they queue nothing). */
static kiln_status lt_find(kiln_run_ctx *c, kiln_dtype dt, const mm_plan *pl, bool bias, uint32_t align, void **h,
                           void **ws, size_t *ws_size, lt_mm **out)
{
    *out = NULL;
    KILN_TRY(kiln_gpu_blaslt(c, h, ws, ws_size));
    gpuDataType_t t;
    if (!*h || !blas_dtype(dt, &t)) return KILN_OK;
    int64_t key[15] = {1, dt, pl->p.op, pl->q.op, pl->m, pl->n, pl->k, pl->p.ld, pl->q.ld, pl->ldc,
                       pl->sp, pl->sq, pl->sc, pl->batch, (int64_t)align * 2 + bias};
    int nk = (int)(sizeof key / sizeof *key);
    lt_mm *l = kiln_gpu_memo_shared_get(c, key, nk);
    if (l && !l->refused && !l->tuned && l->made_in != kiln_gpu_run_serial(c)) {
        lt_tune((cublasLtHandle_t)*h, l, align, *ws_size); /* without a choice the class's stays */
        l->tuned = true;                                     /* asked once either way */
    }
    if (l) {
        *out = l->refused ? NULL : l;
        return KILN_OK;
    }
    int64_t any[15];
    memcpy(any, key, sizeof any);
    any[0] = 2, any[5] = any[10] = any[11] = any[12] = any[13] = -1;
    cublasLtMatmulAlgo_t *known = kiln_gpu_memo_shared_get(c, any, nk);
    l = lt_make(t, pl, bias);
    if (l && known) {
        l->algo = *known, l->made_in = kiln_gpu_run_serial(c);
    } else if (l && lt_tune((cublasLtHandle_t)*h, l, align, *ws_size)) {
        if ((known = malloc(sizeof *known))) {
            *known = l->algo;
            kiln_gpu_memo_shared_put(c, any, nk, known, free); /* first: a later put may evict it, never l */
        }
    } else {
        lt_mm_free(l);
        if (!(l = calloc(1, sizeof *l))) return KILN_OK; /* out of host memory: cuBLAS this time */
        l->refused = true;
    }
    kiln_gpu_memo_shared_put(c, key, nk, l, lt_mm_free);
    *out = l->refused ? NULL : l;
    return KILN_OK;
}

/* One call of l; a class's algorithm that this shape does not take gives way to the heuristics'
 * (then, without one, *declined: the caller takes cuBLAS). */
static kiln_status lt_run(kiln_run_ctx *c, lt_mm *l, void *h, void *ws, size_t ws_size, uint32_t align,
                          const float *alpha, const void *p, const void *q, const float *beta, void *y, const mm_plan *pl,
                          bool *declined)
{
    *declined = false;
    for (;;) {
        cublasStatus_t st = kiln_blaslt.matmul((cublasLtHandle_t)h, l->op, alpha, p, l->p, q, l->q, beta, y, l->c, y,
                                               l->c, &l->algo, ws, ws_size, kiln_gpu_stream(c));
        if (st == CUBLAS_STATUS_SUCCESS) return KILN_OK;
        if ((st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) && !l->tuned) {
            if (lt_tune((cublasLtHandle_t)h, l, align, ws_size)) continue;
            l->refused = *declined = true;
            return KILN_OK;
        }
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "cuBLASLt matmul (m %d, n %d, k %d, batch %d): %s", pl->m, pl->n,
                             pl->k, pl->batch, gpublasGetStatusString(st));
    }
}
#endif

/* Queues Y = alpha * A @ B + beta * Y as planned, one call per outer index, on cuBLASLt where it
 * takes the call, else cuBLAS. With bias (pl->swap false: one value per row of the BLAS call,
 * per column of Y) Y also gets the bias added, in cuBLASLt's epilogue; when cuBLASLt does not
 * take it, nothing is queued and *fused is false (the caller adds the bias itself). */
static kiln_status mm_exec(kiln_run_ctx *c, kiln_dtype dt, const void *A, const void *B, void *Y,
                           const mm_desc *d, const mm_plan *pl, float alpha, float beta, const void *bias, bool *fused)
{
    gpuDataType_t t;
    if (fused) *fused = false;
    if (!blas_dtype(dt, &t)) return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "dtype %d on cuBLAS", (int)dt);
    size_t es = kiln_dtype_size(dt);
    int64_t idx[KILN_MAX_RANK] = {0}, calls = 1;
    for (int i = 0; i < d->n_outer; i++) calls *= d->outer[i];
#if !defined(KILN_HIP)
    /* the alignment every call's pointers share: the bases and the outer steps */
    const void *ptrs[3 + 3 * KILN_MAX_RANK + 1];
    int np = 0;
    ptrs[np++] = A, ptrs[np++] = B, ptrs[np++] = Y;
    for (int i = 0; i < d->n_outer; i++) {
        ptrs[np++] = (const void *)(uintptr_t)((size_t)d->a_o[i] * es);
        ptrs[np++] = (const void *)(uintptr_t)((size_t)d->b_o[i] * es);
        ptrs[np++] = (const void *)(uintptr_t)((size_t)d->y_o[i] * es);
    }
    if (bias) ptrs[np++] = bias;
    void *lh = NULL, *ws = NULL;
    size_t ws_size = 0;
    lt_mm *l = NULL;
    uint32_t align = lt_align(ptrs, np);
    if (!bias || !pl->swap) KILN_TRY(lt_find(c, dt, pl, bias != NULL, align, &lh, &ws, &ws_size, &l));
    if (l && bias && kiln_blaslt.desc_set(l->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)) l = NULL;
    if (!l && bias) return KILN_OK;
#else
    if (bias) return KILN_OK;
#endif
    void *hv = NULL;
    KILN_TRY(kiln_gpu_blas(c, &hv));
    gpublasHandle_t h = (gpublasHandle_t)hv;
    for (int64_t call = 0; call < calls; call++) {
        int64_t ao = 0, bo = 0, yo = 0;
        for (int i = 0; i < d->n_outer; i++) ao += idx[i] * d->a_o[i], bo += idx[i] * d->b_o[i], yo += idx[i] * d->y_o[i];
        const char *a = (const char *)A + (size_t)ao * es, *b = (const char *)B + (size_t)bo * es;
        const void *p = pl->swap ? (const void *)a : (const void *)b, *q = pl->swap ? (const void *)b : (const void *)a;
        void *y = (char *)Y + (size_t)yo * es;
#if !defined(KILN_HIP)
        bool declined = false;
        if (l) KILN_TRY(lt_run(c, l, lh, ws, ws_size, align, &alpha, p, q, &beta, y, pl, &declined));
        if (declined && bias) return KILN_OK; /* on the first call (every call takes one path): the caller's bias */
        if (declined) l = NULL;
        if (!l)
#endif
        {
            gpublasStatus_t st = gpublasGemmStridedBatchedEx(
                h, pl->p.op, pl->q.op, pl->m, pl->n, pl->k, &alpha, p, t, (int)pl->p.ld, (long long)pl->sp, q, t,
                (int)pl->q.ld, (long long)pl->sq, &beta, y, t, (int)pl->ldc, (long long)pl->sc, pl->batch,
                GPUBLAS_COMPUTE_32F, GPUBLAS_GEMM_DEFAULT);
            if (st != GPUBLAS_STATUS_SUCCESS)
                return kiln_run_fail(c, KILN_ERR_RUNTIME,
                                     "cuBLAS GemmStridedBatchedEx (m %d, n %d, k %d, batch %d): %s", pl->m, pl->n,
                                     pl->k, pl->batch, gpublasGetStatusString(st));
        }
        for (int i = d->n_outer - 1; i >= 0; i--) {
            if (++idx[i] < d->outer[i]) break;
            idx[i] = 0;
        }
    }
    if (fused) *fused = bias != NULL;
    return KILN_OK;
}

/* Y = 0 (a product with K == 0). */
static kiln_status zero_out(kiln_run_ctx *c, kiln_value *Y)
{
    return kiln_gpu_check(c, gpuMemsetAsync(Y->data, 0, Y->nbytes, kiln_gpu_stream(c)), "memset");
}

/* ---- MatMul (numpy semantics) ---- */

static bool matmul_supports(const kiln_node *n, char *why, size_t size)
{
    return float_input(n, 0, why, size) && float_input(n, 1, why, size);
}

/* The batch dims of a MatMul as a strided batch plus outer dims: size-1 dims dropped, and
 * neighbours merged where all three operands step through them as through one dim. The
 * innermost merged dim is the BLAS batch. */
static void matmul_batches(int r, const int64_t *od, int64_t st[3][KILN_MAX_RANK], mm_desc *d)
{
    int64_t dims[KILN_MAX_RANK], s[3][KILN_MAX_RANK];
    int n = 0;
    for (int i = 0; i < r; i++) {
        if (od[i] == 1) continue;
        if (n > 0 && st[0][i] * od[i] == s[0][n - 1] && st[1][i] * od[i] == s[1][n - 1] &&
            st[2][i] * od[i] == s[2][n - 1]) {
            dims[n - 1] *= od[i];
            for (int o = 0; o < 3; o++) s[o][n - 1] = st[o][i];
            continue;
        }
        dims[n] = od[i];
        for (int o = 0; o < 3; o++) s[o][n] = st[o][i];
        n++;
    }
    d->batch = 1, d->a_b = d->b_b = d->y_b = 0, d->n_outer = 0;
    if (n == 0) return;
    d->batch = dims[n - 1], d->a_b = s[0][n - 1], d->b_b = s[1][n - 1], d->y_b = s[2][n - 1];
    d->n_outer = n - 1;
    for (int i = 0; i < n - 1; i++) d->outer[i] = dims[i], d->a_o[i] = s[0][i], d->b_o[i] = s[1][i], d->y_o[i] = s[2][i];
}

/* MatMul(A, B) -> Y (numpy semantics) as one planned BLAS call shape; false when the product
 * is beyond BLAS. d->K == 0 (Y is zeros) leaves pl unset. */
static bool matmul_plan(const kiln_value *A, const kiln_value *B, mm_desc *pd, mm_plan *ppl)
{
    if (A->rank < 1 || B->rank < 1 || A->rank > KILN_MAX_RANK || B->rank > KILN_MAX_RANK) return false;
    int64_t ad[KILN_MAX_RANK + 1], bd[KILN_MAX_RANK + 1];
    int ar = A->rank, br = B->rank;
    memcpy(ad, A->dims, (size_t)ar * sizeof *ad);
    memcpy(bd, B->dims, (size_t)br * sizeof *bd);
    if (ar == 1) ad[1] = ad[0], ad[0] = 1, ar = 2;
    if (br == 1) bd[1] = 1, br = 2;
    mm_desc d;
    memset(&d, 0, sizeof d);
    d.M = ad[ar - 2], d.K = ad[ar - 1], d.N = bd[br - 1];
    if (d.K == 0) {
        *pd = d;
        return true;
    }
    d.a_m = d.K, d.a_k = 1, d.b_k = d.N, d.b_n = 1, d.y_m = d.N, d.y_n = 1;
    /* batch dims, right-aligned and broadcast; strides in elements, 0 where broadcast */
    int r = (ar > br ? ar : br) - 2, abr = ar - 2, bbr = br - 2;
    int64_t od[KILN_MAX_RANK], st[3][KILN_MAX_RANK];
    for (int i = 0; i < r; i++) {
        int ia = i - (r - abr), ib = i - (r - bbr);
        int64_t da = ia >= 0 ? ad[ia] : 1, db = ib >= 0 ? bd[ib] : 1;
        od[i] = da == 1 ? db : da;
    }
    int64_t sa = d.M * d.K, sb = d.K * d.N, sy = d.M * d.N;
    for (int i = r - 1; i >= 0; i--) {
        int ia = i - (r - abr), ib = i - (r - bbr);
        int64_t da = ia >= 0 ? ad[ia] : 1, db = ib >= 0 ? bd[ib] : 1;
        st[0][i] = da == 1 ? 0 : sa, st[1][i] = db == 1 ? 0 : sb, st[2][i] = sy;
        sa *= da, sb *= db, sy *= od[i];
    }
    matmul_batches(r, od, st, &d);
    /* B shared by a contiguous batch of A: one taller product [batch * M, K] @ [K, N] */
    if (d.n_outer == 0 && d.batch > 1 && d.b_b == 0 && d.a_b == d.M * d.K && d.y_b == d.M * d.N &&
        d.batch * d.M <= INT_MAX)
        d.M *= d.batch, d.batch = 1, d.a_b = d.y_b = 0;
    *pd = d;
    return mm_plan_of(&d, ppl);
}

static kiln_status matmul_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y->numel) return KILN_OK;
    mm_desc d;
    mm_plan pl;
    if (!matmul_plan(A, B, &d, &pl)) return kiln_gpu_fallback(c);
    if (d.K == 0) return zero_out(c, Y);
    return mm_exec(c, A->dtype, A->data, B->data, Y->data, &d, &pl, 1.0f, 0.0f, NULL, NULL);
}

/* ---- kiln.FusedMatMul (fuse_matmul_bias.c): MatMul(A, W) + bias along Y's last axis ---- */

static bool fused_matmul_supports(const kiln_node *n, char *why, size_t size)
{
    if (kiln_fused_of(n)->act.kind != KILN_ACT_NONE) {
        snprintf(why, size, "an activation (the GPU pass fuses none)");
        return false;
    }
    return float_input(n, 0, why, size) && float_input(n, 1, why, size) && float_input(n, 2, why, size);
}

static kiln_status fused_matmul_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    const kiln_value *bias = kiln_fused_of(kiln_run_node(c))->bias ? kiln_run_in(c, 2) : NULL;
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y->numel) return KILN_OK;
    mm_desc d;
    mm_plan pl;
    if (!matmul_plan(A, B, &d, &pl) || B->dtype != A->dtype || Y->dtype != A->dtype ||
        (bias && (bias->dtype != A->dtype || bias->numel != d.N)))
        return kiln_gpu_fallback(c);
    bool fused = false;
    if (d.K > 0) KILN_TRY(mm_exec(c, A->dtype, A->data, B->data, Y->data, &d, &pl, 1.0f, 0.0f, bias ? bias->data : NULL,
                                  &fused));
    if (fused) return KILN_OK;
    /* no epilogue: Y = the bias broadcast over the rows, then the product added to it */
    if (!bias) return d.K > 0 ? KILN_OK : zero_out(c, Y);
    kiln_gpu_shape bs;
    kiln_gpu_shape_broadcast(&bs, Y->rank, Y->dims, bias->rank, bias->dims);
    KILN_TRY(kiln_gpu_check(c, kiln_gpu_blas_bcast_scale(Y->dtype, bias->data, bs, 1.0f, Y->data, kiln_gpu_stream(c)),
                            "blas_bcast_scale"));
    if (d.K == 0) return KILN_OK;
    return mm_exec(c, A->dtype, A->data, B->data, Y->data, &d, &pl, 1.0f, 1.0f, NULL, NULL);
}

/* Y = alpha A B + beta Y over broadcast batches (ops_core.h). */
kiln_status kiln_gpu_matmul_run(kiln_run_ctx *c, const kiln_gpu_mm *m, bool *done)
{
    *done = false;
    if (m->yb < 0 || m->yb > KILN_MAX_RANK) return KILN_OK;
    mm_desc d;
    memset(&d, 0, sizeof d);
    d.M = m->M, d.N = m->N, d.K = m->K;
    d.a_m = m->a_m, d.a_k = m->a_k, d.b_k = m->b_k, d.b_n = m->b_n, d.y_m = m->N, d.y_n = 1;
    int64_t ynum = m->M * m->N;
    for (int i = 0; i < m->yb; i++) ynum *= m->ydims[i];
    if (ynum == 0) {
        *done = true;
        return KILN_OK;
    }
    if (d.K == 0) {
        if (m->beta != 0.0f && m->beta != 1.0f) return KILN_OK;
        *done = true;
        if (m->beta == 1.0f) return KILN_OK;
        return kiln_gpu_check(c, gpuMemsetAsync(m->Y, 0, (size_t)ynum * kiln_dtype_size(m->dtype), kiln_gpu_stream(c)),
                              "memset");
    }
    int64_t od[KILN_MAX_RANK], st[3][KILN_MAX_RANK], sy = m->M * m->N;
    for (int i = m->yb - 1; i >= 0; i--) {
        od[i] = m->ydims[i];
        st[0][i] = m->ydims[i] == 1 ? 0 : m->a_bs[i];
        st[1][i] = m->ydims[i] == 1 ? 0 : m->b_bs[i];
        st[2][i] = sy;
        sy *= m->ydims[i];
    }
    matmul_batches(m->yb, od, st, &d);
    /* B shared by a contiguous batch of A: one taller product [batch * M, K] @ [K, N] */
    if (d.n_outer == 0 && d.batch > 1 && d.b_b == 0 && d.a_k == 1 && d.a_m == d.K && d.a_b == d.M * d.K &&
        d.y_b == d.M * d.N && d.batch * d.M <= INT_MAX)
        d.M *= d.batch, d.batch = 1, d.a_b = d.y_b = 0;
    mm_plan pl;
    if (!mm_plan_of(&d, &pl)) return KILN_OK;
    *done = true;
    return mm_exec(c, m->dtype, m->A, m->B, m->Y, &d, &pl, m->alpha, m->beta, NULL, NULL);
}

/* ---- Gemm: Y = alpha * A' B' + beta * C, C broadcast to [M, N] ---- */

static bool gemm_supports(const kiln_node *n, char *why, size_t size)
{
    return float_input(n, 0, why, size) && float_input(n, 1, why, size) && float_input(n, 2, why, size);
}

kiln_status kiln_gpu_gemm_core(kiln_run_ctx *c, bool *done)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *C = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    *done = false;
    if (!Y || !B) return KILN_OK;
    if (!Y->numel) {
        *done = true;
        return KILN_OK;
    }
    if (A->rank != 2 || B->rank != 2 || Y->rank != 2 || (C && C->rank > 2)) return KILN_OK;
    bool ta = kiln_attr_int(n, "transA", 0) != 0, tb = kiln_attr_int(n, "transB", 0) != 0;
    float alpha = kiln_attr_float(n, "alpha", 1), beta = kiln_attr_float(n, "beta", 1);
    bool with_c = C && C->numel > 0 && beta != 0;
    mm_desc d;
    memset(&d, 0, sizeof d);
    d.M = Y->dims[0], d.N = Y->dims[1], d.K = A->dims[ta ? 0 : 1];
    /* A is [K, M] when transposed: element (m, k) at k * M + m */
    d.a_m = ta ? 1 : d.K, d.a_k = ta ? d.M : 1;
    d.b_k = tb ? 1 : d.N, d.b_n = tb ? d.K : 1;
    d.y_m = d.N, d.y_n = 1;
    d.batch = 1;
    kiln_gpu_shape cs;
    if (with_c) kiln_gpu_shape_broadcast(&cs, 2, Y->dims, C->rank, C->dims);
    gpuStream_t s = kiln_gpu_stream(c);
    if (d.K == 0) {
        *done = true;
        if (!with_c) return zero_out(c, Y);
        return kiln_gpu_check(c, kiln_gpu_blas_bcast_scale(Y->dtype, C->data, cs, beta, Y->data, s),
                              "blas_bcast_scale");
    }
    mm_plan pl;
    if (!mm_plan_of(&d, &pl)) return KILN_OK;
    *done = true;
    if (with_c)
        KILN_TRY(kiln_gpu_check(c, kiln_gpu_blas_bcast_scale(Y->dtype, C->data, cs, 1.0f, Y->data, s),
                                "blas_bcast_scale"));
    return mm_exec(c, A->dtype, A->data, B->data, Y->data, &d, &pl, alpha, with_c ? beta : 0.0f, NULL, NULL);
}

static kiln_status gemm_run(kiln_run_ctx *c)
{
    bool done;
    KILN_TRY(kiln_gpu_gemm_core(c, &done));
    return done ? KILN_OK : kiln_gpu_fallback(c);
}

/* ---- Einsum of two operands that is one batched matrix product ---- */

/* Label roles: in both operands and the output (batch), in A and the output (M), in B and the
 * output (N), in both operands only (K, summed). */
enum { EIN_BATCH, EIN_M, EIN_N, EIN_K, EIN_ROLES };

#define EIN_TERM_MAX KILN_MAX_RANK

/* A parsed two-operand equation: the labels of A, B and Y, and each letter's role. */
typedef struct ein_mm {
    int len[3];                 /* labels in A, B, Y */
    char lab[3][EIN_TERM_MAX];  /* letters */
    int role[128];              /* by letter; -1 when unused */
} ein_mm;

static bool ein_letter(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
}

/* Reads one term (letters only) of [s, end) into term t. */
static bool ein_term(ein_mm *e, int t, const char *s, const char *end, char *why, size_t size)
{
    e->len[t] = 0;
    for (; s < end; s++) {
        if (*s == '.') {
            snprintf(why, size, "ellipsis in the equation");
            return false;
        }
        if (!ein_letter(*s)) {
            snprintf(why, size, "malformed equation near '%c'", *s);
            return false;
        }
        if (e->len[t] >= EIN_TERM_MAX) {
            snprintf(why, size, "term of more than %d labels", EIN_TERM_MAX);
            return false;
        }
        for (int i = 0; i < e->len[t]; i++)
            if (e->lab[t][i] == *s) {
                snprintf(why, size, "label '%c' repeated in one term (diagonal)", *s);
                return false;
            }
        e->lab[t][e->len[t]++] = *s;
    }
    return true;
}

/* Whether term t holds the letters of role r as one run, in the same order as term ref does. */
static bool ein_group_ok(const ein_mm *e, int t, int ref, int r)
{
    char want[EIN_TERM_MAX], got[EIN_TERM_MAX];
    int nw = 0, ng = 0, first = -1, last = -1;
    for (int i = 0; i < e->len[ref]; i++)
        if (e->role[(int)e->lab[ref][i]] == r) want[nw++] = e->lab[ref][i];
    for (int i = 0; i < e->len[t]; i++)
        if (e->role[(int)e->lab[t][i]] == r) {
            if (first < 0) first = i;
            last = i;
            got[ng++] = e->lab[t][i];
        }
    if (ng != nw || memcmp(want, got, (size_t)ng)) return false;
    return ng == 0 || last - first + 1 == ng;
}

/* Whether term t's innermost label has role r1 or r2, or the term has no label of either
 * (its matrix is 1 x 1: no stride matters). */
static bool ein_inner_ok(const ein_mm *e, int t, int r1, int r2)
{
    bool any = false;
    for (int i = 0; i < e->len[t]; i++) {
        int r = e->role[(int)e->lab[t][i]];
        any = any || r == r1 || r == r2;
    }
    if (!any) return true;
    int last = e->role[(int)e->lab[t][e->len[t] - 1]];
    return last == r1 || last == r2;
}

/* Parses eq as "A,B->Y" (or implicit output) and checks that it is one batched product: no
 * ellipsis, no repeated label, no label summed within one operand, each role's labels one run
 * in the same order in every term holding them, and unit-stride dims a BLAS operand can use. */
static bool ein_mm_parse(const char *eq, ein_mm *e, char *why, size_t size)
{
    char buf[256];
    size_t len = 0;
    for (const char *p = eq; *p; p++) {
        if (*p == ' ') continue;
        if (len + 1 >= sizeof buf) {
            snprintf(why, size, "equation too long");
            return false;
        }
        buf[len++] = *p;
    }
    buf[len] = 0;
    memset(e, 0, sizeof *e);
    for (int i = 0; i < 128; i++) e->role[i] = -1;
    char *arrow = strstr(buf, "->"), *lhs_end = arrow ? arrow : buf + len;
    char *comma = memchr(buf, ',', (size_t)(lhs_end - buf));
    if (!comma || memchr(comma + 1, ',', (size_t)(lhs_end - comma - 1))) {
        snprintf(why, size, "equation is not of two operands");
        return false;
    }
    if (!ein_term(e, 0, buf, comma, why, size) || !ein_term(e, 1, comma + 1, lhs_end, why, size)) return false;
    int count[128] = {0};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < e->len[t]; i++) count[(int)e->lab[t][i]]++;
    if (arrow) {
        if (!ein_term(e, 2, arrow + 2, buf + len, why, size)) return false;
    } else {
        /* implicit output: the labels used once, in ASCII order */
        e->len[2] = 0;
        for (int ch = 'A'; ch <= 'z'; ch++)
            if (ein_letter((char)ch) && count[ch] == 1) {
                if (e->len[2] >= EIN_TERM_MAX) {
                    snprintf(why, size, "output rank too large");
                    return false;
                }
                e->lab[2][e->len[2]++] = (char)ch;
            }
    }
    bool in_y[128] = {false};
    for (int i = 0; i < e->len[2]; i++) {
        int ch = e->lab[2][i];
        if (!count[ch]) {
            snprintf(why, size, "output label '%c' is in no input", ch);
            return false;
        }
        in_y[ch] = true;
    }
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < e->len[t]; i++) {
            int ch = e->lab[t][i];
            bool both = count[ch] == 2;
            if (!both && !in_y[ch]) {
                snprintf(why, size, "label '%c' summed within one operand", ch);
                return false;
            }
            e->role[ch] = both ? (in_y[ch] ? EIN_BATCH : EIN_K) : (t == 0 ? EIN_M : EIN_N);
        }
    /* each role's run: batch in A, B, Y; M in A, Y; N in B, Y; K in A, B */
    static const int terms[EIN_ROLES][3] = {{0, 1, 2}, {0, 2, -1}, {1, 2, -1}, {0, 1, -1}};
    static const char *const names[EIN_ROLES] = {"batch", "M", "N", "K (summed)"};
    for (int r = 0; r < EIN_ROLES; r++)
        for (int j = 0; j < 3 && terms[r][j] >= 0; j++)
            if (!ein_group_ok(e, terms[r][j], terms[r][0], r)) {
                snprintf(why, size, "%s labels not one run in the same order in every term", names[r]);
                return false;
            }
    if (!e->len[0] || !e->len[1]) {
        snprintf(why, size, "scalar operand");
        return false;
    }
    if (!ein_inner_ok(e, 0, EIN_M, EIN_K) || !ein_inner_ok(e, 1, EIN_K, EIN_N) || !ein_inner_ok(e, 2, EIN_M, EIN_N)) {
        snprintf(why, size, "a batch label is the innermost dim of a term");
        return false;
    }
    return true;
}

static bool einsum_supports(const kiln_node *n, char *why, size_t size)
{
    if (n->n_in != 2 || !n->in[0] || !n->in[1]) {
        snprintf(why, size, "%d operands (2 only)", n->n_in);
        return false;
    }
    if (!float_input(n, 0, why, size) || !float_input(n, 1, why, size)) return false;
    const char *eq = kiln_attr_string(n, "equation", NULL);
    if (!eq) {
        snprintf(why, size, "no equation");
        return false;
    }
    ein_mm e;
    if (!ein_mm_parse(eq, &e, why, size)) return false;
    for (int t = 0; t < 2; t++)
        if (n->in[t]->type.rank >= 0 && n->in[t]->type.rank != e.len[t]) {
            snprintf(why, size, "input %d has rank %d, the equation names %d dims", t, n->in[t]->type.rank, e.len[t]);
            return false;
        }
    return true;
}

/* Size and element stride of role r's run in a row-major tensor of dims labelled lab. */
static void ein_group(const ein_mm *e, const char *lab, int rank, const int64_t *dims, int r, int64_t *size,
                      int64_t *stride)
{
    int64_t st = 1;
    *size = 1, *stride = 0;
    bool seen = false;
    for (int i = rank - 1; i >= 0; i--) {
        if (e->role[(int)lab[i]] == r) {
            if (!seen) *stride = st, seen = true;
            *size *= dims[i];
        }
        st *= dims[i];
    }
}

static kiln_status einsum_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    ein_mm e;
    char why[128];
    const char *eq = kiln_attr_string(n, "equation", "");
    if (!ein_mm_parse(eq, &e, why, sizeof why) || A->rank != e.len[0] || B->rank != e.len[1] || Y->rank != e.len[2])
        return kiln_gpu_fallback(c);
    /* every label one size across the terms (the reference would broadcast a 1 otherwise) */
    int64_t lsize[128];
    for (int i = 0; i < 128; i++) lsize[i] = -1;
    const kiln_value *v[3] = {A, B, Y};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < e.len[t]; i++) {
            int ch = e.lab[t][i];
            if (lsize[ch] >= 0 && lsize[ch] != v[t]->dims[i]) return kiln_gpu_fallback(c);
            lsize[ch] = v[t]->dims[i];
        }
    if (!Y->numel) return KILN_OK;
    mm_desc d;
    memset(&d, 0, sizeof d);
    int64_t sz;
    ein_group(&e, e.lab[0], A->rank, A->dims, EIN_M, &d.M, &d.a_m);
    ein_group(&e, e.lab[0], A->rank, A->dims, EIN_K, &d.K, &d.a_k);
    ein_group(&e, e.lab[0], A->rank, A->dims, EIN_BATCH, &d.batch, &d.a_b);
    ein_group(&e, e.lab[1], B->rank, B->dims, EIN_K, &sz, &d.b_k);
    ein_group(&e, e.lab[1], B->rank, B->dims, EIN_N, &d.N, &d.b_n);
    ein_group(&e, e.lab[1], B->rank, B->dims, EIN_BATCH, &sz, &d.b_b);
    ein_group(&e, e.lab[2], Y->rank, Y->dims, EIN_M, &sz, &d.y_m);
    ein_group(&e, e.lab[2], Y->rank, Y->dims, EIN_N, &sz, &d.y_n);
    ein_group(&e, e.lab[2], Y->rank, Y->dims, EIN_BATCH, &sz, &d.y_b);
    if (d.K == 0) return zero_out(c, Y);
    mm_plan pl;
    if (!mm_plan_of(&d, &pl)) return kiln_gpu_fallback(c);
    return mm_exec(c, A->dtype, A->data, B->data, Y->data, &d, &pl, 1.0f, 0.0f, NULL, NULL);
}

static const kiln_gpu_op ops[] = {
    {"", "MatMul", matmul_supports, matmul_run},
    {"", "Gemm", gemm_supports, gemm_run},
    {"", "Einsum", einsum_supports, einsum_run},
    {"kiln", "FusedMatMul", fused_matmul_supports, fused_matmul_run},
};

const kiln_gpu_op_table kiln_gpu_ops_blas = {ops, (int)(sizeof ops / sizeof ops[0])};
