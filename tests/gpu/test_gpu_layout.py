#!/usr/bin/env python3
"""test_gpu_layout.py - the GPU 'layout' family against the CPU reference kernels (an
`unoptimized` session) on random data: Transpose (tiled and strided paths, NHWC<->NCHW),
Concat, Split (split input, attribute, num_outputs), Slice (negative steps, clamping, inputs
as initializers and as graph inputs), Gather, GatherElements, GatherND (batch_dims), ScatterND
and ScatterElements (every reduction), Pad (every mode, negative pads, axes), Expand, Tile,
Range, Reshape/Flatten/Squeeze/Unsqueeze, Trilu and OneHot, over float32, float16, bfloat16
(through Casts), int64, int32, uint8 and bool, with odd, size-1 and zero-size dims. Moves must
be exact; only reductions and Range allow rounding.

usage: KILN_LIB=<build>/libkiln.so test_gpu_layout.py   (prints SKIP without a GPU)
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

rng = np.random.default_rng(11)
ELEM = {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16,
        "i64": TensorProto.INT64, "i32": TensorProto.INT32, "u8": TensorProto.UINT8, "bool": TensorProto.BOOL}
NP = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "i64": np.int64, "i32": np.int32, "u8": np.uint8,
      "bool": np.bool_}
TOL = {"f32": 1e-5, "f16": 1e-2, "bf16": 3e-2}
MOVE_TYPES = ["f32", "f16", "i64", "bool", "u8"]


def rand(dt, shape):
    shape = tuple(shape)
    if dt in ("i64", "i32"):
        return rng.integers(-100, 100, size=shape).astype(NP[dt])
    if dt == "u8":
        return rng.integers(0, 255, size=shape).astype(np.uint8)
    if dt == "bool":
        return rng.random(shape) < 0.5
    return rng.standard_normal(shape).astype(NP[dt])


def make_model(op, inputs, n_out=1, attrs=None, opset=17, inits=(), dt="f32", out_elem=None):
    """One `op` node. inputs: list of (name, dims or None for absent, elem); data inputs of
    elem "x" take the op's dtype (bf16: float32 graph inputs cast to bfloat16 and back)."""
    elem = ELEM[dt]
    io_elem = TensorProto.FLOAT if dt == "bf16" else elem
    init_names = {t.name for t in inits}
    g_in, nodes, op_in = [], [], []
    for nm, dims, e in inputs:
        if dims is None and nm not in init_names:
            op_in.append("")
            continue
        if nm in init_names:
            op_in.append(nm)
            continue
        ge = io_elem if e == "x" else e
        g_in.append(helper.make_tensor_value_info(nm, ge, dims))
        if dt == "bf16" and e == "x":
            nodes.append(helper.make_node("Cast", [nm], [nm + "_bf"], to=TensorProto.BFLOAT16))
            op_in.append(nm + "_bf")
        else:
            op_in.append(nm)
    oe = out_elem if out_elem is not None else elem
    op_out, g_out, post = [], [], []
    for k in range(n_out):
        y = f"Y{k}"
        if dt == "bf16" and oe == TensorProto.BFLOAT16:
            op_out.append(y + "_bf")
            post.append(helper.make_node("Cast", [y + "_bf"], [y], to=TensorProto.FLOAT))
            g_out.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, None))
        else:
            op_out.append(y)
            g_out.append(helper.make_tensor_value_info(y, oe, None))
    nodes.append(helper.make_node(op, op_in, op_out, **(attrs or {})))
    nodes += post
    g = helper.make_graph(nodes, "layout", g_in, g_out, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10 if opset >= 21 else 8
    return m.SerializeToString()


def i64(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def sym(name, rank):
    return [f"{name}{k}" for k in range(rank)]


def compare(g, w, tol):
    if g.dtype != w.dtype:
        return f"dtype {g.dtype}, reference {w.dtype}"
    if g.shape != w.shape:
        return f"shape {g.shape}, reference {w.shape}"
    if not w.size:
        return ""
    if tol is None or not np.issubdtype(w.dtype, np.floating):
        same = (g == w) | (np.isnan(g) & np.isnan(w)) if np.issubdtype(w.dtype, np.floating) else g == w
        lim = 0.0
    else:
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        fin = w64[np.isfinite(w64)]
        lim = tol * max(1.0, float(np.max(np.abs(fin)))) if fin.size else tol
        with np.errstate(invalid="ignore"):
            same = (np.abs(g64 - w64) <= lim) | (np.isnan(g64) & np.isnan(w64)) | (g64 == w64)
    bad = np.argwhere(~same)
    if not len(bad):
        return ""
    idx = tuple(int(x) for x in bad[0])
    with np.errstate(invalid="ignore"):
        diff = float(np.nanmax(np.abs(g.astype(np.float64) - w.astype(np.float64))))
    return (f"{len(bad)} of {w.size} differ, max abs diff {diff:.3g} (allowed {lim:.3g}), first bad index "
            f"{idx}: got {g[idx]!r} want {w[idx]!r}")


def run_case(name, blob, feeds_list, tol=None):
    """Every feed on one cuda session and on the reference; moves compare exactly (tol None).
    A feed the reference refuses must be refused on the GPU too."""
    try:
        gpu = kiln.Session(blob, provider="cuda")
    except kiln.KilnError as e:
        check(f"{name}: create cuda session", False, str(e))
        return
    ref = kiln.Session(blob, unoptimized=True)
    ran = False  # some feed the reference accepts (refused ones may fall back on the GPU)
    for feeds in feeds_list:
        shapes = " ".join(f"{k}={tuple(np.shape(v))}" for k, v in feeds.items())
        label = f"{name} {shapes}"
        try:
            want = ref.run(feeds)
        except kiln.KilnError as e:
            try:
                gpu.run(feeds)
                check(label, False, f"reference failed ({e}) but the cuda session ran")
            except kiln.KilnError:
                check(label, True)
            continue
        ran = True
        try:
            got = gpu.run(feeds)
        except kiln.KilnError as e:
            check(label, False, f"cuda run failed: {e}")
            continue
        for k, (g, w) in enumerate(zip(got, want)):
            detail = compare(g, w, tol)
            check(label, not detail, f"output {k}: {detail}")
    st = gpu.stats()
    check(f"{name}: ran on the GPU", not ran or st["node_runs_gpu"] > 0,
          f"stats nodes_gpu={st.get('nodes_gpu')} node_runs_gpu={st['node_runs_gpu']}")


def ftol(dt):
    return TOL.get(dt)


# ---- Transpose ----

def test_transpose():
    cases = [([2, 3, 4], [0, 2, 1]), ([1, 40, 40, 3], [0, 3, 1, 2]), ([1, 3, 40, 40], [0, 2, 3, 1]),
             ([5, 1, 7], None), ([33, 65], [1, 0]), ([3, 47, 129], [0, 2, 1]), ([2, 3, 4, 5, 6], [4, 2, 0, 3, 1]),
             ([0, 3, 4], [2, 0, 1]), ([1, 1, 1], [2, 1, 0]), ([17, 1, 19], [2, 1, 0]), ([64, 16, 3, 5], [1, 0, 3, 2]),
             ([2, 100, 1, 31], [0, 3, 2, 1])]
    for dt in MOVE_TYPES + ["bf16"]:
        for dims, perm in cases:
            if dt in ("u8", "bool", "bf16") and len(dims) > 3:
                continue
            attrs = {"perm": perm} if perm is not None else {}
            blob = make_model("Transpose", [("X", sym("x", len(dims)), "x")], attrs=attrs, dt=dt)
            feeds = [{"X": rand(dt, dims)}]
            # a second shape of the same rank: dims halved (rounded up), one dim set to 1
            d2 = [max(1, (d + 1) // 2) for d in dims]
            d2[0] = 1
            feeds.append({"X": rand(dt, d2)})
            run_case(f"Transpose {dt} perm={perm}", blob, feeds)


# ---- Concat, Split ----

def test_concat():
    for dt in MOVE_TYPES:
        for axis, shapes in [(0, [[2, 3], [1, 3], [4, 3]]), (1, [[2, 3, 5], [2, 1, 5], [2, 0, 5], [2, 7, 5]]),
                             (-1, [[3, 4, 1], [3, 4, 2], [3, 4, 5]]), (2, [[1, 2, 3, 4], [1, 2, 1, 4]]),
                             (0, [[5], [0], [3]]), (1, [[0, 3], [0, 2]])]:
            ins = [(f"X{i}", [f"a{i}{k}" for k in range(len(s))], "x") for i, s in enumerate(shapes)]
            blob = make_model("Concat", ins, attrs={"axis": axis}, dt=dt)
            run_case(f"Concat {dt} axis={axis}", blob, [{f"X{i}": rand(dt, s) for i, s in enumerate(shapes)}])


def test_split():
    for dt in ["f32", "f16", "i64", "bool"]:
        # split input (initializer), opset 13
        for dims, axis, split in [([7, 4], 0, [2, 0, 5]), ([3, 10, 2], 1, [1, 6, 3]), ([3, 5], -1, [2, 3])]:
            blob = make_model("Split", [("X", sym("x", len(dims)), "x"), ("split", None, None)], n_out=len(split),
                              attrs={"axis": axis}, opset=13, inits=[i64("split", split)], dt=dt)
            run_case(f"Split {dt} axis={axis} split={split}", blob, [{"X": rand(dt, dims)}])
        # equal parts, opset 13; uneven with num_outputs, opset 18
        blob = make_model("Split", [("X", sym("x", 3), "x")], n_out=3, attrs={"axis": 1}, opset=13, dt=dt)
        run_case(f"Split {dt} equal", blob, [{"X": rand(dt, [2, 9, 3])}, {"X": rand(dt, [1, 3, 5])}])
        blob = make_model("Split", [("X", sym("x", 2), "x")], n_out=3, attrs={"axis": 0, "num_outputs": 3},
                          opset=18, dt=dt)
        run_case(f"Split {dt} num_outputs uneven", blob, [{"X": rand(dt, [7, 3])}, {"X": rand(dt, [9, 1])}])
        # attribute split, opset 11
        blob = make_model("Split", [("X", sym("x", 2), "x")], n_out=2, attrs={"axis": 1, "split": [3, 4]},
                          opset=11, dt=dt)
        run_case(f"Split {dt} attr", blob, [{"X": rand(dt, [2, 7])}])


# ---- Slice ----

SLICES = [  # dims, starts, ends, axes, steps
    ([10, 8], [1, 2], [7, 100], [0, 1], [2, 1]),
    ([10, 8], [-1], [-100], [1], [-1]),
    ([10, 8], [8, -3], [1, 0], [0, 1], [-3, -2]),
    ([5, 6, 7], [0], [3], [-1], None),
    ([5, 6, 7], [2, 1, 0], [3, 5, 7], None, [1, 2, 3]),
    ([5, 6, 7], [10], [20], [0], [1]),  # empty
    ([4, 1, 9], [-2, 0], [100, 1], [2, 1], [1, 1]),
    ([3, 4], [0], [9223372036854775807], [1], [9223372036854775807]),
    ([6], [-9223372036854775807], [9223372036854775807], [0], [-1]),
]


def test_slice():
    for dt in ["f32", "f16", "i64", "bool", "u8"]:
        for dims, starts, ends, axes, steps in SLICES:
            n = len(starts)
            # as initializers
            inits = [i64("starts", starts), i64("ends", ends)]
            ins = [("X", sym("x", len(dims)), "x"), ("starts", None, None), ("ends", None, None)]
            if axes is not None:
                inits.append(i64("axes", axes))
                ins.append(("axes", None, None))
            elif steps is not None:
                ins.append(("axes_absent", None, None))
            if steps is not None:
                inits.append(i64("steps", steps))
                ins.append(("steps", None, None))
            blob = make_model("Slice", ins, opset=13, inits=inits, dt=dt)
            run_case(f"Slice {dt} const {starts}:{ends} axes={axes} steps={steps}", blob, [{"X": rand(dt, dims)}])
            # as graph inputs (handed to the kernel on the host)
            ins = [("X", sym("x", len(dims)), "x"), ("s", [n], TensorProto.INT64), ("e", [n], TensorProto.INT64),
                   ("a", [n], TensorProto.INT64), ("st", [n], TensorProto.INT64)]
            blob = make_model("Slice", ins, opset=13, dt=dt)
            feeds = {"X": rand(dt, dims), "s": np.array(starts, np.int64), "e": np.array(ends, np.int64),
                     "a": np.array(axes if axes is not None else list(range(n)), np.int64),
                     "st": np.array(steps if steps is not None else [1] * n, np.int64)}
            run_case(f"Slice {dt} inputs {starts}:{ends} axes={axes} steps={steps}", blob, [feeds])
    blob = make_model("Slice", [("X", sym("x", 2), "x")], opset=9,
                      attrs={"starts": [1, -3], "ends": [100, -1], "axes": [0, 1]}, dt="f32")
    run_case("Slice opset 9", blob, [{"X": rand("f32", [5, 7])}])


# ---- Gather family ----

def test_gather():
    for dt in ["f32", "f16", "i64", "bool"]:
        for dims, axis, ind_shape in [([7, 5], 0, [4]), ([3, 9, 2], 1, [2, 3]), ([4, 6], -1, []),
                                      ([5, 1, 3], 0, [0]), ([0, 4], 1, [3]), ([11], 0, [6, 2])]:
            for ie in (TensorProto.INT64, TensorProto.INT32):
                n = dims[axis]
                blob = make_model("Gather", [("X", sym("x", len(dims)), "x"), ("I", sym("i", len(ind_shape)), ie)],
                                  attrs={"axis": axis}, dt=dt)
                ind = rng.integers(-n, n, size=ind_shape) if n else np.zeros(ind_shape, np.int64)
                ind = ind.astype(np.int64 if ie == TensorProto.INT64 else np.int32)
                if n == 0 and ind.size:
                    continue
                run_case(f"Gather {dt} axis={axis} idx{'64' if ie == TensorProto.INT64 else '32'}", blob,
                         [{"X": rand(dt, dims), "I": ind}])
    # constant indices: in range, and out of range (the reference fails, so must the GPU)
    for vals in ([0, -1, 2], [0, 5]):
        blob = make_model("Gather", [("X", sym("x", 2), "x"), ("I", None, None)], attrs={"axis": 0},
                          inits=[i64("I", vals)])
        run_case(f"Gather const indices {vals}", blob, [{"X": rand("f32", [5, 3])}])


def test_gather_elements():
    for dt in ["f32", "f16", "i64"]:
        for dims, axis, ind_dims in [([4, 5], 0, [3, 5]), ([4, 5], 1, [4, 7]), ([2, 3, 4], -1, [2, 2, 3]),
                                     ([3, 1], 0, [0, 1])]:
            n = dims[axis]
            blob = make_model("GatherElements", [("X", sym("x", len(dims)), "x"), ("I", sym("i", len(dims)),
                                                                                    TensorProto.INT64)],
                              attrs={"axis": axis}, opset=13, dt=dt)
            ind = rng.integers(-n, n, size=ind_dims).astype(np.int64)
            run_case(f"GatherElements {dt} axis={axis}", blob, [{"X": rand(dt, dims), "I": ind}])


def test_gather_nd():
    for dt in ["f32", "f16", "i64"]:
        for dims, b, ind_dims in [([4, 5, 6], 0, [3, 2]), ([4, 5, 6], 0, [2, 2, 1]), ([4, 5, 6], 0, [3]),
                                  ([3, 5, 6], 1, [3, 4, 1]), ([2, 3, 4, 5], 2, [2, 3, 2]), ([4, 5], 0, [0, 2])]:
            last = ind_dims[-1]
            ind = np.stack([rng.integers(-dims[b + k], dims[b + k], size=ind_dims[:-1]) for k in range(last)],
                           axis=-1).astype(np.int64).reshape(ind_dims)
            blob = make_model("GatherND", [("X", sym("x", len(dims)), "x"), ("I", sym("i", len(ind_dims)),
                                                                              TensorProto.INT64)],
                              attrs={"batch_dims": b}, opset=13, dt=dt)
            run_case(f"GatherND {dt} b={b} ind={ind_dims}", blob, [{"X": rand(dt, dims), "I": ind}])


# ---- Scatter family ----

def test_scatter_nd():
    for dt in ["f32", "f16", "i64", "bf16"]:
        for red in ["none", "add", "mul", "max", "min"]:
            if dt == "bool" and red != "none":
                continue
            for dims, ind_dims in [([6, 4], [3, 1]), ([6, 4, 3], [5, 2]), ([7], [4, 1]), ([3, 4], [2, 2, 2])]:
                last = ind_dims[-1]
                tuples = int(np.prod(ind_dims[:-1]))
                if red == "none":  # unique tuples: duplicates have no defined order
                    flat = rng.permutation(int(np.prod(dims[:last])))[:tuples]
                    ind = np.stack(np.unravel_index(flat, dims[:last]), axis=-1).reshape(ind_dims)
                else:  # duplicates on purpose
                    ind = np.stack([rng.integers(0, dims[k], size=ind_dims[:-1]) for k in range(last)], axis=-1)
                ind = np.where(rng.random(ind.shape) < 0.3, ind - np.array(dims[:last]), ind).astype(np.int64)
                u_dims = ind_dims[:-1] + dims[last:]
                blob = make_model("ScatterND", [("X", sym("x", len(dims)), "x"), ("I", sym("i", len(ind_dims)),
                                                                                  TensorProto.INT64),
                                                ("U", sym("u", len(u_dims)), "x")],
                                  attrs={} if red == "none" else {"reduction": red}, opset=18, dt=dt)
                x = rand(dt, dims)
                u = rand(dt, u_dims)
                if red == "mul" and dt == "i64":
                    x, u = x % 5, u % 3
                run_case(f"ScatterND {dt} {red} ind={ind_dims}", blob, [{"X": x, "I": ind, "U": u}],
                         tol=None if red in ("none", "max", "min") else ftol(dt))


def test_scatter_elements():
    for dt in ["f32", "f16", "i64"]:
        for red in ["none", "add", "mul", "max", "min"]:
            for dims, axis, ind_dims in [([5, 4], 0, [3, 4]), ([5, 4], 1, [5, 2]), ([3, 4, 6], -1, [2, 3, 4])]:
                n = dims[axis]
                if red == "none":
                    # distinct positions along the axis within each line
                    perm = np.argsort(rng.random(ind_dims[:axis % len(dims)] + [n] + ind_dims[axis % len(dims) + 1:]),
                                      axis=axis)
                    ind = np.take(perm, np.arange(ind_dims[axis]), axis=axis)
                else:
                    ind = rng.integers(0, n, size=ind_dims)
                ind = np.where(rng.random(ind.shape) < 0.3, ind - n, ind).astype(np.int64)
                blob = make_model("ScatterElements", [("X", sym("x", len(dims)), "x"),
                                                      ("I", sym("i", len(dims)), TensorProto.INT64),
                                                      ("U", sym("i", len(dims)), "x")],
                                  attrs={"axis": axis, **({} if red == "none" else {"reduction": red})}, opset=18,
                                  dt=dt)
                x, u = rand(dt, dims), rand(dt, ind_dims)
                if red == "mul" and dt == "i64":
                    x, u = x % 5, u % 3
                run_case(f"ScatterElements {dt} {red} axis={axis}", blob, [{"X": x, "I": ind, "U": u}],
                         tol=None if red in ("none", "max", "min") else ftol(dt))


# ---- Pad, Expand, Tile ----

def test_pad():
    for dt in ["f32", "f16", "i64", "bool"]:
        for mode in ["constant", "reflect", "edge", "wrap"]:
            for dims, pads in [([3, 4], [1, 2, 2, 1]), ([2, 3, 5], [0, 1, 2, 1, 0, 3]), ([4, 5], [-1, 2, 1, -2]),
                               ([1, 1, 6], [0, 0, 3, 0, 0, 4]), ([3, 1], [2, 0, 0, 0])]:
                ins = [("X", sym("x", len(dims)), "x"), ("pads", None, None)]
                inits = [i64("pads", pads)]
                if mode == "constant" and dt != "bool":
                    cv = np.array(rand(dt, []) if dt != "i64" else 7, dtype=NP[dt])
                    inits.append(numpy_helper.from_array(cv, "cv"))
                    ins.append(("cv", None, None))
                blob = make_model("Pad", ins, attrs={"mode": mode}, opset=13, inits=inits, dt=dt)
                run_case(f"Pad {dt} {mode} pads={pads}", blob, [{"X": rand(dt, dims)}])
    # pads as a graph input (host input), axes (opset 18), the old attribute form
    blob = make_model("Pad", [("X", sym("x", 3), "x"), ("p", [4], TensorProto.INT64), ("cv", None, None),
                              ("ax", None, None)], attrs={"mode": "reflect"}, opset=18, inits=[i64("ax", [2, 0])])
    run_case("Pad axes reflect", blob, [{"X": rand("f32", [4, 3, 5]), "p": np.array([2, 1, 3, 2], np.int64)}])
    blob = make_model("Pad", [("X", sym("x", 2), "x")], attrs={"mode": "constant", "pads": [1, 0, 2, 3],
                                                                "value": 1.5}, opset=10)
    run_case("Pad opset 10 value", blob, [{"X": rand("f32", [3, 2])}])
    blob = make_model("Pad", [("X", sym("x", 2), "x"), ("pads", None, None)], attrs={"mode": "edge"}, opset=13,
                      inits=[i64("pads", [1, 1, 1, 1])])
    run_case("Pad edge empty axis (reference fails)", blob, [{"X": rand("f32", [0, 3])}])


def test_expand_tile():
    for dt in ["f32", "f16", "i64", "bool"]:
        for dims, shape in [([3, 1], [2, 3, 4]), ([1], [5]), ([2, 1, 4], [1, 3, 1]), ([4, 1], [4, 0]),
                            ([1, 1, 1, 7], [2, 3, 4, 1])]:
            blob = make_model("Expand", [("X", sym("x", len(dims)), "x"), ("S", None, None)],
                              inits=[i64("S", shape)], opset=13, dt=dt)
            run_case(f"Expand {dt} {dims}->{shape}", blob, [{"X": rand(dt, dims)}])
        blob = make_model("Expand", [("X", sym("x", 2), "x"), ("S", [3], TensorProto.INT64)], opset=13, dt=dt)
        run_case(f"Expand {dt} shape input", blob, [{"X": rand(dt, [3, 1]), "S": np.array([2, 1, 5], np.int64)}])
        for dims, reps in [([2, 3], [2, 1]), ([2, 1, 3], [1, 4, 2]), ([5], [3]), ([0, 2], [3, 2]), ([3, 2], [0, 1])]:
            blob = make_model("Tile", [("X", sym("x", len(dims)), "x"), ("R", None, None)],
                              inits=[i64("R", reps)], opset=13, dt=dt)
            run_case(f"Tile {dt} {dims}x{reps}", blob, [{"X": rand(dt, dims)}])


# ---- Range, reshapes, Trilu, OneHot ----

def test_range():
    for dt, vals in [("f32", [(0.5, 7.3, 0.7), (5, -3, -1.25), (1, 1, 1)]), ("i64", [(3, 40, 3), (10, -7, -4)]),
                     ("i32", [(-5, 6, 2), (0, 0, 1)]), ("f16", [(0, 3, 0.25)])]:
        for s, l, d in vals:
            np_dt = NP[dt]
            blob = make_model("Range", [("s", [], ELEM[dt]), ("l", [], ELEM[dt]), ("d", [], ELEM[dt])], opset=13,
                              dt=dt)
            run_case(f"Range {dt} {s},{l},{d}", blob,
                     [{"s": np.array(s, np_dt), "l": np.array(l, np_dt), "d": np.array(d, np_dt)}], tol=ftol(dt))


def test_reshapes():
    for dt in ["f32", "f16", "i64", "bool"]:
        blob = make_model("Reshape", [("X", sym("x", 3), "x"), ("S", None, None)], inits=[i64("S", [0, -1])],
                          opset=14, dt=dt)
        run_case(f"Reshape {dt}", blob, [{"X": rand(dt, [2, 3, 4])}, {"X": rand(dt, [3, 0, 2])}])
        blob = make_model("Reshape", [("X", sym("x", 2), "x"), ("S", [3], TensorProto.INT64)], opset=14, dt=dt)
        run_case(f"Reshape {dt} shape input", blob, [{"X": rand(dt, [4, 6]), "S": np.array([2, -1, 3], np.int64)}])
        blob = make_model("Flatten", [("X", sym("x", 4), "x")], attrs={"axis": 2}, opset=13, dt=dt)
        run_case(f"Flatten {dt}", blob, [{"X": rand(dt, [2, 3, 4, 5])}])
        blob = make_model("Squeeze", [("X", sym("x", 4), "x"), ("A", None, None)], inits=[i64("A", [1, -1])],
                          opset=13, dt=dt)
        run_case(f"Squeeze {dt}", blob, [{"X": rand(dt, [3, 1, 4, 1])}])
        blob = make_model("Unsqueeze", [("X", sym("x", 2), "x"), ("A", None, None)], inits=[i64("A", [0, 3])],
                          opset=13, dt=dt)
        run_case(f"Unsqueeze {dt}", blob, [{"X": rand(dt, [3, 4])}])
    # a reshape between two GPU ops (Transpose -> Reshape -> Transpose): a device-side copy
    nodes = [helper.make_node("Transpose", ["X"], ["T"], perm=[1, 0]),
             helper.make_node("Reshape", ["T", "S"], ["R"]),
             helper.make_node("Transpose", ["R"], ["Y0"], perm=[1, 0])]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", "b"])],
                          [helper.make_tensor_value_info("Y0", TensorProto.FLOAT, None)], [i64("S", [-1, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    run_case("Transpose-Reshape-Transpose", m.SerializeToString(), [{"X": rand("f32", [4, 6])}])


def test_trilu_onehot():
    for dt in ["f32", "f16", "i64", "bool"]:
        for upper in (0, 1):
            for dims, k in [([4, 5], 0), ([2, 3, 6], 1), ([2, 3, 6], -2), ([5, 3], 7), ([3, 0, 2], 0)]:
                blob = make_model("Trilu", [("X", sym("x", len(dims)), "x"), ("k", None, None)],
                                  attrs={"upper": upper}, opset=14, inits=[i64("k", k)], dt=dt)
                run_case(f"Trilu {dt} upper={upper} k={k}", blob, [{"X": rand(dt, dims)}])
    for dt in ["f32", "f16", "i64"]:
        for ind_dims, depth, axis in [([3, 4], 5, -1), ([6], 3, 0), ([2, 3], 4, 1)]:
            vals = rand(dt, [2])
            blob = make_model("OneHot", [("I", sym("i", len(ind_dims)), TensorProto.INT64), ("D", None, None),
                                         ("V", None, None)], attrs={"axis": axis}, opset=11,
                              inits=[i64("D", depth), numpy_helper.from_array(vals, "V")], dt=dt)
            ind = rng.integers(-depth - 1, depth + 1, size=ind_dims).astype(np.int64)
            run_case(f"OneHot {dt} depth={depth} axis={axis}", blob, [{"I": ind}])


def main():
    try:
        blob = make_model("Transpose", [("X", ["a", "b"], "x")])
        kiln.Session(blob, provider="cuda")
    except kiln.KilnError as e:
        print(f"SKIP: cannot create a cuda session ({e})")
        return 0
    for t in [test_transpose, test_concat, test_split, test_slice, test_gather, test_gather_elements, test_gather_nd,
              test_scatter_nd, test_scatter_elements, test_pad, test_expand_tile, test_range, test_reshapes,
              test_trilu_onehot]:
        t()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
