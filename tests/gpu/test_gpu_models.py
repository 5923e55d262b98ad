#!/usr/bin/env python3
"""GPU model tests: whole models on the CUDA provider against the CPU reference (an unoptimized
CPU session), element by element.

  layout    the layout case of issue 4: NHWC [1, 40, 40, 3] -> Transpose -> two strided Convs
            -> Resize 2x, and the NCHW-input network; fp32 and fp16; nearest, linear and cubic
            Resize with scales and with sizes; channels-last input into MaxPool / AveragePool.
            Values are compared in place (a permutation fails even when the sorted values
            agree) and each channel's argmax must land on the same position.
  outputs   a model with several outputs, fetched by name in another order than declared.
  fallback  supported ops around unsupported ones (NonZero, Unique): nodes on both providers,
            same result.
  lifetimes CPU and CUDA sessions created and destroyed alternately 100 times, then from two
            threads at once, and one CUDA session run from two threads at once.
  dynamic   one CUDA session of the TTS-like encoder fed 20 shapes: one compilation.
  steady    repeated runs at one shape make no device allocation; graphs replay with new data.
  recording runs with host shape arithmetic in the middle, pool tensors and outputs are recorded
            and stay right on new data; a host read of an input's elements is never recorded.
  device_io inputs given as device pointers (read in place) and outputs returned in device
            memory (device_outputs), plain, recorded and replayed, an output listed twice, a
            device input the host must read; memory from libcudart through ctypes.

usage: test_gpu_models.py   (libkiln.so from build/ or $KILN_LIB; prints SKIP and exits 0 when
                             no CUDA session can be created)
  KILN_GPU_MODEL_TESTS="layout outputs ..."  runs only those tests
  KILN_GPU_TEST_PROVIDER=cpu  puts the "GPU" sessions on the CPU: checks the test itself on a
                             machine without a GPU (the GPU placement checks then fail)
"""
import importlib.util
import os
import sys
import threading
import traceback

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

OPSET = 17
TOL = {np.float32: (1e-4, 1e-4), np.float16: (1e-2, 1e-2)}  # (rtol, atol) GPU vs reference
PROVIDER = os.environ.get("KILN_GPU_TEST_PROVIDER", "cuda")
ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}
rng = np.random.default_rng(4)


def make_model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kiln-gpu-test")
    m.ir_version = 8
    return m.SerializeToString()


def tensor(name, arr):
    return numpy_helper.from_array(arr, name)


def reference(blob):
    return kiln.Session(blob, unoptimized=True, provider="cpu")


def cuda(blob, **kw):
    return kiln.Session(blob, provider=PROVIDER, **kw)


def compare(name, got, want, dtype=np.float32):
    """Element-by-element comparison; the detail tells a permutation ('same values, wrong
    places') from wrong values and names the worst element's index."""
    if got.shape != want.shape or got.dtype != want.dtype:
        check(name, False, f"shape/dtype {got.shape} {got.dtype} vs {want.shape} {want.dtype}")
        return False
    rtol, atol = TOL.get(dtype, TOL[np.float32])
    g, w = got.astype(np.float64), want.astype(np.float64)
    if g.size == 0:
        check(name, True)
        return True
    err = np.abs(g - w)
    nan_ok = np.isnan(g) == np.isnan(w)
    err = np.where(np.isnan(g) & np.isnan(w), 0.0, err)
    bad = ~(err <= atol + rtol * np.abs(w)) | ~nan_ok
    ok = not bad.any()
    detail = ""
    if not ok:
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.where(bad, err, -1.0))), g.shape))
        sorted_err = np.max(np.abs(np.sort(g, axis=None) - np.sort(w, axis=None)))
        scale = max(np.max(np.abs(w)), 1e-30)
        detail = (f"{int(bad.sum())} of {g.size} elements off, max abs err {np.nanmax(err):.4g} at {worst} "
                  f"(got {g[worst]:.6g}, want {w[worst]:.6g}), relative to max |want| {np.nanmax(err) / scale:.3g}")
        if sorted_err <= atol + rtol * scale:
            detail += "; sorted values agree: SAME VALUES, WRONG PLACES (a layout bug)"
    check(name, ok, detail)
    return ok


def check_argmax(name, got, want, dtype):
    """For [N, C, ...] outputs: in every (n, c) map, the position of the reference's maximum
    holds the maximum of the GPU map too (ties within tolerance allowed)."""
    if got.shape != want.shape or got.ndim < 3:
        return
    rtol, atol = TOL[dtype]
    g = got.astype(np.float64).reshape(got.shape[0] * got.shape[1], -1)
    w = want.astype(np.float64).reshape(g.shape)
    idx = np.argmax(w, axis=1)
    at = g[np.arange(g.shape[0]), idx]
    gmax = g.max(axis=1)
    bad = np.nonzero(at < gmax - (atol + rtol * np.abs(gmax)))[0]
    detail = ""
    if len(bad):
        k = bad[0]
        detail = (f"{len(bad)} of {g.shape[0]} channel maps: map {k} has its reference maximum at flat index "
                  f"{idx[k]}, the GPU's at {int(np.argmax(g[k]))}")
    check(f"{name} argmax positions", not len(bad), detail)


def check_on_gpu(name, sess, all_gpu=True):
    st = sess.stats()
    check(f"{name} nodes on the GPU", st["nodes_gpu"] > 0 and st["node_runs_gpu"] > 0,
          f"nodes_gpu {st['nodes_gpu']}, node_runs_gpu {st['node_runs_gpu']}")
    if all_gpu:
        check(f"{name} no CPU fallback", st["nodes_cpu"] == 0, f"nodes_cpu {st['nodes_cpu']}")


# ---- the layout case ----

def layout_model(nhwc, dtype, mode="nearest", sizes=False, coord=None, pool=None):
    """image [N, H, W, 3] (nhwc) or [N, 3, H, W] -> (Transpose) -> Conv s2 -> Conv s2 -> Resize 2x,
    or with pool set -> (Transpose) -> MaxPool/AveragePool."""
    t = ONNX_TYPE[dtype]
    shape = ["N", "H", "W", 3] if nhwc else ["N", 3, "H", "W"]
    nodes, inits = [], []
    x = "image"
    if nhwc:
        nodes.append(helper.make_node("Transpose", [x], ["nchw"], perm=[0, 3, 1, 2]))
        x = "nchw"
    if pool:
        attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        if pool == "AveragePool":
            attrs["count_include_pad"] = 0
        nodes.append(helper.make_node(pool, [x], ["out"], **attrs))
        out_shape = ["N", 3, "OH", "OW"]
    else:
        inits += [tensor("w1", (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(dtype)),
                  tensor("b1", (rng.standard_normal(8) * 0.1).astype(dtype)),
                  tensor("w2", (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(dtype)),
                  tensor("b2", (rng.standard_normal(8) * 0.1).astype(dtype))]
        nodes.append(helper.make_node("Conv", [x, "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1],
                                      kernel_shape=[3, 3]))
        nodes.append(helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1],
                                      kernel_shape=[3, 3]))
        attrs = {"mode": mode}
        if coord:
            attrs["coordinate_transformation_mode"] = coord
        if mode == "nearest" and coord == "asymmetric":
            attrs["nearest_mode"] = "floor"
        if sizes:  # [1, 40, 40, 3] -> c2 [1, 8, 10, 10] -> [1, 8, 20, 20]
            inits.append(tensor("sizes", np.array([1, 8, 20, 20], np.int64)))
            nodes.append(helper.make_node("Resize", ["c2", "", "", "sizes"], ["out"], **attrs))
        else:
            inits.append(tensor("scales", np.array([1, 1, 2, 2], np.float32)))
            nodes.append(helper.make_node("Resize", ["c2", "", "scales"], ["out"], **attrs))
        out_shape = ["N", 8, "OH", "OW"]
    return make_model(nodes, [helper.make_tensor_value_info("image", t, shape)],
                      [helper.make_tensor_value_info("out", t, out_shape)], inits)


def run_layout(name, blob, nhwc, dtype, shapes, all_gpu=True):
    try:
        gpu, ref = cuda(blob), reference(blob)
    except kiln.KilnError as e:
        check(name, False, f"session: {e}")
        return
    for n, h, w in shapes:
        img = rng.standard_normal((n, h, w, 3) if nhwc else (n, 3, h, w)).astype(dtype)
        label = f"{name} {n}x{h}x{w}"
        try:
            got = gpu.run({"image": img})[0]
        except kiln.KilnError as e:
            check(label, False, f"kiln error: {e}")
            continue
        want = ref.run({"image": img})[0]
        compare(label, got, want, dtype)
        check_argmax(label, got, want, dtype)
    check_on_gpu(name, gpu, all_gpu)


def test_layout():
    variants = [("nearest", False, None), ("nearest", True, None), ("nearest", False, "asymmetric"),
                ("linear", False, None), ("linear", True, None), ("cubic", False, None), ("cubic", True, None)]
    for dtype in (np.float32, np.float16):
        dn = "fp32" if dtype == np.float32 else "fp16"
        for nhwc in (True, False):
            ln = "nhwc" if nhwc else "nchw"
            for mode, sizes, coord in variants:
                name = f"layout {ln} {dn} resize {mode}{' sizes' if sizes else ''}{' ' + coord if coord else ''}"
                # sizes are fixed to the 40x40 case; scales also run other shapes in one session
                shapes = [(1, 40, 40)] if sizes else [(1, 40, 40), (2, 37, 41), (1, 40, 40)]
                run_layout(name, layout_model(nhwc, dtype, mode, sizes, coord), nhwc, dtype, shapes)
        for pool in ("MaxPool", "AveragePool"):
            run_layout(f"channels-last {pool} {dn}", layout_model(True, dtype, pool=pool), True, dtype,
                       [(1, 40, 40), (2, 37, 41)])


# ---- several outputs ----

def test_outputs():
    f = TensorProto.FLOAT
    w = (rng.standard_normal((16, 10)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits/dense:0"]),
             helper.make_node("Relu", ["logits/dense:0"], ["relu out"]),
             helper.make_node("Softmax", ["relu out"], ["probs"], axis=-1),
             helper.make_node("ReduceSum", ["x", "ax1"], ["sum:0"], keepdims=0),
             helper.make_node("Identity", ["x"], ["x_copy"])]
    blob = make_model(
        nodes, [helper.make_tensor_value_info("x", f, ["B", 16])],
        [helper.make_tensor_value_info("probs", f, ["B", 10]),
         helper.make_tensor_value_info("logits/dense:0", f, ["B", 10]),  # also consumed inside
         helper.make_tensor_value_info("sum:0", f, ["B"]),
         helper.make_tensor_value_info("x_copy", f, ["B", 16]),
         helper.make_tensor_value_info("relu out", f, ["B", 10])],
        [tensor("w", w), tensor("ax1", np.array([1], np.int64))])
    gpu, ref = cuda(blob), reference(blob)
    check("outputs declared names", [o["name"] for o in gpu.outputs] == [o["name"] for o in ref.outputs],
          [o["name"] for o in gpu.outputs])
    orders = [None, ["sum:0", "relu out", "probs"], ["x_copy"], ["logits/dense:0", "probs", "x_copy", "sum:0"]]
    for b in (1, 5, 64):
        x = rng.standard_normal((b, 16)).astype(np.float32)
        for names in orders:
            names = names or [o["name"] for o in ref.outputs]
            got = gpu.run({"x": x}, names)
            want = ref.run({"x": x}, names)
            for n, g, wv in zip(names, got, want):
                compare(f"outputs B={b} {n!r} among {names}", g, wv)
    check_on_gpu("outputs", gpu, all_gpu=False)


# ---- CPU fallback in the middle ----

def fallback_model():
    """x [N, 8] -> MatMul -> Relu (GPU) -> NonZero / Unique (CPU) -> Gather, Mul, Sigmoid (GPU)."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"]),
             helper.make_node("Relu", ["h0"], ["h"]),
             helper.make_node("Reshape", ["h", "flat_shape"], ["hf"]),
             helper.make_node("Greater", ["hf", "thr"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Squeeze", ["nz", "ax0"], ["idx"]),
             helper.make_node("Gather", ["hf", "idx"], ["picked"]),
             helper.make_node("Mul", ["picked", "three"], ["p3"]),
             helper.make_node("Sigmoid", ["p3"], ["positives"]),
             helper.make_node("Mul", ["h", "three"], ["h3"]),
             helper.make_node("Round", ["h3"], ["hr"]),
             helper.make_node("Unique", ["hr"], ["uniq"], sorted=1),
             helper.make_node("Exp", ["uniq"], ["uniq_exp"]),
             helper.make_node("ReduceSum", ["h", "ax0"], ["colsum"], keepdims=0)]
    inits = [tensor("w", (rng.standard_normal((8, 8)) * 0.5).astype(np.float32)),
             tensor("flat_shape", np.array([-1], np.int64)), tensor("thr", np.array(0.2, np.float32)),
             tensor("ax0", np.array([0], np.int64)), tensor("three", np.array(3.0, np.float32))]
    return make_model(nodes, [helper.make_tensor_value_info("x", f, ["N", 8])],
                      [helper.make_tensor_value_info("positives", f, ["P"]),
                       helper.make_tensor_value_info("uniq_exp", f, ["U"]),
                       helper.make_tensor_value_info("colsum", f, [8])], inits)


def test_fallback():
    blob = fallback_model()
    gpu, ref = cuda(blob), reference(blob)
    for n in (1, 7, 64, 3, 0, 200):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        for name, g, w in zip([o["name"] for o in ref.outputs], gpu.run({"x": x}), ref.run({"x": x})):
            compare(f"fallback N={n} {name}", g, w)
    st = gpu.stats()
    check("fallback nodes on both providers", st["nodes_gpu"] > 0 and st["nodes_cpu"] > 0,
          f"nodes_gpu {st['nodes_gpu']}, nodes_cpu {st['nodes_cpu']}")
    check("fallback node runs on both providers", st["node_runs_gpu"] > 0 and st["node_runs_cpu"] > 0,
          f"node_runs_gpu {st['node_runs_gpu']}, node_runs_cpu {st['node_runs_cpu']}")
    check("fallback copies at the boundaries", st["copies_to_device"] > 0 and st["copies_to_host"] > 0, st)


# ---- session lifetimes and threads ----

def test_lifetimes():
    blob = layout_model(True, np.float32)
    ref = reference(blob)
    img = rng.standard_normal((1, 40, 40, 3)).astype(np.float32)
    want = ref.run({"image": img})[0]
    errors = []

    def cycle(tag, count, first):
        for i in range(count):
            provider = PROVIDER if (i + first) % 2 else "cpu"
            try:
                s = kiln.Session(blob, provider=provider)
                got = s.run({"image": img})[0]
                if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                    errors.append(f"{tag} iteration {i} ({provider}): wrong result")
                s.close()
            except Exception as e:  # noqa: BLE001 - any failure is reported, the loop goes on
                errors.append(f"{tag} iteration {i} ({provider}): {e}")

    cycle("sequential", 100, 0)
    check("lifetimes: 100 alternating CPU/CUDA sessions", not errors, errors[:3])
    # overlapping lifetimes: a CUDA session freed while a CPU one lives, and the other way round
    errors.clear()
    try:
        for i in range(10):
            a = kiln.Session(blob, provider="cpu" if i % 2 else PROVIDER)
            b = kiln.Session(blob, provider=PROVIDER if i % 2 else "cpu")
            ga = a.run({"image": img})[0]
            a.close()
            gb = b.run({"image": img})[0]
            b.close()
            if not (np.allclose(ga, want, rtol=1e-4, atol=1e-4) and np.allclose(gb, want, rtol=1e-4, atol=1e-4)):
                errors.append(f"overlap {i}: wrong result")
    except Exception as e:  # noqa: BLE001
        errors.append(f"overlap: {e}")
    check("lifetimes: overlapping CPU and CUDA sessions", not errors, errors[:3])
    # two threads at once, each creating and destroying sessions of alternating providers
    errors.clear()
    threads = [threading.Thread(target=cycle, args=(f"thread {t}", 100, t)) for t in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check("lifetimes: 2 threads x 100 alternating sessions", not errors, errors[:3])
    # one CUDA session run from two threads at once, different inputs and shapes
    shared = cuda(blob)
    errors.clear()

    def hammer(t):
        r = np.random.default_rng(100 + t)
        for i in range(50):
            h, w = (40, 40) if i % 3 else (24 + t, 36)
            x = r.standard_normal((1 + t, h, w, 3)).astype(np.float32)
            try:
                got = shared.run({"image": x})[0]
                exp = ref.run({"image": x})[0]
                if got.shape != exp.shape or not np.allclose(got, exp, rtol=1e-4, atol=1e-4):
                    errors.append(f"thread {t} run {i}: wrong result")
            except Exception as e:  # noqa: BLE001
                errors.append(f"thread {t} run {i}: {e}")

    threads = [threading.Thread(target=hammer, args=(t,)) for t in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check("lifetimes: one CUDA session run from 2 threads at once", not errors, errors[:3])


# ---- dynamic shapes and steady state ----

def encoder_blob():
    spec = importlib.util.spec_from_file_location("make_models", os.path.join(HERE, "..", "models", "make_models.py"))
    mm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mm)
    m = helper.make_model(mm.encoder(), opset_imports=[helper.make_opsetid("", mm.OPSET)], producer_name="kiln")
    m.ir_version = 8
    return m.SerializeToString()


def test_dynamic():
    blob = encoder_blob()
    gpu, ref = cuda(blob), reference(blob)
    shapes = [(1, 16), (1, 16), (1, 10), (64, 55), (1, 5), (3, 512), (2, 1), (1, 128), (8, 77), (1, 511),
              (4, 33), (1, 2), (16, 64), (1, 300), (2, 17), (1, 16), (32, 128), (1, 255), (5, 3), (1, 400)]
    for b, s in shapes:
        tokens = rng.integers(0, 100, size=(b, s)).astype(np.int64)
        try:
            got = gpu.run({"tokens": tokens})
        except kiln.KilnError as e:
            check(f"encoder batch={b} seq={s}", False, f"kiln error: {e}")
            continue
        for o, g, w in zip(gpu.outputs, got, ref.run({"tokens": tokens})):
            compare(f"encoder batch={b} seq={s} {o['name']}", g, w)
    st = gpu.stats()
    check("encoder 20 shapes: one compilation", st["compilations"] == 1, f"compilations {st['compilations']}")
    check("encoder 20 shapes: runs counted", st["runs"] == len(shapes), f"runs {st['runs']}")
    check_on_gpu("encoder", gpu, all_gpu=False)
    try:
        gpu.run({"tokens": np.zeros((1, 600), np.int64)})
        check("encoder seq=600 is an error", False, "no error raised")
    except kiln.KilnError as e:
        check("encoder seq=600 is an error naming the dims", "600" in str(e) and "512" in str(e), str(e))
    tokens = rng.integers(0, 100, size=(2, 9)).astype(np.int64)
    compare("encoder after the error", gpu.run({"tokens": tokens})[0], ref.run({"tokens": tokens})[0])


def test_steady_state():
    for name, blob, make in [
            ("encoder", encoder_blob(), lambda r, s: {"tokens": r.integers(0, 100, size=s).astype(np.int64)}),
            ("layout fp16", layout_model(True, np.float16),
             lambda r, s: {"image": r.standard_normal(s).astype(np.float16)})]:
        gpu, ref = cuda(blob), reference(blob)
        dtype = np.float16 if "fp16" in name else np.float32
        shape_a, shape_b = ((2, 48), (1, 100)) if name == "encoder" else ((1, 40, 40, 3), (2, 24, 32, 3))
        r = np.random.default_rng(7)
        for _ in range(3):  # warm-up: plans, captures
            gpu.run(make(r, shape_a))
            gpu.run(make(r, shape_b))
        before = gpu.stats()
        wrong = []
        for i in range(20):  # alternate the two bindings with new data on every call
            feeds = make(r, shape_a if i % 2 else shape_b)
            got, want = gpu.run(feeds)[0], ref.run(feeds)[0]
            rtol, atol = TOL[dtype]
            if got.shape != want.shape or not np.allclose(got.astype(np.float64), want.astype(np.float64),
                                                          rtol=rtol, atol=atol):
                wrong.append(i)
        after = gpu.stats()
        check(f"steady {name}: results right on repeated bindings", not wrong, f"wrong at calls {wrong}")
        check(f"steady {name}: no device allocation after warm-up",
              after["device_mallocs"] == before["device_mallocs"],
              f"device_mallocs {before['device_mallocs']} -> {after['device_mallocs']}")
        check(f"steady {name}: plan cache hits", after["plan_cache_hits"] - before["plan_cache_hits"] == 20,
              f"hits {before['plan_cache_hits']} -> {after['plan_cache_hits']}")
        check(f"steady {name}: CUDA graphs replayed", after["graphs_replayed"] > before["graphs_replayed"],
              f"captured {after['graphs_captured']}, replayed {before['graphs_replayed']} -> "
              f"{after['graphs_replayed']}")
        print(f"steady {name}: device_mallocs {after['device_mallocs']}, graphs captured "
              f"{after['graphs_captured']}, replayed {after['graphs_replayed']}, copies h2d "
              f"{after['copies_to_device']} d2h {after['copies_to_host']}")


def mask_model():
    """What exported transformers do around their attention mask: host shape arithmetic (Shape,
    Gather, Range) whose results the GPU reads in the middle of the run, beside the mask's
    elements, which the GPU reads itself."""
    i64 = lambda name, v: tensor(name, np.array(v, np.int64))  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["s"]),
             helper.make_node("Range", ["zero", "s", "one"], ["pos"]),      # host: [s]
             helper.make_node("Unsqueeze", ["pos", "axis0"], ["pos2"]),     # GPU reads it: [1, s]
             helper.make_node("Cast", ["pos2"], ["posf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["posf", "scale"], ["pe"]),
             helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
             helper.make_node("Sub", ["onef", "maskf"], ["inv"]),
             helper.make_node("Mul", ["inv", "big"], ["bias"]),
             helper.make_node("Add", ["x", "pe"], ["xp"]),
             helper.make_node("Add", ["xp", "bias"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    inits = [i64("zero", 0), i64("one", 1), i64("axis0", [0]), tensor("scale", np.array(0.25, np.float32)),
             tensor("onef", np.array(1, np.float32)), tensor("big", np.array(-1e4, np.float32))]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s"]),
                              helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "s"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s"])], inits)


def test_recording():
    """Recorded runs stay right when the host computes values in the middle of the run: values
    of shapes alone are recorded (and replayed on new data), values of the inputs' elements
    keep the binding unrecorded."""
    blob = mask_model()
    gpu, ref = cuda(blob), reference(blob)
    r = np.random.default_rng(11)

    def feeds(shape):
        return {"x": r.standard_normal(shape).astype(np.float32), "mask": r.integers(0, 2, size=shape).astype(np.int64)}
    for _ in range(3):
        gpu.run(feeds((2, 37)))
        gpu.run(feeds((1, 128)))
    before = gpu.stats()
    ok = True
    for i in range(12):
        f = feeds((2, 37) if i % 2 else (1, 128))
        ok = compare(f"recording: mask model {f['x'].shape} call {i}", gpu.run(f)[0], ref.run(f)[0]) and ok
    after = gpu.stats()
    check("recording: mask model replayed", after["graphs_replayed"] - before["graphs_replayed"] == 12,
          f"captured {after['graphs_captured']}, replayed {before['graphs_replayed']} -> {after['graphs_replayed']}")

    # a tensor whose shape inference cannot give before the run (Expand to a shape the host
    # computes with Where, as exported position ids are) lives in the device pool, not the
    # arena: its allocation is recorded too
    i64 = lambda name, v: tensor(name, np.array(v, np.int64))  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["b"]),
             helper.make_node("Unsqueeze", ["b", "axis0"], ["b1"]),
             helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
             helper.make_node("Equal", ["target", "minus1s"], ["is_neg"]),
             helper.make_node("Where", ["is_neg", "ones", "target"], ["target2"]),
             helper.make_node("Expand", ["table", "target2"], ["e"]),
             helper.make_node("ReduceSum", ["e", "axes01"], ["e_sum"], keepdims=0),
             helper.make_node("Reshape", ["e_sum", "one_shape"], ["e1"]),
             helper.make_node("Mul", ["x", "e1"], ["y"]),
             helper.make_node("Mul", ["e", "e"], ["z"])]  # an output without an arena slot
    inits = [i64("zero", 0), i64("axis0", [0]), i64("minus1", [-1]), i64("minus1s", [-1, -1]), i64("ones", [1, 1]),
             tensor("table", r.standard_normal((1, 8)).astype(np.float32)), i64("axes01", [0, 1]),
             i64("one_shape", [1])]
    blob = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s"]),
                       helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    gpu, ref = cuda(blob), reference(blob)
    for i in range(10):
        f = {"x": r.standard_normal((3, 5) if i % 2 else (1, 9)).astype(np.float32)}
        got, want = gpu.run(f), ref.run(f)
        compare(f"recording: Expand to a host-computed shape, call {i}", got[0], want[0])
        compare(f"recording: an output from the device pool, call {i}", got[1], want[1])
    st = gpu.stats()
    check("recording: Expand to a host-computed shape replayed", st["graphs_replayed"] >= 4,
          f"replayed {st['graphs_replayed']}, note {st['graphs_note']!r}")

    # the target shape is an input's elements: the same binding, different shapes out
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    blob = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
                              helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    gpu, ref = cuda(blob), reference(blob)
    for i in range(8):
        f = {"x": r.standard_normal(6).astype(np.float32), "shape": np.array([2, 3] if i % 3 else [3, 2], np.int64)}
        compare(f"recording: Reshape by an input's elements, call {i}", gpu.run(f)[0], ref.run(f)[0])
    check("recording: Reshape by an input's elements is never replayed", gpu.stats()["graphs_replayed"] == 0,
          f"replayed {gpu.stats()['graphs_replayed']}")
    note = gpu.stats()["graphs_note"]
    check("recording: the statistics say why", "reads input 'shape' on the host" in note, f"graphs_note {note!r}")


class Cudart:
    """The few CUDA runtime calls the device I/O test needs, through ctypes."""
    def __init__(self):
        import ctypes
        self.C = ctypes
        last = None
        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError as e:
                last = e
        else:
            raise OSError(f"no libcudart: {last}")
        self.lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def upload(self, a):
        """A device copy of ndarray a, as (kiln.DeviceArray, pointer to free)."""
        a = np.ascontiguousarray(a)
        p = self.C.c_void_p()
        assert self.lib.cudaMalloc(self.C.byref(p), max(a.nbytes, 1)) == 0
        assert self.lib.cudaMemcpy(p, a.ctypes.data_as(self.C.c_void_p), a.nbytes, 1) == 0
        return kiln.DeviceArray(p.value, a.shape, a.dtype), p

    def download(self, d):
        out = np.empty(d.shape, d.dtype)
        if d.nbytes:
            assert self.lib.cudaMemcpy(out.ctypes.data_as(self.C.c_void_p), self.C.c_void_p(d.ptr), d.nbytes, 2) == 0
        return out

    def free(self, p):
        self.lib.cudaFree(p)


def test_device_io():
    rt = Cudart()
    blob = layout_model(True, np.float32)
    ref = reference(blob)
    for device_outputs in (False, True):
        gpu = cuda(blob, device_outputs=device_outputs)
        for i, shape in enumerate([(1, 40, 40, 3), (2, 37, 41, 3), (1, 40, 40, 3), (1, 40, 40, 3), (2, 37, 41, 3),
                                   (1, 40, 40, 3)]):
            img = rng.standard_normal(shape).astype(np.float32)
            d, p = rt.upload(img)
            try:
                got = gpu.run({"image": d})[0]
            finally:
                rt.free(p)
            label = f"device_io outputs_on_device={device_outputs} call {i} {shape}"
            if device_outputs:
                check(f"{label}: output in device memory", isinstance(got, kiln.DeviceArray))
                got = rt.download(got) if isinstance(got, kiln.DeviceArray) else got
            compare(label, got, ref.run({"image": img})[0])
        st = gpu.stats()
        check(f"device_io outputs_on_device={device_outputs}: replayed", st["graphs_replayed"] > 0,
              f"replayed {st['graphs_replayed']}, note {st['graphs_note']!r}")

    # an output listed twice; a device input whose elements the host reads (Reshape's shape)
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    blob = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
                              helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    gpu, ref = cuda(blob, device_outputs=True), reference(blob)
    x, shape = rng.standard_normal(12).astype(np.float32), np.array([3, 4], np.int64)
    dx, px = rt.upload(x)
    ds, ps = rt.upload(shape)
    try:
        got = gpu.run({"x": dx, "shape": ds}, output_names=["y", "y"])
    finally:
        rt.free(px)
        rt.free(ps)
    want = ref.run({"x": x, "shape": shape})[0]
    check("device_io: output listed twice gives two buffers", got[0].ptr != got[1].ptr or got[0].nbytes == 0)
    for k in range(2):
        compare(f"device_io: device shape input, output copy {k}", rt.download(got[k]), want)


def probe():
    """None when a CUDA session can be created, else the reason."""
    blob = make_model([helper.make_node("Relu", ["x"], ["y"])],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    try:
        kiln.Session(blob, provider=PROVIDER).close()
    except kiln.KilnError as e:
        return str(e)
    return None


def main():
    if len(sys.argv) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    why = probe()
    if why is not None:
        print(f"SKIP test_gpu_models: no CUDA session: {why}")
        return 0
    only = os.environ.get("KILN_GPU_MODEL_TESTS", "").split()
    for test in (test_layout, test_outputs, test_fallback, test_dynamic, test_steady_state, test_recording, test_device_io, test_lifetimes):
        if only and test.__name__[5:] not in only:
            continue
        print(f"-- {test.__name__}", flush=True)
        try:
            test()
        except Exception:  # a crash of one test is a failure; the others still run
            check(test.__name__, False, traceback.format_exc())
    return summary()


if __name__ == "__main__":
    sys.exit(main())
