/* ops_layout.c - GPU provider family 'layout': Transpose, Concat, Split, Slice, Gather,
 * GatherElements, GatherND, ScatterND, ScatterElements (and Scatter), Pad, Expand, Tile, Range,
 * Reshape, Flatten, Squeeze, Unsqueeze, Trilu and OneHot. Element moves go by element size, so
 * every dtype of 1, 2, 4 or 8 bytes is covered (bool, int64, float16, ...).
 *
 * Index checks: the reference fails on an out-of-range index. Constant indices (initializers)
 * are checked on the host before each launch, and a bad one sends the node to the reference,
 * which reports it. Indices computed on the device cannot be checked without a sync: there an
 * out-of-range index reads zeros (Gather*) or is skipped (Scatter*). */
#include <stdio.h>
#include <string.h>

#include "gpu/gpu.h"
#include "gpu/support.h"
#include "gpu/k_layout.h"
#include "ops/semantics.h"
#include "ops/util.h"

/* ---- shared helpers ---- */

/* Element size of a dtype the byte-moving kernels take, or 0. */
static int move_size(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_UNDEFINED:
    case KILN_DTYPE_STRING:
    case KILN_DTYPE_COMPLEX128:
    case KILN_DTYPE_UINT4:
    case KILN_DTYPE_INT4:
    case KILN_DTYPE_FLOAT4E2M1:
    case KILN_DTYPE_UINT2:
    case KILN_DTYPE_INT2: return 0;
    default: break;
    }
    if (!kiln_dtype_valid(dt)) return 0;
    size_t s = kiln_dtype_size(dt);
    return s == 1 || s == 2 || s == 4 || s == 8 ? (int)s : 0;
}

/* Input i is a tensor whose dtype the byte-moving kernels take. */
static bool movable_input(const kiln_node *n, int i, char *why, size_t size)
{
    const kiln_type *t = kiln_gpu_in_type(n, i);
    if (!t || t->kind != KILN_VALUE_TENSOR) {
        snprintf(why, size, "input %d is not a tensor", i);
        return false;
    }
    if (!move_size(t->dtype)) {
        snprintf(why, size, "dtype %s", kiln_dtype_name(t->dtype));
        return false;
    }
    return true;
}

/* Input i is int32 or int64 (indices). */
static bool index_input(const kiln_node *n, int i, char *why, size_t size)
{
    const kiln_type *t = kiln_gpu_in_type(n, i);
    if (!t || (t->dtype != KILN_DTYPE_INT32 && t->dtype != KILN_DTYPE_INT64)) {
        snprintf(why, size, "indices dtype %s", t ? kiln_dtype_name(t->dtype) : "(absent)");
        return false;
    }
    return true;
}

/* Input 0 movable with a rank the kernels take (unknown ranks are checked at run time). */
static bool supports_move(const kiln_node *n, char *why, size_t size)
{
    if (!movable_input(n, 0, why, size)) return false;
    if (n->in[0]->type.rank > KILN_GPU_MAX_RANK) {
        snprintf(why, size, "rank %d > %d", n->in[0]->type.rank, KILN_GPU_MAX_RANK);
        return false;
    }
    return true;
}

static bool supports_indexed(const kiln_node *n, char *why, size_t size)
{
    return supports_move(n, why, size) && index_input(n, 1, why, size);
}

static int esize_of(const kiln_value *v) { return (int)kiln_dtype_size(v->dtype); }

static char *bytes_at(const void *p, int64_t elems, int es) { return (char *)p + elems * es; }

/* Drops size-1 dims of (rank, dims) read with strides xs and merges neighbours that x walks
 * contiguously; false when more than KILN_GPU_MAX_RANK dims remain. */
static bool view_shape(kiln_gpu_shape *s, int rank, const int64_t *dims, const int64_t *xs)
{
    int r = 0;
    int64_t d[KILN_MAX_RANK], st[KILN_MAX_RANK];
    for (int k = 0; k < rank; k++) {
        if (dims[k] == 1) continue;
        if (r > 0 && dims[k] != 0 && d[r - 1] != 0 && st[r - 1] == xs[k] * dims[k]) {
            d[r - 1] *= dims[k];
            st[r - 1] = xs[k];
            continue;
        }
        d[r] = dims[k];
        st[r] = xs[k];
        r++;
    }
    if (r > KILN_GPU_MAX_RANK) return false;
    s->rank = r;
    for (int k = 0; k < r; k++) {
        s->dims[k] = d[k];
        s->strides[k] = st[k];
    }
    return true;
}

/* y (contiguous) = x at x_off read with strides xs over y's dims. */
static kiln_status strided_copy(kiln_run_ctx *c, kiln_value *y, const kiln_value *x, int64_t x_off,
                                const int64_t *xs, const char *what)
{
    if (!y->numel) return KILN_OK;
    kiln_gpu_shape s;
    if (!view_shape(&s, y->rank, y->dims, xs)) return kiln_gpu_fallback(c);
    return kiln_gpu_check(c, kiln_gpu_layout_strided(esize_of(x), y->data, x->data, x_off, s, kiln_gpu_stream(c)),
                          what);
}

/* Whether constant indices (input `i`, an initializer) are all in [-d, d); true when they
 * are not constant (the kernels then read zeros / skip the bad ones). */
static bool const_indices_ok(kiln_run_ctx *c, int i, int64_t d)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *v = i < n->n_in ? kiln_ir_constant(n->in[i]) : NULL;
    if (!v || !v->data) return true;
    for (int64_t j = 0; j < v->numel; j++) {
        int64_t p = kiln_load_i64(v->dtype, v->data, j);
        if (p < -d || p >= d) return false;
    }
    return true;
}

/* Same for index tuples of `last` entries addressing dims[from...]. */
static bool const_tuples_ok(kiln_run_ctx *c, int i, const int64_t *dims, int last)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *v = i < n->n_in ? kiln_ir_constant(n->in[i]) : NULL;
    if (!v || !v->data || last <= 0) return true;
    for (int64_t j = 0; j < v->numel; j++) {
        int64_t p = kiln_load_i64(v->dtype, v->data, j), d = dims[j % last];
        if (p < -d || p >= d) return false;
    }
    return true;
}

static int64_t prod(const int64_t *dims, int from, int to)
{
    int64_t p = 1;
    for (int k = from; k < to; k++) p *= dims[k];
    return p;
}

/* ---- Reshape, Flatten, Squeeze, Unsqueeze: the bytes do not move ---- */

static kiln_status reshape_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    if (y->nbytes != x->nbytes) return kiln_gpu_fallback(c); /* the reference reports it */
    if (y->data == x->data || !y->nbytes) return KILN_OK;
    gpuError_t e = gpuMemcpyAsync(y->data, x->data, y->nbytes, gpuMemcpyDeviceToDevice, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "reshape copy");
}

static bool supports_reshape(const kiln_node *n, char *why, size_t size)
{
    const kiln_type *t = kiln_gpu_in_type(n, 0);
    if (!t || t->kind != KILN_VALUE_TENSOR || t->dtype == KILN_DTYPE_STRING || t->dtype == KILN_DTYPE_UNDEFINED) {
        snprintf(why, size, "dtype %s", t ? kiln_dtype_name(t->dtype) : "(absent)");
        return false;
    }
    return true;
}

/* ---- Transpose ---- */

static kiln_status transpose_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int r = x->rank, np;
    const int64_t *p = kiln_attr_ints(kiln_run_node(c), "perm", &np);
    if (p && np != r) return kiln_gpu_fallback(c);
    int64_t xs[KILN_MAX_RANK], vs[KILN_MAX_RANK];
    kiln_strides(r, x->dims, xs);
    for (int k = 0; k < r; k++) {
        int64_t a = p ? p[k] : r - 1 - k;
        if (a < 0 || a >= r) return kiln_gpu_fallback(c);
        vs[k] = xs[a];
    }
    if (!y->numel) return KILN_OK;
    kiln_gpu_shape s;
    if (!view_shape(&s, r, y->dims, vs)) return kiln_gpu_fallback(c);
    /* y [B, P, Q] reading x [B, Q, P]: tiles through shared memory when both sides are wide */
    int q = s.rank;
    if (q >= 2 && q <= 3 && s.strides[q - 2] == 1 && s.strides[q - 1] == s.dims[q - 2] && s.dims[q - 2] >= 16 &&
        s.dims[q - 1] >= 16) {
        int64_t B = q == 3 ? s.dims[0] : 1, bs = q == 3 ? s.strides[0] : 0;
        gpuError_t e = kiln_gpu_layout_transpose(esize_of(x), y->data, x->data, B, s.dims[q - 2], s.dims[q - 1], bs,
                                                 kiln_gpu_stream(c));
        return kiln_gpu_check(c, e, "transpose (tiled)");
    }
    return kiln_gpu_check(c, kiln_gpu_layout_strided(esize_of(x), y->data, x->data, 0, s, kiln_gpu_stream(c)),
                          "transpose");
}

/* ---- Concat, Split ---- */

static bool supports_concat(const kiln_node *n, char *why, size_t size)
{
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] && !movable_input(n, i, why, size)) return false;
    return true;
}

static kiln_status concat_run(kiln_run_ctx *c)
{
    kiln_value *y = kiln_run_out(c, 0);
    int64_t a = kiln_attr_int(kiln_run_node(c), "axis", 1);
    int axis;
    if (!kiln_axis_norm(a, y->rank, &axis)) return kiln_gpu_fallback(c);
    if (!y->numel) return KILN_OK;
    int es = esize_of(y);
    int64_t outer = prod(y->dims, 0, axis), yblock = prod(y->dims, axis, y->rank), off = 0;
    for (int i = 0; i < kiln_run_n_in(c); i++) {
        const kiln_value *x = kiln_run_in(c, i);
        if (!x) continue;
        int64_t xblock = prod(x->dims, axis, x->rank);
        if (off + xblock > yblock) return kiln_gpu_fallback(c);
        if (x->numel) {
            gpuError_t e = kiln_gpu_layout_copy2d(bytes_at(y->data, off, es), yblock * es, x->data, xblock * es,
                                                  outer, xblock * es, kiln_gpu_stream(c));
            KILN_TRY(kiln_gpu_check(c, e, "concat"));
        }
        off += xblock;
    }
    return KILN_OK;
}

static kiln_status split_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    int axis;
    if (!kiln_axis_norm(kiln_attr_int(kiln_run_node(c), "axis", 0), x->rank, &axis)) return kiln_gpu_fallback(c);
    int n = kiln_run_n_out(c), es = esize_of(x);
    for (int i = 0; i < n; i++)
        if (!kiln_run_out(c, i)) return kiln_gpu_fallback(c);
    int64_t outer = prod(x->dims, 0, axis), inner = prod(x->dims, axis + 1, x->rank), xblock = x->dims[axis] * inner;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        kiln_value *y = kiln_run_out(c, i);
        int64_t yblock = y->dims[axis] * inner;
        if (off + yblock > xblock) return kiln_gpu_fallback(c);
        if (y->numel) {
            gpuError_t e = kiln_gpu_layout_copy2d(y->data, yblock * es, bytes_at(x->data, off, es), xblock * es,
                                                  outer, yblock * es, kiln_gpu_stream(c));
            KILN_TRY(kiln_gpu_check(c, e, "split"));
        }
        off += yblock;
    }
    return KILN_OK;
}

/* ---- Slice ---- */

/* Up to KILN_MAX_RANK entries of an integer argument: attribute (opset < 10) or host input. */
static int slice_arg(kiln_run_ctx *c, const char *attr, int input, int64_t *v)
{
    if (kiln_run_opset(c) < 10) {
        int n;
        const int64_t *a = kiln_attr_ints(kiln_run_node(c), attr, &n);
        if (!a) return -1;
        if (n > KILN_MAX_RANK) return -2;
        memcpy(v, a, (size_t)n * sizeof *v);
        return n;
    }
    const kiln_value *t = input < kiln_run_n_in(c) ? kiln_run_in(c, input) : NULL;
    if (!t) return -1;
    if (t->numel > KILN_MAX_RANK || !kiln_dtype_is_int(t->dtype)) return -2;
    for (int64_t i = 0; i < t->numel; i++) v[i] = kiln_load_i64(t->dtype, t->data, i);
    return (int)t->numel;
}

static kiln_status slice_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int r = x->rank;
    int64_t starts[KILN_MAX_RANK], ends[KILN_MAX_RANK], axes[KILN_MAX_RANK], steps[KILN_MAX_RANK];
    int ns = slice_arg(c, "starts", 1, starts), ne = slice_arg(c, "ends", 2, ends);
    int na = slice_arg(c, "axes", 3, axes), nst = kiln_run_opset(c) < 10 ? -1 : slice_arg(c, "", 4, steps);
    if (ns < 0 || ne != ns || na == -2 || nst == -2 || (na >= 0 && na != ns) || (nst >= 0 && nst != ns))
        return kiln_gpu_fallback(c);
    int64_t start[KILN_MAX_RANK], step[KILN_MAX_RANK], xs[KILN_MAX_RANK], vs[KILN_MAX_RANK], off = 0;
    for (int k = 0; k < r; k++) {
        start[k] = 0;
        step[k] = 1;
    }
    for (int i = 0; i < ns; i++) {
        int a = i;
        if (na >= 0 && !kiln_axis_norm(axes[i], r, &a)) return kiln_gpu_fallback(c);
        if (a >= r) return kiln_gpu_fallback(c);
        int64_t st = nst >= 0 ? steps[i] : 1, cnt;
        if (st == 0) return kiln_gpu_fallback(c);
        if (st == INT64_MIN) st = -INT64_MAX;
        kiln_slice_clamp(x->dims[a], starts[i], ends[i], st, &start[a], &cnt);
        if (cnt != y->dims[a]) return kiln_gpu_fallback(c);
        step[a] = st;
    }
    kiln_strides(r, x->dims, xs);
    for (int k = 0; k < r; k++) {
        if (y->dims[k]) off += start[k] * xs[k];
        vs[k] = y->dims[k] > 1 ? xs[k] * step[k] : 0; /* (count - 1) * |step| < dim */
    }
    if (!y->numel) return KILN_OK;
    return strided_copy(c, y, x, off, vs, "slice");
}

/* ---- Expand, Tile ---- */

static kiln_status expand_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    if (y->rank < x->rank) return kiln_gpu_fallback(c);
    int64_t xs[KILN_MAX_RANK];
    kiln_bcast_strides(y->rank, y->dims, x->rank, x->dims, xs);
    return strided_copy(c, y, x, 0, xs, "expand");
}

static kiln_status tile_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int r = x->rank;
    if (r > KILN_GPU_MAX_RANK || y->rank != r) return kiln_gpu_fallback(c);
    if (!y->numel) return KILN_OK;
    kiln_gpu_shape ys, xd;
    kiln_gpu_shape_contiguous(&xd, r, x->dims);
    ys.rank = r;
    for (int k = 0; k < r; k++) {
        ys.dims[k] = y->dims[k];
        ys.strides[k] = xd.strides[k];
    }
    gpuError_t e = kiln_gpu_layout_tile(esize_of(x), y->data, x->data, ys, xd, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "tile");
}

/* ---- Pad ---- */

static bool supports_pad(const kiln_node *n, char *why, size_t size)
{
    const char *mode = kiln_attr_string(n, "mode", "constant");
    if (strcmp(mode, "constant") && strcmp(mode, "reflect") && strcmp(mode, "edge") && strcmp(mode, "wrap")) {
        snprintf(why, size, "mode '%s'", mode);
        return false;
    }
    return supports_move(n, why, size);
}

static kiln_status pad_run(kiln_run_ctx *c)
{
    const kiln_node *node = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int r = x->rank, opset = kiln_run_opset(c), es = esize_of(x);
    if (r > KILN_GPU_MAX_RANK || y->rank != r) return kiln_gpu_fallback(c);
    static const char *const modes[] = {"constant", "reflect", "edge", "wrap"};
    const char *mode = kiln_attr_string(node, "mode", "constant");
    kiln_gpu_pad_args a = {.rank = r, .mode = -1};
    for (int i = 0; i < 4; i++)
        if (!strcmp(mode, modes[i])) a.mode = i;
    if (a.mode < 0) return kiln_gpu_fallback(c);
    /* pads per axis: [begin..., end...] over the axes (all, or input 3's) */
    int64_t pads[2 * KILN_MAX_RANK], axes[KILN_MAX_RANK], begin[KILN_MAX_RANK] = {0}, end[KILN_MAX_RANK] = {0};
    int np = 0, na = -1;
    if (opset < 11) {
        const int64_t *p = kiln_attr_ints(node, opset < 2 ? "paddings" : "pads", &np);
        if (!p || np > 2 * KILN_MAX_RANK) return kiln_gpu_fallback(c);
        memcpy(pads, p, (size_t)np * sizeof *pads);
    } else {
        const kiln_value *p = kiln_run_in(c, 1);
        if (!p || p->numel > 2 * KILN_MAX_RANK || !kiln_dtype_is_int(p->dtype)) return kiln_gpu_fallback(c);
        np = (int)p->numel;
        for (int i = 0; i < np; i++) pads[i] = kiln_load_i64(p->dtype, p->data, i);
        const kiln_value *ax = opset >= 18 && kiln_run_n_in(c) > 3 ? kiln_run_in(c, 3) : NULL;
        if (ax) {
            if (ax->numel > KILN_MAX_RANK || !kiln_dtype_is_int(ax->dtype)) return kiln_gpu_fallback(c);
            na = (int)ax->numel;
            for (int i = 0; i < na; i++) axes[i] = kiln_load_i64(ax->dtype, ax->data, i);
        }
    }
    int n = na >= 0 ? na : r;
    if (np != 2 * n) return kiln_gpu_fallback(c);
    for (int i = 0; i < n; i++) {
        int k = i;
        if (na >= 0 && !kiln_axis_norm(axes[i], r, &k)) return kiln_gpu_fallback(c);
        begin[k] = pads[i];
        end[k] = pads[n + i];
    }
    /* negative pads crop: x's kept window on axis k is [lo, lo + len), placed at pb */
    for (int k = 0; k < r; k++) {
        int64_t d = x->dims[k], b = begin[k], e = end[k];
        if (y->dims[k] != d + b + e) return kiln_gpu_fallback(c);
        a.ydims[k] = y->dims[k];
        a.lo[k] = b < 0 ? (b < -d ? d : -b) : 0;
        a.pb[k] = b > 0 ? b : 0;
        a.len[k] = d - a.lo[k] - (e < 0 ? (e < -d ? d : -e) : 0);
        if (a.len[k] < 0) a.len[k] = 0;
        if (a.len[k] == 0 && y->dims[k] > 0 && a.mode != KILN_GPU_PAD_CONSTANT)
            return kiln_gpu_fallback(c); /* the reference reports it */
    }
    int64_t xs[KILN_MAX_RANK];
    kiln_strides(r, x->dims, xs);
    memcpy(a.xs, xs, (size_t)r * sizeof *xs);
    /* the constant: input 2 (opset 11+, host, default zero) or the float attribute `value` */
    a.value = 0;
    const kiln_value *cv = opset >= 11 && kiln_run_n_in(c) > 2 ? kiln_run_in(c, 2) : NULL;
    if (cv) {
        if (cv->dtype != x->dtype || cv->numel < 1) return kiln_gpu_fallback(c);
        memcpy(&a.value, cv->data, (size_t)es);
    } else if (opset < 11) {
        unsigned char buf[8] = {0};
        kiln_store_f64(x->dtype, buf, 0, kiln_attr_float(node, "value", 0.0f));
        memcpy(&a.value, buf, (size_t)es);
    }
    if (!y->numel) return KILN_OK;
    gpuError_t err = kiln_gpu_layout_pad(es, y->data, x->data, y->numel, a, kiln_gpu_stream(c));
    return kiln_gpu_check(c, err, "pad");
}

/* ---- Gather, GatherElements, GatherND ---- */

static int is_idx64(const kiln_value *ind) { return ind->dtype == KILN_DTYPE_INT64; }

static kiln_status gather_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *ind = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    int axis;
    if (x->rank < 1 || !kiln_axis_norm(kiln_attr_int(kiln_run_node(c), "axis", 0), x->rank, &axis))
        return kiln_gpu_fallback(c);
    int64_t n = x->dims[axis];
    /* nothing to index (the reference reports it), or constant indices out of range */
    if ((n == 0 && ind->numel) || !const_indices_ok(c, 1, n)) return kiln_gpu_fallback(c);
    if (!y->numel) return KILN_OK;
    gpuError_t e = kiln_gpu_layout_gather(esize_of(x), is_idx64(ind), y->data, x->data, ind->data,
                                          prod(x->dims, 0, axis), n, ind->numel,
                                          prod(x->dims, axis + 1, x->rank), kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "gather");
}

/* GatherElements / ScatterElements addressing: s = ind's dims with x's strides, zero on the
 * axis; false (reference) when ind does not fit in x or the rank is too high. */
static bool elements_shape(const kiln_value *x, const kiln_value *ind, int axis, kiln_gpu_shape *s, int64_t *as)
{
    if (x->rank != ind->rank || x->rank > KILN_GPU_MAX_RANK) return false;
    for (int k = 0; k < x->rank; k++)
        if (k != axis && ind->dims[k] > x->dims[k]) return false;
    int64_t xs[KILN_MAX_RANK];
    kiln_strides(x->rank, x->dims, xs);
    s->rank = x->rank;
    for (int k = 0; k < x->rank; k++) {
        s->dims[k] = ind->dims[k];
        s->strides[k] = k == axis ? 0 : xs[k];
    }
    *as = xs[axis];
    return true;
}

static kiln_status gather_elements_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *ind = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    int axis;
    kiln_gpu_shape s;
    int64_t as;
    if (!kiln_axis_norm(kiln_attr_int(kiln_run_node(c), "axis", 0), x->rank, &axis) ||
        !elements_shape(x, ind, axis, &s, &as) || (x->dims[axis] == 0 && ind->numel) ||
        !const_indices_ok(c, 1, x->dims[axis]))
        return kiln_gpu_fallback(c);
    if (!y->numel) return KILN_OK;
    gpuError_t e = kiln_gpu_layout_gather_elements(esize_of(x), is_idx64(ind), y->data, x->data, ind->data, s,
                                                   x->dims[axis], as, ind->numel, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "gather_elements");
}

static kiln_status gather_nd_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *ind = kiln_run_in(c, 1);
    kiln_value *y = kiln_run_out(c, 0);
    int64_t b = kiln_attr_int(kiln_run_node(c), "batch_dims", 0);
    int r = x->rank, q = ind->rank;
    if (r > KILN_GPU_MAX_RANK || q < 1 || b < 0 || b >= r || b >= q) return kiln_gpu_fallback(c);
    int64_t last = ind->dims[q - 1];
    if (last < 1 || last > r - b || !const_tuples_ok(c, 1, x->dims + b, (int)last)) return kiln_gpu_fallback(c);
    for (int k = 0; k < last; k++)
        if (x->dims[b + k] == 0 && ind->numel) return kiln_gpu_fallback(c); /* nothing to index */
    if (!y->numel) return KILN_OK;
    kiln_gpu_shape xs;
    kiln_gpu_shape_contiguous(&xs, r, x->dims);
    int64_t tuples = prod(ind->dims, (int)b, q - 1), slice = prod(x->dims, (int)(b + last), r);
    gpuError_t e = kiln_gpu_layout_gather_nd(esize_of(x), is_idx64(ind), y->data, x->data, ind->data, xs, (int)b,
                                             (int)last, tuples, slice, y->numel, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "gather_nd");
}

/* ---- ScatterND, ScatterElements ---- */

/* The kernels take the reduction as a kiln_scatter_reduction (ops/semantics.h). */
_Static_assert((int)KILN_GPU_RED_NONE == (int)KILN_SCATTER_NONE, "KILN_GPU_RED_* follow kiln_scatter_reduction");
_Static_assert((int)KILN_GPU_RED_ADD == (int)KILN_SCATTER_ADD, "KILN_GPU_RED_* follow kiln_scatter_reduction");
_Static_assert((int)KILN_GPU_RED_MUL == (int)KILN_SCATTER_MUL, "KILN_GPU_RED_* follow kiln_scatter_reduction");
_Static_assert((int)KILN_GPU_RED_MAX == (int)KILN_SCATTER_MAX, "KILN_GPU_RED_* follow kiln_scatter_reduction");
_Static_assert((int)KILN_GPU_RED_MIN == (int)KILN_SCATTER_MIN, "KILN_GPU_RED_* follow kiln_scatter_reduction");

static bool supports_scatter(const kiln_node *n, char *why, size_t size)
{
    if (!supports_indexed(n, why, size) || !movable_input(n, 2, why, size)) return false;
    int red = kiln_scatter_reduction_of(n);
    kiln_dtype dt = n->in[0]->type.dtype;
    if (red < 0) {
        snprintf(why, size, "reduction '%s'", kiln_attr_string(n, "reduction", ""));
        return false;
    }
    if (red != KILN_GPU_RED_NONE && dt != KILN_DTYPE_FLOAT32 && dt != KILN_DTYPE_FLOAT16 &&
        dt != KILN_DTYPE_BFLOAT16 && dt != KILN_DTYPE_FLOAT64 && dt != KILN_DTYPE_INT32 && dt != KILN_DTYPE_INT64) {
        snprintf(why, size, "reduction on dtype %s", kiln_dtype_name(dt));
        return false;
    }
    return true;
}

/* Output 0 starts as a copy of input 0. */
static kiln_status copy_data(kiln_run_ctx *c, kiln_value *y, const kiln_value *x)
{
    if (y->data == x->data || !y->nbytes) return KILN_OK;
    gpuError_t e = gpuMemcpyAsync(y->data, x->data, y->nbytes, gpuMemcpyDeviceToDevice, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "scatter data copy");
}

static kiln_status scatter_nd_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *ind = kiln_run_in(c, 1), *u = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    int red = kiln_scatter_reduction_of(kiln_run_node(c)), r = x->rank, q = ind->rank;
    if (red < 0 || r > KILN_GPU_MAX_RANK || q < 1 || y->nbytes != x->nbytes) return kiln_gpu_fallback(c);
    int64_t last = ind->dims[q - 1];
    if (last > r) return kiln_gpu_fallback(c);
    int64_t tuples = prod(ind->dims, 0, q - 1), slice = prod(x->dims, (int)last, r);
    if (u->numel != tuples * slice || !const_tuples_ok(c, 1, x->dims, (int)last)) return kiln_gpu_fallback(c);
    KILN_TRY(copy_data(c, y, x));
    if (!y->numel) return KILN_OK;
    kiln_gpu_shape xs;
    kiln_gpu_shape_contiguous(&xs, r, x->dims);
    gpuError_t e = kiln_gpu_layout_scatter_nd(x->dtype, red, is_idx64(ind), y->data, ind->data, u->data, xs,
                                              (int)last, tuples, slice, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "scatter_nd");
}

static kiln_status scatter_elements_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *ind = kiln_run_in(c, 1), *u = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    int red = kiln_scatter_reduction_of(kiln_run_node(c)), axis;
    kiln_gpu_shape s;
    int64_t as;
    if (red < 0 || y->nbytes != x->nbytes || u->numel != ind->numel ||
        !kiln_axis_norm(kiln_attr_int(kiln_run_node(c), "axis", 0), x->rank, &axis) ||
        !elements_shape(x, ind, axis, &s, &as) || !const_indices_ok(c, 1, x->dims[axis]))
        return kiln_gpu_fallback(c);
    KILN_TRY(copy_data(c, y, x));
    if (!y->numel) return KILN_OK;
    gpuError_t e = kiln_gpu_layout_scatter_elements(x->dtype, red, is_idx64(ind), y->data, ind->data, u->data, s,
                                                    x->dims[axis], as, ind->numel, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "scatter_elements");
}

/* ---- Range, Trilu, OneHot ---- */

static bool range_dtype(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT32:
    case KILN_DTYPE_FLOAT64:
    case KILN_DTYPE_FLOAT16:
    case KILN_DTYPE_BFLOAT16:
    case KILN_DTYPE_INT8:
    case KILN_DTYPE_UINT8:
    case KILN_DTYPE_INT16:
    case KILN_DTYPE_UINT16:
    case KILN_DTYPE_INT32:
    case KILN_DTYPE_UINT32:
    case KILN_DTYPE_INT64:
    case KILN_DTYPE_UINT64: return true;
    default: return false;
    }
}

static bool supports_range(const kiln_node *n, char *why, size_t size)
{
    const kiln_type *t = kiln_gpu_in_type(n, 0);
    if (!t || !range_dtype(t->dtype)) {
        snprintf(why, size, "dtype %s", t ? kiln_dtype_name(t->dtype) : "(absent)");
        return false;
    }
    return true;
}

static kiln_status range_run(kiln_run_ctx *c)
{
    const kiln_value *s = kiln_run_in(c, 0), *d = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    kiln_dtype dt = y->dtype;
    if (!y->numel) return KILN_OK;
    if (s->numel < 1 || d->numel < 1 || s->dtype != dt || d->dtype != dt) return kiln_gpu_fallback(c);
    bool is_int = kiln_dtype_is_int(dt);
    int64_t is = is_int ? kiln_load_i64(dt, s->data, 0) : 0, id = is_int ? kiln_load_i64(dt, d->data, 0) : 0;
    double fs = is_int ? 0 : kiln_load_f64(dt, s->data, 0), fd = is_int ? 0 : kiln_load_f64(dt, d->data, 0);
    gpuError_t e = kiln_gpu_layout_range(dt, y->data, y->numel, is, id, fs, fd, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "range");
}

static kiln_status trilu_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0), *kv = kiln_run_n_in(c) > 1 ? kiln_run_in(c, 1) : NULL;
    kiln_value *y = kiln_run_out(c, 0);
    if (x->rank < 2) return kiln_gpu_fallback(c);
    bool upper = kiln_attr_int(kiln_run_node(c), "upper", 1) != 0;
    int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1];
    int64_t k = kv && kv->numel ? kiln_load_i64(kv->dtype, kv->data, 0) : 0;
    if (k > rows + cols) k = rows + cols;
    if (k < -(rows + cols)) k = -(rows + cols);
    if (!y->numel) return KILN_OK;
    gpuError_t e = kiln_gpu_layout_trilu(esize_of(x), y->data, x->data, x->numel / (rows * cols), rows, cols, k,
                                         upper, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "trilu");
}

static bool supports_onehot(const kiln_node *n, char *why, size_t size)
{
    const kiln_type *ind = kiln_gpu_in_type(n, 0);
    if (!ind || (ind->dtype != KILN_DTYPE_INT32 && ind->dtype != KILN_DTYPE_INT64 &&
                 ind->dtype != KILN_DTYPE_FLOAT32)) {
        snprintf(why, size, "indices dtype %s", ind ? kiln_dtype_name(ind->dtype) : "(absent)");
        return false;
    }
    if (ind->rank + 1 > KILN_GPU_MAX_RANK) {
        snprintf(why, size, "rank %d", ind->rank);
        return false;
    }
    return movable_input(n, 2, why, size);
}

static kiln_status onehot_run(kiln_run_ctx *c)
{
    const kiln_value *ind = kiln_run_in(c, 0), *depth = kiln_run_in(c, 1), *vals = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    int axis;
    if (depth->numel != 1 || vals->numel != 2 ||
        !kiln_axis_norm(kiln_attr_int(kiln_run_node(c), "axis", -1), ind->rank + 1, &axis))
        return kiln_gpu_fallback(c);
    int64_t d = kiln_dtype_is_float(depth->dtype) ? (int64_t)kiln_load_f64(depth->dtype, depth->data, 0)
                                                  : kiln_load_i64(depth->dtype, depth->data, 0);
    if (!y->numel) return KILN_OK;
    if (y->dims[axis] != d) return kiln_gpu_fallback(c);
    int es = esize_of(vals);
    uint64_t off = 0, on = 0;
    memcpy(&off, vals->data, (size_t)es);
    memcpy(&on, bytes_at(vals->data, 1, es), (size_t)es);
    gpuError_t e = kiln_gpu_layout_onehot(es, ind->dtype, y->data, ind->data, prod(ind->dims, 0, axis), d,
                                          prod(ind->dims, axis, ind->rank), off, on, kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "onehot");
}

static bool supports_trilu(const kiln_node *n, char *why, size_t size)
{
    return supports_move(n, why, size);
}

/* Tile-1 (opsets 1-5: input 1 repeats the tensor along the axis of input 2) stays on the host
 * as it did when this table gave Tile's first opset as 6. */
static bool supports_tile(const kiln_node *n, char *why, size_t size)
{
    if (n->opset < 6) {
        snprintf(why, size, "Tile-1 (tiles and axis inputs, opset %d)", n->opset);
        return false;
    }
    return supports_move(n, why, size);
}

static const kiln_gpu_op ops[] = {
    {"", "Reshape", supports_reshape, reshape_run},
    {"", "Flatten", supports_reshape, reshape_run},
    {"", "Squeeze", supports_reshape, reshape_run},
    {"", "Unsqueeze", supports_reshape, reshape_run},
    {"", "Transpose", supports_move, transpose_run},
    {"", "Concat", supports_concat, concat_run},
    {"", "Split", supports_move, split_run},
    {"", "Slice", supports_move, slice_run},
    {"", "Expand", supports_move, expand_run},
    {"", "Tile", supports_tile, tile_run},
    {"", "Pad", supports_pad, pad_run},
    {"", "Gather", supports_indexed, gather_run},
    {"", "GatherElements", supports_indexed, gather_elements_run},
    {"", "GatherND", supports_indexed, gather_nd_run},
    {"", "Scatter", supports_scatter, scatter_elements_run},
    {"", "ScatterElements", supports_scatter, scatter_elements_run},
    {"", "ScatterND", supports_scatter, scatter_nd_run},
    {"", "Range", supports_range, range_run},
    {"", "Trilu", supports_trilu, trilu_run},
    {"", "OneHot", supports_onehot, onehot_run},
};

const kiln_gpu_op_table kiln_gpu_ops_layout = {ops, sizeof ops / sizeof ops[0]};
