#!/usr/bin/env python3
"""test_gpu_reduce.py - the GPU 'reduce' family against the CPU reference kernels (an
`unoptimized` session) on random data: every Reduce* op over axis sets (attribute and input
axes, keepdims, noop_with_empty_axes, empty reductions), ArgMax/ArgMin (keepdims,
select_last_index, ties), Softmax/LogSoftmax (old 2-D coercion and single-axis semantics),
LayerNormalization (stats outputs, broadcast scales, Scale and B of another float type than X),
RMSNormalization, GroupNormalization,
InstanceNormalization, BatchNormalization (inference) and CumSum (exclusive, reverse), in
float32, float16 and bfloat16, and int32/int64 where the kernels take them; and a small fp16
BERT-like layer in torch.onnx.export's mixed-precision patterns with no node falling back to the
CPU (tests/common/fp16_bert.py).

usage: KILN_LIB=<build>/libkiln.so test_gpu_reduce.py   (prints SKIP without a GPU)
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

rng = np.random.default_rng(7)
# error allowed relative to the output's magnitude (max |reference|, at least 1)
TOL = {"f32": 1e-4, "f16": 1e-2, "bf16": 3e-2, "i32": 0, "i64": 0}
ELEM = {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16,
        "i32": TensorProto.INT32, "i64": TensorProto.INT64}
NP = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "i32": np.int32, "i64": np.int64}
FLOATS = ["f32", "f16", "bf16"]


class Skip(Exception):
    pass


def make_model(nodes, inputs, outputs, opset, inits=()):
    g = helper.make_graph(nodes, "reduce", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10 if opset >= 21 else 8
    return m.SerializeToString()


def op_model(op, ins, dt, attrs=None, opset=17, inits=(), n_out=1, out_elems=None):
    """One `op` node. ins: list of (name, rank or dims list, kind) with kind "x" (the op's dtype),
    "i64" (an int64 graph input), or None for an absent input; names of `inits` are used as
    they are. For bf16 the graph takes float32 inputs, casts "x" inputs to bfloat16 and the
    float outputs back. Returns (blob, number of Cast nodes)."""
    elem = ELEM[dt]
    io_elem = TensorProto.FLOAT if dt == "bf16" else elem
    init_names = {t.name for t in inits}
    inputs, nodes, op_in = [], [], []
    for nm, shape, kind in ins:
        if nm is None:
            op_in.append("")
            continue
        if nm in init_names:
            op_in.append(nm)
            continue
        dims = shape if isinstance(shape, list) else [f"{nm}{j}" for j in range(shape)]
        e = TensorProto.INT64 if kind == "i64" else io_elem
        inputs.append(helper.make_tensor_value_info(nm, e, dims))
        if dt == "bf16" and kind == "x":
            nodes.append(helper.make_node("Cast", [nm], [nm + "_bf"], to=TensorProto.BFLOAT16))
            op_in.append(nm + "_bf")
        else:
            op_in.append(nm)
    out_elems = out_elems or [None] * n_out
    op_out, outputs, post = [], [], []
    for k in range(n_out):
        y = f"Y{k}"
        oe = out_elems[k] if out_elems[k] is not None else elem
        if dt == "bf16" and oe == TensorProto.BFLOAT16:
            op_out.append(y + "_bf")
            post.append(helper.make_node("Cast", [y + "_bf"], [y], to=TensorProto.FLOAT))
            oe = TensorProto.FLOAT
        else:
            op_out.append(y)
        outputs.append(helper.make_tensor_value_info(y, oe, None))
    nodes.append(helper.make_node(op, op_in, op_out, **(attrs or {})))
    nodes += post
    n_casts = sum(1 for n in nodes if n.op_type == "Cast")
    return make_model(nodes, inputs, outputs, opset, inits), n_casts


_cast_share = {}


def cast_gpu_share():
    """How many GPU nodes one Cast float32 <-> bfloat16 adds (0 or 1): the bf16 models' Casts
    may run on either provider, so the op's own GPU node is counted apart from them."""
    if "v" not in _cast_share:
        nodes = [helper.make_node("Cast", ["X"], ["T"], to=TensorProto.BFLOAT16),
                 helper.make_node("Cast", ["T"], ["Y"], to=TensorProto.FLOAT)]
        blob = make_model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], 17)
        s = kiln.Session(blob, provider="cuda")
        s.run({"X": np.ones(3, np.float32)})
        _cast_share["v"] = s.stats()["nodes_gpu"] / 2.0
    return _cast_share["v"]


def rand(dt, shape, kind="normal"):
    shape = list(shape)
    if dt in ("i32", "i64"):
        lo, hi = {"normal": (-50, 50), "small": (-2, 3), "ties": (0, 4)}.get(kind, (-50, 50))
        return rng.integers(lo, hi, size=shape).astype(NP[dt])
    if kind == "positive":
        v = np.abs(rng.standard_normal(shape)) + 0.1
    elif kind == "near1":
        v = np.exp(0.05 * rng.standard_normal(shape))
    elif kind == "ties":
        v = np.round(rng.standard_normal(shape) * 2) / 2
    else:
        v = rng.standard_normal(shape)
    return v.astype(NP[dt])


def first_bad(g, w, lim):
    with np.errstate(invalid="ignore"):
        same = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= lim)
    bad = np.argwhere(~same)
    return tuple(int(x) for x in bad[0]) if len(bad) else None


def run_case(name, blob, feeds_list, dt, n_casts=0, expect_gpu=True):
    """Runs every feed on one cuda session and on the reference; compares each output. A feed
    the reference refuses must be refused on the GPU too."""
    try:
        gpu = kiln.Session(blob, provider="cuda")
    except kiln.KilnError as e:
        check(f"{name} [{dt}]: create cuda session", False, str(e))
        return
    ref = kiln.Session(blob, unoptimized=True)
    ran = 0  # feeds the reference accepted: only those must have run on the GPU
    for feeds in feeds_list:
        shapes = " ".join(f"{k}={tuple(v.shape)}" for k, v in feeds.items())
        label = f"{name} [{dt}] {shapes}"
        try:
            want = ref.run(feeds)
        except kiln.KilnError as e:
            try:
                gpu.run(feeds)
                check(label, False, f"reference failed ({e}) but the cuda session ran")
            except kiln.KilnError:
                check(label, True)
            continue
        try:
            got = gpu.run(feeds)
        except kiln.KilnError as e:
            check(label, False, f"cuda run failed: {e}")
            continue
        ran += 1
        for k, (g, w) in enumerate(zip(got, want)):
            if g.dtype != w.dtype:
                check(label, False, f"output {k} dtype {g.dtype}, reference {w.dtype}")
                continue
            g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
            if g64.shape != w64.shape:
                check(label, False, f"output {k} shape {g64.shape}, reference {w64.shape}")
                continue
            if np.issubdtype(w.dtype, np.integer):
                bad = np.argwhere(g != w)
                ok = len(bad) == 0
                idx = tuple(int(x) for x in bad[0]) if not ok else None
                detail = "" if ok else (f"output {k}: {len(bad)} of {w.size} differ, first bad index {idx}: "
                                        f"got {g[idx]!r} want {w[idx]!r}")
                check(label, ok, detail)
                continue
            finite = w64[np.isfinite(w64)]
            scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
            lim = TOL[dt] * scale
            idx = first_bad(g64, w64, lim)
            detail = ""
            if idx is not None:
                with np.errstate(invalid="ignore"):
                    diff = float(np.nanmax(np.abs(g64 - w64)))
                detail = (f"output {k}: max abs diff {diff:.3g} (allowed {lim:.3g}), first bad index {idx}: "
                          f"got {g64[idx]!r} want {w64[idx]!r}")
            check(label, idx is None, detail)
    st = gpu.stats()
    if expect_gpu and ran:
        own = st["nodes_gpu"] - (cast_gpu_share() * n_casts if n_casts else 0)
        check(f"{name} [{dt}] ran on the GPU", st["node_runs_gpu"] > 0 and own >= 1,
              f"stats nodes_gpu={st['nodes_gpu']} node_runs_gpu={st['node_runs_gpu']} casts={n_casts}")


# ---- Reduce* ----

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
INT_REDUCE = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceSumSquare"}

# shapes per rank, with odd, size-1, zero-size and long (block-per-row) dims
SHAPES = {
    1: [[7], [1], [0], [1500], [33]],
    2: [[3, 5], [1, 7], [4, 0], [0, 3], [5, 1300], [300, 3], [1, 1]],
    3: [[2, 3, 4], [5, 1, 7], [3, 40, 33], [2, 0, 3], [1, 1, 1], [7, 130, 2]],
    4: [[2, 3, 5, 7], [1, 4, 1, 9], [3, 2, 0, 2], [2, 65, 3, 17]],
}
AXES = {
    1: [None, [0], [-1]],
    2: [None, [0], [1], [-1], [0, 1]],
    3: [None, [0], [1], [2], [0, 2], [1, 2], [0, 1], [-1, -3]],
    4: [None, [1], [0, 2], [1, 3], [0, 3], [1, 2], [0, 1, 3], [3], [0, 1, 2, 3]],
}


def reduce_data_kind(op):
    return {"ReduceProd": "near1", "ReduceLogSum": "positive"}.get(op, "normal")


def test_reduce(op, dt):
    kind = reduce_data_kind(op)
    if dt in ("i32", "i64") and op == "ReduceProd":
        kind = "small"
    new_opset = 13 if op == "ReduceSum" else 18
    for rank in (1, 2, 3, 4):
        for axes in AXES[rank]:
            for keep in (1, 0):
                feeds_x = [rand(dt, s, kind) for s in SHAPES[rank]]
                # old opset: axes attribute
                attrs = {"keepdims": keep}
                if axes is not None:
                    attrs["axes"] = axes
                blob, nc = op_model(op, [("X", rank, "x")], dt, attrs, opset=11)
                run_case(f"{op} opset 11 rank {rank} axes={axes} keepdims={keep}", blob,
                         [{"X": x} for x in feeds_x], dt, nc)
                # new opset: axes as a constant input (initializer)
                inits = [numpy_helper.from_array(np.array(axes, np.int64), "A")] if axes is not None else []
                ins = [("X", rank, "x")] + ([("A", 1, "i64")] if axes is not None else [])
                blob, nc = op_model(op, ins, dt, {"keepdims": keep}, opset=new_opset, inits=inits)
                run_case(f"{op} opset {new_opset} rank {rank} const axes={axes} keepdims={keep}", blob,
                         [{"X": x} for x in feeds_x], dt, nc)
            # axes as a graph input (known only at run time), keepdims=1
            if axes is not None:
                blob, nc = op_model(op, [("X", rank, "x"), ("A", [len(axes)], "i64")], dt, {"keepdims": 1},
                                    opset=new_opset)
                run_case(f"{op} opset {new_opset} rank {rank} input axes={axes}", blob,
                         [{"X": rand(dt, s, kind), "A": np.array(axes, np.int64)} for s in SHAPES[rank]], dt, nc)
    # noop_with_empty_axes: no axes reduces nothing (element-wise steps still apply)
    for noop in (0, 1):
        blob, nc = op_model(op, [("X", 3, "x")], dt, {"keepdims": 1, "noop_with_empty_axes": noop},
                            opset=new_opset)
        run_case(f"{op} opset {new_opset} no axes noop_with_empty_axes={noop}", blob,
                 [{"X": rand(dt, s, kind)} for s in SHAPES[3]], dt, nc)
        blob, nc = op_model(op, [("X", 3, "x"), ("A", [0], "i64")], dt,
                            {"keepdims": 0, "noop_with_empty_axes": noop}, opset=new_opset)
        run_case(f"{op} opset {new_opset} empty axes input noop_with_empty_axes={noop}", blob,
                 [{"X": rand(dt, s, kind), "A": np.zeros(0, np.int64)} for s in SHAPES[3]], dt, nc)


# ---- ArgMax, ArgMin ----

def test_arg(op, dt):
    for rank in (1, 2, 3, 4):
        for axis in range(-rank, rank):
            for keep in (1, 0):
                for last in (0, 1):
                    blob, nc = op_model(op, [("X", rank, "x")], dt,
                                        {"axis": axis, "keepdims": keep, "select_last_index": last}, opset=13,
                                        out_elems=[TensorProto.INT64])
                    # a zero-size axis with other elements: the reference refuses it, so must the GPU
                    feeds = [{"X": rand(dt, s, "ties" if last else "normal")} for s in SHAPES[rank]]
                    run_case(f"{op} rank {rank} axis={axis} keepdims={keep} select_last_index={last}", blob,
                             feeds, dt, nc)


# ---- Softmax, LogSoftmax ----

# (rows of 129 to 1024 elements, 256 rows or more: a warp a row, the row held in registers)
SOFTMAX_SHAPES = {1: [[7], [1], [2000], [0]], 2: [[3, 5], [4, 2000], [300, 7], [0, 3], [2, 1], [300, 130], [257, 1000]],
                  3: [[2, 3, 4], [3, 5, 1100], [2, 0, 3], [5, 33, 7], [2, 150, 197]], 4: [[2, 3, 5, 7], [1, 2, 130, 3]]}


def test_softmax(op, dt):
    for opset in (11, 13):
        for rank in (1, 2, 3, 4):
            axes = [None] + list(range(-rank, rank))
            for axis in axes:
                attrs = {} if axis is None else {"axis": axis}
                blob, nc = op_model(op, [("X", rank, "x")], dt, attrs, opset=opset)
                run_case(f"{op} opset {opset} rank {rank} axis={axis}", blob,
                         [{"X": rand(dt, s) * 3} for s in SOFTMAX_SHAPES[rank]], dt, nc)


# ---- LayerNormalization, RMSNormalization ----

def test_layernorm(dt):
    cases = [  # x shape, axis, scale shape (None: the normalized dims)
        ([2, 3, 8], -1, None), ([4, 1030], -1, None), ([2, 5, 7], 1, None), ([3, 4, 5], 0, None),
        ([5, 7], 1, None), ([1, 1], -1, None), ([0, 8], -1, None), ([3, 2, 8], -1, [1, 1, 8]),
        ([3, 2, 8], -2, [2, 1]), ([3, 2, 8], -2, [8]), ([3, 4], 0, [1, 4]), ([6, 300], -1, None),
        ([300, 130], -1, None), ([2, 130, 768], -1, None), ([257, 1000], -1, None), ([300, 200], -1, [1, 200]),
    ]
    for xs, axis, ss in cases:
        rank = len(xs)
        ax = axis % rank
        sshape = ss if ss is not None else xs[ax:]
        for bias in (True, False):
            for stats in (False, True):
                ins = [("X", rank, "x"), ("S", len(sshape), "x")] + ([("B", len(sshape), "x")] if bias else [])
                n_out = 3 if stats else 1
                oe = [ELEM[dt], TensorProto.FLOAT, TensorProto.FLOAT][:n_out]
                blob, nc = op_model("LayerNormalization", ins, dt, {"axis": axis, "epsilon": 1e-3}, opset=17,
                                    n_out=n_out, out_elems=oe)
                feeds = {"X": rand(dt, xs) * 2 + 0.5, "S": rand(dt, sshape)}
                if bias:
                    feeds["B"] = rand(dt, sshape)
                run_case(f"LayerNormalization x={xs} axis={axis} scale={sshape} bias={bias} stats={stats}",
                         blob, [feeds], dt, nc)
    # one session, shapes changing every call
    blob, nc = op_model("LayerNormalization", [("X", 3, "x"), ("S", ["C"], "x"), ("B", ["C"], "x")], dt,
                        {"axis": -1}, opset=17, n_out=1, inits=())
    feeds = [{"X": rand(dt, [b, s, c]), "S": rand(dt, [c]), "B": rand(dt, [c])}
             for b, s, c in [(1, 1, 16), (2, 7, 64), (3, 33, 768), (1, 5, 1500), (2, 0, 8)]]
    run_case("LayerNormalization changing shapes", blob, feeds, dt, nc)


def test_norm_mixed():
    """LayerNormalization / RMSNormalization with Scale and B of another float type than X (what
    exporters of half-precision models write: float32 X with float16 parameters, and the
    reverse): on the GPU, equal to the reference, Y of X's type."""
    for x_dt, p_dt in (("f32", "f16"), ("f16", "f32")):
        for op, opset in (("LayerNormalization", 17), ("RMSNormalization", 23)):
            for xs, axis, sshape in (([2, 3, 8], -1, [8]), ([4, 1030], -1, [1030]), ([3, 2, 8], -2, [2, 8]),
                                     ([3, 2, 8], -1, [1, 1, 8])):
                with_b = op == "LayerNormalization"
                ins = [helper.make_tensor_value_info("X", ELEM[x_dt], [f"x{k}" for k in range(len(xs))]),
                       helper.make_tensor_value_info("S", ELEM[p_dt], sshape)]
                if with_b:
                    ins.append(helper.make_tensor_value_info("B", ELEM[p_dt], sshape))
                outs = [helper.make_tensor_value_info("Y0", ELEM[x_dt], None)]
                if with_b:
                    outs += [helper.make_tensor_value_info(f"Y{k}", TensorProto.FLOAT, None) for k in (1, 2)]
                node = helper.make_node(op, [i.name for i in ins], [o.name for o in outs], axis=axis, epsilon=1e-4)
                blob = make_model([node], ins, outs, opset)
                feeds = {"X": rand(x_dt, xs) * 2 + 0.5, "S": rand(p_dt, sshape)}
                if with_b:
                    feeds["B"] = rand(p_dt, sshape)
                run_case(f"{op} X {x_dt}, Scale/B {p_dt}, x={xs} axis={axis} scale={sshape}", blob, [feeds], x_dt)


def test_fp16_bert_like():
    """A half-precision BERT-like layer in torch.onnx.export's patterns (tests/common/fp16_bert.py):
    no node falls back to the CPU, and the output equals the reference's."""
    import fp16_bert
    blob = fp16_bert.bert(mixed=True)
    gpu, ref = kiln.Session(blob, provider="cuda"), kiln.Session(blob, unoptimized=True)
    st = gpu.stats()
    cpu_nodes = [(name, op) for name, op, prov in kiln.InferenceSession(blob, providers=["CUDAExecutionProvider"])
                 .nodes() if prov == "cpu"]
    check("fp16 BERT-like: no node falls back to the CPU", st["nodes_fallback"] == 0,
          f"nodes_fallback {st['nodes_fallback']}; CPU nodes {cpu_nodes}")
    for b, q in ((1, 8), (2, 13), (4, 64)):
        f = fp16_bert.feeds(b, q, seed=q)
        got, want = gpu.run(f)[0], ref.run(f)[0]
        err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
        check(f"fp16 BERT-like B={b} S={q}: equal to the reference", got.dtype == np.float16 and err <= 2e-2 *
              max(1.0, float(np.max(np.abs(want)))), f"dtype {got.dtype}, max error {err:.3g}")


def test_rmsnorm(dt):
    for xs, axis in [([2, 3, 8], -1), ([4, 1030], -1), ([2, 5, 7], 1), ([3, 4], 0), ([0, 4], -1)]:
        sshape = xs[axis % len(xs):]
        blob, nc = op_model("RMSNormalization", [("X", len(xs), "x"), ("S", len(sshape), "x")], dt,
                            {"axis": axis, "epsilon": 1e-4}, opset=23)
        run_case(f"RMSNormalization x={xs} axis={axis}", blob, [{"X": rand(dt, xs), "S": rand(dt, sshape)}], dt, nc)


# ---- GroupNormalization, InstanceNormalization ----

def test_channel_norms(dt):
    for opset in (18, 21):
        for xs, g in [([2, 6, 5, 3], 3), ([1, 4, 7], 2), ([2, 8, 33, 33], 4), ([3, 6], 6), ([2, 6, 0], 3),
                      ([1, 64, 40], 1), ([2, 4, 50], 2), ([1, 6, 300], 3)]:
            np_ = xs[1] if opset >= 21 else g
            blob, nc = op_model("GroupNormalization", [("X", len(xs), "x"), ("S", 1, "x"), ("B", 1, "x")], dt,
                                {"num_groups": g, "epsilon": 1e-4}, opset=opset)
            run_case(f"GroupNormalization opset {opset} x={xs} groups={g}", blob,
                     [{"X": rand(dt, xs) + 1, "S": rand(dt, [np_]), "B": rand(dt, [np_])}], dt, nc)
    for xs in ([2, 3, 5, 7], [1, 4, 9], [2, 3, 40, 40], [3, 2], [2, 3, 0]):
        blob, nc = op_model("InstanceNormalization", [("X", len(xs), "x"), ("S", 1, "x"), ("B", 1, "x")], dt,
                            {"epsilon": 1e-4}, opset=17)
        run_case(f"InstanceNormalization x={xs}", blob,
                 [{"X": rand(dt, xs), "S": rand(dt, [xs[1]]), "B": rand(dt, [xs[1]])}], dt, nc)


# ---- BatchNormalization ----

def test_batchnorm(dt):
    for opset in (9, 15):
        attrs = {"epsilon": 1e-3}
        if opset >= 14:
            attrs["training_mode"] = 0
        blob, nc = op_model("BatchNormalization", [("X", 4, "x")] + [(n, 1, "x") for n in "SBMV"], dt, attrs,
                            opset=opset)
        feeds = []
        for xs in ([2, 3, 5, 7], [1, 16, 9, 9], [4, 1, 1, 1], [0, 3, 2, 2], [2, 5, 0, 3], [2, 3, 20, 20],
                   [2, 5, 33, 33]):
            c = xs[1]
            feeds.append({"X": rand(dt, xs), "S": rand(dt, [c]), "B": rand(dt, [c]), "M": rand(dt, [c]),
                          "V": np.abs(rand(dt, [c])) + np.asarray(0.5, NP[dt])})
        run_case(f"BatchNormalization opset {opset} rank 4", blob, feeds, dt, nc)
    blob, nc = op_model("BatchNormalization", [("X", 2, "x")] + [(n, 1, "x") for n in "SBMV"], dt, {}, opset=15)
    run_case("BatchNormalization opset 15 rank 2", blob,
             [{"X": rand(dt, [5, 7]), "S": rand(dt, [7]), "B": rand(dt, [7]), "M": rand(dt, [7]),
               "V": np.abs(rand(dt, [7])) + np.asarray(0.5, NP[dt])}], dt, nc)


# ---- CumSum ----

def test_cumsum(dt):
    shapes = {1: [[7], [1], [1000], [0], [33], [3000]], 2: [[3, 70], [130, 3], [1, 1], [0, 5], [2, 5000]],
              3: [[2, 3, 4], [3, 65, 5], [2, 0, 3]]}
    for rank, sl in shapes.items():
        for axis in range(-rank, rank):
            for excl in (0, 1):
                for rev in (0, 1):
                    init = numpy_helper.from_array(np.array(axis, np.int64), "A")
                    blob, nc = op_model("CumSum", [("X", rank, "x"), ("A", [], "i64")], dt,
                                        {"exclusive": excl, "reverse": rev}, opset=14, inits=[init])
                    run_case(f"CumSum rank {rank} axis={axis} exclusive={excl} reverse={rev}", blob,
                             [{"X": rand(dt, s)} for s in sl], dt, nc)
    # axis as a graph input (int32 and int64 on the host)
    blob, nc = op_model("CumSum", [("X", 2, "x"), ("A", [], "i64")], dt, {}, opset=14)
    run_case("CumSum axis input", blob, [{"X": rand(dt, [5, 40]), "A": np.array(a, np.int64)} for a in (0, 1, -1)],
             dt, nc)


def main():
    try:
        blob, _ = op_model("ReduceSum", [("X", 2, "x")], "f32", {"keepdims": 1}, opset=11)
        kiln.Session(blob, provider="cuda")
    except (kiln.KilnError, OSError) as e:
        print(f"SKIP: no CUDA session ({e})")
        return 0
    for op in REDUCE_OPS:
        for dt in FLOATS + (["i32", "i64"] if op in INT_REDUCE else []):
            test_reduce(op, dt)
    for op in ("ArgMax", "ArgMin"):
        for dt in FLOATS + ["i32", "i64"]:
            test_arg(op, dt)
    for dt in FLOATS:
        for op in ("Softmax", "LogSoftmax"):
            test_softmax(op, dt)
        test_layernorm(dt)
        test_rmsnorm(dt)
        test_channel_norms(dt)
        test_batchnorm(dt)
    for dt in FLOATS + ["i32", "i64"]:
        test_cumsum(dt)
    test_norm_mixed()
    test_fp16_bert_like()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
