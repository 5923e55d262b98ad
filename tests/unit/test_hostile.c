/* test_hostile.c - hostile models: truncated files, wrong wire types, bad dims, cycles, missing
 * values, unknown opsets and domains, wrongly typed attributes, huge fan-in, deep nesting. Each
 * must give a clean error (status and message) or a working session, never a crash; sessions
 * created afterwards keep working. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "modelgen.h"
#include "onnx.pb-c.h"
#include "unit.h"

enum { FLOAT = 1, INT64 = 7 };

/* X [N, 3] float -> Relu -> Y */
static mg_model *relu_model(int opset)
{
    mg_model *m = mg_new(opset);
    int64_t dims[2] = {-1, 3};
    const char *names[2] = {"N", NULL};
    mg_input(m, "X", FLOAT, 2, dims, names);
    mg_node(m, "Relu", "", (const char *[]){"X", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    return m;
}

static unsigned char *finish(mg_model *m, size_t *len)
{
    unsigned char *buf = mg_serialize(m, len);
    mg_free(m);
    return buf;
}

/* Runs s once with X = [2, 3] floats (-1 .. 4) when it has an input X; returns the status. */
static kiln_status run_x(kiln_session *s, float *y0)
{
    int64_t dims[2] = {2, 3};
    float x[6] = {-1, 0, 1, 2, 3, 4};
    kiln_value *in = NULL, *out[8] = {0};
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, dims, x, sizeof x, &in);
    const char *in_names[] = {"X"};
    int n_out = kiln_session_output_count(s);
    const char *out_names[8];
    if (n_out > 8) n_out = 8;
    for (int j = 0; j < n_out; j++) {
        kiln_io_info info;
        kiln_session_output_info(s, j, &info);
        out_names[j] = info.name;
    }
    kiln_status st = kiln_session_run(s, 1, in_names, (const kiln_value *const *)&in, n_out, out_names, out);
    if (st == KILN_OK && y0 && n_out > 0 && kiln_value_kind_of(out[0]) == KILN_VALUE_TENSOR &&
        kiln_value_numel(out[0]) > 0 && kiln_value_dtype(out[0]) == KILN_DTYPE_FLOAT32)
        *y0 = ((const float *)kiln_value_data(out[0]))[kiln_value_numel(out[0]) - 1];
    for (int j = 0; j < n_out; j++) kiln_value_free(out[j]);
    kiln_value_free(in);
    return st;
}

/* A fresh valid session still loads and runs. */
static void check_still_works(void)
{
    size_t len;
    unsigned char *buf = finish(relu_model(13), &len);
    kiln_session *s = NULL;
    CHECK(kiln_session_create_from_memory(buf, len, NULL, NULL, &s) == KILN_OK);
    float y = 0;
    CHECK(run_x(s, &y) == KILN_OK);
    CHECK(y == 4.0f);
    kiln_session_free(s);
    free(buf);
}

/* Creation must fail cleanly with a message; returns the status. */
static kiln_status expect_error(const void *buf, size_t len, bool allow_unsupported, const char *what)
{
    kiln_session_options opt = kiln_session_options_default();
    opt.allow_unsupported = allow_unsupported;
    kiln_session *s = NULL;
    kiln_status st = kiln_session_create_from_memory(buf, len, NULL, &opt, &s);
    if (st == KILN_OK) {
        fprintf(stderr, "%s: created a session, expected an error\n", what);
        CHECK(st != KILN_OK);
    } else {
        CHECK(s == NULL || strlen(kiln_last_error(s)) > 0);
        printf("%s: %s: %s\n", what, kiln_status_name(st), kiln_last_error(s));
    }
    kiln_session_free(s);
    check_still_works();
    return st;
}

/* Whatever creation says, nothing crashes; a created session answers its info calls and a run
 * either works or fails with a message. Returns the creation status. */
static kiln_status survive(const void *buf, size_t len)
{
    kiln_session *s = NULL;
    kiln_status st = kiln_session_create_from_memory(buf, len, NULL, NULL, &s);
    if (st == KILN_OK) {
        kiln_io_info info;
        for (int i = 0; i < kiln_session_input_count(s); i++) kiln_session_input_info(s, i, &info);
        if (run_x(s, NULL) != KILN_OK) CHECK(strlen(kiln_last_error(s)) > 0);
    } else {
        CHECK(s == NULL || strlen(kiln_last_error(s)) > 0);
    }
    kiln_session_free(s);
    return st;
}

static void test_truncated(void)
{
    size_t len;
    unsigned char *buf = finish(relu_model(13), &len);
    int errors = 0;
    for (size_t n = 0; n < len; n++)
        if (survive(buf, n) != KILN_OK) errors++;
    CHECK(errors > 0);
    CHECK(expect_error(buf, 0, false, "empty file") != KILN_OK);
    CHECK(expect_error(buf, len - 1, false, "last byte cut") != KILN_OK);
    free(buf);
}

/* Every byte of the file with each of the 8 wire-type values in its low 3 bits. */
static void test_wire_types(void)
{
    size_t len;
    unsigned char *buf = finish(relu_model(13), &len);
    unsigned char *copy = malloc(len);
    for (size_t i = 0; i < len; i++)
        for (int wt = 0; wt < 8; wt++) {
            memcpy(copy, buf, len);
            copy[i] = (unsigned char)((copy[i] & ~7) | wt);
            survive(copy, len);
        }
    /* the graph field (7, length-delimited) declared as a varint: not a model */
    memcpy(copy, buf, len);
    for (size_t i = 0; i < len; i++)
        if (copy[i] == 0x3a) {
            copy[i] = 0x38;
            break;
        }
    survive(copy, len);
    free(copy);
    free(buf);
    check_still_works();
}

/* An initializer W with the given dims (and 6 floats of data) added to X -> Add -> Y. */
static unsigned char *init_dims_model(int rank, const int64_t *dims, size_t *len)
{
    mg_model *m = mg_new(13);
    int64_t xd[2] = {2, 3};
    mg_input(m, "X", FLOAT, 2, xd, NULL);
    float w[6] = {1, 2, 3, 4, 5, 6};
    int64_t ok[2] = {2, 3};
    mg_init_float(m, "W", 2, ok, w, NULL, 0);
    Onnx__ModelProto *mp = mg_proto(m);
    Onnx__TensorProto *t = mp->graph->initializer[0];
    free(t->dims);
    t->dims = calloc((size_t)rank + 1, sizeof *t->dims);
    t->n_dims = (size_t)rank;
    memcpy(t->dims, dims, (size_t)rank * sizeof *dims);
    mg_node(m, "Add", "", (const char *[]){"X", "W", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    return finish(m, len);
}

static void test_bad_tensor_dims(void)
{
    struct {
        const char *what;
        int rank;
        int64_t dims[3];
    } cases[] = {
        {"negative dim", 2, {-2, -3}},
        {"huge dims", 2, {(int64_t)1 << 40, (int64_t)1 << 40}},
        {"a terabyte declared, 24 bytes given", 2, {(int64_t)1 << 20, (int64_t)1 << 20}},
        {"product overflowing 64 bits", 3, {(int64_t)1 << 32, (int64_t)1 << 32, 16}},
        {"product wrapping to 6", 3, {(int64_t)1 << 62, 4, 6}},
        {"INT64_MAX", 1, {INT64_MAX}},
        {"data shorter than dims", 2, {2, 4}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        unsigned char *buf = init_dims_model(cases[i].rank, cases[i].dims, &len);
        CHECK(expect_error(buf, len, false, cases[i].what) == KILN_ERR_MODEL);
        free(buf);
    }
}

/* Input X (or output Y) with the given dim values, straight into the proto (mg_input only takes dims >= 0
 * or symbols). */
static void test_bad_value_info_dims(void)
{
    int64_t bad[] = {-1, -7, INT64_MIN, (int64_t)1 << 62, INT64_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int where = 0; where < 2; where++) {
            mg_model *m = relu_model(13);
            Onnx__ModelProto *mp = mg_proto(m);
            Onnx__ValueInfoProto *vi = mp->graph->input[0];
            if (where == 1) {
                /* the same type on the output's value info */
                Onnx__ValueInfoProto *out = mp->graph->output[0];
                size_t n = onnx__value_info_proto__get_packed_size(vi);
                unsigned char *tmp = malloc(n);
                onnx__value_info_proto__pack(vi, tmp);
                Onnx__ValueInfoProto *copy = onnx__value_info_proto__unpack(NULL, n, tmp);
                free(tmp);
                out->type = copy->type;
                copy->type = NULL;
                onnx__value_info_proto__free_unpacked(copy, NULL);
                vi = out;
            }
            Onnx__TensorShapeProto__Dimension *d = vi->type->tensor_type->shape->dim[0];
            free(d->dim_param);
            d->dim_param = NULL;
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = bad[i];
            size_t len;
            unsigned char *buf = finish(m, &len);
            kiln_status st = survive(buf, len);
            /* a negative dim is an unknown dim, as ONNX Runtime reads it: the model loads */
            if (bad[i] < 0) CHECK(st == KILN_OK);
            free(buf);
        }
    }
    check_still_works();
}

static void test_cycle(void)
{
    mg_model *m = mg_new(13);
    int64_t dims[1] = {3};
    mg_input(m, "X", FLOAT, 1, dims, NULL);
    mg_node(m, "Add", "", (const char *[]){"X", "B", NULL}, (const char *[]){"A", NULL});
    mg_node(m, "Relu", "", (const char *[]){"A", NULL}, (const char *[]){"B", NULL});
    mg_output(m, "B");
    size_t len;
    unsigned char *buf = finish(m, &len);
    CHECK(expect_error(buf, len, false, "cycle") == KILN_ERR_MODEL);
    free(buf);

    m = mg_new(13);
    mg_input(m, "X", FLOAT, 1, dims, NULL);
    mg_node(m, "Relu", "", (const char *[]){"Y", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    buf = finish(m, &len);
    CHECK(expect_error(buf, len, false, "self loop") == KILN_ERR_MODEL);
    free(buf);
}

static void test_missing_initializer(void)
{
    mg_model *m = relu_model(13);
    mg_node(m, "Add", "", (const char *[]){"Y", "W", NULL}, (const char *[]){"Z", NULL});
    mg_output(m, "Z");
    size_t len;
    unsigned char *buf = finish(m, &len);
    CHECK(expect_error(buf, len, false, "missing initializer") == KILN_ERR_MODEL);
    free(buf);

    m = mg_new(13);
    mg_output(m, "nowhere");
    buf = finish(m, &len);
    CHECK(expect_error(buf, len, false, "output never produced") == KILN_ERR_MODEL);
    free(buf);
}

static void test_unknown_opsets(void)
{
    size_t len;
    int64_t opsets[] = {0, -5, 9999, INT64_MAX};
    for (size_t i = 0; i < sizeof opsets / sizeof opsets[0]; i++) {
        mg_model *m = relu_model(13);
        ((Onnx__ModelProto *)mg_proto(m))->opset_import[0]->version = opsets[i];
        unsigned char *buf = finish(m, &len);
        survive(buf, len);
        free(buf);
    }
    /* an operator in a domain the model does not even import */
    mg_model *m = relu_model(13);
    mg_node(m, "Evil", "com.example.evil", (const char *[]){"Y", NULL}, (const char *[]){"Z", NULL});
    mg_output(m, "Z");
    unsigned char *buf = finish(m, &len);
    CHECK(expect_error(buf, len, false, "unknown domain") != KILN_OK);
    kiln_session_options opt = kiln_session_options_default();
    opt.allow_unsupported = true;
    kiln_session *s = NULL;
    kiln_status st = kiln_session_create_from_memory(buf, len, NULL, &opt, &s);
    if (st == KILN_OK) {
        CHECK(run_x(s, NULL) != KILN_OK);
        CHECK(strstr(kiln_last_error(s), "Evil") != NULL);
    } else {
        CHECK(strlen(kiln_last_error(s)) > 0);
    }
    kiln_session_free(s);
    free(buf);
    check_still_works();
}

/* Attributes whose type is not the one the operator reads. */
static void test_attr_wrong_type(void)
{
    const float f[3] = {0, 1, 2};
    struct {
        const char *op;
        int opset;
        const char *attr;
        bool as_floats;
    } cases[] = {
        {"Transpose", 13, "perm", true}, {"Squeeze", 11, "axes", true}, {"Unsqueeze", 11, "axes", true},
        {"ReduceSum", 11, "axes", true}, {"Softmax", 13, "axis", true}, {"Flatten", 13, "axis", true},
        {"LeakyRelu", 13, "alpha", false}, {"Gather", 13, "axis", true}, {"Concat", 13, "axis", true},
        {"Split", 13, "split", true}, {"MaxPool", 12, "kernel_shape", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mg_model *m = mg_new(cases[i].opset);
        int64_t dims[2] = {2, 3};
        mg_input(m, "X", FLOAT, 2, dims, NULL);
        if (!strcmp(cases[i].op, "Gather")) {
            mg_node(m, cases[i].op, "", (const char *[]){"X", "X", NULL}, (const char *[]){"Y", NULL});
        } else {
            mg_node(m, cases[i].op, "", (const char *[]){"X", NULL}, (const char *[]){"Y", NULL});
        }
        if (cases[i].as_floats) mg_attr_floats(m, cases[i].attr, 3, f);
        else mg_attr_int(m, cases[i].attr, 7);
        mg_output(m, "Y");
        size_t len;
        unsigned char *buf = finish(m, &len);
        survive(buf, len);
        free(buf);
    }
    check_still_works();
}

/* Sum of X listed 5000 times. */
static void test_many_inputs(void)
{
    enum { N = 5000 };
    mg_model *m = relu_model(13);
    mg_node(m, "Sum", "", (const char *[]){"Y", NULL}, (const char *[]){"S", NULL});
    Onnx__ModelProto *mp = mg_proto(m);
    Onnx__NodeProto *n = mp->graph->node[1];
    for (size_t i = 0; i < n->n_input; i++) free(n->input[i]);
    free(n->input);
    n->input = calloc(N, sizeof *n->input);
    n->n_input = N;
    for (int i = 0; i < N; i++) n->input[i] = strdup("Y");
    mp->graph->output[0]->name[0] = 'S';
    size_t len;
    unsigned char *buf = finish(m, &len);
    kiln_session *s = NULL;
    kiln_status st = kiln_session_create_from_memory(buf, len, NULL, NULL, &s);
    if (st == KILN_OK) {
        /* the reference kernel takes at most 64 inputs: a clean error naming the node */
        float y = 0;
        if (run_x(s, &y) == KILN_OK) CHECK(y == 4.0f * N);
        else CHECK(strstr(kiln_last_error(s), "Sum") != NULL);
        printf("Sum of %d inputs: %s\n", N, kiln_last_error(s));
    } else {
        CHECK(strlen(kiln_last_error(s)) > 0);
    }
    kiln_session_free(s);
    free(buf);
    check_still_works();
}

/* If nodes nested `depth` deep (each then/else branch holds the next If), Y = X at the bottom. */
static mg_model *nested_if(int depth)
{
    mg_model *inner = mg_new(13);
    mg_node(inner, "Identity", "", (const char *[]){"X", NULL}, (const char *[]){"Y0", NULL});
    mg_output(inner, "Y0");
    for (int d = 1; d <= depth; d++) {
        char out[32], prev[32];
        snprintf(out, sizeof out, "Y%d", d);
        snprintf(prev, sizeof prev, "Y%d", d - 1);
        mg_model *outer = mg_new(13);
        mg_node(outer, "If", "", (const char *[]){"C", NULL}, (const char *[]){out, NULL});
        mg_attr_graph(outer, "then_branch", inner);
        /* the else branch: an Identity of X */
        mg_model *e = mg_new(13);
        mg_node(e, "Identity", "", (const char *[]){"X", NULL}, (const char *[]){prev, NULL});
        mg_output(e, prev);
        mg_attr_graph(outer, "else_branch", e);
        mg_output(outer, out);
        inner = outer;
    }
    return inner;
}

static void test_deep_nesting(void)
{
    int depths[] = {8, 70, 200, 5000}; /* 70: past the loader's graph depth; 200: past the wire depth */
    for (size_t i = 0; i < sizeof depths / sizeof depths[0]; i++) {
        mg_model *m = nested_if(depths[i]);
        Onnx__ModelProto *mp = mg_proto(m);
        /* the top graph gets inputs X and C */
        mg_model *top = mg_new(13);
        int64_t dims[2] = {2, 3};
        mg_input(top, "X", FLOAT, 2, dims, NULL);
        mg_input(top, "C", 9, 0, NULL, NULL);
        Onnx__ModelProto *tp = mg_proto(top);
        Onnx__GraphProto *g = mp->graph;
        /* swap the nested graph's nodes and outputs into the top model */
        tp->graph->node = g->node, tp->graph->n_node = g->n_node;
        tp->graph->output = g->output, tp->graph->n_output = g->n_output;
        g->node = NULL, g->n_node = 0, g->output = NULL, g->n_output = 0;
        mg_free(m);
        size_t len;
        unsigned char *buf = finish(top, &len);
        kiln_session *s = NULL;
        kiln_status st = kiln_session_create_from_memory(buf, len, NULL, NULL, &s);
        if (st == KILN_OK) {
            int64_t xd[2] = {2, 3};
            float x[6] = {1, 2, 3, 4, 5, 6};
            bool c = true;
            kiln_value *in[2] = {0}, *out = NULL;
            kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, xd, x, sizeof x, &in[0]);
            kiln_value_wrap_tensor(KILN_DTYPE_BOOL, 0, NULL, &c, 1, &in[1]);
            kiln_io_info info;
            kiln_session_output_info(s, 0, &info);
            const char *in_names[] = {"X", "C"}, *out_names[] = {info.name};
            st = kiln_session_run(s, 2, in_names, (const kiln_value *const *)in, 1, out_names, &out);
            if (st == KILN_OK) CHECK(((const float *)kiln_value_data(out))[5] == 6.0f);
            else CHECK(strlen(kiln_last_error(s)) > 0);
            kiln_value_free(out);
            kiln_value_free(in[0]);
            kiln_value_free(in[1]);
        } else {
            CHECK(strlen(kiln_last_error(s)) > 0);
        }
        printf("If nested %d deep: %s %s\n", depths[i], kiln_status_name(st), kiln_last_error(s));
        if (depths[i] <= 8) CHECK(st == KILN_OK);
        kiln_session_free(s);
        free(buf);
    }
    check_still_works();
}

/* A node without outputs and a node missing its required input 0 (both found by fuzzing). */
static void test_arity(void)
{
    mg_model *m = relu_model(13);
    mg_node(m, "Ceil", "", (const char *[]){"Y", NULL}, (const char *[]){NULL});
    size_t len;
    unsigned char *buf = finish(m, &len);
    CHECK(expect_error(buf, len, false, "node without outputs") == KILN_ERR_MODEL);
    free(buf);
    m = relu_model(13);
    mg_node(m, "Squeeze", "", (const char *[]){"", NULL}, (const char *[]){"Z", NULL});
    mg_output(m, "Z");
    buf = finish(m, &len);
    CHECK(expect_error(buf, len, false, "absent input 0") == KILN_ERR_MODEL);
    free(buf);
}

int main(void)
{
    test_truncated();
    test_wire_types();
    test_bad_tensor_dims();
    test_bad_value_info_dims();
    test_cycle();
    test_missing_initializer();
    test_unknown_opsets();
    test_attr_wrong_type();
    test_many_inputs();
    test_deep_nesting();
    test_arity();
    return unit_report("test_hostile");
}
