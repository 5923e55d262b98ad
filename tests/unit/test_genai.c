/* test_genai.c - genai_config.json parsing (valid, truncated, mistyped and hostile configs, a
 * filename leaving the folder) and generator create/append/generate/free cycles on a generated
 * model folder (argument 1; tests/models/make_llm.py) with memory that stays flat, from the folder
 * each time and from one kiln_genai_model (in turn, on two threads, outliving its handle). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "genai/config.h"
#include "kiln.h"
#include "unit.h"

static const char *good =
    "{\"model\": {\"bos_token_id\": 1, \"context_length\": 256, \"eos_token_id\": [2, 3], \"pad_token_id\": 0,"
    " \"vocab_size\": 512, \"decoder\": {\"filename\": \"model.onnx\", \"head_size\": 16, \"hidden_size\": 64,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2,"
    " \"session_options\": {\"provider_options\": [{\"cuda\": {}}]},"
    " \"inputs\": {\"input_ids\": \"input_ids\", \"attention_mask\": \"attention_mask\","
    " \"past_key_names\": \"past_key_values.%d.key\", \"past_value_names\": \"past_key_values.%d.value\"},"
    " \"outputs\": {\"logits\": \"logits\", \"present_key_names\": \"present.%d.key\","
    " \"present_value_names\": \"present.%d.value\"}}},"
    " \"search\": {\"max_length\": 128, \"do_sample\": true, \"top_k\": 5, \"top_p\": 0.9, \"temperature\": 0.7,"
    " \"past_present_share_buffer\": true}}";

/* good with the first occurrence of `from` replaced by `to` */
static kiln_status parse_edit(const char *from, const char *to, kiln_genai_config *c, kiln_err *e)
{
    static char buf[8192];
    const char *at = strstr(good, from);
    if (!at) {
        fprintf(stderr, "test_genai: '%s' not in the config\n", from);
        return KILN_ERR_INVALID_ARG;
    }
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - good), good, to, at + strlen(from));
    kiln_status st = kiln_genai_config_parse(buf, strlen(buf), c, e);
    return st;
}

static void test_parse(void)
{
    kiln_genai_config c;
    kiln_err e = {0};
    CHECK(kiln_genai_config_parse(good, strlen(good), &c, &e) == KILN_OK);
    CHECK(c.num_heads == 4 && c.kv_heads == 2 && c.head_size == 16 && c.hidden_size == 64 && c.layers == 2);
    CHECK(c.context_length == 256 && c.max_length == 128 && c.vocab_size == 512);
    CHECK(c.n_eos == 2 && c.eos[0] == 2 && c.eos[1] == 3 && c.bos == 1 && c.pad == 0);
    CHECK(c.do_sample && c.share_buffer && c.top_k == 5 && c.top_p == 0.9 && c.temperature == 0.7);
    CHECK(!strcmp(c.provider, "cuda") && !strcmp(c.filename, "model.onnx"));
    CHECK(!strcmp(c.past_key, "past_key_values.%d.key"));
    char name[KILN_GENAI_NAME_MAX];
    CHECK(kiln_genai_name(c.present_value, 17, name, sizeof name, &e) == KILN_OK && !strcmp(name, "present.17.value"));
    CHECK(kiln_genai_name(c.present_value, 17, name, 8, &e) == KILN_ERR_MODEL);

    /* truncated at every length: an error, never a crash */
    size_t n = strlen(good);
    int errors = 0;
    for (size_t k = 0; k < n; k++) errors += kiln_genai_config_parse(good, k, &c, &e) != KILN_OK;
    CHECK(errors == (int)n);

    struct { const char *from, *to, *says; } bad[] = {
        {"\"head_size\": 16", "\"head_size\": \"16\"", "head_size must be an integer"},
        {"\"head_size\": 16", "\"head_size\": 16.5", "head_size must be an integer"},
        {"\"head_size\": 16", "\"head_size\": -1", "out of range"},
        {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 99999999999999999999999", "out of range"},
        {"\"context_length\": 256", "\"context_length\": 9223372036854775807", "out of range"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "not a multiple"},
        {"\"max_length\": 128", "\"max_length\": 100000", "exceeds context_length"},
        {"\"head_size\": 16,", "", "head_size is missing"},
        {"\"filename\": \"model.onnx\"", "\"filename\": \"../model.onnx\"", "leaves the model folder"},
        {"\"filename\": \"model.onnx\"", "\"filename\": \"a/../../model.onnx\"", "leaves the model folder"},
        {"\"filename\": \"model.onnx\"", "\"filename\": \"/etc/passwd\"", "relative path"},
        {"\"filename\": \"model.onnx\"", "\"filename\": \"\"", "1 to"},
        {"past_key_values.%d.key", "past_key_values.%s.key", "no other"},
        {"past_key_values.%d.key", "past_key_values.%d.%d.key", "exactly one"},
        {"past_key_values.%d.key", "past_key_values.%n.key", "no other"},
        {"past_key_values.%d.key", "past_key_values.key", "exactly one"},
        {"present.%d.value", "present.%d.value%", "no other"},
        {"\"eos_token_id\": [2, 3]", "\"eos_token_id\": [2, -3]", "eos_token_id[1]"},
        {"\"eos_token_id\": [2, 3]", "\"eos_token_id\": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", "at most"},
        {"\"eos_token_id\": [2, 3]", "\"eos_token_id\": \"2\"", "integer or a list"},
        {"\"top_p\": 0.9", "\"top_p\": 1.5", "out of range"},
        {"\"temperature\": 0.7", "\"temperature\": 0", "out of range"},
        {"\"temperature\": 0.7", "\"temperature\": 1e999", "temperature"},
        {"\"do_sample\": true", "\"do_sample\": 1", "true or false"},
        {"\"input_ids\": \"input_ids\"", "\"input_ids\": 7", "must be a string"},
        {"\"input_ids\": \"input_ids\"", "\"input_ids\": \"a\\u0001b\"", "control character"},
        {"\"search\": {", "\"search\": {\"num_beams\": 4, ", "num_beams"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        kiln_status st = parse_edit(bad[k].from, bad[k].to, &c, &e);
        bool ok = st != KILN_OK && strstr(e.msg, bad[k].says);
        if (!ok) fprintf(stderr, "case %zu (%s): status %d, message '%s'\n", k, bad[k].to, st, e.msg);
        CHECK(ok);
    }
    /* a long name: bounded, not copied past its field */
    char longname[400];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    char edit[512];
    snprintf(edit, sizeof edit, "\"input_ids\": \"%s\"", longname);
    CHECK(parse_edit("\"input_ids\": \"input_ids\"", edit, &c, &e) == KILN_ERR_MODEL);
    /* not JSON, trailing text, a NUL, deep nesting, the wrong top-level type */
    CHECK(kiln_genai_config_parse("[]", 2, &c, &e) == KILN_ERR_MODEL);
    CHECK(kiln_genai_config_parse("{} x", 4, &c, &e) == KILN_ERR_MODEL);
    CHECK(kiln_genai_config_parse("{\"a\":\0}", 7, &c, &e) == KILN_ERR_MODEL);
    static char deep[20000];
    for (int k = 0; k < 10000; k++) deep[k] = '[';
    for (int k = 0; k < 10000; k++) deep[10000 + k] = ']';
    CHECK(kiln_genai_config_parse(deep, sizeof deep, &c, &e) == KILN_ERR_MODEL);
    CHECK(kiln_genai_config_parse(NULL, 0, &c, &e) == KILN_ERR_INVALID_ARG);
}

/* A folder whose model file is a symlink out of it: refused after resolving. */
static void test_symlink_escape(void)
{
    char dir[] = "/tmp/kiln_genai_XXXXXX";
    if (!mkdtemp(dir)) return;
    char path[512];
    snprintf(path, sizeof path, "%s/genai_config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(good, f);
    fclose(f);
    char link[512];
    snprintf(link, sizeof link, "%s/model.onnx", dir);
    CHECK(symlink("/etc/hostname", link) == 0);
    kiln_genai_config c;
    kiln_err e = {0};
    char model[4096];
    CHECK(kiln_genai_config_load(dir, &c, model, sizeof model, &e) == KILN_ERR_MODEL && strstr(e.msg, "outside"));
    kiln_generator *g = NULL;
    CHECK(kiln_generator_create(dir, NULL, &g) == KILN_ERR_MODEL && strstr(kiln_generator_last_error(g), "outside"));
    kiln_generator_free(g);
    unlink(link);
    /* no model file at all */
    CHECK(kiln_genai_config_load(dir, &c, model, sizeof model, &e) == KILN_ERR_IO);
    unlink(path);
    rmdir(dir);
    g = NULL;
    CHECK(kiln_generator_create("/nonexistent/folder", NULL, &g) == KILN_ERR_IO && g);
    kiln_generator_free(g);
    kiln_generator_free(NULL);
    CHECK(kiln_generator_is_done(NULL));
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static const int64_t cycle_prompt[2][6] = {{5, 17, 33, 100, 7, 250}, {9, 44, 301, 0, 0, 0}}, cycle_lens[2] = {6, 3};

static kiln_generator_params cycle_params(void)
{
    kiln_generator_params p = kiln_generator_params_default();
    p.batch_size = 2;
    p.max_length = 14;
    return p;
}

/* One cycle's prompt and 8 greedy steps on g (batch 2, max_length 14): the tokens into out,
 * the API's refusals checked on the way. */
static void run_cycle(kiln_generator *g, int64_t out[2][8])
{
    CHECK(kiln_generator_generate_next(g) == KILN_ERR_INVALID_ARG); /* no prompt yet */
    CHECK(kiln_generator_append_tokens(g, 1, cycle_lens, cycle_prompt[0]) == KILN_ERR_INVALID_ARG);
    CHECK(kiln_generator_append_tokens(g, 2, cycle_lens, cycle_prompt[0]) == KILN_OK);
    CHECK(kiln_generator_append_tokens(g, 2, cycle_lens, cycle_prompt[0]) == KILN_ERR_INVALID_ARG); /* once */
    int steps = 0;
    while (!kiln_generator_is_done(g) && kiln_generator_generate_next(g) == KILN_OK) {
        const int64_t *next;
        int n = 0;
        CHECK(kiln_generator_get_next_tokens(g, &next, &n) == KILN_OK && n == 2);
        for (int b = 0; b < 2 && steps < 8; b++) out[b][steps] = next[b];
        steps++;
    }
    CHECK(steps == 8);
    CHECK(kiln_generator_generate_next(g) == KILN_ERR_INVALID_ARG &&
          strstr(kiln_generator_last_error(g), "max_length"));
}

static bool same_tokens(int64_t a[2][8], int64_t b[2][8]) { return !memcmp(a, b, sizeof(int64_t[2][8])); }

/* 100 create / prompt / generate / free cycles: same tokens each time, flat memory. The
 * tokens of the first cycle into first. */
static void test_cycles(const char *dir, int64_t first[2][8])
{
    long rss10 = 0;
    for (int cyc = 0; cyc < 100; cyc++) {
        kiln_generator_params p = cycle_params();
        kiln_generator *g = NULL;
        kiln_status st = kiln_generator_create(dir, &p, &g);
        if (st) fprintf(stderr, "test_genai: %s\n", kiln_generator_last_error(g));
        CHECK(st == KILN_OK);
        if (st) {
            kiln_generator_free(g);
            return;
        }
        int64_t toks[2][8];
        run_cycle(g, cyc ? toks : first);
        if (cyc) CHECK(same_tokens(toks, first));
        kiln_session_stats s;
        CHECK(kiln_generator_session_stats(g, &s) == KILN_OK && s.compilations == 1 && s.runs == 8);
        kiln_generator_free(g);
        if (cyc == 9) rss10 = rss_kb();
    }
    long rss100 = rss_kb();
    printf("test_genai: 100 generator cycles, RSS %ld kB after 10, %ld kB after 100\n", rss10, rss100);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* the sanitizers keep freed blocks (AddressSanitizer's quarantine) and shadow memory: RSS
     * grows by design; the leak checker runs at exit instead */
    printf("test_genai: RSS not compared under a sanitizer\n");
#else
    CHECK(rss100 - rss10 < 2048);
#endif
}

typedef struct thread_run {
    kiln_genai_model *m;
    int64_t toks[2][8];
    kiln_status st;
} thread_run;

/* A cycle's prompt and steps on a thread of its own (the checks are the main thread's: CHECK's
 * counters are not atomic). */
static void *generate_on_thread(void *arg)
{
    thread_run *t = arg;
    kiln_generator_params p = cycle_params();
    kiln_generator *g = NULL;
    t->st = kiln_generator_create_from(t->m, &p, &g);
    if (!t->st) t->st = kiln_generator_append_tokens(g, 2, cycle_lens, cycle_prompt[0]);
    for (int k = 0; k < 8 && !t->st; k++) {
        const int64_t *next;
        t->st = kiln_generator_generate_next(g);
        if (!t->st) t->st = kiln_generator_get_next_tokens(g, &next, NULL);
        if (!t->st) t->toks[0][k] = next[0], t->toks[1][k] = next[1];
    }
    kiln_generator_free(g);
    return NULL;
}

/* One model, compiled once, for many generators: 100 cycles of kiln_generator_create_from with
 * the tokens of test_cycles and flat memory; two generators stepped in turn; two on two threads
 * at once; generators outliving the caller's reference; the errors. */
static void test_shared_model(const char *dir, int64_t first[2][8])
{
    kiln_genai_model *m = NULL;
    kiln_status st = kiln_genai_model_open(dir, NULL, &m);
    if (st) fprintf(stderr, "test_genai: %s\n", kiln_genai_model_last_error(m));
    CHECK(st == KILN_OK && m && !*kiln_genai_model_last_error(m));
    if (st) {
        kiln_genai_model_free(m);
        return;
    }
    long rss10 = 0;
    kiln_session_stats s = {0};
    for (int cyc = 0; cyc < 100; cyc++) {
        kiln_generator_params p = cycle_params();
        p.provider = KILN_PROVIDER_CUDA; /* not used: the model's options apply */
        kiln_generator *g = NULL;
        CHECK(kiln_generator_create_from(m, &p, &g) == KILN_OK);
        int64_t toks[2][8];
        run_cycle(g, toks);
        CHECK(same_tokens(toks, first));
        CHECK(kiln_generator_session_stats(g, &s) == KILN_OK);
        kiln_generator_free(g);
        if (cyc == 9) rss10 = rss_kb();
    }
    CHECK(s.compilations == 1 && s.runs == 800);
    long rss100 = rss_kb();
    printf("test_genai: 100 generators of one model, RSS %ld kB after 10, %ld kB after 100\n", rss10, rss100);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    CHECK(rss100 - rss10 < 2048);
#endif
    /* two generators stepped in turn: each its own cache */
    kiln_generator_params p = cycle_params();
    kiln_generator *a = NULL, *b = NULL;
    CHECK(kiln_generator_create_from(m, &p, &a) == KILN_OK && kiln_generator_create_from(m, &p, &b) == KILN_OK);
    CHECK(kiln_generator_append_tokens(a, 2, cycle_lens, cycle_prompt[0]) == KILN_OK);
    CHECK(kiln_generator_append_tokens(b, 2, cycle_lens, cycle_prompt[0]) == KILN_OK);
    int64_t ta[2][8], tb[2][8];
    for (int k = 0; k < 8; k++) {
        const int64_t *next;
        CHECK(kiln_generator_generate_next(a) == KILN_OK && kiln_generator_get_next_tokens(a, &next, NULL) == KILN_OK);
        ta[0][k] = next[0], ta[1][k] = next[1];
        CHECK(kiln_generator_generate_next(b) == KILN_OK && kiln_generator_get_next_tokens(b, &next, NULL) == KILN_OK);
        tb[0][k] = next[0], tb[1][k] = next[1];
    }
    CHECK(same_tokens(ta, first) && same_tokens(tb, first));
    kiln_generator_free(a);
    kiln_generator_free(b);
    /* two threads at once */
    thread_run tr[2] = {{.m = m}, {.m = m}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, generate_on_thread, &tr[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) CHECK(tr[i].st == KILN_OK && same_tokens(tr[i].toks, first));
    /* a generator outlives the caller's reference */
    kiln_generator *g = NULL;
    CHECK(kiln_generator_create_from(m, &p, &g) == KILN_OK);
    kiln_genai_model_free(m);
    int64_t toks[2][8];
    run_cycle(g, toks);
    CHECK(same_tokens(toks, first));
    kiln_generator_free(g);
    /* errors */
    g = NULL;
    CHECK(kiln_generator_create_from(NULL, &p, &g) == KILN_ERR_INVALID_ARG && g &&
          strstr(kiln_generator_last_error(g), "no model"));
    kiln_generator_free(g);
    m = NULL;
    CHECK(kiln_genai_model_open("/nonexistent/folder", NULL, &m) == KILN_ERR_IO && m &&
          strstr(kiln_genai_model_last_error(m), "genai_config.json"));
    g = NULL;
    CHECK(kiln_generator_create_from(m, &p, &g) == KILN_ERR_INVALID_ARG && g); /* a failed open's handle */
    kiln_generator_free(g);
    kiln_genai_model_free(m);
    kiln_genai_model_free(NULL);
    CHECK(kiln_genai_model_open(dir, NULL, NULL) == KILN_ERR_INVALID_ARG);
}

int main(int argc, char **argv)
{
    test_parse();
    test_symlink_escape();
    int64_t first[2][8];
    if (argc > 1) test_cycles(argv[1], first), test_shared_model(argv[1], first);
    else printf("test_genai: no model folder given, generator cycles not run\n");
    return unit_report("test_genai");
}
