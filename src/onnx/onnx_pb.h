/* onnx_pb.h - protobuf-level helpers shared inside src/onnx only (nothing else sees protobuf). */
#ifndef KILN_ONNX_PB_H
#define KILN_ONNX_PB_H

#include "core/error.h"
#include "core/value.h"
#include "onnx.pb-c.h"
#include "onnx/external.h"

/* Where external data of tensors resolves. */
typedef struct kiln_tensor_source {
    const char *base_dir;  /* model folder, NULL forbids external data */
    kiln_mapping **maps;   /* mappings list to reuse / extend; NULL forbids external data */
    bool borrow_raw;       /* the parsed proto outlives the values: raw_data may be borrowed */
} kiln_tensor_source;

/* Converts a TensorProto into a new value (owned by the caller). Data of external tensors
 * points into the mapping, and with src->borrow_raw data of raw_data tensors points into the
 * proto, when the layout allows (zero-copy; owns_data false). */
kiln_status kiln_onnx_tensor(const Onnx__TensorProto *tp, const kiln_tensor_source *src,
                             kiln_value **out, kiln_err *err);

#endif
