/* index.c - Indexing ops: Gather*, Scatter*, OneHot, Compress, NonZero, Unique, TopK, ArgMax/ArgMin, ReverseSequence, Col2Im, TensorScatter. */
#include "ops/op.h"
#include "ops/util.h"

static const kiln_op_def defs[] = {
    {NULL, NULL, 0, NULL, NULL},
};

const kiln_op_table kiln_ops_index = {defs, 0};
