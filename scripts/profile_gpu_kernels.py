#!/usr/bin/env python3
"""The GPU kernels of one decode step of a GenAI-layout folder on the CUDA provider, timed by
PyTorch's profiler (CUPTI sees every kernel the process launches, kiln's included): per kernel
name, calls per step, average and total microseconds, and for MatMulNBits' GEMV the bandwidth
its weights were read at. A diagnostic for the GPU machine (torch there), not a test.

usage: KILN_LIB=.gpu/libkiln.so python3 scripts/profile_gpu_kernels.py DIR [--position P] [--runs N]

The step's inputs live in device memory (torch tensors fed as kiln.DeviceArray, outputs kept on
the device), so the profile holds the step's kernels and no host copies of the KV cache."""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--position", type=int, default=200)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    import kiln

    cfg = json.load(open(os.path.join(a.dir, "genai_config.json")))
    dec = cfg["model"]["decoder"]
    T = cfg.get("search", {}).get("max_length") or cfg["model"]["context_length"]
    sess = kiln.Session(os.path.join(a.dir, dec["filename"]), provider="cuda", device_outputs=True)
    types = {1: (torch.float32, np.float32), 10: (torch.float16, np.float16), 7: (torch.int64, np.int64),
             6: (torch.int32, np.int32)}
    keep, feeds = [], {}
    for inp in sess.inputs:
        tt, nt = types[inp["dtype"]]
        name = inp["name"]
        if name == "input_ids":
            t = torch.full((1, 1), 7, dtype=tt, device="cuda")
        elif name == "attention_mask":
            t = (torch.arange(T, device="cuda") <= a.position).to(tt)[None]
        elif name == "position_ids":
            t = torch.full((1, 1), a.position, dtype=tt, device="cuda")
        else:  # past key / value [1, kv_heads, T, head_size]
            shape = [1 if d == "batch_size" else T if isinstance(d, str) else d for d in inp["shape"]]
            t = torch.randn(shape, device="cuda").to(tt)
        keep.append(t)
        feeds[name] = kiln.DeviceArray(t.data_ptr(), tuple(t.shape), nt)
    for _ in range(3):
        sess.run(feeds)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.runs):
            sess.run(feeds)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = e.cuda_time_total
        if t > 0:
            rows.append((t, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"decode step at position {a.position} of {T}, {a.runs} runs: {total / a.runs:.1f} us of kernels per step")
    print(f"{'us/step':>9} {'calls/step':>10} {'avg us':>8}  kernel")
    for t, n, k in rows[:a.top]:
        print(f"{t / a.runs:9.1f} {n / a.runs:10.1f} {t / n:8.2f}  {k[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
