/* fused.c - kiln's fused operators (fused.h): inference and reference kernels that are the
 * ONNX op's own (src/ops/nn_conv.c, nn_matmul.c) followed by the residual or bias Add and the
 * activation exactly as those ops' reference kernels compute them. */
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "ops/fused.h"
#include "ops/nn_internal.h"
#include "ops/op.h"
#include "ops/util.h"

static const kiln_fused no_fusion = {{KILN_ACT_NONE, 0.0f, 0.0f}, 0, 0};

static const struct {
    const char *name;
    kiln_act_kind kind;
    int n_params; /* activation_params it takes */
    float alpha, beta; /* their defaults */
} acts[] = {
    {"Relu", KILN_ACT_RELU, 0, 0, 0},
    {"Clip", KILN_ACT_CLIP, 2, -INFINITY, INFINITY},
    {"Sigmoid", KILN_ACT_SIGMOID, 0, 0, 0},
    {"HardSigmoid", KILN_ACT_HARD_SIGMOID, 2, 0.2f, 0.5f},
    {"HardSwish", KILN_ACT_HARD_SWISH, 0, 0, 0},
    {"LeakyRelu", KILN_ACT_LEAKY_RELU, 1, 0.01f, 0},
    {"Gelu", KILN_ACT_GELU, 0, 0, 0},
    {"GeluTanh", KILN_ACT_GELU_TANH, 0, 0, 0},
    {"Tanh", KILN_ACT_TANH, 0, 0, 0},
};

const char *kiln_act_name(kiln_act_kind k)
{
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++)
        if (acts[i].kind == k) return acts[i].name;
    return "";
}

const kiln_fused *kiln_fused_of(const kiln_node *n)
{
    return n->op && (n->op->flags & KILN_OP_FUSED) && n->params ? n->params : &no_fusion;
}

static const struct {
    const char *onnx, *fused;
} fused_ops[] = {{"Conv", "FusedConv"}, {"Gemm", "FusedGemm"}, {"MatMul", "FusedMatMul"}, {"Add", "FusedAdd"}};

const char *kiln_fused_op_type(const char *op_type)
{
    for (size_t i = 0; i < sizeof fused_ops / sizeof *fused_ops; i++)
        if (!strcmp(fused_ops[i].onnx, op_type)) return fused_ops[i].fused;
    return NULL;
}

bool kiln_node_is_fused(const kiln_node *n, const char *op_type)
{
    const char *f = kiln_fused_op_type(op_type);
    return f && !strcmp(n->domain, "kiln") && !strcmp(n->op_type, f);
}

static kiln_status fused_parse(const kiln_node *n, void *params, kiln_err *err)
{
    kiln_fused *p = params;
    *p = no_fusion;
    const char *name = kiln_attr_string(n, "activation", NULL);
    int np = 0;
    const float *v = kiln_attr_floats(n, "activation_params", &np);
    if (name) {
        size_t i = 0;
        while (i < sizeof acts / sizeof *acts && strcmp(acts[i].name, name)) i++;
        if (i == sizeof acts / sizeof *acts)
            return kiln_errf(err, KILN_ERR_MODEL, "node '%s' (kiln.%s): unknown activation '%s'", n->name, n->op_type,
                             name);
        if (np > acts[i].n_params)
            return kiln_errf(err, KILN_ERR_MODEL, "node '%s' (kiln.%s): activation %s takes %d activation_params, %d given",
                             n->name, n->op_type, name, acts[i].n_params, np);
        p->act = (kiln_act){acts[i].kind, np > 0 ? v[0] : acts[i].alpha, np > 1 ? v[1] : acts[i].beta};
    } else if (np) {
        return kiln_errf(err, KILN_ERR_MODEL, "node '%s' (kiln.%s): activation_params without an activation", n->name,
                         n->op_type);
    }
    if (!strcmp(n->op_type, "FusedConv") && n->n_in > 3 && n->in[3]) p->residual = 3;
    if (!strcmp(n->op_type, "FusedMatMul") && n->n_in > 2 && n->in[2]) p->bias = 2;
    return KILN_OK;
}

/* ---- inference: the ONNX op's, then what the fusion adds ---- */

static kiln_status check_fusion(kiln_infer_ctx *c, int max_in)
{
    if (kiln_infer_n_in(c) > max_in)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "takes at most %d inputs, has %d", max_in, kiln_infer_n_in(c));
    const kiln_type *x = kiln_infer_in(c, 0);
    if (kiln_fused_of(kiln_infer_node(c))->act.kind != KILN_ACT_NONE && x && x->dtype && !kiln_dtype_is_float(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "an activation needs a float type, not %s", kiln_dtype_name(x->dtype));
    return KILN_OK;
}

/* The type inferred for output 0, when inference gave it a known rank. */
static const kiln_type *out0(kiln_infer_ctx *c)
{
    const kiln_type *y = kiln_infer_out(c, 0);
    return y && y->kind == KILN_VALUE_TENSOR && y->rank >= 0 ? y : NULL;
}

static kiln_status fused_conv_infer(kiln_infer_ctx *c)
{
    KILN_TRY(check_fusion(c, 4));
    KILN_TRY(kiln_nn_conv_infer(c));
    const kiln_type *z = kiln_infer_in(c, 3), *y = out0(c);
    if (!z || !y || z->rank < 0) return KILN_OK;
    if (z->dtype && y->dtype && z->dtype != y->dtype)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "Z is %s, Y %s", kiln_dtype_name(z->dtype), kiln_dtype_name(y->dtype));
    if (z->rank != y->rank) return kiln_infer_fail(c, KILN_ERR_SHAPE, "Z has rank %d, Y %d", z->rank, y->rank);
    for (int k = 0; k < y->rank; k++) KILN_TRY(kiln_infer_require_equal(c, z->dims[k], y->dims[k], "Z dims and Y dims"));
    return KILN_OK;
}

static kiln_status fused_gemm_infer(kiln_infer_ctx *c)
{
    KILN_TRY(check_fusion(c, 3));
    return kiln_nn_gemm_infer(c);
}

static kiln_status fused_matmul_infer(kiln_infer_ctx *c)
{
    KILN_TRY(check_fusion(c, 3));
    KILN_TRY(kiln_nn_matmul_infer(c));
    const kiln_type *b = kiln_infer_in(c, 2), *y = out0(c);
    if (!b || !y || b->rank < 0) return KILN_OK;
    if (b->dtype && y->dtype && b->dtype != y->dtype)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "bias is %s, Y %s", kiln_dtype_name(b->dtype), kiln_dtype_name(y->dtype));
    /* the bias must not widen Y: [..., 1, N] with at most Y's rank */
    if (b->rank < 1 || b->rank > y->rank || y->rank < 1)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "bias has rank %d, Y %d", b->rank, y->rank);
    for (int k = 0; k + 1 < b->rank; k++)
        if (!kiln_dim_is_const(b->dims[k]) || b->dims[k].c != 1)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "bias dim %d must be 1", k);
    return kiln_infer_require_equal(c, b->dims[b->rank - 1], y->dims[y->rank - 1], "bias length and Y's last dim");
}

static kiln_status fused_add_infer(kiln_infer_ctx *c)
{
    KILN_TRY(check_fusion(c, 2));
    return kiln_ops_binary_infer(c);
}

/* ---- reference kernels ---- */

/* Applies act in place over y, as the activation op's reference kernel does. */
static kiln_status act_reference(kiln_run_ctx *c, const kiln_act *a, kiln_value *y)
{
    if (a->kind == KILN_ACT_NONE || !y) return KILN_OK;
    if (!kiln_dtype_is_float(y->dtype))
        return kiln_run_fail(c, KILN_ERR_MODEL, "an activation needs a float type, not %s", kiln_dtype_name(y->dtype));
    if (a->kind == KILN_ACT_CLIP) { /* Clip's float path: NaN kept */
        for (int64_t i = 0; i < y->numel; i++) {
            double v = kiln_load_f64(y->dtype, y->data, i);
            if (!isnan(v)) v = fmin(fmax(v, (double)a->alpha), (double)a->beta);
            kiln_store_f64(y->dtype, y->data, i, v);
        }
        return KILN_OK;
    }
    const char *op = a->kind == KILN_ACT_GELU_TANH ? "Gelu" : kiln_act_name(a->kind);
    if (!kiln_ops_unary_reference(op, a->alpha, a->beta, a->kind == KILN_ACT_GELU_TANH, y))
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "activation %s has no reference", op);
    return KILN_OK;
}

/* y += r, r broadcast along y's trailing elements (r->numel divides y->numel), as Add computes it. */
static kiln_status add_reference(kiln_run_ctx *c, kiln_value *y, const kiln_value *r, const char *what)
{
    if (!y || !r) return KILN_OK;
    if (r->dtype != y->dtype || !r->numel || y->numel % r->numel)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "%s (%s, %lld elements) does not fit Y (%s, %lld elements)", what,
                             kiln_dtype_name(r->dtype), (long long)r->numel, kiln_dtype_name(y->dtype), (long long)y->numel);
    for (int64_t i = 0; i < y->numel; i++)
        kiln_store_f64(y->dtype, y->data, i,
                       kiln_load_f64(y->dtype, y->data, i) + kiln_load_f64(r->dtype, r->data, i % r->numel));
    return KILN_OK;
}

static kiln_status fused_conv_run(kiln_run_ctx *c)
{
    const kiln_fused *f = kiln_fused_of(kiln_run_node(c));
    KILN_TRY(kiln_nn_conv_run(c));
    kiln_value *y = kiln_run_out(c, 0);
    const kiln_value *z = f->residual ? kiln_run_in(c, f->residual) : NULL;
    if (z && y && z->numel != y->numel) return kiln_run_fail(c, KILN_ERR_SHAPE, "Z does not have Y's shape");
    KILN_TRY(add_reference(c, y, z, "Z"));
    return act_reference(c, &f->act, y);
}

static kiln_status fused_gemm_run(kiln_run_ctx *c)
{
    KILN_TRY(kiln_nn_gemm_run(c));
    return act_reference(c, &kiln_fused_of(kiln_run_node(c))->act, kiln_run_out(c, 0));
}

static kiln_status fused_matmul_run(kiln_run_ctx *c)
{
    const kiln_fused *f = kiln_fused_of(kiln_run_node(c));
    KILN_TRY(kiln_nn_matmul_run(c));
    kiln_value *y = kiln_run_out(c, 0);
    const kiln_value *b = f->bias ? kiln_run_in(c, f->bias) : NULL;
    if (b && y && (!y->rank || b->numel != y->dims[y->rank - 1]))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "bias has %lld elements, not Y's last dim", (long long)b->numel);
    KILN_TRY(add_reference(c, y, b, "bias"));
    return act_reference(c, &f->act, y);
}

static kiln_status fused_add_run(kiln_run_ctx *c)
{
    KILN_TRY(kiln_ops_binary_run(c));
    return act_reference(c, &kiln_fused_of(kiln_run_node(c))->act, kiln_run_out(c, 0));
}

/* ---- ChannelLookup ---- */

static kiln_status channel_lookup_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *t = kiln_infer_in(c, 1);
    if (!x || !t) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs X and T");
    if (x->dtype && x->dtype != KILN_DTYPE_UINT8 && x->dtype != KILN_DTYPE_INT8)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "X must be uint8 or int8, is %s", kiln_dtype_name(x->dtype));
    if (t->dtype && t->dtype != KILN_DTYPE_UINT8 && t->dtype != KILN_DTYPE_INT8)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "T must be uint8 or int8, is %s", kiln_dtype_name(t->dtype));
    if (t->rank >= 0 && (t->rank != 2 || !kiln_dim_is_const(t->dims[1]) || t->dims[1].c != 256))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "T must be [C, 256]");
    if (x->rank >= 0 && x->rank < 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must have rank >= 2 ([N, C, ...]), has rank %d", x->rank);
    if (x->rank >= 2 && t->rank == 2)
        KILN_TRY(kiln_infer_require_equal(c, x->dims[1], t->dims[0], "X's channels and T's rows"));
    return kiln_infer_set_out(c, 0, t->dtype, x->rank, x->dims);
}

static kiln_status channel_lookup_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *t = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    if (x->rank < 2 || t->rank != 2 || t->dims[1] != 256 || t->dims[0] != x->dims[1])
        return kiln_run_fail(c, KILN_ERR_SHAPE, "T must be [C, 256] for X's C = %lld",
                             (long long)(x->rank >= 2 ? x->dims[1] : -1));
    int64_t C = x->dims[1], S = x->numel && C ? x->numel / (x->dims[0] * C) : 0;
    const uint8_t *xv = x->data, *tv = t->data;
    uint8_t *yv = y->data;
    for (int64_t p = 0; p < x->numel / (S ? S : 1) && S; p++) {
        const uint8_t *row = tv + (p % C) * 256;
        for (int64_t i = p * S; i < (p + 1) * S; i++) yv[i] = row[xv[i]];
    }
    return KILN_OK;
}

/* ---- SiluMul ---- */

static kiln_status silu_mul_infer(kiln_infer_ctx *c)
{
    int n_in = kiln_infer_n_in(c);
    const kiln_type *g = kiln_infer_in(c, 0), *u = n_in == 2 ? kiln_infer_in(c, 1) : g;
    if (!g || !u || n_in < 1 || n_in > 2) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs G and U, or H");
    if (g->dtype && !kiln_dtype_is_float(g->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "G must be a float type, is %s", kiln_dtype_name(g->dtype));
    if (n_in == 1) { /* packed: Y is H with its last dim halved */
        if (g->rank == 0) return kiln_infer_fail(c, KILN_ERR_SHAPE, "H is a scalar");
        if (g->rank < 0) return kiln_infer_set_out(c, 0, g->dtype, -1, NULL);
        kiln_dim d[KILN_MAX_RANK];
        memcpy(d, g->dims, (size_t)g->rank * sizeof *d);
        kiln_dim last = d[g->rank - 1];
        if (kiln_dim_is_const(last) && last.c % 2)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "H's last dim %lld is odd", (long long)last.c);
        d[g->rank - 1] = kiln_dim_is_const(last) ? kiln_dim_const(last.c / 2)
                                                 : kiln_dim_floordiv(kiln_infer_dims(c), last, kiln_dim_const(2));
        return kiln_infer_set_out(c, 0, g->dtype, g->rank, d);
    }
    if (g->dtype && u->dtype && g->dtype != u->dtype)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "G is %s, U %s", kiln_dtype_name(g->dtype), kiln_dtype_name(u->dtype));
    if (g->rank >= 0 && u->rank >= 0) {
        if (g->rank != u->rank) return kiln_infer_fail(c, KILN_ERR_SHAPE, "G has rank %d, U %d", g->rank, u->rank);
        for (int k = 0; k < g->rank; k++) KILN_TRY(kiln_infer_require_equal(c, g->dims[k], u->dims[k], "G dims and U dims"));
    }
    return kiln_infer_same_as_input(c, 0, 0);
}

bool kiln_silu_mul_rows_of(const kiln_value *G, const kiln_value *U, const kiln_value *Y, kiln_silu_mul_rows *r)
{
    r->g = G->data, r->total = Y->numel;
    if (U) {
        r->u = U->data, r->n = r->stride = Y->numel;
        return U->dtype == G->dtype && U->numel == G->numel && Y->numel == G->numel;
    }
    int64_t h = G->rank ? G->dims[G->rank - 1] : 0;
    r->n = h / 2, r->stride = h;
    r->u = G->data ? (const char *)G->data + (size_t)(h / 2) * kiln_dtype_size(G->dtype) : NULL;
    return G->rank && h % 2 == 0 && Y->numel * 2 == G->numel;
}

/* The unfused chain, each node's result rounded to the type: s = Sigmoid(G), t = G * s, Y = t * U. */
static kiln_status silu_mul_run(kiln_run_ctx *c)
{
    const kiln_value *g = kiln_run_in(c, 0), *u = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    kiln_silu_mul_rows r;
    if (!kiln_silu_mul_rows_of(g, u, y, &r)) {
        if (!u)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "H's last dim (%lld) must be even",
                                 (long long)(g->rank ? g->dims[g->rank - 1] : 0));
        return kiln_run_fail(c, KILN_ERR_SHAPE, "U (%s, %lld elements) does not fit G (%s, %lld elements)",
                             kiln_dtype_name(u->dtype), (long long)u->numel, kiln_dtype_name(g->dtype), (long long)g->numel);
    }
    for (int64_t i = 0; i < r.total; i++) {
        int64_t at = i / r.n * r.stride + i % r.n;
        double gv = kiln_load_f64(g->dtype, r.g, at);
        double sv = kiln_round_to(g->dtype, 1.0 / (1.0 + exp(-gv)));
        double tv = kiln_round_to(g->dtype, gv * sv);
        kiln_store_f64(y->dtype, y->data, i, tv * kiln_load_f64(g->dtype, r.u, at));
    }
    return KILN_OK;
}

#define FUSED(name, infer, run) {"kiln", name, 1, infer, run, KILN_OP_FUSED, 0, fused_parse, sizeof(kiln_fused)}

static const kiln_op_def defs[] = {
    FUSED("FusedConv", fused_conv_infer, fused_conv_run),
    FUSED("FusedGemm", fused_gemm_infer, fused_gemm_run),
    FUSED("FusedMatMul", fused_matmul_infer, fused_matmul_run),
    {"kiln", "FusedAdd", 1, fused_add_infer, fused_add_run, KILN_OP_FUSED | KILN_OP_INPLACE, 0, fused_parse,
     sizeof(kiln_fused)},
    {"kiln", "ChannelLookup", 1, channel_lookup_infer, channel_lookup_run, 0},
    {"kiln", "SiluMul", 1, silu_mul_infer, silu_mul_run, 0},
};

const kiln_op_table kiln_ops_fused = {defs, sizeof defs / sizeof defs[0]};
