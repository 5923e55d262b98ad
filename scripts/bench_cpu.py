#!/usr/bin/env python3
"""The CPU benchmark table: every benchmark model at every shape through kiln and ONNX Runtime
(scripts/bench_peer.py's measure: same inputs, same thread count, each in its own process,
taking turns for --rounds rounds; each figure is the median over the rounds),
printed as a markdown table with median and p90 latency, the ratio kiln / ORT, session
creation and peak RSS. Figures, not a test: it never fails on time.

usage: bench_cpu.py [--models build/models] [--bm /tmp/bm] [--kiln build/kiln] [--threads 2] [--runs N]
                    [--rounds N] [--packages-only]
  build/models from tests/models/make_models.py, /tmp/bm from tests/models/make_bench_models.py; the last
  rows are the ONNX files public PyPI packages ship, found inside the installed packages
  (pip install -r requirements.txt)
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


def package_file(module, rel):
    """The path of a file an installed package ships (found without importing the package), or
    a 'pip install MODULE' placeholder when the package is missing."""
    import importlib.util
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return f"<pip install -r requirements.txt: no {module}>"
    return os.path.join(list(spec.submodule_search_locations)[0], rel)


def package_cases():
    """The ONNX files that public PyPI packages ship (requirements.txt), at
    the shapes those packages run them: RapidOCR's PP-OCRv4 det on a 480x640 page and a 96x320
    strip, rec on a
    48x320 text line, its cls on 48x192; faster-whisper's Silero VAD v6 on one 512-sample chunk
    (+ 64 samples of context) with its LSTM state; text2tashkeel's int8 BiLSTMs on a 40-letter
    sentence."""
    ocr = "rapidocr_onnxruntime"
    yield "RapidOCR det (PP-OCRv4)", "480x640", package_file(ocr, "models/ch_PP-OCRv4_det_infer.onnx"), \
        {"x": [1, 3, 480, 640]}
    yield "RapidOCR det (PP-OCRv4)", "96x320", package_file(ocr, "models/ch_PP-OCRv4_det_infer.onnx"), \
        {"x": [1, 3, 96, 320]}
    yield "RapidOCR rec (PP-OCRv4)", "48x320", package_file(ocr, "models/ch_PP-OCRv4_rec_infer.onnx"), \
        {"x": [1, 3, 48, 320]}
    yield "RapidOCR cls (mobile v2)", "48x192", package_file(ocr, "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"), \
        {"x": [1, 3, 48, 192]}
    yield "Silero VAD v6 (faster-whisper)", "1 chunk", package_file("faster_whisper", "assets/silero_vad_v6.onnx"), \
        {"input": [1, 576], "h": [1, 1, 128], "c": [1, 1, 128]}
    yield "text2tashkeel rawi-ensemble int8", "seq 40", package_file("text2tashkeel", "models/rawi_ensemble.int8.onnx"), \
        {"input": [1, 40]}
    yield "text2tashkeel bilstm int8", "seq 40", package_file("text2tashkeel", "models/bilstm.int8.onnx"), \
        {"input_ids": [1, 40]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap.add_argument("--models", default=os.path.join(here, "build", "models"))
    ap.add_argument("--bm", default="/tmp/bm")
    ap.add_argument("--kiln", default=os.path.join(here, "build", "kiln"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--packages-only", action="store_true", help="only the ONNX files the PyPI packages ship")
    a = ap.parse_args()
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    print(f"{os.cpu_count()} CPUs ({cpu}), {a.threads} threads each; {a.rounds} rounds of kiln then ORT, {a.runs} runs "
          "after 3 warm-ups each; each figure the median over the rounds")
    print("| model | shape | kiln median / p90 ms | ORT median / p90 ms | kiln/ORT | session create kiln / ORT ms "
          "| peak RSS kiln / ORT MB (ORT above its interpreter) |")
    print("|---|---|---|---|---|---|---|")
    table = list(package_cases()) if a.packages_only else list(cases(a.models, a.bm)) + list(package_cases())
    for name, shape, path, shapes in table:
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
