/* load.h - ONNX model bytes to kiln IR. The only entry point into the ONNX file format. */
#ifndef KILN_ONNX_LOAD_H
#define KILN_ONNX_LOAD_H

#include <stddef.h>

#include "core/error.h"
#include "ir/graph.h"

/* Parses a serialized ModelProto into a new model (owned by the caller, release with
 * kiln_model_free). Model-local functions are inlined. External data resolves relative to
 * base_dir (NULL forbids it). Node ops are not looked up here. */
kiln_status kiln_onnx_load(const void *buf, size_t len, const char *base_dir, kiln_model **out,
                           kiln_err *err);
/* Reads and parses a model file; external data resolves relative to its folder. */
kiln_status kiln_onnx_load_file(const char *path, kiln_model **out, kiln_err *err);

#endif
