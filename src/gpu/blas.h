/* blas.h - the BLAS portability layer: the cuBLAS names the GPU kernels use, spelled gpublas*,
 * mapped to cuBLAS (CUDA) or to hipBLAS (HIP, with KILN_HIP), as rt.h does for the runtime.
 * Include this instead of cublas_v2.h / hipblas.h. Usable from C. */
#ifndef KILN_GPU_BLAS_H
#define KILN_GPU_BLAS_H

#include "gpu/rt.h"

#if defined(KILN_HIP)
#ifndef HIPBLAS_V2
#define HIPBLAS_V2 /* hipDataType and hipblasComputeType_t in the *Ex calls, as cuBLAS has */
#endif
#include <hipblas/hipblas.h>
typedef hipblasHandle_t gpublasHandle_t;
typedef hipblasStatus_t gpublasStatus_t;
typedef hipblasOperation_t gpublasOperation_t;
typedef hipDataType gpuDataType_t;
#define GPUBLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define GPUBLAS_OP_N HIPBLAS_OP_N
#define GPUBLAS_OP_T HIPBLAS_OP_T
#define GPU_R_32F HIP_R_32F
#define GPU_R_16F HIP_R_16F
#define GPU_R_16BF HIP_R_16BF
#define GPUBLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define GPUBLAS_GEMM_DEFAULT HIPBLAS_GEMM_DEFAULT
#define gpublasGemmStridedBatchedEx hipblasGemmStridedBatchedEx
#define gpublasGetStatusString hipblasStatusToString
#else
#include <cublas_v2.h>
typedef cublasHandle_t gpublasHandle_t;
typedef cublasStatus_t gpublasStatus_t;
typedef cublasOperation_t gpublasOperation_t;
typedef cudaDataType gpuDataType_t;
#define GPUBLAS_STATUS_SUCCESS CUBLAS_STATUS_SUCCESS
#define GPUBLAS_OP_N CUBLAS_OP_N
#define GPUBLAS_OP_T CUBLAS_OP_T
#define GPU_R_32F CUDA_R_32F
#define GPU_R_16F CUDA_R_16F
#define GPU_R_16BF CUDA_R_16BF
#define GPUBLAS_COMPUTE_32F CUBLAS_COMPUTE_32F
#define GPUBLAS_GEMM_DEFAULT CUBLAS_GEMM_DEFAULT
#define gpublasGemmStridedBatchedEx cublasGemmStridedBatchedEx
#define gpublasGetStatusString cublasGetStatusString
#endif


/* Handle management (used by src/gpu/runtime.c). */
#if defined(KILN_HIP)
#include <hipblaslt/hipblaslt.h>
typedef hipblasLtHandle_t gpublasLtHandle_t;
#define gpublasCreate hipblasCreate
#define gpublasDestroy hipblasDestroy
#define gpublasSetStream hipblasSetStream
#define gpublasSetWorkspace hipblasSetWorkspace
#define gpublasLtCreate hipblasLtCreate
#define gpublasLtDestroy hipblasLtDestroy
#else
#include <cublasLt.h>
typedef cublasLtHandle_t gpublasLtHandle_t;
#define gpublasCreate cublasCreate
#define gpublasDestroy cublasDestroy
#define gpublasSetStream cublasSetStream
#define gpublasSetWorkspace cublasSetWorkspace
#define gpublasLtCreate cublasLtCreate
#define gpublasLtDestroy cublasLtDestroy
#endif

#endif
