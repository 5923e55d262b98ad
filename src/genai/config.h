/* config.h - genai_config.json (onnxruntime-genai's model folder description), parsed with json-c
 * into bounded, validated fields. The file is untrusted: every number is range-checked, every
 * name length-checked, and the model filename must stay inside the folder. */
#ifndef KILN_GENAI_CONFIG_H
#define KILN_GENAI_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define KILN_GENAI_NAME_MAX 128    /* bytes of an input/output name or pattern, NUL included */
#define KILN_GENAI_MAX_EOS 16
#define KILN_GENAI_MAX_LAYERS 1024
#define KILN_GENAI_MAX_HEADS 1024
#define KILN_GENAI_MAX_HEAD_SIZE 1024
#define KILN_GENAI_MAX_CONTEXT (1 << 24) /* tokens */
#define KILN_GENAI_MAX_CONFIG_BYTES (1 << 20)

typedef struct kiln_genai_config {
    /* model.decoder.inputs / outputs; the past/present ones hold exactly one "%d" */
    char input_ids[KILN_GENAI_NAME_MAX], attention_mask[KILN_GENAI_NAME_MAX], position_ids[KILN_GENAI_NAME_MAX];
    char past_key[KILN_GENAI_NAME_MAX], past_value[KILN_GENAI_NAME_MAX];
    char logits[KILN_GENAI_NAME_MAX], present_key[KILN_GENAI_NAME_MAX], present_value[KILN_GENAI_NAME_MAX];
    char filename[256];          /* model.decoder.filename, relative to the folder, no ".." */
    char provider[32];           /* first provider named in session_options.provider_options, or "" */
    int num_heads, kv_heads, head_size, hidden_size, layers;
    int64_t context_length;      /* tokens */
    int64_t vocab_size;          /* 0 when the file leaves it out */
    int64_t bos, pad;            /* -1 when absent */
    int64_t eos[KILN_GENAI_MAX_EOS];
    int n_eos;
    /* search */
    int64_t max_length;          /* tokens, prompt included; <= context_length */
    bool do_sample, share_buffer;
    int top_k;                   /* 0: no top-k filter */
    double top_p, temperature;   /* (0, 1], (0, 1e4] */
} kiln_genai_config;

/* Parses genai_config.json text (json, len bytes; need not be NUL-terminated). Fields the file
 * leaves out take onnxruntime-genai's defaults where it has them; a required one missing, a
 * wrong type, a value out of range or a malformed name is KILN_ERR_MODEL with a message naming
 * the field. */
kiln_status kiln_genai_config_parse(const char *json, size_t len, kiln_genai_config *cfg, kiln_err *err);
/* Reads DIR/genai_config.json and parses it; *model_path (size bytes) receives the model file's
 * path, checked to resolve (symlinks followed) inside DIR. */
kiln_status kiln_genai_config_load(const char *dir, kiln_genai_config *cfg, char *model_path, size_t size,
                                   kiln_err *err);
/* pattern with its "%d" replaced by layer, into out; KILN_ERR_MODEL when it does not fit. */
kiln_status kiln_genai_name(const char *pattern, int layer, char *out, size_t size, kiln_err *err);

#endif
