/* control_sequence.c - sequence ops (SequenceConstruct/Empty/Insert/At/Erase/Length, SplitToSequence,
 * ConcatFromSequence, SequenceMap) and optional ops (Optional, OptionalHasElement,
 * OptionalGetElement); listed in kiln_ops_control (control.c). */
#include <stdlib.h>
#include <string.h>

#include "ops/control.h"
#include "ops/util.h"

static const char *kind_name(kiln_value_kind k)
{
    if (k == KILN_VALUE_TENSOR) return "tensor";
    if (k == KILN_VALUE_SEQUENCE) return "sequence";
    return k == KILN_VALUE_OPTIONAL ? "optional" : "unknown";
}

/* Fails unless input i is present and (when its kind is known) of kind k. */
static kiln_status need_kind(kiln_infer_ctx *c, int i, kiln_value_kind k, const kiln_type **t)
{
    *t = kiln_infer_in(c, i);
    if (!*t) return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d is missing", i);
    if ((*t)->kind && (*t)->kind != k)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d must be a %s, got a %s", i, kind_name(k),
                               kind_name((*t)->kind));
    return KILN_OK;
}

/* Output i is handed over by the kernel: at run time give it no type, so nothing is allocated. */
static bool run_time_unknown(kiln_infer_ctx *c, int i, kiln_status *st)
{
    if (kiln_infer_dims(c)) return false;
    kiln_type t;
    kiln_type_unknown(&t);
    *st = kiln_infer_set_out_type(c, i, &t);
    return true;
}

/* Sequence type whose elements have tensor type elem (kind ignored). */
static kiln_status set_seq_out(kiln_infer_ctx *c, int i, const kiln_type *elem)
{
    kiln_type t = *elem;
    t.kind = KILN_VALUE_SEQUENCE;
    t.elem_kind = 0;
    return kiln_infer_set_out_type(c, i, &t);
}

static kiln_status set_seq_out_dtype(kiln_infer_ctx *c, int i, kiln_dtype dt)
{
    kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = dt;
    return set_seq_out(c, i, &t);
}

/* Reads an optional position input against a sequence of n items: valid in [-n, n - 1 + extra]
 * (extra = 1 for insertion); absent gives def. */
static kiln_status read_position(kiln_run_ctx *c, int i, int64_t n, int extra, int64_t def, int64_t *pos)
{
    const kiln_value *p = kiln_run_in(c, i);
    if (!p) {
        *pos = def;
        return KILN_OK;
    }
    if (p->kind != KILN_VALUE_TENSOR || p->numel != 1 || !kiln_dtype_is_int(p->dtype))
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "position must be one integer");
    int64_t v = kiln_load_i64(p->dtype, p->data, 0);
    if (v < -n || v > n - 1 + extra)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "position %lld out of range [%lld, %lld] for a sequence of %lld",
                             (long long)v, (long long)-n, (long long)(n - 1 + extra), (long long)n);
    *pos = v < 0 ? v + n : v;
    return KILN_OK;
}

static const kiln_value *seq_in(kiln_run_ctx *c, int i)
{
    const kiln_value *s = kiln_run_in(c, i);
    return s && s->kind == KILN_VALUE_SEQUENCE ? s : NULL;
}

static kiln_status set_copy(kiln_run_ctx *c, int i, const kiln_value *v)
{
    kiln_value *y;
    KILN_TRY(kiln_value_copy(v, &y, kiln_run_err(c)));
    return kiln_run_set_out(c, i, y);
}

/* ---- SequenceConstruct, SequenceEmpty ---- */

kiln_status kiln_control_seq_construct_infer(kiln_infer_ctx *c)
{
    const kiln_type *a, *b;
    if (kiln_infer_n_in(c) < 1) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs at least one input");
    KILN_TRY(need_kind(c, 0, KILN_VALUE_TENSOR, &a));
    kiln_type t = *a;
    for (int i = 1; i < kiln_infer_n_in(c); i++) {
        KILN_TRY(need_kind(c, i, KILN_VALUE_TENSOR, &b));
        if (a->dtype && b->dtype && a->dtype != b->dtype)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d is %s, input 0 is %s", i, kiln_dtype_name(b->dtype),
                                   kiln_dtype_name(a->dtype));
        if (kiln_infer_dims(c)) {
            kiln_type m = t;
            kiln_control_merge_type(c, &m, b, true, &t);
        }
    }
    if (!kiln_infer_dims(c)) t.rank = -1;
    return set_seq_out(c, 0, &t);
}

kiln_status kiln_control_seq_construct_run(kiln_run_ctx *c)
{
    kiln_value *s;
    KILN_TRY(kiln_sequence_new(kiln_run_in(c, 0)->dtype, &s, kiln_run_err(c)));
    for (int i = 0; i < kiln_run_n_in(c); i++) {
        kiln_value *v;
        kiln_status st = kiln_value_copy(kiln_run_in(c, i), &v, kiln_run_err(c));
        if (!st) st = kiln_sequence_insert(s, -1, v, kiln_run_err(c));
        if (st) {
            kiln_value_free(s);
            return st;
        }
    }
    return kiln_run_set_out(c, 0, s);
}

kiln_status kiln_control_seq_empty_infer(kiln_infer_ctx *c)
{
    int64_t dt = kiln_attr_int(kiln_infer_node(c), "dtype", KILN_DTYPE_FLOAT32);
    if (!kiln_dtype_valid((kiln_dtype)dt))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "dtype %lld is not a tensor element type", (long long)dt);
    return set_seq_out_dtype(c, 0, (kiln_dtype)dt);
}

kiln_status kiln_control_seq_empty_run(kiln_run_ctx *c)
{
    kiln_dtype dt = (kiln_dtype)kiln_attr_int(kiln_run_node(c), "dtype", KILN_DTYPE_FLOAT32);
    kiln_value *s;
    KILN_TRY(kiln_sequence_new(dt, &s, kiln_run_err(c)));
    return kiln_run_set_out(c, 0, s);
}

/* ---- SequenceInsert, SequenceAt, SequenceErase, SequenceLength ---- */

kiln_status kiln_control_seq_insert_infer(kiln_infer_ctx *c)
{
    const kiln_type *s, *x;
    KILN_TRY(need_kind(c, 0, KILN_VALUE_SEQUENCE, &s));
    KILN_TRY(need_kind(c, 1, KILN_VALUE_TENSOR, &x));
    if (s->dtype && x->dtype && s->dtype != x->dtype)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "inserting a %s tensor into a sequence of %s",
                               kiln_dtype_name(x->dtype), kiln_dtype_name(s->dtype));
    kiln_type elem = *s, t = *x;
    elem.kind = KILN_VALUE_TENSOR;
    if (kiln_infer_dims(c)) kiln_control_merge_type(c, &elem, x, true, &t);
    else t.rank = -1;
    if (!t.dtype) t.dtype = s->dtype ? s->dtype : x->dtype;
    return set_seq_out(c, 0, &t);
}

kiln_status kiln_control_seq_insert_run(kiln_run_ctx *c)
{
    const kiln_value *s = seq_in(c, 0), *x = kiln_run_in(c, 1);
    if (!s || !x || x->kind != KILN_VALUE_TENSOR)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "needs a sequence and a tensor");
    if ((s->n_items || s->dtype != KILN_DTYPE_UNDEFINED) && x->dtype != s->dtype)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "inserting a %s tensor into a sequence of %s",
                             kiln_dtype_name(x->dtype), kiln_dtype_name(s->dtype));
    int64_t pos;
    KILN_TRY(read_position(c, 2, s->n_items, 1, s->n_items, &pos));
    kiln_value *y, *v;
    KILN_TRY(kiln_value_copy(s, &y, kiln_run_err(c)));
    y->dtype = x->dtype;
    kiln_status st = kiln_value_copy(x, &v, kiln_run_err(c));
    if (!st) st = kiln_sequence_insert(y, pos, v, kiln_run_err(c));
    if (st) {
        kiln_value_free(y);
        return st;
    }
    return kiln_run_set_out(c, 0, y);
}

kiln_status kiln_control_seq_at_infer(kiln_infer_ctx *c)
{
    const kiln_type *s, *p;
    KILN_TRY(need_kind(c, 0, KILN_VALUE_SEQUENCE, &s));
    KILN_TRY(need_kind(c, 1, KILN_VALUE_TENSOR, &p));
    kiln_status st;
    if (run_time_unknown(c, 0, &st)) return st;
    if (s->rank < 0) return kiln_infer_set_out_unknown(c, 0, s->dtype);
    return kiln_infer_set_out(c, 0, s->dtype, s->rank, s->dims);
}

kiln_status kiln_control_seq_at_run(kiln_run_ctx *c)
{
    const kiln_value *s = seq_in(c, 0);
    if (!s) return kiln_run_fail(c, KILN_ERR_RUNTIME, "input 0 must be a sequence");
    if (!kiln_run_in(c, 1)) return kiln_run_fail(c, KILN_ERR_MODEL, "input 'position' is missing");
    int64_t pos;
    KILN_TRY(read_position(c, 1, s->n_items, 0, 0, &pos));
    return set_copy(c, 0, s->items[pos]);
}

kiln_status kiln_control_seq_erase_infer(kiln_infer_ctx *c)
{
    const kiln_type *s;
    KILN_TRY(need_kind(c, 0, KILN_VALUE_SEQUENCE, &s));
    return kiln_infer_set_out_type(c, 0, s);
}

kiln_status kiln_control_seq_erase_run(kiln_run_ctx *c)
{
    const kiln_value *s = seq_in(c, 0);
    if (!s) return kiln_run_fail(c, KILN_ERR_RUNTIME, "input 0 must be a sequence");
    if (!s->n_items) return kiln_run_fail(c, KILN_ERR_RUNTIME, "erasing from an empty sequence");
    int64_t pos;
    KILN_TRY(read_position(c, 1, s->n_items, 0, s->n_items - 1, &pos));
    kiln_value *y;
    KILN_TRY(kiln_value_copy(s, &y, kiln_run_err(c)));
    kiln_value_free(y->items[pos]);
    memmove(y->items + pos, y->items + pos + 1, (size_t)(y->n_items - pos - 1) * sizeof *y->items);
    y->n_items--;
    return kiln_run_set_out(c, 0, y);
}

kiln_status kiln_control_seq_length_infer(kiln_infer_ctx *c)
{
    const kiln_type *s;
    KILN_TRY(need_kind(c, 0, KILN_VALUE_SEQUENCE, &s));
    return kiln_infer_set_out(c, 0, KILN_DTYPE_INT64, 0, NULL);
}

kiln_status kiln_control_seq_length_run(kiln_run_ctx *c)
{
    const kiln_value *s = seq_in(c, 0);
    if (!s) return kiln_run_fail(c, KILN_ERR_RUNTIME, "input 0 must be a sequence");
    *(int64_t *)kiln_run_out(c, 0)->data = s->n_items;
    return KILN_OK;
}

/* ---- SplitToSequence, ConcatFromSequence ---- */

kiln_status kiln_control_split_to_seq_infer(kiln_infer_ctx *c)
{
    const kiln_type *x, *split = kiln_infer_in(c, 1);
    KILN_TRY(need_kind(c, 0, KILN_VALUE_TENSOR, &x));
    const kiln_node *n = kiln_infer_node(c);
    int64_t axis = kiln_attr_int(n, "axis", 0), keep = kiln_attr_int(n, "keepdims", 1);
    kiln_type t = *x;
    int ax;
    if (x->rank < 0 || !kiln_infer_dims(c)) {
        t.rank = -1;
        return set_seq_out(c, 0, &t);
    }
    if (!kiln_axis_norm(axis, x->rank, &ax))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld out of range for rank %d", (long long)axis, x->rank);
    if (split && split->rank > 1)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "split must be a scalar or 1-D, has rank %d", split->rank);
    kiln_dim chunk;
    int n_chunk;
    if (split) {
        /* items share a shape only when a scalar split divides the axis */
        bool even = split->rank == 0 && kiln_infer_in_dims_value(c, 1, &chunk, 1, &n_chunk) && n_chunk == 1 &&
                    kiln_dim_is_const(chunk) && chunk.c > 0 && kiln_dim_is_const(x->dims[ax]) &&
                    x->dims[ax].c % chunk.c == 0;
        if (even) t.dims[ax] = chunk;
        else t.rank = -1;
    } else if (keep) {
        t.dims[ax] = kiln_dim_const(1);
    } else {
        memmove(t.dims + ax, t.dims + ax + 1, (size_t)(x->rank - ax - 1) * sizeof *t.dims);
        t.rank--;
    }
    return set_seq_out(c, 0, &t);
}

kiln_status kiln_control_split_to_seq_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *split = kiln_run_in(c, 1);
    const kiln_node *n = kiln_run_node(c);
    int64_t axis = kiln_attr_int(n, "axis", 0);
    bool keep = kiln_attr_int(n, "keepdims", 1) != 0 || split;
    int ax;
    if (X->kind != KILN_VALUE_TENSOR) return kiln_run_fail(c, KILN_ERR_RUNTIME, "input must be a tensor");
    if (!kiln_axis_norm(axis, X->rank, &ax))
        return kiln_run_fail(c, KILN_ERR_MODEL, "axis %lld out of range for rank %d", (long long)axis, X->rank);
    int64_t dim = X->dims[ax], chunk = 1, count = dim;
    if (split && (split->kind != KILN_VALUE_TENSOR || !kiln_dtype_is_int(split->dtype) || split->rank > 1))
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "split must be an integer scalar or 1-D tensor");
    if (split && split->rank == 0) {
        chunk = kiln_load_i64(split->dtype, split->data, 0);
        if (chunk <= 0) return kiln_run_fail(c, KILN_ERR_RUNTIME, "split %lld must be positive", (long long)chunk);
        count = (dim + chunk - 1) / chunk;
    } else if (split) {
        int64_t sum = 0;
        count = split->numel;
        for (int64_t i = 0; i < count; i++) {
            int64_t v = kiln_load_i64(split->dtype, split->data, i);
            if (v < 0 || v > dim - sum)
                return kiln_run_fail(c, KILN_ERR_RUNTIME, "split[%lld] = %lld: sizes must be >= 0 and sum to %lld",
                                     (long long)i, (long long)v, (long long)dim);
            sum += v;
        }
        if (sum != dim)
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "split sums to %lld, axis %d has %lld", (long long)sum, ax,
                                 (long long)dim);
    }
    kiln_value *s;
    KILN_TRY(kiln_sequence_new(X->dtype, &s, kiln_run_err(c)));
    for (int64_t i = 0, at = 0; i < count; i++) {
        int64_t len = split && split->rank == 1 ? kiln_load_i64(split->dtype, split->data, i)
                                                : (dim - at < chunk ? dim - at : chunk);
        kiln_value *v;
        kiln_status st = kiln_control_slice(c, X, ax, at, len, keep, &v);
        if (!st) st = kiln_sequence_insert(s, -1, v, kiln_run_err(c));
        if (st) {
            kiln_value_free(s);
            return st;
        }
        at += len;
    }
    return kiln_run_set_out(c, 0, s);
}

kiln_status kiln_control_concat_from_seq_infer(kiln_infer_ctx *c)
{
    const kiln_type *s;
    KILN_TRY(need_kind(c, 0, KILN_VALUE_SEQUENCE, &s));
    const kiln_node *n = kiln_infer_node(c);
    int64_t axis = kiln_attr_int(n, "axis", 0), new_axis = kiln_attr_int(n, "new_axis", 0);
    if (!kiln_node_attr(n, "axis")) return kiln_infer_fail(c, KILN_ERR_MODEL, "attribute 'axis' is required");
    kiln_status st;
    if (run_time_unknown(c, 0, &st)) return st;
    int rank = s->rank < 0 ? -1 : s->rank + (new_axis ? 1 : 0), ax;
    if (rank < 0 || rank > KILN_MAX_RANK) return kiln_infer_set_out_unknown(c, 0, s->dtype);
    if (!kiln_axis_norm(axis, rank, &ax))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld out of range for rank %d", (long long)axis, rank);
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0, j = 0; k < rank; k++) {
        if (k != ax) {
            dims[k] = s->dims[j++];
            continue;
        }
        dims[k] = kiln_infer_fresh(c, "n"); /* the item count, or the sum of the items' dims */
        if (!new_axis) j++;
    }
    return kiln_infer_set_out(c, 0, s->dtype, rank, dims);
}

kiln_status kiln_control_concat_from_seq_run(kiln_run_ctx *c)
{
    const kiln_value *s = seq_in(c, 0);
    if (!s) return kiln_run_fail(c, KILN_ERR_RUNTIME, "input 0 must be a sequence");
    if (!s->n_items) return kiln_run_fail(c, KILN_ERR_RUNTIME, "the sequence is empty");
    const kiln_node *n = kiln_run_node(c);
    bool new_axis = kiln_attr_int(n, "new_axis", 0) != 0;
    int64_t axis = kiln_attr_int(n, "axis", 0);
    int rank = s->items[0]->rank + (new_axis ? 1 : 0), ax;
    if (!kiln_axis_norm(axis, rank, &ax))
        return kiln_run_fail(c, KILN_ERR_MODEL, "axis %lld out of range for rank %d", (long long)axis, rank);
    kiln_value *y;
    KILN_TRY(kiln_control_concat(c, (const kiln_value *const *)s->items, s->n_items, ax, new_axis, false, &y));
    return kiln_run_set_out(c, 0, y);
}

/* ---- SequenceMap ---- */

kiln_status kiln_control_seq_map_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_graph *body = kiln_attr_graph(n, "body");
    const kiln_type *s;
    KILN_TRY(need_kind(c, 0, KILN_VALUE_SEQUENCE, &s));
    if (!body || body->n_inputs != n->n_in || body->n_outputs != n->n_out)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "body must take %d inputs and give %d outputs", n->n_in, n->n_out);
    for (int i = 0; i < n->n_out; i++) {
        const kiln_type *bo = &body->outputs[i]->type;
        kiln_type t;
        kiln_type_unknown(&t);
        t.dtype = bo->dtype;
        /* elements may differ in shape: keep only fully constant body shapes */
        bool fixed = kiln_infer_dims(c) && bo->kind == KILN_VALUE_TENSOR && bo->rank >= 0;
        for (int k = 0; fixed && k < bo->rank; k++) fixed = kiln_dim_is_const(bo->dims[k]);
        if (fixed) t = *bo;
        KILN_TRY(set_seq_out(c, i, &t));
    }
    return KILN_OK;
}

kiln_status kiln_control_seq_map_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_graph *body = kiln_attr_graph(n, "body");
    const kiln_value *s = seq_in(c, 0);
    if (!s) return kiln_run_fail(c, KILN_ERR_RUNTIME, "input 0 must be a sequence");
    for (int j = 1; j < n->n_in; j++) {
        const kiln_value *v = kiln_run_in(c, j);
        if (!v) return kiln_run_fail(c, KILN_ERR_MODEL, "input %d is missing", j);
        if (v->kind == KILN_VALUE_SEQUENCE && v->n_items != s->n_items)
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "input %d has %lld items, input 0 %lld", j,
                                 (long long)v->n_items, (long long)s->n_items);
    }
    kiln_status st = KILN_OK;
    const kiln_value **bin = calloc((size_t)n->n_in + 1, sizeof *bin);
    kiln_value **ys = calloc((size_t)n->n_out + 1, sizeof *ys);
    kiln_value **bout = calloc((size_t)n->n_out + 1, sizeof *bout);
    if (!bin || !ys || !bout) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n->n_out; i++) {
        kiln_dtype dt = body->outputs[i]->type.dtype;
        if ((st = kiln_sequence_new(kiln_dtype_valid(dt) ? dt : s->dtype, &ys[i], kiln_run_err(c)))) goto out;
    }
    for (int64_t t = 0; t < s->n_items; t++) {
        for (int j = 0; j < n->n_in; j++) {
            const kiln_value *v = kiln_run_in(c, j);
            bin[j] = v->kind == KILN_VALUE_SEQUENCE ? v->items[t] : v;
        }
        if ((st = kiln_run_subgraph(c, body, n->n_in, bin, bout))) goto out;
        for (int i = 0; i < n->n_out; i++) {
            kiln_value *v = bout[i];
            bout[i] = NULL;
            if (st) {
                kiln_value_free(v);
                continue;
            }
            ys[i]->dtype = v->dtype;
            st = kiln_sequence_insert(ys[i], -1, v, kiln_run_err(c)); /* takes v, also on failure */
        }
        if (st) goto out;
    }
    for (int i = 0; i < n->n_out; i++) {
        st = kiln_run_set_out(c, i, ys[i]);
        ys[i] = NULL;
        if (st) goto out;
    }
out:
    for (int i = 0; ys && i < n->n_out; i++) kiln_value_free(ys[i]);
    free(ys);
    free(bout);
    free(bin);
    return st;
}

/* ---- Optional, OptionalHasElement, OptionalGetElement ---- */

kiln_status kiln_control_optional_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    const kiln_attr *a = kiln_node_attr(kiln_infer_node(c), "type");
    kiln_type t;
    kiln_type_unknown(&t);
    if (x) {
        if (x->kind == KILN_VALUE_OPTIONAL)
            return kiln_infer_fail(c, KILN_ERR_MODEL, "input must be a tensor or a sequence, not an optional");
        t = *x;
        t.elem_kind = x->kind;
    } else if (a) {
        t.dtype = a->tp_dtype;
    } else {
        return kiln_infer_fail(c, KILN_ERR_MODEL, "needs an input or a 'type' attribute");
    }
    t.kind = KILN_VALUE_OPTIONAL;
    return kiln_infer_set_out_type(c, 0, &t);
}

kiln_status kiln_control_optional_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    const kiln_attr *a = kiln_node_attr(kiln_run_node(c), "type");
    kiln_value *inner = NULL, *y;
    if (x) KILN_TRY(kiln_value_copy(x, &inner, kiln_run_err(c)));
    KILN_TRY(kiln_optional_new(x ? x->dtype : a ? a->tp_dtype : KILN_DTYPE_UNDEFINED, inner, &y, kiln_run_err(c)));
    return kiln_run_set_out(c, 0, y);
}

/* Before opset 18 the input of OptionalHasElement/OptionalGetElement must be an optional. Checked
 * on declared types only: at run time a loop-carried optional may already hold its value plainly
 * (a body that turns an optional into a sequence), which runtimes accept. */
static kiln_status check_opt_input(kiln_infer_ctx *c, bool may_be_absent)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x && !(may_be_absent && kiln_infer_opset(c) >= 18))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input is missing");
    if (kiln_infer_dims(c) && x && x->kind && x->kind != KILN_VALUE_OPTIONAL && kiln_infer_opset(c) < 18)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input must be an optional before opset 18, got a %s",
                               kind_name(x->kind));
    return KILN_OK;
}

kiln_status kiln_control_opt_has_infer(kiln_infer_ctx *c)
{
    KILN_TRY(check_opt_input(c, true));
    return kiln_infer_set_out(c, 0, KILN_DTYPE_BOOL, 0, NULL);
}

kiln_status kiln_control_opt_has_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    *(bool *)kiln_run_out(c, 0)->data = x && (x->kind != KILN_VALUE_OPTIONAL || x->inner);
    return KILN_OK;
}

kiln_status kiln_control_opt_get_infer(kiln_infer_ctx *c)
{
    KILN_TRY(check_opt_input(c, false));
    kiln_status st;
    if (run_time_unknown(c, 0, &st)) return st;
    kiln_type t = *kiln_infer_in(c, 0);
    if (t.kind == KILN_VALUE_OPTIONAL) {
        t.kind = t.elem_kind;
        t.elem_kind = 0;
    }
    if (!t.kind) kiln_type_unknown(&t);
    return kiln_infer_set_out_type(c, 0, &t);
}

kiln_status kiln_control_opt_get_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    if (x->kind == KILN_VALUE_OPTIONAL && !x->inner)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "the optional input is empty");
    return set_copy(c, 0, x->kind == KILN_VALUE_OPTIONAL ? x->inner : x);
}
