/* kernels_qmatmul_batched.c - QLinearMatMul of two activations in batches (the Q K^T and P V
 * products of a statically quantized transformer: A [..., M, K], B [..., K, N], per-tensor
 * parameters), where kernels_quant.c's path packs B for every batch: small products summed
 * directly in int32, row by row over B's contiguous rows, then requantized as MLAS does
 * (requant.h). Constant B keeps kernels_quant.c's kernel (this
 * table comes before it), and so do products over 64K multiply-adds per batch; per-row/column
 * parameters take the reference. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/requant.h"

static bool is_q8(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

static int q8_at(bool sg, const uint8_t *p, int64_t i) { return sg ? (int8_t)p[i] : p[i]; }

static bool scalar_param(const kiln_value *v, kiln_dtype dt)
{
    return v && v->numel == 1 && v->dtype == dt;
}

/* kernels_quant.c's kernel for the node, for products too large to sum directly */
typedef struct qmmb_state {
    kiln_kernel_fn big;
} qmmb_state;

static kiln_status qmmb_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *as = kiln_run_in(c, 1), *az = kiln_run_in(c, 2), *B = kiln_run_in(c, 3);
    const kiln_value *bs = kiln_run_in(c, 4), *bz = kiln_run_in(c, 5), *ys = kiln_run_in(c, 6), *yz = kiln_run_in(c, 7);
    kiln_value *Y = kiln_run_out(c, 0);
    int r = A->rank;
    if (!is_q8(A->dtype) || !is_q8(B->dtype) || !Y || !is_q8(Y->dtype) || r < 3 || B->rank != r ||
        !scalar_param(as, KILN_DTYPE_FLOAT32) || !scalar_param(bs, KILN_DTYPE_FLOAT32) || !scalar_param(ys, KILN_DTYPE_FLOAT32) ||
        (az && !scalar_param(az, A->dtype)) || (bz && !scalar_param(bz, B->dtype)) || !scalar_param(yz, Y->dtype))
        return kiln_cpu_reference(c);
    int64_t M = A->dims[r - 2], K = A->dims[r - 1], N = B->dims[r - 1], batch = 1;
    for (int k = 0; k < r - 2; k++) {
        if (A->dims[k] != B->dims[k] || Y->dims[k] != A->dims[k]) return kiln_cpu_reference(c);
        batch *= A->dims[k];
    }
    if (B->dims[r - 2] != K || Y->dims[r - 2] != M || Y->dims[r - 1] != N) return kiln_cpu_reference(c);
    const qmmb_state *s = n->kernel_state;
    if (M * K * N > (1 << 16) && s && s->big) return s->big(c);
    bool sa = A->dtype == KILN_DTYPE_INT8, sb = B->dtype == KILN_DTYPE_INT8, sy = Y->dtype == KILN_DTYPE_INT8;
    int za = az ? q8_at(sa, az->data, 0) : 0, zb = bz ? q8_at(sb, bz->data, 0) : 0, zy = q8_at(sy, yz->data, 0);
    float mult = *(const float *)as->data * *(const float *)bs->data / *(const float *)ys->data;
    int lo_i = sy ? -128 : 0, hi_i = sy ? 127 : 255;
    float lo = (float)(lo_i - zy), hi = (float)(hi_i - zy);
    int32_t *acc = malloc((size_t)(N > 0 ? N : 1) * sizeof *acc);
    int32_t *bw = malloc((size_t)(K * N > 0 ? K * N : 1) * sizeof *bw);
    if (!acc || !bw) {
        free(acc);
        free(bw);
        return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    }
    const uint8_t *a = A->data, *b = B->data;
    uint8_t *y = Y->data;
    for (int64_t t = 0; t < batch; t++) {
        for (int64_t i = 0; i < K * N; i++) bw[i] = q8_at(sb, b, t * K * N + i) - zb;
        for (int64_t i = 0; i < M; i++) {
            memset(acc, 0, (size_t)N * sizeof *acc);
            for (int64_t k = 0; k < K; k++) {
                int32_t av = q8_at(sa, a, (t * M + i) * K + k) - za;
                const int32_t *brow = bw + k * N;
                for (int64_t j = 0; j < N; j++) acc[j] += av * brow[j];
            }
            kiln_cpu_requant_line(NULL, acc, N, 0, mult, lo, hi, zy, y + (t * M + i) * N);
        }
    }
    free(acc);
    free(bw);
    return KILN_OK;
}

static kiln_kernel_fn select_qmmb(kiln_node *n)
{
    if (n->n_in < 8 || !n->in[0] || !n->in[3] || kiln_ir_constant(n->in[3]) || n->in[0]->type.rank < 3 ||
        n->in[3]->type.rank != n->in[0]->type.rank)
        return NULL;
    const kiln_cpu_kernel *q = kiln_cpu_kernel_find(&kiln_cpu_kernels_quant, n->op);
    kiln_kernel_fn big = q ? q->select(n) : NULL;
    if (n->kernel_state) return big; /* it keeps state of its own: all of the node is its */
    qmmb_state *s = calloc(1, sizeof *s);
    if (!s) return big;
    s->big = big;
    n->kernel_state = s;
    n->kernel_state_free = free;
    return qmmb_run;
}

static const kiln_cpu_kernel kernels[] = {
    {"", "QLinearMatMul", select_qmmb},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_qmatmul_batched, kernels);
