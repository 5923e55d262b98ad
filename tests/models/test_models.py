#!/usr/bin/env python3
"""Model tests: kiln against ONNX Runtime on generated models, one kiln session per model,
with the input shape changing from call to call.

usage: test_models.py MODELS_DIR [--provider cpu|cuda]
       (models from tests/models/make_models.py; libkiln.so from build/ or $KILN_LIB; --provider
       cuda creates every kiln session on the CUDA provider, for scripts/test_gpu.sh)
"""
import argparse
import os
import sys
import traceback

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

RTOL, ATOL = 1e-4, 1e-4
N_RANDOM_LENGTHS = int(os.environ.get("KILN_TEST_LENGTHS", "500"))
N_SOAK_CALLS = 10000
PROVIDER = "cpu"  # --provider: the provider of every kiln session created here


def new_session(path, **kw):
    return kiln.Session(path, provider=PROVIDER, **kw)


def check_plan(name, sess):
    """After a run: the arena is within 1.10x the planner's lower bound, nothing fell back to
    the heap, and the model was compiled once."""
    st = sess.stats()
    check(f"{name} arena within 1.10x lower bound", st["arena_last_bytes"] <= 1.10 * st["lower_bound_last_bytes"],
          f"arena {st['arena_last_bytes']} vs lower bound {st['lower_bound_last_bytes']}")
    check(f"{name} no heap fallback", st["heap_fallbacks"] == 0, st)
    check(f"{name} one compilation", st["compilations"] == 1, st)


def compare(name, sess, ref, feeds):
    try:
        got = sess.run(feeds)
    except kiln.KilnError as e:
        check(name, False, f"kiln error: {e}")
        return
    check_plan(name, sess)
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
    """TTS-like encoder, one session: lengths 16, 16, 10, 55, 5, then 500 random in [1, 512],
    batch changing between 1 and 64."""
    path = os.path.join(models, "encoder.onnx")
    sess, ref = new_session(path), ort.InferenceSession(path)
    lengths = [16, 16, 10, 55, 5] + [int(n) for n in rng.integers(1, 513, size=N_RANDOM_LENGTHS)]
    for i, seq in enumerate(lengths):
        batch = 64 if i in (3, 40) else [1, 3, 1, 2][i % 4]
        tokens = rng.integers(0, 100, size=(batch, seq)).astype(np.int64)
        compare(f"encoder batch={batch} seq={seq}", sess, ref, {"tokens": tokens})
    # longer than the positional table: the Add of embeddings and positions cannot broadcast
    expect_error("encoder seq=600 names the node and dims", sess,
                 {"tokens": rng.integers(0, 100, size=(1, 600)).astype(np.int64)}, ["Add", "600", "512"])
    expect_error("encoder wrong dtype", sess, {"tokens": np.zeros((1, 4), np.float32)}, ["tokens", "int64"])
    expect_error("encoder wrong rank", sess, {"tokens": np.zeros((4,), np.int64)}, ["tokens", "rank 2"])
    compare("encoder after errors", sess, ref, {"tokens": rng.integers(0, 100, size=(2, 9)).astype(np.int64)})


def test_decoder(models, rng):
    """Decoder step with a KV cache: past length grows 0 -> 511, one call per step."""
    path = os.path.join(models, "decoder.onnx")
    sess, ref = new_session(path), ort.InferenceSession(path)
    for batch in (1, 64):
        past_k = np.zeros((batch, 4, 0, 16), np.float32)
        past_v = np.zeros((batch, 4, 0, 16), np.float32)
        steps = 512 if batch == 1 else 24
        for step in range(steps):
            x = rng.standard_normal((batch, 1, 64)).astype(np.float32)
            feeds = {"x": x, "past_k": past_k, "past_v": past_v}
            got = sess.run(feeds)
            want = ref.run(None, feeds)
            ok = all(g.shape == w.shape and np.allclose(g, w, rtol=RTOL, atol=ATOL) for g, w in zip(got, want))
            check(f"decoder batch={batch} past={step}", ok, f"shapes {[g.shape for g in got]}")
            past_k, past_v = want[1], want[2]
    # the cache's head count is fixed by the model; the batch of x and the cache must agree
    expect_error("decoder cache batch mismatch", sess,
                 {"x": np.zeros((2, 1, 64), np.float32), "past_k": np.zeros((3, 4, 5, 16), np.float32),
                  "past_v": np.zeros((3, 4, 5, 16), np.float32)}, ["batch"])
    expect_error("decoder k/v length mismatch", sess,
                 {"x": np.zeros((1, 1, 64), np.float32), "past_k": np.zeros((1, 4, 5, 16), np.float32),
                  "past_v": np.zeros((1, 4, 6, 16), np.float32)}, ["past"])
    compare("decoder after errors", sess, ref, {"x": np.ones((1, 1, 64), np.float32),
                                                "past_k": np.ones((1, 4, 3, 16), np.float32),
                                                "past_v": np.ones((1, 4, 3, 16), np.float32)})


def test_convnet(models, rng):
    """Conv/upsample network at many H x W, most not multiples of the total stride."""
    path = os.path.join(models, "convnet.onnx")
    sess, ref = new_session(path), ort.InferenceSession(path)
    sizes = [(1, 40, 40), (1, 41, 37), (2, 17, 23), (1, 64, 48), (1, 3, 5), (2, 1, 1), (64, 8, 8), (1, 40, 40)]
    sizes += [(1, int(h), int(w)) for h, w in rng.integers(1, 70, size=(12, 2))]
    for batch, h, w in sizes:
        img = rng.standard_normal((batch, h, w, 3)).astype(np.float32)
        compare(f"convnet {batch}x{h}x{w}", sess, ref, {"image": img})
    expect_error("convnet wrong channel count", sess, {"image": np.zeros((1, 8, 8, 4), np.float32)},
                 ["image", "dim 3 must be 3"])
    strict = new_session(os.path.join(models, "unet_strict.onnx"))
    strict_ref = ort.InferenceSession(os.path.join(models, "unet_strict.onnx"))
    compare("unet_strict 40x36", strict, strict_ref, {"image": rng.standard_normal((1, 40, 36, 3)).astype(np.float32)})
    # 42 = 2 * 21: the upsampled 11 -> 22 cannot be concatenated with 21
    expect_error("unet_strict 42x36 names Concat and dims", strict,
                 {"image": np.zeros((1, 42, 36, 3), np.float32)}, ["Concat", "21", "22"])
    compare("unet_strict after error", strict, strict_ref,
            {"image": rng.standard_normal((2, 16, 20, 3)).astype(np.float32)})


def test_datadep(models, rng):
    """Data-dependent sizes: NonZero -> Gather, TopK with k from an input, Unique, Loop with a
    trip count from data."""
    path = os.path.join(models, "datadep.onnx")
    sess, ref = new_session(path), ort.InferenceSession(path)
    for n, k, trips in [(9, 3, 4), (1, 1, 0), (30, 30, 7), (5, 2, 1), (0, 0, 2), (17, 5, 12)]:
        feeds = {"x": rng.standard_normal(n).astype(np.float32), "k": np.array([k], np.int64),
                 "trips": np.array(trips, np.int64)}
        compare(f"datadep n={n} k={k} trips={trips}", sess, ref, feeds)
    expect_error("datadep k > n", sess, {"x": np.ones(3, np.float32), "k": np.array([5], np.int64),
                                         "trips": np.array(1, np.int64)}, ["TopK"])
    compare("datadep after error", sess, ref, {"x": rng.standard_normal(6).astype(np.float32),
                                               "k": np.array([2], np.int64), "trips": np.array(3, np.int64)})


def test_plan_cache_soak(models, rng):
    """10,000 calls with random shapes: the plan cache stays at its bound and memory is flat."""
    path = os.path.join(models, "mlp.onnx")
    sess = new_session(path, plan_cache_size=8)
    x = rng.standard_normal((300, 32)).astype(np.float32)

    def rss_kib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024

    batches = rng.integers(1, 301, size=N_SOAK_CALLS)
    rss_early = None
    for i, b in enumerate(batches):
        sess.run({"x": x[:b]})
        if i == N_SOAK_CALLS // 10:
            rss_early = rss_kib()
    st = sess.stats()
    check("soak plan cache at its bound", st["plan_cache_entries"] <= 8 and st["plan_cache_capacity"] == 8, st)
    check("soak runs counted", st["runs"] == N_SOAK_CALLS and st["plan_cache_hits"] + st["plan_cache_misses"] == st["runs"],
          st)
    check("soak compilations", st["compilations"] == 1, st)
    growth = rss_kib() - rss_early
    check("soak memory flat", growth < 4096, f"RSS grew {growth} KiB between call {N_SOAK_CALLS // 10} and the end")


def test_mlp(models, rng):
    path = os.path.join(models, "mlp.onnx")
    sess, ref = new_session(path), ort.InferenceSession(path)
    for batch in [1, 64, 7, 1, 33, 64]:
        compare(f"mlp batch={batch}", sess, ref, {"x": rng.standard_normal((batch, 32)).astype(np.float32)})
    expect_error("mlp inner dim", sess, {"x": np.zeros((2, 31), np.float32)}, ["x", "dim 1 must be 32"])


def test_weights_in_file(models, rng):
    """A model file's large initializers stay in the mapped file (the loader parses a copy
    without their bytes): float32, float16, float64 and int8 weights at whatever alignment
    their names leave them, small ones parsed as usual, an initializer that is also a graph
    input and is fed in some runs; the file removed while the session lives. Against ORT and
    against the same model loaded from memory."""
    import tempfile
    from onnx import TensorProto, helper, numpy_helper
    inits = {"W1_a": rng.standard_normal((64, 64)).astype(np.float32),
             "W2_bcd": rng.standard_normal((64, 64)).astype(np.float16),
             "W3_e": rng.standard_normal(601).astype(np.float64),
             "W4_fghij": rng.integers(-100, 100, 5001).astype(np.int8),
             "small": rng.standard_normal(64).astype(np.float32),
             "S": rng.standard_normal((1, 64)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "W1_a"], ["a"]),
             helper.make_node("Cast", ["W2_bcd"], ["w2"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "w2"], ["b"]),
             helper.make_node("ReduceSum", ["W3_e"], ["s3"], keepdims=0),
             helper.make_node("Cast", ["s3"], ["s3f"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["W4_fghij"], ["w4"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["w4"], ["s4"], keepdims=0),
             helper.make_node("Add", ["a", "b"], ["ab"]),
             helper.make_node("Add", ["ab", "small"], ["abs"]),
             helper.make_node("Mul", ["abs", "S"], ["m"]),
             helper.make_node("Add", ["m", "s3f"], ["m3"]),
             helper.make_node("Sub", ["m3", "s4"], ["y"])]
    g = helper.make_graph(nodes, "weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64]),
                                             helper.make_tensor_value_info("S", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    blob = m.SerializeToString()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "weights.onnx")
        with open(path, "wb") as f:
            f.write(blob)
        sess, ref = new_session(path), ort.InferenceSession(path)
        os.remove(path)
    mem = kiln.Session(blob, provider=PROVIDER)
    for i, n in enumerate([1, 5, 0, 17, 3]):
        feeds = {"x": rng.standard_normal((n, 64)).astype(np.float32)}
        if i % 2:
            feeds["S"] = rng.standard_normal((1, 64)).astype(np.float32)
        compare(f"weights in the file n={n} S fed={i % 2 == 1}", sess, ref, feeds)
        got, same = sess.run(feeds)[0], mem.run(feeds)[0]
        check(f"weights in the file n={n}: same as loaded from memory", np.array_equal(got, same))


def test_overridable_initializers(models, rng):
    """Initializers that are also graph inputs are defaults a run may replace (ONNX IR 4+):
    Conv weights and bias under a BatchNormalization, the BatchNormalization variance, Clip
    bounds, MatMul weights and bias, the Gelu pattern's constants and Gather indices. The
    graph passes (Conv+BN folding, bias and activation fusion, the Gelu fusion), weight packing
    and the GPU's uploaded constants must all use the fed value. One session; each default fed
    alone, all fed, none fed, repeated so that GPU runs get recorded."""
    from onnx import TensorProto, helper, numpy_helper
    f32 = np.float32
    inits = {"Wc": rng.standard_normal((4, 3, 3, 3)).astype(f32), "Bc": rng.standard_normal(4).astype(f32),
             "sc": rng.uniform(0.5, 1.5, 4).astype(f32), "bi": rng.standard_normal(4).astype(f32),
             "mu": rng.standard_normal(4).astype(f32), "var": rng.uniform(0.5, 2.0, 4).astype(f32),
             "lo": np.array(-0.5, f32), "hi": np.array(1.5, f32),
             "Wm": (rng.standard_normal((196, 10)) / 14).astype(f32), "bm": rng.standard_normal(10).astype(f32),
             "s2": np.array(np.sqrt(2.0), f32), "one": np.array(1.0, f32), "half": np.array(0.5, f32),
             "idx": np.array([7, 0, 3], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "Wc", "Bc"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "sc", "bi", "mu", "var"], ["b"]),
             helper.make_node("Clip", ["b", "lo", "hi"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "Wm"], ["m"]),
             helper.make_node("Add", ["m", "bm"], ["a"]),
             helper.make_node("Div", ["a", "s2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["a", "e1"], ["g1"]),
             helper.make_node("Mul", ["g1", "half"], ["y"]),
             helper.make_node("Gather", ["y", "idx"], ["z"], axis=1)]
    overridable = [k for k in inits if k not in ("sc", "bi", "mu", "one")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 7, 7])]
    ins += [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(inits[k].dtype), inits[k].shape)
            for k in overridable]
    g = helper.make_graph(nodes, "overridable", ins, [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 3])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    blob = m.SerializeToString()
    sess, ref = kiln.Session(blob, provider=PROVIDER), ort.InferenceSession(blob)

    def fresh(k):
        v = inits[k]
        if k == "idx":
            return rng.integers(-10, 10, 3).astype(np.int64)
        if k in ("var", "s2", "half"):
            return np.asarray(rng.uniform(0.5, 2.0, v.shape), f32)
        if k == "hi":
            return np.asarray(rng.uniform(0.5, 3.0), f32)
        return np.asarray(rng.standard_normal(v.shape) * (1 / 14 if k == "Wm" else 1), f32)

    cases = [[], ["Wc"], ["Bc"], ["var"], ["lo", "hi"], ["Wm"], ["bm"], ["s2", "half"], ["idx"], overridable]
    for n in (2, 2, 1):
        for fed in cases:
            for _ in range(2):  # the same binding again: a GPU run replays its recording
                feeds = {"x": rng.standard_normal((n, 3, 7, 7)).astype(f32)}
                feeds.update({k: fresh(k) for k in fed})
                compare(f"overridable n={n} fed={','.join(fed) or 'none'}", sess, ref, feeds)


def main():
    global PROVIDER
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("models")
    ap.add_argument("--provider", choices=sorted(kiln.PROVIDERS), default="cpu")
    args = ap.parse_args()
    PROVIDER = args.provider
    rng = np.random.default_rng(1234)
    for test in (test_weights_in_file, test_overridable_initializers, test_mlp, test_plan_cache_soak, test_datadep, test_convnet, test_decoder, test_encoder):
        try:
            test(args.models, rng)
        except Exception:  # a crash of one model test is a failure, the others still run
            check(test.__name__, False, traceback.format_exc())
    return summary()


if __name__ == "__main__":
    sys.exit(main())
