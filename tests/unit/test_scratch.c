/* test_scratch.c - the block cache of a session (core/scratch.h): reuse of a block given back,
 * the fit rule, the bound on kept bytes, a NULL scratch, refused sizes, and four threads
 * getting and putting at once (also under ThreadSanitizer). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "unit.h"

static void *hammer(void *arg)
{
    kiln_scratch *s = arg;
    for (int i = 0; i < 2000; i++) {
        size_t n = 1000 + (size_t)(i % 7) * 70000;
        unsigned char *p = kiln_scratch_get(s, n);
        if (!p) return (void *)1;
        memset(p, i & 0xff, n); /* all of it is writable */
        if ((uintptr_t)p % 64) return (void *)1;
        kiln_scratch_put(s, p);
    }
    return NULL;
}

int main(void)
{
    kiln_scratch *s = kiln_scratch_create();
    CHECK(s != NULL);
    CHECK(kiln_scratch_get(s, 0) == NULL);
    CHECK(kiln_scratch_get(s, SIZE_MAX - 10) == NULL);
    CHECK(kiln_scratch_kept_bytes(s) == 0);

    /* a block given back is handed out again for a request it fits */
    void *a = kiln_scratch_get(s, 100000);
    CHECK(a != NULL && (uintptr_t)a % 64 == 0);
    kiln_scratch_put(s, a);
    CHECK(kiln_scratch_kept_bytes(s) >= 100000);
    void *b = kiln_scratch_get(s, 90000);
    CHECK(b == a);
    CHECK(kiln_scratch_kept_bytes(s) == 0);
    /* not for a request of less than half its size, nor one larger */
    kiln_scratch_put(s, b);
    void *small = kiln_scratch_get(s, 20000), *large = kiln_scratch_get(s, 200000);
    CHECK(small != a && large != a);
    kiln_scratch_put(s, small);
    kiln_scratch_put(s, large);

    /* never more kept than was ever out at once (here 100000 + 20000 + 200000, page-rounded) */
    size_t peak = 0;
    void *blocks[8];
    for (int i = 0; i < 8; i++) blocks[i] = kiln_scratch_get(s, 4096 * (size_t)(i + 1));
    for (int i = 0; i < 8; i++) peak += 4096 * (size_t)(i + 1);
    for (int i = 0; i < 8; i++) kiln_scratch_put(s, blocks[i]);
    CHECK(kiln_scratch_kept_bytes(s) <= 4096 * 25 + 20480 + 200704 + peak);
    kiln_scratch_put(s, NULL);

    /* a NULL scratch is aligned_alloc and free */
    void *c = kiln_scratch_get(NULL, 5000);
    CHECK(c != NULL && (uintptr_t)c % 64 == 0);
    memset(c, 1, 5000);
    kiln_scratch_put(NULL, c);
    CHECK(kiln_scratch_kept_bytes(NULL) == 0);

    pthread_t t[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, hammer, s) == 0);
    for (int i = 0; i < 4; i++) {
        void *r = NULL;
        pthread_join(t[i], &r);
        CHECK(r == NULL);
    }
    kiln_scratch_free(s);
    kiln_scratch_free(NULL);
    return unit_report("test_scratch");
}
