/* kcommon.cuh - device-side helpers shared by the k_*.cu kernel sources: element conversions
 * to and from float for every floating dtype, grid-stride loops, and offsets of a strided
 * index. Builds with nvcc and hipcc. */
#ifndef KILN_GPU_KCOMMON_CUH
#define KILN_GPU_KCOMMON_CUH

#if defined(KILN_HIP)
#include <hip/hip_runtime.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/kshape.h"
#include "gpu/rt.h"

#if defined(KILN_HIP_OLD_BF16)
/* hip_bfloat16 (ROCm < 5.7): the conversions of hip_bf16.h, rounding to nearest even */
static __host__ __device__ __forceinline__ float __bfloat162float(hip_bfloat16 x) { return (float)x; }
static __host__ __device__ __forceinline__ hip_bfloat16 __float2bfloat16(float x) { return hip_bfloat16(x); }
#endif

#if defined(KILN_HIP) && (HIP_VERSION_MAJOR < 6 || (HIP_VERSION_MAJOR == 6 && HIP_VERSION_MINOR < 2))
/* ROCm before 6.2 has no *_sync shuffles. The kernels are written for 32-lane warps: these
 * shuffle within 32-lane groups (width 32), which keeps that meaning on 64-lane wavefronts.
 * The mask is ignored (the kernels pass full masks). */
#define __shfl_sync(mask, v, src) __shfl((v), (src), 32)
#define __shfl_up_sync(mask, v, d) __shfl_up((v), (d), 32)
#define __shfl_down_sync(mask, v, d) __shfl_down((v), (d), 32)
#define __shfl_xor_sync(mask, v, d) __shfl_xor((v), (d), 32)
#endif

/* Loop over [0, n) across the whole grid. */
#define KILN_GRID_LOOP(i, n)                                                                  \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)(n);        \
         i += (int64_t)gridDim.x * blockDim.x)

/* Accumulation type and conversions: half and bfloat16 compute in float. */
template <typename T> struct kiln_acc { typedef T type; };
template <> struct kiln_acc<kiln_gpu_half> { typedef float type; };
template <> struct kiln_acc<kiln_gpu_bf16> { typedef float type; };

/* Programmatic dependent launch (sm_90): kiln_pdl_trigger lets a kernel launched after this one
 * with the programmatic-serialization attribute start before this one ends; such a kernel calls
 * kiln_pdl_wait before it reads anything an earlier kernel wrote (or writes anything), which
 * waits for this grid's completion and its memory. Nothing on other devices and on HIP. */
__device__ __forceinline__ void kiln_pdl_trigger(void)
{
#if !defined(KILN_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void kiln_pdl_wait(void)
{
#if !defined(KILN_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* *p, read past the multiprocessor's L1 (another block wrote it in this kernel, before a
 * __threadfence and an atomic this block saw). */
__device__ __forceinline__ float kiln_load_l2(const float *p)
{
#if defined(KILN_HIP)
    return *(const volatile float *)p;
#else
    return __ldcg(p);
#endif
}

/* The kernels kiln_launch_pdl launches early (KILN_GPU_PDL in the environment, read once, an
 * A/B): KILN_PDL_ALL (unset or "all"), KILN_PDL_PREFETCH ("prefetch": only kernels that load
 * constants before they wait, the tensor-core GEMV) or none (anything else, "0"). */
enum { KILN_PDL_NONE, KILN_PDL_PREFETCH, KILN_PDL_ALL };

static inline int kiln_pdl_level(void)
{
    static int level = -1;
    if (level < 0) {
        const char *e = getenv("KILN_GPU_PDL");
        level = !e || !strcmp(e, "all") ? KILN_PDL_ALL : !strcmp(e, "prefetch") ? KILN_PDL_PREFETCH : KILN_PDL_NONE;
    }
    return level;
}

/* Launches kernel k on stream s, with the programmatic-serialization attribute when
 * kiln_pdl_level() >= level: it may start while the kernel ahead of it runs (after that one's
 * kiln_pdl_trigger), so k calls kiln_pdl_wait before it touches memory. A plain launch on HIP.
 * Returns the launch's error. */
template <typename... KArgs, typename... Args>
static gpuError_t kiln_launch_pdl(int level, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, gpuStream_t s,
                                  Args... args)
{
#if defined(KILN_HIP)
    (void)level;
    hipLaunchKernelGGL(k, grid, block, smem, s, ((KArgs)args)...);
    return gpuGetLastError();
#else
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = kiln_pdl_level() >= level ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...);
#endif
}

template <typename T> __device__ __forceinline__ float kiln_to_f(T x) { return (float)x; }
template <> __device__ __forceinline__ float kiln_to_f<kiln_gpu_half>(kiln_gpu_half x) { return __half2float(x); }
template <> __device__ __forceinline__ float kiln_to_f<kiln_gpu_bf16>(kiln_gpu_bf16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T kiln_from_f(float x) { return (T)x; }
template <> __device__ __forceinline__ kiln_gpu_half kiln_from_f<kiln_gpu_half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ kiln_gpu_bf16 kiln_from_f<kiln_gpu_bf16>(float x) { return __float2bfloat16(x); }

/* Rounds v to T's precision (where the reference holds a value in the tensor's type). */
template <typename T> __device__ __forceinline__ float kiln_round_to(float v) { return kiln_to_f<T>(kiln_from_f<T>(v)); }

#define KILN_FULL_MASK 0xffffffffu

/* The sum and the max over a warp's 32 lanes, in every lane. */
__device__ __forceinline__ float kiln_warp_sum(float v)
{
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(KILN_FULL_MASK, v, d);
    return v;
}

__device__ __forceinline__ float kiln_warp_max(float v)
{
    for (int d = 16; d > 0; d >>= 1) v = fmaxf(v, __shfl_xor_sync(KILN_FULL_MASK, v, d));
    return v;
}

/* The error a launcher gives for an argument its C caller should have refused (a dtype, a
 * size): the runtime's invalid-value code. */
static inline gpuError_t kiln_gpu_bad_arg(void)
{
#if defined(KILN_HIP)
    return hipErrorInvalidValue;
#else
    return cudaErrorInvalidValue;
#endif
}

/* Grants kernel fn `bytes` of dynamic shared memory (past the default 48 KB) on the current
 * device, once per device: the attribute is a device's, so a process on several GPUs sets it on
 * each. `granted` is the kernel's own bit set of devices done (devices past 31 set it every
 * time); a failure is returned, and the next launch tries again. */
template <typename F>
static inline gpuError_t kiln_gpu_grant_smem(unsigned *granted, F fn, int bytes)
{
    int dev = 0;
#if defined(KILN_HIP)
    gpuError_t e = hipGetDevice(&dev);
#else
    gpuError_t e = cudaGetDevice(&dev);
#endif
    if (e != gpuSuccess) return e;
    unsigned bit = dev >= 0 && dev < 32 ? 1u << dev : 0;
    if (bit && (__atomic_load_n(granted, __ATOMIC_RELAXED) & bit)) return gpuSuccess;
#if defined(KILN_HIP)
    e = hipFuncSetAttribute((const void *)fn, hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
#else
    e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
#endif
    if (e == gpuSuccess) __atomic_fetch_or(granted, bit, __ATOMIC_RELAXED);
    return e;
}

/* Offset, under s's strides, of the element at flat index i (< s's element count) of a
 * contiguous tensor with s's dims, computed in I: int32_t where the caller knows every index and
 * offset fits (a 64-bit division costs several times more). Unrolled to constant indices, so s
 * stays in parameter space. Strides may be negative. */
template <typename I = int64_t> __device__ __forceinline__ I kiln_strided_offset(const kiln_gpu_shape &s, int64_t i)
{
    I off = 0, rem = (I)i;
#pragma unroll
    for (int k = KILN_GPU_MAX_RANK - 1; k > 0; k--) {
        if (k >= s.rank) continue;
        I d = (I)s.dims[k], q = rem / d;
        off += (rem - q * d) * (I)s.strides[k];
        rem = q;
    }
    return s.rank ? off + rem * (I)s.strides[0] : 0;
}

#endif
