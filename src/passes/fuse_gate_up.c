/* fuse_gate_up.c - a gated MLP's two int4 products, G = MatMulNBits(A, gate weights) and
 * U = MatMulNBits(A, up weights), read only by kiln.SiluMul(G, U), become one MatMulNBits over
 * the weights stacked [gate; up] (N doubled) whose output H kiln.SiluMul reads packed
 * (kiln.SiluMul(H): G = H[..., :N], U = H[..., N:]). A decode step then launches one GEMV where it
 * launched two, and reads twice the bytes in it, which a memory-bound GEMV does closer to the
 * bandwidth. The GPU provider's pass, after fuse_silu_mul.
 *
 * Both products: the same A value and attributes (K, N, bits, block_size, accuracy_level);
 * constant B, scales, zero points and bias, each pair of one dtype and dims, or both absent; no
 * g_idx. Every one of those inputs lists the N columns in order along its first dim (B [N, blocks,
 * blob], scales and zero points N * per-column entries, bias [N]), so stacking is concatenation. */
#include <stdio.h>
#include <string.h>

#include "ops/eval.h"
#include "ops/llm.h"
#include "passes/passes.h"

/* The MatMulNBits producing v when v's only reader is r and the node has no g_idx, else NULL. */
static kiln_node *product(const kiln_graph *g, const kiln_ir_value *v, const kiln_node *r)
{
    kiln_node *n = v->producer;
    if (!n || n->graph != g || strcmp(n->domain, "com.microsoft") || strcmp(n->op_type, "MatMulNBits") || !n->params ||
        n->n_out != 1 || kiln_ir_value_only_reader(v) != r)
        return NULL;
    return n->n_in > NB_GIDX && n->in[NB_GIDX] ? NULL : n;
}

/* Input i of a and of b: both absent, or constants of one dtype and dims (*both set). */
static bool stackable(const kiln_node *a, const kiln_node *b, int i, bool *both)
{
    const kiln_ir_value *x = i < a->n_in ? a->in[i] : NULL, *y = i < b->n_in ? b->in[i] : NULL;
    *both = x && y;
    if (!x || !y) return !x && !y;
    const kiln_value *p = kiln_ir_constant(x), *q = kiln_ir_constant(y);
    if (!p || !q || p->kind != KILN_VALUE_TENSOR || q->kind != KILN_VALUE_TENSOR || p->dtype != q->dtype ||
        p->rank != q->rank || p->rank < 1 || p->nbytes != q->nbytes)
        return false;
    return !memcmp(p->dims, q->dims, (size_t)p->rank * sizeof *p->dims);
}

/* *out: a new constant of g holding x's bytes then y's (dims[0] doubled), named after x. */
static kiln_status stack(kiln_graph *g, const kiln_ir_value *x, const kiln_ir_value *y, kiln_ir_value **out,
                         kiln_err *err)
{
    const kiln_value *p = kiln_ir_constant(x), *q = kiln_ir_constant(y);
    int64_t dims[KILN_MAX_RANK];
    memcpy(dims, p->dims, (size_t)p->rank * sizeof *dims);
    dims[0] *= 2;
    kiln_value *t = NULL;
    KILN_TRY(kiln_tensor_new_unset(p->dtype, p->rank, dims, &t, err));
    if (p->nbytes) {
        memcpy(t->data, p->data, p->nbytes);
        memcpy((unsigned char *)t->data + p->nbytes, q->data, q->nbytes);
    }
    KILN_TRY(kiln_model_own_value(g->model, t, err)); /* frees t when it fails */
    char name[256];
    snprintf(name, sizeof name, "%s.gate_up", x->name);
    if (!(*out = kiln_graph_new_value(g, name, err))) return KILN_ERR_NOMEM;
    kiln_ir_value_set_constant(*out, t);
    return KILN_OK;
}

/* Whether the MatMulNBits nodes a and b read one A with equal attributes. */
static bool alike(const kiln_node *a, const kiln_node *b)
{
    const kiln_nbits_params *p = a->params, *q = b->params;
    return a != b && a->in[NB_A] == b->in[NB_A] && p->K == q->K && p->N == q->N && p->bits == q->bits &&
           p->block_size == q->block_size && p->accuracy_level == q->accuracy_level;
}

kiln_status kiln_pass_fuse_gate_up(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *s = g->nodes[k];
        if (!s || strcmp(s->domain, "kiln") || strcmp(s->op_type, "SiluMul") || s->n_in != 2 || !s->in[0] || !s->in[1])
            continue;
        kiln_node *a = product(g, s->in[0], s), *b = product(g, s->in[1], s);
        if (!a || !b || !alike(a, b)) continue;
        const kiln_type *h = &a->out[0]->type;
        const kiln_nbits_params *p = a->params;
        if (h->rank < 1 || !kiln_dim_is_const(h->dims[h->rank - 1]) || h->dims[h->rank - 1].c != p->N) continue;
        static const int weights[] = {NB_B, NB_SCALES, NB_ZP, NB_BIAS};
        bool ok = true, present[4];
        for (int i = 0; i < 4 && ok; i++) ok = stackable(a, b, weights[i], &present[i]);
        if (!ok || !present[0] || !present[1]) continue;
        /* a reads the stacked weights and writes H (N doubled); b leaves the graph, and the
         * originals give their bytes back when nothing else reads them (an 8B model's gate and
         * up weights are 2 GB) */
        kiln_ir_value *orig[8] = {0};
        for (int i = 0; i < 4; i++) {
            if (!present[i]) continue;
            kiln_ir_value *v;
            orig[2 * i] = a->in[weights[i]], orig[2 * i + 1] = b->in[weights[i]];
            KILN_TRY(stack(g, orig[2 * i], orig[2 * i + 1], &v, err));
            KILN_TRY(kiln_node_set_input(a, weights[i], v, err));
        }
        kiln_attr n_attr = {.name = "N", .type = KILN_ATTR_INT, .i = 2 * p->N};
        KILN_TRY(kiln_node_set_attr(a, &n_attr, err));
        KILN_TRY(kiln_node_bind(a, err));
        a->out[0]->type.dims[h->rank - 1] = kiln_dim_const(2 * p->N);
        KILN_TRY(kiln_node_set_inputs(s, 1, (kiln_ir_value *const[]){a->out[0]}, err));
        kiln_node_unlink(b);
        g->nodes[b->index] = NULL;
        for (int i = 0; i < 8; i++)
            if (orig[i]) kiln_ir_value_release_unread(orig[i]);
        (*fused)++;
    }
    kiln_graph_compact(g);
    return KILN_OK;
}
