/* value.h - runtime values (tensors, sequences, optionals): the struct behind the public
 * kiln_value handle, and the internal constructors the loader, executor and kernels use. */
#ifndef KILN_CORE_VALUE_H
#define KILN_CORE_VALUE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "kiln.h"

struct kiln_value {
    kiln_value_kind kind;
    kiln_dtype dtype; /* tensor element type; element type of a sequence / optional */
    /* tensor */
    int rank;
    int64_t dims[KILN_MAX_RANK];
    int64_t numel;
    size_t nbytes;    /* numel * kiln_dtype_size(dtype) */
    void *data;       /* row-major, contiguous; NULL when numel == 0 */
    bool owns_data;   /* free(data) (and each string) on release */
    /* data is in GPU device memory (the GPU provider's values; never handed to API callers) */
    bool on_device;
    /* owned data not from malloc: released by release(data, release_ctx) instead of free */
    void (*release)(void *data, void *release_ctx);
    void *release_ctx;
    /* sequence */
    kiln_value **items;
    int64_t n_items, cap_items;
    /* optional: the held value, NULL when empty */
    kiln_value *inner;
};

/* numel of dims, checking each dim >= 0 and the product for int64 overflow. */
kiln_status kiln_dims_numel(int rank, const int64_t *dims, int64_t *numel, kiln_err *err);

/* New owned tensor, data zeroed (strings: empty). */
kiln_status kiln_tensor_new(kiln_dtype dt, int rank, const int64_t *dims, kiln_value **out,
                            kiln_err *err);
/* The same with the data left unset (strings are still empty): for a kernel that writes every
 * element, where zeroing a large output would be a wasted pass over memory. */
kiln_status kiln_tensor_new_unset(kiln_dtype dt, int rank, const int64_t *dims, kiln_value **out,
                                  kiln_err *err);
/* A tensor header over memory it does not own (an arena slot); data must outlive it. */
kiln_status kiln_value_view(kiln_dtype dt, int rank, const int64_t *dims, void *data, kiln_value **out,
                            kiln_err *err);
/* New owned tensor with like's dtype and shape, data zeroed. */
kiln_status kiln_tensor_new_like(const kiln_value *like, kiln_value **out, kiln_err *err);
/* New empty sequence. */
kiln_status kiln_sequence_new(kiln_dtype elem, kiln_value **out, kiln_err *err);
/* Appends item at position pos (-1 = end); takes ownership of item, also on failure. */
kiln_status kiln_sequence_insert(kiln_value *seq, int64_t pos, kiln_value *item, kiln_err *err);
/* New optional holding inner (taken) or empty. */
kiln_status kiln_optional_new(kiln_dtype elem, kiln_value *inner, kiln_value **out, kiln_err *err);
kiln_status kiln_value_copy(const kiln_value *v, kiln_value **out, kiln_err *err);

/* Sets a string element (copied). */
kiln_status kiln_tensor_set_string(kiln_value *t, int64_t i, const char *s, size_t len,
                                   kiln_err *err);

#endif
