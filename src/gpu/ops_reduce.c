/* ops_reduce.c - GPU provider family 'reduce': Reduce* (attribute and input axes), ArgMax,
 * ArgMin, Softmax, LogSoftmax, LayerNormalization, RMSNormalization, GroupNormalization,
 * InstanceNormalization, BatchNormalization (inference) and CumSum, in float32, float16 and
 * bfloat16 (int32 and int64 where the op is used on indices and counts). Anything the
 * reference would reject at run time (bad axes, mismatched parameter sizes, ArgMax over an
 * empty axis) goes to the reference, which reports it. */
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "gpu/gpu.h"
#include "gpu/k_reduce.h"
#include "ops/util.h"

/* ---- shared helpers ---- */

static const kiln_type *in_type(const kiln_node *n, int i)
{
    return i < n->n_in && n->in[i] ? &n->in[i]->type : NULL;
}

static bool is_float_dt(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16;
}

static bool is_index_dt(kiln_dtype dt) { return dt == KILN_DTYPE_INT32 || dt == KILN_DTYPE_INT64; }

/* Input i is a tensor of a floating dtype (or, with ints, int32/int64); else says why. */
static bool input_dtype_ok(const kiln_node *n, int i, bool ints, char *why, size_t size)
{
    const kiln_type *t = in_type(n, i);
    if (!t || t->kind != KILN_VALUE_TENSOR) {
        snprintf(why, size, "input %d is not a tensor", i);
        return false;
    }
    if (is_float_dt(t->dtype) || (ints && is_index_dt(t->dtype))) return true;
    snprintf(why, size, "input %d dtype %s", i, kiln_dtype_name(t->dtype));
    return false;
}

/* Input i, when present, has input 0's dtype (the kernels read parameters as X's type). */
static bool same_dtype_as_x(const kiln_node *n, int i, char *why, size_t size)
{
    const kiln_type *t = in_type(n, i), *x = in_type(n, 0);
    if (!t || !x || t->dtype == x->dtype) return true;
    snprintf(why, size, "input %d dtype %s differs from X's %s", i, kiln_dtype_name(t->dtype),
             kiln_dtype_name(x->dtype));
    return false;
}

static bool rank_ok(const kiln_node *n, char *why, size_t size)
{
    const kiln_type *x = in_type(n, 0);
    if (x && x->rank > KILN_GPU_MAX_RANK) {
        snprintf(why, size, "rank %d > %d", x->rank, KILN_GPU_MAX_RANK);
        return false;
    }
    return true;
}

/* Splits x's dims into [outer, dims[axis], inner]. */
static void split_at(const kiln_value *x, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = *inner = 1;
    *n = x->dims[axis];
    for (int k = 0; k < x->rank; k++) {
        if (k < axis) *outer *= x->dims[k];
        else if (k > axis) *inner *= x->dims[k];
    }
}

/* ---- Reduce* ---- */

static const char *const reduce_names[] = {
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
};

/* The KILN_GPU_RK_* kind of n (the names follow the enum's order). */
static int reduce_kind(const kiln_node *n)
{
    for (int k = 0; k < (int)(sizeof reduce_names / sizeof reduce_names[0]); k++)
        if (!strcmp(n->op_type, reduce_names[k])) return k;
    return KILN_GPU_RK_SUM;
}

static bool reduce_supports(const kiln_node *n, char *why, size_t size)
{
    int kind = reduce_kind(n);
    bool ints = kind != KILN_GPU_RK_L2 && kind != KILN_GPU_RK_LOGSUM && kind != KILN_GPU_RK_LOGSUMEXP;
    return input_dtype_ok(n, 0, ints, why, size) && rank_ok(n, why, size);
}

/* The reduced axes as the reference reads them (attribute before opset 13 for ReduceSum and
 * 18 for the others, then input 1, on the host); false when invalid. */
static bool reduce_mask(kiln_run_ctx *c, int rank, bool *mask)
{
    const kiln_node *n = kiln_run_node(c);
    bool from_input = kiln_run_opset(c) >= (reduce_kind(n) == KILN_GPU_RK_SUM ? 13 : 18);
    const kiln_value *av = from_input ? kiln_run_in(c, 1) : NULL;
    const int64_t *attr = NULL;
    int na = 0;
    if (!from_input) {
        attr = kiln_attr_ints(n, "axes", &na);
    } else if (av) {
        if (av->kind != KILN_VALUE_TENSOR || av->rank > 1 || !kiln_dtype_is_int(av->dtype) || av->numel > rank)
            return false;
        na = (int)av->numel;
    }
    bool noop = from_input && kiln_attr_int(n, "noop_with_empty_axes", 0) != 0;
    for (int k = 0; k < rank; k++) mask[k] = na == 0 && !noop;
    for (int i = 0; i < na; i++) {
        int64_t a = attr ? attr[i] : kiln_load_i64(av->dtype, av->data, i);
        int k;
        if (!kiln_axis_norm(a, rank, &k) || mask[k]) return false;
        mask[k] = true;
    }
    return true;
}

/* Merges x's dims into alternating kept and reduced groups (size-1 dims dropped): the kept
 * groups in order index the output, which is contiguous in them. Launches the column kernel
 * for [outer, reduced, inner > 1], the row kernel otherwise. */
static kiln_status reduce_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    bool mask[KILN_MAX_RANK];
    if (!y || x->rank > KILN_GPU_MAX_RANK || !reduce_mask(c, x->rank, mask)) return kiln_gpu_fallback(c);
    if (y->numel == 0) return KILN_OK;
    int ng = 0;
    bool g_red[KILN_GPU_MAX_RANK];
    int64_t g_size[KILN_GPU_MAX_RANK], g_stride[KILN_GPU_MAX_RANK], count = 1, st = 1;
    for (int k = x->rank - 1; k >= 0; k--) {
        int64_t d = x->dims[k];
        if (mask[k]) count *= d;
        if (d != 1) {
            if (ng > 0 && g_red[ng - 1] == mask[k]) {
                g_size[ng - 1] *= d; /* contiguous: the group's inner stride stays */
            } else {
                g_red[ng] = mask[k], g_size[ng] = d, g_stride[ng] = st;
                ng++;
            }
        }
        st *= d;
    }
    /* groups run from the innermost (0) to the outermost (ng - 1) */
    kiln_gpu_shape keep = {0}, red = {0};
    for (int g = ng - 1; g >= 0; g--) {
        kiln_gpu_shape *s = g_red[g] ? &red : &keep;
        s->dims[s->rank] = g_size[g];
        s->strides[s->rank] = g_stride[g];
        s->rank++;
    }
    int kind = reduce_kind(kiln_run_node(c));
    gpuError_t e;
    if (red.rank == 1 && ng >= 2 && !g_red[0]) {
        int64_t inner = g_size[0], outer = ng == 3 ? g_size[2] : 1;
        e = kiln_gpu_reduce_cols(kiln_gpu_stream(c), kind, x->dtype, x->data, y->data, outer, red.dims[0], inner);
    } else {
        e = kiln_gpu_reduce_rows(kiln_gpu_stream(c), kind, x->dtype, x->data, y->data, y->numel, keep, red, count);
    }
    return kiln_gpu_check(c, e, "reduce");
}

/* ---- ArgMax, ArgMin ---- */

static bool argext_supports(const kiln_node *n, char *why, size_t size)
{
    return input_dtype_ok(n, 0, true, why, size);
}

static kiln_status argext_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int axis;
    if (!y || y->dtype != KILN_DTYPE_INT64 || !kiln_axis_norm(kiln_attr_int(n, "axis", 0), x->rank, &axis))
        return kiln_gpu_fallback(c);
    if (y->numel == 0) return KILN_OK;
    int64_t outer, len, inner;
    split_at(x, axis, &outer, &len, &inner);
    if (len == 0) return kiln_gpu_fallback(c); /* the reference reports the empty axis */
    int sign = n->op_type[3] == 'M' && n->op_type[4] == 'a' ? 1 : -1; /* Arg'Ma'x */
    bool last = kiln_attr_int(n, "select_last_index", 0) != 0;
    gpuError_t e = kiln_gpu_argext(kiln_gpu_stream(c), x->dtype, x->data, y->data, outer, len, inner, sign, last);
    return kiln_gpu_check(c, e, "argmax/argmin");
}

/* ---- Softmax, LogSoftmax ---- */

static bool softmax_supports(const kiln_node *n, char *why, size_t size)
{
    return input_dtype_ok(n, 0, false, why, size);
}

/* Before opset 13 the input is coerced to 2-D at axis (default 1); from 13 the op runs along
 * the one axis (default -1). */
static kiln_status softmax_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    int opset = kiln_run_opset(c), axis;
    if (!y || !kiln_axis_norm(kiln_attr_int(n, "axis", opset < 13 ? 1 : -1), x->rank, &axis))
        return kiln_gpu_fallback(c);
    if (y->numel == 0) return KILN_OK;
    int64_t outer = 1, len = 1, inner = 1;
    for (int k = 0; k < x->rank; k++) {
        if (k < axis) outer *= x->dims[k];
        else if (k == axis || opset < 13) len *= x->dims[k];
        else inner *= x->dims[k];
    }
    bool lg = n->op_type[0] == 'L';
    gpuError_t e = kiln_gpu_softmax(kiln_gpu_stream(c), x->dtype, x->data, y->data, outer, len, inner, lg);
    return kiln_gpu_check(c, e, lg ? "log_softmax" : "softmax");
}

/* ---- LayerNormalization, RMSNormalization ---- */

static bool layernorm_supports(const kiln_node *n, char *why, size_t size)
{
    if (!input_dtype_ok(n, 0, false, why, size) || !same_dtype_as_x(n, 1, why, size) ||
        !same_dtype_as_x(n, 2, why, size))
        return false;
    bool stats = (n->n_out > 1 && n->out[1]) || (n->n_out > 2 && n->out[2]);
    if (stats && kiln_attr_int(n, "stash_type", KILN_DTYPE_FLOAT32) != KILN_DTYPE_FLOAT32) {
        snprintf(why, size, "stash_type %lld", (long long)kiln_attr_int(n, "stash_type", 0));
        return false;
    }
    return true;
}

static bool rmsnorm_supports(const kiln_node *n, char *why, size_t size)
{
    return input_dtype_ok(n, 0, false, why, size) && same_dtype_as_x(n, 1, why, size);
}

/* Whether v broadcasts unidirectionally to x. */
static bool bcasts_to(const kiln_value *v, const kiln_value *x)
{
    if (v->rank > x->rank) return false;
    for (int k = 0; k < v->rank; k++) {
        int64_t d = v->dims[k], xd = x->dims[x->rank - v->rank + k];
        if (d != xd && d != 1) return false;
    }
    return true;
}

/* Whether v (broadcasting to x) holds one value per element of the normalized dims [axis,
 * rank), in their order, the same for every row. */
static bool per_col(const kiln_value *v, const kiln_value *x, int axis, int64_t cols)
{
    if (v->numel != cols) return false;
    for (int k = 0; k < v->rank; k++)
        if (x->rank - v->rank + k < axis && v->dims[k] != 1) return false;
    return true;
}

static kiln_status trailing_norm_run(kiln_run_ctx *c, bool center)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0), *scale = kiln_run_in(c, 1), *bias = center ? kiln_run_in(c, 2) : NULL;
    kiln_value *y = kiln_run_out(c, 0);
    kiln_value *mean = center ? kiln_run_out(c, 1) : NULL, *inv = center ? kiln_run_out(c, 2) : NULL;
    int axis;
    if (!y || !scale || !kiln_axis_norm(kiln_attr_int(n, "axis", -1), x->rank, &axis) || !bcasts_to(scale, x) ||
        (bias && !bcasts_to(bias, x)) || scale->dtype != x->dtype || (bias && bias->dtype != x->dtype) ||
        (mean && mean->dtype != KILN_DTYPE_FLOAT32) || (inv && inv->dtype != KILN_DTYPE_FLOAT32))
        return kiln_gpu_fallback(c);
    int64_t rows = 1, cols = 1;
    for (int k = 0; k < x->rank; k++) *(k < axis ? &rows : &cols) *= x->dims[k];
    if ((mean && mean->numel != rows) || (inv && inv->numel != rows)) return kiln_gpu_fallback(c);
    if (rows == 0) return KILN_OK;
    kiln_gpu_shape ss = {0}, bs = {0};
    int pmode = KILN_GPU_NP_COL;
    if (!per_col(scale, x, axis, cols) || (bias && !per_col(bias, x, axis, cols))) {
        if (x->rank > KILN_GPU_MAX_RANK) return kiln_gpu_fallback(c);
        pmode = KILN_GPU_NP_STRIDED;
        kiln_gpu_shape_broadcast(&ss, x->rank, x->dims, scale->rank, scale->dims);
        if (bias) kiln_gpu_shape_broadcast(&bs, x->rank, x->dims, bias->rank, bias->dims);
    }
    gpuError_t e = kiln_gpu_norm_rows(kiln_gpu_stream(c), x->dtype, x->data, y->data, rows, cols,
                                      kiln_attr_float(n, "epsilon", 1e-5f), center, scale->data,
                                      bias ? bias->data : NULL, pmode, ss, bs, 1, 1, 1, mean ? mean->data : NULL,
                                      inv ? inv->data : NULL);
    return kiln_gpu_check(c, e, center ? "layer_norm" : "rms_norm");
}

static kiln_status layernorm_run(kiln_run_ctx *c) { return trailing_norm_run(c, true); }
static kiln_status rmsnorm_run(kiln_run_ctx *c) { return trailing_norm_run(c, false); }

/* ---- GroupNormalization, InstanceNormalization ---- */

static bool channel_norm_supports(const kiln_node *n, char *why, size_t size)
{
    return input_dtype_ok(n, 0, false, why, size) && same_dtype_as_x(n, 1, why, size) &&
           same_dtype_as_x(n, 2, why, size);
}

/* X [N, C, ...] normalized per group of C / groups channels; scale and bias per channel
 * (per_channel) or per group. */
static kiln_status channel_norm_run(kiln_run_ctx *c, int64_t groups, bool per_channel, float eps)
{
    const kiln_value *x = kiln_run_in(c, 0), *scale = kiln_run_in(c, 1), *bias = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    if (!y || !scale || !bias || x->rank < 2 || scale->dtype != x->dtype || bias->dtype != x->dtype)
        return kiln_gpu_fallback(c);
    int64_t N = x->dims[0], C = x->dims[1], S = C && N ? x->numel / (N * C) : 0;
    if (groups <= 0 || C % groups) return kiln_gpu_fallback(c);
    int64_t np = per_channel ? C : groups;
    if (scale->numel != np || bias->numel != np) return kiln_gpu_fallback(c);
    if (x->numel == 0) return KILN_OK;
    kiln_gpu_shape none = {0};
    gpuError_t e = kiln_gpu_norm_rows(kiln_gpu_stream(c), x->dtype, x->data, y->data, N * groups, C / groups * S,
                                      eps, true, scale->data, bias->data,
                                      per_channel ? KILN_GPU_NP_CHANNEL : KILN_GPU_NP_GROUP, none, none, groups, C,
                                      S, NULL, NULL);
    return kiln_gpu_check(c, e, "group_norm");
}

/* scale and bias are per group in opset 18, per channel from 21 */
static kiln_status groupnorm_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    return channel_norm_run(c, kiln_attr_int(n, "num_groups", 0), kiln_run_opset(c) >= 21,
                            kiln_attr_float(n, "epsilon", 1e-5f));
}

static kiln_status instancenorm_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    if (x->rank < 2) return kiln_gpu_fallback(c);
    return channel_norm_run(c, x->dims[1], true, kiln_attr_float(kiln_run_node(c), "epsilon", 1e-5f));
}

/* ---- BatchNormalization (inference) ---- */

static bool batchnorm_supports(const kiln_node *n, char *why, size_t size)
{
    if (!input_dtype_ok(n, 0, false, why, size)) return false;
    for (int i = 1; i < 5; i++)
        if (!input_dtype_ok(n, i, false, why, size)) return false;
    /* training: the training_mode attribute from opset 14; before, the extra outputs (with
     * is_test = 0 before opset 7), as the reference decides */
    bool training;
    if (n->opset >= 14) training = kiln_attr_int(n, "training_mode", 0) != 0;
    else if (n->opset < 7 && kiln_attr_int(n, "is_test", 0) != 0) training = false;
    else training = n->n_out > 1 && n->out[1];
    if (training) {
        snprintf(why, size, "training mode");
        return false;
    }
    if (n->opset < 9 && kiln_attr_int(n, "spatial", 1) == 0) {
        snprintf(why, size, "spatial = 0");
        return false;
    }
    return true;
}

static kiln_status batchnorm_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    if (!y || x->rank < 2) return kiln_gpu_fallback(c);
    int64_t N = x->dims[0], C = x->dims[1], S = C && N ? x->numel / (N * C) : 0;
    const void *p[4];
    kiln_dtype pdt[4];
    for (int i = 0; i < 4; i++) {
        const kiln_value *v = kiln_run_in(c, i + 1);
        if (!v || v->numel != C || !is_float_dt(v->dtype)) return kiln_gpu_fallback(c);
        p[i] = v->data, pdt[i] = v->dtype;
    }
    if (x->numel == 0) return KILN_OK;
    void *work;
    KILN_TRY(kiln_gpu_workspace(c, (size_t)C * 3 * sizeof(float), &work));
    gpuError_t e = kiln_gpu_batchnorm(kiln_gpu_stream(c), x->dtype, x->data, y->data, N, C, S,
                                      kiln_attr_float(kiln_run_node(c), "epsilon", 1e-5f), p, pdt, work);
    return kiln_gpu_check(c, e, "batch_norm");
}

/* ---- CumSum ---- */

static bool cumsum_supports(const kiln_node *n, char *why, size_t size)
{
    return input_dtype_ok(n, 0, true, why, size);
}

static kiln_status cumsum_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0), *a = kiln_run_in(c, 1); /* axis: on the host */
    kiln_value *y = kiln_run_out(c, 0);
    int axis;
    if (!y || !a || a->kind != KILN_VALUE_TENSOR || a->numel != 1 || a->rank > 1 || !kiln_dtype_is_int(a->dtype) ||
        !kiln_axis_norm(kiln_load_i64(a->dtype, a->data, 0), x->rank, &axis))
        return kiln_gpu_fallback(c);
    if (y->numel == 0) return KILN_OK;
    int64_t outer, len, inner;
    split_at(x, axis, &outer, &len, &inner);
    gpuError_t e = kiln_gpu_cumsum(kiln_gpu_stream(c), x->dtype, x->data, y->data, outer, len, inner,
                                   kiln_attr_int(n, "exclusive", 0) != 0, kiln_attr_int(n, "reverse", 0) != 0);
    return kiln_gpu_check(c, e, "cumsum");
}

/* ---- the table ---- */

#define AXES_INPUT (1u << 1) /* Reduce* axes (new opsets) and CumSum's axis: read on the host */

static const kiln_gpu_op ops[] = {
    {"ReduceSum", 1, reduce_supports, reduce_run, AXES_INPUT},
    {"ReduceMean", 1, reduce_supports, reduce_run, AXES_INPUT},
    {"ReduceMax", 1, reduce_supports, reduce_run, AXES_INPUT},
    {"ReduceMin", 1, reduce_supports, reduce_run, AXES_INPUT},
    {"ReduceProd", 1, reduce_supports, reduce_run, AXES_INPUT},
    {"ReduceL1", 1, reduce_supports, reduce_run, AXES_INPUT},
    {"ReduceL2", 1, reduce_supports, reduce_run, AXES_INPUT},
    {"ReduceLogSum", 1, reduce_supports, reduce_run, AXES_INPUT},
    {"ReduceLogSumExp", 1, reduce_supports, reduce_run, AXES_INPUT},
    {"ReduceSumSquare", 1, reduce_supports, reduce_run, AXES_INPUT},
    {"ArgMax", 1, argext_supports, argext_run, 0},
    {"ArgMin", 1, argext_supports, argext_run, 0},
    {"Softmax", 1, softmax_supports, softmax_run, 0},
    {"LogSoftmax", 1, softmax_supports, softmax_run, 0},
    {"LayerNormalization", 17, layernorm_supports, layernorm_run, 0},
    {"RMSNormalization", 23, rmsnorm_supports, rmsnorm_run, 0},
    {"GroupNormalization", 18, channel_norm_supports, groupnorm_run, 0},
    {"InstanceNormalization", 1, channel_norm_supports, instancenorm_run, 0},
    {"BatchNormalization", 1, batchnorm_supports, batchnorm_run, 0},
    {"CumSum", 11, cumsum_supports, cumsum_run, AXES_INPUT},
};

const kiln_gpu_op_table kiln_gpu_ops_reduce = {ops, sizeof ops / sizeof ops[0]};
