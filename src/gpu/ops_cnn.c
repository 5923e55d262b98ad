/* ops_cnn.c - GPU provider family 'cnn': Conv (cuDNN where it is there and takes the
 * geometry, with its bias + ReLU + residual epilogue for the fused forms; else im2col around
 * cuBLAS GEMMs, a direct kernel for depthwise), ConvTranspose (col2im around cuBLAS GEMMs), window and global pooling, Resize / Upsample,
 * DepthToSpace / SpaceToDepth. Geometry and Resize scale arithmetic run on the host exactly as
 * the reference kernels do (src/ops/nn_*.c, src/ops/image.c); the kernels are in k_cnn.cu. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "gpu/blas.h"
#include "gpu/dnn.h"
#include "gpu/gpu.h"
#include "gpu/k_cnn.h"
#include "gpu/ops_core.h"
#include "ops/image_internal.h"
#include "ops/resize.h"
#include "ops/nn_internal.h"
#include "ops/util.h"

/* Column scratch of the convolutions is bounded by processing the batch in chunks. */
#define CNN_COL_BYTES ((size_t)256 << 20)

static bool is_fp(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16;
}

/* Bytes of one element of the fixed-size types the gather kernels move; 0 for others. */
static size_t esize_of(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_UINT8: case KILN_DTYPE_INT8: case KILN_DTYPE_BOOL: return 1;
    case KILN_DTYPE_UINT16: case KILN_DTYPE_INT16: case KILN_DTYPE_FLOAT16: case KILN_DTYPE_BFLOAT16: return 2;
    case KILN_DTYPE_UINT32: case KILN_DTYPE_INT32: case KILN_DTYPE_FLOAT32: return 4;
    case KILN_DTYPE_UINT64: case KILN_DTYPE_INT64: case KILN_DTYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static kiln_dtype in_dtype(const kiln_node *n, int i)
{
    return i < n->n_in && n->in[i] ? n->in[i]->type.dtype : KILN_DTYPE_UNDEFINED;
}

static int in_rank(const kiln_node *n, int i)
{
    return i < n->n_in && n->in[i] ? n->in[i]->type.rank : -1;
}

/* Input 0 a float32 / float16 / bfloat16 tensor of rank -1 or 3..5 (1 to 3 spatial dims). */
static bool fp_spatial_input(const kiln_node *n, char *why, size_t size)
{
    kiln_dtype dt = in_dtype(n, 0);
    if (!is_fp(dt)) {
        snprintf(why, size, "dtype %s", kiln_dtype_name(dt));
        return false;
    }
    int r = in_rank(n, 0);
    if (r >= 0 && (r < 3 || r > 2 + KILN_GPU_CNN_MAX_SP)) {
        snprintf(why, size, "rank %d (1 to %d spatial dims)", r, KILN_GPU_CNN_MAX_SP);
        return false;
    }
    return true;
}

static size_t dtype_bytes(const kiln_value *v)
{
    return esize_of(v->dtype);
}

/* The kernels' window from a resolved geometry; in / out are the spatial sizes. */
static kiln_gpu_window make_window(const kiln_nn_geom *g, const int64_t *in, const int64_t *out)
{
    kiln_gpu_window w;
    memset(&w, 0, sizeof w);
    w.nsp = g->nsp;
    for (int i = 0; i < g->nsp; i++) {
        w.in[i] = in[i];
        w.out[i] = out[i];
        w.k[i] = g->kernel[i];
        w.stride[i] = g->strides[i];
        w.dil[i] = g->dilations[i];
        w.pad[i] = g->pads[i];
        w.pad_end[i] = g->pads[g->nsp + i];
    }
    return w;
}

/* ---- GEMMs (column-major cuBLAS over row-major tensors) ---- */

static gpuDataType_t blas_type(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT16 ? GPU_R_16F : dt == KILN_DTYPE_BFLOAT16 ? GPU_R_16BF : GPU_R_32F;
}

static bool fits_int(int64_t v)
{
    return v >= 0 && v <= INT_MAX;
}

/* C = op(A) op(B) (+ C when accumulate), batched with element strides; fp32 stays full
 * precision (CUBLAS_COMPUTE_32F, no TF32). */
static kiln_status gemm_batched(kiln_run_ctx *c, bool trans_b, int64_t m, int64_t n, int64_t k, kiln_dtype ab,
                                const void *A, int64_t lda, int64_t sa, const void *B, int64_t ldb, int64_t sb,
                                kiln_dtype cd, void *C, int64_t ldc, int64_t sc, int64_t batch, bool accumulate)
{
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) || !fits_int(ldc) ||
        !fits_int(batch))
        return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "GEMM dims beyond cuBLAS's int range");
    if (m == 0 || n == 0 || batch == 0) return KILN_OK;
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    void *h;
    KILN_TRY(kiln_gpu_blas(c, &h));
    gpublasStatus_t st = gpublasGemmStridedBatchedEx(
        (gpublasHandle_t)h, GPUBLAS_OP_N, trans_b ? GPUBLAS_OP_T : GPUBLAS_OP_N, (int)m, (int)n, (int)k,
        &alpha, A, blas_type(ab), (int)lda, (long long)sa, B, blas_type(ab), (int)ldb, (long long)sb, &beta, C,
        blas_type(cd), (int)ldc, (long long)sc, (int)batch, GPUBLAS_COMPUTE_32F, GPUBLAS_GEMM_DEFAULT);
    if (st != GPUBLAS_STATUS_SUCCESS)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "GEMM failed: %s", gpublasGetStatusString(st));
    return KILN_OK;
}

/* Items of a batch whose per-item scratch is `item` bytes that fit the column budget. */
static int64_t chunk_items(int64_t N, size_t item)
{
    int64_t nb = item ? (int64_t)(CNN_COL_BYTES / item) : N;
    if (nb < 1) nb = 1;
    return nb < N ? nb : N;
}

/* ---- Conv ---- */

static bool conv_supports(const kiln_node *n, char *why, size_t size)
{
    if (!fp_spatial_input(n, why, size)) return false;
    if (in_dtype(n, 1) != in_dtype(n, 0) || (n->n_in > 2 && n->in[2] && in_dtype(n, 2) != in_dtype(n, 0))) {
        snprintf(why, size, "mixed dtypes");
        return false;
    }
    return true;
}

/* ---- Conv on cuDNN ---- */

#if !defined(KILN_HIP)
/* Workspace a cuDNN algorithm may take (the heuristics' first choice that fits). */
#define DNN_WORKSPACE_MAX ((size_t)512 << 20)

/* The algorithm a node's convolution takes and its math type; also kept, under a key without N,
 * as what another batch size of the node borrows (dnn_conv_run). */
typedef struct dnn_algo {
    cudnnConvolutionFwdAlgo_t algo;
    cudnnMathType_t math;
} dnn_algo;

/* A convolution cuDNN runs for one node and one input shape: descriptors and algorithm, kept in
 * the run context's memo (kiln_gpu_memo_get) so that a repeated shape sets up nothing. */
typedef struct dnn_conv {
    cudnnTensorDescriptor_t x, y, b;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnActivationDescriptor_t relu;
    dnn_algo chosen;
    size_t ws;      /* bytes of workspace the algorithm takes */
    bool no_fused;  /* cuDNN refused the fused epilogue (or KILN_CUDNN=nofuse): convolution, then the caller's */
    bool refused;   /* cuDNN refused the convolution itself: im2col + GEMM */
    bool borrowed;  /* the algorithm another batch size of this node chose (dnn_conv_run) */
} dnn_conv;

/* A status cuDNN gives when it validates a call and declines it, before queueing anything
 * (bad or unsupported parameters); other failures are errors of the run. */
static bool dnn_declined(cudnnStatus_t st) { return st >= 1000 && st < 4000; }

static void dnn_conv_free(void *p)
{
    dnn_conv *d = p;
    if (!d) return;
    if (d->x) kiln_dnn.destroy_tensor(d->x);
    if (d->y) kiln_dnn.destroy_tensor(d->y);
    if (d->b) kiln_dnn.destroy_tensor(d->b);
    if (d->w) kiln_dnn.destroy_filter(d->w);
    if (d->conv) kiln_dnn.destroy_conv(d->conv);
    if (d->relu) kiln_dnn.destroy_act(d->relu);
    free(d);
}

/* A packed NCHW-like tensor descriptor of rank n. */
static bool dnn_tensor(cudnnTensorDescriptor_t *t, cudnnDataType_t dt, int n, const int *dims)
{
    int st[CUDNN_DIM_MAX];
    st[n - 1] = 1;
    for (int i = n - 2; i >= 0; i--) st[i] = st[i + 1] * dims[i + 1];
    return kiln_dnn.create_tensor(t) == CUDNN_STATUS_SUCCESS &&
           kiln_dnn.set_tensor(*t, dt, n, dims, st) == CUDNN_STATUS_SUCCESS;
}

/* Descriptors and algorithm for X [N, C, sp...] * W [M, Cg, k...] -> Y [N, M, out...] of
 * geometry g (symmetric pads) and `group`; 1-D runs as 2-D of height 1: the heuristics' choice,
 * or with `use` the algorithm given (its workspace asked for this shape). NULL when cuDNN does
 * not take it (a dim beyond int, no algorithm within DNN_WORKSPACE_MAX, exact float32
 * unavailable, the given algorithm refused). */
static dnn_conv *dnn_conv_make(cudnnHandle_t h, kiln_dtype dtype, const kiln_nn_geom *g, const int64_t *xd,
                               const int64_t *wd, const int64_t *yd, int64_t group, const dnn_algo *use)
{
    int nsp = g->nsp, n = nsp == 1 ? 4 : nsp + 2, lift = nsp == 1; /* 1-D: a height of 1 in front */
    int x[CUDNN_DIM_MAX], w[CUDNN_DIM_MAX], y[CUDNN_DIM_MAX], b[CUDNN_DIM_MAX], pad[3], str[3], dil[3];
    int64_t xn = 1, yn = 1;
    for (int i = 0; i < n; i++) {
        int src = i < 2 ? i : i - lift;
        bool one = lift && i == 2;
        int64_t xv = one ? 1 : xd[src], wv = one ? 1 : wd[src], yv = one ? 1 : yd[src];
        if (!fits_int(xv) || !fits_int(wv) || !fits_int(yv)) return NULL;
        x[i] = (int)xv, w[i] = (int)wv, y[i] = (int)yv, b[i] = i == 1 ? y[1] : 1;
        xn *= xv, yn *= yv;
        if (i >= 2) {
            int k = i - 2;
            pad[k] = one ? 0 : (int)g->pads[src - 2];
            str[k] = one ? 1 : (int)g->strides[src - 2];
            dil[k] = one ? 1 : (int)g->dilations[src - 2];
        }
    }
    if (!fits_int(xn) || !fits_int(yn)) return NULL;
    cudnnDataType_t dt = dtype == KILN_DTYPE_FLOAT16 ? CUDNN_DATA_HALF
                         : dtype == KILN_DTYPE_BFLOAT16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    /* float32 exactly (no TF32), as the cuBLAS products; 16-bit on tensor cores, float sums */
    cudnnMathType_t math = dtype == KILN_DTYPE_FLOAT32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    dnn_conv *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->no_fused = !kiln_gpu_dnn_fused();
    if (!dnn_tensor(&d->x, dt, n, x) || !dnn_tensor(&d->y, dt, n, y) || !dnn_tensor(&d->b, dt, n, b) ||
        kiln_dnn.create_filter(&d->w) || kiln_dnn.set_filter(d->w, dt, CUDNN_TENSOR_NCHW, n, w) ||
        kiln_dnn.create_conv(&d->conv) ||
        kiln_dnn.set_conv(d->conv, n - 2, pad, str, dil, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) ||
        kiln_dnn.set_conv_groups(d->conv, (int)group) || kiln_dnn.set_conv_math(d->conv, math) ||
        kiln_dnn.create_act(&d->relu) ||
        kiln_dnn.set_act(d->relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0))
        goto refuse;
    if (use) {
        size_t ws = 0;
        if (kiln_dnn.set_conv_math(d->conv, use->math) ||
            kiln_dnn.forward_workspace(h, d->x, d->w, d->conv, d->y, use->algo, &ws) || ws > DNN_WORKSPACE_MAX)
            goto refuse;
        d->chosen = *use, d->ws = ws, d->borrowed = true;
        return d;
    }
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int found = 0;
    if (kiln_dnn.forward_algos(h, d->x, d->w, d->conv, d->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf))
        goto refuse;
    for (int i = 0; i < found; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > DNN_WORKSPACE_MAX) continue;
        /* float32 keeps the descriptor's FMA math (an algorithm reported with the default math
         * runs so too; one that needs tensor ops is declined when it runs, see dnn_conv_run);
         * 16-bit types take the math the heuristics name */
        if (dtype == KILN_DTYPE_FLOAT32 ? perf[i].mathType != CUDNN_FMA_MATH && perf[i].mathType != CUDNN_DEFAULT_MATH
                                        : kiln_dnn.set_conv_math(d->conv, perf[i].mathType) != CUDNN_STATUS_SUCCESS)
            continue;
        d->chosen.algo = perf[i].algo;
        d->chosen.math = dtype == KILN_DTYPE_FLOAT32 ? CUDNN_FMA_MATH : perf[i].mathType;
        d->ws = perf[i].memory;
        return d;
    }
refuse:
    dnn_conv_free(d);
    return NULL;
}

/* Y = relu(conv(X, W) + B + Z) as e asks (see kiln_gpu_conv_epi), on cuDNN; *done false when
 * cuDNN is not there or does not take the call (nothing queued then). */
static kiln_status dnn_conv_run(kiln_run_ctx *c, const kiln_nn_geom *g, int64_t group, const kiln_value *X,
                                const kiln_value *W, const kiln_value *B, kiln_value *Y, kiln_gpu_conv_epi *e,
                                bool *done)
{
    *done = false;
    void *h;
    KILN_TRY(kiln_gpu_dnn(c, &h));
    if (!h) return KILN_OK;
    for (int i = 0; i < g->nsp; i++)
        if (g->pads[i] != g->pads[g->nsp + i]) return KILN_OK; /* cuDNN pads both ends alike */
    int64_t key[KILN_GPU_MEMO_KEY];
    int nk = 0;
    key[nk++] = X->dtype;
    for (int i = 0; i < X->rank; i++) key[nk++] = X->dims[i]; /* W's are the node's; SAME pads follow X's */
    /* A new batch size first borrows the algorithm the heuristics chose for another (only the
     * workspace is asked for: the heuristics cost milliseconds a layer, which made a first run at
     * a new shape 40-200x a repeat); its second run, the one a CUDA graph records, asks them. */
    dnn_conv *d = kiln_gpu_memo_get(c, key, nk);
    if (d && d->borrowed) {
        /* the heuristics' own choice, if it fits the workspace the first run sized (this run may
         * be recorded, and a recorded run allocates nothing) */
        dnn_conv *own = dnn_conv_make(h, X->dtype, g, X->dims, W->dims, Y->dims, group, NULL);
        if (own && own->ws <= d->ws) {
            kiln_gpu_memo_put(c, key, nk, own, dnn_conv_free); /* frees d */
            d = own;
        } else {
            dnn_conv_free(own);
            d->borrowed = false;
        }
    }
    if (!d) {
        int64_t any_n[KILN_GPU_MEMO_KEY]; /* the key without N */
        memcpy(any_n, key, (size_t)nk * sizeof *key);
        any_n[0] = -1 - X->dtype, any_n[1] = -1;
        dnn_algo *known = kiln_gpu_memo_get(c, any_n, nk);
        d = known ? dnn_conv_make(h, X->dtype, g, X->dims, W->dims, Y->dims, group, known) : NULL;
        if (!d) d = dnn_conv_make(h, X->dtype, g, X->dims, W->dims, Y->dims, group, NULL);
        if (!d) return KILN_OK;
        /* the algorithm first: the table is direct-mapped, so the later put may evict it, never d */
        if (!known && (known = malloc(sizeof *known))) {
            *known = d->chosen;
            kiln_gpu_memo_put(c, any_n, nk, known, free);
        }
        kiln_gpu_memo_put(c, key, nk, d, dnn_conv_free);
    }
    if (d->refused) return KILN_OK;
    void *ws = NULL;
    if (d->ws) KILN_TRY(kiln_gpu_workspace(c, d->ws, &ws));
    float one = 1.0f, zero = 0.0f;
    cudnnStatus_t st;
    /* the fused epilogue needs a bias and an activation (cuDNN's identity form takes one algorithm) */
    if (e && e->relu && B && !d->no_fused) {
        st = kiln_dnn.forward_bias_act(h, &one, d->x, X->data, d->w, W->data, d->conv, d->chosen.algo, ws, d->ws,
                                       e->Z ? &one : &zero, d->y, e->Z ? e->Z : Y->data, d->b, B->data, d->relu, d->y,
                                       Y->data);
        if (st == CUDNN_STATUS_SUCCESS) {
            e->applied = *done = true;
            return KILN_OK;
        }
        if (!dnn_declined(st))
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "GPU: cuDNN convolution failed: %s", kiln_dnn.error_string(st));
        d->no_fused = true; /* the same answer on every call: it is remembered */
    }
    if (B) KILN_TRY(kiln_gpu_check(c, kiln_gpu_cnn_bias_fill(X->dtype, Y->data, B->data, Y->dims[0], Y->dims[1],
                                                              kiln_nn_prod(g->nsp, Y->dims + 2), kiln_gpu_stream(c)),
                                   "bias_fill"));
    st = kiln_dnn.forward(h, &one, d->x, X->data, d->w, W->data, d->conv, d->chosen.algo, ws, d->ws, B ? &one : &zero,
                          d->y, Y->data);
    if (st == CUDNN_STATUS_SUCCESS) {
        *done = true;
        return KILN_OK;
    }
    if (!dnn_declined(st))
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "GPU: cuDNN convolution failed: %s", kiln_dnn.error_string(st));
    d->refused = true; /* the im2col path writes all of Y, the bias first, over what bias_fill queued */
    return KILN_OK;
}
#endif

/* Threads a depthwise launch needs before the tiled kernel goes ahead of cuDNN (see
 * kiln_gpu_conv_core): about half of an H100's resident threads. */
#define DW2D_MIN_THREADS (64 * 1024)

kiln_status kiln_gpu_conv_core(kiln_run_ctx *c, kiln_gpu_conv_epi *epi, bool *done)
{
    *done = false;
    if (epi) epi->applied = false;
    const kiln_node *node = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1), *B = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    int nsp = X->rank - 2;
    kiln_nn_geom g;
    char msg[160];
    int64_t od[KILN_MAX_RANK];
    if (!Y || nsp < 1 || nsp > KILN_GPU_CNN_MAX_SP || W->rank != X->rank || !kiln_nn_geom_parse(node, nsp, &g, msg, sizeof msg))
        return KILN_OK;
    memcpy(g.kernel, W->dims + 2, (size_t)nsp * sizeof(int64_t));
    if (!kiln_nn_geom_resolve(&g, X->dims + 2, od)) return KILN_OK;
    int64_t group = kiln_attr_int(node, "group", 1);
    int64_t N = X->dims[0], C = X->dims[1], M = W->dims[0], Cg = W->dims[1];
    if (group < 1 || C != Cg * group || M % group || (B && B->numel != M)) return KILN_OK;
    if (Y->numel == 0) {
        *done = true;
        if (epi) epi->applied = true;
        return KILN_OK;
    }
    kiln_gpu_window w = make_window(&g, X->dims + 2, od);
    gpuStream_t s = kiln_gpu_stream(c);
    int dt = X->dtype;
    /* Depthwise by the tiled kernel where it fills the device: cuDNN's NCHW depthwise kernels
     * are direct and slow at batch 32 (ConvNeXt-T float16 5.95 -> 3.98 ms, MobileNetV3-L 2.51 ->
     * 2.15, EfficientNet-B0 4.36 -> 4.04 on an H100), but at batch 1 MobileNetV3's and
     * EfficientNet's small planes launched too few threads (float16 0.45 -> 0.55 and 0.71 ->
     * 0.80 ms): there cuDNN first, the tiled kernel where cuDNN does not take the call. */
    int64_t dw_threads = Cg == 1 ? kiln_gpu_cnn_dw2d_threads(&w, N * M) : 0;
#if !defined(KILN_HIP)
    if (dw_threads < DW2D_MIN_THREADS) {
        KILN_TRY(dnn_conv_run(c, &g, group, X, W, B, Y, epi, done));
        if (*done) return KILN_OK;
    }
#endif
    *done = true;
    if (dw_threads) {
        if (epi) epi->applied = true;
        return kiln_gpu_check(c, kiln_gpu_cnn_conv_dw2d(dt, X->data, W->data, B ? B->data : NULL, epi ? epi->Z : NULL,
                                                        epi && epi->relu, Y->data, N, C, M, w, s),
                              "conv_dw2d");
    }
    if (Cg == 1) /* one input channel per group: depthwise and its channel multipliers */
        return kiln_gpu_check(c, kiln_gpu_cnn_conv_direct(dt, X->data, W->data, B ? B->data : NULL, Y->data, N, C, M, w, s),
                              "conv_direct");

    int64_t Mg = M / group, ks = kiln_nn_prod(nsp, g.kernel), Kg = Cg * ks, is = kiln_nn_prod(nsp, X->dims + 2),
            os = kiln_nn_prod(nsp, od);
    size_t es = dtype_bytes(X);
    if (Kg == 0) /* no input channels: the bias alone */
        return kiln_gpu_check(c, B ? kiln_gpu_cnn_bias_fill(dt, Y->data, B->data, N, M, os, s)
                                   : gpuMemsetAsync(Y->data, 0, Y->nbytes, s),
                              "bias_fill");
    if (B) KILN_TRY(kiln_gpu_check(c, kiln_gpu_cnn_bias_fill(dt, Y->data, B->data, N, M, os, s), "bias_fill"));
    bool direct = true; /* 1x1, stride 1, no padding: X is its own column matrix */
    for (int i = 0; i < nsp; i++)
        direct = direct && g.kernel[i] == 1 && g.strides[i] == 1 && g.pads[i] == 0 && g.pads[nsp + i] == 0;
    size_t item = (size_t)C * (size_t)ks * (size_t)os * es;
    int64_t nb = direct ? N : chunk_items(N, item);
    void *col = NULL;
    if (!direct) KILN_TRY(kiln_gpu_workspace(c, item * (size_t)nb, &col));
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t cnt = N - n0 < nb ? N - n0 : nb;
        const char *x = (const char *)X->data + (size_t)(n0 * C * is) * es;
        char *y = (char *)Y->data + (size_t)(n0 * M * os) * es;
        const char *a = x;
        if (!direct) {
            KILN_TRY(kiln_gpu_check(c, kiln_gpu_cnn_im2col(dt, x, col, cnt, C, w, s), "im2col"));
            a = col;
        }
        /* Y_n,g [Mg x os] = W_g [Mg x Kg] * col_n,g [Kg x os]; column-major: Y^T = col^T W^T */
        if (group == 1) {
            KILN_TRY(gemm_batched(c, false, os, M, Kg, X->dtype, a, os, C * ks * os, W->data, Kg, 0, Y->dtype, y, os,
                                  M * os, cnt, B != NULL));
            continue;
        }
        for (int64_t n = 0; n < cnt; n++)
            KILN_TRY(gemm_batched(c, false, os, Mg, Kg, X->dtype, a + (size_t)(n * C * ks * os) * es, os, Kg * os,
                                  W->data, Kg, Mg * Kg, Y->dtype, y + (size_t)(n * M * os) * es, os, Mg * os, group,
                                  B != NULL));
    }
    return KILN_OK;
}

static kiln_status conv_run(kiln_run_ctx *c)
{
    bool done;
    KILN_TRY(kiln_gpu_conv_core(c, NULL, &done));
    return done ? KILN_OK : kiln_gpu_fallback(c);
}

/* ---- ConvTranspose ---- */

static kiln_status conv_transpose_run(kiln_run_ctx *c)
{
    const kiln_node *node = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, 1), *B = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    int nsp = X->rank - 2;
    kiln_nn_geom g;
    char msg[160];
    /* pads derived from the output size when it is given or SAME, as the reference does */
    if (!Y || nsp < 1 || nsp > KILN_GPU_CNN_MAX_SP || W->rank != X->rank || Y->rank != X->rank ||
        !kiln_nn_conv_transpose_geom(node, nsp, X->dims, W->dims, Y->dims, &g, msg, sizeof msg))
        return kiln_gpu_fallback(c);
    int64_t group = kiln_attr_int(node, "group", 1);
    memcpy(g.kernel, W->dims + 2, (size_t)nsp * sizeof(int64_t));
    int64_t N = X->dims[0], C = X->dims[1], Mg = W->dims[1], M = Y->dims[1];
    if (group < 1 || C % group || W->dims[0] != C || M != Mg * group || Y->dims[0] != N || (B && B->numel != M))
        return kiln_gpu_fallback(c);
    if (Y->numel == 0) return KILN_OK;
    int64_t Cg = C / group, ks = kiln_nn_prod(nsp, g.kernel), is = kiln_nn_prod(nsp, X->dims + 2),
            os = kiln_nn_prod(nsp, Y->dims + 2);
    kiln_gpu_window w = make_window(&g, X->dims + 2, Y->dims + 2);
    gpuStream_t s = kiln_gpu_stream(c);
    size_t es = dtype_bytes(X), item = (size_t)M * (size_t)ks * (size_t)is * sizeof(float);
    int64_t nb = chunk_items(N, item);
    void *cols;
    KILN_TRY(kiln_gpu_workspace(c, item * (size_t)nb, &cols));
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t cnt = N - n0 < nb ? N - n0 : nb;
        const char *x = (const char *)X->data + (size_t)(n0 * C * is) * es;
        /* cols_n,g [Mg*ks x is] = W_g^T [Mg*ks x Cg] * X_n,g [Cg x is]; column-major:
         * cols^T = X^T W with W read transposed */
        if (Cg == 0) {
            KILN_TRY(kiln_gpu_check(c, gpuMemsetAsync(cols, 0, item * (size_t)cnt, s), "memset"));
        } else if (group == 1) {
            KILN_TRY(gemm_batched(c, true, is, M * ks, C, X->dtype, x, is, C * is, W->data, M * ks, 0,
                                  KILN_DTYPE_FLOAT32, cols, is, M * ks * is, cnt, false));
        } else {
            for (int64_t n = 0; n < cnt; n++)
                KILN_TRY(gemm_batched(c, true, is, Mg * ks, Cg, X->dtype, x + (size_t)(n * C * is) * es, is, Cg * is,
                                      W->data, Mg * ks, Cg * Mg * ks, KILN_DTYPE_FLOAT32,
                                      (float *)cols + n * M * ks * is, is, Mg * ks * is, group, false));
        }
        char *y = (char *)Y->data + (size_t)(n0 * M * os) * es;
        KILN_TRY(kiln_gpu_check(c, kiln_gpu_cnn_col2im(X->dtype, cols, B ? B->data : NULL, y, cnt, M, w, s),
                                "col2im"));
    }
    return KILN_OK;
}

/* ---- pooling ---- */

static bool pool_supports(const kiln_node *n, char *why, size_t size)
{
    if (!fp_spatial_input(n, why, size)) return false;
    int nk;
    if (!kiln_attr_ints(n, "kernel_shape", &nk) || nk < 1 || nk > KILN_GPU_CNN_MAX_SP) {
        snprintf(why, size, "kernel_shape with %d values", nk);
        return false;
    }
    return true;
}

static kiln_status pool_run(kiln_run_ctx *c, int mode)
{
    const kiln_node *node = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0), *I = kiln_run_out(c, 1);
    kiln_nn_geom g;
    char msg[160];
    int64_t od[KILN_MAX_RANK];
    if (!Y || !kiln_nn_pool_geom(node, &g, msg, sizeof msg) || g.nsp != X->rank - 2 || g.nsp > KILN_GPU_CNN_MAX_SP)
        return kiln_gpu_fallback(c);
    if (!kiln_nn_geom_resolve(&g, X->dims + 2, od)) return kiln_gpu_fallback(c);
    if (Y->numel == 0) return KILN_OK;
    bool include_pad = kiln_attr_int(node, "count_include_pad", 0) != 0;
    bool col_major = kiln_attr_int(node, "storage_order", 0) == 1;
    kiln_gpu_window w = make_window(&g, X->dims + 2, od);
    gpuError_t e = kiln_gpu_cnn_pool(X->dtype, mode, X->data, Y->data, I && mode == KILN_GPU_POOL_MAX ? I->data : NULL,
                                     X->dims[0] * X->dims[1], w, include_pad, col_major, (float)kiln_nn_pool_p(node),
                                     kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "pool");
}

static kiln_status max_pool_run(kiln_run_ctx *c) { return pool_run(c, KILN_GPU_POOL_MAX); }
static kiln_status average_pool_run(kiln_run_ctx *c) { return pool_run(c, KILN_GPU_POOL_AVG); }
static kiln_status lp_pool_run(kiln_run_ctx *c) { return pool_run(c, KILN_GPU_POOL_LP); }

static bool global_pool_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_dtype dt = in_dtype(n, 0);
    if (!is_fp(dt)) {
        snprintf(why, size, "dtype %s", kiln_dtype_name(dt));
        return false;
    }
    return true;
}

static kiln_status global_pool_run(kiln_run_ctx *c, int mode)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->rank < 2) return kiln_gpu_fallback(c);
    int64_t planes = X->dims[0] * X->dims[1], sz = planes ? X->numel / planes : 0;
    if (planes == 0) return KILN_OK;
    gpuError_t e = kiln_gpu_cnn_global_pool(X->dtype, mode, X->data, Y->data, planes, sz,
                                            (float)kiln_nn_pool_p(kiln_run_node(c)), kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "global_pool");
}

static kiln_status global_max_pool_run(kiln_run_ctx *c) { return global_pool_run(c, KILN_GPU_POOL_MAX); }
static kiln_status global_average_pool_run(kiln_run_ctx *c) { return global_pool_run(c, KILN_GPU_POOL_AVG); }
static kiln_status global_lp_pool_run(kiln_run_ctx *c) { return global_pool_run(c, KILN_GPU_POOL_LP); }

/* ---- Resize (opsets 10, 11, 13, 18, 19) and Upsample (7, 9): the reference's attribute and
 * scale logic (src/ops/image.c), the interpolation on the device ---- */

static const char *const rs_modes[] = {"nearest", "linear", "cubic"};

static bool resize_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_dtype dt = in_dtype(n, 0);
    kiln_resize_attrs a;
    char msg[200];
    if (!kiln_resize_parse(n, n->opset, -1, &a, msg, sizeof msg)) {
        snprintf(why, size, "%s", msg);
        return false;
    }
    if (a.antialias) {
        snprintf(why, size, "antialias");
        return false;
    }
    if (a.mode == KILN_RESIZE_NEAREST ? !esize_of(dt) || dt == KILN_DTYPE_BOOL : !is_fp(dt)) {
        snprintf(why, size, "mode '%s' on dtype %s", rs_modes[a.mode], kiln_dtype_name(dt));
        return false;
    }
    if (in_rank(n, 0) > KILN_GPU_MAX_RANK) {
        snprintf(why, size, "rank %d", in_rank(n, 0));
        return false;
    }
    return true;
}

static kiln_status resize_run(kiln_run_ctx *c)
{
    const kiln_node *node = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    kiln_resize_attrs a;
    char msg[200];
    int rank = x->rank;
    if (!y || rank > KILN_GPU_MAX_RANK || !kiln_resize_parse(node, kiln_run_opset(c), rank, &a, msg, sizeof msg) ||
        a.antialias)
        return kiln_gpu_fallback(c);
    const kiln_value *scales = a.scales_in >= 0 ? kiln_run_in(c, a.scales_in) : NULL;
    const kiln_value *sizes = a.sizes_in >= 0 ? kiln_run_in(c, a.sizes_in) : NULL;
    if (scales && scales->numel == 0 && sizes) scales = NULL;
    kiln_gpu_resize r;
    memset(&r, 0, sizeof r);
    int64_t out[KILN_MAX_RANK];
    double scale[KILN_MAX_RANK];
    if (kiln_resize_plan(&a, rank, x->dims, scales, scales ? NULL : sizes, out, scale, msg, sizeof msg))
        return kiln_gpu_fallback(c); /* the reference reports it */
    for (int k = 0; k < rank; k++) r.lo[k] = 0, r.hi[k] = 1;
    if (a.ct == KILN_RESIZE_CT_TF_CROP) {
        const kiln_value *roi = a.roi_in >= 0 ? kiln_run_in(c, a.roi_in) : NULL;
        if (!roi || roi->numel != 2 * a.n_axes || !kiln_dtype_is_float(roi->dtype)) return kiln_gpu_fallback(c);
        for (int i = 0; i < a.n_axes; i++) {
            r.lo[a.axes[i]] = kiln_load_f64(roi->dtype, roi->data, i);
            r.hi[a.axes[i]] = kiln_load_f64(roi->dtype, roi->data, a.n_axes + i);
        }
    }
    if (y->numel == 0) return KILN_OK;
    if (x->numel == 0) return kiln_gpu_fallback(c); /* the reference reports it */
    for (int k = 0; k < rank; k++)
        if (out[k] != y->dims[k]) return kiln_gpu_fallback(c);
    r.rank = rank;
    r.mode = a.mode;
    r.ct = a.ct;
    r.nr = a.nr;
    r.exclude_outside = a.exclude_outside;
    r.cubic_a = a.cubic_a;
    r.extrapolation = (float)a.extrapolation;
    uint64_t slot = 0;
    kiln_image_store_sat(y->dtype, &slot, 0, a.extrapolation);
    r.extrap_bits = slot;
    for (int k = 0; k < rank; k++) {
        r.in[k] = x->dims[k];
        r.out[k] = out[k];
        r.scale[k] = scale[k];
        r.active[k] = !(out[k] == x->dims[k] && scale[k] == 1.0 &&
                        (a.ct != KILN_RESIZE_CT_TF_CROP || (r.lo[k] == 0 && r.hi[k] == 1)));
    }
    if (a.mode != KILN_RESIZE_NEAREST && !is_fp(x->dtype)) return kiln_gpu_fallback(c);
    void *ws;
    KILN_TRY(kiln_gpu_workspace(c, kiln_gpu_cnn_resize_ws_bytes(&r), &ws));
    return kiln_gpu_check(c, kiln_gpu_cnn_resize(x->dtype, esize_of(x->dtype), x->data, y->data, &r, ws,
                                                 kiln_gpu_stream(c)),
                          "resize");
}

/* ---- DepthToSpace / SpaceToDepth: a 6-D permuted gather ---- */

static bool block_supports(const kiln_node *n, char *why, size_t size)
{
    kiln_dtype dt = in_dtype(n, 0);
    if (!esize_of(dt)) {
        snprintf(why, size, "dtype %s", kiln_dtype_name(dt));
        return false;
    }
    return true;
}

static kiln_status block_run(kiln_run_ctx *c, bool to_space)
{
    const kiln_node *node = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int64_t b = kiln_attr_int(node, "blocksize", 0);
    const char *mode = kiln_attr_string(node, "mode", "DCR");
    bool crd = !strcmp(mode, "CRD");
    if (!y || x->rank != 4 || b <= 0 || (!crd && strcmp(mode, "DCR")) || !esize_of(x->dtype))
        return kiln_gpu_fallback(c);
    if (y->numel == 0) return KILN_OK;
    int64_t dims[6];
    const int *perm;
    /* the reference's views (src/ops/shape_move.c) */
    static const int d2s_dcr[6] = {0, 3, 4, 1, 5, 2}, d2s_crd[6] = {0, 1, 4, 2, 5, 3};
    static const int s2d_dcr[6] = {0, 3, 5, 1, 2, 4}, s2d_crd[6] = {0, 1, 3, 5, 2, 4};
    if (to_space) {
        int64_t cc = x->dims[1] / (b * b);
        if (cc * b * b != x->dims[1]) return kiln_gpu_fallback(c);
        int64_t dcr[6] = {x->dims[0], b, b, cc, x->dims[2], x->dims[3]};
        int64_t crdd[6] = {x->dims[0], cc, b, b, x->dims[2], x->dims[3]};
        memcpy(dims, crd ? crdd : dcr, sizeof dims);
        perm = crd ? d2s_crd : d2s_dcr;
    } else {
        if (x->dims[2] % b || x->dims[3] % b) return kiln_gpu_fallback(c);
        int64_t d[6] = {x->dims[0], x->dims[1], x->dims[2] / b, b, x->dims[3] / b, b};
        memcpy(dims, d, sizeof dims);
        perm = crd ? s2d_crd : s2d_dcr;
    }
    int64_t xs[6], st = 1;
    for (int k = 5; k >= 0; k--) xs[k] = st, st *= dims[k];
    kiln_gpu_shape src;
    memset(&src, 0, sizeof src);
    src.rank = 6;
    for (int k = 0; k < 6; k++) src.dims[k] = dims[perm[k]], src.strides[k] = xs[perm[k]];
    return kiln_gpu_check(c, kiln_gpu_cnn_gather_view(esize_of(x->dtype), x->data, y->data, src, y->numel,
                                                      kiln_gpu_stream(c)),
                          "block_gather");
}

static kiln_status depth_to_space_run(kiln_run_ctx *c) { return block_run(c, true); }
static kiln_status space_to_depth_run(kiln_run_ctx *c) { return block_run(c, false); }

static const kiln_gpu_op ops[] = {
    {"", "Conv", conv_supports, conv_run},
    {"", "ConvTranspose", conv_supports, conv_transpose_run},
    {"", "MaxPool", pool_supports, max_pool_run},
    {"", "AveragePool", pool_supports, average_pool_run},
    {"", "LpPool", pool_supports, lp_pool_run},
    {"", "GlobalAveragePool", global_pool_supports, global_average_pool_run},
    {"", "GlobalMaxPool", global_pool_supports, global_max_pool_run},
    {"", "GlobalLpPool", global_pool_supports, global_lp_pool_run},
    {"", "Upsample", resize_supports, resize_run},
    {"", "Resize", resize_supports, resize_run},
    {"", "DepthToSpace", block_supports, depth_to_space_run},
    {"", "SpaceToDepth", block_supports, space_to_depth_run},
};

const kiln_gpu_op_table kiln_gpu_ops_cnn = {ops, sizeof ops / sizeof ops[0]};
