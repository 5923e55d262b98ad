/* provider.c - the optimised CPU provider: float32 MatMul, Gemm and 2-D Conv on the packed
 * sgemm (src/cpu/gemm.c) with the session's thread pool; element-wise, normalisation and
 * layout kernels from kernels_*.c (kernels.h). Every other node, and every case these kernels
 * do not cover at run time, runs its reference kernel. */
#include <stdlib.h>
#include <string.h>

#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "exec/provider.h"
#include "ops/nn_internal.h"
#include "ops/util.h"

static bool is_f32(const kiln_ir_value *v)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.dtype == KILN_DTYPE_FLOAT32;
}

static kiln_status reference(kiln_run_ctx *c) { return kiln_run_node(c)->op->run(c); }

/* Constant 2-D float32 weights op(B), packed at compile time for the kernels. */
static void packed_free(void *p) { kiln_gemm_packed_b_free(p); }

static void pack_weights(kiln_node *n, int input, bool trans_b)
{
    const kiln_value *w = n->in[input] ? n->in[input]->init : NULL;
    if (!w || w->dtype != KILN_DTYPE_FLOAT32 || w->rank != 2 || !w->numel) return;
    int64_t K = trans_b ? w->dims[1] : w->dims[0], N = trans_b ? w->dims[0] : w->dims[1];
    kiln_gemm_ctx ctx = {0};
    kiln_gemm_packed_b *pb = NULL;
    if (kiln_gemm_packed_b_create(&ctx, trans_b, K, N, w->data, w->dims[1], &pb)) return; /* run unpacked */
    n->kernel_state = pb;
    n->kernel_state_free = packed_free;
}

/* The packed weights when they are the B this call multiplies. */
static const kiln_gemm_packed_b *packed_for(kiln_run_ctx *c, const kiln_value *B)
{
    const kiln_node *n = kiln_run_node(c);
    return n->kernel_state && n->in[1] && B == n->in[1]->init ? n->kernel_state : NULL;
}

static kiln_status gemm_fail(kiln_run_ctx *c, kiln_status st)
{
    return kiln_run_fail(c, st, "sgemm failed (%s)", kiln_status_name(st));
}

/* ---- MatMul: numpy matmul semantics ---- */

static kiln_status matmul_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || A->dtype != KILN_DTYPE_FLOAT32 || B->dtype != KILN_DTYPE_FLOAT32 || A->rank < 1 || B->rank < 1)
        return reference(c);
    int ra = A->rank, rb = B->rank;
    int64_t M = ra >= 2 ? A->dims[ra - 2] : 1, K = A->dims[ra - 1];
    int64_t N = rb >= 2 ? B->dims[rb - 1] : 1, KB = rb >= 2 ? B->dims[rb - 2] : B->dims[0];
    if (K != KB) return reference(c); /* the reference kernel reports it */
    kiln_threadpool *pool = kiln_run_threadpool(c);
    const float *a = A->data, *b = B->data;
    float *y = Y->data;
    if (Y->numel == 0) return KILN_OK;
    if (rb <= 2) {
        /* B has no batch: every row of A (batches included) is one GEMM row */
        int64_t rows = K ? A->numel / K : (ra >= 2 ? Y->numel / N : 1);
        const kiln_gemm_packed_b *pb = rb == 2 ? packed_for(c, B) : NULL;
        kiln_gemm_ctx ctx = {.pool = pool};
        kiln_status st = pb ? kiln_sgemm_packed(&ctx, false, rows, 1.0f, a, K, pb, 0.0f, y, N, NULL)
                            : kiln_sgemm(pool, false, false, rows, N, K, 1.0f, a, K, b, N, 0.0f, y, N);
        return st ? gemm_fail(c, st) : KILN_OK;
    }
    /* batched: Y's batch dims are the broadcast of A's and B's */
    int yb = Y->rank - (ra >= 2 ? 1 : 0) - 1; /* batch rank of Y */
    int64_t ydims[KILN_MAX_RANK], sa[KILN_MAX_RANK], sb[KILN_MAX_RANK];
    memcpy(ydims, Y->dims, (size_t)yb * sizeof *ydims);
    kiln_bcast_strides(yb, ydims, ra >= 2 ? ra - 2 : 0, A->dims, sa);
    kiln_bcast_strides(yb, ydims, rb - 2, B->dims, sb);
    int64_t idx[KILN_MAX_RANK] = {0}, batches = 1;
    for (int k = 0; k < yb; k++) batches *= ydims[k];
    for (int64_t t = 0; t < batches; t++) {
        int64_t oa = 0, ob = 0;
        for (int k = 0; k < yb; k++) {
            oa += idx[k] * sa[k];
            ob += idx[k] * sb[k];
        }
        kiln_status st = kiln_sgemm(pool, false, false, M, N, K, 1.0f, a + oa * M * K, K, b + ob * K * N, N, 0.0f,
                                    y + t * M * N, N);
        if (st) return gemm_fail(c, st);
        nn_index_next(yb, ydims, idx);
    }
    return KILN_OK;
}

/* ---- Gemm: Y = alpha * op(A) op(B) + beta * C ---- */

static kiln_status gemm_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *C = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || Y->rank != 2 || A->rank != 2 || B->rank != 2 || A->dtype != KILN_DTYPE_FLOAT32 ||
        B->dtype != KILN_DTYPE_FLOAT32 || (C && (C->dtype != KILN_DTYPE_FLOAT32 || C->rank > 2)))
        return reference(c);
    bool ta = kiln_attr_int(n, "transA", 0) != 0, tb = kiln_attr_int(n, "transB", 0) != 0;
    float alpha = kiln_attr_float(n, "alpha", 1.0f), beta = kiln_attr_float(n, "beta", 1.0f);
    int64_t M = Y->dims[0], N = Y->dims[1], K = ta ? A->dims[0] : A->dims[1];
    if ((ta ? A->dims[1] : A->dims[0]) != M || (tb ? B->dims[1] : B->dims[0]) != K || (tb ? B->dims[0] : B->dims[1]) != N)
        return reference(c);
    float *y = Y->data;
    float use_beta = 0.0f;
    if (C && beta != 0.0f && Y->numel) {
        /* Y starts as C broadcast to [M, N] */
        int64_t cm = C->rank == 2 ? C->dims[0] : 1, cn = C->rank >= 1 ? C->dims[C->rank - 1] : 1;
        if ((cm != 1 && cm != M) || (cn != 1 && cn != N)) return reference(c);
        const float *cv = C->data;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) y[i * N + j] = cv[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
        use_beta = beta;
    }
    if (!Y->numel) return KILN_OK;
    const kiln_gemm_packed_b *pb = packed_for(c, B);
    kiln_gemm_ctx ctx = {.pool = kiln_run_threadpool(c)};
    kiln_status st = pb ? kiln_sgemm_packed(&ctx, ta, M, alpha, A->data, A->dims[1], pb, use_beta, y, N, NULL)
                        : kiln_sgemm(ctx.pool, ta, tb, M, N, K, alpha, A->data, A->dims[1], B->data, B->dims[1],
                                     use_beta, y, N);
    return st ? gemm_fail(c, st) : KILN_OK;
}

/* ---- Conv, 2-D: im2col per image and group, then one sgemm ---- */

typedef struct im2col_job {
    const float *x;        /* one image's channels of this group: [cg, H, W] */
    float *cols;           /* [cg * kh * kw, oh * ow] */
    int64_t cg, H, W, kh, kw, oh, ow;
    const nn_geom *g;
} im2col_job;

static void im2col_rows(void *ctx, int64_t begin, int64_t end)
{
    const im2col_job *j = ctx;
    const nn_geom *g = j->g;
    for (int64_t r = begin; r < end; r++) { /* r = (ci, ky, kx) */
        int64_t ci = r / (j->kh * j->kw), ky = (r / j->kw) % j->kh, kx = r % j->kw;
        float *out = j->cols + r * j->oh * j->ow;
        const float *xc = j->x + ci * j->H * j->W;
        for (int64_t oy = 0; oy < j->oh; oy++) {
            int64_t iy = oy * g->strides[0] - g->pads[0] + ky * g->dilations[0];
            for (int64_t ox = 0; ox < j->ow; ox++) {
                int64_t ix = ox * g->strides[1] - g->pads[1] + kx * g->dilations[1];
                out[oy * j->ow + ox] = (iy >= 0 && iy < j->H && ix >= 0 && ix < j->W) ? xc[iy * j->W + ix] : 0.0f;
            }
        }
    }
}

static kiln_status conv_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *Wt = kiln_run_in(c, 1), *Bv = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->rank != 4 || Wt->rank != 4 || Y->rank != 4 || X->dtype != KILN_DTYPE_FLOAT32 ||
        Wt->dtype != KILN_DTYPE_FLOAT32 || (Bv && (Bv->dtype != KILN_DTYPE_FLOAT32 || Bv->numel != Wt->dims[0])))
        return reference(c);
    nn_geom g;
    char msg[128];
    if (!nn_geom_parse(n, 2, &g, msg, sizeof msg)) return reference(c);
    g.kernel[0] = Wt->dims[2];
    g.kernel[1] = Wt->dims[3];
    int64_t out_hw[2];
    int64_t group = kiln_attr_int(n, "group", 1);
    int64_t Nb = X->dims[0], C = X->dims[1], H = X->dims[2], W = X->dims[3], M = Wt->dims[0];
    if (group < 1 || C % group || M % group || Wt->dims[1] != C / group || !nn_geom_resolve(&g, X->dims + 2, out_hw) ||
        out_hw[0] != Y->dims[2] || out_hw[1] != Y->dims[3] || Y->dims[1] != M || Y->dims[0] != Nb)
        return reference(c);
    int64_t cg = C / group, mg = M / group, kh = g.kernel[0], kw = g.kernel[1], oh = out_hw[0], ow = out_hw[1];
    int64_t kdim = cg * kh * kw, area = oh * ow;
    if (!Y->numel) return KILN_OK;
    if (!X->numel || !Wt->numel) return reference(c); /* no channels: the output is the bias */
    if (group == C && M == C) /* depthwise: W [C, 1, kh, kw] */
        return kiln_cpu_conv_depthwise(c, &g, X->data, Wt->data, Bv ? Bv->data : NULL, Y->data, Nb, C, H, W, oh, ow);
    bool direct = kh == 1 && kw == 1 && g.strides[0] == 1 && g.strides[1] == 1 && !g.pads[0] && !g.pads[1] &&
                  !g.pads[2] && !g.pads[3]; /* 1x1: X itself is the column matrix */
    float *cols = direct ? NULL : malloc((size_t)(kdim * area) * sizeof *cols);
    if (!direct && !cols) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for a %lld x %lld im2col buffer",
                                               (long long)kdim, (long long)area);
    kiln_threadpool *pool = kiln_run_threadpool(c);
    const float *x = X->data, *w = Wt->data, *bias = Bv ? Bv->data : NULL;
    float *y = Y->data;
    kiln_status st = KILN_OK;
    for (int64_t b = 0; b < Nb && !st; b++)
        for (int64_t gi = 0; gi < group && !st; gi++) {
            const float *xg = x + (b * C + gi * cg) * H * W;
            float *yg = y + (b * M + gi * mg) * area;
            if (!direct) {
                im2col_job job = {xg, cols, cg, H, W, kh, kw, oh, ow, &g};
                kiln_threadpool_parallel_for(pool, kdim, im2col_rows, &job);
            }
            for (int64_t m = 0; m < mg; m++) {
                float v = bias ? bias[gi * mg + m] : 0.0f;
                for (int64_t p = 0; p < area; p++) yg[m * area + p] = v;
            }
            st = kiln_sgemm(pool, false, false, mg, area, kdim, 1.0f, w + gi * mg * kdim, kdim, direct ? xg : cols,
                            area, 1.0f, yg, area);
        }
    free(cols);
    return st ? gemm_fail(c, st) : KILN_OK;
}

static kiln_kernel_fn cpu_select(kiln_node *n)
{
    kiln_kernel_fn k = kiln_cpu_select_ew(n);
    if (!k) k = kiln_cpu_select_norm(n);
    if (!k) k = kiln_cpu_select_layout(n);
    if (!k) k = kiln_cpu_select_cnn(n);
    if (k) return k;
    if (*n->domain || n->n_in < 2 || n->n_out < 1 || !is_f32(n->in[0]) || !is_f32(n->in[1])) return NULL;
    if (!strcmp(n->op_type, "MatMul")) {
        pack_weights(n, 1, false);
        return matmul_run;
    }
    if (!strcmp(n->op_type, "Gemm") && n->opset >= 11) {
        pack_weights(n, 1, kiln_attr_int(n, "transB", 0) != 0);
        return gemm_run;
    }
    if (!strcmp(n->op_type, "Conv") && n->in[0]->type.rank == 4 && n->in[1]->type.rank == 4) return conv_run;
    return NULL;
}

const kiln_provider_i kiln_provider_cpu = {
    .name = "cpu",
    .select = cpu_select,
};
