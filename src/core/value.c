/* value.c - construction, copying and release of runtime values (public and internal API). */
#include "core/value.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"

kiln_status kiln_dims_numel(int rank, const int64_t *dims, int64_t *numel, kiln_err *err)
{
    if (rank < 0 || rank > KILN_MAX_RANK)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "rank %d outside [0, %d]", rank, KILN_MAX_RANK);
    int64_t n = 1;
    bool zero = false;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0)
            return kiln_errf(err, KILN_ERR_INVALID_ARG, "negative dim %lld at axis %d",
                             (long long)dims[i], i);
        if (dims[i] == 0) zero = true;
    }
    if (zero) {
        *numel = 0;
        return KILN_OK;
    }
    for (int i = 0; i < rank; i++) {
        if (dims[i] && n > INT64_MAX / dims[i])
            return kiln_errf(err, KILN_ERR_INVALID_ARG, "element count overflows int64");
        n *= dims[i];
    }
    *numel = n;
    return KILN_OK;
}

static kiln_value *value_alloc(kiln_value_kind kind, kiln_dtype dt)
{
    kiln_value *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->kind = kind;
    v->dtype = dt;
    return v;
}

static kiln_status tensor_header(kiln_dtype dt, int rank, const int64_t *dims, kiln_value **out,
                                 kiln_err *err)
{
    *out = NULL;
    if (!kiln_dtype_valid(dt))
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "invalid dtype %d", (int)dt);
    if (rank > 0 && !dims) return kiln_errf(err, KILN_ERR_INVALID_ARG, "dims is NULL");
    int64_t numel;
    KILN_TRY(kiln_dims_numel(rank, dims, &numel, err));
    size_t es = kiln_dtype_size(dt);
    if ((uint64_t)numel > SIZE_MAX / es)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "tensor size overflows");
    kiln_value *v = value_alloc(KILN_VALUE_TENSOR, dt);
    if (!v) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    v->rank = rank;
    if (rank) memcpy(v->dims, dims, (size_t)rank * sizeof *dims);
    v->numel = numel;
    v->nbytes = (size_t)numel * es;
    *out = v;
    return KILN_OK;
}

static kiln_status tensor_alloc(kiln_dtype dt, int rank, const int64_t *dims, bool zero, kiln_value **out,
                                kiln_err *err)
{
    KILN_TRY(tensor_header(dt, rank, dims, out, err));
    kiln_value *v = *out;
    if (v->nbytes) {
        v->data = zero || dt == KILN_DTYPE_STRING ? calloc(1, v->nbytes) : malloc(v->nbytes);
        if (!v->data) {
            size_t nbytes = v->nbytes;
            free(v);
            *out = NULL;
            return kiln_errf(err, KILN_ERR_NOMEM, "out of memory allocating %zu bytes", nbytes);
        }
        v->owns_data = true;
        if (dt == KILN_DTYPE_STRING) {
            char **s = v->data;
            for (int64_t i = 0; i < v->numel; i++) {
                s[i] = calloc(1, 1);
                if (!s[i]) {
                    kiln_value_free(v);
                    *out = NULL;
                    return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
                }
            }
        }
    }
    return KILN_OK;
}

kiln_status kiln_tensor_new(kiln_dtype dt, int rank, const int64_t *dims, kiln_value **out, kiln_err *err)
{
    return tensor_alloc(dt, rank, dims, true, out, err);
}

kiln_status kiln_tensor_new_unset(kiln_dtype dt, int rank, const int64_t *dims, kiln_value **out, kiln_err *err)
{
    return tensor_alloc(dt, rank, dims, false, out, err);
}

kiln_status kiln_value_view(kiln_dtype dt, int rank, const int64_t *dims, void *data, kiln_value **out,
                            kiln_err *err)
{
    KILN_TRY(tensor_header(dt, rank, dims, out, err));
    (*out)->data = (*out)->nbytes ? data : NULL;
    return KILN_OK;
}

kiln_status kiln_tensor_new_like(const kiln_value *like, kiln_value **out, kiln_err *err)
{
    return kiln_tensor_new(like->dtype, like->rank, like->dims, out, err);
}

kiln_status kiln_tensor_set_string(kiln_value *t, int64_t i, const char *s, size_t len,
                                   kiln_err *err)
{
    char *d = malloc(len + 1);
    if (!d) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    if (len) memcpy(d, s, len);
    d[len] = '\0';
    char **slot = &((char **)t->data)[i];
    free(*slot);
    *slot = d;
    return KILN_OK;
}

kiln_status kiln_sequence_new(kiln_dtype elem, kiln_value **out, kiln_err *err)
{
    *out = value_alloc(KILN_VALUE_SEQUENCE, elem);
    return *out ? KILN_OK : kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
}

kiln_status kiln_sequence_insert(kiln_value *seq, int64_t pos, kiln_value *item, kiln_err *err)
{
    if (pos < 0) pos = seq->n_items;
    if (pos > seq->n_items) {
        kiln_value_free(item);
        return kiln_errf(err, KILN_ERR_RUNTIME, "sequence position %lld out of range [0, %lld]",
                         (long long)pos, (long long)seq->n_items);
    }
    if (seq->n_items == seq->cap_items) {
        int64_t cap = seq->cap_items ? seq->cap_items * 2 : 4;
        kiln_value **items = realloc(seq->items, (size_t)cap * sizeof *items);
        if (!items) {
            kiln_value_free(item);
            return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        }
        seq->items = items;
        seq->cap_items = cap;
    }
    memmove(seq->items + pos + 1, seq->items + pos,
            (size_t)(seq->n_items - pos) * sizeof *seq->items);
    seq->items[pos] = item;
    seq->n_items++;
    return KILN_OK;
}

kiln_status kiln_optional_new(kiln_dtype elem, kiln_value *inner, kiln_value **out, kiln_err *err)
{
    *out = value_alloc(KILN_VALUE_OPTIONAL, inner ? inner->dtype : elem);
    if (!*out) {
        kiln_value_free(inner);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    (*out)->inner = inner;
    return KILN_OK;
}

kiln_status kiln_value_copy(const kiln_value *v, kiln_value **out, kiln_err *err)
{
    *out = NULL;
    switch (v->kind) {
    case KILN_VALUE_TENSOR: {
        if (v->on_device) return kiln_errf(err, KILN_ERR_RUNTIME, "internal: a device tensor copied on the host");
        KILN_TRY(kiln_tensor_new(v->dtype, v->rank, v->dims, out, err));
        if (v->dtype == KILN_DTYPE_STRING) {
            for (int64_t i = 0; i < v->numel; i++) {
                const char *s = ((char *const *)v->data)[i];
                kiln_status st = kiln_tensor_set_string(*out, i, s, strlen(s), err);
                if (st) {
                    kiln_value_free(*out);
                    *out = NULL;
                    return st;
                }
            }
        } else if (v->nbytes) {
            memcpy((*out)->data, v->data, v->nbytes);
        }
        return KILN_OK;
    }
    case KILN_VALUE_SEQUENCE: {
        KILN_TRY(kiln_sequence_new(v->dtype, out, err));
        for (int64_t i = 0; i < v->n_items; i++) {
            kiln_value *c;
            kiln_status st = kiln_value_copy(v->items[i], &c, err);
            if (!st) st = kiln_sequence_insert(*out, -1, c, err);
            if (st) {
                kiln_value_free(*out);
                *out = NULL;
                return st;
            }
        }
        return KILN_OK;
    }
    case KILN_VALUE_OPTIONAL: {
        kiln_value *c = NULL;
        if (v->inner) KILN_TRY(kiln_value_copy(v->inner, &c, err));
        return kiln_optional_new(v->dtype, c, out, err);
    }
    }
    return kiln_errf(err, KILN_ERR_INVALID_ARG, "unknown value kind %d", (int)v->kind);
}

/* ---- public API ---- */

void kiln_value_free(kiln_value *v)
{
    if (!v) return;
    if (v->owns_data && v->data && v->release) {
        v->release(v->data, v->release_ctx);
    } else if (v->owns_data && v->data) {
        if (v->dtype == KILN_DTYPE_STRING)
            for (int64_t i = 0; i < v->numel; i++) free(((char **)v->data)[i]);
        free(v->data);
    }
    for (int64_t i = 0; i < v->n_items; i++) kiln_value_free(v->items[i]);
    free(v->items);
    kiln_value_free(v->inner);
    free(v);
}

kiln_status kiln_value_create_tensor(kiln_dtype dt, int rank, const int64_t *dims,
                                     const void *data, size_t nbytes, kiln_value **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    kiln_status st = kiln_tensor_new(dt, rank, dims, out, NULL);
    if (st) return st;
    kiln_value *v = *out;
    if (data) {
        if (nbytes != v->nbytes) {
            kiln_value_free(v);
            *out = NULL;
            return KILN_ERR_INVALID_ARG;
        }
        if (dt == KILN_DTYPE_STRING) {
            for (int64_t i = 0; i < v->numel; i++) {
                const char *s = ((const char *const *)data)[i];
                if (!s) s = "";
                st = kiln_tensor_set_string(v, i, s, strlen(s), NULL);
                if (st) {
                    kiln_value_free(v);
                    *out = NULL;
                    return st;
                }
            }
        } else if (nbytes) {
            memcpy(v->data, data, nbytes);
        }
    }
    return KILN_OK;
}

kiln_status kiln_value_wrap_tensor(kiln_dtype dt, int rank, const int64_t *dims, void *data,
                                   size_t nbytes, kiln_value **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (dt == KILN_DTYPE_STRING) return KILN_ERR_INVALID_ARG;
    kiln_status st = tensor_header(dt, rank, dims, out, NULL);
    if (st) return st;
    if (nbytes != (*out)->nbytes || (!data && nbytes)) {
        kiln_value_free(*out);
        *out = NULL;
        return KILN_ERR_INVALID_ARG;
    }
    (*out)->data = (*out)->nbytes ? data : NULL;
    return KILN_OK;
}

kiln_status kiln_value_wrap_device_tensor(kiln_dtype dt, int rank, const int64_t *dims, void *data,
                                          size_t nbytes, kiln_value **out)
{
    kiln_status st = kiln_value_wrap_tensor(dt, rank, dims, data, nbytes, out);
    if (!st) (*out)->on_device = true;
    return st;
}

bool kiln_value_on_device(const kiln_value *v) { return v && v->kind == KILN_VALUE_TENSOR && v->on_device; }

kiln_status kiln_value_create_sequence(kiln_dtype elem, kiln_value **items, int64_t n,
                                       kiln_value **out)
{
    if (!out || (n && !items) || n < 0) return KILN_ERR_INVALID_ARG;
    kiln_status st = kiln_sequence_new(elem, out, NULL);
    for (int64_t i = 0; i < n; i++) {
        if (!st && kiln_value_on_device(items[i])) st = KILN_ERR_INVALID_ARG;
        if (st) {
            kiln_value_free(items[i]);
            continue;
        }
        st = kiln_sequence_insert(*out, -1, items[i], NULL);
    }
    if (st) {
        kiln_value_free(*out);
        *out = NULL;
    }
    return st;
}

kiln_status kiln_value_create_optional(kiln_dtype elem, kiln_value *inner, kiln_value **out)
{
    if (!out || kiln_value_on_device(inner)) {
        kiln_value_free(inner);
        if (out) *out = NULL;
        return KILN_ERR_INVALID_ARG;
    }
    return kiln_optional_new(elem, inner, out, NULL);
}

kiln_status kiln_value_clone(const kiln_value *v, kiln_value **out)
{
    if (!v || !out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (kiln_value_on_device(v)) return KILN_ERR_INVALID_ARG; /* device memory: not readable here */
    return kiln_value_copy(v, out, NULL);
}

kiln_value_kind kiln_value_kind_of(const kiln_value *v) { return v ? v->kind : 0; }
kiln_dtype kiln_value_dtype(const kiln_value *v) { return v ? v->dtype : KILN_DTYPE_UNDEFINED; }
int kiln_value_rank(const kiln_value *v) { return v && v->kind == KILN_VALUE_TENSOR ? v->rank : 0; }

const int64_t *kiln_value_dims(const kiln_value *v)
{
    return v && v->kind == KILN_VALUE_TENSOR ? v->dims : NULL;
}

int64_t kiln_value_numel(const kiln_value *v) { return v && v->kind == KILN_VALUE_TENSOR ? v->numel : 0; }
size_t kiln_value_nbytes(const kiln_value *v) { return v && v->kind == KILN_VALUE_TENSOR ? v->nbytes : 0; }
void *kiln_value_data(const kiln_value *v) { return v && v->kind == KILN_VALUE_TENSOR ? v->data : NULL; }

int64_t kiln_value_sequence_length(const kiln_value *v)
{
    return v && v->kind == KILN_VALUE_SEQUENCE ? v->n_items : 0;
}

const kiln_value *kiln_value_sequence_at(const kiln_value *v, int64_t i)
{
    if (!v || v->kind != KILN_VALUE_SEQUENCE || i < 0 || i >= v->n_items) return NULL;
    return v->items[i];
}

const kiln_value *kiln_value_optional_get(const kiln_value *v)
{
    return v && v->kind == KILN_VALUE_OPTIONAL ? v->inner : NULL;
}
