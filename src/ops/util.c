/* util.c - shared kernel helpers. */
#include "ops/util.h"

#include <string.h>

bool kiln_axis_norm(int64_t axis, int rank, int *out)
{
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return false;
    *out = (int)axis;
    return true;
}

void kiln_strides(int rank, const int64_t *dims, int64_t *strides)
{
    int64_t s = 1;
    for (int k = rank - 1; k >= 0; k--) {
        strides[k] = s;
        s *= dims[k];
    }
}

void kiln_iter_init(kiln_iter *it, int rank, const int64_t *dims, int n_ops, int64_t (*strides)[KILN_MAX_RANK])
{
    memset(it, 0, sizeof *it);
    it->rank = rank;
    it->n_ops = n_ops;
    if (rank) memcpy(it->dims, dims, (size_t)rank * sizeof *dims);
    for (int o = 0; o < n_ops; o++) memcpy(it->strides[o], strides[o], (size_t)rank * sizeof(int64_t));
}

void kiln_iter_next(kiln_iter *it)
{
    for (int k = it->rank - 1; k >= 0; k--) {
        it->idx[k]++;
        for (int o = 0; o < it->n_ops; o++) it->off[o] += it->strides[o][k];
        if (it->idx[k] < it->dims[k]) return;
        for (int o = 0; o < it->n_ops; o++) it->off[o] -= it->strides[o][k] * it->dims[k];
        it->idx[k] = 0;
    }
}

double kiln_round_to(kiln_dtype dt, double v)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT32: return (float)v;
    case KILN_DTYPE_FLOAT16: return kiln_f16_to_f32(kiln_f32_to_f16((float)v));
    case KILN_DTYPE_BFLOAT16: return kiln_bf16_to_f32(kiln_f32_to_bf16((float)v));
    default: return v;
    }
}

kiln_status kiln_infer_max_inputs(kiln_infer_ctx *c, int max)
{
    for (int i = max; i < kiln_infer_n_in(c); i++)
        if (kiln_infer_in(c, i))
            return kiln_infer_fail(c, KILN_ERR_MODEL, "takes at most %d input%s, has %d", max, max == 1 ? "" : "s",
                                   kiln_infer_n_in(c));
    return KILN_OK;
}

kiln_status kiln_infer_elementwise(kiln_infer_ctx *c, kiln_dtype dt)
{
    int n = kiln_infer_n_in(c);
    const kiln_type *ins[64];
    if (n > 64) return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "more than 64 inputs");
    const kiln_type *first = NULL;
    for (int i = 0; i < n; i++) {
        ins[i] = kiln_infer_in(c, i);
        if (!first) first = ins[i];
    }
    if (!first) return kiln_infer_fail(c, KILN_ERR_MODEL, "no inputs");
    int rank;
    kiln_dim dims[KILN_MAX_RANK];
    KILN_TRY(kiln_infer_broadcast(c, n, ins, &rank, dims));
    if (dt == KILN_DTYPE_UNDEFINED) dt = first->dtype;
    if (rank < 0) return kiln_infer_set_out_unknown(c, 0, dt);
    return kiln_infer_set_out(c, 0, dt, rank, dims);
}
