/* kshape.c - shapes and strides for the GPU kernels' arguments. */
#include "gpu/kshape.h"

void kiln_gpu_shape_contiguous(kiln_gpu_shape *s, int rank, const int64_t *dims)
{
    s->rank = rank;
    int64_t st = 1;
    for (int k = rank - 1; k >= 0; k--) {
        s->dims[k] = dims[k];
        s->strides[k] = st;
        st *= dims[k];
    }
}

void kiln_gpu_shape_broadcast(kiln_gpu_shape *s, int out_rank, const int64_t *out_dims, int rank,
                              const int64_t *dims)
{
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
