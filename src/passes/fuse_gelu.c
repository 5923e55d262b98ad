/* fuse_gelu.c - Gelu written out as element-wise ops (as PyTorch exports it) becomes one ONNX
 * Gelu node (opset 20), and HardSwish written out (as paddle2onnx exports it) one HardSwish node
 * (opset 14), which the CPU provider runs in one pass over memory or in a Conv's epilogue:
 *
 *   exact:  x * 0.5 * (1 + Erf(x / sqrt 2))            (Div by sqrt 2 or Mul by 1 / sqrt 2)
 *   tanh:   x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))   (x^3: Pow(x, 3), x*x*x)
 *   HardSwish: x * Clip(x + 3, 0, 6) / 6                (Div by 6 or Mul by 1 / 6)
 *
 * with the Gelu products x * 0.5 * s (s the 1 + ... term) in any association and operand order.
 * Constants are float32 scalars checked to a relative 1e-4; x and every intermediate are float32
 * and the intermediates have no other reader. CPU sessions only. */
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

static bool single_use(const kiln_graph *g, const kiln_ir_value *v)
{
    (void)g;
    return kiln_ir_is_f32(v) && !v->is_output && kiln_ir_value_readers(v) == 1;
}

/* kiln_passes_producer, with every input present */
static kiln_node *producer(const kiln_graph *g, const kiln_ir_value *v, const char *op_type)
{
    kiln_node *p = kiln_passes_producer(g, v, op_type);
    for (int i = 0; p && i < p->n_in; i++)
        if (!p->in[i]) return NULL;
    return p;
}

/* kiln_passes_only_reader of a float32 v, of two inputs */
static kiln_node *only_reader(const kiln_ir_value *v, const char *op_type)
{
    kiln_node *nd = kiln_ir_is_f32(v) ? kiln_passes_only_reader(v, op_type) : NULL;
    return nd && nd->n_in == 2 ? nd : NULL;
}

/* Whether v is a float32 scalar constant (one element, rank at most max_rank) within a relative
 * 1e-4 of want: broadcasting it keeps the other operand's shape. */
static bool is_const(const kiln_ir_value *v, double want, int max_rank)
{
    const kiln_value *t = kiln_ir_constant(v);
    if (!t || v->producer || t->kind != KILN_VALUE_TENSOR || t->dtype != KILN_DTYPE_FLOAT32 || t->numel != 1 ||
        t->rank > max_rank)
        return false;
    double c = *(const float *)t->data;
    return fabs(c - want) <= 1e-4 * fabs(want);
}

/* b = Mul(v, c) in either order with the constant c: v, else NULL. */
static kiln_ir_value *mul_by(const kiln_node *b, double c, int rank)
{
    if (!b || strcmp(b->op_type, "Mul")) return NULL;
    if (is_const(b->in[1], c, rank)) return b->in[0];
    if (is_const(b->in[0], c, rank)) return b->in[1];
    return NULL;
}

/* The x of Erf's input x / sqrt 2 (or x * (1 / sqrt 2)), else NULL. */
static kiln_ir_value *erf_arg(const kiln_graph *g, const kiln_ir_value *z)
{
    if (!single_use(g, z)) return NULL;
    int r = z->type.rank;
    kiln_node *d = producer(g, z, "Div");
    if (d) return is_const(d->in[1], 1.4142135623730951, r) ? d->in[0] : NULL;
    return mul_by(producer(g, z, "Mul"), 0.7071067811865476, r);
}

/* Whether c is x^3: Pow(x, 3) or a product of x and x * x. */
static bool is_cube(const kiln_graph *g, const kiln_ir_value *c, const kiln_ir_value *x)
{
    if (!single_use(g, c)) return false;
    kiln_node *p = producer(g, c, "Pow");
    if (p) {
        const kiln_value *e = kiln_ir_constant(p->in[1]);
        if (p->in[0] != x || !e || p->in[1]->producer || e->kind != KILN_VALUE_TENSOR || e->numel != 1 ||
            e->rank > c->type.rank)
            return false;
        if (e->dtype == KILN_DTYPE_FLOAT32) return *(const float *)e->data == 3.0f;
        if (e->dtype == KILN_DTYPE_INT64) return *(const int64_t *)e->data == 3;
        if (e->dtype == KILN_DTYPE_INT32) return *(const int32_t *)e->data == 3;
        return false;
    }
    kiln_node *m = producer(g, c, "Mul");
    kiln_ir_value *sq = m ? kiln_passes_other_input(m, x) : NULL;
    kiln_node *s = sq && sq != x && single_use(g, sq) ? producer(g, sq, "Mul") : NULL;
    return s && s->in[0] == x && s->in[1] == x;
}

/* The x of Tanh's input sqrt(2/pi) * (x + 0.044715 * x^3), else NULL. */
static kiln_ir_value *tanh_arg(const kiln_graph *g, const kiln_ir_value *t)
{
    if (!single_use(g, t)) return NULL;
    int r = t->type.rank;
    kiln_ir_value *u = mul_by(producer(g, t, "Mul"), 0.7978845608028654, r);
    kiln_node *a = u && single_use(g, u) ? producer(g, u, "Add") : NULL;
    for (int side = 0; a && side < 2; side++) {
        kiln_ir_value *x = a->in[side], *v = a->in[1 - side];
        kiln_ir_value *c = single_use(g, v) ? mul_by(producer(g, v, "Mul"), 0.044715, r) : NULL;
        if (c && is_cube(g, c, x)) return x;
    }
    return NULL;
}

/* Tries the pattern around the Erf or Tanh node e; on a match rewrites the node producing the
 * result into Gelu (the rest is left for the sweep) and sets *done. */
static kiln_status fuse(kiln_graph *g, kiln_node *e, bool tanh_form, bool *done, kiln_err *err)
{
    *done = false;
    if (e->n_in != 1 || e->n_out != 1 || !e->in[0] || !e->out[0]) return KILN_OK;
    kiln_ir_value *x = tanh_form ? tanh_arg(g, e->in[0]) : erf_arg(g, e->in[0]);
    if (!kiln_ir_is_f32(x) || x->type.rank < 0) return KILN_OK;
    int r = x->type.rank;
    /* s = 1 + e */
    kiln_node *add = only_reader(e->out[0], "Add");
    if (!add || !is_const(kiln_passes_other_input(add, e->out[0]), 1.0, r)) return KILN_OK;
    kiln_ir_value *s = add->out[0];
    kiln_node *m1 = only_reader(s, "Mul"), *target = NULL;
    if (!m1 || !kiln_ir_is_f32(m1->out[0])) return KILN_OK;
    kiln_ir_value *f = kiln_passes_other_input(m1, s); /* s's factor */
    if (!f) return KILN_OK;
    kiln_node *m2 = NULL;
    if (is_const(f, 0.5, r) || f == x) {
        /* (s * 0.5) * x or (s * x) * 0.5 */
        m2 = only_reader(m1->out[0], "Mul");
        kiln_ir_value *f2 = m2 ? kiln_passes_other_input(m2, m1->out[0]) : NULL;
        if (f2 && (f == x ? is_const(f2, 0.5, r) : f2 == x)) target = m2;
    } else if (single_use(g, f) && mul_by(producer(g, f, "Mul"), 0.5, r) == x) {
        target = m1; /* (x * 0.5) * s */
    }
    if (!target || !kiln_ir_is_f32(target->out[0]) || target->out[0]->type.rank != r) return KILN_OK;

    if (!kiln_op_lookup("", "Gelu", 20)) return KILN_OK;
    kiln_attr *at = kiln_passes_new_attrs(g, 1);
    if (!at) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    at[0] = (kiln_attr){.name = "approximate", .type = KILN_ATTR_STRING, .s = "tanh", .s_len = 4};
    KILN_TRY(kiln_passes_become(target, "Gelu", "", 20, 1, &x, at, tanh_form ? 1 : 0, err));
    *done = true;
    return KILN_OK;
}

/* The two bounds of Clip node c when both are float32 constants (inputs from opset 11, else
 * attributes); false otherwise. */
static bool clip_bounds(const kiln_node *c, double *lo, double *hi)
{
    if (c->opset < 11) {
        *lo = kiln_attr_float(c, "min", -INFINITY), *hi = kiln_attr_float(c, "max", INFINITY);
        return true;
    }
    for (int i = 1; i < 3; i++) {
        const kiln_ir_value *v = c->n_in > i ? c->in[i] : NULL;
        const kiln_value *t = v ? kiln_ir_constant(v) : NULL;
        if (!t || v->producer || t->kind != KILN_VALUE_TENSOR || t->dtype != KILN_DTYPE_FLOAT32 || t->numel != 1)
            return false;
        *(i == 1 ? lo : hi) = *(const float *)t->data;
    }
    return true;
}

/* HardSwish written out: Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6) (paddle2onnx's form; Mul either
 * order, Mul by 1/6 for the Div). Tries the pattern around Clip node c; on a match rewrites the
 * node producing the result into HardSwish and sets *done. */
static kiln_status fuse_hardswish(kiln_graph *g, kiln_node *c, bool *done, kiln_err *err)
{
    *done = false;
    double lo = 0.0, hi = 0.0;
    if (c->n_out != 1 || !c->in[0] || !c->out[0] || !clip_bounds(c, &lo, &hi) || lo != 0.0 || hi != 6.0 ||
        !single_use(g, c->in[0]))
        return KILN_OK;
    kiln_node *add = producer(g, c->in[0], "Add");
    if (!add || add->n_in != 2) return KILN_OK;
    int r = c->in[0]->type.rank;
    kiln_ir_value *x = is_const(add->in[1], 3.0, r) ? add->in[0] : is_const(add->in[0], 3.0, r) ? add->in[1] : NULL;
    if (!kiln_ir_is_f32(x) || x->type.rank != r || r < 0) return KILN_OK;
    kiln_node *m = only_reader(c->out[0], "Mul");
    if (!m || kiln_passes_other_input(m, c->out[0]) != x) return KILN_OK;
    kiln_node *target = only_reader(m->out[0], "Div");
    if (target ? !is_const(target->in[1], 6.0, r) || target->in[0] != m->out[0]
               : !mul_by(target = only_reader(m->out[0], "Mul"), 1.0 / 6.0, r))
        return KILN_OK;
    if (!kiln_ir_is_f32(target->out[0]) || target->out[0]->type.rank != r || !kiln_op_lookup("", "HardSwish", 14))
        return KILN_OK;
    KILN_TRY(kiln_passes_become(target, "HardSwish", "", 14, 1, &x, NULL, 0, err));
    *done = true;
    return KILN_OK;
}

kiln_status kiln_pass_fuse_gelu(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    bool any = false;
    for (int k = 0; k < g->n_nodes && !any; k++)
        any = !*g->nodes[k]->domain && (!strcmp(g->nodes[k]->op_type, "Erf") || !strcmp(g->nodes[k]->op_type, "Tanh") ||
                                        !strcmp(g->nodes[k]->op_type, "Clip"));
    if (!any) return KILN_OK;
    static const char *const pure[] = {"Mul", "Div", "Add", "Erf", "Tanh", "Pow", "Clip"};
    bool *candidate = kiln_passes_mark_ops(g, pure, (int)(sizeof pure / sizeof *pure));
    if (!candidate) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    int n0 = g->n_nodes;
    for (int k = 0; k < n0; k++) {
        kiln_node *n = g->nodes[k];
        bool erf = !strcmp(n->op_type, "Erf"), tanh_form = !strcmp(n->op_type, "Tanh"), clip = !strcmp(n->op_type, "Clip");
        if (*n->domain || (!erf && !tanh_form && !clip)) continue;
        bool done;
        if (clip) KILN_TRY(fuse_hardswish(g, n, &done, err));
        else KILN_TRY(fuse(g, n, tanh_form, &done, err));
        *fused += done;
    }
    if (!*fused) return KILN_OK;
    kiln_passes_sweep(g, candidate);
    return KILN_OK;
}
