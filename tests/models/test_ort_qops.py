#!/usr/bin/env python3
"""The com.microsoft operators of the ORT-forms work against ONNX Runtime (CPU), one node each on
random data: QGemm, QLinearSoftmax, QLinearAveragePool (integer outputs bit for bit), and
DynamicQuantizeLSTM, QAttention, QEmbedLayerNormalization (float outputs, within float32
rounding of ORT's order: rtol 1e-4 of the output's largest magnitude). Each model runs in kiln's
optimised session and its reference (unoptimized) one. A block-8 com.microsoft.nchwc file (made
from this machine's ORT_ENABLE_ALL file by re-blocking its filters) is checked against the float
model, since no ORT here runs block 8.

DynamicQuantizeLSTM is compared with a one-thread ORT: with more threads ORT splits the batch and
quantizes each share of the hidden state on its own (its numbers then depend on the thread count);
kiln quantizes the whole batch's state per step, as ORT's one-thread run does.

ORT is the exact one of tests/common/ort_int8.py: as it is where its uint8 x int8 products are exact
(VNNI), computing them as uint8 x uint8 where they saturate (AVX2 without VNNI); the first line
printed says which.

usage: test_ort_qops.py   (libkiln.so from build/ or $KILN_LIB)
"""
import os
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402
import ort_int8  # noqa: E402

rng = np.random.default_rng(30)
TP = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8, np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32,
      np.int64: TensorProto.INT64}


def q8(dt, *shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, size=shape, dtype=np.int64).astype(dt)


def model(node, inputs, outputs, inits):
    g = helper.make_graph([node], "qops", inputs, outputs, [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def vi(name, dt, dims):
    return helper.make_tensor_value_info(name, TP[dt], dims)


def compare(name, blob, feeds, exact, rtol=1e-4, ort_threads=2, ref_steps=0):
    """ref_steps: integer steps the reference session may differ by (its requantization multiplies
    in double, as ONNX's reference does, where MLAS multiplies in float32)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = ort_threads
    ref_blob, (ref_feeds,) = ort_int8.exact_form(blob, [feeds])
    want = ort_int8.expected_session(ref_blob, so).run(None, ref_feeds)
    for label, opts in (("kiln", {"num_threads": 2}), ("kiln-reference", {"unoptimized": True})):
        try:
            got = kiln.Session(blob, **opts).run(feeds)
        except kiln.KilnError as e:
            check(f"{name} {label}", False, f"failed: {str(e)[:300]}")
            continue
        for i, (g, w) in enumerate(zip(got, want)):
            g = np.asarray(g)
            if g.shape != w.shape or g.dtype != w.dtype:
                check(f"{name} {label} out{i}", False, f"{g.shape} {g.dtype} vs {w.shape} {w.dtype}")
            elif exact and label == "kiln-reference" and ref_steps:
                d = np.abs(g.astype(np.int64) - w.astype(np.int64))
                check(f"{name} {label} out{i}", int(d.max(initial=0)) <= ref_steps, f"{int(np.sum(d > 0))} of {w.size} differ, by up to {int(d.max(initial=0))}")
            elif exact:
                check(f"{name} {label} out{i}", np.array_equal(g, w), f"{int(np.sum(g != w))} of {w.size} differ")
            else:
                tol = rtol * float(np.max(np.abs(w))) if w.size else 0.0
                d = float(np.max(np.abs(g - w))) if w.size else 0.0
                check(f"{name} {label} out{i}", d <= tol, f"max diff {d:.3g} > {tol:.3g}")


def test_qgemm():
    for at, bt in [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)]:
        for M, K, N in [(1, 7, 5), (3, 17, 10), (13, 64, 33)]:
            for ta, tb, per_col, bias, yq in [(0, 0, False, True, True), (0, 1, True, True, True), (1, 0, False, False, True),
                                              (0, 1, True, True, False)]:
                A = q8(at, *((K, M) if ta else (M, K)))
                Bm = q8(bt, *((N, K) if tb else (K, N)))
                nb = N if per_col else 1
                inits = {"as": np.float32(0.02), "az": q8(at, 1).reshape(()), "B": Bm,
                         "bs": (rng.uniform(0.001, 0.01, nb)).astype(np.float32).reshape((nb,) if per_col else ()),
                         "bz": (np.zeros(nb, bt) if bt == np.int8 else q8(bt, nb)).reshape((nb,) if per_col else ())}
                ins = ["A", "as", "az", "B", "bs", "bz"]
                if bias:
                    inits["C"] = rng.integers(-2000, 2000, N).astype(np.int32)
                    ins.append("C")
                elif yq:
                    ins.append("")
                yt = at if yq else np.float32
                if yq:
                    inits["ys"], inits["yz"] = np.float32(0.05), q8(at, 1).reshape(())
                    ins += ["ys", "yz"]
                node = helper.make_node("QGemm", ins, ["Y"], domain="com.microsoft", transA=ta, transB=tb, alpha=0.75)
                blob = model(node, [vi("A", at, list(A.shape))], [vi("Y", yt, [M, N])], inits)
                compare(f"QGemm {at.__name__}x{bt.__name__} {M}x{K}x{N} tA{ta} tB{tb} col{int(per_col)} bias{int(bias)} "
                        f"{'q' if yq else 'f'}", blob, {"A": A}, exact=yq, rtol=1e-6)


def test_qsoftmax():
    for dt in (np.uint8, np.int8):
        for shape, axis, opset in [((2, 3, 5), -1, 13), ((1, 4, 1, 1), -1, 13), ((2, 4, 7, 7), 3, 13), ((3, 6), 1, 12),
                                   ((2, 5, 3), 1, 13), ((2, 3, 4), 1, 12), ((1, 2, 9, 37), -1, 13)]:
            for xs, ys in [(0.05, 1 / 256), (0.3, 1 / 255), (0.01, 0.004)]:
                zp = np.array(0 if dt == np.uint8 else -128, dt)
                node = helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft",
                                        axis=axis, opset=opset)
                inits = {"xs": np.float32(xs), "xz": q8(dt, 1).reshape(()), "ys": np.float32(ys), "yz": zp}
                blob = model(node, [vi("x", dt, list(shape))], [vi("y", dt, list(shape))], inits)
                compare(f"QLinearSoftmax {dt.__name__} {shape} axis {axis} opset {opset} xs {xs}", blob, {"x": q8(dt, *shape)},
                        exact=True)


def test_qavgpool():
    for dt in (np.uint8, np.int8):
        for shape, k, s, p, incl, ceil, last in [((1, 3, 8, 8), [2, 2], [2, 2], [0, 0, 0, 0], 0, 0, 0),
                                                  ((2, 5, 9, 11), [3, 3], [2, 2], [1, 1, 1, 1], 0, 0, 0),
                                                  ((2, 5, 9, 11), [3, 3], [2, 2], [1, 1, 1, 1], 1, 0, 0),
                                                  ((1, 4, 7, 10), [3, 2], [2, 3], [1, 0, 1, 1], 0, 1, 0),
                                                  ((2, 6, 7, 5), [2, 2], [1, 1], [0, 0, 0, 0], 0, 0, 1)]:
            node = helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft",
                                    kernel_shape=k, strides=s, pads=p, count_include_pad=incl, ceil_mode=ceil,
                                    channels_last=last)
            inits = {"xs": np.float32(0.04), "xz": q8(dt, 1).reshape(()), "ys": np.float32(0.03), "yz": q8(dt, 1).reshape(())}
            blob = model(node, [vi("x", dt, list(shape))], [vi("y", dt, None)], inits)
            compare(f"QLinearAveragePool {dt.__name__} {shape} k{k} s{s} p{p} incl{incl} ceil{ceil} last{last}", blob,
                    {"x": q8(dt, *shape)}, exact=True)


def test_dqlstm():
    for direction, dirs in [("forward", 1), ("reverse", 1), ("bidirectional", 2)]:
        for S, B, I, H, wt, per_col, extras in [(5, 1, 6, 4, np.int8, True, True), (9, 3, 10, 8, np.int8, False, False),
                                                (7, 2, 16, 16, np.int8, True, True), (4, 2, 12, 37, np.int8, True, False)]:
            G = 4 * H
            shape_s = (dirs, G) if per_col else (dirs,)
            inits = {"W": q8(wt, dirs, I, G), "R": q8(wt, dirs, H, G), "Bb": (rng.standard_normal((dirs, 2 * G)) * 0.1).astype(np.float32),
                     "ws": rng.uniform(0.001, 0.02, shape_s).astype(np.float32), "wz": np.zeros(shape_s, wt),
                     "rs": rng.uniform(0.001, 0.02, shape_s).astype(np.float32), "rz": np.zeros(shape_s, wt)}
            ins = ["X", "W", "R", "Bb", "", "", "", "", "ws", "wz", "rs", "rz"]
            feeds = {"X": rng.standard_normal((S, B, I)).astype(np.float32)}
            inputs = [vi("X", np.float32, [S, B, I])]
            if extras:
                ins[5], ins[6] = "h0", "c0"
                feeds["h0"] = (rng.standard_normal((dirs, B, H)) * 0.5).astype(np.float32)
                feeds["c0"] = (rng.standard_normal((dirs, B, H)) * 0.5).astype(np.float32)
                inputs += [vi("h0", np.float32, [dirs, B, H]), vi("c0", np.float32, [dirs, B, H])]
            node = helper.make_node("DynamicQuantizeLSTM", ins, ["Y", "Yh", "Yc"], domain="com.microsoft", hidden_size=H,
                                    direction=direction)
            blob = model(node, inputs, [vi("Y", np.float32, None), vi("Yh", np.float32, None), vi("Yc", np.float32, None)], inits)
            compare(f"DynamicQuantizeLSTM {direction} S{S} B{B} I{I} H{H} {wt.__name__} col{int(per_col)}", blob, feeds,
                    exact=False, rtol=1e-4, ort_threads=1)


def test_qattention():
    for at, wt in [(np.uint8, np.int8), (np.uint8, np.uint8)]:
        for B, S, Hin, N, mask in [(1, 5, 16, 2, False), (2, 7, 32, 4, True), (3, 1, 16, 4, True)]:
            D = Hin
            inits = {"W": q8(wt, Hin, 3 * D), "bias": (rng.standard_normal(3 * D) * 0.1).astype(np.float32),
                     "xs": np.float32(0.02), "ws": np.float32(0.01), "xz": q8(at, 1).reshape(()),
                     "wz": (np.array(0, wt) if wt == np.int8 else q8(wt, 1).reshape(()))}
            feeds = {"X": q8(at, B, S, Hin)}
            inputs = [vi("X", at, [B, S, Hin])]
            ins = ["X", "W", "bias", "xs", "ws", "", "xz", "wz"]
            if mask:
                ins[5] = "mask"
                feeds["mask"] = rng.integers(1, S + 1, B).astype(np.int32)
                inputs.append(vi("mask", np.int32, [B]))
            node = helper.make_node("QAttention", ins, ["Y"], domain="com.microsoft", num_heads=N)
            blob = model(node, inputs, [vi("Y", np.float32, [B, S, D])], inits)
            compare(f"QAttention {at.__name__}x{wt.__name__} B{B} S{S} H{Hin} heads{N} mask{int(mask)}", blob, feeds, exact=False)


def test_qembed():
    for B, S, H, V, seg in [(1, 5, 16, 20, True), (2, 9, 32, 30, False), (3, 1, 8, 10, True)]:
        tables = {"we": (V, H), "pe": (16, H), "se": (2, H), "g": (H,), "b": (H,)}
        inits = {}
        for k, shp in tables.items():
            if k == "se" and not seg:
                continue
            inits[k] = q8(np.uint8, *shp)
            inits[k + "_s"] = np.float32(rng.uniform(0.005, 0.02))
            inits[k + "_z"] = q8(np.uint8, 1).reshape(())
        feeds = {"ids": rng.integers(0, V, (B, S)).astype(np.int32), "mask": np.ones((B, S), np.int32)}
        inputs = [vi("ids", np.int32, [B, S]), vi("mask", np.int32, [B, S])]
        if seg:
            feeds["seg"] = rng.integers(0, 2, (B, S)).astype(np.int32)
            inputs.append(vi("seg", np.int32, [B, S]))
        names = ["we", "pe", "se", "g", "b"]
        ins = ["ids", "seg" if seg else "", "we", "pe", "se" if seg else "", "g", "b", "mask"]
        ins += [f"{k}_s" if k in inits else "" for k in names] + [f"{k}_z" if k in inits else "" for k in names]
        node = helper.make_node("QEmbedLayerNormalization", ins, ["Y", "mi"], domain="com.microsoft", epsilon=1e-12)
        blob = model(node, inputs, [vi("Y", np.float32, [B, S, H]), vi("mi", np.int32, [B])], inits)
        compare(f"QEmbedLayerNormalization B{B} S{S} H{H} seg{int(seg)}", blob, feeds, exact=False)


def filt_index(B, M, C, kh, kw, dw):
    """For each element of a plain filter [M, C, kh, kw], its offset in ORT's reordered one."""
    m, c, i, j = np.meshgrid(np.arange(M), np.arange(C), np.arange(kh), np.arange(kw), indexing="ij")
    if dw:
        return (((m // B) * kh + i) * kw + j) * B + m % B
    if C >= B:
        return ((((m // B) * (C // B) + c // B) * kh + i) * kw + j) * B * B + (c % B) * B + m % B
    return ((((m // B) * C + c) * kh + i) * kw + j) * B + m % B


def reblock(w16, b16, dw):
    """ORT's block-16 filter (and bias) as block 8: the zero padding past the real channels cut to a
    multiple of 8."""
    M, C, kh, kw = w16.shape
    plain = w16.reshape(-1)[filt_index(16, M, C, kh, kw, dw)]
    nz_m = np.nonzero(np.abs(plain).sum(axis=(1, 2, 3)))[0]
    m8 = -(-(int(nz_m.max()) + 1) // 8) * 8
    c8 = C if dw or C < 16 else -(-(int(np.nonzero(np.abs(plain).sum(axis=(0, 2, 3)))[0].max()) + 1) // 8) * 8
    plain = plain[:m8, :c8]
    out = np.zeros(plain.size, np.float32)
    out[filt_index(8, m8, c8, kh, kw, dw).reshape(-1)] = plain.reshape(-1)
    return out.reshape(plain.shape), (b16[:m8] if b16 is not None else None)


def test_nchwc_block8():
    """A conv net of 24 and 40 channels (block 16 pads them to 32 and 48; block 8 keeps them), saved by
    this machine's ORT at ORT_ENABLE_ALL, re-blocked to 8: kiln must read block 8 off the shapes and
    match ORT on the float model."""
    import tempfile
    import onnx
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ort_families as f
    g = f.G(9)
    x = f.conv_bn(g, "image", 3, 24, 3)
    x = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = g.op("Relu", [g.op("Add", [f.conv_bn(g, x, 24, 24, 3, act=None), x])])
    x = f.conv_bn(g, f.conv_bn(g, x, 24, 40, 1, 2), 40, 40, 3, group=40)
    y = f.head(g, x, 40)
    g.out_types = {"logits": (f.F32, ["batch", 10])}
    m = g.model([helper.make_tensor_value_info("image", f.F32, ["batch", 3, "H", "W"])], [y], ["logits"])
    with tempfile.TemporaryDirectory() as d:
        src, opt = os.path.join(d, "b8.onnx"), os.path.join(d, "b8_all.onnx")
        onnx.save(m, src)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = opt
        ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
        mm = onnx.load(opt)
        inits = {i.name: i for i in mm.graph.initializer}
        convs = [n for n in mm.graph.node if n.domain == "com.microsoft.nchwc" and n.op_type == "Conv"]
        check("block-8 test: ORT_ENABLE_ALL wrote nchwc convolutions", bool(convs), "none in the file")
        if kiln_block16_machine():  # this ORT writes block 16: re-block the filters (else the file is block 8 already)
            for n in convs:
                w = numpy_helper.to_array(inits[n.input[1]])
                b = numpy_helper.to_array(inits[n.input[2]]) if len(n.input) > 2 and n.input[2] in inits else None
                dw = any(a.name == "group" and a.i > 1 for a in n.attribute)
                w8, b8 = reblock(w, b, dw)
                for a in n.attribute:
                    if dw and a.name == "group":
                        a.i = w8.shape[0]
                inits[n.input[1]].CopyFrom(numpy_helper.from_array(w8, n.input[1]))
                if b8 is not None:
                    inits[n.input[2]].CopyFrom(numpy_helper.from_array(b8, n.input[2]))
        blob = mm.SerializeToString()
        ref = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
        for label, opts in (("kiln", {"num_threads": 2}), ("kiln-reference", {"unoptimized": True})):
            sess = kiln.Session(blob, **opts)
            for b, h, w in [(1, 16, 16), (2, 13, 21), (3, 9, 8)]:
                x = rng.standard_normal((b, 3, h, w)).astype(np.float32)
                want, got = ref.run(None, {"image": x})[0], sess.run({"image": x})[0]
                tol = 1e-3 * float(np.max(np.abs(want)))
                check(f"nchwc block 8 {label} {x.shape}", got.shape == want.shape and float(np.max(np.abs(got - want))) <= tol,
                      f"max diff {float(np.max(np.abs(got - want))) if got.shape == want.shape else got.shape}")


def expect_error(name, blob, feeds):
    """A malformed node must come back as an error (at load or at run), never a crash."""
    try:
        kiln.Session(blob).run(feeds)
    except kiln.KilnError as e:
        check(f"{name}: refused with a message", bool(str(e)), "empty message")
        return
    check(f"{name}: refused", False, "ran")


def test_errors():
    f32 = np.float32
    # QGemm with K of A and B disagreeing (the weight is constant: caught at load or run)
    node = helper.make_node("QGemm", ["A", "as", "az", "B", "bs", "bz"], ["Y"], domain="com.microsoft")
    blob = model(node, [vi("A", np.uint8, ["m", "k"])], [vi("Y", f32, None)],
                 {"as": f32(0.1), "az": np.uint8(0), "B": q8(np.int8, 5, 4), "bs": f32(0.1), "bz": np.int8(0)})
    expect_error("QGemm K mismatch", blob, {"A": q8(np.uint8, 3, 7)})
    # DynamicQuantizeLSTM whose W does not match X's input size
    node = helper.make_node("DynamicQuantizeLSTM", ["X", "W", "R", "", "", "", "", "", "ws", "wz", "rs", "rz"], ["Y"],
                            domain="com.microsoft", hidden_size=4)
    blob = model(node, [vi("X", f32, ["s", "b", "i"])], [vi("Y", f32, None)],
                 {"W": q8(np.int8, 1, 6, 16), "R": q8(np.int8, 1, 4, 16), "ws": np.full(1, 0.1, f32), "wz": np.zeros(1, np.int8),
                  "rs": np.full(1, 0.1, f32), "rz": np.zeros(1, np.int8)})
    expect_error("DynamicQuantizeLSTM input size mismatch", blob, {"X": rng.standard_normal((3, 2, 5)).astype(f32)})
    # QLinearSoftmax without its opset attribute
    node = helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft", axis=-1)
    blob = model(node, [vi("x", np.uint8, [2, 3])], [vi("y", np.uint8, None)],
                 {"xs": f32(0.1), "xz": np.uint8(0), "ys": f32(1 / 256), "yz": np.uint8(0)})
    expect_error("QLinearSoftmax without opset", blob, {"x": q8(np.uint8, 2, 3)})
    # nchwc Conv whose filter's output channels fit no block
    node = helper.make_node("Conv", ["x", "w"], ["y"], domain="com.microsoft.nchwc", kernel_shape=[1, 1])
    g = helper.make_graph([node], "n", [vi("x", f32, [1, 3, 4, 4])], [vi("y", f32, None)],
                          [numpy_helper.from_array(rng.standard_normal((12, 3, 1, 1)).astype(f32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft.nchwc", 1)])
    m.ir_version = 8
    expect_error("nchwc Conv of 12 output channels", m.SerializeToString(), {"x": rng.standard_normal((1, 3, 4, 4)).astype(f32)})
    # QAttention whose weight columns do not split into heads
    node = helper.make_node("QAttention", ["X", "W", "bias", "xs", "ws"], ["Y"], domain="com.microsoft", num_heads=4)
    blob = model(node, [vi("X", np.uint8, [1, 3, 8])], [vi("Y", f32, None)],
                 {"W": q8(np.int8, 8, 30), "bias": np.zeros(30, f32), "xs": f32(0.1), "ws": f32(0.1)})
    expect_error("QAttention 30 columns for 4 heads", blob, {"X": q8(np.uint8, 1, 3, 8)})


def test_qlinear_matmul_batched():
    """QLinearMatMul of two activations in batches (kernels_qmatmul_batched.c), bit for bit."""
    for at, bt in [(np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8)]:
        for sa, sb in [((2, 4, 17, 8), (2, 4, 8, 17)), ((3, 5, 7), (3, 7, 2)), ((1, 2, 1, 33), (1, 2, 33, 9)),
                       ((2, 40, 64), (2, 64, 40))]:
            inits = {"as": np.float32(0.03), "az": q8(at, 1).reshape(()), "bs": np.float32(0.02), "bz": q8(bt, 1).reshape(()),
                     "ys": np.float32(0.5), "yz": q8(at, 1).reshape(())}
            node = helper.make_node("QLinearMatMul", ["A", "as", "az", "B", "bs", "bz", "ys", "yz"], ["Y"])
            blob = model(node, [vi("A", at, list(sa)), vi("B", bt, list(sb))], [vi("Y", at, None)], inits)
            compare(f"QLinearMatMul batched {at.__name__}x{bt.__name__} {sa} {sb}", blob, {"A": q8(at, *sa), "B": q8(bt, *sb)},
                    exact=True, ref_steps=1)


def test_std_kernels():
    """The standard-op CPU kernels the families needed (kernels_conv1d.c, kernels_ew_more.c) on the
    shapes and attributes they cover, against ORT."""
    f32 = np.float32
    for N, C, L, M, k, s, p, d, op, grp, bias in [(1, 16, 9, 8, 4, 2, [1, 1], 1, 0, 1, True), (2, 6, 7, 4, 3, 1, [0, 0], 1, 0, 2, False),
                                                 (1, 4, 5, 3, 3, 3, [1, 2], 2, 1, 1, True), (3, 2, 1, 5, 2, 2, [0, 0], 1, 1, 1, True)]:
        inits = {"W": rng.standard_normal((C, M // grp if grp > 1 else M, k)).astype(f32)}
        if grp > 1:
            inits["W"] = rng.standard_normal((C, M // grp, k)).astype(f32)
        ins = ["X", "W"] + (["Bb"] if bias else [])
        if bias:
            inits["Bb"] = rng.standard_normal(inits["W"].shape[1] * grp).astype(f32)
        node = helper.make_node("ConvTranspose", ins, ["Y"], kernel_shape=[k], strides=[s], pads=p, dilations=[d],
                                output_padding=[op], group=grp)
        g = helper.make_graph([node], "ct", [vi("X", f32, [N, C, "L"])], [vi("Y", f32, None)],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        compare(f"ConvTranspose 1-D N{N} C{C} L{L} M{M} k{k} s{s} p{p} d{d} op{op} g{grp}", m.SerializeToString(),
                {"X": rng.standard_normal((N, C, L)).astype(f32)}, exact=False, rtol=1e-5)
    for op_type in ["Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Equal"]:
        for dt, sa, sb in [(np.int64, [7, 1], [1, 5]), (np.float32, [2, 3, 4], [4]), (np.int32, [3, 4], [3, 4]), (np.int64, [], [6])]:
            a = rng.integers(-3, 4, sa).astype(dt)
            b = rng.integers(-3, 4, sb).astype(dt)
            node = helper.make_node(op_type, ["a", "b"], ["y"])
            g = helper.make_graph([node], "c", [vi("a", dt, sa), vi("b", dt, sb)], [helper.make_tensor_value_info("y", TensorProto.BOOL, None)])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            m.ir_version = 8
            compare(f"{op_type} {dt.__name__} {sa} {sb}", m.SerializeToString(), {"a": a, "b": b}, exact=True)
    for cs, xs, ys in [((1, 1, 5, 5), (2, 3, 5, 5), ()), ((4, 1), (4, 6), (1, 6)), ((3,), (2, 3), (2, 3))]:
        node = helper.make_node("Where", ["c", "x", "y"], ["o"])
        g = helper.make_graph([node], "w", [helper.make_tensor_value_info("c", TensorProto.BOOL, list(cs)), vi("x", f32, list(xs)),
                                            vi("y", f32, list(ys))], [vi("o", f32, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        compare(f"Where {cs} {xs} {ys}", m.SerializeToString(), {"c": rng.integers(0, 2, cs).astype(bool),
                "x": rng.standard_normal(xs).astype(f32), "y": np.asarray(rng.standard_normal(ys), f32)}, exact=True)
    for shape, skip_shape, outs in [((2, 7, 32), (2, 7, 32), 4), ((3, 5, 16), (5, 16), 1), ((1, 9, 8), (1, 9, 8), 4)]:
        H = shape[-1]
        inits = {"g": (1 + rng.standard_normal(H) * 0.1).astype(f32), "b": (rng.standard_normal(H) * 0.1).astype(f32),
                 "bias": (rng.standard_normal(H) * 0.1).astype(f32)}
        names = ["Y", "mean", "inv", "sum"][:outs]
        node = helper.make_node("SkipLayerNormalization", ["x", "s", "g", "b", "bias"], names, domain="com.microsoft", epsilon=1e-5)
        blob = model(node, [vi("x", f32, list(shape)), vi("s", f32, list(skip_shape))], [vi(nm, f32, None) for nm in names], inits)
        compare(f"SkipLayerNormalization {shape} skip {skip_shape} outputs {outs}", blob,
                {"x": rng.standard_normal(shape).astype(f32), "s": rng.standard_normal(skip_shape).astype(f32)}, exact=False)
    for src, dst in [(np.bool_, np.int64), (np.int64, np.float32), (np.int32, np.int64), (np.float32, np.bool_), (np.int64, np.int32)]:
        x = (rng.integers(-5, 6, (4, 9)) * (1 if src != np.float32 else 0.5)).astype(src)
        to = {np.int64: TensorProto.INT64, np.float32: TensorProto.FLOAT, np.bool_: TensorProto.BOOL, np.int32: TensorProto.INT32}[dst]
        node = helper.make_node("Cast", ["x"], ["y"], to=to)
        g = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", {np.bool_: TensorProto.BOOL, np.int64: TensorProto.INT64, np.int32: TensorProto.INT32, np.float32: TensorProto.FLOAT}[src], [4, 9])],
                              [helper.make_tensor_value_info("y", to, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        compare(f"Cast {src.__name__} -> {dst.__name__}", m.SerializeToString(), {"x": x}, exact=True)


def kiln_block16_machine():
    with open("/proc/cpuinfo") as fh:
        return "avx512f" in fh.read()


if __name__ == "__main__":
    ort_int8.announce()
    for t in [test_qgemm, test_qsoftmax, test_qavgpool, test_dqlstm, test_qattention, test_qembed, test_nchwc_block8, test_errors, test_std_kernels, test_qlinear_matmul_batched]:
        t()
    sys.exit(summary())
