/* k_blas.cu - helper kernels of the 'blas' family (the products themselves run in cuBLAS):
 * Gemm's C broadcast into Y before the product accumulates onto it. */
#include "gpu/k_blas.h"
#include "gpu/kcommon.cuh"

/* gpu.h's grid sizing (gpu.h itself is C-only) */
extern "C" unsigned kiln_gpu_blocks(int64_t n, unsigned block);

template <typename T>
__global__ void blas_bcast_scale(const T *__restrict__ c, kiln_gpu_shape s, float scale, T *__restrict__ y,
                                 int64_t n)
{
    KILN_GRID_LOOP(i, n) y[i] = kiln_from_f<T>(scale * kiln_to_f<T>(c[kiln_strided_offset(s, i)]));
}

template <typename T>
static gpuError_t launch_bcast_scale(const void *c, const kiln_gpu_shape &s, float scale, void *y, int64_t n,
                                     gpuStream_t stream)
{
    const unsigned block = 256;
    blas_bcast_scale<T><<<kiln_gpu_blocks(n, block), block, 0, stream>>>((const T *)c, s, scale, (T *)y, n);
    return gpuGetLastError();
}

extern "C" gpuError_t kiln_gpu_blas_bcast_scale(int dtype, const void *c, kiln_gpu_shape s, float scale, void *y,
                                                gpuStream_t stream)
{
    int64_t n = 1;
    for (int k = 0; k < s.rank; k++) n *= s.dims[k];
    if (n <= 0) return gpuSuccess;
    switch (dtype) {
    case KILN_DTYPE_FLOAT32: return launch_bcast_scale<float>(c, s, scale, y, n, stream);
    case KILN_DTYPE_FLOAT16: return launch_bcast_scale<kiln_gpu_half>(c, s, scale, y, n, stream);
    case KILN_DTYPE_BFLOAT16: return launch_bcast_scale<kiln_gpu_bf16>(c, s, scale, y, n, stream);
    default: return gpuSuccess; /* the C side passes float types only (k_blas.h) */
    }
}
