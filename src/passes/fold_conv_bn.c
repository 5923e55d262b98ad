/* fold_conv_bn.c - Conv followed by BatchNormalization (inference) becomes one Conv:
 * W'[m] = W[m] * s[m] and B'[m] = (B[m] - mean[m]) * s[m] + beta[m], s = scale / sqrt(var + eps). */
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

static kiln_status fold(kiln_graph *g, kiln_node *conv, kiln_node *bn, bool *done, kiln_err *err)
{
    *done = false;
    const kiln_ir_value *wv = conv->in[1];
    const kiln_value *W = kiln_ir_constant(wv);
    if (!W || wv->producer) return KILN_OK;
    if (W->kind != KILN_VALUE_TENSOR || W->dtype != KILN_DTYPE_FLOAT32 || W->rank < 3 || !W->dims[0]) return KILN_OK;
    int64_t M = W->dims[0], per = W->numel / M;
    const float *scale = param(bn, 1, M), *beta = param(bn, 2, M), *mean = param(bn, 3, M), *var = param(bn, 4, M);
    const float *bias = conv->n_in > 2 && conv->in[2] ? param(conv, 2, M) : NULL;
    if (!scale || !beta || !mean || !var || (conv->n_in > 2 && conv->in[2] && !bias)) return KILN_OK;
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
    char name[512];
    snprintf(name, sizeof name, "%s/bn_folded_W", conv->name);
    kiln_ir_value *wn = constant(g, name, W2, err);
    if (!wn) {
        kiln_value_free(B2);
        return err->code;
    }
    snprintf(name, sizeof name, "%s/bn_folded_B", conv->name);
    kiln_ir_value *bnv = constant(g, name, B2, err);
    if (!bnv) return err->code;
    kiln_ir_value *in[3] = {conv->in[0], wn, bnv};
    KILN_TRY(kiln_node_set_inputs(conv, 3, in, err));
    /* the Conv now produces what the BatchNormalization produced */
    kiln_ir_value *y = bn->out[0];
    kiln_node_unlink(bn);
    kiln_node_set_output(conv, 0, y);
    *done = true;
    return KILN_OK;
}

kiln_status kiln_pass_fold_conv_bn(kiln_graph *g, int *folded, kiln_err *err)
{
    *folded = 0;
    int kept = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *bn = g->nodes[k];
        bool done = false;
        if (!strcmp(bn->op_type, "BatchNormalization") && !*bn->domain && bn->opset >= 9 &&
            !kiln_attr_int(bn, "training_mode", 0) && bn->n_out == 1 && bn->out[0] && bn->n_in == 5 && bn->in[0]) {
            kiln_node *conv = bn->in[0]->producer;
            if (conv && conv->graph == g && !strcmp(conv->op_type, "Conv") && !*conv->domain && conv->n_out == 1 &&
                conv->out[0] == bn->in[0] && conv->n_in >= 2 && kiln_ir_value_only_reader(bn->in[0]) == bn)
                KILN_TRY(fold(g, conv, bn, &done, err));
        }
        if (done) {
            (*folded)++;
            continue; /* the BatchNormalization leaves the graph */
        }
        g->nodes[kept] = bn;
        bn->index = kept++;
    }
    g->n_nodes = kept;
    return KILN_OK;
}
