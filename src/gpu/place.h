/* place.h - placement of a graph's nodes between the GPU provider and the CPU. */
#ifndef KILN_GPU_PLACE_H
#define KILN_GPU_PLACE_H

#include "core/error.h"
#include "ir/graph.h"

/* Places each node of g's main graph: on the GPU when the provider has a kernel covering it
 * (kiln_gpu_op.supports), else on the CPU with the reason in n->placement_note. Shape
 * arithmetic (nodes computing small integer vectors from shapes and constants) stays on the
 * CPU, where the inference that reads it runs; control flow and its subgraphs too. */
kiln_status kiln_gpu_place(kiln_graph *g, int *n_gpu, int *n_cpu, kiln_err *err);

#endif
