/* contrib_nchwc.h - what the CPU provider shares with the com.microsoft.nchwc references
 * (contrib_nchwc.c): the channel block of a graph's ORT-blocked values. */
#ifndef KILN_OPS_CONTRIB_NCHWC_H
#define KILN_OPS_CONTRIB_NCHWC_H

#include "ir/graph.h"

/* The block (8 or 16) of graph g's com.microsoft.nchwc values, read off its Conv filters'
 * shapes; where both fit, the one ONNX Runtime's MLAS uses on this CPU. 0 when neither fits.
 * O(nodes of g). */
int kiln_nchwc_block(const kiln_graph *g);

#endif
