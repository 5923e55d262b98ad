/* generate.c - `kiln generate` (token ids in, generated ids out) and `kiln bench-llm` (prompt
 * processing and token generation timings in the manner of onnxruntime-genai's model_benchmark),
 * both over kiln_generator_* on an onnxruntime-genai model folder. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "generate.h"
#include "kiln.h"

#define MAX_PROMPTS 256

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static long peak_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Parses a whole decimal integer in [lo, hi]. */
static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return 1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v)) return 1;
    *out = v;
    return 0;
}

/* "1,2,3" -> ids (malloc'd), n */
static int parse_ids(const char *s, int64_t **ids, int64_t *n)
{
    int64_t cap = 1;
    for (const char *c = s; *c; c++) cap += *c == ',';
    *ids = malloc((size_t)cap * sizeof **ids);
    if (!*ids) return cli_fail("out of memory");
    char *copy = strdup(s), *save = NULL;
    *n = 0;
    int rc = copy ? 0 : cli_fail("out of memory");
    for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; t && !rc; t = strtok_r(NULL, ",", &save))
        if (parse_i64(t, 0, INT32_MAX, &(*ids)[(*n)++])) rc = cli_fail("--prompt-tokens: '%s' is not a token id", t);
    if (!rc && *n == 0) rc = cli_fail("--prompt-tokens: no ids in '%s'", s);
    free(copy);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    const char *dir = NULL;
    int64_t *prompt[MAX_PROMPTS] = {0}, plen[MAX_PROMPTS] = {0}, n_gen = -1;
    int n_prompts = 0, rc = 0;
    bool json = false, greedy = false, sampling = false;
    kiln_generator_params p = kiln_generator_params_default();
    p.do_sample = 0;
    for (int i = 0; i < argc && !rc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x = 0;
        if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--greedy")) greedy = true;
        else if (!v && a[0] == '-') rc = cli_fail("generate: option '%s' needs a value", a);
        else if (!strcmp(a, "--prompt-tokens")) {
            if (n_prompts == MAX_PROMPTS) rc = cli_fail("generate: at most %d prompts", MAX_PROMPTS);
            else rc = parse_ids(v, &prompt[n_prompts], &plen[n_prompts]), n_prompts++, i++;
        } else if (!strcmp(a, "-g") || !strcmp(a, "--max-new-tokens")) {
            if (parse_i64(v, 1, 1 << 24, &n_gen)) rc = cli_fail("generate: -g '%s' is not a count of tokens", v);
            i++;
        } else if (!strcmp(a, "--temperature")) {
            if (parse_double(v, &p.temperature) || p.temperature <= 0) rc = cli_fail("generate: bad --temperature '%s'", v);
            sampling = true, i++;
        } else if (!strcmp(a, "--top-k")) {
            if (parse_i64(v, 0, INT32_MAX, &x)) rc = cli_fail("generate: bad --top-k '%s'", v);
            p.top_k = (int)x, sampling = true, i++;
        } else if (!strcmp(a, "--top-p")) {
            if (parse_double(v, &p.top_p) || p.top_p <= 0 || p.top_p > 1) rc = cli_fail("generate: bad --top-p '%s'", v);
            sampling = true, i++;
        } else if (!strcmp(a, "--seed")) {
            if (parse_i64(v, 0, INT64_MAX, &x)) rc = cli_fail("generate: bad --seed '%s'", v);
            p.seed = (uint64_t)x, sampling = true, i++;
        } else if (!strcmp(a, "--threads")) {
            if (parse_i64(v, 0, 4096, &x)) rc = cli_fail("generate: bad --threads '%s'", v);
            p.num_threads = (int)x, i++;
        } else if (!strcmp(a, "--provider")) {
            rc = cli_parse_provider(v, &p.provider), i++;
        } else if (a[0] == '-') rc = cli_fail("generate: unknown option '%s'", a);
        else if (!dir) dir = a;
        else rc = cli_fail("generate: unexpected argument '%s'", a);
    }
    if (!rc && !dir) rc = cli_fail("generate: missing the model folder");
    if (!rc && !n_prompts) rc = cli_fail("generate: give at least one --prompt-tokens");
    if (!rc && n_gen < 0) rc = cli_fail("generate: give -g N (tokens to generate)");
    if (!rc && greedy && sampling) rc = cli_fail("generate: --greedy and sampling options exclude each other");
    kiln_generator *g = NULL;
    int64_t *tokens = NULL, lmax = 0;
    if (rc) goto out;
    for (int b = 0; b < n_prompts; b++) lmax = plen[b] > lmax ? plen[b] : lmax;
    p.do_sample = sampling;
    p.batch_size = n_prompts;
    p.max_length = lmax + n_gen;
    tokens = calloc((size_t)n_prompts * (size_t)lmax, sizeof *tokens);
    if (!tokens) {
        rc = cli_fail("out of memory");
        goto out;
    }
    for (int b = 0; b < n_prompts; b++) memcpy(tokens + (size_t)b * (size_t)lmax, prompt[b], (size_t)plen[b] * sizeof *tokens);
    if (kiln_generator_create(dir, &p, &g) || kiln_generator_append_tokens(g, n_prompts, plen, tokens)) {
        rc = cli_fail("%s", kiln_generator_last_error(g));
        goto out;
    }
    for (int64_t k = 0; k < n_gen && !kiln_generator_is_done(g); k++)
        if (kiln_generator_generate_next(g)) {
            rc = cli_fail("%s", kiln_generator_last_error(g));
            goto out;
        }
    if (json) printf("{\"tokens\": [");
    for (int b = 0; b < n_prompts; b++) {
        int64_t len;
        const int64_t *seq = kiln_generator_get_sequence(g, b, &len);
        /* the generated ids: an eos ends a sequence, pads follow it while other rows go on */
        int64_t end = len;
        printf(json ? "%s[" : "%s", b ? (json ? ", " : "") : "");
        for (int64_t t = plen[b]; t < end; t++) printf("%s%" PRId64, t > plen[b] ? (json ? ", " : " ") : "", seq[t]);
        printf(json ? "]" : "\n");
    }
    if (json) printf("]}\n");
out:
    kiln_generator_free(g);
    free(tokens);
    for (int b = 0; b < n_prompts; b++) free(prompt[b]);
    return rc;
}

typedef struct series {
    double *v;
    int n, cap;
} series;

static int series_add(series *s, double x)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        double *v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) return 1;
        s->v = v, s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

typedef struct summary {
    double avg, p50, sd;
    int n;
} summary;

static summary summarize(series *s)
{
    summary r = {0};
    if (!s->n) return r;
    double sum = 0;
    for (int i = 0; i < s->n; i++) sum += s->v[i];
    r.avg = sum / s->n;
    for (int i = 0; i < s->n; i++) r.sd += (s->v[i] - r.avg) * (s->v[i] - r.avg);
    r.sd = s->n > 1 ? sqrt(r.sd / (s->n - 1)) : 0;
    qsort(s->v, (size_t)s->n, sizeof *s->v, cli_cmp_double);
    r.p50 = s->n % 2 ? s->v[s->n / 2] : (s->v[s->n / 2 - 1] + s->v[s->n / 2]) / 2;
    r.n = s->n;
    return r;
}

int cmd_bench_llm(int argc, char **argv)
{
    const char *dir = NULL;
    int64_t L = 16, G = 16, reps = 5, warm = 1, B = 1, x = 0;
    bool json = false;
    int rc = 0;
    kiln_generator_params p = kiln_generator_params_default();
    p.do_sample = 0;
    for (int i = 0; i < argc && !rc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *dst = !strcmp(a, "-l") || !strcmp(a, "--prompt_length") ? &L
                       : !strcmp(a, "-g") || !strcmp(a, "--generation_length") ? &G
                       : !strcmp(a, "-r") || !strcmp(a, "--repetitions") ? &reps
                       : !strcmp(a, "-w") || !strcmp(a, "--warmup") ? &warm
                       : !strcmp(a, "-b") || !strcmp(a, "--batch_size") ? &B : NULL;
        if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) continue;
        else if (!v && a[0] == '-') rc = cli_fail("bench-llm: option '%s' needs a value", a);
        else if (dst) {
            int64_t lo = dst == &warm ? 0 : 1;
            if (parse_i64(v, lo, dst == &B ? 4096 : 1 << 24, dst)) rc = cli_fail("bench-llm: bad value '%s' for %s", v, a);
            i++;
        } else if (!strcmp(a, "-i") || !strcmp(a, "--input_folder")) dir = v, i++;
        else if (!strcmp(a, "--provider")) rc = cli_parse_provider(v, &p.provider), i++;
        else if (!strcmp(a, "--threads")) {
            if (parse_i64(v, 0, 4096, &x)) rc = cli_fail("bench-llm: bad --threads '%s'", v);
            p.num_threads = (int)x, i++;
        } else rc = cli_fail("bench-llm: unknown option '%s'", a);
    }
    if (!rc && !dir) rc = cli_fail("bench-llm: missing -i MODEL_FOLDER");
    if (rc) return rc;
    p.batch_size = (int)B;
    p.max_length = L + G;
    int64_t *tokens = malloc((size_t)(B * L) * sizeof *tokens), *lens = malloc((size_t)B * sizeof *lens);
    series prompt = {0}, gen = {0}, sample = {0}, e2e = {0};
    kiln_genai_model *model = NULL;
    kiln_session_stats last = {0}; /* the last generator's session */
    int64_t dev_peak = 0;          /* the most device memory one generator's session held */
    if (!tokens || !lens) {
        rc = cli_fail("out of memory");
        goto out;
    }
    for (int64_t i = 0; i < B * L; i++) tokens[i] = 4 + (i * 7919) % 50; /* ids every vocabulary has */
    for (int64_t b = 0; b < B; b++) lens[b] = L;
    /* the model opened and compiled once; a generator (and its KV cache) per iteration, as
     * model_benchmark makes them */
    kiln_session_options so = kiln_session_options_default();
    so.provider = p.provider;
    so.num_threads = p.num_threads;
    if (kiln_genai_model_open(dir, &so, &model)) {
        rc = cli_fail("%s", kiln_genai_model_last_error(model));
        goto out;
    }
    double t_start = now_us(), last_progress = t_start;
    for (int64_t it = 0; it < warm + reps && !rc; it++) {
        bool timed = it >= warm;
        kiln_generator *g = NULL;
        if (kiln_generator_create_from(model, &p, &g)) {
            rc = cli_fail("%s", kiln_generator_last_error(g));
            kiln_generator_free(g);
            break;
        }
        double t0 = now_us();
        if (kiln_generator_append_tokens(g, (int)B, lens, tokens)) rc = cli_fail("%s", kiln_generator_last_error(g));
        double t1 = now_us();
        if (!rc && kiln_generator_generate_next(g)) rc = cli_fail("%s", kiln_generator_last_error(g));
        double t2 = now_us();
        if (!rc && timed) rc = series_add(&prompt, t2 - t0) || series_add(&sample, t2 - t1);
        for (int64_t k = 1; k < G && !rc && !kiln_generator_is_done(g); k++) {
            double a = now_us();
            if (kiln_generator_generate_next(g)) rc = cli_fail("%s", kiln_generator_last_error(g));
            if (!rc && timed && series_add(&gen, now_us() - a)) rc = cli_fail("out of memory");
        }
        if (!rc && timed && series_add(&e2e, (now_us() - t0) / 1e3)) rc = cli_fail("out of memory");
        if (!rc && !kiln_generator_session_stats(g, &last) && last.device_bytes_peak > dev_peak)
            dev_peak = last.device_bytes_peak;
        kiln_generator_free(g);
        if (!json && now_us() - last_progress > 5e6) {
            fprintf(stderr, "bench-llm: iteration %" PRId64 " of %" PRId64 " (%.0f s)\n", it + 1, warm + reps,
                    (now_us() - t_start) / 1e6);
            last_progress = now_us();
        }
    }
    if (rc) goto out;
    summary sp = summarize(&prompt), sg = summarize(&gen), ss = summarize(&sample), se = summarize(&e2e);
    long peak = peak_rss_bytes();
    double p_tps = sp.avg > 0 ? (double)(B * L) / (sp.avg / 1e6) : 0, g_tps = sg.avg > 0 ? (double)B / (sg.avg / 1e6) : 0;
    if (json) {
        printf("{\"batch_size\": %" PRId64 ", \"prompt_length\": %" PRId64 ", \"generation_length\": %" PRId64
               ", \"repetitions\": %" PRId64 ", \"warmup\": %" PRId64 ", "
               "\"prompt\": {\"avg_us\": %.3f, \"p50_us\": %.3f, \"stddev_us\": %.3f, \"n\": %d, \"tokens_per_s\": %.3f}, "
               "\"generation\": {\"avg_us\": %.3f, \"p50_us\": %.3f, \"stddev_us\": %.3f, \"n\": %d, \"tokens_per_s\": %.3f}, "
               "\"sampling\": {\"avg_us\": %.3f, \"p50_us\": %.3f, \"stddev_us\": %.3f, \"n\": %d}, "
               "\"e2e\": {\"avg_ms\": %.3f, \"p50_ms\": %.3f, \"stddev_ms\": %.3f, \"n\": %d}, "
               "\"peak_rss_bytes\": %ld, \"peak_device_bytes\": %" PRId64 ", \"graphs_captured\": %" PRId64
               ", \"graphs_replayed\": %" PRId64 "}\n",
               B, L, G, reps, warm, sp.avg, sp.p50, sp.sd, sp.n, p_tps, sg.avg, sg.p50, sg.sd, sg.n, g_tps, ss.avg,
               ss.p50, ss.sd, ss.n, se.avg, se.p50, se.sd, se.n, peak, dev_peak, last.graphs_captured,
               last.graphs_replayed);
    } else {
        printf("Batch size: %" PRId64 ", prompt tokens: %" PRId64 ", tokens to generate: %" PRId64 "\n", B, L, G);
        printf("Prompt processing (time to first token):\n\tavg (us):       %.3f\n\tavg (tokens/s): %.3f\n"
               "\tp50 (us):       %.3f\n\tstddev (us):    %.3f\n\tn:              %d * %" PRId64 " token(s)\n",
               sp.avg, p_tps, sp.p50, sp.sd, sp.n, B * L);
        printf("Token generation:\n\tavg (us):       %.3f\n\tavg (tokens/s): %.3f\n\tp50 (us):       %.3f\n"
               "\tstddev (us):    %.3f\n\tn:              %d * %" PRId64 " token(s)\n",
               sg.avg, g_tps, sg.p50, sg.sd, sg.n, B);
        printf("Token sampling:\n\tavg (us):       %.3f\n\tp50 (us):       %.3f\n\tstddev (us):    %.3f\n\tn:              %d\n",
               ss.avg, ss.p50, ss.sd, ss.n);
        printf("E2E generation (entire generation loop):\n\tavg (ms):       %.3f\n\tp50 (ms):       %.3f\n"
               "\tstddev (ms):    %.3f\n\tn:              %d\n", se.avg, se.p50, se.sd, se.n);
        printf("Peak working set size (bytes): %ld\n", peak);
        if (p.provider == KILN_PROVIDER_CUDA) printf("Peak device memory of the session (bytes): %" PRId64 "\n", dev_peak);
        if (p.provider == KILN_PROVIDER_CUDA)
            printf("CUDA graphs (last generator): %" PRId64 " recorded, %" PRId64 " replayed%s%s\n", last.graphs_captured,
                   last.graphs_replayed, last.graphs_note[0] ? "; last unrecorded run: " : "", last.graphs_note);
    }
out:
    kiln_genai_model_free(model);
    free(tokens);
    free(lens);
    free(prompt.v);
    free(gen.v);
    free(sample.v);
    free(e2e.v);
    return rc;
}
