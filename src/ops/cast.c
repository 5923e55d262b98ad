/* cast.c - Cast, CastLike, BitCast, quantization, string ops, ai.onnx.ml ops and random generators. */
#include "ops/op.h"
#include "ops/util.h"

static const kiln_op_def defs[] = {
    {NULL, NULL, 0, NULL, NULL},
};

const kiln_op_table kiln_ops_cast = {defs, 0};
