/* test_cache.c - the on-disk cache: round trip, default location, disabled mode, corrupt and
 * truncated entries, keys that look like paths, two processes writing one key at once. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cache.h"
#include "unit.h"

static char tmpdir[256];

static kiln_cache *open_at(const char *dir)
{
    kiln_cache *c = NULL;
    kiln_err err = {0};
    CHECK(kiln_cache_open(dir, &c, &err) == KILN_OK);
    return c;
}

/* The one entry file in dir (the cache keeps no other files); false if not exactly one. */
static bool only_entry(const char *dir, char *path, size_t size)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, size, "%s/%s", dir, e->d_name);
            n++;
        }
    if (d) closedir(d);
    return n == 1;
}

static void test_round_trip(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/a/b/c", tmpdir);  /* created with its parents */
    kiln_cache *c = open_at(dir);
    CHECK(kiln_cache_warning(c) == NULL);
    CHECK(!strcmp(kiln_cache_dir(c), dir));
    void *p;
    size_t n;
    CHECK(!kiln_cache_get(c, "k", &p, &n) && p == NULL && n == 0);
    CHECK(kiln_cache_put(c, "k", "hello", 5) == KILN_OK);
    CHECK(kiln_cache_get(c, "k", &p, &n) && n == 5 && !memcmp(p, "hello", 5));
    free(p);
    CHECK(kiln_cache_put(c, "k", "bye", 3) == KILN_OK);  /* replaced */
    CHECK(kiln_cache_get(c, "k", &p, &n) && n == 3 && !memcmp(p, "bye", 3));
    free(p);
    CHECK(kiln_cache_put(c, "empty", NULL, 0) == KILN_OK);
    CHECK(kiln_cache_get(c, "empty", &p, &n) && p != NULL && n == 0);
    free(p);
    /* keys never reach a path: this one stays inside the folder */
    CHECK(kiln_cache_put(c, "../../../../escape/\n/x", "z", 1) == KILN_OK);
    CHECK(kiln_cache_get(c, "../../../../escape/\n/x", &p, &n) && n == 1);
    free(p);
    char path[600];
    snprintf(path, sizeof path, "%s/escape", tmpdir);
    struct stat st;
    CHECK(stat(path, &st) != 0);
    /* a big payload */
    size_t big = 3 << 20;
    unsigned char *b = malloc(big);
    for (size_t i = 0; i < big; i++) b[i] = (unsigned char)(i * 31);
    CHECK(kiln_cache_put(c, "big", b, big) == KILN_OK);
    CHECK(kiln_cache_get(c, "big", &p, &n) && n == big && !memcmp(p, b, big));
    free(p);
    free(b);
    kiln_cache_close(c);
    /* another handle on the same folder sees the entries */
    c = open_at(dir);
    CHECK(kiln_cache_get(c, "k", &p, &n) && n == 3);
    free(p);
    kiln_cache_close(c);
    kiln_cache_close(NULL);
}

static void test_default_location(void)
{
    char want[600], env[300];
    snprintf(env, sizeof env, "%s/env", tmpdir);
    setenv("KILN_CACHE_DIR", env, 1);
    kiln_cache *c = open_at(NULL);
    CHECK(!strcmp(kiln_cache_dir(c), env) && kiln_cache_warning(c) == NULL);
    kiln_cache_close(c);

    unsetenv("KILN_CACHE_DIR");
    snprintf(env, sizeof env, "%s/xdg", tmpdir);
    setenv("XDG_CACHE_HOME", env, 1);
    c = open_at(NULL);
    snprintf(want, sizeof want, "%s/kiln", env);
    CHECK(!strcmp(kiln_cache_dir(c), want) && kiln_cache_warning(c) == NULL);
    kiln_cache_close(c);

    setenv("XDG_CACHE_HOME", "relative/ignored", 1);  /* XDG says: ignore relative paths */
    snprintf(env, sizeof env, "%s/home", tmpdir);
    setenv("HOME", env, 1);
    c = open_at(NULL);
    snprintf(want, sizeof want, "%s/.cache/kiln", env);
    CHECK(!strcmp(kiln_cache_dir(c), want) && kiln_cache_warning(c) == NULL);
    kiln_cache_close(c);

    unsetenv("XDG_CACHE_HOME");
    c = open_at(NULL);
    CHECK(!strcmp(kiln_cache_dir(c), want));
    kiln_cache_close(c);

    /* an explicit folder wins over the environment */
    setenv("KILN_CACHE_DIR", "/nonexistent-should-not-be-used", 1);
    snprintf(env, sizeof env, "%s/explicit", tmpdir);
    c = open_at(env);
    CHECK(!strcmp(kiln_cache_dir(c), env));
    kiln_cache_close(c);

    unsetenv("KILN_CACHE_DIR");
    unsetenv("HOME");
    c = open_at(NULL);
    CHECK(kiln_cache_warning(c) != NULL);
    kiln_cache_close(c);
}

static void test_unwritable(void)
{
    char file[300], dir[400];
    snprintf(file, sizeof file, "%s/plainfile", tmpdir);
    FILE *f = fopen(file, "w");
    fputs("x", f);
    fclose(f);
    snprintf(dir, sizeof dir, "%s/sub/cache", file);  /* under a regular file */
    kiln_cache *c = open_at(dir);
    CHECK(c != NULL);
    const char *w = kiln_cache_warning(c);
    CHECK(w != NULL && strstr(w, "plainfile") != NULL);
    CHECK(kiln_cache_put(c, "k", "v", 1) == KILN_OK);  /* does nothing */
    void *p;
    size_t n;
    CHECK(!kiln_cache_get(c, "k", &p, &n) && p == NULL);
    kiln_cache_close(c);

    c = open_at(file);  /* the folder is a file */
    CHECK(kiln_cache_warning(c) != NULL);
    kiln_cache_close(c);

    if (geteuid() != 0) {  /* root writes anywhere */
        snprintf(dir, sizeof dir, "%s/readonly", tmpdir);
        mkdir(dir, 0555);
        c = open_at(dir);
        CHECK(kiln_cache_warning(c) != NULL);
        kiln_cache_close(c);
    }
}

static void test_corrupt(void)
{
    char dir[300], path[600];
    snprintf(dir, sizeof dir, "%s/corrupt", tmpdir);
    kiln_cache *c = open_at(dir);
    CHECK(kiln_cache_put(c, "key", "0123456789", 10) == KILN_OK);
    CHECK(only_entry(dir, path, sizeof path));
    void *p;
    size_t n;
    struct stat st;
    stat(path, &st);
    long size = (long)st.st_size;
    /* every single-byte flip and every truncation is a miss; the next put replaces it */
    for (long i = 0; i < size; i++) {
        FILE *f = fopen(path, "r+b");
        fseek(f, i, SEEK_SET);
        int b = fgetc(f);
        fseek(f, i, SEEK_SET);
        fputc(b ^ 0x40, f);
        fclose(f);
        CHECK(!kiln_cache_get(c, "key", &p, &n) && p == NULL);
        CHECK(kiln_cache_put(c, "key", "0123456789", 10) == KILN_OK);
        CHECK(kiln_cache_get(c, "key", &p, &n) && n == 10 && !memcmp(p, "0123456789", 10));
        free(p);
    }
    for (long len = 0; len < size; len++) {
        CHECK(truncate(path, len) == 0);
        CHECK(!kiln_cache_get(c, "key", &p, &n));
        CHECK(kiln_cache_put(c, "key", "0123456789", 10) == KILN_OK);
    }
    /* trailing garbage */
    FILE *f = fopen(path, "ab");
    fputs("junk", f);
    fclose(f);
    CHECK(!kiln_cache_get(c, "key", &p, &n));
    CHECK(kiln_cache_put(c, "key", "0123456789", 10) == KILN_OK);
    CHECK(kiln_cache_get(c, "key", &p, &n) && n == 10);
    free(p);
    /* another key's entry copied under this key's name (a hash collision) is a miss */
    CHECK(kiln_cache_put(c, "other", "0123456789", 10) == KILN_OK);
    CHECK(kiln_cache_get(c, "key", &p, &n));
    free(p);
    kiln_cache_close(c);
}

/* Two processes put the same key 200 times each (payloads of different sizes and contents)
 * while both read it back: every hit is one complete payload of either writer. */
static void test_concurrent(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/concurrent", tmpdir);
    kiln_cache *c = open_at(dir);
    kiln_cache_close(c);
    pid_t pids[2];
    for (int w = 0; w < 2; w++) {
        pids[w] = fork();
        if (pids[w] == 0) {
            kiln_cache *cc = open_at(dir);
            size_t len = w ? 70000 : 1000;
            unsigned char *buf = malloc(len);
            int bad = 0;
            for (int i = 0; i < 200; i++) {
                memset(buf, 'a' + w, len);
                if (kiln_cache_put(cc, "shared", buf, len) != KILN_OK) bad++;
                void *p;
                size_t n;
                if (kiln_cache_get(cc, "shared", &p, &n)) {
                    const unsigned char *q = p;
                    if (!(n == 1000 || n == 70000)) bad++;
                    for (size_t k = 0; k < n; k++)
                        if (q[k] != (n == 1000 ? 'a' : 'b')) {
                            bad++;
                            break;
                        }
                    free(p);
                } else {
                    bad++;  /* once written, the entry never disappears */
                }
            }
            free(buf);
            kiln_cache_close(cc);
            _exit(bad ? 1 : 0);
        }
    }
    for (int w = 0; w < 2; w++) {
        int status = 0;
        waitpid(pids[w], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    char path[600];
    CHECK(only_entry(dir, path, sizeof path));  /* no temporary files left behind */
}

static void rm_rf(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s' 2>/dev/null; rm -rf '%s'", path, path);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", path);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_cache_test_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    test_round_trip();
    test_default_location();
    test_unwritable();
    test_corrupt();
    test_concurrent();
    rm_rf(tmpdir);
    return unit_report("test_cache");
}
