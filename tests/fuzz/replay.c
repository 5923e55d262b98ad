/* replay.c - runs the fuzz target over every file of the given folders (committed seeds and
 * regressions), so that every build replays them without libFuzzer. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
    size_t got = buf && len >= 0 ? fread(buf, 1, (size_t)len, f) : 0;
    fclose(f);
    if (!buf || (long)got != len) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(buf);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    int files = 0, failures = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        if (!d) {
            fprintf(stderr, "replay: cannot open folder %s\n", argv[a]);
            return 1;
        }
        char **names = NULL;
        size_t n = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            names = realloc(names, (n + 1) * sizeof *names);
            names[n++] = strdup(e->d_name);
        }
        closedir(d);
        if (n)
            qsort(names, n, sizeof *names, cmp_names);
        for (size_t i = 0; i < n; i++) {
            char path[4096];
            struct stat st;
            snprintf(path, sizeof path, "%s/%s", argv[a], names[i]);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                failures += replay_file(path);
                files++;
            }
            free(names[i]);
        }
        free(names);
    }
    printf("fuzz_replay: %d files replayed, %d unreadable\n", files, failures);
    return failures ? 1 : 0;
}
