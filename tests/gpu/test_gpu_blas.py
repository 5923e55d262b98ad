#!/usr/bin/env python3
"""test_gpu_blas.py - the GPU 'blas' family (MatMul, Gemm, Einsum on cuBLAS) against the CPU
reference kernels (an `unoptimized` session) on random data: every MatMul rank pair 1..4 with
batch broadcasting, odd and zero sizes, every Gemm trans/alpha/beta/C-shape variant, the
transformer Einsum equations (and some it must refuse), float32, float16 and bfloat16.

usage: KILN_LIB=<build>/libkiln.so test_gpu_blas.py   (prints SKIP without a GPU)
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

rng = np.random.default_rng(4)
SIZES = [1, 3, 7, 17, 33, 65, 127]
# error allowed relative to the output's magnitude (max |reference|, at least 1)
TOL = {"f32": 1e-4, "f16": 1e-2, "bf16": 3e-2}
ELEM = {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
NP = {"f32": np.float32, "f16": np.float16, "bf16": np.float32}  # bf16 is fed as float32 and cast


class Skip(Exception):
    pass


def make_model(nodes, inputs, outputs, opset=17, inits=()):
    g = helper.make_graph(nodes, "blas", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def op_model(op, names, ranks, dt, attrs=None, opset=17, inits=(), dims=None):
    """One `op` node over inputs `names` (ranks[i] symbolic dims, or dims[i] when given). For
    bf16 the graph takes float32 inputs, casts them to bfloat16 and casts the result back."""
    elem = ELEM[dt]
    io_elem = TensorProto.FLOAT if dt == "bf16" else elem
    init_names = {t.name for t in inits}
    inputs, nodes, op_in = [], [], []
    for i, (nm, r) in enumerate(zip(names, ranks)):
        if nm is None or nm == "":
            op_in.append("")
            continue
        if nm in init_names:
            op_in.append(nm)
            continue
        shape = dims[i] if dims and dims[i] is not None else [f"{nm}{j}" for j in range(r)]
        inputs.append(helper.make_tensor_value_info(nm, io_elem, shape))
        if dt == "bf16":
            nodes.append(helper.make_node("Cast", [nm], [nm + "_bf"], to=TensorProto.BFLOAT16))
            op_in.append(nm + "_bf")
        else:
            op_in.append(nm)
    out = "Y_bf" if dt == "bf16" else "Y"
    nodes.append(helper.make_node(op, op_in, [out], **(attrs or {})))
    if dt == "bf16":
        nodes.append(helper.make_node("Cast", [out], ["Y"], to=TensorProto.FLOAT))
    return make_model(nodes, inputs, [helper.make_tensor_value_info("Y", io_elem, None)], opset, inits)


def rand(dt, shape):
    return rng.standard_normal(shape).astype(NP[dt])


def first_bad(g, w, lim):
    bad = np.argwhere(~(np.abs(g - w) <= lim))
    return tuple(int(x) for x in bad[0]) if len(bad) else None


def run_case(name, blob, feeds_list, dt, expect_gpu=True):
    """Runs every feed on a cuda session and on the reference; compares each output."""
    try:
        gpu = kiln.Session(blob, provider="cuda")
    except kiln.KilnError as e:
        check(f"{name} [{dt}]: create cuda session", False, str(e))
        return None
    ref = kiln.Session(blob, unoptimized=True)
    for feeds in feeds_list:
        shapes = " ".join(f"{k}={tuple(v.shape)}" for k, v in feeds.items())
        label = f"{name} [{dt}] {shapes}"
        try:
            want = ref.run(feeds)
        except kiln.KilnError as e:
            check(label, False, f"reference failed: {e}")
            continue
        try:
            got = gpu.run(feeds)
        except kiln.KilnError as e:
            check(label, False, f"cuda run failed: {e}")
            continue
        for g, w in zip(got, want):
            g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
            if g64.shape != w64.shape:
                check(label, False, f"shape {g64.shape}, reference {w64.shape}")
                continue
            scale = max(1.0, float(np.max(np.abs(w64)))) if w64.size else 1.0
            lim = TOL[dt] * scale
            ok = bool(np.all(np.abs(g64 - w64) <= lim))
            detail = ""
            if not ok:
                with np.errstate(invalid="ignore"):
                    diff = float(np.nanmax(np.abs(g64 - w64))) if g64.size else 0.0
                idx = first_bad(g64, w64, lim)
                detail = (f"max abs diff {diff:.3g} (allowed {lim:.3g}), first bad index {idx}: "
                          f"got {g64[idx]!r} want {w64[idx]!r}")
            check(label, ok, detail)
    st = gpu.stats()
    if expect_gpu:
        check(f"{name} [{dt}] ran on the GPU", st["node_runs_gpu"] > 0 and st["nodes_gpu"] > 0,
              f"stats {st}")
    return st


# ---- MatMul ----

def matmul_shapes(ra, rb, m, k, n):
    """A and B shapes of ranks ra, rb for [.., m, k] @ [.., k, n], with random broadcast batches."""
    nb = max(ra, rb) - 2
    batch = [int(rng.choice([1, 2, 3, 5])) for _ in range(max(nb, 0))]
    a = [m, k] if ra >= 2 else [k]
    b = [k, n] if rb >= 2 else [k]
    if ra > 2:
        ab = batch[len(batch) - (ra - 2):]
        a = [1 if rng.random() < 0.3 else d for d in ab] + a
    if rb > 2:
        bb = batch[len(batch) - (rb - 2):]
        b = [1 if rng.random() < 0.3 else d for d in bb] + b
    return a, b


def test_matmul(dt):
    for ra in range(1, 5):
        for rb in range(1, 5):
            blob = op_model("MatMul", ["A", "B"], [ra, rb], dt)
            feeds = []
            for t in range(7):
                m, k, n = (int(rng.choice(SIZES)) for _ in range(3))
                if t == 5:
                    m, k, n = [(0, 3, 5), (3, 0, 5), (3, 5, 0)][(ra + rb) % 3]
                if t == 6:
                    m, k, n = 1, 1, 1
                a, b = matmul_shapes(ra, rb, m, k, n)
                feeds.append({"A": rand(dt, a), "B": rand(dt, b)})
            # batch broadcasting that no single stride expresses (looped), and B shared (folded)
            if ra == 4 and rb == 4:
                feeds.append({"A": rand(dt, [2, 1, 7, 5]), "B": rand(dt, [1, 3, 5, 9])})
                feeds.append({"A": rand(dt, [3, 2, 7, 5]), "B": rand(dt, [1, 2, 5, 9])})
                feeds.append({"A": rand(dt, [3, 4, 7, 5]), "B": rand(dt, [1, 1, 5, 9])})
                feeds.append({"A": rand(dt, [1, 1, 7, 5]), "B": rand(dt, [3, 4, 5, 9])})
            if ra == 3 and rb == 2:
                feeds.append({"A": rand(dt, [4, 33, 65]), "B": rand(dt, [65, 17])})
            run_case(f"MatMul rank {ra}x{rb}", blob, feeds, dt)
    # weights as an initializer (uploaded once): [b, s, K] @ W[K, N]
    w = rand(dt, [65, 33])
    winit = numpy_helper.from_array(w.astype(np.float16) if dt == "f16" else w.astype(np.float32), "W")
    if dt != "bf16":
        blob = op_model("MatMul", ["A", "W"], [3, 2], dt, inits=[winit])
        run_case("MatMul A @ initializer W", blob, [{"A": rand(dt, [2, 7, 65])}, {"A": rand(dt, [1, 1, 65])}], dt)


# ---- dense layers: MatMul by constant weights + constant bias (kiln.FusedMatMul, cuBLASLt's bias
# epilogue; under KILN_BLASLT=0 the bias broadcast, then the product added) ----

def test_dense(dt):
    """A [.., K] @ W [K, N] + bias, W and bias initializers (bf16: float32 ones cast, folded), the
    bias first or second in the Add and of shape [N], [1, N] or [1, 1, N]; odd K and N; several
    leading shapes per session, M = 1 among them."""
    elem = ELEM[dt]
    io_elem = TensorProto.FLOAT if dt == "bf16" else elem
    np_init = np.float16 if dt == "f16" else np.float32
    for k, n, bshape, first, rank in [(65, 33, [33], False, 3), (7, 1, [1, 1], True, 2), (128, 96, [1, 1, 96], False, 3),
                                      (33, 127, [127], True, 3), (768, 768, [768], False, 3), (17, 64, [1, 64], False, 4)]:
        w = rand(dt, [k, n]).astype(np_init)
        b = rand(dt, bshape).astype(np_init)
        inits = [numpy_helper.from_array(w, "W0"), numpy_helper.from_array(b, "b0")]
        nodes, x = [], "A"
        if dt == "bf16":
            nodes += [helper.make_node("Cast", ["A"], ["A_bf"], to=TensorProto.BFLOAT16),
                      helper.make_node("Cast", ["W0"], ["W"], to=TensorProto.BFLOAT16),
                      helper.make_node("Cast", ["b0"], ["b"], to=TensorProto.BFLOAT16)]
            x = "A_bf"
        else:
            nodes += [helper.make_node("Identity", ["W0"], ["W"]), helper.make_node("Identity", ["b0"], ["b"])]
        nodes.append(helper.make_node("MatMul", [x, "W"], ["mm"]))
        nodes.append(helper.make_node("Add", ["b", "mm"] if first else ["mm", "b"], ["Y_bf" if dt == "bf16" else "Y"]))
        if dt == "bf16":
            nodes.append(helper.make_node("Cast", ["Y_bf"], ["Y"], to=TensorProto.FLOAT))
        shape = [f"a{j}" for j in range(rank - 1)] + [k]
        blob = make_model(nodes, [helper.make_tensor_value_info("A", io_elem, shape)],
                          [helper.make_tensor_value_info("Y", io_elem, None)], inits=inits)
        leads = [[1] * (rank - 1), [3] * (rank - 1), [2] * (rank - 2) + [37], [1] * (rank - 2) + [128]]
        feeds = [{"A": rand(dt, lead + [k])} for lead in leads]
        run_case(f"dense K {k} N {n} bias {bshape}{' first' if first else ''} rank {rank}", blob, feeds, dt)
        gpu = kiln.Session(blob, provider="cuda")
        ops = [op for _, op, prov in gpu.nodes() if prov == "cuda"]
        check(f"dense K {k} N {n} [{dt}]: the bias joined the MatMul on the GPU",
              "FusedMatMul" in ops and "Add" not in ops, f"GPU nodes {ops}")
        gpu.close()


# ---- Gemm ----

def test_gemm(dt):
    c_shapes = [None, "N", "1N", "M1", "MN", "11", "1", "scalar"]
    for ta in (0, 1):
        for tb in (0, 1):
            for alpha, beta in ((1.0, 1.0), (0.5, -2.0), (1.0, 0.0), (-1.5, 0.25)):
                for cs in c_shapes:
                    a_dims = ["K", "M"] if ta else ["M", "K"]
                    b_dims = ["N", "K"] if tb else ["K", "N"]
                    c_dims = {None: None, "N": ["N"], "1N": [1, "N"], "M1": ["M", 1], "MN": ["M", "N"],
                              "11": [1, 1], "1": [1], "scalar": []}[cs]
                    names = ["A", "B"] + (["C"] if cs is not None else [])
                    dims = [a_dims, b_dims] + ([c_dims] if cs is not None else [])
                    blob = op_model("Gemm", names, [2, 2, len(c_dims or [])], dt, dims=dims, opset=13,
                                    attrs=dict(transA=ta, transB=tb, alpha=alpha, beta=beta))
                    feeds = []
                    sizes = [(int(rng.choice(SIZES)), int(rng.choice(SIZES)), int(rng.choice(SIZES))),
                             (17, 33, 7), (1, 1, 1), (5, 0, 3), (0, 4, 3), (4, 3, 0)]
                    for m, k, n in sizes:
                        f = {"A": rand(dt, [k, m] if ta else [m, k]), "B": rand(dt, [n, k] if tb else [k, n])}
                        if cs is not None:
                            shape = [{"M": m, "N": n}.get(d, d) for d in c_dims]
                            f["C"] = rand(dt, shape)
                        feeds.append(f)
                    run_case(f"Gemm transA={ta} transB={tb} alpha={alpha} beta={beta} C={cs}", blob, feeds, dt)
    # the Linear layer: B and C initializers, transB=1
    if dt != "bf16":
        npdt = np.float16 if dt == "f16" else np.float32
        inits = [numpy_helper.from_array(rng.standard_normal([33, 65]).astype(npdt), "W"),
                 numpy_helper.from_array(rng.standard_normal([33]).astype(npdt), "Bias")]
        blob = op_model("Gemm", ["X", "W", "Bias"], [2, 2, 1], dt, attrs=dict(transB=1), inits=inits)
        run_case("Gemm Linear (initializers)", blob, [{"X": rand(dt, [7, 65])}, {"X": rand(dt, [1, 65])},
                                                      {"X": rand(dt, [0, 65])}], dt)


# ---- Einsum ----

EINSUM = [
    "bhid,bhjd->bhij",
    "bhij,bhjd->bhid",
    "bid,jd->bij",
    "ij,jk->ik",
    "bij,bjk->bik",
    "ij,kj->ik",
    "ji,jk->ik",
    "ji,kj->ik",
    "bij,bkj->bik",
    "bji,bjk->bik",
    "ibd,jbd->bij",
    "bik,kj->bij",
    "bij,bjk->bki",
    "ij,jk",
    "i,i->",
    "i,j->ij",
    "bi,bi->b",
    "b,bk->bk",
    "ij,ij->ij",
]
# equations the family must refuse (still correct through the CPU)
EINSUM_REFUSED = ["bhqd,bkhd->bhqk", "bij,bjk->ikb", "ij,jk->i", "ii,ij->ij", "hd,bhjd->bhj"]


def einsum_shapes(eq, sizes):
    lhs = eq.split("->")[0]
    return [[sizes[ch] for ch in term] for term in lhs.split(",")]


def test_einsum(dt):
    for eq, expect in [(e, True) for e in EINSUM] + [(e, False) for e in EINSUM_REFUSED]:
        lhs = eq.split("->")[0]
        ranks = [len(t) for t in lhs.split(",")]
        blob = op_model("Einsum", ["A", "B"], ranks, dt, attrs=dict(equation=eq), opset=12)
        letters = sorted(set(lhs) - {","})
        feeds = []
        for t in range(5):
            sizes = {ch: int(rng.choice(SIZES[:5])) for ch in letters}
            if t == 3:
                sizes = {ch: 1 for ch in letters}
            if t == 4:
                sizes[letters[-1]] = 0
            if eq.startswith("ii"):
                sizes["j"] = sizes["i"]
            shapes = einsum_shapes(eq, sizes)
            feeds.append({"A": rand(dt, shapes[0]), "B": rand(dt, shapes[1])})
        st = run_case(f"Einsum '{eq}'", blob, feeds, dt, expect_gpu=expect)
        if st is not None and not expect and dt != "bf16":
            check(f"Einsum '{eq}' [{dt}] refused by the GPU family", st["nodes_gpu"] == 0, f"stats {st}")


def cuda_available():
    blob = op_model("MatMul", ["A", "B"], [2, 2], "f32")
    try:
        kiln.Session(blob, provider="cuda")
    except kiln.KilnError as e:
        return str(e)
    return None


def main():
    why = cuda_available()
    if why is not None:
        print(f"SKIP: {why}")
        return 0
    for dt in ("f32", "f16", "bf16"):
        for test in (test_matmul, test_dense, test_gemm, test_einsum):
            test(dt)
    if os.environ.get("KILN_BLASLT") != "0":  # the same without cuBLASLt: cuBLAS, the bias added first
        import subprocess
        r = subprocess.run([sys.executable, __file__], env=dict(os.environ, KILN_BLASLT="0"), capture_output=True,
                           text=True)
        tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
        check("the suite again with KILN_BLASLT=0", r.returncode == 0, " | ".join(tail))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
