/* kernels_nchwc.c - the kernels of the nodes that read or write a value blocked by 16 channels
 * (kiln_layout NCHW16C, chosen by src/passes/layout_nchwc.c): Conv, MaxPool, AveragePool and
 * GlobalAveragePool over src/cpu/nchwc.h. They never hand a node to the reference kernels,
 * which read plain layouts only: what they cannot run fails with a message. */
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/nchwc.h"
#include "ops/nn_internal.h"

static bool is_blocked(const kiln_ir_value *v) { return v && v->layout == KILN_LAYOUT_NCHW16C; }

static bool touches_blocked(const kiln_node *n)
{
    for (int i = 0; i < n->n_in; i++)
        if (is_blocked(n->in[i])) return true;
    for (int i = 0; i < n->n_out; i++)
        if (is_blocked(n->out[i])) return true;
    return false;
}

static bool f32_4d(const kiln_value *v) { return v && v->dtype == KILN_DTYPE_FLOAT32 && v->rank == 4; }

static void packed_free(void *p) { kiln_cpu_nchwc_conv_free(p); }
static void packed_unpack(const void *p, void *dst) { kiln_cpu_nchwc_conv_unpack(p, dst); }

static kiln_status conv_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_nchwc_conv *p = n->kernel_state;
    if (!p) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for the blocked convolution's weights");
    const kiln_value *X = kiln_run_in(c, 0), *B = n->n_in > 2 ? kiln_run_in(c, 2) : NULL;
    const kiln_fused *f = kiln_fused_of(n);
    const kiln_value *R = f->residual ? kiln_run_in(c, f->residual) : NULL;
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t kh, kw, M, C;
    bool dw = kiln_cpu_nchwc_conv_shape(p, &M, &C, &kh, &kw);
    if (dw) C = M;
    if (!f32_4d(X) || !Y || !f32_4d(Y) || X->dims[1] != C || Y->dims[1] != M || Y->dims[0] != X->dims[0])
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked convolution: X or Y is not float32 [N, %lld, H, W] / [N, %lld, oh, ow]",
                             (long long)C, (long long)M);
    if (B && (B->dtype != KILN_DTYPE_FLOAT32 || B->numel != M))
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked convolution: B is not %lld float32 values", (long long)M);
    if (f->residual && (!f32_4d(R) || memcmp(R->dims, Y->dims, sizeof R->dims[0] * 4)))
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "fused residual input does not match the output");
    kiln_nn_geom g;
    char msg[160];
    if (!kiln_nn_geom_parse(n, 2, &g, msg, sizeof msg)) return kiln_run_fail(c, KILN_ERR_INVALID_ARG, "%s", msg);
    g.kernel[0] = kh, g.kernel[1] = kw;
    int64_t out[2];
    if (!kiln_nn_geom_resolve(&g, X->dims + 2, out) || out[0] != Y->dims[2] || out[1] != Y->dims[3])
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked convolution: the window does not fit X [%lld, %lld]",
                             (long long)X->dims[2], (long long)X->dims[3]);
    if (!Y->numel) return KILN_OK;
    kiln_nchwc_conv_io io = {.x = X->data, .x_blocked = is_blocked(n->in[0]), .N = X->dims[0], .H = X->dims[2],
                             .W = X->dims[3], .y = Y->data, .y_blocked = is_blocked(n->out[0]), .oh = out[0],
                             .ow = out[1], .bias = B ? B->data : NULL, .res = R ? R->data : NULL, .act = &f->act,
                             .strides = {g.strides[0], g.strides[1]}, .dilations = {g.dilations[0], g.dilations[1]},
                             .pads = {g.pads[0], g.pads[1]}, .scratch = kiln_run_scratch(c)};
    kiln_status st = kiln_cpu_nchwc_conv_run(kiln_run_threadpool(c), p, &io);
    if (st == KILN_ERR_NOMEM) return kiln_run_fail(c, st, "blocked convolution: out of memory for the padded input");
    return st ? kiln_run_fail(c, st, "blocked convolution: layouts the channel counts do not allow") : KILN_OK;
}

static kiln_status pool_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_nn_geom g;
    char msg[160];
    if (!f32_4d(X) || !Y || !f32_4d(Y) || X->dims[1] % KILN_NCHWC_BLOCK || !is_blocked(n->in[0]) ||
        !is_blocked(n->out[0]))
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked pooling: X and Y are not both blocked float32 [N, C, H, W]");
    if (!kiln_nn_pool_geom(n, &g, msg, sizeof msg)) return kiln_run_fail(c, KILN_ERR_INVALID_ARG, "%s", msg);
    if (g.nsp != 2)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked pooling: kernel_shape has %d values for 2 spatial dims",
                             g.nsp);
    int64_t out[2];
    if (!kiln_nn_geom_resolve(&g, X->dims + 2, out) || out[0] != Y->dims[2] || out[1] != Y->dims[3] ||
        Y->dims[0] != X->dims[0] || Y->dims[1] != X->dims[1])
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked pooling: the window does not fit X [%lld, %lld]",
                             (long long)X->dims[2], (long long)X->dims[3]);
    kiln_nchwc_pool_io io = {.x = X->data, .y = Y->data, .N = X->dims[0], .C = X->dims[1], .H = X->dims[2],
                             .W = X->dims[3], .oh = out[0], .ow = out[1], .kernel = {g.kernel[0], g.kernel[1]},
                             .strides = {g.strides[0], g.strides[1]}, .dilations = {g.dilations[0], g.dilations[1]},
                             .pads = {g.pads[0], g.pads[1], g.pads[2], g.pads[3]},
                             .max = !strcmp(n->op_type, "MaxPool"),
                             .count_include_pad = kiln_attr_int(n, "count_include_pad", 0) != 0};
    kiln_cpu_nchwc_pool_run(kiln_run_threadpool(c), &io);
    return KILN_OK;
}

static kiln_status global_avg_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!f32_4d(X) || X->dims[1] % KILN_NCHWC_BLOCK || !Y || Y->dtype != KILN_DTYPE_FLOAT32 ||
        Y->numel != X->dims[0] * X->dims[1])
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked GlobalAveragePool: X is not float32 [N, C, H, W]");
    kiln_cpu_nchwc_global_avg(kiln_run_threadpool(c), X->data, Y->data, X->dims[0], X->dims[1],
                              X->dims[2] * X->dims[3]);
    return KILN_OK;
}

static kiln_status unsupported_run(kiln_run_ctx *c)
{
    return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "no kernel for a value blocked by 16 channels");
}

/* Conv and kiln.FusedConv, packing the weights into n->kernel_state */
static kiln_kernel_fn select_conv(kiln_node *n)
{
    if (!n->kernel_state) {
        const kiln_value *w = kiln_ir_constant(n->in[1]);
        bool dw = kiln_attr_int(n, "group", 1) > 1;
        if (w && w->rank == 4 && w->dtype == KILN_DTYPE_FLOAT32)
            n->kernel_state = kiln_cpu_nchwc_conv_pack(w->data, w->dims[0], w->dims[1], w->dims[2], w->dims[3], dw);
        n->kernel_state_free = packed_free;
        if (n->kernel_state && kiln_node_release_constant(n, 1)) {
            n->kernel_state_unpack = packed_unpack;
            n->released_in = 1;
        }
    }
    return conv_run;
}

static kiln_kernel_fn select_pool(kiln_node *n) { return (void)n, pool_run; }
static kiln_kernel_fn select_global_avg(kiln_node *n) { return (void)n, global_avg_run; }

static const kiln_cpu_kernel kernels[] = {
    {"", "Conv", select_conv},
    {"kiln", "FusedConv", select_conv},
    {"", "MaxPool", select_pool},
    {"", "AveragePool", select_pool},
    {"", "GlobalAveragePool", select_global_avg},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_nchwc, kernels);

kiln_kernel_fn kiln_cpu_select_nchwc(kiln_node *n)
{
    if (!touches_blocked(n) || (n->op->flags & KILN_OP_READS_TYPE_ONLY)) return NULL;
    const kiln_cpu_kernel *k = kiln_cpu_kernel_find(&kiln_cpu_kernels_nchwc, n->op);
    return k ? k->select(n) : unsupported_run;
}
