/* tensor.c - ONNX TensorProto to kiln_value: raw, typed and external data, sub-byte unpacking. */
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "onnx/onnx_pb.h"

/* bits per element of sub-byte types, 0 for the others */
static int sub_byte_bits(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_INT4:
    case KILN_DTYPE_UINT4:
    case KILN_DTYPE_FLOAT4E2M1: return 4;
    case KILN_DTYPE_INT2:
    case KILN_DTYPE_UINT2: return 2;
    default: return 0;
    }
}

/* unpacks sub-byte elements (lowest bits first) into one byte each, sign-extending signed types */
static void unpack_sub_byte(kiln_dtype dt, const unsigned char *src, int64_t numel, uint8_t *dst)
{
    int bits = sub_byte_bits(dt);
    int per = 8 / bits;
    uint8_t mask = (uint8_t)((1u << bits) - 1);
    bool sign = dt == KILN_DTYPE_INT4 || dt == KILN_DTYPE_INT2;
    for (int64_t i = 0; i < numel; i++) {
        uint8_t v = (src[i / per] >> ((i % per) * bits)) & mask;
        if (sign && (v >> (bits - 1))) v |= (uint8_t)~mask;
        dst[i] = v;
    }
}

static kiln_status fill_from_bytes(kiln_value *v, const unsigned char *p, size_t n, kiln_err *err)
{
    int bits = sub_byte_bits(v->dtype);
    size_t want = bits ? (size_t)((v->numel * bits + 7) / 8) : v->nbytes;
    if (n != want)
        return kiln_errf(err, KILN_ERR_MODEL, "tensor data has %zu bytes, %zu expected", n, want);
    if (bits) unpack_sub_byte(v->dtype, p, v->numel, v->data);
    else if (n) memcpy(v->data, p, n);
    return KILN_OK;
}

static kiln_status count_check(size_t have, int64_t want, const char *field, kiln_err *err)
{
    if ((int64_t)have != want)
        return kiln_errf(err, KILN_ERR_MODEL, "tensor %s holds %zu elements, %lld expected", field,
                         have, (long long)want);
    return KILN_OK;
}

static kiln_status fill_external(kiln_value **vp, const Onnx__TensorProto *tp,
                                 const kiln_tensor_source *src, kiln_err *err)
{
    kiln_value *v = *vp;
    const char *location = NULL;
    int64_t offset = 0, length = -1;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const Onnx__StringStringEntryProto *e = tp->external_data[i];
        if (!e->key || !e->value) continue;
        char *end;
        if (!strcmp(e->key, "location")) location = e->value;
        else if (!strcmp(e->key, "offset") || !strcmp(e->key, "length")) {
            long long x = strtoll(e->value, &end, 10);
            if (*end || x < 0) return kiln_errf(err, KILN_ERR_MODEL, "bad external data %s '%s'", e->key, e->value);
            if (!strcmp(e->key, "offset")) offset = x;
            else length = x;
        }
    }
    if (!location) return kiln_errf(err, KILN_ERR_MODEL, "external tensor without a location");
    if (!src || !src->maps)
        return kiln_errf(err, KILN_ERR_MODEL, "external data '%s' is not allowed here", location);
    const unsigned char *addr;
    size_t len;
    KILN_TRY(kiln_external_map(src->maps, src->base_dir, location, &addr, &len, err));
    int bits = sub_byte_bits(v->dtype);
    size_t want = bits ? (size_t)((v->numel * bits + 7) / 8) : v->nbytes;
    if (length < 0) length = (int64_t)want;
    if ((size_t)offset > len || (size_t)length > len - (size_t)offset)
        return kiln_errf(err, KILN_ERR_MODEL,
                         "external data '%s': offset %lld + length %lld beyond the file's %zu bytes",
                         location, (long long)offset, (long long)length, len);
    const unsigned char *p = addr + offset;
    size_t es = kiln_dtype_size(v->dtype);
    if (!bits && v->dtype != KILN_DTYPE_STRING && (size_t)length == want && ((uintptr_t)p % es) == 0) {
        /* zero-copy: the value borrows the mapping, which lives as long as the model */
        free(v->data);
        v->data = want ? (void *)p : NULL;
        v->owns_data = false;
        return KILN_OK;
    }
    return fill_from_bytes(v, p, (size_t)length, err);
}

/* Upper bound of the elements a tensor's own data fields can hold (4 per raw byte for 2-bit
 * types, generous for packed fields). */
static uint64_t inline_capacity(const Onnx__TensorProto *tp)
{
    return (uint64_t)tp->raw_data.len * 4 + tp->n_float_data + (uint64_t)tp->n_int32_data * 8 + tp->n_string_data +
           tp->n_int64_data + tp->n_double_data + tp->n_uint64_data;
}

kiln_status kiln_onnx_tensor(const Onnx__TensorProto *tp, const kiln_tensor_source *src,
                             kiln_value **out, kiln_err *err)
{
    *out = NULL;
    kiln_dtype dt = (kiln_dtype)tp->data_type;
    if (!kiln_dtype_valid(dt))
        return kiln_errf(err, KILN_ERR_MODEL, "tensor '%s' has unknown data type %d",
                         tp->name ? tp->name : "", (int)tp->data_type);
    if (tp->n_dims > KILN_MAX_RANK)
        return kiln_errf(err, KILN_ERR_UNSUPPORTED, "tensor rank %zu exceeds %d", tp->n_dims, KILN_MAX_RANK);
    if (tp->segment) return kiln_errf(err, KILN_ERR_UNSUPPORTED, "segmented tensors are not supported");
    kiln_value *v = NULL;
    int64_t numel = 0;
    bool external = tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    kiln_status st = kiln_dims_numel((int)tp->n_dims, tp->dims, &numel, err);
    /* a few bytes of file must not make kiln allocate the gigabytes they declare */
    if (!st && !external && (uint64_t)numel > inline_capacity(tp))
        st = kiln_errf(err, KILN_ERR_MODEL, "declares %lld elements but holds data for at most %llu",
                       (long long)numel, (unsigned long long)inline_capacity(tp));
    if (!st) st = kiln_tensor_new(dt, (int)tp->n_dims, tp->dims, &v, err);
    if (st) {
        /* negative dims or an element count that overflows: the file is at fault */
        if (st == KILN_ERR_INVALID_ARG) st = KILN_ERR_MODEL;
        if (err) {
            err->code = st;
            kiln_err_prefix(err, "tensor '%s'", tp->name ? tp->name : "");
        }
        return st;
    }
    int64_t n = v->numel;
    if (external) {
        if (dt == KILN_DTYPE_STRING) st = kiln_errf(err, KILN_ERR_MODEL, "external string tensors are invalid");
        else st = fill_external(&v, tp, src, err);
    } else if (tp->has_raw_data && dt != KILN_DTYPE_STRING) {
        const unsigned char *raw = tp->raw_data.data;
        if (src && src->borrow_raw && !sub_byte_bits(dt) && tp->raw_data.len == v->nbytes && v->nbytes &&
            (uintptr_t)raw % kiln_dtype_size(dt) == 0) {
            /* zero-copy: the value reads the parsed proto, which lives as long as the model */
            free(v->data);
            v->data = (void *)raw;
            v->owns_data = false;
        } else {
            st = fill_from_bytes(v, raw, tp->raw_data.len, err);
            /* copied out of a mapped file (an unaligned raw_data): its pages can go */
            if (!st && src && src->maps) kiln_mappings_drop(*src->maps, raw, tp->raw_data.len);
        }
    } else {
        switch (dt) {
        case KILN_DTYPE_STRING:
            st = count_check(tp->n_string_data, n, "string_data", err);
            for (int64_t i = 0; !st && i < n; i++)
                st = kiln_tensor_set_string(v, i, (const char *)tp->string_data[i].data,
                                            tp->string_data[i].len, err);
            break;
        case KILN_DTYPE_FLOAT32:
            st = count_check(tp->n_float_data, n, "float_data", err);
            if (!st && n) memcpy(v->data, tp->float_data, v->nbytes);
            break;
        case KILN_DTYPE_COMPLEX64:
            st = count_check(tp->n_float_data, 2 * n, "float_data", err);
            if (!st && n) memcpy(v->data, tp->float_data, v->nbytes);
            break;
        case KILN_DTYPE_FLOAT64:
            st = count_check(tp->n_double_data, n, "double_data", err);
            if (!st && n) memcpy(v->data, tp->double_data, v->nbytes);
            break;
        case KILN_DTYPE_COMPLEX128:
            st = count_check(tp->n_double_data, 2 * n, "double_data", err);
            if (!st && n) memcpy(v->data, tp->double_data, v->nbytes);
            break;
        case KILN_DTYPE_INT64:
            st = count_check(tp->n_int64_data, n, "int64_data", err);
            if (!st && n) memcpy(v->data, tp->int64_data, v->nbytes);
            break;
        case KILN_DTYPE_UINT32:
        case KILN_DTYPE_UINT64:
            st = count_check(tp->n_uint64_data, n, "uint64_data", err);
            for (int64_t i = 0; !st && i < n; i++) kiln_store_u64(dt, v->data, i, tp->uint64_data[i]);
            break;
        default: {
            int bits = sub_byte_bits(dt);
            if (bits) {
                int64_t packed = (n * bits + 7) / 8;
                st = count_check(tp->n_int32_data, packed, "int32_data", err);
                if (st) break;
                unsigned char *tmp = malloc((size_t)packed + 1);
                if (!tmp) {
                    st = kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
                    break;
                }
                for (int64_t i = 0; i < packed; i++) tmp[i] = (unsigned char)tp->int32_data[i];
                unpack_sub_byte(dt, tmp, n, v->data);
                free(tmp);
                break;
            }
            /* int8/16, uint8/16, bool, float16, bfloat16, float8: one element per int32 */
            st = count_check(tp->n_int32_data, n, "int32_data", err);
            size_t es = kiln_dtype_size(dt);
            for (int64_t i = 0; !st && i < n; i++) {
                int32_t x = tp->int32_data[i];
                if (es == 1) ((uint8_t *)v->data)[i] = (uint8_t)x;
                else ((uint16_t *)v->data)[i] = (uint16_t)x;
            }
            if (dt == KILN_DTYPE_BOOL)
                for (int64_t i = 0; i < n; i++) ((uint8_t *)v->data)[i] = ((uint8_t *)v->data)[i] != 0;
            break;
        }
        }
    }
    if (st) {
        kiln_value_free(v);
        if (tp->name && *tp->name) kiln_err_prefix(err, "tensor '%s'", tp->name);
        return st;
    }
    *out = v;
    return KILN_OK;
}
