#!/usr/bin/env python3
"""Model tests: kiln against ONNX Runtime on generated models, one kiln session per model,
with the input shape changing from call to call.

usage: test_models.py MODELS_DIR   (models from scripts/make_models.py; libkiln.so from
                                     build/ or $KILN_LIB)
"""
import os
import sys
import traceback

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kiln  # noqa: E402

RTOL, ATOL = 1e-4, 1e-4
results = {"passed": 0, "failed": 0}


def check(name, cond, detail=""):
    if cond:
        results["passed"] += 1
    else:
        results["failed"] += 1
        print(f"FAIL {name}: {detail}")


def compare(name, sess, ref, feeds):
    try:
        got = sess.run(feeds)
    except kiln.KilnError as e:
        check(name, False, f"kiln error: {e}")
        return
    want = ref.run(None, feeds)
    for o, g, w in zip(sess.outputs, got, want):
        ok = g.shape == w.shape and np.allclose(g, w, rtol=RTOL, atol=ATOL)
        detail = f"{o['name']}: shape {g.shape} vs {w.shape}"
        if g.shape == w.shape:
            detail += f", max abs diff {np.max(np.abs(g - w)) if g.size else 0:.3g}"
        check(f"{name} {o['name']}", ok, detail)


def expect_error(name, sess, feeds, needles):
    try:
        sess.run(feeds)
        check(name, False, "no error raised")
    except kiln.KilnError as e:
        msg = str(e)
        check(name, all(n in msg for n in needles), f"message {msg!r} lacks one of {needles}")


def test_encoder(models, rng):
    path = os.path.join(models, "encoder.onnx")
    sess, ref = kiln.Session(path), ort.InferenceSession(path)
    lengths = [16, 16, 10, 55, 5] + list(rng.integers(1, 513, size=20))
    for i, seq in enumerate(lengths):
        batch = [1, 3, 1, 2][i % 4]
        tokens = rng.integers(0, 100, size=(batch, int(seq))).astype(np.int64)
        compare(f"encoder batch={batch} seq={seq}", sess, ref, {"tokens": tokens})
    # longer than the positional table: the Add of embeddings and positions cannot broadcast
    expect_error("encoder seq=600 names the node and dims", sess,
                 {"tokens": rng.integers(0, 100, size=(1, 600)).astype(np.int64)}, ["Add", "600", "512"])
    expect_error("encoder wrong dtype", sess, {"tokens": np.zeros((1, 4), np.float32)}, ["tokens", "int64"])
    compare("encoder after errors", sess, ref, {"tokens": rng.integers(0, 100, size=(2, 9)).astype(np.int64)})


def test_convnet(models, rng):
    path = os.path.join(models, "convnet.onnx")
    sess, ref = kiln.Session(path), ort.InferenceSession(path)
    for batch, h, w in [(1, 40, 40), (1, 41, 37), (2, 17, 23), (1, 64, 48), (1, 3, 5), (2, 1, 1), (1, 40, 40)]:
        img = rng.standard_normal((batch, h, w, 3)).astype(np.float32)
        compare(f"convnet {batch}x{h}x{w}", sess, ref, {"image": img})
    expect_error("convnet wrong channel count", sess, {"image": np.zeros((1, 8, 8, 4), np.float32)},
                 ["image", "dim 3 must be 3"])


def test_mlp(models, rng):
    path = os.path.join(models, "mlp.onnx")
    sess, ref = kiln.Session(path), ort.InferenceSession(path)
    for batch in [1, 64, 7, 1, 33]:
        compare(f"mlp batch={batch}", sess, ref, {"x": rng.standard_normal((batch, 32)).astype(np.float32)})


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    rng = np.random.default_rng(1234)
    for test in (test_mlp, test_encoder, test_convnet):
        try:
            test(sys.argv[1], rng)
        except Exception:  # a crash of one model test is a failure, the others still run
            check(test.__name__, False, traceback.format_exc())
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
