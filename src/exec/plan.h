/* plan.h - memory planning: which intermediate tensors of the main graph live in the run's
 * arena, their byte sizes as symbolic expressions (fixed at compile time), and per binding of
 * the symbols an offset for each, placed greedily by size within their lifetimes. Plans are
 * cached per binding in a bounded LRU cache. */
#ifndef KILN_EXEC_PLAN_H
#define KILN_EXEC_PLAN_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "ir/graph.h"

#define KILN_ARENA_ALIGN 64

/* Compile-time description of the plannable tensors of a graph. */
typedef struct kiln_memprog {
    int n;               /* candidates */
    int *value_id;       /* [n] value ids in the graph */
    int *first, *last;   /* [n] producing node index, last reading node index */
    kiln_dim *numel;     /* [n] element count expression */
    size_t *elem_size;   /* [n] bytes per element */
    int *share;          /* [n] candidate whose buffer this one reuses in place, or -1 */
    int n_values;        /* of the graph */
} kiln_memprog;

/* One binding's placement. Immutable once built; shared by concurrent runs (refcounted). */
typedef struct kiln_plan {
    int64_t *key;        /* symbol values (-1 unbound), n_key entries */
    int n_key;
    size_t *offset;      /* [n_values] byte offset in the arena, SIZE_MAX when not planned */
    size_t *size;        /* [n_values] planned bytes */
    int *in_place;       /* [n_values] 1 when the value reuses its producer's input 0 buffer */
    size_t peak;         /* arena bytes */
    size_t lower_bound;  /* max over time of the live planned bytes */
    int refs;
    struct kiln_plan *prev, *next;
} kiln_plan;

typedef struct kiln_plan_cache {
    pthread_mutex_t lock;
    kiln_plan *head, *tail; /* most recently used first */
    int count, capacity;
    int64_t hits, misses;
} kiln_plan_cache;

/* Builds the memory program of g (tensors produced by g's nodes, not graph outputs, with a
 * known dtype other than string and dims that are expressions). With io (GPU sessions, whose
 * device arena also holds the device copies of graph inputs and the graph outputs before
 * they are copied back), graph inputs and outputs are planned too. */
kiln_status kiln_memprog_build(const kiln_graph *g, bool io, kiln_memprog *mp, kiln_err *err);
void kiln_memprog_release(kiln_memprog *mp);

void kiln_plan_cache_init(kiln_plan_cache *pc, int capacity);
void kiln_plan_cache_release(kiln_plan_cache *pc);
/* The plan for binding `syms` (n entries): from the cache, or planned now and inserted
 * (evicting the least recently used beyond capacity). The caller holds a reference until
 * kiln_plan_cache_put. Tensors whose sizes cannot be evaluated from the binding (sizes
 * decided by data) are left out of the plan. */
kiln_status kiln_plan_cache_get(kiln_plan_cache *pc, const kiln_memprog *mp, const int64_t *syms, int n,
                                kiln_plan **out, kiln_err *err);
void kiln_plan_cache_put(kiln_plan_cache *pc, kiln_plan *p);

#endif
