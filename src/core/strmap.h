/* strmap.h - string-keyed hash map to pointers (keys borrowed; they must outlive the map). */
#ifndef KILN_CORE_STRMAP_H
#define KILN_CORE_STRMAP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kiln_strmap {
    const char **keys;
    void **vals;
    size_t cap, count;
} kiln_strmap;

/* Inserts or replaces; false when out of memory. */
bool kiln_strmap_put(kiln_strmap *m, const char *key, void *val);
void *kiln_strmap_get(const kiln_strmap *m, const char *key);
void kiln_strmap_release(kiln_strmap *m);

#endif
