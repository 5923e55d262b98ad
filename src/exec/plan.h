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
    unsigned char *device; /* [n] 1: lives in the device arena (io sessions), 0: the host's */
    int n_values;        /* of the graph */
    /* the shape program: the compile-time dims of every tensor value of known dtype and rank
     * (rank[v] >= 0; -1: decided at run time), dims[dim_at[v] ..] its expressions; and per
     * node whether its outputs can take these types instead of inference at run time
     * (node_static[k]: no subgraphs, every output present and of static type) */
    int n_nodes;
    int *rank;           /* [n_values] */
    int *dim_at;         /* [n_values] */
    kiln_dim *dims;
    unsigned char *node_static; /* [n_nodes] */
    int *out_at, *out_ids;      /* node k's output value ids: out_ids[out_at[k] .. out_at[k + 1]) */
    /* the graph's broadcast constraints (a, b pairs). Inference gives a broadcast of two
     * symbolic dims one of them as the result, exact unless the other is 1 at run time: a
     * binding where one is (or one is unknown) takes no compile-time shapes at all (a wrong
     * dim would also flow on through symbolic shape contents, which no type check sees) */
    int n_bcast;
    kiln_dim *bcast;            /* [2 * n_bcast] */
} kiln_memprog;

/* Nodes with more inputs or outputs than this always run with inference at run time. */
#define KILN_PLANNED_MAX_IO 16

/* One binding's placement. Immutable once built; shared by concurrent runs (refcounted). */
typedef struct kiln_plan {
    int64_t *key;        /* symbol values (-1 unbound), n_key entries */
    int n_key;
    size_t *offset;      /* [n_values] byte offset in its arena (memprog.device), SIZE_MAX when not planned */
    size_t *size;        /* [n_values] planned bytes */
    int *in_place;       /* [n_values] 1 when the value reuses its producer's input 0 buffer */
    /* the shape program evaluated for this binding: value v's dims at vdims + dim_at[v] when
     * vok[v]; node k's outputs take them (no inference at run time) when node_ok[k] */
    int64_t *vdims;
    const int *rank, *dim_at; /* the memory program's (it outlives its plans) */
    unsigned char *vok;     /* [n_values] */
    unsigned char *node_ok; /* [n_nodes] */
    size_t peak;         /* host arena bytes */
    size_t device_peak;  /* device arena bytes (io sessions; 0 otherwise) */
    size_t lower_bound;  /* max over time of the live planned bytes, summed over the arenas */
    /* per arena (host, device): the placement order and fit that gave its offsets, which the
     * next binding's plan tries first (kiln_plan_cache_get) */
    int *order[2];
    int n_order[2];
    bool best_fit[2];
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
