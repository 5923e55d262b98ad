#!/usr/bin/env python3
"""Peer benchmark: the same model and inputs through `kiln bench` and ONNX Runtime (CPU, same
thread count), in one run; prints both latencies and the ratio kiln / ORT. A benchmark, not a
test: it never fails on time.

Each of the two runs in its own process, and they take turns: --rounds rounds of kiln then ORT,
--runs timed runs each. A shared machine's speed drifts by tens of percent over seconds, so
one long run of each would compare two different machines; each figure is the median over the
rounds of that round's figure.

usage: bench_peer.py MODEL --shape NAME=1x3x224x224 [...] [--threads N] [--runs N] [--warmup N]
                     [--rounds N] [--kiln build/kiln]
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


ORT_CHILD = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort


def vm_hwm_mb():  # peak RSS of this process; unlike ru_maxrss it does not start at the parent's
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024

model, feeds_path, threads, runs, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
feeds = dict(np.load(feeds_path))
base_mb = vm_hwm_mb()
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
t0 = time.perf_counter()
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
create_ms = (time.perf_counter() - t0) * 1e3
for _ in range(warmup):
    sess.run(None, feeds)
times = []
for _ in range(runs):
    t = time.perf_counter()
    sess.run(None, feeds)
    times.append((time.perf_counter() - t) * 1e3)
times.sort()
print(json.dumps({"median_ms": float(np.median(times)), "p90_ms": times[int(round((len(times) - 1) * 0.9))],
                  "create_ms": create_ms, "peak_rss_mb": vm_hwm_mb(), "base_rss_mb": base_mb}))
"""


def measure(model, shapes, threads=2, runs=20, warmup=3, kiln="build/kiln", rounds=3):
    """kiln and ORT on the same inputs, each in its own process, taking turns for `rounds`
    rounds. Returns a dict of figures, each the median over the rounds: median/p90 latency (ms),
    session creation (ms), peak RSS (MB) of the process, and for ORT also the RSS of its
    interpreter before the session (the model's share is the difference)."""
    feeds = make_inputs(model, shapes, np.random.default_rng(0))
    ks, os_ = [], []
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [kiln, "bench", model, "--runs", str(runs), "--warmup", str(warmup), "--json", "--threads", str(threads)]
        for name, arr in feeds.items():
            path = os.path.join(tmp, f"in{len(cmd)}.npy")
            np.save(path, arr)
            cmd += ["--input", f"{name}={path}"]
        feeds_path = os.path.join(tmp, "feeds.npz")
        np.savez(feeds_path, **feeds)
        for _ in range(rounds):
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"kiln bench failed: {out.stderr.strip()}")
            ks.append(json.loads(out.stdout.strip().splitlines()[-1]))
            out = subprocess.run([sys.executable, "-c", ORT_CHILD, model, feeds_path, str(threads), str(runs),
                                  str(warmup)], capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"ORT failed: {out.stderr.strip()[-500:]}")
            os_.append(json.loads(out.stdout.strip().splitlines()[-1]))
    k = {key: float(np.median([r[key] for r in ks])) for key in ("median_ms", "p90_ms", "create_ms", "peak_rss_mb")}
    o = {key: float(np.median([r[key] for r in os_]))
         for key in ("median_ms", "p90_ms", "create_ms", "peak_rss_mb", "base_rss_mb")}
    shape_txt = " ".join(f"{n}={'x'.join(map(str, v.shape))}" for n, v in feeds.items())
    return {"shape": shape_txt, "kiln": k, "ort": o, "ratio": k["median_ms"] / o["median_ms"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kiln", default=os.path.join(os.path.dirname(__file__), "..", "build", "kiln"))
    a = ap.parse_args()
    shapes = {}
    for s in a.shape:
        name, dims = s.rsplit("=", 1)
        shapes[name] = [int(d) for d in dims.split("x")] if dims else []
    try:
        r = measure(a.model, shapes, a.threads, a.runs, a.warmup, a.kiln, a.rounds)
    except RuntimeError as e:
        sys.exit(str(e))
    k, o = r["kiln"], r["ort"]
    print(f"model {a.model} ({r['shape']}), {a.threads} threads each, {a.rounds} rounds of {a.runs} runs; "
          "each figure the median over the rounds")
    print(f"  kiln: median {k['median_ms']:.3f} ms, p90 {k['p90_ms']:.3f} ms, session create {k['create_ms']:.1f} ms, "
          f"peak RSS {k['peak_rss_mb']:.0f} MB")
    print(f"  ORT : median {o['median_ms']:.3f} ms, p90 {o['p90_ms']:.3f} ms, session create {o['create_ms']:.1f} ms, "
          f"peak RSS {o['peak_rss_mb']:.0f} MB ({o['peak_rss_mb'] - o['base_rss_mb']:.0f} MB above the interpreter)")
    print(f"  ratio kiln/ORT (median): {r['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
