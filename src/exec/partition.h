/* partition.h - placing nodes on providers and selecting their kernels (compile time). */
#ifndef KILN_EXEC_PARTITION_H
#define KILN_EXEC_PARTITION_H

#include "ops/provider.h"

/* Places each node of g (the main graph; subgraphs run on the host) on the device provider dev
 * when it may go there and dev->supports accepts it (n->on_device), else on the host with the
 * reason in n->placement_note (and n->host_fallback when it computes tensor data there).
 * Counts the nodes of each side and the fallbacks among the host's. */
kiln_status kiln_partition(kiln_graph *g, const kiln_provider_i *dev, const kiln_provider *dp, int *n_dev,
                           int *n_host, int *n_fallback, kiln_err *err);

/* Gives every node with an op the kernel its provider selects: dev's for nodes placed on the
 * device (dev may be NULL: none), host's for the others, subgraphs included. */
void kiln_select_kernels(kiln_graph *g, const kiln_provider_i *host, kiln_provider *hp, const kiln_provider_i *dev,
                         kiln_provider *dp);

#endif
