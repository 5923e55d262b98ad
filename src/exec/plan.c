/* plan.c - the memory planner: lifetimes from the execution order, offsets by greedy
 * placement in decreasing size order (each buffer at the lowest offset that overlaps no
 * placed buffer alive at the same time), and the LRU cache of plans per binding.
 * Planning is O(n^2) in the number of planned tensors in the worst case, cheap enough to run
 * on every call when every call is a new shape. */
#include "exec/plan.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"

kiln_status kiln_memprog_build(const kiln_graph *g, kiln_memprog *mp, kiln_err *err)
{
    memset(mp, 0, sizeof *mp);
    mp->n_values = g->n_values;
    int cap = g->n_values + 1;
    mp->value_id = calloc((size_t)cap, sizeof *mp->value_id);
    mp->first = calloc((size_t)cap, sizeof *mp->first);
    mp->last = calloc((size_t)cap, sizeof *mp->last);
    mp->numel = calloc((size_t)cap, sizeof *mp->numel);
    mp->elem_size = calloc((size_t)cap, sizeof *mp->elem_size);
    if (!mp->value_id || !mp->first || !mp->last || !mp->numel || !mp->elem_size) {
        kiln_memprog_release(mp);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    kiln_dimtab *t = g->model->dims;
    for (int i = 0; i < g->n_values; i++) {
        const kiln_ir_value *v = g->values[i];
        const kiln_type *ty = &v->type;
        if (!v->producer || v->is_output || ty->kind != KILN_VALUE_TENSOR || ty->rank < 0 ||
            !kiln_dtype_valid(ty->dtype) || ty->dtype == KILN_DTYPE_STRING)
            continue;
        kiln_dim numel = kiln_dim_const(1);
        for (int k = 0; k < ty->rank; k++) numel = kiln_dim_mul(t, numel, ty->dims[k]);
        if (kiln_dim_is_unknown(numel)) continue;
        int j = mp->n++;
        mp->value_id[j] = i;
        mp->first[j] = v->producer->index;
        mp->last[j] = v->last_use > v->producer->index ? v->last_use : v->producer->index;
        mp->numel[j] = numel;
        mp->elem_size[j] = kiln_dtype_size(ty->dtype);
    }
    return KILN_OK;
}

void kiln_memprog_release(kiln_memprog *mp)
{
    free(mp->value_id);
    free(mp->first);
    free(mp->last);
    free(mp->numel);
    free(mp->elem_size);
    memset(mp, 0, sizeof *mp);
}

static void plan_free(kiln_plan *p)
{
    if (!p) return;
    free(p->key);
    free(p->offset);
    free(p->size);
    free(p);
}

typedef struct placed {
    size_t off, size;
    int first, last;
} placed;

static int by_size_desc(const void *a, const void *b)
{
    const placed *x = a, *y = b;
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    return x->first - y->first;
}

static int by_offset(const void *a, const void *b)
{
    const placed *x = *(const placed *const *)a, *y = *(const placed *const *)b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static kiln_status plan_build(const kiln_memprog *mp, const int64_t *syms, int n_syms, kiln_plan **out, kiln_err *err)
{
    kiln_plan *p = calloc(1, sizeof *p);
    placed *items = calloc((size_t)mp->n + 1, sizeof *items);
    int *idx = calloc((size_t)mp->n + 1, sizeof *idx);
    placed **live = calloc((size_t)mp->n + 1, sizeof *live);
    if (p) {
        p->key = malloc(((size_t)n_syms + 1) * sizeof *p->key);
        p->offset = malloc(((size_t)mp->n_values + 1) * sizeof *p->offset);
        p->size = calloc((size_t)mp->n_values + 1, sizeof *p->size);
    }
    if (!p || !items || !idx || !live || !p->key || !p->offset || !p->size) {
        plan_free(p);
        free(items);
        free(idx);
        free(live);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    if (n_syms) memcpy(p->key, syms, (size_t)n_syms * sizeof *syms);
    p->n_key = n_syms;
    for (int i = 0; i < mp->n_values; i++) p->offset[i] = SIZE_MAX;
    int n = 0;
    for (int j = 0; j < mp->n; j++) {
        int64_t numel;
        if (!kiln_dim_eval(mp->numel[j], syms, n_syms, &numel) || numel < 0) continue;
        if ((uint64_t)numel > (SIZE_MAX / 2) / mp->elem_size[j]) continue;
        size_t bytes = (size_t)numel * mp->elem_size[j];
        bytes = (bytes + KILN_ARENA_ALIGN - 1) / KILN_ARENA_ALIGN * KILN_ARENA_ALIGN;
        items[n] = (placed){0, bytes, mp->first[j], mp->last[j]};
        idx[n++] = j;
    }
    /* lower bound: the most bytes alive at once */
    size_t lb = 0;
    for (int k = 0; k < n; k++) {
        size_t live_bytes = 0;
        for (int q = 0; q < n; q++)
            if (items[q].first <= items[k].first && items[k].first <= items[q].last) live_bytes += items[q].size;
        if (live_bytes > lb) lb = live_bytes;
    }
    /* remember which candidate each item came from across the sort */
    for (int k = 0; k < n; k++) items[k].off = (size_t)idx[k];
    qsort(items, (size_t)n, sizeof *items, by_size_desc);
    size_t peak = 0;
    placed *done = calloc((size_t)n + 1, sizeof *done);
    if (!done) {
        plan_free(p);
        free(items);
        free(idx);
        free(live);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < n; k++) {
        /* buffers already placed whose lifetimes overlap this one, by offset */
        int m = 0;
        for (int q = 0; q < k; q++)
            if (done[q].first <= items[k].last && items[k].first <= done[q].last) live[m++] = &done[q];
        qsort(live, (size_t)m, sizeof *live, by_offset);
        size_t off = 0;
        for (int q = 0; q < m; q++) {
            if (live[q]->off >= off + items[k].size) break; /* fits in the gap before it */
            if (live[q]->off + live[q]->size > off) off = live[q]->off + live[q]->size;
        }
        int cand = (int)items[k].off;
        done[k] = (placed){off, items[k].size, items[k].first, items[k].last};
        p->offset[mp->value_id[cand]] = off;
        p->size[mp->value_id[cand]] = items[k].size;
        if (off + items[k].size > peak) peak = off + items[k].size;
    }
    p->peak = peak;
    p->lower_bound = lb;
    free(done);
    free(items);
    free(idx);
    free(live);
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
    pthread_mutex_unlock(&pc->lock);
    kiln_plan *p = NULL;
    KILN_TRY(plan_build(mp, syms, n, &p, err));
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
