#!/usr/bin/env python3
"""GPU family 'cnn' against the CPU reference: Conv (and its fused forms: residual Add, Relu),
ConvTranspose, pooling, Resize / Upsample,
DepthToSpace / SpaceToDepth on random data, odd and size-1 dims, batch 1 and 3, every attribute
variant the kernels cover, float32 / float16 / bfloat16 (bf16 through Cast nodes).

usage: KILN_LIB=<build>/libkiln.so test_gpu_cnn.py [substring filter]
Prints SKIP and exits 0 when no CUDA session can be created.
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

rng = np.random.default_rng(4242)
FILTER = sys.argv[1] if len(sys.argv) > 1 else ""

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
NP = {F32: np.float32, F16: np.float16, TensorProto.UINT8: np.uint8, TensorProto.INT64: np.int64,
      TensorProto.INT32: np.int32}
TOL = {F32: (1e-4, 1e-4), F16: (1e-2, 1e-2), BF16: (2e-2, 2e-2)}


def model(nodes, inputs, outputs, opset, inits=()):
    g = helper.make_graph(nodes, "cnn", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def vi(name, dt, rank_or_shape):
    shape = [f"{name}{i}" for i in range(rank_or_shape)] if isinstance(rank_or_shape, int) else rank_or_shape
    return helper.make_tensor_value_info(name, dt, shape)


def rand(shape, dt=F32):
    if dt in (TensorProto.UINT8,):
        return rng.integers(0, 255, size=shape).astype(np.uint8)
    if dt in (TensorProto.INT64, TensorProto.INT32):
        return rng.integers(-1000, 1000, size=shape).astype(NP[dt])
    return rng.standard_normal(shape).astype(NP.get(dt, np.float32))


def first_bad(g, w, rtol, atol):
    with np.errstate(invalid="ignore"):
        bad = ~np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    idx = np.argwhere(bad)
    return tuple(int(i) for i in idx[0]) if len(idx) else None


def compare(name, blob, feeds_list, dt=F32, exact=False):
    """Runs blob on the GPU and on the reference for each feed dict; compares every output."""
    if FILTER and FILTER not in name:
        return
    rtol, atol = TOL.get(dt, (0, 0))
    try:
        gpu = kiln.Session(blob, provider="cuda")
        ref = kiln.Session(blob, unoptimized=True)
    except kiln.KilnError as e:
        check(name, False, f"session creation failed: {e}")
        return
    for feeds in feeds_list:
        shapes = " ".join(f"{k}={list(v.shape)}" for k, v in feeds.items())
        case = f"{name} [{shapes}]"
        try:
            want = ref.run(feeds)
        except kiln.KilnError as e:
            try:
                gpu.run(feeds)
                check(case, False, f"reference failed ({e}) but the GPU ran")
            except kiln.KilnError:
                check(case, True)
            continue
        try:
            got = gpu.run(feeds)
        except kiln.KilnError as e:
            check(case, False, f"GPU run failed: {e}")
            continue
        ok = True
        for k, (g, w) in enumerate(zip(got, want)):
            if g.shape != w.shape or g.dtype != w.dtype:
                check(case, False, f"output {k}: shape/dtype {g.shape} {g.dtype} vs reference {w.shape} {w.dtype}")
                ok = False
                continue
            if g.size == 0:
                continue
            gf, wf = g.astype(np.float64), w.astype(np.float64)
            scale = max(1.0, float(np.nanmax(np.abs(wf))) if np.isfinite(wf).any() else 1.0)
            if exact or not np.issubdtype(w.dtype, np.floating):
                bad = first_bad(gf, wf, 0, 0)
            else:
                bad = first_bad(gf, wf, rtol, atol * scale)
            if bad is not None:
                with np.errstate(invalid="ignore"):
                    diff = np.nanmax(np.abs(gf - wf))
                check(case, False, f"output {k} {list(w.shape)}: max abs diff {diff:.3g}, first bad index {bad}: "
                                   f"gpu {gf[bad]!r} vs ref {wf[bad]!r}")
                ok = False
        runs = gpu.stats()["node_runs_gpu"]
        if runs <= 0:
            check(case, False, "no node ran on the GPU")
            ok = False
        if ok:
            check(case, True)


def cast_wrap(op_nodes, float_inputs, dt, opset, inits=(), other_inputs=(), n_out=1, out_dtypes=None):
    """Wraps nodes over float inputs for dtype dt: bf16 gets Cast nodes around (inputs and
    outputs stay float32); f32 / f16 take the inputs directly. Nodes read '<name>_c' names
    and write 'Y<k>_c'."""
    nodes, ins, outs = [], [], []
    for name, rank in float_inputs:
        if dt == BF16:
            ins.append(vi(name, F32, rank))
            nodes.append(helper.make_node("Cast", [name], [name + "_c"], to=BF16))
        else:
            ins.append(vi(name, dt, rank))
            nodes.append(helper.make_node("Identity", [name], [name + "_c"]))
    nodes += op_nodes
    for k in range(n_out):
        odt = (out_dtypes or {}).get(k, dt)
        if dt == BF16 and odt == BF16:
            nodes.append(helper.make_node("Cast", [f"Y{k}_c"], [f"Y{k}"], to=F32))
            outs.append(helper.make_tensor_value_info(f"Y{k}", F32, None))
        else:
            nodes.append(helper.make_node("Identity", [f"Y{k}_c"], [f"Y{k}"]))
            outs.append(helper.make_tensor_value_info(f"Y{k}", odt, None))
    return model(nodes, ins + list(other_inputs), outs, opset, inits)


def feed_np(arr, dt):
    return arr.astype(np.float32) if dt == BF16 else arr.astype(NP[dt])


def out_size(i, k, s, d, pb, pe, ceil=False):
    room = i + pb + pe - d * (k - 1) - 1
    if room < 0:
        return 0
    return (-(-room // s) if ceil else room // s) + 1


# ---------------------------------------------------------------- Conv

def conv_case(name, dt, xshape, wshape, bias, attrs, opset=17, batch_shapes=None):
    nsp = len(xshape) - 2
    node = helper.make_node("Conv", ["X_c", "W_c"] + (["B_c"] if bias else []), ["Y0_c"], **attrs)
    fl = [("X", len(xshape)), ("W", len(wshape))] + ([("B", 1)] if bias else [])
    blob = cast_wrap([node], fl, dt, opset)
    feeds = []
    for xs in batch_shapes or [xshape]:
        f = {"X": feed_np(rand(xs), dt), "W": feed_np(rand(wshape), dt)}
        if bias:
            f["B"] = feed_np(rand([wshape[0]]), dt)
        feeds.append(f)
    compare(f"Conv{nsp}d {name} {TensorProto.DataType.Name(dt)}", blob, feeds, dt)


def test_conv():
    for dt in (F32, F16, BF16):
        # 2-D: spatial sizes, kernels, strides, pads, dilations, groups, bias
        for (h, w) in [(1, 1), (2, 5), (5, 7), (7, 7), (13, 2), (40, 40), (13, 40)]:
            for (k, s, d, p) in [((1, 1), (1, 1), (1, 1), (0, 0, 0, 0)), ((1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),
                                 ((3, 3), (1, 1), (1, 1), (1, 1, 1, 1)), ((3, 3), (2, 2), (1, 1), (0, 1, 1, 0)),
                                 ((2, 3), (2, 1), (2, 1), (1, 0, 0, 2)), ((5, 5), (1, 2), (1, 2), (2, 2, 2, 2))]:
                ok = all(out_size(i, kk, ss, dd, p[j], p[2 + j]) >= 1 for j, (i, kk, ss, dd) in
                         enumerate(zip((h, w), k, s, d)))
                if not ok:
                    continue
                for (C, M, group) in [(3, 4, 1), (4, 6, 2), (4, 4, 4), (4, 8, 4), (1, 5, 1)]:
                    for n in (1, 3):
                        bias = (n + C) % 2 == 0
                        conv_case(f"h{h}w{w} k{k} s{s} d{d} p{p} C{C} M{M} g{group} N{n} bias{bias}", dt,
                                  [n, C, h, w], [M, C // group, *k], bias,
                                  dict(kernel_shape=list(k), strides=list(s), dilations=list(d), pads=list(p),
                                       group=group))
                    if dt != F32:
                        break
                if dt != F32:
                    break
        # auto_pad variants
        for ap in ("SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"):
            for (h, w, k, s) in [(7, 5, (3, 3), (2, 2)), (13, 13, (2, 4), (3, 1)), (5, 40, (1, 3), (1, 2))]:
                attrs = dict(auto_pad=ap, strides=list(s))
                if ap == "NOTSET":
                    attrs["pads"] = [1, 0, 0, 1]
                conv_case(f"auto_pad {ap} h{h}w{w} k{k} s{s}", dt, [2, 4, h, w], [6, 2, *k], True,
                          dict(group=2, **attrs))
        # no kernel_shape attribute, several shapes in one session (symbolic dims)
        conv_case("dynamic shapes", dt, [1, 3, 7, 7], [8, 3, 3, 3], True, dict(pads=[1, 1, 1, 1]),
                  batch_shapes=[[1, 3, 7, 7], [3, 3, 13, 5], [2, 3, 40, 40], [1, 3, 3, 3]])
        # 1-D and 3-D
        for (L, k, s, d, p, g) in [(1, 1, 1, 1, (0, 0), 1), (13, 3, 2, 1, (1, 1), 1), (40, 5, 1, 2, (2, 3), 2),
                                   (7, 3, 1, 1, (1, 1), 4)]:
            conv_case(f"L{L} k{k} s{s} d{d} p{p} g{g}", dt, [3, 4, L], [8, 4 // g, k], g != 2,
                      dict(kernel_shape=[k], strides=[s], dilations=[d], pads=list(p), group=g))
        for (D, k, s, p, g) in [((2, 5, 7), (1, 1, 1), (1, 1, 1), (0,) * 6, 1),
                                ((5, 7, 13), (3, 3, 3), (1, 2, 1), (1, 1, 1, 1, 1, 1), 1),
                                ((7, 5, 5), (2, 3, 1), (2, 1, 1), (0, 1, 0, 1, 1, 0), 2),
                                ((5, 5, 5), (3, 3, 3), (1, 1, 1), (1,) * 6, 4)]:
            conv_case(f"D{D} k{k} s{s} p{p} g{g}", dt, [1, 4, *D], [4, 4 // g, *k], True,
                      dict(kernel_shape=list(k), strides=list(s), pads=list(p), group=g))
    # 2-D depthwise (the tiled kernel: square 3/5/7 kernels at stride 1 and 2; one tile or many,
    # planes batched in a block or one a block; channel multipliers; other windows: the direct
    # kernel). Launches of 64K threads or more take the tiled kernel ahead of cuDNN (the large
    # cases), smaller ones where cuDNN declines (asymmetric pads) or is not there
    for dt in (F32, F16):
        for (n, C, h, w, k, s, p) in [(2, 128, 64, 64, 3, 1, 1), (4, 96, 56, 56, 7, 1, 3), (16, 64, 64, 64, 5, 2, 2),
                                      (64, 256, 7, 7, 7, 1, 3)]:
            conv_case(f"depthwise large N{n} C{C} h{h}w{w} k{k} s{s}", dt, [n, C, h, w], [C, 1, k, k], True,
                      dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, group=C))
    for dt in (F32, F16, BF16):
        for (h, w, C, M, k, s, p) in [(1, 1, 3, 3, 3, 1, (1, 1, 1, 1)), (7, 7, 40, 40, 7, 1, (3, 3, 3, 3)),
                                      (57, 61, 5, 5, 7, 1, (3, 3, 3, 3)), (56, 56, 3, 6, 3, 2, (0, 1, 1, 0)),
                                      (13, 70, 4, 4, 5, 2, (2, 2, 2, 2)), (33, 9, 6, 6, 5, 1, (0, 0, 0, 0)),
                                      (140, 3, 2, 2, 3, 1, (1, 0, 2, 1)), (9, 9, 300, 300, 3, 2, (1, 1, 1, 1)),
                                      (12, 12, 4, 4, 4, 1, (1, 2, 1, 2))]:
            for n in (1, 3):
                conv_case(f"depthwise h{h}w{w} C{C} M{M} k{k} s{s} p{p} N{n}", dt, [n, C, h, w], [M, 1, k, k], n == 1,
                          dict(kernel_shape=[k, k], strides=[s, s], pads=list(p), group=C))
    # a wider 2-D conv (GEMM path with K in the hundreds)
    conv_case("wide", F32, [2, 32, 13, 13], [48, 32, 3, 3], True, dict(pads=[1, 1, 1, 1]))
    conv_case("wide 1x1", F32, [3, 64, 7, 5], [40, 64, 1, 1], False, {})
    # zero-size batch
    conv_case("empty batch", F32, [0, 3, 5, 5], [4, 3, 3, 3], True, {}, batch_shapes=[[0, 3, 5, 5], [1, 3, 5, 5]])


def fused_case(name, dt, xshape, wshape, bias, attrs, residual, relu, batch_shapes=None):
    """Conv (+ Add of a second input R) (+ Relu): the GPU passes make it kiln.FusedConv, which
    cuDNN runs with Z and ReLU in its epilogue (with a bias)."""
    nsp = len(xshape) - 2
    nodes = [helper.make_node("Conv", ["X_c", "W_c"] + (["B_c"] if bias else []), ["C"], **attrs)]
    last = "C"
    if residual:
        nodes.append(helper.make_node("Add", ["R_c", last] if residual == "left" else [last, "R_c"], ["S"]))
        last = "S"
    nodes.append(helper.make_node("Relu" if relu else "Identity", [last], ["Y0_c"]))
    # named dims: R and the Conv's output have provably equal shapes ('same' convolutions), so
    # the residual Add fuses whatever the batch and size
    fl = [("X", ["N", xshape[1], "H", "W"]), ("W", len(wshape))] + ([("B", 1)] if bias else []) + \
        ([("R", ["N", wshape[0], "H", "W"])] if residual else [])
    blob = cast_wrap(nodes, fl, dt, 17)
    feeds = []
    for xs in batch_shapes or [xshape]:
        f = {"X": feed_np(rand(xs), dt), "W": feed_np(rand(wshape), dt)}
        if bias:
            f["B"] = feed_np(rand([wshape[0]]), dt)
        if residual:
            ys = [xs[0], wshape[0]] + [out_size(i, k, s_, 1, p_, p_) for i, k, s_, p_ in
                                       zip(xs[2:], wshape[2:], attrs.get("strides", [1] * nsp), attrs.get("pads", [0] * nsp))]
            f["R"] = feed_np(rand(ys), dt)
        feeds.append(f)
    compare(f"fused Conv{nsp}d {name} residual={residual} relu={relu} {TensorProto.DataType.Name(dt)}", blob, feeds, dt)


def test_conv_fused():
    for dt in (F32, F16, BF16):
        for residual in (None, "left", "right"):
            for relu in (False, True):
                for bias in (True, False):
                    fused_case(f"3x3 bias{bias}", dt, [2, 8, 9, 7], [12, 8, 3, 3], bias, dict(pads=[1, 1, 1, 1]),
                               residual, relu)
        # ResNet-like layers: 1x1 down, 3x3 stride 2, groups, several batch sizes in one session
        fused_case("1x1 64->256", dt, [1, 64, 14, 14], [256, 64, 1, 1], True, {}, "right", True,
                   batch_shapes=[[1, 64, 14, 14], [4, 64, 14, 14], [3, 64, 9, 13]])
        fused_case("3x3 s2", dt, [2, 32, 15, 15], [32, 32, 3, 3], True, dict(pads=[1, 1, 1, 1], strides=[2, 2]),
                   None, True, batch_shapes=[[2, 32, 15, 15], [1, 32, 28, 28]])
        fused_case("grouped", dt, [2, 16, 11, 11], [16, 4, 3, 3], True, dict(pads=[1, 1, 1, 1], group=4), "left", True)
        fused_case("depthwise", dt, [2, 16, 11, 11], [16, 1, 3, 3], True, dict(pads=[1, 1, 1, 1], group=16), None, True)
        fused_case("depthwise 7x7 + residual", dt, [3, 24, 29, 30], [24, 1, 7, 7], True,
                   dict(pads=[3, 3, 3, 3], group=24), "left", True)
        fused_case("depthwise 5x5 + residual, no relu", dt, [2, 8, 19, 20], [8, 1, 5, 5], False,
                   dict(pads=[2, 2, 2, 2], group=8), "right", False)
        # a launch above the 64K-thread cut: the tiled kernel's own bias + residual + ReLU epilogue
        fused_case("depthwise 7x7 + residual, large", dt, [4, 96, 56, 56], [96, 1, 7, 7], True,
                   dict(pads=[3, 3, 3, 3], group=96), "left", True)


def test_cudnn_loaded():
    """Where scripts/test_gpu.sh found cuDNN (KILN_EXPECT_CUDNN=1), the convolutions above ran on
    it: the library is mapped into this process."""
    with open("/proc/self/maps") as f:
        mapped = "libcudnn" in f.read()
    if os.environ.get("KILN_EXPECT_CUDNN") == "1":
        check("cuDNN loaded for the convolutions", mapped)
    else:
        print(f"note: cuDNN {'loaded' if mapped else 'not loaded'} (KILN_EXPECT_CUDNN unset)")


# ---------------------------------------------------------------- ConvTranspose

def convt_case(name, dt, xshape, wshape, bias, attrs, opset=17):
    nsp = len(xshape) - 2
    node = helper.make_node("ConvTranspose", ["X_c", "W_c"] + (["B_c"] if bias else []), ["Y0_c"], **attrs)
    fl = [("X", len(xshape)), ("W", len(wshape))] + ([("B", 1)] if bias else [])
    blob = cast_wrap([node], fl, dt, opset)
    group = attrs.get("group", 1)
    f = {"X": feed_np(rand(xshape), dt), "W": feed_np(rand(wshape), dt)}
    if bias:
        f["B"] = feed_np(rand([wshape[1] * group]), dt)
    compare(f"ConvTranspose{nsp}d {name} {TensorProto.DataType.Name(dt)}", blob, [f], dt)


def test_conv_transpose():
    for dt in (F32, F16, BF16):
        for (h, w) in [(1, 1), (2, 5), (7, 7), (13, 40)]:
            for (k, s, d, p, op) in [((1, 1), (1, 1), (1, 1), (0, 0, 0, 0), (0, 0)),
                                     ((3, 3), (1, 1), (1, 1), (1, 1, 1, 1), (0, 0)),
                                     ((3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (1, 1)),
                                     ((4, 4), (2, 2), (1, 1), (1, 1, 1, 1), (0, 0)),
                                     ((2, 3), (3, 2), (2, 1), (0, 1, 1, 0), (2, 1))]:
                for (C, M, g) in [(3, 4, 1), (4, 6, 2), (4, 4, 4)]:
                    for n in (1, 3):
                        convt_case(f"h{h}w{w} k{k} s{s} d{d} p{p} op{op} C{C} M{M} g{g} N{n}", dt, [n, C, h, w],
                                   [C, M // g, *k], n == 1,
                                   dict(kernel_shape=list(k), strides=list(s), dilations=list(d), pads=list(p),
                                        output_padding=list(op), group=g))
                    if dt != F32:
                        break
        for ap in ("SAME_UPPER", "SAME_LOWER", "VALID"):
            convt_case(f"auto_pad {ap}", dt, [2, 4, 5, 7], [4, 3, 3, 2], True, dict(auto_pad=ap, strides=[2, 3]))
        convt_case("output_shape", dt, [1, 2, 5, 5], [2, 3, 3, 3], True, dict(strides=[2, 2], output_shape=[10, 11]))
        convt_case("output_shape NCHW", dt, [3, 2, 4, 7], [2, 3, 3, 3], False,
                   dict(strides=[3, 2], output_shape=[3, 3, 12, 15]))
        for (L, k, s, p, op, g) in [(1, 1, 1, (0, 0), 0, 1), (13, 3, 2, (1, 1), 1, 1), (7, 5, 3, (2, 0), 2, 2)]:
            convt_case(f"L{L} k{k} s{s} p{p} op{op} g{g}", dt, [3, 4, L], [4, 6 // g, k], True,
                       dict(kernel_shape=[k], strides=[s], pads=list(p), output_padding=[op], group=g))
        for (D, k, s, p, g) in [((2, 5, 7), (1, 1, 1), (1, 1, 1), (0,) * 6, 1),
                                ((3, 5, 4), (3, 3, 3), (2, 1, 2), (1, 1, 1, 1, 0, 1), 2)]:
            convt_case(f"D{D} k{k} s{s} p{p} g{g}", dt, [2, 4, *D], [4, 2, *k], True,
                       dict(kernel_shape=list(k), strides=list(s), pads=list(p), group=g))
    convt_case("wide", F32, [2, 32, 7, 7], [32, 24, 4, 4], True, dict(strides=[2, 2], pads=[1, 1, 1, 1]))


# ---------------------------------------------------------------- pooling

def pool_case(name, op, dt, xshape, attrs, opset, indices=False):
    nsp = len(xshape) - 2
    outs = ["Y0_c", "Y1_c"] if indices else ["Y0_c"]
    node = helper.make_node(op, ["X_c"], outs, **attrs)
    blob = cast_wrap([node], [("X", len(xshape))], dt, opset, n_out=len(outs),
                     out_dtypes={1: TensorProto.INT64})
    compare(f"{op}{nsp}d {name} {TensorProto.DataType.Name(dt)}", blob, [{"X": feed_np(rand(xshape), dt)}], dt)


def test_pool():
    for dt in (F32, F16, BF16):
        for (h, w) in [(1, 1), (2, 5), (5, 7), (7, 7), (13, 40), (40, 13)]:
            for (k, s, d, p) in [((1, 1), (1, 1), (1, 1), (0, 0, 0, 0)), ((2, 2), (2, 2), (1, 1), (0, 0, 0, 0)),
                                 ((3, 3), (2, 2), (1, 1), (1, 1, 1, 1)), ((3, 2), (1, 2), (2, 1), (1, 0, 2, 1)),
                                 ((5, 5), (3, 3), (1, 1), (2, 2, 2, 2))]:
                for ceil in (0, 1):
                    ok = all(out_size(i, kk, ss, dd, p[j], p[2 + j], bool(ceil)) >= 1 and kk <= i + p[j] + p[2 + j]
                             for j, (i, kk, ss, dd) in enumerate(zip((h, w), k, s, d)))
                    if not ok:
                        continue
                    base = dict(kernel_shape=list(k), strides=list(s), pads=list(p), ceil_mode=ceil)
                    tag = f"h{h}w{w} k{k} s{s} d{d} p{p} ceil{ceil}"
                    for so in (0, 1):
                        pool_case(f"{tag} so{so}", "MaxPool", dt, [3, 2, h, w],
                                  dict(base, dilations=list(d), storage_order=so), 12, indices=True)
                    pool_case(tag, "MaxPool", dt, [1, 3, h, w], dict(base, dilations=list(d)), 12)
                    for cip in (0, 1):
                        pool_case(f"{tag} cip{cip}", "AveragePool", dt, [3, 2, h, w],
                                  dict(base, count_include_pad=cip, dilations=list(d)), 19)
                        if d == (1, 1):
                            pool_case(f"{tag} cip{cip} opset11", "AveragePool", dt, [1, 2, h, w],
                                      dict(base, count_include_pad=cip), 11)
                    pool_case(tag, "LpPool", dt, [2, 3, h, w], dict(base, dilations=list(d), p=3), 18)
        for ap in ("SAME_UPPER", "SAME_LOWER", "VALID"):
            for op in ("MaxPool", "AveragePool"):
                pool_case(f"auto_pad {ap}", op, dt, [2, 3, 7, 13], dict(auto_pad=ap, kernel_shape=[3, 2],
                                                                        strides=[2, 3]), 12,
                          indices=op == "MaxPool")
        for (L, k, s, p) in [(1, 1, 1, (0, 0)), (13, 3, 2, (1, 1)), (40, 4, 3, (0, 2))]:
            pool_case(f"L{L} k{k} s{s} p{p}", "MaxPool", dt, [3, 4, L],
                      dict(kernel_shape=[k], strides=[s], pads=list(p)), 12, indices=True)
            pool_case(f"L{L} k{k} s{s} p{p}", "AveragePool", dt, [3, 4, L],
                      dict(kernel_shape=[k], strides=[s], pads=list(p), count_include_pad=1), 11)
        for (D, k, s, p) in [((2, 5, 7), (1, 2, 3), (1, 2, 2), (0, 0, 1, 0, 1, 1)),
                             ((5, 7, 13), (3, 3, 3), (2, 2, 2), (1,) * 6)]:
            pool_case(f"D{D} k{k}", "MaxPool", dt, [1, 2, *D], dict(kernel_shape=list(k), strides=list(s),
                                                                    pads=list(p)), 12, indices=True)
            pool_case(f"D{D} k{k}", "AveragePool", dt, [1, 2, *D], dict(kernel_shape=list(k), strides=list(s),
                                                                        pads=list(p)), 11)
        for shape in ([1, 1, 1, 1], [3, 5, 7, 7], [2, 3, 40, 13], [1, 4, 100, 100], [3, 2, 13], [1, 3, 2, 5, 7],
                      [2, 3]):
            for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
                node = helper.make_node(op, ["X_c"], ["Y0_c"])
                blob = cast_wrap([node], [("X", len(shape))], dt, 17)
                compare(f"{op} {shape} {TensorProto.DataType.Name(dt)}", blob, [{"X": feed_np(rand(shape), dt)}], dt)


# ---------------------------------------------------------------- Resize

def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def resize_case(name, dt, xshape, opset, attrs, scales=None, sizes=None, roi=None, runtime=False, op="Resize"):
    """Resize with scales or sizes (constants, or graph inputs fed at run time)."""
    inits, other_in, feeds_extra = [], [], {}

    def add(nm, arr, dtype):
        if arr is None:
            return ""
        arr = np.asarray(arr, dtype=dtype)
        if runtime:
            other_in.append(helper.make_tensor_value_info(nm, TensorProto.FLOAT if dtype == np.float32
                                                          else TensorProto.INT64, [len(arr)]))
            feeds_extra[nm] = arr
        else:
            inits.append(const(nm, arr))
        return nm

    if op == "Upsample" and opset < 9:
        ins = ["X_c"]
        attrs = dict(attrs, scales=[float(v) for v in scales])
    elif op == "Upsample" or opset < 11:
        ins = ["X_c", add("scales", scales, np.float32)]
    else:
        empty_roi = opset < 13
        r = add("roi", roi if roi is not None else ([] if empty_roi else None), np.float32)
        if opset < 13:
            sc = add("scales", scales if scales is not None else [], np.float32)
        else:
            sc = add("scales", scales, np.float32)
        ins = ["X_c", r, sc] + ([add("sizes", sizes, np.int64)] if sizes is not None else [])
    node = helper.make_node(op, ins, ["Y0_c"], **attrs)
    if dt in (TensorProto.UINT8, TensorProto.INT64, TensorProto.INT32):
        blob = model([node, helper.make_node("Identity", ["Y0_c"], ["Y0"])],
                     [helper.make_tensor_value_info("X_c", dt, [f"x{i}" for i in range(len(xshape))])] + other_in,
                     [helper.make_tensor_value_info("Y0", dt, None)], opset, inits)
        feeds = {"X_c": rand(xshape, dt)}
    else:
        blob = cast_wrap([node], [("X", len(xshape))], dt, opset, inits=inits, other_inputs=other_in)
        feeds = {"X": feed_np(rand(xshape), dt)}
    feeds.update(feeds_extra)
    compare(f"{op}-{opset} {name} x{list(xshape)} {TensorProto.DataType.Name(dt)}", blob, [feeds], dt,
            exact=attrs.get("mode", "nearest") == "nearest")


CT_MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
NR_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SCALES = [(2.0, 2.0), (0.5, 0.5), (1.5, 0.6), (3.0, 1.0), (1.0, 2.5), (0.75, 1.3333)]
XSHAPES = [[1, 2, 1, 1], [3, 2, 5, 7], [1, 3, 13, 40], [1, 1, 2, 5], [2, 1, 7, 7]]


def test_resize():
    for dt in (F32, F16, BF16):
        for xs in XSHAPES:
            for sc in SCALES:
                if dt != F32 and sc not in ((2.0, 2.0), (1.5, 0.6)):
                    continue
                s4 = [1.0, 1.0, *sc]
                for ct in CT_MODES + ["half_pixel_symmetric", "tf_half_pixel_for_nn"]:
                    opset = 19 if ct == "half_pixel_symmetric" else 11 if ct == "tf_half_pixel_for_nn" else 13
                    for nr in NR_MODES:
                        resize_case(f"nearest {ct} {nr} s{sc}", dt, xs, opset,
                                    dict(mode="nearest", coordinate_transformation_mode=ct, nearest_mode=nr), s4)
                    resize_case(f"linear {ct} s{sc}", dt, xs, opset,
                                dict(mode="linear", coordinate_transformation_mode=ct), s4)
                    for a, ex in [(-0.75, 0), (-0.5, 1)]:
                        resize_case(f"cubic {ct} a{a} ex{ex} s{sc}", dt, xs, opset,
                                    dict(mode="cubic", coordinate_transformation_mode=ct, cubic_coeff_a=a,
                                         exclude_outside=ex), s4)
            # sizes instead of scales, at run time too
            for sizes in ([xs[0], xs[1], 9, 4], [xs[0], xs[1], 1, 1], [xs[0], xs[1], 2 * xs[2], 3 * xs[3]]):
                for mode in ("nearest", "linear", "cubic"):
                    for runtime in (False, True):
                        resize_case(f"{mode} sizes{sizes} rt{runtime}", dt, xs, 13,
                                    dict(mode=mode), sizes=sizes, runtime=runtime)
            # tf_crop_and_resize with roi and extrapolation
            for mode in ("nearest", "linear", "cubic"):
                resize_case(f"tf_crop {mode}", dt, xs, 13,
                            dict(mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
                                 extrapolation_value=-7.5),
                            sizes=[xs[0], xs[1], 6, 9], roi=[0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4])
                resize_case(f"tf_crop {mode} scales", dt, xs, 11,
                            dict(mode=mode, coordinate_transformation_mode="tf_crop_and_resize"),
                            scales=[1, 1, 1.7, 0.8], roi=[0, 0, 0.1, 0.2, 1, 1, 0.8, 0.7])
        # scales at run time, every axis resized (channels and batch too)
        for mode in ("nearest", "linear", "cubic"):
            resize_case(f"{mode} all axes runtime", dt, [2, 3, 5, 7], 13, dict(mode=mode),
                        scales=[1.5, 2.0, 0.6, 1.5], runtime=True)
        # opset 18: axes and keep_aspect_ratio_policy
        for pol in ("stretch", "not_larger", "not_smaller"):
            for mode in ("nearest", "linear"):
                resize_case(f"axes {pol} {mode}", dt, [2, 3, 5, 7], 18,
                            dict(mode=mode, axes=[2, 3], keep_aspect_ratio_policy=pol), sizes=[9, 9])
                resize_case(f"axes neg {pol} {mode}", dt, [2, 3, 5, 7], 18,
                            dict(mode=mode, axes=[-1, -2], keep_aspect_ratio_policy=pol), sizes=[4, 11])
        resize_case("axes scales", dt, [2, 3, 5, 7], 18, dict(mode="cubic", axes=[3]), scales=[2.5])
        # 3-D volumes: trilinear and nearest
        for mode in ("nearest", "linear"):
            resize_case(f"3d {mode}", dt, [1, 2, 3, 5, 7], 13, dict(mode=mode), scales=[1, 1, 2.0, 1.5, 0.5])
        # opset 10 and Upsample
        for mode in ("nearest", "linear"):
            resize_case(f"{mode}", dt, [2, 3, 5, 7], 10, dict(mode=mode), scales=[1, 1, 2.0, 3.0])
            resize_case(f"{mode} down", dt, [2, 3, 13, 7], 10, dict(mode=mode), scales=[1, 1, 0.5, 0.7])
            resize_case(f"{mode}", dt, [2, 3, 5, 7], 9, dict(mode=mode), scales=[1, 1, 2.0, 1.5], op="Upsample")
            resize_case(f"{mode}", dt, [2, 3, 5, 7], 7, dict(mode=mode), scales=[1, 1, 3.0, 2.0], op="Upsample")
            resize_case(f"{mode} runtime", dt, [2, 3, 5, 7], 9, dict(mode=mode), scales=[1, 1, 2.0, 2.0],
                        op="Upsample", runtime=True)
    # integer inputs: nearest is a gather
    for dt in (TensorProto.UINT8, TensorProto.INT64, TensorProto.INT32):
        for ct in ("asymmetric", "half_pixel", "tf_crop_and_resize"):
            extra = dict(roi=[0, 0, 0.1, -0.2, 1, 1, 0.9, 1.3]) if ct == "tf_crop_and_resize" else {}
            resize_case(f"nearest int {ct}", dt, [1, 3, 5, 7], 13,
                        dict(mode="nearest", coordinate_transformation_mode=ct, extrapolation_value=300.0),
                        sizes=[1, 3, 11, 4], **extra)


# ---------------------------------------------------------------- DepthToSpace / SpaceToDepth

def test_depth_space():
    for dt in (F32, F16, TensorProto.INT64):
        for b in (1, 2, 3):
            for mode in ("DCR", "CRD"):
                for (n, c, h, w) in [(1, 1, 1, 1), (3, 2, 5, 7), (1, 4, 13, 2)]:
                    shape = [n, c * b * b, h, w]
                    node = helper.make_node("DepthToSpace", ["X"], ["Y"], blocksize=b, mode=mode)
                    blob = model([node], [vi("X", dt, 4)], [helper.make_tensor_value_info("Y", dt, None)], 13)
                    compare(f"DepthToSpace b{b} {mode} {shape} {TensorProto.DataType.Name(dt)}", blob,
                            [{"X": rand(shape, dt)}], dt, exact=True)
                    shape = [n, c, h * b, w * b]
                    attrs = dict(blocksize=b) if mode == "DCR" else dict(blocksize=b)
                    node = helper.make_node("SpaceToDepth", ["X"], ["Y"], **attrs)
                    blob = model([node], [vi("X", dt, 4)], [helper.make_tensor_value_info("Y", dt, None)], 13)
                    if mode == "DCR":
                        compare(f"SpaceToDepth b{b} {shape} {TensorProto.DataType.Name(dt)}", blob,
                                [{"X": rand(shape, dt)}], dt, exact=True)


def main():
    probe = model([helper.make_node("GlobalMaxPool", ["X"], ["Y"])], [vi("X", F32, 4)],
                  [helper.make_tensor_value_info("Y", F32, None)], 17)
    try:
        kiln.Session(probe, provider="cuda").run({"X": rand([1, 1, 2, 2])})
    except kiln.KilnError as e:
        print(f"SKIP: no CUDA session ({e})")
        return 0
    if os.environ.get("KILN_CUDNN") == "nofuse":  # the child below: the fused layers alone
        test_conv_fused()
        return summary("test_gpu_cnn (KILN_CUDNN=nofuse): ")
    for t in (test_conv, test_conv_fused, test_cudnn_loaded, test_conv_transpose, test_pool, test_resize,
              test_depth_space):
        t()
    # the fused layers again with cuDNN's convolution alone and kiln's bias, residual and ReLU
    import subprocess
    r = subprocess.run([sys.executable, __file__], env=dict(os.environ, KILN_CUDNN="nofuse"), capture_output=True,
                       text=True)
    tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
    check("the fused layers again with KILN_CUDNN=nofuse", r.returncode == 0, " | ".join(tail))
    return summary("test_gpu_cnn: ")


if __name__ == "__main__":
    sys.exit(main())
