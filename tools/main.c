/* main.c - the kiln command-line tool: info, run, bench, verify, generate, bench-llm. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "kiln.h"
#include "cli.h"
#include "npy.h"
#include "generate.h"
#include "verify.h"


static const char usage[] =
    "usage: kiln info MODEL [--provider cpu|cuda] [--json]\n"
    "       kiln run MODEL [--provider cpu|cuda] [--input NAME=FILE.npy]... [--shape NAME=1x3xHxW]... [--seed N] [--threads N] [--output-dir DIR] [--stats]\n"
    "       kiln bench MODEL [--provider cpu|cuda] [--input NAME=FILE.npy]... [--shape NAME=DIMS]... [--seed N] [--threads N] [--warmup N] [--runs N] [--json] [--stats] [--profile|--profile-all]\n"
    "       kiln verify MODEL [--provider cpu|cuda] [--input ...|--shape ...] [--rtol R] [--atol A]\n"
    "       kiln generate DIR --prompt-tokens 1,2,3 [--prompt-tokens ...] -g N [--greedy | --temperature T --top-k K --top-p P --seed S] [--provider cpu|cuda] [--threads N] [--json]\n"
    "       kiln bench-llm -i DIR [-l PROMPT_LEN] [-g GEN_LEN] [-r REPS] [-w WARMUP] [-b BATCH] [--provider cpu|cuda] [--threads N] [--json]\n"
    "       kiln ops\n"
    "       kiln --version\n"
    "A --shape repeated for one input runs the model once per shape, in one session.\n";

/* Peak resident memory of this process in MB: VmHWM (Linux; unlike ru_maxrss it starts anew
 * at exec, so a parent's size does not count), else getrusage's figure. */
static double peak_rss_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kb = ru.ru_maxrss;
    }
    return kb / 1024.0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Length of the well-formed UTF-8 sequence at p (1..4), or 0 if it is not one. */
static int utf8_len(const unsigned char *p)
{
    int n = p[0] < 0x80 ? 1 : p[0] >= 0xc2 && p[0] <= 0xdf ? 2 : p[0] >= 0xe0 && p[0] <= 0xef ? 3
            : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : 0;
    for (int k = 1; k < n; k++)
        if ((p[k] & 0xc0) != 0x80) return 0;
    return n;
}

/* A JSON string; bytes that are not UTF-8 (names are not checked on load) become U+FFFD. */
static void json_string(FILE *o, const char *s)
{
    fputc('"', o);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = utf8_len(p);
        if (*p == '"' || *p == '\\') fprintf(o, "\\%c", *p);
        else if (*p < 0x20) fprintf(o, "\\u%04x", *p);
        else if (n == 0) fputs("\\ufffd", o);
        else fwrite(p, 1, (size_t)n, o);
        p += n ? n : 1;
    }
    fputc('"', o);
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

typedef struct op_count {
    char name[160];
    int count;
    bool supported;
} op_count;

static int cmd_info(int argc, char **argv)
{
    const char *model = NULL;
    bool json = false;
    kiln_session_options opt = kiln_session_options_default();
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--provider") && i + 1 < argc) {
            if (cli_parse_provider(argv[++i], &opt.provider)) return 1;
        } else if (argv[i][0] == '-') return cli_fail("info: unknown option '%s'", argv[i]);
        else if (!model) model = argv[i];
        else return cli_fail("info: unexpected argument '%s'", argv[i]);
    }
    if (!model) return cli_fail("info: missing MODEL\n%s", usage);
    opt.allow_unsupported = true;
    kiln_session *s = cli_open_session(model, &opt);
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
                fprintf(o, ", \"kind\": \"%s\", \"dtype\": \"%s\", \"shape\": ", cli_kind_name(io.kind), kiln_dtype_name(io.dtype));
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
        fprintf(o, "], \"initializer_bytes\": %" PRId64, kiln_session_initializer_bytes(s));
        if (opt.provider == KILN_PROVIDER_CUDA) {
            fprintf(o, ", \"cpu_nodes\": [");
            for (int i = 0, first = 1; i < n_nodes; i++) {
                const char *name, *domain, *op, *prov, *why;
                kiln_session_node(s, i, &name, &domain, &op, NULL);
                kiln_session_node_placement(s, i, &prov, &why);
                if (strcmp(prov, "cpu")) continue;
                fprintf(o, "%s{\"node\": ", first ? "" : ", ");
                json_string(o, name);
                fprintf(o, ", \"op\": ");
                json_string(o, op);
                fprintf(o, ", \"why\": ");
                json_string(o, why ? why : "");
                fprintf(o, ", \"fallback\": %s}", kiln_session_node_fallback(s, i) ? "true" : "false");
                first = 0;
            }
            kiln_session_stats st;
            kiln_session_stats_get(s, &st);
            fprintf(o, "], \"nodes_fallback\": %d", st.nodes_fallback);
        }
        fprintf(o, "}\n");
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
                fprintf(o, "  %s: %s%s%s %s%s\n", io.name, io.kind == KILN_VALUE_TENSOR ? "" : cli_kind_name(io.kind),
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
        if (opt.provider == KILN_PROVIDER_CUDA) {
            kiln_session_stats st;
            kiln_session_stats_get(s, &st);
            fprintf(o, "placement: %d nodes on the GPU, %d on the CPU (%d of them fallbacks)\n", st.nodes_gpu,
                    st.nodes_cpu, st.nodes_fallback);
            for (int i = 0; i < n_nodes; i++) {
                const char *name, *domain, *op, *prov, *why;
                kiln_session_node(s, i, &name, &domain, &op, NULL);
                kiln_session_node_placement(s, i, &prov, &why);
                if (!strcmp(prov, "cpu")) fprintf(o, "  cpu  %-32s %-20s %s\n", name, op, why ? why : "");
            }
            /* nodes computing data on the CPU: each a warning line of its own */
            for (int i = 0; i < n_nodes; i++) {
                const char *name, *domain, *op, *prov, *why;
                if (!kiln_session_node_fallback(s, i)) continue;
                kiln_session_node(s, i, &name, &domain, &op, NULL);
                kiln_session_node_placement(s, i, &prov, &why);
                fprintf(o, "warning: node '%s' (%s) falls back to the CPU: %s\n", name, op, why ? why : "");
            }
        }
    }
    free(ops);
    kiln_session_free(s);
    return 0;
}

/* ---- bench --profile: each node's time as the observer event reports it ---- */

typedef struct node_times {
    double *ms; /* [nodes] */
    char (*shape)[64];          /* [nodes] output 0's dims, as seen */
    int nodes;
} node_times;

static int time_node(void *user, const kiln_node_event *ev)
{
    node_times *p = user;
    if (ev->node >= 0 && ev->node < p->nodes) {
        p->ms[ev->node] += ev->ms;
        const kiln_value *y = ev->n_outputs > 0 ? ev->outputs[0] : NULL;
        if (y && !p->shape[ev->node][0] && kiln_value_kind_of(y) == KILN_VALUE_TENSOR) {
            int at = 0;
            for (int d = 0; d < kiln_value_rank(y) && at < 56; d++)
                at += snprintf(p->shape[ev->node] + at, 64 - (size_t)at, "%s%" PRId64, d ? "x" : "", kiln_value_dims(y)[d]);
        }
    }
    return 0;
}

/* Runs the model `runs` more times with an observer and prints where the time goes: per op
 * type, then the costliest nodes (or, with `all`, every node in graph order). */
static int print_profile(kiln_session *s, int n_in, const char **in_names, kiln_value **in, int n_out,
                         const char **out_names, int runs, bool all)
{
    node_times p = {0};
    p.nodes = kiln_session_node_count(s);
    p.ms = calloc((size_t)p.nodes + 1, sizeof *p.ms);
    p.shape = calloc((size_t)p.nodes + 1, sizeof *p.shape);
    kiln_value **out = calloc((size_t)n_out + 1, sizeof *out);
    int *order = calloc((size_t)p.nodes + 1, sizeof *order);
    int rc = !p.ms || !p.shape || !out || !order ? cli_fail("out of memory") : 0;
    for (int r = 0; r < runs && !rc; r++) {
        if (kiln_session_run_observed(s, n_in, in_names, (const kiln_value *const *)in, n_out, out_names, out,
                                      time_node, &p))
            rc = cli_fail("%s", kiln_last_error(s));
        cli_free_values(out, n_out);
    }
    double total = 0;
    for (int i = 0; i < p.nodes; i++) total += p.ms[i];
    if (!rc && total > 0) {
        printf("profile: %d runs with an observer, %.3f ms per run in nodes\n", runs, total / runs);
        /* per op type, in order of first appearance; then the nodes by time */
        printf("  by op type:\n");
        for (int i = 0; i < p.nodes; i++) {
            const char *name, *domain, *op, *op_i;
            bool sup;
            kiln_session_node(s, i, &name, &domain, &op, &sup);
            bool first = true;
            for (int k = 0; k < i && first; k++)
                if (kiln_session_node(s, k, &name, &domain, &op_i, &sup) == KILN_OK && !strcmp(op_i, op)) first = false;
            if (!first) continue;
            double t = 0;
            int count = 0;
            for (int k = i; k < p.nodes; k++)
                if (kiln_session_node(s, k, &name, &domain, &op_i, &sup) == KILN_OK && !strcmp(op_i, op) && p.ms[k] > 0)
                    t += p.ms[k], count++;
            if (count) printf("    %-24s %4d nodes %9.3f ms %5.1f%%\n", op, count, t / runs, 100 * t / total);
        }
        for (int i = 0; i < p.nodes; i++) order[i] = i;
        for (int i = 1; i < p.nodes && !all; i++)
            for (int j = i; j > 0 && p.ms[order[j - 1]] < p.ms[order[j]]; j--) {
                int x = order[j];
                order[j] = order[j - 1];
                order[j - 1] = x;
            }
        printf(all ? "  nodes:\n" : "  costliest nodes:\n");
        for (int i = 0; i < p.nodes && (all || (i < 15 && p.ms[order[i]] > 0)); i++) {
            const char *name, *domain, *op;
            bool sup;
            if (all && p.ms[order[i]] <= 0) continue;
            kiln_session_node(s, order[i], &name, &domain, &op, &sup);
            printf("    %9.3f ms %5.1f%%  %-16s %-24s -> [%s]\n", p.ms[order[i]] / runs, 100 * p.ms[order[i]] / total, op,
                   name, p.shape[order[i]]);
        }
    }
    free(p.ms);
    free(p.shape);
    free(out);
    free(order);
    return rc;
}

/* ---- inputs for run and bench ---- */

static int cmd_run(int argc, char **argv, bool bench)
{
    run_args a;
    if (cli_parse_run_args(argc, argv, bench ? "bench" : "run", &a)) return 1;
    double t0 = now_ms();
    kiln_session_options opt = kiln_session_options_default();
    opt.num_threads = a.threads;
    opt.provider = a.provider;
    kiln_session *s = cli_open_session(a.model, &opt);
    if (!s) {
        cli_free_run_args(&a);
        return 1;
    }
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
    int shapes = cli_run_count(&a);
    /* two different outputs must not write one file: refuse before running anything */
    for (int j = 0; a.out_dir && j < n_out && !rc; j++)
        for (int i = 0; i < j && !rc; i++) {
            char fi[512], fj[512];
            cli_safe_name(out_names[i], fi, sizeof fi);
            cli_safe_name(out_names[j], fj, sizeof fj);
            if (strcmp(out_names[i], out_names[j]) && !strcmp(fi, fj))
                rc = cli_fail("outputs '%s' and '%s' collide: both would be written to '%s/%s.npy'",
                              out_names[i], out_names[j], a.out_dir, fi);
        }
    if (!rc && a.out_dir && mkdir(a.out_dir, 0777) && errno != EEXIST) {
        rc = cli_fail("cannot create output folder '%s': %s", a.out_dir, strerror(errno));
        goto out;
    }
    for (int k = 0; k < shapes && !rc; k++) {
        if (cli_make_inputs(s, &a, k, &rng, in, in_names)) {
            rc = 1;
            break;
        }
        int iters = bench ? a.warmup + a.runs : 1;
        double *times = calloc((size_t)iters, sizeof *times);
        for (int it = 0; it < iters; it++) {
            double t = now_ms();
            if (kiln_session_run(s, n_in, in_names, (const kiln_value *const *)in, n_out, out_names, out)) {
                rc = cli_fail("%s", kiln_last_error(s));
                break;
            }
            times[it] = now_ms() - t;
            if (it + 1 < iters) cli_free_values(out, n_out);
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
                    printf(" (%s)", cli_kind_name(kiln_value_kind_of(out[j])));
                }
                printf("\n");
                if (a.out_dir && kiln_value_kind_of(out[j]) == KILN_VALUE_TENSOR) {
                    char fname[512], path[4096], why[512];
                    cli_safe_name(out_names[j], fname, sizeof fname);
                    if (shapes > 1) snprintf(path, sizeof path, "%s/%s.%d.npy", a.out_dir, fname, k + 1);
                    else snprintf(path, sizeof path, "%s/%s.npy", a.out_dir, fname);
                    if (npy_write(path, out[j], why, sizeof why)) rc = cli_fail("%s", why);
                }
            }
        } else if (!rc) {
            double *t = times + a.warmup;
            int n = a.runs;
            qsort(t, (size_t)n, sizeof *t, cli_cmp_double);
            double med = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
            double p90 = t[(int)((n - 1) * 0.9 + 0.5)];
            double peak_mb = peak_rss_mb();
            if (a.json)
                printf("{\"model\": \"%s\", \"run\": %d, \"create_ms\": %.3f, \"runs\": %d, \"min_ms\": %.4f, "
                       "\"median_ms\": %.4f, \"p90_ms\": %.4f, \"max_ms\": %.4f, \"throughput_per_s\": %.2f, "
                       "\"peak_rss_mb\": %.1f}\n",
                       a.model, k + 1, create_ms, n, t[0], med, p90, t[n - 1], 1000.0 / med, peak_mb);
            else
                printf("%s (shape set %d): %d runs, min %.4f ms, median %.4f ms, p90 %.4f ms, max %.4f ms, "
                       "%.2f runs/s\n", a.model, k + 1, n, t[0], med, p90, t[n - 1], 1000.0 / med);
        }
        free(times);
        if (!rc && bench && a.profile) rc = print_profile(s, n_in, in_names, in, n_out, out_names, a.runs, a.profile == PROFILE_ALL);
        cli_free_values(in, n_in);
        cli_free_values(out, n_out);
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
        if (a.provider == KILN_PROVIDER_CUDA)
            printf("gpu: nodes %d on the GPU, %d on the CPU; node runs %" PRId64 " GPU, %" PRId64 " CPU; device mallocs %" PRId64
                   "; copies %" PRId64 " to device, %" PRId64 " to host; graphs captured %" PRId64 ", replayed %" PRId64 "\n",
                   st.nodes_gpu, st.nodes_cpu, st.node_runs_gpu, st.node_runs_cpu, st.device_mallocs, st.copies_to_device,
                   st.copies_to_host, st.graphs_captured, st.graphs_replayed);
        if (a.provider == KILN_PROVIDER_CUDA && st.graphs_note[0]) printf("gpu: not recorded: %s\n", st.graphs_note);
        if (a.provider == KILN_PROVIDER_CUDA && (st.kernels_generated || st.kernels_note[0]))
            printf("gpu: generated kernels %d (%d from the cache)%s%s\n", st.kernels_generated, st.kernels_from_cache,
                   st.kernels_note[0] ? "; " : "", st.kernels_note);
    }
out:
    cli_free_values(in, n_in);
    free(in);
    free(out);
    free(in_names);
    free(out_names);
    cli_free_run_args(&a);
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
    if (!strcmp(cmd, "verify")) return cmd_verify(argc - 2, argv + 2);
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench-llm")) return cmd_bench_llm(argc - 2, argv + 2);
    cli_fail("unknown command '%s'", cmd);
    fputs(usage, stderr);
    return 2;
}
