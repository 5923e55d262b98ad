#!/usr/bin/env python3
"""test_gpu_fused.py - generated kernels (src/gpu/ops_fused.c): element-wise chains that the GPU
pipeline fuses into kiln.FusedElementwise nodes, compiled by NVRTC when the session is created
and kept in the on-disk kernel cache.

- random element-wise DAGs (unary ops with attributes, binary ops with broadcasting and scalar
  constants, Cast between float32, float16 and bfloat16 and from int64 and bool, Clip, Where on
  a Greater, a mask chain), float32 and float16 graph inputs with symbolic dims, each session fed
  several shapes (odd sizes, broadcasts along different axes, > 2^16 elements): the CUDA session
  against the CPU reference (an unoptimized CPU session), its fused nodes on the GPU, at least
  one kernel generated, no node falling back, and no kernel compiled after creation;
- the BERT patterns the exporter writes: bias Add + Gelu's Erf form, the attention mask's Cast ->
  Sub -> Mul feeding the scores' Div -> Add, a residual Add, in float32 and float16;
- the cache: a second process loads every kernel from it (kernels_from_cache), a corrupted entry
  is a miss that recompiles with the right results, an unusable cache folder runs without a cache
  and says so once in the stats, and KILN_RTC=0 leaves the chains unfused with the same results.

usage: KILN_LIB=<build>/libkiln.so test_gpu_fused.py   (prints SKIP without a GPU)
  KILN_GPU_TEST_PROVIDER=cpu  runs the "GPU" sessions on the CPU (checks the test itself)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from checks import check, close, summary  # noqa: E402
import kiln  # noqa: E402

PROVIDER = os.environ.get("KILN_GPU_TEST_PROVIDER", "cuda")
CACHE = tempfile.mkdtemp(prefix="kiln-cache-test-")
os.environ["KILN_CACHE_DIR"] = CACHE
rng = np.random.default_rng(4242)
F32, F16, BF16, I64, BOOL = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT64, TensorProto.BOOL
NP = {F32: np.float32, F16: np.float16}
TOL = {F32: (2e-5, 2e-5), F16: (4e-3, 4e-3)}  # relative to max(1, max |ref|), absolute


def make_model(nodes, inputs, outputs, inits=(), opset=20):
    g = helper.make_graph(nodes, "fused", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m.SerializeToString()


def fused_nodes(sess):
    return [(op, p) for _, op, p in sess.nodes() if op == "FusedElementwise"]


def run_case(name, blob, feeds_list, elem, expect_fused=True, expect_note=False):
    """The CUDA session against the reference on every feed; structure checks (expect_fused:
    the graph has a group to fuse; expect_note: the kernel cache is meant to be unusable)."""
    t = time.perf_counter()
    try:
        gpu = kiln.Session(blob, provider=PROVIDER)
    except kiln.KilnError as e:
        return check(f"{name}: create", False, str(e))
    created = time.perf_counter() - t
    ref = kiln.Session(blob, unoptimized=True, provider="cpu")
    st0 = gpu.stats() if PROVIDER == "cuda" else None
    if PROVIDER == "cuda":
        fused = fused_nodes(gpu)
        if expect_fused:
            check(f"{name}: fused nodes on the GPU", fused and all(p == "cuda" for _, p in fused), fused)
            check(f"{name}: kernels generated", st0["kernels_generated"] >= 1 and bool(st0["kernels_note"]) == expect_note,
                  f"{st0['kernels_generated']} kernels, note '{st0['kernels_note']}'")
        check(f"{name}: no fallback", st0["nodes_fallback"] == 0, st0["nodes_fallback"])
    rtol, atol = TOL[elem]
    for feeds in feeds_list:
        label = f"{name} " + " ".join(f"{k}={v.shape}" for k, v in feeds.items())
        try:
            got, want = gpu.run(feeds), ref.run(feeds)
        except kiln.KilnError as e:
            check(label, False, str(e))
            continue
        close(label, got, want, rtol, atol)
    if PROVIDER == "cuda":
        st = gpu.stats()
        check(f"{name}: nothing compiled after creation", st["kernels_generated"] == st0["kernels_generated"])
        check(f"{name}: the runs ran no node on the host", st["node_runs_cpu"] == 0 or not expect_fused,
              st["node_runs_cpu"])
    return created, (st0 or {})


# ---------------------------------------------------------------- random DAGs

UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Erf", "Softplus", "HardSwish", "HardSigmoid",
         "LeakyRelu", "Elu", "Gelu", "Reciprocal", "Floor", "Sin", "Softsign", "Mish", "Selu", "Celu"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"]


def random_dag(seed, elem):
    """A DAG over inputs A [n, s, c], B [c], C [n, 1, c], M [n, s] (bool mask as int64) of dtype elem."""
    r = np.random.default_rng(seed)
    nodes, inits = [], [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                        numpy_helper.from_array(np.array(-0.75, np.float32), "neg"),
                        numpy_helper.from_array(np.array(-1.5, NP[elem]), "lo"),
                        numpy_helper.from_array(np.array(2.5, NP[elem]), "hi")]
    inputs = [helper.make_tensor_value_info("A", elem, ["n", "s", "c"]), helper.make_tensor_value_info("B", elem, ["c"]),
              helper.make_tensor_value_info("C", elem, ["n", 1, "c"]), helper.make_tensor_value_info("M", I64, ["n", "s"])]
    vals = [("A", elem), ("B", elem), ("C", elem)]
    count = [0]

    def new():
        count[0] += 1
        return f"t{count[0]}"

    def cast(v, to):
        out = new()
        nodes.append(helper.make_node("Cast", [v], [out], to=to))
        return out

    steps = int(r.integers(3, 12))
    for _ in range(steps):
        kind = int(r.integers(0, 8))
        a, adt = vals[-1 - int(r.integers(0, min(3, len(vals))))]
        out = new()
        if kind <= 1:
            op = UNARY[int(r.integers(0, len(UNARY)))]
            attrs = {}
            if op == "HardSigmoid":
                attrs = {"alpha": 0.3, "beta": 0.4}
            if op == "LeakyRelu":
                attrs = {"alpha": 0.2}
            if op == "Gelu" and r.integers(0, 2):
                attrs = {"approximate": "tanh"}
            nodes.append(helper.make_node(op, [a], [out], **attrs))
        elif kind <= 3:
            op = BINARY[int(r.integers(0, len(BINARY)))]
            b, bdt = vals[int(r.integers(0, len(vals)))]
            if r.integers(0, 3) == 0 or op == "Pow":
                b, bdt = cast("two" if op == "Pow" else "neg", adt), adt
            if bdt != adt:
                b = cast(b, adt)
            if op == "Pow":
                a2 = new()
                nodes.append(helper.make_node("Abs", [a], [a2]))
                a = a2
            nodes.append(helper.make_node(op, [a, b], [out]))
        elif kind == 4:
            to = {F32: F16, F16: BF16, BF16: F32}[adt]
            nodes.append(helper.make_node("Cast", [a], [out], to=to))
            adt = to
        elif kind == 5:
            lo, hi = ("lo", "hi") if adt == elem else (cast("lo", adt), cast("hi", adt))
            nodes.append(helper.make_node("Clip", [a, lo, hi], [out]))
        elif kind == 6:
            g = new()
            nodes.append(helper.make_node("Greater", ["A", "lo"], [g]))
            b = "C" if adt == elem else cast("C", adt)
            nodes.append(helper.make_node("Where", [g, a, b], [out]))
        else:  # the mask: a + (1 - float(M)) * -0.75, M [n, s] unsqueezed to [n, s, 1]
            u = new()
            nodes.append(helper.make_node("Unsqueeze", ["M", "axes"], [u]))
            mf = cast(u, adt)
            one = cast("two", adt)
            sub, mul = new(), new()
            nodes.append(helper.make_node("Sub", [one, mf], [sub]))
            nodes.append(helper.make_node("Mul", [sub, cast("neg", adt)], [mul]))
            nodes.append(helper.make_node("Add", [a, mul], [out]))
        vals.append((out, adt))
    last, ldt = vals[-1]
    if ldt != F32:
        last = cast(last, F32)
    inits.append(numpy_helper.from_array(np.array([2], np.int64), "axes"))
    outputs = [helper.make_tensor_value_info(last, F32, None)]
    if seed % 3 == 0 and len(vals) > 6:  # an intermediate read outside its group
        mid = cast(vals[-3][0], F32)
        outputs.append(helper.make_tensor_value_info(mid, F32, None))
    return make_model(nodes, inputs, outputs, inits)


def dag_feeds(elem):
    out = []
    for n, s, c in [(2, 3, 5), (1, 7, 64), (3, 129, 67), (4, 128, 256)]:
        f = {"A": rng.standard_normal((n, s, c)).astype(NP[elem]), "B": rng.standard_normal(c).astype(NP[elem]),
             "C": rng.standard_normal((n, 1, c)).astype(NP[elem]), "M": rng.integers(0, 2, (n, s)).astype(np.int64)}
        out.append(f)
    return out


def test_random():
    fused = 0
    for elem in (F32, F16):
        for seed in range(24):
            blob = random_dag(seed, elem)
            # a DAG may hold no group of two (its chain broken by Greater or Unsqueeze): the CPU's
            # kiln (no such pass) cannot tell, so the placement checks apply where the GPU fused
            groups = fused_nodes(kiln.Session(blob, provider=PROVIDER)) if PROVIDER == "cuda" else []
            fused += bool(groups)
            run_case(f"dag {seed} {'f32' if elem == F32 else 'f16'}", blob, dag_feeds(elem), elem,
                     expect_fused=bool(groups))
    if PROVIDER == "cuda":
        check("most random DAGs fuse", fused >= 40, f"{fused} of 48")


# ---------------------------------------------------------------- BERT's element-wise patterns

def bert_block(elem):
    """scores [b, h, s, s] / 8 + (1 - float(mask)) * -10000; h = gelu(x @ W + bias) + residual"""
    nodes = [
        helper.make_node("Unsqueeze", ["mask", "ax12"], ["m4"]),
        helper.make_node("Cast", ["m4"], ["mf"], to=elem),
        helper.make_node("Sub", ["one", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["bias_mask"]),
        helper.make_node("Div", ["scores", "eight"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias_mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["P"], axis=-1),
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "bias"], ["pre"]),
        helper.make_node("Div", ["pre", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["pre", "e1"], ["p"]),
        helper.make_node("Mul", ["p", "half"], ["g"]),
        helper.make_node("Add", ["g", "x"], ["H"]),
    ]
    dt = NP[elem]
    inits = [numpy_helper.from_array(np.array(v, dt), n) for n, v in
             [("one", 1.0), ("big", -10000.0), ("eight", 8.0), ("sqrt2", 1.4142135), ("half", 0.5)]]
    inits += [numpy_helper.from_array(np.array([1, 2], np.int64), "ax12"),
              numpy_helper.from_array((rng.standard_normal((48, 48)) * 0.2).astype(dt), "W"),
              numpy_helper.from_array(rng.standard_normal(48).astype(dt), "bias")]
    inputs = [helper.make_tensor_value_info("scores", elem, ["b", 4, "s", "s"]),
              helper.make_tensor_value_info("mask", I64, ["b", "s"]),
              helper.make_tensor_value_info("x", elem, ["b", "s", 48])]
    outputs = [helper.make_tensor_value_info("P", elem, None), helper.make_tensor_value_info("H", elem, None)]
    return make_model(nodes, inputs, outputs, inits, opset=17)


def test_bert():
    for elem in (F32, F16):
        feeds = []
        for b, s in [(1, 7), (2, 128), (3, 33)]:
            mask = np.ones((b, s), np.int64)
            mask[:, s - s // 3:] = 0
            feeds.append({"scores": rng.standard_normal((b, 4, s, s)).astype(NP[elem]) * 4, "mask": mask,
                          "x": rng.standard_normal((b, s, 48)).astype(NP[elem])})
        name = f"bert patterns {'f32' if elem == F32 else 'f16'}"
        blob = bert_block(elem)
        run_case(name, blob, feeds, elem)
        if PROVIDER == "cuda":
            s = kiln.Session(blob, provider=PROVIDER)
            ops = [op for _, op, _ in s.nodes()]
            # mask + scale in one node, bias + Gelu + residual in one: Softmax and MatMul stay
            ew = {"Add", "Sub", "Mul", "Div", "Erf", "Cast"}
            check(f"{name}: two fused nodes", ops.count("FusedElementwise") == 2 and not ew & set(ops), ops)


# ---------------------------------------------------------------- the cache

CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import kiln
t = time.perf_counter()
s = kiln.Session(open(sys.argv[2], "rb").read(), provider="cuda")
dt = time.perf_counter() - t
st = s.stats()
print(st["kernels_generated"], st["kernels_from_cache"], f"{dt:.3f}", repr(st["kernels_note"]))
"""


def child(path, env=None):
    e = dict(os.environ, **(env or {}))
    p = subprocess.run([sys.executable, "-c", CHILD, os.path.join(HERE, "..", "..", "python"), path],
                       capture_output=True, text=True, env=e, timeout=300)
    if p.returncode:
        return None
    gen, hit, secs, note = p.stdout.split(maxsplit=3)
    return int(gen), int(hit), float(secs), note.strip()


def test_cache():
    if PROVIDER != "cuda":
        return
    blob = bert_block(F16)
    path = os.path.join(CACHE, f"kiln-fused-{os.getpid()}.onnx")
    with open(path, "wb") as f:
        f.write(blob)
    fresh = tempfile.mkdtemp(prefix="kiln-cache-fresh-", dir=CACHE)
    cold = child(path, {"KILN_CACHE_DIR": fresh})
    warm = child(path, {"KILN_CACHE_DIR": fresh})
    check("cache: cold process compiles", cold and cold[0] >= 1 and cold[1] == 0, cold)
    check("cache: a second process loads every kernel from the cache", warm and warm[1] == warm[0] >= 1, warm)
    if cold and warm:
        print(f"  session creation: cold {cold[2]:.3f} s, warm {warm[2]:.3f} s")
    # a corrupted entry: a miss, recompiled, right results
    bins = [os.path.join(fresh, f) for f in os.listdir(fresh) if f.endswith(".bin")]
    check("cache: entries written", bool(bins), os.listdir(fresh))
    for b in bins:
        with open(b, "r+b") as f:
            f.seek(os.path.getsize(b) // 2)
            f.write(b"\xde\xad\xbe\xef")
    bad = child(path, {"KILN_CACHE_DIR": fresh})
    check("cache: a corrupt entry is a miss that recompiles", bad and bad[1] == 0 and bad[0] >= 1, bad)
    again = child(path, {"KILN_CACHE_DIR": fresh})
    check("cache: rewritten after the miss", again and again[1] == again[0], again)
    # an unusable folder: no cache, one note, still runs
    blocker = os.path.join(fresh, "not-a-folder")
    with open(blocker, "w") as f:
        f.write("x")
    off = child(path, {"KILN_CACHE_DIR": os.path.join(blocker, "sub")})
    check("cache: an unusable folder runs without a cache and says so", off and off[0] >= 1 and off[1] == 0 and
          "cache" in off[3], off)
    os.environ["KILN_CACHE_DIR"] = os.path.join(blocker, "sub")
    feeds = [{"scores": rng.standard_normal((2, 4, 9, 9)).astype(np.float16), "mask": np.ones((2, 9), np.int64),
              "x": rng.standard_normal((2, 9, 48)).astype(np.float16)}]
    run_case("no cache: results", blob, feeds, F16, expect_note=True)
    os.environ["KILN_CACHE_DIR"] = CACHE
    # KILN_RTC=0: the chains stay unfused, the results the same
    os.environ["KILN_RTC"] = "0"
    s = kiln.Session(blob, provider=PROVIDER)
    check("KILN_RTC=0: nothing fused", not fused_nodes(s) and s.stats()["kernels_generated"] == 0, fused_nodes(s))
    run_case("KILN_RTC=0: results", blob, feeds, F16, expect_fused=False)
    del os.environ["KILN_RTC"]
    os.remove(path)


def main():
    try:
        kiln.Session(make_model([helper.make_node("Relu", ["X"], ["Y"])],
                                [helper.make_tensor_value_info("X", F32, [2])],
                                [helper.make_tensor_value_info("Y", F32, None)]), provider=PROVIDER)
    except kiln.KilnError as e:
        shutil.rmtree(CACHE, ignore_errors=True)
        print(f"SKIP test_gpu_fused: no {PROVIDER} session: {e}")
        return 0
    try:
        test_random()
        test_bert()
        test_cache()
    finally:
        shutil.rmtree(CACHE, ignore_errors=True)
    return summary("test_gpu_fused: ")


if __name__ == "__main__":
    sys.exit(main())
