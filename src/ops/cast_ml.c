/* cast_ml.c - ai.onnx.ml operators: LabelEncoder, ArrayFeatureExtractor, Binarizer and
 * TreeEnsemble. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cast_internal.h"
#include "ops/util.h"

/* An attribute list or tensor seen as n elements of dtype dt (lists: INT64, FLOAT32 or
 * STRING as `const char *const *`). */
typedef struct elems {
    kiln_dtype dt;
    int64_t n;
    const void *data;
} elems;

static const char *str_at(const void *data, int64_t i)
{
    return ((const char *const *)data)[i];
}

/* The first present of the list attributes <prefix>_int64s / _floats / _strings or the tensor
 * attribute <prefix>_tensor; false if none. */
static bool elems_attr(const kiln_node *n, const char *prefix, elems *e)
{
    char name[64];
    const struct {
        const char *suffix;
        kiln_dtype dt;
        kiln_attr_type type;
    } kinds[] = {{"int64s", KILN_DTYPE_INT64, KILN_ATTR_INTS}, {"floats", KILN_DTYPE_FLOAT32, KILN_ATTR_FLOATS},
                 {"strings", KILN_DTYPE_STRING, KILN_ATTR_STRINGS}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        snprintf(name, sizeof name, "%s_%s", prefix, kinds[k].suffix);
        const kiln_attr *a = kiln_node_attr_typed(n, name, kinds[k].type);
        if (!a || !a->n) continue;
        e->dt = kinds[k].dt;
        e->n = a->n;
        e->data = kinds[k].dt == KILN_DTYPE_INT64 ? (const void *)a->ints
                  : kinds[k].dt == KILN_DTYPE_FLOAT32 ? (const void *)a->floats : (const void *)a->strings;
        return true;
    }
    snprintf(name, sizeof name, "%s_tensor", prefix);
    const kiln_value *t = kiln_attr_tensor(n, name);
    if (!t) return false;
    *e = (elems){t->dtype, t->numel, t->data};
    return true;
}

/* ---- LabelEncoder ---- */

typedef struct label_map {
    elems keys, values, def;
    int64_t def_i;
    float def_f;
    const char *def_s;
} label_map;

static kiln_status label_map_of(const kiln_node *n, label_map *m, const char **why)
{
    if (!elems_attr(n, "keys", &m->keys) || !elems_attr(n, "values", &m->values))
        return *why = "needs keys and values", KILN_ERR_MODEL;
    if (m->keys.n != m->values.n) return *why = "keys and values differ in length", KILN_ERR_MODEL;
    if (m->values.dt == KILN_DTYPE_COMPLEX64 || m->values.dt == KILN_DTYPE_COMPLEX128 ||
        !kiln_dtype_valid(m->values.dt))
        return *why = "unsupported values type", KILN_ERR_MODEL;
    m->def_i = kiln_attr_int(n, "default_int64", -1);
    m->def_f = kiln_attr_float(n, "default_float", -0.0f);
    m->def_s = kiln_attr_string(n, "default_string", "_Unused");
    const kiln_value *dt = kiln_attr_tensor(n, "default_tensor");
    if (dt && dt->numel >= 1 && dt->dtype == m->values.dt) m->def = (elems){dt->dtype, 1, dt->data};
    else if (m->values.dt == KILN_DTYPE_STRING) m->def = (elems){KILN_DTYPE_STRING, 1, &m->def_s};
    else if (m->values.dt == KILN_DTYPE_FLOAT32) m->def = (elems){KILN_DTYPE_FLOAT32, 1, &m->def_f};
    else if (m->values.dt == KILN_DTYPE_INT64) m->def = (elems){KILN_DTYPE_INT64, 1, &m->def_i};
    else m->def = (elems){m->values.dt, 0, NULL}; /* zero / empty string */
    return KILN_OK;
}

/* LabelEncoder-1: strings to their index in classes_strings (else default_int64), or int64
 * indices to those strings (else default_string). */
static kiln_status label_encoder1_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input X is missing");
    if (x->dtype && x->dtype != KILN_DTYPE_STRING && x->dtype != KILN_DTYPE_INT64)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "X must be string or int64, is %s", kiln_dtype_name(x->dtype));
    kiln_dtype dt = !x->dtype ? KILN_DTYPE_UNDEFINED
                    : x->dtype == KILN_DTYPE_STRING ? KILN_DTYPE_INT64 : KILN_DTYPE_STRING;
    return kiln_cast_infer_like(c, 0, 0, dt);
}

static kiln_status label_encoder1_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    const kiln_attr *cl = kiln_node_attr_typed(n, "classes_strings", KILN_ATTR_STRINGS);
    int n_classes = cl ? cl->n : 0;
    for (int64_t i = 0; i < X->numel; i++) {
        if (X->dtype == KILN_DTYPE_STRING) {
            int64_t v = kiln_attr_int(n, "default_int64", -1);
            for (int k = 0; k < n_classes; k++)
                if (!strcmp(cl->strings[k], str_at(X->data, i))) {
                    v = k;
                    break;
                }
            ((int64_t *)Y->data)[i] = v;
            continue;
        }
        int64_t k = ((const int64_t *)X->data)[i];
        const char *v = k >= 0 && k < n_classes ? cl->strings[k] : kiln_attr_string(n, "default_string", "_Unused");
        KILN_TRY(kiln_tensor_set_string(Y, i, v, strlen(v), kiln_run_err(c)));
    }
    return KILN_OK;
}

kiln_status kiln_cast_label_encoder_infer(kiln_infer_ctx *c)
{
    if (kiln_infer_opset(c) < 2) return label_encoder1_infer(c);
    label_map m;
    const char *why = NULL;
    kiln_status st = label_map_of(kiln_infer_node(c), &m, &why);
    if (st) return kiln_infer_fail(c, st, "%s", why);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (x && x->dtype && (x->dtype == KILN_DTYPE_STRING) != (m.keys.dt == KILN_DTYPE_STRING))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "X of type %s does not match keys of type %s",
                               kiln_dtype_name(x->dtype), kiln_dtype_name(m.keys.dt));
    return kiln_cast_infer_like(c, 0, 0, m.values.dt);
}

static bool key_equal(const kiln_value *X, int64_t i, const elems *k, int64_t j)
{
    if (X->dtype == KILN_DTYPE_STRING) return !strcmp(str_at(X->data, i), str_at(k->data, j));
    if (kiln_dtype_is_int(X->dtype) && kiln_dtype_is_int(k->dt))
        return kiln_load_i64(X->dtype, X->data, i) == kiln_load_i64(k->dt, k->data, j);
    return kiln_load_f64(X->dtype, X->data, i) == kiln_load_f64(k->dt, k->data, j);
}

kiln_status kiln_cast_label_encoder_run(kiln_run_ctx *c)
{
    if (kiln_run_opset(c) < 2) return label_encoder1_run(c);
    label_map m;
    const char *why = NULL;
    label_map_of(kiln_run_node(c), &m, &why);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    size_t es = kiln_dtype_size(Y->dtype);
    for (int64_t i = 0; i < X->numel; i++) {
        const elems *src = &m.def;
        int64_t at = 0;
        for (int64_t j = 0; j < m.keys.n; j++)
            if (key_equal(X, i, &m.keys, j)) {
                src = &m.values, at = j;
                break;
            }
        if (!src->n) continue; /* default of a type without a default attribute: zero */
        if (Y->dtype == KILN_DTYPE_STRING) {
            const char *s = str_at(src->data, at);
            KILN_TRY(kiln_tensor_set_string(Y, i, s, strlen(s), kiln_run_err(c)));
        } else {
            memcpy((char *)Y->data + (size_t)i * es, (const char *)src->data + (size_t)at * es, es);
        }
    }
    return KILN_OK;
}

/* ---- ArrayFeatureExtractor: Y[..., k] = X[..., indices[k]]; 1-D X gives [1, K] ---- */

kiln_status kiln_cast_array_feature_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0), *idx = kiln_infer_in(c, 1);
    if (!x || !idx) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs inputs X and Y");
    if (idx->dtype && idx->dtype != KILN_DTYPE_INT64)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "indices must be int64, are %s", kiln_dtype_name(idx->dtype));
    if (x->rank < 0 || idx->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    if (x->rank == 0) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must have rank >= 1");
    kiln_dim dims[KILN_MAX_RANK], k = kiln_dim_const(1);
    for (int d = 0; d < idx->rank; d++) k = kiln_dim_mul(kiln_infer_dims(c), k, idx->dims[d]);
    int rank = x->rank == 1 ? 2 : x->rank;
    dims[0] = kiln_dim_const(1);
    for (int d = 0; d + 1 < x->rank; d++) dims[d] = x->dims[d];
    dims[rank - 1] = k;
    return kiln_infer_set_out(c, 0, x->dtype, rank, dims);
}

kiln_status kiln_cast_array_feature_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0), *I = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t F = X->dims[X->rank - 1], K = I->numel, rows = F ? X->numel / F : 0;
    const int64_t *idx = I->data;
    for (int64_t k = 0; k < K; k++)
        if (idx[k] < 0 || idx[k] >= F)
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "index %lld out of range [0, %lld)", (long long)idx[k],
                                 (long long)F);
    size_t es = kiln_dtype_size(X->dtype);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < K; k++) {
            int64_t from = r * F + idx[k], to = r * K + k;
            if (X->dtype == KILN_DTYPE_STRING) {
                const char *s = str_at(X->data, from);
                KILN_TRY(kiln_tensor_set_string(Y, to, s, strlen(s), kiln_run_err(c)));
            } else {
                memcpy((char *)Y->data + (size_t)to * es, (const char *)X->data + (size_t)from * es, es);
            }
        }
    return KILN_OK;
}

/* ---- Binarizer ---- */

kiln_status kiln_cast_binarizer_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (x && x->dtype && !kiln_dtype_is_float(x->dtype) && !kiln_dtype_is_int(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "X must be numeric, is %s", kiln_dtype_name(x->dtype));
    return kiln_infer_same_as_input(c, 0, 0);
}

kiln_status kiln_cast_binarizer_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    double t = kiln_attr_float(kiln_run_node(c), "threshold", 0.0f);
    for (int64_t i = 0; i < X->numel; i++) kiln_store_f64(Y->dtype, Y->data, i, kiln_load_f64(X->dtype, X->data, i) > t);
    return KILN_OK;
}

/* ---- TreeEnsemble (ai.onnx.ml 5) ---- */

enum { T_LEQ, T_LT, T_GTE, T_GT, T_EQ, T_NEQ, T_MEMBER };
enum { AGG_AVERAGE, AGG_SUM, AGG_MIN, AGG_MAX };
enum { POST_NONE, POST_SOFTMAX, POST_LOGISTIC, POST_SOFTMAX_ZERO };

typedef struct forest {
    int n_nodes, n_leaves, n_roots;
    elems splits, modes, weights, members;
    const int64_t *feat, *tnode, *fnode, *tleaf, *fleaf, *targets, *roots, *missing_true;
    int64_t n_targets, agg, post;
    int64_t *member_start; /* per node: offset of its set in members (MEMBER nodes), else -1 */
} forest;

static kiln_status forest_of(const kiln_node *n, forest *f, const char **why)
{
    memset(f, 0, sizeof *f);
    int cnt[7], n_missing = 0;
    f->feat = kiln_attr_ints(n, "nodes_featureids", &cnt[0]);
    f->tnode = kiln_attr_ints(n, "nodes_truenodeids", &cnt[1]);
    f->fnode = kiln_attr_ints(n, "nodes_falsenodeids", &cnt[2]);
    f->tleaf = kiln_attr_ints(n, "nodes_trueleafs", &cnt[3]);
    f->fleaf = kiln_attr_ints(n, "nodes_falseleafs", &cnt[4]);
    f->targets = kiln_attr_ints(n, "leaf_targetids", &cnt[5]);
    f->roots = kiln_attr_ints(n, "tree_roots", &cnt[6]);
    f->missing_true = kiln_attr_ints(n, "nodes_missing_value_tracks_true", &n_missing);
    f->n_nodes = cnt[0], f->n_leaves = cnt[5], f->n_roots = cnt[6];
    f->n_targets = kiln_attr_int(n, "n_targets", 0);
    f->agg = kiln_attr_int(n, "aggregate_function", AGG_SUM);
    f->post = kiln_attr_int(n, "post_transform", POST_NONE);
    const kiln_value *sp = kiln_attr_tensor(n, "nodes_splits"), *md = kiln_attr_tensor(n, "nodes_modes"),
                     *lw = kiln_attr_tensor(n, "leaf_weights"), *mv = kiln_attr_tensor(n, "membership_values");
    if (!sp || !md || !lw) return *why = "needs nodes_splits, nodes_modes and leaf_weights", KILN_ERR_MODEL;
    f->splits = (elems){sp->dtype, sp->numel, sp->data};
    f->modes = (elems){md->dtype, md->numel, md->data};
    f->weights = (elems){lw->dtype, lw->numel, lw->data};
    if (mv) f->members = (elems){mv->dtype, mv->numel, mv->data};
    for (int k = 1; k < 5; k++)
        if (cnt[k] != f->n_nodes) return *why = "nodes_* attributes differ in length", KILN_ERR_MODEL;
    if (f->splits.n != f->n_nodes || f->modes.n != f->n_nodes || (n_missing && n_missing != f->n_nodes))
        return *why = "nodes_* attributes differ in length", KILN_ERR_MODEL;
    if (f->weights.n != f->n_leaves) return *why = "leaf_weights and leaf_targetids differ in length", KILN_ERR_MODEL;
    if (f->n_targets < 1) return *why = "n_targets must be positive", KILN_ERR_MODEL;
    if (f->agg < AGG_AVERAGE || f->agg > AGG_MAX) return *why = "unknown aggregate_function", KILN_ERR_MODEL;
    if (f->post < POST_NONE || f->post > POST_SOFTMAX_ZERO)
        return *why = "post_transform PROBIT is not supported", KILN_ERR_UNSUPPORTED;
    for (int i = 0; i < f->n_nodes; i++) {
        int64_t mode = kiln_load_i64(f->modes.dt, f->modes.data, i);
        if (mode < T_LEQ || mode > T_MEMBER) return *why = "unknown node mode", KILN_ERR_MODEL;
        if (f->tnode[i] < 0 || f->fnode[i] < 0 ||
            f->tnode[i] >= (f->tleaf[i] ? f->n_leaves : f->n_nodes) ||
            f->fnode[i] >= (f->fleaf[i] ? f->n_leaves : f->n_nodes))
            return *why = "node child index out of range", KILN_ERR_MODEL;
    }
    for (int r = 0; r < f->n_roots; r++)
        if (f->roots[r] < 0 || f->roots[r] >= f->n_nodes) return *why = "tree root out of range", KILN_ERR_MODEL;
    for (int i = 0; i < f->n_leaves; i++)
        if (f->targets[i] < 0 || f->targets[i] >= f->n_targets) return *why = "leaf target out of range", KILN_ERR_MODEL;
    return KILN_OK;
}

/* Offsets of each MEMBER node's NaN-terminated set in membership_values, in node order. */
static kiln_status forest_members(forest *f, const char **why)
{
    f->member_start = malloc(((size_t)f->n_nodes + 1) * sizeof *f->member_start);
    if (!f->member_start) return *why = "out of memory", KILN_ERR_NOMEM;
    int64_t at = 0;
    for (int i = 0; i < f->n_nodes; i++) {
        f->member_start[i] = -1;
        if (kiln_load_i64(f->modes.dt, f->modes.data, i) != T_MEMBER) continue;
        if (at >= f->members.n) return *why = "membership_values has too few sets", KILN_ERR_MODEL;
        f->member_start[i] = at;
        while (at < f->members.n && !isnan(kiln_load_f64(f->members.dt, f->members.data, at))) at++;
        at++;
    }
    return KILN_OK;
}

static bool node_true(const forest *f, int64_t i, double x)
{
    if (isnan(x) && f->missing_true && f->missing_true[i]) return true;
    double s = kiln_load_f64(f->splits.dt, f->splits.data, i);
    switch (kiln_load_i64(f->modes.dt, f->modes.data, i)) {
    case T_LEQ: return x <= s;
    case T_LT: return x < s;
    case T_GTE: return x >= s;
    case T_GT: return x > s;
    case T_EQ: return x == s;
    case T_NEQ: return x != s;
    default:
        for (int64_t k = f->member_start[i]; k < f->members.n; k++) {
            double m = kiln_load_f64(f->members.dt, f->members.data, k);
            if (isnan(m)) break;
            if (m == x) return true;
        }
        return false;
    }
}

kiln_status kiln_cast_tree_ensemble_infer(kiln_infer_ctx *c)
{
    forest f;
    const char *why = NULL;
    kiln_status st = forest_of(kiln_infer_node(c), &f, &why);
    if (st) return kiln_infer_fail(c, st, "%s", why);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input X is missing");
    if (x->dtype && x->dtype != KILN_DTYPE_FLOAT32 && x->dtype != KILN_DTYPE_FLOAT64 && x->dtype != KILN_DTYPE_FLOAT16)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "X must be a float tensor, is %s", kiln_dtype_name(x->dtype));
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, x->dtype);
    if (x->rank != 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must be [N, F], has rank %d", x->rank);
    kiln_dim dims[2] = {x->dims[0], kiln_dim_const(f.n_targets)};
    return kiln_infer_set_out(c, 0, x->dtype, 2, dims);
}

/* Leaf index reached from root r by row x (F features), or -1 on a bad feature id or a cycle. */
static int64_t tree_leaf(const forest *f, int64_t r, const kiln_value *X, int64_t row, int64_t F)
{
    int64_t i = r;
    /* a root whose both branches are the same leaf is that leaf, indexed like ONNX's reference */
    if (f->tleaf[i] && f->fleaf[i] && f->tnode[i] == f->fnode[i]) return i < f->n_leaves ? i : -1;
    for (int steps = 0; steps <= f->n_nodes; steps++) {
        if (f->feat[i] < 0 || f->feat[i] >= F) return -1;
        bool t = node_true(f, i, kiln_load_f64(X->dtype, X->data, row * F + f->feat[i]));
        int64_t next = t ? f->tnode[i] : f->fnode[i];
        if (t ? f->tleaf[i] : f->fleaf[i]) return next;
        i = next;
    }
    return -1;
}

static void post_transform(int64_t post, double *v, int64_t n)
{
    if (post == POST_LOGISTIC)
        for (int64_t k = 0; k < n; k++) v[k] = 1.0 / (1.0 + exp(-v[k]));
    if (post != POST_SOFTMAX && post != POST_SOFTMAX_ZERO) return;
    double mx = -INFINITY, sum = 0;
    for (int64_t k = 0; k < n; k++) mx = fmax(mx, v[k]);
    for (int64_t k = 0; k < n; k++) {
        bool zero = post == POST_SOFTMAX_ZERO && v[k] == 0;
        v[k] = zero ? 0 : exp(v[k] - mx);
        sum += v[k];
    }
    for (int64_t k = 0; k < n && sum > 0; k++) v[k] /= sum;
}

kiln_status kiln_cast_tree_ensemble_run(kiln_run_ctx *c)
{
    forest f;
    const char *why = NULL;
    kiln_status st = forest_of(kiln_run_node(c), &f, &why);
    if (!st) st = forest_members(&f, &why);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t N = X->dims[0], F = X->dims[1], T = f.n_targets;
    /* MIN / MAX start from the type's largest finite value, as ONNX's reference does */
    double big = X->dtype == KILN_DTYPE_FLOAT64 ? DBL_MAX : X->dtype == KILN_DTYPE_FLOAT16 ? 65504.0 : FLT_MAX;
    double *acc = st ? NULL : malloc((size_t)T * sizeof *acc);
    if (!st && !acc) st = KILN_ERR_NOMEM, why = "out of memory";
    for (int64_t row = 0; row < N && !st; row++) {
        double init = f.agg == AGG_MIN ? big : f.agg == AGG_MAX ? -big : 0;
        for (int64_t t = 0; t < T; t++) acc[t] = init;
        for (int64_t r = 0; r < f.n_roots; r++) {
            int64_t leaf = tree_leaf(&f, f.roots[r], X, row, F);
            if (leaf < 0) {
                st = KILN_ERR_RUNTIME, why = "tree walk hit a bad feature id or a cycle";
                break;
            }
            double w = kiln_load_f64(f.weights.dt, f.weights.data, leaf);
            double *a = &acc[f.targets[leaf]];
            if (f.agg == AGG_SUM) *a += w;
            else if (f.agg == AGG_AVERAGE) *a += w / (double)f.n_roots;
            else if (f.agg == AGG_MIN) *a = fmin(*a, w);
            else *a = fmax(*a, w);
        }
        post_transform(f.post, acc, T);
        for (int64_t t = 0; t < T; t++) kiln_store_f64(Y->dtype, Y->data, row * T + t, acc[t]);
    }
    free(acc);
    free(f.member_start);
    if (st) return kiln_run_fail(c, st, "%s", why);
    return KILN_OK;
}
