/* arena.c - chunked bump allocator. */
#include "core/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct kiln_arena_chunk {
    kiln_arena_chunk *next;
    size_t used, cap; /* bytes of data[] */
    _Alignas(16) unsigned char data[];
};

#define KILN_ARENA_CHUNK (64 * 1024)

void *kiln_arena_alloc(kiln_arena *a, size_t size)
{
    if (size > SIZE_MAX / 2) return NULL;
    size = (size + 15) & ~(size_t)15;
    kiln_arena_chunk *c = a->head;
    if (!c || c->cap - c->used < size) {
        size_t cap = size > KILN_ARENA_CHUNK ? size : KILN_ARENA_CHUNK;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        if (a->head && size > KILN_ARENA_CHUNK) {
            /* keep filling the current chunk; put the big block behind it */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += size;
    memset(p, 0, size);
    return p;
}

void *kiln_arena_calloc(kiln_arena *a, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    return kiln_arena_alloc(a, (n * size) != 0 ? n * size : 1);
}

char *kiln_arena_strndup(kiln_arena *a, const char *s, size_t n)
{
    char *d = kiln_arena_alloc(a, n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *kiln_arena_strdup(kiln_arena *a, const char *s)
{
    return kiln_arena_strndup(a, s ? s : "", s ? strlen(s) : 0);
}

void kiln_arena_release(kiln_arena *a)
{
    kiln_arena_chunk *c = a->head;
    while (c) {
        kiln_arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
}
