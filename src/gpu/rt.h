/* rt.h - the GPU runtime portability layer. Every GPU API call in kiln goes through these
 * names, so the same sources build with CUDA (nvcc, NVIDIA) and with HIP (hipcc, AMD):
 * define KILN_HIP to take the HIP branch. Usable from C (host code) and from kernel sources. */
#ifndef KILN_GPU_RT_H
#define KILN_GPU_RT_H

#if defined(KILN_HIP)
#if !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP_PLATFORM_NVIDIA__)
#define __HIP_PLATFORM_AMD__ 1 /* hipcc sets it for HIP sources, not for host C code */
#endif
#include <hip/hip_runtime_api.h>
typedef hipError_t gpuError_t;
typedef hipStream_t gpuStream_t;
typedef hipEvent_t gpuEvent_t;
typedef hipGraph_t gpuGraph_t;
typedef hipGraphExec_t gpuGraphExec_t;
#define gpuSuccess hipSuccess
#define gpuErrorNotPermitted hipErrorNotSupported
#define gpuErrorInvalidValue hipErrorInvalidValue
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuSetDevice hipSetDevice
#define gpuGetDevice hipGetDevice
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMallocAsync hipMallocAsync
#define gpuFreeAsync hipFreeAsync
#define gpuHostAlloc(p, n) hipHostMalloc((p), (n), hipHostMallocDefault)
#define gpuFreeHost hipHostFree
#define gpuMemcpy hipMemcpy
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuMemcpyDefault hipMemcpyDefault
#define gpuStreamCreate(s) hipStreamCreateWithFlags((s), hipStreamNonBlocking)
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuStreamBeginCapture(s) hipStreamBeginCapture((s), hipStreamCaptureModeRelaxed)
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuGraphInstantiate(e, g) hipGraphInstantiate((e), (g), NULL, NULL, 0)
#define gpuGraphLaunch hipGraphLaunch
#define gpuGraphDestroy hipGraphDestroy
#define gpuGraphExecDestroy hipGraphExecDestroy
#define gpuPointerGetAttributes hipPointerGetAttributes
#define gpuDeviceGetAttribute hipDeviceGetAttribute
#define gpuDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define gpuDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#define gpuDevAttrComputeCapabilityMinor hipDeviceAttributeComputeCapabilityMinor
typedef hipPointerAttribute_t gpuPointerAttributes;
#define gpuMemoryTypeDevice hipMemoryTypeDevice
#define gpuDeviceGetDefaultMemPool hipDeviceGetDefaultMemPool
#define gpuMemPoolSetAttribute hipMemPoolSetAttribute
#define gpuMemPoolAttrReleaseThreshold hipMemPoolAttrReleaseThreshold
typedef hipMemPool_t gpuMemPool_t;
#else
#include <cuda_runtime_api.h>
typedef cudaError_t gpuError_t;
typedef cudaStream_t gpuStream_t;
typedef cudaEvent_t gpuEvent_t;
typedef cudaGraph_t gpuGraph_t;
typedef cudaGraphExec_t gpuGraphExec_t;
#define gpuSuccess cudaSuccess
#define gpuErrorNotPermitted cudaErrorNotPermitted
#define gpuErrorInvalidValue cudaErrorInvalidValue
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuSetDevice cudaSetDevice
#define gpuGetDevice cudaGetDevice
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMallocAsync cudaMallocAsync
#define gpuFreeAsync cudaFreeAsync
#define gpuHostAlloc(p, n) cudaHostAlloc((p), (n), cudaHostAllocDefault)
#define gpuFreeHost cudaFreeHost
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuMemcpyDefault cudaMemcpyDefault
#define gpuStreamCreate(s) cudaStreamCreateWithFlags((s), cudaStreamNonBlocking)
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamBeginCapture(s) cudaStreamBeginCapture((s), cudaStreamCaptureModeRelaxed)
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuGraphInstantiate(e, g) cudaGraphInstantiate((e), (g), 0)
#define gpuGraphLaunch cudaGraphLaunch
#define gpuGraphDestroy cudaGraphDestroy
#define gpuGraphExecDestroy cudaGraphExecDestroy
#define gpuPointerGetAttributes cudaPointerGetAttributes
#define gpuDeviceGetAttribute cudaDeviceGetAttribute
#define gpuDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount
#define gpuDevAttrComputeCapabilityMajor cudaDevAttrComputeCapabilityMajor
#define gpuDevAttrComputeCapabilityMinor cudaDevAttrComputeCapabilityMinor
typedef struct cudaPointerAttributes gpuPointerAttributes;
#define gpuMemoryTypeDevice cudaMemoryTypeDevice
#define gpuDeviceGetDefaultMemPool cudaDeviceGetDefaultMemPool
#define gpuMemPoolSetAttribute cudaMemPoolSetAttribute
#define gpuMemPoolAttrReleaseThreshold cudaMemPoolAttrReleaseThreshold
typedef cudaMemPool_t gpuMemPool_t;
#endif

/* Element types of kernel sources (C++ only): IEEE half and bfloat16. */
#if defined(__cplusplus) && defined(KILN_HIP)
#include <hip/hip_fp16.h>
typedef __half kiln_gpu_half;
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
typedef __hip_bfloat16 kiln_gpu_bf16;
#else
/* ROCm before 5.7 (Debian 12 ships 5.2) has only the hip_bfloat16 struct; kcommon.cuh adds
 * the conversions the newer header has */
#include <hip/hip_bfloat16.h>
typedef hip_bfloat16 kiln_gpu_bf16;
#define KILN_HIP_OLD_BF16 1
#endif
#elif defined(__cplusplus)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef __half kiln_gpu_half;
typedef __nv_bfloat16 kiln_gpu_bf16;
#endif

#endif
