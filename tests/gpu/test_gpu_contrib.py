#!/usr/bin/env python3
"""test_gpu_contrib.py - the GPU 'contrib' family (src/gpu/ops_contrib.c): the float com.microsoft
operators of ONNX Runtime's transformer optimizer and offline files, on the CUDA provider against
the CPU reference (an unoptimized CPU session) and ONNX Runtime's CPU provider where it runs the
case, on random data (never zeros), float32 and float16, several shapes each (odd sizes, batch
> 1, one session fed several shapes):

Gelu, FastGelu (with and without bias), BiasGelu, QuickGelu (alpha), BiasAdd,
SkipLayerNormalization (beta and bias optional, every output, skip as input's shape, [S, H] and
[1, S, H], 2-D input), EmbedLayerNormalization (segments, mask, position_ids [B, S] and [1, S],
mask_index and embedding_sum), FusedMatMul (alpha, transA/transB, transBatchA/transBatchB,
broadcast batches, 1-D operands), FusedGemm (activations, C as [N] and [M, N], transposes),
FusedConv (Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid; Z; 1-D and 2-D; groups, strides,
pads), Attention (every mask_index form, unidirectional, past/present, qkv_hidden_sizes,
attention_bias, scale) and MultiHeadAttention (separate Q/K/V with and without bias, packed QKV,
packed KV, key/value as [B, N, L, H], key_padding_mask, attention_bias, past/present, the qk
output); two small multi-node models (a BERT-like encoder layer from EmbedLayerNormalization to
SkipLayerNormalization, and a FusedConv -> FusedConv(Z) -> FusedGemm head). Each model checks
that its com.microsoft nodes are placed on the GPU and that the session has no node falling back
to the CPU (nodes_fallback 0); the mixed-dtype and float64 cases check the refusal (on the CPU).

usage: KILN_LIB=<build>/libkiln.so test_gpu_contrib.py   (prints SKIP without a GPU)
  KILN_GPU_TEST_PROVIDER=cpu  puts the "GPU" sessions on the CPU: checks the test itself (model
                              building, feeds, ORT comparisons) on a machine without a GPU
  KILN_GPU_CONTRIB_TESTS="ew norm mm attn conv model" picks parts
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from checks import check, run_feeds, skip_without, summary  # noqa: E402
import kiln  # noqa: E402

try:
    import onnxruntime as ort
except ImportError:  # the reference alone
    ort = None

PROVIDER = os.environ.get("KILN_GPU_TEST_PROVIDER", "cuda")
PARTS = os.environ.get("KILN_GPU_CONTRIB_TESTS", "ew norm mm attn conv model").split()
MS = "com.microsoft"
CONTRIB_OPS = {"Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd", "SkipLayerNormalization",
               "EmbedLayerNormalization", "FusedMatMul", "FusedGemm", "FusedConv", "Attention", "MultiHeadAttention"}
ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE,
        np.int32: TensorProto.INT32, np.int64: TensorProto.INT64}
# error allowed relative to the output's magnitude (max |reference|, at least 1), and absolute
TOL = {np.float32: (1e-4, 1e-4), np.float16: (1e-2, 1e-2), np.float64: (1e-9, 1e-9)}
DTYPES = (np.float32, np.float16)
rng = np.random.default_rng(3030)


def rand(*shape, dtype=np.float32, scale=1.0, shift=0.0):
    a = rng.standard_normal(shape) * scale + shift
    a[a == 0] = 0.5
    return a.astype(dtype)


def dname(dt):
    return np.dtype(dt).name


def vi(name, dt, shape):
    return helper.make_tensor_value_info(name, ELEM[dt], shape)


def model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "contrib", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def init(name, a):
    return numpy_helper.from_array(a, name)


def ort_session(m):
    if ort is None:
        return None
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def compare(name, m, feeds_list, dt, on_gpu=True, ort_too=True, tol=None):
    """The provider's session vs the CPU reference (and ORT where it runs the feed) on every feed;
    a feed the reference refuses must be refused there too. on_gpu: whether the model's
    com.microsoft nodes must be on the GPU with no node falling back (False: refused, on the CPU)."""
    rtol, atol = tol or TOL[dt]
    blob = m.SerializeToString()
    try:
        gpu = kiln.Session(blob, provider=PROVIDER)
    except kiln.KilnError as e:
        check(f"{name}: create {PROVIDER} session", False, str(e))
        return
    ref = kiln.Session(blob, unoptimized=True, provider="cpu")
    if PROVIDER == "cuda":
        nodes = gpu.nodes()
        placed = [(op, prov) for _, op, prov in nodes if op in CONTRIB_OPS]
        want = "cuda" if on_gpu else "cpu"
        check(f"{name}: com.microsoft nodes on {want}", placed and all(p == want for _, p in placed), placed)
        if on_gpu:
            st = gpu.stats()
            check(f"{name}: no node falls back to the CPU", st["nodes_fallback"] == 0,
                  f"nodes_fallback {st['nodes_fallback']}: {[(op, p) for _, op, p in nodes if p == 'cpu']}")
    ort_s = None
    if ort_too:
        try:
            ort_s = ort_session(m)
        except Exception:  # noqa: BLE001 - ORT's CPU provider lacks the case: the reference alone
            ort_s = None
    run_feeds(name, gpu, ref, feeds_list, rtol, atol, PROVIDER, ort_s)


# ---------------------------------------------------------------- the Gelu family, BiasAdd

def test_gelu():
    shapes = [(2, 3, 7), (1, 5, 64), (3, 1, 33), (4, 129)]
    cases = [("Gelu", False, {}), ("FastGelu", False, {}), ("FastGelu", True, {}), ("BiasGelu", True, {}),
             ("QuickGelu", False, {}), ("QuickGelu", False, {"alpha": 1.0})]
    for dt in DTYPES:
        for op, with_bias, attrs in cases:
            for rank in (2, 3):
                dims = [f"d{i}" for i in range(rank)]
                ins = [vi("X", dt, dims)] + ([vi("B", dt, [dims[-1]])] if with_bias else [])
                node = helper.make_node(op, [i.name for i in ins], ["Y"], domain=MS, **attrs)
                m = model([node], ins, [vi("Y", dt, None)])
                feeds = []
                for s in shapes:
                    if len(s) != rank:
                        continue
                    f = {"X": rand(*s, dtype=dt, scale=2.0)}
                    if with_bias:
                        f["B"] = rand(s[-1], dtype=dt)
                    feeds.append(f)
                compare(f"{op} bias={with_bias} {attrs} rank {rank} {dname(dt)}", m, feeds, dt)


def test_bias_add():
    for dt in DTYPES:
        ins = [vi("X", dt, ["n", "s", "c"]), vi("B", dt, ["c"]), vi("S", dt, ["n", "s", "c"])]
        m = model([helper.make_node("BiasAdd", ["X", "B", "S"], ["Y"], domain=MS)], ins, [vi("Y", dt, None)])
        feeds = [{"X": rand(*s, dtype=dt), "B": rand(s[2], dtype=dt), "S": rand(*s, dtype=dt)}
                 for s in [(2, 3, 8), (1, 7, 33), (3, 4, 320)]]
        compare(f"BiasAdd {dname(dt)}", m, feeds, dt)


# ---------------------------------------------------------------- layer normalizations

def skip_ln_model(dt, beta, bias, outs, skip_dims, x_rank=3, eps=None):
    xd = ["b", "s", "h"][3 - x_rank:]
    ins = [vi("X", dt, xd), vi("SK", dt, skip_dims), vi("G", dt, ["h"])]
    names = ["X", "SK", "G"]
    if beta:
        ins.append(vi("BE", dt, ["h"]))
    names.append("BE" if beta else "")
    if bias:
        ins.append(vi("BI", dt, ["h"]))
        names.append("BI")
    while names and names[-1] == "":
        names.pop()
    stat = np.float32 if dt != np.float64 else np.float64
    out_names = ["Y", "M" if outs > 1 else "", "I" if outs > 2 else "", "SUM" if outs > 3 else ""]
    while out_names[-1] == "":
        out_names.pop()
    outputs = [vi("Y", dt, None)]
    if outs > 1:
        outputs.append(vi("M", stat, None))
    if outs > 2:
        outputs.append(vi("I", stat, None))
    if outs > 3:
        outputs.append(vi("SUM", dt, None))
    attrs = {} if eps is None else {"epsilon": eps}
    node = helper.make_node("SkipLayerNormalization", names, out_names, domain=MS, **attrs)
    return model([node], ins, outputs)


def skip_feeds(dt, shapes, beta, bias, skip_form):
    feeds = []
    for s in shapes:
        h = s[-1]
        sk = {"same": s, "sh": s[-2:], "1sh": (1,) + tuple(s[-2:])}[skip_form]
        f = {"X": rand(*s, dtype=dt, scale=2.0, shift=0.3), "SK": rand(*sk, dtype=dt), "G": rand(h, dtype=dt)}
        if beta:
            f["BE"] = rand(h, dtype=dt)
        if bias:
            f["BI"] = rand(h, dtype=dt)
        feeds.append(f)
    return feeds


def test_skip_ln():
    shapes = [(2, 3, 16), (1, 7, 33), (3, 5, 768)]
    for dt in DTYPES:
        for beta, bias, outs in [(True, True, 1), (True, False, 4), (False, True, 4), (False, False, 2), (True, True, 3)]:
            m = skip_ln_model(dt, beta, bias, outs, ["b", "s", "h"], eps=1e-5)
            compare(f"SkipLayerNormalization beta={beta} bias={bias} outputs={outs} {dname(dt)}", m,
                    skip_feeds(dt, shapes, beta, bias, "same"), dt)
        for form, dims in [("sh", ["s", "h"]), ("1sh", [1, "s", "h"])]:
            m = skip_ln_model(dt, True, True, 4, dims)
            compare(f"SkipLayerNormalization skip {form} {dname(dt)}", m, skip_feeds(dt, shapes, True, True, form), dt)
        m = skip_ln_model(dt, True, False, 4, ["s", "h"], x_rank=2)
        compare(f"SkipLayerNormalization 2-D {dname(dt)}", m,
                [{"X": rand(*s, dtype=dt), "SK": rand(*s, dtype=dt), "G": rand(s[1], dtype=dt), "BE": rand(s[1], dtype=dt)}
                 for s in [(5, 16), (9, 65)]], dt)
    # float64: refused (the CPU)
    m = skip_ln_model(np.float64, True, True, 1, ["b", "s", "h"])
    compare("SkipLayerNormalization float64 (refused)", m, skip_feeds(np.float64, [(2, 3, 8)], True, True, "same"),
            np.float64, on_gpu=False, ort_too=False)


def embed_model(dt, seg, mask, pos, outs, V=50, P=40, G=3, H=32, gamma_dt=None, ids_dt=np.int32):
    gamma_dt = gamma_dt or dt
    inits = [init("WE", rand(V, H, dtype=dt)), init("PE", rand(P, H, dtype=dt)), init("GA", rand(H, dtype=gamma_dt)),
             init("BE", rand(H, dtype=gamma_dt))]
    ins = [vi("ids", ids_dt, ["b", "s"])]
    names = ["ids", "seg" if seg else "", "WE", "PE", "SE" if seg else "", "GA", "BE", "mask" if mask else "",
             "pos" if pos else ""]
    if seg:
        ins.append(vi("seg", ids_dt, ["b", "s"]))
        inits.append(init("SE", rand(G, H, dtype=dt)))
    if mask:
        ins.append(vi("mask", np.int32, ["b", "s"]))
    if pos:
        ins.append(vi("pos", ids_dt, [pos, "s"]))
    while names[-1] == "":
        names.pop()
    out_names = ["Y", "MI" if outs > 1 else "", "SUM" if outs > 2 else ""]
    while out_names[-1] == "":
        out_names.pop()
    outputs = [vi("Y", dt, None)] + ([vi("MI", np.int32, None)] if outs > 1 else []) + \
              ([vi("SUM", dt, None)] if outs > 2 else [])
    node = helper.make_node("EmbedLayerNormalization", names, out_names, domain=MS, epsilon=1e-5)
    return model([node], ins, outputs, inits)


def embed_feeds(shapes, seg, mask, pos, V=50, P=40, G=3, ids_dt=np.int32):
    feeds = []
    for b, s in shapes:
        f = {"ids": rng.integers(0, V, (b, s)).astype(ids_dt)}
        if seg:
            f["seg"] = rng.integers(0, G, (b, s)).astype(ids_dt)
        if mask:
            mk = np.ones((b, s), np.int32)
            for i in range(b):
                mk[i, rng.integers(1, s + 1):] = 0
            f["mask"] = mk
        if pos:
            f["pos"] = rng.integers(0, P, (1 if pos == 1 else b, s)).astype(ids_dt)
        feeds.append(f)
    return feeds


def test_embed_ln():
    shapes = [(2, 7), (1, 16), (3, 5)]
    for dt in DTYPES:
        for seg, mask, pos, outs in [(True, True, None, 2), (False, False, None, 1), (True, True, "b", 3),
                                     (False, True, 1, 3), (True, False, None, 3)]:
            m = embed_model(dt, seg, mask, pos, outs)
            compare(f"EmbedLayerNormalization seg={seg} mask={mask} pos={pos} outputs={outs} {dname(dt)}", m,
                    embed_feeds(shapes, seg, mask, pos), dt)
    m = embed_model(np.float32, True, True, None, 3, ids_dt=np.int64)
    compare("EmbedLayerNormalization int64 ids", m, embed_feeds(shapes, True, True, None, ids_dt=np.int64), np.float32,
            ort_too=False)
    # gamma/beta of another dtype than the tables: refused (the CPU)
    m = embed_model(np.float32, True, True, None, 2, gamma_dt=np.float16)
    compare("EmbedLayerNormalization float16 gamma (refused)", m, embed_feeds(shapes, True, True, None), np.float32,
            on_gpu=False, ort_too=False)


# ---------------------------------------------------------------- FusedMatMul

def test_fused_matmul():
    # (A shape, B shape, attributes)
    cases = [((5, 7), (7, 3), {}),
             ((7, 5), (7, 3), {"transA": 1}),
             ((5, 7), (3, 7), {"transB": 1, "alpha": 0.5}),
             ((7, 5), (3, 7), {"transA": 1, "transB": 1, "alpha": -1.25}),
             ((2, 5, 7), (7, 3), {"alpha": 2.0}),
             ((2, 5, 7), (2, 7, 3), {}),
             ((3, 1, 5, 7), (4, 7, 6), {"transB": 0}),
             ((2, 3, 7, 5), (3, 6, 7), {"transA": 1, "transB": 1}),
             ((5, 2, 7), (2, 7, 3), {"transBatchA": 1}),
             ((2, 5, 7), (7, 2, 3), {"transBatchB": 1}),
             ((5, 2, 7), (3, 2, 7), {"transBatchA": 1, "transBatchB": 1, "transB": 1, "alpha": 0.75}),
             ((5, 3, 2, 7), (3, 2, 7, 4), {"transBatchA": 1}),
             ((7,), (7, 3), {}),
             ((2, 5, 7), (7,), {"alpha": 3.0}),
             ((1, 33, 65), (65, 17), {})]
    for dt in DTYPES:
        for a, b, attrs in cases:
            ins = [vi("A", dt, list(a)), vi("B", dt, list(b))]
            m = model([helper.make_node("FusedMatMul", ["A", "B"], ["Y"], domain=MS, **attrs)], ins, [vi("Y", dt, None)])
            compare(f"FusedMatMul {a} x {b} {attrs} {dname(dt)}", m,
                    [{"A": rand(*a, dtype=dt), "B": rand(*b, dtype=dt)}], dt)
    # one session, several shapes
    ins = [vi("A", np.float32, ["b", "m", "k"]), vi("B", np.float32, ["k", "n"])]
    m = model([helper.make_node("FusedMatMul", ["A", "B"], ["Y"], domain=MS, alpha=0.3, transB=0)], ins,
              [vi("Y", np.float32, None)])
    compare("FusedMatMul symbolic dims", m, [{"A": rand(b, mm, k), "B": rand(k, n)}
                                              for b, mm, k, n in [(1, 4, 8, 3), (3, 17, 31, 9), (2, 1, 64, 128)]],
            np.float32)


# ---------------------------------------------------------------- FusedGemm, FusedConv

GEMM_ACTS = [("Relu", {}), ("Tanh", {}), ("Sigmoid", {}), ("LeakyRelu", {"activation_alpha": 0.1}),
             ("HardSigmoid", {"activation_alpha": 0.2, "activation_beta": 0.5}), ("Softplus", {}),
             ("Elu", {"activation_alpha": 0.7}), ("Selu", {"activation_alpha": 1.6, "activation_gamma": 1.05}),
             ("Softsign", {}), ("ThresholdedRelu", {"activation_alpha": 0.3}),
             ("ScaledTanh", {"activation_alpha": 1.5, "activation_beta": 0.5}),
             ("ParametricSoftplus", {"activation_alpha": 1.2, "activation_beta": 0.8})]


def test_fused_gemm():
    for dt in DTYPES:
        for k, (act, aattrs) in enumerate(GEMM_ACTS):
            ta, tb = k % 2, (k // 2) % 2
            c_full = k % 3 == 0
            M, K, N = [(5, 7, 3), (17, 33, 9), (1, 64, 65)][k % 3]
            a = (K, M) if ta else (M, K)
            b = (N, K) if tb else (K, N)
            cs = (M, N) if c_full else (N,)
            attrs = dict(activation=act, transA=ta, transB=tb, alpha=0.8, beta=1.3, **aattrs)
            ins = [vi("A", dt, list(a)), vi("B", dt, list(b)), vi("C", dt, list(cs))]
            m = model([helper.make_node("FusedGemm", ["A", "B", "C"], ["Y"], domain=MS, **attrs)], ins, [vi("Y", dt, None)])
            compare(f"FusedGemm {act} {a} {b} C{cs} {dname(dt)}", m,
                    [{"A": rand(*a, dtype=dt), "B": rand(*b, dtype=dt), "C": rand(*cs, dtype=dt)}], dt)
        ins = [vi("A", dt, [6, 10]), vi("B", dt, [10, 4])]
        m = model([helper.make_node("FusedGemm", ["A", "B"], ["Y"], domain=MS, activation="Relu")], ins, [vi("Y", dt, None)])
        compare(f"FusedGemm no C {dname(dt)}", m, [{"A": rand(6, 10, dtype=dt), "B": rand(10, 4, dtype=dt)}], dt)


CONV_ACTS = [("Relu", []), ("Tanh", []), ("Sigmoid", []), ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.7]),
             ("HardSigmoid", [0.2, 0.5])]


def test_fused_conv():
    # (X shape, W shape, conv attributes)
    geos = [((2, 3, 9, 11), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
            ((1, 4, 8, 8), (6, 2, 3, 3), {"group": 2, "strides": [2, 2]}),
            ((2, 4, 7, 7), (4, 1, 3, 3), {"group": 4, "pads": [1, 0, 1, 2]}),
            ((3, 5, 6, 6), (8, 5, 1, 1), {}),
            ((2, 3, 17), (5, 3, 3), {"dilations": [2], "pads": [2, 2]})]
    for dt in DTYPES:
        for k, (act, params) in enumerate(CONV_ACTS):
            for g, (xs, ws, cattrs) in enumerate(geos):
                if (k + g) % 2:  # half the pairs: every activation, every geometry, both Z forms
                    continue
                with_z = (k + g) % 4 == 0
                attrs = dict(activation=act, **cattrs)
                if params:
                    attrs["activation_params"] = params
                inits = [init("W", rand(*ws, dtype=dt, scale=0.5)), init("Bc", rand(ws[0], dtype=dt))]
                ins = [vi("X", dt, list(xs))]
                names = ["X", "W", "Bc"]
                feed = {"X": rand(*xs, dtype=dt)}
                if with_z:
                    ref = kiln.Session(model([helper.make_node("Conv", ["X", "W", "Bc"], ["Y"], **cattrs)], ins,
                                             [vi("Y", dt, None)], inits).SerializeToString(), provider="cpu")
                    zs = ref.run(feed)[0].shape
                    ins.append(vi("Z", dt, list(zs)))
                    names.append("Z")
                    feed["Z"] = rand(*zs, dtype=dt)
                m = model([helper.make_node("FusedConv", names, ["Y"], domain=MS, **attrs)], ins, [vi("Y", dt, None)], inits)
                compare(f"FusedConv {act} {xs} {ws} {cattrs} Z={with_z} {dname(dt)}", m, [feed], dt)


# ---------------------------------------------------------------- Attention, MultiHeadAttention

def mask_feed(form, B, S, P, T):
    if form == "1d":
        return rng.integers(1, T + 1, (B,)).astype(np.int32)
    if form == "2b":
        ends = rng.integers(T // 2 + 1, T + 1, (B,))
        starts = rng.integers(0, T // 2 + 1, (B,))
        return np.concatenate([ends, starts]).astype(np.int32)
    if form == "2d":
        m = (rng.random((B, T)) > 0.3).astype(np.int32)
        m[:, 0] = 1
        return m
    if form == "3d":
        m = (rng.random((B, S, T)) > 0.3).astype(np.int32)
        m[:, :, 0] = 1
        return m
    if form == "4d":
        M = T + 3
        m = (rng.random((B, 1, M, M)) > 0.3).astype(np.int32)
        m[..., 0] = 1
        return m
    return None


def attention_case(dt, B, S, Hin, N, H, mask=None, unidir=0, P=0, qkv=None, ab=None, scale=None, present=False):
    Dq = Dk = N * H
    Dv = qkv[2] if qkv else N * H
    D = Dq + Dk + Dv
    T = P + S
    inits = [init("W", rand(Hin, D, dtype=dt, scale=Hin ** -0.5)), init("BI", rand(D, dtype=dt, scale=0.2))]
    ins = [vi("X", dt, ["b", "s", Hin])]
    names = ["X", "W", "BI"]
    feed = {"X": rand(B, S, Hin, dtype=dt)}
    m_arr = mask_feed(mask, B, S, P, T)
    names.append("mask" if m_arr is not None else "")
    if m_arr is not None:
        ins.append(vi("mask", np.int32, list(m_arr.shape)))
        feed["mask"] = m_arr
    names.append("past" if P else "")
    if P:
        ins.append(vi("past", dt, [2, B, N, P, H]))
        feed["past"] = rand(2, B, N, P, H, dtype=dt)
    if ab:
        names.append("ab")
        shp = [ab[0], ab[1], S, T]
        ins.append(vi("ab", dt, shp))
        feed["ab"] = rand(*shp, dtype=dt)
    while names[-1] == "":
        names.pop()
    attrs = {"num_heads": N}
    if unidir:
        attrs["unidirectional"] = 1
    if qkv:
        attrs["qkv_hidden_sizes"] = list(qkv)
    if scale:
        attrs["scale"] = scale
    outs = ["Y"] + (["present"] if present else [])
    outputs = [vi("Y", dt, None)] + ([vi("present", dt, None)] if present else [])
    m = model([helper.make_node("Attention", names, outs, domain=MS, **attrs)], ins, outputs, inits)
    return m, feed


def test_attention():
    cases = [dict(B=2, S=5, Hin=16, N=2, H=8),
             dict(B=1, S=7, Hin=24, N=3, H=8, mask="1d"),
             dict(B=3, S=6, Hin=32, N=4, H=8, mask="2b"),
             dict(B=2, S=9, Hin=20, N=2, H=10, mask="2d"),
             dict(B=2, S=4, Hin=16, N=2, H=8, mask="3d"),
             dict(B=2, S=4, Hin=16, N=2, H=8, mask="4d"),
             dict(B=2, S=6, Hin=16, N=4, H=4, unidir=1),
             dict(B=2, S=5, Hin=16, N=2, H=8, unidir=1, mask="2d"),
             dict(B=2, S=3, Hin=16, N=2, H=8, P=4, mask="2d", present=True),
             dict(B=1, S=1, Hin=16, N=2, H=8, P=9, unidir=1, present=True),
             dict(B=2, S=5, Hin=24, N=2, H=8, qkv=(16, 16, 24)),
             dict(B=2, S=5, Hin=16, N=2, H=8, ab=(1, 2)),
             dict(B=2, S=5, Hin=16, N=2, H=8, ab=(2, 1), mask="1d", scale=0.2),
             dict(B=2, S=33, Hin=64, N=4, H=16, mask="2d"),
             dict(B=1, S=128, Hin=64, N=1, H=64, unidir=1)]
    for dt in DTYPES:
        for kw in cases:
            m, feed = attention_case(dt, **kw)
            compare(f"Attention {kw} {dname(dt)}", m, [feed], dt)
    # one session over several batch and sequence lengths
    m, _ = attention_case(np.float32, 2, 4, 16, 2, 8, mask="2d")
    feeds = []
    for B, S in [(1, 3), (2, 11), (4, 1)]:
        feeds.append({"X": rand(B, S, 16), "mask": mask_feed("2d", B, S, 0, S)})
    m.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "b"
    m.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "t"
    compare("Attention symbolic shapes", m, feeds, np.float32)


def mha_case(dt, form, B, S, L, N, H, Hv=None, bias=False, mask=None, ab=None, P=0, present=False, qk=False,
             unidir=0, scale=None):
    Hv = Hv or H
    feed, ins = {}, []
    names = ["q", "", ""]
    if form == "qkv":
        feed["q"], feed["k"], feed["v"] = rand(B, S, N * H, dtype=dt), rand(B, L, N * H, dtype=dt), rand(B, L, N * Hv, dtype=dt)
        names = ["q", "k", "v"]
    elif form == "packed_qkv":
        feed["q"] = rand(B, S, N, 3, H, dtype=dt)
    elif form == "packed_kv":
        feed["q"], feed["k"] = rand(B, S, N * H, dtype=dt), rand(B, L, N, 2, H, dtype=dt)
        names = ["q", "k", ""]
    else:  # bnsh
        feed["q"], feed["k"], feed["v"] = rand(B, S, N * H, dtype=dt), rand(B, N, L, H, dtype=dt), rand(B, N, L, Hv, dtype=dt)
        names = ["q", "k", "v"]
    for nm in ("q", "k", "v"):
        if nm in feed:
            ins.append(vi(nm, dt, list(feed[nm].shape)))
    inits = []
    names.append("BI" if bias else "")
    if bias:
        inits.append(init("BI", rand(N * (2 * H + Hv), dtype=dt, scale=0.3)))
    T = P + L
    m_arr = None
    if mask == "2d":
        m_arr = (rng.random((B, T)) > 0.3).astype(np.int32)
        m_arr[:, 0] = 1
    elif mask == "1d":
        m_arr = rng.integers(1, T + 1, (B,)).astype(np.int32)
    names.append("mask" if m_arr is not None else "")
    if m_arr is not None:
        feed["mask"] = m_arr
        ins.append(vi("mask", np.int32, list(m_arr.shape)))
    names.append("ab" if ab else "")
    if ab:
        feed["ab"] = rand(ab[0], ab[1], S, T, dtype=dt)
        ins.append(vi("ab", dt, list(feed["ab"].shape)))
    if P:
        names += ["pk", "pv"]
        feed["pk"], feed["pv"] = rand(B, N, P, H, dtype=dt), rand(B, N, P, Hv, dtype=dt)
        ins += [vi("pk", dt, [B, N, P, H]), vi("pv", dt, [B, N, P, Hv])]
    while names[-1] == "":
        names.pop()
    outs = ["Y", "PK" if present else "", "PV" if present else "", "QK" if qk else ""]
    while outs[-1] == "":
        outs.pop()
    outputs = [vi(o, dt, None) for o in outs if o]
    attrs = {"num_heads": N}
    if unidir:
        attrs["unidirectional"] = 1
    if scale:
        attrs["scale"] = scale
    m = model([helper.make_node("MultiHeadAttention", names, outs, domain=MS, **attrs)], ins, outputs, inits)
    return m, feed


def test_mha():
    cases = [dict(form="qkv", B=2, S=5, L=7, N=2, H=8),
             dict(form="qkv", B=2, S=5, L=5, N=3, H=8, Hv=12, bias=True, mask="2d"),
             dict(form="qkv", B=1, S=6, L=9, N=2, H=16, mask="1d", scale=0.3),
             dict(form="qkv", B=2, S=4, L=4, N=2, H=8, bias=True, ab=(1, 2), qk=True),
             dict(form="qkv", B=2, S=3, L=3, N=2, H=8, bias=True, P=5, present=True, mask="2d"),
             dict(form="qkv", B=3, S=1, L=1, N=4, H=8, P=11, present=True, ab=(3, 1)),
             dict(form="qkv", B=2, S=6, L=6, N=2, H=8, unidir=1),
             dict(form="packed_qkv", B=2, S=5, L=5, N=2, H=8),
             dict(form="packed_qkv", B=1, S=7, L=7, N=3, H=8, bias=True, mask="2d"),
             dict(form="packed_kv", B=2, S=4, L=6, N=2, H=8, bias=True),
             dict(form="packed_kv", B=1, S=3, L=9, N=2, H=16, mask="1d", qk=True),
             dict(form="bnsh", B=2, S=5, L=8, N=2, H=8, Hv=4),
             dict(form="bnsh", B=2, S=5, L=8, N=2, H=8, bias=True, mask="2d", present=True),
             dict(form="qkv", B=2, S=33, L=65, N=4, H=32, bias=True, mask="2d")]
    for dt in DTYPES:
        for kw in cases:
            m, feed = mha_case(dt, **kw)
            compare(f"MultiHeadAttention {kw} {dname(dt)}", m, [feed], dt)


# ---------------------------------------------------------------- multi-node models

def test_bert_layer():
    """EmbedLayerNormalization -> Attention -> SkipLayerNormalization -> FusedMatMul -> BiasGelu ->
    MatMul -> SkipLayerNormalization, as the transformer optimizer writes a BERT layer."""
    for dt in DTYPES:
        V, P, H, N, F = 30, 64, 32, 4, 64
        inits = [init("WE", rand(V, H, dtype=dt)), init("PE", rand(P, H, dtype=dt)), init("SE", rand(2, H, dtype=dt)),
                 init("G0", rand(H, dtype=dt, scale=0.2, shift=1.0)), init("B0", rand(H, dtype=dt, scale=0.1)),
                 init("QKV", rand(H, 3 * H, dtype=dt, scale=H ** -0.5)), init("QB", rand(3 * H, dtype=dt, scale=0.1)),
                 init("G1", rand(H, dtype=dt, scale=0.2, shift=1.0)), init("B1", rand(H, dtype=dt, scale=0.1)),
                 init("AB", rand(H, dtype=dt, scale=0.1)),
                 init("W1", rand(H, F, dtype=dt, scale=H ** -0.5)), init("F1", rand(F, dtype=dt, scale=0.1)),
                 init("W2", rand(F, H, dtype=dt, scale=F ** -0.5)), init("F2", rand(H, dtype=dt, scale=0.1)),
                 init("G2", rand(H, dtype=dt, scale=0.2, shift=1.0)), init("B2", rand(H, dtype=dt, scale=0.1))]
        nodes = [helper.make_node("EmbedLayerNormalization", ["ids", "seg", "WE", "PE", "SE", "G0", "B0", "mask"],
                                  ["E", "MI"], domain=MS, epsilon=1e-12),
                 helper.make_node("Attention", ["E", "QKV", "QB", "MI"], ["A"], domain=MS, num_heads=N),
                 helper.make_node("SkipLayerNormalization", ["A", "E", "G1", "B1", "AB"], ["L1"], domain=MS, epsilon=1e-12),
                 helper.make_node("FusedMatMul", ["L1", "W1"], ["M1"], domain=MS, alpha=1.0),
                 helper.make_node("BiasGelu", ["M1", "F1"], ["Gl"], domain=MS),
                 helper.make_node("MatMul", ["Gl", "W2"], ["M2"]),
                 helper.make_node("SkipLayerNormalization", ["M2", "L1", "G2", "B2", "F2"], ["Y"], domain=MS,
                                  epsilon=1e-12)]
        ins = [vi("ids", np.int32, ["b", "s"]), vi("seg", np.int32, ["b", "s"]), vi("mask", np.int32, ["b", "s"])]
        m = model(nodes, ins, [vi("Y", dt, None)], inits)
        feeds = []
        for B, S in [(1, 8), (2, 13), (3, 32)]:
            f = embed_feeds([(B, S)], True, True, None, V=V, P=P, G=2)[0]
            feeds.append(f)
        compare(f"BERT-like layer {dname(dt)}", m, feeds, dt, tol=(TOL[dt][0] * 3, TOL[dt][1] * 3))


def test_conv_head():
    """FusedConv(Relu) -> FusedConv(LeakyRelu, Z = the first's output) -> Flatten -> FusedGemm(Tanh)."""
    for dt in DTYPES:
        inits = [init("W1", rand(6, 3, 3, 3, dtype=dt, scale=0.3)), init("C1", rand(6, dtype=dt, scale=0.1)),
                 init("W2", rand(6, 6, 3, 3, dtype=dt, scale=0.2)), init("C2", rand(6, dtype=dt, scale=0.1)),
                 init("WG", rand(6 * 8 * 8, 10, dtype=dt, scale=0.05)), init("CG", rand(10, dtype=dt, scale=0.1))]
        nodes = [helper.make_node("FusedConv", ["X", "W1", "C1"], ["A"], domain=MS, activation="Relu", pads=[1, 1, 1, 1]),
                 helper.make_node("FusedConv", ["A", "W2", "C2", "A"], ["Bv"], domain=MS, activation="LeakyRelu",
                                  activation_params=[0.05], pads=[1, 1, 1, 1]),
                 helper.make_node("Flatten", ["Bv"], ["F"]),
                 helper.make_node("FusedGemm", ["F", "WG", "CG"], ["Y"], domain=MS, activation="Tanh")]
        m = model(nodes, [vi("X", dt, ["n", 3, 8, 8])], [vi("Y", dt, None)], inits)
        compare(f"conv head {dname(dt)}", m, [{"X": rand(n, 3, 8, 8, dtype=dt)} for n in (1, 3)], dt,
                tol=(TOL[dt][0] * 3, TOL[dt][1] * 3))


def main():
    if skip_without(PROVIDER):
        return 0
    if "ew" in PARTS:
        test_gelu()
        test_bias_add()
    if "norm" in PARTS:
        test_skip_ln()
        test_embed_ln()
    if "mm" in PARTS:
        test_fused_matmul()
    if "conv" in PARTS:
        test_fused_gemm()
        test_fused_conv()
    if "attn" in PARTS:
        test_attention()
        test_mha()
    if "model" in PARTS:
        test_bert_layer()
        test_conv_head()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
