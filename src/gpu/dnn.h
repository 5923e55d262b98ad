/* dnn.h - cuDNN, opened at run time as cuBLAS is (blas.h): the convolution calls of ops_cnn.c.
 * Include this instead of cudnn.h. Under HIP there is no DNN library wired (MIOpen would be
 * its counterpart): kiln_gpu_dnn_open reports it unsupported and the convolutions keep their
 * im2col + GEMM path. Usable from C. */
#ifndef KILN_GPU_DNN_H
#define KILN_GPU_DNN_H

#include "core/error.h"
#include "gpu/rt.h"

#if !defined(KILN_HIP)
#include <cudnn.h>

/* The cuDNN entry points kiln calls, filled by kiln_gpu_dnn_open; processes that never run a
 * convolution on the GPU never map the library (its engines are hundreds of MB). */
typedef struct kiln_dnn_api {
    __typeof__(cudnnCreate) *create;
    __typeof__(cudnnDestroy) *destroy;
    __typeof__(cudnnSetStream) *set_stream;
    __typeof__(cudnnGetErrorString) *error_string;
    __typeof__(cudnnCreateTensorDescriptor) *create_tensor;
    __typeof__(cudnnSetTensorNdDescriptor) *set_tensor;
    __typeof__(cudnnDestroyTensorDescriptor) *destroy_tensor;
    __typeof__(cudnnCreateFilterDescriptor) *create_filter;
    __typeof__(cudnnSetFilterNdDescriptor) *set_filter;
    __typeof__(cudnnDestroyFilterDescriptor) *destroy_filter;
    __typeof__(cudnnCreateConvolutionDescriptor) *create_conv;
    __typeof__(cudnnSetConvolutionNdDescriptor) *set_conv;
    __typeof__(cudnnSetConvolutionGroupCount) *set_conv_groups;
    __typeof__(cudnnSetConvolutionMathType) *set_conv_math;
    __typeof__(cudnnDestroyConvolutionDescriptor) *destroy_conv;
    __typeof__(cudnnCreateActivationDescriptor) *create_act;
    __typeof__(cudnnSetActivationDescriptor) *set_act;
    __typeof__(cudnnDestroyActivationDescriptor) *destroy_act;
    __typeof__(cudnnGetConvolutionForwardAlgorithm_v7) *forward_algos;
    __typeof__(cudnnGetConvolutionForwardWorkspaceSize) *forward_workspace;
    __typeof__(cudnnConvolutionForward) *forward;
    __typeof__(cudnnConvolutionBiasActivationForward) *forward_bias_act;
} kiln_dnn_api;

extern kiln_dnn_api kiln_dnn;
#endif

/* Opens cuDNN once per process and fills kiln_dnn. Thread-safe; a failure (the library or a
 * symbol missing, or a HIP build) is reported every time, with dlerror's words. */
kiln_status kiln_gpu_dnn_open(kiln_err *err);
/* Whether a convolution with a bias and a ReLU takes cuDNN's fused call: false under
 * KILN_CUDNN=nofuse (the convolution alone, the rest by kiln's kernels: an A/B of the fused
 * call, whose set-up at a new shape costs ~1 ms a node). */
bool kiln_gpu_dnn_fused(void);

#endif
