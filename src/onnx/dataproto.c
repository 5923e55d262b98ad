/* dataproto.c - decoding of serialized TensorProto, SequenceProto and OptionalProto (the
 * `.pb` files of ONNX test data). onnx.proto lacks the last two (they live in onnx-data.proto),
 * so their few fields are read with a small wire-format reader; tensors go through protobuf-c. */
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx_pb.h"

typedef struct wire {
    const unsigned char *p, *end;
} wire;

static bool read_varint(wire *w, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && w->p < w->end; shift += 7) {
        unsigned char b = *w->p++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return true;
    }
    return false;
}

/* Reads the next field; for length-delimited fields, data and len receive the payload. */
static bool next_field(wire *w, uint32_t *field, uint32_t *wt, uint64_t *num, const unsigned char **data, size_t *len)
{
    uint64_t key;
    if (!read_varint(w, &key)) return false;
    *field = (uint32_t)(key >> 3);
    *wt = key & 7;
    switch (*wt) {
    case 0: return read_varint(w, num);
    case 1:
        if (w->end - w->p < 8) return false;
        w->p += 8;
        return true;
    case 5:
        if (w->end - w->p < 4) return false;
        w->p += 4;
        return true;
    case 2:
        if (!read_varint(w, num) || *num > (uint64_t)(w->end - w->p)) return false;
        *data = w->p;
        *len = (size_t)*num;
        w->p += *len;
        return true;
    default: return false;
    }
}

static kiln_status decode_tensor(const unsigned char *buf, size_t len, kiln_value **out, char **name, kiln_err *err)
{
    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, len, buf);
    if (!tp) return kiln_errf(err, KILN_ERR_MODEL, "not a valid TensorProto (%zu bytes)", len);
    kiln_status st = kiln_onnx_tensor(tp, NULL, out, err);
    if (!st && name && tp->name && *tp->name) *name = strdup(tp->name);
    onnx__tensor_proto__free_unpacked(tp, NULL);
    return st;
}

static kiln_status decode(const unsigned char *buf, size_t len, kiln_value_kind kind, kiln_value **out, char **name,
                          int depth, kiln_err *err);

/* SequenceProto: name=1, elem_type=2, tensor_values=3, sequence_values=5, optional_values=7.
 * OptionalProto: name=1, elem_type=2, tensor_value=3, sequence_value=5, optional_value=7. */
static kiln_status decode_container(const unsigned char *buf, size_t len, kiln_value_kind kind, kiln_value **out,
                                    char **name, int depth, kiln_err *err)
{
    if (depth > 16) return kiln_errf(err, KILN_ERR_MODEL, "nesting too deep");
    kiln_value *c = NULL;
    kiln_value *inner = NULL;
    kiln_status st = kind == KILN_VALUE_SEQUENCE ? kiln_sequence_new(KILN_DTYPE_UNDEFINED, &c, err) : KILN_OK;
    if (st) return st;
    wire w = {buf, buf + len};
    int64_t elem_type = 0;
    while (!st && w.p < w.end) {
        uint32_t f, wt;
        uint64_t num = 0;
        const unsigned char *data = NULL;
        size_t dlen = 0;
        if (!next_field(&w, &f, &wt, &num, &data, &dlen)) {
            st = kiln_errf(err, KILN_ERR_MODEL, "malformed %s proto", kind == KILN_VALUE_SEQUENCE ? "sequence" : "optional");
            break;
        }
        if (f == 1 && wt == 2 && name && !*name) {
            *name = malloc(dlen + 1);
            if (*name) {
                memcpy(*name, data, dlen);
                (*name)[dlen] = '\0';
            }
        } else if (f == 2 && wt == 0) {
            elem_type = (int64_t)num;
        } else if (wt == 2 && (f == 3 || f == 5 || f == 7)) {
            kiln_value_kind k = f == 3 ? KILN_VALUE_TENSOR : f == 5 ? KILN_VALUE_SEQUENCE : KILN_VALUE_OPTIONAL;
            kiln_value *item;
            st = decode(data, dlen, k, &item, NULL, depth + 1, err);
            if (st) break;
            if (kind == KILN_VALUE_SEQUENCE) {
                if (c->dtype == KILN_DTYPE_UNDEFINED) c->dtype = item->dtype;
                st = kiln_sequence_insert(c, -1, item, err);
            } else {
                kiln_value_free(inner);
                inner = item;
            }
        } else if (wt == 2 && (f == 4 || f == 6)) {
            st = kiln_errf(err, KILN_ERR_UNSUPPORTED, "sparse tensors and maps in test data are not supported");
        }
    }
    (void)elem_type;
    if (!st && kind == KILN_VALUE_OPTIONAL) {
        st = kiln_optional_new(KILN_DTYPE_UNDEFINED, inner, &c, err);
        inner = NULL;
    }
    kiln_value_free(inner);
    if (st) {
        kiln_value_free(c);
        return st;
    }
    *out = c;
    return KILN_OK;
}

static kiln_status decode(const unsigned char *buf, size_t len, kiln_value_kind kind, kiln_value **out, char **name,
                          int depth, kiln_err *err)
{
    if (kind == KILN_VALUE_TENSOR) return decode_tensor(buf, len, out, name, err);
    if (kind == KILN_VALUE_SEQUENCE || kind == KILN_VALUE_OPTIONAL)
        return decode_container(buf, len, kind, out, name, depth, err);
    return kiln_errf(err, KILN_ERR_INVALID_ARG, "unknown value kind %d", (int)kind);
}

kiln_status kiln_value_decode_proto(const void *buf, size_t len, kiln_value_kind kind, kiln_value **out,
                                    char **name_out, char *errbuf, size_t err_size)
{
    kiln_err err = {0};
    if (name_out) *name_out = NULL;
    if (!out || (!buf && len)) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    kiln_status st = decode(buf, len, kind, out, name_out, 0, &err);
    if (st && name_out) {
        free(*name_out);
        *name_out = NULL;
    }
    if (st && errbuf && err_size) {
        strncpy(errbuf, err.msg, err_size - 1);
        errbuf[err_size - 1] = '\0';
    }
    return st;
}
