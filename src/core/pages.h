/* pages.h - large long-lived blocks (packed weights, kept scratch) on huge pages where the OS
 * offers them.
 *
 * A layer's packed weights are megabytes read front to back once per run, mostly from memory:
 * on 4 KB pages every 4 KB is another TLB miss and the hardware prefetchers stop at each page
 * boundary. On Linux a block of 2 MB or more starts on a 2 MB boundary and is marked for
 * transparent huge pages (madvise: honoured when THP is "always" or "madvise", the default of
 * most distributions); elsewhere, or when the kernel declines, it is an ordinary block.
 *
 *     float *w = kiln_pages_alloc(bytes);   // NULL: out of memory
 *     ...
 *     free(w);
 */
#ifndef KILN_CORE_PAGES_H
#define KILN_CORE_PAGES_H

#include <stddef.h>

/* At least n bytes (n > 0), 64-byte aligned, contents undefined, freed with free(); NULL when
 * out of memory. */
void *kiln_pages_alloc(size_t n);

#endif
