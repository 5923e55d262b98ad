/* blas.h - the BLAS portability layer: the cuBLAS names the GPU kernels use, spelled gpublas*,
 * mapped to cuBLAS (CUDA) or to hipBLAS (HIP, with KILN_HIP), as rt.h does for the runtime.
 * Include this instead of cublas_v2.h / hipblas.h. Usable from C. */
#ifndef KILN_GPU_BLAS_H
#define KILN_GPU_BLAS_H

#include "core/error.h"
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
#endif


/* The BLAS library is opened on first use (src/gpu/blas_load.c), not linked: processes that
 * never create a CUDA session never map it (libcublasLt alone is hundreds of MB). Every call
 * goes through kiln_blas, filled by kiln_gpu_blas_open. */
typedef struct kiln_blas_api {
#if defined(KILN_HIP)
    __typeof__(hipblasCreate) *create;
    __typeof__(hipblasDestroy) *destroy;
    __typeof__(hipblasSetStream) *set_stream;
    __typeof__(hipblasSetWorkspace) *set_workspace;
    __typeof__(hipblasGemmStridedBatchedEx) *gemm_strided_batched_ex;
    __typeof__(hipblasStatusToString) *status_string;
#else
    __typeof__(cublasCreate_v2) *create;
    __typeof__(cublasDestroy_v2) *destroy;
    __typeof__(cublasSetStream_v2) *set_stream;
    __typeof__(cublasSetWorkspace_v2) *set_workspace;
    __typeof__(cublasGemmStridedBatchedEx) *gemm_strided_batched_ex;
    __typeof__(cublasGetStatusString) *status_string;
#endif
} kiln_blas_api;

extern kiln_blas_api kiln_blas;

/* Opens the BLAS library once per process and fills kiln_blas. Thread-safe; a failure (the
 * library or a symbol missing) is reported every time, with dlerror's words. */
kiln_status kiln_gpu_blas_open(kiln_err *err);

#define gpublasCreate (*kiln_blas.create)
#define gpublasDestroy (*kiln_blas.destroy)
#define gpublasSetStream (*kiln_blas.set_stream)
#define gpublasSetWorkspace (*kiln_blas.set_workspace)
#define gpublasGemmStridedBatchedEx (*kiln_blas.gemm_strided_batched_ex)
#define gpublasGetStatusString (*kiln_blas.status_string)

#if !defined(KILN_HIP)
#include <cublasLt.h>

/* cuBLASLt, opened like cuBLAS (a second library of the toolkit): the products with a bias
 * epilogue and an algorithm kept per node and shape (ops_blas.c). Absent, the products take
 * cuBLAS. Not in HIP builds. */
typedef struct kiln_blaslt_api {
    __typeof__(cublasLtCreate) *create;
    __typeof__(cublasLtDestroy) *destroy;
    __typeof__(cublasLtMatmulDescCreate) *desc_create;
    __typeof__(cublasLtMatmulDescDestroy) *desc_destroy;
    __typeof__(cublasLtMatmulDescSetAttribute) *desc_set;
    __typeof__(cublasLtMatrixLayoutCreate) *layout_create;
    __typeof__(cublasLtMatrixLayoutDestroy) *layout_destroy;
    __typeof__(cublasLtMatrixLayoutSetAttribute) *layout_set;
    __typeof__(cublasLtMatmulPreferenceCreate) *pref_create;
    __typeof__(cublasLtMatmulPreferenceDestroy) *pref_destroy;
    __typeof__(cublasLtMatmulPreferenceSetAttribute) *pref_set;
    __typeof__(cublasLtMatmulAlgoGetHeuristic) *heuristic;
    __typeof__(cublasLtMatmulAlgoCheck) *algo_check;
    __typeof__(cublasLtMatmul) *matmul;
} kiln_blaslt_api;

extern kiln_blaslt_api kiln_blaslt;

/* Opens cuBLASLt once per process and fills kiln_blaslt (as kiln_gpu_blas_open). */
kiln_status kiln_gpu_blaslt_open(kiln_err *err);
#endif

#endif
