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
    /* the reference's rule (kiln_bcast_strides) but stride 0 on every dim of size 1 in the
     * operand, also where the output's is 1 too: the same elements are read, and the kernels
     * classify operands (scalar, contiguous, broadcast rows) and merge dims by zero strides */
    s->rank = out_rank;
    int64_t st = 1;
    for (int k = out_rank - 1; k >= 0; k--) {
        int j = k - (out_rank - rank);
        s->dims[k] = out_dims[k];
        int64_t d = j >= 0 ? dims[j] : 1;
        s->strides[k] = d == 1 ? 0 : st;
        st *= d;
    }
}
