/* fuse_matmul_bias.c - a constant bias added to a MatMul by constant weights (the dense layers
 * of transformers: MatMul(A [..., K], W [K, N]) -> Add(., B [N])) becomes kiln.FusedMatMul(A, W,
 * B) (src/ops/fused.h): the CPU provider adds it while each GEMM tile is in cache (float32), the
 * CUDA provider in cuBLASLt's epilogue (float32, float16, bfloat16), and the Add's pass over
 * memory disappears. The MatMul's output must have no other reader, the bias must not widen it by
 * broadcasting (N values, leading dims 1, rank at most the output's). */
#include <string.h>

#include "core/dtype.h"
#include "ops/eval.h"
#include "passes/passes.h"

/* Whether v is a tensor of dtype dt (float32), or with any_float of any of the float types
 * (dt UNDEFINED: of any dtype so taken). */
static bool float_value(const kiln_ir_value *v, kiln_dtype dt, bool any_float)
{
    kiln_dtype t = v ? v->type.dtype : KILN_DTYPE_UNDEFINED;
    return v && v->type.kind == KILN_VALUE_TENSOR &&
           (t == KILN_DTYPE_FLOAT32 || (any_float && (t == KILN_DTYPE_FLOAT16 || t == KILN_DTYPE_BFLOAT16))) &&
           (dt == KILN_DTYPE_UNDEFINED || t == dt);
}

/* The constant 2-D weights [K, N] of a MatMul that can take a bias (A, W and Y of one float
 * type as float_value takes it), else NULL. */
static const kiln_value *weights(const kiln_graph *g, const kiln_node *m, bool any_float)
{
    if (m->graph != g || *m->domain || strcmp(m->op_type, "MatMul") || m->n_in != 2 || m->n_out != 1 ||
        !m->out[0] || !float_value(m->in[0], KILN_DTYPE_UNDEFINED, any_float) ||
        !float_value(m->out[0], m->in[0]->type.dtype, any_float) || m->in[0]->type.rank < 1 ||
        m->out[0]->type.rank < 1)
        return NULL;
    const kiln_ir_value *w = m->in[1];
    const kiln_value *t = kiln_ir_constant(w);
    if (!t || w->producer || t->kind != KILN_VALUE_TENSOR || t->dtype != m->in[0]->type.dtype || t->rank != 2)
        return NULL;
    return t;
}

/* Whether b is a constant of dtype dt and n values that broadcasts onto a rank-r output
 * [..., n] without widening it. */
static bool bias_fits(const kiln_ir_value *b, kiln_dtype dt, int64_t n, int r)
{
    const kiln_value *t = kiln_ir_constant(b);
    return t && !b->producer && t->kind == KILN_VALUE_TENSOR && t->dtype == dt && t->rank >= 1 && t->rank <= r &&
           t->numel == n && t->dims[t->rank - 1] == n;
}

static kiln_status fuse(kiln_graph *g, bool any_float, int *fused, kiln_err *err)
{
    *fused = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *a = g->nodes[k];
        if (*a->domain || strcmp(a->op_type, "Add") || a->n_in != 2 || a->n_out != 1 || !a->out[0] || a->opset < 7 ||
            !float_value(a->out[0], KILN_DTYPE_UNDEFINED, any_float))
            continue;
        for (int side = 0; side < 2; side++) {
            kiln_ir_value *x = a->in[side], *b = a->in[1 - side];
            kiln_node *m = x ? x->producer : NULL;
            const kiln_value *w = m ? weights(g, m, any_float) : NULL;
            if (!w || m->out[0] != x || kiln_ir_value_only_reader(x) != a) continue;
            if (!bias_fits(b, w->dtype, w->dims[1], x->type.rank) || a->out[0]->type.rank != x->type.rank ||
                a->out[0]->type.dtype != w->dtype)
                continue;
            /* the MatMul becomes kiln.FusedMatMul(A, W, b) and yields what the Add yielded; the
             * Add leaves the graph */
            kiln_ir_value *in[3] = {m->in[0], m->in[1], b}, *y = a->out[0];
            KILN_TRY(kiln_node_set_inputs(m, 3, in, err));
            m->domain = "kiln";
            m->op_type = "FusedMatMul";
            KILN_TRY(kiln_node_bind(m, err));
            if (!m->op) return kiln_errf(err, KILN_ERR_RUNTIME, "internal: no kiln.FusedMatMul");
            kiln_node_unlink(a);
            kiln_node_set_output(m, 0, y);
            g->nodes[k] = NULL;
            (*fused)++;
            break;
        }
    }
    kiln_graph_compact(g);
    return KILN_OK;
}

kiln_status kiln_pass_fuse_matmul_bias(kiln_graph *g, int *fused, kiln_err *err) { return fuse(g, false, fused, err); }

kiln_status kiln_pass_fuse_matmul_bias_gpu(kiln_graph *g, int *fused, kiln_err *err)
{
    return fuse(g, true, fused, err);
}
