/* config.c - genai_config.json through json-c: the decoder's names, sizes, token ids and search
 * defaults, each checked for type and range before anything sizes a buffer from it. */
#define _GNU_SOURCE
#include "genai/config.h"

#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 32

static json_object *get(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (!o || !json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, key, &v)) return NULL;
    return json_object_is_type(v, json_type_null) ? NULL : v;
}

/* An integer field in [lo, hi]; *out keeps its value when absent and not required. */
static kiln_status get_int(json_object *o, const char *path, const char *key, bool required, int64_t lo, int64_t hi,
                           int64_t *out, kiln_err *err)
{
    json_object *v = get(o, key);
    if (!v) {
        if (required) return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s is missing", path, key);
        return KILN_OK;
    }
    if (!json_object_is_type(v, json_type_int))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s must be an integer", path, key);
    errno = 0;
    int64_t x = json_object_get_int64(v);
    if (errno == ERANGE || x < lo || x > hi) {
        if (errno == ERANGE || json_object_get_type(v) != json_type_int)
            return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s is out of range [%lld, %lld]", path, key,
                             (long long)lo, (long long)hi);
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s = %lld is out of range [%lld, %lld]", path,
                         key, (long long)x, (long long)lo, (long long)hi);
    }
    *out = x;
    return KILN_OK;
}

static kiln_status get_i32(json_object *o, const char *path, const char *key, bool required, int64_t lo, int64_t hi,
                           int *out, kiln_err *err)
{
    int64_t x = *out;
    KILN_TRY(get_int(o, path, key, required, lo, hi, &x, err));
    *out = (int)x;
    return KILN_OK;
}

static kiln_status get_double(json_object *o, const char *path, const char *key, double lo, double hi, bool lo_open,
                              double *out, kiln_err *err)
{
    json_object *v = get(o, key);
    if (!v) return KILN_OK;
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s must be a number", path, key);
    double x = json_object_get_double(v);
    if (!isfinite(x) || x > hi || x < lo || (lo_open && x == lo))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s = %g is out of range %s%g, %g]", path, key, x,
                         lo_open ? "(" : "[", lo, hi);
    *out = x;
    return KILN_OK;
}

static kiln_status get_bool(json_object *o, const char *path, const char *key, bool *out, kiln_err *err)
{
    json_object *v = get(o, key);
    if (!v) return KILN_OK;
    if (!json_object_is_type(v, json_type_boolean))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s must be true or false", path, key);
    *out = json_object_get_boolean(v);
    return KILN_OK;
}

/* A string field copied into out (size bytes): no NUL inside, no control characters. */
static kiln_status get_string(json_object *o, const char *path, const char *key, bool required, char *out,
                              size_t size, kiln_err *err)
{
    json_object *v = get(o, key);
    if (!v) {
        if (required) return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s is missing", path, key);
        return KILN_OK;
    }
    if (!json_object_is_type(v, json_type_string))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s must be a string", path, key);
    const char *s = json_object_get_string(v);
    size_t n = (size_t)json_object_get_string_len(v);
    if (n == 0 || n >= size)
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s must have 1 to %zu bytes, has %zu", path, key,
                         size - 1, n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20)
            return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s holds a control character", path, key);
    memcpy(out, s, n);
    out[n] = 0;
    return KILN_OK;
}

/* A past/present name pattern: exactly one "%d" and no other '%'. */
static kiln_status check_pattern(const char *path, const char *key, const char *p, kiln_err *err)
{
    int d = 0;
    for (const char *c = p; *c; c++) {
        if (*c != '%') continue;
        if (c[1] != 'd')
            return kiln_errf(err, KILN_ERR_MODEL,
                             "genai_config.json: %s.%s = '%s' may hold only one '%%d' and no other '%%' specifier", path,
                             key, p);
        d++;
        c++;
    }
    if (d != 1)
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s.%s = '%s' must hold exactly one '%%d' (has %d)",
                         path, key, p, d);
    return KILN_OK;
}

kiln_status kiln_genai_name(const char *pattern, int layer, char *out, size_t size, kiln_err *err)
{
    const char *at = strstr(pattern, "%d");
    if (!at || size == 0) return kiln_errf(err, KILN_ERR_MODEL, "name pattern '%s' has no '%%d'", pattern);
    int n = snprintf(out, size, "%.*s%d%s", (int)(at - pattern), pattern, layer, at + 2);
    if (n < 0 || (size_t)n >= size)
        return kiln_errf(err, KILN_ERR_MODEL, "name pattern '%s' for layer %d is longer than %zu bytes", pattern, layer,
                         size - 1);
    return KILN_OK;
}

/* The model filename: relative, no "." or ".." component, no empty component. */
static kiln_status check_filename(const char *f, kiln_err *err)
{
    if (f[0] == '/' || strchr(f, '\\'))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: model.decoder.filename '%s' must be a relative path "
                                              "inside the model folder", f);
    for (const char *c = f; *c;) {
        const char *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
            return kiln_errf(err, KILN_ERR_MODEL,
                             "genai_config.json: model.decoder.filename '%s' leaves the model folder or has an empty "
                             "component", f);
        c += n + (e != NULL);
    }
    return KILN_OK;
}

static kiln_status parse_eos(json_object *model, kiln_genai_config *cfg, kiln_err *err)
{
    json_object *v = get(model, "eos_token_id");
    cfg->n_eos = 0;
    if (!v) return KILN_OK;
    if (json_object_is_type(v, json_type_int)) {
        KILN_TRY(get_int(model, "model", "eos_token_id", true, 0, INT32_MAX, &cfg->eos[0], err));
        cfg->n_eos = 1;
        return KILN_OK;
    }
    if (!json_object_is_type(v, json_type_array))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: model.eos_token_id must be an integer or a list");
    size_t n = json_object_array_length(v);
    if (n > KILN_GENAI_MAX_EOS)
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: model.eos_token_id lists %zu ids (at most %d)", n,
                         KILN_GENAI_MAX_EOS);
    for (size_t i = 0; i < n; i++) {
        json_object *x = json_object_array_get_idx(v, i);
        errno = 0;
        int64_t id = json_object_is_type(x, json_type_int) ? json_object_get_int64(x) : -1;
        if (errno == ERANGE || id < 0 || id > INT32_MAX)
            return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: model.eos_token_id[%zu] is not a token id", i);
        cfg->eos[cfg->n_eos++] = id;
    }
    return KILN_OK;
}

static kiln_status parse_tree(json_object *root, kiln_genai_config *cfg, kiln_err *err)
{
    if (!json_object_is_type(root, json_type_object))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: the top level must be an object");
    json_object *model = get(root, "model"), *dec = get(model, "decoder");
    if (!model || !json_object_is_type(model, json_type_object))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: 'model' is missing or not an object");
    if (!dec || !json_object_is_type(dec, json_type_object))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: model.decoder is missing or not an object");
    json_object *in = get(dec, "inputs"), *out = get(dec, "outputs");
    if (!in || !json_object_is_type(in, json_type_object) || !out || !json_object_is_type(out, json_type_object))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: model.decoder.inputs/outputs missing or not objects");

    const char *pi = "model.decoder.inputs", *po = "model.decoder.outputs", *pd = "model.decoder";
    KILN_TRY(get_string(in, pi, "input_ids", true, cfg->input_ids, sizeof cfg->input_ids, err));
    KILN_TRY(get_string(in, pi, "attention_mask", false, cfg->attention_mask, sizeof cfg->attention_mask, err));
    KILN_TRY(get_string(in, pi, "position_ids", false, cfg->position_ids, sizeof cfg->position_ids, err));
    KILN_TRY(get_string(in, pi, "past_key_names", true, cfg->past_key, sizeof cfg->past_key, err));
    KILN_TRY(get_string(in, pi, "past_value_names", true, cfg->past_value, sizeof cfg->past_value, err));
    KILN_TRY(get_string(out, po, "logits", true, cfg->logits, sizeof cfg->logits, err));
    KILN_TRY(get_string(out, po, "present_key_names", true, cfg->present_key, sizeof cfg->present_key, err));
    KILN_TRY(get_string(out, po, "present_value_names", true, cfg->present_value, sizeof cfg->present_value, err));
    KILN_TRY(check_pattern(pi, "past_key_names", cfg->past_key, err));
    KILN_TRY(check_pattern(pi, "past_value_names", cfg->past_value, err));
    KILN_TRY(check_pattern(po, "present_key_names", cfg->present_key, err));
    KILN_TRY(check_pattern(po, "present_value_names", cfg->present_value, err));
    KILN_TRY(get_string(dec, pd, "filename", true, cfg->filename, sizeof cfg->filename, err));
    KILN_TRY(check_filename(cfg->filename, err));

    KILN_TRY(get_i32(dec, pd, "num_attention_heads", true, 1, KILN_GENAI_MAX_HEADS, &cfg->num_heads, err));
    cfg->kv_heads = cfg->num_heads;
    KILN_TRY(get_i32(dec, pd, "num_key_value_heads", false, 1, KILN_GENAI_MAX_HEADS, &cfg->kv_heads, err));
    KILN_TRY(get_i32(dec, pd, "head_size", true, 1, KILN_GENAI_MAX_HEAD_SIZE, &cfg->head_size, err));
    KILN_TRY(get_i32(dec, pd, "hidden_size", true, 1, (int64_t)KILN_GENAI_MAX_HEADS * KILN_GENAI_MAX_HEAD_SIZE,
                     &cfg->hidden_size, err));
    KILN_TRY(get_i32(dec, pd, "num_hidden_layers", true, 1, KILN_GENAI_MAX_LAYERS, &cfg->layers, err));
    if (cfg->num_heads % cfg->kv_heads)
        return kiln_errf(err, KILN_ERR_MODEL,
                         "genai_config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                         cfg->num_heads, cfg->kv_heads);

    KILN_TRY(get_int(model, "model", "context_length", true, 1, KILN_GENAI_MAX_CONTEXT, &cfg->context_length, err));
    KILN_TRY(get_int(model, "model", "vocab_size", false, 1, INT32_MAX, &cfg->vocab_size, err));
    KILN_TRY(get_int(model, "model", "bos_token_id", false, 0, INT32_MAX, &cfg->bos, err));
    KILN_TRY(get_int(model, "model", "pad_token_id", false, 0, INT32_MAX, &cfg->pad, err));
    KILN_TRY(parse_eos(model, cfg, err));

    /* session_options.provider_options: [{"cuda": {...}}, ...] -> the first provider's name */
    json_object *so = get(dec, "session_options"), *po_list = get(so, "provider_options");
    if (po_list) {
        if (!json_object_is_type(po_list, json_type_array))
            return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: session_options.provider_options must be a list");
        json_object *first = json_object_array_length(po_list) ? json_object_array_get_idx(po_list, 0) : NULL;
        if (first && json_object_is_type(first, json_type_object)) {
            json_object_object_foreach(first, key, val) {
                (void)val;
                snprintf(cfg->provider, sizeof cfg->provider, "%s", key);
                break;
            }
        }
    }

    json_object *search = get(root, "search");
    if (search && !json_object_is_type(search, json_type_object))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: 'search' must be an object");
    cfg->max_length = cfg->context_length;
    KILN_TRY(get_int(search, "search", "max_length", false, 1, KILN_GENAI_MAX_CONTEXT, &cfg->max_length, err));
    if (cfg->max_length > cfg->context_length)
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: search.max_length %lld exceeds context_length %lld",
                         (long long)cfg->max_length, (long long)cfg->context_length);
    KILN_TRY(get_bool(search, "search", "do_sample", &cfg->do_sample, err));
    KILN_TRY(get_bool(search, "search", "past_present_share_buffer", &cfg->share_buffer, err));
    KILN_TRY(get_i32(search, "search", "top_k", false, 0, INT32_MAX, &cfg->top_k, err));
    KILN_TRY(get_double(search, "search", "top_p", 0, 1, true, &cfg->top_p, err));
    KILN_TRY(get_double(search, "search", "temperature", 0, 1e4, true, &cfg->temperature, err));
    int64_t beams = 1;
    KILN_TRY(get_int(search, "search", "num_beams", false, 1, 1 << 16, &beams, err));
    if (beams != 1)
        return kiln_errf(err, KILN_ERR_UNSUPPORTED, "genai_config.json: search.num_beams = %lld: kiln does greedy and "
                                                    "sampled search only", (long long)beams);
    return KILN_OK;
}

kiln_status kiln_genai_config_parse(const char *json, size_t len, kiln_genai_config *cfg, kiln_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->bos = cfg->pad = -1;
    cfg->top_k = 50; /* onnxruntime-genai's defaults */
    cfg->top_p = 1.0;
    cfg->temperature = 1.0;
    if (!json) return kiln_errf(err, KILN_ERR_INVALID_ARG, "genai_config.json: no text");
    if (len > KILN_GENAI_MAX_CONFIG_BYTES)
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %zu bytes is more than the %d a config may have", len,
                         KILN_GENAI_MAX_CONFIG_BYTES);
    if (memchr(json, 0, len)) return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: the text holds a NUL byte");
    json_tokener *tok = json_tokener_new_ex(JSON_MAX_DEPTH);
    if (!tok) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *root = json_tokener_parse_ex(tok, json, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    kiln_status st = KILN_OK;
    if (!root || je != json_tokener_success) {
        st = kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: %s at byte %zu",
                       je == json_tokener_continue ? "truncated JSON" : json_tokener_error_desc(je), end);
    } else {
        while (end < len && (json[end] == ' ' || json[end] == '\n' || json[end] == '\r' || json[end] == '\t')) end++;
        if (end < len) st = kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: text after the JSON value at byte %zu", end);
        else st = parse_tree(root, cfg, err);
    }
    json_object_put(root);
    json_tokener_free(tok);
    return st;
}

kiln_status kiln_genai_config_load(const char *dir, kiln_genai_config *cfg, char *model_path, size_t size,
                                   kiln_err *err)
{
    char path[PATH_MAX];
    if (!dir || !*dir) return kiln_errf(err, KILN_ERR_INVALID_ARG, "no model folder given");
    if (snprintf(path, sizeof path, "%s/genai_config.json", dir) >= (int)sizeof path)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "model folder path is too long");
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_errf(err, KILN_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    char *buf = malloc(KILN_GENAI_MAX_CONFIG_BYTES + 1);
    size_t n = buf ? fread(buf, 1, KILN_GENAI_MAX_CONFIG_BYTES + 1, f) : 0;
    int rerr = ferror(f);
    fclose(f);
    if (!buf) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    kiln_status st = rerr ? kiln_errf(err, KILN_ERR_IO, "cannot read '%s'", path)
                          : kiln_genai_config_parse(buf, n, cfg, err);
    free(buf);
    if (st) return st;
    /* the model file resolves inside the folder, symlinks followed */
    char rdir[PATH_MAX], rfile[PATH_MAX], joined[PATH_MAX];
    if (!realpath(dir, rdir)) return kiln_errf(err, KILN_ERR_IO, "cannot resolve folder '%s': %s", dir, strerror(errno));
    if (snprintf(joined, sizeof joined, "%s/%s", rdir, cfg->filename) >= (int)sizeof joined)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "model path is too long");
    if (!realpath(joined, rfile))
        return kiln_errf(err, KILN_ERR_IO, "model file '%s' (genai_config.json model.decoder.filename): %s", joined,
                         strerror(errno));
    size_t dl = strlen(rdir);
    if (strncmp(rfile, rdir, dl) || (rfile[dl] != '/' && strcmp(rdir, "/")))
        return kiln_errf(err, KILN_ERR_MODEL, "genai_config.json: model.decoder.filename '%s' resolves to '%s', outside "
                                              "the model folder '%s'", cfg->filename, rfile, rdir);
    if (snprintf(model_path, size, "%s", rfile) >= (int)size)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "model path is too long");
    return KILN_OK;
}
