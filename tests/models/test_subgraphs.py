#!/usr/bin/env python3
"""Subgraph model tests: kiln against ONNX Runtime on the models of tests/models/make_vad.py,
one kiln session per model, with branch, batch and sequence length changing from call to call
(subgraphs are compiled once with the session and bind their plans per call).

usage: test_subgraphs.py MODELS_DIR   (libkiln.so from build/ or $KILN_LIB)
"""
import os
import sys
import traceback

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5


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


def check_session(name, sess, runs):
    st = sess.stats()
    check(f"{name} one compilation", st["compilations"] == 1, st)
    check(f"{name} runs counted", st["runs"] == runs, st)
    check(f"{name} no heap fallback", st["heap_fallbacks"] == 0, st)


def expect_error(name, sess, feeds, needles):
    try:
        sess.run(feeds)
        check(name, False, "no error raised")
    except kiln.KilnError as e:
        msg = str(e)
        check(name, all(n in msg for n in needles), f"message {msg!r} lacks one of {needles}")


def test_vad(models, rng):
    """The VAD-shaped If: batch 1, 2, 3 and both branches alternating in one session, the state
    carried from call to call as a streaming caller does; then a state of the wrong batch."""
    path = os.path.join(models, "vad.onnx")
    sess, ref = kiln.Session(path), ort.InferenceSession(path)
    runs = 0
    for rounds in range(3):
        for batch in (1, 2, 3, 1, 3, 2):
            state = np.zeros((2, batch, 128), np.float32)
            for call in range(3):
                sr = 16000 if (call + batch + rounds) % 2 else 8000
                feeds = {"input": rng.standard_normal((batch, 512)).astype(np.float32), "state": state,
                         "sr": np.array(sr, np.int64)}
                compare(f"vad batch={batch} sr={sr} call={call}", sess, ref, feeds)
                state = ref.run(["stateN"], feeds)[0]
                runs += 1
    check_session("vad", sess, runs)
    bad = {"input": rng.standard_normal((3, 512)).astype(np.float32), "state": np.zeros((2, 2, 128), np.float32),
           "sr": np.array(16000, np.int64)}
    expect_error("vad state batch 2 with input batch 3 names the dims", sess, bad, ["3", "2"])
    compare("vad after error", sess, ref, {"input": rng.standard_normal((2, 512)).astype(np.float32),
                                           "state": np.zeros((2, 2, 128), np.float32), "sr": np.array(8000, np.int64)})


def test_loop(models, rng):
    """A Loop over seq steps (trip count from Shape, carried h, scanned ys) reading outer weights
    and the outer input by the iteration number; seq and batch change on every call."""
    path = os.path.join(models, "loop_rnn.onnx")
    sess, ref = kiln.Session(path), ort.InferenceSession(path)
    cases = [(5, 2), (1, 1), (8, 3), (5, 2), (3, 1), (12, 4), (1, 3), (7, 2)]
    for seq, batch in cases:
        feeds = {"x": rng.standard_normal((seq, batch, 16)).astype(np.float32),
                 "h0": rng.standard_normal((batch, 32)).astype(np.float32)}
        compare(f"loop seq={seq} batch={batch}", sess, ref, feeds)
    check_session("loop", sess, len(cases))
    expect_error("loop h0 of another batch", sess, {"x": np.zeros((2, 3, 16), np.float32),
                                                    "h0": np.zeros((2, 32), np.float32)}, ["batch"])


def test_scan(models, rng):
    """A Scan along axis 1 with its scan output stacked along axis 1; seq and batch change."""
    path = os.path.join(models, "scan_rnn.onnx")
    sess, ref = kiln.Session(path), ort.InferenceSession(path)
    cases = [(2, 5), (1, 1), (3, 8), (2, 5), (4, 2), (1, 9)]
    for batch, seq in cases:
        feeds = {"x": rng.standard_normal((batch, seq, 16)).astype(np.float32),
                 "h0": rng.standard_normal((batch, 32)).astype(np.float32)}
        compare(f"scan batch={batch} seq={seq}", sess, ref, feeds)
    check_session("scan", sess, len(cases))


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    rng = np.random.default_rng(29)
    for test in (test_vad, test_loop, test_scan):
        try:
            test(sys.argv[1], rng)
        except Exception:  # a crash of one model test is a failure, the others still run
            check(test.__name__, False, traceback.format_exc())
    return summary()


if __name__ == "__main__":
    sys.exit(main())
