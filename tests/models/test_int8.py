#!/usr/bin/env python3
"""int8 operators against ONNX Runtime (CPU): MatMulInteger, QLinearMatMul, DynamicQuantizeLinear,
DequantizeLinear and com.microsoft MatMulIntegerToFloat / DynamicQuantizeMatMul, each one node, on
random data over odd shapes (M, K, N in 1, 3, 17, 63, 130, ...), batches, u8/s8 combinations,
per-tensor and per-column zero points, weights constant (packed at compile time) or fed. Integer
outputs must equal ORT's bit for bit; float outputs within float32 rounding of the epilogue. Each
model also runs in kiln's reference (unoptimized) session, which must agree the same way.

usage: test_int8.py   (libkiln.so from build/ or $KILN_LIB)
"""
import os
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

rng = np.random.default_rng(8)
SIZES = [1, 3, 17, 63, 130]
TP = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8, np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32}


def model(nodes, inputs, outputs, inits=(), ms=False, opset=17):
    g = helper.make_graph(nodes if isinstance(nodes, list) else [nodes], "int8", inputs, outputs, list(inits))
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8
    return m.SerializeToString()


def vi(name, dt, dims):
    return helper.make_tensor_value_info(name, TP[dt], dims)


def q8(dt, *shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, size=shape, dtype=np.int64).astype(dt)


def ort_session(blob):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def compare(name, blob, feeds_list, exact=True, rtol=1e-5):
    try:
        ref = ort_session(blob)
    except Exception as e:  # an ORT build without this combination: nothing to compare with
        print(f"skip {name}: ONNX Runtime refuses it ({str(e).splitlines()[0][:120]})")
        return
    fast, slow = kiln.Session(blob, num_threads=2), kiln.Session(blob, unoptimized=True)
    for feeds in feeds_list:
        shapes = " ".join(f"{k}={v.shape}" for k, v in feeds.items())
        want = ref.run(None, feeds)
        for label, sess in (("kiln", fast), ("kiln-reference", slow)):
            try:
                got = sess.run(feeds)
            except kiln.KilnError as e:
                check(f"{name} {label} {shapes}", False, f"failed: {e}")
                continue
            for i, (g, w) in enumerate(zip(got, want)):
                g = np.asarray(g)
                if g.shape != w.shape or g.dtype != w.dtype:
                    check(f"{name} {label} {shapes} out{i}", False, f"{g.shape} {g.dtype} vs {w.shape} {w.dtype}")
                    continue
                if exact or not np.issubdtype(w.dtype, np.floating):
                    ok = np.array_equal(g, w)
                    detail = "" if ok else f"{int(np.sum(g != w))} of {w.size} differ"
                else:
                    tol = rtol * (np.max(np.abs(w)) if w.size else 0) + 1e-30
                    ok = np.allclose(g, w, rtol=rtol, atol=tol)
                    detail = "" if ok else f"max diff {np.max(np.abs(g.astype(np.float64) - w)) if w.size else 0}"
                check(f"{name} {label} {shapes} out{i}", ok, detail)


def a_shapes(K):
    """A's shapes for one K: rank 2 and 3 (batch > 1), odd M."""
    out = []
    for m in SIZES:
        out.append([m, K])
    out.append([2, 17, K])
    out.append([3, 1, K])
    return out


def zp_of(dt, per_col, N):
    return q8(dt, N) if per_col else q8(dt)


def test_matmul_integer():
    combos = [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8), (np.int8, np.uint8)]
    for adt, bdt in combos:
        for K, N in [(1, 3), (17, 63), (63, 17), (130, 130), (64, 768)]:
            for per_col in (False, True):
                for const_b in (True, False):
                    B = q8(bdt, K, N)
                    bzp = zp_of(bdt, per_col, N)
                    inits = [numpy_helper.from_array(bzp, "bzp")]
                    inputs = [helper.make_tensor_value_info("A", TP[adt], None), vi("azp", adt, [])]
                    if const_b:
                        inits.append(numpy_helper.from_array(B, "B"))
                    else:
                        inputs.append(vi("B", bdt, [K, N]))
                    blob = model(helper.make_node("MatMulInteger", ["A", "B", "azp", "bzp"], ["Y"]), inputs,
                                 [vi("Y", np.int32, None)], inits)
                    feeds = []
                    for s in a_shapes(K):
                        f = {"A": q8(adt, *s), "azp": q8(adt)}
                        if not const_b:
                            f["B"] = B
                        feeds.append(f)
                    compare(f"MatMulInteger {adt.__name__}x{bdt.__name__} K={K} N={N} "
                            f"{'per-column' if per_col else 'per-tensor'} {'const' if const_b else 'fed'} B",
                            blob, feeds)
    # no zero points at all
    B = q8(np.int8, 33, 65)
    blob = model(helper.make_node("MatMulInteger", ["A", "B"], ["Y"]), [helper.make_tensor_value_info("A", TP[np.uint8], None)],
                 [vi("Y", np.int32, None)], [numpy_helper.from_array(B, "B")])
    compare("MatMulInteger no zero points", blob, [{"A": q8(np.uint8, m, 33)} for m in SIZES])


def test_dynamic_quantize_linear():
    blob = model(helper.make_node("DynamicQuantizeLinear", ["X"], ["Y", "S", "Z"]),
                 [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                 [vi("Y", np.uint8, None), vi("S", np.float32, []), vi("Z", np.uint8, [])])
    feeds = []
    for shape in [[1], [3], [17], [63, 5], [130, 17], [2, 3, 257], [1, 128, 384]]:
        x = (rng.standard_normal(shape) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32)
        feeds.append({"X": x})
        feeds.append({"X": np.abs(x) + np.float32(0.5)})  # all positive: zero point 0
        feeds.append({"X": -np.abs(x) - np.float32(0.5)})  # all negative: zero point 255
    compare("DynamicQuantizeLinear", blob, feeds)


def test_dequantize_linear():
    for dt in (np.uint8, np.int8):
        blob = model(helper.make_node("DequantizeLinear", ["X", "s", "z"], ["Y"]),
                     [helper.make_tensor_value_info("X", TP[dt], None)], [vi("Y", np.float32, None)],
                     [numpy_helper.from_array(np.array(0.037, np.float32), "s"), numpy_helper.from_array(q8(dt), "z")])
        compare(f"DequantizeLinear {dt.__name__}", blob, [{"X": q8(dt, *s)} for s in ([1], [17, 3], [2, 130, 63])])


def test_qlinear_matmul():
    for adt, bdt in [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)]:
        for K, N in [(3, 17), (63, 130), (130, 63), (256, 64)]:
            for per_col in (False, True):
                ydt = adt
                B = q8(bdt, K, N)
                bs = (rng.uniform(0.001, 0.02, N) if per_col else rng.uniform(0.001, 0.02, [])).astype(np.float32)
                inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(bs, "bs"),
                         numpy_helper.from_array(zp_of(bdt, per_col, N), "bzp"),
                         numpy_helper.from_array(np.array(0.021, np.float32), "as"),
                         numpy_helper.from_array(q8(adt), "azp"),
                         numpy_helper.from_array(np.array(rng.uniform(0.05, 0.3) * np.sqrt(K), np.float32), "ys"),
                         numpy_helper.from_array(q8(ydt), "yzp")]
                blob = model(helper.make_node("QLinearMatMul", ["A", "as", "azp", "B", "bs", "bzp", "ys", "yzp"], ["Y"]),
                             [helper.make_tensor_value_info("A", TP[adt], None)], [vi("Y", ydt, None)], inits)
                compare(f"QLinearMatMul {adt.__name__}x{bdt.__name__} K={K} N={N} {'per-column' if per_col else 'per-tensor'}",
                        blob, [{"A": q8(adt, *s)} for s in a_shapes(K)])


def test_matmul_integer_to_float():
    for adt, bdt in [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)]:
        for K, N in [(1, 17), (17, 3), (63, 130), (384, 64)]:
            for per_col in (False, True):
                for bias in (False, True):
                    bs = (rng.uniform(0.001, 0.02, N) if per_col else rng.uniform(0.001, 0.02, [])).astype(np.float32)
                    inits = [numpy_helper.from_array(q8(bdt, K, N), "B"), numpy_helper.from_array(bs, "bs"),
                             numpy_helper.from_array(zp_of(bdt, per_col, N), "bzp")]
                    ins = ["A", "B", "as", "bs", "azp", "bzp"]
                    if bias:
                        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias"))
                        ins.append("bias")
                    blob = model(helper.make_node("MatMulIntegerToFloat", ins, ["Y"], domain="com.microsoft"),
                                 [helper.make_tensor_value_info("A", TP[adt], None), vi("as", np.float32, []),
                                  vi("azp", adt, [])], [vi("Y", np.float32, None)], inits, ms=True)
                    feeds = [{"A": q8(adt, *s), "as": np.array(rng.uniform(0.01, 0.1), np.float32), "azp": q8(adt)}
                             for s in a_shapes(K)]
                    compare(f"MatMulIntegerToFloat {adt.__name__}x{bdt.__name__} K={K} N={N} "
                            f"{'per-column' if per_col else 'per-tensor'}{' bias' if bias else ''}", blob, feeds,
                            exact=False)


def test_dynamic_quantize_matmul():
    for bdt in (np.int8, np.uint8):
        for K, N in [(1, 3), (17, 63), (130, 17), (384, 384)]:
            for per_col in (False, True):
                for bias in (False, True):
                    bs = (rng.uniform(0.001, 0.02, N) if per_col else rng.uniform(0.001, 0.02, [])).astype(np.float32)
                    inits = [numpy_helper.from_array(q8(bdt, K, N), "B"), numpy_helper.from_array(bs, "bs"),
                             numpy_helper.from_array(zp_of(bdt, per_col, N), "bzp")]
                    ins = ["A", "B", "bs", "bzp"]
                    if bias:
                        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias"))
                        ins.append("bias")
                    blob = model(helper.make_node("DynamicQuantizeMatMul", ins, ["Y"], domain="com.microsoft"),
                                 [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)],
                                 [vi("Y", np.float32, None)], inits, ms=True)
                    feeds = [{"A": rng.standard_normal(s).astype(np.float32)} for s in a_shapes(K)]
                    compare(f"DynamicQuantizeMatMul {bdt.__name__} K={K} N={N} "
                            f"{'per-column' if per_col else 'per-tensor'}{' bias' if bias else ''}", blob, feeds,
                            exact=False)


if __name__ == "__main__":
    test_matmul_integer()
    test_dynamic_quantize_linear()
    test_dequantize_linear()
    test_qlinear_matmul()
    test_matmul_integer_to_float()
    test_dynamic_quantize_matmul()
    sys.exit(summary())
