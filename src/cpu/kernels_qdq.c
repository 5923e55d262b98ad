/* kernels_qdq.c - what QDQ graphs run besides the int8 GEMM once fuse_qdq.c has rewritten them:
 * per-tensor QuantizeLinear of float32 into uint8 / int8 (ORT's order: x / scale, rounded half to
 * even, plus the zero point, saturated: dynquant.h's pass) and 2-D MaxPool on
 * 8-bit values (no Indices). Every case not covered runs the reference. */
#include <math.h>
#include <string.h>

#include "core/threadpool.h"
#include "cpu/dynquant.h"
#include "cpu/kernels.h"
#include "ops/nn_internal.h"
#include "ops/util.h"

static bool is_8bit(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

/* Whether some x is NaN (QuantizeLinear's NaN rule is the reference's) */
KILN_VECTORIZE static bool has_nan(const float *x, int64_t n)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= x[i] != x[i];
    return bad;
}

static kiln_status quantize_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *s = kiln_run_in(c, 1), *zp = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || !is_8bit(Y->dtype) || !s || s->dtype != KILN_DTYPE_FLOAT32 ||
        s->numel != 1 || !zp || zp->numel != 1 || zp->dtype != Y->dtype || X->numel != Y->numel ||
        kiln_attr_int(kiln_run_node(c), "saturate", 1) != 1)
        return kiln_cpu_reference(c);
    float scale = ((const float *)s->data)[0];
    if (!(scale > 0.0f) || isinf(scale) || has_nan(X->data, X->numel)) return kiln_cpu_reference(c);
    kiln_cpu_quantize(kiln_run_threadpool(c), X->data, X->numel, scale, (int32_t)kiln_load_i64(zp->dtype, zp->data, 0),
                      Y->dtype == KILN_DTYPE_INT8, Y->data);
    return KILN_OK;
}

/* ---- 8-bit 2-D MaxPool ---- */

typedef struct pool_job {
    const kiln_nn_geom *g;
    const uint8_t *x;
    uint8_t *y;
    bool is_signed;
    int64_t H, W, oh, ow;
} pool_job;

KILN_VECTORIZE static void pool_planes(void *ctx, int64_t begin, int64_t end)
{
    const pool_job *j = ctx;
    const kiln_nn_geom *g = j->g;
    uint8_t flip = j->is_signed ? 0x80 : 0; /* int8 compared as uint8 after flipping the sign bit */
    int64_t sw = g->strides[1], tlo[64], thi[64], kw = g->kernel[1] <= 64 ? g->kernel[1] : 0;
    /* output columns [tlo, thi) whose tap kx falls inside the row (ix = ox * sw - pad + kx * dilation) */
    for (int64_t kx = 0; kx < kw; kx++) {
        int64_t off = g->pads[1] - kx * g->dilations[1], r = j->W - 1 + off;
        tlo[kx] = off <= 0 ? 0 : (off + sw - 1) / sw;
        thi[kx] = r < 0 ? 0 : r / sw + 1 < j->ow ? r / sw + 1 : j->ow;
    }
    uint8_t best[256];
    for (int64_t p = begin; p < end; p++) {
        const uint8_t *x = j->x + p * j->H * j->W;
        uint8_t *y = j->y + p * j->oh * j->ow;
        for (int64_t oy = 0; oy < j->oh; oy++)
            for (int64_t o0 = 0; o0 < j->ow; o0 += 256) {
                int64_t nb = j->ow - o0 < 256 ? j->ow - o0 : 256;
                memset(best, 0, (size_t)nb);
                for (int64_t ky = 0; ky < g->kernel[0]; ky++) {
                    int64_t iy = oy * g->strides[0] - g->pads[0] + ky * g->dilations[0];
                    if (iy < 0 || iy >= j->H) continue;
                    const uint8_t *xr = x + iy * j->W;
                    for (int64_t kx = 0; kx < kw; kx++) {
                        int64_t a = tlo[kx] > o0 ? tlo[kx] : o0, b = thi[kx] < o0 + nb ? thi[kx] : o0 + nb;
                        int64_t base = kx * g->dilations[1] - g->pads[1];
                        for (int64_t o = a; o < b; o++) {
                            uint8_t v = xr[o * sw + base] ^ flip;
                            best[o - o0] = v > best[o - o0] ? v : best[o - o0];
                        }
                    }
                }
                for (int64_t i = 0; i < nb; i++) y[oy * j->ow + o0 + i] = best[i] ^ flip;
            }
    }
}

static kiln_status maxpool8_run(kiln_run_ctx *c)
{
    const kiln_node *nd = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || !is_8bit(X->dtype) || Y->dtype != X->dtype || X->rank != 4 || Y->rank != 4 ||
        (kiln_run_n_out(c) > 1 && kiln_run_has_out(c, 1)))
        return kiln_cpu_reference(c);
    int nk;
    const int64_t *ks = kiln_attr_ints(nd, "kernel_shape", &nk);
    kiln_nn_geom g;
    char msg[160];
    if (!ks || nk != 2 || !kiln_nn_geom_parse(nd, 2, &g, msg, sizeof msg) || g.ceil_mode) return kiln_cpu_reference(c);
    for (int i = 0; i < 2; i++) {
        if (ks[i] < 1 || ks[i] > 64) return kiln_cpu_reference(c);
        g.kernel[i] = ks[i];
    }
    int64_t od[2];
    if (!kiln_nn_geom_resolve(&g, X->dims + 2, od) || od[0] != Y->dims[2] || od[1] != Y->dims[3] ||
        Y->dims[0] != X->dims[0] || Y->dims[1] != X->dims[1])
        return kiln_cpu_reference(c);
    /* every window must hold an input pixel (else the reference's -inf rule applies) */
    for (int i = 0; i < 2; i++)
        if (g.pads[i] >= g.kernel[i] || g.pads[2 + i] >= g.kernel[i]) return kiln_cpu_reference(c);
    pool_job j = {.g = &g, .x = X->data, .y = Y->data, .is_signed = X->dtype == KILN_DTYPE_INT8, .H = X->dims[2],
                  .W = X->dims[3], .oh = od[0], .ow = od[1]};
    kiln_threadpool_parallel_for(kiln_run_threadpool(c), X->dims[0] * X->dims[1], pool_planes, &j);
    return KILN_OK;
}

static kiln_kernel_fn select_quantize(kiln_node *n)
{
    return n->n_in == 3 && n->n_out >= 1 && n->in[0] && n->out[0] && n->in[0]->type.dtype == KILN_DTYPE_FLOAT32 &&
                   is_8bit(n->out[0]->type.dtype)
               ? quantize_run
               : NULL;
}

static kiln_kernel_fn select_maxpool8(kiln_node *n)
{
    return n->n_in >= 1 && n->n_out >= 1 && n->in[0] && n->out[0] && n->opset >= 12 && is_8bit(n->in[0]->type.dtype)
               ? maxpool8_run
               : NULL;
}

static const kiln_cpu_kernel kernels[] = {
    {"", "QuantizeLinear", select_quantize},
    {"", "MaxPool", select_maxpool8},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_qdq, kernels);
