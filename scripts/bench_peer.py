#!/usr/bin/env python3
"""Peer benchmark: the same model and inputs through `kiln bench` and ONNX Runtime (CPU, same
thread count), in one run; prints both latencies and the ratio kiln / ORT. A benchmark, not a
test: it never fails on time.

usage: bench_peer.py MODEL --shape NAME=1x3x224x224 [...] [--threads N] [--runs N] [--warmup N]
                     [--kiln build/kiln]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

NP_TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
            10: np.float16, 11: np.float64}


def make_inputs(model_path, shapes, rng):
    model = onnx.load(model_path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if vi.name in shapes:
            dims = shapes[vi.name]
        else:
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if any(d is None for d in dims):
                sys.exit(f"input {vi.name} has symbolic dims: give --shape {vi.name}=DIMS")
        dt = NP_TYPES[tt.elem_type]
        if np.issubdtype(dt, np.floating):
            feeds[vi.name] = rng.uniform(-1, 1, size=dims).astype(dt)
        else:
            feeds[vi.name] = rng.integers(0, 10, size=dims).astype(dt)
    return feeds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--kiln", default=os.path.join(os.path.dirname(__file__), "..", "build", "kiln"))
    a = ap.parse_args()
    shapes = {}
    for s in a.shape:
        name, dims = s.rsplit("=", 1)
        shapes[name] = [int(d) for d in dims.split("x")] if dims else []
    feeds = make_inputs(a.model, shapes, np.random.default_rng(0))

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [a.kiln, "bench", a.model, "--runs", str(a.runs), "--warmup", str(a.warmup), "--json",
               "--threads", str(a.threads)]
        for name, arr in feeds.items():
            path = os.path.join(tmp, f"in{len(cmd)}.npy")
            np.save(path, arr)
            cmd += ["--input", f"{name}={path}"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"kiln bench failed: {out.stderr.strip()}")
        k = json.loads(out.stdout.strip().splitlines()[-1])

    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    t0 = time.perf_counter()
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    create_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(a.warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(a.runs):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    o_med = float(np.median(times))
    o_p90 = times[int(round((len(times) - 1) * 0.9))]
    shape_txt = " ".join(f"{n}={'x'.join(map(str, v.shape))}" for n, v in feeds.items())
    print(f"model {a.model} ({shape_txt}), {a.threads} threads each, {a.runs} runs")
    print(f"  kiln: median {k['median_ms']:.3f} ms, p90 {k['p90_ms']:.3f} ms, session create {k['create_ms']:.1f} ms")
    print(f"  ORT : median {o_med:.3f} ms, p90 {o_p90:.3f} ms, session create {create_ms:.1f} ms")
    print(f"  ratio kiln/ORT (median): {k['median_ms'] / o_med:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
