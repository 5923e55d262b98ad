/* test_cache.c - the on-disk cache of compiled artefacts (core/cache.h): round trips of random
 * payloads, misses, invalid keys, corrupt, truncated, hostile and misplaced entry files, the
 * folder from the environment, LRU eviction under the bound, stale temporaries, and two
 * processes of four writer and four reader threads each on shared and own keys, every hit
 * checked intact. Each case works in a folder of its own under a mkdtemp folder, removed at the end. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cache.h"
#include "unit.h"

enum { HEADER = 40, THREADS = 4, ROUNDS = 300 };

static char g_root[PATH_MAX]; /* the mkdtemp folder everything lives under */

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(rnd(&s) >> 24);
}

/* rm -rf path (our folders hold only files and folders) */
static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char sub[PATH_MAX];
            snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
            remove_tree(sub);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* a fresh folder g_root/name, returned in buf */
static const char *fresh_dir(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_root, name);
    remove_tree(buf);
    return buf;
}

static bool exists(const char *dir, const char *name)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0;
}

static off_t file_size(const char *dir, const char *name)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0 ? st.st_size : -1;
}

/* the files of dir: how many end .bin, their total size, and how many start .tmp- */
static void count_files(const char *dir, int *bins, int64_t *bin_bytes, int *tmps)
{
    *bins = 0, *bin_bytes = 0, *tmps = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len > 4 && !strcmp(de->d_name + len - 4, ".bin")) {
            (*bins)++;
            *bin_bytes += file_size(dir, de->d_name);
        }
        if (!strncmp(de->d_name, ".tmp-", 5)) (*tmps)++;
    }
    closedir(d);
}

/* sets the mtime of dir/name to `ago` seconds before now */
static void set_age(const char *dir, const char *name, int ago)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct timespec t[2] = {{time(NULL) - ago, 0}, {time(NULL) - ago, 0}};
    CHECK(utimensat(AT_FDCWD, p, t, 0) == 0);
}

/* overwrites len bytes at off of dir/name */
static void patch(const char *dir, const char *name, off_t off, const void *bytes, size_t len)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(pwrite(fd, bytes, len, off) == (ssize_t)len);
    close(fd);
}

static bool put_ok(kiln_cache *c, const char *key, const void *data, size_t n)
{
    char why[256] = "x";
    bool ok = kiln_cache_put(c, key, data, n, why, sizeof why);
    if (!ok) fprintf(stderr, "put '%s': %s\n", key, why);
    return ok && why[0] == '\0';
}

/* get that expects a miss; true when it was one with a why that is empty or not, as asked */
static bool miss(kiln_cache *c, const char *key, bool why_empty, char *why, size_t why_size)
{
    void *data = (void *)1;
    size_t n = 7;
    bool hit = kiln_cache_get(c, key, &data, &n, why, why_size);
    if (hit) free(data);
    return !hit && data == NULL && n == 0 && (why[0] == '\0') == why_empty;
}

static void test_hash(void)
{
    CHECK(kiln_hash64("", 0, KILN_HASH64_SEED) == KILN_HASH64_SEED);
    CHECK(kiln_hash64(NULL, 0, 42) == 42);
    CHECK(kiln_hash64("a", 1, KILN_HASH64_SEED) == 0xaf63dc4c8601ec8cull); /* FNV-1a 64 test vector */
    CHECK(kiln_hash64("foobar", 6, KILN_HASH64_SEED) == 0x85944171f73967e8ull);
    /* chaining equals one call over the concatenation */
    CHECK(kiln_hash64("bar", 3, kiln_hash64("foo", 3, KILN_HASH64_SEED)) == kiln_hash64("foobar", 6, KILN_HASH64_SEED));
    CHECK(kiln_hash64("foobar", 6, KILN_HASH64_SEED) != kiln_hash64("foobaz", 6, KILN_HASH64_SEED));
}

static void test_round_trip(void)
{
    char dir[PATH_MAX], why[256];
    fresh_dir(dir, sizeof dir, "rt");
    kiln_cache *c = kiln_cache_open(dir, 64 << 20, why, sizeof why);
    CHECK(c != NULL && why[0] == '\0');
    if (!c) return;
    CHECK(kiln_cache_max_bytes(c) == 64 << 20);
    char real[PATH_MAX];
    CHECK(realpath(dir, real) && !strcmp(kiln_cache_dir(c), real));
    struct stat st;
    CHECK(stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);

    const size_t sizes[] = {0, 1, 4097, (size_t)1 << 20};
    for (int round = 0; round < 2; round++) { /* the second round replaces every entry */
        for (int i = 0; i < 4; i++) {
            size_t n = sizes[i];
            unsigned char *want = malloc(n + 1);
            fill(want, n, 1000 * (uint64_t)round + (uint64_t)i + 1);
            char key[32];
            snprintf(key, sizeof key, "rt-%zu", n);
            CHECK(put_ok(c, key, n ? want : NULL, n));
            void *got = NULL;
            size_t got_n = 99;
            strcpy(why, "x");
            CHECK(kiln_cache_get(c, key, &got, &got_n, why, sizeof why));
            CHECK(got != NULL && got_n == n && why[0] == '\0');
            if (got && got_n == n) CHECK(memcmp(got, want, n) == 0);
            free(got);
            char name[40];
            snprintf(name, sizeof name, "%s.bin", key);
            CHECK(file_size(dir, name) == (off_t)(HEADER + strlen(key) + n));
            free(want);
        }
    }
    int bins, tmps;
    int64_t bytes;
    count_files(dir, &bins, &bytes, &tmps);
    CHECK(bins == 4 && tmps == 0);

    /* a second handle on the folder (another process's view) reads the same entries */
    kiln_cache *c2 = kiln_cache_open(dir, 0, why, sizeof why);
    CHECK(c2 != NULL);
    void *got = NULL;
    size_t got_n = 0;
    CHECK(c2 && kiln_cache_get(c2, "rt-4097", &got, &got_n, why, sizeof why) && got_n == 4097);
    free(got);
    kiln_cache_free(c2);

    /* an absent key is a miss with an empty why */
    strcpy(why, "x");
    CHECK(miss(c, "absent", true, why, sizeof why));
    CHECK(miss(c, "rt-4098", true, why, sizeof why));

    /* invalid keys: a miss and a refused put, each with a reason, and no file made */
    char long_key[201], k120[121];
    memset(long_key, 'a', 200), long_key[200] = '\0';
    memset(k120, 'b', 120), k120[120] = '\0';
    const char *bad[] = {"../x", "", ".hidden", "a/b", long_key, "a b", "a\\b", "x\n", "..", ".tmp-1", "k\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        strcpy(why, "");
        CHECK(miss(c, bad[i], false, why, sizeof why));
        strcpy(why, "");
        CHECK(!kiln_cache_put(c, bad[i], "z", 1, why, sizeof why) && why[0] != '\0');
    }
    strcpy(why, "");
    CHECK(miss(c, NULL, false, why, sizeof why));
    count_files(dir, &bins, &bytes, &tmps);
    CHECK(bins == 4 && tmps == 0);
    CHECK(!exists(g_root, "x.bin") && !exists(dir, ".hidden.bin") && !exists(dir, "a"));
    /* the longest key and every allowed character */
    CHECK(put_ok(c, k120, "long", 4));
    CHECK(put_ok(c, "Az09._-", "chars", 5));
    k120[0] = 'c';
    CHECK(miss(c, k120, true, why, sizeof why));
    CHECK(!kiln_cache_get(c, "rt-1", NULL, &got_n, why, sizeof why) && why[0] != '\0');

    /* a NULL cache is a miss and a refused put; freeing NULL is a no-op */
    CHECK(miss(NULL, "rt-1", false, why, sizeof why));
    CHECK(!kiln_cache_put(NULL, "rt-1", "z", 1, why, sizeof why) && why[0] != '\0');
    CHECK(!kiln_cache_put(c, "nodata", NULL, 5, why, sizeof why) && why[0] != '\0');
    kiln_cache_free(NULL);
    /* why may be NULL with why_size 0 */
    CHECK(!kiln_cache_get(c, "absent", &got, &got_n, NULL, 0));
    CHECK(kiln_cache_put(c, "nowhy", "abc", 3, NULL, 0));
    kiln_cache_free(c);
}

static void test_corrupt(void)
{
    char dir[PATH_MAX], why[256];
    fresh_dir(dir, sizeof dir, "corrupt");
    kiln_cache *c = kiln_cache_open(dir, 1 << 20, why, sizeof why);
    CHECK(c != NULL);
    if (!c) return;
    unsigned char payload[5000];
    fill(payload, sizeof payload, 7);
    const unsigned char flip = 0x5a;
    const off_t entry = HEADER + 4 + sizeof payload; /* file size of a 4-character key */

    /* a changed byte in the payload, the header, the stored key, or trailing bytes: a miss, the file removed */
    const off_t at[] = {entry - 1, HEADER + 4 + 2500, HEADER + 4, 0, 8, 12, 16, 24, 32, HEADER + 1, entry};
    for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
        CHECK(put_ok(c, "cork", payload, sizeof payload));
        unsigned char b = 0;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/cork.bin", dir);
        int fd = open(p, O_RDONLY);
        CHECK(fd >= 0 && (at[i] == entry || pread(fd, &b, 1, at[i]) == 1));
        if (fd >= 0) close(fd);
        b = at[i] == entry ? 0 : b ^ flip;
        patch(dir, "cork.bin", at[i], &b, 1); /* at `entry`: one byte appended */
        strcpy(why, "");
        CHECK(miss(c, "cork", false, why, sizeof why));
        CHECK(strstr(why, "corrupt") != NULL);
        CHECK(!exists(dir, "cork.bin"));
        CHECK(miss(c, "cork", true, why, sizeof why)); /* now plainly absent */
    }

    /* truncated: in the payload, in the key, in the header, to nothing */
    const off_t keep[] = {entry - 1, HEADER + 4 + 1, HEADER + 2, HEADER - 1, 3, 0};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) {
        CHECK(put_ok(c, "trun", payload, sizeof payload));
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/trun.bin", dir);
        CHECK(truncate(p, keep[i]) == 0);
        strcpy(why, "");
        CHECK(miss(c, "trun", false, why, sizeof why));
        CHECK(!exists(dir, "trun.bin"));
    }

    /* hostile lengths: a payload length of 2^62, or one past the file, is refused before any
     * allocation; a key length beyond the file, too */
    const uint64_t hostile[] = {(uint64_t)1 << 62, sizeof payload + 1, UINT64_MAX};
    for (size_t i = 0; i < 3; i++) {
        CHECK(put_ok(c, "host", payload, sizeof payload));
        unsigned char le[8];
        for (int j = 0; j < 8; j++) le[j] = (unsigned char)(hostile[i] >> (8 * j));
        patch(dir, "host.bin", 16, le, 8);
        strcpy(why, "");
        CHECK(miss(c, "host", false, why, sizeof why));
        CHECK(!exists(dir, "host.bin"));
    }
    CHECK(put_ok(c, "host", payload, sizeof payload));
    patch(dir, "host.bin", 12, (unsigned char[4]){0xff, 0xff, 0xff, 0x7f}, 4);
    CHECK(miss(c, "host", false, why, sizeof why) && !exists(dir, "host.bin"));

    /* the file of another key under this key's name: the same length of key (caught by the key's
     * hash and bytes) and another length */
    CHECK(put_ok(c, "keyA", "payload of A", 12));
    CHECK(put_ok(c, "keyB", "payload of B", 12));
    CHECK(put_ok(c, "key-long", "payload of L", 12));
    char a[PATH_MAX], b[PATH_MAX];
    snprintf(a, sizeof a, "%s/keyA.bin", dir);
    snprintf(b, sizeof b, "%s/keyB.bin", dir);
    CHECK(rename(a, b) == 0);
    strcpy(why, "");
    CHECK(miss(c, "keyB", false, why, sizeof why));
    CHECK(strstr(why, "another key") != NULL);
    CHECK(!exists(dir, "keyB.bin"));
    snprintf(a, sizeof a, "%s/key-long.bin", dir);
    CHECK(rename(a, b) == 0);
    CHECK(miss(c, "keyB", false, why, sizeof why) && !exists(dir, "keyB.bin"));

    /* a valid entry larger than this handle's bound (written by a process with a larger one):
     * a miss with a reason, the file kept */
    kiln_cache *small = kiln_cache_open(dir, 1000, why, sizeof why);
    CHECK(small != NULL);
    CHECK(put_ok(c, "big", payload, sizeof payload));
    strcpy(why, "");
    CHECK(small && miss(small, "big", false, why, sizeof why));
    CHECK(exists(dir, "big.bin"));
    kiln_cache_free(small);

    /* a folder in an entry's place: a miss with a reason, left alone */
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/odd.bin", dir);
    CHECK(mkdir(p, 0700) == 0);
    strcpy(why, "");
    CHECK(miss(c, "odd", false, why, sizeof why));
    CHECK(exists(dir, "odd.bin"));
    kiln_cache_free(c);
}

/* the folder from the environment; restores the variables after */
static void test_env(void)
{
    const char *names[] = {"KILN_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "KILN_CACHE_MAX_MB"};
    char *saved[4];
    for (int i = 0; i < 4; i++) {
        const char *v = getenv(names[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(names[i]);
    }
    char why[256], p[PATH_MAX], want[PATH_MAX];
    kiln_cache *c;

    /* nothing set: no cache, with a reason */
    strcpy(why, "");
    CHECK(kiln_cache_open(NULL, 0, why, sizeof why) == NULL && why[0] != '\0');
    CHECK(kiln_cache_open(NULL, 0, NULL, 0) == NULL);
    /* a relative XDG_CACHE_HOME is ignored, as the XDG spec asks */
    setenv("XDG_CACHE_HOME", "relative/cache", 1);
    strcpy(why, "");
    CHECK(kiln_cache_open(NULL, 0, why, sizeof why) == NULL && why[0] != '\0');

    /* HOME: $HOME/.cache/kiln, made with mkdir -p */
    setenv("HOME", fresh_dir(p, sizeof p, "home"), 1);
    c = kiln_cache_open(NULL, 0, why, sizeof why);
    CHECK(c != NULL);
    snprintf(want, sizeof want, "%s/home/.cache/kiln", g_root);
    char real[PATH_MAX];
    CHECK(c && realpath(want, real) && !strcmp(kiln_cache_dir(c), real));
    CHECK(c && kiln_cache_max_bytes(c) == KILN_CACHE_DEFAULT_MAX_BYTES);
    kiln_cache_free(c);

    /* XDG_CACHE_HOME before HOME */
    setenv("XDG_CACHE_HOME", fresh_dir(p, sizeof p, "xdg"), 1);
    c = kiln_cache_open(NULL, 0, why, sizeof why);
    snprintf(want, sizeof want, "%s/xdg/kiln", g_root);
    CHECK(c && realpath(want, real) && !strcmp(kiln_cache_dir(c), real));
    kiln_cache_free(c);

    /* KILN_CACHE_DIR before both, and a trailing '/' */
    snprintf(want, sizeof want, "%s/a/b/", fresh_dir(p, sizeof p, "envdir"));
    setenv("KILN_CACHE_DIR", want, 1);
    c = kiln_cache_open(NULL, 0, why, sizeof why);
    CHECK(c && realpath(want, real) && !strcmp(kiln_cache_dir(c), real));
    CHECK(c && put_ok(c, "k", "v", 1));
    kiln_cache_free(c);
    /* a `dir` argument before everything */
    c = kiln_cache_open(fresh_dir(p, sizeof p, "arg"), 0, why, sizeof why);
    CHECK(c && realpath(p, real) && !strcmp(kiln_cache_dir(c), real));
    kiln_cache_free(c);

    /* KILN_CACHE_MAX_MB: used when max_bytes <= 0 and valid; otherwise 256 MiB */
    const struct {
        const char *v;
        int64_t max_arg, want;
    } mb[] = {{"3", 0, 3 << 20},
              {"3", -5, 3 << 20},
              {"3", 12345, 12345},
              {"junk", 0, KILN_CACHE_DEFAULT_MAX_BYTES},
              {"0", 0, KILN_CACHE_DEFAULT_MAX_BYTES},
              {"-2", 0, KILN_CACHE_DEFAULT_MAX_BYTES},
              {"5x", 0, KILN_CACHE_DEFAULT_MAX_BYTES},
              {"99999999999999999999", 0, KILN_CACHE_DEFAULT_MAX_BYTES}};
    for (size_t i = 0; i < sizeof mb / sizeof *mb; i++) {
        setenv("KILN_CACHE_MAX_MB", mb[i].v, 1);
        c = kiln_cache_open(NULL, mb[i].max_arg, why, sizeof why);
        CHECK(c && kiln_cache_max_bytes(c) == mb[i].want);
        kiln_cache_free(c);
    }
    unsetenv("KILN_CACHE_MAX_MB");

    /* KILN_CACHE_DIR off or empty: disabled, even with HOME set */
    setenv("KILN_CACHE_DIR", "off", 1);
    strcpy(why, "");
    CHECK(kiln_cache_open(NULL, 0, why, sizeof why) == NULL && why[0] != '\0');
    setenv("KILN_CACHE_DIR", "", 1);
    strcpy(why, "");
    CHECK(kiln_cache_open(NULL, 0, why, sizeof why) == NULL && why[0] != '\0');
    /* ... but an explicit dir still opens */
    c = kiln_cache_open(fresh_dir(p, sizeof p, "arg2"), 0, why, sizeof why);
    CHECK(c != NULL);
    kiln_cache_free(c);

    /* not a writable folder (tests may run as root, so: under a regular file, and a regular file) */
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s/plainfile", g_root);
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    snprintf(p, sizeof p, "%s/sub", file);
    strcpy(why, "");
    CHECK(kiln_cache_open(p, 0, why, sizeof why) == NULL && why[0] != '\0');
    snprintf(p, sizeof p, "%s/sub/deeper", file);
    strcpy(why, "");
    CHECK(kiln_cache_open(p, 0, why, sizeof why) == NULL && why[0] != '\0');
    strcpy(why, "");
    CHECK(kiln_cache_open(file, 0, why, sizeof why) == NULL && why[0] != '\0');
    setenv("KILN_CACHE_DIR", p, 1);
    strcpy(why, "");
    CHECK(kiln_cache_open(NULL, 0, why, sizeof why) == NULL && why[0] != '\0');
    strcpy(why, "");
    CHECK(kiln_cache_open("", 0, why, sizeof why) == NULL && why[0] != '\0');
    /* a why of one byte holds only the terminator */
    why[0] = 'x';
    CHECK(kiln_cache_open(file, 0, why, 1) == NULL && why[0] == '\0');

    for (int i = 0; i < 4; i++) {
        if (saved[i]) setenv(names[i], saved[i], 1);
        else unsetenv(names[i]);
        free(saved[i]);
    }
}

static void test_evict(void)
{
    char dir[PATH_MAX], why[256];
    fresh_dir(dir, sizeof dir, "evict");
    enum { PAYLOAD = 2000, ENTRY = HEADER + 2 + PAYLOAD, BOUND = 5 * ENTRY + 100 };
    kiln_cache *c = kiln_cache_open(dir, BOUND, why, sizeof why);
    CHECK(c != NULL);
    if (!c) return;
    unsigned char payload[PAYLOAD];
    fill(payload, sizeof payload, 3);

    /* e0..e4 fit (5 entries); their mtimes set 100..60 s ago, e0 the oldest, so the order does
     * not hang on the file system's clock granularity */
    char key[8], name[16];
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "e%d", i);
        CHECK(put_ok(c, key, payload, sizeof payload));
        snprintf(name, sizeof name, "%s.bin", key);
        set_age(dir, name, 100 - 10 * i);
    }
    int bins, tmps;
    int64_t bytes;
    count_files(dir, &bins, &bytes, &tmps);
    CHECK(bins == 5 && bytes == 5 * ENTRY);

    /* files that are not entries neither count nor go */
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    int fd = open(p, O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 100000) == 0);
    if (fd >= 0) close(fd);
    /* a temporary left by a writer that died two hours ago goes, a fresh one (a writer at work) stays */
    const char *tmp_names[] = {".tmp-stale", ".tmp-fresh"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, tmp_names[i]);
        fd = open(p, O_WRONLY | O_CREAT, 0600);
        CHECK(fd >= 0);
        if (fd >= 0) close(fd);
    }
    set_age(dir, ".tmp-stale", 7200);
    set_age(dir, ".tmp-fresh", 60);

    /* a get of e0 makes it the most recent: the next put evicts e1, the oldest then */
    void *got = NULL;
    size_t got_n = 0;
    CHECK(kiln_cache_get(c, "e0", &got, &got_n, why, sizeof why) && got_n == PAYLOAD);
    free(got);
    CHECK(put_ok(c, "e5", payload, sizeof payload));
    count_files(dir, &bins, &bytes, &tmps);
    CHECK(bytes <= BOUND && bins == 5);
    CHECK(exists(dir, "e0.bin") && exists(dir, "e5.bin") && !exists(dir, "e1.bin"));
    CHECK(exists(dir, "e2.bin") && exists(dir, "e3.bin") && exists(dir, "e4.bin"));
    CHECK(exists(dir, "notes.txt") && !exists(dir, ".tmp-stale") && exists(dir, ".tmp-fresh"));

    /* an entry of three slots evicts the three oldest (e2, e3, e4), keeps e0 and e5 */
    unsigned char big[3 * ENTRY - HEADER - 3];
    fill(big, sizeof big, 4);
    CHECK(put_ok(c, "big", big, sizeof big));
    count_files(dir, &bins, &bytes, &tmps);
    CHECK(bytes <= BOUND && bins == 3);
    CHECK(exists(dir, "big.bin") && exists(dir, "e0.bin") && exists(dir, "e5.bin"));

    /* an entry alone over the bound is not kept, and nothing else goes for it */
    unsigned char *huge = calloc(1, BOUND);
    strcpy(why, "");
    CHECK(huge && !kiln_cache_put(c, "huge", huge, BOUND, why, sizeof why) && why[0] != '\0');
    CHECK(!exists(dir, "huge.bin") && exists(dir, "big.bin"));
    /* one of exactly the bound is kept, alone */
    CHECK(huge && put_ok(c, "exact", huge, BOUND - HEADER - 5));
    count_files(dir, &bins, &bytes, &tmps);
    CHECK(bins == 1 && bytes == BOUND && exists(dir, "exact.bin"));
    free(huge);

    /* a stream of puts: the bound holds after each, the latest put always stays */
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof key, "s%d", i);
        size_t n = 100 + (size_t)(i * 397) % (2 * PAYLOAD);
        CHECK(put_ok(c, key, big, n));
        snprintf(name, sizeof name, "%s.bin", key);
        count_files(dir, &bins, &bytes, &tmps);
        CHECK(bytes <= BOUND && exists(dir, name));
    }
    kiln_cache_free(c);
}

/* ---- several threads in two processes ---- */

typedef struct worker {
    kiln_cache *c;
    atomic_int *writers_left; /* readers go on until it is 0 */
    int id;
    bool reader;
    int hits, bad; /* hits seen; puts refused, or hits or misses not as they should be */
} worker;

/* payload of (key id, version): its length and bytes follow from both, and its first 8 bytes
 * name them, so a reader can check any hit whole */
static size_t make_payload(unsigned char *buf, uint64_t tag)
{
    uint64_t s = tag * 0x9e3779b97f4a7c15ull | 1;
    size_t n = 8 + (size_t)(rnd(&s) % 30000);
    memcpy(buf, &tag, 8);
    fill(buf + 8, n - 8, tag);
    return n;
}

static bool payload_ok(const unsigned char *p, size_t n, uint64_t key_id)
{
    static _Thread_local unsigned char want[8 + 30000];
    if (n < 8) return false;
    uint64_t tag;
    memcpy(&tag, p, 8);
    if (tag >> 32 != key_id) return false;
    return make_payload(want, tag) == n && !memcmp(want, p, n);
}

/* keys 0-3 shared by every writer; 100 + 10 * writer + (0..9) each writer's own */
static void key_of(uint64_t id, char *key, size_t n)
{
    if (id < 4) snprintf(key, n, "shared-%d", (int)id);
    else snprintf(key, n, "own-%d", (int)id);
}

static void *work(void *arg)
{
    worker *w = arg;
    static _Thread_local unsigned char buf[8 + 30000];
    uint64_t s = 0x1234567ull + (uint64_t)w->id * 7919 + (uint64_t)getpid() * 104729;
    char key[32], why[256];
    for (int i = 0; w->reader ? i < ROUNDS || atomic_load(w->writers_left) > 0 : i < ROUNDS; i++) {
        uint64_t r = rnd(&s);
        uint64_t id =
            r % 2 ? r / 2 % 4 : 100 + 10 * (uint64_t)(w->reader ? r / 2 % THREADS : (uint64_t)w->id) + r / 8 % 10;
        key_of(id, key, sizeof key);
        if (w->reader) {
            void *data = NULL;
            size_t n = 0;
            strcpy(why, "x");
            if (kiln_cache_get(w->c, key, &data, &n, why, sizeof why)) {
                w->hits++;
                if (!payload_ok(data, n, id) || why[0]) w->bad++;
                free(data);
            } else if (why[0]) { /* a miss is only ever an absent (or evicted) entry, never a torn one */
                fprintf(stderr, "get '%s': %s\n", key, why);
                w->bad++;
            }
        } else {
            size_t n = make_payload(buf, id << 32 | (r & 0xffffffffull));
            if (!put_ok(w->c, key, buf, n)) w->bad++;
        }
    }
    if (!w->reader) atomic_fetch_sub(w->writers_left, 1);
    return NULL;
}

/* THREADS writers and THREADS readers on one handle; the failures */
static int run_workers(const char *dir)
{
    char why[256];
    /* a bound of about 40 average entries, so evictions run alongside the rest */
    kiln_cache *c = kiln_cache_open(dir, 600000, why, sizeof why);
    if (!c) return fprintf(stderr, "open: %s\n", why), 1;
    worker w[2 * THREADS];
    pthread_t t[2 * THREADS];
    int bad = 0, hits = 0;
    atomic_int writers_left = THREADS;
    for (int i = 0; i < 2 * THREADS; i++) {
        w[i] = (worker){.c = c, .writers_left = &writers_left, .id = i % THREADS, .reader = i >= THREADS};
        if (pthread_create(&t[i], NULL, work, &w[i])) return kiln_cache_free(c), 1;
    }
    for (int i = 0; i < 2 * THREADS; i++) {
        pthread_join(t[i], NULL);
        bad += w[i].bad;
        hits += w[i].hits;
    }
    kiln_cache_free(c);
    if (hits == 0) bad++; /* the readers must have seen something */
    return bad;
}

static void test_concurrent(void)
{
    char dir[PATH_MAX];
    fresh_dir(dir, sizeof dir, "conc");
    CHECK(mkdir(dir, 0700) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(run_workers(dir) ? 1 : 0);
    CHECK(run_workers(dir) == 0);
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* after: no temporaries left, the bound holds, and every entry left reads back intact */
    int bins, tmps;
    int64_t bytes;
    count_files(dir, &bins, &bytes, &tmps);
    CHECK(tmps == 0 && bins > 0 && bytes <= 600000);
    char why[256];
    kiln_cache *c = kiln_cache_open(dir, 600000, why, sizeof why);
    CHECK(c != NULL);
    int intact = 0;
    for (uint64_t id = 0; c && id < 100 + 10 * THREADS; id = id == 3 ? 100 : id + 1) {
        char key[32];
        key_of(id, key, sizeof key);
        void *data = NULL;
        size_t n = 0;
        strcpy(why, "x");
        if (kiln_cache_get(c, key, &data, &n, why, sizeof why)) {
            CHECK(payload_ok(data, n, id));
            intact++;
        } else {
            CHECK(why[0] == '\0');
        }
        free(data);
    }
    CHECK(intact == bins);
    kiln_cache_free(c);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(g_root, sizeof g_root, "%s/kiln-test-cache-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_root)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    test_hash();
    test_round_trip();
    test_corrupt();
    test_env();
    test_evict();
    test_concurrent();
    remove_tree(g_root);
    struct stat st;
    CHECK(stat(g_root, &st) != 0); /* cleaned up */
    return unit_report("test_cache");
}
