/* llm_norm.c - SimplifiedLayerNormalization (RMS normalisation over the dims from `axis` on:
 * Y = X / sqrt(mean(X^2) + epsilon) * scale, and the optional inv_std_var output), as ONNX
 * Runtime registers it in the default domain and as com.microsoft. Statistics in double. */
#include <math.h>

#include "ops/util.h"

static bool sln_axis(const kiln_node *n, int rank, int *axis)
{
    return kiln_axis_norm(kiln_attr_int(n, "axis", -1), rank, axis);
}

static kiln_status sln_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *s = kiln_infer_in(c, 1);
    if (!x || !s) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs X and scale");
    kiln_dtype u = x->dtype == KILN_DTYPE_FLOAT64 ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32;
    KILN_TRY(kiln_infer_same_as_input(c, 0, 0));
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 1, u);
    int axis;
    if (!sln_axis(kiln_infer_node(c), x->rank, &axis))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "axis %lld is outside rank %d",
                               (long long)kiln_attr_int(kiln_infer_node(c), "axis", -1), x->rank);
    if (s->rank >= 0) {
        if (s->rank > x->rank - axis)
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "scale has rank %d, more than the %d normalised dims", s->rank,
                                   x->rank - axis);
        for (int i = 0; i < s->rank; i++)
            KILN_TRY(kiln_infer_require_equal(c, s->dims[i], x->dims[x->rank - s->rank + i], "scale dim and X's normalised dim"));
    }
    kiln_dim d[KILN_MAX_RANK];
    for (int i = 0; i < x->rank; i++) d[i] = i < axis ? x->dims[i] : kiln_dim_const(1);
    return kiln_infer_set_out(c, 1, u, x->rank, d);
}

static kiln_status sln_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *S = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0), *Inv = kiln_run_out(c, 1);
    int axis;
    if (!S || !sln_axis(n, X->rank, &axis)) return kiln_run_fail(c, KILN_ERR_MODEL, "needs scale and an axis inside X's rank");
    int64_t h = 1;
    for (int i = axis; i < X->rank; i++) h *= X->dims[i];
    bool fits = S->rank <= X->rank - axis;
    for (int i = 0; fits && i < S->rank; i++) fits = S->dims[i] == X->dims[X->rank - S->rank + i];
    if (!fits || !S->numel || h % S->numel)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "scale (%lld elements) does not match X's normalised dims", (long long)S->numel);
    double eps = kiln_attr_float(n, "epsilon", 1e-5f);
    int64_t rows = h ? X->numel / h : 0;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t j = 0; j < h; j++) {
            double x = kiln_load_f64(X->dtype, X->data, r * h + j);
            ss += x * x;
        }
        double inv = 1.0 / sqrt(ss / (double)h + eps);
        for (int64_t j = 0; j < h; j++)
            kiln_store_f64(Y->dtype, Y->data, r * h + j,
                           kiln_load_f64(X->dtype, X->data, r * h + j) * inv * kiln_load_f64(S->dtype, S->data, j % S->numel));
        if (Inv) kiln_store_f64(Inv->dtype, Inv->data, r, inv);
    }
    return KILN_OK;
}

static const kiln_op_def defs[] = {
    {"", "SimplifiedLayerNormalization", 1, sln_infer, sln_run},
    {"com.microsoft", "SimplifiedLayerNormalization", 1, sln_infer, sln_run},
};

const kiln_op_table kiln_ops_llm_norm = {defs, sizeof defs / sizeof defs[0]};
