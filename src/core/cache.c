/* cache.c - the on-disk cache: hashed file names, checksummed entries, atomic replacement. */
#define _GNU_SOURCE
#include "core/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CACHE_MAGIC "KILNCACH"
#define CACHE_FORMAT 1u
#define CACHE_KILN_VERSION \
    ((uint32_t)KILN_VERSION_MAJOR << 16 | (uint32_t)KILN_VERSION_MINOR << 8 | (uint32_t)KILN_VERSION_PATCH)
#define CACHE_HEADER 40 /* bytes: magic 8, format 4, kiln version 4, key length 4, pad 4, payload 8, sum 8 */
#define CACHE_MAX_KEY 4096 /* bytes */

struct kiln_cache {
    char dir[4096];
    char warning[4200];
    bool disabled;
};

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define FNV_SEED 0xcbf29ce484222325ull

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Creates every missing folder of path; 0 or an errno. */
static int mkdir_p(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return ENAMETOOLONG;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return errno;
        buf[i] = c;
    }
    struct stat st;
    if (stat(path, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

static void disable(kiln_cache *c, const char *fmt, const char *what, int e)
{
    c->disabled = true;
    snprintf(c->warning, sizeof c->warning, fmt, what, strerror(e));
}

/* The folder: the argument, $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln, $HOME/.cache/kiln. */
static bool resolve_dir(kiln_cache *c, const char *dir)
{
    const char *env;
    int n;
    if (dir && *dir)
        n = snprintf(c->dir, sizeof c->dir, "%s", dir);
    else if ((env = getenv("KILN_CACHE_DIR")) && *env)
        n = snprintf(c->dir, sizeof c->dir, "%s", env);
    else if ((env = getenv("XDG_CACHE_HOME")) && *env == '/')  /* XDG: relative paths are ignored */
        n = snprintf(c->dir, sizeof c->dir, "%s/kiln", env);
    else if ((env = getenv("HOME")) && *env)
        n = snprintf(c->dir, sizeof c->dir, "%s/.cache/kiln", env);
    else {
        c->dir[0] = '\0';
        c->disabled = true;
        snprintf(c->warning, sizeof c->warning, "cache disabled: no folder given and none of KILN_CACHE_DIR, "
                 "XDG_CACHE_HOME, HOME is set");
        return false;
    }
    if (n < 0 || (size_t)n >= sizeof c->dir - 64) {
        c->dir[0] = '\0';
        c->disabled = true;
        snprintf(c->warning, sizeof c->warning, "cache disabled: folder path too long");
        return false;
    }
    return true;
}

kiln_status kiln_cache_open(const char *dir, kiln_cache **out, kiln_err *err)
{
    *out = NULL;
    kiln_cache *c = calloc(1, sizeof *c);
    if (!c) return kiln_errf(err, KILN_ERR_NOMEM, "cache: out of memory");
    *out = c;
    if (!resolve_dir(c, dir)) return KILN_OK;
    int e = mkdir_p(c->dir);
    if (e) {
        disable(c, "cache disabled: cannot create folder '%s': %s", c->dir, e);
        return KILN_OK;
    }
    /* probe that the folder takes new files */
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.probe.XXXXXX", c->dir);
    int fd = mkstemp(probe);
    if (fd < 0) {
        disable(c, "cache disabled: cannot write in folder '%s': %s", c->dir, errno);
        return KILN_OK;
    }
    close(fd);
    unlink(probe);
    return KILN_OK;
}

void kiln_cache_close(kiln_cache *c)
{
    free(c);
}

const char *kiln_cache_warning(const kiln_cache *c)
{
    return c && c->disabled ? c->warning : NULL;
}

const char *kiln_cache_dir(const kiln_cache *c)
{
    return c ? c->dir : "";
}

static void entry_path(const kiln_cache *c, const char *key, char *path, size_t size)
{
    snprintf(path, size, "%s/%016llx.kc", c->dir,
             (unsigned long long)fnv1a(FNV_SEED, key, strlen(key)));
}

/* Reads exactly n bytes; false on a short read or an error. */
static bool read_all(int fd, void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

static bool write_all(int fd, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

bool kiln_cache_get(kiln_cache *c, const char *key, void **bytes, size_t *len)
{
    *bytes = NULL;
    *len = 0;
    if (!c || c->disabled || !key) return false;
    size_t klen = strlen(key);
    if (klen > CACHE_MAX_KEY) return false;
    char path[4200];
    entry_path(c, key, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool hit = false;
    unsigned char h[CACHE_HEADER], *buf = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !read_all(fd, h, sizeof h)) goto out_close;
    uint64_t plen = get_u64(h + 24);
    if (memcmp(h, CACHE_MAGIC, 8) != 0 || get_u32(h + 8) != CACHE_FORMAT ||
        get_u32(h + 12) != CACHE_KILN_VERSION || get_u32(h + 16) != klen || get_u32(h + 20) != 0)
        goto out_close;
    /* the file must be exactly header + key + payload: a truncated or padded entry is a miss */
    if ((uint64_t)st.st_size < CACHE_HEADER + klen || plen != (uint64_t)st.st_size - CACHE_HEADER - klen)
        goto out_close;
    buf = malloc(klen + (size_t)plen + 1);
    if (!buf || !read_all(fd, buf, klen + (size_t)plen)) goto out_close;
    if (memcmp(buf, key, klen) != 0 || fnv1a(FNV_SEED, buf, klen + (size_t)plen) != get_u64(h + 32))
        goto out_close;
    memmove(buf, buf + klen, (size_t)plen);
    *bytes = buf;
    *len = (size_t)plen;
    buf = NULL;
    hit = true;
out_close:
    free(buf);
    close(fd);
    return hit;
}

kiln_status kiln_cache_put(kiln_cache *c, const char *key, const void *bytes, size_t len)
{
    if (!c || c->disabled) return KILN_OK;
    if (!key || (len && !bytes)) return KILN_ERR_INVALID_ARG;
    size_t klen = strlen(key);
    if (klen > CACHE_MAX_KEY) return KILN_ERR_INVALID_ARG;
    char path[4200], tmp[4300];
    entry_path(c, key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) return KILN_ERR_IO;
    unsigned char h[CACHE_HEADER] = {0};
    memcpy(h, CACHE_MAGIC, 8);
    put_u32(h + 8, CACHE_FORMAT);
    put_u32(h + 12, CACHE_KILN_VERSION);
    put_u32(h + 16, (uint32_t)klen);
    put_u64(h + 24, (uint64_t)len);
    put_u64(h + 32, fnv1a(fnv1a(FNV_SEED, key, klen), bytes ? bytes : "", len));
    bool ok = write_all(fd, h, sizeof h) && write_all(fd, key, klen) && write_all(fd, bytes, len) &&
              fchmod(fd, 0644) == 0 && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return KILN_ERR_IO;
    }
    return KILN_OK;
}
