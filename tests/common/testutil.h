/* testutil.h - helpers shared by kiln's C tests: reading .pb test data, comparing values. */
#ifndef KILN_TESTUTIL_H
#define KILN_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "kiln.h"

/* Reads a serialized TensorProto / SequenceProto / OptionalProto file. Nonzero on failure
 * with a message in why. */
int test_read_pb(const char *path, kiln_value_kind kind, kiln_value **out, char *why, size_t why_size);
/* True when got matches want: same kind, dtype and shape; numbers within
 * |got - want| <= atol + rtol * |want| (NaN equals NaN, infinities must match); integers,
 * bools and strings exactly. Otherwise false with the first difference in why. */
bool test_values_close(const kiln_value *got, const kiln_value *want, double rtol, double atol, char *why,
                       size_t why_size);

#endif
