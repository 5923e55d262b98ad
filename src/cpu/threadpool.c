/* threadpool.c - persistent workers that sleep on a condition variable and run parallel loops. */
#define _GNU_SOURCE
#include "cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

enum {
    MAX_THREADS = 1024,
    CHUNKS_PER_THREAD = 4, /* dynamic chunks per thread, for load balance */
    SPIN_ROUNDS = 2000,    /* pauses before sleeping (tens of microseconds) */
};

struct kiln_threadpool {
    int n_threads; /* workers + the caller */
    int n_workers;
    pthread_t *workers; /* [n_workers] */

    pthread_mutex_t submit; /* held by the caller whose loop runs */
    pthread_mutex_t lock;   /* guards the sleeps on wake and done */
    pthread_cond_t wake;    /* a new generation (a loop, or stop) was posted */
    pthread_cond_t done;    /* the last worker left a closed loop */

    /* the current loop: written by its caller before state opens it (release) */
    kiln_parallel_fn fn;
    void *ctx;
    int64_t n, chunk, n_chunks;
    atomic_int_fast64_t next; /* next chunk to take */
    /* generation << GEN_SHIFT | OPEN while the loop accepts workers | workers inside it. A worker
     * joins with a compare-and-swap that fails once the caller has closed the loop, so the caller
     * never waits for a worker that was not scheduled in time, only for those inside. */
    atomic_uint_fast64_t state;
    atomic_bool stop;
};

#define STATE_OPEN ((uint_fast64_t)1 << 32)
#define STATE_COUNT ((uint_fast64_t)0xffffffff)
#define GEN_SHIFT 33

/* How deep this thread is inside loop bodies: a loop started from a body runs inline. */
static _Thread_local int tp_depth;

static int cores_available(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    return 1;
}

static void run_chunks(kiln_threadpool *p)
{
    tp_depth++;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (c >= p->n_chunks) break;
        int64_t begin = c * p->chunk;
        int64_t end = begin + p->chunk < p->n ? begin + p->chunk : p->n;
        p->fn(p->ctx, begin, end);
    }
    tp_depth--;
}

static void *worker_main(void *arg)
{
    kiln_threadpool *p = arg;
    uint_fast64_t seen = 0; /* generation last handled */
    for (;;) {
        uint_fast64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
        for (int i = 0; s >> GEN_SHIFT == seen && i < SPIN_ROUNDS; i++) {
            cpu_relax();
            s = atomic_load_explicit(&p->state, memory_order_acquire);
        }
        if (s >> GEN_SHIFT == seen) {
            pthread_mutex_lock(&p->lock);
            while ((s = atomic_load_explicit(&p->state, memory_order_acquire)) >> GEN_SHIFT == seen)
                pthread_cond_wait(&p->wake, &p->lock);
            pthread_mutex_unlock(&p->lock);
        }
        seen = s >> GEN_SHIFT;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        /* join the loop if it is still open and still this generation */
        bool joined = false;
        while ((s & STATE_OPEN) && s >> GEN_SHIFT == seen) {
            if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                      memory_order_acquire)) {
                joined = true;
                break;
            }
        }
        if (!joined) continue;
        run_chunks(p);
        s = atomic_fetch_sub_explicit(&p->state, 1, memory_order_acq_rel) - 1;
        if (!(s & STATE_OPEN) && (s & STATE_COUNT) == 0) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
    return NULL;
}

/* Publishes a new state (a new generation: a loop, or stop) and wakes the sleeping workers. */
static void post(kiln_threadpool *p, uint_fast64_t state)
{
    pthread_mutex_lock(&p->lock);
    atomic_store_explicit(&p->state, state, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
}

kiln_status kiln_threadpool_create(int n_threads, kiln_threadpool **out)
{
    if (!out || n_threads < 0) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (n_threads == 0) n_threads = cores_available();
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    kiln_threadpool *p = calloc(1, sizeof *p);
    if (!p) return KILN_ERR_NOMEM;
    p->n_threads = n_threads;
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) goto fail_pool;
    pthread_mutex_init(&p->submit, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    atomic_init(&p->state, 0);
    atomic_init(&p->stop, false);
    for (int i = 0; i < n_threads - 1; i++) {
        if (pthread_create(&p->workers[i], NULL, worker_main, p) != 0) {
            kiln_threadpool_free(p);
            return KILN_ERR_RUNTIME;
        }
        p->n_workers++;
    }
    *out = p;
    return KILN_OK;

fail_pool:
    free(p);
    return KILN_ERR_NOMEM;
}

void kiln_threadpool_free(kiln_threadpool *pool)
{
    if (!pool) return;
    if (pool->n_workers > 0) {
        atomic_store_explicit(&pool->stop, true, memory_order_release);
        uint_fast64_t gen = (atomic_load_explicit(&pool->state, memory_order_relaxed) >> GEN_SHIFT) + 1;
        post(pool, gen << GEN_SHIFT);
        for (int i = 0; i < pool->n_workers; i++) pthread_join(pool->workers[i], NULL);
    }
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->submit);
    free(pool->workers);
    free(pool);
}

int kiln_threadpool_size(const kiln_threadpool *pool)
{
    return pool ? pool->n_threads : 1;
}

void kiln_threadpool_parallel_for(kiln_threadpool *pool, int64_t n, kiln_parallel_fn fn, void *ctx)
{
    if (n <= 0) return;
    if (!pool || pool->n_workers == 0 || n == 1 || tp_depth > 0) {
        tp_depth++;
        fn(ctx, 0, n);
        tp_depth--;
        return;
    }
    kiln_threadpool *p = pool;
    pthread_mutex_lock(&p->submit);
    int64_t want = (int64_t)p->n_threads * CHUNKS_PER_THREAD;
    int64_t n_chunks = n < want ? n : want;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = (n + n_chunks - 1) / n_chunks;
    p->n_chunks = (n + p->chunk - 1) / p->chunk;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    uint_fast64_t gen = (atomic_load_explicit(&p->state, memory_order_relaxed) >> GEN_SHIFT) + 1;
    post(p, gen << GEN_SHIFT | STATE_OPEN);
    run_chunks(p);
    /* every chunk is taken: close the loop to latecomers, then wait for those inside */
    uint_fast64_t s = atomic_fetch_and_explicit(&p->state, ~STATE_OPEN, memory_order_acq_rel) & ~STATE_OPEN;
    for (int i = 0; i < SPIN_ROUNDS && (s & STATE_COUNT) != 0; i++) {
        cpu_relax();
        s = atomic_load_explicit(&p->state, memory_order_acquire);
    }
    if ((s & STATE_COUNT) != 0) {
        pthread_mutex_lock(&p->lock);
        while ((atomic_load_explicit(&p->state, memory_order_acquire) & STATE_COUNT) != 0)
            pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&p->submit);
}
