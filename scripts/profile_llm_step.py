#!/usr/bin/env python3
"""One decode step of a GenAI-layout folder (shared KV buffer) through `kiln bench --profile`:
where a step's time goes, per op type and per node. A diagnostic, not a test.

usage: profile_llm_step.py DIR [--position P] [--provider cuda] [--kiln .gpu/kiln] [--runs 20]

Writes the step's inputs as .npy files (input_ids [1, 1], attention_mask [1, max_length] with
P + 1 ones, past key/value [1, kv_heads, max_length, head_size] random) and runs
`kiln bench DIR/model.onnx --input ... --runs N --profile` (kiln bench times the plain runs
first: on the GPU those replay one recording)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--position", type=int, default=200)
    ap.add_argument("--provider", default="cuda")
    ap.add_argument("--kiln", default=os.environ.get("KILN", "build/kiln"))
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.dir, "genai_config.json")))
    m = cfg["model"]
    dec = m["decoder"]
    T = cfg.get("search", {}).get("max_length") or m["context_length"]
    kv, hd, layers = dec["num_key_value_heads"], dec["head_size"], dec["num_hidden_layers"]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as work:
        feeds = {"input_ids": np.array([[7]], np.int64),
                 "attention_mask": (np.arange(T) <= a.position).astype(np.int64)[None]}
        ins = dec["inputs"]
        for l in range(layers):
            for pat in (ins["past_key_names"], ins["past_value_names"]):
                feeds[pat % l] = rng.standard_normal((1, kv, T, hd)).astype(np.float32)
        args = []
        for name, x in feeds.items():
            path = os.path.join(work, name.replace("/", "_") + ".npy")
            np.save(path, x)
            args += ["--input", f"{name}={path}"]
        cmd = [a.kiln, "bench", os.path.join(a.dir, dec["filename"]), "--provider", a.provider, "--runs", str(a.runs),
               "--warmup", "5", "--stats", "--profile"] + args
        print(f"decode step at position {a.position} of {T}: kiln bench --provider {a.provider} --profile", flush=True)
        return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
