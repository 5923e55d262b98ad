/* cache.c - the on-disk cache of cache.h: entry files, their atomic replacement, LRU eviction. */
#define _GNU_SOURCE
#include "core/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum {
    HEADER = 40, /* bytes: magic 8, version 4, key length 4, payload length 8, payload hash 8, key hash 8 */
    VERSION = 1,
    NAME_ROOM = 256, /* bytes of a path kept for the file name after the folder */
    STALE_TMP_S = 3600, /* a temporary file older than this was left by a writer that died */
    TMP_TRIES = 16, /* names tried for a temporary file before giving up */
};

static const unsigned char MAGIC[8] = {'K', 'I', 'L', 'N', 'C', 'A', 'C', 'H'};

struct kiln_cache {
    char *dir; /* absolute, no trailing '/' */
    int64_t max_bytes; /* bound on the total size of the .bin files */
};

/* The one piece of shared state: makes temporary names unique between the threads of a process. */
static atomic_uint_fast64_t tmp_counter;

static void say(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t n, const char *fmt, ...)
{
    if (!why || !n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
}

uint64_t kiln_hash64(const void *data, size_t n, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = seed;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* key: 1-KILN_CACHE_KEY_MAX characters of [A-Za-z0-9._-], not starting with '.' (so never "..",
 * a hidden file or a temporary's name), and never a '/' */
static bool key_ok(const char *key, char *why, size_t why_size)
{
    if (!key) return say(why, why_size, "invalid cache key: NULL"), false;
    size_t len = strnlen(key, KILN_CACHE_KEY_MAX + 1);
    if (len == 0 || len > KILN_CACHE_KEY_MAX)
        return say(why, why_size, "invalid cache key: length must be 1 to %d", KILN_CACHE_KEY_MAX), false;
    if (key[0] == '.') return say(why, why_size, "invalid cache key '%s': starts with '.'", key), false;
    for (size_t i = 0; i < len; i++) {
        char ch = key[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                  ch == '_' || ch == '-';
        if (!ok) return say(why, why_size, "invalid cache key: character %zu is not one of [A-Za-z0-9._-]", i), false;
    }
    return true;
}

static int open_retry(const char *path, int flags, mode_t mode)
{
    int fd;
    do fd = open(path, flags, mode);
    while (fd < 0 && errno == EINTR);
    return fd;
}

/* Reads up to n bytes; fewer only at the end of the file. -1 on an error. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = read(fd, (unsigned char *)buf + done, n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

static bool write_full(int fd, const void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, (const unsigned char *)buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return false;
        if (w == 0) return errno = ENOSPC, false;
        done += (size_t)w;
    }
    return true;
}

/* mkdir -p path, each folder created with mode 0700; false with why on failure */
static bool make_dirs(const char *path, char *why, size_t why_size)
{
    size_t len = strlen(path);
    char *p = malloc(len + 1);
    if (!p) return say(why, why_size, "out of memory"), false;
    memcpy(p, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        if (p[i - 1] == '/') continue; /* "a//b" and a trailing '/' */
        char was = p[i];
        p[i] = '\0';
        if (mkdir(p, 0700) && errno != EEXIST) {
            int e = errno;
            struct stat st;
            if (stat(p, &st) || !S_ISDIR(st.st_mode)) { /* an existing folder may still refuse mkdir */
                say(why, why_size, "cannot create cache folder '%s': %s", p, strerror(e));
                free(p);
                return false;
            }
        }
        p[i] = was;
    }
    free(p);
    return true;
}

/* $KILN_CACHE_MAX_MB in bytes when a whole number > 0, else the default */
static int64_t max_from_env(void)
{
    const char *s = getenv("KILN_CACHE_MAX_MB");
    if (!s || !*s) return KILN_CACHE_DEFAULT_MAX_BYTES;
    char *end;
    errno = 0;
    long long mb = strtoll(s, &end, 10);
    if (errno || *end || mb <= 0 || mb > (INT64_MAX >> 20)) return KILN_CACHE_DEFAULT_MAX_BYTES;
    return (int64_t)mb << 20;
}

kiln_cache *kiln_cache_open(const char *dir, int64_t max_bytes, char *why, size_t why_size)
{
    say(why, why_size, "%s", "");
    char buf[PATH_MAX];
    const char *path = dir, *env;
    if (!path) {
        if ((env = getenv("KILN_CACHE_DIR"))) {
            if (!*env || !strcmp(env, "off")) {
                say(why, why_size, "cache disabled by KILN_CACHE_DIR='%s'", env);
                return NULL;
            }
            path = env;
        } else if ((env = getenv("XDG_CACHE_HOME")) && env[0] == '/') {
            if (snprintf(buf, sizeof buf, "%s/kiln", env) >= (int)sizeof buf)
                return say(why, why_size, "XDG_CACHE_HOME is too long"), NULL;
            path = buf;
        } else if ((env = getenv("HOME")) && *env) {
            if (snprintf(buf, sizeof buf, "%s/.cache/kiln", env) >= (int)sizeof buf)
                return say(why, why_size, "HOME is too long"), NULL;
            path = buf;
        } else {
            say(why, why_size, "no cache folder: KILN_CACHE_DIR, XDG_CACHE_HOME (absolute) and HOME are unset");
            return NULL;
        }
    }
    if (!*path) return say(why, why_size, "no cache folder: empty path"), NULL;
    if (!make_dirs(path, why, why_size)) return NULL;

    kiln_cache *c = calloc(1, sizeof *c);
    if (!c) return say(why, why_size, "out of memory"), NULL;
    c->dir = realpath(path, NULL); /* absolute: a later chdir does not move the cache */
    if (!c->dir) {
        say(why, why_size, "cannot resolve cache folder '%s': %s", path, strerror(errno));
        goto fail_c;
    }
    struct stat st;
    if (stat(c->dir, &st) || !S_ISDIR(st.st_mode)) {
        say(why, why_size, "cache folder '%s' is not a folder", c->dir);
        goto fail_dir;
    }
    if (access(c->dir, W_OK | X_OK)) {
        say(why, why_size, "cache folder '%s' is not writable: %s", c->dir, strerror(errno));
        goto fail_dir;
    }
    if (strlen(c->dir) > PATH_MAX - NAME_ROOM) {
        say(why, why_size, "cache folder path is too long (%zu bytes)", strlen(c->dir));
        goto fail_dir;
    }
    c->max_bytes = max_bytes > 0 ? max_bytes : max_from_env();
    return c;

fail_dir:
    free(c->dir);
fail_c:
    free(c);
    return NULL;
}

void kiln_cache_free(kiln_cache *c)
{
    if (!c) return;
    free(c->dir);
    free(c);
}

const char *kiln_cache_dir(const kiln_cache *c) { return c ? c->dir : NULL; }

int64_t kiln_cache_max_bytes(const kiln_cache *c) { return c ? c->max_bytes : 0; }

/* Removes path if it is still the file fd has open: a writer may have renamed a good entry over
 * it since it was read. */
static void remove_if_same(const char *path, int fd)
{
    struct stat a, b;
    if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) unlink(path);
}

bool kiln_cache_get(kiln_cache *c, const char *key, void **data, size_t *size, char *why, size_t why_size)
{
    say(why, why_size, "%s", "");
    if (data) *data = NULL;
    if (size) *size = 0;
    if (!c || !data || !size) return say(why, why_size, "no cache"), false;
    if (!key_ok(key, why, why_size)) return false;

    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.bin", c->dir, key); /* fits: kiln_cache_open left NAME_ROOM */
    /* O_NONBLOCK: a FIFO of that name must not hang the caller; no effect on a regular file */
    int fd = open_retry(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0) {
        if (errno != ENOENT) say(why, why_size, "cannot open cache entry '%s': %s", path, strerror(errno));
        return false;
    }
    char bad[96] = ""; /* why the file is corrupt */
    unsigned char *payload = NULL, h[HEADER];
    size_t klen = strlen(key);
    uint64_t fsize, plen = 0;
    ssize_t got;
    struct stat st;
    if (fstat(fd, &st)) {
        say(why, why_size, "cannot stat cache entry '%s': %s", path, strerror(errno));
        goto out_fd;
    }
    if (!S_ISREG(st.st_mode)) {
        say(why, why_size, "cache entry '%s' is not a regular file", path);
        goto out_fd;
    }

    fsize = (uint64_t)st.st_size;
    if ((got = read_full(fd, h, HEADER)) < 0) goto out_read;
    if (got < HEADER) {
        snprintf(bad, sizeof bad, "truncated header: %zd of %d bytes", got, HEADER);
    } else if (memcmp(h, MAGIC, sizeof MAGIC)) {
        snprintf(bad, sizeof bad, "not a kiln cache file");
    } else if (get_le(h + 8, 4) != VERSION) {
        snprintf(bad, sizeof bad, "format version %u, not %d", (unsigned)get_le(h + 8, 4), VERSION);
    } else if (get_le(h + 12, 4) != klen || get_le(h + 32, 8) != kiln_hash64(key, klen, KILN_HASH64_SEED)) {
        snprintf(bad, sizeof bad, "stored for another key");
    } else if ((plen = get_le(h + 16, 8)) > fsize || fsize - plen != HEADER + klen) {
        /* both lengths against the file's size before anything is allocated */
        snprintf(bad, sizeof bad, "payload of %llu bytes in a file of %llu", (unsigned long long)plen,
                 (unsigned long long)fsize);
    }
    if (*bad) goto out_bad;
    if (plen > (uint64_t)c->max_bytes || plen > SIZE_MAX - 1) {
        say(why, why_size, "cache entry '%s' holds %llu bytes, more than the bound of %lld", path,
            (unsigned long long)plen, (long long)c->max_bytes);
        goto out_fd;
    }

    char stored[KILN_CACHE_KEY_MAX];
    if ((got = read_full(fd, stored, klen)) < 0) goto out_read;
    if ((size_t)got < klen || memcmp(stored, key, klen)) {
        snprintf(bad, sizeof bad, "stored for another key");
        goto out_bad;
    }
    payload = malloc(plen ? (size_t)plen : 1);
    if (!payload) {
        say(why, why_size, "out of memory reading cache entry '%s' (%llu bytes)", path, (unsigned long long)plen);
        goto out_fd;
    }
    if ((got = read_full(fd, payload, (size_t)plen)) < 0) goto out_read;
    if ((uint64_t)got < plen) {
        snprintf(bad, sizeof bad, "truncated payload: %zd of %llu bytes", got, (unsigned long long)plen);
        goto out_bad;
    }
    if (kiln_hash64(payload, (size_t)plen, KILN_HASH64_SEED) != get_le(h + 24, 8)) {
        snprintf(bad, sizeof bad, "payload checksum mismatch");
        goto out_bad;
    }
    (void)futimens(fd, NULL); /* the LRU order; where refused (another user's file) only the order is lost */
    close(fd);
    *data = payload;
    *size = (size_t)plen;
    return true;

out_read:
    say(why, why_size, "cannot read cache entry '%s': %s", path, strerror(errno));
    goto out_fd;
out_bad:
    remove_if_same(path, fd);
    say(why, why_size, "corrupt cache entry '%s' (%s), removed", path, bad);
out_fd:
    free(payload);
    close(fd);
    return false;
}

typedef struct entry {
    char *name;
    uint64_t size; /* bytes */
    struct timespec mtime;
} entry;

static int older_first(const void *pa, const void *pb)
{
    const entry *a = pa, *b = pb;
    if (a->mtime.tv_sec != b->mtime.tv_sec) return a->mtime.tv_sec < b->mtime.tv_sec ? -1 : 1;
    if (a->mtime.tv_nsec != b->mtime.tv_nsec) return a->mtime.tv_nsec < b->mtime.tv_nsec ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* Removes the oldest .bin files but `keep` until they total at most the bound, and temporary
 * files older than STALE_TMP_S. O(entries log entries). */
static bool evict(kiln_cache *c, const char *keep, char *why, size_t why_size)
{
    DIR *d = opendir(c->dir);
    if (!d) return say(why, why_size, "cannot list cache folder '%s': %s", c->dir, strerror(errno)), false;
    int dfd = dirfd(d);
    entry *es = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    bool ok = true;
    time_t now = time(NULL);
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno) {
                ok = false;
                say(why, why_size, "cannot list cache folder '%s': %s", c->dir, strerror(errno));
            }
            break;
        }
        const char *name = de->d_name;
        size_t len = strlen(name);
        bool tmp = !strncmp(name, ".tmp-", 5), bin = len > 4 && !strcmp(name + len - 4, ".bin");
        struct stat st;
        if ((!tmp && !bin) || fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode)) continue;
        if (tmp) {
            if (now - st.st_mtime > STALE_TMP_S) (void)unlinkat(dfd, name, 0);
            continue;
        }
        total += (uint64_t)st.st_size;
        if (!strcmp(name, keep)) continue;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 64;
            entry *grown = realloc(es, ncap * sizeof *es);
            if (!grown) goto oom;
            es = grown;
            cap = ncap;
        }
        if (!(es[n].name = strdup(name))) goto oom;
        es[n].size = (uint64_t)st.st_size;
        es[n].mtime = st.st_mtim;
        n++;
    }
    if (ok && total > (uint64_t)c->max_bytes) {
        qsort(es, n, sizeof *es, older_first);
        for (size_t i = 0; i < n && total > (uint64_t)c->max_bytes; i++) {
            struct stat st;
            if (fstatat(dfd, es[i].name, &st, AT_SYMLINK_NOFOLLOW)) {
                if (errno == ENOENT) total -= es[i].size; /* another process removed it */
                continue;
            }
            /* touched or rewritten since the scan: no longer the oldest */
            if (st.st_mtim.tv_sec != es[i].mtime.tv_sec || st.st_mtim.tv_nsec != es[i].mtime.tv_nsec) continue;
            if (unlinkat(dfd, es[i].name, 0) == 0 || errno == ENOENT) total -= es[i].size;
        }
    }
    goto out;
oom:
    ok = false;
    say(why, why_size, "out of memory listing cache folder '%s'", c->dir);
out:
    for (size_t i = 0; i < n; i++) free(es[i].name);
    free(es);
    closedir(d);
    return ok;
}

bool kiln_cache_put(kiln_cache *c, const char *key, const void *data, size_t size, char *why, size_t why_size)
{
    say(why, why_size, "%s", "");
    if (!c) return say(why, why_size, "no cache"), false;
    if (!key_ok(key, why, why_size)) return false;
    if (size && !data) return say(why, why_size, "no data"), false;
    size_t klen = strlen(key);
    uint64_t room = (uint64_t)c->max_bytes;
    if (room < HEADER + klen || size > room - HEADER - klen) {
        say(why, why_size, "cache entry '%s' of %zu bytes exceeds the bound of %lld bytes, not stored", key, size,
            (long long)c->max_bytes);
        return false;
    }

    char tmp[PATH_MAX], path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.bin", c->dir, key);
    pthread_t self = pthread_self();
    uint64_t tid = kiln_hash64(&self, sizeof self, KILN_HASH64_SEED); /* pthread_t is opaque */
    int fd = -1;
    for (int i = 0; i < TMP_TRIES && fd < 0; i++) {
        unsigned long long k = (unsigned long long)atomic_fetch_add(&tmp_counter, 1);
        snprintf(tmp, sizeof tmp, "%s/.tmp-%ld-%016llx-%llx", c->dir, (long)getpid(), (unsigned long long)tid, k);
        fd = open_retry(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) break; /* EEXIST: a leftover of a process of the same pid */
    }
    if (fd < 0) return say(why, why_size, "cannot create '%s': %s", tmp, strerror(errno)), false;

    unsigned char head[HEADER + KILN_CACHE_KEY_MAX];
    memcpy(head, MAGIC, sizeof MAGIC);
    put_le(head + 8, VERSION, 4);
    put_le(head + 12, klen, 4);
    put_le(head + 16, size, 8);
    put_le(head + 24, kiln_hash64(data, size, KILN_HASH64_SEED), 8);
    put_le(head + 32, kiln_hash64(key, klen, KILN_HASH64_SEED), 8);
    memcpy(head + HEADER, key, klen);
    if (!write_full(fd, head, HEADER + klen) || !write_full(fd, data, size)) {
        say(why, why_size, "cannot write '%s': %s", tmp, strerror(errno));
        close(fd);
        goto fail_tmp;
    }
    if (close(fd)) { /* NFS and full disks may report here */
        say(why, why_size, "cannot write '%s': %s", tmp, strerror(errno));
        goto fail_tmp;
    }
    if (rename(tmp, path)) {
        say(why, why_size, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        goto fail_tmp;
    }
    return evict(c, path + strlen(c->dir) + 1, why, why_size);

fail_tmp:
    unlink(tmp);
    return false;
}
