/* layout_nchwc.c - chooses the blocked layout (kiln_layout NCHW16C) for the activations a CNN
 * passes from one convolution or pooling to the next, so each kernel reads its input and writes
 * its output as whole 16-channel vectors (src/cpu/nchwc.h).
 *
 * A value is blocked when it is a float32 [N, C, H, W] tensor with C a known multiple of 16,
 * produced by a node of the main graph and read by nodes only (not a graph input or output, not
 * read inside a subgraph), whose producer and every reader have a kernel for it:
 *  - Conv (2-D, constant float32 weights, group 1 or depthwise) reads X and writes Y in either
 *    layout, and so does kiln.FusedConv, except that a depthwise one needs both blocked and
 *    FusedConv's residual Z needs Y's layout;
 *  - MaxPool (without Indices) and AveragePool (2-D) need X and Y in the same layout;
 *  - Add, Sub, Mul, Div (opset 7 on) and kiln.FusedAdd of two [N, C, H, W] values with the same
 *    channels need A, B and Y in one layout: of equal dims, the bytes are combined as they lie;
 *    where N, H or W of one is 1 at run time (a squeeze-excitation scale [N, C, 1, 1], or an
 *    upsampled pyramid level against the full one, which inference cannot prove equal), the
 *    blocked kernel broadcasts them as [N, C / 16, H, W, 16], as ONNX Runtime's
 *    NchwcTransformer does; an operand whose H and W are known to be 1 has the same bytes in
 *    both layouts and may be plain (a constant [1, C, 1, 1]);
 *  - an element-wise node whose output element i depends on element i of its one [N, C, H, W]
 *    input alone (kiln_pass_nchwc_flat_input: an activation between two convolutions, or a
 *    learnable scale or shift of one element) needs X and Y in the same layout and runs its own
 *    kernel on the bytes as they lie;
 *  - a nearest Resize (not tf_crop_and_resize) or Upsample whose scales or sizes, known when
 *    compiling, leave N and C as they are needs X and Y in the same layout;
 *  - GlobalAveragePool and GlobalMaxPool read a blocked X (their [N, C, 1, 1] output is the same
 *    bytes either way);
 *  - Shape reads the dims only.
 * The first choice blocks every value whose producer and readers qualify; then the pairs that
 * must agree are made to, by unblocking, until nothing changes (blocks only ever go). A
 * convolution with both sides plain keeps the plain kernels. */
#include <string.h>

#include "core/dtype.h"
#include "ops/fused.h"
#include "ops/resize.h"
#include "passes/passes.h"

static bool is_op(const kiln_node *n, const char *op) { return !*n->domain && !strcmp(n->op_type, op); }

static bool is_f32_4d(const kiln_ir_value *v)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.dtype == KILN_DTYPE_FLOAT32 && v->type.rank == 4;
}

/* A Conv the blocked kernels run, either side blocked: 2-D, constant float32 weights [M, C/group,
 * kh, kw] of group 1 or depthwise (group = C = M). */
static bool conv_ok(const kiln_node *n, bool *depthwise)
{
    bool fused = kiln_node_is_fused(n, "Conv");
    if ((!is_op(n, "Conv") && !fused) || n->n_in < 2 || n->n_in > (fused ? 4 : 3) || n->n_out != 1 || !is_f32_4d(n->in[0]) ||
        !is_f32_4d(n->out[0]))
        return false;
    const kiln_value *w = kiln_ir_constant(n->in[1]);
    if (!w || w->dtype != KILN_DTYPE_FLOAT32 || w->rank != 4 || !w->numel) return false;
    if (n->n_in >= 3 && n->in[2] && (n->in[2]->type.dtype != KILN_DTYPE_FLOAT32 || n->in[2]->type.rank != 1))
        return false;
    int64_t group = kiln_attr_int(n, "group", 1);
    *depthwise = group > 1 && group == w->dims[0] && w->dims[1] == 1;
    return group == 1 || *depthwise;
}

int kiln_pass_nchwc_flat_input(const kiln_node *n)
{
    if (*n->domain || n->n_out != 1 || !is_f32_4d(n->out[0])) return -1;
    double params[4];
    if (kiln_ops_unary_code(n, params) >= 0) return n->n_in == 1 && is_f32_4d(n->in[0]) ? 0 : -1;
    if (!strcmp(n->op_type, "Clip")) {
        if (n->n_in < 1 || n->n_in > 3 || !is_f32_4d(n->in[0])) return -1;
        for (int i = 1; i < n->n_in; i++)
            if (n->in[i] && !kiln_ir_constant(n->in[i])) return -1; /* the bounds known when compiling */
        return 0;
    }
    bool bin = !strcmp(n->op_type, "Add") || !strcmp(n->op_type, "Sub") || !strcmp(n->op_type, "Mul") ||
               !strcmp(n->op_type, "Div");
    if (!bin || n->opset < 7 || n->n_in != 2) return -1;
    for (int x = 0; x < 2; x++) {
        const kiln_value *k = kiln_ir_constant(n->in[1 - x]);
        if (is_f32_4d(n->in[x]) && k && k->numel == 1 && k->dtype == KILN_DTYPE_FLOAT32) return x;
    }
    return -1;
}

/* A 2-D MaxPool without Indices or AveragePool. */
static bool pool_ok(const kiln_node *n)
{
    int nk = 0;
    bool max = is_op(n, "MaxPool") && n->opset >= 8 && (n->n_out == 1 || !n->out[1]);
    bool avg = is_op(n, "AveragePool") && n->opset >= 7 && n->n_out == 1;
    return (max || avg) && kiln_attr_ints(n, "kernel_shape", &nk) && nk == 2 && is_f32_4d(n->in[0]) &&
           is_f32_4d(n->out[0]);
}

/* An Add, Sub, Mul or Div (opset 7 on: numpy broadcasting) or kiln.FusedAdd of float32 A and B
 * [N, C, H, W] into Y with the same channels: the blocked kernel broadcasts N, H and W. */
static bool binary_ok(const kiln_node *n)
{
    bool op = is_op(n, "Add") || is_op(n, "Sub") || is_op(n, "Mul") || is_op(n, "Div") || kiln_node_is_fused(n, "Add");
    if (!op || n->opset < 7 || n->n_in != 2 || n->n_out != 1 ||
        !is_f32_4d(n->in[0]) || !is_f32_4d(n->in[1]) || !is_f32_4d(n->out[0]))
        return false;
    kiln_dim c = n->out[0]->type.dims[1];
    return kiln_dim_equal(n->in[0]->type.dims[1], c) && kiln_dim_equal(n->in[1]->type.dims[1], c);
}

/* Whether the scales or sizes of Resize / Upsample n with attributes a leave axis ax of X as it
 * is (scale 1, out = in: the reference copies it), known when compiling: scales of a constant or
 * of Upsample-7's attribute, sizes of a constant or of shape arithmetic (stretched, so a size
 * equal to the dim is scale 1). */
static bool resize_keeps(const kiln_node *n, const kiln_resize_attrs *a, int ax)
{
    int i = 0;
    while (i < a->n_axes && a->axes[i] != ax) i++;
    if (i == a->n_axes) return true; /* not among the resized axes */
    const kiln_ir_value *sv = a->scales_in >= 0 && a->scales_in < n->n_in ? n->in[a->scales_in] : NULL;
    const kiln_ir_value *zv = a->sizes_in >= 0 && a->sizes_in < n->n_in ? n->in[a->sizes_in] : NULL;
    bool no_scales = !sv || (sv->type.rank == 1 && kiln_dim_is_const(sv->type.dims[0]) && sv->type.dims[0].c == 0);
    if (zv && no_scales) {
        const kiln_value *z = kiln_ir_constant(zv);
        if (a->ka != KILN_RESIZE_KA_STRETCH) return false;
        if (z && z->numel == a->n_axes && kiln_dtype_is_int(z->dtype))
            return kiln_dim_equal(kiln_dim_const(kiln_load_i64(z->dtype, z->data, i)), n->in[0]->type.dims[ax]);
        return !z && zv->shape_value && zv->shape_value_n == a->n_axes &&
               kiln_dim_equal(zv->shape_value[i], n->in[0]->type.dims[ax]);
    }
    if (a->scales_attr) return a->n_scales_attr == a->n_axes && a->scales_attr[i] == 1.0f;
    const kiln_value *s = kiln_ir_constant(sv);
    return s && s->numel == a->n_axes && kiln_dtype_is_float(s->dtype) && kiln_load_f64(s->dtype, s->data, i) == 1.0;
}

/* A nearest Resize or Upsample of float32 [N, C, H, W] (not tf_crop_and_resize) that resizes
 * only H and W. */
static bool resize_ok(const kiln_node *n)
{
    kiln_resize_attrs a;
    char msg[200];
    bool resize = is_op(n, "Resize") && n->opset >= 10, upsample = is_op(n, "Upsample") && n->opset >= 7;
    if ((!resize && !upsample) || n->n_in < 1 || n->n_out != 1 || !is_f32_4d(n->in[0]) || !is_f32_4d(n->out[0]) ||
        !kiln_resize_parse(n, n->opset, 4, &a, msg, sizeof msg) || a.mode != KILN_RESIZE_NEAREST ||
        a.ct == KILN_RESIZE_CT_TF_CROP)
        return false;
    const kiln_dim *x = n->in[0]->type.dims, *y = n->out[0]->type.dims;
    return kiln_dim_equal(x[0], y[0]) && kiln_dim_equal(x[1], y[1]) && resize_keeps(n, &a, 0) &&
           resize_keeps(n, &a, 1);
}

/* A [N, C, 1, 1] value (H and W known to be 1): its bytes are the same in either layout, so a
 * binary node's operand of this kind need not agree with the others (a squeeze-excitation scale,
 * a constant per-channel scale or shift). */
static bool hw_one(const kiln_ir_value *v)
{
    return is_f32_4d(v) && kiln_dim_is_const(v->type.dims[2]) && v->type.dims[2].c == 1 &&
           kiln_dim_is_const(v->type.dims[3]) && v->type.dims[3].c == 1;
}

/* Whether node n has a kernel that writes v (its output 0) blocked. */
static bool writes_blocked(const kiln_node *n, const kiln_ir_value *v)
{
    bool dw;
    return n->out[0] == v &&
           (conv_ok(n, &dw) || pool_ok(n) || binary_ok(n) || resize_ok(n) || kiln_pass_nchwc_flat_input(n) >= 0);
}

/* Whether node n has a kernel that reads v blocked wherever v is among its inputs. */
static bool reads_blocked(const kiln_node *n, const kiln_ir_value *v)
{
    bool dw;
    if (is_op(n, "Shape")) return true;
    int flat = kiln_pass_nchwc_flat_input(n);
    if (flat >= 0) return n->in[flat] == v; /* not a bound or the other operand */
    if (is_op(n, "GlobalAveragePool") || is_op(n, "GlobalMaxPool"))
        return n->n_in == 1 && n->n_out == 1 && is_f32_4d(n->out[0]);
    if (pool_ok(n)) return n->n_in == 1;
    if (binary_ok(n)) return true;
    if (resize_ok(n)) {
        for (int i = 1; i < n->n_in; i++)
            if (n->in[i] == v) return false; /* as roi, scales or sizes */
        return true;
    }
    if (!conv_ok(n, &dw)) return false;
    for (int i = 1; i < n->n_in; i++)
        if (n->in[i] == v && i != kiln_fused_of(n)->residual) return false; /* as weights or bias */
    return true;
}

/* Whether v may be blocked: see the file's comment. */
static bool candidate(const kiln_graph *g, const kiln_ir_value *v)
{
    kiln_dim c = v->type.dims[1];
    if (!is_f32_4d(v) || v->is_input || v->is_output || v->init || !v->producer || v->producer->graph != g ||
        !kiln_dim_is_const(c) || c.c <= 0 || c.c % 16 || !writes_blocked(v->producer, v))
        return false;
    for (int u = 0; u < v->n_uses; u++)
        if (!reads_blocked(v->uses[u].node, v)) return false;
    return true;
}

static bool has_subgraphs(const kiln_graph *g)
{
    for (int k = 0; k < g->n_nodes; k++)
        for (int a = 0; a < g->nodes[k]->n_attrs; a++)
            if (kiln_attr_graph_count(&g->nodes[k]->attrs[a])) return true;
    return false;
}

static bool blocked(const kiln_ir_value *v) { return v && v->layout == KILN_LAYOUT_NCHW16C; }

/* Makes a and b plain unless both are blocked; true when that changed anything. */
static bool agree(kiln_ir_value *a, kiln_ir_value *b)
{
    if (blocked(a) == blocked(b)) return false;
    if (a) a->layout = KILN_LAYOUT_PLAIN;
    if (b) b->layout = KILN_LAYOUT_PLAIN;
    return true;
}

kiln_status kiln_pass_layout_nchwc(kiln_graph *g, int *blocked_count, kiln_err *err)
{
    (void)err;
    *blocked_count = 0;
    if (has_subgraphs(g)) return KILN_OK; /* their captures would need a reader check of their own */
    for (int i = 0; i < g->n_values; i++)
        if (candidate(g, g->values[i])) g->values[i]->layout = KILN_LAYOUT_NCHW16C;
    for (bool changed = true; changed;) {
        changed = false;
        for (int k = 0; k < g->n_nodes; k++) {
            kiln_node *n = g->nodes[k];
            bool conv = conv_ok(n, &(bool){false}), dw = false;
            if (pool_ok(n) || (conv_ok(n, &dw) && dw) || resize_ok(n)) changed |= agree(n->in[0], n->out[0]);
            int flat = kiln_pass_nchwc_flat_input(n);
            if (flat >= 0) changed |= agree(n->in[flat], n->out[0]);
            if (binary_ok(n))
                for (int i = 0; i < 2; i++)
                    if (!hw_one(n->in[i]) || hw_one(n->out[0])) changed |= agree(n->in[i], n->out[0]);
            int z = kiln_fused_of(n)->residual;
            if (conv && z) changed |= agree(n->in[z], n->out[0]);
        }
    }
    for (int i = 0; i < g->n_values; i++) *blocked_count += blocked(g->values[i]);
    return KILN_OK;
}
