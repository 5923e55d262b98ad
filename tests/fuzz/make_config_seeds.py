#!/usr/bin/env python3
"""Writes the genai_config.json fuzzing seeds (tests/fuzz/config_seeds/): the configs
tests/models/make_llm.py writes for both forms, onnxruntime-genai builder-style fields, and
hostile variants (truncated, mistyped, huge numbers, escaping filenames, format specifiers).

usage: make_config_seeds.py OUT_DIR
"""
import json
import os
import sys

BASE = {
    "model": {"bos_token_id": 1, "context_length": 256, "eos_token_id": [2, 3], "pad_token_id": 0, "type": "llama",
              "vocab_size": 512,
              "decoder": {"session_options": {"log_id": "onnxruntime-genai", "provider_options": [{"cuda": {}}]},
                          "filename": "model.onnx", "head_size": 16, "hidden_size": 64,
                          "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                     "past_key_names": "past_key_values.%d.key",
                                     "past_value_names": "past_key_values.%d.value"},
                          "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                      "present_value_names": "present.%d.value"},
                          "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2}},
    "search": {"do_sample": False, "max_length": 128, "num_beams": 1, "past_present_share_buffer": True,
               "temperature": 1.0, "top_k": 1, "top_p": 1.0},
}


def variant(path, value):
    c = json.loads(json.dumps(BASE))
    o = c
    for k in path[:-1]:
        o = o[k]
    if value is None:
        del o[path[-1]]
    else:
        o[path[-1]] = value
    return json.dumps(c)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    dec = ("model", "decoder")
    seeds = {
        "base.json": json.dumps(BASE, indent=4),
        "truncated.json": json.dumps(BASE)[:300],
        "huge_layers.json": variant(dec + ("num_hidden_layers",), 10 ** 30),
        "layers_string.json": variant(dec + ("num_hidden_layers",), "2"),
        "filename_parent.json": variant(dec + ("filename",), "../../etc/passwd"),
        "filename_absolute.json": variant(dec + ("filename",), "/etc/passwd"),
        "pattern_specifier.json": variant(dec + ("inputs", "past_key_names"), "past.%s.%n.%x"),
        "no_decoder.json": variant(dec, None),
        "eos_int.json": variant(("model", "eos_token_id"), 2),
        "max_length_over_context.json": variant(("search", "max_length"), 1 << 40),
        "top_p_nan.json": json.dumps(BASE).replace('"top_p": 1.0', '"top_p": NaN'),
    }
    for name, text in seeds.items():
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    print(f"wrote {len(seeds)} seeds to {out}")


if __name__ == "__main__":
    main()
