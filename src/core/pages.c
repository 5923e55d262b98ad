/* pages.c - see pages.h. */
#define _GNU_SOURCE
#include "core/pages.h"

#include <stdint.h>
#include <stdlib.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

enum { HUGE_PAGE = 2 << 20, LINE = 64 };

void *kiln_pages_alloc(size_t n)
{
    if (n == 0 || n > SIZE_MAX - HUGE_PAGE) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (n >= HUGE_PAGE) {
        void *p = NULL;
        if (posix_memalign(&p, HUGE_PAGE, n)) return NULL;
        /* only a hint: a kernel without THP leaves ordinary pages */
        (void)madvise(p, n, MADV_HUGEPAGE);
        return p;
    }
#endif
    return aligned_alloc(LINE, (n + LINE - 1) / LINE * LINE);
}
