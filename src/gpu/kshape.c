/* kshape.c - shapes and strides for the GPU kernels' arguments (the broadcast rule is the
 * reference's, ops/semantics.h). */
#include "gpu/kshape.h"

#include <string.h>

#include "ops/semantics.h"
#include "ops/util.h"

void kiln_gpu_shape_contiguous(kiln_gpu_shape *s, int rank, const int64_t *dims)
{
    s->rank = rank;
    if (rank) memcpy(s->dims, dims, (size_t)rank * sizeof *dims);
    kiln_strides(rank, dims, s->strides);
}

void kiln_gpu_shape_broadcast(kiln_gpu_shape *s, int out_rank, const int64_t *out_dims, int rank,
                              const int64_t *dims)
{
    s->rank = out_rank;
    if (out_rank) memcpy(s->dims, out_dims, (size_t)out_rank * sizeof *out_dims);
    kiln_bcast_strides(out_rank, out_dims, rank, dims, s->strides);
}
