/* image.c - Resize, Upsample, GridSample, AffineGrid, RoiAlign, NonMaxSuppression, DFT, STFT, window functions, MelWeightMatrix. */
#include "ops/op.h"
#include "ops/util.h"

static const kiln_op_def defs[] = {
    {NULL, NULL, 0, NULL, NULL},
};

const kiln_op_table kiln_ops_image = {defs, 0};
