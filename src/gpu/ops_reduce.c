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
#include "gpu/support.h"
#include "gpu/k_reduce.h"
#include "ops/semantics.h"
#include "ops/util.h"

/* ---- shared helpers ---- */

static bool is_float_dt(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16;
}

static bool is_index_dt(kiln_dtype dt) { return dt == KILN_DTYPE_INT32 || dt == KILN_DTYPE_INT64; }

/* Input i is a tensor of a floating dtype (or, with ints, int32/int64); else says why. */
static bool input_dtype_ok(const kiln_node *n, int i, bool ints, char *why, size_t size)
{
    const kiln_type *t = kiln_gpu_in_type(n, i);
    if (!t || t->kind != KILN_VALUE_TENSOR) {
        snprintf(why, size, "input %d is not a tensor", i);
        return false;
    }
    if (is_float_dt(t->dtype) || (ints && is_index_dt(t->dtype))) return true;
    snprintf(why, size, "input %d dtype %s", i, kiln_dtype_name(t->dtype));
    return false;
}

/* Input i, when present, has input 0's dtype (the kernel reads it as X's type). */
static bool same_dtype_as_x(const kiln_node *n, int i, char *why, size_t size)
{
    const kiln_type *t = kiln_gpu_in_type(n, i), *x = kiln_gpu_in_type(n, 0);
    if (!t || !x || t->dtype == x->dtype) return true;
    snprintf(why, size, "input %d dtype %s differs from X's %s", i, kiln_dtype_name(t->dtype),
             kiln_dtype_name(x->dtype));
    return false;
}

static bool rank_ok(const kiln_node *n, char *why, size_t size)
{
    const kiln_type *x = kiln_gpu_in_type(n, 0);
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

/* The kernels take the op as a kiln_reduce_op (ops/semantics.h). */
_Static_assert((int)KILN_GPU_RK_SUM == (int)KILN_REDUCE_SUM, "KILN_GPU_RK_* follow kiln_reduce_op");
_Static_assert((int)KILN_GPU_RK_MEAN == (int)KILN_REDUCE_MEAN, "KILN_GPU_RK_* follow kiln_reduce_op");
_Static_assert((int)KILN_GPU_RK_MAX == (int)KILN_REDUCE_MAX, "KILN_GPU_RK_* follow kiln_reduce_op");
_Static_assert((int)KILN_GPU_RK_MIN == (int)KILN_REDUCE_MIN, "KILN_GPU_RK_* follow kiln_reduce_op");
_Static_assert((int)KILN_GPU_RK_PROD == (int)KILN_REDUCE_PROD, "KILN_GPU_RK_* follow kiln_reduce_op");
_Static_assert((int)KILN_GPU_RK_L1 == (int)KILN_REDUCE_L1, "KILN_GPU_RK_* follow kiln_reduce_op");
_Static_assert((int)KILN_GPU_RK_L2 == (int)KILN_REDUCE_L2, "KILN_GPU_RK_* follow kiln_reduce_op");
_Static_assert((int)KILN_GPU_RK_LOGSUM == (int)KILN_REDUCE_LOGSUM, "KILN_GPU_RK_* follow kiln_reduce_op");
_Static_assert((int)KILN_GPU_RK_LOGSUMEXP == (int)KILN_REDUCE_LOGSUMEXP, "KILN_GPU_RK_* follow kiln_reduce_op");
_Static_assert((int)KILN_GPU_RK_SUMSQ == (int)KILN_REDUCE_SUMSQ, "KILN_GPU_RK_* follow kiln_reduce_op");

static bool reduce_supports(const kiln_node *n, char *why, size_t size)
{
    int kind = (int)kiln_reduce_op_of(n);
    bool ints = kind != KILN_GPU_RK_L2 && kind != KILN_GPU_RK_LOGSUM && kind != KILN_GPU_RK_LOGSUMEXP;
    return input_dtype_ok(n, 0, ints, why, size) && rank_ok(n, why, size);
}

/* Merges x's dims into alternating kept and reduced groups (size-1 dims dropped): the kept
 * groups in order index the output, which is contiguous in them. Launches the column kernel
 * for [outer, reduced, inner > 1], the row kernel otherwise. */
static kiln_status reduce_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *y = kiln_run_out(c, 0);
    bool mask[KILN_MAX_RANK];
    /* the reduced axes as the reference reads them (input 1 on the host in input-axes opsets) */
    if (!y || x->rank > KILN_GPU_MAX_RANK ||
        !kiln_reduce_axes(kiln_run_node(c), kiln_run_opset(c), kiln_run_in(c, 1), x->rank, mask, NULL, 0))
        return kiln_gpu_fallback(c);
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
    int kind = (int)kiln_reduce_op_of(kiln_run_node(c));
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

/* Scale (input 1) and, when present, B (input 2) are of one floating dtype, X's or another:
 * the kernels read them as their own (a float32 X with float16 parameters, as exporters of
 * half-precision models write, or the reverse). */
static bool norm_params_ok(const kiln_node *n, bool with_bias, char *why, size_t size)
{
    const kiln_type *sc = kiln_gpu_in_type(n, 1), *b = with_bias ? kiln_gpu_in_type(n, 2) : NULL;
    if (!sc) return true;
    if (!input_dtype_ok(n, 1, false, why, size) || (b && !input_dtype_ok(n, 2, false, why, size))) return false;
    if (b && b->dtype != sc->dtype) {
        snprintf(why, size, "B's dtype %s differs from Scale's %s", kiln_dtype_name(b->dtype), kiln_dtype_name(sc->dtype));
        return false;
    }
    return true;
}

static bool layernorm_supports(const kiln_node *n, char *why, size_t size)
{
    if (!input_dtype_ok(n, 0, false, why, size) || !norm_params_ok(n, true, why, size)) return false;
    bool stats = (n->n_out > 1 && n->out[1]) || (n->n_out > 2 && n->out[2]);
    if (stats && kiln_attr_int(n, "stash_type", KILN_DTYPE_FLOAT32) != KILN_DTYPE_FLOAT32) {
        snprintf(why, size, "stash_type %lld", (long long)kiln_attr_int(n, "stash_type", 0));
        return false;
    }
    return true;
}

static bool rmsnorm_supports(const kiln_node *n, char *why, size_t size)
{
    return input_dtype_ok(n, 0, false, why, size) && norm_params_ok(n, false, why, size);
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
    if (!y || !scale || !kiln_axis_norm(kiln_attr_int(n, "axis", -1), x->rank, &axis) ||
        !kiln_value_bcasts_to(scale, x) || (bias && !kiln_value_bcasts_to(bias, x)) ||
        (bias && bias->dtype != scale->dtype) || (mean && mean->dtype != KILN_DTYPE_FLOAT32) ||
        (inv && inv->dtype != KILN_DTYPE_FLOAT32))
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
    gpuError_t e = kiln_gpu_norm_rows(kiln_gpu_stream(c), x->dtype, scale->dtype, x->data, y->data, rows, cols,
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
    gpuError_t e = kiln_gpu_norm_rows(kiln_gpu_stream(c), x->dtype, x->dtype, x->data, y->data, N * groups,
                                      C / groups * S,
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

static const kiln_gpu_op ops[] = {
    {"", "ReduceSum", reduce_supports, reduce_run},
    {"", "ReduceMean", reduce_supports, reduce_run},
    {"", "ReduceMax", reduce_supports, reduce_run},
    {"", "ReduceMin", reduce_supports, reduce_run},
    {"", "ReduceProd", reduce_supports, reduce_run},
    {"", "ReduceL1", reduce_supports, reduce_run},
    {"", "ReduceL2", reduce_supports, reduce_run},
    {"", "ReduceLogSum", reduce_supports, reduce_run},
    {"", "ReduceLogSumExp", reduce_supports, reduce_run},
    {"", "ReduceSumSquare", reduce_supports, reduce_run},
    {"", "ArgMax", argext_supports, argext_run},
    {"", "ArgMin", argext_supports, argext_run},
    {"", "Softmax", softmax_supports, softmax_run},
    {"", "LogSoftmax", softmax_supports, softmax_run},
    {"", "LayerNormalization", layernorm_supports, layernorm_run},
    {"", "RMSNormalization", rmsnorm_supports, rmsnorm_run},
    {"", "GroupNormalization", channel_norm_supports, groupnorm_run},
    {"", "InstanceNormalization", channel_norm_supports, instancenorm_run},
    {"", "BatchNormalization", batchnorm_supports, batchnorm_run},
    {"", "CumSum", cumsum_supports, cumsum_run},
};

const kiln_gpu_op_table kiln_gpu_ops_reduce = {ops, sizeof ops / sizeof ops[0]};
