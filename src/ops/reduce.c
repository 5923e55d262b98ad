/* reduce.c - Reductions, softmax family, normalizations, cumulative ops, losses, Dropout, Det. */
#include "ops/op.h"
#include "ops/util.h"

static const kiln_op_def defs[] = {
    {NULL, NULL, 0, NULL, NULL},
};

const kiln_op_table kiln_ops_reduce = {defs, 0};
