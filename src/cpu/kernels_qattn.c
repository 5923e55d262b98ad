/* kernels_qattn.c - the CPU kernel of com.microsoft QAttention (src/ops/contrib_qattn.c): the
 * Q/K/V projection on the int8 GEMM (qgemm.h) with the constant weight packed once, scaled by
 * input_scale * weight_scale[col] plus the bias as ONNX Runtime's output processor does, then the
 * attention core of the float Attention kernel (kiln_cpu_attn_f32) reading Q, K and V in place,
 * with ORT's mask forms (contrib_attn.h). A past state, qkv_hidden_sizes or non-constant weights
 * take the reference kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/qgemm.h"
#include "ops/contrib_attn.h"

enum { Q_X, Q_W, Q_BIAS, Q_XS, Q_WS, Q_MASK, Q_XZ, Q_WZ, Q_PAST };

typedef struct qattn_state {
    kiln_qgemm_packed_b *w; /* [Hin, 3D] */
    int32_t *wz;            /* [3D] */
    float *ws;              /* [3D] */
    int64_t Hin, D3;
} qattn_state;

static void state_free(void *p)
{
    qattn_state *s = p;
    if (!s) return;
    kiln_qgemm_packed_b_free(s->w);
    free(s->wz);
    free(s->ws);
    free(s);
}

typedef struct proj_tile {
    const qattn_state *s;
    float xs;
    const float *bias;
    float *qkv; /* [rows, 3D] */
} proj_tile;

/* acc * (input_scale * weight_scale[j]) + bias[j] over one finished block */
static void proj_epilogue(void *ctx, int32_t *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n)
{
    const proj_tile *t = ctx;
    int64_t D3 = t->s->D3;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int64_t col = j0 + j;
            t->qkv[(i0 + i) * D3 + col] = (float)c[i * ldc + j] * (t->xs * t->s->ws[col]) + (t->bias ? t->bias[col] : 0.0f);
        }
}

static kiln_status qattn_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const qattn_state *s = n->kernel_state;
    const kiln_value *X = kiln_run_in(c, Q_X), *bias = kiln_run_in(c, Q_BIAS), *xs = kiln_run_in(c, Q_XS),
                     *mask = kiln_run_in(c, Q_MASK), *xz = kiln_run_in(c, Q_XZ);
    if (kiln_run_in(c, Q_PAST) || kiln_run_has_out(c, 1)) return kiln_cpu_reference(c);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t N = kiln_attr_int(n, "num_heads", 0);
    if (X->rank != 3 || X->dims[2] != s->Hin || (X->dtype != KILN_DTYPE_UINT8 && X->dtype != KILN_DTYPE_INT8) || N <= 0 ||
        s->D3 % (3 * N))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "input must be 8-bit [B, S, %lld]", (long long)s->Hin);
    if (!xs || xs->dtype != KILN_DTYPE_FLOAT32 || xs->numel != 1 || (xz && (xz->numel != 1 || xz->dtype != X->dtype)))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "input_scale must be a float32 scalar and input_zero_point a scalar of the input's type");
    if (bias && (bias->dtype != KILN_DTYPE_FLOAT32 || bias->numel != s->D3))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "bias must be float32 [%lld]", (long long)s->D3);
    int64_t B = X->dims[0], S = X->dims[1], D3 = s->D3, D = D3 / 3, Hd = D / N, T = S;
    char msg[256];
    if (!kiln_contrib_attn_mask_ok(mask, B, S, 0, T, msg, sizeof msg)) return kiln_run_fail(c, KILN_ERR_SHAPE, "%s", msg);
    if (!Y->numel) return KILN_OK;
    bool causal = kiln_attr_int(n, "unidirectional", 0) && S > 1, per_row = kiln_contrib_attn_mask_per_row(mask, causal);
    float *qkv = malloc((size_t)(B * S * D3) * sizeof *qkv);
    int32_t *acc = malloc((size_t)(B * S * D3) * sizeof *acc);
    float *m = mask || causal ? malloc((size_t)(B * S * T) * sizeof *m) : NULL;
    kiln_status st = KILN_OK;
    if (!qkv || !acc || ((mask || causal) && !m)) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    int32_t az = !xz ? 0 : X->dtype == KILN_DTYPE_INT8 ? *(const int8_t *)xz->data : *(const uint8_t *)xz->data;
    proj_tile tile = {s, *(const float *)xs->data, bias ? bias->data : NULL, qkv};
    kiln_qgemm_ctx ctx = {.pool = kiln_run_threadpool(c), .scratch = kiln_run_scratch(c)};
    kiln_qgemm_args a = {.M = B * S, .N = D3, .K = s->Hin, .A = X->data, .lda = s->Hin, .a_signed = X->dtype == KILN_DTYPE_INT8,
                         .a_zp = az, .pb = s->w, .b_zp = s->wz, .n_bzp = D3, .C = acc, .ldc = D3, .tile = proj_epilogue,
                         .tile_ctx = &tile};
    if ((st = kiln_qgemm(&ctx, &a))) {
        st = kiln_run_fail(c, st, "int8 GEMM failed");
        goto out;
    }
    if (m) kiln_contrib_attn_mask_fill(mask, causal, B, S, 0, T, kiln_attr_float(n, "mask_filter_value", -10000.0f), m);
    float scale = kiln_attr_float(n, "scale", 0.0f);
    kiln_cpu_attn at = {.q = qkv, .k = qkv + D, .v = qkv + 2 * D, .mask = m, .y = Y->data, .B = B, .Hq = N, .Hkv = N,
                        .Sq = S, .total = T, .Dk = Hd, .Dv = Hd, .q_b = S * D3, .q_h = Hd, .q_s = D3, .k_b = S * D3,
                        .k_h = Hd, .k_s = D3, .v_b = S * D3, .v_h = Hd, .v_s = D3, .y_b = S * D, .y_h = Hd, .y_s = D,
                        .m_b = per_row ? S * T : T, .m_h = 0, .m_s = per_row ? T : 0, .m_len = T,
                        .scale = scale > 0 ? scale : 1.0f / sqrtf((float)Hd)};
    st = kiln_cpu_attn_f32(c, &at);
out:
    free(qkv);
    free(acc);
    free(m);
    return st;
}

static kiln_kernel_fn select_qattn(kiln_node *n)
{
    if (kiln_node_attr(n, "qkv_hidden_sizes") || n->n_in <= Q_WS) return NULL;
    const kiln_value *W = kiln_ir_constant(n->in[Q_W]), *ws = kiln_ir_constant(n->in[Q_WS]);
    const kiln_value *wz = n->n_in > Q_WZ && n->in[Q_WZ] ? kiln_ir_constant(n->in[Q_WZ]) : NULL;
    bool has_wz = n->n_in > Q_WZ && n->in[Q_WZ];
    if (!W || W->rank != 2 || (W->dtype != KILN_DTYPE_INT8 && W->dtype != KILN_DTYPE_UINT8) || !ws ||
        ws->dtype != KILN_DTYPE_FLOAT32 || (has_wz && !wz))
        return NULL;
    int64_t Hin = W->dims[0], D3 = W->dims[1];
    if ((ws->numel != 1 && ws->numel != D3) || (wz && (wz->dtype != W->dtype || (wz->numel != 1 && wz->numel != D3))))
        return NULL;
    if (n->kernel_state) return qattn_run;
    qattn_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->Hin = Hin, s->D3 = D3;
    s->wz = malloc((size_t)D3 * sizeof *s->wz), s->ws = malloc((size_t)D3 * sizeof *s->ws);
    kiln_qgemm_ctx ctx = {0};
    bool sg = W->dtype == KILN_DTYPE_INT8;
    if (!s->wz || !s->ws || kiln_qgemm_packed_b_create(&ctx, Hin, D3, W->data, D3, sg, &s->w)) {
        state_free(s);
        return NULL;
    }
    for (int64_t j = 0; j < D3; j++) {
        int64_t i = ws->numel == 1 ? 0 : j, iz = wz && wz->numel == 1 ? 0 : j;
        s->ws[j] = ((const float *)ws->data)[i];
        s->wz[j] = !wz ? 0 : sg ? ((const int8_t *)wz->data)[iz] : ((const uint8_t *)wz->data)[iz];
    }
    n->kernel_state = s;
    n->kernel_state_free = state_free;
    return qattn_run;
}

static const kiln_cpu_kernel kernels[] = {
    {"com.microsoft", "QAttention", select_qattn},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_qattn, kernels);
