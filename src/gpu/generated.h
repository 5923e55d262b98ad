/* generated.h - the kernels the CUDA provider generates for a session (ops_fused.c): one module
 * per session holding a kernel per distinct kiln.FusedElementwise program, compiled by NVRTC
 * when the session is created or loaded from the on-disk cache; and the GPU pipeline's pass
 * that makes those nodes. */
#ifndef KILN_GPU_GENERATED_H
#define KILN_GPU_GENERATED_H

#include <stddef.h>

#include "core/error.h"
#include "ir/graph.h"

typedef struct kiln_gpu_fused kiln_gpu_fused;

/* Builds the kernels of g's FusedElementwise nodes placed on `device` (*out NULL when g has
 * none). A compile or cache failure is not an error: those nodes keep no kernel (they run their
 * reference on the host) and the stats' note says why. Fails only for lack of memory. */
kiln_status kiln_gpu_fused_prepare(int device, const kiln_graph *g, kiln_gpu_fused **out, kiln_err *err);
void kiln_gpu_fused_free(kiln_gpu_fused *f);
/* Kernels generated, how many the cache held, and the note ("" when all went well). f may be NULL. */
void kiln_gpu_fused_stats(const kiln_gpu_fused *f, int *kernels, int *from_cache, char *note, size_t size);
/* Node n's kernel (a CUfunction), or NULL. */
void *kiln_gpu_fused_kernel(const kiln_gpu_fused *f, const kiln_node *n);

/* The CUDA C source of the module for every FusedElementwise node of g (placed or not; *src
 * malloc'd, caller frees) and its count of distinct kernels: what kiln_gpu_fused_prepare
 * compiles, for tests that compile it without a GPU. */
kiln_status kiln_gpu_fused_source(const kiln_graph *g, char **src, int *kernels, kiln_err *err);

/* kiln_pass_fuse_elementwise when kernels can be generated here (NVRTC and the driver load,
 * KILN_RTC is not 0); else nothing. */
kiln_status kiln_gpu_pass_fuse_elementwise(kiln_graph *g, int *fused, kiln_err *err);

#endif
