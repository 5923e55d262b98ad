/* fuse_activation.c - an element-wise activation that is the only reader of a float32 Conv's,
 * Gemm's, MatMul's (by constant 2-D weights) or Add's output, or of their kiln fused forms',
 * joins that node: it becomes kiln.FusedConv / FusedGemm / FusedMatMul / FusedAdd with the
 * activation as attributes (src/ops/fused.h) and produces the activation's output. The CPU
 * provider applies it while the output tile is still in cache, and the activation's pass over
 * memory disappears. The GPU's form
 * (kiln_pass_fuse_activation_gpu) joins only a Relu to a Conv, of any float dtype: cuDNN applies
 * it in the convolution's epilogue. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "ops/eval.h"
#include "ops/fused.h"
#include "passes/passes.h"

/* The constant float32 scalar at input i of n into *out; true also when the input is absent. */
static bool const_scalar(const kiln_node *n, int i, float *out)
{
    const kiln_ir_value *v = i < n->n_in ? n->in[i] : NULL;
    if (!v) return true;
    const kiln_value *t = kiln_ir_constant(v);
    if (v->producer || !t) return false;
    if (t->kind != KILN_VALUE_TENSOR || t->dtype != KILN_DTYPE_FLOAT32 || t->numel != 1) return false;
    float f = *(const float *)t->data;
    if (!isnan(f)) *out = f; /* a NaN bound is ignored, as the Clip kernels do */
    return true;
}

/* The activation node `a` computes, or KILN_ACT_NONE when it is not one this pass fuses. */
static kiln_act activation(const kiln_node *a)
{
    kiln_act act = {KILN_ACT_NONE, 0.0f, 0.0f};
    if (*a->domain || a->n_out != 1 || !a->out[0] || a->n_in < 1 || !a->in[0] || !kiln_ir_is_f32(a->out[0])) return act;
    const char *op = a->op_type;
    if (!strcmp(op, "Relu") && a->n_in == 1) {
        act.kind = KILN_ACT_RELU;
    } else if (!strcmp(op, "Sigmoid") && a->n_in == 1) {
        act.kind = KILN_ACT_SIGMOID;
    } else if (!strcmp(op, "Tanh") && a->n_in == 1) {
        act.kind = KILN_ACT_TANH;
    } else if (!strcmp(op, "HardSigmoid") && a->n_in == 1) {
        act = (kiln_act){KILN_ACT_HARD_SIGMOID, kiln_attr_float(a, "alpha", 0.2f), kiln_attr_float(a, "beta", 0.5f)};
    } else if (!strcmp(op, "HardSwish") && a->n_in == 1) {
        act.kind = KILN_ACT_HARD_SWISH;
    } else if (!strcmp(op, "LeakyRelu") && a->n_in == 1) {
        act = (kiln_act){KILN_ACT_LEAKY_RELU, kiln_attr_float(a, "alpha", 0.01f), 0.0f};
    } else if (!strcmp(op, "Gelu") && a->n_in == 1) {
        const char *approx = kiln_attr_string(a, "approximate", "none");
        if (!strcmp(approx, "none")) act.kind = KILN_ACT_GELU;
        else if (!strcmp(approx, "tanh")) act.kind = KILN_ACT_GELU_TANH;
    } else if (!strcmp(op, "Clip")) {
        float lo = -INFINITY, hi = INFINITY;
        if (a->opset < 11) {
            if (a->n_in != 1) return act;
            lo = kiln_attr_float(a, "min", -FLT_MAX);
            hi = kiln_attr_float(a, "max", FLT_MAX);
            if (isnan(lo) || isnan(hi)) return act;
        } else if (!const_scalar(a, 1, &lo) || !const_scalar(a, 2, &hi)) {
            return act;
        }
        act = (kiln_act){KILN_ACT_CLIP, lo, hi};
    }
    return act;
}

/* The ONNX op n is or extends when its GPU kernel can take a fused Relu, else NULL. */
static const char *gpu_fusable(const kiln_node *n)
{
    bool conv = (!*n->domain && !strcmp(n->op_type, "Conv")) || kiln_node_is_fused(n, "Conv");
    if (!conv || n->n_out != 1 || !n->out[0] || kiln_fused_of(n)->act.kind != KILN_ACT_NONE || n->n_in < 2 ||
        !n->in[0] || !n->in[1] || n->in[0]->type.kind != KILN_VALUE_TENSOR || n->in[0]->type.rank != 4)
        return NULL;
    kiln_dtype dt = n->in[0]->type.dtype;
    bool fp = dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16;
    return fp && n->in[1]->type.dtype == dt && n->out[0]->type.dtype == dt ? "Conv" : NULL;
}

/* The ONNX op n is or extends when its CPU kernel can take a fused activation, else NULL. */
static const char *fusable(const kiln_node *n)
{
    const char *base = NULL;
    for (int i = 0; i < 4 && !base; i++) {
        static const char *const ops[] = {"Conv", "Gemm", "MatMul", "Add"};
        if ((!*n->domain && !strcmp(n->op_type, ops[i])) || kiln_node_is_fused(n, ops[i])) base = ops[i];
    }
    if (!base || n->n_out != 1 || !n->out[0] || kiln_fused_of(n)->act.kind != KILN_ACT_NONE || n->n_in < 2 ||
        !kiln_ir_is_f32(n->in[0]) || !kiln_ir_is_f32(n->in[1]) || !kiln_ir_is_f32(n->out[0]))
        return NULL;
    if (!strcmp(base, "Conv")) return n->in[0]->type.rank == 4 && n->in[1]->type.rank == 4 ? base : NULL;
    if (!strcmp(base, "Gemm")) return n->opset >= 11 ? base : NULL;
    /* Add with numpy broadcasting (before opset 7 it broadcast by attributes) */
    if (!strcmp(base, "Add")) return n->n_in == 2 && n->opset >= 7 ? base : NULL;
    /* MatMul by constant 2-D weights: one GEMM over all rows */
    const kiln_value *w = kiln_ir_constant(n->in[1]);
    return n->n_in <= 3 && w && !n->in[1]->producer && w->kind == KILN_VALUE_TENSOR && w->rank == 2 &&
                   w->dtype == KILN_DTYPE_FLOAT32 && n->in[0]->type.rank >= 1
               ? base
               : NULL;
}

/* Makes n (an ONNX base op or its fused form) the fused form with activation act. */
static kiln_status set_activation(kiln_node *n, const char *base, kiln_act act, kiln_err *err)
{
    kiln_attr at[2] = {{.name = "activation", .type = KILN_ATTR_STRING, .s = kiln_act_name(act.kind)},
                       {.name = "activation_params", .type = KILN_ATTR_FLOATS}};
    at[0].s_len = strlen(at[0].s);
    float *params = kiln_arena_calloc(&n->graph->model->arena, 2, sizeof *params);
    if (!params) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    params[0] = act.alpha, params[1] = act.beta;
    at[1].floats = params;
    at[1].n = act.kind == KILN_ACT_CLIP || act.kind == KILN_ACT_HARD_SIGMOID ? 2 : act.kind == KILN_ACT_LEAKY_RELU;
    KILN_TRY(kiln_node_set_attr(n, &at[0], err));
    if (at[1].n) KILN_TRY(kiln_node_set_attr(n, &at[1], err));
    n->domain = "kiln";
    n->op_type = kiln_fused_op_type(base);
    KILN_TRY(kiln_node_bind(n, err));
    if (!n->op) return kiln_errf(err, KILN_ERR_RUNTIME, "internal: no kiln.%s", n->op_type);
    return KILN_OK;
}

/* The Relu of a value of any dtype (the GPU's rule). */
static kiln_act gpu_activation(const kiln_node *a)
{
    kiln_act act = {KILN_ACT_NONE, 0.0f, 0.0f};
    if (!*a->domain && !strcmp(a->op_type, "Relu") && a->n_in == 1 && a->in[0] && a->n_out == 1 && a->out[0])
        act.kind = KILN_ACT_RELU;
    return act;
}

static kiln_status fuse(kiln_graph *g, bool gpu, int *fused, kiln_err *err)
{
    *fused = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *a = g->nodes[k];
        kiln_act act = gpu ? gpu_activation(a) : activation(a);
        kiln_node *p = act.kind ? a->in[0]->producer : NULL;
        const char *base = p && p->graph == g ? (gpu ? gpu_fusable(p) : fusable(p)) : NULL;
        if (!base || p->out[0] != a->in[0] || kiln_ir_value_only_reader(a->in[0]) != a) continue;
        /* the producer now yields what the activation yielded; the activation leaves the graph */
        KILN_TRY(set_activation(p, base, act, err));
        kiln_ir_value *y = a->out[0];
        kiln_node_unlink(a);
        kiln_node_set_output(p, 0, y);
        g->nodes[k] = NULL;
        (*fused)++;
    }
    kiln_graph_compact(g);
    return KILN_OK;
}

kiln_status kiln_pass_fuse_activation(kiln_graph *g, int *fused, kiln_err *err) { return fuse(g, false, fused, err); }

kiln_status kiln_pass_fuse_activation_gpu(kiln_graph *g, int *fused, kiln_err *err) { return fuse(g, true, fused, err); }
