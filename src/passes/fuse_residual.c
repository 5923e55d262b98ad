/* fuse_residual.c - a float32 Add of two same-shaped tensors, one of them the output of a Conv
 * (group 1) that nothing else reads, becomes part of that Conv: the Conv becomes kiln.FusedConv
 * (src/ops/fused.h) with the other operand as its input Z, which the CPU provider adds to each
 * output tile with the bias, before any fused activation. The residual blocks of ResNets (Conv -> Add(shortcut) ->
 * Relu) then write their output once; fuse_activation, run after this pass, folds the Relu.
 * The GPU's form (kiln_pass_fuse_residual_gpu) takes float16 and bfloat16 and any group too:
 * cuDNN adds Z in the convolution's epilogue. */
#include <string.h>

#include "core/dtype.h"
#include "ops/eval.h"
#include "passes/passes.h"

/* Which Convs a pipeline fuses: the CPU's (float32, group 1) or the GPU's (any float, any group). */
typedef struct residual_rule {
    bool gpu;
} residual_rule;

static bool dtype_ok(const residual_rule *rule, kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || (rule->gpu && (dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16));
}

/* A tensor of a dtype the rule takes, of rank 4, with the dims and dtype of t. */
static bool same_4d(const residual_rule *rule, const kiln_ir_value *v, const kiln_type *t)
{
    if (!v || v->type.kind != KILN_VALUE_TENSOR || !dtype_ok(rule, v->type.dtype) || v->type.dtype != t->dtype ||
        v->type.rank != 4)
        return false;
    for (int i = 0; i < 4; i++)
        if (kiln_dim_is_unknown(v->type.dims[i]) || !kiln_dim_equal(v->type.dims[i], t->dims[i])) return false;
    return true;
}

/* A plain 2-D Conv of g the rule's kernel adds a residual to. */
static bool conv_fusable(const residual_rule *rule, const kiln_graph *g, const kiln_node *n)
{
    return n && n->graph == g && !*n->domain && !strcmp(n->op_type, "Conv") && n->n_out == 1 && n->out[0] &&
           n->n_in >= 2 && n->n_in <= 3 && n->in[0] && n->in[1] && dtype_ok(rule, n->in[0]->type.dtype) &&
           n->in[0]->type.rank == 4 && n->in[1]->type.rank == 4 && (rule->gpu || kiln_attr_int(n, "group", 1) == 1) &&
           same_4d(rule, n->out[0], &n->out[0]->type);
}

static kiln_status fuse(const residual_rule *rule, kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    int kept = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *a = g->nodes[k];
        if (!a) continue; /* a Conv moved to its Add's place */
        kiln_node *p = NULL;
        kiln_ir_value *r = NULL;
        if (!*a->domain && !strcmp(a->op_type, "Add") && a->n_in == 2 && a->n_out == 1 && a->out[0] &&
            a->in[0] && a->in[1] && a->in[0] != a->in[1] && same_4d(rule, a->out[0], &a->out[0]->type))
            for (int i = 0; i < 2 && !p; i++) {
                kiln_node *c = a->in[i]->producer;
                if (conv_fusable(rule, g, c) && c->out[0] == a->in[i] && kiln_ir_value_only_reader(a->in[i]) == a &&
                    same_4d(rule, a->in[i], &a->out[0]->type) && same_4d(rule, a->in[1 - i], &a->out[0]->type))
                    p = c, r = a->in[1 - i];
            }
        if (!p) {
            g->nodes[kept] = a;
            a->index = kept++;
            continue;
        }
        /* the Conv becomes kiln.FusedConv(X, W, B, Z), takes the Add's place (all its inputs are
         * ready by then) and yields its output */
        kiln_ir_value *in[4] = {p->in[0], p->in[1], p->n_in > 2 ? p->in[2] : NULL, r};
        KILN_TRY(kiln_node_set_inputs(p, 4, in, err));
        p->domain = "kiln";
        p->op_type = "FusedConv";
        KILN_TRY(kiln_node_bind(p, err));
        if (!p->op) return kiln_errf(err, KILN_ERR_RUNTIME, "internal: no kiln.FusedConv");
        kiln_ir_value *y = a->out[0];
        kiln_node_unlink(a);
        kiln_node_set_output(p, 0, y);
        for (int q = 0; q < kept; q++)
            if (g->nodes[q] == p) { /* take it out of the kept prefix */
                memmove(g->nodes + q, g->nodes + q + 1, (size_t)(kept - q - 1) * sizeof *g->nodes);
                kept--;
                for (int t = q; t < kept; t++) g->nodes[t]->index = t;
                break;
            }
        g->nodes[kept] = p;
        p->index = kept++;
        (*fused)++;
    }
    g->n_nodes = kept;
    return KILN_OK;
}

kiln_status kiln_pass_fuse_residual(kiln_graph *g, int *fused, kiln_err *err)
{
    static const residual_rule cpu = {.gpu = false};
    return fuse(&cpu, g, fused, err);
}

kiln_status kiln_pass_fuse_residual_gpu(kiln_graph *g, int *fused, kiln_err *err)
{
    static const residual_rule gpu = {.gpu = true};
    return fuse(&gpu, g, fused, err);
}
