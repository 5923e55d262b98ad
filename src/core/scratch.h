/* scratch.h - large temporary blocks kept for reuse: a session's run arenas, GEMM packing
 * buffers and the like, which every run needs again at about the same sizes. Freeing them to
 * the C library and allocating them again made the kernel map fresh zeroed pages on every run
 * (glibc returns large blocks to the system), up to a quarter of a small model's run time.
 *
 *     void *p = kiln_scratch_get(s, bytes);   // NULL: out of memory
 *     ...
 *     kiln_scratch_put(s, p);
 *
 * A scratch keeps the blocks given back, up to four times as many bytes as were ever out at
 * once (a run asks for many sizes one after another: a bound of once evicted, and the next run
 * mapped again, blocks on every run), and hands the smallest that fits (no more than twice
 * the size asked for, so a small request does not pin a large block). Thread-safe; a NULL
 * scratch is plain aligned_alloc/free. */
#ifndef KILN_CORE_SCRATCH_H
#define KILN_CORE_SCRATCH_H

#include <stddef.h>


typedef struct kiln_scratch kiln_scratch;

/* An empty scratch; NULL when out of memory. */
kiln_scratch *kiln_scratch_create(void);
/* Frees the kept blocks and s. Every block must have been put back. NULL is a no-op. */
void kiln_scratch_free(kiln_scratch *s);

/* A block of at least n bytes (n > 0), 64-byte aligned, contents undefined; NULL when out of
 * memory. */
void *kiln_scratch_get(kiln_scratch *s, size_t n);
/* Gives back a block from kiln_scratch_get of the same s. NULL is a no-op. */
void kiln_scratch_put(kiln_scratch *s, void *p);

/* Bytes of the blocks kept now (for tests). */
size_t kiln_scratch_kept_bytes(kiln_scratch *s);

#endif
