/* control.c - If, Loop and Scan (control flow over subgraphs), the tensor helpers they share
 * with the sequence ops, and the family table kiln_ops_control (sequences and optionals live in
 * control_sequence.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/control.h"
#include "ops/util.h"

/* ---- shared helpers ---- */

static int64_t prod(const int64_t *dims, int from, int to)
{
    int64_t p = 1;
    for (int k = from; k < to; k++) p *= dims[k];
    return p;
}

/* Copies n elements of src from element soff into dst at element doff (same dtype). */
static kiln_status copy_elems(kiln_run_ctx *c, kiln_value *dst, int64_t doff, const kiln_value *src, int64_t soff,
                              int64_t n)
{
    if (n <= 0) return KILN_OK;
    if (src->dtype == KILN_DTYPE_STRING) {
        for (int64_t i = 0; i < n; i++) {
            const char *s = ((char *const *)src->data)[soff + i];
            KILN_TRY(kiln_tensor_set_string(dst, doff + i, s, strlen(s), kiln_run_err(c)));
        }
        return KILN_OK;
    }
    size_t es = kiln_dtype_size(src->dtype);
    memcpy((char *)dst->data + (size_t)doff * es, (const char *)src->data + (size_t)soff * es, (size_t)n * es);
    return KILN_OK;
}

kiln_status kiln_control_slice(kiln_run_ctx *c, const kiln_value *X, int axis, int64_t start, int64_t len,
                               bool keep, kiln_value **out)
{
    int64_t dims[KILN_MAX_RANK];
    int r = 0;
    for (int k = 0; k < X->rank; k++)
        if (k != axis || keep) dims[r++] = k == axis ? len : X->dims[k];
    KILN_TRY(kiln_tensor_new(X->dtype, r, dims, out, kiln_run_err(c)));
    int64_t outer = prod(X->dims, 0, axis), inner = prod(X->dims, axis + 1, X->rank), n = X->dims[axis];
    for (int64_t o = 0; o < outer; o++) {
        kiln_status st = copy_elems(c, *out, o * len * inner, X, (o * n + start) * inner, len * inner);
        if (st) {
            kiln_value_free(*out);
            *out = NULL;
            return st;
        }
    }
    return KILN_OK;
}

static void dims_str(const kiln_value *v, char *buf, size_t size)
{
    size_t at = (size_t)snprintf(buf, size, "[");
    for (int k = 0; k < v->rank && at < size; k++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", k ? "," : "", (long long)v->dims[k]);
    if (at < size) snprintf(buf + at, size - at, "]");
}

kiln_status kiln_control_concat(kiln_run_ctx *c, const kiln_value *const *items, int64_t n, int axis,
                                bool new_axis, bool reverse, kiln_value **out)
{
    *out = NULL;
    if (n <= 0) return kiln_run_fail(c, KILN_ERR_RUNTIME, "nothing to concatenate");
    const kiln_value *a = items[0];
    int rank = a->rank + (new_axis ? 1 : 0);
    if (rank > KILN_MAX_RANK)
        return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "result rank %d exceeds %d", rank, KILN_MAX_RANK);
    if (axis < 0 || axis >= rank || (!new_axis && rank == 0))
        return kiln_run_fail(c, KILN_ERR_MODEL, "axis %d out of range for rank %d", axis, rank);
    int64_t total = 0;
    for (int64_t t = 0; t < n; t++) {
        const kiln_value *b = items[t];
        bool same = b->kind == KILN_VALUE_TENSOR && b->dtype == a->dtype && b->rank == a->rank;
        for (int k = 0; same && k < a->rank; k++)
            if (b->dims[k] != a->dims[k] && (new_axis || k != axis)) same = false;
        if (!same) {
            char sa[256], sb[256];
            dims_str(a, sa, sizeof sa);
            dims_str(b, sb, sizeof sb);
            return kiln_run_fail(c, KILN_ERR_SHAPE, "item %lld is %s%s, item 0 is %s%s (joining along axis %d%s)",
                                 (long long)t, kiln_dtype_name(b->dtype), sb, kiln_dtype_name(a->dtype), sa, axis,
                                 new_axis ? ", new axis" : "");
        }
        total += new_axis ? 1 : b->dims[axis];
    }
    int64_t dims[KILN_MAX_RANK];
    if (new_axis) {
        for (int k = 0, j = 0; k < rank; k++) dims[k] = k == axis ? total : a->dims[j++];
    } else {
        memcpy(dims, a->dims, (size_t)rank * sizeof *dims);
        dims[axis] = total;
    }
    KILN_TRY(kiln_tensor_new(a->dtype, rank, dims, out, kiln_run_err(c)));
    /* per item: `outer` blocks of len * inner elements */
    int64_t outer = prod(a->dims, 0, axis), inner = prod(a->dims, new_axis ? axis : axis + 1, a->rank), at = 0;
    for (int64_t i = 0; i < n; i++) {
        const kiln_value *b = items[reverse ? n - 1 - i : i];
        int64_t len = new_axis ? 1 : b->dims[axis];
        for (int64_t o = 0; o < outer; o++) {
            kiln_status st = copy_elems(c, *out, (o * total + at) * inner, b, o * len * inner, len * inner);
            if (st) {
                kiln_value_free(*out);
                *out = NULL;
                return st;
            }
        }
        at += len;
    }
    return KILN_OK;
}

void kiln_control_merge_type(kiln_infer_ctx *c, const kiln_type *a, const kiln_type *b, bool per_item,
                             kiln_type *t)
{
    kiln_type_unknown(t);
    if (a->kind != b->kind) return;
    t->kind = a->kind;
    t->elem_kind = a->elem_kind == b->elem_kind ? a->elem_kind : 0;
    t->dtype = a->dtype == b->dtype ? a->dtype : KILN_DTYPE_UNDEFINED;
    if (a->rank != b->rank || a->rank < 0) return;
    t->rank = a->rank;
    for (int k = 0; k < a->rank; k++) {
        if (kiln_dim_equal(a->dims[k], b->dims[k])) {
            t->dims[k] = a->dims[k];
        } else if (per_item) {
            t->rank = -1;
            return;
        } else {
            t->dims[k] = kiln_infer_fresh(c, "d");
        }
    }
}

void kiln_control_outer_type(kiln_infer_ctx *c, const kiln_type *body, kiln_type *t)
{
    *t = *body;
    for (int k = 0; k < t->rank; k++)
        if (!kiln_dim_is_const(t->dims[k])) t->dims[k] = kiln_infer_fresh(c, "d");
}

static bool types_equal(const kiln_type *a, const kiln_type *b)
{
    if (a->kind != b->kind || a->elem_kind != b->elem_kind || a->dtype != b->dtype || a->rank != b->rank)
        return false;
    for (int k = 0; k < a->rank; k++)
        if (!kiln_dim_equal(a->dims[k], b->dims[k])) return false;
    return true;
}

/* Reads a one-element bool/number tensor as a condition or count. */
static kiln_status read_scalar(kiln_run_ctx *c, const kiln_value *v, const char *what, int64_t *out)
{
    *out = 0;
    if (!v || v->kind != KILN_VALUE_TENSOR || v->numel != 1 || v->dtype == KILN_DTYPE_STRING)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "%s must be a one-element tensor", what);
    *out = kiln_load_i64(v->dtype, v->data, 0);
    return KILN_OK;
}

/* Makes the scan output of a loop that ran zero times: the body's declared output type with a
 * 0-length axis inserted at axis (rank 1 when the body's type is not fully known). */
static kiln_status empty_scan_output(kiln_run_ctx *c, const kiln_type *t, int axis, kiln_value **out)
{
    int64_t dims[KILN_MAX_RANK] = {0};
    int rank = 1;
    bool known = t->kind == KILN_VALUE_TENSOR && t->rank >= 0 && t->rank < KILN_MAX_RANK;
    for (int k = 0; known && k < t->rank; k++)
        if (!kiln_dim_is_const(t->dims[k])) known = false;
    if (known && axis <= t->rank) {
        rank = t->rank + 1;
        for (int k = 0, j = 0; k < rank; k++) dims[k] = k == axis ? 0 : t->dims[j++].c;
    }
    kiln_dtype dt = kiln_dtype_valid(t->dtype) ? t->dtype : KILN_DTYPE_FLOAT32;
    return kiln_tensor_new(dt, rank, dims, out, kiln_run_err(c));
}

/* Runs g with the given inputs into a new array of its outputs (release with free_values). */
static kiln_status run_body(kiln_run_ctx *c, const kiln_graph *g, const kiln_value *const *in, kiln_value ***out)
{
    *out = calloc((size_t)g->n_outputs + 1, sizeof **out);
    if (!*out) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    kiln_status st = kiln_run_subgraph(c, g, g->n_inputs, in, *out);
    if (st) {
        free(*out);
        *out = NULL;
    }
    return st;
}

static void free_values(kiln_value **v, int64_t n)
{
    if (!v) return;
    for (int64_t i = 0; i < n; i++) kiln_value_free(v[i]);
    free(v);
}

/* ---- If ---- */

static kiln_status if_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_graph *gt = kiln_attr_graph(n, "then_branch"), *ge = kiln_attr_graph(n, "else_branch");
    if (!gt || !ge) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs then_branch and else_branch graphs");
    if (gt->n_outputs != n->n_out || ge->n_outputs != n->n_out)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "node has %d outputs, then_branch %d, else_branch %d", n->n_out,
                               gt->n_outputs, ge->n_outputs);
    const kiln_type *cond = kiln_infer_in(c, 0);
    if (!cond) return kiln_infer_fail(c, KILN_ERR_MODEL, "input 'cond' is missing");
    if (cond->kind != KILN_VALUE_TENSOR || (cond->dtype && cond->dtype != KILN_DTYPE_BOOL))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input 'cond' must be a bool tensor");
    const kiln_value *cv = kiln_infer_in_value(c, 0);
    for (int i = 0; i < n->n_out; i++) {
        kiln_type t;
        if (!kiln_infer_dims(c)) /* run time: the branch decides */
            kiln_type_unknown(&t);
        else if (cv && cv->numel == 1)
            t = (kiln_load_i64(cv->dtype, cv->data, 0) ? gt : ge)->outputs[i]->type;
        else if (types_equal(&gt->outputs[i]->type, &ge->outputs[i]->type))
            t = gt->outputs[i]->type;
        else
            kiln_control_merge_type(c, &gt->outputs[i]->type, &ge->outputs[i]->type, false, &t);
        KILN_TRY(kiln_infer_set_out_type(c, i, &t));
    }
    return KILN_OK;
}

static kiln_status if_run(kiln_run_ctx *c)
{
    int64_t cond = 0;
    KILN_TRY(read_scalar(c, kiln_run_in(c, 0), "cond", &cond));
    const kiln_graph *g = kiln_attr_graph(kiln_run_node(c), cond ? "then_branch" : "else_branch");
    kiln_value **out;
    KILN_TRY(run_body(c, g, NULL, &out));
    kiln_status st = KILN_OK;
    for (int i = 0; i < g->n_outputs; i++) {
        if (!st) st = kiln_run_set_out(c, i, out[i]);
        else kiln_value_free(out[i]);
    }
    free(out);
    return st;
}

/* ---- Loop ---- */

/* Outer type of a loop-carried value: the initial value's type when the body provably keeps it
 * (or `fixed`: Scan requires states to keep their shape), else the body output's type seen from
 * outside. */
static void carried_type(kiln_infer_ctx *c, const kiln_type *init, const kiln_type *body_in,
                         const kiln_type *body_out, bool fixed, kiln_type *t)
{
    if (init && (fixed || (body_in->kind && types_equal(body_in, body_out)))) *t = *init;
    else if (body_out->kind) kiln_control_outer_type(c, body_out, t);
    else kiln_type_unknown(t);
}

/* Outer type of a scan output: the body output's type with an axis of length len inserted. */
static void scan_out_type(kiln_infer_ctx *c, const kiln_type *body_out, int64_t axis, kiln_dim len, kiln_type *t)
{
    kiln_type_unknown(t);
    t->kind = KILN_VALUE_TENSOR;
    t->dtype = body_out->dtype;
    if (body_out->kind != KILN_VALUE_TENSOR || body_out->rank < 0 || body_out->rank >= KILN_MAX_RANK) return;
    int ax;
    if (!kiln_axis_norm(axis, body_out->rank + 1, &ax)) return;
    kiln_type inner;
    kiln_control_outer_type(c, body_out, &inner);
    t->rank = body_out->rank + 1;
    for (int k = 0, j = 0; k < t->rank; k++) t->dims[k] = k == ax ? len : inner.dims[j++];
}

static kiln_status loop_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_graph *body = kiln_attr_graph(n, "body");
    int nc = n->n_in - 2;
    if (!body) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs a body graph");
    if (nc < 0 || body->n_inputs != n->n_in || body->n_outputs != n->n_out + 1 || n->n_out < nc)
        return kiln_infer_fail(c, KILN_ERR_MODEL,
                               "body takes %d inputs and gives %d outputs; node has %d inputs and %d outputs "
                               "(body needs 2 + carried inputs, 1 + carried + scan outputs)",
                               body->n_inputs, body->n_outputs, n->n_in, n->n_out);
    /* without a cond input the loop runs exactly M times */
    kiln_dim iters;
    int n_m = 0;
    if (!kiln_infer_dims(c) || kiln_infer_in(c, 1) || !kiln_infer_in_dims_value(c, 0, &iters, 1, &n_m) ||
        n_m != 1 || (kiln_dim_is_const(iters) && iters.c < 0))
        iters = kiln_infer_fresh(c, "iters");
    for (int i = 0; i < n->n_out; i++) {
        kiln_type t;
        const kiln_type *bo = &body->outputs[1 + i]->type;
        if (!kiln_infer_dims(c)) kiln_type_unknown(&t);
        else if (i < nc) carried_type(c, kiln_infer_in(c, 2 + i), &body->inputs[2 + i]->type, bo, false, &t);
        else scan_out_type(c, bo, 0, iters, &t);
        KILN_TRY(kiln_infer_set_out_type(c, i, &t));
    }
    return KILN_OK;
}

/* A growable list of per-iteration scan output values. */
typedef struct value_list {
    kiln_value **v;
    int64_t n, cap;
} value_list;

static kiln_status list_push(kiln_run_ctx *c, value_list *l, kiln_value *v)
{
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 8;
        kiln_value **p = realloc(l->v, (size_t)cap * sizeof *p);
        if (!p) {
            kiln_value_free(v);
            return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        }
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return KILN_OK;
}

/* Hands over a stacked scan output (new axis `axis`), or an empty one when nothing ran. */
static kiln_status set_scan_out(kiln_run_ctx *c, int i, const kiln_type *body_out, kiln_value *const *items,
                                int64_t n, int axis, bool reverse)
{
    kiln_value *y;
    if (n) KILN_TRY(kiln_control_concat(c, (const kiln_value *const *)items, n, axis, true, reverse, &y));
    else KILN_TRY(empty_scan_output(c, body_out, axis, &y));
    return kiln_run_set_out(c, i, y);
}

static kiln_status loop_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_graph *body = kiln_attr_graph(n, "body");
    int nc = n->n_in - 2, ns = n->n_out - nc;
    int64_t trip = INT64_MAX, go = 1;
    bool has_cond = kiln_run_in(c, 1) != NULL; /* without it the body's cond output is ignored */
    if (kiln_run_in(c, 0)) KILN_TRY(read_scalar(c, kiln_run_in(c, 0), "M (trip count)", &trip));
    if (has_cond) KILN_TRY(read_scalar(c, kiln_run_in(c, 1), "cond", &go));
    kiln_status st = KILN_OK;
    kiln_value *iter_v = NULL, *cond_v = NULL, **bout = NULL;
    const kiln_value **bin = calloc((size_t)n->n_in + 1, sizeof *bin);
    kiln_value **state = calloc((size_t)nc + 1, sizeof *state);
    value_list *scans = calloc((size_t)ns + 1, sizeof *scans);
    if (!bin || !state || !scans) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((st = kiln_tensor_new(KILN_DTYPE_INT64, 0, NULL, &iter_v, kiln_run_err(c)))) goto out;
    if ((st = kiln_tensor_new(KILN_DTYPE_BOOL, 0, NULL, &cond_v, kiln_run_err(c)))) goto out;
    for (int64_t it = 0; go && it < trip; it++) {
        *(int64_t *)iter_v->data = it;
        *(bool *)cond_v->data = true;
        bin[0] = iter_v;
        bin[1] = cond_v;
        for (int i = 0; i < nc; i++) bin[2 + i] = state[i] ? state[i] : kiln_run_in(c, 2 + i);
        if ((st = run_body(c, body, bin, &bout))) goto out;
        if (has_cond && (st = read_scalar(c, bout[0], "body output 'cond'", &go))) goto out;
        for (int i = 0; i < nc; i++) {
            kiln_value_free(state[i]);
            state[i] = bout[1 + i];
            bout[1 + i] = NULL;
        }
        for (int k = 0; k < ns; k++) {
            st = list_push(c, &scans[k], bout[1 + nc + k]);
            bout[1 + nc + k] = NULL;
            if (st) goto out;
        }
        free_values(bout, body->n_outputs);
        bout = NULL;
    }
    for (int i = 0; i < nc; i++) {
        kiln_value *y = state[i];
        state[i] = NULL;
        if (!y && !kiln_run_in(c, 2 + i)) {
            st = kiln_run_fail(c, KILN_ERR_RUNTIME, "loop-carried input %d is absent and the body never ran",
                               2 + i);
            goto out;
        }
        if (!y && (st = kiln_value_copy(kiln_run_in(c, 2 + i), &y, kiln_run_err(c)))) goto out;
        if ((st = kiln_run_set_out(c, i, y))) goto out;
    }
    for (int k = 0; k < ns; k++)
        if ((st = set_scan_out(c, nc + k, &body->outputs[1 + nc + k]->type, scans[k].v, scans[k].n, 0, false)))
            goto out;
out:
    free_values(bout, body->n_outputs);
    for (int k = 0; scans && k < ns; k++) free_values(scans[k].v, scans[k].n);
    free_values(state, nc);
    free(scans);
    free(bin);
    kiln_value_free(iter_v);
    kiln_value_free(cond_v);
    return st;
}

/* ---- Scan ---- */

/* Scan's layout: opset 8 has a leading sequence_lens input and a batch axis. */
typedef struct scan_shape {
    int first;      /* index of the first state input (1 in opset 8, else 0) */
    int n_state;    /* N: state variables */
    int n_scan_in;  /* M: scan inputs */
    int n_scan_out; /* K: scan outputs */
} scan_shape;

static kiln_status scan_layout(const kiln_node *n, int opset, const kiln_graph *body, scan_shape *s, char *why,
                               size_t why_size)
{
    int64_t m = kiln_attr_int(n, "num_scan_inputs", -1);
    s->first = opset < 9 ? 1 : 0;
    s->n_scan_in = (int)m;
    s->n_state = n->n_in - s->first - (int)m;
    s->n_scan_out = n->n_out - s->n_state;
    if (!body) return snprintf(why, why_size, "needs a body graph"), KILN_ERR_MODEL;
    if (m < 1 || m > n->n_in - s->first || s->n_scan_out < 0 || body->n_inputs != s->n_state + s->n_scan_in ||
        body->n_outputs != n->n_out) {
        snprintf(why, why_size,
                 "num_scan_inputs %lld with %d inputs and %d outputs does not fit a body of %d inputs and "
                 "%d outputs",
                 (long long)m, n->n_in, n->n_out, body->n_inputs, body->n_outputs);
        return KILN_ERR_MODEL;
    }
    return KILN_OK;
}

static kiln_status scan_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_graph *body = kiln_attr_graph(n, "body");
    scan_shape s;
    char why[256];
    kiln_status st = scan_layout(n, kiln_infer_opset(c), body, &s, why, sizeof why);
    if (st) return kiln_infer_fail(c, st, "%s", why);
    int n_axes;
    const int64_t *in_axes = kiln_attr_ints(n, "scan_input_axes", &n_axes);
    int n_out_axes;
    const int64_t *out_axes = kiln_attr_ints(n, "scan_output_axes", &n_out_axes);
    if ((in_axes && n_axes != s.n_scan_in) || (out_axes && n_out_axes != s.n_scan_out))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "scan_input_axes has %d entries for %d scan inputs, "
                               "scan_output_axes %d for %d scan outputs",
                               n_axes, s.n_scan_in, n_out_axes, s.n_scan_out);
    /* the scan length, from the first scan input (opset 9+) */
    kiln_dim len = kiln_infer_dims(c) ? kiln_infer_fresh(c, "len") : kiln_dim_unknown();
    const kiln_type *x0 = kiln_infer_in(c, s.first + s.n_state);
    int ax;
    if (s.first == 0 && x0 && x0->rank > 0 && kiln_axis_norm(in_axes ? in_axes[0] : 0, x0->rank, &ax))
        len = x0->dims[ax];
    for (int i = 0; i < n->n_out; i++) {
        kiln_type t;
        const kiln_type *bo = &body->outputs[i]->type;
        if (!kiln_infer_dims(c)) {
            kiln_type_unknown(&t); /* run time: the kernel hands the outputs over */
        } else if (s.first) {
            kiln_type_unknown(&t); /* opset 8's batched layout: only the dtype */
            t.kind = KILN_VALUE_TENSOR;
            t.dtype = bo->dtype;
        } else if (i < s.n_state) {
            carried_type(c, kiln_infer_in(c, i), &body->inputs[i]->type, bo, true, &t);
        } else {
            scan_out_type(c, bo, out_axes ? out_axes[i - s.n_state] : 0, len, &t);
        }
        KILN_TRY(kiln_infer_set_out_type(c, i, &t));
    }
    return KILN_OK;
}

/* One scan over `len` steps: states start at init[0..ns), scan input j is read at step t along
 * axes[j] (from the end when dirs[j]). Final states go to fin[0..ns) and the body's scan
 * outputs to items[k * len + t]; all owned by the caller, also on failure. */
static kiln_status scan_pass(kiln_run_ctx *c, const kiln_graph *body, const scan_shape *s,
                             const kiln_value *const *init, const kiln_value *const *xs, const int *axes,
                             const int64_t *dirs, int64_t len, kiln_value **fin, kiln_value **items)
{
    kiln_status st = KILN_OK;
    int ni = s->n_state + s->n_scan_in;
    const kiln_value **bin = calloc((size_t)ni + 1, sizeof *bin);
    kiln_value **slices = calloc((size_t)s->n_scan_in + 1, sizeof *slices), **bout = NULL;
    if (!bin || !slices) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int64_t t = 0; t < len; t++) {
        for (int j = 0; j < s->n_scan_in; j++) {
            kiln_value_free(slices[j]);
            slices[j] = NULL;
            if ((st = kiln_control_slice(c, xs[j], axes[j], dirs[j] ? len - 1 - t : t, 1, false, &slices[j])))
                goto out;
            bin[s->n_state + j] = slices[j];
        }
        for (int i = 0; i < s->n_state; i++) bin[i] = fin[i] ? fin[i] : init[i];
        if ((st = run_body(c, body, bin, &bout))) goto out;
        for (int i = 0; i < s->n_state; i++) {
            kiln_value_free(fin[i]);
            fin[i] = bout[i];
        }
        for (int k = 0; k < s->n_scan_out; k++) items[k * len + t] = bout[s->n_state + k];
        free(bout);
        bout = NULL;
    }
    for (int i = 0; i < s->n_state; i++)
        if (!fin[i] && (st = kiln_value_copy(init[i], &fin[i], kiln_run_err(c)))) goto out;
out:
    free_values(slices, s->n_scan_in);
    free(bin);
    return st;
}

/* Reads a per-input attribute list (absent: zeros) of `want` entries. */
static kiln_status scan_attr(kiln_run_ctx *c, const char *name, int want, const int64_t **v)
{
    static const int64_t zeros[KILN_MAX_RANK * 4];
    int n;
    *v = kiln_attr_ints(kiln_run_node(c), name, &n);
    if (!*v) {
        if (want > (int)(sizeof zeros / sizeof zeros[0]))
            return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "%d scan inputs/outputs without '%s'", want, name);
        *v = zeros;
        return KILN_OK;
    }
    if (n != want) return kiln_run_fail(c, KILN_ERR_MODEL, "'%s' has %d entries, expected %d", name, n, want);
    return KILN_OK;
}

/* Scan-9+: N states, M scan inputs along scan_input_axes, K scan outputs stacked along
 * scan_output_axes; both directions per input/output. */
static kiln_status scan9_run(kiln_run_ctx *c, const kiln_graph *body, const scan_shape *s)
{
    const int64_t *in_axes, *in_dirs, *out_axes, *out_dirs;
    KILN_TRY(scan_attr(c, "scan_input_axes", s->n_scan_in, &in_axes));
    KILN_TRY(scan_attr(c, "scan_input_directions", s->n_scan_in, &in_dirs));
    KILN_TRY(scan_attr(c, "scan_output_axes", s->n_scan_out, &out_axes));
    KILN_TRY(scan_attr(c, "scan_output_directions", s->n_scan_out, &out_dirs));
    const kiln_value **ins = calloc((size_t)s->n_state + s->n_scan_in + 1, sizeof *ins);
    int *axes = calloc((size_t)s->n_scan_in + 1, sizeof *axes);
    kiln_value **fin = calloc((size_t)s->n_state + 1, sizeof *fin), **items = NULL;
    int64_t len = 0;
    kiln_status st = KILN_OK;
    if (!ins || !axes || !fin) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < s->n_state + s->n_scan_in; i++) ins[i] = kiln_run_in(c, i);
    for (int j = 0; j < s->n_scan_in; j++) {
        const kiln_value *x = ins[s->n_state + j];
        if (!x || x->kind != KILN_VALUE_TENSOR || !kiln_axis_norm(in_axes[j], x->rank, &axes[j])) {
            st = kiln_run_fail(c, KILN_ERR_SHAPE, "scan input %d: needs a tensor with axis %lld (rank %d)", j,
                               (long long)in_axes[j], x && x->kind == KILN_VALUE_TENSOR ? x->rank : -1);
            goto out;
        }
        if (j == 0) len = x->dims[axes[j]];
        if (x->dims[axes[j]] != len) {
            st = kiln_run_fail(c, KILN_ERR_SHAPE, "scan input %d has length %lld along axis %d, scan input 0 %lld",
                               j, (long long)x->dims[axes[j]], axes[j], (long long)len);
            goto out;
        }
    }
    for (int i = 0; i < s->n_state; i++)
        if (!ins[i]) {
            st = kiln_run_fail(c, KILN_ERR_MODEL, "state input %d is absent", i);
            goto out;
        }
    items = calloc((size_t)(s->n_scan_out * len) + 1, sizeof *items);
    if (!items) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((st = scan_pass(c, body, s, ins, ins + s->n_state, axes, in_dirs, len, fin, items))) goto out;
    for (int i = 0; i < s->n_state; i++) {
        st = kiln_run_set_out(c, i, fin[i]);
        fin[i] = NULL;
        if (st) goto out;
    }
    for (int k = 0; k < s->n_scan_out; k++) {
        const kiln_type *bt = &body->outputs[s->n_state + k]->type;
        int rank = len ? items[k * len]->rank : bt->rank, ax;
        if (!kiln_axis_norm(out_axes[k], (rank < 0 ? 0 : rank) + 1, &ax)) {
            st = kiln_run_fail(c, KILN_ERR_MODEL, "scan_output_axes[%d] = %lld out of range for rank %d", k,
                               (long long)out_axes[k], rank + 1);
            goto out;
        }
        if ((st = set_scan_out(c, s->n_state + k, bt, items + k * len, len, ax, out_dirs[k] != 0))) goto out;
    }
out:
    free_values(items, s->n_scan_out * len);
    free_values(fin, s->n_state);
    free(axes);
    free(ins);
    return st;
}

/* Stacks per-(batch, step) scan outputs items[b * L + t] into [B, L, ...]; steps past a
 * batch's sequence length (NULL items) stay zero. */
static kiln_status scan8_stack(kiln_run_ctx *c, int out, const kiln_type *bt, kiln_value *const *items, int64_t B,
                               int64_t L)
{
    const kiln_value *tmpl = NULL;
    for (int64_t i = 0; i < B * L && !tmpl; i++) tmpl = items[i];
    int64_t dims[KILN_MAX_RANK] = {B, L};
    int rank = 2;
    kiln_dtype dt = tmpl ? tmpl->dtype : kiln_dtype_valid(bt->dtype) ? bt->dtype : KILN_DTYPE_FLOAT32;
    if (tmpl && tmpl->rank + 2 > KILN_MAX_RANK)
        return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "scan output rank %d exceeds %d", tmpl->rank + 2,
                             KILN_MAX_RANK);
    for (int k = 0; tmpl && k < tmpl->rank; k++) dims[rank++] = tmpl->dims[k];
    kiln_value *y;
    KILN_TRY(kiln_run_alloc_out(c, out, dt, rank, dims, &y));
    for (int64_t i = 0; i < B * L; i++) {
        const kiln_value *v = items[i];
        if (!v) continue;
        bool same = v->kind == KILN_VALUE_TENSOR && v->dtype == dt && v->rank == rank - 2;
        for (int k = 0; same && k < v->rank; k++) same = v->dims[k] == dims[k + 2];
        if (!same)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "scan output %d changes shape or type at batch %lld step %lld",
                                 out, (long long)(i / L), (long long)(i % L));
        KILN_TRY(copy_elems(c, y, i * v->numel, v, 0, v->numel));
    }
    return KILN_OK;
}

/* Scan-8: sequence_lens, then N states [B, ...] and M scan inputs [B, L, ...] (directions per
 * scan input); each batch runs its own scan. */
static kiln_status scan8_run(kiln_run_ctx *c, const kiln_graph *body, const scan_shape *s)
{
    const int64_t *dirs;
    KILN_TRY(scan_attr(c, "directions", s->n_scan_in, &dirs));
    int ns = s->n_state, nx = s->n_scan_in, nk = s->n_scan_out;
    const kiln_value *lens = kiln_run_in(c, 0), *x0 = kiln_run_in(c, 1 + ns);
    if (!x0 || x0->kind != KILN_VALUE_TENSOR || x0->rank < 2)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "scan inputs must be tensors [batch, sequence, ...]");
    int64_t B = x0->dims[0], L = x0->dims[1];
    for (int i = 0; i < ns + nx; i++) {
        const kiln_value *v = kiln_run_in(c, 1 + i);
        bool ok = v && v->kind == KILN_VALUE_TENSOR && v->rank >= (i < ns ? 1 : 2) && v->dims[0] == B &&
                  (i < ns || v->dims[1] == L);
        if (!ok)
            return kiln_run_fail(c, KILN_ERR_SHAPE, "input %d must be a tensor [%lld%s, ...] (batch%s)", 1 + i,
                                 (long long)B, i < ns ? "" : ", L", i < ns ? "" : ", sequence");
    }
    if (lens && (lens->kind != KILN_VALUE_TENSOR || !kiln_dtype_is_int(lens->dtype) || lens->numel != B))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "sequence_lens must hold %lld integers", (long long)B);
    static const int axes0[KILN_MAX_RANK * 4];
    if (nx > (int)(sizeof axes0 / sizeof axes0[0]))
        return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "%d scan inputs", nx);
    kiln_status st = KILN_OK;
    const kiln_value **in_b = calloc((size_t)(ns + nx) + 1, sizeof *in_b);
    kiln_value **owned_b = calloc((size_t)(ns + nx) + 1, sizeof *owned_b);
    kiln_value **fin = calloc((size_t)(ns * B) + 1, sizeof *fin);
    kiln_value **items = calloc((size_t)(nk * B * L) + 1, sizeof *items);
    kiln_value **items_b = calloc((size_t)(nk * L) + 1, sizeof *items_b);
    const kiln_value **gather = calloc((size_t)B + 1, sizeof *gather);
    if (!in_b || !owned_b || !fin || !items || !items_b || !gather) {
        st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int64_t b = 0; b < B; b++) {
        int64_t len = lens ? kiln_load_i64(lens->dtype, lens->data, b) : L;
        if (len < 0 || len > L) {
            st = kiln_run_fail(c, KILN_ERR_RUNTIME, "sequence_lens[%lld] = %lld outside [0, %lld]", (long long)b,
                               (long long)len, (long long)L);
            goto out;
        }
        for (int i = 0; i < ns + nx; i++) {
            kiln_value_free(owned_b[i]);
            owned_b[i] = NULL;
            if ((st = kiln_control_slice(c, kiln_run_in(c, 1 + i), 0, b, 1, false, &owned_b[i]))) goto out;
            in_b[i] = owned_b[i];
        }
        kiln_value **fin_b = fin + b * ns;
        st = scan_pass(c, body, s, in_b, in_b + ns, axes0, dirs, len, fin_b, items_b);
        for (int k = 0; k < nk; k++)
            for (int64_t t = 0; t < len; t++) {
                items[(k * B + b) * L + t] = items_b[k * len + t];
                items_b[k * len + t] = NULL;
            }
        if (st) goto out;
    }
    /* fin is [b][i]: gather each state's batch items */
    for (int i = 0; i < ns; i++) {
        for (int64_t b = 0; b < B; b++) gather[b] = fin[b * ns + i];
        kiln_value *y = NULL;
        st = B ? kiln_control_concat(c, gather, B, 0, true, false, &y)
               : kiln_value_copy(kiln_run_in(c, 1 + i), &y, kiln_run_err(c));
        if (!st) st = kiln_run_set_out(c, i, y);
        if (st) goto out;
    }
    for (int k = 0; k < nk; k++)
        if ((st = scan8_stack(c, ns + k, &body->outputs[ns + k]->type, items + k * B * L, B, L))) goto out;
out:
    free_values(items_b, nk * L);
    free_values(items, nk * B * L);
    free_values(fin, ns * B);
    free_values(owned_b, ns + nx);
    free(in_b);
    free(gather);
    return st;
}

static kiln_status scan_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_graph *body = kiln_attr_graph(n, "body");
    scan_shape s;
    char why[256];
    kiln_status st = scan_layout(n, kiln_run_opset(c), body, &s, why, sizeof why);
    if (st) return kiln_run_fail(c, st, "%s", why);
    return s.first ? scan8_run(c, body, &s) : scan9_run(c, body, &s);
}

static const kiln_op_def defs[] = {
    {"", "If", 1, if_infer, if_run},
    {"", "Loop", 1, loop_infer, loop_run, KILN_OP_X_OPTIONAL},
    {"", "Scan", 8, scan_infer, scan_run, KILN_OP_X_OPTIONAL},
    {"", "SequenceConstruct", 11, kiln_control_seq_construct_infer, kiln_control_seq_construct_run},
    {"", "SequenceEmpty", 11, kiln_control_seq_empty_infer, kiln_control_seq_empty_run, KILN_OP_X_OPTIONAL},
    {"", "SequenceInsert", 11, kiln_control_seq_insert_infer, kiln_control_seq_insert_run},
    {"", "SequenceAt", 11, kiln_control_seq_at_infer, kiln_control_seq_at_run},
    {"", "SequenceErase", 11, kiln_control_seq_erase_infer, kiln_control_seq_erase_run},
    {"", "SequenceLength", 11, kiln_control_seq_length_infer, kiln_control_seq_length_run},
    {"", "SplitToSequence", 11, kiln_control_split_to_seq_infer, kiln_control_split_to_seq_run},
    {"", "ConcatFromSequence", 11, kiln_control_concat_from_seq_infer, kiln_control_concat_from_seq_run},
    {"", "SequenceMap", 17, kiln_control_seq_map_infer, kiln_control_seq_map_run},
    {"", "Optional", 15, kiln_control_optional_infer, kiln_control_optional_run, KILN_OP_X_OPTIONAL},
    {"", "OptionalHasElement", 15, kiln_control_opt_has_infer, kiln_control_opt_has_run, KILN_OP_X_OPTIONAL},
    {"", "OptionalGetElement", 15, kiln_control_opt_get_infer, kiln_control_opt_get_run},
};

const kiln_op_table kiln_ops_control = {defs, sizeof defs / sizeof defs[0]};
