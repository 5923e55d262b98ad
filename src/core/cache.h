/* cache.h - an on-disk cache of compiled artefacts shared by every process of the user (the GPU
 * provider keeps its NVRTC-compiled kernels here, so that a second process starts warm).
 *
 *     char why[256];
 *     kiln_cache *c = kiln_cache_open(NULL, 0, why, sizeof why);   // NULL: no cache, why says why
 *     uint64_t h = kiln_hash64(src, src_len, KILN_HASH64_SEED);
 *     char key[64];
 *     snprintf(key, sizeof key, "sm90-%016llx", (unsigned long long)h);
 *     void *bin; size_t n;
 *     if (!kiln_cache_get(c, key, &bin, &n, why, sizeof why)) {
 *         ... compile into bin, n ...
 *         kiln_cache_put(c, key, bin, n, why, sizeof why);         // false: not stored, why says why
 *     }
 *     free(bin);
 *     kiln_cache_free(c);
 *
 * Each entry is one file, `<key>.bin`: a 40-byte header (the magic "KILNCACH", the format
 * version, the key's length, the payload's length, a 64-bit hash of the payload and one of the
 * key, all little-endian), then the key, then the payload. Writers write a temporary file of a
 * name of their own (`.tmp-<pid>-<thread>-<counter>`) and rename() it over the entry, so readers
 * in other processes see the old entry or the new one, never a part. Every length read from a
 * file is checked against the file's size and the bound before anything is allocated.
 *
 * Thread-safe: a handle may be used from several threads at once, and several processes may
 * share one folder. Nothing here prints, exits or aborts; failures are return values with a
 * one-line reason in the caller's `why` buffer (why_size bytes; why may be NULL when why_size is
 * 0). */
#ifndef KILN_CORE_CACHE_H
#define KILN_CORE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_cache kiln_cache;

/* The longest key, in characters. */
#define KILN_CACHE_KEY_MAX 120
/* The bound when neither max_bytes nor $KILN_CACHE_MAX_MB gives one: 256 MiB. */
#define KILN_CACHE_DEFAULT_MAX_BYTES ((int64_t)256 << 20)

/* Opens the cache folder: `dir` when non-NULL, else $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln
 * (an absolute XDG_CACHE_HOME only, as the XDG spec asks), else $HOME/.cache/kiln (created with
 * mkdir -p, mode 0700). max_bytes <= 0: $KILN_CACHE_MAX_MB MiB if set and valid (a whole number
 * > 0), else 256 MiB. KILN_CACHE_DIR set to the empty string or "off" disables the cache.
 * Returns NULL with a one-line reason in why when there is no usable cache: the cache disabled,
 * the variables unset, a path that is not a writable folder, out of memory. Never aborts.
 * Free with kiln_cache_free. */
kiln_cache *kiln_cache_open(const char *dir, int64_t max_bytes, char *why, size_t why_size);
/* Frees the handle (the folder stays). NULL is a no-op. */
void kiln_cache_free(kiln_cache *c);

/* Looks key up. key: 1-120 characters of [A-Za-z0-9._-], not starting with '.'; anything else
 * is a miss with why set. A hit returns true with *data (malloc'd, never NULL, even for a
 * 0-byte payload; the caller frees it) and *size, sets why to "", and touches the entry's mtime
 * (the LRU order of kiln_cache_put). A miss returns false with *data NULL and *size 0: a missing
 * entry with why "", a truncated or corrupt one (magic, version, lengths against the file's
 * size, the hash of the payload, the key stored in the file and its hash, so two keys never
 * alias) with the file removed and why saying so; a payload larger than the bound, or an error
 * reading the file (the file kept), with why saying so. c NULL is a miss with why set.
 * Cost: one open, one read of the file and a hash over it. */
bool kiln_cache_get(kiln_cache *c, const char *key, void **data, size_t *size, char *why, size_t why_size);

/* Stores size bytes of data (data may be NULL when size is 0) under key atomically: a uniquely
 * named temporary file in the folder (pid, thread, counter, O_EXCL), written fully, then
 * rename()d over the entry, so readers in other processes never see a partial file. Then, if the
 * folder's entries (files ending .bin) total more than the bound, removes the least recently
 * used (oldest mtime) until the total fits, never the entry just written; and removes temporary
 * files older than an hour, which a crashed writer left. An entry that alone exceeds the bound is
 * not stored (false, why says so). Returns true with why "" when stored and the bound holds;
 * false with why on any failure: an invalid key, c NULL, a write error (nothing stored, the old
 * entry if any kept), or an error while evicting (the entry stored, the bound perhaps not kept).
 * Never aborts. Cost: a write of the file, and a scan of the folder. */
bool kiln_cache_put(kiln_cache *c, const char *key, const void *data, size_t size, char *why, size_t why_size);

/* The folder in use, without a trailing '/' (borrowed; valid until c is freed). */
const char *kiln_cache_dir(const kiln_cache *c);
/* The bound on the entries' total size, in bytes. */
int64_t kiln_cache_max_bytes(const kiln_cache *c);

/* The start of a hash chain for kiln_hash64. */
#define KILN_HASH64_SEED 0xcbf29ce484222325ull
/* FNV-1a 64 of n bytes (data may be NULL when n is 0) continuing from seed: chaining
 * kiln_hash64(b, nb, kiln_hash64(a, na, KILN_HASH64_SEED)) equals the hash of a then b in one
 * call, so a key can be built from several parts. Start from KILN_HASH64_SEED (with 0, runs of
 * zero bytes hash to 0). For keys and checksums; not a defence against a chosen collision. */
uint64_t kiln_hash64(const void *data, size_t n, uint64_t seed);

#endif
