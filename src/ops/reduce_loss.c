/* reduce_loss.c - NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss over [N, C, d1, ...]
 * inputs with [N, d1, ...] class targets. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/reduce_internal.h"

/* Output 0: the target's shape ([N, d1, ...], the input's dims without C) for reduction
 * "none", else a scalar; output 1 (SoftmaxCrossEntropyLoss's log_prob): the input's type. */
static kiln_status loss_infer(kiln_infer_ctx *c)
{
    const char *red = kiln_attr_string(kiln_infer_node(c), "reduction", "mean");
    const kiln_type *x = kiln_infer_in(c, 0), *t = kiln_infer_in(c, 1);
    if (!x || !t) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs input/scores and target/labels");
    if (strcmp(red, "none") && strcmp(red, "sum") && strcmp(red, "mean"))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "reduction '%s' is not none, sum or mean", red);
    if (x->rank >= 0 && x->rank < 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "input must have rank >= 2 ([N, C, ...]), has rank %d", x->rank);
    if (x->rank >= 0 && t->rank >= 0 && t->rank != x->rank - 1)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "target has rank %d, input has rank %d (needs one less)",
                               t->rank, x->rank);
    if (kiln_infer_has_out(c, 1)) KILN_TRY(kiln_infer_same_as_input(c, 1, 0));
    if (strcmp(red, "none")) return kiln_infer_set_out(c, 0, x->dtype, 0, NULL);
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    kiln_dim dims[KILN_MAX_RANK];
    dims[0] = x->dims[0];
    for (int k = 2; k < x->rank; k++) {
        dims[k - 1] = x->dims[k];
        if (t->rank >= 0)
            KILN_TRY(kiln_infer_require_equal(c, x->dims[k], t->dims[k - 1], "input and target dims"));
    }
    if (t->rank >= 0) KILN_TRY(kiln_infer_require_equal(c, x->dims[0], t->dims[0], "input and target batch dims"));
    return kiln_infer_set_out(c, 0, x->dtype, x->rank - 1, dims);
}

/* The loss of log-probabilities lp [N, C, D] (D: the trailing dims flattened) against the
 * classes in target [N, D], weighted by weight[class] (1 when absent); targets equal to
 * ignore_index count neither loss nor weight. "mean" divides by the total weight. */
static kiln_status nll_core(kiln_run_ctx *c, const double *lp, const kiln_value *x, const kiln_value *target,
                            const kiln_value *weight, kiln_value *y)
{
    const kiln_node *n = kiln_run_node(c);
    const char *red = kiln_attr_string(n, "reduction", "mean");
    bool has_ii = kiln_node_attr(n, "ignore_index") != NULL;
    int64_t ii = kiln_attr_int(n, "ignore_index", 0);
    int64_t N = x->dims[0], C = x->dims[1], D = 1;
    for (int k = 2; k < x->rank; k++) D *= x->dims[k];
    if (target->numel != N * D || !kiln_dtype_is_int(target->dtype))
        return kiln_run_fail(c, KILN_ERR_SHAPE, "target needs %lld integers, has %lld", (long long)(N * D),
                             (long long)target->numel);
    if (weight && weight->numel != C)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "weight needs %lld values, has %lld", (long long)C,
                             (long long)weight->numel);
    bool none = !strcmp(red, "none");
    double sum = 0, wsum = 0;
    for (int64_t i = 0; i < N * D; i++) {
        int64_t t = kiln_load_i64(target->dtype, target->data, i), b = i / D, d = i % D;
        if (has_ii && t == ii) continue;
        if (t < 0 || t >= C)
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "target %lld at %lld out of range [0, %lld)", (long long)t,
                                 (long long)i, (long long)C);
        double w = weight ? kiln_load_f64(weight->dtype, weight->data, t) : 1.0;
        double l = -lp[(b * C + t) * D + d] * w;
        if (none) kiln_store_f64(y->dtype, y->data, i, l);
        sum += l;
        wsum += w;
    }
    if (!none) kiln_store_f64(y->dtype, y->data, 0, strcmp(red, "sum") ? sum / wsum : sum);
    return KILN_OK;
}

kiln_status kiln_nllloss_infer(kiln_infer_ctx *c) { return loss_infer(c); }

kiln_status kiln_nllloss_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    double *lp;
    KILN_TRY(kiln_reduce_load_all(c, x, &lp));
    kiln_status st = nll_core(c, lp, x, kiln_run_in(c, 1), kiln_run_in(c, 2), kiln_run_out(c, 0));
    free(lp);
    return st;
}

kiln_status kiln_sce_infer(kiln_infer_ctx *c) { return loss_infer(c); }

/* log_softmax of the scores over C, then the NLL loss of it. */
kiln_status kiln_sce_run(kiln_run_ctx *c)
{
    const kiln_value *x = kiln_run_in(c, 0);
    kiln_value *log_prob = kiln_run_out(c, 1);
    int64_t N = x->dims[0], C = x->dims[1], D = 1;
    for (int k = 2; k < x->rank; k++) D *= x->dims[k];
    double *lp;
    KILN_TRY(kiln_reduce_load_all(c, x, &lp));
    for (int64_t b = 0; b < N; b++) {
        for (int64_t d = 0; d < D; d++) {
            double *row = lp + b * C * D + d, mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < C; j++) mx = fmax(mx, row[j * D]);
            for (int64_t j = 0; j < C; j++) sum += exp(row[j * D] - mx);
            for (int64_t j = 0; j < C; j++) row[j * D] -= mx + log(sum);
        }
    }
    if (log_prob)
        for (int64_t i = 0; i < x->numel; i++) kiln_store_f64(log_prob->dtype, log_prob->data, i, lp[i]);
    kiln_status st = nll_core(c, lp, x, kiln_run_in(c, 1), kiln_run_in(c, 2), kiln_run_out(c, 0));
    free(lp);
    return st;
}
