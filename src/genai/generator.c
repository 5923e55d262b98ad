/* generator.c - token generation over a decoder in onnxruntime-genai's folder layout: the prompt
 * run, greedy or sampled choice, and a KV cache allocated once at max_length that each step
 * writes in place (shared past/present) or into its second half (present -> next past). On a
 * device provider (CUDA) the cache is device memory: past inputs and present outputs are bound
 * to it, so only the ids, the mask and the logits cross the bus. */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/value.h"
#include "exec/exec.h"
#include "genai/config.h"
#include "kiln.h"

#define MAX_BATCH 4096

/* A model folder opened and compiled once; generators hold references (the last one out frees). */
struct kiln_genai_model {
    kiln_err err;
    kiln_session *s;
    kiln_genai_config cfg;
    atomic_int refs;
};

struct kiln_generator {
    kiln_err err;
    kiln_genai_model *m; /* a reference */
    kiln_session *s; /* m's */
    kiln_genai_config cfg; /* a copy of m's */
    kiln_generator_params p;     /* resolved: no "from the config" values left */
    int B, L;                    /* batch, layers */
    int64_t T;                   /* max_length: the cache's capacity in positions */
    int64_t V;                   /* vocab, known after the prompt */
    size_t kv_elem;              /* bytes of one cache element */
    bool on_device;              /* the cache is device memory of the session's device */
    /* decode steps' attention mask is max_length wide (ones, then zeros), as onnxruntime-genai
     * feeds it for CUDA graphs, wherever the cache is shared: every decode step then has the same
     * shapes (seqlens_k, computed from the mask, carries the length), so on the device it replays
     * one recording and on the host it reuses one memory plan (a growing mask made each step a
     * new binding, whose plan took ~8% of a mid-size model's decode step, perf); prompts keep
     * their own width (a first prompt) */
    bool static_mask;
    int64_t past;                /* positions in the cache (the same for every row) */
    int64_t gen;                 /* generated tokens per row */
    int64_t prompt_max;          /* longest prompt */
    bool prompted, pending;      /* pending: next[] chosen but not yet run through the model */
    /* names and values of one step: inputs [ids, mask?, position_ids?, past k/v per layer],
     * outputs [logits, present k/v per layer] */
    int n_in, n_out, in_mask, in_pos, in_past;
    char (*names)[KILN_GENAI_NAME_MAX];
    const char **in_names, **out_names;
    kiln_value **in_vals;        /* headers made once; each step sets their dims */
    kiln_value **bind;           /* [n_out] storage for the outputs (logits, the presents) */
    kiln_value **outs;           /* [n_out] a step's output headers */
    void *(*kv)[2][2];           /* [L][key/value][buffer]: B * kv_heads * T * head_size elements,
                                  * host or (on_device) device memory */
    int cur;                     /* the buffer holding the past (unshared cache) */
    int64_t *ids, *mask, *pos;   /* [B * T] a step's input_ids, attention_mask, position_ids */
    int64_t *mask_hist;          /* [B * T] unshared cache: mask of every cached position */
    int64_t *seq, *seq_len;      /* [B * T], [B] */
    int64_t *plen;               /* [B] prompt lengths */
    int64_t *next;               /* [B] */
    int64_t *ones;               /* [B] all 1: a decode step's new positions per row */
    bool *eos;                   /* [B] */
    float *logits;               /* [B * V] the last position's logits */
    kiln_dtype logit_dtype;      /* the model's logits: float32, float16 or bfloat16 */
    void *step_logits;           /* [B * V] of logit_dtype: storage for decode steps' logits output */
    int *idx;                    /* [V] sampling scratch */
    double *prob;                /* [V] */
    uint64_t rng;
    int64_t kv_copies;           /* presents the session did not write in place (copied in) */
};

kiln_generator_params kiln_generator_params_default(void)
{
    return (kiln_generator_params){.max_length = 0, .batch_size = 1, .do_sample = 0, .temperature = 0,
                                   .top_k = -1, .top_p = 0, .seed = 0, .provider = KILN_PROVIDER_CPU};
}

/* Points header v at data with the given shape (no allocation). */
static void set_view(kiln_value *v, void *data, int rank, const int64_t *dims, size_t elem)
{
    int64_t n = 1;
    v->rank = rank;
    for (int k = 0; k < rank; k++) {
        v->dims[k] = dims[k];
        n *= dims[k];
    }
    v->numel = n;
    v->nbytes = (size_t)n * elem;
    v->data = n ? data : NULL;
}

static kiln_status mul_size(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? KILN_ERR_NOMEM : KILN_OK;
}

/* The session's input or output named name: its info, or -1. */
static int find_io(const kiln_session *s, bool output, const char *name, kiln_io_info *io)
{
    int n = output ? kiln_session_output_count(s) : kiln_session_input_count(s);
    for (int i = 0; i < n; i++) {
        if ((output ? kiln_session_output_info(s, i, io) : kiln_session_input_info(s, i, io)) != KILN_OK) continue;
        if (!strcmp(io->name, name)) return i;
    }
    return -1;
}

/* A past or present tensor's declared shape agrees with [batch, kv_heads, ?, head_size]. */
static kiln_status check_kv_io(kiln_generator *g, const kiln_io_info *io, const char *what)
{
    const kiln_genai_config *c = &g->cfg;
    if (io->kind != KILN_VALUE_TENSOR || io->rank != 4)
        return kiln_errf(&g->err, KILN_ERR_MODEL, "%s '%s' must be a rank-4 tensor [batch, kv_heads, seq, head_size]",
                         what, io->name);
    if ((io->dims[1] >= 0 && io->dims[1] != c->kv_heads) || (io->dims[3] >= 0 && io->dims[3] != c->head_size) ||
        (io->dims[0] >= 0 && io->dims[0] != g->B))
        return kiln_errf(&g->err, KILN_ERR_MODEL,
                         "%s '%s' has dims that disagree with genai_config.json (batch %d, kv_heads %d, "
                         "head_size %d)",
                         what, io->name, g->B, c->kv_heads, c->head_size);
    size_t e = kiln_dtype_size(io->dtype);
    if (io->dtype != KILN_DTYPE_FLOAT32 && io->dtype != KILN_DTYPE_FLOAT16 && io->dtype != KILN_DTYPE_BFLOAT16)
        return kiln_errf(&g->err, KILN_ERR_UNSUPPORTED,
                         "%s '%s' is %s: the KV cache takes float32, float16 or bfloat16", what, io->name,
                         kiln_dtype_name(io->dtype));
    if (g->kv_elem && g->kv_elem != e)
        return kiln_errf(&g->err, KILN_ERR_MODEL, "%s '%s' has another element type than the other cache tensors", what,
                         io->name);
    g->kv_elem = e;
    return KILN_OK;
}

static kiln_status setup_names(kiln_generator *g)
{
    const kiln_genai_config *c = &g->cfg;
    int L = g->L;
    g->in_mask = c->attention_mask[0] ? 1 : 0;
    g->in_pos = c->position_ids[0] ? 1 : 0;
    g->in_past = 1 + g->in_mask + g->in_pos;
    g->n_in = g->in_past + 2 * L;
    g->n_out = 1 + 2 * L;
    g->names = calloc((size_t)(g->n_in + g->n_out), sizeof *g->names);
    g->in_names = calloc((size_t)g->n_in, sizeof *g->in_names);
    g->out_names = calloc((size_t)g->n_out, sizeof *g->out_names);
    g->in_vals = calloc((size_t)g->n_in, sizeof *g->in_vals);
    g->bind = calloc((size_t)g->n_out, sizeof *g->bind);
    g->outs = calloc((size_t)g->n_out, sizeof *g->outs);
    if (!g->names || !g->in_names || !g->out_names || !g->in_vals || !g->bind || !g->outs)
        return kiln_errf(&g->err, KILN_ERR_NOMEM, "out of memory");
    char(*nm)[KILN_GENAI_NAME_MAX] = g->names;
    snprintf(nm[0], sizeof nm[0], "%s", c->input_ids);
    if (g->in_mask) snprintf(nm[1], sizeof nm[1], "%s", c->attention_mask);
    if (g->in_pos) snprintf(nm[1 + g->in_mask], sizeof nm[0], "%s", c->position_ids);
    for (int l = 0; l < L; l++) {
        KILN_TRY(kiln_genai_name(c->past_key, l, nm[g->in_past + 2 * l], sizeof nm[0], &g->err));
        KILN_TRY(kiln_genai_name(c->past_value, l, nm[g->in_past + 2 * l + 1], sizeof nm[0], &g->err));
    }
    char(*on)[KILN_GENAI_NAME_MAX] = nm + g->n_in;
    snprintf(on[0], sizeof on[0], "%s", c->logits);
    for (int l = 0; l < L; l++) {
        KILN_TRY(kiln_genai_name(c->present_key, l, on[1 + 2 * l], sizeof on[0], &g->err));
        KILN_TRY(kiln_genai_name(c->present_value, l, on[2 + 2 * l], sizeof on[0], &g->err));
    }
    for (int i = 0; i < g->n_in; i++) g->in_names[i] = nm[i];
    for (int j = 0; j < g->n_out; j++) g->out_names[j] = on[j];
    return KILN_OK;
}

/* Checks the session has every input and output the config names, with sensible types. */
static kiln_status check_session(kiln_generator *g)
{
    kiln_io_info io;
    for (int i = 0; i < g->n_in; i++) {
        if (find_io(g->s, false, g->in_names[i], &io) < 0)
            return kiln_errf(&g->err, KILN_ERR_MODEL, "the model has no input '%s' (named by genai_config.json)",
                             g->in_names[i]);
        if (i < g->in_past && (io.kind != KILN_VALUE_TENSOR || io.dtype != KILN_DTYPE_INT64 || io.rank != 2))
            return kiln_errf(&g->err, KILN_ERR_UNSUPPORTED, "input '%s' must be an int64 tensor of rank 2", io.name);
        if (i >= g->in_past) KILN_TRY(check_kv_io(g, &io, "past input"));
    }
    int n_model_in = kiln_session_input_count(g->s);
    for (int i = 0; i < n_model_in; i++) {
        kiln_session_input_info(g->s, i, &io);
        bool known = false;
        for (int k = 0; k < g->n_in && !known; k++) known = !strcmp(g->in_names[k], io.name);
        if (!known)
            return kiln_errf(&g->err, KILN_ERR_UNSUPPORTED, "the model's input '%s' is not one genai_config.json names",
                             io.name);
    }
    for (int j = 0; j < g->n_out; j++) {
        if (find_io(g->s, true, g->out_names[j], &io) < 0)
            return kiln_errf(&g->err, KILN_ERR_MODEL, "the model has no output '%s' (named by genai_config.json)",
                             g->out_names[j]);
        if (j == 0 && (io.kind != KILN_VALUE_TENSOR || (io.dtype != KILN_DTYPE_FLOAT32 && io.dtype != KILN_DTYPE_FLOAT16 &&
                                                         io.dtype != KILN_DTYPE_BFLOAT16)))
            return kiln_errf(&g->err, KILN_ERR_UNSUPPORTED,
                             "output '%s' is %s: kiln's generator reads float32, float16 or bfloat16 "
                             "logits",
                             io.name, kiln_dtype_name(io.dtype));
        if (j == 0) g->logit_dtype = io.dtype;
        if (j > 0) KILN_TRY(check_kv_io(g, &io, "present output"));
    }
    return KILN_OK;
}

static kiln_status alloc_state(kiln_generator *g)
{
    const kiln_genai_config *c = &g->cfg;
    size_t BT, per, bytes;
    if (mul_size((size_t)g->B, (size_t)g->T, &BT) || mul_size(BT, (size_t)c->kv_heads, &per) ||
        mul_size(per, (size_t)c->head_size, &per) || mul_size(per, g->kv_elem, &bytes))
        return kiln_errf(&g->err, KILN_ERR_NOMEM, "a KV cache of batch %d x %lld tokens overflows", g->B,
                         (long long)g->T);
    g->kv = calloc((size_t)g->L, sizeof *g->kv);
    if (!g->kv) return kiln_errf(&g->err, KILN_ERR_NOMEM, "out of memory");
    int nbuf = c->share_buffer ? 1 : 2;
    for (int l = 0; l < g->L; l++)
        for (int w = 0; w < 2; w++)
            for (int b = 0; b < nbuf; b++) {
                if (g->on_device) {
                    if (kiln_session_device_alloc(g->s, bytes ? bytes : 1, &g->kv[l][w][b]))
                        return kiln_errf(&g->err, KILN_ERR_NOMEM,
                                         "allocating a %zu-byte KV cache buffer (layer %d) on the device: %s", bytes, l,
                                         kiln_last_error(g->s));
                } else if (!(g->kv[l][w][b] = calloc(1, bytes ? bytes : 1))) {
                    return kiln_errf(&g->err, KILN_ERR_NOMEM,
                                     "out of memory allocating a %zu-byte KV cache buffer (layer %d)", bytes, l);
                }
            }
    g->ids = calloc(BT, sizeof *g->ids);
    g->mask = calloc(BT, sizeof *g->mask);
    g->pos = calloc(BT, sizeof *g->pos);
    g->mask_hist = calloc(BT, sizeof *g->mask_hist);
    g->seq = calloc(BT, sizeof *g->seq);
    g->seq_len = calloc((size_t)g->B, sizeof *g->seq_len);
    g->plen = calloc((size_t)g->B, sizeof *g->plen);
    g->next = calloc((size_t)g->B, sizeof *g->next);
    g->ones = calloc((size_t)g->B, sizeof *g->ones);
    g->eos = calloc((size_t)g->B, sizeof *g->eos);
    if (!g->ids || !g->mask || !g->pos || !g->mask_hist || !g->seq || !g->seq_len || !g->plen || !g->next || !g->ones || !g->eos)
        return kiln_errf(&g->err, KILN_ERR_NOMEM, "out of memory");
    int64_t zero[4] = {0, 0, 0, 0};
    for (int i = 0; i < g->n_in; i++) {
        kiln_dtype dt = KILN_DTYPE_INT64;
        if (i >= g->in_past) {
            kiln_io_info io;
            find_io(g->s, false, g->in_names[i], &io);
            dt = io.dtype;
        }
        kiln_status st = i >= g->in_past && g->on_device ? kiln_value_wrap_device_tensor(dt, 4, zero, NULL, 0, &g->in_vals[i])
                                                         : kiln_value_wrap_tensor(dt, i < g->in_past ? 2 : 4, zero, NULL, 0,
                                                                                  &g->in_vals[i]);
        if (st) return kiln_errf(&g->err, KILN_ERR_NOMEM, "out of memory");
    }
    for (int j = 1; j < g->n_out; j++) {
        kiln_io_info io;
        find_io(g->s, true, g->out_names[j], &io);
        kiln_status st = g->on_device ? kiln_value_wrap_device_tensor(io.dtype, 4, zero, NULL, 0, &g->bind[j])
                                      : kiln_value_wrap_tensor(io.dtype, 4, zero, NULL, 0, &g->bind[j]);
        if (st) return kiln_errf(&g->err, KILN_ERR_NOMEM, "out of memory");
    }
    return KILN_OK;
}

kiln_status kiln_genai_model_open(const char *model_dir, const kiln_session_options *opt, kiln_genai_model **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    kiln_genai_model *m = calloc(1, sizeof *m);
    *out = m;
    if (!m) return KILN_ERR_NOMEM;
    atomic_init(&m->refs, 1);
    char model_path[PATH_MAX];
    kiln_status st = kiln_genai_config_load(model_dir, &m->cfg, model_path, sizeof model_path, &m->err);
    if (st) return st;
    kiln_session_options so = opt ? *opt : kiln_session_options_default();
    if (so.num_threads < 0)
        return kiln_errf(&m->err, KILN_ERR_INVALID_ARG, "num_threads %d is negative", so.num_threads);
    if ((st = kiln_session_create(model_path, &so, &m->s))) {
        kiln_errf(&m->err, st, "%s", kiln_last_error(m->s));
        kiln_session_free(m->s);
        m->s = NULL;
    }
    return st;
}

const char *kiln_genai_model_last_error(const kiln_genai_model *m)
{
    return m ? m->err.msg : "no model (opening it ran out of memory)";
}

void kiln_genai_model_free(kiln_genai_model *m)
{
    if (!m || atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) != 1) return;
    kiln_session_free(m->s);
    free(m);
}

kiln_status kiln_generator_create_from(kiln_genai_model *m, const kiln_generator_params *params, kiln_generator **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    kiln_generator *g = calloc(1, sizeof *g);
    *out = g;
    if (!g) return KILN_ERR_NOMEM;
    if (!m || !m->s)
        return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "no model (kiln_genai_model_open failed or was not called)");
    atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
    g->m = m, g->s = m->s, g->cfg = m->cfg;
    kiln_generator_params p = params ? *params : kiln_generator_params_default();
    const kiln_genai_config *c = &g->cfg;
    if (p.batch_size < 1 || p.batch_size > MAX_BATCH)
        return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "batch_size %d is out of range [1, %d]", p.batch_size,
                         MAX_BATCH);
    if (p.max_length == 0) p.max_length = c->max_length;
    if (p.max_length < 2 || p.max_length > c->context_length)
        return kiln_errf(&g->err, KILN_ERR_INVALID_ARG,
                         "max_length %lld is out of range [2, %lld] (the model's context_length)",
                         (long long)p.max_length, (long long)c->context_length);
    if (p.do_sample < 0) p.do_sample = c->do_sample;
    if (p.do_sample > 1) return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "do_sample must be -1, 0 or 1");
    if (p.temperature == 0) p.temperature = c->temperature;
    if (p.top_k < 0) p.top_k = c->top_k;
    if (p.top_p == 0) p.top_p = c->top_p;
    if (!(p.temperature > 0 && p.temperature <= 1e4))
        return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "temperature %g is out of range (0, 10000]", p.temperature);
    if (!(p.top_p > 0 && p.top_p <= 1))
        return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "top_p %g is out of range (0, 1]", p.top_p);
    g->p = p;
    g->B = p.batch_size;
    g->T = p.max_length;
    g->L = c->layers;
    g->rng = p.seed ^ 0x9e3779b97f4a7c15ull;
    kiln_status st;
    if ((st = setup_names(g)) || (st = check_session(g))) return st;
    g->on_device = kiln_session_on_device(g->s);
    g->static_mask = g->cfg.share_buffer;
    return alloc_state(g);
}

kiln_status kiln_generator_create(const char *model_dir, const kiln_generator_params *params, kiln_generator **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    kiln_generator_params p = params ? *params : kiln_generator_params_default();
    kiln_session_options so = kiln_session_options_default();
    so.provider = p.provider;
    so.num_threads = p.num_threads;
    kiln_genai_model *m = NULL;
    kiln_status st = kiln_genai_model_open(model_dir, &so, &m);
    if (st) { /* the model's error, in a generator handle */
        kiln_generator *g = calloc(1, sizeof *g);
        *out = g;
        if (g) kiln_errf(&g->err, st, "%s", kiln_genai_model_last_error(m));
        kiln_genai_model_free(m);
        return st;
    }
    st = kiln_generator_create_from(m, params, out);
    kiln_genai_model_free(m); /* the generator's reference keeps it */
    return st;
}

static bool is_eos(const kiln_generator *g, int64_t t)
{
    for (int k = 0; k < g->cfg.n_eos; k++)
        if (g->cfg.eos[k] == t) return true;
    return false;
}

/* The attention mask's width for a step of S new positions per row (see static_mask). */
static int64_t mask_width(const kiln_generator *g, int64_t S) { return g->static_mask && S == 1 ? g->T : g->past + S; }

/* Runs the model on S new positions per row (ids[] and the masks set by the caller), writing
 * the presents into the cache; leaves the last real position's logits of each row in logits. */
static kiln_status run_step(kiln_generator *g, int64_t S)
{
    const kiln_genai_config *c = &g->cfg;
    int B = g->B;
    int64_t width = g->past + S;
    if (width > g->T)
        return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "step of %lld tokens after %lld would pass max_length %lld",
                         (long long)S, (long long)g->past, (long long)g->T);
    int64_t d_ids[2] = {B, S}, d_mask[2] = {B, mask_width(g, S)};
    set_view(g->in_vals[0], g->ids, 2, d_ids, sizeof(int64_t));
    if (g->in_mask) set_view(g->in_vals[1], g->mask, 2, d_mask, sizeof(int64_t));
    if (g->in_pos) set_view(g->in_vals[1 + g->in_mask], g->pos, 2, d_ids, sizeof(int64_t));
    int64_t d_past[4] = {B, c->kv_heads, c->share_buffer ? g->T : g->past, c->head_size};
    int64_t d_cap[4] = {B, c->kv_heads, g->T, c->head_size};
    int src = g->cur, dst = c->share_buffer ? 0 : 1 - g->cur;
    for (int l = 0; l < g->L; l++)
        for (int w = 0; w < 2; w++) {
            set_view(g->in_vals[g->in_past + 2 * l + w], g->kv[l][w][src], 4, d_past, g->kv_elem);
            set_view(g->bind[1 + 2 * l + w], g->kv[l][w][dst], 4, d_cap, g->kv_elem);
        }
    kiln_value *logit_bind = NULL;
    if (g->step_logits && S == 1) {
        int64_t d[3] = {B, 1, g->V};
        if (kiln_value_wrap_tensor(g->logit_dtype, 3, d, g->step_logits,
                                   (size_t)B * (size_t)g->V * kiln_dtype_size(g->logit_dtype), &logit_bind))
            return kiln_errf(&g->err, KILN_ERR_NOMEM, "out of memory");
    }
    g->bind[0] = logit_bind;
    kiln_status st = kiln_session_run_bound(g->s, g->n_in, g->in_names, (const kiln_value *const *)g->in_vals, g->n_out,
                                            g->out_names, g->outs, g->bind);
    g->bind[0] = NULL;
    kiln_value_free(logit_bind);
    if (st) return kiln_errf(&g->err, st, "%s", kiln_last_error(g->s));
    /* the logits: [B, S, V] */
    const kiln_value *lg = g->outs[0];
    int64_t V = lg->rank == 3 ? lg->dims[2] : -1;
    if (lg->rank != 3 || lg->dims[0] != B || lg->dims[1] != S || V < 1 || V > INT32_MAX ||
        (g->V && V != g->V) || (c->vocab_size && V != c->vocab_size)) {
        st = kiln_errf(&g->err, KILN_ERR_MODEL,
                       "output '%s' has shape [%lld, %lld, %lld], expected [%d, %lld, vocab%s]", g->out_names[0],
                       (long long)(lg->rank > 0 ? lg->dims[0] : -1), (long long)(lg->rank > 1 ? lg->dims[1] : -1),
                       (long long)V, B, (long long)S, c->vocab_size ? " of genai_config.json" : "");
        goto out;
    }
    if (!g->V) {
        g->V = V;
        size_t n = (size_t)B * (size_t)V;
        g->logits = malloc(n * sizeof *g->logits);
        g->step_logits = malloc(n * kiln_dtype_size(g->logit_dtype));
        g->idx = malloc((size_t)V * sizeof *g->idx);
        g->prob = malloc((size_t)V * sizeof *g->prob);
        if (!g->logits || !g->step_logits || !g->idx || !g->prob) {
            st = kiln_errf(&g->err, KILN_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    for (int b = 0; b < B; b++) { /* the row's last real position, as float */
        int64_t at = S == 1 ? 0 : g->plen[b] - 1;
        size_t from = ((size_t)b * (size_t)S + (size_t)at) * (size_t)V;
        float *to = g->logits + (size_t)b * (size_t)V;
        if (lg->dtype == KILN_DTYPE_FLOAT32) {
            memcpy(to, (const float *)lg->data + from, (size_t)V * sizeof(float));
        } else {
            kiln_half_to_f32_array((const uint16_t *)lg->data + from, to, V, lg->dtype == KILN_DTYPE_BFLOAT16);
        }
    }
    /* the presents: [B, kv, width, hd] (unshared) or the whole buffer (shared), in place */
    for (int j = 1; j < g->n_out; j++) {
        const kiln_value *pr = g->outs[j];
        int64_t want = c->share_buffer ? g->T : width;
        if (pr->rank != 4 || pr->dims[0] != B || pr->dims[1] != c->kv_heads || pr->dims[2] != want ||
            pr->dims[3] != c->head_size || kiln_dtype_size(pr->dtype) != g->kv_elem) {
            st = kiln_errf(&g->err, KILN_ERR_MODEL, "output '%s' is not [%d, %d, %lld, %d] as the KV cache needs",
                           g->out_names[j], B, c->kv_heads, (long long)want, c->head_size);
            goto out;
        }
        if (pr->data != g->bind[j]->data) { /* not written in place (an output the model copies from elsewhere) */
            if (g->on_device) {
                st = kiln_errf(&g->err, KILN_ERR_UNSUPPORTED,
                               "output '%s' was not computed on the device: the device KV cache "
                               "takes presents that GPU nodes write",
                               g->out_names[j]);
                goto out;
            }
            memcpy(g->bind[j]->data, pr->data, pr->nbytes);
            g->kv_copies++;
        }
    }
    g->past = width;
    if (!c->share_buffer) g->cur = dst;
out:
    for (int j = 0; j < g->n_out; j++) {
        kiln_value_free(g->outs[j]);
        g->outs[j] = NULL;
    }
    return st;
}

/* Fills the attention mask (and position ids) for S new positions per row. Unshared caches
 * keep a mask per cached position (right-padded prompts leave zeros among them); shared
 * caches (GroupQueryAttention: seqlens_k = sum(mask) - 1) get each row's ones first. */
static void fill_masks(kiln_generator *g, int64_t S, const int64_t *valid_new)
{
    int64_t width = mask_width(g, S);
    for (int b = 0; b < g->B; b++) {
        int64_t *h = g->mask_hist + (size_t)b * (size_t)g->T;
        for (int64_t t = 0; t < S; t++) h[g->past + t] = t < valid_new[b];
        int64_t ones = 0;
        for (int64_t t = 0; t < g->past + S; t++) ones += h[t];
        int64_t *m = g->mask + (size_t)b * (size_t)width;
        for (int64_t t = 0; t < width; t++) m[t] = g->cfg.share_buffer ? t < ones : h[t];
        /* position ids: the count of real tokens before each new one */
        int64_t before = 0;
        for (int64_t t = 0; t < g->past; t++) before += h[t];
        for (int64_t t = 0; t < S; t++) {
            g->pos[(size_t)b * (size_t)S + (size_t)t] = before;
            before += h[g->past + t];
        }
    }
}

kiln_status kiln_generator_append_tokens(kiln_generator *g, int batch, const int64_t *lengths, const int64_t *tokens)
{
    if (!g) return KILN_ERR_INVALID_ARG;
    if (!g->s) return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "the generator failed to open: %s", g->err.msg);
    if (g->prompted) return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "the generator already has its prompt");
    if (batch != g->B)
        return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "batch %d, but the generator was made for %d", batch, g->B);
    if (!lengths || !tokens) return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "lengths or tokens is NULL");
    int64_t S = 0;
    for (int b = 0; b < g->B; b++) {
        if (lengths[b] < 1 || lengths[b] >= g->T)
            return kiln_errf(&g->err, KILN_ERR_INVALID_ARG,
                             "prompt %d has %lld tokens: must be 1 to %lld (max_length - 1)", b, (long long)lengths[b],
                             (long long)g->T - 1);
        if (lengths[b] > S) S = lengths[b];
    }
    int64_t pad = g->cfg.pad >= 0 ? g->cfg.pad : 0;
    for (int b = 0; b < g->B; b++)
        for (int64_t t = 0; t < S; t++) {
            int64_t id = tokens[(size_t)b * (size_t)S + (size_t)t];
            if (t < lengths[b] && (id < 0 || id > INT32_MAX || (g->cfg.vocab_size && id >= g->cfg.vocab_size)))
                return kiln_errf(&g->err, KILN_ERR_INVALID_ARG,
                                 "prompt %d, token %lld: id %lld is not in the vocabulary", b, (long long)t,
                                 (long long)id);
            g->ids[(size_t)b * (size_t)S + (size_t)t] = t < lengths[b] ? id : pad;
        }
    for (int b = 0; b < g->B; b++) g->plen[b] = lengths[b];
    fill_masks(g, S, lengths);
    kiln_status st = run_step(g, S);
    if (st) {
        memset(g->mask_hist, 0, (size_t)g->B * (size_t)g->T * sizeof *g->mask_hist);
        return st;
    }
    for (int b = 0; b < g->B; b++) {
        g->seq_len[b] = lengths[b];
        memcpy(g->seq + (size_t)b * (size_t)g->T, tokens + (size_t)b * (size_t)S, (size_t)lengths[b] * sizeof(int64_t));
    }
    g->prompt_max = S;
    g->prompted = true;
    return KILN_OK;
}

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int by_logit_desc(const void *a, const void *b, void *ctx)
{
    const float *l = ctx;
    int i = *(const int *)a, j = *(const int *)b;
    float x = l[i], y = l[j];
    if (x != y) return x > y ? -1 : 1;
    return i - j;
}

static int64_t argmax(const float *l, int64_t V)
{
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (l[v] > l[best] || (isnan(l[best]) && !isnan(l[v]))) best = v;
    return best;
}

/* One token from logits l[V]: greedy, or temperature / top-k / top-p sampling. */
static int64_t pick(kiln_generator *g, const float *l)
{
    int64_t V = g->V;
    if (!g->p.do_sample) return argmax(l, V);
    int64_t k = g->p.top_k > 0 && g->p.top_k < V ? g->p.top_k : V;
    for (int64_t v = 0; v < V; v++) g->idx[v] = (int)v;
    qsort_r(g->idx, (size_t)V, sizeof *g->idx, by_logit_desc, (void *)l);
    double mx = l[g->idx[0]], sum = 0;
    for (int64_t i = 0; i < k; i++) {
        double x = l[g->idx[i]];
        g->prob[i] = isnan(x) ? 0 : exp((x - mx) / g->p.temperature);
        sum += g->prob[i];
    }
    if (!(sum > 0)) return g->idx[0];
    double mass = 0;
    int64_t keep = k;
    for (int64_t i = 0; i < k; i++) {
        mass += g->prob[i] / sum;
        if (mass >= g->p.top_p) {
            keep = i + 1;
            break;
        }
    }
    double kept = 0;
    for (int64_t i = 0; i < keep; i++) kept += g->prob[i];
    double u = (double)(next_u64(&g->rng) >> 11) * 0x1.0p-53 * kept, acc = 0;
    for (int64_t i = 0; i < keep; i++) {
        acc += g->prob[i];
        if (u < acc) return g->idx[i];
    }
    return g->idx[keep - 1];
}

bool kiln_generator_is_done(const kiln_generator *g)
{
    if (!g || !g->prompted) return g == NULL;
    if (g->prompt_max + g->gen >= g->T) return true;
    for (int b = 0; b < g->B; b++)
        if (!g->eos[b]) return false;
    return true;
}

kiln_status kiln_generator_generate_next(kiln_generator *g)
{
    if (!g) return KILN_ERR_INVALID_ARG;
    if (!g->prompted)
        return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "generate_next before append_tokens: no prompt yet");
    if (kiln_generator_is_done(g))
        return kiln_errf(&g->err, KILN_ERR_INVALID_ARG, "the generator is done: %s",
                         g->prompt_max + g->gen >= g->T ? "the sequences reached max_length"
                                                        : "every sequence ended with eos");
    if (g->pending) {
        for (int b = 0; b < g->B; b++) {
            g->ids[b] = g->next[b];
            g->ones[b] = 1;
        }
        fill_masks(g, 1, g->ones);
        kiln_status st = run_step(g, 1);
        if (st) return st;
        g->pending = false;
    }
    int64_t pad = g->cfg.pad >= 0 ? g->cfg.pad : g->cfg.n_eos ? g->cfg.eos[0] : 0;
    for (int b = 0; b < g->B; b++) {
        int64_t t = g->eos[b] ? pad : pick(g, g->logits + (size_t)b * (size_t)g->V);
        if (is_eos(g, t)) g->eos[b] = true;
        g->next[b] = t;
        g->seq[(size_t)b * (size_t)g->T + (size_t)g->seq_len[b]++] = t;
    }
    g->gen++;
    g->pending = true;
    return KILN_OK;
}

kiln_status kiln_generator_get_next_tokens(const kiln_generator *g, const int64_t **tokens, int *n)
{
    if (!g || !tokens) return KILN_ERR_INVALID_ARG;
    if (!g->gen) return kiln_errf(&((kiln_generator *)g)->err, KILN_ERR_INVALID_ARG, "no token generated yet");
    *tokens = g->next;
    if (n) *n = g->B;
    return KILN_OK;
}

kiln_status kiln_generator_get_logits(const kiln_generator *g, const float **logits, int64_t *vocab)
{
    if (!g || !logits) return KILN_ERR_INVALID_ARG;
    if (!g->prompted)
        return kiln_errf(&((kiln_generator *)g)->err, KILN_ERR_INVALID_ARG, "no logits before append_tokens");
    *logits = g->logits;
    if (vocab) *vocab = g->V;
    return KILN_OK;
}

const int64_t *kiln_generator_get_sequence(const kiln_generator *g, int b, int64_t *len)
{
    if (!g || !g->seq || b < 0 || b >= g->B) return NULL;
    if (len) *len = g->seq_len[b];
    return g->seq + (size_t)b * (size_t)g->T;
}

kiln_status kiln_generator_session_stats(const kiln_generator *g, kiln_session_stats *out)
{
    if (!g || !g->s) return KILN_ERR_INVALID_ARG;
    return kiln_session_stats_get(g->s, out);
}

const char *kiln_generator_last_error(const kiln_generator *g)
{
    return g ? g->err.msg : "no generator (creating it ran out of memory)";
}

void kiln_generator_free(kiln_generator *g)
{
    if (!g) return;
    if (g->kv) /* device buffers go before their session */
        for (int l = 0; l < g->L; l++)
            for (int w = 0; w < 2; w++)
                for (int b = 0; b < 2; b++) {
                    if (g->on_device) kiln_session_device_free(g->s, g->kv[l][w][b]);
                    else free(g->kv[l][w][b]);
                }
    free(g->kv);
    kiln_genai_model_free(g->m);
    for (int i = 0; g->in_vals && i < g->n_in; i++) kiln_value_free(g->in_vals[i]);
    for (int j = 0; g->bind && j < g->n_out; j++) kiln_value_free(g->bind[j]);
    free(g->in_vals);
    free(g->bind);
    free(g->outs);
    free(g->names);
    free(g->in_names);
    free(g->out_names);
    free(g->ids);
    free(g->mask);
    free(g->pos);
    free(g->mask_hist);
    free(g->seq);
    free(g->seq_len);
    free(g->plen);
    free(g->next);
    free(g->ones);
    free(g->eos);
    free(g->logits);
    free(g->step_logits);
    free(g->idx);
    free(g->prob);
    free(g);
}
