/* modelgen.c - small ONNX models built with protobuf-c for tests. */
#include "modelgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"

struct mg_model {
    Onnx__ModelProto model;
    Onnx__GraphProto graph;
    Onnx__OperatorSetIdProto opset;
    Onnx__OperatorSetIdProto *opsets[1];
};

static void *grow(void *arr, size_t n, size_t size)
{
    return realloc(arr, (n + 1) * size);
}

mg_model *mg_new(int opset)
{
    mg_model *m = calloc(1, sizeof *m);
    onnx__model_proto__init(&m->model);
    onnx__graph_proto__init(&m->graph);
    onnx__operator_set_id_proto__init(&m->opset);
    m->model.has_ir_version = 1;
    m->model.ir_version = 8;
    m->opset.has_version = 1;
    m->opset.version = opset;
    m->opset.domain = strdup("");
    m->opsets[0] = &m->opset;
    m->model.n_opset_import = 1;
    m->model.opset_import = m->opsets;
    m->model.graph = &m->graph;
    m->graph.name = strdup("g");
    return m;
}

void mg_input(mg_model *m, const char *name, int dtype, int rank, const int64_t *dims, const char *const *dim_names)
{
    Onnx__ValueInfoProto *vi = calloc(1, sizeof *vi);
    onnx__value_info_proto__init(vi);
    vi->name = strdup(name);
    Onnx__TypeProto *tp = calloc(1, sizeof *tp);
    onnx__type_proto__init(tp);
    Onnx__TypeProto__Tensor *tt = calloc(1, sizeof *tt);
    onnx__type_proto__tensor__init(tt);
    tt->has_elem_type = 1;
    tt->elem_type = dtype;
    Onnx__TensorShapeProto *sp = calloc(1, sizeof *sp);
    onnx__tensor_shape_proto__init(sp);
    sp->n_dim = (size_t)rank;
    sp->dim = calloc((size_t)rank + 1, sizeof *sp->dim);
    for (int i = 0; i < rank; i++) {
        Onnx__TensorShapeProto__Dimension *d = calloc(1, sizeof *d);
        onnx__tensor_shape_proto__dimension__init(d);
        if (dims[i] >= 0) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = dims[i];
        } else if (dim_names && dim_names[i] && *dim_names[i]) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d->dim_param = strdup(dim_names[i]);
        }
        sp->dim[i] = d;
    }
    tt->shape = sp;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    vi->type = tp;
    m->graph.input = grow(m->graph.input, m->graph.n_input, sizeof *m->graph.input);
    m->graph.input[m->graph.n_input++] = vi;
}

void mg_output(mg_model *m, const char *name)
{
    Onnx__ValueInfoProto *vi = calloc(1, sizeof *vi);
    onnx__value_info_proto__init(vi);
    vi->name = strdup(name);
    m->graph.output = grow(m->graph.output, m->graph.n_output, sizeof *m->graph.output);
    m->graph.output[m->graph.n_output++] = vi;
}

static char **str_list(const char *const *s, size_t *n)
{
    *n = 0;
    while (s && s[*n]) (*n)++;
    char **out = calloc(*n + 1, sizeof *out);
    for (size_t i = 0; i < *n; i++) out[i] = strdup(s[i]);
    return out;
}

void mg_node(mg_model *m, const char *op, const char *domain, const char *const *in, const char *const *out)
{
    Onnx__NodeProto *n = calloc(1, sizeof *n);
    onnx__node_proto__init(n);
    n->op_type = strdup(op);
    n->domain = strdup(domain ? domain : "");
    n->name = strdup(op);
    n->input = str_list(in, &n->n_input);
    n->output = str_list(out, &n->n_output);
    m->graph.node = grow(m->graph.node, m->graph.n_node, sizeof *m->graph.node);
    m->graph.node[m->graph.n_node++] = n;
}

static Onnx__StringStringEntryProto *entry(const char *k, const char *v)
{
    Onnx__StringStringEntryProto *e = calloc(1, sizeof *e);
    onnx__string_string_entry_proto__init(e);
    e->key = strdup(k);
    e->value = strdup(v);
    return e;
}

/* A new initializer of m (appended): name, element type and dims set; *n its element count. */
static Onnx__TensorProto *new_init(mg_model *m, const char *name, int dtype, int rank, const int64_t *dims, int64_t *n)
{
    Onnx__TensorProto *t = calloc(1, sizeof *t);
    onnx__tensor_proto__init(t);
    t->name = strdup(name);
    t->has_data_type = 1;
    t->data_type = dtype;
    t->n_dims = (size_t)rank;
    t->dims = calloc((size_t)rank + 1, sizeof *t->dims);
    *n = 1;
    for (int i = 0; i < rank; i++) {
        t->dims[i] = dims[i];
        *n *= dims[i];
    }
    m->graph.initializer = grow(m->graph.initializer, m->graph.n_initializer, sizeof *m->graph.initializer);
    m->graph.initializer[m->graph.n_initializer++] = t;
    return t;
}

void mg_init_float(mg_model *m, const char *name, int rank, const int64_t *dims, const float *data,
                   const char *location, int64_t offset)
{
    int64_t n;
    Onnx__TensorProto *t = new_init(m, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, rank, dims, &n);
    if (location) {
        char buf[32];
        t->has_data_location = 1;
        t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
        t->n_external_data = 3;
        t->external_data = calloc(3, sizeof *t->external_data);
        t->external_data[0] = entry("location", location);
        snprintf(buf, sizeof buf, "%lld", (long long)offset);
        t->external_data[1] = entry("offset", buf);
        snprintf(buf, sizeof buf, "%lld", (long long)(n * 4));
        t->external_data[2] = entry("length", buf);
    } else {
        t->n_float_data = (size_t)n;
        t->float_data = malloc((size_t)n * sizeof(float) + 1);
        memcpy(t->float_data, data, (size_t)n * sizeof(float));
    }
}

void mg_init_raw(mg_model *m, const char *name, int dtype, size_t esize, int rank, const int64_t *dims, const void *data)
{
    int64_t n;
    Onnx__TensorProto *t = new_init(m, name, dtype, rank, dims, &n);
    t->has_raw_data = 1;
    t->raw_data.len = (size_t)n * esize;
    t->raw_data.data = malloc(t->raw_data.len + 1);
    memcpy(t->raw_data.data, data, t->raw_data.len);
}

static Onnx__AttributeProto *new_attr(mg_model *m, const char *name, Onnx__AttributeProto__AttributeType type)
{
    Onnx__NodeProto *n = m->graph.node[m->graph.n_node - 1];
    Onnx__AttributeProto *a = calloc(1, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = strdup(name);
    a->has_type = 1;
    a->type = type;
    n->attribute = grow(n->attribute, n->n_attribute, sizeof *n->attribute);
    n->attribute[n->n_attribute++] = a;
    return a;
}

void mg_attr_int(mg_model *m, const char *name, int64_t v)
{
    Onnx__AttributeProto *a = new_attr(m, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    a->has_i = 1;
    a->i = v;
}

void mg_attr_float(mg_model *m, const char *name, float v)
{
    Onnx__AttributeProto *a = new_attr(m, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    a->has_f = 1;
    a->f = v;
}

void mg_attr_string(mg_model *m, const char *name, const char *v)
{
    Onnx__AttributeProto *a = new_attr(m, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
    a->has_s = 1;
    a->s.len = strlen(v);
    a->s.data = (uint8_t *)strdup(v);
}

void mg_attr_ints(mg_model *m, const char *name, int n, const int64_t *v)
{
    Onnx__AttributeProto *a = new_attr(m, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    a->n_ints = (size_t)n;
    a->ints = malloc((size_t)n * sizeof *v + 1);
    memcpy(a->ints, v, (size_t)n * sizeof *v);
}

void mg_attr_floats(mg_model *m, const char *name, int n, const float *v)
{
    Onnx__AttributeProto *a = new_attr(m, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS);
    a->n_floats = (size_t)n;
    a->floats = malloc((size_t)n * sizeof *v + 1);
    memcpy(a->floats, v, (size_t)n * sizeof *v);
}

void mg_attr_graph(mg_model *m, const char *name, mg_model *body)
{
    Onnx__AttributeProto *a = new_attr(m, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH);
    a->g = malloc(sizeof *a->g);
    *a->g = body->graph;  /* the parts move with it: freed with the node that now holds them */
    free(body->opset.domain);
    free(body);
}

void *mg_proto(mg_model *m)
{
    return &m->model;
}

unsigned char *mg_serialize(mg_model *m, size_t *len)
{
    *len = onnx__model_proto__get_packed_size(&m->model);
    unsigned char *buf = malloc(*len + 1);
    onnx__model_proto__pack(&m->model, buf);
    return buf;
}

void mg_free(mg_model *m)
{
    /* the graph's parts were allocated piecewise; free them through protobuf-c's own walker
     * after detaching the statically embedded messages */
    Onnx__GraphProto *g = &m->graph;
    for (size_t i = 0; i < g->n_node; i++) onnx__node_proto__free_unpacked(g->node[i], NULL);
    for (size_t i = 0; i < g->n_input; i++) onnx__value_info_proto__free_unpacked(g->input[i], NULL);
    for (size_t i = 0; i < g->n_output; i++) onnx__value_info_proto__free_unpacked(g->output[i], NULL);
    for (size_t i = 0; i < g->n_initializer; i++) onnx__tensor_proto__free_unpacked(g->initializer[i], NULL);
    free(g->node);
    free(g->input);
    free(g->output);
    free(g->initializer);
    free(g->name);
    free(m->opset.domain);
    free(m);
}
