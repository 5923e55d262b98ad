/* shape.c - Shape and layout ops: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Split, Slice, Expand, Tile, Pad, Shape, Size, ConstantOfShape, Range, DepthToSpace, SpaceToDepth, CenterCropPad, Trilu, EyeLike. */
#include "ops/op.h"
#include "ops/util.h"

static const kiln_op_def defs[] = {
    {NULL, NULL, 0, NULL, NULL},
};

const kiln_op_table kiln_ops_shape = {defs, 0};
