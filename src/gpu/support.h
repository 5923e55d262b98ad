/* support.h - what the GPU families' placement checks (kiln_gpu_op.supports) share: reading a
 * node's compile-time input types and writing the reason a node is refused. */
#ifndef KILN_GPU_SUPPORT_H
#define KILN_GPU_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "ops/op.h"

/* Writes the reason (printf-style) into why (when why and size) and returns false. */
bool kiln_gpu_refuse(char *why, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The compile-time type of input i of n, NULL when the input is absent. */
const kiln_type *kiln_gpu_in_type(const kiln_node *n, int i);
/* Whether dt is one of ok[] (ending in KILN_DTYPE_UNDEFINED). */
bool kiln_gpu_dtype_in(kiln_dtype dt, const kiln_dtype *ok);
/* Input i (when present, or when required) is a tensor of one of the dtypes in ok; else says
 * why. An unknown dtype passes (the kernel checks it again at run time). */
bool kiln_gpu_input_is(const kiln_node *n, int i, bool required, const kiln_dtype *ok, char *why, size_t size);
/* Input i, when present, has input ref's dtype; else says why. */
bool kiln_gpu_same_dtype(const kiln_node *n, int i, int ref, char *why, size_t size);

#endif
