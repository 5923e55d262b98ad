/* cache.h - the on-disk cache: every piece of state kiln keeps on disk (compiled artefacts,
 * tuning results) goes through this module, as opaque payloads under string keys.
 *
 *     kiln_cache *c = NULL;
 *     kiln_err err = {0};
 *     if (kiln_cache_open(NULL, &c, &err) != KILN_OK) return err.code;  // only out of memory
 *     if (kiln_cache_warning(c)) ...          // disabled: every get misses, puts do nothing
 *     kiln_cache_put(c, "conv/3x3/avx2", bytes, len);
 *     void *p; size_t n;
 *     if (kiln_cache_get(c, "conv/3x3/avx2", &p, &n)) { ...; free(p); }
 *     kiln_cache_close(c);
 *
 * Location, resolved by kiln_cache_open (no global state): the folder given, else
 * $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; created if missing.
 *
 * One entry is one file named by the FNV-1a 64 hash of its key (so keys never reach a path):
 * a header (magic, format version, kiln version, key length, payload length, FNV-1a 64 checksum
 * of key and payload), the key, the payload. Entries are written to a unique temporary file
 * in the same folder, fsync'd and renamed over the old one, so that readers see a complete
 * old or new entry even with several processes writing the same key. An entry that is
 * truncated, corrupt, of another format or kiln version, or of another key (a hash collision)
 * is a miss, and the next put replaces it. */
#ifndef KILN_CORE_CACHE_H
#define KILN_CORE_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

typedef struct kiln_cache kiln_cache;

/* Opens the cache in folder `dir` (NULL: the default location above). When the folder cannot
 * be resolved, created or written, the cache opens disabled and kiln_cache_warning says why.
 * Fails (KILN_ERR_NOMEM, message in err) only when the handle cannot be allocated; *out is then
 * NULL. The handle is released by kiln_cache_close; it is not meant to be shared by threads. */
kiln_status kiln_cache_open(const char *dir, kiln_cache **out, kiln_err *err);
void kiln_cache_close(kiln_cache *c);

/* NULL when the cache works; else why it is disabled ("cannot create folder '...': ...").
 * Borrowed: valid until the cache is closed. */
const char *kiln_cache_warning(const kiln_cache *c);
/* The folder in use (borrowed; "" when no location could be resolved). */
const char *kiln_cache_dir(const kiln_cache *c);

/* On a hit: true, *bytes a malloc'd copy of the payload (caller frees; non-NULL even when
 * *len is 0). On a miss (absent, invalid entry, disabled cache, out of memory): false, *bytes
 * NULL, *len 0. */
bool kiln_cache_get(kiln_cache *c, const char *key, void **bytes, size_t *len);
/* Stores len bytes under key, replacing any entry. A disabled cache does nothing and returns
 * KILN_OK; a write that fails returns KILN_ERR_IO (the old entry, if any, stays intact). */
kiln_status kiln_cache_put(kiln_cache *c, const char *key, const void *bytes, size_t len);

#endif
