#!/usr/bin/env python3
"""Cross-provider oracle: every kernel of the optimised CPU provider against the reference
kernels (an `unoptimized` session) on random shapes, odd and zero sizes and broadcasting
included, each model in one session per configuration with the shape changing every call.

usage: test_oracle.py   (libkiln.so from build/ or $KILN_LIB)
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

RTOL, ATOL = 1e-4, 1e-4
rng = np.random.default_rng(2024)

def model(node, inputs, outputs, opset=17):
    g = helper.make_graph([node], "oracle", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def sym(name, rank, prefix):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [f"{prefix}{i}" for i in range(rank)])


def compare(name, blob, feeds_list):
    fast, ref = kiln.Session(blob, num_threads=3), kiln.Session(blob, unoptimized=True)
    for feeds in feeds_list:
        shapes = " ".join(f"{k}={v.shape}" for k, v in feeds.items())
        try:
            want = ref.run(feeds)
        except kiln.KilnError as e:
            # the reference refuses it: the optimised path must refuse it too
            try:
                fast.run(feeds)
                check(f"{name} {shapes}", False, f"reference failed ({e}) but the fast path ran")
            except kiln.KilnError:
                check(f"{name} {shapes}", True)
            continue
        got = fast.run(feeds)
        for g, w in zip(got, want):
            ok = g.shape == w.shape and np.allclose(g, w, rtol=RTOL, atol=ATOL)
            check(f"{name} {shapes}", ok, f"shape {g.shape} vs {w.shape}, max diff "
                  f"{np.max(np.abs(g - w)) if g.shape == w.shape and g.size else 0}")


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_matmul():
    sizes = [0, 1, 2, 3, 7, 16, 17, 33, 64, 65]
    for ra, rb in [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (2, 3), (3, 3), (4, 3), (3, 4), (4, 4)]:
        blob = model(helper.make_node("MatMul", ["A", "B"], ["Y"]), [sym("A", ra, "a"), sym("B", rb, "b")],
                     [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
        feeds = []
        for _ in range(6):
            m, k, n = (int(rng.choice(sizes)) for _ in range(3))
            batch = [int(rng.choice([1, 2, 3])) for _ in range(2)]
            a_shape = ([m, k] if ra >= 2 else [k])
            b_shape = ([k, n] if rb >= 2 else [k])
            if ra > 2:
                a_shape = batch[-(ra - 2):] + a_shape
            if rb > 2:
                bb = batch[-(rb - 2):]
                bb = [1 if rng.random() < 0.3 else d for d in bb]  # broadcast some batch dims
                b_shape = bb + b_shape
            feeds.append({"A": rand(*a_shape), "B": rand(*b_shape)})
        # inner dims that do not match: both paths must refuse
        feeds.append({"A": rand(*([3] * (ra - 1) + [5])), "B": rand(*([3] * (rb - 2) + [4, 2])) if rb >= 2 else rand(4)})
        compare(f"MatMul {ra}x{rb}", blob, feeds)


def test_gemm():
    for ta in (0, 1):
        for tb in (0, 1):
            for c_rank in (None, 0, 1, 2):
                inputs = [sym("A", 2, "a"), sym("B", 2, "b")]
                names = ["A", "B"]
                if c_rank is not None:
                    inputs.append(sym("C", c_rank, "c"))
                    names.append("C")
                alpha, beta = float(rng.choice([1.0, 0.5, -2.0])), float(rng.choice([1.0, 0.0, 0.25]))
                node = helper.make_node("Gemm", names, ["Y"], transA=ta, transB=tb, alpha=alpha, beta=beta)
                blob = model(node, inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
                feeds = []
                for m, k, n in [(1, 1, 1), (3, 5, 7), (17, 33, 65), (64, 64, 64), (0, 4, 3), (5, 0, 2), (2, 3, 0)]:
                    f = {"A": rand(*((k, m) if ta else (m, k))), "B": rand(*((n, k) if tb else (k, n)))}
                    if c_rank is not None:
                        f["C"] = rand(*[(m, n), (n,), ()][2 - c_rank]) if c_rank else rand()
                        if c_rank == 2 and m > 1 and rng.random() < 0.5:
                            f["C"] = rand(1, n)  # broadcast rows
                    feeds.append(f)
                compare(f"Gemm transA={ta} transB={tb} C rank {c_rank}", blob, feeds)


def test_packed_weights():
    """Constant weights are packed once at session creation: MatMul and Gemm (both transB)."""
    from onnx import numpy_helper
    for k, n in [(1, 1), (7, 33), (64, 64), (129, 17)]:
        w = rand(k, n)
        for op, attrs, wmat in [("MatMul", {}, w), ("Gemm", {"transB": 0}, w), ("Gemm", {"transB": 1}, w.T.copy())]:
            node = helper.make_node(op, ["A", "W"], ["Y"], **attrs)
            g = helper.make_graph([node], "packed", [sym("A", 2 if op == "Gemm" else 3, "a")],
                                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(wmat, "W")])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            m.ir_version = 8
            feeds = [{"A": rand(*(([] if op == "Gemm" else [b]) + [rows, k]))}
                     for b, rows in [(1, 1), (2, 5), (3, 31), (1, 0)]]
            compare(f"{op} {attrs} packed {k}x{n}", m.SerializeToString(), feeds)


def test_conv():
    configs = [
        dict(kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), dil=(1, 1), group=1),
        dict(kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), dil=(1, 1), group=1),
        dict(kernel=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), group=1),
        dict(kernel=(1, 1), strides=(2, 2), pads=(0, 0, 0, 0), dil=(1, 1), group=1),
        dict(kernel=(3, 2), strides=(1, 2), pads=(0, 1, 2, 0), dil=(2, 1), group=1),
        dict(kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), dil=(1, 1), group=4),   # grouped
        dict(kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), dil=(1, 1), group=8),   # depthwise
        dict(kernel=(5, 5), strides=(3, 3), pads=(2, 2, 2, 2), dil=(1, 1), group=1, auto_pad="SAME_UPPER"),
        dict(kernel=(4, 4), strides=(2, 2), pads=(0, 0, 0, 0), dil=(1, 1), group=2, auto_pad="SAME_LOWER"),
        dict(kernel=(3, 3), strides=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), group=1, auto_pad="VALID"),
    ]
    for cfg in configs:
        for bias in (False, True):
            c_in, m_out = 8, 8 if cfg["group"] == 8 else 12
            attrs = dict(kernel_shape=list(cfg["kernel"]), strides=list(cfg["strides"]), dilations=list(cfg["dil"]),
                         group=cfg["group"])
            if "auto_pad" in cfg:
                attrs["auto_pad"] = cfg["auto_pad"]
            else:
                attrs["pads"] = list(cfg["pads"])
            names = ["X", "W"] + (["B"] if bias else [])
            inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", c_in, "h", "w"]),
                      helper.make_tensor_value_info("W", TensorProto.FLOAT, [m_out, c_in // cfg["group"]] +
                                                    list(cfg["kernel"]))]
            if bias:
                inputs.append(helper.make_tensor_value_info("B", TensorProto.FLOAT, [m_out]))
            blob = model(helper.make_node("Conv", names, ["Y"], **attrs), inputs,
                         [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
            w = rand(m_out, c_in // cfg["group"], *cfg["kernel"])
            feeds = []
            for n, h, wd in [(1, 9, 9), (2, 17, 13), (1, 5, 31), (1, 1, 1), (3, 8, 8), (1, 33, 20)]:
                f = {"X": rand(n, c_in, h, wd), "W": w}
                if bias:
                    f["B"] = rand(m_out)
                feeds.append(f)
            compare(f"Conv {cfg} bias={bias}", blob, feeds)


def main():
    for test in (test_matmul, test_gemm, test_packed_weights, test_conv):
        test()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
