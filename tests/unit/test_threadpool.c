/* test_threadpool.c - kiln_threadpool: every index exactly once, for many sizes and pool sizes;
 * nested loops run inline; two threads calling one pool at once; loops after the workers have
 * gone to sleep and loops whose caller sleeps until a slow worker is done; the balance
 * estimate. Run under ThreadSanitizer too. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "core/threadpool.h"
#include "unit.h"

typedef struct {
    atomic_int *count; /* [n] */
    int64_t n;
    atomic_int bad_range;
} cover_ctx;

static void cover(void *ctx, int64_t begin, int64_t end)
{
    cover_ctx *c = ctx;
    if (begin < 0 || end > c->n || begin >= end) atomic_fetch_add(&c->bad_range, 1);
    for (int64_t i = begin; i < end && i < c->n; i++) atomic_fetch_add(&c->count[i], 1);
}

/* Runs one loop of n indices on pool; true when each index ran exactly once. */
static bool cover_once(kiln_threadpool *pool, int64_t n)
{
    cover_ctx c = {.count = calloc((size_t)(n > 0 ? n : 1), sizeof(atomic_int)), .n = n};
    if (!c.count) return false;
    kiln_threadpool_parallel_for(pool, n, cover, &c);
    bool ok = atomic_load(&c.bad_range) == 0;
    for (int64_t i = 0; i < n; i++) ok = ok && atomic_load(&c.count[i]) == 1;
    free(c.count);
    return ok;
}

static void sleep_ms(int ms) { nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL); }

/* cover, each index taking 3 ms: longer than the threads spin before they sleep */
static void cover_slowly(void *ctx, int64_t begin, int64_t end)
{
    for (int64_t i = begin; i < end; i++) sleep_ms(3);
    cover(ctx, begin, end);
}

/* Loops that meet sleeping threads: after the workers have been idle past their spin, and with
 * bodies slow enough that the caller sleeps until the workers inside are done. */
static bool sleep_paths(kiln_threadpool *pool)
{
    bool ok = true;
    for (int i = 0; i < 3; i++) {
        sleep_ms(5);
        ok = cover_once(pool, 64) && ok;
        cover_ctx c = {.count = calloc(4, sizeof(atomic_int)), .n = 4};
        if (!c.count) return false;
        kiln_threadpool_parallel_for(pool, 4, cover_slowly, &c);
        ok = ok && atomic_load(&c.bad_range) == 0;
        for (int64_t k = 0; k < 4; k++) ok = ok && atomic_load(&c.count[k]) == 1;
        free(c.count);
    }
    return ok;
}

enum { OUTER = 8, INNER = 100 };

typedef struct {
    kiln_threadpool *pool;
    atomic_int count[OUTER][INNER];
    atomic_int bad;
} nest_ctx;

typedef struct {
    nest_ctx *parent;
    int64_t row;
} nest_row;

static void nest_inner(void *ctx, int64_t begin, int64_t end)
{
    nest_row *r = ctx;
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&r->parent->count[r->row][i], 1);
}

static void nest_outer(void *ctx, int64_t begin, int64_t end)
{
    nest_ctx *c = ctx;
    for (int64_t row = begin; row < end; row++) {
        nest_row r = {c, row};
        kiln_threadpool_parallel_for(c->pool, INNER, nest_inner, &r);
    }
}

typedef struct {
    kiln_threadpool *pool;
    int calls;
    bool ok;
} caller_ctx;

static void *caller_main(void *arg)
{
    caller_ctx *c = arg;
    c->ok = true;
    for (int i = 0; i < c->calls; i++) c->ok = cover_once(c->pool, 1 + (i * 37) % 500) && c->ok;
    return NULL;
}

static double cost_of(void *ctx, int64_t i) { return ((const double *)ctx)[i]; }

static bool near(double a, double b) { return a > b - 1e-9 && a < b + 1e-9; }

/* kiln_threadpool_balance against the schedules worked out by hand (shares, then stealing from
 * the front of the others'). */
static void check_balance(void)
{
    double equal[8] = {1, 1, 1, 1, 1, 1, 1, 1}, groups[3] = {4, 4, 2}, chunks[6] = {60, 40, 60, 40, 30, 20};
    double tail[6] = {1, 1, 1, 1, 10, 10};
    CHECK(near(kiln_threadpool_balance(NULL, 3, cost_of, equal), 1.0));
    kiln_threadpool *two = NULL, *three = NULL;
    CHECK(kiln_threadpool_create(2, &two) == KILN_OK && kiln_threadpool_create(3, &three) == KILN_OK);
    if (!two || !three) return;
    CHECK(near(kiln_threadpool_balance(two, 1, cost_of, equal), 1.0));
    CHECK(near(kiln_threadpool_balance(two, 3, cost_of, equal), 0.75));
    CHECK(near(kiln_threadpool_balance(two, 4, cost_of, equal), 1.0));
    /* [4, 4 | 2]: the second thread's 2, then the first share's second 4 */
    CHECK(near(kiln_threadpool_balance(two, 3, cost_of, groups), 10.0 / 12.0));
    /* [60, 40, 60 | 40, 30, 20]: the second thread takes the first share's last 60 at 90 */
    CHECK(near(kiln_threadpool_balance(two, 6, cost_of, chunks), 250.0 / 300.0));
    /* [1, 1, 1 | 1, 10, 10]: the first thread takes the second share's last 10 at 3 */
    CHECK(near(kiln_threadpool_balance(two, 6, cost_of, tail), 24.0 / 26.0));
    CHECK(near(kiln_threadpool_balance(three, 7, cost_of, equal), 7.0 / 9.0));
    CHECK(near(kiln_threadpool_balance(three, 6, cost_of, equal), 1.0));
    kiln_threadpool_free(two);
    kiln_threadpool_free(three);
}

int main(void)
{
    check_balance();
    CHECK(kiln_threadpool_create(-1, &(kiln_threadpool *){NULL}) == KILN_ERR_INVALID_ARG);
    CHECK(kiln_threadpool_create(1, NULL) == KILN_ERR_INVALID_ARG);
    kiln_threadpool_free(NULL);
    CHECK(kiln_threadpool_size(NULL) == 1);
    CHECK(cover_once(NULL, 10));

    int sizes[] = {1, 2, 3, 0};
    for (int s = 0; s < 4; s++) {
        kiln_threadpool *pool = NULL;
        CHECK(kiln_threadpool_create(sizes[s], &pool) == KILN_OK);
        if (!pool) continue;
        CHECK(kiln_threadpool_size(pool) >= 1);
        if (sizes[s]) CHECK(kiln_threadpool_size(pool) == sizes[s]);
        int64_t ns[] = {0, 1, 2, 3, 5, 7, 12, 100, 1000, 12345};
        for (int i = 0; i < 10; i++) CHECK(cover_once(pool, ns[i]));
        for (int i = 0; i < 300; i++) CHECK(cover_once(pool, 1 + i % 17)); /* many short loops */
        CHECK(sleep_paths(pool));

        nest_ctx *nc = calloc(1, sizeof *nc);
        nc->pool = pool;
        kiln_threadpool_parallel_for(pool, OUTER, nest_outer, nc);
        bool nest_ok = true;
        for (int r = 0; r < OUTER; r++)
            for (int i = 0; i < INNER; i++) nest_ok = nest_ok && atomic_load(&nc->count[r][i]) == 1;
        CHECK(nest_ok);
        free(nc);

        caller_ctx cc[2] = {{pool, 200, false}, {pool, 200, false}};
        pthread_t th[2];
        for (int t = 0; t < 2; t++) CHECK(pthread_create(&th[t], NULL, caller_main, &cc[t]) == 0);
        for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
        CHECK(cc[0].ok && cc[1].ok);
        kiln_threadpool_free(pool);
    }
    /* create and free repeatedly, with and without work in between */
    for (int i = 0; i < 20; i++) {
        kiln_threadpool *pool = NULL;
        CHECK(kiln_threadpool_create(1 + i % 4, &pool) == KILN_OK);
        if (i % 2) CHECK(cover_once(pool, 50));
        kiln_threadpool_free(pool);
    }
    return unit_report("test_threadpool");
}
