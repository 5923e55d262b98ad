#!/usr/bin/env python3
"""The GPU kernels of decode steps of a GenAI-layout folder on the CUDA provider, timed by
PyTorch's profiler (CUPTI sees every kernel the process launches, kiln's included, inside CUDA
graphs too): per kernel name, calls per step, average and total microseconds. A diagnostic for the
GPU machine (torch there), not a test.

usage: KILN_LIB=.gpu/libkiln.so python3 scripts/profile_gpu_kernels.py DIR [--position P] [--runs N]

The steps are the generator's own (tests/models/genai_ctypes.py over the C API): a prompt of P
tokens, then N decode steps as kiln generate runs them (the KV cache shared in place on the
device, each step a replay of one CUDA graph); the figures are per decode step, and the step's
wall time next to the kernels' sum shows what the gaps between them cost."""
import argparse
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--position", type=int, default=200)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models"))
    import genai_ctypes as gc

    g = gc.Generator(a.dir, max_length=a.position + a.runs + 8, provider=1)  # kiln_provider_kind: CUDA
    g.append_tokens([[(7 * k) % 1000 + 1 for k in range(a.position)]])
    for _ in range(3):
        g.generate_next()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(a.runs):
            g.generate_next()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / a.runs * 1e6
    g.close()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = e.cuda_time_total
        if t > 0:
            rows.append((t, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"decode steps after a prompt of {a.position}, {a.runs} steps: {wall:.1f} us per step (wall), "
          f"{total / a.runs:.1f} us of kernels per step")
    print(f"{'us/step':>9} {'calls/step':>10} {'avg us':>8}  kernel")
    for t, n, k in rows[:a.top]:
        print(f"{t / a.runs:9.1f} {n / a.runs:10.1f} {t / n:8.2f}  {k[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
