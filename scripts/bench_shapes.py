#!/usr/bin/env python3
"""Dynamic-shape benchmarks (figures, not tests), through libkiln in one session per model:

  1. first run at a never-seen shape vs a repeat run at that shape, median ratio over 100 new
     shapes, on the encoder (new sequence length) and the decoder step (new past length);
  2. binding + planning time per call as a fraction of the run time, decoder step at past 1.

usage: bench_shapes.py MODELS_DIR   (models from tests/models/make_models.py)
"""
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import kiln  # noqa: E402


def timed(sess, feeds):
    t = time.perf_counter()
    sess.run(feeds)
    return time.perf_counter() - t


def first_vs_repeat(sess, feeds_for, shapes):
    ratios = []
    for shape in shapes:
        feeds = feeds_for(shape)
        first = timed(sess, feeds)
        repeat = timed(sess, feeds)
        ratios.append(first / repeat)
    return statistics.median(ratios)


def main():
    models = sys.argv[1] if len(sys.argv) > 1 else "build/models"
    rng = np.random.default_rng(0)
    enc = kiln.Session(os.path.join(models, "encoder.onnx"), plan_cache_size=4)
    lengths = rng.permutation(np.arange(1, 257))[:100]
    r = first_vs_repeat(enc, lambda n: {"tokens": rng.integers(0, 100, size=(1, int(n))).astype(np.int64)}, lengths)
    print(f"encoder: first run at a new sequence length / repeat run, median over 100 lengths: {r:.3f}")

    dec = kiln.Session(os.path.join(models, "decoder.onnx"), plan_cache_size=4)

    def dec_feeds(past):
        return {"x": rng.standard_normal((1, 1, 64)).astype(np.float32),
                "past_k": rng.standard_normal((1, 4, int(past), 16)).astype(np.float32),
                "past_v": rng.standard_normal((1, 4, int(past), 16)).astype(np.float32)}

    r = first_vs_repeat(dec, dec_feeds, range(1, 101))
    print(f"decoder step: first run at a new past length / repeat run, median over 100 lengths: {r:.3f}")

    dec2 = kiln.Session(os.path.join(models, "decoder.onnx"))
    feeds = dec_feeds(1)
    for _ in range(2000):
        dec2.run(feeds)
    st = dec2.stats()
    print(f"decoder step at past 1: binding + planning {st['bind_plan_ns'] / st['runs'] / 1e3:.2f} us of "
          f"{st['run_ns'] / st['runs'] / 1e3:.2f} us per call ({100.0 * st['bind_plan_ns'] / st['run_ns']:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
