/* runner.c - ONNX backend conformance runner: runs every test folder (model.onnx plus
 * test_data_set_*) through a kiln session and compares outputs with the expected ones within
 * ONNX's backend tolerances (rtol 1e-3, atol 1e-7, NaN equals NaN). Each test runs in a forked
 * child, so a crash fails that test only. Tests listed in the expected-failures file must fail;
 * a listed test that passes is an error too (the list only shrinks).
 *
 * With --provider cuda the sessions are created on the CUDA provider and the summary also
 * counts the tests that ran at least one node on the GPU (nodes_gpu in the session's stats);
 * --shard I/N runs only every N-th test starting at the I-th (0-based), so that
 * scripts/test_gpu.sh can run N runners side by side. --batch N runs up to N tests in one
 * child (a crash still fails only the test in flight; the next test gets a new child): a
 * child opening the GPU once instead of once per test saves most of a GPU run's time, at the
 * price of tests sharing a process (a leak found at exit cannot be pinned to one test).
 * --provider emu and emu-split run the device half of the executor on the CPU: sessions
 * created for the CUDA provider get the emulated device of tests/common/emu_device.h, which
 * takes every node it can (emu) or about half of them (emu-split, many host/device
 * boundaries), so partitioning and the copies between the sides are checked in CI.
 *
 * usage: conformance DATA_ROOT [--expected FILE] [--filter SUBSTR] [--no-fork] [-v]
 *                    [--provider cpu|cuda|emu|emu-split] [--shard I/N] [--batch N] */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emu_device.h"
#include "exec/test_hooks.h"
#include "kiln.h"
#include "testutil.h"

static const char *const folders[] = {"node", "simple", "pytorch-converted", "pytorch-operator"};

/* --provider: the provider every test session is created on */
static kiln_provider_kind provider = KILN_PROVIDER_CPU;

typedef struct expected {
    char **names;
    char **reasons;
    bool *chance; /* listed as `~name`: random output that may match by chance, so a pass is no news */
    int n;
    bool *seen;
} expected;

/* Reads the expected-failures file; an entry written `gpu:name` applies only where the sessions
 * run on a real GPU (gpu: --provider cuda, not the emulated device). */
static void load_expected(const char *path, bool gpu, expected *e)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open expected-failures file %s\n", path);
        exit(2);
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '#' || *p == '\n' || !*p) continue;
        char *end = p;
        while (*end && *end != ' ' && *end != '\t' && *end != '\n') end++;
        char *reason = end;
        while (*reason == ' ' || *reason == '\t') reason++;
        reason[strcspn(reason, "\n")] = '\0';
        *end = '\0';
        if (!strncmp(p, "gpu:", 4)) {
            if (!gpu) continue;
            p += 4;
        }
        e->names = realloc(e->names, (size_t)(e->n + 1) * sizeof *e->names);
        e->reasons = realloc(e->reasons, (size_t)(e->n + 1) * sizeof *e->reasons);
        e->chance = realloc(e->chance, (size_t)(e->n + 1) * sizeof *e->chance);
        e->chance[e->n] = *p == '~';
        if (*p == '~') p++;
        e->names[e->n] = strdup(p);
        e->reasons[e->n] = strdup(reason);
        e->n++;
    }
    fclose(f);
    e->seen = calloc((size_t)e->n + 1, 1);
}

static int find_expected(const expected *e, const char *name)
{
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->names[i], name)) return i;
    return -1;
}

static bool is_training(kiln_session *s)
{
    for (int i = 0; i < kiln_session_opset_count(s); i++) {
        const char *d;
        kiln_session_opset(s, i, &d, NULL);
        if (!strcmp(d, "ai.onnx.preview.training")) return true;
    }
    return false;
}

/* Result codes written by the child. */
enum { RES_PASS = 0, RES_FAIL = 1, RES_SKIP = 2 };

static int run_data_set(kiln_session *s, const char *dir, char *why, size_t why_size)
{
    int n_in = kiln_session_input_count(s), n_out = kiln_session_output_count(s);
    kiln_value **in = calloc((size_t)n_in + 1, sizeof *in), **out = calloc((size_t)n_out + 1, sizeof *out),
               **want = calloc((size_t)n_out + 1, sizeof *want);
    const char **in_names = calloc((size_t)n_in + 1, sizeof *in_names), **out_names = calloc((size_t)n_out + 1, sizeof *out_names);
    int res = RES_FAIL;
    int given = 0;
    for (int i = 0; i < n_in; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/input_%d.pb", dir, i);
        if (access(path, R_OK)) break; /* fewer inputs given: optional inputs left out */
        kiln_io_info info;
        kiln_session_input_info(s, i, &info);
        if (test_read_pb(path, info.kind, &in[i], why, why_size)) goto out;
        in_names[i] = info.name;
        given++;
    }
    for (int j = 0; j < n_out; j++) {
        kiln_io_info info;
        kiln_session_output_info(s, j, &info);
        out_names[j] = info.name;
        char path[4096];
        snprintf(path, sizeof path, "%s/output_%d.pb", dir, j);
        if (test_read_pb(path, info.kind, &want[j], why, why_size)) goto out;
    }
    if (kiln_session_run(s, given, in_names, (const kiln_value *const *)in, n_out, out_names, out)) {
        snprintf(why, why_size, "run failed: %s", kiln_last_error(s));
        goto out;
    }
    for (int j = 0; j < n_out; j++) {
        char msg[512];
        if (!test_values_close(out[j], want[j], 1e-3, 1e-7, msg, sizeof msg)) {
            snprintf(why, why_size, "output '%s': %s", out_names[j], msg);
            goto out;
        }
    }
    res = RES_PASS;
out:
    for (int i = 0; i < n_in; i++) kiln_value_free(in[i]);
    for (int j = 0; j < n_out; j++) {
        kiln_value_free(out[j]);
        kiln_value_free(want[j]);
    }
    free(in);
    free(out);
    free(want);
    free(in_names);
    free(out_names);
    return res;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* *on_gpu: whether the session placed at least one node on the GPU. */
static int run_test(const char *dir, bool *on_gpu, char *why, size_t why_size)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    kiln_session_options opt = kiln_session_options_default();
    opt.allow_unsupported = true;
    opt.provider = provider;
    *on_gpu = false;
    kiln_session *s = NULL;
    if (kiln_session_create(path, &opt, &s)) {
        snprintf(why, why_size, "load failed: %s", kiln_last_error(s));
        kiln_session_free(s);
        return RES_FAIL;
    }
    if (is_training(s)) {
        snprintf(why, why_size, "training operator (ai.onnx.preview.training)");
        kiln_session_free(s);
        return RES_SKIP;
    }
    for (int i = 0; i < kiln_session_node_count(s); i++) {
        const char *name, *domain, *op;
        bool ok;
        kiln_session_node(s, i, &name, &domain, &op, &ok);
        if (!ok) {
            snprintf(why, why_size, "unsupported operator %s%s%s", domain, *domain ? "." : "", op);
            kiln_session_free(s);
            return RES_FAIL;
        }
    }
    DIR *d = opendir(dir);
    char *sets[256];
    int n_sets = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n_sets < 256)
        if (!strncmp(e->d_name, "test_data_set_", 14)) sets[n_sets++] = strdup(e->d_name);
    if (d) closedir(d);
    if (n_sets) qsort(sets, (size_t)n_sets, sizeof *sets, cmp_str);
    int res = n_sets ? RES_PASS : RES_FAIL;
    if (!n_sets) snprintf(why, why_size, "no test data sets");
    for (int k = 0; k < n_sets; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, sets[k]);
        if (res == RES_PASS) {
            char w[1536];
            res = run_data_set(s, path, w, sizeof w);
            if (res != RES_PASS) snprintf(why, why_size, "%s: %s", sets[k], w);
        }
        free(sets[k]);
    }
    kiln_session_stats st;
    if (kiln_session_stats_get(s, &st) == KILN_OK) *on_gpu = st.nodes_gpu > 0;
    kiln_session_free(s);
    return res;
}

/* Runs one test in a child; a crash or a hang counts as a failure. The child writes
 * "RES GPU WHY": its result code, 1 if a node ran on the GPU, and the reason. */
static int run_isolated(const char *dir, bool fork_it, bool *on_gpu, char *why, size_t why_size)
{
    *on_gpu = false;
    if (!fork_it) return run_test(dir, on_gpu, why, why_size);
    int fds[2];
    if (pipe(fds)) return run_test(dir, on_gpu, why, why_size);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        alarm(120);
        char w[2048] = "";
        bool gpu = false;
        int r = run_test(dir, &gpu, w, sizeof w);
        char buf[2100];
        int len = snprintf(buf, sizeof buf, "%d %d %s", r, gpu ? 1 : 0, w);
        if (write(fds[1], buf, (size_t)len) < 0) _exit(3);
        /* exit, not _exit: sanitizer builds check for leaks at exit and fail the status */
        exit(0);
    }
    close(fds[1]);
    char buf[2100];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)r;
    buf[got] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) {
        snprintf(why, why_size, "crashed with signal %d%s", WTERMSIG(status),
                 WTERMSIG(status) == SIGALRM ? " (timeout)" : "");
        return RES_FAIL;
    }
    if (got < 3) {
        snprintf(why, why_size, "child exited with status %d and no result", WEXITSTATUS(status));
        return RES_FAIL;
    }
    int res = buf[0] - '0';
    *on_gpu = buf[2] == '1';
    snprintf(why, why_size, "%s", got > 4 ? buf + 4 : "");
    if (WIFEXITED(status) && WEXITSTATUS(status)) {
        snprintf(why, why_size, "exited with status %d after the test (a sanitizer found a leak or an error)",
                 WEXITSTATUS(status));
        return RES_FAIL;
    }
    return res;
}

/* --batch: a child that runs the tests whose folders it reads, one per line, from `to`, and
 * answers each with "RES GPU LEN\n" and LEN bytes of reason on `from`. */
typedef struct batch_child {
    pid_t pid; /* 0: none running */
    FILE *to, *from;
    int left; /* tests it may still take */
} batch_child;

static void batch_child_serve(FILE *in, FILE *out)
{
    /* testing hook of the runner itself: a child crashes on the test of this folder name */
    const char *crash = getenv("KILN_CONFORMANCE_TEST_CRASH");
    char dir[8192];
    while (fgets(dir, sizeof dir, in)) {
        dir[strcspn(dir, "\n")] = '\0';
        const char *name = strrchr(dir, '/');
        if (crash && *crash && !strcmp(name ? name + 1 : dir, crash)) raise(SIGKILL); /* sanitizers catch SIGSEGV */
        char w[2048] = "";
        bool gpu = false;
        alarm(120);
        int r = run_test(dir, &gpu, w, sizeof w);
        alarm(0);
        fprintf(out, "%d %d %zu\n%s", r, gpu ? 1 : 0, strlen(w), w);
        fflush(out);
    }
}

static void batch_child_stop(batch_child *c, int *status)
{
    if (!c->pid) return;
    fclose(c->to);
    fclose(c->from);
    waitpid(c->pid, status, 0);
    c->pid = 0;
}

static int run_batched(batch_child *c, int batch, const char *dir, bool *on_gpu, char *why, size_t why_size)
{
    *on_gpu = false;
    int status = 0;
    if (c->pid && c->left == 0) {
        batch_child_stop(c, &status);
        if (WIFEXITED(status) && WEXITSTATUS(status))
            fprintf(stderr, "conformance: a batch child exited with status %d (a sanitizer report?)\n",
                    WEXITSTATUS(status));
    }
    if (!c->pid) {
        int down[2], up[2];
        if (pipe(down) || pipe(up)) return run_isolated(dir, true, on_gpu, why, why_size);
        pid_t pid = fork();
        if (pid == 0) {
            close(down[1]);
            close(up[0]);
            FILE *in = fdopen(down[0], "r"), *out = fdopen(up[1], "w");
            if (in && out) batch_child_serve(in, out);
            exit(0); /* exit, not _exit: sanitizer builds check for leaks at exit */
        }
        close(down[0]);
        close(up[1]);
        c->pid = pid;
        c->to = fdopen(down[1], "w");
        c->from = fdopen(up[0], "r");
        c->left = batch;
    }
    c->left--;
    fprintf(c->to, "%s\n", dir);
    fflush(c->to);
    int res, gpu;
    size_t len;
    if (fscanf(c->from, "%d %d %zu", &res, &gpu, &len) == 3 && fgetc(c->from) == '\n') {
        size_t n = len < why_size - 1 ? len : why_size - 1;
        size_t got = fread(why, 1, n, c->from);
        why[got] = '\0';
        for (size_t i = n; i < len; i++) fgetc(c->from);
        *on_gpu = gpu == 1;
        return res;
    }
    /* no answer: the child died on this test */
    batch_child_stop(c, &status);
    if (WIFSIGNALED(status))
        snprintf(why, why_size, "crashed with signal %d%s", WTERMSIG(status),
                 WTERMSIG(status) == SIGALRM ? " (timeout)" : "");
    else
        snprintf(why, why_size, "child exited with status %d and no result", WEXITSTATUS(status));
    return RES_FAIL;
}

int main(int argc, char **argv)
{
    const char *root = NULL, *expected_path = NULL, *filter = NULL;
    bool fork_it = true, verbose = false, usage = false, emu = false;
    int shard = 0, n_shards = 1, batch = 0;
    batch_child child = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--provider") && i + 1 < argc) {
            i++;
            if (!strcmp(argv[i], "cuda")) provider = KILN_PROVIDER_CUDA;
            else if (!strcmp(argv[i], "cpu")) provider = KILN_PROVIDER_CPU;
            else if (!strcmp(argv[i], "emu") || !strcmp(argv[i], "emu-split")) {
                provider = KILN_PROVIDER_CUDA, emu = true;
                emu_device_set_mode(argv[i][3] ? EMU_DEVICE_SPLIT : EMU_DEVICE_ALL);
                kiln_test_device_provider(&emu_device);
            }
            else usage = true;
        } else if (!strcmp(argv[i], "--shard") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d/%d", &shard, &n_shards) != 2 || n_shards < 1 || shard < 0 || shard >= n_shards)
                usage = true;
        } else if (!strcmp(argv[i], "--expected") && i + 1 < argc) expected_path = argv[++i];
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--no-fork")) fork_it = false;
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
            batch = atoi(argv[++i]);
            if (batch < 1) usage = true;
        }
        else if (!strcmp(argv[i], "-v")) verbose = true;
        else if (argv[i][0] != '-' && !root) root = argv[i];
        else usage = true;
    }
    if (!root || usage) {
        fprintf(stderr, "usage: conformance DATA_ROOT [--expected FILE] [--filter SUBSTR] [--no-fork] [-v]\n"
                        "                   [--provider cpu|cuda|emu|emu-split] [--shard I/N] [--batch N]\n");
        return 2;
    }
    expected ex = {0};
    if (expected_path) load_expected(expected_path, provider == KILN_PROVIDER_CUDA && !emu, &ex);
    int passed = 0, failed = 0, skipped = 0, unexpected = 0, fixed = 0, total = 0;
    int on_gpu_ran = 0, on_gpu_passed = 0, seq = 0; /* seq: index among the tests the filter keeps */
    for (size_t f = 0; f < sizeof folders / sizeof folders[0]; f++) {
        char fdir[4096];
        snprintf(fdir, sizeof fdir, "%s/%s", root, folders[f]);
        DIR *d = opendir(fdir);
        if (!d) {
            fprintf(stderr, "missing test folder %s\n", fdir);
            return 2;
        }
        char **names = NULL;
        int n = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            names = realloc(names, (size_t)(n + 1) * sizeof *names);
            names[n++] = strdup(e->d_name);
        }
        closedir(d);
        if (n) qsort(names, (size_t)n, sizeof *names, cmp_str);
        for (int i = 0; i < n; i++) {
            bool skip = filter && !strstr(names[i], filter);
            if (!skip && seq++ % n_shards != shard) skip = true; /* another shard's test */
            if (skip) {
                int xi = find_expected(&ex, names[i]);
                if (xi >= 0) ex.seen[xi] = true;
                free(names[i]);
                continue;
            }
            char dir[8192], why[2048] = "";
            snprintf(dir, sizeof dir, "%s/%s", fdir, names[i]);
            bool on_gpu = false;
            int res = fork_it && batch ? run_batched(&child, batch, dir, &on_gpu, why, sizeof why)
                                       : run_isolated(dir, fork_it, &on_gpu, why, sizeof why);
            on_gpu_ran += on_gpu;
            on_gpu_passed += on_gpu && res == RES_PASS;
            int xi = find_expected(&ex, names[i]);
            if (xi >= 0) ex.seen[xi] = true;
            total++;
            if (res == RES_SKIP) {
                skipped++;
                if (verbose) printf("SKIP %s/%s: %s\n", folders[f], names[i], why);
            } else if (res == RES_PASS) {
                passed++;
                if (xi >= 0 && ex.chance[xi]) {
                    if (verbose) printf("PASS %s/%s (by chance: %s)\n", folders[f], names[i], ex.reasons[xi]);
                } else if (xi >= 0) {
                    fixed++;
                    printf("FIXED %s/%s: passes but is listed as expected to fail (%s); remove it from the list\n",
                           folders[f], names[i], ex.reasons[xi]);
                } else if (verbose) {
                    printf("PASS %s/%s\n", folders[f], names[i]);
                }
            } else {
                failed++;
                if (xi < 0) unexpected++;
                printf("%s %s/%s: %s\n", xi >= 0 ? "XFAIL" : "FAIL", folders[f], names[i], why);
            }
            fflush(stdout);
            free(names[i]);
        }
        free(names);
    }
    int child_status = 0;
    batch_child_stop(&child, &child_status);
    if (WIFEXITED(child_status) && WEXITSTATUS(child_status))
        fprintf(stderr, "conformance: a batch child exited with status %d (a sanitizer report?)\n",
                WEXITSTATUS(child_status));
    int stale = 0;
    for (int i = 0; i < ex.n; i++)
        if (!ex.seen[i]) {
            printf("STALE %s: listed as expected to fail but no such test exists\n", ex.names[i]);
            stale++;
        }
    printf("pass rate %.1f%% (%d of %d, skipped excluded); unexpected failures %d, listed tests now passing %d\n",
           100.0 * passed / (total - skipped > 0 ? total - skipped : 1), passed, total - skipped, unexpected, fixed);
    if (provider == KILN_PROVIDER_CUDA)
        printf("on the GPU: %d tests ran at least one node there, %d of them passed\n", on_gpu_ran, on_gpu_passed);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    for (int i = 0; i < ex.n; i++) {
        free(ex.names[i]);
        free(ex.reasons[i]);
    }
    free(ex.names);
    free(ex.reasons);
    free(ex.seen);
    free(ex.chance);
    return (unexpected || fixed || stale) ? 1 : 0;
}
