#!/usr/bin/env python3
"""bench_packages.py - public PyPI packages that run ONNX Runtime internally and ship their ONNX
files, run end to end on kiln through the drop-in path (kiln.install_as_onnxruntime() before the
package is imported) and on ONNX Runtime, each in a fresh process on the same inputs: outputs
compared (tolerances per package below) and the median time of one pipeline call.

  rapidocr   rapidocr-onnxruntime: PP-OCRv4 det + PP-OCR mobile cls + PP-OCRv4 rec on a text image
             drawn with PIL -> [(box, text, score)]. Texts equal, boxes within 1 px, scores 1e-3.
  vad        faster-whisper's Silero VAD v6 (faster_whisper.vad) on a generated vowel-like
             waveform -> per-512-sample speech probabilities (atol 1e-4) and speech timestamps (equal).
  tashkeel   text2tashkeel: Arabic diacritization, the int8 BiLSTM models (rawi-ensemble, the
             default, and bilstm-int8) over a few sentences -> diacritized strings (equal).

The packages are pinned in requirements.txt (pip install -r it first).

usage: bench_packages.py [--calls N] [--only rapidocr,vad,tashkeel]
       (kiln from python/ with libkiln.so from $KILN_LIB or build/; tests/python/test_packages.py
       runs the same pipelines as tests)"""
import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PACKAGES = ("rapidocr", "vad", "tashkeel")

# ---- the inputs ----


def text_image(lines=("Hello kiln 2024", "ONNX Runtime drop-in"), width=560):
    """A BGR uint8 image (what RapidOCR takes from cv2) with `lines` drawn in black on white."""
    from PIL import Image, ImageDraw, ImageFont
    img = Image.new("RGB", (width, 70 * len(lines) + 30), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=40)
    for i, s in enumerate(lines):
        d.text((20, 20 + 70 * i), s, fill="black", font=font)
    return np.ascontiguousarray(np.array(img)[:, :, ::-1])


def speechlike(seconds=4.0, sr=16000, seed=0):
    """A vowel-like waveform (float32, a multiple of 512 samples): a glottal pulse train (pitch
    110..150 Hz) through formant resonators at 700, 1220 and 2600 Hz, in 4 Hz syllables, with a
    silent second at 40% and light noise. Silero VAD scores its syllables as speech."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr) // 512 * 512
    t = np.arange(n) / sr
    phase = np.cumsum((130 + 20 * np.sin(2 * np.pi * 0.7 * t)) / sr)
    y = (np.diff(np.floor(phase), prepend=0) > 0).astype(np.float64)
    for fc, bw in ((700, 130), (1220, 70), (2600, 160)):
        r, th = np.exp(-np.pi * bw / sr), 2 * np.pi * fc / sr
        a1, a2 = -2 * r * np.cos(th), r * r
        out, y1, y2 = np.zeros(n), 0.0, 0.0
        for i in range(n):
            v = y[i] - a1 * y1 - a2 * y2
            out[i], y2, y1 = v, y1, v
        y = out
    env = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) ** 0.5
    env[(t > seconds * 0.4) & (t < seconds * 0.4 + 1.0)] = 0
    return (y / np.max(np.abs(y)) * env * 0.5 + 0.003 * rng.standard_normal(n)).astype(np.float32)


SENTENCES = ["بسم الله الرحمن الرحيم", "ذهب الولد إلى المدرسة صباحا", "العلم نور والجهل ظلام",
             "كتب الطالب الدرس في الدفتر"]

# ---- the pipelines: setup() -> call() -> output (picklable) ----


def pipeline(name):
    if name == "rapidocr":
        from rapidocr_onnxruntime import RapidOCR
        engine, img = RapidOCR(), text_image()

        def call():
            result, _ = engine(img)
            return [(np.asarray(box, np.float64), text, float(score)) for box, text, score in (result or [])]
        return call
    if name == "vad":
        from faster_whisper.vad import VadOptions, get_speech_timestamps, get_vad_model
        model, audio = get_vad_model(), speechlike()

        def call():
            return model(audio).ravel().copy(), get_speech_timestamps(audio, VadOptions(), sampling_rate=16000)
        return call
    if name == "tashkeel":
        from text2tashkeel import Diacritizer
        ds = [Diacritizer(), Diacritizer("bilstm-int8")]

        def call():
            return [[d.diacritize(s) for s in SENTENCES] for d in ds]
        return call
    raise ValueError(f"unknown package pipeline '{name}'; have {PACKAGES}")


def compare(name, got, want):
    """[(what, ok, detail)] comparing kiln's output of pipeline `name` with ORT's."""
    if name == "rapidocr":
        rows = [("number of text boxes", len(got) == len(want), f"{len(got)} vs {len(want)}")]
        for i, ((gb, gt, gs), (wb, wt, ws)) in enumerate(zip(got, want)):
            rows.append((f"box {i} text", gt == wt, f"{gt!r} vs {wt!r}"))
            d = float(np.max(np.abs(gb - wb))) if gb.shape == wb.shape else float("inf")
            rows.append((f"box {i} corners (1 px)", d <= 1.0, f"max diff {d:g} px"))
            rows.append((f"box {i} score (1e-3)", abs(gs - ws) <= 1e-3, f"{gs:.6f} vs {ws:.6f}"))
        return rows
    if name == "vad":
        (gp, gt), (wp, wt) = got, want
        d = float(np.max(np.abs(gp - wp))) if gp.shape == wp.shape else float("inf")
        return [("speech probabilities (atol 1e-4)", d <= 1e-4, f"{gp.size} chunks, max diff {d:.2e}"),
                ("speech timestamps", gt == wt, f"{gt} vs {wt}")]
    if name == "tashkeel":
        rows = []
        for m, (gm, wm) in enumerate(zip(got, want)):
            for s, (g, w) in enumerate(zip(gm, wm)):
                rows.append((f"model {m} sentence {s}", g == w, f"{g} vs {w}"))
        return rows
    raise ValueError(name)


# ---- one process per (package, runtime) ----

def exact_int8_ort():
    """Makes every onnxruntime.InferenceSession this process creates the exact ORT of
    tests/common/ort_int8.py (uint8 x int8 products exact where this CPU's ORT saturates them);
    returns the line saying which ORT that is."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
    import onnxruntime
    import ort_int8
    line = ort_int8.mode()  # probes through the unpatched ORT
    init = onnxruntime.InferenceSession.__init__

    def exact_init(self, path_or_bytes, sess_options=None, *a, **kw):
        model, _ = ort_int8.exact_form(path_or_bytes)
        init(self, model, ort_int8.session_options(sess_options, model), *a, **kw)
    onnxruntime.InferenceSession.__init__ = exact_init
    return line


def worker(name, runtime, calls, out_path, exact_int8=False):
    """Runs in a fresh process: installs kiln as onnxruntime (runtime 'kiln') before the package
    is imported, runs the pipeline once for its output, then `calls` more times for the timing.
    Writes {output, median_ms, kiln_runs, ort_mode} to out_path; kiln_runs counts the runs of the
    kiln sessions the package created (the proof that kiln ran: None under ORT). exact_int8 (ORT
    only): ORT's int8 products exact on any CPU (exact_int8_ort), its mode line in ort_mode."""
    sessions = []
    ort_mode = None
    if runtime == "kiln":
        import kiln
        ort = kiln.install_as_onnxruntime()
        import onnxruntime
        assert onnxruntime is ort, "onnxruntime did not resolve to kiln"
        init = kiln.InferenceSession.__init__

        def recording_init(self, *a, **kw):
            init(self, *a, **kw)
            sessions.append(self)
        kiln.InferenceSession.__init__ = recording_init
    else:
        import onnxruntime
        assert "kiln" not in onnxruntime.__file__
        if exact_int8:
            ort_mode = exact_int8_ort()
    import warnings
    warnings.simplefilter("ignore")  # the packages' ignored ORT options: listed by --warnings
    call = pipeline(name)
    out = call()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    runs = sum(s.stats()["runs"] for s in sessions) if runtime == "kiln" else None
    with open(out_path, "wb") as f:
        pickle.dump({"output": out, "median_ms": statistics.median(times) if times else None,
                     "kiln_runs": runs, "kiln_sessions": len(sessions), "ort_mode": ort_mode}, f)


def run_in_fresh_process(name, runtime, calls, tmpdir, exact_int8=False):
    out_path = os.path.join(tmpdir, f"{name}-{runtime}.pkl")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), os.path.dirname(os.path.abspath(__file__))] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if not env.get("KILN_LIB") and os.path.exists(os.path.join(ROOT, "build", "libkiln.so")):
        env["KILN_LIB"] = os.path.join(ROOT, "build", "libkiln.so")
    code = f"import bench_packages as b; b.worker({name!r}, {runtime!r}, {calls}, {out_path!r}, {exact_int8!r})"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{name} on {runtime} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    with open(out_path, "rb") as f:
        return pickle.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--only", default=",".join(PACKAGES))
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    import tempfile
    rows, bad = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            ort_r = run_in_fresh_process(name, "ort", args.calls, tmp)
            kiln_r = run_in_fresh_process(name, "kiln", args.calls, tmp)
            checks = compare(name, kiln_r["output"], ort_r["output"])
            fails = [c for c in checks if not c[1]]
            bad += len(fails) + (not kiln_r["kiln_runs"])
            print(f"{name}: {len(checks) - len(fails)}/{len(checks)} outputs equal to ORT's; "
                  f"{kiln_r['kiln_sessions']} kiln sessions ran {kiln_r['kiln_runs']} times")
            for what, _, detail in fails:
                print(f"   DIFFERS {what}: {detail}")
            rows.append({"package": name, "kiln_ms": kiln_r["median_ms"], "ort_ms": ort_r["median_ms"],
                         "ratio": kiln_r["median_ms"] / ort_r["median_ms"], "equal": not fails})
    print(f"\n{'pipeline':10} {'kiln ms':>9} {'ORT ms':>9} {'kiln/ORT':>9}   (median of {args.calls} calls)")
    for r in rows:
        print(f"{r['package']:10} {r['kiln_ms']:9.2f} {r['ort_ms']:9.2f} {r['ratio']:9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
