#!/usr/bin/env python3
"""The model families of ort_families.py in every form ONNX Runtime's tools write, against ONNX
Runtime (CPU):

  float        the family as built
  qd_s8/qd_u8  onnxruntime.quantization.quantize_dynamic, weight type QInt8 / QUInt8
  qs_qdq       quantize_static, QDQ format (calibration feeds from a fixed seed)
  qs_qop       quantize_static, QOperator format
  optimizer    onnxruntime.transformers.optimizer.optimize_model (the transformers only)
  opt_qd_s8/u8 the optimizer's file through quantize_dynamic (QAttention, QEmbedLayerNormalization)
  ort_ext      ORT's offline optimised file, ORT_ENABLE_EXTENDED (SessionOptions.optimized_model_filepath)
  ort_all      the same at ORT_ENABLE_ALL (com.microsoft.nchwc operators, block size of this machine)

Every form: `kiln info` lists no unsupported operator, and kiln's outputs equal ORT's at each
feed of the family. Float forms: rtol 1e-3 (atol 1e-4 of the output's largest magnitude).
Quantized forms: kiln's difference from ORT on the form, in max and in rms, no larger than ORT's
own quantization error (the form against the float model); integer outputs equal. ORT running a
form is the exact one of tests/common/ort_int8.py: as it is where its uint8 x int8 products are
exact (VNNI), computing them as uint8 x uint8 where they saturate (AVX2 without VNNI: there ORT's
quantized forms would carry its saturation error, which kiln does not make); the first line
printed says which. The TTS model
runs its token lengths 16, 16, 10, 55, 5 in one session that compiles once. A form that cannot be
made, loaded or run counts as a failure.

usage: test_ort_forms.py [KILN_CLI] [--only FAMILY[,FAMILY]] [--keep DIR]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402
import ort_families  # noqa: E402
import ort_int8  # noqa: E402

FORMS = ["float", "qd_s8", "qd_u8", "qs_qdq", "qs_qop", "optimizer", "opt_qd_s8", "opt_qd_u8", "ort_ext", "ort_all"]
QUANT = {"qd_s8", "qd_u8", "qs_qdq", "qs_qop", "opt_qd_s8", "opt_qd_u8"}


def ort_session(path, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL, save=None, expected=False):
    """expected: the session whose outputs kiln's are checked against (exact int8 products on
    every CPU); else one that writes a form."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.graph_optimization_level = level
    if save:
        so.optimized_model_filepath = save
    if expected:
        return ort_int8.expected_session(path, so)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def make_form(fam, form, src, d):
    """Writes `form` of the family (float file at src) into d; returns its path, or None where the
    form does not apply to the family."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
    dst = os.path.join(d, f"{fam.name}_{form}.onnx")
    if form == "float":
        return src
    if form in ("qd_s8", "qd_u8"):
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8 if form == "qd_s8" else QuantType.QUInt8)
    elif form in ("qs_qdq", "qs_qop"):
        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter(fam.calib)

            def get_next(self):
                return next(self.it, None)
        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ if form == "qs_qdq" else QuantFormat.QOperator,
                        per_channel=False)
    elif form == "optimizer":
        if not fam.model_type:
            return None
        from onnxruntime.transformers.optimizer import optimize_model
        optimize_model(src, model_type=fam.model_type, num_heads=fam.heads, hidden_size=fam.hidden,
                       opt_level=0).save_model_to_file(dst)
    elif form in ("opt_qd_s8", "opt_qd_u8"):
        if not fam.model_type:
            return None
        opt = make_form(fam, "optimizer", src, d)
        quantize_dynamic(opt, dst, weight_type=QuantType.QInt8 if form == "opt_qd_s8" else QuantType.QUInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    elif form in ("ort_ext", "ort_all"):
        L = ort.GraphOptimizationLevel
        ort_session(src, L.ORT_ENABLE_EXTENDED if form == "ort_ext" else L.ORT_ENABLE_ALL, save=dst)
    return dst


def ms_ops(path):
    m = onnx.load(path)
    return sorted({f"{n.domain}.{n.op_type}" for n in m.graph.node if n.domain not in ("", "ai.onnx")})


def errors(a, b):
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return (float(d.max()) if d.size else 0.0), (float(np.sqrt(np.mean(d * d))) if d.size else 0.0)


def run_form(fam, form, path, float_sess, cli, results):
    tag = f"{fam.name} {form}"
    if cli:
        r = subprocess.run([cli, "info", path], capture_output=True, text=True)
        text = r.stdout + r.stderr
        ok = r.returncode == 0 and "unsupported operators: none" in text
        check(f"{tag}: kiln info", ok, text.strip().splitlines()[-1][:300] if text.strip() else f"rc {r.returncode}")
        if not ok:
            results[(fam.name, form)] = "unsupported"
            return
    ref = ort_session(path, expected=True)
    try:
        sess = kiln.Session(path, num_threads=2)
    except kiln.KilnError as e:
        check(f"{tag}: load", False, str(e)[:300])
        results[(fam.name, form)] = "load"
        return
    good = True
    for feeds in fam.feeds:
        shapes = " ".join(f"{k}={list(v.shape)}" for k, v in feeds.items())
        want = ref.run(None, feeds)
        try:
            got = sess.run(feeds)
        except kiln.KilnError as e:
            check(f"{tag} {shapes}", False, f"run failed: {str(e)[:300]}")
            good = False
            continue
        base = float_sess.run(None, feeds) if form in QUANT else None
        for i, (g, w) in enumerate(zip(got, want)):
            g = np.asarray(g)
            name = f"{tag} {shapes} out{i}"
            if g.shape != w.shape or g.dtype != w.dtype:
                check(name, False, f"kiln {g.shape} {g.dtype}, ORT {w.shape} {w.dtype}")
                good = False
                continue
            if not np.issubdtype(w.dtype, np.floating):
                ok = np.array_equal(g, w)
                check(name, ok, f"{int(np.sum(g != w))} of {w.size} differ")
            elif form in QUANT:
                kmax, krms = errors(g, w)
                if base[i].shape == w.shape:
                    qmax, qrms = errors(w, base[i])
                else:  # quantization changed a data-dependent length: ORT's error is the whole output
                    qmax, qrms = errors(w, np.zeros_like(w))
                ok = kmax <= qmax and krms <= qrms
                check(name, ok, f"kiln vs ORT max {kmax:.3g} rms {krms:.3g}; ORT's quantization error max {qmax:.3g} "
                                f"rms {qrms:.3g}")
            else:
                tol = 1e-4 * (float(np.max(np.abs(w))) if w.size else 0.0) + 1e-30
                ok = np.allclose(g, w, rtol=1e-3, atol=tol)
                check(name, ok, f"max abs diff {float(np.max(np.abs(g - w))):.3g} (max |ORT| {float(np.max(np.abs(w))):.3g})")
            good = good and ok
    if fam.name == "tts":
        comp = sess.stats()["compilations"]
        check(f"{tag}: one compilation for lengths {ort_families.TTS_LENGTHS}", comp == 1, f"{comp} compilations")
        good = good and comp == 1
    results[(fam.name, form)] = "pass" if good else "mismatch"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli", nargs="?")
    ap.add_argument("--only")
    ap.add_argument("--forms")
    ap.add_argument("--keep")
    a = ap.parse_args()
    ort_int8.announce()
    results = {}
    fams = [b() for b in ort_families.FAMILIES]
    if a.only:
        fams = [f for f in fams if f.name in a.only.split(",")]
    forms = a.forms.split(",") if a.forms else FORMS
    with tempfile.TemporaryDirectory() as tmp:
        d = a.keep or tmp
        os.makedirs(d, exist_ok=True)
        for fam in fams:
            src = os.path.join(d, f"{fam.name}.onnx")
            onnx.save(fam.model, src)
            float_sess = ort_session(src, expected=True)
            for form in forms:
                try:
                    path = make_form(fam, form, src, d)
                except Exception as e:  # the tool itself refused: still a failure of the matrix
                    check(f"{fam.name} {form}: making the form", False, str(e).splitlines()[0][:200])
                    results[(fam.name, form)] = "tool"
                    continue
                if path is None:
                    continue
                print(f"  {fam.name} {form}: {' '.join(ms_ops(path)) or 'standard operators only'}")
                run_form(fam, form, path, float_sess, a.cli, results)
    names = [f.name for f in fams]
    print("\nform       " + " ".join(f"{n:>10}" for n in names))
    for form in forms:
        print(f"{form:<10} " + " ".join(f"{results.get((n, form), '-'):>10}" for n in names))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
