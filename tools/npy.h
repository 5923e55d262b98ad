/* npy.h - reading and writing NumPy .npy files (format versions 1-3) as kiln values. */
#ifndef KILN_TOOLS_NPY_H
#define KILN_TOOLS_NPY_H

#include <stddef.h>

#include "kiln.h"

/* Reads a .npy file into a new tensor. Supports every ONNX numeric dtype: numpy's own
 * (bool, int/uint 8-64, float16/32/64, complex64/128), ml_dtypes' names for the others
 * (bfloat16, float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, float8_e8m0fnu,
 * float4_e2m1fn, int4, uint4, int2, uint2; one element per byte), and fixed-width unicode
 * ('<U') as strings. C order only. numpy's own np.save writes those ml_dtypes types with
 * raw descrs ('<V1', '<V2', '<f1'); such files take the element type `hint` (the model's
 * declared input type) when it has that size. Nonzero on failure with a message in why. */
int npy_read(const char *path, kiln_dtype hint, kiln_value **out, char *why, size_t why_size);
/* Writes a tensor to path. Nonzero on failure with a message in why. */
int npy_write(const char *path, const kiln_value *v, char *why, size_t why_size);

#endif
