/* semantics.c - the ONNX-semantics rules of semantics.h. */
#include "ops/semantics.h"

#include <stdio.h>
#include <string.h>

#include "ops/util.h"

void kiln_bcast_strides(int out_rank, const int64_t *out_dims, int in_rank, const int64_t *in_dims, int64_t *strides)
{
    int64_t s = 1;
    for (int k = out_rank - 1; k >= 0; k--) {
        int ik = k - (out_rank - in_rank);
        if (ik < 0) {
            strides[k] = 0;
            continue;
        }
        strides[k] = (in_dims[ik] == 1 && out_dims[k] != 1) ? 0 : s;
        s *= in_dims[ik];
    }
}

bool kiln_bcasts_to(int rank, const int64_t *dims, int to_rank, const int64_t *to_dims)
{
    if (rank > to_rank) return false;
    for (int k = 0; k < rank; k++) {
        int64_t d = dims[k], td = to_dims[to_rank - rank + k];
        if (d != td && d != 1) return false;
    }
    return true;
}

bool kiln_legacy_bcast_pad(const kiln_node *n, int opset, int rank_a, int rank_b, int *pad)
{
    *pad = 0;
    if (opset >= 7) return true;
    bool prelu = !strcmp(n->op_type, "PRelu") && rank_b == 1 && rank_a >= 2;
    if (!prelu && (!kiln_attr_int(n, "broadcast", 0) || !kiln_node_attr(n, "axis"))) return true;
    int64_t axis = prelu ? 1 : kiln_attr_int(n, "axis", 0);
    if (axis < 0) axis += rank_a;
    if (axis < 0 || axis + rank_b > rank_a) return false;
    *pad = rank_a - (int)axis - rank_b;
    return true;
}

int kiln_legacy_bcast_dims(int rank, const int64_t *dims, int pad, int64_t *out)
{
    if (rank) memcpy(out, dims, (size_t)rank * sizeof *dims);
    for (int k = 0; k < pad; k++) out[rank + k] = 1;
    return rank + pad;
}

void kiln_slice_clamp(int64_t d, int64_t s, int64_t e, int64_t step, int64_t *first, int64_t *count)
{
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? d - 1 : d;
    if (s < 0)
        s = s < -d ? lo : s + d;
    else if (s > hi)
        s = hi;
    if (e < 0)
        e = e < -d ? lo : e + d;
    else if (e > hi)
        e = hi;
    if (s < lo) s = lo;
    if (e < lo) e = lo;
    *first = s;
    if (step > 0)
        *count = e > s ? (e - s - 1) / step + 1 : 0;
    else if (step == INT64_MIN) /* -step overflows; s - e - 1 < 2^63 fits one step */
        *count = s > e ? 1 : 0;
    else
        *count = s > e ? (s - e - 1) / -step + 1 : 0;
}

void kiln_same_pads(int64_t total, bool upper, int64_t *begin, int64_t *end)
{
    int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2); /* floor(total / 2) */
    *begin = upper ? half : total - half;
    *end = total - *begin;
}

int kiln_scatter_reduction_of(const kiln_node *n)
{
    static const char *const names[] = {"none", "add", "mul", "max", "min"};
    const char *s = kiln_attr_string(n, "reduction", "none");
    for (int k = 0; k < (int)(sizeof names / sizeof names[0]); k++)
        if (!strcmp(s, names[k])) return k;
    return -1;
}

kiln_reduce_op kiln_reduce_op_of(const kiln_node *n)
{
    static const char *const names[] = {
        "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
    };
    for (int k = 0; k < (int)(sizeof names / sizeof names[0]); k++)
        if (!strcmp(n->op_type, names[k])) return (kiln_reduce_op)k;
    return KILN_REDUCE_SUM;
}

bool kiln_reduce_axes_from_input(const kiln_node *n, int opset)
{
    return opset >= (kiln_reduce_op_of(n) == KILN_REDUCE_SUM ? 13 : 18);
}

bool kiln_reduce_axes(const kiln_node *n, int opset, const kiln_value *axes_v, int rank, bool *mask, char *msg,
                      size_t size)
{
    const int64_t *attr = NULL;
    int na = 0;
    bool from_input = kiln_reduce_axes_from_input(n, opset);
    if (!from_input) {
        attr = kiln_attr_ints(n, "axes", &na);
    } else if (axes_v) {
        if (axes_v->kind != KILN_VALUE_TENSOR || axes_v->rank > 1 || !kiln_dtype_is_int(axes_v->dtype) ||
            axes_v->numel > rank) {
            if (size) snprintf(msg, size, "axes (input 1) must be a 1-D integer tensor of at most %d values", rank);
            return false;
        }
        na = (int)axes_v->numel;
    }
    bool noop = from_input && kiln_attr_int(n, "noop_with_empty_axes", 0) != 0;
    for (int k = 0; k < rank; k++) mask[k] = na == 0 && !noop;
    for (int i = 0; i < na; i++) {
        int64_t a = attr ? attr[i] : kiln_load_i64(axes_v->dtype, axes_v->data, i);
        int k;
        if (!kiln_axis_norm(a, rank, &k)) {
            if (size) snprintf(msg, size, "axis %lld out of range for input of rank %d", (long long)a, rank);
            return false;
        }
        if (mask[k]) {
            if (size) snprintf(msg, size, "axis %lld repeated in axes", (long long)a);
            return false;
        }
        mask[k] = true;
    }
    return true;
}
