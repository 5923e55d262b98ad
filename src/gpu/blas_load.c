/* blas_load.c - opens cuBLAS (hipBLAS under HIP) when the first CUDA session needs it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gpu/blas.h"

kiln_blas_api kiln_blas;

#if defined(KILN_HIP)
static const char *const libraries[] = {"libhipblas.so.3", "libhipblas.so.2", "libhipblas.so"};
#define SYMBOLS(X)                                                                                    \
    X(create, "hipblasCreate") X(destroy, "hipblasDestroy") X(set_stream, "hipblasSetStream")          \
    X(set_workspace, "hipblasSetWorkspace") X(gemm_strided_batched_ex, "hipblasGemmStridedBatchedEx") \
    X(status_string, "hipblasStatusToString")
#else
static const char *const libraries[] = {"libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.13", "libcublas.so"};
#define SYMBOLS(X)                                                                                    \
    X(create, "cublasCreate_v2") X(destroy, "cublasDestroy_v2") X(set_stream, "cublasSetStream_v2")    \
    X(set_workspace, "cublasSetWorkspace_v2") X(gemm_strided_batched_ex, "cublasGemmStridedBatchedEx") \
    X(status_string, "cublasGetStatusString")
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char failure[512]; /* empty when the library is open */

static void open_library(void)
{
    void *h = NULL;
    for (size_t i = 0; i < sizeof libraries / sizeof *libraries && !h; i++) {
        h = dlopen(libraries[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && i == 0) snprintf(failure, sizeof failure, "cannot load %s: %s", libraries[0], dlerror());
    }
    if (!h) return;
    kiln_blas_api api;
#define RESOLVE(field, name)                                                                          \
    *(void **)&api.field = dlsym(h, name);                                                            \
    if (!api.field) {                                                                                 \
        snprintf(failure, sizeof failure, "%s has no %s", libraries[0], name);                        \
        return;                                                                                       \
    }
    SYMBOLS(RESOLVE)
#undef RESOLVE
    kiln_blas = api;
    failure[0] = '\0';
}

kiln_status kiln_gpu_blas_open(kiln_err *err)
{
    pthread_once(&once, open_library);
    if (failure[0]) return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: %s", failure);
    return KILN_OK;
}
