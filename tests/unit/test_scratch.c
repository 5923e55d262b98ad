/* test_scratch.c - the block cache of a session (core/scratch.h): reuse of a block given back,
 * the fit rule, the bound on kept bytes, a NULL scratch, refused sizes, and four threads
 * getting and putting at once (also under ThreadSanitizer); the large blocks under it
 * (core/pages.h): alignment, every byte writable, refused sizes. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/pages.h"
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

    /* blocks of many sizes, one out at a time: all kept while they fit in four times the most
     * ever out at once (here one block), then the smallest are dropped */
    kiln_scratch *u = kiln_scratch_create();
    size_t last = 0;
    for (int i = 0; i < 20; i++) {
        size_t n = 40960 + 4096 * (size_t)i; /* whole pages */
        kiln_scratch_put(u, kiln_scratch_get(u, n));
        last = n;
        CHECK(kiln_scratch_kept_bytes(u) <= 4 * n);
        if (i < 3) CHECK(kiln_scratch_kept_bytes(u) >= 40960 * (size_t)(i + 1)); /* nothing dropped yet */
    }
    CHECK(kiln_scratch_kept_bytes(u) >= last);
    kiln_scratch_free(u);
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

    /* large blocks: small, exactly one huge page, and odd sizes over several */
    CHECK(kiln_pages_alloc(0) == NULL && kiln_pages_alloc(SIZE_MAX - 5) == NULL);
    const size_t sizes[] = {1, 100, 4095, (size_t)2 << 20, ((size_t)5 << 20) + 3};
    for (int i = 0; i < 5; i++) {
        unsigned char *p = kiln_pages_alloc(sizes[i]);
        CHECK(p != NULL && (uintptr_t)p % 64 == 0);
        if (!p) continue;
        memset(p, 0x5a, sizes[i]);
        CHECK(p[0] == 0x5a && p[sizes[i] - 1] == 0x5a);
        free(p);
    }
    return unit_report("test_scratch");
}
