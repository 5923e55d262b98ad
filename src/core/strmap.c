/* strmap.c - open-addressing string map. */
#include "core/strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static bool grow(kiln_strmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    const char **keys = calloc(cap, sizeof *keys);
    void **vals = calloc(cap, sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = str_hash(m->keys[i]) & (cap - 1);
        while (keys[j]) j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    return true;
}

bool kiln_strmap_put(kiln_strmap *m, const char *key, void *val)
{
    if ((m->count + 1) * 2 > m->cap && !grow(m)) return false;
    size_t j = str_hash(key) & (m->cap - 1);
    while (m->keys[j]) {
        if (!strcmp(m->keys[j], key)) {
            m->vals[j] = val;
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->keys[j] = key;
    m->vals[j] = val;
    m->count++;
    return true;
}

void *kiln_strmap_get(const kiln_strmap *m, const char *key)
{
    if (!m->cap) return NULL;
    size_t j = str_hash(key) & (m->cap - 1);
    while (m->keys[j]) {
        if (!strcmp(m->keys[j], key)) return m->vals[j];
        j = (j + 1) & (m->cap - 1);
    }
    return NULL;
}

void kiln_strmap_release(kiln_strmap *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}
