/* kernels_qdq.c - what QDQ graphs run besides the int8 GEMM once fuse_qdq.c has rewritten them:
 * per-tensor QuantizeLinear of float32 into uint8 / int8 (ORT's order: x / scale, rounded half to
 * even, plus the zero point, saturated: dynquant.h's pass), 2-D MaxPool on 8-bit values (no
 * Indices) and kiln.ChannelLookup (64 bytes at a time by AVX-512 VBMI byte permutes where the
 * CPU has them). Every case not covered runs the reference. */
#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
#endif

#include "core/threadpool.h"
#include "cpu/dynquant.h"
#include "cpu/kernels.h"
#include "ops/nn_internal.h"
#include "ops/util.h"

static bool is_8bit(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

static kiln_status quantize_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *s = kiln_run_in(c, 1), *zp = kiln_run_in(c, 2);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || !is_8bit(Y->dtype) || !s || s->dtype != KILN_DTYPE_FLOAT32 ||
        s->numel != 1 || !zp || zp->numel != 1 || zp->dtype != Y->dtype || X->numel != Y->numel ||
        kiln_attr_int(kiln_run_node(c), "saturate", 1) != 1)
        return kiln_cpu_reference(c);
    float scale = ((const float *)s->data)[0];
    if (!(scale > 0.0f) || isinf(scale)) return kiln_cpu_reference(c);
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

/* ---- kiln.ChannelLookup ---- */

typedef struct lookup_job {
    const uint8_t *x, *t;
    uint8_t *y;
    int64_t C, S; /* channels, elements per plane */
} lookup_job;

#if HAVE_X86
/* y[i] = t[x[i]] for i < n: two 128-entry permutes on the low 7 bits, the sign bit choosing */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void lookup_vbmi(const uint8_t *x, const uint8_t *t,
                                                                             uint8_t *y, int64_t n)
{
    __m512i t0 = _mm512_loadu_si512(t), t1 = _mm512_loadu_si512(t + 64);
    __m512i t2 = _mm512_loadu_si512(t + 128), t3 = _mm512_loadu_si512(t + 192);
    for (int64_t i = 0; i < n; i += 64) {
        __mmask64 k = n - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (n - i)) - 1);
        __m512i v = _mm512_maskz_loadu_epi8(k, x + i);
        __m512i lo = _mm512_permutex2var_epi8(t0, v, t1), hi = _mm512_permutex2var_epi8(t2, v, t3);
        _mm512_mask_storeu_epi8(y + i, k, _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi));
    }
}
#endif

static void lookup_planes(void *ctx, int64_t begin, int64_t end)
{
    const lookup_job *j = ctx;
#if HAVE_X86
    bool vbmi = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw");
#endif
    for (int64_t p = begin; p < end; p++) {
        const uint8_t *restrict x = j->x + p * j->S, *restrict t = j->t + p % j->C * 256;
        uint8_t *restrict y = j->y + p * j->S;
#if HAVE_X86
        if (vbmi) {
            lookup_vbmi(x, t, y, j->S);
            continue;
        }
#endif
        for (int64_t i = 0; i < j->S; i++) y[i] = t[x[i]];
    }
}

static kiln_status lookup_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *T = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->rank < 2 || T->rank != 2 || T->dims[1] != 256 || T->dims[0] != X->dims[1] || !X->numel)
        return kiln_cpu_reference(c);
    lookup_job j = {.x = X->data, .t = T->data, .y = Y->data, .C = X->dims[1], .S = X->numel / (X->dims[0] * X->dims[1])};
    int64_t planes = X->dims[0] * j.C;
    kiln_threadpool_parallel_for(X->numel < (1 << 16) ? NULL : kiln_run_threadpool(c), planes, lookup_planes, &j);
    return KILN_OK;
}

static kiln_kernel_fn select_lookup(kiln_node *n)
{
    (void)n;
    return lookup_run;
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
    {"kiln", "ChannelLookup", select_lookup},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_qdq, kernels);
