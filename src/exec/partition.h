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

/* After kernel selection: where a main-graph value is read on the other side than the one it
 * lives on (a device node's input produced on the host, a host node's input produced on the
 * device, a graph input, which may come in either memory, read by either side, a value a
 * host node's subgraph captures from the device), a copy node (kiln.MemcpyToDevice or
 * kiln.MemcpyToHost) goes before the first reader on that side and those readers read its
 * output: one copy per value and side, planned like any value. Constants are not copied (the
 * device provider uploads them once). Renumbers the nodes and their release lists. */
kiln_status kiln_insert_copies(kiln_graph *g, const kiln_provider_i *dev, kiln_err *err);

#endif
