/* main.c - the kiln command-line tool: info, run, bench. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "kiln.h"
#include "npy.h"

#define MAX_SPECS 64

static const char usage[] =
    "usage: kiln info MODEL [--json]\n"
    "       kiln run MODEL [--input NAME=FILE.npy]... [--shape NAME=1x3xHxW]... [--seed N] [--output-dir DIR] [--stats]\n"
    "       kiln bench MODEL [--input NAME=FILE.npy]... [--shape NAME=DIMS]... [--seed N] [--warmup N] [--runs N] [--json] [--stats]\n"
    "       kiln ops\n"
    "       kiln --version\n"
    "A --shape repeated for one input runs the model once per shape, in one session.\n";

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kiln: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void json_string(FILE *o, const char *s)
{
    fputc('"', o);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(o, "\\%c", *p);
        else if (*p < 0x20) fprintf(o, "\\u%04x", *p);
        else fputc(*p, o);
    }
    fputc('"', o);
}

static kiln_session *open_session(const char *path, bool allow_unsupported)
{
    struct stat st;
    if (stat(path, &st)) {
        fail("cannot open model '%s': %s", path, strerror(errno));
        return NULL;
    }
    kiln_session_options opt = kiln_session_options_default();
    opt.allow_unsupported = allow_unsupported;
    kiln_session *s = NULL;
    if (kiln_session_create(path, &opt, &s)) {
        fail("%s", kiln_last_error(s));
        kiln_session_free(s);
        return NULL;
    }
    return s;
}

static void dims_str(const kiln_io_info *io, char *buf, size_t size)
{
    if (io->rank < 0) {
        snprintf(buf, size, "?");
        return;
    }
    size_t at = (size_t)snprintf(buf, size, "[");
    for (int k = 0; k < io->rank && at < size; k++) {
        if (io->dims[k] >= 0) at += (size_t)snprintf(buf + at, size - at, "%s%" PRId64, k ? ", " : "", io->dims[k]);
        else at += (size_t)snprintf(buf + at, size - at, "%s%s", k ? ", " : "", io->dim_names[k]);
    }
    if (at < size) snprintf(buf + at, size - at, "]");
}

static const char *kind_name(kiln_value_kind k)
{
    return k == KILN_VALUE_SEQUENCE ? "sequence" : k == KILN_VALUE_OPTIONAL ? "optional" : "tensor";
}

/* ---- info ---- */

typedef struct op_count {
    char name[160];
    int count;
    bool supported;
} op_count;

static int cmd_info(int argc, char **argv)
{
    const char *model = NULL;
    bool json = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (argv[i][0] == '-') return fail("info: unknown option '%s'", argv[i]);
        else if (!model) model = argv[i];
        else return fail("info: unexpected argument '%s'", argv[i]);
    }
    if (!model) return fail("info: missing MODEL\n%s", usage);
    kiln_session *s = open_session(model, true);
    if (!s) return 1;
    int n_nodes = kiln_session_node_count(s);
    op_count *ops = calloc((size_t)n_nodes + 1, sizeof *ops);
    int n_ops = 0;
    for (int i = 0; i < n_nodes; i++) {
        const char *name, *domain, *op;
        bool ok;
        kiln_session_node(s, i, &name, &domain, &op, &ok);
        char key[160];
        snprintf(key, sizeof key, "%s%s%s", domain, *domain ? "." : "", op);
        int j = 0;
        while (j < n_ops && strcmp(ops[j].name, key)) j++;
        if (j == n_ops) {
            snprintf(ops[n_ops].name, sizeof ops[n_ops].name, "%s", key);
            ops[n_ops++].supported = ok;
        }
        ops[j].count++;
    }
    FILE *o = stdout;
    const char *sets[2] = {"inputs", "outputs"};
    if (json) {
        fprintf(o, "{\"model\": ");
        json_string(o, model);
        fprintf(o, ", \"ir_version\": %" PRId64 ", \"opsets\": {", kiln_session_ir_version(s));
        for (int i = 0; i < kiln_session_opset_count(s); i++) {
            const char *d;
            int64_t v;
            kiln_session_opset(s, i, &d, &v);
            fprintf(o, "%s", i ? ", " : "");
            json_string(o, *d ? d : "ai.onnx");
            fprintf(o, ": %" PRId64, v);
        }
        fprintf(o, "}");
        for (int set = 0; set < 2; set++) {
            int n = set ? kiln_session_output_count(s) : kiln_session_input_count(s);
            fprintf(o, ", \"%s\": [", sets[set]);
            for (int i = 0; i < n; i++) {
                kiln_io_info io;
                if (set) kiln_session_output_info(s, i, &io);
                else kiln_session_input_info(s, i, &io);
                fprintf(o, "%s{\"name\": ", i ? ", " : "");
                json_string(o, io.name);
                fprintf(o, ", \"kind\": \"%s\", \"dtype\": \"%s\", \"shape\": ", kind_name(io.kind), kiln_dtype_name(io.dtype));
                if (io.rank < 0) {
                    fprintf(o, "null");
                } else {
                    fprintf(o, "[");
                    for (int k = 0; k < io.rank; k++) {
                        fprintf(o, "%s", k ? ", " : "");
                        if (io.dims[k] >= 0) fprintf(o, "%" PRId64, io.dims[k]);
                        else json_string(o, io.dim_names[k]);
                    }
                    fprintf(o, "]");
                }
                fprintf(o, "}");
            }
            fprintf(o, "]");
        }
        fprintf(o, ", \"nodes\": %d, \"operators\": {", n_nodes);
        for (int j = 0; j < n_ops; j++) {
            fprintf(o, "%s", j ? ", " : "");
            json_string(o, ops[j].name);
            fprintf(o, ": %d", ops[j].count);
        }
        fprintf(o, "}, \"unsupported\": [");
        for (int j = 0, first = 1; j < n_ops; j++)
            if (!ops[j].supported) {
                fprintf(o, "%s", first ? "" : ", ");
                json_string(o, ops[j].name);
                first = 0;
            }
        fprintf(o, "], \"initializer_bytes\": %" PRId64 "}\n", kiln_session_initializer_bytes(s));
    } else {
        fprintf(o, "model: %s\nir_version: %" PRId64 "\nopsets:", model, kiln_session_ir_version(s));
        for (int i = 0; i < kiln_session_opset_count(s); i++) {
            const char *d;
            int64_t v;
            kiln_session_opset(s, i, &d, &v);
            fprintf(o, " %s=%" PRId64, *d ? d : "ai.onnx", v);
        }
        fprintf(o, "\n");
        for (int set = 0; set < 2; set++) {
            int n = set ? kiln_session_output_count(s) : kiln_session_input_count(s);
            fprintf(o, "%s:\n", sets[set]);
            for (int i = 0; i < n; i++) {
                kiln_io_info io;
                if (set) kiln_session_output_info(s, i, &io);
                else kiln_session_input_info(s, i, &io);
                char d[512];
                dims_str(&io, d, sizeof d);
                fprintf(o, "  %s: %s%s%s %s%s\n", io.name, io.kind == KILN_VALUE_TENSOR ? "" : kind_name(io.kind),
                        io.kind == KILN_VALUE_TENSOR ? "" : " of ", kiln_dtype_name(io.dtype), d, "");
            }
        }
        fprintf(o, "nodes: %d\noperators:\n", n_nodes);
        for (int j = 0; j < n_ops; j++)
            fprintf(o, "  %-32s %6d%s\n", ops[j].name, ops[j].count, ops[j].supported ? "" : "  (unsupported)");
        fprintf(o, "initializer bytes: %" PRId64 "\n", kiln_session_initializer_bytes(s));
        int uns = 0;
        for (int j = 0; j < n_ops; j++) uns += !ops[j].supported;
        if (uns) {
            fprintf(o, "unsupported operators:");
            for (int j = 0; j < n_ops; j++)
                if (!ops[j].supported) fprintf(o, " %s", ops[j].name);
            fprintf(o, "\n");
        } else {
            fprintf(o, "unsupported operators: none\n");
        }
    }
    free(ops);
    kiln_session_free(s);
    return 0;
}

/* ---- inputs for run and bench ---- */

typedef struct spec {
    char *name;
    char *file;          /* --input */
    int64_t dims[KILN_MAX_RANK];
    int rank;            /* --shape */
} spec;

typedef struct run_args {
    const char *model;
    spec specs[MAX_SPECS];
    int n_specs;
    uint64_t seed;
    const char *out_dir;
    int warmup, runs;
    bool json, stats;
} run_args;

static int parse_dims(const char *s, int64_t *dims, int *rank)
{
    *rank = 0;
    if (!*s) return 0; /* a scalar */
    while (*s) {
        char *end;
        long long d = strtoll(s, &end, 10);
        if (end == s || d < 0 || *rank == KILN_MAX_RANK) return -1;
        dims[(*rank)++] = d;
        if (*end == 'x' || *end == 'X' || *end == ',') end++;
        else if (*end) return -1;
        s = end;
    }
    return 0;
}

static int parse_run_args(int argc, char **argv, bool bench, run_args *a)
{
    memset(a, 0, sizeof *a);
    a->warmup = 3;
    a->runs = 20;
    for (int i = 0; i < argc; i++) {
        const char *opt = argv[i];
        bool has_val = i + 1 < argc;
        if ((!strcmp(opt, "--input") || !strcmp(opt, "--shape")) && has_val) {
            char *arg = argv[++i];
            char *eq = strrchr(arg, '=');
            if (!eq || eq == arg) return fail("%s expects NAME=VALUE, got '%s'", opt, arg);
            if (a->n_specs == MAX_SPECS) return fail("too many --input/--shape options");
            spec *sp = &a->specs[a->n_specs++];
            sp->name = strndup(arg, (size_t)(eq - arg));
            if (!strcmp(opt, "--input")) {
                sp->file = eq + 1;
            } else if (parse_dims(eq + 1, sp->dims, &sp->rank)) {
                return fail("--shape %s: dims must look like 1x3x224x224", arg);
            }
        } else if (!strcmp(opt, "--seed") && has_val) {
            a->seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(opt, "--stats")) {
            a->stats = true;
        } else if (!bench && !strcmp(opt, "--output-dir") && has_val) {
            a->out_dir = argv[++i];
        } else if (bench && !strcmp(opt, "--warmup") && has_val) {
            a->warmup = atoi(argv[++i]);
        } else if (bench && !strcmp(opt, "--runs") && has_val) {
            a->runs = atoi(argv[++i]);
        } else if (bench && !strcmp(opt, "--json")) {
            a->json = true;
        } else if (opt[0] == '-') {
            return fail("%s: unknown option '%s' (or missing value)", bench ? "bench" : "run", opt);
        } else if (!a->model) {
            a->model = opt;
        } else {
            return fail("unexpected argument '%s'", opt);
        }
    }
    if (!a->model) return fail("missing MODEL\n%s", usage);
    if (a->runs < 1 || a->warmup < 0) return fail("--runs must be >= 1 and --warmup >= 0");
    return 0;
}

static uint64_t next_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint16_t float_to_half(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    int e = (int)exp - 127 + 15;
    if (e <= 0) return (uint16_t)sign; /* random data in [-1, 1): tiny values flush to zero */
    return (uint16_t)(sign | (uint32_t)e << 10 | man >> 13);
}

/* Random tensor: floats uniform in [-1, 1), integers in [0, 10), bools 0/1. */
static int random_tensor(kiln_dtype dt, int rank, const int64_t *dims, uint64_t *rng, kiln_value **out)
{
    if (kiln_value_create_tensor(dt, rank, dims, NULL, 0, out)) return fail("cannot create a %s tensor", kiln_dtype_name(dt));
    int64_t n = kiln_value_numel(*out);
    void *p = kiln_value_data(*out);
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = next_rand(rng);
        double u = (double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        switch (dt) {
        case KILN_DTYPE_FLOAT32: ((float *)p)[i] = (float)u; break;
        case KILN_DTYPE_FLOAT64: ((double *)p)[i] = u; break;
        case KILN_DTYPE_FLOAT16: ((uint16_t *)p)[i] = float_to_half((float)u); break;
        case KILN_DTYPE_BFLOAT16: {
            float f = (float)u;
            uint32_t b;
            memcpy(&b, &f, 4);
            ((uint16_t *)p)[i] = (uint16_t)(b >> 16);
            break;
        }
        case KILN_DTYPE_BOOL: ((uint8_t *)p)[i] = r & 1; break;
        case KILN_DTYPE_INT8: case KILN_DTYPE_UINT8: ((uint8_t *)p)[i] = (uint8_t)(r % 10); break;
        case KILN_DTYPE_INT16: case KILN_DTYPE_UINT16: ((uint16_t *)p)[i] = (uint16_t)(r % 10); break;
        case KILN_DTYPE_INT32: case KILN_DTYPE_UINT32: ((uint32_t *)p)[i] = (uint32_t)(r % 10); break;
        case KILN_DTYPE_INT64: case KILN_DTYPE_UINT64: ((uint64_t *)p)[i] = r % 10; break;
        default:
            kiln_value_free(*out);
            *out = NULL;
            return fail("cannot generate random %s data: give the input with --input", kiln_dtype_name(dt));
        }
    }
    return 0;
}

/* The inputs of run number k: the k-th --input/--shape for each input (the last one when it
 * has fewer), random data where only a shape or nothing is given. */
static int make_inputs(kiln_session *s, const run_args *a, int k, uint64_t *rng, kiln_value **vals, const char **names)
{
    int n = kiln_session_input_count(s);
    for (int i = 0; i < n; i++) {
        kiln_io_info io;
        kiln_session_input_info(s, i, &io);
        names[i] = io.name;
        const spec *sp = NULL;
        for (int j = 0, seen = 0; j < a->n_specs; j++)
            if (!strcmp(a->specs[j].name, io.name) && seen++ <= k) sp = &a->specs[j];
        if (sp && sp->file) {
            char why[512];
            if (npy_read(sp->file, io.dtype, &vals[i], why, sizeof why)) return fail("input '%s': %s", io.name, why);
            continue;
        }
        if (io.kind != KILN_VALUE_TENSOR) return fail("input '%s' is a %s: give it with --input", io.name, kind_name(io.kind));
        int64_t dims[KILN_MAX_RANK];
        int rank;
        if (sp) {
            rank = sp->rank;
            memcpy(dims, sp->dims, sizeof dims);
        } else {
            if (io.rank < 0) return fail("input '%s' has no declared shape: give --shape %s=DIMS", io.name, io.name);
            rank = io.rank;
            for (int d = 0; d < rank; d++) {
                if (io.dims[d] < 0)
                    return fail("input '%s' has symbolic dim '%s': give --shape %s=DIMS", io.name, io.dim_names[d], io.name);
                dims[d] = io.dims[d];
            }
        }
        if (random_tensor(io.dtype ? io.dtype : KILN_DTYPE_FLOAT32, rank, dims, rng, &vals[i])) return 1;
    }
    for (int j = 0; j < a->n_specs; j++) {
        bool known = false;
        for (int i = 0; i < n; i++) known = known || !strcmp(a->specs[j].name, names[i]);
        if (!known) return fail("the model has no input named '%s'", a->specs[j].name);
    }
    return 0;
}

static int run_count(const run_args *a)
{
    int most = 1;
    for (int j = 0; j < a->n_specs; j++) {
        int c = 0;
        for (int q = 0; q < a->n_specs; q++) c += !strcmp(a->specs[q].name, a->specs[j].name);
        if (c > most) most = c;
    }
    return most;
}

static void safe_name(const char *name, char *out, size_t size)
{
    size_t i = 0;
    for (; name[i] && i + 1 < size; i++) {
        char ch = name[i];
        bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                  ch == '_' || ch == '-';
        out[i] = ok ? ch : '_';
    }
    out[i] = '\0';
    if (!i || !strcmp(out, ".") || !strcmp(out, "..")) snprintf(out, size, "_%s", name[0] ? "" : "output");
}

static void free_values(kiln_value **v, int n)
{
    for (int i = 0; i < n; i++) {
        kiln_value_free(v[i]);
        v[i] = NULL;
    }
}

static int cmd_run(int argc, char **argv, bool bench)
{
    run_args a;
    if (parse_run_args(argc, argv, bench, &a)) return 1;
    double t0 = now_ms();
    kiln_session *s = open_session(a.model, false);
    if (!s) return 1;
    double create_ms = now_ms() - t0;
    int n_in = kiln_session_input_count(s), n_out = kiln_session_output_count(s);
    kiln_value **in = calloc((size_t)n_in + 1, sizeof *in), **out = calloc((size_t)n_out + 1, sizeof *out);
    const char **in_names = calloc((size_t)n_in + 1, sizeof *in_names), **out_names = calloc((size_t)n_out + 1, sizeof *out_names);
    for (int j = 0; j < n_out; j++) {
        kiln_io_info io;
        kiln_session_output_info(s, j, &io);
        out_names[j] = io.name;
    }
    uint64_t rng = a.seed;
    int rc = 0;
    if (a.out_dir && mkdir(a.out_dir, 0777) && errno != EEXIST) {
        rc = fail("cannot create output folder '%s': %s", a.out_dir, strerror(errno));
        goto out;
    }
    int shapes = run_count(&a);
    for (int k = 0; k < shapes && !rc; k++) {
        if (make_inputs(s, &a, k, &rng, in, in_names)) {
            rc = 1;
            break;
        }
        int iters = bench ? a.warmup + a.runs : 1;
        double *times = calloc((size_t)iters, sizeof *times);
        for (int it = 0; it < iters; it++) {
            double t = now_ms();
            if (kiln_session_run(s, n_in, in_names, (const kiln_value *const *)in, n_out, out_names, out)) {
                rc = fail("%s", kiln_last_error(s));
                break;
            }
            times[it] = now_ms() - t;
            if (it + 1 < iters) free_values(out, n_out);
        }
        if (!rc && !bench) {
            printf("run %d (%.3f ms):\n", k + 1, times[0]);
            for (int j = 0; j < n_out; j++) {
                printf("  %s: %s", out_names[j], kiln_dtype_name(kiln_value_dtype(out[j])));
                if (kiln_value_kind_of(out[j]) == KILN_VALUE_TENSOR) {
                    printf(" [");
                    for (int d = 0; d < kiln_value_rank(out[j]); d++)
                        printf("%s%" PRId64, d ? ", " : "", kiln_value_dims(out[j])[d]);
                    printf("]");
                } else {
                    printf(" (%s)", kind_name(kiln_value_kind_of(out[j])));
                }
                printf("\n");
                if (a.out_dir && kiln_value_kind_of(out[j]) == KILN_VALUE_TENSOR) {
                    char fname[512], path[4096], why[512];
                    safe_name(out_names[j], fname, sizeof fname);
                    if (shapes > 1) snprintf(path, sizeof path, "%s/%s.%d.npy", a.out_dir, fname, k + 1);
                    else snprintf(path, sizeof path, "%s/%s.npy", a.out_dir, fname);
                    if (npy_write(path, out[j], why, sizeof why)) rc = fail("%s", why);
                }
            }
        } else if (!rc) {
            double *t = times + a.warmup;
            int n = a.runs;
            for (int i = 1; i < n; i++)
                for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
                    double x = t[j];
                    t[j] = t[j - 1];
                    t[j - 1] = x;
                }
            double med = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
            double p90 = t[(int)((n - 1) * 0.9 + 0.5)];
            if (a.json)
                printf("{\"model\": \"%s\", \"run\": %d, \"create_ms\": %.3f, \"runs\": %d, \"min_ms\": %.4f, "
                       "\"median_ms\": %.4f, \"p90_ms\": %.4f, \"max_ms\": %.4f, \"throughput_per_s\": %.2f}\n",
                       a.model, k + 1, create_ms, n, t[0], med, p90, t[n - 1], 1000.0 / med);
            else
                printf("%s (shape set %d): %d runs, min %.4f ms, median %.4f ms, p90 %.4f ms, max %.4f ms, "
                       "%.2f runs/s\n", a.model, k + 1, n, t[0], med, p90, t[n - 1], 1000.0 / med);
        }
        free(times);
        free_values(in, n_in);
        free_values(out, n_out);
    }
    if (!rc && a.stats) {
        kiln_session_stats st;
        kiln_session_stats_get(s, &st);
        printf("stats: compilations %" PRId64 ", runs %" PRId64 ", plan cache hits %" PRId64 " misses %" PRId64
               " (%d of %d cached), arena peak %" PRId64 " bytes, last arena %" PRId64 " bytes (lower bound %" PRId64
               "), heap fallbacks %" PRId64 "\n",
               st.compilations, st.runs, st.plan_cache_hits, st.plan_cache_misses, st.plan_cache_entries,
               st.plan_cache_capacity, st.arena_peak_bytes, st.arena_last_bytes, st.lower_bound_last_bytes,
               st.heap_fallbacks);
    }
out:
    free_values(in, n_in);
    free(in);
    free(out);
    free(in_names);
    free(out_names);
    for (int j = 0; j < a.n_specs; j++) free(a.specs[j].name);
    kiln_session_free(s);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version")) {
        printf("kiln %s\n", kiln_version());
        return 0;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "ops")) {
        for (int i = 0; i < kiln_operator_count(); i++) {
            const char *domain, *op;
            int since;
            kiln_operator_info(i, &domain, &op, &since);
            printf("%s%s%s (since opset %d)\n", domain, *domain ? "." : "", op, since);
        }
        return 0;
    }
    if (!strcmp(cmd, "info")) return cmd_info(argc - 2, argv + 2);
    if (!strcmp(cmd, "run")) return cmd_run(argc - 2, argv + 2, false);
    if (!strcmp(cmd, "bench")) return cmd_run(argc - 2, argv + 2, true);
    fail("unknown command '%s'", cmd);
    fputs(usage, stderr);
    return 2;
}
