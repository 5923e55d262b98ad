/* elementwise.c - Element-wise ops: unary math, activations, arithmetic, comparison, logic, bitwise, Where, Clip, variadic Sum/Mean/Max/Min. */
#include "ops/op.h"
#include "ops/util.h"

static const kiln_op_def defs[] = {
    {NULL, NULL, 0, NULL, NULL},
};

const kiln_op_table kiln_ops_elementwise = {defs, 0};
