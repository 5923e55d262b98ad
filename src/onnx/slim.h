/* slim.h - parsing a model file without copying its weights (slim.c). */
#ifndef KILN_ONNX_SLIM_H
#define KILN_ONNX_SLIM_H

#include <stdbool.h>
#include <stddef.h>

/* Where the raw_data bytes of one main-graph initializer are in the original buffer. */
typedef struct kiln_raw_cut {
    size_t initializer; /* index in GraphProto.initializer */
    size_t offset, len;
} kiln_raw_cut;

/* *slim receives a copy of the serialized ModelProto buf without the raw_data fields of at
 * least min_bytes of the main graph's initializers (malloc'd, as is *cuts, which says where
 * each one was). Returns false, allocating nothing, when there is none or when the wire format
 * is not the plain kind handled (the caller then parses buf as it is; a malformed buf fails
 * there with the parser's message). */
bool kiln_onnx_slim(const unsigned char *buf, size_t len, size_t min_bytes, unsigned char **slim, size_t *slim_len,
                    kiln_raw_cut **cuts, size_t *n_cuts);

#endif
