/* threadpool.c - persistent workers that sleep on a condition variable and run parallel loops.
 *
 * A loop's indices are cut into one contiguous share per thread. Each thread works through its
 * own share from the front, a piece at a time, then takes pieces from the others' shares: the
 * split is static while the threads keep pace (a thread's consecutive indices, and the data they
 * touch, stay on its core: a convolution's weights of a group of output channels stay in one L2)
 * and dynamic where one falls behind or a worker joins late. */
#define _GNU_SOURCE
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

enum {
    MAX_THREADS = 1024,
    PIECES_PER_SHARE = 16, /* a share is taken this many indices at a time, for load balance */
};
/* A thread waiting for a loop to start (a worker) or to end (its caller) spins before it sleeps
 * on a condition variable, looking at the clock every PAUSES_PER_LOOK pauses, for up to the
 * pool's current spin budget, which adapts between SPIN_MIN_NS and SPIN_MAX_NS: halved after a
 * spin that ended in sleep, doubled after one that saw the change. Where the cores are the
 * pool's alone, waits are short and the budget stays long: waking a sleeping thread costs tens of
 * microseconds on a virtual machine, more than the serial stretches between a model's loops
 * (1 ms against 27 us of spinning, 2 threads: the conv/upsample net at 256x256 0.81, the
 * TTS-like encoder at 512 tokens 0.89). On a shared machine (more runnable threads than cores)
 * the thread waited for was preempted, the spin fails and a long one spends the CPU time that
 * thread needs: 1 ms against 5 us, 2 threads on 2 vCPUs at load 4-5, kiln bench-llm decode: 1.8x
 * slower on a 4-layer 512-wide int4 model, 4x on a 64-wide toy. */
enum { SPIN_MIN_NS = 5 * 1000, SPIN_MAX_NS = 1000 * 1000, PAUSES_PER_LOOK = 64 };

/* One thread's share of a loop: the indices [next, end), taken from the front. */
typedef struct share {
    _Alignas(64) atomic_int_fast64_t next;
    int64_t end;
} share;

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
    int64_t piece;  /* indices taken at a time */
    share *shares;  /* [n_threads]: slot 0 the caller's, slot k the k-th worker to join */
    /* generation << GEN_SHIFT | OPEN while the loop accepts workers | workers inside it. A worker
     * joins with a compare-and-swap that fails once the caller has closed the loop, so the caller
     * never waits for a worker that was not scheduled in time, only for those inside. */
    atomic_uint_fast64_t state;
    atomic_bool stop;
    atomic_int_fast64_t spin_ns; /* the spin budget (SPIN_MIN_NS to SPIN_MAX_NS; see above) */
};

#define STATE_OPEN ((uint_fast64_t)1 << 32)
#define STATE_COUNT ((uint_fast64_t)0xffffffff)
#define GEN_SHIFT 33

/* How deep this thread is inside loop bodies: a loop started from a body runs inline. */
static _Thread_local int tp_depth;

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Spins while the state masked by mask is (equal) or is not (!equal) value, for at most the
 * pool's spin budget, which it then adapts; returns the state last read. */
static uint_fast64_t spin(kiln_threadpool *p, uint_fast64_t mask, uint_fast64_t value, bool equal)
{
    uint_fast64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    int64_t budget = atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
    for (int64_t deadline = 0; ((s & mask) == value) == equal;) {
        for (int i = 0; i < PAUSES_PER_LOOK && ((s & mask) == value) == equal; i++) {
            cpu_relax();
            s = atomic_load_explicit(&p->state, memory_order_acquire);
        }
        if (((s & mask) == value) != equal) break;
        int64_t t = now_ns();
        if (!deadline) {
            deadline = t + budget;
        } else if (t >= deadline) {
            atomic_store_explicit(&p->spin_ns, budget / 2 > SPIN_MIN_NS ? budget / 2 : SPIN_MIN_NS,
                                  memory_order_relaxed);
            return s;
        }
    }
    if (budget < SPIN_MAX_NS)
        atomic_store_explicit(&p->spin_ns, budget * 2 < SPIN_MAX_NS ? budget * 2 : SPIN_MAX_NS, memory_order_relaxed);
    return s;
}

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

/* Runs slot me's share, then helps the others with theirs (a worker that joined late or not at
 * all, or a slower thread), a piece at a time. */
static void run_shares(kiln_threadpool *p, int me)
{
    tp_depth++;
    for (int k = 0; k < p->n_threads; k++) {
        share *sh = &p->shares[(me + k) % p->n_threads];
        for (;;) {
            int64_t begin = atomic_fetch_add_explicit(&sh->next, p->piece, memory_order_relaxed);
            if (begin >= sh->end) break;
            p->fn(p->ctx, begin, begin + p->piece < sh->end ? begin + p->piece : sh->end);
        }
    }
    tp_depth--;
}

static void *worker_main(void *arg)
{
    kiln_threadpool *p = arg;
    uint_fast64_t seen = 0; /* generation last handled */
    for (;;) {
        uint_fast64_t s = spin(p, ~(uint_fast64_t)0 << GEN_SHIFT, seen << GEN_SHIFT, true);
        if (s >> GEN_SHIFT == seen) {
            pthread_mutex_lock(&p->lock);
            while ((s = atomic_load_explicit(&p->state, memory_order_acquire)) >> GEN_SHIFT == seen)
                pthread_cond_wait(&p->wake, &p->lock);
            pthread_mutex_unlock(&p->lock);
        }
        seen = s >> GEN_SHIFT;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        /* join the loop if it is still open and still this generation */
        int me = 0; /* the slot of this thread's share: the workers inside before it, plus one */
        while ((s & STATE_OPEN) && s >> GEN_SHIFT == seen) {
            if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                      memory_order_acquire)) {
                me = (int)(s & STATE_COUNT) + 1;
                break;
            }
        }
        if (!me) continue;
        run_shares(p, me);
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
    p->shares = aligned_alloc(64, (size_t)n_threads * sizeof *p->shares);
    if (!p->workers || !p->shares) goto fail_pool;
    pthread_mutex_init(&p->submit, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < n_threads; i++) atomic_init(&p->shares[i].next, 0), p->shares[i].end = 0;
    atomic_init(&p->state, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->spin_ns, SPIN_MAX_NS);
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
    free(p->workers);
    free(p->shares);
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
    free(pool->shares);
    free(pool);
}

int kiln_threadpool_size(const kiln_threadpool *pool)
{
    return pool ? pool->n_threads : 1;
}

/* Share i of a loop of n indices over T threads: [*begin, *end), contiguous, nearly equal. */
static void share_of(int64_t n, int T, int i, int64_t *begin, int64_t *end)
{
    *begin = n / T * i + (i < n % T ? i : n % T);
    *end = *begin + n / T + (i < n % T);
}

/* Indices a thread takes at a time from a share of a loop of n indices over T threads. */
static int64_t piece_of(int64_t n, int T)
{
    int64_t per = (n + T - 1) / T;
    return (per + PIECES_PER_SHARE - 1) / PIECES_PER_SHARE;
}

double kiln_threadpool_balance(const kiln_threadpool *pool, int64_t n, kiln_cost_fn cost, void *ctx)
{
    enum { MAX_SIMULATED = 64 };
    int T = pool ? pool->n_threads : 1;
    if (T <= 1 || n <= 1 || T > MAX_SIMULATED) return 1.0;
    int64_t next[MAX_SIMULATED], end[MAX_SIMULATED], piece = piece_of(n, T);
    double busy[MAX_SIMULATED] = {0}, total = 0.0, last = 0.0;
    int stage[MAX_SIMULATED] = {0}; /* the share a thread takes from: (k + stage) % T */
    for (int i = 0; i < T; i++) share_of(n, T, i, &next[i], &end[i]);
    for (;;) { /* the thread that is free first takes its next piece, as run_shares does */
        int k = -1;
        for (int i = 0; i < T; i++)
            if (stage[i] < T && (k < 0 || busy[i] < busy[k])) k = i;
        if (k < 0) break;
        int sh = (k + stage[k]) % T;
        if (next[sh] >= end[sh]) {
            stage[k]++;
            continue;
        }
        for (int64_t e = next[sh] + piece < end[sh] ? next[sh] + piece : end[sh]; next[sh] < e; next[sh]++) {
            double c = cost(ctx, next[sh]);
            busy[k] += c, total += c;
        }
        if (busy[k] > last) last = busy[k];
    }
    return last > 0.0 ? total / (T * last) : 1.0;
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
    p->fn = fn;
    p->ctx = ctx;
    p->piece = piece_of(n, p->n_threads);
    for (int i = 0; i < p->n_threads; i++) {
        int64_t begin;
        share_of(n, p->n_threads, i, &begin, &p->shares[i].end);
        atomic_store_explicit(&p->shares[i].next, begin, memory_order_relaxed);
    }
    uint_fast64_t gen = (atomic_load_explicit(&p->state, memory_order_relaxed) >> GEN_SHIFT) + 1;
    post(p, gen << GEN_SHIFT | STATE_OPEN);
    run_shares(p, 0);
    /* every index is taken: close the loop to latecomers, then wait for those inside */
    uint_fast64_t s = atomic_fetch_and_explicit(&p->state, ~STATE_OPEN, memory_order_acq_rel) & ~STATE_OPEN;
    if ((s & STATE_COUNT) != 0) s = spin(p, STATE_COUNT, 0, false);
    if ((s & STATE_COUNT) != 0) {
        pthread_mutex_lock(&p->lock);
        while ((atomic_load_explicit(&p->state, memory_order_acquire) & STATE_COUNT) != 0)
            pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&p->submit);
}
