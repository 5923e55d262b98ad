/* attention_variants.c - LinearAttention, FlexAttention (ai.onnx.preview), CausalConvWithState. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op.h"
#include "ops/util.h"

static bool is_float_dtype(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16 ||
           dt == KILN_DTYPE_FLOAT64;
}

/* Fails when the dim d is known and not a multiple of n. */
static kiln_status require_multiple(kiln_infer_ctx *c, kiln_dim d, int64_t n, const char *what)
{
    if (kiln_dim_is_const(d) && (n <= 0 || d.c % n != 0))
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "%s (%lld) is not a multiple of %lld", what, (long long)d.c,
                               (long long)n);
    return KILN_OK;
}

/* Whether the dim d is known to equal neither a nor b (both constants). */
static bool dim_known_not_either(kiln_dim d, int64_t a, int64_t b)
{
    return kiln_dim_is_const(d) && d.c != a && d.c != b;
}

/* ---- LinearAttention ---- */

/* Update rule as flags: decay gates the state, delta corrects the written value. */
typedef struct la_rule {
    bool gating, delta;
} la_rule;

static bool la_parse_rule(const char *s, la_rule *r)
{
    if (!strcmp(s, "linear")) *r = (la_rule){false, false};
    else if (!strcmp(s, "gated")) *r = (la_rule){true, false};
    else if (!strcmp(s, "delta")) *r = (la_rule){false, true};
    else if (!strcmp(s, "gated_delta")) *r = (la_rule){true, true};
    else return false;
    return true;
}

/* Inputs: query [B,T,Hq*dk], key [B,T,Hkv*dk], value [B,T,Hkv*dv], past_state [B,Hkv,dk,dv],
 * decay [B,T,Hkv or Hkv*dk], beta [B,T,Hkv or 1]. Outputs: output [B,T,Hq*dv], present_state. */
static kiln_status linear_attention_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *q = kiln_infer_in(c, 0), *k = kiln_infer_in(c, 1), *v = kiln_infer_in(c, 2);
    const kiln_type *past = kiln_infer_in(c, 3), *decay = kiln_infer_in(c, 4), *beta = kiln_infer_in(c, 5);
    if (!q || !k || !v) return kiln_infer_fail(c, KILN_ERR_MODEL, "query, key and value are required");
    int64_t hq = kiln_attr_int(n, "q_num_heads", 0), hkv = kiln_attr_int(n, "kv_num_heads", 0);
    if (hq <= 0 || hkv <= 0 || hq % hkv != 0)
        return kiln_infer_fail(c, KILN_ERR_MODEL,
                               "q_num_heads (%lld) must be a positive multiple of kv_num_heads (%lld)", (long long)hq,
                               (long long)hkv);
    const char *rule_name = kiln_attr_string(n, "update_rule", "gated_delta");
    la_rule rule;
    if (!la_parse_rule(rule_name, &rule))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "unsupported update_rule '%s'", rule_name);
    if (rule.gating != (decay != NULL))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "update_rule '%s' %s the decay input", rule_name,
                               rule.gating ? "requires" : "forbids");
    if (rule.delta != (beta != NULL))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "update_rule '%s' %s the beta input", rule_name,
                               rule.delta ? "requires" : "forbids");
    kiln_dtype state_dt = past ? past->dtype : q->dtype;
    if (q->rank < 0 || k->rank < 0 || v->rank < 0) {
        KILN_TRY(kiln_infer_set_out_unknown(c, 0, q->dtype));
        return kiln_infer_set_out_unknown(c, 1, state_dt);
    }
    if (q->rank != 3 || k->rank != 3 || v->rank != 3)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "query, key, value must be 3-D (ranks %d, %d, %d)", q->rank, k->rank,
                               v->rank);
    kiln_dimtab *t = kiln_infer_dims(c);
    kiln_dim b = q->dims[0], len = q->dims[1];
    KILN_TRY(require_multiple(c, q->dims[2], hq, "query's last dim"));
    KILN_TRY(require_multiple(c, v->dims[2], hkv, "value's last dim"));
    kiln_dim dk = kiln_dim_floordiv(t, q->dims[2], kiln_dim_const(hq));
    kiln_dim dv = kiln_dim_floordiv(t, v->dims[2], kiln_dim_const(hkv));
    KILN_TRY(kiln_infer_require_equal(c, k->dims[0], b, "key batch vs query batch"));
    KILN_TRY(kiln_infer_require_equal(c, v->dims[0], b, "value batch vs query batch"));
    KILN_TRY(kiln_infer_require_equal(c, k->dims[1], len, "key length vs query length"));
    KILN_TRY(kiln_infer_require_equal(c, v->dims[1], len, "value length vs query length"));
    KILN_TRY(kiln_infer_require_equal(c, k->dims[2], kiln_dim_mul(t, kiln_dim_const(hkv), dk),
                                      "key's last dim vs kv_num_heads * d_k"));
    kiln_dim state[4] = {b, kiln_dim_const(hkv), dk, dv};
    if (past && past->rank >= 0) {
        if (past->rank != 4) return kiln_infer_fail(c, KILN_ERR_SHAPE, "past_state must be 4-D (rank %d)", past->rank);
        for (int i = 0; i < 4; i++)
            KILN_TRY(kiln_infer_require_equal(c, past->dims[i], state[i], "past_state vs (B, H_kv, d_k, d_v)"));
    }
    const kiln_type *gates[2] = {decay, beta};
    for (int g = 0; g < 2; g++) {
        const kiln_type *x = gates[g];
        const char *name = g ? "beta" : "decay";
        if (!x || x->rank < 0) continue;
        if (x->rank != 3) return kiln_infer_fail(c, KILN_ERR_SHAPE, "%s must be 3-D (rank %d)", name, x->rank);
        KILN_TRY(kiln_infer_require_equal(c, x->dims[0], b, "gate batch vs query batch"));
        KILN_TRY(kiln_infer_require_equal(c, x->dims[1], len, "gate length vs query length"));
        int64_t alt = g ? 1 : (kiln_dim_is_const(dk) ? hkv * dk.c : hkv);
        if (dim_known_not_either(x->dims[2], hkv, alt))
            return kiln_infer_fail(c, KILN_ERR_SHAPE, "%s's last dim %lld must be %lld or %lld", name,
                                   (long long)x->dims[2].c, (long long)hkv, (long long)alt);
    }
    kiln_dim y[3] = {b, len, kiln_dim_mul(t, kiln_dim_const(hq), dv)};
    KILN_TRY(kiln_infer_set_out(c, 0, q->dtype, 3, y));
    return kiln_infer_set_out(c, 1, state_dt, 4, state);
}

/* The recurrence per (batch, kv head), with the state held in double:
 *   S *= exp(g_t);  u = delta ? beta_t * (v_t - S^T k_t) : v_t;  S += k_t u^T;
 *   o_t = scale * q_t^T S  for each query head sharing this kv head. */
static kiln_status linear_attention_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *q = kiln_run_in(c, 0), *k = kiln_run_in(c, 1), *v = kiln_run_in(c, 2);
    const kiln_value *past = kiln_run_in(c, 3), *decay = kiln_run_in(c, 4), *beta = kiln_run_in(c, 5);
    kiln_value *y = kiln_run_out(c, 0), *present = kiln_run_out(c, 1);
    int64_t hq = kiln_attr_int(n, "q_num_heads", 0), hkv = kiln_attr_int(n, "kv_num_heads", 0);
    int64_t B = q->dims[0], T = q->dims[1], dk = q->dims[2] / hq, dv = v->dims[2] / hkv, group = hq / hkv;
    double scale = kiln_attr_float(n, "scale", 0.0f);
    if (scale == 0.0) scale = 1.0 / sqrt((double)dk);
    int64_t decay_w = decay ? decay->dims[2] : 0, beta_w = beta ? beta->dims[2] : 0;
    size_t cells = (size_t)(dk * dv);
    double *S = malloc((cells ? cells : 1) * sizeof *S), *u = malloc((size_t)(dv ? dv : 1) * sizeof *u);
    if (!S || !u) {
        free(S);
        free(u);
        return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    }
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < hkv; h++) {
            int64_t s0 = (b * hkv + h) * dk * dv;
            for (int64_t i = 0; i < dk * dv; i++) S[i] = past ? kiln_load_f64(past->dtype, past->data, s0 + i) : 0.0;
            for (int64_t t = 0; t < T; t++) {
                int64_t kbase = (b * T + t) * hkv * dk + h * dk, vbase = (b * T + t) * hkv * dv + h * dv;
                if (decay) {
                    for (int64_t i = 0; i < dk; i++) {
                        int64_t gi = (b * T + t) * decay_w + (decay_w == hkv ? h : h * dk + i);
                        double g = exp(kiln_load_f64(decay->dtype, decay->data, gi));
                        for (int64_t m = 0; m < dv; m++) S[i * dv + m] *= g;
                    }
                }
                double bt = beta ? kiln_load_f64(beta->dtype, beta->data, (b * T + t) * beta_w + (beta_w == 1 ? 0 : h))
                                 : 1.0;
                for (int64_t m = 0; m < dv; m++) {
                    double vm = kiln_load_f64(v->dtype, v->data, vbase + m);
                    if (beta) {
                        double r = 0.0;
                        for (int64_t i = 0; i < dk; i++)
                            r += S[i * dv + m] * kiln_load_f64(k->dtype, k->data, kbase + i);
                        vm = bt * (vm - r);
                    }
                    u[m] = vm;
                }
                for (int64_t i = 0; i < dk; i++) {
                    double ki = kiln_load_f64(k->dtype, k->data, kbase + i);
                    for (int64_t m = 0; m < dv; m++) S[i * dv + m] += ki * u[m];
                }
                for (int64_t hh = h * group; hh < (h + 1) * group; hh++) {
                    int64_t qbase = (b * T + t) * hq * dk + hh * dk, ybase = (b * T + t) * hq * dv + hh * dv;
                    for (int64_t m = 0; m < dv; m++) {
                        double acc = 0.0;
                        for (int64_t i = 0; i < dk; i++)
                            acc += kiln_load_f64(q->dtype, q->data, qbase + i) * S[i * dv + m];
                        kiln_store_f64(y->dtype, y->data, ybase + m, kiln_round_to(KILN_DTYPE_FLOAT32, scale * acc));
                    }
                }
            }
            if (present)
                for (int64_t i = 0; i < dk * dv; i++)
                    kiln_store_f64(present->dtype, present->data, s0 + i, kiln_round_to(KILN_DTYPE_FLOAT32, S[i]));
        }
    }
    free(S);
    free(u);
    return KILN_OK;
}

/* ---- FlexAttention ---- */

/* Element type of the scores and probabilities: softmax_precision, else double for double
 * inputs and float32 otherwise. */
static kiln_dtype flex_softmax_dtype(const kiln_node *n, kiln_dtype in_dt)
{
    const kiln_attr *a = kiln_node_attr(n, "softmax_precision");
    if (a) return (kiln_dtype)a->i;
    return in_dt == KILN_DTYPE_FLOAT64 ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32;
}

/* Q [B,Hq,L,E], K [B,Hkv,S,E], V [B,Hkv,S,Ev] -> Y [B,Hq,L,Ev] of V's type. */
static kiln_status flex_attention_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *q = kiln_infer_in(c, 0), *k = kiln_infer_in(c, 1), *v = kiln_infer_in(c, 2);
    if (!q || !k || !v) return kiln_infer_fail(c, KILN_ERR_MODEL, "Q, K and V are required");
    if (kiln_node_attr(n, "softmax_precision") && !is_float_dtype(flex_softmax_dtype(n, q->dtype)))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "unsupported softmax_precision %lld",
                               (long long)kiln_attr_int(n, "softmax_precision", 0));
    const char *mods[2] = {"score_mod", "prob_mod"};
    for (int i = 0; i < 2; i++) {
        const kiln_graph *g = kiln_attr_graph(n, mods[i]);
        if (g && (g->n_inputs != 1 || g->n_outputs != 1))
            return kiln_infer_fail(c, KILN_ERR_MODEL, "%s must have 1 input and 1 output (has %d and %d)", mods[i],
                                   g->n_inputs, g->n_outputs);
    }
    if (q->rank < 0 || k->rank < 0 || v->rank < 0) return kiln_infer_set_out_unknown(c, 0, v->dtype);
    if (q->rank != 4 || k->rank != 4 || v->rank != 4)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "Q, K, V must be 4-D (ranks %d, %d, %d)", q->rank, k->rank, v->rank);
    KILN_TRY(kiln_infer_require_equal(c, k->dims[0], q->dims[0], "K batch vs Q batch"));
    KILN_TRY(kiln_infer_require_equal(c, v->dims[0], q->dims[0], "V batch vs Q batch"));
    KILN_TRY(kiln_infer_require_equal(c, v->dims[1], k->dims[1], "V heads vs K heads"));
    KILN_TRY(kiln_infer_require_equal(c, v->dims[2], k->dims[2], "V length vs K length"));
    KILN_TRY(kiln_infer_require_equal(c, k->dims[3], q->dims[3], "K head size vs Q head size"));
    if (kiln_dim_is_const(k->dims[1])) KILN_TRY(require_multiple(c, q->dims[1], k->dims[1].c, "Q heads"));
    kiln_dim y[4] = {q->dims[0], q->dims[1], q->dims[2], v->dims[3]};
    return kiln_infer_set_out(c, 0, v->dtype, 4, y);
}

/* Runs the modifier subgraph g on buf (n elements of dims, held at precision dt) in place. */
static kiln_status flex_apply_mod(kiln_run_ctx *c, const kiln_graph *g, const char *what, kiln_dtype dt,
                                  const int64_t *dims, int64_t n, double *buf)
{
    kiln_value *in = NULL, *out = NULL;
    KILN_TRY(kiln_tensor_new(dt, 4, dims, &in, kiln_run_err(c)));
    for (int64_t i = 0; i < n; i++) kiln_store_f64(dt, in->data, i, buf[i]);
    const kiln_value *args[1] = {in};
    kiln_status st = kiln_run_subgraph(c, g, 1, args, &out);
    kiln_value_free(in);
    if (st) return st;
    if (out->kind != KILN_VALUE_TENSOR || out->rank != 4 || memcmp(out->dims, dims, 4 * sizeof *dims) != 0 ||
        !is_float_dtype(out->dtype)) {
        kiln_value_free(out);
        return kiln_run_fail(c, KILN_ERR_RUNTIME,
                             "%s must return a float tensor of the input's shape [%lld,%lld,%lld,%lld]", what,
                             (long long)dims[0], (long long)dims[1], (long long)dims[2], (long long)dims[3]);
    }
    for (int64_t i = 0; i < n; i++) buf[i] = kiln_round_to(dt, kiln_load_f64(out->dtype, out->data, i));
    kiln_value_free(out);
    return KILN_OK;
}

/* Numpy's order: Q and K each pre-scaled by sqrt(scale) in their type, Q K^T in that type, then
 * score_mod, softmax and prob_mod at softmax precision, P V at softmax precision. */
static kiln_status flex_attention_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *q = kiln_run_in(c, 0), *k = kiln_run_in(c, 1), *v = kiln_run_in(c, 2);
    kiln_value *y = kiln_run_out(c, 0);
    int64_t B = q->dims[0], Hq = q->dims[1], L = q->dims[2], E = q->dims[3];
    int64_t Hkv = k->dims[1], S = k->dims[2], Ev = v->dims[3];
    if (Hkv <= 0 || Hq % Hkv != 0)
        return kiln_run_fail(c, KILN_ERR_SHAPE, "Q heads (%lld) must be a multiple of K heads (%lld)", (long long)Hq,
                             (long long)Hkv);
    int64_t group = Hq / Hkv;
    kiln_dtype dt = q->dtype, sm = flex_softmax_dtype(n, dt);
    const kiln_attr *scale_attr = kiln_node_attr(n, "scale");
    double scale = scale_attr ? scale_attr->f : 1.0 / sqrt((double)E);
    double ss = kiln_round_to(dt, sqrtf((float)scale)); /* numpy: sqrt in float32, cast to Q's type */
    int64_t sdims[4] = {B, Hq, L, S}, total = B * Hq * L * S;
    double *P = malloc((size_t)(total ? total : 1) * sizeof *P);
    if (!P) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < L; i++)
                for (int64_t j = 0; j < S; j++) {
                    int64_t qo = ((b * Hq + h) * L + i) * E, ko = ((b * Hkv + h / group) * S + j) * E;
                    double acc = 0.0;
                    for (int64_t e = 0; e < E; e++)
                        acc += kiln_round_to(dt, kiln_load_f64(dt, q->data, qo + e) * ss) *
                               kiln_round_to(dt, kiln_load_f64(k->dtype, k->data, ko + e) * ss);
                    P[((b * Hq + h) * L + i) * S + j] = kiln_round_to(sm, kiln_round_to(dt, acc));
                }
    kiln_status st = KILN_OK;
    const kiln_graph *score_mod = kiln_attr_graph(n, "score_mod"), *prob_mod = kiln_attr_graph(n, "prob_mod");
    if (score_mod && (st = flex_apply_mod(c, score_mod, "score_mod", sm, sdims, total, P))) goto done;
    for (int64_t r = 0; r < B * Hq * L; r++) {
        double *row = P + r * S, mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < S; j++) mx = row[j] > mx || isnan(row[j]) ? row[j] : mx;
        for (int64_t j = 0; j < S; j++) {
            row[j] = kiln_round_to(sm, exp(row[j] - mx));
            sum += row[j];
        }
        sum = kiln_round_to(sm, sum);
        for (int64_t j = 0; j < S; j++) row[j] = kiln_round_to(sm, row[j] / sum);
    }
    if (prob_mod && (st = flex_apply_mod(c, prob_mod, "prob_mod", sm, sdims, total, P))) goto done;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < L; i++)
                for (int64_t d = 0; d < Ev; d++) {
                    const double *row = P + ((b * Hq + h) * L + i) * S;
                    int64_t vo = (b * Hkv + h / group) * S * Ev + d;
                    double acc = 0.0;
                    for (int64_t j = 0; j < S; j++)
                        acc += row[j] * kiln_round_to(sm, kiln_load_f64(v->dtype, v->data, vo + j * Ev));
                    kiln_store_f64(y->dtype, y->data, ((b * Hq + h) * L + i) * Ev + d, kiln_round_to(sm, acc));
                }
done:
    free(P);
    return st;
}

/* ---- CausalConvWithState ---- */

/* input [B,C,L], weight [C,1,k], bias [C], past_state [B,C,k-1] -> output [B,C,L],
 * present_state [B,C,k-1]. */
static kiln_status causal_conv_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0), *w = kiln_infer_in(c, 1), *bias = kiln_infer_in(c, 2);
    const kiln_type *past = kiln_infer_in(c, 3);
    if (!x || !w) return kiln_infer_fail(c, KILN_ERR_MODEL, "input and weight are required");
    const char *act = kiln_attr_string(n, "activation", "none");
    if (strcmp(act, "none") && strcmp(act, "silu") && strcmp(act, "swish"))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "unsupported activation '%s'", act);
    if (x->rank < 0 || w->rank < 0) {
        KILN_TRY(kiln_infer_set_out_unknown(c, 0, x->dtype));
        return kiln_infer_set_out_unknown(c, 1, x->dtype);
    }
    if (x->rank != 3 || w->rank != 3)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "input and weight must be 3-D (ranks %d, %d)", x->rank, w->rank);
    KILN_TRY(kiln_infer_require_equal(c, w->dims[0], x->dims[1], "weight dim 0 vs input channels"));
    KILN_TRY(kiln_infer_require_equal(c, w->dims[1], kiln_dim_const(1), "weight dim 1 (depthwise)"));
    if (kiln_dim_is_const(w->dims[2]) && w->dims[2].c < 1)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "kernel size %lld must be >= 1", (long long)w->dims[2].c);
    kiln_dim carry = kiln_dim_sub(kiln_infer_dims(c), w->dims[2], kiln_dim_const(1));
    kiln_dim state[3] = {x->dims[0], x->dims[1], carry};
    if (bias && bias->rank >= 0) {
        if (bias->rank != 1) return kiln_infer_fail(c, KILN_ERR_SHAPE, "bias must be 1-D (rank %d)", bias->rank);
        KILN_TRY(kiln_infer_require_equal(c, bias->dims[0], x->dims[1], "bias length vs input channels"));
    }
    if (past && past->rank >= 0) {
        if (past->rank != 3) return kiln_infer_fail(c, KILN_ERR_SHAPE, "past_state must be 3-D (rank %d)", past->rank);
        for (int i = 0; i < 3; i++)
            KILN_TRY(kiln_infer_require_equal(c, past->dims[i], state[i], "past_state vs (B, C, k - 1)"));
    }
    KILN_TRY(kiln_infer_set_out(c, 0, x->dtype, 3, x->dims));
    return kiln_infer_set_out(c, 1, x->dtype, 3, state);
}

/* Element p of the padded sequence (past_state or zeros, then input) of row (b, ch). */
static double padded_at(const kiln_value *x, const kiln_value *past, int64_t row, int64_t carry, int64_t p)
{
    if (p >= carry) return kiln_load_f64(x->dtype, x->data, row * x->dims[2] + p - carry);
    return past ? kiln_load_f64(past->dtype, past->data, row * carry + p) : 0.0;
}

/* Numpy's order: the convolution accumulates wide and rounds to the input type, the bias is
 * added in that type, SiLU is computed in float32 and rounded back. */
static kiln_status causal_conv_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *x = kiln_run_in(c, 0), *w = kiln_run_in(c, 1), *bias = kiln_run_in(c, 2);
    const kiln_value *past = kiln_run_in(c, 3);
    kiln_value *y = kiln_run_out(c, 0), *present = kiln_run_out(c, 1);
    bool silu = strcmp(kiln_attr_string(n, "activation", "none"), "none") != 0;
    int64_t C = x->dims[1], L = x->dims[2], K = w->dims[2], carry = K - 1;
    kiln_dtype dt = x->dtype;
    for (int64_t row = 0; row < x->dims[0] * C; row++) {
        int64_t ch = row % C;
        for (int64_t t = 0; t < L; t++) {
            double acc = 0.0;
            for (int64_t j = 0; j < K; j++)
                acc += kiln_load_f64(w->dtype, w->data, ch * K + j) * padded_at(x, past, row, carry, t + j);
            double o = kiln_round_to(dt, acc);
            if (bias) o = kiln_round_to(dt, o + kiln_load_f64(bias->dtype, bias->data, ch));
            if (silu) o = kiln_round_to(KILN_DTYPE_FLOAT32, o * kiln_round_to(KILN_DTYPE_FLOAT32, 1.0 / (1.0 + exp(-o))));
            kiln_store_f64(dt, y->data, row * L + t, o);
        }
        if (present)
            for (int64_t p = 0; p < carry; p++)
                kiln_store_f64(present->dtype, present->data, row * carry + p, padded_at(x, past, row, carry, L + p));
    }
    return KILN_OK;
}

static const kiln_op_def defs[] = {
    {"", "LinearAttention", 1, linear_attention_infer, linear_attention_run},
    {"ai.onnx.preview", "FlexAttention", 1, flex_attention_infer, flex_attention_run},
    {"", "CausalConvWithState", 1, causal_conv_infer, causal_conv_run},
};

const kiln_op_table kiln_ops_attention_variants = {defs, sizeof defs / sizeof defs[0]};
