#!/usr/bin/env python3
"""com.microsoft quantized operators (what quantize_static in QOperator format emits) against
ONNX Runtime, bit for bit: QLinearAdd, QLinearMul (broadcast, scalar operands, ties that the
order of ORT's float steps decides), QLinearSigmoid, QLinearLeakyRelu, QLinearConcat (requantized
and copied inputs), QLinearGlobalAveragePool (NCHW and channels_last); one-node models on random
data at several shapes (odd sizes, batch > 1), uint8 and int8, optional zero points present and
absent, in an optimised and a reference kiln session.

usage: test_contrib_q.py   (libkiln.so from build/ or $KILN_LIB)
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

MS = "com.microsoft"
rng = np.random.default_rng(11)
ort.set_default_logger_severity(3)
QT = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


def qrand(dt, *shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, shape).astype(dt)


def model(node, inputs, inits):
    g = helper.make_graph([node], "q", inputs, [onnx.ValueInfoProto(name=node.output[0])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def io(name, dt, rank):
    return helper.make_tensor_value_info(name, dt, [f"{name}{i}" for i in range(rank)])


def compare_exact(name, m, feeds_list):
    blob = m.SerializeToString()
    ref = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    sessions = [("fast", kiln.Session(blob, num_threads=2)), ("ref", kiln.Session(blob, unoptimized=True))]
    for feeds in feeds_list:
        want = ref.run(None, feeds)[0]
        shapes = " ".join(f"{k}={v.shape}" for k, v in feeds.items())
        for tag, s in sessions:
            try:
                got = np.asarray(s.run(feeds)[0])
            except kiln.KilnError as e:
                check(f"{name} [{tag}] {shapes}", False, f"kiln failed: {e}")
                continue
            ok = got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
            detail = (f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}" if got.shape != want.shape or got.dtype != want.dtype
                      else f"{np.count_nonzero(got != want)} of {got.size} differ, max {np.max(np.abs(got.astype(int) - want.astype(int)))}")
            check(f"{name} [{tag}] {shapes}", ok, detail)


def scale_zp(dt, tag, with_zp=True):
    inits = [numpy_helper.from_array(np.array(rng.uniform(0.005, 0.1), np.float32), f"{tag}_s")]
    if with_zp:
        info = np.iinfo(dt)
        inits.append(numpy_helper.from_array(np.array(rng.integers(info.min // 2, info.max // 2 + 1), dt), f"{tag}_z"))
    return inits, [f"{tag}_s", f"{tag}_z" if with_zp else ""]


def test_binary():
    shapes = [((2, 3, 5), (2, 3, 5)), ((4, 17), (17,)), ((3, 1, 7), (1, 6, 1)), ((1,), (5, 33)), ((2, 9, 64), ()),
              ((3, 4, 16, 37), (3, 1, 1, 37)), ((2, 1, 33), (2, 5, 1)), ((3, 4, 5), (4, 1))]  # any broadcast, row by row
    for op in ("QLinearAdd", "QLinearMul"):
        for dt in (np.uint8, np.int8):
            for with_zp in (True,):  # ORT's type inference refuses absent A/B zero points
                for sa, sb in shapes:
                    inits, names = [], []
                    for tag, x in (("a", "A"), ("b", "B"), ("c", None)):
                        i, n = scale_zp(dt, tag, with_zp or tag == "c")  # ORT types C by its zero point
                        inits += i
                        names += ([x] if x else []) + n
                    while names[-1] == "":
                        names.pop()
                    node = helper.make_node(op, names, ["C"], domain=MS)
                    m = model(node, [io("A", QT[dt], len(sa)), io("B", QT[dt], len(sb))], inits)
                    feeds = [{"A": qrand(dt, *sa), "B": qrand(dt, *sb)} for _ in range(2)]
                    compare_exact(f"{op} {dt.__name__} zp={with_zp} {sa}x{sb}", m, feeds)


def test_binary_ties():
    """QLinearAdd and QLinearMul where the order of ORT's float steps decides the integer: scales
    whose ratios are inexact in float32 (0.07 / 0.05 and 0.021 / 0.05) put many exact results on
    x.5, where Add's two fused multiply-adds (ORT's AVX2 kernel, operands exchanged for a scalar A
    in a span) and Mul's unfused product and sum round apart from other orders. Every broadcast
    form at odd sizes, (2, 64, 33) + (33,) among them, random codes (never zero) and every pair of
    nonzero codes."""
    shapes = [((2, 64, 33), (33,)), ((2, 64, 33), (2, 64, 33)), ((7,), ()), ((), (65,)), ((1,), (129,)), ((1,), (1,)),
              ((), ()), ((5, 1), (5, 1)), ((129, 1), (1, 65)), ((3, 1, 65), (1, 129, 1)), ((2, 7, 129), (7, 129)),
              ((33, 1), (33, 7)), ((4, 1, 7), (3, 1)), ((3, 70001), ()), ((255, 1), (255,)), ((255, 255), (255, 1))]
    for op in ("QLinearAdd", "QLinearMul"):
        for dt in (np.uint8, np.int8):
            info = np.iinfo(dt)
            codes = np.arange(info.min, info.max + 1)
            codes = codes[codes != 0].astype(dt)
            ties = ((0.07, 0.021, 0.05), (0.021, 0.07, 0.05), (0.05, 0.03, 0.07))
            for scales in ties + (tuple(rng.uniform(0.005, 0.1, 3)),):
                inits, names = [], []
                for tag, x, sc in (("a", "A", scales[0]), ("b", "B", scales[1]), ("c", None, scales[2])):
                    inits.append(numpy_helper.from_array(np.array(sc, np.float32), f"{tag}_s"))
                    inits.append(numpy_helper.from_array(np.array(rng.integers(info.min // 2, info.max // 2 + 1), dt),
                                                         f"{tag}_z"))
                    names += ([x] if x else []) + [f"{tag}_s", f"{tag}_z"]
                node = helper.make_node(op, names, ["C"], domain=MS)
                for sa, sb in shapes:
                    m = model(node, [io("A", QT[dt], len(sa)), io("B", QT[dt], len(sb))], inits)
                    if sa == (255, 1) or sa == (255, 255):  # every pair: A's codes down, B's across (or down)
                        feeds = [{"A": np.broadcast_to(codes[:, None], sa).copy(),
                                  "B": np.broadcast_to(codes[:, None] if sb == (255, 1) else codes, sb).copy()}]
                    else:
                        feeds = []
                        for _ in range(2):
                            a, b = qrand(dt, *sa), qrand(dt, *sb)
                            a[a == 0], b[b == 0] = 1, 1
                            feeds.append({"A": a, "B": b})
                    label = f"{op} {dt.__name__} ties scales {tuple(round(float(v), 5) for v in scales)} {sa}x{sb}"
                    compare_exact(label, m, feeds)


def test_lookup():
    for op, attrs in (("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1}), ("QLinearLeakyRelu", {"alpha": 0.37})):
        for dt in (np.uint8, np.int8):
            for with_zp in (True, False):
                for trial in range(3):
                    ix, nx = scale_zp(dt, "x", with_zp)
                    iy, ny = scale_zp(dt, "y")  # ORT types Y by its zero point
                    if op == "QLinearSigmoid":  # outputs in [0, 1]
                        iy[0] = numpy_helper.from_array(np.array(rng.uniform(1 / 300, 1 / 100), np.float32), "y_s")
                    names = ["X"] + nx + ny
                    while names[-1] == "":
                        names.pop()
                    m = model(helper.make_node(op, names, ["Y"], domain=MS, **attrs), [io("X", QT[dt], 3)], ix + iy)
                    feeds = [{"X": qrand(dt, *s)} for s in [(1, 1, 1), (2, 3, 37), (3, 16, 255)]]
                    compare_exact(f"{op}{attrs} {dt.__name__} zp={with_zp} #{trial}", m, feeds)


def test_concat():
    for dt in (np.uint8, np.int8):
        for axis in (0, 1, -1):
            for n_in in (1, 2, 3):
                iy, ny = scale_zp(dt, "y")
                inits, names, ins = iy, ny, []
                for i in range(n_in):
                    if i == 1:  # the same parameters as Y: copied
                        inits += [numpy_helper.from_array(numpy_helper.to_array(iy[0]), "x1_s"),
                                  numpy_helper.from_array(numpy_helper.to_array(iy[1]), "x1_z")]
                        n = ["x1_s", "x1_z"]
                    else:
                        ix, n = scale_zp(dt, f"x{i}")
                        inits += ix
                    names += [f"X{i}"] + n
                    ins.append(io(f"X{i}", QT[dt], 3))
                m = model(helper.make_node("QLinearConcat", names, ["Y"], domain=MS, axis=axis), ins, inits)
                feeds = []
                for shape in [(1, 1, 1), (2, 3, 5), (3, 7, 16)]:
                    f = {}
                    for i in range(n_in):
                        s = list(shape)
                        s[axis] += i
                        f[f"X{i}"] = qrand(dt, *s)
                    feeds.append(f)
                compare_exact(f"QLinearConcat {dt.__name__} axis={axis} inputs={n_in}", m, feeds)


def test_global_average_pool():
    for dt in (np.uint8, np.int8):
        for last in (0, 1):
            for trial in range(2):
                ix, nx = scale_zp(dt, "x")
                iy, ny = scale_zp(dt, "y")
                m = model(helper.make_node("QLinearGlobalAveragePool", ["X"] + nx + ny, ["Y"], domain=MS, channels_last=last),
                          [io("X", QT[dt], 4)], ix + iy)
                feeds = [{"X": qrand(dt, *s)} for s in [(1, 3, 1, 1), (2, 5, 7, 9), (3, 16, 14, 14), (1, 64, 3, 3)]]
                compare_exact(f"QLinearGlobalAveragePool {dt.__name__} channels_last={last} #{trial}", m, feeds)


if __name__ == "__main__":
    for t in (test_binary, test_binary_ties, test_lookup, test_concat, test_global_average_pool):
        t()
    sys.exit(summary())
