#!/usr/bin/env python3
"""The CPU benchmark table: every benchmark model at every shape through kiln and ONNX Runtime
(scripts/bench_peer.py's measure: same inputs, same thread count, each in its own process,
taking turns for --rounds rounds; each figure is the median over the rounds),
printed as a markdown table with median and p90 latency, the ratio kiln / ORT, session
creation and peak RSS. Figures, not a test: it never fails on time.

usage: bench_cpu.py [--models build/models] [--bm /tmp/bm] [--kiln build/kiln] [--threads 2] [--runs N]
                    [--rounds N]
  build/models from scripts/make_models.py, /tmp/bm from scripts/make_bench_models.py
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_peer import measure  # noqa: E402


def cases(models, bm):
    for s in (16, 128, 512):
        yield "TTS-like encoder", f"seq {s}", os.path.join(models, "encoder.onnx"), {"tokens": [1, s]}
    for name, f in (("MiniLM-L6", "minilm_l6.onnx"), ("BERT-base", "bert_base.onnx")):
        for s in (16, 128, 384):
            yield name, f"seq {s}", os.path.join(bm, f), {"input_ids": [1, s], "attention_mask": [1, s]}
    for name, f in (("ResNet-50", "resnet50.onnx"), ("MobileNetV2", "mobilenetv2.onnx")):
        for hw in (160, 224, 288):
            yield name, f"{hw}x{hw}", os.path.join(bm, f), {"image": [1, 3, hw, hw]}
    for h, w in ((64, 64), (128, 96), (256, 256)):
        yield "conv/upsample net", f"{h}x{w}", os.path.join(models, "convnet.onnx"), {"image": [1, h, w, 3]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap.add_argument("--models", default=os.path.join(here, "build", "models"))
    ap.add_argument("--bm", default="/tmp/bm")
    ap.add_argument("--kiln", default=os.path.join(here, "build", "kiln"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    print(f"{os.cpu_count()} CPUs ({cpu}), {a.threads} threads each; {a.rounds} rounds of kiln then ORT, {a.runs} runs "
          "after 3 warm-ups each; each figure the median over the rounds")
    print("| model | shape | kiln median / p90 ms | ORT median / p90 ms | kiln/ORT | session create kiln / ORT ms "
          "| peak RSS kiln / ORT MB (ORT above its interpreter) |")
    print("|---|---|---|---|---|---|---|")
    for name, shape, path, shapes in cases(a.models, a.bm):
        if not os.path.exists(path):
            print(f"| {name} | {shape} | missing {path} | | | | |")
            continue
        try:
            r = measure(path, shapes, a.threads, a.runs, 3, a.kiln, a.rounds)
        except RuntimeError as e:
            print(f"| {name} | {shape} | failed: {e} | | | | |")
            continue
        k, o = r["kiln"], r["ort"]
        print(f"| {name} | {shape} | {k['median_ms']:.3f} / {k['p90_ms']:.3f} | {o['median_ms']:.3f} / {o['p90_ms']:.3f} "
              f"| **{r['ratio']:.2f}** | {k['create_ms']:.1f} / {o['create_ms']:.1f} "
              f"| {k['peak_rss_mb']:.0f} / {o['peak_rss_mb']:.0f} ({o['peak_rss_mb'] - o['base_rss_mb']:.0f}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
