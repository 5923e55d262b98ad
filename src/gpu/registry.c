/* registry.c - the GPU provider's operator families; the one place a family is listed. The
 * kernels are keyed by the op registry's entries (ops/op.h): one GPU op per registry op. */
#include <string.h>

#include "gpu/gpu.h"

#define GPU_FAMILIES(X) \
    X(kiln_gpu_ops_ew) \
    X(kiln_gpu_ops_reduce) \
    X(kiln_gpu_ops_blas) \
    X(kiln_gpu_ops_cnn) \
    X(kiln_gpu_ops_layout) \
    X(kiln_gpu_ops_llm) \
    X(kiln_gpu_ops_contrib) \
    X(kiln_gpu_ops_attn) \
    X(kiln_gpu_ops_quant) \
    X(kiln_gpu_ops_fused)

#define DECLARE(name) extern const kiln_gpu_op_table name;
GPU_FAMILIES(DECLARE)
#undef DECLARE

#define ENTRY(name) &name,
static const kiln_gpu_op_table *const families[] = {GPU_FAMILIES(ENTRY)};
#undef ENTRY

const kiln_gpu_op *kiln_gpu_op_find(const kiln_op_def *def)
{
    if (!def) return NULL;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (int i = 0; i < families[f]->n; i++) {
            const kiln_gpu_op *o = &families[f]->ops[i];
            if (!strcmp(o->op_type, def->op_type) && !strcmp(o->domain, def->domain)) return o;
        }
    return NULL;
}
