/* rtc.h - run-time compilation of generated kernels (NVRTC) and loading them (the CUDA driver's
 * module API), both opened at run time as cuBLAS is (blas.h): libnvrtc for the compiler,
 * libcuda for cuModuleLoadData and cuLaunchKernel. Under HIP nothing is wired (hiprtc would be
 * the counterpart): kiln_gpu_rtc_open reports it unsupported and the graph keeps its unfused
 * element-wise nodes. Usable from C. */
#ifndef KILN_GPU_RTC_H
#define KILN_GPU_RTC_H

#include <stddef.h>

#include "core/error.h"
#include "gpu/rt.h"

/* Opens both libraries on the first call (thread-safe); later calls report the same outcome:
 * KILN_OK, or KILN_ERR_UNSUPPORTED saying which library is missing. KILN_RTC=0 in the
 * environment turns generated kernels off (an A/B of fused and unfused element-wise nodes). */
kiln_status kiln_gpu_rtc_open(kiln_err *err);

/* Compiles CUDA C source `src` for compute capability `cc` (major * 10 + minor: 90 for sm_90)
 * into a loadable image (a cubin for that architecture, or PTX for the newest one NVRTC knows
 * below it when it does not know cc): *image malloc'd (caller frees), *size its bytes; *arch
 * receives the target ("sm_90"). Needs no GPU. A compile error fails with the start of
 * NVRTC's log. */
kiln_status kiln_gpu_rtc_compile(int cc, const char *src, void **image, size_t *size, char *arch, size_t arch_size,
                                 kiln_err *err);

/* The compiler's version, folded into cache keys (major * 1000 + minor). */
int kiln_gpu_rtc_version(void);

/* A loaded image (CUmodule) and its kernels (CUfunction), in the current context of `device`. */
typedef struct kiln_gpu_module kiln_gpu_module;
kiln_status kiln_gpu_module_load(const void *image, kiln_gpu_module **out, kiln_err *err);
/* The kernel `name` (extern "C") of m, or NULL with err set. */
void *kiln_gpu_module_kernel(kiln_gpu_module *m, const char *name, kiln_err *err);
void kiln_gpu_module_free(kiln_gpu_module *m);

/* Launches kernel fn (from kiln_gpu_module_kernel) with one by-value argument of `bytes`
 * bytes at `arg` on stream s: grid x blocks of `block` threads. */
gpuError_t kiln_gpu_module_launch(void *fn, unsigned grid, unsigned block, const void *arg, size_t bytes,
                                  gpuStream_t s);

#endif
