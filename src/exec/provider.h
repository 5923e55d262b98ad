/* provider.h - execution providers: sets of kernels that take over the nodes they support from
 * the reference kernels. A provider is a static table of function pointers; the executor only
 * sees the kernels it selects. */
#ifndef KILN_EXEC_PROVIDER_H
#define KILN_EXEC_PROVIDER_H

#include "ops/op.h"

typedef struct kiln_provider_i {
    const char *name;
    /* Required. The kernel for node n, judged from the types compile-time inference gave its
     * inputs (dims may be symbolic) and their constant contents, or NULL to leave the node to
     * its reference kernel. It may prepare data for the kernel (packed weights) in
     * n->kernel_state with its destructor in n->kernel_state_free. A selected kernel must
     * compute what the reference kernel computes (up to float rounding) for every input the
     * types allow, or fail cleanly; it runs under the same contract as kiln_op_def.run, except
     * that the outputs the executor allocated are not zeroed: it writes every element (or
     * hands the node to kiln_cpu_reference, which zeroes them). */
    kiln_kernel_fn (*select)(kiln_node *n);
} kiln_provider_i;

/* The optimised CPU provider (src/cpu/). */
extern const kiln_provider_i kiln_provider_cpu;

#endif
