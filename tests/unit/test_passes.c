/* test_passes.c - each graph pass on small models built with modelgen: run alone through the
 * pass runner, it rewrites the structure as documented (node count, op types, attributes,
 * consumer lists consistent with a recount), and a session with every pass computes what the
 * unoptimized session computes on random inputs. Fused nodes' reference kernels are checked
 * against the unfused chain's, bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "cpu/kernels.h"
#include "cpu/nchwc.h"
#include "exec/providers.h"
#include "modelgen.h"
#include "onnx/load.h"
#include "ops/eval.h"
#include "ops/fused.h"
#include "ops/llm.h"
#include "passes/pass.h"
#include "passes/passes.h"
#include "unit.h"

enum { FLOAT = 1, UINT8 = 2, INT64 = 7, FLOAT16 = 10 };

static const kiln_pass P_FOLD = {"fold_constants", kiln_pass_fold_constants};
static const kiln_pass P_CONV_BN = {"fold_conv_bn", kiln_pass_fold_conv_bn};
static const kiln_pass P_RESIDUAL = {"fuse_residual", kiln_pass_fuse_residual};
static const kiln_pass P_ACT = {"fuse_activation", kiln_pass_fuse_activation};
static const kiln_pass P_BIAS = {"fuse_matmul_bias", kiln_pass_fuse_matmul_bias};
static const kiln_pass P_GELU = {"fuse_gelu", kiln_pass_fuse_gelu};
static const kiln_pass P_LN = {"fuse_layernorm", kiln_pass_fuse_layernorm};
static const kiln_pass P_ATTN = {"fuse_attention", kiln_pass_fuse_attention};
static const kiln_pass P_ATTN_GPU = {"fuse_attention", kiln_pass_fuse_attention_gpu};
static const kiln_pass P_NCHWC = {"layout_nchwc", kiln_pass_layout_nchwc};
static const kiln_pass P_ADOPT = {"adopt_ms_fused_conv", kiln_pass_adopt_ms_fused_conv};
static const kiln_pass P_RESIDUAL_GPU = {"fuse_residual", kiln_pass_fuse_residual_gpu};
static const kiln_pass P_ACT_GPU = {"fuse_activation", kiln_pass_fuse_activation_gpu};
static const kiln_pass P_SILU = {"fuse_silu_mul", kiln_pass_fuse_silu_mul};

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

static float *rand_floats(int64_t n)
{
    float *v = malloc((size_t)n * sizeof *v + 1);
    for (int64_t i = 0; i < n; i++) v[i] = frand();
    return v;
}

static void init(mg_model *m, const char *name, int rank, const int64_t *dims)
{
    int64_t n = 1;
    for (int k = 0; k < rank; k++) n *= dims[k];
    float *v = rand_floats(n);
    mg_init_float(m, name, rank, dims, v, NULL, 0);
    free(v);
}

static void scalar(mg_model *m, const char *name, float v) { mg_init_float(m, name, 0, NULL, &v, NULL, 0); }

typedef struct built {
    unsigned char *buf;
    size_t len;
} built;

static built finish(mg_model *m)
{
    built b;
    b.buf = mg_serialize(m, &b.len);
    mg_free(m);
    return b;
}

/* The model loaded, bound and inferred: what the session's compile has before the passes. */
static kiln_model *load(const built *b)
{
    kiln_model *m = NULL;
    kiln_err err = {0};
    if (kiln_onnx_load(b->buf, b->len, NULL, &m, &err) || kiln_bind_ops(m->graph, true, &err) ||
        kiln_graph_infer(m->graph, NULL)) {
        fprintf(stderr, "load: %s\n", err.msg);
        kiln_model_free(m);
        return NULL;
    }
    return m;
}

/* Runs one pass through the runner; returns its count of rewrites (-1 on failure). */
static int run_pass(kiln_model *m, const kiln_pass *p)
{
    kiln_err err = {0};
    int changed = -1;
    if (kiln_passes_run(m->graph, p, 1, &changed, &err)) {
        fprintf(stderr, "%s: %s\n", p->name, err.msg);
        return -1;
    }
    CHECK(kiln_graph_uses_consistent(m->graph));
    for (int k = 0; k < m->graph->n_nodes; k++) CHECK(m->graph->nodes[k]->index == k);
    return changed;
}

static int count_op(const kiln_graph *g, const char *domain, const char *op)
{
    int n = 0;
    for (int k = 0; k < g->n_nodes; k++) n += !strcmp(g->nodes[k]->domain, domain) && !strcmp(g->nodes[k]->op_type, op);
    return n;
}

static kiln_node *find_op(const kiln_graph *g, const char *domain, const char *op)
{
    for (int k = 0; k < g->n_nodes; k++)
        if (!strcmp(g->nodes[k]->domain, domain) && !strcmp(g->nodes[k]->op_type, op)) return g->nodes[k];
    return NULL;
}

/* Output "Y" of b's unoptimised session run with its one input "unused" (a float32 [1]), for the
 * models whose other inputs are all initializers; NULL when it fails. */
static kiln_value *unoptimized_y(const built *b)
{
    kiln_session_options opt = kiln_session_options_default();
    opt.unoptimized = true;
    kiln_session *ss = NULL;
    float one = 0;
    kiln_value *in = NULL, *y = NULL;
    const char *in_names[] = {"unused"}, *out_names[] = {"Y"};
    if (kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 1, (int64_t[]){1}, &one, sizeof one, &in) ||
        kiln_session_create_from_memory(b->buf, b->len, NULL, &opt, &ss) ||
        kiln_session_run(ss, 1, in_names, (const kiln_value *const *)&in, 1, out_names, &y))
        y = NULL;
    kiln_session_free(ss);
    kiln_value_free(in);
    return y;
}

/* Runs the optimised and the unoptimised session on the same random inputs; the max abs
 * difference of output "Y" (or INFINITY when a run fails). */
static double session_diff(const built *b, int n_in, const char *const *names, const int *ranks,
                           const int64_t (*dims)[4])
{
    kiln_value *in[4] = {0}, *out[2] = {0};
    float *data[4] = {0};
    for (int i = 0; i < n_in; i++) {
        int64_t n = 1;
        for (int k = 0; k < ranks[i]; k++) n *= dims[i][k];
        data[i] = rand_floats(n);
        kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, ranks[i], dims[i], data[i], (size_t)n * sizeof(float), &in[i]);
    }
    const char *out_names[] = {"Y"};
    double diff = INFINITY;
    for (int ref = 0; ref < 2; ref++) {
        kiln_session_options opt = kiln_session_options_default();
        opt.unoptimized = ref;
        kiln_session *s = NULL;
        if (kiln_session_create_from_memory(b->buf, b->len, NULL, &opt, &s) ||
            kiln_session_run(s, n_in, names, (const kiln_value *const *)in, 1, out_names, &out[ref]))
            fprintf(stderr, "session (%s): %s\n", ref ? "reference" : "optimised", kiln_last_error(s));
        kiln_session_free(s);
    }
    if (out[0] && out[1] && kiln_value_numel(out[0]) == kiln_value_numel(out[1])) {
        const float *a = kiln_value_data(out[0]), *r = kiln_value_data(out[1]);
        diff = 0;
        for (int64_t i = 0; i < kiln_value_numel(out[0]); i++) {
            double d = fabs((double)a[i] - r[i]);
            if (!(d <= diff)) diff = d; /* NaN propagates */
        }
    }
    for (int i = 0; i < 2; i++) kiln_value_free(out[i]);
    for (int i = 0; i < n_in; i++) {
        kiln_value_free(in[i]);
        free(data[i]);
    }
    return diff;
}

static const char *const X_ONLY[] = {"X"};

/* ---- fold_constants: Mul(X, Add(C1, C2)) keeps one node reading a new constant ---- */
static void test_fold_constants(void)
{
    mg_model *m = mg_new(13);
    int64_t d[2] = {3, 4};
    mg_input(m, "X", FLOAT, 2, d, NULL);
    init(m, "C1", 2, d);
    init(m, "C2", 2, d);
    mg_node(m, "Add", "", (const char *[]){"C1", "C2", NULL}, (const char *[]){"S", NULL});
    mg_node(m, "Mul", "", (const char *[]){"X", "S", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_FOLD) == 1);
    if (md) {
        const kiln_graph *g = md->graph;
        CHECK(g->n_nodes == 1 && count_op(g, "", "Mul") == 1);
        const kiln_node *mul = g->nodes[0];
        CHECK(mul->in[1]->init && !mul->in[1]->producer && mul->in[1]->n_uses == 1);
        const float *s = mul->in[1]->init->data, *c1 = NULL;
        for (int i = 0; i < g->n_values; i++)
            if (!strcmp(g->values[i]->name, "C1")) c1 = g->values[i]->init->data;
        CHECK(c1 && s && s[0] != c1[0]); /* the sum, not an operand */
        CHECK(run_pass(md, &P_FOLD) == 0);
    }
    kiln_model_free(md);
    int ranks[] = {2};
    int64_t dims[][4] = {{3, 4}};
    CHECK(session_diff(&b, 1, X_ONLY, ranks, dims) <= 1e-6);
    free(b.buf);
}

/* ---- fold_conv_bn: Conv -> BatchNormalization is one Conv with new W and B producing Y ---- */
static void test_fold_conv_bn(void)
{
    mg_model *m = mg_new(13);
    int64_t x[4] = {1, 4, 6, 6}, w[4] = {8, 4, 3, 3}, c[1] = {8};
    mg_input(m, "X", FLOAT, 4, x, NULL);
    init(m, "W", 4, w);
    init(m, "scale", 1, c);
    init(m, "beta", 1, c);
    init(m, "mean", 1, c);
    float var[8];
    for (int i = 0; i < 8; i++) var[i] = 0.5f + (float)i;
    mg_init_float(m, "var", 1, c, var, NULL, 0);
    mg_node(m, "Conv", "", (const char *[]){"X", "W", NULL}, (const char *[]){"C", NULL});
    mg_node(m, "BatchNormalization", "", (const char *[]){"C", "scale", "beta", "mean", "var", NULL},
            (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_CONV_BN) == 1);
    if (md) {
        const kiln_graph *g = md->graph;
        CHECK(g->n_nodes == 1 && count_op(g, "", "Conv") == 1);
        const kiln_node *conv = g->nodes[0];
        CHECK(conv->n_in == 3 && conv->in[2] && conv->in[2]->init && !strcmp(conv->out[0]->name, "Y"));
        CHECK(conv->in[1]->init && strcmp(conv->in[1]->name, "W") && conv->out[0]->producer == conv);
    }
    kiln_model_free(md);
    int ranks[] = {4};
    int64_t dims[][4] = {{1, 4, 6, 6}};
    CHECK(session_diff(&b, 1, X_ONLY, ranks, dims) <= 1e-4);
    free(b.buf);
}

/* Conv -> Mul(scalar) -> Add([1, M, 1, 1]) -> Div(scalar): paddle2onnx's learnt affine after a
 * Conv (Mul with the constant first) folds into the Conv; Sub(c, Conv) (not y - c) stays. */
static void test_fold_conv_affine(void)
{
    mg_model *m = mg_new(13);
    int64_t x[4] = {1, 4, 6, 6}, w[4] = {8, 4, 3, 3}, c[4] = {1, 8, 1, 1};
    mg_input(m, "X", FLOAT, 4, x, NULL);
    init(m, "W", 4, w);
    init(m, "B", 1, (int64_t[]){8});
    init(m, "shift", 4, c);
    scalar(m, "k", 1.7f);
    scalar(m, "d", -2.5f);
    mg_node(m, "Conv", "", (const char *[]){"X", "W", "B", NULL}, (const char *[]){"C", NULL});
    mg_node(m, "Mul", "", (const char *[]){"k", "C", NULL}, (const char *[]){"m", NULL});
    mg_node(m, "Add", "", (const char *[]){"m", "shift", NULL}, (const char *[]){"a", NULL});
    mg_node(m, "Div", "", (const char *[]){"a", "d", NULL}, (const char *[]){"q", NULL});
    mg_node(m, "Sub", "", (const char *[]){"k", "q", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_CONV_BN) == 3);
    if (md) {
        const kiln_graph *g = md->graph;
        CHECK(g->n_nodes == 2 && count_op(g, "", "Conv") == 1 && count_op(g, "", "Sub") == 1);
        const kiln_node *conv = g->nodes[0];
        CHECK(conv->n_in == 3 && conv->in[2]->init && !strcmp(conv->out[0]->name, "q"));
    }
    kiln_model_free(md);
    int ranks[] = {4};
    int64_t dims[][4] = {{1, 4, 6, 6}};
    CHECK(session_diff(&b, 1, X_ONLY, ranks, dims) <= 1e-4);
    free(b.buf);
}

/* x * Clip(x + 3, 0, 6) / 6 -> HardSwish(x) */
static void test_fuse_hardswish(void)
{
    mg_model *m = mg_new(13);
    int64_t x[2] = {3, 7};
    mg_input(m, "X", FLOAT, 2, x, NULL);
    scalar(m, "three", 3.0f);
    scalar(m, "zero", 0.0f);
    scalar(m, "six", 6.0f);
    mg_node(m, "Add", "", (const char *[]){"X", "three", NULL}, (const char *[]){"a", NULL});
    mg_node(m, "Clip", "", (const char *[]){"a", "zero", "six", NULL}, (const char *[]){"c", NULL});
    mg_node(m, "Mul", "", (const char *[]){"c", "X", NULL}, (const char *[]){"p", NULL});
    mg_node(m, "Div", "", (const char *[]){"p", "six", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_GELU) == 1);
    if (md) {
        kiln_node *h = find_op(md->graph, "", "HardSwish");
        CHECK(md->graph->n_nodes == 1 && h && h->n_in == 1 && !strcmp(h->in[0]->name, "X") && h->op);
        CHECK(h && !strcmp(h->out[0]->name, "Y"));
    }
    kiln_model_free(md);
    int ranks[] = {2};
    int64_t dims[][4] = {{3, 7}};
    CHECK(session_diff(&b, 1, X_ONLY, ranks, dims) <= 1e-5);
    free(b.buf);
}

/* Conv(X, W, B) -> Add(R) -> act: the ResNet block tail; act NULL for none. */
static built conv_add_act(const char *act, bool extra_reader)
{
    mg_model *m = mg_new(13);
    int64_t x[4] = {1, 8, 8, 8}, w[4] = {16, 8, 3, 3}, bd[1] = {16}, r[4] = {1, 16, 6, 6};
    mg_input(m, "X", FLOAT, 4, x, NULL);
    mg_input(m, "R", FLOAT, 4, r, NULL);
    init(m, "W", 4, w);
    init(m, "B", 1, bd);
    mg_node(m, "Conv", "", (const char *[]){"X", "W", "B", NULL}, (const char *[]){"C", NULL});
    mg_node(m, "Add", "", (const char *[]){"R", "C", NULL}, (const char *[]){act ? "S" : "Y", NULL});
    if (act) {
        mg_node(m, act, "", (const char *[]){"S", NULL}, (const char *[]){"Y", NULL});
        if (!strcmp(act, "LeakyRelu")) mg_attr_float(m, "alpha", 0.25f);
    }
    mg_output(m, "Y");
    if (extra_reader) mg_output(m, "C");
    return finish(m);
}

static const char *const X_R[] = {"X", "R"};
static const int RANKS_XR[] = {4, 4};
static const int64_t DIMS_XR[][4] = {{1, 8, 8, 8}, {1, 16, 6, 6}};

static void test_fuse_residual(void)
{
    built b = conv_add_act(NULL, false);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_RESIDUAL) == 1);
    if (md) {
        const kiln_graph *g = md->graph;
        kiln_node *f = find_op(g, "kiln", "FusedConv");
        CHECK(g->n_nodes == 1 && f && f->n_in == 4 && !strcmp(f->in[3]->name, "R"));
        CHECK(f && kiln_fused_of(f)->residual == 3 && kiln_fused_of(f)->act.kind == KILN_ACT_NONE);
        CHECK(f && !strcmp(f->out[0]->name, "Y") && f->out[0]->producer == f);
        CHECK(f && f->in[3]->n_uses == 1 && f->in[3]->uses[0].node == f && f->in[3]->uses[0].slot == 3);
    }
    kiln_model_free(md);
    CHECK(session_diff(&b, 2, X_R, RANKS_XR, DIMS_XR) <= 1e-4);
    free(b.buf);
    /* a Conv output something else reads stays a Conv */
    b = conv_add_act(NULL, true);
    md = load(&b);
    CHECK(md && run_pass(md, &P_RESIDUAL) == 0 && md->graph->n_nodes == 2);
    kiln_model_free(md);
    free(b.buf);
}

static void test_fuse_activation_conv(void)
{
    const char *acts[] = {"Relu", "LeakyRelu", "Sigmoid", "HardSwish"};
    const kiln_act_kind kinds[] = {KILN_ACT_RELU, KILN_ACT_LEAKY_RELU, KILN_ACT_SIGMOID, KILN_ACT_HARD_SWISH};
    for (int a = 0; a < 4; a++) {
        built b = conv_add_act(acts[a], false);
        kiln_model *md = load(&b);
        CHECK(md && run_pass(md, &P_RESIDUAL) == 1 && run_pass(md, &P_ACT) == 1);
        if (md) {
            const kiln_graph *g = md->graph;
            kiln_node *f = find_op(g, "kiln", "FusedConv");
            CHECK(g->n_nodes == 1 && f && kiln_fused_of(f)->act.kind == kinds[a] && kiln_fused_of(f)->residual == 3);
            CHECK(f && !strcmp(kiln_attr_string(f, "activation", ""), acts[a]) && !strcmp(f->out[0]->name, "Y"));
            if (f && kinds[a] == KILN_ACT_LEAKY_RELU) CHECK(kiln_fused_of(f)->act.alpha == 0.25f);
        }
        kiln_model_free(md);
        CHECK(session_diff(&b, 2, X_R, RANKS_XR, DIMS_XR) <= 1e-4);
        free(b.buf);
    }
}

/* Conv (group 2) -> Add(R) -> act in float16 (X, R inputs; W and B cast from float): the GPU
 * passes fuse Add and Relu into kiln.FusedConv, the CPU's (float32 only) leave it; the GPU's
 * join no activation but Relu. */
static built conv_add_act_f16(const char *act)
{
    mg_model *m = mg_new(13);
    int64_t x[4] = {1, 8, 8, 8}, w[4] = {16, 4, 3, 3}, bd[1] = {16}, r[4] = {1, 16, 6, 6};
    mg_input(m, "X", FLOAT16, 4, x, NULL);
    mg_input(m, "R", FLOAT16, 4, r, NULL);
    init(m, "W32", 4, w);
    init(m, "B32", 1, bd);
    mg_node(m, "Cast", "", (const char *[]){"W32", NULL}, (const char *[]){"W", NULL});
    mg_attr_int(m, "to", FLOAT16);
    mg_node(m, "Cast", "", (const char *[]){"B32", NULL}, (const char *[]){"B", NULL});
    mg_attr_int(m, "to", FLOAT16);
    mg_node(m, "Conv", "", (const char *[]){"X", "W", "B", NULL}, (const char *[]){"C", NULL});
    mg_attr_int(m, "group", 2);
    mg_node(m, "Add", "", (const char *[]){"C", "R", NULL}, (const char *[]){"S", NULL});
    mg_node(m, act, "", (const char *[]){"S", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    return finish(m);
}

static void test_fuse_conv_gpu(void)
{
    built b = conv_add_act_f16("Relu");
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_RESIDUAL) == 0 && run_pass(md, &P_ACT) == 0);
    CHECK(md && run_pass(md, &P_RESIDUAL_GPU) == 1 && run_pass(md, &P_ACT_GPU) == 1);
    if (md) {
        kiln_node *f = find_op(md->graph, "kiln", "FusedConv");
        CHECK(f && md->graph->n_nodes == 3 && f->n_in == 4 && !strcmp(f->in[3]->name, "R"));
        CHECK(f && kiln_fused_of(f)->act.kind == KILN_ACT_RELU && kiln_fused_of(f)->residual == 3);
        CHECK(f && !strcmp(f->out[0]->name, "Y") && f->out[0]->type.dtype == 10);
    }
    kiln_model_free(md);
    free(b.buf);
    b = conv_add_act_f16("Sigmoid");
    md = load(&b);
    CHECK(md && run_pass(md, &P_RESIDUAL_GPU) == 1 && run_pass(md, &P_ACT_GPU) == 0);
    CHECK(md && count_op(md->graph, "", "Sigmoid") == 1 && count_op(md->graph, "kiln", "FusedConv") == 1);
    kiln_model_free(md);
    free(b.buf);
}

/* com.microsoft FusedConv with a Sum: adopted as kiln.FusedConv (residual 3, the activation and its
 * params kept); same outputs. */
static void test_adopt_ms_fused_conv(void)
{
    const char *acts[] = {"LeakyRelu", "Tanh"};
    for (int a = 0; a < 2; a++) {
        mg_model *m = mg_new(13);
        int64_t x[4] = {1, 8, 8, 8}, w[4] = {16, 8, 3, 3}, bd[1] = {16}, r[4] = {1, 16, 6, 6};
        mg_input(m, "X", FLOAT, 4, x, NULL);
        mg_input(m, "R", FLOAT, 4, r, NULL);
        init(m, "W", 4, w);
        init(m, "B", 1, bd);
        mg_node(m, "FusedConv", "com.microsoft", (const char *[]){"X", "W", "B", "R", NULL}, (const char *[]){"Y", NULL});
        mg_attr_string(m, "activation", acts[a]);
        if (a == 0) mg_attr_floats(m, "activation_params", 1, (const float[]){0.25f});
        mg_output(m, "Y");
        built b = finish(m);
        kiln_model *md = load(&b);
        CHECK(md && run_pass(md, &P_ADOPT));
        kiln_node *f = md ? find_op(md->graph, "kiln", "FusedConv") : NULL;
        CHECK(f && kiln_fused_of(f)->residual == 3 &&
              kiln_fused_of(f)->act.kind == (a == 0 ? KILN_ACT_LEAKY_RELU : KILN_ACT_TANH) &&
              kiln_fused_of(f)->act.alpha == (a == 0 ? 0.25f : 0.0f));
        kiln_model_free(md);
        CHECK(session_diff(&b, 2, X_R, RANKS_XR, DIMS_XR) <= 1e-4);
        free(b.buf);
    }
}

/* The fused node's reference kernel is the unfused chain's, bit for bit: every input a
 * constant, the fused node evaluated against the reference session of the original model. */
static void test_fused_reference(void)
{
    mg_model *m = mg_new(13);
    int64_t x[4] = {1, 3, 5, 5}, w[4] = {4, 3, 3, 3}, r[4] = {1, 4, 3, 3};
    mg_input(m, "unused", FLOAT, 1, (int64_t[]){1}, NULL);
    init(m, "X", 4, x);
    init(m, "W", 4, w);
    init(m, "R", 4, r);
    mg_node(m, "Conv", "", (const char *[]){"X", "W", NULL}, (const char *[]){"C", NULL});
    mg_node(m, "Add", "", (const char *[]){"C", "R", NULL}, (const char *[]){"S", NULL});
    mg_node(m, "HardSigmoid", "", (const char *[]){"S", NULL}, (const char *[]){"Y", NULL});
    mg_attr_float(m, "alpha", 0.3f);
    mg_output(m, "Y");
    mg_output(m, "unused");
    built b = finish(m);
    kiln_model *md = load(&b);
    kiln_value *got[1] = {NULL}, *want = NULL;
    kiln_err err = {0};
    CHECK(md && run_pass(md, &P_RESIDUAL) == 1 && run_pass(md, &P_ACT) == 1 && md->graph->n_nodes == 1);
    if (md && md->graph->n_nodes == 1) CHECK(kiln_node_evaluate(md->graph->nodes[0], 0, got, &err) == KILN_OK);
    kiln_session_options opt = kiln_session_options_default();
    opt.unoptimized = true;
    kiln_session *s = NULL;
    float one = 0;
    kiln_value *in = NULL;
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 1, (int64_t[]){1}, &one, sizeof one, &in);
    const char *in_names[] = {"unused"}, *out_names[] = {"Y"};
    CHECK(kiln_session_create_from_memory(b.buf, b.len, NULL, &opt, &s) == KILN_OK &&
          kiln_session_run(s, 1, in_names, (const kiln_value *const *)&in, 1, out_names, &want) == KILN_OK);
    CHECK(got[0] && want && kiln_value_numel(got[0]) == 36 && kiln_value_numel(want) == 36 &&
          !memcmp(kiln_value_data(got[0]), kiln_value_data(want), 36 * sizeof(float)));
    kiln_session_free(s);
    kiln_value_free(in);
    kiln_value_free(want);
    kiln_value_free(got[0]);
    kiln_model_free(md);
    free(b.buf);
}

/* Mul(Mul(G, Sigmoid(G)), U) in each operand order -> kiln.SiluMul(G, U), whose reference
 * kernel gives the chain's result bit for bit; a Sigmoid read elsewhere stays. */
static void test_fuse_silu_mul(void)
{
    for (int order = 0; order < 5; order++) {
        mg_model *m = mg_new(17);
        int64_t d[2] = {3, 11};
        mg_input(m, "unused", FLOAT, 1, (int64_t[]){1}, NULL);
        init(m, "G", 2, d);
        init(m, "U", 2, d);
        mg_node(m, "Sigmoid", "", (const char *[]){"G", NULL}, (const char *[]){"s", NULL});
        mg_node(m, "Mul", "", order & 1 ? (const char *[]){"s", "G", NULL} : (const char *[]){"G", "s", NULL},
                (const char *[]){"t", NULL});
        mg_node(m, "Mul", "", order & 2 ? (const char *[]){"U", "t", NULL} : (const char *[]){"t", "U", NULL},
                (const char *[]){"Y", NULL});
        mg_output(m, "Y");
        mg_output(m, "unused");
        if (order == 4) mg_output(m, "s");
        built b = finish(m);
        kiln_model *md = load(&b);
        int want_fused = order == 4 ? 0 : 1;
        CHECK(md && run_pass(md, &P_SILU) == want_fused);
        kiln_value *got[1] = {NULL}, *want = NULL;
        kiln_err err = {0};
        if (md && want_fused) {
            kiln_node *f = find_op(md->graph, "kiln", "SiluMul");
            CHECK(md->graph->n_nodes == 1 && f && f->n_in == 2 && !strcmp(f->in[0]->name, "G") &&
                  !strcmp(f->in[1]->name, "U") && !strcmp(f->out[0]->name, "Y"));
            if (f) CHECK(kiln_node_evaluate(f, 0, got, &err) == KILN_OK);
            CHECK((want = unoptimized_y(&b)) != NULL);
            CHECK(got[0] && want && kiln_value_numel(got[0]) == 33 && kiln_value_numel(want) == 33 &&
                  !memcmp(kiln_value_data(got[0]), kiln_value_data(want), 33 * sizeof(float)));
        }
        if (md && !want_fused) CHECK(md->graph->n_nodes == 3 && count_op(md->graph, "kiln", "SiluMul") == 0);
        kiln_value_free(want);
        kiln_value_free(got[0]);
        kiln_model_free(md);
        free(b.buf);
    }
}

/* SiluMul(MatMulNBits(A, gate), MatMulNBits(A, up)) -> SiluMul(MatMulNBits(A, [gate; up])) read
 * packed: the stacked product and the packed SiluMul's reference kernels give the unfused
 * graph's result bit for bit. Products of another A, or a bias on one side only, stay apart. */
static void test_fuse_gate_up(void)
{
    static const kiln_pass P_GATE_UP = {"fuse_gate_up", kiln_pass_fuse_gate_up};
    enum { K = 40, N = 5, BS = 16, NB = 3, BLOB = 8 };
    for (int variant = 0; variant < 3; variant++) {
        mg_model *m = mg_new(17);
        mg_input(m, "unused", FLOAT, 1, (int64_t[]){1}, NULL);
        init(m, "A", 3, (int64_t[]){2, 3, K});
        init(m, "A2", 3, (int64_t[]){2, 3, K});
        for (int p = 0; p < 2; p++) {
            uint8_t b[N * NB * BLOB], z[N * 2];
            for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)(unit_rnd() >> 24);
            for (size_t i = 0; i < sizeof z; i++) z[i] = (uint8_t)(unit_rnd() >> 24);
            float sc[N * NB];
            for (int i = 0; i < N * NB; i++) sc[i] = unit_unif(0.01f, 0.11f);
            char nb[8], ns[8], nz[8], nbias[8];
            snprintf(nb, sizeof nb, "B%d", p), snprintf(ns, sizeof ns, "S%d", p), snprintf(nz, sizeof nz, "Z%d", p);
            snprintf(nbias, sizeof nbias, "bias%d", p);
            mg_init_raw(m, nb, UINT8, 1, 3, (int64_t[]){N, NB, BLOB}, b);
            mg_init_float(m, ns, 1, (int64_t[]){N * NB}, sc, NULL, 0);
            mg_init_raw(m, nz, UINT8, 1, 1, (int64_t[]){N * 2}, z);
            init(m, nbias, 1, (int64_t[]){N});
            const char *a = p == 1 && variant == 1 ? "A2" : "A", *bias = p == 0 && variant == 2 ? nbias : NULL;
            mg_node(m, "MatMulNBits", "com.microsoft", (const char *[]){a, nb, ns, nz, bias ? "" : NULL, bias, NULL},
                    (const char *[]){p ? "U" : "G", NULL});
            mg_attr_int(m, "K", K);
            mg_attr_int(m, "N", N);
            mg_attr_int(m, "bits", 4);
            mg_attr_int(m, "block_size", BS);
        }
        mg_node(m, "Sigmoid", "", (const char *[]){"G", NULL}, (const char *[]){"s", NULL});
        mg_node(m, "Mul", "", (const char *[]){"G", "s", NULL}, (const char *[]){"t", NULL});
        mg_node(m, "Mul", "", (const char *[]){"t", "U", NULL}, (const char *[]){"Y", NULL});
        mg_output(m, "Y");
        mg_output(m, "unused");
        built b = finish(m);
        kiln_model *md = load(&b);
        CHECK(md && run_pass(md, &P_SILU) == 1);
        int want = variant == 0 ? 1 : 0;
        CHECK(md && run_pass(md, &P_GATE_UP) == want);
        kiln_err err = {0};
        if (md && want) {
            kiln_node *f = find_op(md->graph, "com.microsoft", "MatMulNBits"), *s = find_op(md->graph, "kiln", "SiluMul");
            CHECK(md->graph->n_nodes == 2 && f && s && s->n_in == 1 && s->in[0] == f->out[0] &&
                  ((const kiln_nbits_params *)f->params)->N == 2 * N && kiln_ir_constant(f->in[1])->dims[0] == 2 * N &&
                  kiln_ir_constant(f->in[2])->numel == 2 * N * NB && kiln_ir_constant(f->in[3])->numel == 4 * N);
            kiln_value *h[1] = {NULL}, *got[1] = {NULL}, *want_y = NULL;
            if (f && s && kiln_node_evaluate(f, 0, h, &err) == KILN_OK && kiln_model_own_value(md, h[0], &err) == KILN_OK) {
                kiln_ir_value_set_constant(f->out[0], h[0]);
                CHECK(kiln_node_evaluate(s, 0, got, &err) == KILN_OK);
            }
            CHECK((want_y = unoptimized_y(&b)) != NULL);
            CHECK(got[0] && want_y && kiln_value_numel(got[0]) == 2 * 3 * N && kiln_value_numel(want_y) == 2 * 3 * N &&
                  !memcmp(kiln_value_data(got[0]), kiln_value_data(want_y), 2 * 3 * N * sizeof(float)));
            kiln_value_free(want_y);
            kiln_value_free(got[0]);
        }
        if (md && !want) CHECK(count_op(md->graph, "com.microsoft", "MatMulNBits") == 2);
        kiln_model_free(md);
        free(b.buf);
    }
}

/* MatMul(X, W) -> Add(b) [-> Relu] and Gemm -> Clip */
static void test_fuse_matmul_bias_and_gemm(void)
{
    mg_model *m = mg_new(13);
    int64_t x[3] = {2, 5, 8}, w[2] = {8, 6}, bd[1] = {6};
    mg_input(m, "X", FLOAT, 3, x, NULL);
    init(m, "W", 2, w);
    init(m, "b", 1, bd);
    mg_node(m, "MatMul", "", (const char *[]){"X", "W", NULL}, (const char *[]){"M", NULL});
    mg_node(m, "Add", "", (const char *[]){"b", "M", NULL}, (const char *[]){"S", NULL});
    mg_node(m, "Relu", "", (const char *[]){"S", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_BIAS) == 1);
    if (md) {
        kiln_node *f = find_op(md->graph, "kiln", "FusedMatMul");
        CHECK(md->graph->n_nodes == 2 && f && f->n_in == 3 && !strcmp(f->in[2]->name, "b"));
        CHECK(f && kiln_fused_of(f)->bias == 2 && !strcmp(f->out[0]->name, "S"));
        CHECK(run_pass(md, &P_ACT) == 1 && md->graph->n_nodes == 1);
        CHECK(f && kiln_fused_of(f)->act.kind == KILN_ACT_RELU && kiln_fused_of(f)->bias == 2 &&
              !strcmp(f->out[0]->name, "Y"));
    }
    kiln_model_free(md);
    int ranks[] = {3};
    int64_t dims[][4] = {{2, 5, 8}};
    CHECK(session_diff(&b, 1, X_ONLY, ranks, dims) <= 1e-5);
    free(b.buf);

    m = mg_new(13);
    int64_t a[2] = {4, 8}, bw[2] = {6, 8}, cd[1] = {6};
    mg_input(m, "X", FLOAT, 2, a, NULL);
    init(m, "B", 2, bw);
    init(m, "C", 1, cd);
    scalar(m, "lo", -0.2f);
    scalar(m, "hi", 0.3f);
    mg_node(m, "Gemm", "", (const char *[]){"X", "B", "C", NULL}, (const char *[]){"G", NULL});
    mg_attr_int(m, "transB", 1);
    mg_node(m, "Clip", "", (const char *[]){"G", "lo", "hi", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    b = finish(m);
    md = load(&b);
    CHECK(md && run_pass(md, &P_ACT) == 1);
    if (md) {
        kiln_node *f = find_op(md->graph, "kiln", "FusedGemm");
        CHECK(md->graph->n_nodes == 1 && f && kiln_attr_int(f, "transB", 0) == 1);
        CHECK(f && kiln_fused_of(f)->act.kind == KILN_ACT_CLIP && kiln_fused_of(f)->act.alpha == -0.2f &&
              kiln_fused_of(f)->act.beta == 0.3f);
    }
    kiln_model_free(md);
    int r2[] = {2};
    int64_t d2[][4] = {{4, 8}};
    CHECK(session_diff(&b, 1, X_ONLY, r2, d2) <= 1e-5);
    free(b.buf);
}

/* x * 0.5 * (1 + Erf(x / sqrt 2)) */
static void test_fuse_gelu(void)
{
    mg_model *m = mg_new(13);
    int64_t x[2] = {3, 7};
    mg_input(m, "X", FLOAT, 2, x, NULL);
    scalar(m, "sqrt2", 1.4142135f);
    scalar(m, "one", 1.0f);
    scalar(m, "half", 0.5f);
    mg_node(m, "Div", "", (const char *[]){"X", "sqrt2", NULL}, (const char *[]){"d", NULL});
    mg_node(m, "Erf", "", (const char *[]){"d", NULL}, (const char *[]){"e", NULL});
    mg_node(m, "Add", "", (const char *[]){"e", "one", NULL}, (const char *[]){"s", NULL});
    mg_node(m, "Mul", "", (const char *[]){"X", "s", NULL}, (const char *[]){"p", NULL});
    mg_node(m, "Mul", "", (const char *[]){"p", "half", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_GELU) == 1);
    if (md) {
        kiln_node *gl = find_op(md->graph, "", "Gelu");
        CHECK(md->graph->n_nodes == 1 && gl && gl->n_in == 1 && !strcmp(gl->in[0]->name, "X") && gl->op);
        CHECK(gl && !strcmp(gl->out[0]->name, "Y") && gl->in[0]->n_uses == 1);
    }
    kiln_model_free(md);
    int ranks[] = {2};
    int64_t dims[][4] = {{3, 7}};
    CHECK(session_diff(&b, 1, X_ONLY, ranks, dims) <= 1e-5);
    free(b.buf);
}

/* Layer normalisation written out over the last `axes` axes of X [3, 5, 8] (opset 13: axes
 * attributes; 18: an axes input), in the variants exporters write; form:
 *   0  Pow(d, 2), Add(v, eps), Mul(n, gamma), Add(y, beta)
 *   1  Mul(d, d), Add(eps, v), Mul(gamma, n), Add(beta, y)
 *   2  no beta
 *   3  over the last two axes
 *   4  opset 18
 * and what must stay: 5 Mul(d, sd) for the Div (not a normalisation), 6 a mean over axis 1, 7 d
 * read outside the pattern, 8 gamma of the wrong shape. Fused: one LayerNormalization (axis, epsilon), outputs
 * as the unfused session's within 1e-5. */
static void test_fuse_layernorm(void)
{
    for (int form = 0; form < 9; form++) {
        int opset = form == 4 ? 18 : 13, k = form == 3 ? 2 : 1;
        mg_model *m = mg_new(opset);
        mg_input(m, "X", FLOAT, 3, (int64_t[]){3, 5, 8}, NULL);
        int64_t axes[2] = {k == 2 ? 1 : 2, 2};
        if (form == 6) axes[0] = 1;
        for (int r = 0; r < 2; r++) {
            const char *in = r ? "sq" : "X", *outv = r ? "v" : "mu";
            if (opset >= 18) {
                mg_init_raw(m, r ? "ax1" : "ax0", INT64, 8, 1, (int64_t[]){k}, axes);
                mg_node(m, "ReduceMean", "", (const char *[]){in, r ? "ax1" : "ax0", NULL}, (const char *[]){outv, NULL});
            } else {
                mg_node(m, "ReduceMean", "", (const char *[]){in, NULL}, (const char *[]){outv, NULL});
                mg_attr_ints(m, "axes", k, axes);
            }
        }
        /* (the second ReduceMean is added above before its input: nodes are sorted at load) */
        mg_node(m, "Sub", "", (const char *[]){"X", "mu", NULL}, (const char *[]){"d", NULL});
        scalar(m, "two", 2.0f);
        if (form == 1) mg_node(m, "Mul", "", (const char *[]){"d", "d", NULL}, (const char *[]){"sq", NULL});
        else mg_node(m, "Pow", "", (const char *[]){"d", "two", NULL}, (const char *[]){"sq", NULL});
        scalar(m, "eps", 1e-5f);
        mg_node(m, "Add", "", form == 1 ? (const char *[]){"eps", "v", NULL} : (const char *[]){"v", "eps", NULL},
                (const char *[]){"ve", NULL});
        mg_node(m, "Sqrt", "", (const char *[]){"ve", NULL}, (const char *[]){"sd", NULL});
        mg_node(m, form == 5 ? "Mul" : "Div", "", (const char *[]){"d", "sd", NULL}, (const char *[]){"nrm", NULL});
        int64_t gd[2] = {k == 2 ? 5 : 8, 8};
        init(m, "gamma", form == 8 ? 2 : k, form == 8 ? (int64_t[]){1, 8} : gd);
        init(m, "beta", k, gd);
        bool beta = form != 2;
        mg_node(m, "Mul", "", form == 1 ? (const char *[]){"gamma", "nrm", NULL} : (const char *[]){"nrm", "gamma", NULL},
                (const char *[]){beta ? "sc" : "Y", NULL});
        if (beta)
            mg_node(m, "Add", "", form == 1 ? (const char *[]){"beta", "sc", NULL} : (const char *[]){"sc", "beta", NULL},
                    (const char *[]){"Y", NULL});
        mg_output(m, "Y");
        if (form == 7) {
            mg_node(m, "Relu", "", (const char *[]){"d", NULL}, (const char *[]){"Z", NULL});
            mg_output(m, "Z");
        }
        built b = finish(m);
        kiln_model *md = load(&b);
        bool want = form <= 4;
        int fused = md ? run_pass(md, &P_LN) : -1;
        if (fused != (want ? 1 : 0)) fprintf(stderr, "fuse_layernorm form %d: %d fused\n", form, fused);
        CHECK(fused == (want ? 1 : 0));
        if (md && want) {
            kiln_node *ln = find_op(md->graph, "", "LayerNormalization");
            CHECK(md->graph->n_nodes == 1 && ln && ln->op && ln->n_in == (beta ? 3 : 2) && !strcmp(ln->in[0]->name, "X"));
            CHECK(ln && kiln_attr_int(ln, "axis", 0) == 3 - k && kiln_attr_float(ln, "epsilon", 0) == 1e-5f &&
                  !strcmp(ln->out[0]->name, "Y"));
        }
        kiln_model_free(md);
        int ranks[] = {3};
        int64_t dims[][4] = {{3, 5, 8}};
        double diff = session_diff(&b, 1, X_ONLY, ranks, dims);
        if (!(diff <= 1e-5)) fprintf(stderr, "fuse_layernorm form %d: %g\n", form, diff);
        CHECK(diff <= 1e-5);
        free(b.buf);
    }
}

/* Y = Softmax(scale_op(Q K^T, scale)) V over values Q, K, V and scale of m, written out. */
static void attention_nodes(mg_model *m, const char *scale_op)
{
    mg_node(m, "Transpose", "", (const char *[]){"K", NULL}, (const char *[]){"kt", NULL});
    mg_attr_ints(m, "perm", 4, (int64_t[]){0, 1, 3, 2});
    mg_node(m, "MatMul", "", (const char *[]){"Q", "kt", NULL}, (const char *[]){"qk", NULL});
    mg_node(m, scale_op, "", (const char *[]){"qk", "scale", NULL}, (const char *[]){"sc", NULL});
    mg_node(m, "Softmax", "", (const char *[]){"sc", NULL}, (const char *[]){"p", NULL});
    mg_attr_int(m, "axis", -1);
    mg_node(m, "MatMul", "", (const char *[]){"p", "V", NULL}, (const char *[]){"Y", NULL});
}

/* Softmax(Q K^T * scale) V on [B, H, S, D] */
static void test_fuse_attention(void)
{
    mg_model *m = mg_new(13);
    int64_t q[4] = {1, 2, 5, 4};
    mg_input(m, "Q", FLOAT, 4, q, NULL);
    mg_input(m, "K", FLOAT, 4, q, NULL);
    mg_input(m, "V", FLOAT, 4, q, NULL);
    scalar(m, "scale", 0.5f);
    attention_nodes(m, "Mul");
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_ATTN) == 1);
    if (md) {
        kiln_node *at = find_op(md->graph, "", "Attention");
        CHECK(md->graph->n_nodes == 1 && at && at->n_in == 3 && at->op && !strcmp(at->out[0]->name, "Y"));
        CHECK(at && kiln_attr_float(at, "scale", 0) == 0.5f && !strcmp(at->in[1]->name, "K"));
    }
    kiln_model_free(md);
    const char *names[] = {"Q", "K", "V"};
    int ranks[] = {4, 4, 4};
    int64_t dims[][4] = {{1, 2, 5, 4}, {1, 2, 5, 4}, {1, 2, 5, 4}};
    CHECK(session_diff(&b, 3, names, ranks, dims) <= 1e-5);
    free(b.buf);
}

static void transpose_node(mg_model *m, const char *x, const char *y, int n, const int64_t *perm)
{
    mg_node(m, "Transpose", "", (const char *[]){x, NULL}, (const char *[]){y, NULL});
    mg_attr_ints(m, "perm", n, perm);
}

static void shape_init(mg_model *m, const char *name, int n, const int64_t *dims)
{
    mg_init_raw(m, name, 7 /* INT64 */, sizeof(int64_t), 1, (int64_t[]){n}, dims);
}

/* Two exporters' forms of attention fuse, and the fused session computes the unfused one's Y:
 *  - TorchScript's BERT: heads by Reshape + Transpose of [B, S, H*D] inputs, K^T as one
 *    Transpose [0,2,3,1], a scale, a mask whose dims inference cannot relate to the scores',
 *    the heads merged back (3-D Attention);
 *  - dynamo's scaled_dot_product_attention: K^T by Reshape [B*H, S, D] -> Transpose [0,2,1] ->
 *    Reshape [B, H, D, S], Q and K^T each scaled by sqrt(scale) (4-D Attention, scale c^2). */
static void test_fuse_attention_exported(void)
{
    mg_model *m = mg_new(13);
    const char *in3[] = {"Q3", "K3", "V3", "M"};
    /* B and S symbolic; the mask's dims are its own symbols, as an exporter's Expand of
     * data-dependent shapes leaves them, so the scores' dims after the Add are fresh ones; the
     * heads merge by Reshape to Concat(Shape(Q3)[0:2], [-1]), as the exporter writes it */
    for (int i = 0; i < 3; i++) mg_input(m, in3[i], FLOAT, 3, (int64_t[]){-1, -1, 8}, (const char *[]){"B", "S", NULL});
    mg_input(m, "M", FLOAT, 4, (int64_t[]){-1, -1, -1, -1}, (const char *[]){"mb", "mh", "mq", "mk"});
    shape_init(m, "shp", 4, (int64_t[]){0, 0, -1, 4});
    shape_init(m, "zero", 1, (int64_t[]){0});
    shape_init(m, "two", 1, (int64_t[]){2});
    shape_init(m, "minus1", 1, (int64_t[]){-1});
    mg_node(m, "Shape", "", (const char *[]){"Q3", NULL}, (const char *[]){"q3shape", NULL});
    mg_node(m, "Slice", "", (const char *[]){"q3shape", "zero", "two", NULL}, (const char *[]){"bs", NULL});
    mg_node(m, "Concat", "", (const char *[]){"bs", "minus1", NULL}, (const char *[]){"oshp", NULL});
    mg_attr_int(m, "axis", 0);
    scalar(m, "scale", 0.5f);
    static const int64_t heads[4] = {0, 2, 1, 3}, heads_t[4] = {0, 2, 3, 1};
    const char *r[] = {"qr", "kr", "vr"}, *t[] = {"q", "kt", "v"};
    for (int i = 0; i < 3; i++) {
        mg_node(m, "Reshape", "", (const char *[]){in3[i], "shp", NULL}, (const char *[]){r[i], NULL});
        transpose_node(m, r[i], t[i], 4, i == 1 ? heads_t : heads);
    }
    mg_node(m, "MatMul", "", (const char *[]){"q", "kt", NULL}, (const char *[]){"qk", NULL});
    mg_node(m, "Mul", "", (const char *[]){"qk", "scale", NULL}, (const char *[]){"sc", NULL});
    mg_node(m, "Add", "", (const char *[]){"sc", "M", NULL}, (const char *[]){"am", NULL});
    mg_node(m, "Softmax", "", (const char *[]){"am", NULL}, (const char *[]){"p", NULL});
    mg_attr_int(m, "axis", -1);
    mg_node(m, "MatMul", "", (const char *[]){"p", "v", NULL}, (const char *[]){"o", NULL});
    transpose_node(m, "o", "ot", 4, heads);
    mg_node(m, "Reshape", "", (const char *[]){"ot", "oshp", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_ATTN) == 1);
    if (md) {
        kiln_node *at = find_op(md->graph, "", "Attention");
        CHECK(count_op(md->graph, "", "Softmax") == 0 && at && at->n_in == 4 && kiln_attr_int(at, "q_num_heads", 0) == 2);
        CHECK(at && !strcmp(at->in[1]->name, "K3") && !strcmp(at->in[3]->name, "M") && !strcmp(at->out[0]->name, "Y"));
    }
    kiln_model_free(md);
    int ranks[] = {3, 3, 3, 4};
    int64_t dims[][4] = {{2, 5, 8}, {2, 5, 8}, {2, 5, 8}, {2, 1, 1, 5}};
    CHECK(session_diff(&b, 4, in3, ranks, dims) <= 1e-5);
    free(b.buf);

    m = mg_new(13);
    int64_t x4[4] = {1, 2, 5, 4};
    const char *in4[] = {"Q", "K", "V"};
    for (int i = 0; i < 3; i++) mg_input(m, in4[i], FLOAT, 4, x4, NULL);
    shape_init(m, "r1", 3, (int64_t[]){-1, 5, 4});
    shape_init(m, "r2", 4, (int64_t[]){1, 2, 4, 5});
    scalar(m, "c", 0.70710677f);
    mg_node(m, "Reshape", "", (const char *[]){"K", "r1", NULL}, (const char *[]){"k1", NULL});
    transpose_node(m, "k1", "k2", 3, (int64_t[]){0, 2, 1});
    mg_node(m, "Reshape", "", (const char *[]){"k2", "r2", NULL}, (const char *[]){"kt", NULL});
    mg_node(m, "Mul", "", (const char *[]){"Q", "c", NULL}, (const char *[]){"qs", NULL});
    mg_node(m, "Mul", "", (const char *[]){"kt", "c", NULL}, (const char *[]){"ks", NULL});
    mg_node(m, "MatMul", "", (const char *[]){"qs", "ks", NULL}, (const char *[]){"qk", NULL});
    mg_node(m, "Softmax", "", (const char *[]){"qk", NULL}, (const char *[]){"p", NULL});
    mg_attr_int(m, "axis", -1);
    mg_node(m, "MatMul", "", (const char *[]){"p", "V", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    b = finish(m);
    md = load(&b);
    CHECK(md && run_pass(md, &P_ATTN) == 1);
    if (md) {
        kiln_node *at = find_op(md->graph, "", "Attention");
        CHECK(md->graph->n_nodes == 1 && at && at->n_in == 3 && !strcmp(at->in[1]->name, "K"));
        CHECK(at && fabsf(kiln_attr_float(at, "scale", 0) - 0.5f) < 1e-6f && !strcmp(at->in[0]->name, "Q"));
    }
    kiln_model_free(md);
    int r4[] = {4, 4, 4};
    int64_t d4[][4] = {{1, 2, 5, 4}, {1, 2, 5, 4}, {1, 2, 5, 4}};
    CHECK(session_diff(&b, 3, in4, r4, d4) <= 1e-5);
    free(b.buf);
}

/* GPT-2's causal form as ORT's offline file writes it: Where(keep, FusedMatMul(Q, K^T, alpha),
 * -FLT_MAX) -> Softmax -> MatMul(., V) fuses on the CPU (mask Where(keep, 0, -FLT_MAX), scale
 * alpha) and computes the unfused Y; the GPU's pass leaves it. */
static void test_fuse_attention_causal_where(void)
{
    mg_model *m = mg_new(13);
    int64_t x4[4] = {2, 2, 6, 4};
    const char *in4[] = {"Q", "K", "V"};
    for (int i = 0; i < 3; i++) mg_input(m, in4[i], FLOAT, 4, x4, NULL);
    unsigned char keep[6 * 6];
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 6; c++) keep[r * 6 + c] = c <= r;
    mg_init_raw(m, "keep", 9 /* BOOL */, 1, 4, (int64_t[]){1, 1, 6, 6}, keep);
    scalar(m, "fill", -3.4028234663852886e38f);
    transpose_node(m, "K", "kt", 4, (int64_t[]){0, 1, 3, 2});
    mg_node(m, "FusedMatMul", "com.microsoft", (const char *[]){"Q", "kt", NULL}, (const char *[]){"qk", NULL});
    mg_attr_float(m, "alpha", 0.5f);
    mg_node(m, "Where", "", (const char *[]){"keep", "qk", "fill", NULL}, (const char *[]){"w", NULL});
    mg_node(m, "Softmax", "", (const char *[]){"w", NULL}, (const char *[]){"p", NULL});
    mg_attr_int(m, "axis", -1);
    mg_node(m, "MatMul", "", (const char *[]){"p", "V", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_ATTN_GPU) == 0 && run_pass(md, &P_ATTN) == 1);
    if (md) {
        kiln_node *at = find_op(md->graph, "", "Attention"), *wh = find_op(md->graph, "", "Where");
        CHECK(at && at->n_in == 4 && kiln_attr_float(at, "scale", 0) == 0.5f && !strcmp(at->in[1]->name, "K"));
        CHECK(at && wh && at->in[3] == wh->out[0] && wh->out[0]->type.dtype == KILN_DTYPE_FLOAT32 &&
              wh->out[0]->type.rank == 4 && count_op(md->graph, "", "Softmax") == 0);
    }
    kiln_model_free(md);
    int r4[] = {4, 4, 4};
    int64_t d4[][4] = {{2, 2, 6, 4}, {2, 2, 6, 4}, {2, 2, 6, 4}};
    CHECK(session_diff(&b, 3, in4, r4, d4) <= 1e-5);
    free(b.buf);
}

/* The same pattern in float16 (Q, K, V and the scale constants), head size 32: the CPU's pass
 * leaves it, the GPU's (kiln_pass_fuse_attention_gpu) makes one Attention whose reference result
 * is the unfused graph's within float16 rounding. */
static void test_fuse_attention_f16(void)
{
    enum { N = 1 * 2 * 5 * 32 };
    mg_model *m = mg_new(13);
    mg_input(m, "unused", FLOAT, 1, (int64_t[]){1}, NULL);
    const char *names[3] = {"Q", "K", "V"};
    for (int t = 0; t < 3; t++) {
        uint16_t h[N];
        for (int i = 0; i < N; i++) h[i] = kiln_f32_to_f16(unit_unif(-1.0f, 1.0f));
        mg_init_raw(m, names[t], FLOAT16, 2, 4, (int64_t[]){1, 2, 5, 32}, h);
    }
    uint16_t sc = kiln_f32_to_f16(0.5f);
    mg_init_raw(m, "scale", FLOAT16, 2, 0, NULL, &sc);
    attention_nodes(m, "Div");
    mg_output(m, "Y");
    mg_output(m, "unused");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_ATTN) == 0 && run_pass(md, &P_ATTN_GPU) == 1);
    kiln_value *got[1] = {NULL}, *want = NULL;
    kiln_err err = {0};
    kiln_node *at = md ? find_op(md->graph, "", "Attention") : NULL;
    CHECK(at && md->graph->n_nodes == 1 && at->n_in == 3 && kiln_attr_float(at, "scale", 0) == 2.0f);
    if (at) CHECK(kiln_node_evaluate(at, 0, got, &err) == KILN_OK);
    CHECK((want = unoptimized_y(&b)) != NULL);
    if (got[0] && want && kiln_value_numel(got[0]) == N && kiln_value_numel(want) == N) {
        const uint16_t *g = kiln_value_data(got[0]), *w = kiln_value_data(want);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double d = fabs((double)kiln_f16_to_f32(g[i]) - (double)kiln_f16_to_f32(w[i]));
            if (!(d <= worst)) worst = d;
        }
        CHECK(worst <= 4e-3);
    } else {
        CHECK(!"both computed Y");
    }
    kiln_value_free(want);
    kiln_value_free(got[0]);
    kiln_model_free(md);
    free(b.buf);
}

/* Conv(16 -> 16) -> FusedConv(Z) -> Conv: the values between convolutions are blocked, the
 * graph's inputs and outputs stay plain, and a residual agrees with its output's layout. */
static void test_layout_nchwc(void)
{
    mg_model *m = mg_new(13);
    int64_t x[4] = {1, 16, 6, 6}, w[4] = {16, 16, 1, 1};
    mg_input(m, "X", FLOAT, 4, x, NULL);
    init(m, "W1", 4, w);
    init(m, "W2", 4, w);
    init(m, "W3", 4, w);
    mg_node(m, "Conv", "", (const char *[]){"X", "W1", NULL}, (const char *[]){"a", NULL});
    mg_node(m, "Conv", "", (const char *[]){"a", "W2", NULL}, (const char *[]){"c", NULL});
    mg_node(m, "Add", "", (const char *[]){"c", "a", NULL}, (const char *[]){"s", NULL});
    mg_node(m, "Conv", "", (const char *[]){"s", "W3", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = load(&b);
    CHECK(md && run_pass(md, &P_RESIDUAL) == 1 && run_pass(md, &P_NCHWC) == 2);
    if (md) {
        const kiln_graph *g = md->graph;
        for (int i = 0; i < g->n_values; i++) {
            const kiln_ir_value *v = g->values[i];
            bool inner = !strcmp(v->name, "a") || !strcmp(v->name, "s");
            CHECK(v->layout == (inner ? KILN_LAYOUT_NCHW16C : KILN_LAYOUT_PLAIN));
        }
    }
    kiln_model_free(md);
    int ranks[] = {4};
    int64_t dims[][4] = {{1, 16, 6, 6}};
    CHECK(session_diff(&b, 1, X_ONLY, ranks, dims) <= 1e-4);
    free(b.buf);
}

/* ---- layout_nchwc over feature pyramids: Add, GlobalMaxPool and nearest Resize ---- */

/* b compiled as a CPU session compiles it before choosing kernels (src/exec/session.c): the
 * CPU's early passes, the generic ones, inference and the CPU's own, the layout pass among them
 * where this CPU has the blocked kernels (else that pass alone: it does not depend on the CPU). */
static kiln_model *compile_cpu(const built *b)
{
    const kiln_provider_i *cpu = kiln_provider_find(KILN_PROVIDER_CPU);
    kiln_model *m = NULL;
    kiln_err err = {0};
    int blocked = 0;
    if (kiln_onnx_load(b->buf, b->len, NULL, &m, &err) || kiln_bind_ops(m->graph, true, &err) ||
        kiln_passes_run(m->graph, cpu->pre_passes, cpu->n_pre_passes, NULL, &err) ||
        kiln_passes_run(m->graph, kiln_passes_generic, kiln_passes_generic_n, NULL, &err) ||
        kiln_graph_infer(m->graph, NULL) || kiln_passes_run(m->graph, cpu->passes, cpu->n_passes, NULL, &err) ||
        (!kiln_cpu_nchwc_available() && kiln_passes_run(m->graph, &P_NCHWC, 1, &blocked, &err))) {
        fprintf(stderr, "compile: %s\n", err.msg);
        kiln_model_free(m);
        return NULL;
    }
    return m;
}

/* The blocked values of md are exactly those named in `names` (NULL-terminated), and each node
 * reading or writing one has a blocked kernel (kernels_nchwc.c) rather than the one that fails,
 * or is element-wise on its bytes (kiln_pass_nchwc_flat_input). */
static void check_blocked(const kiln_model *md, const char *const *names)
{
    CHECK(md != NULL);
    if (!md) return;
    const kiln_graph *g = md->graph;
    int want = 0, got = 0;
    while (names[want]) want++;
    for (int i = 0; i < g->n_values; i++) {
        const kiln_ir_value *v = g->values[i];
        bool named = false, blocked = v->layout == KILN_LAYOUT_NCHW16C;
        for (int k = 0; names[k]; k++) named = named || !strcmp(v->name, names[k]);
        if (blocked != named) fprintf(stderr, "layout_nchwc: '%s' is %s\n", v->name, blocked ? "blocked" : "plain");
        CHECK(blocked == named);
        got += blocked;
    }
    CHECK(got == want);
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        bool touches = false;
        for (int i = 0; i < n->n_in; i++) touches = touches || (n->in[i] && n->in[i]->layout == KILN_LAYOUT_NCHW16C);
        for (int i = 0; i < n->n_out; i++) touches = touches || (n->out[i] && n->out[i]->layout == KILN_LAYOUT_NCHW16C);
        if (touches && strcmp(n->op_type, "Shape") && kiln_pass_nchwc_flat_input(n) < 0)
            CHECK(kiln_cpu_kernel_find(&kiln_cpu_kernels_nchwc, n->op) != NULL);
    }
}

/* The largest |got - want| / max(1, |want|) over outputs out_names of b's optimised and
 * unoptimised sessions on the same random inputs; INFINITY when a run fails or a shape differs. */
static double outputs_rel_diff(const built *b, int n_in, const char *const *names, const int64_t (*dims)[4], int n_out,
                               const char *const *out_names)
{
    kiln_value *in[4] = {0}, *out[2][4] = {{0}};
    float *data[4] = {0};
    for (int i = 0; i < n_in; i++) {
        int64_t n = dims[i][0] * dims[i][1] * dims[i][2] * dims[i][3];
        data[i] = rand_floats(n);
        kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 4, dims[i], data[i], (size_t)n * sizeof(float), &in[i]);
    }
    bool ran = true;
    for (int ref = 0; ref < 2; ref++) {
        kiln_session_options opt = kiln_session_options_default();
        opt.unoptimized = ref;
        opt.num_threads = 2;
        kiln_session *s = NULL;
        if (kiln_session_create_from_memory(b->buf, b->len, NULL, &opt, &s) ||
            kiln_session_run(s, n_in, names, (const kiln_value *const *)in, n_out, out_names, out[ref])) {
            fprintf(stderr, "session (%s): %s\n", ref ? "reference" : "optimised", kiln_last_error(s));
            ran = false;
        }
        kiln_session_free(s);
    }
    double worst = ran ? 0 : INFINITY;
    for (int o = 0; ran && o < n_out; o++) {
        const kiln_value *a = out[0][o], *r = out[1][o];
        if (kiln_value_rank(a) != kiln_value_rank(r) ||
            memcmp(kiln_value_dims(a), kiln_value_dims(r), sizeof(int64_t) * (size_t)kiln_value_rank(a))) {
            worst = INFINITY;
            break;
        }
        const float *x = kiln_value_data(a), *y = kiln_value_data(r);
        for (int64_t i = 0; i < kiln_value_numel(a); i++) {
            double d = fabs((double)x[i] - y[i]) / fmax(1.0, fabs((double)y[i]));
            if (!(d <= worst)) worst = d; /* NaN propagates */
        }
    }
    for (int o = 0; o < n_out; o++) kiln_value_free(out[0][o]), kiln_value_free(out[1][o]);
    for (int i = 0; i < n_in; i++) {
        kiln_value_free(in[i]);
        free(data[i]);
    }
    return worst;
}

/* Random weights [dims] scaled by 1 / sqrt(the fan-in, dims[1..] multiplied). */
static void init_w(mg_model *m, const char *name, int rank, const int64_t *dims)
{
    int64_t n = dims[0], fan = 1;
    for (int k = 1; k < rank; k++) fan *= dims[k], n *= dims[k];
    float *v = rand_floats(n);
    for (int64_t i = 0; i < n; i++) v[i] /= sqrtf((float)fan);
    mg_init_float(m, name, rank, dims, v, NULL, 0);
    free(v);
}

/* y = Conv(x) of c -> k channels, a kh x kh window padded to keep H and W, with a bias */
static void conv_node(mg_model *m, const char *x, const char *y, int64_t c, int64_t k, int64_t kh)
{
    char w[64], bias[64];
    snprintf(w, sizeof w, "W_%s", y);
    snprintf(bias, sizeof bias, "B_%s", y);
    init_w(m, w, 4, (int64_t[]){k, c, kh, kh});
    init(m, bias, 1, (int64_t[]){k});
    mg_node(m, "Conv", "", (const char *[]){x, w, bias, NULL}, (const char *[]){y, NULL});
    mg_attr_ints(m, "pads", 4, (int64_t[]){kh / 2, kh / 2, kh / 2, kh / 2});
}

/* y = Resize(x) nearest (opset 11 on) by constant scales [4] */
static void resize_node(mg_model *m, const char *x, const char *y, const float *scales, const char *ct, const char *nr)
{
    char sc[64];
    snprintf(sc, sizeof sc, "S_%s", y);
    mg_init_float(m, sc, 1, (int64_t[]){4}, scales, NULL, 0);
    mg_node(m, "Resize", "", (const char *[]){x, "", sc, NULL}, (const char *[]){y, NULL});
    mg_attr_string(m, "mode", "nearest");
    mg_attr_string(m, "coordinate_transformation_mode", ct);
    mg_attr_string(m, "nearest_mode", nr);
}

/* X [n, C, h, w] -> s = Conv 3x3 -> p = AveragePool 2x2 / 2 (ceil) -> q = Conv 1x1 (2C) ->
 * r = Resize to s's H and W -> t = Conv 1x1 (C) -> G = GlobalMaxPool(t); m = Relu(t + s)
 * (kiln.FusedAdd) -> u = Resize x1.5 (half_pixel, round_prefer_floor) -> Y = Conv 1x1 (8).
 * r by scales x2 (asymmetric, floor: t's dims are s's for even h and w only, which inference
 * cannot prove: the Add's broadcast) or by sizes of q's N and C and s's H and W through Shape,
 * Slice and Concat (half_pixel, round_prefer_ceil: the dims proved equal, any h and w). */
static built pyramid(int64_t C, bool sizes)
{
    mg_model *m = mg_new(13);
    mg_input(m, "X", FLOAT, 4, (int64_t[]){-1, C, -1, -1}, (const char *[]){"n", NULL, "h", "w"});
    conv_node(m, "X", "s", C, C, 3);
    mg_node(m, "AveragePool", "", (const char *[]){"s", NULL}, (const char *[]){"p", NULL});
    mg_attr_ints(m, "kernel_shape", 2, (int64_t[]){2, 2});
    mg_attr_ints(m, "strides", 2, (int64_t[]){2, 2});
    mg_attr_ints(m, "pads", 4, (int64_t[]){0, 0, 1, 1});
    conv_node(m, "p", "q", C, 2 * C, 1);
    if (sizes) {
        mg_init_raw(m, "k0", INT64, 8, 1, (int64_t[]){1}, (int64_t[]){0});
        mg_init_raw(m, "k2", INT64, 8, 1, (int64_t[]){1}, (int64_t[]){2});
        mg_init_raw(m, "k4", INT64, 8, 1, (int64_t[]){1}, (int64_t[]){4});
        mg_node(m, "Shape", "", (const char *[]){"q", NULL}, (const char *[]){"q_shape", NULL});
        mg_node(m, "Slice", "", (const char *[]){"q_shape", "k0", "k2", NULL}, (const char *[]){"q_nc", NULL});
        mg_node(m, "Shape", "", (const char *[]){"s", NULL}, (const char *[]){"s_shape", NULL});
        mg_node(m, "Slice", "", (const char *[]){"s_shape", "k2", "k4", NULL}, (const char *[]){"s_hw", NULL});
        mg_node(m, "Concat", "", (const char *[]){"q_nc", "s_hw", NULL}, (const char *[]){"r_sizes", NULL});
        mg_attr_int(m, "axis", 0);
        mg_node(m, "Resize", "", (const char *[]){"q", "", "", "r_sizes", NULL}, (const char *[]){"r", NULL});
        mg_attr_string(m, "mode", "nearest");
        mg_attr_string(m, "nearest_mode", "round_prefer_ceil");
    } else {
        resize_node(m, "q", "r", (const float[]){1, 1, 2, 2}, "asymmetric", "floor");
    }
    conv_node(m, "r", "t", 2 * C, C, 1);
    mg_node(m, "GlobalMaxPool", "", (const char *[]){"t", NULL}, (const char *[]){"G", NULL});
    mg_node(m, "Add", "", (const char *[]){"t", "s", NULL}, (const char *[]){"a", NULL});
    mg_node(m, "Relu", "", (const char *[]){"a", NULL}, (const char *[]){"m", NULL});
    resize_node(m, "m", "u", (const float[]){1, 1, 1.5f, 1.5f}, "half_pixel", "round_prefer_floor");
    conv_node(m, "u", "Y", C, 8, 1);
    mg_output(m, "Y");
    mg_output(m, "G");
    return finish(m);
}

/* Pyramids of 16 and 32 channels block every value between the input and the outputs: the
 * Add (kiln.FusedAdd with its Relu), both Resizes and GlobalMaxPool run blocked kernels, and
 * the outputs match the unoptimised session's on batches 1 to 3 and sizes from 1x1 (by sizes,
 * odd ones; by scales x2, even ones, whose dims inference cannot prove equal). At 24 channels
 * only the 48-channel values between q's convolution and t's are blocked. */
static void test_layout_nchwc_pyramid(void)
{
    static const char *const inner[] = {"s", "p", "q", "r", "t", "m", "u", NULL}, *const wide[] = {"q", "r", NULL};
    static const char *const x_only[] = {"X"}, *const outs[] = {"Y", "G"};
    for (int c = 0; c < 3; c++) {
        int64_t C = (int64_t[]){16, 32, 24}[c];
        for (int sizes = 0; sizes < 2; sizes++) {
            built b = pyramid(C, sizes);
            kiln_model *md = compile_cpu(&b);
            check_blocked(md, C % 16 ? wide : inner);
            CHECK(md && count_op(md->graph, "kiln", "FusedAdd") == 1 && count_op(md->graph, "", "Add") == 0);
            kiln_model_free(md);
            static const int64_t even[][3] = {{1, 10, 22}, {3, 6, 14}, {2, 2, 2}, {1, 4, 8}};
            static const int64_t odd[][3] = {{1, 7, 9}, {3, 1, 1}, {2, 10, 22}, {1, 5, 2}, {3, 9, 13}};
            int n_shapes = sizes ? 5 : 4;
            for (int k = 0; k < n_shapes; k++) {
                const int64_t *d = sizes ? odd[k] : even[k];
                int64_t dims[1][4] = {{d[0], C, d[1], d[2]}};
                double diff = outputs_rel_diff(&b, 1, x_only, dims, 2, outs);
                if (!(diff <= 1e-5))
                    fprintf(stderr, "pyramid C=%lld sizes=%d [%lld, %lld, %lld]: %g\n", (long long)C, sizes,
                            (long long)d[0], (long long)d[1], (long long)d[2], diff);
                CHECK(diff <= 1e-5);
            }
            free(b.buf);
        }
    }
}

/* s = Conv 3x3 (X [n, 16, h, w]) plus e = Conv 1x1 (GlobalAveragePool(s)) [n, 16, 1, 1], plus
 * z = Conv 3x3 (Z [m, 16, h2, w2]) -> Y = Conv 1x1 (8): Adds whose operands' N, H and W differ or
 * may, all blocked, broadcast at run time as [N, C / 16, H, W, 16]. */
static void test_layout_nchwc_broadcast_add(void)
{
    mg_model *m = mg_new(13);
    mg_input(m, "X", FLOAT, 4, (int64_t[]){-1, 16, -1, -1}, (const char *[]){"n", NULL, "h", "w"});
    mg_input(m, "Z", FLOAT, 4, (int64_t[]){-1, 16, -1, -1}, (const char *[]){"m", NULL, "h2", "w2"});
    conv_node(m, "X", "s", 16, 16, 3);
    mg_node(m, "GlobalAveragePool", "", (const char *[]){"s", NULL}, (const char *[]){"gp", NULL});
    conv_node(m, "gp", "e", 16, 16, 1);
    mg_node(m, "Add", "", (const char *[]){"s", "e", NULL}, (const char *[]){"a", NULL});
    conv_node(m, "Z", "z", 16, 16, 3);
    mg_node(m, "Add", "", (const char *[]){"a", "z", NULL}, (const char *[]){"b", NULL});
    conv_node(m, "b", "Y", 16, 8, 1);
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = compile_cpu(&b);
    check_blocked(md, (const char *const[]){"s", "e", "a", "z", "b", NULL});
    kiln_model_free(md);
    static const char *const names[] = {"X", "Z"}, *const outs[] = {"Y"};
    static const int64_t shapes[][2][4] = {
        {{1, 16, 5, 7}, {1, 16, 5, 7}}, {{3, 16, 5, 7}, {1, 16, 1, 7}}, {{1, 16, 1, 1}, {2, 16, 4, 6}},
        {{2, 16, 6, 1}, {2, 16, 1, 9}}, {{3, 16, 9, 11}, {3, 16, 9, 1}}, {{1, 16, 2, 3}, {4, 16, 2, 3}},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        double diff = outputs_rel_diff(&b, 2, names, shapes[k], 1, outs);
        if (!(diff <= 1e-5)) fprintf(stderr, "broadcast Add, shapes %zu: %g\n", k, diff);
        CHECK(diff <= 1e-5);
    }
    free(b.buf);
}

/* PP-OCR's blocks between blocked convolutions: s = Conv 3x3 (X [n, 16, h, w] -> 32) with
 * HardSwish, then its learnable scale and shift (Mul by and Add of one-element constants, either
 * side), a squeeze-excitation t + t * HardSigmoid(Conv(Relu(Conv(GlobalAveragePool(t))))), a
 * constant per-channel scale [1, 32, 1, 1], Div and Sub of scalars and Clip(0, 6), into Y = Relu(
 * Conv 3x3 (32 -> 24) + R): every value from s to the last Clip blocked, the element-wise nodes
 * on their own kernels, and Y plain (24 channels), by Winograd from 12x12 (its tiles stored per
 * channel, with the residual and the activation) and directly below. Outputs match the
 * unoptimised session's on batches 1 to 3 and sizes odd and even. */
static void test_layout_nchwc_flat_se(void)
{
    mg_model *m = mg_new(13);
    mg_input(m, "X", FLOAT, 4, (int64_t[]){-1, 16, -1, -1}, (const char *[]){"n", NULL, "h", "w"});
    mg_input(m, "R", FLOAT, 4, (int64_t[]){-1, 24, -1, -1}, (const char *[]){"n", NULL, "h", "w"});
    conv_node(m, "X", "c0", 16, 32, 3);
    mg_node(m, "HardSwish", "", (const char *[]){"c0", NULL}, (const char *[]){"s", NULL});
    scalar(m, "k_scale", 1.25f);
    scalar(m, "k_shift", -0.5f);
    mg_node(m, "Mul", "", (const char *[]){"k_scale", "s", NULL}, (const char *[]){"sm", NULL});
    mg_node(m, "Add", "", (const char *[]){"sm", "k_shift", NULL}, (const char *[]){"t", NULL});
    mg_node(m, "GlobalAveragePool", "", (const char *[]){"t", NULL}, (const char *[]){"g", NULL});
    conv_node(m, "g", "e1", 32, 8, 1);
    mg_node(m, "Relu", "", (const char *[]){"e1", NULL}, (const char *[]){"e2", NULL});
    conv_node(m, "e2", "e3", 8, 32, 1);
    mg_node(m, "HardSigmoid", "", (const char *[]){"e3", NULL}, (const char *[]){"hs", NULL});
    mg_node(m, "Mul", "", (const char *[]){"t", "hs", NULL}, (const char *[]){"se", NULL});
    mg_node(m, "Add", "", (const char *[]){"t", "se", NULL}, (const char *[]){"a", NULL});
    init(m, "k_chan", 4, (int64_t[]){1, 32, 1, 1});
    mg_node(m, "Mul", "", (const char *[]){"a", "k_chan", NULL}, (const char *[]){"ac", NULL});
    scalar(m, "k_div", 3.0f);
    mg_node(m, "Div", "", (const char *[]){"ac", "k_div", NULL}, (const char *[]){"d", NULL});
    mg_node(m, "Sub", "", (const char *[]){"k_shift", "d", NULL}, (const char *[]){"sb", NULL});
    scalar(m, "k_lo", 0.0f);
    scalar(m, "k_hi", 6.0f);
    mg_node(m, "Clip", "", (const char *[]){"sb", "k_lo", "k_hi", NULL}, (const char *[]){"cl", NULL});
    conv_node(m, "cl", "y0", 32, 24, 3);
    mg_node(m, "Add", "", (const char *[]){"y0", "R", NULL}, (const char *[]){"y1", NULL});
    mg_node(m, "Relu", "", (const char *[]){"y1", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    built b = finish(m);
    kiln_model *md = compile_cpu(&b);
    if (md && kiln_cpu_nchwc_available()) { /* (without the blocked kernels the pass alone ran: unfused names) */
        int blocked = 0, flat = 0;
        for (int i = 0; i < md->graph->n_values; i++) {
            const kiln_ir_value *v = md->graph->values[i];
            bool want = !strcmp(v->name, "s") || !strcmp(v->name, "t") || !strcmp(v->name, "se") ||
                        !strcmp(v->name, "a") || !strcmp(v->name, "ac") || !strcmp(v->name, "d") ||
                        !strcmp(v->name, "sb") || !strcmp(v->name, "cl");
            if (want && v->layout != KILN_LAYOUT_NCHW16C) fprintf(stderr, "flat/SE: '%s' is plain\n", v->name);
            CHECK(!want || v->layout == KILN_LAYOUT_NCHW16C);
            if (!strcmp(v->name, "Y") || !strcmp(v->name, "X") || !strcmp(v->name, "R")) CHECK(v->layout == KILN_LAYOUT_PLAIN);
            blocked += v->layout == KILN_LAYOUT_NCHW16C;
        }
        for (int k = 0; k < md->graph->n_nodes; k++) flat += kiln_pass_nchwc_flat_input(md->graph->nodes[k]) >= 0;
        CHECK(blocked >= 8 && flat >= 4);
    }
    kiln_model_free(md);
    static const char *const names[] = {"X", "R"}, *const outs[] = {"Y"};
    static const int64_t hw[][3] = {{1, 12, 12}, {2, 13, 17}, {3, 16, 20}, {1, 5, 7}, {2, 1, 1}, {1, 24, 9}};
    for (size_t k = 0; k < sizeof hw / sizeof hw[0]; k++) {
        int64_t dims[2][4] = {{hw[k][0], 16, hw[k][1], hw[k][2]}, {hw[k][0], 24, hw[k][1], hw[k][2]}};
        double diff = outputs_rel_diff(&b, 2, names, dims, 1, outs);
        if (!(diff <= 1e-5)) fprintf(stderr, "flat/SE [%lld, %lld, %lld]: %g\n", (long long)hw[k][0], (long long)hw[k][1],
                                     (long long)hw[k][2], diff);
        CHECK(diff <= 1e-5);
    }
    free(b.buf);
}

/* What must stay plain around a blocked-capable convolution s = Conv 3x3 (X [n, 16, h, w]): an
 * Add that broadcasts channels (a 1-channel operand), a Resize that resizes C or N or whose
 * scales are a graph input (with a default, so not constant); an Add of a constant [1, 16, 1, 1]
 * (the same bytes in both layouts) and Upsample / Resize of scale 1 on C and N keep both sides
 * blocked (opsets 7, 9, 19 with axes). */
static void test_layout_nchwc_resize_add_plain(void)
{
    static const char *const x_only[] = {"X"}, *const outs[] = {"Y"};
    for (int kind = 0; kind < 8; kind++) {
        int opset = kind == 5 ? 7 : kind == 6 ? 9 : kind == 7 ? 19 : 13;
        mg_model *m = mg_new(opset);
        mg_input(m, "X", FLOAT, 4, (int64_t[]){-1, 16, -1, -1}, (const char *[]){"n", NULL, "h", "w"});
        int64_t yc = 16;
        const char *blocked[4] = {NULL, NULL, NULL, NULL};
        conv_node(m, "X", "s", 16, 16, 3);
        if (kind == 0) { /* channels broadcast */
            conv_node(m, "X", "c1", 16, 1, 1);
            mg_node(m, "Add", "", (const char *[]){"s", "c1", NULL}, (const char *[]){"r", NULL});
        } else if (kind == 1) { /* a constant operand (after a MaxPool: Conv + constant folds into the bias) */
            mg_node(m, "MaxPool", "", (const char *[]){"s", NULL}, (const char *[]){"p", NULL});
            mg_attr_ints(m, "kernel_shape", 2, (int64_t[]){3, 3});
            mg_attr_ints(m, "pads", 4, (int64_t[]){1, 1, 1, 1});
            init(m, "K", 4, (int64_t[]){1, 16, 1, 1});
            mg_node(m, "Add", "", (const char *[]){"p", "K", NULL}, (const char *[]){"r", NULL});
        } else if (kind == 2 || kind == 3) { /* C x2, N x2 */
            const float *sc = kind == 2 ? (const float[]){1, 2, 1, 1} : (const float[]){2, 1, 1, 1};
            resize_node(m, "s", "r", sc, "asymmetric", "floor");
            yc = kind == 2 ? 32 : 16;
        } else if (kind == 4) { /* scales a graph input with a default */
            mg_input(m, "S_r", FLOAT, 1, (int64_t[]){4}, NULL);
            resize_node(m, "s", "r", (const float[]){1, 1, 2, 2}, "asymmetric", "floor");
        } else if (kind == 5) { /* Upsample-7: scales an attribute */
            mg_node(m, "Upsample", "", (const char *[]){"s", NULL}, (const char *[]){"r", NULL});
            mg_attr_floats(m, "scales", 4, (const float[]){1, 1, 2, 3});
        } else if (kind == 6) { /* Upsample-9: scales an input */
            mg_init_float(m, "S_r", 1, (int64_t[]){4}, (const float[]){1, 1, 3, 2}, NULL, 0);
            mg_node(m, "Upsample", "", (const char *[]){"s", "S_r", NULL}, (const char *[]){"r", NULL});
        } else { /* Resize-19 of H and W only (axes), by constant sizes */
            mg_init_raw(m, "Z_r", INT64, 8, 1, (int64_t[]){2}, (int64_t[]){5, 3});
            mg_node(m, "Resize", "", (const char *[]){"s", "", "", "Z_r", NULL}, (const char *[]){"r", NULL});
            mg_attr_ints(m, "axes", 2, (int64_t[]){2, 3});
            mg_attr_string(m, "coordinate_transformation_mode", "half_pixel_symmetric");
        }
        if (kind >= 5) blocked[0] = "s", blocked[1] = "r";
        if (kind == 1) blocked[0] = "s", blocked[1] = "p", blocked[2] = "r";
        conv_node(m, "r", "Y", yc, 8, 1);
        mg_output(m, "Y");
        built b = finish(m);
        kiln_model *md = compile_cpu(&b);
        int failures = unit_failures;
        check_blocked(md, blocked);
        if (unit_failures != failures) fprintf(stderr, "layout_nchwc plain/resize case %d: layouts\n", kind);
        kiln_model_free(md);
        static const int64_t shapes[][3] = {{1, 5, 7}, {3, 4, 6}, {1, 1, 1}, {2, 9, 2}};
        for (int k = 0; k < 4; k++) {
            int64_t dims[1][4] = {{shapes[k][0], 16, shapes[k][1], shapes[k][2]}};
            double diff = outputs_rel_diff(&b, 1, x_only, dims, 1, outs);
            if (!(diff <= 1e-5)) fprintf(stderr, "layout_nchwc plain/resize case %d, shape %d: %g\n", kind, k, diff);
            CHECK(diff <= 1e-5);
        }
        free(b.buf);
    }
}

/* The rewiring helpers keep the consumer lists: set_input, set_inputs, unlink. */
static void test_consumer_lists(void)
{
    built b = conv_add_act("Relu", false);
    kiln_model *md = load(&b);
    kiln_err err = {0};
    CHECK(md && kiln_graph_index_uses(md->graph, &err) == KILN_OK && kiln_graph_uses_consistent(md->graph));
    if (md) {
        kiln_graph *g = md->graph;
        kiln_node *conv = g->nodes[0], *add = g->nodes[1], *relu = g->nodes[2];
        kiln_ir_value *x = conv->in[0], *c = conv->out[0], *r = add->in[0];
        CHECK(kiln_ir_value_only_reader(c) == add && kiln_ir_value_readers(x) == 1 && kiln_ir_value_only_reader(relu->out[0]) == NULL);
        CHECK(kiln_node_set_input(add, 0, c, &err) == KILN_OK); /* Add(C, C) */
        CHECK(c->n_uses == 2 && r->n_uses == 0 && kiln_ir_value_only_reader(c) == NULL && kiln_graph_uses_consistent(g));
        kiln_ir_value *in[2] = {r, x};
        CHECK(kiln_node_set_inputs(add, 2, in, &err) == KILN_OK);
        CHECK(c->n_uses == 0 && r->n_uses == 1 && x->n_uses == 2 && kiln_graph_uses_consistent(g));
        kiln_node_unlink(relu);
        g->nodes[2] = NULL;
        kiln_graph_compact(g);
        CHECK(g->n_nodes == 2 && kiln_graph_uses_consistent(g) && add->out[0]->n_uses == 0);
    }
    kiln_model_free(md);
    free(b.buf);
}

/* ---- fuse_elementwise (the GPU's pass): random element-wise DAGs ---- */

static const kiln_pass P_EW = {"fuse_elementwise", kiln_pass_fuse_elementwise};

/* Every node of m evaluated in order by its reference kernel, each result made a constant;
 * returns a copy of value `name` (NULL on failure). */
static kiln_value *interpret(kiln_model *m, const char *name)
{
    kiln_graph *g = m->graph;
    kiln_err err = {0};
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = g->nodes[k];
        kiln_value *out[8] = {0};
        if (n->n_out > 8 || kiln_node_evaluate(n, 0, out, &err)) {
            fprintf(stderr, "interpret: node %s (%s): %s\n", n->name, n->op_type, err.msg);
            return NULL;
        }
        for (int i = 0; i < n->n_out; i++) {
            if (!out[i]) continue;
            kiln_ir_value *v = n->out[i];
            if (kiln_model_own_value(m, out[i], &err)) return NULL;
            kiln_ir_value_set_constant(v, out[i]);
        }
    }
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i] && !strcmp(g->values[i]->name, name) && g->values[i]->init) {
            kiln_value *copy = NULL;
            return kiln_value_copy(g->values[i]->init, &copy, &err) ? NULL : copy;
        }
    return NULL;
}

/* Bit-equal, NaN equal to NaN of any payload. */
static bool same_values(const kiln_value *a, const kiln_value *b)
{
    if (!a || !b || a->dtype != b->dtype || a->numel != b->numel || a->rank != b->rank) return false;
    for (int k = 0; k < a->rank; k++)
        if (a->dims[k] != b->dims[k]) return false;
    for (int64_t i = 0; i < a->numel; i++) {
        double x = kiln_load_f64(a->dtype, a->data, i), y = kiln_load_f64(b->dtype, b->data, i);
        if (!(x == y || (isnan(x) && isnan(y)) || !memcmp((const char *)a->data + i * (int64_t)kiln_dtype_size(a->dtype),
                                                         (const char *)b->data + i * (int64_t)kiln_dtype_size(a->dtype),
                                                         kiln_dtype_size(a->dtype))))
            return false;
    }
    return true;
}

typedef struct ewv {
    char name[16];
    int dtype; /* 1 float, 10 float16 */
} ewv;

static int rand_below(int n) { return (int)((frand() + 1.0f) * 0.5f * (float)n) % n; }

/* A random element-wise DAG over broadcastable [2, 3, 4, 5]-based shapes: float32 and float16
 * (Cast) values, unary ops with attributes, binary ops with scalar constants, Clip, Where on a
 * Greater (a node the pass leaves alone), a mask's int64 Cast; one intermediate sometimes an
 * output too. Returns the name of the last value in *last. */
static built ew_dag(int seed, char *last)
{
    static const char *const unary[] = {"Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Erf", "Softplus",
                                        "HardSwish", "HardSigmoid", "LeakyRelu", "Elu", "Gelu", "Sqrt",
                                        "Reciprocal", "Floor", "Sin", "Softsign"};
    static const char *const binary[] = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"};
    enum { F32 = 1, F16 = 10, I64 = 7 };
    rng = 0x9E3779B97F4A7C15ull * (uint64_t)(seed + 1);
    mg_model *m = mg_new(20);
    ewv v[64];
    int nv = 0, tmp = 0;
    mg_input(m, "unused", F32, 1, (int64_t[]){1}, NULL);
    for (int i = 0; i < 4; i++) { /* leaves of broadcastable shapes */
        int64_t full[4] = {2, 3, 4, 5}, d[4];
        int r = 1 + rand_below(4);
        for (int k = 0; k < r; k++) d[k] = rand_below(3) ? full[4 - r + k] : 1;
        snprintf(v[nv].name, sizeof v[nv].name, "L%d", i);
        init(m, v[nv].name, r, d);
        v[nv++].dtype = F32;
    }
    scalar(m, "c2", 2.0f);
    scalar(m, "cneg", -0.75f);
    scalar(m, "lo", -0.5f);
    scalar(m, "hi", 0.8f);
    int steps = 3 + rand_below(10);
    for (int s = 0; s < steps && nv < 60; s++) {
        int kind = rand_below(7), a = nv - 1 - rand_below(nv < 3 ? nv : 3), b = rand_below(nv);
        char out[16];
        snprintf(out, sizeof out, "t%d", tmp++);
        int dt = v[a].dtype;
        if (kind == 0 || kind == 1) {
            const char *op = unary[rand_below((int)(sizeof unary / sizeof *unary))];
            mg_node(m, op, "", (const char *[]){v[a].name, NULL}, (const char *[]){out, NULL});
            if (!strcmp(op, "HardSigmoid")) mg_attr_float(m, "alpha", 0.3f), mg_attr_float(m, "beta", 0.4f);
            if (!strcmp(op, "LeakyRelu")) mg_attr_float(m, "alpha", 0.2f);
            if (!strcmp(op, "Gelu") && rand_below(2)) mg_attr_string(m, "approximate", "tanh");
        } else if (kind == 2 || kind == 3) {
            const char *op = binary[rand_below((int)(sizeof binary / sizeof *binary))];
            const char *rhs = v[b].name;
            if (rand_below(3) == 0) rhs = rand_below(2) ? "c2" : "cneg";
            if (v[b].dtype != dt && rhs == v[b].name) { /* match the dtype with a Cast */
                char c[16];
                snprintf(c, sizeof c, "t%d", tmp++);
                mg_node(m, "Cast", "", (const char *[]){v[b].name, NULL}, (const char *[]){c, NULL});
                mg_attr_int(m, "to", dt);
                snprintf(v[nv].name, sizeof v[nv].name, "%s", c);
                v[nv++].dtype = dt;
                rhs = v[nv - 1].name;
            }
            if (dt == F16 && (rhs[0] == 'c')) { /* a float16 scalar through a Cast of the constant */
                char c[16];
                snprintf(c, sizeof c, "t%d", tmp++);
                mg_node(m, "Cast", "", (const char *[]){rhs, NULL}, (const char *[]){c, NULL});
                mg_attr_int(m, "to", F16);
                snprintf(v[nv].name, sizeof v[nv].name, "%s", c);
                v[nv++].dtype = F16;
                rhs = v[nv - 1].name;
            }
            if (!strcmp(op, "PRelu")) { /* its slope must broadcast to X: a scalar */
                if (dt == F32) rhs = "cneg";
                else op = "Mul";
            }
            mg_node(m, op, "", (const char *[]){v[a].name, rhs, NULL}, (const char *[]){out, NULL});
        } else if (kind == 4) {
            mg_node(m, "Cast", "", (const char *[]){v[a].name, NULL}, (const char *[]){out, NULL});
            dt = dt == F32 ? F16 : F32;
            mg_attr_int(m, "to", dt);
        } else if (kind == 5 && dt == F32) {
            mg_node(m, "Clip", "", (const char *[]){v[a].name, "lo", "hi", NULL}, (const char *[]){out, NULL});
        } else if (kind == 5) {
            mg_node(m, "Relu", "", (const char *[]){v[a].name, NULL}, (const char *[]){out, NULL});
        } else {
            /* Where(Greater(leaf, 0), a, b) or a mask: a + Cast(Cast(leaf, int64)) * -3 */
            char c[16], z[16];
            snprintf(c, sizeof c, "t%d", tmp++);
            snprintf(z, sizeof z, "t%d", tmp++);
            int leaf = rand_below(4);
            if (rand_below(2)) {
                mg_node(m, "Greater", "", (const char *[]){v[leaf].name, "cneg", NULL}, (const char *[]){c, NULL});
                const char *other = v[b].dtype == dt ? v[b].name : v[a].name;
                mg_node(m, "Where", "", (const char *[]){c, v[a].name, other, NULL}, (const char *[]){out, NULL});
            } else {
                mg_node(m, "Cast", "", (const char *[]){v[leaf].name, NULL}, (const char *[]){c, NULL});
                mg_attr_int(m, "to", I64);
                mg_node(m, "Cast", "", (const char *[]){c, NULL}, (const char *[]){z, NULL});
                mg_attr_int(m, "to", dt);
                mg_node(m, "Add", "", (const char *[]){v[a].name, z, NULL}, (const char *[]){out, NULL});
            }
        }
        snprintf(v[nv].name, sizeof v[nv].name, "%s", out);
        v[nv++].dtype = dt;
    }
    snprintf(last, 16, "%s", v[nv - 1].name);
    mg_output(m, last);
    mg_output(m, "unused");
    if (seed % 3 == 0 && nv > 6) mg_output(m, v[nv - 3].name); /* read outside: it must survive */
    return finish(m);
}

static void test_fuse_elementwise(void)
{
    int fused_total = 0, cases = 0;
    for (int seed = 0; seed < 300; seed++) {
        char last[16];
        built b = ew_dag(seed, last);
        kiln_model *ref = load(&b), *md = load(&b);
        CHECK(ref && md);
        if (!ref || !md) {
            kiln_model_free(ref);
            kiln_model_free(md);
            free(b.buf);
            continue;
        }
        int before = md->graph->n_nodes, fused = run_pass(md, &P_EW);
        CHECK(fused >= 0);
        fused_total += fused > 0;
        /* no element-wise node left whose only reader is another one of a group (the pass is greedy) */
        int fused_nodes = count_op(md->graph, "kiln", "FusedElementwise");
        CHECK(fused_nodes == fused);
        if (fused) CHECK(md->graph->n_nodes < before);
        kiln_value *want = interpret(ref, last), *got = interpret(md, last);
        CHECK(want && got && same_values(want, got));
        if (!(want && got && same_values(want, got))) fprintf(stderr, "fuse_elementwise: seed %d differs\n", seed);
        cases++;
        kiln_value_free(want);
        kiln_value_free(got);
        kiln_model_free(ref);
        kiln_model_free(md);
        free(b.buf);
    }
    CHECK(cases == 300 && fused_total > 200);
}

int main(void)
{
    test_fold_constants();
    test_fold_conv_bn();
    test_fold_conv_affine();
    test_fuse_hardswish();
    test_fuse_residual();
    test_fuse_activation_conv();
    test_fuse_conv_gpu();
    test_fuse_silu_mul();
    test_fuse_gate_up();
    test_adopt_ms_fused_conv();
    test_fused_reference();
    test_fuse_matmul_bias_and_gemm();
    test_fuse_gelu();
    test_fuse_layernorm();
    test_fuse_attention();
    test_fuse_attention_f16();
    test_fuse_attention_exported();
    test_fuse_attention_causal_where();
    test_layout_nchwc();
    test_layout_nchwc_pyramid();
    test_layout_nchwc_broadcast_add();
    test_layout_nchwc_flat_se();
    test_layout_nchwc_resize_add_plain();
    test_consumer_lists();
    test_fuse_elementwise();
    return unit_report("test_passes");
}
