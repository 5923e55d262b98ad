/* provider.c - the optimised CPU provider: float32 MatMul and Gemm (and com.microsoft
 * FusedMatMul and FusedGemm) on the packed sgemm (src/cpu/gemm.c) with the session's thread pool; element-wise, normalisation and
 * layout kernels from kernels_*.c (kernels.h). Every other node, and every case these kernels
 * do not cover at run time, runs its reference kernel. */
#include <stdlib.h>
#include <string.h>

#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "cpu/nchwc.h"
#include "ops/contrib_internal.h"
#include "ops/nn_internal.h"
#include "ops/provider.h"
#include "ops/semantics.h"
#include "ops/util.h"
#include "passes/pass.h"
#include "passes/passes.h"

static kiln_status reference_run(kiln_run_ctx *c)
{
    for (int i = 0; i < kiln_run_n_out(c); i++) {
        kiln_value *y = kiln_run_out(c, i);
        if (!y || y->kind != KILN_VALUE_TENSOR || !y->nbytes || y->dtype == KILN_DTYPE_STRING) continue;
        /* an output written in place over its input keeps the input's values */
        bool shared = false;
        for (int k = 0; k < kiln_run_n_in(c); k++) {
            const kiln_value *x = kiln_run_in(c, k);
            shared = shared || (x && x->kind == KILN_VALUE_TENSOR && x->data == y->data);
        }
        if (!shared) memset(y->data, 0, y->nbytes);
    }
    return kiln_run_node(c)->op->run(c);
}

/* The reference kernel, which reads constants in their ONNX layout: a weight whose original
 * bytes were released after packing (kiln_node_release_constant) is rebuilt from the packed
 * copy into a temporary buffer for this call. Only error paths and shapes the fast kernels do
 * not cover get here with such a node, so the O(weight) rebuild is not on any hot path. */
kiln_status kiln_cpu_reference(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *w = n->kernel_state_unpack ? n->in[n->released_in]->init : NULL;
    if (!w || kiln_run_in(c, n->released_in) != w) return reference_run(c);
    kiln_value tmp = *w;
    tmp.owns_data = false;
    tmp.data = malloc(w->nbytes);
    if (!tmp.data) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory rebuilding %zu bytes of weights", w->nbytes);
    n->kernel_state_unpack(n->kernel_state, tmp.data);
    kiln_status st = kiln_run_with_in(c, n->released_in, &tmp, reference_run);
    free(tmp.data);
    return st;
}

/* Constant 2-D float32 weights op(B), packed at compile time for the kernels; the originals are
 * released when nothing else reads them (kiln_node_release_constant) and rebuilt by unpacking
 * for the reference kernel (kiln_cpu_reference). */
static void packed_free(void *p) { kiln_gemm_packed_b_free(p); }
static void packed_unpack(const void *p, void *dst) { kiln_gemm_packed_b_unpack(p, dst); }

static void pack_weights(kiln_node *n, int input, bool trans_b)
{
    const kiln_value *w = kiln_ir_constant(n->in[input]);
    if (!w || w->dtype != KILN_DTYPE_FLOAT32 || w->rank != 2 || !w->numel) return;
    int64_t K = trans_b ? w->dims[1] : w->dims[0], N = trans_b ? w->dims[0] : w->dims[1];
    kiln_gemm_ctx ctx = {0};
    kiln_gemm_packed_b *pb = NULL;
    if (kiln_gemm_packed_b_create(&ctx, trans_b, K, N, w->data, w->dims[1], &pb)) return; /* run unpacked */
    n->kernel_state = pb;
    n->kernel_state_free = packed_free;
    if (kiln_node_release_constant(n, input)) {
        n->kernel_state_unpack = packed_unpack;
        n->released_in = input;
    }
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

/* Batches [begin, end) of a batched MatMul, each one sgemm (ctx's pool NULL inside a parallel loop). */
typedef struct batch_job {
    int yb;
    int64_t ydims[KILN_MAX_RANK], sa[KILN_MAX_RANK], sb[KILN_MAX_RANK];
    int64_t M, N, K;
    const float *a, *b;
    float *y;
    kiln_gemm_ctx ctx;
    kiln_status st; /* first failure */
} batch_job;

static void batch_range(void *ctx, int64_t begin, int64_t end)
{
    batch_job *j = ctx;
    for (int64_t t = begin; t < end; t++) {
        int64_t oa = 0, ob = 0, rem = t;
        for (int k = j->yb - 1; k >= 0; k--) {
            int64_t i = rem % j->ydims[k];
            rem /= j->ydims[k];
            oa += i * j->sa[k];
            ob += i * j->sb[k];
        }
        kiln_status st = kiln_sgemm_ex(&j->ctx, false, false, j->M, j->N, j->K, 1.0f, j->a + oa * j->M * j->K, j->K,
                                       j->b + ob * j->K * j->N, j->N, 0.0f, j->y + t * j->M * j->N, j->N, NULL);
        if (st) {
            __atomic_store_n(&j->st, st, __ATOMIC_RELAXED);
            return;
        }
    }
}

/* ---- MatMul and kiln.FusedMatMul: numpy matmul semantics, then the fused bias and activation ---- */

/* The fused bias [N] (kiln.FusedMatMul's input 2), or NULL. */
static const float *matmul_bias(kiln_run_ctx *c, const kiln_fused *f, int64_t N)
{
    const kiln_value *b = f->bias ? kiln_run_in(c, f->bias) : NULL;
    return b && b->dtype == KILN_DTYPE_FLOAT32 && b->numel == N ? b->data : NULL;
}

static kiln_status matmul_run(kiln_run_ctx *c)
{
    const kiln_fused *f = kiln_fused_of(kiln_run_node(c));
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || A->dtype != KILN_DTYPE_FLOAT32 || B->dtype != KILN_DTYPE_FLOAT32 || A->rank < 1 || B->rank < 1)
        return kiln_cpu_reference(c);
    int ra = A->rank, rb = B->rank;
    int64_t M = ra >= 2 ? A->dims[ra - 2] : 1, K = A->dims[ra - 1];
    int64_t N = rb >= 2 ? B->dims[rb - 1] : 1, KB = rb >= 2 ? B->dims[rb - 2] : B->dims[0];
    if (K != KB) return kiln_cpu_reference(c); /* the reference kernel reports it */
    bool fused = f->bias || f->act.kind != KILN_ACT_NONE;
    if (fused && rb != 2) return kiln_cpu_reference(c); /* the passes fuse only 2-D weights */
    kiln_threadpool *pool = kiln_run_threadpool(c);
    const float *a = A->data, *b = B->data;
    float *y = Y->data;
    if (Y->numel == 0) return KILN_OK;
    if (rb <= 2) {
        /* B has no batch: every row of A (batches included) is one GEMM row */
        int64_t rows = K ? A->numel / K : (ra >= 2 ? Y->numel / N : 1);
        const kiln_gemm_packed_b *pb = rb == 2 ? packed_for(c, B) : NULL;
        kiln_gemm_ctx ctx = {.pool = pool, .scratch = kiln_run_scratch(c)};
        kiln_gemm_epilogue ep = {.bias = matmul_bias(c, f, N)};
        if (f->bias && !ep.bias) return kiln_cpu_reference(c); /* it reports the mismatch */
        if (f->act.kind != KILN_ACT_NONE) {
            ep.tile = kiln_cpu_act_tile;
            ep.tile_ctx = (void *)&f->act;
        }
        const kiln_gemm_epilogue *epp = fused ? &ep : NULL;
        kiln_status st = pb ? kiln_sgemm_packed(&ctx, false, rows, 1.0f, a, K, pb, 0.0f, y, N, epp)
                            : kiln_sgemm_ex(&ctx, false, false, rows, N, K, 1.0f, a, K, b, N, 0.0f, y, N, epp);
        return st ? gemm_fail(c, st) : KILN_OK;
    }
    /* batched: Y's batch dims are the broadcast of A's and B's */
    int yb = Y->rank - (ra >= 2 ? 1 : 0) - 1; /* batch rank of Y */
    int64_t ydims[KILN_MAX_RANK], sa[KILN_MAX_RANK], sb[KILN_MAX_RANK];
    memcpy(ydims, Y->dims, (size_t)yb * sizeof *ydims);
    kiln_bcast_strides(yb, ydims, ra >= 2 ? ra - 2 : 0, A->dims, sa);
    kiln_bcast_strides(yb, ydims, rb - 2, B->dims, sb);
    int64_t batches = 1;
    for (int k = 0; k < yb; k++) batches *= ydims[k];
    batch_job j = {.yb = yb, .M = M, .N = N, .K = K, .a = a, .b = b, .y = y, .ctx.scratch = kiln_run_scratch(c)};
    memcpy(j.ydims, ydims, sizeof ydims);
    memcpy(j.sa, sa, sizeof sa);
    memcpy(j.sb, sb, sizeof sb);
    /* small products (attention heads): one whole GEMM per thread beats splitting each one */
    if (batches > 1 && M * N * K < (int64_t)1 << 22) kiln_threadpool_parallel_for(pool, batches, batch_range, &j);
    else {
        j.ctx.pool = pool;
        batch_range(&j, 0, batches);
    }
    kiln_status st = __atomic_load_n(&j.st, __ATOMIC_RELAXED);
    return st ? gemm_fail(c, st) : KILN_OK;
}

/* ---- Gemm and kiln.FusedGemm: Y = act(alpha * op(A) op(B) + beta * C) ---- */

/* Gemm with the activation act applied by the sgemm epilogue; every case the fast path does
 * not cover runs `fallback` (which applies the activation its own way). */
static kiln_status gemm_core(kiln_run_ctx *c, const kiln_act *act, kiln_kernel_fn fallback)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1), *C = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || Y->rank != 2 || A->rank != 2 || B->rank != 2 || A->dtype != KILN_DTYPE_FLOAT32 ||
        B->dtype != KILN_DTYPE_FLOAT32 || (C && (C->dtype != KILN_DTYPE_FLOAT32 || C->rank > 2)))
        return fallback(c);
    bool ta = kiln_attr_int(n, "transA", 0) != 0, tb = kiln_attr_int(n, "transB", 0) != 0;
    float alpha = kiln_attr_float(n, "alpha", 1.0f), beta = kiln_attr_float(n, "beta", 1.0f);
    int64_t M = Y->dims[0], N = Y->dims[1], K = ta ? A->dims[0] : A->dims[1];
    if ((ta ? A->dims[1] : A->dims[0]) != M || (tb ? B->dims[1] : B->dims[0]) != K || (tb ? B->dims[0] : B->dims[1]) != N)
        return fallback(c);
    float *y = Y->data;
    float use_beta = 0.0f;
    if (C && beta != 0.0f && Y->numel) {
        /* Y starts as C broadcast to [M, N] */
        int64_t cm = C->rank == 2 ? C->dims[0] : 1, cn = C->rank >= 1 ? C->dims[C->rank - 1] : 1;
        if ((cm != 1 && cm != M) || (cn != 1 && cn != N)) return fallback(c);
        const float *cv = C->data;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) y[i * N + j] = cv[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
        use_beta = beta;
    }
    if (!Y->numel) return KILN_OK;
    const kiln_gemm_packed_b *pb = packed_for(c, B);
    kiln_gemm_ctx ctx = {.pool = kiln_run_threadpool(c), .scratch = kiln_run_scratch(c)};
    kiln_gemm_epilogue ep = {.tile = kiln_cpu_act_tile, .tile_ctx = (void *)act}; /* the fused activation */
    const kiln_gemm_epilogue *epp = act->kind != KILN_ACT_NONE ? &ep : NULL;
    kiln_status st = pb ? kiln_sgemm_packed(&ctx, ta, M, alpha, A->data, A->dims[1], pb, use_beta, y, N, epp)
                        : kiln_sgemm_ex(&ctx, ta, tb, M, N, K, alpha, A->data, A->dims[1], B->data, B->dims[1],
                                        use_beta, y, N, epp);
    return st ? gemm_fail(c, st) : KILN_OK;
}

static kiln_status gemm_run(kiln_run_ctx *c)
{
    return gemm_core(c, &kiln_fused_of(kiln_run_node(c))->act, kiln_cpu_reference); /* kiln.FusedGemm's activation */
}

/* ---- com.microsoft FusedGemm and FusedMatMul on the same sgemm ---- */

/* FusedGemm's activation as one the sgemm epilogue applies; false for the others (Tanh,
 * Elu, ...), which run the reference kernel. */
static bool fused_gemm_act(const kiln_node *n, kiln_act *k)
{
    kiln_contrib_act a;
    char msg[160];
    if (!kiln_contrib_act_parse(n, false, &a, msg, sizeof msg)) return false;
    switch (a.kind) {
    case KILN_CONTRIB_ACT_RELU: *k = (kiln_act){KILN_ACT_RELU, 0.0f, 0.0f}; return true;
    case KILN_CONTRIB_ACT_SIGMOID: *k = (kiln_act){KILN_ACT_SIGMOID, 0.0f, 0.0f}; return true;
    case KILN_CONTRIB_ACT_LEAKY_RELU: *k = (kiln_act){KILN_ACT_LEAKY_RELU, (float)a.alpha, 0.0f}; return true;
    case KILN_CONTRIB_ACT_HARD_SIGMOID: *k = (kiln_act){KILN_ACT_HARD_SIGMOID, (float)a.alpha, (float)a.beta}; return true;
    default: return false;
    }
}

static kiln_status fused_gemm_run(kiln_run_ctx *c)
{
    kiln_act act;
    if (!fused_gemm_act(kiln_run_node(c), &act)) return kiln_cpu_reference(c); /* it reports a bad attribute */
    return gemm_core(c, &act, kiln_cpu_reference);
}

/* One operand's matrix [rows, cols] read with row stride rs and column stride cs as an sgemm
 * operand: untransposed when columns are contiguous, transposed when rows are; false when
 * neither (the reference kernel runs). */
static bool sgemm_operand(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool *trans, int64_t *ld)
{
    if (cs == 1 || cols <= 1) {
        *trans = false;
        *ld = rows <= 1 || rs < cols ? cols : rs;
        return rows <= 1 || rs >= cols;
    }
    if (rs == 1 || rows <= 1) {
        *trans = true;
        *ld = cols <= 1 || cs < rows ? rows : cs;
        return cols <= 1 || cs >= rows;
    }
    return false;
}

static kiln_status fused_matmul_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_contrib_mm_view v;
    char msg[160];
    if (!Y || A->dtype != KILN_DTYPE_FLOAT32 || B->dtype != KILN_DTYPE_FLOAT32 || Y->dtype != KILN_DTYPE_FLOAT32 ||
        !kiln_contrib_mm_resolve(n, A, B, &v, msg, sizeof msg))
        return kiln_cpu_reference(c); /* it reports the mismatch */
    if (!Y->numel) return KILN_OK;
    bool ta, tb = false; /* tb and ldb are unused when B is prepacked */
    int64_t lda, ldb = 0;
    const kiln_gemm_packed_b *pb = B->rank == 2 && !kiln_attr_int(n, "transBatchB", 0) ? packed_for(c, B) : NULL;
    if (!sgemm_operand(v.M, v.K, v.a_rs, v.a_cs, &ta, &lda) ||
        (!pb && !sgemm_operand(v.K, v.N, v.b_rs, v.b_cs, &tb, &ldb)))
        return kiln_cpu_reference(c);
    float alpha = kiln_attr_float(n, "alpha", 1.0f);
    kiln_gemm_ctx ctx = {.pool = kiln_run_threadpool(c), .scratch = kiln_run_scratch(c)};
    const float *a = A->data, *b = B->data;
    float *y = Y->data;
    int64_t batches = 1, idx[KILN_MAX_RANK] = {0};
    for (int i = 0; i < v.yb; i++) batches *= v.ydims[i];
    for (int64_t t = 0; t < batches; t++) {
        int64_t oa = 0, ob = 0;
        for (int i = 0; i < v.yb; i++) oa += idx[i] * v.a_bs[i], ob += idx[i] * v.b_bs[i];
        float *yt = y + t * v.M * v.N;
        kiln_status st = pb ? kiln_sgemm_packed(&ctx, ta, v.M, alpha, a + oa, lda, pb, 0.0f, yt, v.N, NULL)
                            : kiln_sgemm_ex(&ctx, ta, tb, v.M, v.N, v.K, alpha, a + oa, lda, b + ob, ldb, 0.0f, yt,
                                            v.N, NULL);
        if (st) return gemm_fail(c, st);
        kiln_nn_index_next(v.yb, v.ydims, idx);
    }
    return KILN_OK;
}

static bool f32_ab(const kiln_node *n)
{
    return n->n_in >= 2 && n->n_out >= 1 && kiln_ir_is_f32(n->in[0]) && kiln_ir_is_f32(n->in[1]);
}

/* MatMul and kiln.FusedMatMul */
static kiln_kernel_fn select_matmul(kiln_node *n)
{
    if (!f32_ab(n)) return NULL;
    pack_weights(n, 1, false);
    return matmul_run;
}

/* Gemm and kiln.FusedGemm */
static kiln_kernel_fn select_gemm(kiln_node *n)
{
    if (!f32_ab(n) || n->opset < 11) return NULL;
    pack_weights(n, 1, kiln_attr_int(n, "transB", 0) != 0);
    return gemm_run;
}

static kiln_kernel_fn select_ms_fused_matmul(kiln_node *n)
{
    if (!f32_ab(n)) return NULL;
    if (!kiln_attr_int(n, "transBatchB", 0)) pack_weights(n, 1, kiln_attr_int(n, "transB", 0) != 0);
    return fused_matmul_run;
}

static kiln_kernel_fn select_ms_fused_gemm(kiln_node *n)
{
    kiln_act act;
    if (!f32_ab(n) || !fused_gemm_act(n, &act)) return NULL;
    pack_weights(n, 1, kiln_attr_int(n, "transB", 0) != 0);
    return fused_gemm_run;
}

static const kiln_cpu_kernel gemm_kernels[] = {
    {"", "MatMul", select_matmul},
    {"kiln", "FusedMatMul", select_matmul},
    {"", "Gemm", select_gemm},
    {"kiln", "FusedGemm", select_gemm},
    {"com.microsoft", "FusedMatMul", select_ms_fused_matmul},
    {"com.microsoft", "FusedGemm", select_ms_fused_gemm},
};
static KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_gemm, gemm_kernels);

/* Every family's table; an operator with kernels in several (MaxPool: float32 and 8-bit) takes
 * the first that selects one. */
static const kiln_cpu_kernel_table *const families[] = {
    &kiln_cpu_kernels_gemm, &kiln_cpu_kernels_conv, &kiln_cpu_kernels_ew,
    &kiln_cpu_kernels_norm, &kiln_cpu_kernels_layout, &kiln_cpu_kernels_cnn,
    &kiln_cpu_kernels_attn, &kiln_cpu_kernels_contrib_attn, &kiln_cpu_kernels_qmatmul_batched, &kiln_cpu_kernels_quant,
    &kiln_cpu_kernels_qconv, &kiln_cpu_kernels_qdq, &kiln_cpu_kernels_ort_nchwc, &kiln_cpu_kernels_dqlstm,
    &kiln_cpu_kernels_qattn, &kiln_cpu_kernels_lstm, &kiln_cpu_kernels_contrib_ew,
    &kiln_cpu_kernels_qlinear_ew, &kiln_cpu_kernels_ew_more, &kiln_cpu_kernels_conv1d,
    &kiln_cpu_kernels_nbits, &kiln_cpu_kernels_gqa, &kiln_cpu_kernels_resize,
};

const kiln_cpu_kernel *kiln_cpu_kernel_find(const kiln_cpu_kernel_table *t, const kiln_op_def *op)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->k[i].op_type, op->op_type) && !strcmp(t->k[i].domain, op->domain)) return &t->k[i];
    return NULL;
}

/* Compile time, O(kernels) per node: the blocked-layout kernel of a node touching blocked values,
 * else the kernel of its operator's entry. */
static kiln_kernel_fn cpu_select(kiln_provider *p, kiln_node *n, unsigned *host_inputs)
{
    (void)p;
    *host_inputs = 0;
    kiln_kernel_fn k = kiln_cpu_select_nchwc(n);
    if (k) return k;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        const kiln_cpu_kernel *e = kiln_cpu_kernel_find(families[f], n->op);
        if (e && (k = e->select(n))) return k;
    }
    return NULL;
}

/* The fusions that hold inside a subgraph (MatMul + bias, activations into their producer),
 * over every subgraph of g, any depth. */
static const kiln_pass subgraph_passes[] = {
    {"fuse_matmul_bias", kiln_pass_fuse_matmul_bias},
    {"fuse_activation", kiln_pass_fuse_activation},
};

static kiln_status subgraphs_fuse(kiln_graph *g, int *changed, kiln_err *err)
{
    *changed = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        for (int a = 0; a < n->n_attrs; a++)
            for (int q = 0; q < kiln_attr_graph_count(&n->attrs[a]); q++) {
                kiln_graph *sg = (kiln_graph *)kiln_attr_graph_at(&n->attrs[a], q);
                int fused = 0, inner = 0;
                KILN_TRY(kiln_passes_run(sg, subgraph_passes, sizeof subgraph_passes / sizeof *subgraph_passes,
                                         &fused, err));
                KILN_TRY(subgraphs_fuse(sg, &inner, err));
                *changed += fused + inner;
            }
    }
    return KILN_OK;
}

/* The blocked layout where this CPU has its kernels (src/cpu/nchwc.h). */
static kiln_status layout_nchwc(kiln_graph *g, int *changed, kiln_err *err)
{
    *changed = 0;
    return kiln_cpu_nchwc_available() ? kiln_pass_layout_nchwc(g, changed, err) : KILN_OK;
}

/* Before the generic passes: DequantizeLinear -> op -> QuantizeLinear groups become int8 ops
 * while the DequantizeLinear of the weights is still there (constant folding would turn it
 * into float weights). */
static const kiln_pass cpu_pre_passes[] = {
    {"fuse_qdq", kiln_pass_fuse_qdq},
};

/* The CPU's pass pipeline over the inferred graph: int8 MatMul chains, attention, GELU, layer
 * normalisation written out, bias, residual and
 * activation fusion into the kernels above (bias and activation in subgraphs too), a gated
 * MLP's SiLU(gate) * up as one kernel and its int4 gate and up products as one, then the
 * blocked layout. */
static const kiln_pass cpu_passes[] = {
    {"fuse_quant_matmul", kiln_pass_fuse_quant_matmul},
    {"adopt_ms_fused_conv", kiln_pass_adopt_ms_fused_conv},
    {"fuse_attention", kiln_pass_fuse_attention},
    {"fuse_gelu", kiln_pass_fuse_gelu},
    {"fuse_layernorm", kiln_pass_fuse_layernorm},
    {"fuse_matmul_bias", kiln_pass_fuse_matmul_bias},
    {"fuse_residual", kiln_pass_fuse_residual},
    {"fuse_activation", kiln_pass_fuse_activation},
    {"fuse_silu_mul", kiln_pass_fuse_silu_mul},
    {"fuse_gate_up", kiln_pass_fuse_gate_up},
    {"fuse_in_subgraphs", subgraphs_fuse},
    {"layout_nchwc", layout_nchwc},
};

/* Values in the blocked layout (KILN_LAYOUT_NCHW16C) shown to observers as plain NCHW copies. */
static kiln_status cpu_to_plain(const kiln_ir_value *iv, const kiln_value *v, kiln_value **out, kiln_err *err)
{
    *out = NULL;
    if (iv->layout != KILN_LAYOUT_NCHW16C) return KILN_OK;
    KILN_TRY(kiln_value_copy(v, out, err));
    kiln_cpu_nchwc_unblock(NULL, v->data, (*out)->data, v->dims[0], v->dims[1], v->dims[2] * v->dims[3]);
    return KILN_OK;
}

const kiln_provider_i kiln_provider_cpu = {
    .api_version = KILN_PROVIDER_API,
    .name = "cpu",
    .kind = KILN_PROVIDER_CPU,
    .pre_passes = cpu_pre_passes,
    .n_pre_passes = sizeof cpu_pre_passes / sizeof *cpu_pre_passes,
    .passes = cpu_passes,
    .n_passes = sizeof cpu_passes / sizeof *cpu_passes,
    .select = cpu_select,
    .to_plain = cpu_to_plain,
};
