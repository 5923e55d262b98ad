/* fold_conv_bn.c - Conv followed by BatchNormalization (inference) becomes one Conv:
 * W'[m] = W[m] * s[m] and B'[m] = (B[m] - mean[m]) * s[m] + beta[m], s = scale / sqrt(var + eps);
 * and Conv followed by Mul, Div, Add or Sub with a constant per output channel (one value, or
 * [M, 1, ..] broadcast over the rest, as paddle2onnx writes a learnt affine) likewise:
 * W'[m] = W[m] * c[m], B'[m] = B[m] * c[m] (Div: by 1 / c[m]) or B'[m] = B[m] + c[m] (Sub: - c[m]). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "passes/passes.h"

/* The constant float32 vector of m elements feeding input i of n, or NULL. */
static const float *param(const kiln_node *n, int i, int64_t m)
{
    const kiln_ir_value *v = i < n->n_in ? n->in[i] : NULL;
    const kiln_value *t = kiln_ir_constant(v);
    if (!t || v->producer) return NULL;
    return t->kind == KILN_VALUE_TENSOR && t->dtype == KILN_DTYPE_FLOAT32 && t->numel == m ? t->data : NULL;
}

/* A new constant IR value holding t (owned by the model). */
static kiln_ir_value *constant(kiln_graph *g, const char *name, kiln_value *t, kiln_err *err)
{
    if (kiln_model_own_value(g->model, t, err)) return NULL;
    kiln_ir_value *v = kiln_graph_new_value(g, name, err);
    if (v) kiln_ir_value_set_constant(v, t);
    return v;
}

/* The Conv's constant float32 weights W [M, ...] (rank 3 or more, M > 0) and its bias [M] (NULL
 * when it has none); false when either is not what folding needs. */
static bool conv_params(const kiln_node *conv, const kiln_value **W, const float **bias)
{
    const kiln_ir_value *wv = conv->in[1];
    const kiln_value *w = kiln_ir_constant(wv);
    if (!w || wv->producer || w->kind != KILN_VALUE_TENSOR || w->dtype != KILN_DTYPE_FLOAT32 || w->rank < 3 ||
        !w->dims[0])
        return false;
    bool has_bias = conv->n_in > 2 && conv->in[2];
    *W = w;
    *bias = has_bias ? param(conv, 2, w->dims[0]) : NULL;
    return !has_bias || *bias;
}

/* The Conv now takes W2 (NULL: its weights stay) and B2 as its weights and bias and produces
 * what the folded node n produced; n leaves the graph. Takes W2 and B2 in every case. */
static kiln_status adopt(kiln_graph *g, kiln_node *conv, kiln_node *n, kiln_value *W2, kiln_value *B2, const char *tag,
                         bool *done, kiln_err *err)
{
    char name[512];
    kiln_ir_value *wn = conv->in[1];
    if (W2) {
        snprintf(name, sizeof name, "%s/%s_folded_W", conv->name, tag);
        if (!(wn = constant(g, name, W2, err))) {
            kiln_value_free(B2);
            return err->code;
        }
    }
    snprintf(name, sizeof name, "%s/%s_folded_B", conv->name, tag);
    kiln_ir_value *bnv = constant(g, name, B2, err);
    if (!bnv) return err->code;
    kiln_ir_value *in[3] = {conv->in[0], wn, bnv};
    KILN_TRY(kiln_node_set_inputs(conv, 3, in, err));
    kiln_ir_value *y = n->out[0];
    kiln_node_unlink(n);
    kiln_node_set_output(conv, 0, y);
    *done = true;
    return KILN_OK;
}

static kiln_status fold(kiln_graph *g, kiln_node *conv, kiln_node *bn, bool *done, kiln_err *err)
{
    *done = false;
    const kiln_value *W;
    const float *bias;
    if (!conv_params(conv, &W, &bias)) return KILN_OK;
    int64_t M = W->dims[0], per = W->numel / M;
    const float *scale = param(bn, 1, M), *beta = param(bn, 2, M), *mean = param(bn, 3, M), *var = param(bn, 4, M);
    if (!scale || !beta || !mean || !var) return KILN_OK;
    double eps = kiln_attr_float(bn, "epsilon", 1e-5f);
    kiln_value *W2, *B2;
    KILN_TRY(kiln_tensor_new(KILN_DTYPE_FLOAT32, W->rank, W->dims, &W2, err));
    kiln_status st = kiln_tensor_new(KILN_DTYPE_FLOAT32, 1, &M, &B2, err);
    if (st) {
        kiln_value_free(W2);
        return st;
    }
    for (int64_t m = 0; m < M; m++) {
        double s = scale[m] / sqrt((double)var[m] + eps);
        for (int64_t i = 0; i < per; i++)
            ((float *)W2->data)[m * per + i] = (float)(((const float *)W->data)[m * per + i] * s);
        ((float *)B2->data)[m] = (float)(((bias ? bias[m] : 0.0) - mean[m]) * s + beta[m]);
    }
    return adopt(g, conv, bn, W2, B2, "bn", done, err);
}

/* The constant float32 operand of binary node n that broadcasts per output channel of the Conv
 * output y (rank R, M channels) without widening y: its value for channel m at c[m * step]
 * (step 0: one value). NULL when the other operand is not y or none fits. */
static const float *channel_const(const kiln_node *n, const kiln_ir_value *y, int R, int64_t M, int64_t *step,
                                  bool *y_first)
{
    if (n->n_in != 2 || (n->in[0] != y && n->in[1] != y) || n->in[0] == n->in[1]) return NULL;
    *y_first = n->in[0] == y;
    const kiln_ir_value *cv = n->in[*y_first ? 1 : 0];
    const kiln_value *t = kiln_ir_constant(cv);
    if (!t || cv->producer || t->kind != KILN_VALUE_TENSOR || t->dtype != KILN_DTYPE_FLOAT32 || t->rank > R)
        return NULL;
    int ci = 1 - (R - t->rank); /* the channel axis in t, aligned right */
    for (int i = 0; i < t->rank; i++)
        if (t->dims[i] != 1 && (i != ci || t->dims[i] != M)) return NULL;
    *step = t->numel == 1 ? 0 : 1;
    return t->data;
}

/* Folds Mul/Div/Add/Sub node n, reading Conv conv's output by a per-channel constant, into conv. */
static kiln_status fold_affine(kiln_graph *g, kiln_node *conv, kiln_node *n, bool *done, kiln_err *err)
{
    *done = false;
    const kiln_value *W;
    const float *bias;
    if (!conv_params(conv, &W, &bias)) return KILN_OK;
    int64_t M = W->dims[0], per = W->numel / M, step;
    bool y_first;
    const float *c = channel_const(n, conv->out[0], W->rank, M, &step, &y_first);
    bool mul = !strcmp(n->op_type, "Mul"), div = !strcmp(n->op_type, "Div"), sub = !strcmp(n->op_type, "Sub");
    /* c / y and c - y are not affine in the Conv's weights the same way */
    if (!c || ((div || sub) && !y_first)) return KILN_OK;
    kiln_value *W2 = NULL, *B2;
    if ((mul || div) && kiln_tensor_new(KILN_DTYPE_FLOAT32, W->rank, W->dims, &W2, err)) return err->code;
    if (kiln_tensor_new(KILN_DTYPE_FLOAT32, 1, &M, &B2, err)) {
        kiln_value_free(W2);
        return err->code;
    }
    for (int64_t m = 0; m < M; m++) {
        float k = c[m * step], b = bias ? bias[m] : 0.0f;
        if (mul || div) {
            for (int64_t i = 0; i < per; i++) {
                float w = ((const float *)W->data)[m * per + i];
                ((float *)W2->data)[m * per + i] = div ? w / k : w * k;
            }
            ((float *)B2->data)[m] = div ? b / k : b * k;
        } else ((float *)B2->data)[m] = sub ? b - k : b + k;
    }
    return adopt(g, conv, n, W2, B2, n->op_type, done, err);
}

/* The default-domain Conv of g producing y (its one output) when n is y's only reader, else NULL. */
static kiln_node *sole_conv(const kiln_graph *g, const kiln_ir_value *y, const kiln_node *n)
{
    kiln_node *conv = y ? y->producer : NULL;
    return conv && conv->graph == g && !strcmp(conv->op_type, "Conv") && !*conv->domain && conv->n_out == 1 &&
                   conv->out[0] == y && conv->n_in >= 2 && kiln_ir_value_only_reader(y) == n
               ? conv
               : NULL;
}

kiln_status kiln_pass_fold_conv_bn(kiln_graph *g, int *folded, kiln_err *err)
{
    *folded = 0;
    int kept = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = g->nodes[k];
        bool done = false;
        if (!strcmp(n->op_type, "BatchNormalization") && !*n->domain && n->opset >= 9 &&
            !kiln_attr_int(n, "training_mode", 0) && n->n_out == 1 && n->out[0] && n->n_in == 5 && n->in[0]) {
            kiln_node *conv = sole_conv(g, n->in[0], n);
            if (conv) KILN_TRY(fold(g, conv, n, &done, err));
        } else if (!*n->domain && n->n_out == 1 && n->out[0] && n->n_in == 2 &&
                   (!strcmp(n->op_type, "Mul") || !strcmp(n->op_type, "Div") || !strcmp(n->op_type, "Add") ||
                    !strcmp(n->op_type, "Sub"))) {
            for (int side = 0; side < 2 && !done; side++) {
                kiln_node *conv = sole_conv(g, n->in[side], n);
                if (conv) KILN_TRY(fold_affine(g, conv, n, &done, err));
            }
        }
        if (done) {
            (*folded)++;
            continue; /* the folded node leaves the graph */
        }
        g->nodes[kept] = n;
        n->index = kept++;
    }
    g->n_nodes = kept;
    return KILN_OK;
}
