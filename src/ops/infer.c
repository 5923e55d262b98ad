/* infer.c - compile-time binding of nodes to the op registry, symbolic inference over graphs,
 * and the inference context API used by every op (the same calls run at run time with
 * constant dims). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops/ctx.h"
#include "ops/eval.h"

/* ---- context API ---- */

const kiln_node *kiln_infer_node(const kiln_infer_ctx *c) { return c->node; }
int kiln_infer_opset(const kiln_infer_ctx *c) { return c->node->opset; }
kiln_dimtab *kiln_infer_dims(const kiln_infer_ctx *c) { return c->tab; }
int kiln_infer_n_in(const kiln_infer_ctx *c) { return c->node->n_in; }
int kiln_infer_n_out(const kiln_infer_ctx *c) { return c->node->n_out; }

const kiln_type *kiln_infer_in(const kiln_infer_ctx *c, int i)
{
    return i >= 0 && i < c->node->n_in ? c->in[i] : NULL;
}

const kiln_value *kiln_infer_in_value(const kiln_infer_ctx *c, int i)
{
    const kiln_value *v = i >= 0 && i < c->node->n_in ? c->in_val[i] : NULL;
    /* a device node's device input: its contents are not readable here (the ops whose inference
     * needs them read those inputs on the host: kiln_provider_i.select) */
    return v && v->on_device ? NULL : v;
}

bool kiln_infer_in_dims_value(const kiln_infer_ctx *c, int i, kiln_dim *dims, int max, int *n)
{
    const kiln_value *v = kiln_infer_in_value(c, i);
    if (v) {
        if (v->kind != KILN_VALUE_TENSOR || v->rank > 1 || !kiln_dtype_is_int(v->dtype) || v->numel > max)
            return false;
        for (int64_t k = 0; k < v->numel; k++) dims[k] = kiln_dim_const(kiln_load_i64(v->dtype, v->data, k));
        *n = (int)v->numel;
        return true;
    }
    if (c->tab && i < c->node->n_in && c->node->in[i] && c->node->in[i]->shape_value) {
        const kiln_ir_value *iv = c->node->in[i];
        if (iv->shape_value_n > max) return false;
        memcpy(dims, iv->shape_value, (size_t)iv->shape_value_n * sizeof *dims);
        *n = iv->shape_value_n;
        return true;
    }
    return false;
}

const kiln_type *kiln_infer_out(const kiln_infer_ctx *c, int i)
{
    return kiln_infer_has_out(c, i) ? &c->out[i] : NULL;
}

bool kiln_infer_has_out(const kiln_infer_ctx *c, int i)
{
    return i >= 0 && i < c->node->n_out && c->node->out[i];
}

kiln_status kiln_infer_set_out(kiln_infer_ctx *c, int i, kiln_dtype dt, int rank, const kiln_dim *dims)
{
    if (i < 0 || i >= c->node->n_out) return KILN_OK;
    if (rank > KILN_MAX_RANK)
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "output rank %d exceeds %d", rank, KILN_MAX_RANK);
    kiln_type *t = &c->out[i];
    kiln_type_unknown(t);
    t->kind = KILN_VALUE_TENSOR;
    t->dtype = dt;
    t->rank = rank;
    for (int k = 0; k < rank; k++) {
        if (kiln_dim_is_const(dims[k]) && dims[k].c < 0)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "output %d would have negative dim %lld at axis %d", i,
                                   (long long)dims[k].c, k);
        t->dims[k] = dims[k];
    }
    return KILN_OK;
}

kiln_status kiln_infer_set_out_type(kiln_infer_ctx *c, int i, const kiln_type *t)
{
    if (i < 0 || i >= c->node->n_out) return KILN_OK;
    c->out[i] = *t;
    return KILN_OK;
}

kiln_status kiln_infer_set_out_unknown(kiln_infer_ctx *c, int i, kiln_dtype dt)
{
    if (i < 0 || i >= c->node->n_out) return KILN_OK;
    kiln_type_unknown(&c->out[i]);
    c->out[i].kind = KILN_VALUE_TENSOR;
    c->out[i].dtype = dt;
    return KILN_OK;
}

kiln_status kiln_infer_set_out_dims_value(kiln_infer_ctx *c, int i, const kiln_dim *dims, int n)
{
    if (!c->out_ir || i < 0 || i >= c->node->n_out || !c->out_ir[i]) return KILN_OK;
    kiln_ir_value *v = c->out_ir[i];
    kiln_dim *d = kiln_arena_calloc(&v->graph->model->arena, (size_t)n + 1, sizeof *d);
    if (!d) return kiln_infer_fail(c, KILN_ERR_NOMEM, "out of memory");
    if (n) memcpy(d, dims, (size_t)n * sizeof *d);
    v->shape_value = d;
    v->shape_value_n = n;
    return KILN_OK;
}

kiln_status kiln_infer_set_out_const(kiln_infer_ctx *c, int i, const kiln_value *v)
{
    if (!c->out_ir || i < 0 || i >= c->node->n_out || !c->out_ir[i]) return KILN_OK;
    c->out_ir[i]->init = v;
    return KILN_OK;
}

kiln_dim kiln_infer_fresh(kiln_infer_ctx *c, const char *hint)
{
    if (!c->tab) return kiln_dim_unknown();
    char buf[96];
    snprintf(buf, sizeof buf, "%s_%s", c->node->op_type, hint ? hint : "n");
    return kiln_dim_fresh(c->tab, buf);
}

kiln_status kiln_infer_fail(kiln_infer_ctx *c, kiln_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kiln_status st = kiln_errv_node(c->err, code, c->node->name, c->node->op_type, fmt, ap);
    va_end(ap);
    return st;
}

/* Compile time: remembers a constraint between dims that are not provably equal, to be
 * checked when the inputs bind the symbols. */
static kiln_status record_constraint(kiln_infer_ctx *c, kiln_dim a, kiln_dim b, bool broadcast, const char *what)
{
    /* a subgraph's constraints are checked when a call binds it (kiln_subgraph_bind): its
     * dims may reuse names of the main graph's symbols with other values per iteration, and
     * such a call runs with inference at run time instead */
    if (!c->tab || kiln_dim_equal(a, b) || kiln_dim_is_unknown(a) || kiln_dim_is_unknown(b))
        return KILN_OK;
    kiln_model *m = c->node->graph->model;
    const char *w = kiln_arena_strdup(&m->arena, what);
    if (!w) return kiln_infer_fail(c, KILN_ERR_NOMEM, "out of memory");
    kiln_constraint k = {.node = c->node, .a = a, .b = b, .broadcast = broadcast, .what = w};
    return kiln_model_add_constraint(m, &k, c->err);
}

kiln_status kiln_infer_require_equal(kiln_infer_ctx *c, kiln_dim a, kiln_dim b, const char *what)
{
    if (kiln_dim_is_const(a) && kiln_dim_is_const(b) && a.c != b.c)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "%s: %lld != %lld", what, (long long)a.c, (long long)b.c);
    return record_constraint(c, a, b, false, what);
}

static const char *in_name(const kiln_infer_ctx *c, const kiln_type *t)
{
    for (int i = 0; i < c->node->n_in; i++)
        if (c->in[i] == t) return c->node->in[i] ? c->node->in[i]->name : "?";
    return "?";
}

kiln_status kiln_infer_broadcast(kiln_infer_ctx *c, int n, const kiln_type *const *ins, int *rank, kiln_dim *dims)
{
    int r = 0;
    for (int i = 0; i < n; i++) {
        if (!ins[i]) continue;
        if (ins[i]->rank < 0) {
            *rank = -1;
            return KILN_OK;
        }
        if (ins[i]->rank > r) r = ins[i]->rank;
    }
    for (int k = 0; k < r; k++) dims[k] = kiln_dim_const(1);
    for (int i = 0; i < n; i++) {
        const kiln_type *t = ins[i];
        if (!t) continue;
        for (int k = 0; k < t->rank; k++) {
            int o = r - t->rank + k;
            kiln_dim a = dims[o], b = t->dims[k];
            if (kiln_dim_is_const(b) && b.c == 1) continue;
            if (kiln_dim_is_const(a) && a.c == 1) {
                dims[o] = b;
                continue;
            }
            if (kiln_dim_equal(a, b)) continue;
            if (kiln_dim_is_const(a) && kiln_dim_is_const(b)) {
                char sa[256] = "", sb[256];
                for (int j = 0; j < n; j++) {
                    if (!ins[j]) continue;
                    kiln_type_print(ins[j], sb, sizeof sb);
                    size_t l = strlen(sa);
                    snprintf(sa + l, sizeof sa - l, "%s'%s' %s", l ? ", " : "", in_name(c, ins[j]), sb);
                }
                return kiln_infer_fail(c, KILN_ERR_SHAPE,
                                       "inputs do not broadcast: dim %lld vs %lld at output axis %d (%s)",
                                       (long long)a.c, (long long)b.c, o, sa);
            }
            /* different and not both constant: equal unless one is 1 at run time. A
             * constant (not 1) is the result; of two symbolic dims the result is their max,
             * spelled as the plain symbol when the other operand is compound. */
            char what[256];
            snprintf(what, sizeof what, "input '%s' does not broadcast with the others at output axis %d",
                     in_name(c, t), o);
            KILN_TRY(record_constraint(c, a, b, true, what));
            if (kiln_dim_is_const(b)) dims[o] = b;
            else if (!kiln_dim_is_const(a)) {
                bool sa = a.e->kind == KILN_EXPR_SYM, sb = b.e->kind == KILN_EXPR_SYM;
                dims[o] = sa && !sb ? a : sb && !sa ? b : kiln_dim_max(c->tab, a, b);
            }
        }
    }
    *rank = r;
    return KILN_OK;
}

kiln_status kiln_infer_same_as_input(kiln_infer_ctx *c, int out, int in)
{
    const kiln_type *t = kiln_infer_in(c, in);
    if (!t) return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d is missing", in);
    return kiln_infer_set_out_type(c, out, t);
}

/* ---- run-time types ---- */

void kiln_type_of_value(const kiln_value *v, kiln_type *t)
{
    kiln_type_unknown(t);
    if (!v) return;
    t->kind = v->kind;
    t->dtype = v->dtype;
    const kiln_value *tensor = v->kind == KILN_VALUE_TENSOR ? v : v->kind == KILN_VALUE_OPTIONAL ? v->inner : NULL;
    if (v->kind == KILN_VALUE_OPTIONAL) t->elem_kind = v->inner ? v->inner->kind : 0;
    if (tensor && tensor->kind == KILN_VALUE_TENSOR) {
        t->rank = tensor->rank;
        for (int k = 0; k < tensor->rank; k++) t->dims[k] = kiln_dim_const(tensor->dims[k]);
    }
}

/* ---- compile-time passes ---- */

kiln_status kiln_node_bind(kiln_node *n, kiln_err *err)
{
    n->op = kiln_op_lookup(n->domain, n->op_type, n->opset);
    n->params = NULL;
    if (!n->op || !n->op->parse) return KILN_OK;
    void *p = kiln_arena_calloc(&n->graph->model->arena, 1, n->op->params_size ? n->op->params_size : 1);
    if (!p) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    KILN_TRY(n->op->parse(n, p, err));
    n->params = p;
    return KILN_OK;
}

kiln_status kiln_bind_ops(kiln_graph *g, bool strict, kiln_err *err)
{
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = g->nodes[k];
        KILN_TRY(kiln_node_bind(n, err));
        /* kernels write output 0; every ONNX operator declares at least one output */
        if (n->n_out == 0)
            return kiln_errf(err, KILN_ERR_MODEL, "node '%s' (%s): no outputs", n->name, n->op_type);
        if (n->op && !(n->op->flags & KILN_OP_X_OPTIONAL) && (n->n_in == 0 || !n->in[0]))
            return kiln_errf(err, KILN_ERR_MODEL, "node '%s' (%s): input 0 is missing", n->name, n->op_type);
        if (!n->op && strict)
            return kiln_errf(err, KILN_ERR_UNSUPPORTED, "node '%s': operator %s%s%s (opset %d) is not supported",
                             n->name, n->domain, *n->domain ? "." : "", n->op_type, n->opset);
        for (int a = 0; a < n->n_attrs; a++) {
            kiln_attr *at = &n->attrs[a];
            if (at->type == KILN_ATTR_GRAPH) KILN_TRY(kiln_bind_ops(at->g, strict, err));
            for (int q = 0; at->type == KILN_ATTR_GRAPHS && q < at->n; q++)
                KILN_TRY(kiln_bind_ops(at->graphs[q], strict, err));
        }
    }
    return KILN_OK;
}

static bool type_known(const kiln_type *t)
{
    return t->kind == KILN_VALUE_SEQUENCE || t->kind == KILN_VALUE_OPTIONAL ||
           (t->kind == KILN_VALUE_TENSOR && t->rank >= 0 && t->dtype != KILN_DTYPE_UNDEFINED);
}

kiln_status kiln_graph_infer(kiln_graph *g, kiln_err *note)
{
    kiln_dimtab *tab = g->model->dims;
    const kiln_type *in[64];
    const kiln_value *in_val[64];
    kiln_type out[64];
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = g->nodes[k];
        for (int a = 0; a < n->n_attrs; a++) {
            kiln_attr *at = &n->attrs[a];
            if (at->type == KILN_ATTR_GRAPH) KILN_TRY(kiln_graph_infer(at->g, note));
            for (int q = 0; at->type == KILN_ATTR_GRAPHS && q < at->n; q++)
                KILN_TRY(kiln_graph_infer(at->graphs[q], note));
        }
        bool ok = n->op && n->op->infer && n->n_in <= 64 && n->n_out <= 64;
        for (int i = 0; ok && i < n->n_in; i++) {
            in[i] = n->in[i] ? &n->in[i]->type : NULL;
            in_val[i] = kiln_ir_constant(n->in[i]);
            if (in[i] && !type_known(in[i])) ok = false;
        }
        if (ok) {
            for (int i = 0; i < n->n_out; i++) kiln_type_unknown(&out[i]);
            kiln_err err = {0};
            kiln_infer_ctx c = {.node = n, .tab = tab, .in = in, .in_val = in_val, .out = out, .out_ir = n->out, .err = &err};
            kiln_status st = n->op->infer(&c);
            if (st) {
                ok = false;
                if (note && note->code == KILN_OK) *note = err;
            }
        }
        for (int i = 0; i < n->n_out; i++) {
            if (!n->out[i]) continue;
            if (ok) {
                n->out[i]->type = out[i];
            } else {
                kiln_type_unknown(&n->out[i]->type);
                n->out[i]->init = NULL;
                n->out[i]->shape_value = NULL;
            }
        }
    }
    return KILN_OK;
}
