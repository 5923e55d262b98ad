/* kshape.h - what the C side of the GPU provider passes to kernel launchers (plain C, included
 * by ops_*.c and k_*.cu alike): dtype codes are kiln_dtype values (kiln.h), shapes travel by
 * value in kiln_gpu_shape. */
#ifndef KILN_GPU_KSHAPE_H
#define KILN_GPU_KSHAPE_H

#include <stdint.h>

#include "kiln.h"

/* Highest rank the GPU kernels take (ops check it in `supports` or fail at run time). */
#define KILN_GPU_MAX_RANK 8

/* A shape with per-dim element strides (0 for a broadcast dim), passed to kernels by value. */
typedef struct kiln_gpu_shape {
    int rank;
    int64_t dims[KILN_GPU_MAX_RANK];
    int64_t strides[KILN_GPU_MAX_RANK];
} kiln_gpu_shape;

#ifdef __cplusplus
extern "C" {
#endif
/* Contiguous strides of dims (rank <= KILN_GPU_MAX_RANK). */
void kiln_gpu_shape_contiguous(kiln_gpu_shape *s, int rank, const int64_t *dims);
/* Strides of a tensor of (rank, dims) broadcast (numpy rules, right-aligned) to out_rank
 * dims out_dims (kiln_bcast_strides): 0 where the tensor's dim is missing or is 1 against a
 * larger one (along an output dim of 1 the stride is never used). */
void kiln_gpu_shape_broadcast(kiln_gpu_shape *s, int out_rank, const int64_t *out_dims, int rank,
                              const int64_t *dims);
#ifdef __cplusplus
}
#endif

#endif
