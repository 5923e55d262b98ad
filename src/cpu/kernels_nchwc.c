/* kernels_nchwc.c - the kernels of the nodes that read or write a value blocked by 16 channels
 * (kiln_layout NCHW16C, chosen by src/passes/layout_nchwc.c): Conv, MaxPool, AveragePool,
 * GlobalAveragePool, GlobalMaxPool and nearest Resize / Upsample over src/cpu/nchwc.h, and Add /
 * Sub / Mul / Div / kiln.FusedAdd of two blocked values over the element-wise kernel
 * (kernels_ew.c). They never hand a node to the reference kernels, which read plain layouts only:
 * what they cannot run fails with a message. An element-wise node of one blocked input
 * (kiln_pass_nchwc_flat_input) keeps its own kernel, which computes element i from element i. */
#include <string.h>

#include "core/scratch.h"
#include "cpu/kernels.h"
#include "cpu/nchwc.h"
#include "ops/nn_internal.h"
#include "ops/resize.h"
#include "passes/passes.h"

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

/* GlobalAveragePool and GlobalMaxPool of a blocked X */
static kiln_status global_pool_run(kiln_run_ctx *c)
{
    const char *op = kiln_run_node(c)->op_type;
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!f32_4d(X) || X->dims[1] % KILN_NCHWC_BLOCK || !Y || Y->dtype != KILN_DTYPE_FLOAT32 ||
        Y->numel != X->dims[0] * X->dims[1])
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked %s: X is not float32 [N, C, H, W]", op);
    kiln_cpu_nchwc_global_pool(kiln_run_threadpool(c), X->data, Y->data, X->dims[0], X->dims[1],
                               X->dims[2] * X->dims[3], !strcmp(op, "GlobalMaxPool"));
    return KILN_OK;
}

/* v [N, C, H, W] blocked as the 5-D tensor [N, C / 16, H, W, 16] it is stored as */
static kiln_value blocks_5d(const kiln_value *v)
{
    kiln_value b = *v;
    b.rank = 5;
    b.dims[1] = v->dims[1] / KILN_NCHWC_BLOCK;
    b.dims[4] = KILN_NCHWC_BLOCK;
    memcpy(b.dims + 2, v->dims + 2, 2 * sizeof v->dims[0]);
    return b;
}

/* A [N, C, 1, 1] tensor: the same bytes blocked or plain. */
static bool hw_one(const kiln_value *v) { return v->dims[2] == 1 && v->dims[3] == 1; }

/* Add, Sub, Mul, Div and kiln.FusedAdd of blocked A and B into blocked Y (any of them may be
 * plain where its H and W are 1: the same bytes): of equal dims, the
 * element-wise kernel's one flat loop; else (N, H or W of A or B 1 where Y's is not) that
 * kernel's broadcast over the 5-D tensors the values are stored as, [N, C / 16, H, W, 16], whose
 * channels line up. */
static kiln_status binary_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const char *name = n->op_type;
    kiln_bin_op op = !strcmp(name, "Sub") ? KILN_BIN_SUB : !strcmp(name, "Mul") ? KILN_BIN_MUL
                     : !strcmp(name, "Div") ? KILN_BIN_DIV : KILN_BIN_ADD;
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!f32_4d(A) || !f32_4d(B) || !Y || !f32_4d(Y) || !(is_blocked(n->in[0]) || hw_one(A)) ||
        !(is_blocked(n->in[1]) || hw_one(B)) || !(is_blocked(n->out[0]) || hw_one(Y)) || Y->dims[1] % KILN_NCHWC_BLOCK)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked %s: A, B and Y are not all blocked float32 [N, C, H, W]", name);
    bool same = true;
    for (int k = 0; k < 4; k++) {
        bool a = A->dims[k] == Y->dims[k], b = B->dims[k] == Y->dims[k];
        same = same && a && b;
        if (!(a || (k != 1 && A->dims[k] == 1)) || !(b || (k != 1 && B->dims[k] == 1)))
            return kiln_run_fail(c, KILN_ERR_RUNTIME,
                                 "blocked %s: A [%lld, %lld, %lld, %lld] and B [%lld, %lld, %lld, %lld] do not have "
                                 "Y's dims [%lld, %lld, %lld, %lld] or 1 in N, H and W",
                                 name, (long long)A->dims[0], (long long)A->dims[1], (long long)A->dims[2],
                                 (long long)A->dims[3], (long long)B->dims[0], (long long)B->dims[1],
                                 (long long)B->dims[2], (long long)B->dims[3], (long long)Y->dims[0],
                                 (long long)Y->dims[1], (long long)Y->dims[2], (long long)Y->dims[3]);
    }
    const kiln_act *act = &kiln_fused_of(n)->act;
    bool done;
    if (same) {
        done = kiln_cpu_binary_f32(kiln_run_threadpool(c), op, A, B, Y, act);
    } else {
        kiln_value a5 = blocks_5d(A), b5 = blocks_5d(B), y5 = blocks_5d(Y);
        done = kiln_cpu_binary_f32(kiln_run_threadpool(c), op, &a5, &b5, &y5, act);
    }
    return done ? KILN_OK : kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked %s: a broadcast the kernel does not take", name);
}

/* Nearest Resize / Upsample of H and W between blocked values: the reference's plan and source
 * indices (src/ops/resize.h), the N and C axes left as they are. */
static kiln_status resize_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!f32_4d(X) || !Y || !f32_4d(Y) || X->dims[1] % KILN_NCHWC_BLOCK || !is_blocked(n->in[0]) ||
        !is_blocked(n->out[0]))
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked Resize: X and Y are not both blocked float32 [N, C, H, W]");
    kiln_resize_attrs a;
    char msg[200];
    if (!kiln_resize_parse(n, kiln_run_opset(c), 4, &a, msg, sizeof msg))
        return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    if (a.mode != KILN_RESIZE_NEAREST || a.ct == KILN_RESIZE_CT_TF_CROP)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked Resize: not a nearest resize");
    const kiln_value *scales = a.scales_in >= 0 ? kiln_run_in(c, a.scales_in) : NULL;
    const kiln_value *sizes = a.sizes_in >= 0 ? kiln_run_in(c, a.sizes_in) : NULL;
    if (scales && scales->numel == 0 && sizes) scales = NULL;
    int64_t out[4];
    double scale[4];
    kiln_status st = kiln_resize_plan(&a, 4, X->dims, scales, scales ? NULL : sizes, out, scale, msg, sizeof msg);
    if (st) return kiln_run_fail(c, st, "%s", msg);
    if (out[0] != X->dims[0] || scale[0] != 1.0 || out[1] != X->dims[1] || scale[1] != 1.0)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked Resize: resizes N or C (scales %g, %g)", scale[0], scale[1]);
    if (memcmp(out, Y->dims, sizeof out))
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "blocked Resize: Y is not [%lld, %lld, %lld, %lld]",
                             (long long)out[0], (long long)out[1], (long long)out[2], (long long)out[3]);
    if (!Y->numel) return KILN_OK;
    if (!X->numel) return kiln_run_fail(c, KILN_ERR_SHAPE, "cannot resize an empty input to a non-empty output");
    kiln_scratch *scratch = kiln_run_scratch(c);
    int64_t *iy = kiln_scratch_get(scratch, (size_t)(out[2] + out[3]) * sizeof *iy);
    if (!iy) return kiln_run_fail(c, KILN_ERR_NOMEM, "blocked Resize: out of memory for its index tables");
    kiln_resize_nearest_index(&a, scale[2], X->dims[2], out[2], iy);
    kiln_resize_nearest_index(&a, scale[3], X->dims[3], out[3], iy + out[2]);
    kiln_nchwc_resize_io io = {.x = X->data, .y = Y->data, .N = X->dims[0], .C = X->dims[1], .H = X->dims[2],
                               .W = X->dims[3], .oh = out[2], .ow = out[3], .iy = iy, .ix = iy + out[2]};
    kiln_cpu_nchwc_resize_nearest(kiln_run_threadpool(c), &io);
    kiln_scratch_put(scratch, iy);
    return KILN_OK;
}

static kiln_status unsupported_run(kiln_run_ctx *c)
{
    return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "no kernel for a value blocked by 16 channels");
}

/* Conv and kiln.FusedConv, packing the weights into n->kernel_state */
kiln_kernel_fn kiln_cpu_nchwc_select_conv(kiln_node *n)
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
static kiln_kernel_fn select_global_pool(kiln_node *n) { return (void)n, global_pool_run; }
static kiln_kernel_fn select_binary(kiln_node *n) { return (void)n, binary_run; }
static kiln_kernel_fn select_resize(kiln_node *n) { return (void)n, resize_run; }

static const kiln_cpu_kernel kernels[] = {
    {"", "Conv", kiln_cpu_nchwc_select_conv},
    {"kiln", "FusedConv", kiln_cpu_nchwc_select_conv},
    {"", "MaxPool", select_pool},
    {"", "AveragePool", select_pool},
    {"", "GlobalAveragePool", select_global_pool},
    {"", "GlobalMaxPool", select_global_pool},
    {"", "Add", select_binary},
    {"", "Sub", select_binary},
    {"", "Mul", select_binary},
    {"", "Div", select_binary},
    {"kiln", "FusedAdd", select_binary},
    {"", "Resize", select_resize},
    {"", "Upsample", select_resize},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_nchwc, kernels);

kiln_kernel_fn kiln_cpu_select_nchwc(kiln_node *n)
{
    if (!touches_blocked(n) || (n->op->flags & KILN_OP_READS_TYPE_ONLY) || kiln_pass_nchwc_flat_input(n) >= 0)
        return NULL;
    const kiln_cpu_kernel *k = kiln_cpu_kernel_find(&kiln_cpu_kernels_nchwc, n->op);
    return k ? k->select(n) : unsupported_run;
}
