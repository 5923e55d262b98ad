/* adopt_ms_fused_conv.c - a com.microsoft FusedConv (what ORT_ENABLE_EXTENDED files hold: Conv,
 * an optional Sum added before the activation, activation and activation_params attributes)
 * whose activation kiln's fused kernels apply becomes kiln.FusedConv, which has the same inputs,
 * attributes and meaning (src/ops/fused.h), so it runs on the CPU provider's convolutions
 * instead of the reference. */
#include <string.h>

#include "ops/eval.h"
#include "passes/passes.h"

static bool adoptable(const kiln_node *n)
{
    if (strcmp(n->domain, "com.microsoft") || strcmp(n->op_type, "FusedConv") || n->n_in < 2 || n->n_in > 4 ||
        !n->in[0] || !kiln_ir_is_f32(n->in[0]))
        return false;
    const char *act = kiln_attr_string(n, "activation", NULL);
    static const char *const ok[] = {"Relu", "Clip", "Sigmoid", "HardSigmoid", "LeakyRelu", "Tanh"};
    if (!act) return true;
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (!strcmp(act, ok[i])) return true;
    return false;
}

kiln_status kiln_pass_adopt_ms_fused_conv(kiln_graph *g, int *changed, kiln_err *err)
{
    *changed = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = g->nodes[k];
        if (!adoptable(n)) continue;
        const char *domain = n->domain;
        const kiln_op_def *op = n->op;
        const void *params = n->params;
        n->domain = "kiln";
        if (kiln_node_bind(n, err) || !n->op) { /* kiln's parse refused its attributes: leave the node as it was */
            n->domain = domain, n->op = op, n->params = params;
            continue;
        }
        (*changed)++;
    }
    return KILN_OK;
}
