/* dnn_load.c - opens cuDNN when the first GPU convolution needs it (dnn.h). */
#include "gpu/dnn.h"

#include <stdlib.h>
#include <string.h>

#include "gpu/libload.h"

#if defined(KILN_HIP)
kiln_status kiln_gpu_dnn_open(kiln_err *err)
{
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "no DNN library in HIP builds");
}

bool kiln_gpu_dnn_fused(void) { return false; }
#else
kiln_dnn_api kiln_dnn;

/* where CUDA 13's toolkit puts it, and where pip's nvidia-cudnn-cu13 does (on LD_LIBRARY_PATH) */
static const char *const libraries[] = {"libcudnn.so.9", "/usr/local/cuda/lib64/libcudnn.so.9",
                                        "/usr/local/cuda/lib/libcudnn.so.9"};
#define SYMBOLS(X)                                                                                              \
    X(create, "cudnnCreate") X(destroy, "cudnnDestroy") X(set_stream, "cudnnSetStream")                         \
    X(error_string, "cudnnGetErrorString") X(create_tensor, "cudnnCreateTensorDescriptor")                      \
    X(set_tensor, "cudnnSetTensorNdDescriptor") X(destroy_tensor, "cudnnDestroyTensorDescriptor")               \
    X(create_filter, "cudnnCreateFilterDescriptor") X(set_filter, "cudnnSetFilterNdDescriptor")                 \
    X(destroy_filter, "cudnnDestroyFilterDescriptor") X(create_conv, "cudnnCreateConvolutionDescriptor")        \
    X(set_conv, "cudnnSetConvolutionNdDescriptor") X(set_conv_groups, "cudnnSetConvolutionGroupCount")          \
    X(set_conv_math, "cudnnSetConvolutionMathType") X(destroy_conv, "cudnnDestroyConvolutionDescriptor")        \
    X(create_act, "cudnnCreateActivationDescriptor") X(set_act, "cudnnSetActivationDescriptor")                 \
    X(destroy_act, "cudnnDestroyActivationDescriptor") X(forward_algos, "cudnnGetConvolutionForwardAlgorithm_v7") \
    X(forward_workspace, "cudnnGetConvolutionForwardWorkspaceSize") X(forward, "cudnnConvolutionForward")       \
    X(forward_bias_act, "cudnnConvolutionBiasActivationForward")

#define NAME(field, name) name,
#define SLOT(field, name) (void **)&kiln_dnn.field,
static const char *const names[] = {SYMBOLS(NAME)};
static void **const slots[] = {SYMBOLS(SLOT)};
static kiln_gpu_lib lib = {
    .what = "cuDNN", .files = libraries, .n_files = sizeof libraries / sizeof *libraries,
    .names = names, .slots = slots, .n = sizeof names / sizeof *names, .lock = PTHREAD_MUTEX_INITIALIZER,
};

/* KILN_CUDNN=0 in the environment leaves cuDNN closed, so that the convolutions run kiln's own
 * im2col + cuBLAS path: an A/B of the two in one process tree (scripts/bench_gpu.py). */
kiln_status kiln_gpu_dnn_open(kiln_err *err)
{
    const char *off = getenv("KILN_CUDNN");
    if (off && !strcmp(off, "0")) return kiln_errf(err, KILN_ERR_UNSUPPORTED, "cuDNN turned off (KILN_CUDNN=0)");
    return kiln_gpu_lib_open(&lib, err);
}

bool kiln_gpu_dnn_fused(void)
{
    const char *mode = getenv("KILN_CUDNN");
    return !mode || strcmp(mode, "nofuse");
}
#endif
