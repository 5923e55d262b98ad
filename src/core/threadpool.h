/* threadpool.h - a persistent pool of worker threads running parallel loops (no global state). */
#ifndef KILN_CPU_THREADPOOL_H
#define KILN_CPU_THREADPOOL_H

#include <stdint.h>

#include "kiln.h"

typedef struct kiln_threadpool kiln_threadpool;

/* Body of a parallel loop: handles the indices [begin, end). */
typedef void (*kiln_parallel_fn)(void *ctx, int64_t begin, int64_t end);

/* Creates a pool that runs loops on n_threads threads: the calling thread plus n_threads - 1
 * workers. n_threads 0 means the cores this process may run on (sched_getaffinity). Workers
 * sleep on a condition variable while idle (after spinning for up to a millisecond). *out is
 * owned by the caller (kiln_threadpool_free). Errors: KILN_ERR_INVALID_ARG (n_threads < 0, out NULL),
 * KILN_ERR_NOMEM or KILN_ERR_RUNTIME (a thread could not be started). */
kiln_status kiln_threadpool_create(int n_threads, kiln_threadpool **out);

/* Stops and joins the workers. No loop may be running on the pool. NULL is a no-op. */
void kiln_threadpool_free(kiln_threadpool *pool);

/* Threads a loop on this pool may use (1 for a NULL pool). */
int kiln_threadpool_size(const kiln_threadpool *pool);

/* Runs fn over [0, n) split into contiguous pieces, each index exactly once, on the workers and
 * the calling thread; returns when every piece is done. Each thread first takes the pieces of
 * its own contiguous share of [0, n) (nearly n / threads indices), in order, then helps the
 * others with theirs. fn must not fail (it returns nothing).
 * pool may be NULL (runs inline). Any number of threads may call this on one pool at once:
 * their loops are serialised. The caller takes pieces too and never waits for a worker that has
 * not started (a descheduled worker simply misses the loop), only for those inside it. A call
 * made from inside a loop body (any pool's) runs inline on the calling thread, so nested loops
 * neither deadlock nor oversubscribe. Cost per call: about 1.5 us back to back, ~15 us when the
 * workers have gone to sleep; n <= 1 runs inline without waking anyone. */
void kiln_threadpool_parallel_for(kiln_threadpool *pool, int64_t n, kiln_parallel_fn fn, void *ctx);

/* Cost of index i of a loop (any unit). */
typedef double (*kiln_cost_fn)(void *ctx, int64_t i);

/* How evenly this pool would share a loop of n indices of the given costs, were every thread to
 * start at once and run at one speed: the total cost over (threads x the busiest thread's).
 * 1 is even; a loop of 3 equal indices on 2 threads is 0.75. 1 for a NULL pool, one thread, or
 * over 64 threads (not simulated). */
double kiln_threadpool_balance(const kiln_threadpool *pool, int64_t n, kiln_cost_fn cost, void *ctx);

#endif
