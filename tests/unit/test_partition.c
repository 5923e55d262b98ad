/* test_partition.c - partitioning and copy nodes (src/exec/partition.c) with a fake device
 * provider that takes Relu, Exp and Add: nodes land on the side its supports() says, with the
 * reason kept for the others; a copy node goes before the first reader on the other side of
 * each value (one per value and side), graph inputs get copies for the side they are read on,
 * a value a host node's subgraph captures from the device is read there through its host copy,
 * Shape-like readers and constants get none, and the release lists stay consistent. */
#include <stdlib.h>
#include <string.h>

#include "exec/partition.h"
#include "exec/providers.h"
#include "modelgen.h"
#include "onnx/load.h"
#include "ops/eval.h"
#include "unit.h"

enum { FLOAT = 1, BOOL = 9 };

static bool fake_supports(const kiln_provider *p, const kiln_node *n, char *why, size_t size)
{
    (void)p;
    if (!strcmp(n->op_type, "Relu") || !strcmp(n->op_type, "Exp") || !strcmp(n->op_type, "Add")) return true;
    snprintf(why, size, "no fake kernel for %s", n->op_type);
    return false;
}

static kiln_kernel_fn fake_select(kiln_provider *p, kiln_node *n, unsigned *host_inputs)
{
    (void)p;
    *host_inputs = 0;
    return n->op->run;
}

static const kiln_provider_i fake = {
    .api_version = KILN_PROVIDER_API, .name = "fake", .kind = KILN_PROVIDER_CUDA, .device = true,
    .supports = fake_supports, .select = fake_select,
};

/* X -> Relu (device) -> A; Neg(A) (host) -> B; Exp(B) (device) -> C; Add(A, C) (device) -> Y;
 * Shape(A) (host, reads the type only) -> S; If(cond) (host) with both branches Identity(A) -> Z;
 * Mul(X, W) (host, W constant) -> M. */
static unsigned char *model(size_t *len)
{
    int64_t d[2] = {2, 3};
    mg_model *m = mg_new(13);
    mg_input(m, "X", FLOAT, 2, d, NULL);
    mg_input(m, "cond", BOOL, 0, NULL, NULL);
    float w[6] = {1, 2, 3, 4, 5, 6};
    mg_init_float(m, "W", 2, d, w, NULL, 0);
    mg_node(m, "Relu", "", (const char *[]){"X", NULL}, (const char *[]){"A", NULL});
    mg_node(m, "Neg", "", (const char *[]){"A", NULL}, (const char *[]){"B", NULL});
    mg_node(m, "Exp", "", (const char *[]){"B", NULL}, (const char *[]){"C", NULL});
    mg_node(m, "Add", "", (const char *[]){"A", "C", NULL}, (const char *[]){"Y", NULL});
    mg_node(m, "Shape", "", (const char *[]){"A", NULL}, (const char *[]){"S", NULL});
    mg_node(m, "If", "", (const char *[]){"cond", NULL}, (const char *[]){"Z", NULL});
    for (int b = 0; b < 2; b++) {
        mg_model *br = mg_new(13);
        mg_node(br, "Identity", "", (const char *[]){"A", NULL}, (const char *[]){b ? "Zt" : "Ze", NULL});
        mg_output(br, b ? "Zt" : "Ze");
        mg_attr_graph(m, b ? "then_branch" : "else_branch", br);
    }
    mg_node(m, "Mul", "", (const char *[]){"X", "W", NULL}, (const char *[]){"M", NULL});
    mg_output(m, "Y");
    mg_output(m, "S");
    mg_output(m, "Z");
    mg_output(m, "M");
    unsigned char *buf = mg_serialize(m, len);
    mg_free(m);
    return buf;
}

static const kiln_node *find(const kiln_graph *g, const char *op_type, int nth)
{
    for (int k = 0; k < g->n_nodes; k++)
        if (!strcmp(g->nodes[k]->op_type, op_type) && nth-- == 0) return g->nodes[k];
    return NULL;
}

static int count(const kiln_graph *g, const char *op_type)
{
    int c = 0;
    for (int k = 0; k < g->n_nodes; k++) c += !strcmp(g->nodes[k]->op_type, op_type);
    return c;
}

int main(void)
{
    size_t len;
    unsigned char *buf = model(&len);
    kiln_model *m = NULL;
    kiln_err err = {0};
    CHECK(kiln_onnx_load(buf, len, NULL, &m, &err) == KILN_OK);
    if (!m) return unit_report("test_partition");
    kiln_graph *g = m->graph;
    CHECK(kiln_bind_ops(g, true, &err) == KILN_OK);
    CHECK(kiln_graph_infer(g, NULL) == KILN_OK);
    int n_dev = 0, n_host = 0, n_fallback = 0;
    CHECK(kiln_partition(g, &fake, NULL, &n_dev, &n_host, &n_fallback, &err) == KILN_OK);
    CHECK(n_dev == 3 && n_host == 4);
    CHECK(n_fallback == 3); /* Neg, If and Mul compute tensor data on the host; Shape does not */
    const kiln_node *neg = find(g, "Neg", 0), *shape = find(g, "Shape", 0), *iff = find(g, "If", 0);
    CHECK(neg && !neg->on_device && neg->placement_note && strstr(neg->placement_note, "no fake kernel for Neg"));
    CHECK(shape && !shape->on_device && strstr(shape->placement_note, "reads only"));
    CHECK(iff && !iff->on_device && strstr(iff->placement_note, "control flow"));
    kiln_select_kernels(g, kiln_provider_find(KILN_PROVIDER_CPU), NULL, &fake, NULL);
    int n0 = g->n_nodes;
    CHECK(kiln_insert_copies(g, &fake, &err) == KILN_OK);

    /* X to the device for Relu, X and cond to the host for Mul and If (a graph input may come
     * in either memory), A to the host for Neg and the If's branches (one copy), B to the device
     * for Exp; none for Shape, for A read by Add on the device, for the constant W */
    CHECK(count(g, "MemcpyToDevice") == 2);
    CHECK(count(g, "MemcpyToHost") == 3);
    CHECK(g->n_nodes == n0 + 5);
    const kiln_node *relu = find(g, "Relu", 0), *exp_ = find(g, "Exp", 0), *add = find(g, "Add", 0);
    const kiln_node *mul = find(g, "Mul", 0);
    neg = find(g, "Neg", 0), shape = find(g, "Shape", 0), iff = find(g, "If", 0);
    CHECK(relu->in[0]->producer && !strcmp(relu->in[0]->producer->op_type, "MemcpyToDevice"));
    CHECK(relu->in[0]->producer->index < relu->index && relu->in[0]->producer->on_device);
    CHECK(!strcmp(relu->in[0]->producer->in[0]->name, "X"));
    CHECK(mul->in[0]->producer && !strcmp(mul->in[0]->producer->op_type, "MemcpyToHost"));
    CHECK(!strcmp(mul->in[1]->name, "W"));
    CHECK(neg->in[0]->producer && !strcmp(neg->in[0]->producer->op_type, "MemcpyToHost"));
    CHECK(!neg->in[0]->producer->on_device && neg->in[0]->producer->index < neg->index);
    CHECK(exp_->in[0]->producer && !strcmp(exp_->in[0]->producer->op_type, "MemcpyToDevice"));
    CHECK(!strcmp(add->in[0]->name, "A") && add->in[1] == exp_->out[0]);
    CHECK(!strcmp(shape->in[0]->name, "A"));
    CHECK(iff->in[0]->producer && !strcmp(iff->in[0]->producer->op_type, "MemcpyToHost"));
    const kiln_ir_value *a_host = neg->in[0];
    for (int b = 0; b < 2; b++) {
        const kiln_graph *br = kiln_attr_graph_at(&iff->attrs[b], 0);
        CHECK(br->n_nodes == 1 && br->nodes[0]->in[0] == a_host);
        CHECK(br->n_captures == 1 && br->captures[0] == a_host);
    }
    /* node order is topological and every produced value is released once, after its last reader */
    int released[64] = {0};
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        CHECK(n->index == k);
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] && n->in[i]->producer) CHECK(n->in[i]->producer->index < k);
        for (int r = 0; r < n->n_release; r++) {
            CHECK(n->release[r]->id < 64 && n->release[r]->last_use == k);
            if (n->release[r]->id < 64) released[n->release[r]->id]++;
        }
    }
    for (int i = 0; i < g->n_values && i < 64; i++) CHECK(released[i] <= 1);
    CHECK(released[a_host->id] == 1);

    /* a second pass finds nothing to copy */
    n0 = g->n_nodes;
    CHECK(kiln_insert_copies(g, &fake, &err) == KILN_OK);
    CHECK(g->n_nodes == n0);
    kiln_model_free(m);
    free(buf);
    return unit_report("test_partition");
}
