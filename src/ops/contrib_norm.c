/* contrib_norm.c - com.microsoft SkipLayerNormalization, SkipSimplifiedLayerNormalization
 * (residual add, optional bias, then LayerNorm or RMSNorm over the last dim) and
 * EmbedLayerNormalization (word + position + segment embeddings, then LayerNorm, and the
 * mask's per-row count of ones). Statistics in double; epsilon defaults to 1e-12 as in ONNX
 * Runtime. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/contrib_internal.h"
#include "ops/util.h"

#define EPS_DEFAULT 1e-12f

/* A 1-D input i of length h when present (or required): fails naming `what` otherwise. */
static kiln_status infer_vec(kiln_infer_ctx *c, int i, kiln_dim h, bool required, const char *what)
{
    const kiln_type *t = kiln_infer_in(c, i);
    if (!t) return required ? kiln_infer_fail(c, KILN_ERR_MODEL, "needs input %s", what) : KILN_OK;
    if (t->rank < 0) return KILN_OK;
    if (t->rank != 1) return kiln_infer_fail(c, KILN_ERR_SHAPE, "%s must be 1-D, has rank %d", what, t->rank);
    return kiln_infer_require_equal(c, t->dims[0], h, what);
}

static bool vec_ok(const kiln_value *v, int64_t h)
{
    return !v || (v->rank == 1 && v->dims[0] == h);
}

/* ---- SkipLayerNormalization / SkipSimplifiedLayerNormalization ---- */

/* bias_in: index of the bias input (4 for SkipLayerNormalization, 3 for the simplified form);
 * beta_in: index of beta or -1. */
static kiln_status skip_infer(kiln_infer_ctx *c, int beta_in, int bias_in)
{
    const kiln_type *x = kiln_infer_in(c, 0), *s = kiln_infer_in(c, 1);
    if (!x || !s) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs input, skip and gamma");
    if (x->rank >= 0 && x->rank != 2 && x->rank != 3)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "input must be 2-D or 3-D, has rank %d", x->rank);
    if (x->rank >= 0) {
        kiln_dim h = x->dims[x->rank - 1];
        KILN_TRY(infer_vec(c, 2, h, true, "gamma (hidden size)"));
        if (beta_in >= 0) KILN_TRY(infer_vec(c, beta_in, h, false, "beta (hidden size)"));
        KILN_TRY(infer_vec(c, bias_in, h, false, "bias (hidden size)"));
        if (s->rank >= 0) {
            /* skip is input's shape, or its last dims ([S, H] or [1, S, H]) for every batch */
            if (s->rank > x->rank || s->rank < 2)
                return kiln_infer_fail(c, KILN_ERR_SHAPE, "skip has rank %d, input rank %d", s->rank, x->rank);
            for (int k = 0; k < s->rank; k++) {
                kiln_dim d = s->dims[s->rank - 1 - k], want = x->dims[x->rank - 1 - k];
                if (k == 2) continue; /* [1, S, H] or [B, S, H]: checked when it runs */
                KILN_TRY(kiln_infer_require_equal(c, d, want, "skip dim and input dim"));
            }
        }
    }
    KILN_TRY(kiln_infer_same_as_input(c, 0, 0));
    KILN_TRY(kiln_infer_same_as_input(c, 3, 0));
    kiln_dtype u = KILN_DTYPE_FLOAT32;
    if (x->dtype == KILN_DTYPE_FLOAT64) u = x->dtype;
    if (x->rank < 0) {
        KILN_TRY(kiln_infer_set_out_unknown(c, 1, u));
        return kiln_infer_set_out_unknown(c, 2, u);
    }
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0; k < x->rank; k++) dims[k] = k == x->rank - 1 ? kiln_dim_const(1) : x->dims[k];
    KILN_TRY(kiln_infer_set_out(c, 1, u, x->rank, dims));
    return kiln_infer_set_out(c, 2, u, x->rank, dims);
}

kiln_status kiln_contrib_skip_check(const kiln_value *X, const kiln_value *S, const kiln_value *G, const kiln_value *beta,
                                    const kiln_value *bias, int64_t *h, char *msg, int size)
{
    if (X->rank != 2 && X->rank != 3) {
        snprintf(msg, (size_t)size, "input must be 2-D or 3-D, has rank %d", X->rank);
        return KILN_ERR_SHAPE;
    }
    *h = X->dims[X->rank - 1];
    if (!G || !vec_ok(G, *h) || !vec_ok(beta, *h) || !vec_ok(bias, *h)) {
        snprintf(msg, (size_t)size, "gamma, beta and bias must be 1-D of the hidden size %lld", (long long)*h);
        return KILN_ERR_SHAPE;
    }
    bool skip_ok = S && S->rank >= 2 && S->rank <= X->rank;
    for (int k = 0; skip_ok && k < S->rank; k++) {
        int64_t d = S->dims[S->rank - 1 - k], want = X->dims[X->rank - 1 - k];
        skip_ok = d == want || (k == 2 && d == 1);
    }
    if (!skip_ok) {
        snprintf(msg, (size_t)size, "skip (rank %d, %lld elements) is neither input's shape nor its [S, H]",
                 S ? S->rank : -1, S ? (long long)S->numel : 0LL);
        return KILN_ERR_SHAPE;
    }
    return KILN_OK;
}

static kiln_status skip_run(kiln_run_ctx *c, int beta_in, int bias_in, bool center)
{
    const kiln_value *X = kiln_run_in(c, 0), *S = kiln_run_in(c, 1), *G = kiln_run_in(c, 2);
    const kiln_value *beta = beta_in >= 0 ? kiln_run_in(c, beta_in) : NULL, *bias = kiln_run_in(c, bias_in);
    kiln_value *Y = kiln_run_out(c, 0), *Mean = kiln_run_out(c, 1), *Inv = kiln_run_out(c, 2),
               *Sum = kiln_run_out(c, 3);
    int64_t h;
    char msg[160];
    kiln_status st = kiln_contrib_skip_check(X, S, G, beta, bias, &h, msg, sizeof msg);
    if (st) return kiln_run_fail(c, st, "%s", msg);
    double eps = kiln_attr_float(kiln_run_node(c), "epsilon", EPS_DEFAULT);
    double *row = malloc((size_t)(h > 0 ? h : 1) * sizeof *row);
    if (!row) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    int64_t rows = h ? X->numel / h : 0;
    for (int64_t r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int64_t j = 0; j < h; j++) {
            int64_t i = r * h + j;
            double x = kiln_load_f64(X->dtype, X->data, i) + kiln_load_f64(S->dtype, S->data, i % S->numel);
            if (bias) x += kiln_load_f64(bias->dtype, bias->data, j);
            row[j] = kiln_round_to(X->dtype, x); /* the sum is a tensor of X's type */
            if (Sum) kiln_store_f64(Sum->dtype, Sum->data, i, row[j]);
            m += row[j];
        }
        m = center ? m / (double)h : 0;
        for (int64_t j = 0; j < h; j++) v += (row[j] - m) * (row[j] - m);
        double inv = 1.0 / sqrt(v / (double)h + eps);
        for (int64_t j = 0; j < h; j++) {
            double y = (row[j] - m) * inv * kiln_load_f64(G->dtype, G->data, j);
            if (beta) y += kiln_load_f64(beta->dtype, beta->data, j);
            kiln_store_f64(Y->dtype, Y->data, r * h + j, y);
        }
        if (Mean) kiln_store_f64(Mean->dtype, Mean->data, r, m);
        if (Inv) kiln_store_f64(Inv->dtype, Inv->data, r, inv);
    }
    free(row);
    return KILN_OK;
}

kiln_status kiln_contrib_skip_ln_infer(kiln_infer_ctx *c) { return skip_infer(c, 3, 4); }
kiln_status kiln_contrib_skip_ln_run(kiln_run_ctx *c) { return skip_run(c, 3, 4, true); }
kiln_status kiln_contrib_skip_sln_infer(kiln_infer_ctx *c) { return skip_infer(c, -1, 3); }
kiln_status kiln_contrib_skip_sln_run(kiln_run_ctx *c) { return skip_run(c, -1, 3, false); }

/* ---- EmbedLayerNormalization ----
 * inputs: input_ids [B, S], segment_ids? [B, S], word_embedding [V, H], position_embedding
 * [P, H], segment_embedding? [G, H], gamma [H], beta [H], mask? [B, S], position_ids? [B, S]
 * or [1, S]; outputs: output [B, S, H], mask_index? [B] int32, embedding_sum? [B, S, H]. */

enum {
    E_IDS = KILN_EMBED_IDS, E_SEG = KILN_EMBED_SEG, E_WORD = KILN_EMBED_WORD, E_POS = KILN_EMBED_POS,
    E_SEGEMB = KILN_EMBED_SEGEMB, E_GAMMA = KILN_EMBED_GAMMA, E_BETA = KILN_EMBED_BETA, E_MASK = KILN_EMBED_MASK,
    E_POSIDS = KILN_EMBED_POSIDS
};

kiln_status kiln_contrib_embed_ln_infer(kiln_infer_ctx *c)
{
    const kiln_type *ids = kiln_infer_in(c, E_IDS), *we = kiln_infer_in(c, E_WORD), *pe = kiln_infer_in(c, E_POS);
    if (!ids || !we || !pe || !kiln_infer_in(c, E_GAMMA) || !kiln_infer_in(c, E_BETA))
        return kiln_infer_fail(c, KILN_ERR_MODEL,
                               "needs input_ids, word_embedding, position_embedding, gamma and beta");
    if (ids->dtype && !kiln_dtype_is_int(ids->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input_ids is %s, expected int32", kiln_dtype_name(ids->dtype));
    if ((kiln_infer_in(c, E_SEG) == NULL) != (kiln_infer_in(c, E_SEGEMB) == NULL))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "segment_ids and segment_embedding come together");
    if (ids->rank >= 0 && ids->rank != 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "input_ids must be 2-D [batch, sequence], has rank %d", ids->rank);
    if (we->rank >= 0 && we->rank != 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "word_embedding must be 2-D, has rank %d", we->rank);
    kiln_dim b = ids->rank == 2 ? ids->dims[0] : kiln_infer_fresh(c, "batch"),
             s = ids->rank == 2 ? ids->dims[1] : kiln_infer_fresh(c, "sequence"),
             h = we->rank == 2 ? we->dims[1] : kiln_infer_fresh(c, "hidden");
    if (pe->rank >= 0 && pe->rank != 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "position_embedding must be 2-D, has rank %d", pe->rank);
    if (pe->rank == 2) KILN_TRY(kiln_infer_require_equal(c, pe->dims[1], h, "position_embedding and word_embedding hidden size"));
    const kiln_type *se = kiln_infer_in(c, E_SEGEMB);
    if (se && se->rank == 2) KILN_TRY(kiln_infer_require_equal(c, se->dims[1], h, "segment_embedding and word_embedding hidden size"));
    KILN_TRY(infer_vec(c, E_GAMMA, h, true, "gamma (hidden size)"));
    KILN_TRY(infer_vec(c, E_BETA, h, true, "beta (hidden size)"));
    kiln_dim dims[3] = {b, s, h};
    KILN_TRY(kiln_infer_set_out(c, 0, we->dtype, 3, dims));
    KILN_TRY(kiln_infer_set_out(c, 1, KILN_DTYPE_INT32, 1, dims));
    return kiln_infer_set_out(c, 2, we->dtype, 3, dims);
}

/* Whether v is [B, S] (or [1, S] when `one_batch`). */
static bool bs_shaped(const kiln_value *v, int64_t B, int64_t S, bool one_batch)
{
    return v->rank == 2 && v->dims[1] == S && (v->dims[0] == B || (one_batch && v->dims[0] == 1));
}

kiln_status kiln_contrib_embed_check(const kiln_value *const *in, char *msg, int size)
{
    const kiln_value *ids = in[E_IDS], *seg = in[E_SEG], *we = in[E_WORD], *pe = in[E_POS], *se = in[E_SEGEMB],
                     *g = in[E_GAMMA], *beta = in[E_BETA], *mask = in[E_MASK], *pos = in[E_POSIDS];
    if (!ids || !we || !pe || !g || !beta) {
        snprintf(msg, (size_t)size, "needs input_ids, word_embedding, position_embedding, gamma and beta");
        return KILN_ERR_MODEL;
    }
    if (ids->rank != 2 || we->rank != 2 || pe->rank != 2 || (se && se->rank != 2)) {
        snprintf(msg, (size_t)size, "input_ids and the embeddings must be 2-D");
        return KILN_ERR_SHAPE;
    }
    int64_t B = ids->dims[0], S = ids->dims[1], H = we->dims[1];
    if (pe->dims[1] != H || (se && se->dims[1] != H) || !vec_ok(g, H) || !vec_ok(beta, H)) {
        snprintf(msg, (size_t)size, "embeddings, gamma and beta must share the hidden size %lld", (long long)H);
        return KILN_ERR_SHAPE;
    }
    if ((seg && !bs_shaped(seg, B, S, false)) || (mask && !bs_shaped(mask, B, S, false)) ||
        (pos && !bs_shaped(pos, B, S, true))) {
        snprintf(msg, (size_t)size, "segment_ids, mask and position_ids must be [%lld, %lld] (position_ids also [1, %lld])",
                 (long long)B, (long long)S, (long long)S);
        return KILN_ERR_SHAPE;
    }
    if ((seg == NULL) != (se == NULL)) {
        snprintf(msg, (size_t)size, "segment_ids and segment_embedding come together");
        return KILN_ERR_MODEL;
    }
    return KILN_OK;
}

kiln_status kiln_contrib_embed_ln_run(kiln_run_ctx *c)
{
    const kiln_value *in[KILN_EMBED_N_IN];
    for (int i = 0; i < KILN_EMBED_N_IN; i++) in[i] = kiln_run_in(c, i);
    const kiln_value *ids = in[E_IDS], *seg = in[E_SEG], *we = in[E_WORD], *pe = in[E_POS], *se = in[E_SEGEMB],
                     *g = in[E_GAMMA], *beta = in[E_BETA], *mask = in[E_MASK], *pos = in[E_POSIDS];
    kiln_value *Y = kiln_run_out(c, 0), *MI = kiln_run_out(c, 1), *Sum = kiln_run_out(c, 2);
    char msg[192];
    kiln_status chk = kiln_contrib_embed_check(in, msg, sizeof msg);
    if (chk) return kiln_run_fail(c, chk, "%s", msg);
    int64_t B = ids->dims[0], S = ids->dims[1], H = we->dims[1];
    double eps = kiln_attr_float(kiln_run_node(c), "epsilon", EPS_DEFAULT);
    double *row = malloc((size_t)(H > 0 ? H : 1) * sizeof *row);
    if (!row) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    kiln_status st = KILN_OK;
    for (int64_t t = 0; t < B * S; t++) {
        int64_t w = kiln_load_i64(ids->dtype, ids->data, t);
        int64_t p = pos ? kiln_load_i64(pos->dtype, pos->data, pos->dims[0] == 1 ? t % S : t) : t % S;
        int64_t sg = seg ? kiln_load_i64(seg->dtype, seg->data, t) : 0;
        if (w < 0 || w >= we->dims[0] || p < 0 || p >= pe->dims[0] || (se && (sg < 0 || sg >= se->dims[0]))) {
            st = kiln_run_fail(c, KILN_ERR_SHAPE,
                               "token %lld: word id %lld (of %lld), position %lld (of %lld) or segment %lld out of range",
                               (long long)t, (long long)w, (long long)we->dims[0], (long long)p, (long long)pe->dims[0],
                               (long long)sg);
            goto out;
        }
        double m = 0, v = 0;
        for (int64_t j = 0; j < H; j++) {
            double x = kiln_load_f64(we->dtype, we->data, w * H + j) + kiln_load_f64(pe->dtype, pe->data, p * H + j);
            if (se) x += kiln_load_f64(se->dtype, se->data, sg * H + j);
            row[j] = kiln_round_to(we->dtype, x);
            if (Sum) kiln_store_f64(Sum->dtype, Sum->data, t * H + j, row[j]);
            m += row[j];
        }
        m /= (double)(H ? H : 1);
        for (int64_t j = 0; j < H; j++) v += (row[j] - m) * (row[j] - m);
        double inv = 1.0 / sqrt(v / (double)(H ? H : 1) + eps);
        for (int64_t j = 0; j < H; j++)
            kiln_store_f64(Y->dtype, Y->data, t * H + j,
                           (row[j] - m) * inv * kiln_load_f64(g->dtype, g->data, j) +
                               kiln_load_f64(beta->dtype, beta->data, j));
    }
    /* mask_index: per batch row, how many mask entries are 1 (0 without a mask) */
    for (int64_t bi = 0; MI && bi < B; bi++) {
        int64_t n = 0;
        for (int64_t j = 0; mask && j < S; j++) n += kiln_load_i64(mask->dtype, mask->data, bi * S + j) == 1;
        kiln_store_i64(MI->dtype, MI->data, bi, n);
    }
out:
    free(row);
    return st;
}
