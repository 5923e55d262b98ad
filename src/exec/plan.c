/* plan.c - the memory planner: lifetimes from the execution order, offsets by greedy
 * placement in decreasing size order (each buffer at the lowest offset that overlaps no
 * placed buffer alive at the same time), and the LRU cache of plans per binding.
 * Planning is O(n^2) in the number of planned tensors in the worst case, cheap enough to run
 * on every call when every call is a new shape. */
#include "exec/plan.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "ops/op.h"

/* A tensor type a run can take from compile time: kind, dtype and rank known. */
static bool static_type(const kiln_type *t)
{
    return t->kind == KILN_VALUE_TENSOR && t->rank >= 0 && t->rank <= KILN_MAX_RANK && kiln_dtype_valid(t->dtype);
}

/* The shape program of g (see kiln_memprog). */
static kiln_status shapes_build(const kiln_graph *g, kiln_memprog *mp, kiln_err *err)
{
    int total = 0;
    mp->n_nodes = g->n_nodes;
    mp->rank = malloc(((size_t)g->n_values + 1) * sizeof *mp->rank);
    mp->dim_at = calloc((size_t)g->n_values + 1, sizeof *mp->dim_at);
    mp->node_static = calloc((size_t)g->n_nodes + 1, sizeof *mp->node_static);
    mp->out_at = calloc((size_t)g->n_nodes + 1, sizeof *mp->out_at);
    if (!mp->rank || !mp->dim_at || !mp->node_static || !mp->out_at) goto nomem;
    int n_outs = 0;
    for (int k = 0; k < g->n_nodes; k++) n_outs += g->nodes[k]->n_out;
    mp->out_ids = calloc((size_t)n_outs + 1, sizeof *mp->out_ids);
    if (!mp->out_ids) goto nomem;
    for (int i = 0; i < g->n_values; i++) {
        const kiln_type *t = &g->values[i]->type;
        mp->rank[i] = static_type(t) ? t->rank : -1;
        mp->dim_at[i] = total;
        if (mp->rank[i] > 0) total += t->rank;
    }
    mp->dims = calloc((size_t)total + 1, sizeof *mp->dims);
    if (!mp->dims) goto nomem;
    for (int i = 0; i < g->n_values; i++)
        for (int k = 0; k < mp->rank[i]; k++) mp->dims[mp->dim_at[i] + k] = g->values[i]->type.dims[k];
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        bool ok = n->op && n->op->run && n->n_in <= KILN_PLANNED_MAX_IO && n->n_out <= KILN_PLANNED_MAX_IO &&
                  !kiln_node_has_subgraphs(n);
        for (int i = 0; ok && i < n->n_out; i++)
            if (!n->out[i] || n->out[i]->graph != g || mp->rank[n->out[i]->id] < 0) ok = false;
        mp->node_static[k] = ok;
        mp->out_at[k + 1] = mp->out_at[k];
        for (int i = 0; ok && i < n->n_out; i++)
            if (n->out[i]) mp->out_ids[mp->out_at[k + 1]++] = n->out[i]->id;
    }
    const kiln_model *m = g->model;
    mp->bcast = calloc(2 * (size_t)m->n_constraints + 1, sizeof *mp->bcast);
    if (!mp->bcast) goto nomem;
    for (int i = 0; i < m->n_constraints; i++) {
        const kiln_constraint *c = &m->constraints[i];
        if (c->node->graph != g || !c->broadcast) continue;
        mp->bcast[2 * mp->n_bcast] = c->a;
        mp->bcast[2 * mp->n_bcast++ + 1] = c->b;
    }
    return KILN_OK;
nomem:
    kiln_memprog_release(mp);
    return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
}

kiln_status kiln_memprog_build(const kiln_graph *g, bool io, kiln_memprog *mp, kiln_err *err)
{
    memset(mp, 0, sizeof *mp);
    mp->n_values = g->n_values;
    int cap = g->n_values + 1;
    mp->value_id = calloc((size_t)cap, sizeof *mp->value_id);
    mp->first = calloc((size_t)cap, sizeof *mp->first);
    mp->last = calloc((size_t)cap, sizeof *mp->last);
    mp->numel = calloc((size_t)cap, sizeof *mp->numel);
    mp->elem_size = calloc((size_t)cap, sizeof *mp->elem_size);
    mp->share = calloc((size_t)cap, sizeof *mp->share);
    mp->device = calloc((size_t)cap, sizeof *mp->device);
    int *cand_of = malloc((size_t)cap * sizeof *cand_of);
    if (!mp->value_id || !mp->first || !mp->last || !mp->numel || !mp->elem_size || !mp->share || !mp->device ||
        !cand_of) {
        free(cand_of);
        kiln_memprog_release(mp);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    /* candidates in production order (values without a producer, then each node's outputs),
     * so that a buffer reused in place is a candidate before the values that reuse it, also
     * where passes and copy nodes made values after their readers' outputs */
    int *by_production = malloc((size_t)cap * sizeof *by_production);
    if (!by_production) {
        free(cand_of);
        kiln_memprog_release(mp);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    int n_order = 0;
    for (int i = 0; i < g->n_values; i++)
        if (!g->values[i]->producer) by_production[n_order++] = i;
    for (int k = 0; k < g->n_nodes; k++)
        for (int q = 0; q < g->nodes[k]->n_out; q++) {
            const kiln_ir_value *o = g->nodes[k]->out[q];
            if (o && o->graph == g && o->producer == g->nodes[k] && n_order < g->n_values) by_production[n_order++] = o->id;
        }
    kiln_dimtab *t = g->model->dims;
    for (int i = 0; i < g->n_values; i++) cand_of[i] = -1;
    for (int r = 0; r < n_order; r++) {
        int i = by_production[r];
        const kiln_ir_value *v = g->values[i];
        const kiln_type *ty = &v->type;
        bool input = io && v->is_input && !v->init;
        if ((!v->producer && !input) || (v->is_output && !io) || ty->kind != KILN_VALUE_TENSOR || ty->rank < 0 ||
            !kiln_dtype_valid(ty->dtype) || ty->dtype == KILN_DTYPE_STRING)
            continue;
        kiln_dim numel = kiln_dim_const(1);
        for (int k = 0; k < ty->rank; k++) numel = kiln_dim_mul(t, numel, ty->dims[k]);
        if (kiln_dim_is_unknown(numel)) continue;
        int j = mp->n++;
        cand_of[i] = j;
        mp->value_id[j] = i;
        mp->first[j] = v->producer ? v->producer->index : 0;
        mp->last[j] = v->last_use > mp->first[j] ? v->last_use : mp->first[j];
        if (v->is_output) mp->last[j] = g->n_nodes; /* live to the end of the run */
        mp->numel[j] = numel;
        mp->elem_size[j] = kiln_dtype_size(ty->dtype);
        /* the device arena holds what device nodes (copies to the device among them) make
         * and the graph inputs' device copies; the host arena the rest */
        mp->device[j] = io && (v->producer ? v->producer->on_device : true);
    }
    /* in place: an output reuses input 0's buffer when the op allows it, the sizes are the
     * same expression and this node is the input's last reader (and no one reused it yet) */
    bool *taken = calloc((size_t)cap, sizeof *taken);
    if (!taken) {
        free(cand_of);
        free(by_production);
        kiln_memprog_release(mp);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    for (int j = 0; j < mp->n; j++) {
        mp->share[j] = -1;
        const kiln_node *nd = g->values[mp->value_id[j]]->producer;
        const kiln_ir_value *in0 = nd && nd->n_in ? nd->in[0] : NULL;
        if (!nd || !nd->op || !(nd->op->flags & KILN_OP_INPLACE) || nd->out[0] != g->values[mp->value_id[j]] || !in0 ||
            in0->graph != g || cand_of[in0->id] < 0)
            continue;
        int i = cand_of[in0->id];
        if (taken[i] || mp->last[i] != nd->index || mp->elem_size[i] != mp->elem_size[j] || mp->device[i] != mp->device[j] ||
            !kiln_dim_equal(mp->numel[i], mp->numel[j]))
            continue;
        taken[i] = true;
        mp->share[j] = mp->share[i] >= 0 ? mp->share[i] : i;
    }
    free(taken);
    free(cand_of);
    free(by_production);
    return shapes_build(g, mp, err);
}

void kiln_memprog_release(kiln_memprog *mp)
{
    free(mp->value_id);
    free(mp->first);
    free(mp->last);
    free(mp->numel);
    free(mp->elem_size);
    free(mp->share);
    free(mp->device);
    free(mp->rank);
    free(mp->dim_at);
    free(mp->dims);
    free(mp->node_static);
    free(mp->out_at);
    free(mp->out_ids);
    free(mp->bcast);
    memset(mp, 0, sizeof *mp);
}

static void plan_free(kiln_plan *p)
{
    if (!p) return;
    free(p->key);
    free(p->offset);
    free(p->size);
    free(p->in_place);
    free(p->vdims);
    free(p->vok);
    free(p->node_ok);
    free(p->order[0]);
    free(p->order[1]);
    free(p);
}

/* Evaluates the shape program of mp for this binding into p. */
static kiln_status shapes_eval(const kiln_memprog *mp, const int64_t *syms, int n_syms, kiln_plan *p, kiln_err *err)
{
    int total = 0;
    for (int i = 0; i < mp->n_values; i++)
        if (mp->rank[i] > 0) total = mp->dim_at[i] + mp->rank[i];
    p->vdims = calloc((size_t)total + 1, sizeof *p->vdims);
    p->vok = calloc((size_t)mp->n_values + 1, sizeof *p->vok);
    p->node_ok = calloc((size_t)mp->n_nodes + 1, sizeof *p->node_ok);
    if (!p->vdims || !p->vok || !p->node_ok) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    p->rank = mp->rank;
    p->dim_at = mp->dim_at;
    for (int i = 0; i < mp->n_bcast; i++) {
        int64_t a, b;
        if (!kiln_dim_eval(mp->bcast[2 * i], syms, n_syms, &a) || !kiln_dim_eval(mp->bcast[2 * i + 1], syms, n_syms, &b) ||
            a != b)
            return KILN_OK; /* no compile-time shapes for this binding (see kiln_memprog.bcast) */
    }
    for (int i = 0; i < mp->n_values; i++) {
        bool ok = mp->rank[i] >= 0;
        for (int k = 0; ok && k < mp->rank[i]; k++) {
            int64_t *d = &p->vdims[mp->dim_at[i] + k];
            ok = kiln_dim_eval(mp->dims[mp->dim_at[i] + k], syms, n_syms, d) && *d >= 0;
        }
        p->vok[i] = ok;
    }
    for (int k = 0; k < mp->n_nodes; k++) {
        bool ok = mp->node_static[k];
        for (int q = mp->out_at[k]; ok && q < mp->out_at[k + 1]; q++) ok = p->vok[mp->out_ids[q]];
        p->node_ok[k] = ok;
    }
    return KILN_OK;
}

typedef struct placed {
    size_t off, size;
    int first, last;
} placed;

/* Sort keys of the placement orders tried: decreasing size; decreasing size x lifetime;
 * production order; reverse production order (the last to die first: a transformer's
 * residual stream, reused in place from layer to layer, leaves gaps that forward orders
 * fragment); decreasing size, the last to die first among equal sizes. */
#define PLACEMENT_KEYS 5
static bool placed_before(const placed *x, const placed *y, int key)
{
    if ((key == 0 || key == 4) && x->size != y->size) return x->size > y->size;
    if (key == 1) {
        double ax = (double)x->size * (x->last - x->first + 1), ay = (double)y->size * (y->last - y->first + 1);
        if (ax != ay) return ax > ay;
    }
    if ((key == 3 || key == 4) && x->last != y->last) return x->last > y->last;
    if (x->first != y->first) return x->first < y->first;
    return x->size > y->size;
}

static void sort_order(const placed *items, int n, int key, int *order)
{
    for (int k = 0; k < n; k++) order[k] = k;
    for (int k = 1; k < n; k++) /* insertion sort: stable and n is small */
        for (int j = k; j > 0 && placed_before(&items[order[j]], &items[order[j - 1]], key); j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
}

/* Places items in the given order, each at the lowest offset (first fit) or in the smallest
 * gap (best fit) among the buffers already placed whose lifetimes overlap it. Writes offsets
 * into off[] (by item) and returns the arena size. O(n^2 log n). */
static size_t place(const placed *items, int n, const int *order, bool best_fit, placed **live, size_t *off)
{
    placed *done = (placed *)(live + n); /* after the n pointers: the placed copies */
    size_t peak = 0;
    for (int k = 0; k < n; k++) {
        const placed *it = &items[order[k]];
        int m = 0;
        for (int q = 0; q < k; q++)
            if (done[q].first <= it->last && it->first <= done[q].last) live[m++] = &done[q];
        for (int q = 1; q < m; q++)
            for (int j = q; j > 0 && live[j]->off < live[j - 1]->off; j--) {
                placed *t = live[j];
                live[j] = live[j - 1];
                live[j - 1] = t;
            }
        size_t at = 0, chosen = SIZE_MAX, chosen_gap = SIZE_MAX;
        for (int q = 0; q <= m; q++) {
            size_t end = q < m ? live[q]->off : SIZE_MAX; /* the space above all is unbounded */
            if (end > at && end - at >= it->size) {
                if (!best_fit) {
                    chosen = at;
                    break;
                }
                if (end - at < chosen_gap || chosen == SIZE_MAX) {
                    chosen = at;
                    chosen_gap = end - at;
                }
            }
            if (q < m && live[q]->off + live[q]->size > at) at = live[q]->off + live[q]->size;
        }
        off[order[k]] = chosen;
        done[k] = (placed){chosen, it->size, it->first, it->last};
        if (chosen + it->size > peak) peak = chosen + it->size;
    }
    return peak;
}

/* The smallest arena found for items[0..n): the order and fit of `hint` (another binding's
 * plan of the same items, or NULL) first, kept when within 3% of the lower bound (a decode step's
 * plan differs from the last one by its sizes only, so one placement serves); else greedy
 * placement in each order and fit, then, unless that is within 3% of the lower bound already, a
 * short hill climb (swap two buffers in the best order or move one, keep what shrinks the arena;
 * the trial count shrinks with n^2 so planning stays cheap next to running). Offsets into best[]
 * (by item), the order and fit that gave them into best_order and *fit_out, the lower bound (the
 * most bytes alive at once) into *lb_out; off, order and best_order are scratch of n. */
static size_t place_best(const placed *items, int n, placed **live, size_t *off, size_t *best, int *order,
                         int *best_order, const int *hint, bool hint_fit, bool *fit_out, size_t *lb_out)
{
    size_t lb = 0;
    for (int k = 0; k < n; k++) {
        size_t live_bytes = 0;
        for (int q = 0; q < n; q++)
            if (items[q].first <= items[k].first && items[k].first <= items[q].last) live_bytes += items[q].size;
        if (live_bytes > lb) lb = live_bytes;
    }
    *lb_out = lb;
    *fit_out = false;
    if (!n) return 0;
    size_t peak = SIZE_MAX;
    bool best_fit = false;
    if (hint) {
        peak = place(items, n, hint, hint_fit, live, best);
        best_fit = hint_fit;
        memcpy(best_order, hint, (size_t)n * sizeof *order);
        if (peak <= lb + lb / 32) {
            *fit_out = best_fit;
            return peak;
        }
    }
    for (int strategy = 0; strategy < 2 * PLACEMENT_KEYS && peak > lb; strategy++) { /* at the bound: optimal */
        sort_order(items, n, strategy / 2, order);
        size_t got = place(items, n, order, strategy % 2, live, off);
        if (got < peak) {
            peak = got;
            best_fit = strategy % 2;
            memcpy(best, off, (size_t)n * sizeof *best);
            memcpy(best_order, order, (size_t)n * sizeof *order);
        }
    }
    int trials = n > 2 && peak > lb + lb / 32 ? (int)(1000000 / ((int64_t)n * n)) : 0;
    if (trials > 1000) trials = 1000;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int t = 0; t < trials && peak > lb; t++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int i = (int)(rng % (uint64_t)n), j = (int)((rng >> 32) % (uint64_t)n);
        if (i == j) continue;
        memcpy(order, best_order, (size_t)n * sizeof *order);
        if (t % 2) { /* swap two */
            int tmp = order[i];
            order[i] = order[j];
            order[j] = tmp;
        } else { /* move one to another place in the order */
            int tmp = order[i];
            if (i < j) memmove(order + i, order + i + 1, (size_t)(j - i) * sizeof *order);
            else memmove(order + j + 1, order + j, (size_t)(i - j) * sizeof *order);
            order[j] = tmp;
        }
        size_t got = place(items, n, order, best_fit, live, off);
        if (got < peak) {
            peak = got;
            memcpy(best, off, (size_t)n * sizeof *best);
            memcpy(best_order, order, (size_t)n * sizeof *order);
        }
    }
    *fit_out = best_fit;
    return peak;
}

/* The plan of mp for the binding syms, its placements tried first in hint's orders (hint may
 * be NULL). */
static kiln_status plan_build(const kiln_memprog *mp, const int64_t *syms, int n_syms, const kiln_plan *hint,
                              kiln_plan **out, kiln_err *err)
{
    kiln_plan *p = calloc(1, sizeof *p);
    placed *items = calloc((size_t)mp->n + 1, sizeof *items);
    int *idx = calloc((size_t)mp->n + 1, sizeof *idx);
    /* scratch for place(): n pointers, then n placed records */
    placed **live = calloc((size_t)mp->n + 1, sizeof *live + sizeof(placed));
    if (p) {
        p->key = malloc(((size_t)n_syms + 1) * sizeof *p->key);
        p->offset = malloc(((size_t)mp->n_values + 1) * sizeof *p->offset);
        p->size = calloc((size_t)mp->n_values + 1, sizeof *p->size);
        p->in_place = calloc((size_t)mp->n_values + 1, sizeof *p->in_place);
    }
    if (!p || !items || !idx || !live || !p->key || !p->offset || !p->size || !p->in_place) {
        plan_free(p);
        free(items);
        free(idx);
        free(live);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    if (n_syms) memcpy(p->key, syms, (size_t)n_syms * sizeof *syms);
    p->n_key = n_syms;
    for (int i = 0; i < mp->n_values; i++) p->offset[i] = SIZE_MAX;
    /* one item per buffer: a candidate and the ones that reuse it in place, whose lifetimes
     * chain, so the item lives from the first producer to the last reader */
    int n = 0;
    int *item_of = malloc(((size_t)mp->n + 1) * sizeof *item_of);
    if (!item_of) {
        plan_free(p);
        free(items);
        free(idx);
        free(live);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    for (int j = 0; j < mp->n; j++) {
        item_of[j] = -1;
        int64_t numel;
        if (!kiln_dim_eval(mp->numel[j], syms, n_syms, &numel) || numel < 0) continue;
        if ((uint64_t)numel > (SIZE_MAX / 2) / mp->elem_size[j]) continue;
        int root = mp->share[j];
        if (root >= 0 && item_of[root] >= 0) {
            placed *it = &items[item_of[root]];
            if (mp->last[j] > it->last) it->last = mp->last[j];
            item_of[j] = item_of[root];
            continue;
        }
        size_t bytes = (size_t)numel * mp->elem_size[j];
        bytes = (bytes + KILN_ARENA_ALIGN - 1) / KILN_ARENA_ALIGN * KILN_ARENA_ALIGN;
        items[n] = (placed){0, bytes, mp->first[j], mp->last[j]};
        idx[n] = j;
        item_of[j] = n++;
    }
    /* each arena on its own: the host's, then the device's */
    size_t *off = calloc((size_t)n + 1, sizeof *off), *best = calloc((size_t)n + 1, sizeof *best);
    int *order = calloc((size_t)n + 1, sizeof *order), *best_order = calloc((size_t)n + 1, sizeof *best_order);
    placed *side_items = calloc((size_t)n + 1, sizeof *side_items);
    int *side_of = calloc((size_t)n + 1, sizeof *side_of);
    if (!off || !best || !order || !best_order || !side_items || !side_of) {
        free(off);
        free(best);
        free(order);
        free(best_order);
        free(side_items);
        free(side_of);
        free(item_of);
        plan_free(p);
        free(items);
        free(idx);
        free(live);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    size_t lb_total = 0;
    for (int side = 0; side < 2; side++) {
        int m = 0;
        for (int k = 0; k < n; k++)
            if (mp->device[idx[k]] == side) {
                side_of[m] = k;
                side_items[m++] = items[k];
            }
        const int *h = hint && hint->order[side] && hint->n_order[side] == m ? hint->order[side] : NULL;
        bool fit;
        size_t lb, peak = place_best(side_items, m, live, off, best, order, best_order, h,
                                     h ? hint->best_fit[side] : false, &fit, &lb);
        for (int q = 0; q < m; q++) items[side_of[q]].off = best[q];
        p->best_fit[side] = fit;
        if (m && (p->order[side] = malloc((size_t)m * sizeof *best_order))) { /* without it: no hint, no error */
            memcpy(p->order[side], best_order, (size_t)m * sizeof *best_order);
            p->n_order[side] = m;
        }
        lb_total += lb;
        if (side) p->device_peak = peak;
        else p->peak = peak;
    }
    free(side_items);
    free(side_of);
    for (int k = 0; k < n; k++) {
        p->offset[mp->value_id[idx[k]]] = items[k].off;
        p->size[mp->value_id[idx[k]]] = items[k].size;
    }
    free(off);
    free(best);
    free(order);
    free(best_order);
    /* the in-place members take their root's slot */
    for (int j = 0; j < mp->n; j++) {
        int root = mp->share[j];
        if (root < 0 || item_of[j] < 0 || p->offset[mp->value_id[root]] == SIZE_MAX) continue;
        p->offset[mp->value_id[j]] = p->offset[mp->value_id[root]];
        p->size[mp->value_id[j]] = p->size[mp->value_id[root]];
        p->in_place[mp->value_id[j]] = 1;
    }
    free(item_of);
    p->lower_bound = lb_total;
    free(items);
    free(idx);
    free(live);
    kiln_status st = shapes_eval(mp, syms, n_syms, p, err);
    if (st) {
        plan_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

void kiln_plan_cache_init(kiln_plan_cache *pc, int capacity)
{
    memset(pc, 0, sizeof *pc);
    pthread_mutex_init(&pc->lock, NULL);
    pc->capacity = capacity > 0 ? capacity : 1;
}

void kiln_plan_cache_release(kiln_plan_cache *pc)
{
    kiln_plan *p = pc->head;
    while (p) {
        kiln_plan *n = p->next;
        plan_free(p);
        p = n;
    }
    pthread_mutex_destroy(&pc->lock);
}

static void unlink_plan(kiln_plan_cache *pc, kiln_plan *p)
{
    if (p->prev) p->prev->next = p->next;
    else pc->head = p->next;
    if (p->next) p->next->prev = p->prev;
    else pc->tail = p->prev;
    p->prev = p->next = NULL;
}

static void push_front(kiln_plan_cache *pc, kiln_plan *p)
{
    p->prev = NULL;
    p->next = pc->head;
    if (pc->head) pc->head->prev = p;
    pc->head = p;
    if (!pc->tail) pc->tail = p;
}

kiln_status kiln_plan_cache_get(kiln_plan_cache *pc, const kiln_memprog *mp, const int64_t *syms, int n,
                                kiln_plan **out, kiln_err *err)
{
    pthread_mutex_lock(&pc->lock);
    for (kiln_plan *p = pc->head; p; p = p->next)
        if (p->n_key == n && (!n || !memcmp(p->key, syms, (size_t)n * sizeof *syms))) {
            unlink_plan(pc, p);
            push_front(pc, p);
            p->refs++;
            pc->hits++;
            pthread_mutex_unlock(&pc->lock);
            *out = p;
            return KILN_OK;
        }
    pc->misses++;
    kiln_plan *hint = pc->head; /* the binding used last: most likely the one this one follows */
    if (hint) hint->refs++;
    pthread_mutex_unlock(&pc->lock);
    kiln_plan *p = NULL;
    kiln_status st = plan_build(mp, syms, n, hint, &p, err);
    kiln_plan_cache_put(pc, hint);
    if (st) return st;
    pthread_mutex_lock(&pc->lock);
    p->refs = 2; /* the cache's and the caller's */
    push_front(pc, p);
    pc->count++;
    while (pc->count > pc->capacity) {
        kiln_plan *old = pc->tail;
        unlink_plan(pc, old);
        pc->count--;
        if (--old->refs == 0) plan_free(old);
    }
    pthread_mutex_unlock(&pc->lock);
    *out = p;
    return KILN_OK;
}

void kiln_plan_cache_put(kiln_plan_cache *pc, kiln_plan *p)
{
    if (!p) return;
    pthread_mutex_lock(&pc->lock);
    bool gone = --p->refs == 0;
    pthread_mutex_unlock(&pc->lock);
    if (gone) plan_free(p);
}
