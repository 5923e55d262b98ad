/* fuse_silu_mul.c - a gated MLP's activation written out, Mul(Mul(g, Sigmoid(g)), u) (the
 * operands of either Mul in either order, as onnxruntime-genai's model builder and exporters
 * write SiLU(gate) * up), becomes kiln.SiluMul(g, u) (src/ops/fused.h): one pass over memory
 * instead of three. g and u of one float type (float32, float16, bfloat16) and provably equal
 * dims; the Sigmoid and the inner Mul read by nothing else. The GPU provider's pass: its kernel
 * makes a decode step's three small launches a layer one. */
#include <string.h>

#include "ops/eval.h"
#include "passes/passes.h"

/* n when it is a default-domain op_type node with two inputs and one output, else NULL. */
static kiln_node *binary(kiln_node *n, const char *op_type)
{
    return n && !*n->domain && !strcmp(n->op_type, op_type) && n->n_in == 2 && n->in[0] && n->in[1] && n->n_out == 1 &&
                   n->out[0]
               ? n
               : NULL;
}

/* The g of v = Mul(g, Sigmoid(g)) (either order) when v's producer *m and its Sigmoid *s have
 * no other reader than the chain, else NULL. */
static kiln_ir_value *silu_of(const kiln_graph *g, const kiln_ir_value *v, kiln_node **m, kiln_node **s)
{
    *m = binary(v->producer, "Mul");
    if (!*m || (*m)->graph != g || !kiln_ir_value_only_reader(v)) return NULL;
    for (int i = 0; i < 2; i++) {
        *s = (*m)->in[i]->producer;
        if (*s && (*s)->graph == g && !*(*s)->domain && !strcmp((*s)->op_type, "Sigmoid") && (*s)->n_in == 1 &&
            (*s)->n_out == 1 && (*s)->in[0] == (*m)->in[1 - i] && kiln_ir_value_only_reader((*m)->in[i]) == *m)
            return (*m)->in[1 - i];
    }
    return NULL;
}

/* Same float type (GPU-run), same rank, provably equal dims. */
static bool alike(const kiln_ir_value *a, const kiln_ir_value *b)
{
    kiln_dtype dt = a->type.dtype;
    if (a->type.kind != KILN_VALUE_TENSOR || b->type.kind != KILN_VALUE_TENSOR || b->type.dtype != dt ||
        (dt != KILN_DTYPE_FLOAT32 && dt != KILN_DTYPE_FLOAT16 && dt != KILN_DTYPE_BFLOAT16) || a->type.rank < 0 ||
        a->type.rank != b->type.rank)
        return false;
    for (int k = 0; k < a->type.rank; k++)
        if (kiln_dim_is_unknown(a->type.dims[k]) || !kiln_dim_equal(a->type.dims[k], b->type.dims[k])) return false;
    return true;
}

kiln_status kiln_pass_fuse_silu_mul(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = binary(g->nodes[k], "Mul");
        kiln_ir_value *x = NULL, *u = NULL;
        kiln_node *m = NULL, *s = NULL;
        for (int i = 0; n && i < 2 && !x; i++)
            if ((x = silu_of(g, n->in[i], &m, &s))) u = n->in[1 - i];
        if (!x || !alike(x, u) || !alike(x, n->out[0])) continue;
        /* n becomes SiluMul(x, u); the inner Mul m and the Sigmoid s, now unread, leave the graph */
        kiln_ir_value *in[2] = {x, u};
        KILN_TRY(kiln_node_set_inputs(n, 2, in, err));
        n->domain = "kiln";
        n->op_type = "SiluMul";
        n->attrs = NULL;
        n->n_attrs = 0;
        KILN_TRY(kiln_node_bind(n, err));
        if (!n->op) return kiln_errf(err, KILN_ERR_RUNTIME, "internal: no kiln.SiluMul");
        for (int j = 0; j < g->n_nodes; j++)
            if (g->nodes[j] == m || g->nodes[j] == s) {
                kiln_node_unlink(g->nodes[j]);
                g->nodes[j] = NULL;
            }
        (*fused)++;
    }
    kiln_graph_compact(g);
    return KILN_OK;
}
