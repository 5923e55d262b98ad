#!/usr/bin/env python3
"""com.microsoft operators (ONNX Runtime's contrib ops) and loader leniencies against ONNX Runtime:
each op as a one-node model on random data at several shapes (odd sizes, batch > 1, optional
inputs present and absent), in an optimised and an unoptimised kiln session; models with negative
dims, partial value_info, unused opset imports, IR versions 3 to 10, initializers listed as inputs;
and a BERT-style encoder after onnxruntime.transformers' optimize_model.

usage: test_contrib.py [kiln_cli]   (libkiln.so from build/ or $KILN_LIB)
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
MS = "com.microsoft"
rng = np.random.default_rng(7)
ort.set_default_logger_severity(3)


def rand(*shape, dtype=np.float32):
    a = rng.standard_normal(shape).astype(dtype)
    a[a == 0] = 0.5  # never zeros
    return a


def model(nodes, inputs, outputs, inits=(), opsets=(("", 17), (MS, 1)), ir=8):
    nodes = nodes if isinstance(nodes, list) else [nodes]
    g = helper.make_graph(nodes, "contrib", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = ir
    return m


def io(name, arr_or_dtype, rank=None):
    dt = arr_or_dtype if isinstance(arr_or_dtype, int) else helper.np_dtype_to_tensor_dtype(arr_or_dtype.dtype)
    r = rank if rank is not None else arr_or_dtype.ndim
    return helper.make_tensor_value_info(name, dt, [f"{name}_{i}" for i in range(r)])


def out(name):
    return onnx.ValueInfoProto(name=name)


def ort_session(m):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def compare(name, m, feeds_list, rtol=RTOL, atol=ATOL):
    """Runs every feed through ORT and through kiln (optimised and reference sessions)."""
    blob = m.SerializeToString()
    try:
        ref = ort_session(m)
    except Exception as e:  # noqa: BLE001
        check(f"{name}: ORT loads it", False, str(e).splitlines()[0])
        return
    try:
        sessions = [("fast", kiln.Session(blob, num_threads=2)), ("ref", kiln.Session(blob, unoptimized=True))]
    except kiln.KilnError as e:
        check(f"{name}: kiln loads it", False, str(e))
        return
    for feeds in feeds_list:
        shapes = " ".join(f"{k}={v.shape}" for k, v in feeds.items())
        try:
            want = ref.run(None, feeds)
        except Exception as e:  # noqa: BLE001
            for tag, s in sessions:
                try:
                    s.run(feeds)
                    check(f"{name} [{tag}] {shapes}", False, f"ORT refuses ({str(e).splitlines()[0][:120]}) but kiln ran")
                except kiln.KilnError:
                    check(f"{name} [{tag}] {shapes}", True)
            continue
        for tag, s in sessions:
            try:
                got = s.run(feeds)
            except kiln.KilnError as e:
                check(f"{name} [{tag}] {shapes}", False, f"kiln failed: {e}")
                continue
            ok = len(got) == len(want)
            detail = f"{len(got)} outputs vs {len(want)}"
            for k, (g, w) in enumerate(zip(got, want)):
                g, w = np.asarray(g), np.asarray(w)
                if g.shape != w.shape or g.dtype != w.dtype:
                    ok, detail = False, f"output {k}: {g.dtype}{g.shape} vs ORT {w.dtype}{w.shape}"
                    break
                if not np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True):
                    ok = False
                    detail = f"output {k}: max diff {np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))}"
                    break
            check(f"{name} [{tag}] {shapes}", ok, detail)


SHAPES = [(1, 1, 1), (2, 3, 5), (3, 7, 16), (2, 17, 33), (4, 1, 64), (1, 9, 130)]


def test_gelu_family():
    for op, attrs, bias in [("Gelu", {}, None), ("FastGelu", {}, False), ("FastGelu", {}, True),
                            ("BiasGelu", {}, True), ("QuickGelu", {}, None), ("QuickGelu", {"alpha": 1.3}, None)]:
        names = ["X"] + (["bias"] if bias else [])
        x = rand(2, 3, 4)
        ins = [io("X", x)] + ([io("bias", x, 1)] if bias else [])
        m = model(helper.make_node(op, names, ["Y"], domain=MS, **attrs), ins, [out("Y")])
        feeds = []
        for s in SHAPES:
            f = {"X": rand(*s) * 3}
            if bias:
                f["bias"] = rand(s[-1])
            feeds.append(f)
        feeds.append({"X": rand(5, 6)[..., :6], **({"bias": rand(6)} if bias else {})})  # rank 2
        if bias:
            feeds.append({"X": rand(2, 3, 4), "bias": rand(5)})  # bias of the wrong length: both refuse
        compare(f"{op}{attrs} bias={bias}", m, feeds)
    # float16 where ORT's CPU provider has it
    x = rand(2, 3, 4, dtype=np.float16)
    m = model(helper.make_node("Gelu", ["X"], ["Y"], domain=MS), [io("X", x)], [out("Y")])
    compare("Gelu float16", m, [{"X": rand(*s, dtype=np.float16)} for s in SHAPES], rtol=2e-3, atol=2e-3)


def test_bias_add():
    """ONNX Runtime has BiasAdd on CUDA only: the expected values are X + bias + skip."""
    x = rand(2, 3, 4)
    m = model(helper.make_node("BiasAdd", ["X", "bias", "skip"], ["Y"], domain=MS),
              [io("X", x), io("bias", x, 1), io("skip", x)], [out("Y")])
    for tag, s in [("fast", kiln.Session(m.SerializeToString(), num_threads=2)),
                   ("ref", kiln.Session(m.SerializeToString(), unoptimized=True))]:
        for shape in SHAPES:
            f = {"X": rand(*shape), "bias": rand(shape[2]), "skip": rand(*shape)}
            got = s.run(f)[0]
            want = f["X"] + f["bias"] + f["skip"]
            check(f"BiasAdd [{tag}] {shape}", got.shape == want.shape and np.allclose(got, want, rtol=RTOL, atol=ATOL))
        try:
            s.run({"X": rand(2, 3, 4), "bias": rand(5), "skip": rand(2, 3, 4)})
            check(f"BiasAdd [{tag}] bias of the wrong length is refused", False, "kiln ran it")
        except kiln.KilnError:
            check(f"BiasAdd [{tag}] bias of the wrong length is refused", True)


def test_skip_layer_norm():
    for simplified in (False, True):
        op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
        for beta in ([False] if simplified else [False, True]):
            for bias in (False, True):
                for outs in (["Y"], ["Y", "mean", "inv", "sum"], ["Y", "", "", "sum"]):
                    x = rand(2, 3, 4)
                    names = ["X", "skip", "gamma"]
                    ins = [io("X", x), io("skip", x), io("gamma", x, 1)]
                    if not simplified:
                        names.append("beta" if beta else "")
                        if beta:
                            ins.append(io("beta", x, 1))
                    if bias:
                        names.append("bias")
                        ins.append(io("bias", x, 1))
                    eps = float(rng.choice([1e-12, 1e-5]))
                    m = model(helper.make_node(op, names, outs, domain=MS, epsilon=eps), ins,
                              [out(o) for o in outs if o])
                    feeds = []
                    for s in SHAPES[1:]:
                        f = {"X": rand(*s), "skip": rand(*s), "gamma": rand(s[2])}
                        if beta:
                            f["beta"] = rand(s[2])
                        if bias:
                            f["bias"] = rand(s[2])
                        feeds.append(f)
                    compare(f"{op} beta={beta} bias={bias} outs={len([o for o in outs if o])}", m, feeds)
    # skip broadcast over the batch ([1, S, H] and [S, H]) and 2-D input
    for skip_shape in ("1SH", "SH"):
        x = rand(2, 3, 4)
        m = model(helper.make_node("SkipLayerNormalization", ["X", "skip", "gamma", "beta"], ["Y"], domain=MS),
                  [io("X", x), io("skip", x, len(skip_shape)), io("gamma", x, 1), io("beta", x, 1)], [out("Y")])
        feeds = []
        for b, s, h in [(2, 3, 8), (3, 5, 17), (1, 4, 32)]:
            sk = rand(1, s, h) if skip_shape == "1SH" else rand(s, h)
            feeds.append({"X": rand(b, s, h), "skip": sk, "gamma": rand(h), "beta": rand(h)})
        compare(f"SkipLayerNormalization skip {skip_shape}", m, feeds)
    x = rand(6, 8)
    m = model(helper.make_node("SkipLayerNormalization", ["X", "skip", "gamma"], ["Y"], domain=MS),
              [io("X", x), io("skip", x), io("gamma", x, 1)], [out("Y")])
    compare("SkipLayerNormalization 2-D", m, [{"X": rand(t, h), "skip": rand(t, h), "gamma": rand(h)}
                                              for t, h in [(6, 8), (1, 3), (13, 40)]])


def test_embed_layer_norm():
    for seg in (False, True):
        for mask in (False, True):
            for pos in (None, "BS", "1S"):
                for want_sum in (False, True):
                    names = ["ids", "seg" if seg else "", "word", "posemb", "segemb" if seg else "", "gamma", "beta",
                             "mask" if mask else "", "pos" if pos else ""]
                    while names[-1] == "":
                        names.pop()
                    i32 = TensorProto.INT32
                    h, v, p = [(8, 11, 16), (33, 50, 20), (4, 3, 16)][(seg + 2 * mask) % 3]
                    inits = [numpy_helper.from_array(a, n) for a, n in
                             [(rand(v, h), "word"), (rand(p, h), "posemb"), (rand(h), "gamma"), (rand(h), "beta")]]
                    ins = [io("ids", i32, 2)]
                    if seg:
                        ins.append(io("seg", i32, 2))
                        inits.append(numpy_helper.from_array(rand(2, h), "segemb"))
                    if mask:
                        ins.append(io("mask", i32, 2))
                    if pos:
                        ins.append(io("pos", i32, 2))
                    outs = ["Y", "mask_index"] + (["sum"] if want_sum else [])
                    m = model(helper.make_node("EmbedLayerNormalization", names, outs, domain=MS, epsilon=1e-5), ins,
                              [out(o) for o in outs], inits=inits)
                    feeds = []
                    for b, s in [(1, 1), (2, 5), (3, 16)]:
                        f = {"ids": rng.integers(0, v, (b, s)).astype(np.int32)}
                        if seg:
                            f["seg"] = rng.integers(0, 2, (b, s)).astype(np.int32)
                        if mask:
                            f["mask"] = rng.integers(0, 2, (b, s)).astype(np.int32)
                        if pos:
                            f["pos"] = rng.integers(0, p, (b if pos == "BS" else 1, s)).astype(np.int32)
                        feeds.append(f)
                    compare(f"EmbedLayerNormalization seg={seg} mask={mask} pos={pos} sum={want_sum}", m, feeds)


def test_fused_matmul():
    cases = [(2, 2), (3, 3), (4, 4), (3, 2), (4, 2), (2, 3), (4, 3)]
    for ra, rb in cases:
        for ta in (0, 1):
            for tb in (0, 1):
                for tba, tbb in ((0, 0), (1, 0), (0, 1), (1, 1)):
                    if (tba or tbb) and (ra != rb or ra < 3):
                        continue
                    alpha = float(rng.choice([1.0, 0.125, -1.5]))
                    node = helper.make_node("FusedMatMul", ["A", "B"], ["Y"], domain=MS, alpha=alpha, transA=ta,
                                            transB=tb, transBatchA=tba, transBatchB=tbb)
                    m = model(node, [io("A", TensorProto.FLOAT, ra), io("B", TensorProto.FLOAT, rb)], [out("Y")])
                    feeds = []
                    for M, K, N in [(1, 1, 1), (3, 5, 7), (17, 33, 9), (64, 20, 65)]:
                        batch = [2, 3][:max(ra, rb) - 2]

                        def operand(r, rows, cols, trans, tbatch):
                            bd = batch[len(batch) - (r - 2):] if r > 2 else []
                            logical = bd + ([cols, rows] if trans else [rows, cols])
                            if tbatch:  # stored with the second-to-last logical dim first
                                logical = [logical[-2]] + bd + [logical[-1]]
                            return rand(*logical)
                        feeds.append({"A": operand(ra, M, K, ta, tba), "B": operand(rb, K, N, tb, tbb)})
                    compare(f"FusedMatMul {ra}x{rb} tA={ta} tB={tb} tbA={tba} tbB={tbb}", m, feeds, atol=1e-4)
    # constant weights (the packed path)
    for tb in (0, 1):
        w = rand(24, 40)
        node = helper.make_node("FusedMatMul", ["A", "W"], ["Y"], domain=MS, alpha=0.5, transB=tb)
        m = model(node, [io("A", TensorProto.FLOAT, 3)], [out("Y")], inits=[numpy_helper.from_array(w, "W")])
        k = 40 if tb else 24
        compare(f"FusedMatMul constant W transB={tb}", m, [{"A": rand(b, s, k)} for b, s in [(1, 1), (2, 7), (3, 33)]],
                atol=1e-4)


ACTS = [("Relu", {}), ("Tanh", {}), ("Sigmoid", {}), ("Softsign", {}), ("Softplus", {}),
        ("LeakyRelu", {"activation_alpha": 0.1}), ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4}),
        ("Elu", {"activation_alpha": 0.7}), ("Selu", {"activation_alpha": 1.6, "activation_gamma": 1.05}),
        ("ThresholdedRelu", {"activation_alpha": 0.2}),
        ("ScaledTanh", {"activation_alpha": 0.5, "activation_beta": 1.5}),
        ("ParametricSoftplus", {"activation_alpha": 0.6, "activation_beta": 1.2})]


def test_fused_gemm():
    for act, attrs in ACTS:
        for ta, tb, c_rank in [(0, 0, None), (0, 1, 1), (1, 0, 2), (1, 1, 0)]:
            names = ["A", "B"] + (["C"] if c_rank is not None else [])
            ins = [io("A", TensorProto.FLOAT, 2), io("B", TensorProto.FLOAT, 2)]
            if c_rank is not None:
                ins.append(io("C", TensorProto.FLOAT, c_rank))
            node = helper.make_node("FusedGemm", names, ["Y"], domain=MS, activation=act, transA=ta, transB=tb,
                                    alpha=0.75, beta=0.5, **attrs)
            m = model(node, ins, [out("Y")])
            feeds = []
            for M, K, N in [(1, 1, 1), (3, 5, 7), (17, 33, 65), (64, 64, 40)]:
                f = {"A": rand(*((K, M) if ta else (M, K))), "B": rand(*((N, K) if tb else (K, N)))}
                if c_rank is not None:
                    f["C"] = [rand(), rand(N), rand(M, N)][c_rank]
                feeds.append(f)
            compare(f"FusedGemm {act} tA={ta} tB={tb} C={c_rank}", m, feeds, atol=1e-4)
    # constant B (packed) and a missing activation parameter (both refuse)
    w = rand(33, 20)
    node = helper.make_node("FusedGemm", ["A", "W", "C"], ["Y"], domain=MS, activation="LeakyRelu", activation_alpha=0.2)
    m = model(node, [io("A", TensorProto.FLOAT, 2)], [out("Y")],
              inits=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(rand(20), "C")])
    compare("FusedGemm constant W", m, [{"A": rand(r, 33)} for r in (1, 5, 70)], atol=1e-4)
    m = model(helper.make_node("FusedGemm", ["A", "B"], ["Y"], domain=MS, activation="LeakyRelu"),
              [io("A", TensorProto.FLOAT, 2), io("B", TensorProto.FLOAT, 2)], [out("Y")])
    try:
        kiln.Session(m.SerializeToString()).run({"A": rand(2, 3), "B": rand(3, 4)})
        check("FusedGemm LeakyRelu without activation_alpha is refused", False, "kiln ran it")
    except kiln.KilnError as e:
        check("FusedGemm LeakyRelu without activation_alpha is refused", "activation_alpha" in str(e), str(e))


def test_fused_conv():
    conv_acts = [("Relu", None), ("Tanh", None), ("Sigmoid", None), ("LeakyRelu", [0.15]), ("Clip", [-0.4, 0.6]),
                 ("HardSigmoid", [0.25, 0.45])]
    for act, params in conv_acts:
        for with_b in (False, True):
            for with_z in (False, True):
                names = ["X", "W", "B" if with_b else ""] + (["Z"] if with_z else [])
                while names[-1] == "":
                    names.pop()
                ins = [io("X", TensorProto.FLOAT, 4)]
                kw = {"activation": act, "pads": [1, 1, 1, 1], "strides": [1, 1]}
                if params:
                    kw["activation_params"] = params
                c_in, c_out = 3, 8
                inits = [numpy_helper.from_array(rand(c_out, c_in, 3, 3), "W")]
                if with_b:
                    inits.append(numpy_helper.from_array(rand(c_out), "B"))
                if with_z:
                    ins.append(io("Z", TensorProto.FLOAT, 4))
                m = model(helper.make_node("FusedConv", names, ["Y"], domain=MS, **kw), ins, [out("Y")], inits=inits)
                feeds = []
                for n, h, w in [(1, 1, 1), (2, 5, 7), (1, 16, 17)]:
                    f = {"X": rand(n, c_in, h, w)}
                    if with_z:
                        f["Z"] = rand(n, c_out, h, w)
                    feeds.append(f)
                compare(f"FusedConv {act} B={with_b} Z={with_z}", m, feeds, atol=1e-4)


def test_quant():
    for qt, lo, hi in [(np.uint8, 0, 255), (np.int8, -128, 127), (np.uint16, 0, 65535), (np.int16, -32768, 32767)]:
        for per_axis in (False, True):
            for with_zp in (False, True):
                c = 5
                scale = (np.abs(rand(c)) * 0.05 + 0.01) if per_axis else np.array(0.02, np.float32)
                zp = rng.integers(lo // 4, hi // 4 + 1, scale.shape).astype(qt)
                attrs = {"axis": 1} if per_axis else {}
                inits = [numpy_helper.from_array(scale.astype(np.float32), "s")]
                names = ["x", "s"]
                if with_zp:
                    inits.append(numpy_helper.from_array(zp, "zp"))
                    names.append("zp")
                elif qt != np.uint8:
                    continue  # the zero point's type is the output type; without it, uint8
                q = helper.make_node("QuantizeLinear", names, ["q"], domain=MS, **attrs)
                dq = helper.make_node("DequantizeLinear", ["q"] + names[1:], ["y"], domain=MS, **attrs)
                m = model([q, dq], [io("x", TensorProto.FLOAT, 3)], [out("q"), out("y")], inits=inits)
                feeds = [{"x": rand(b, c, w) * 2} for b, w in [(1, 1), (2, 7), (3, 64)]]
                compare(f"Quantize/DequantizeLinear {qt.__name__} per_axis={per_axis} zp={with_zp}", m, feeds)


def mask_feed(form, b, s, p=0, rng_=None):
    """A mask_index / key_padding_mask of the given form for batch b, s queries, p past keys."""
    t = p + s
    if form == "1D":
        return rng.integers(1, t + 1, (b,)).astype(np.int32)
    if form == "2B":
        end = rng.integers(1, t + 1, (b,))
        start = np.array([rng.integers(0, e) for e in end])
        return np.concatenate([end, start]).astype(np.int32)
    if form == "2D":
        m = rng.integers(0, 2, (b, t)).astype(np.int32)
        m[:, 0] = 1
        return m
    if form == "3D":
        m = rng.integers(0, 2, (b, s, t)).astype(np.int32)
        m[:, :, 0] = 1
        return m
    if form == "4D":
        mx = t + 3
        m = rng.integers(0, 2, (b, 1, mx, mx)).astype(np.int32)
        m[..., 0] = 1
        return m
    return None


def test_attention():
    """com.microsoft Attention: constant weights (as the optimizer writes them), bias, every mask
    form, unidirectional, past/present, attention_bias, qkv_hidden_sizes, scale."""
    cases = [
        dict(hid=32, heads=4), dict(hid=12, heads=3, bias=False), dict(hid=32, heads=4, mask="1D"),
        dict(hid=32, heads=4, mask="2B"), dict(hid=32, heads=2, mask="2D"), dict(hid=24, heads=4, mask="3D"),
        dict(hid=32, heads=4, uni=1), dict(hid=32, heads=4, uni=1, mask="2D"),
        dict(hid=16, heads=4, past=True), dict(hid=16, heads=4, past=True, uni=1, mask="2D"),
        dict(hid=20, heads=4, abias=True), dict(hid=20, heads=5, abias=True, mask="1D"),
        dict(hid=12, heads=3, qkv=[12, 12, 18]), dict(hid=32, heads=4, scale=0.3, mask="2D", filt=-1e4 * 3),
        dict(hid=128, heads=2, mask="2D"),  # head size 64 (the two-pass fast kernel)
    ]
    for cs in cases:
        hid, heads, hin = cs["hid"], cs["heads"], cs["hid"] + 3
        qkv = cs.get("qkv") or [hid] * 3
        hs = qkv[0] // heads
        attrs = {"num_heads": heads}
        for k, a in (("uni", "unidirectional"), ("scale", "scale"), ("filt", "mask_filter_value")):
            if k in cs:
                attrs[a] = cs[k]
        if "qkv" in cs:
            attrs["qkv_hidden_sizes"] = qkv
        inits = [numpy_helper.from_array(rand(hin, sum(qkv)) * hin ** -0.5, "W")]
        names = ["X", "W", ""]
        if cs.get("bias", True):
            inits.append(numpy_helper.from_array(rand(sum(qkv)) * 0.3, "bias"))
            names[2] = "bias"
        ins = [io("X", TensorProto.FLOAT, 3)]
        mask = cs.get("mask")
        names.append("mask" if mask else "")
        if mask:
            ins.append(io("mask", TensorProto.INT32, {"1D": 1, "2B": 1, "2D": 2, "3D": 3, "4D": 4}[mask]))
        names.append("past" if cs.get("past") else "")
        if cs.get("past"):
            ins.append(io("past", TensorProto.FLOAT, 5))
        if cs.get("abias"):
            names.append("abias")
            ins.append(io("abias", TensorProto.FLOAT, 4))
        while names[-1] == "":
            names.pop()
        outs = ["Y", "present"] if cs.get("past") else ["Y"]
        m = model(helper.make_node("Attention", names, outs, domain=MS, **attrs), ins, [out(o) for o in outs], inits=inits)
        feeds = []
        for b, s in [(1, 1), (2, 5), (3, 16), (1, 33)]:
            p = 4 if cs.get("past") else 0
            f = {"X": rand(b, s, hin)}
            if mask:
                f["mask"] = mask_feed(mask, b, s, p)
            if cs.get("past"):
                f["past"] = rand(2, b, heads, p, hs)
            if cs.get("abias"):
                f["abias"] = rand(1 if b % 2 else b, heads if s % 2 else 1, s, s + p)
            feeds.append(f)
        compare(f"Attention {cs}", m, feeds, atol=1e-4)
    # the 4-D mask [B, 1, M, M] (Megatron's; ORT's CPU kernel refuses it): against ORT given the
    # 3-D mask it stands for, rows P .. P+S-1 and keys 0 .. T-1
    hin, hid, heads = 19, 16, 2
    for past in (False, True):
        inits = [numpy_helper.from_array(rand(hin, 3 * hid) * hin ** -0.5, "W"), numpy_helper.from_array(rand(3 * hid), "bias")]
        ins = [io("X", TensorProto.FLOAT, 3), io("mask", TensorProto.INT32, 4)] + ([io("past", TensorProto.FLOAT, 5)] if past else [])
        names = ["X", "W", "bias", "mask"] + (["past"] if past else [])
        outs = ["Y", "present"] if past else ["Y"]
        m4 = model(helper.make_node("Attention", names, outs, domain=MS, num_heads=heads), ins, [out(o) for o in outs], inits=inits)
        ins[1] = io("mask", TensorProto.INT32, 3)
        m3 = model(helper.make_node("Attention", names, outs, domain=MS, num_heads=heads), ins, [out(o) for o in outs], inits=inits)
        ref = ort_session(m3)
        sessions = [("fast", kiln.Session(m4.SerializeToString(), num_threads=2)),
                    ("ref", kiln.Session(m4.SerializeToString(), unoptimized=True))]
        for b, s in [(1, 1), (2, 5), (3, 16)]:
            p = 3 if past else 0
            f = {"X": rand(b, s, hin), "mask": mask_feed("4D", b, s, p)}
            if past:
                f["past"] = rand(2, b, heads, p, hid // heads)
            want = ref.run(None, {**f, "mask": np.ascontiguousarray(f["mask"][:, 0, p:p + s, :p + s])})[0]
            for tag, ks in sessions:
                got = ks.run(f)[0]
                check(f"Attention 4-D mask past={past} [{tag}] b={b} s={s}",
                      got.shape == want.shape and np.allclose(got, want, rtol=RTOL, atol=1e-4),
                      f"max diff {np.max(np.abs(got - want)) if got.shape == want.shape else got.shape}")


def test_multihead_attention():
    """com.microsoft MultiHeadAttention: separate Q/K/V (self and cross), bias, key_padding_mask
    forms, attention_bias, past_key/past_value with presents, unidirectional, scale; packed
    forms against the same inputs unpacked (ORT's CPU kernel takes only separate Q/K/V)."""
    cases = [
        dict(), dict(bias=True), dict(cross=True, bias=True), dict(mask="1D"), dict(mask="2D", bias=True),
        dict(mask="3D"), dict(abias=True, mask="2D"), dict(past=True, bias=True), dict(past=True, uni=1, mask="2D"),
        dict(uni=1), dict(scale=0.2, filt=-3e4, mask="2D"), dict(dv=12), dict(bnsh=True, bias=True),
    ]
    heads = 4
    for cs in cases:
        d, dv = 16, cs.get("dv", 16)
        hs, hv = d // heads, dv // heads
        attrs = {"num_heads": heads}
        for k, a in (("uni", "unidirectional"), ("scale", "scale"), ("filt", "mask_filter_value")):
            if k in cs:
                attrs[a] = cs[k]
        names = ["q", "k", "v", "bias" if cs.get("bias") else "", "mask" if cs.get("mask") else "",
                 "abias" if cs.get("abias") else "", "pk" if cs.get("past") else "", "pv" if cs.get("past") else ""]
        rk = 4 if cs.get("bnsh") else 3
        ins = [io("q", TensorProto.FLOAT, 3), io("k", TensorProto.FLOAT, rk), io("v", TensorProto.FLOAT, rk)]
        inits = []
        if cs.get("bias"):
            inits.append(numpy_helper.from_array(rand(2 * d + dv), "bias"))
        if cs.get("mask"):
            ins.append(io("mask", TensorProto.INT32, {"1D": 1, "2D": 2, "3D": 3}[cs["mask"]]))
        if cs.get("abias"):
            ins.append(io("abias", TensorProto.FLOAT, 4))
        if cs.get("past"):
            ins += [io("pk", TensorProto.FLOAT, 4), io("pv", TensorProto.FLOAT, 4)]
        while names[-1] == "":
            names.pop()
        outs = ["Y", "present_key", "present_value"] if cs.get("past") else ["Y"]
        m = model(helper.make_node("MultiHeadAttention", names, outs, domain=MS, **attrs), ins, [out(o) for o in outs],
                  inits=inits)
        feeds = []
        for b, s in [(1, 1), (2, 5), (3, 16), (1, 33)]:
            L = s + 3 if cs.get("cross") or cs.get("bnsh") else s
            p = 2 if cs.get("past") else 0
            if cs.get("bnsh"):
                f = {"q": rand(b, s, d), "k": rand(b, heads, L, hs), "v": rand(b, heads, L, hv)}
            else:
                f = {"q": rand(b, s, d), "k": rand(b, L, d), "v": rand(b, L, dv)}
            if cs.get("mask"):
                f["mask"] = mask_feed(cs["mask"], b, s, p + L - s)
            if cs.get("abias"):
                f["abias"] = rand(b if s % 2 else 1, 1 if b % 2 else heads, s, L + p)
            if cs.get("past"):
                f["pk"], f["pv"] = rand(b, heads, p, hs), rand(b, heads, p, hv)
            feeds.append(f)
        compare(f"MultiHeadAttention {cs}", m, feeds, atol=1e-4)
    # packed QKV [B, S, N, 3, H] and packed KV [B, L, N, 2, H]: the same numbers unpacked through ORT
    for packed in ("qkv", "kv"):
        for with_bias in (False, True):
            d = 16
            hs = d // heads
            bias = rand(3 * d)
            uq = model(helper.make_node("MultiHeadAttention", ["q", "k", "v"] + (["bias"] if with_bias else []), ["Y"],
                                        domain=MS, num_heads=heads),
                       [io("q", TensorProto.FLOAT, 3), io("k", TensorProto.FLOAT, 3), io("v", TensorProto.FLOAT, 3)],
                       [out("Y")], inits=[numpy_helper.from_array(bias, "bias")] if with_bias else [])
            names = ["qkv"] if packed == "qkv" else ["q", "kv"]
            if with_bias:
                names += [""] * (3 - len(names)) + ["bias"]
            ins = [io("qkv", TensorProto.FLOAT, 5)] if packed == "qkv" else [io("q", TensorProto.FLOAT, 3), io("kv", TensorProto.FLOAT, 5)]
            pm = model(helper.make_node("MultiHeadAttention", names, ["Y"], domain=MS, num_heads=heads), ins, [out("Y")],
                       inits=[numpy_helper.from_array(bias, "bias")] if with_bias else [])
            ref = ort_session(uq)
            sessions = [("fast", kiln.Session(pm.SerializeToString(), num_threads=2)),
                        ("ref", kiln.Session(pm.SerializeToString(), unoptimized=True))]
            for b, s in [(1, 1), (2, 5), (3, 16)]:
                q, k, v = rand(b, s, heads, hs), rand(b, s, heads, hs), rand(b, s, heads, hs)
                want = ref.run(None, {"q": q.reshape(b, s, d), "k": k.reshape(b, s, d), "v": v.reshape(b, s, d)})[0]
                feeds = ({"qkv": np.stack([q, k, v], axis=3)} if packed == "qkv"
                         else {"q": q.reshape(b, s, d), "kv": np.stack([k, v], axis=3)})
                for tag, ks in sessions:
                    got = ks.run(feeds)[0]
                    check(f"MultiHeadAttention packed {packed} bias={with_bias} [{tag}] b={b} s={s}",
                          got.shape == want.shape and np.allclose(got, want, rtol=RTOL, atol=1e-4),
                          f"max diff {np.max(np.abs(got - want)) if got.shape == want.shape else got.shape}")


def test_loader_leniencies():
    def relu(inputs=None, outputs=None, inits=(), opsets=(("", 17),), ir=8, nodes=None, vis=()):
        nodes = nodes or [helper.make_node("Relu", ["x"], ["y"])]
        g = helper.make_graph(nodes, "lenient", inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], list(inits),
                              value_info=list(vis))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
        m.ir_version = ir
        return m

    feeds = [{"x": rand(2, 3)}]
    m = relu()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    m.graph.output[0].type.tensor_type.shape.dim[1].dim_value = -1
    compare("negative dim_value on input and output", m, [{"x": rand(2, 3)}, {"x": rand(5, 3)}])
    two = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Sigmoid", ["t"], ["y"])]
    compare("value_info partial (no shape)", relu(nodes=two, vis=[helper.make_tensor_value_info("t", TensorProto.FLOAT, None)]), feeds)
    m = relu(nodes=two, vis=[helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])])
    m.graph.value_info[0].type.tensor_type.shape.dim[0].dim_value = -1
    compare("value_info with a negative dim", m, feeds)
    compare("no value_info, untyped output", relu(nodes=two, outputs=[out("y")]), feeds)
    compare("unused opset imports", relu(opsets=(("", 17), ("com.example", 3), ("ai.onnx.ml", 2), (MS, 1))), feeds)
    compare("only com.microsoft imported (ONNX at the newest)", relu(opsets=((MS, 1),)), feeds)
    compare("com.microsoft node without its import",
            relu(nodes=[helper.make_node("Gelu", ["x"], ["y"], domain=MS)]), feeds)
    compare("duplicate opset import", relu(opsets=(("", 17), ("", 13))), feeds)
    for ir in range(3, 11):
        compare(f"IR version {ir}", relu(ir=ir), feeds)
    w = rand(2, 3)
    add = [helper.make_node("Add", ["x", "w"], ["y"])]
    m = relu(nodes=add, inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3])],
             inits=[numpy_helper.from_array(w, "w")], ir=4)
    compare("initializer listed as an input (default)", m, [{"x": rand(2, 3)}])
    compare("initializer listed as an input (overridden)", m, [{"x": rand(2, 3), "w": rand(2, 3)}])
    compare("IR 3 initializer not an input", relu(nodes=add, inits=[numpy_helper.from_array(w, "w")], ir=3), feeds)
    m = relu(inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                     helper.make_tensor_value_info("unused", TensorProto.FLOAT, [4])])
    compare("unused graph input (fed)", m, [{"x": rand(2, 3), "unused": rand(4)}])
    # refused by ORT, refused by kiln with the cause named
    try:
        kiln.Session(relu(opsets=()).SerializeToString())
        check("empty opset_import is refused", False, "kiln loaded it")
    except kiln.KilnError as e:
        check("empty opset_import is refused", "opset" in str(e), str(e))


def test_transformer_optimizer(cli):
    """A small BERT-style encoder (embeddings, attention with a mask, erf Gelu, post-LayerNorm)
    through ORT's transformer optimizer: the fused file loads in kiln, `kiln info` lists no
    unsupported operator, outputs match ORT."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model
    import onnxruntime.transformers.onnx_model as om  # noqa: F401

    H, heads, V, P, L = 32, 4, 30, 16, 2
    nodes, inits = [], []

    def w(name, shape, scale=0.2):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def c(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(op, ins, outn, **kw):
        nodes.append(helper.make_node(op, ins, [outn], **kw))
        return outn

    def layer_norm(x, tag):
        g = c(f"{tag}_g", (1 + rng.standard_normal(H) * 0.1).astype(np.float32))
        b = w(f"{tag}_b", (H,), 0.1)
        return node("LayerNormalization", [x, g, b], f"{tag}_out", axis=-1, epsilon=1e-12)

    we = node("Gather", [w("word_embeddings", (V, H), 1.0), "input_ids"], "we")
    shape = node("Shape", ["input_ids"], "ids_shape")
    seq = node("Gather", [shape, c("one", np.array(1, np.int64))], "seq_len")
    pos_ids = node("Unsqueeze", [node("Range", [c("zero_i", np.array(0, np.int64)), seq, c("one_i", np.array(1, np.int64))], "pos_range"), c("ax0", np.array([0], np.int64))], "pos_ids")
    pe = node("Gather", [w("position_embeddings", (P, H), 0.5), pos_ids], "pe")
    se = node("Gather", [w("token_type_embeddings", (2, H), 0.5), "token_type_ids"], "se")
    x = node("Add", [node("Add", [we, pe], "wpe"), se], "emb")
    x = layer_norm(x, "emb_ln")
    # mask: (1 - mask) * -10000, broadcast to [B, 1, 1, S]
    # as torch exports mask[:, None, None, :].to(float): two Unsqueezes, then the Cast
    m4 = node("Unsqueeze", ["attention_mask", c("ax1", np.array([1], np.int64))], "mask3")
    m4 = node("Cast", [node("Unsqueeze", [m4, c("ax2", np.array([2], np.int64))], "mask4i")], "mask4", to=TensorProto.FLOAT)
    madd = node("Mul", [node("Sub", [c("one_f", np.array(1.0, np.float32)), m4], "mask_inv"), c("neg", np.array(-10000.0, np.float32))], "mask_add")
    hd = H // heads
    for i in range(L):
        def proj(t, src):
            y = node("Add", [node("MatMul", [src, w(f"l{i}_{t}_w", (H, H), H ** -0.5)], f"l{i}_{t}_mm"), w(f"l{i}_{t}_b", (H,), 0.1)], f"l{i}_{t}")
            y = node("Reshape", [y, c(f"l{i}_{t}_shape", np.array([0, 0, heads, hd], np.int64))], f"l{i}_{t}_r")
            return node("Transpose", [y], f"l{i}_{t}_t", perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3])
        q, k, v = proj("q", x), proj("k", x), proj("v", x)
        s = node("Div", [node("MatMul", [q, k], f"l{i}_qk"), c(f"l{i}_sqrt", np.array(np.sqrt(hd), np.float32))], f"l{i}_scaled")
        s = node("Add", [s, madd], f"l{i}_masked")
        p = node("Softmax", [s], f"l{i}_probs", axis=3)
        ctx = node("Transpose", [node("MatMul", [p, v], f"l{i}_ctx")], f"l{i}_ctx_t", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, c(f"l{i}_ctx_shape", np.array([0, 0, H], np.int64))], f"l{i}_ctx_r")
        o = node("Add", [node("MatMul", [ctx, w(f"l{i}_o_w", (H, H), H ** -0.5)], f"l{i}_o_mm"), w(f"l{i}_o_b", (H,), 0.1)], f"l{i}_o")
        x = layer_norm(node("Add", [o, x], f"l{i}_res1"), f"l{i}_ln1")
        f1 = node("Add", [node("MatMul", [x, w(f"l{i}_f1_w", (H, 4 * H), H ** -0.5)], f"l{i}_f1_mm"), w(f"l{i}_f1_b", (4 * H,), 0.1)], f"l{i}_f1")
        ge = node("Mul", [node("Mul", [f1, node("Add", [node("Erf", [node("Div", [f1, c(f"l{i}_sqrt2", np.array(np.sqrt(2), np.float32))], f"l{i}_g_div")], f"l{i}_g_erf"), c(f"l{i}_g_one", np.array(1.0, np.float32))], f"l{i}_g_add")], f"l{i}_g_mul"), c(f"l{i}_g_half", np.array(0.5, np.float32))], f"l{i}_gelu")
        f2 = node("Add", [node("MatMul", [ge, w(f"l{i}_f2_w", (4 * H, H), (4 * H) ** -0.5)], f"l{i}_f2_mm"), w(f"l{i}_f2_b", (H,), 0.1)], f"l{i}_f2")
        x = layer_norm(node("Add", [f2, x], f"l{i}_res2"), f"l{i}_ln2")
    nodes[-1].output[0] = "last_hidden_state"
    i64 = TensorProto.INT64
    g = helper.make_graph(nodes, "bert", [helper.make_tensor_value_info(n, i64, ["batch", "seq"]) for n in
                                          ("input_ids", "attention_mask", "token_type_ids")],
                          [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", H])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    m.ir_version = 8
    opts = FusionOptions("bert")
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "bert.onnx"), os.path.join(d, "bert_opt.onnx")
        onnx.save(m, src)
        opt = optimize_model(src, model_type="bert", num_heads=heads, hidden_size=H, optimization_options=opts,
                             opt_level=0)
        opt.save_model_to_file(dst)
        fused = sorted({n.op_type for n in opt.model.graph.node if n.domain == MS})
        check("optimize_model fused com.microsoft operators", len(fused) >= 2, f"fused: {fused}")
        check("optimize_model fused the attention", "Attention" in fused or "MultiHeadAttention" in fused, f"fused: {fused}")
        print(f"  optimized BERT-style encoder: com.microsoft {fused}")
        if cli:
            r = subprocess.run([cli, "info", dst], capture_output=True, text=True)
            text = r.stdout + r.stderr
            check("kiln info on the optimized encoder", r.returncode == 0 and "unsupported operators: none" in text,
                  text[-400:])
        om_ = onnx.load(dst)
        feeds = []
        for b, s in [(1, 1), (2, 7), (3, 16)]:
            mask = np.ones((b, s), np.int64)
            mask[:, s // 2 + 1:] = rng.integers(0, 2, (b, s - s // 2 - 1))
            feeds.append({"input_ids": rng.integers(0, V, (b, s)).astype(np.int64), "attention_mask": mask,
                          "token_type_ids": rng.integers(0, 2, (b, s)).astype(np.int64)})
        compare("BERT-style encoder after optimize_model", om_, feeds, atol=1e-4)


if __name__ == "__main__":
    cli = sys.argv[1] if len(sys.argv) > 1 else None
    for t in [test_loader_leniencies, test_gelu_family, test_bias_add, test_skip_layer_norm, test_embed_layer_norm,
              test_fused_matmul, test_fused_gemm, test_fused_conv, test_quant, test_attention,
              test_multihead_attention]:
        t()
    test_transformer_optimizer(cli)
    sys.exit(summary())
