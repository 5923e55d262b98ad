#!/usr/bin/env python3
"""GPU element-wise kernels (src/gpu/k_ew.cu, ops_ew.c) against the CPU reference: unary math
and activations, broadcasting arithmetic, comparisons and logic, Sum/Mean/Max/Min, Where, Clip,
Cast and Identity, on random data over odd, size-1, zero-size and broadcast shapes, float32,
float16, bfloat16 (through Cast) and the integer and bool types each op takes. One session per
model serves every shape of its case (symbolic dims). Each case also checks that every node of
its model was placed on the GPU and ran there.

usage: KILN_LIB=<build>/libkiln.so python3 tests/gpu/test_gpu_ew.py [group...]
       (groups: unary clip binary variadic where cast chain; default all)
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

rng = np.random.default_rng(4242)

F32, F16, F64, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16
I32, I64, I8, U8, BOOL = TensorProto.INT32, TensorProto.INT64, TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL
NP = {F32: np.float32, F16: np.float16, F64: np.float64, I32: np.int32, I64: np.int64, I8: np.int8, U8: np.uint8,
      BOOL: np.bool_}
NAMES = {F32: "f32", F16: "f16", F64: "f64", BF16: "bf16", I32: "i32", I64: "i64", I8: "i8", U8: "u8", BOOL: "bool"}
TOL = {F32: (1e-4, 1e-5), F16: (1e-2, 1e-2), BF16: (2e-2, 2e-2), F64: (1e-6, 1e-9)}


def build(nodes, inputs, outputs, opset=17, inits=()):
    """inputs: [(name, onnx dtype, rank)] with symbolic dims (rank None: unknown rank, so that one
    session serves every rank); outputs: [(name, onnx dtype)]."""
    ins = [helper.make_tensor_value_info(n, t, None if r is None else [f"{n}_{k}" for k in range(r)])
           for n, t, r in inputs]
    outs = [helper.make_tensor_value_info(n, t, None) for n, t in outputs]
    g = helper.make_graph(nodes if isinstance(nodes, list) else [nodes], "ew", ins, outs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def describe(feeds):
    return " ".join(f"{k}:{v.dtype}{list(v.shape)}" for k, v in feeds.items())


def compare_arrays(got, want, tol):
    """None when equal (within tol for floats), else a description of the first mismatch."""
    if got.shape != want.shape:
        return f"shape {got.shape} vs reference {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} vs reference {want.dtype}"
    if got.size == 0:
        return None
    if np.issubdtype(want.dtype, np.floating):
        g, w = got.astype(np.float64), want.astype(np.float64)
        rtol, atol = tol
        with np.errstate(invalid="ignore"):
            ok = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
            diff = np.abs(g - w)
        if ok.all():
            return None
        finite = np.isfinite(diff)
        maxdiff = diff[finite].max() if finite.any() else float("nan")
    else:
        ok = got == want
        if ok.all():
            return None
        maxdiff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
    bad = tuple(int(i) for i in np.argwhere(~ok)[0])
    return (f"{int((~ok).sum())}/{ok.size} differ, max abs diff {maxdiff}, first bad index {bad}: "
            f"got {got[bad]!r} want {want[bad]!r}")


def run_case(name, blob, feeds_list, tol=TOL[F32]):
    """Runs feeds_list through one CUDA session and one reference session and compares."""
    try:
        gpu = kiln.Session(blob, provider="cuda")
    except kiln.KilnError as e:
        check(name, False, f"cuda session failed: {e}")
        return
    ref = kiln.Session(blob, unoptimized=True)
    for feeds in feeds_list:
        label = f"{name} [{describe(feeds)}]"
        try:
            want = ref.run(feeds)
        except kiln.KilnError as e:
            try:
                gpu.run(feeds)
                check(label, False, f"reference refused ({e}) but the GPU session ran")
            except kiln.KilnError:
                check(label, True)
            continue
        try:
            got = gpu.run(feeds)
        except kiln.KilnError as e:
            check(label, False, f"GPU run failed: {e}")
            continue
        for k, (g, w) in enumerate(zip(got, want)):
            err = compare_arrays(g, w, tol)
            check(f"{label} output {k}", err is None, err or "")
    st = gpu.stats()
    if st["runs"] == 0:
        return  # every feed was refused (checked above): nothing ran anywhere
    check(f"{name}: every node on the GPU", st["nodes_cpu"] == 0 and st["node_runs_gpu"] > 0,
          f"nodes_gpu={st['nodes_gpu']} nodes_cpu={st['nodes_cpu']} node_runs_gpu={st['node_runs_gpu']} "
          f"(`kiln info --provider cuda` says why a node stays on the CPU)")


# ---- data ----

def rand(shape, dt, kind="normal"):
    """Random array of numpy dtype dt; kind picks the value range (never all zeros)."""
    shape = tuple(shape)
    n = int(np.prod(shape))
    if dt == np.bool_:
        return (rng.random(n) < 0.5).reshape(shape)
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        lo, hi = (max(info.min, -50), min(info.max, 50)) if kind != "wide" else (info.min // 2, info.max // 2)
        return rng.integers(lo, hi, size=n, endpoint=True).astype(dt).reshape(shape)
    if kind == "positive":
        x = np.abs(rng.standard_normal(n)) + 0.1
    elif kind == "unit":
        x = rng.uniform(-0.95, 0.95, n)
    elif kind == "above1":
        x = 1.0 + np.abs(rng.standard_normal(n)) * 2
    elif kind == "halves":  # exact .5 values: Round's ties, Floor/Ceil edges
        x = rng.integers(-12, 12, size=n) / 2.0 + rng.choice([0.0, 0.25], size=n)
    elif kind == "small":  # few distinct values: comparisons see equal pairs
        x = rng.integers(-3, 3, size=n).astype(np.float64)
    elif kind == "special":  # NaN, +-Inf and ordinary values
        x = rng.standard_normal(n) * 3
        m = rng.random(n)
        x[m < 0.1] = np.nan
        x[(m >= 0.1) & (m < 0.2)] = np.inf
        x[(m >= 0.2) & (m < 0.3)] = -np.inf
    elif kind == "nonzero":  # divisors away from 0
        x = rng.standard_normal(n)
        x = np.sign(x) * (np.abs(x) + 0.5)
    else:
        x = rng.standard_normal(n) * 2
    return x.astype(dt).reshape(shape)


UNARY_SHAPES = [(), (1,), (7,), (3, 5), (1023,), (4, 33, 17), (2, 0, 3), (0,), (5, 1, 1, 4097)]


# ---- unary ----

UNARY = [  # op, attributes, input range
    ("Abs", {}, "normal"), ("Neg", {}, "normal"), ("Sign", {}, "special"), ("Relu", {}, "normal"),
    ("Reciprocal", {}, "nonzero"), ("Floor", {}, "halves"), ("Ceil", {}, "halves"), ("Round", {}, "halves"),
    ("Sqrt", {}, "positive"), ("Exp", {}, "normal"), ("Log", {}, "positive"), ("Sin", {}, "normal"),
    ("Cos", {}, "normal"), ("Tan", {}, "unit"), ("Asin", {}, "unit"), ("Acos", {}, "unit"), ("Atan", {}, "normal"),
    ("Sinh", {}, "normal"), ("Cosh", {}, "normal"), ("Asinh", {}, "normal"), ("Acosh", {}, "above1"),
    ("Atanh", {}, "unit"), ("Erf", {}, "normal"), ("Sigmoid", {}, "normal"), ("Tanh", {}, "normal"),
    ("LeakyRelu", {}, "normal"), ("LeakyRelu", {"alpha": 0.3}, "normal"), ("Elu", {}, "normal"),
    ("Elu", {"alpha": 0.5}, "normal"), ("Selu", {}, "normal"), ("Selu", {"alpha": 1.5, "gamma": 2.0}, "normal"),
    ("Celu", {}, "normal"), ("Celu", {"alpha": 2.0}, "normal"), ("HardSigmoid", {}, "normal"),
    ("HardSigmoid", {"alpha": 0.4, "beta": 0.3}, "normal"), ("HardSwish", {}, "normal"), ("Softplus", {}, "normal"),
    ("Softsign", {}, "normal"), ("ThresholdedRelu", {}, "normal"), ("ThresholdedRelu", {"alpha": 0.5}, "normal"),
    ("Shrink", {}, "normal"), ("Shrink", {"lambd": 1.0, "bias": 0.25}, "normal"), ("Mish", {}, "normal"),
    ("IsNaN", {}, "special"), ("IsInf", {}, "special"), ("IsInf", {"detect_negative": 0}, "special"),
    ("IsInf", {"detect_positive": 0}, "special"),
]


def unary_model(op, attrs, dt, rank, opset=17):
    """X (dt) -> op -> Y; bfloat16 through Casts from and to float32."""
    out_t = BOOL if op in ("IsNaN", "IsInf") else dt
    if dt != BF16:
        return build(helper.make_node(op, ["X"], ["Y"], **attrs), [("X", dt, rank)], [("Y", out_t)], opset)
    nodes = [helper.make_node("Cast", ["X"], ["Xb"], to=BF16), helper.make_node(op, ["Xb"], ["Yb"], **attrs)]
    if out_t == BOOL:
        nodes[-1] = helper.make_node(op, ["Xb"], ["Y"], **attrs)
    else:
        nodes.append(helper.make_node("Cast", ["Yb"], ["Y"], to=F32))
    return build(nodes, [("X", F32, rank)], [("Y", BOOL if out_t == BOOL else F32)], opset)


def test_unary():
    for op, attrs, kind in UNARY:
        for dt in (F32, F16, BF16):
            if dt == BF16 and op not in ("Relu", "Sigmoid", "Exp", "Tanh", "Abs", "Neg", "IsNaN", "Round", "Erf"):
                continue
            np_dt = np.float32 if dt == BF16 else NP[dt]
            blob = unary_model(op, attrs, dt, None)
            run_case(f"{op}{attrs} {NAMES[dt]}", blob, [{"X": rand(s, np_dt, kind)} for s in UNARY_SHAPES], TOL[dt])
    for approx in ("none", "tanh"):
        for dt in (F32, F16, BF16):
            blob = unary_model("Gelu", {"approximate": approx}, dt, 3, opset=20)
            feeds = [{"X": rand(s, np.float32 if dt == BF16 else NP[dt])} for s in [(2, 3, 5), (1, 1, 1025), (0, 2, 2)]]
            run_case(f"Gelu approximate={approx} {NAMES[dt]}", blob, feeds, TOL[dt])
    # Swish (opset 24 in ONNX; kiln's reference takes it at any opset)
    for attrs in ({}, {"alpha": 1.702}):
        blob = unary_model("Swish", attrs, F32, 2, opset=24)
        run_case(f"Swish{attrs} f32", blob, [{"X": rand(s, np.float32)} for s in [(3, 7), (1, 4096), (0, 1)]])
    # integer Abs, Neg, Sign, Relu (wrapping at the minimum)
    for op in ("Abs", "Neg", "Sign", "Relu"):
        for dt in (I32, I64):
            blob = unary_model(op, {}, dt, 2)
            feeds = [{"X": rand(s, NP[dt])} for s in [(3, 7), (1, 1), (0, 5), (17, 129)]]
            x = rand((2, 3), NP[dt])
            x[0, 0] = np.iinfo(NP[dt]).min
            feeds.append({"X": x})
            run_case(f"{op} {NAMES[dt]}", blob, feeds)
    # Not
    blob = build(helper.make_node("Not", ["X"], ["Y"]), [("X", BOOL, 2)], [("Y", BOOL)])
    run_case("Not bool", blob, [{"X": rand(s, np.bool_)} for s in [(3, 5), (1, 1), (0, 3), (33, 129)]])


# ---- Clip ----

def test_clip():
    shapes = [(3, 5), (1, 1), (0, 4), (17, 1029)]
    # opset 6: attributes
    for attrs in ({}, {"min": -0.5}, {"max": 0.7}, {"min": -1.0, "max": 1.0}, {"min": 1.0, "max": -1.0}):
        for dt in (F32, F16):
            blob = build(helper.make_node("Clip", ["X"], ["Y"], **attrs), [("X", dt, 2)], [("Y", dt)], opset=6)
            run_case(f"Clip-6 {attrs} {NAMES[dt]}", blob, [{"X": rand(s, NP[dt], "special")} for s in shapes], TOL[dt])
    # opset 13: min/max as inputs, fed (the executor hands them over on the host) or absent
    for dt in (F32, F16, I32, I64):
        npd = NP[dt]
        for names in (["X", "lo", "hi"], ["X", "", "hi"], ["X", "lo"], ["X"]):
            inputs = [("X", dt, 2)] + [(nm, dt, 0) for nm in names[1:] if nm]
            blob = build(helper.make_node("Clip", names, ["Y"]), inputs, [("Y", dt)], opset=13)
            feeds = []
            for s in shapes:
                f = {"X": rand(s, npd, "special" if dt in (F32, F16) else "normal")}
                lo, hi = (-0.8, 1.2) if dt in (F32, F16) else (-20, 30)
                if rng.random() < 0.25:
                    lo, hi = hi, lo  # min > max: everything becomes max
                if "lo" in names:
                    f["lo"] = np.array(lo, dtype=npd)
                if "hi" in names:
                    f["hi"] = np.array(hi, dtype=npd)
                feeds.append(f)
            run_case(f"Clip-13 inputs {names} {NAMES[dt]}", blob, feeds, TOL.get(dt, TOL[F32]))
    # opset 11 with constant bounds (initializers)
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "lo"), numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    blob = build(helper.make_node("Clip", ["X", "lo", "hi"], ["Y"]), [("X", F32, 4)], [("Y", F32)], 11, inits)
    run_case("Clip-11 relu6 initializers", blob, [{"X": rand(s, np.float32) * 4} for s in [(1, 3, 5, 5), (2, 8, 1, 33)]])


# ---- binary ----

BCAST = [  # (A shape, B shape)
    ((7,), (7,)), ((1023,), (1023,)), ((3, 5), (3, 5)), ((2, 3, 4, 5), (2, 3, 4, 5)),  # same shape
    ((), ()), ((), (3, 4)), ((3, 4), ()), ((1,), (4099,)), ((4099,), (1,)),  # scalars
    ((4, 5, 6), (6,)), ((4, 5, 6), (1, 6)), ((6,), (4, 5, 6)),  # rows
    ((2, 3, 4, 5), (3, 1, 1)), ((2, 3, 4, 5), (1, 3, 1, 1)), ((3, 1, 1), (2, 3, 4, 5)),  # channels
    ((5, 1), (1, 6)), ((1, 6), (5, 1)),  # outer product
    ((2, 1, 4, 1, 3), (5, 1, 3)), ((2, 4, 3, 3), (2, 1, 1, 3)), ((1, 3, 1, 2), (2, 1, 3, 1)),  # general
    ((0, 3), (3,)), ((2, 0, 4), (1, 1, 4)), ((1,), (0,)),  # zero-size
    ((1, 1, 1), (1,)), ((1, 1), (1, 1)),  # size 1
    ((2, 1, 2, 1, 2, 1, 2, 1, 2, 1), (1, 2, 1, 2, 1, 2, 1, 2, 1, 2)),  # rank 10: no dims merge (fallback)
    ((2, 3, 1, 1, 1, 1, 1, 1, 1, 4), (3, 1, 1, 1, 1, 1, 1, 1, 4)),  # rank 10 that merges down
    ((8, 64, 33, 33), (64, 1, 1)), ((257, 1031), (257, 1031)), ((3, 65, 1000), (1000,)),  # large
]

ARITH = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "PRelu"]
COMPARE = ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]


def binary_data(op, shape, npd, which):
    if np.issubdtype(npd, np.integer) or npd == np.bool_:
        if op == "Pow":  # small bases, exponents from -2 to 4
            return (rand(shape, npd) % 7 - 2) if which == "B" else (rand(shape, npd) % 9 - 4)
        return rand(shape, npd)
    if op in COMPARE:
        return rand(shape, npd, "small")
    if op == "Div" and which == "B":
        return rand(shape, npd, "nonzero")
    if op == "Pow":
        if which == "A":
            return rand(shape, npd, "positive") * 2
        return rand(shape, npd, "normal")
    if op in ("Max", "Min"):
        return rand(shape, npd, "special")
    if op == "Mod" and which == "B":
        return rand(shape, npd, "nonzero")
    return rand(shape, npd)


def binary_cases(op, dt, attrs=None, shapes=BCAST, opset=17, tb=None):
    """One session (inputs of unknown rank) for every shape pair, and one with symbolic dims of
    fixed ranks for the pairs of the first pair's ranks."""
    attrs = attrs or {}
    tb = tb or dt
    out_t = BOOL if op in COMPARE else dt
    shapes = [(sa, sb) for sa, sb in shapes if not (op == "PRelu" and len(sb) > len(sa))]  # slope onto X only
    ra0, rb0 = len(shapes[0][0]), len(shapes[0][1])
    groups = {(None, None): shapes, (ra0, rb0): [p for p in shapes if (len(p[0]), len(p[1])) == (ra0, rb0)]}
    for (ra, rb), pairs in groups.items():
        if dt == BF16:
            nodes = [helper.make_node("Cast", ["A"], ["Ab"], to=BF16), helper.make_node("Cast", ["B"], ["Bb"], to=BF16),
                     helper.make_node(op, ["Ab", "Bb"], ["Yb"], **attrs)]
            if out_t == BOOL:
                nodes[-1] = helper.make_node(op, ["Ab", "Bb"], ["Y"], **attrs)
            else:
                nodes.append(helper.make_node("Cast", ["Yb"], ["Y"], to=F32))
            blob = build(nodes, [("A", F32, ra), ("B", F32, rb)], [("Y", BOOL if out_t == BOOL else F32)], opset)
            npa = npb = np.float32
        else:
            blob = build(helper.make_node(op, ["A", "B"], ["Y"], **attrs), [("A", dt, ra), ("B", tb, rb)],
                         [("Y", out_t)], opset)
            npa, npb = NP[dt], NP[tb]
        feeds = [{"A": binary_data(op, sa, npa, "A"), "B": binary_data(op, sb, npb, "B")} for sa, sb in pairs]
        run_case(f"{op}{attrs or ''} {NAMES[dt]}{'/' + NAMES[tb] if tb != dt else ''} ranks {ra},{rb}", blob, feeds,
                 TOL.get(dt, TOL[F32]))


def test_binary():
    for op in ARITH:
        for dt in (F32, F16, BF16, I32, I64):
            if op == "Mod":
                if dt == BF16:
                    continue
                binary_cases(op, dt, {"fmod": 1})
                binary_cases(op, dt, {"fmod": 0})
            else:
                binary_cases(op, dt)
    # Pow with an exponent of another dtype
    for ta, tb in ((F32, I64), (F32, I32), (F16, F32), (F32, F16)):
        binary_cases("Pow", ta, tb=tb, shapes=BCAST[:12])
    for op in COMPARE:
        for dt in (F32, F16, I32, I64, BOOL):
            binary_cases(op, dt)
    for op in ("And", "Or", "Xor"):
        binary_cases(op, BOOL)
    # integer division edge cases: by 0, by -1 at the minimum
    for dt in (I32, I64):
        mn = np.iinfo(NP[dt]).min
        a = np.array([7, -7, 7, -7, mn, mn, 5, 0, 13, -13], NP[dt])
        b = np.array([2, 2, -2, -2, -1, 1, 0, 3, 0, -1], NP[dt])
        for op, attrs in (("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})):
            blob = build(helper.make_node(op, ["A", "B"], ["Y"], **attrs), [("A", dt, 1), ("B", dt, 1)], [("Y", dt)])
            run_case(f"{op}{attrs} {NAMES[dt]} edges", blob, [{"A": a, "B": b}])
    # legacy broadcast (opset 6: broadcast=1 with axis; PRelu's slope on axis 1)
    for axis, sb in ((1, (3, 4)), (0, (2,)), (2, (4, 5)), (None, (5,))):
        attrs = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
        for op in ("Add", "Mul", "Sub"):
            blob = build(helper.make_node(op, ["A", "B"], ["Y"], **attrs), [("A", F32, 4), ("B", F32, len(sb))],
                         [("Y", F32)], opset=6)
            run_case(f"{op}-6 {attrs} B{sb}", blob, [{"A": rand((2, 3, 4, 5), np.float32), "B": rand(sb, np.float32)}])
    blob = build(helper.make_node("PRelu", ["X", "S"], ["Y"]), [("X", F32, 4), ("S", F32, 1)], [("Y", F32)], opset=6)
    run_case("PRelu-6 channel slope", blob, [{"X": rand((2, 3, 4, 5), np.float32), "S": rand((3,), np.float32)}])


# ---- Sum, Mean, Max, Min ----

def test_variadic():
    sets = [  # shapes of the inputs
        [(3, 5)], [(3, 5), (3, 5)], [(3, 5), (5,), (1, 5), ()], [(2, 1, 4), (3, 1), (2, 3, 4)],
        [(1029,), (1029,), (1029,)], [(0, 4), (4,)], [(4, 1, 6), (1, 5, 1), (6,), (4, 5, 6)],
    ]
    for op in ("Sum", "Mean", "Max", "Min"):
        for dt in (F32, F16, I32, I64):
            if op == "Mean" and dt in (I32, I64):
                continue
            for shapes in sets:
                names = [f"X{i}" for i in range(len(shapes))]
                blob = build(helper.make_node(op, names, ["Y"]), [(n, dt, len(s)) for n, s in zip(names, shapes)],
                             [("Y", dt)])
                kind = "special" if op in ("Max", "Min") else "normal"
                feeds = [{n: rand(s, NP[dt], kind) for n, s in zip(names, shapes)}]
                run_case(f"{op} {NAMES[dt]} {shapes}", blob, feeds, TOL.get(dt, TOL[F32]))
    # the same input twice
    blob = build(helper.make_node("Sum", ["X", "X", "X"], ["Y"]), [("X", F32, 2)], [("Y", F32)])
    run_case("Sum X+X+X", blob, [{"X": rand((5, 7), np.float32)}])


# ---- Where ----

def test_where():
    shapes = [((3, 5), (3, 5), (3, 5)), ((4, 1), (1, 5), ()), ((), (3, 4), (3, 4)), ((2, 3, 4), (3, 1), (4,)),
              ((1029,), (1029,), (1,)), ((0, 3), (3,), (1, 3)), ((2, 1, 4, 1, 3), (5, 1, 3), (2, 1, 1, 1, 1)),
              ((8, 1, 1, 64), (8, 12, 64, 64), ())]
    for dt in (F32, F16, I64, I32, BOOL, U8, F64, BF16):
        for (rc, rx, ry), group in {(None, None, None): shapes, (2, 2, 2): shapes[:1]}.items():
            if dt == BF16:
                nodes = [helper.make_node("Cast", ["X"], ["Xb"], to=BF16), helper.make_node("Cast", ["Y"], ["Yb"], to=BF16),
                         helper.make_node("Where", ["C", "Xb", "Yb"], ["Ob"]), helper.make_node("Cast", ["Ob"], ["O"], to=F32)]
                blob = build(nodes, [("C", BOOL, rc), ("X", F32, rx), ("Y", F32, ry)], [("O", F32)])
                npd = np.float32
            else:
                blob = build(helper.make_node("Where", ["C", "X", "Y"], ["O"]),
                             [("C", BOOL, rc), ("X", dt, rx), ("Y", dt, ry)], [("O", dt)])
                npd = NP[dt]
            feeds = [{"C": rand(sc, np.bool_), "X": rand(sx, npd), "Y": rand(sy, npd)} for sc, sx, sy in group]
            run_case(f"Where {NAMES[dt]} ranks {rc},{rx},{ry}", blob, feeds, TOL.get(dt, TOL[F32]))


# ---- Cast, CastLike, Identity ----

CAST_TYPES = [F32, F16, BF16, F64, I32, I64, I8, U8, BOOL]


def cast_source(dt, shape):
    if dt == BOOL:
        return rand(shape, np.bool_)
    if dt in (I32, I64, I8, U8):
        return rand(shape, NP[dt], "wide")
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * 100
    m = rng.random(n)
    x[m < 0.05] = np.nan
    x[(m >= 0.05) & (m < 0.1)] = np.inf
    x[(m >= 0.1) & (m < 0.15)] = -np.inf
    x[(m >= 0.15) & (m < 0.2)] = 0.0
    x[(m >= 0.2) & (m < 0.25)] *= 1e8  # beyond int32 and 8-bit ranges
    ties = (m >= 0.25) & (m < 0.3)
    x[ties] = rng.integers(-3, 3, size=int(ties.sum())) + 0.5
    x = x.reshape(shape)
    if dt == F16:
        x = np.where(np.isfinite(x), np.clip(x, -60000, 60000), x)
    return x.astype(np.float32 if dt == BF16 else NP[dt])


def test_cast():
    shapes = [(3, 5), (1, 1), (0, 7), (33, 129)]
    for src in CAST_TYPES:
        for dst in CAST_TYPES:
            if src == dst and src == BF16:
                continue
            nodes, in_t, out_t, cur = [], src, dst, "X"
            if src == BF16:  # feed float32, make bfloat16 on the GPU first
                nodes.append(helper.make_node("Cast", ["X"], ["Xb"], to=BF16))
                in_t, cur = F32, "Xb"
            last = "Y" if dst != BF16 else "Yb"
            nodes.append(helper.make_node("Cast", [cur], [last], to=dst))
            if dst == BF16:
                nodes.append(helper.make_node("Cast", ["Yb"], ["Y"], to=F32))
                out_t = F32
            blob = build(nodes, [("X", in_t, 2)], [("Y", out_t)])
            tol = TOL[BF16] if BF16 in (src, dst) else (0.0, 0.0)
            run_case(f"Cast {NAMES[src]} -> {NAMES[dst]}", blob, [{"X": cast_source(src, s)} for s in shapes], tol)
    # CastLike: the target's dtype decides
    for dst in (F16, I64, BOOL):
        blob = build(helper.make_node("CastLike", ["X", "T"], ["Y"]), [("X", F32, 2), ("T", dst, 1)], [("Y", dst)])
        run_case(f"CastLike f32 -> {NAMES[dst]}", blob,
                 [{"X": cast_source(F32, s), "T": rand((1,), NP[dst])} for s in shapes], (0.0, 0.0))
    for dt in (F32, F16, I64, BOOL, U8):
        blob = build(helper.make_node("Identity", ["X"], ["Y"]), [("X", dt, 3)], [("Y", dt)])
        run_case(f"Identity {NAMES[dt]}", blob, [{"X": rand(s, NP[dt])} for s in [(2, 3, 4), (1, 1, 1), (0, 2, 3), (5, 1, 2049)]])


# ---- a chain: buffers reused in place, shapes changing every call ----

def test_chain():
    nodes = [helper.make_node("Relu", ["X"], ["r"]), helper.make_node("Add", ["r", "B"], ["a"]),
             helper.make_node("Mul", ["a", "C"], ["m"]), helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("Greater", ["s", "T"], ["g"]), helper.make_node("Where", ["g", "s", "X"], ["w"]),
             helper.make_node("Cast", ["w"], ["h"], to=F16), helper.make_node("Cast", ["h"], ["Y"], to=F32)]
    blob = build(nodes, [("X", F32, 3), ("B", F32, 1), ("C", F32, 3), ("T", F32, 0)], [("Y", F32)])
    feeds = []
    for n, c, h in [(2, 3, 4), (1, 1, 1), (4, 7, 33), (3, 5, 1), (0, 2, 3), (2, 3, 4)]:
        feeds.append({"X": rand((n, c, h), np.float32), "B": rand((h,), np.float32), "C": rand((1, c, 1), np.float32),
                      "T": np.array(0.5, np.float32)})
    run_case("chain Relu-Add-Mul-Sigmoid-Greater-Where-Cast", blob, feeds, TOL[F16])


def main():
    try:
        kiln.Session(build(helper.make_node("Relu", ["X"], ["Y"]), [("X", F32, 1)], [("Y", F32)]), provider="cuda")
    except kiln.KilnError as e:
        print(f"SKIP: no CUDA session ({e})")
        return 0
    tests = (test_unary, test_clip, test_binary, test_variadic, test_where, test_cast, test_chain)
    wanted = sys.argv[1:]  # e.g. `binary cast`: only those groups
    for t in tests:
        if not wanted or t.__name__[5:] in wanted:
            t()
    return summary("test_gpu_ew: ")


if __name__ == "__main__":
    sys.exit(main())
