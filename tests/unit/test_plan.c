/* test_plan.c - the memory planner (src/exec/plan.c) on a model with a symbolic batch: at
 * several bindings, every planned tensor gets its evaluated byte size, tensors whose lifetimes
 * overlap never share bytes (except an in-place output with the input it reuses), in-place
 * reuse happens only where the op allows it and the input dies there, the lower bound is at
 * most the arena, and the plan cache hands back the same plan for the same binding. */
#include <stdlib.h>
#include <string.h>

#include "modelgen.h"
#include "exec/plan.h"
#include "onnx/load.h"
#include "ops/eval.h"
#include "ops/op.h"
#include "unit.h"

enum { FLOAT = 1 };

/* X [n, 8] -> Relu (in place) -> MatMul W [8, 16] -> Sigmoid (in place) -> Add(., r) ->
 * Transpose -> Relu -> Y, plus a side branch t = Exp(X) read by the Add's input. */
static unsigned char *build(size_t *len)
{
    mg_model *m = mg_new(13);
    int64_t x[2] = {-1, 8}, w[2] = {8, 16};
    const char *names[] = {"n", NULL};
    mg_input(m, "X", FLOAT, 2, x, names);
    float wv[8 * 16];
    for (int i = 0; i < 8 * 16; i++) wv[i] = (float)(i % 7) * 0.1f;
    mg_init_float(m, "W", 2, w, wv, NULL, 0);
    mg_node(m, "Relu", "", (const char *[]){"X", NULL}, (const char *[]){"a", NULL});
    mg_node(m, "Exp", "", (const char *[]){"a", NULL}, (const char *[]){"e", NULL});
    mg_node(m, "MatMul", "", (const char *[]){"e", "W", NULL}, (const char *[]){"b", NULL});
    mg_node(m, "Sigmoid", "", (const char *[]){"b", NULL}, (const char *[]){"c", NULL});
    mg_node(m, "MatMul", "", (const char *[]){"a", "W", NULL}, (const char *[]){"r", NULL});
    mg_node(m, "Add", "", (const char *[]){"c", "r", NULL}, (const char *[]){"d", NULL});
    mg_node(m, "Transpose", "", (const char *[]){"d", NULL}, (const char *[]){"t", NULL});
    mg_node(m, "Relu", "", (const char *[]){"t", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    unsigned char *buf = mg_serialize(m, len);
    mg_free(m);
    return buf;
}

static int cand_of(const kiln_memprog *mp, int value_id)
{
    for (int j = 0; j < mp->n; j++)
        if (mp->value_id[j] == value_id) return j;
    return -1;
}

static void check_plan(const kiln_graph *g, const kiln_memprog *mp, const kiln_plan *p, int64_t n)
{
    CHECK(p->lower_bound <= p->peak && p->lower_bound > 0);
    for (int j = 0; j < mp->n; j++) {
        int id = mp->value_id[j];
        int64_t numel;
        CHECK(kiln_dim_eval(mp->numel[j], &n, 1, &numel));
        size_t bytes = (size_t)numel * mp->elem_size[j];
        CHECK(p->offset[id] != SIZE_MAX && p->size[id] >= bytes && p->size[id] < bytes + KILN_ARENA_ALIGN);
        CHECK(p->offset[id] % KILN_ARENA_ALIGN == 0 && p->offset[id] + p->size[id] <= p->peak);
        /* in place only where the planner's rule allows it */
        if (p->in_place[id]) {
            const kiln_node *nd = g->values[id]->producer;
            int i = nd ? cand_of(mp, nd->in[0]->id) : -1;
            CHECK(mp->share[j] >= 0 && nd && (nd->op->flags & KILN_OP_INPLACE) && i >= 0 && mp->last[i] == nd->index);
            CHECK(i >= 0 && p->offset[mp->value_id[i]] == p->offset[id]);
        }
        for (int k = j + 1; k < mp->n; k++) {
            int id2 = mp->value_id[k];
            bool overlap_time = mp->first[j] <= mp->last[k] && mp->first[k] <= mp->last[j];
            bool same_buffer = (mp->share[j] >= 0 ? mp->share[j] : j) == (mp->share[k] >= 0 ? mp->share[k] : k);
            bool overlap_bytes = p->offset[id] < p->offset[id2] + p->size[id2] && p->offset[id2] < p->offset[id] + p->size[id];
            if (overlap_time && !same_buffer) CHECK(!overlap_bytes);
        }
    }
}

int main(void)
{
    size_t len;
    unsigned char *buf = build(&len);
    kiln_model *m = NULL;
    kiln_err err = {0};
    CHECK(kiln_onnx_load(buf, len, NULL, &m, &err) == KILN_OK);
    CHECK(m && kiln_bind_ops(m->graph, true, &err) == KILN_OK && kiln_graph_infer(m->graph, NULL) == KILN_OK);
    CHECK(m && kiln_graph_plan_releases(m->graph, &err) == KILN_OK);
    kiln_memprog mp;
    CHECK(m && kiln_memprog_build(m->graph, false, &mp, &err) == KILN_OK);
    if (m) {
        const kiln_graph *g = m->graph;
        CHECK(mp.n == 7); /* every intermediate, not the output Y */
        int shared = 0;
        for (int j = 0; j < mp.n; j++) shared += mp.share[j] >= 0;
        CHECK(shared >= 1); /* Sigmoid over b, b's last reader */
        /* Relu over X: a graph input is not planned, so no reuse of it */
        int a = -1;
        for (int i = 0; i < g->n_values; i++)
            if (!strcmp(g->values[i]->name, "a")) a = cand_of(&mp, i);
        CHECK(a >= 0 && mp.share[a] < 0);
        kiln_plan_cache pc;
        kiln_plan_cache_init(&pc, 2);
        int64_t bindings[] = {1, 7, 64, 7};
        kiln_plan *first7 = NULL;
        CHECK(kiln_dimtab_sym_count(m->dims) == 1);
        for (int b = 0; b < 4; b++) {
            kiln_plan *p = NULL;
            CHECK(kiln_plan_cache_get(&pc, &mp, &bindings[b], 1, &p, &err) == KILN_OK && p);
            if (!p) continue;
            check_plan(g, &mp, p, bindings[b]);
            if (b == 1) first7 = p;
            if (b == 3) CHECK(p == first7 && pc.hits == 1);
            kiln_plan_cache_put(&pc, p);
        }
        kiln_plan_cache_release(&pc);
        kiln_memprog_release(&mp);
    }
    kiln_model_free(m);
    free(buf);
    return unit_report("test_plan");
}
