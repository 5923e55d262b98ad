/* k_blas.h - launchers of the 'blas' family's helper kernels (k_blas.cu); C-callable. */
#ifndef KILN_GPU_K_BLAS_H
#define KILN_GPU_K_BLAS_H

#include "gpu/kshape.h"
#include "gpu/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Y[i] = scale * C[offset of i under s.strides], i over the contiguous dims s.dims (Gemm's C
 * broadcast to [M, N]; strides 0 on broadcast dims). dtype: float32, float16 or bfloat16 (Y
 * and C alike; other dtypes launch nothing); computes in float. Launches nothing for an
 * empty s. */
gpuError_t kiln_gpu_blas_bcast_scale(int dtype, const void *c, kiln_gpu_shape s, float scale, void *y,
                                     gpuStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
