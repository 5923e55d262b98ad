/* scratch.c - the block cache of scratch.h. */
#include "core/scratch.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/pages.h"

enum {
    HEAD = 64,        /* bytes before each block: its capacity (and the alignment) */
    PAGE = 4096,      /* capacities are whole pages */
    MAX_KEPT = 64,
    KEEP_FACTOR = 4, /* kept bytes: at most this many times the most ever out at once */
};

typedef struct kept_block {
    unsigned char *raw;
    size_t cap;
} kept_block;

struct kiln_scratch {
    pthread_mutex_t lock;
    kept_block kept[MAX_KEPT];
    int n_kept;
    size_t kept_bytes;
    size_t out_bytes, peak_out; /* capacity handed out now, and at most */
};

kiln_scratch *kiln_scratch_create(void)
{
    kiln_scratch *s = calloc(1, sizeof *s);
    if (s && pthread_mutex_init(&s->lock, NULL)) {
        free(s);
        return NULL;
    }
    return s;
}

void kiln_scratch_free(kiln_scratch *s)
{
    if (!s) return;
    for (int i = 0; i < s->n_kept; i++) free(s->kept[i].raw);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static size_t cap_of(const void *p) { return *(const size_t *)((const unsigned char *)p - HEAD); }

void *kiln_scratch_get(kiln_scratch *s, size_t n)
{
    if (n == 0 || n > SIZE_MAX - HEAD - PAGE) return NULL;
    size_t cap = (n + PAGE - 1) / PAGE * PAGE;
    unsigned char *raw = NULL;
    if (s) {
        pthread_mutex_lock(&s->lock);
        int best = -1;
        for (int i = 0; i < s->n_kept; i++) /* the smallest that fits, at most twice the size */
            if (s->kept[i].cap >= cap && s->kept[i].cap / 2 <= cap && (best < 0 || s->kept[i].cap < s->kept[best].cap))
                best = i;
        if (best >= 0) {
            raw = s->kept[best].raw;
            cap = s->kept[best].cap;
            s->kept_bytes -= cap;
            s->kept[best] = s->kept[--s->n_kept];
        }
        s->out_bytes += cap;
        if (s->out_bytes > s->peak_out) s->peak_out = s->out_bytes;
        pthread_mutex_unlock(&s->lock);
    }
    if (!raw) raw = kiln_pages_alloc(HEAD + cap);
    if (!raw) {
        if (s) {
            pthread_mutex_lock(&s->lock);
            s->out_bytes -= cap;
            pthread_mutex_unlock(&s->lock);
        }
        return NULL;
    }
    *(size_t *)raw = cap;
    return raw + HEAD;
}

void kiln_scratch_put(kiln_scratch *s, void *p)
{
    if (!p) return;
    unsigned char *raw = (unsigned char *)p - HEAD;
    if (!s) {
        free(raw);
        return;
    }
    size_t cap = cap_of(p);
    pthread_mutex_lock(&s->lock);
    s->out_bytes -= cap;
    /* keep at most the peak of what was out at once: drop the smallest kept blocks (the cheapest
     * to map again) until this one fits, or this one if it is the smallest */
    while (s->n_kept > 0 && (s->n_kept == MAX_KEPT || s->kept_bytes + cap > KEEP_FACTOR * s->peak_out)) {
        int small = 0;
        for (int i = 1; i < s->n_kept; i++)
            if (s->kept[i].cap < s->kept[small].cap) small = i;
        if (s->kept[small].cap >= cap) break;
        free(s->kept[small].raw);
        s->kept_bytes -= s->kept[small].cap;
        s->kept[small] = s->kept[--s->n_kept];
    }
    if (s->n_kept < MAX_KEPT && s->kept_bytes + cap <= KEEP_FACTOR * s->peak_out) {
        s->kept[s->n_kept++] = (kept_block){raw, cap};
        s->kept_bytes += cap;
        raw = NULL;
    }
    pthread_mutex_unlock(&s->lock);
    free(raw);
}

size_t kiln_scratch_kept_bytes(kiln_scratch *s)
{
    if (!s) return 0;
    pthread_mutex_lock(&s->lock);
    size_t n = s->kept_bytes;
    pthread_mutex_unlock(&s->lock);
    return n;
}
