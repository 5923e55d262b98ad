#!/usr/bin/env python3
"""Builds a fuzzing corpus from the ONNX conformance models: a modest, diverse subset (one small
model per operator, control flow and sequences first), copied as OUT_DIR/<test name>.onnx.

usage: make_seeds.py OUT_DIR [--data DIR] [--count N] [--max-file-bytes B] [--max-total-bytes B]

--data is a folder laid out by tests/conformance/prepare_data.py (default /tmp/kdata; it is
generated there if missing). The committed tests/fuzz/seeds/ was made with
--count 30 --max-file-bytes 32768 --max-total-bytes 400000.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

# Models exercising the parts of the loader a plain element-wise model does not reach.
PREFERRED = ("loop", "if", "scan", "sequence", "optional", "split_to_sequence", "function",
             "string", "cast", "reshape", "concat", "slice", "gather", "conv", "resize",
             "nonzero", "unique", "topk", "einsum", "lstm", "attention", "range", "expand")


def op_key(name):
    """test_gather_elements_negative_indices -> gather (the family a test belongs to)."""
    n = re.sub(r"^test_", "", name)
    n = re.sub(r"_(expanded|ver\d+|opset\d+).*$", "", n)
    return n.split("_")[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--data", default="/tmp/kdata")
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--max-file-bytes", type=int, default=65536)
    ap.add_argument("--max-total-bytes", type=int, default=8 << 20)
    a = ap.parse_args()

    if not os.path.isdir(a.data):
        here = os.path.dirname(os.path.abspath(__file__))
        prepare = os.path.join(here, "..", "conformance", "prepare_data.py")
        subprocess.check_call([sys.executable, prepare, a.data])

    models = []
    for root, _dirs, files in os.walk(a.data):
        if "model.onnx" in files:
            p = os.path.join(root, "model.onnx")
            size = os.path.getsize(p)
            if size <= a.max_file_bytes:
                models.append((os.path.basename(root), p, size))
    models.sort(key=lambda m: (m[2], m[0]))

    # One model per operator family, smallest first; preferred families lead.
    seen, picked = set(), []
    for pass_ in (0, 1):
        for name, path, size in models:
            key = op_key(name)
            if key in seen:
                continue
            if pass_ == 0 and key not in PREFERRED:
                continue
            seen.add(key)
            picked.append((name, path, size))
    os.makedirs(a.out_dir, exist_ok=True)
    total = count = 0
    for name, path, size in picked:
        if count >= a.count or total + size > a.max_total_bytes:
            continue
        shutil.copyfile(path, os.path.join(a.out_dir, name + ".onnx"))
        total += size
        count += 1
    print(f"{count} models, {total} bytes -> {a.out_dir}")


if __name__ == "__main__":
    main()
