/* blas_load.c - opens cuBLAS (hipBLAS under HIP), and cuBLASLt, when the first CUDA session
 * needs them. */
#include "gpu/blas.h"

#include <stdlib.h>
#include <string.h>

#include "gpu/libload.h"

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

#define NAME(field, name) name,
#define SLOT(field, name) (void **)&kiln_blas.field,
static const char *const names[] = {SYMBOLS(NAME)};
static void **const slots[] = {SYMBOLS(SLOT)};
static kiln_gpu_lib lib = {
    .what = "CUDA provider", .files = libraries, .n_files = sizeof libraries / sizeof *libraries,
    .names = names, .slots = slots, .n = sizeof names / sizeof *names, .lock = PTHREAD_MUTEX_INITIALIZER,
};

kiln_status kiln_gpu_blas_open(kiln_err *err) { return kiln_gpu_lib_open(&lib, err); }

#if !defined(KILN_HIP)
kiln_blaslt_api kiln_blaslt;

static const char *const lt_libraries[] = {"libcublasLt.so.13", "/usr/local/cuda/lib64/libcublasLt.so.13",
                                           "libcublasLt.so"};
#define LT_SYMBOLS(X)                                                                                          \
    X(create, "cublasLtCreate") X(destroy, "cublasLtDestroy") X(desc_create, "cublasLtMatmulDescCreate")       \
    X(desc_destroy, "cublasLtMatmulDescDestroy") X(desc_set, "cublasLtMatmulDescSetAttribute")                 \
    X(layout_create, "cublasLtMatrixLayoutCreate") X(layout_destroy, "cublasLtMatrixLayoutDestroy")            \
    X(layout_set, "cublasLtMatrixLayoutSetAttribute") X(pref_create, "cublasLtMatmulPreferenceCreate")         \
    X(pref_destroy, "cublasLtMatmulPreferenceDestroy") X(pref_set, "cublasLtMatmulPreferenceSetAttribute")     \
    X(heuristic, "cublasLtMatmulAlgoGetHeuristic") X(algo_check, "cublasLtMatmulAlgoCheck")                    \
    X(matmul, "cublasLtMatmul")
#define LT_SLOT(field, name) (void **)&kiln_blaslt.field,
static const char *const lt_names[] = {LT_SYMBOLS(NAME)};
static void **const lt_slots[] = {LT_SYMBOLS(LT_SLOT)};
static kiln_gpu_lib lt_lib = {
    .what = "cuBLASLt", .files = lt_libraries, .n_files = sizeof lt_libraries / sizeof *lt_libraries,
    .names = lt_names, .slots = lt_slots, .n = sizeof lt_names / sizeof *lt_names, .lock = PTHREAD_MUTEX_INITIALIZER,
};

/* KILN_BLASLT=0 in the environment leaves cuBLASLt closed: the products take cuBLAS (an A/B). */
kiln_status kiln_gpu_blaslt_open(kiln_err *err)
{
    const char *off = getenv("KILN_BLASLT");
    if (off && !strcmp(off, "0")) return kiln_errf(err, KILN_ERR_UNSUPPORTED, "cuBLASLt turned off (KILN_BLASLT=0)");
    return kiln_gpu_lib_open(&lt_lib, err);
}
#endif
