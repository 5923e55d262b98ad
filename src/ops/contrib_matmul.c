/* contrib_matmul.c - com.microsoft FusedMatMul (MatMul with alpha and transposes of the last
 * two dims or of the first and batch dims), FusedGemm (Gemm, then an activation) and FusedConv
 * (Conv, plus an optional Z, then an activation). Reference kernels accumulate in double. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/contrib_internal.h"
#include "ops/nn_internal.h"
#include "ops/util.h"

/* ---- activations by name ---- */

typedef struct act_name {
    const char *name;
    kiln_contrib_act_kind kind;
    int n_params; /* FusedGemm: activation_alpha, _beta, _gamma needed; FusedConv: activation_params */
    bool gemm, conv;
} act_name;

static const act_name act_names[] = {
    {"Relu", KILN_CONTRIB_ACT_RELU, 0, true, true},
    {"Tanh", KILN_CONTRIB_ACT_TANH, 0, true, true},
    {"Sigmoid", KILN_CONTRIB_ACT_SIGMOID, 0, true, true},
    {"Softsign", KILN_CONTRIB_ACT_SOFTSIGN, 0, true, false},
    {"Softplus", KILN_CONTRIB_ACT_SOFTPLUS, 0, true, false},
    {"LeakyRelu", KILN_CONTRIB_ACT_LEAKY_RELU, 1, true, true},
    {"HardSigmoid", KILN_CONTRIB_ACT_HARD_SIGMOID, 2, true, true},
    {"Elu", KILN_CONTRIB_ACT_ELU, 1, true, false},
    {"Selu", KILN_CONTRIB_ACT_SELU, 3, true, false}, /* alpha and gamma */
    {"ThresholdedRelu", KILN_CONTRIB_ACT_THRESHOLDED_RELU, 1, true, false},
    {"ScaledTanh", KILN_CONTRIB_ACT_SCALED_TANH, 2, true, false},
    {"ParametricSoftplus", KILN_CONTRIB_ACT_PARAMETRIC_SOFTPLUS, 2, true, false},
    {"Clip", KILN_CONTRIB_ACT_CLIP, 2, false, true},
};

bool kiln_contrib_act_parse(const kiln_node *n, bool conv, kiln_contrib_act *a, char *msg, int size)
{
    memset(a, 0, sizeof *a);
    const char *name = kiln_attr_string(n, "activation", "");
    const act_name *an = NULL;
    for (size_t i = 0; i < sizeof act_names / sizeof act_names[0]; i++)
        if (!strcmp(act_names[i].name, name) && (conv ? act_names[i].conv : act_names[i].gemm)) an = &act_names[i];
    if (!an) {
        snprintf(msg, (size_t)size, "activation '%s' is not one %s supports", name, conv ? "FusedConv" : "FusedGemm");
        return false;
    }
    a->kind = an->kind;
    if (conv) {
        int np = 0;
        const float *p = kiln_attr_floats(n, "activation_params", &np);
        if (np != an->n_params) {
            snprintf(msg, (size_t)size, "activation %s needs %d activation_params, has %d", name, an->n_params, np);
            return false;
        }
        if (np > 0) a->alpha = p[0];
        if (np > 1) a->beta = p[1];
        return true;
    }
    const char *names[3] = {"activation_alpha", "activation_beta", "activation_gamma"};
    bool need[3] = {an->n_params >= 1, an->n_params == 2, an->n_params == 3};
    if (an->kind == KILN_CONTRIB_ACT_SELU) need[0] = true, need[1] = false, need[2] = true;
    double *dst[3] = {&a->alpha, &a->beta, &a->gamma};
    for (int i = 0; i < 3; i++) {
        if (!need[i]) continue;
        if (!kiln_node_attr_typed(n, names[i], KILN_ATTR_FLOAT)) {
            snprintf(msg, (size_t)size, "activation %s needs attribute %s", name, names[i]);
            return false;
        }
        *dst[i] = kiln_attr_float(n, names[i], 0.0f);
    }
    return true;
}

/* Applies the node's activation to every element of Y in place (after the base op). */
static void act_over(const kiln_contrib_act *a, kiln_value *Y)
{
    if (a->kind == KILN_CONTRIB_ACT_NONE) return;
    for (int64_t i = 0; i < Y->numel; i++)
        kiln_store_f64(Y->dtype, Y->data, i, kiln_contrib_act_eval(a, kiln_load_f64(Y->dtype, Y->data, i)));
}

/* ---- FusedMatMul ---- */

/* The permutation FusedMatMul reads an operand of rank r through: transBatch moves dim 0 to
 * the second-to-last place, trans swaps the last two. */
static void mm_perm(int r, bool trans, bool trans_batch, int *perm)
{
    for (int i = 0; i < r; i++) perm[i] = i;
    if (trans_batch && r >= 3) {
        for (int i = 0; i < r - 2; i++) perm[i] = i + 1;
        perm[r - 2] = 0;
    }
    if (trans && r >= 2) {
        int t = perm[r - 2];
        perm[r - 2] = perm[r - 1];
        perm[r - 1] = t;
    }
}

typedef struct mm_attrs {
    bool ta, tb, tba, tbb;
    double alpha;
} mm_attrs;

static mm_attrs mm_attrs_of(const kiln_node *n)
{
    return (mm_attrs){kiln_attr_int(n, "transA", 0) != 0, kiln_attr_int(n, "transB", 0) != 0,
                      kiln_attr_int(n, "transBatchA", 0) != 0, kiln_attr_int(n, "transBatchB", 0) != 0,
                      kiln_attr_float(n, "alpha", 1.0f)};
}

kiln_status kiln_contrib_fused_matmul_infer(kiln_infer_ctx *c)
{
    const kiln_type *a = kiln_infer_in(c, 0), *b = kiln_infer_in(c, 1);
    if (!a || !b) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs A and B");
    if (a->rank < 0 || b->rank < 0) return kiln_infer_set_out_unknown(c, 0, a->dtype);
    if (a->rank == 0 || b->rank == 0) return kiln_infer_fail(c, KILN_ERR_SHAPE, "A and B must not be scalars");
    mm_attrs at = mm_attrs_of(kiln_infer_node(c));
    if ((at.tba || at.tbb) && (a->rank < 3 || a->rank != b->rank))
        return kiln_infer_fail(c, KILN_ERR_SHAPE,
                               "transBatchA/transBatchB need A and B of one rank >= 3, have ranks %d and %d", a->rank,
                               b->rank);
    int pa[KILN_MAX_RANK], pb[KILN_MAX_RANK];
    mm_perm(a->rank, at.ta, at.tba, pa);
    mm_perm(b->rank, at.tb, at.tbb, pb);
    kiln_type ta = *a, tb = *b;
    for (int i = 0; i < a->rank; i++) ta.dims[i] = a->dims[pa[i]];
    for (int i = 0; i < b->rank; i++) tb.dims[i] = b->dims[pb[i]];
    kiln_dim ka = ta.dims[ta.rank - 1], kb = tb.dims[tb.rank == 1 ? 0 : tb.rank - 2];
    KILN_TRY(kiln_infer_require_equal(c, ka, kb, "op(A)'s last dim (K) and op(B)'s second-to-last dim (K)"));
    kiln_dim m = ta.dims[ta.rank - 2 >= 0 ? ta.rank - 2 : 0], nn = tb.dims[tb.rank - 1];
    int ar = ta.rank, br = tb.rank;
    ta.rank = ar > 2 ? ar - 2 : 0;
    tb.rank = br > 2 ? br - 2 : 0;
    const kiln_type *ins[2] = {&ta, &tb};
    int r;
    kiln_dim dims[KILN_MAX_RANK];
    KILN_TRY(kiln_infer_broadcast(c, 2, ins, &r, dims));
    if (ar >= 2) dims[r++] = m;
    if (br >= 2) dims[r++] = nn;
    return kiln_infer_set_out(c, 0, a->dtype, r, dims);
}

bool kiln_contrib_mm_resolve(const kiln_node *n, const kiln_value *A, const kiln_value *B, kiln_contrib_mm_view *v, char *msg,
                        int size)
{
    mm_attrs at = mm_attrs_of(n);
    int ar = A->rank, br = B->rank;
    if (ar < 1 || br < 1) {
        snprintf(msg, (size_t)size, "A and B must not be scalars");
        return false;
    }
    if ((at.tba || at.tbb) && (ar < 3 || ar != br)) {
        snprintf(msg, (size_t)size, "transBatchA/transBatchB need A and B of one rank >= 3, have ranks %d and %d", ar,
                 br);
        return false;
    }
    int pa[KILN_MAX_RANK], pb[KILN_MAX_RANK];
    mm_perm(ar, at.ta, at.tba, pa);
    mm_perm(br, at.tb, at.tbb, pb);
    int64_t sa[KILN_MAX_RANK], sb[KILN_MAX_RANK], ad[KILN_MAX_RANK + 1], as[KILN_MAX_RANK + 1],
        bd[KILN_MAX_RANK + 1], bs[KILN_MAX_RANK + 1];
    kiln_strides(ar, A->dims, sa);
    kiln_strides(br, B->dims, sb);
    for (int i = 0; i < ar; i++) ad[i] = A->dims[pa[i]], as[i] = sa[pa[i]];
    for (int i = 0; i < br; i++) bd[i] = B->dims[pb[i]], bs[i] = sb[pb[i]];
    if (ar == 1) ad[1] = ad[0], as[1] = as[0], ad[0] = 1, as[0] = 0, ar = 2; /* [K] -> [1, K] */
    if (br == 1) bd[1] = 1, bs[1] = 0, br = 2;                            /* [K] -> [K, 1] */
    v->M = ad[ar - 2], v->K = ad[ar - 1], v->N = bd[br - 1];
    if (bd[br - 2] != v->K) {
        snprintf(msg, (size_t)size, "op(A) is [.., %lld, %lld] but op(B) is [.., %lld, %lld]: K differs",
                 (long long)v->M, (long long)v->K, (long long)bd[br - 2], (long long)v->N);
        return false;
    }
    v->a_rs = as[ar - 2], v->a_cs = as[ar - 1], v->b_rs = bs[br - 2], v->b_cs = bs[br - 1];
    int abr = ar - 2, bbr = br - 2, r = abr > bbr ? abr : bbr;
    v->yb = r;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - abr), ib = i - (r - bbr);
        int64_t da = ia >= 0 ? ad[ia] : 1, db = ib >= 0 ? bd[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            snprintf(msg, (size_t)size, "batch dims %lld and %lld of op(A) and op(B) do not broadcast", (long long)da,
                     (long long)db);
            return false;
        }
        v->ydims[i] = da == 1 ? db : da;
        v->a_bs[i] = da == 1 ? 0 : as[ia];
        v->b_bs[i] = db == 1 ? 0 : bs[ib];
    }
    return true;
}

kiln_status kiln_contrib_fused_matmul_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_contrib_mm_view v;
    char msg[160];
    if (!kiln_contrib_mm_resolve(n, A, B, &v, msg, sizeof msg)) return kiln_run_fail(c, KILN_ERR_SHAPE, "%s", msg);
    double alpha = mm_attrs_of(n).alpha;
    double *a = kiln_nn_load_f64(A), *b = kiln_nn_load_f64(B);
    if (!a || !b) {
        free(a), free(b);
        return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    }
    int64_t batches = 1, idx[KILN_MAX_RANK] = {0};
    for (int i = 0; i < v.yb; i++) batches *= v.ydims[i];
    for (int64_t t = 0; t < batches; t++) {
        int64_t oa = 0, ob = 0;
        for (int i = 0; i < v.yb; i++) oa += idx[i] * v.a_bs[i], ob += idx[i] * v.b_bs[i];
        for (int64_t i = 0; i < v.M; i++)
            for (int64_t j = 0; j < v.N; j++) {
                double s = 0;
                for (int64_t k = 0; k < v.K; k++) s += a[oa + i * v.a_rs + k * v.a_cs] * b[ob + k * v.b_rs + j * v.b_cs];
                kiln_store_f64(Y->dtype, Y->data, (t * v.M + i) * v.N + j, alpha * s);
            }
        kiln_nn_index_next(v.yb, v.ydims, idx);
    }
    free(a), free(b);
    return KILN_OK;
}

/* ---- FusedGemm ---- */

kiln_status kiln_contrib_fused_gemm_infer(kiln_infer_ctx *c)
{
    kiln_contrib_act a;
    char msg[160];
    if (!kiln_contrib_act_parse(kiln_infer_node(c), false, &a, msg, sizeof msg))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    return kiln_nn_gemm_infer(c);
}

kiln_status kiln_contrib_fused_gemm_run(kiln_run_ctx *c)
{
    kiln_contrib_act a;
    char msg[160];
    if (!kiln_contrib_act_parse(kiln_run_node(c), false, &a, msg, sizeof msg))
        return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    KILN_TRY(kiln_nn_gemm_run(c));
    act_over(&a, kiln_run_out(c, 0));
    return KILN_OK;
}

/* ---- FusedConv: Y = act(Conv(X, W, B) + Z) ---- */

kiln_status kiln_contrib_fused_conv_infer(kiln_infer_ctx *c)
{
    kiln_contrib_act a;
    char msg[160];
    if (!kiln_contrib_act_parse(kiln_infer_node(c), true, &a, msg, sizeof msg))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    KILN_TRY(kiln_nn_conv_infer(c));
    const kiln_type *x = kiln_infer_in(c, 0), *z = kiln_infer_in(c, 3);
    if (z && x && z->rank >= 0 && x->rank >= 0 && z->rank != x->rank)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "Z has rank %d, X and Y rank %d", z->rank, x->rank);
    return KILN_OK;
}

kiln_status kiln_contrib_fused_conv_run(kiln_run_ctx *c)
{
    kiln_contrib_act a;
    char msg[160];
    if (!kiln_contrib_act_parse(kiln_run_node(c), true, &a, msg, sizeof msg))
        return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    const kiln_value *Z = kiln_run_in(c, 3);
    KILN_TRY(kiln_nn_conv_run(c));
    kiln_value *Y = kiln_run_out(c, 0);
    bool same = Z && Z->rank == Y->rank;
    for (int i = 0; same && i < Y->rank; i++) same = Z->dims[i] == Y->dims[i];
    if (Z && !same)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "Z (rank %d, %lld elements) does not have Y's shape (rank %d, %lld elements)",
                             Z->rank, (long long)Z->numel, Y->rank, (long long)Y->numel);
    for (int64_t i = 0; i < Y->numel; i++) {
        double y = kiln_load_f64(Y->dtype, Y->data, i);
        if (Z) y += kiln_load_f64(Z->dtype, Z->data, i);
        kiln_store_f64(Y->dtype, Y->data, i, kiln_contrib_act_eval(&a, y));
    }
    return KILN_OK;
}
