/* slim.c - a copy of a serialized ModelProto without the raw_data bytes of its main graph's
 * initializers, so that parsing it does not copy the weights: the loader points those
 * tensors at the mapped file instead (load.c). Only the plain wire format is handled (the
 * graph field once, each raw_data once, no groups); anything else leaves the model as it is. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/slim.h"

enum { MODEL_GRAPH = 7, GRAPH_INITIALIZER = 5, TENSOR_RAW_DATA = 9 };
enum { WIRE_VARINT = 0, WIRE_64 = 1, WIRE_LEN = 2, WIRE_32 = 5 };

static const unsigned char *varint(const unsigned char *p, const unsigned char *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; p < end && shift < 64; shift += 7) {
        unsigned char b = *p++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return p;
    }
    return NULL;
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

static unsigned char *put_varint(unsigned char *d, uint64_t v)
{
    while (v >= 0x80) *d++ = (unsigned char)(v | 0x80), v >>= 7;
    *d++ = (unsigned char)v;
    return d;
}

/* One field at p: its number, wire type, where its tag starts and its payload (for
 * length-delimited fields) lies; returns the end of the field, or NULL when malformed. */
typedef struct field {
    uint64_t number;
    int wire;
    const unsigned char *start, *payload;
    size_t payload_len;
} field;

static const unsigned char *next_field(const unsigned char *p, const unsigned char *end, field *f)
{
    uint64_t tag, v;
    f->start = p;
    if (!(p = varint(p, end, &tag))) return NULL;
    f->number = tag >> 3;
    f->wire = (int)(tag & 7);
    switch (f->wire) {
    case WIRE_VARINT: return varint(p, end, &v);
    case WIRE_64: return end - p >= 8 ? p + 8 : NULL;
    case WIRE_32: return end - p >= 4 ? p + 4 : NULL;
    case WIRE_LEN:
        if (!(p = varint(p, end, &v)) || v > (uint64_t)(end - p)) return NULL;
        f->payload = p;
        f->payload_len = (size_t)v;
        return p + v;
    default: return NULL; /* groups */
    }
}

/* The raw_data field of TensorProto [p, end) when it holds at least min_bytes: *raw is the
 * whole field (tag to end). False when malformed or raw_data appears twice. */
static bool tensor_raw(const unsigned char *p, const unsigned char *end, size_t min_bytes, field *raw, bool *big)
{
    *big = false;
    int seen = 0;
    while (p < end) {
        field f;
        const unsigned char *nx = next_field(p, end, &f);
        if (!nx) return false;
        if (f.number == TENSOR_RAW_DATA) {
            if (f.wire != WIRE_LEN || ++seen > 1) return false;
            *raw = f;
            *big = f.payload_len >= min_bytes;
        }
        p = nx;
    }
    return true;
}

/* Bytes the rewritten GraphProto [p, end) loses, or SIZE_MAX when it cannot be rewritten. */
static size_t graph_savings(const unsigned char *p, const unsigned char *end, size_t min_bytes, size_t *n_cuts)
{
    size_t saved = 0;
    *n_cuts = 0;
    while (p < end) {
        field f;
        const unsigned char *nx = next_field(p, end, &f);
        if (!nx) return SIZE_MAX;
        if (f.number == GRAPH_INITIALIZER && f.wire == WIRE_LEN) {
            field raw;
            bool big;
            if (!tensor_raw(f.payload, f.payload + f.payload_len, min_bytes, &raw, &big)) return SIZE_MAX;
            if (big) {
                size_t raw_bytes = (size_t)((raw.payload + raw.payload_len) - raw.start);
                size_t inner = f.payload_len - raw_bytes;
                saved += raw_bytes + varint_size(f.payload_len) - varint_size(inner);
                ++*n_cuts;
            }
        }
        p = nx;
    }
    return saved;
}

bool kiln_onnx_slim(const unsigned char *buf, size_t len, size_t min_bytes, unsigned char **slim, size_t *slim_len,
                    kiln_raw_cut **cuts, size_t *n_cuts)
{
    *slim = NULL;
    *cuts = NULL;
    *slim_len = *n_cuts = 0;
    const unsigned char *end = buf + len, *p = buf;
    field graph = {0};
    int graphs = 0;
    while (p < end) {
        field f;
        const unsigned char *nx = next_field(p, end, &f);
        if (!nx) return false;
        if (f.number == MODEL_GRAPH) {
            if (f.wire != WIRE_LEN || ++graphs > 1) return false;
            graph = f;
        }
        p = nx;
    }
    if (!graphs) return false;
    size_t count;
    const unsigned char *gend = graph.payload + graph.payload_len;
    size_t saved = graph_savings(graph.payload, gend, min_bytes, &count);
    if (saved == SIZE_MAX || !count) return false;
    size_t new_graph = graph.payload_len - saved;
    unsigned char *out = malloc(len);
    kiln_raw_cut *cut = calloc(count, sizeof *cut);
    if (!out || !cut) {
        free(out);
        free(cut);
        return false;
    }
    /* the model's fields before the graph, the graph's tag, its new length, its fields */
    unsigned char *d = out;
    size_t head = (size_t)(graph.start - buf);
    memcpy(d, buf, head), d += head;
    const unsigned char *tag_end = graph.start;
    uint64_t tag;
    tag_end = varint(tag_end, end, &tag);
    memcpy(d, graph.start, (size_t)(tag_end - graph.start)), d += tag_end - graph.start;
    d = put_varint(d, new_graph);
    size_t ordinal = 0, k = 0;
    for (p = graph.payload; p < gend;) {
        field f;
        const unsigned char *nx = next_field(p, gend, &f);
        field raw;
        bool big = false;
        if (f.number == GRAPH_INITIALIZER && f.wire == WIRE_LEN)
            tensor_raw(f.payload, f.payload + f.payload_len, min_bytes, &raw, &big);
        if (!big) {
            memcpy(d, p, (size_t)(nx - p)), d += nx - p;
        } else {
            size_t raw_bytes = (size_t)((raw.payload + raw.payload_len) - raw.start);
            const unsigned char *ftag_end = varint(f.start, gend, &tag);
            memcpy(d, f.start, (size_t)(ftag_end - f.start)), d += ftag_end - f.start;
            d = put_varint(d, f.payload_len - raw_bytes);
            size_t before = (size_t)(raw.start - f.payload);
            memcpy(d, f.payload, before), d += before;
            size_t after = (size_t)((f.payload + f.payload_len) - (raw.payload + raw.payload_len));
            memcpy(d, raw.payload + raw.payload_len, after), d += after;
            cut[k++] = (kiln_raw_cut){ordinal, (size_t)(raw.payload - buf), raw.payload_len};
        }
        if (f.number == GRAPH_INITIALIZER && f.wire == WIRE_LEN) ordinal++;
        p = nx;
    }
    /* the model's fields after the graph */
    memcpy(d, gend, (size_t)(end - gend)), d += end - gend;
    *slim = out;
    *slim_len = (size_t)(d - out);
    *cuts = cut;
    *n_cuts = k;
    return true;
}
