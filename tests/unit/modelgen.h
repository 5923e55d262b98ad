/* modelgen.h - builds small ONNX models in C (through the generated protobuf-c code) for the
 * unit tests, so that loader and API tests need no Python. */
#ifndef KILN_TEST_MODELGEN_H
#define KILN_TEST_MODELGEN_H

#include <stddef.h>
#include <stdint.h>

typedef struct mg_model mg_model;

mg_model *mg_new(int opset);
/* dims: rank entries; an entry < 0 takes its name from dim_names[i] (NULL or "" = unnamed) */
void mg_input(mg_model *m, const char *name, int dtype, int rank, const int64_t *dims, const char *const *dim_names);
void mg_output(mg_model *m, const char *name);
/* node with up to 8 inputs and outputs (NULL-terminated lists) */
void mg_node(mg_model *m, const char *op, const char *domain, const char *const *in, const char *const *out);
/* float initializer; with location != NULL it is stored as external data at that path
 * (relative to the model's folder) with the given offset */
void mg_init_float(mg_model *m, const char *name, int rank, const int64_t *dims, const float *data,
                   const char *location, int64_t offset);
/* initializer of ONNX element type dtype, esize bytes an element, stored as raw_data */
void mg_init_raw(mg_model *m, const char *name, int dtype, size_t esize, int rank, const int64_t *dims, const void *data);
/* Attributes of the last node added. */
void mg_attr_int(mg_model *m, const char *name, int64_t v);
void mg_attr_float(mg_model *m, const char *name, float v);
void mg_attr_string(mg_model *m, const char *name, const char *v);
void mg_attr_ints(mg_model *m, const char *name, int n, const int64_t *v);
void mg_attr_floats(mg_model *m, const char *name, int n, const float *v);
/* Moves body's graph into a graph attribute of the last node; body is freed. */
void mg_attr_graph(mg_model *m, const char *name, mg_model *body);
/* The underlying ModelProto (an Onnx__ModelProto *), for tests that corrupt fields by hand.
 * Anything attached to its nodes, inputs, outputs or initializers must be malloc'd: mg_free
 * releases those parts with protobuf-c's walker. */
void *mg_proto(mg_model *m);
/* Serializes; the buffer is malloc'd, caller frees. */
unsigned char *mg_serialize(mg_model *m, size_t *len);
void mg_free(mg_model *m);

#endif
