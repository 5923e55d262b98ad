/* arena.h - bump allocator for objects that live exactly as long as their owner (a model's IR). */
#ifndef KILN_CORE_ARENA_H
#define KILN_CORE_ARENA_H

#include <stddef.h>

typedef struct kiln_arena_chunk kiln_arena_chunk;

typedef struct kiln_arena {
    kiln_arena_chunk *head;
} kiln_arena;

/* Zeroed memory aligned to 16 bytes, or NULL when out of memory (or on size overflow). */
void *kiln_arena_alloc(kiln_arena *a, size_t size);
/* n * size bytes, zeroed; NULL on overflow or out of memory. */
void *kiln_arena_calloc(kiln_arena *a, size_t n, size_t size);
char *kiln_arena_strdup(kiln_arena *a, const char *s);
char *kiln_arena_strndup(kiln_arena *a, const char *s, size_t n);
/* Releases every allocation of the arena; the arena can be reused afterwards. */
void kiln_arena_release(kiln_arena *a);

#endif
