#!/usr/bin/env python3
"""test_gpu_llm.py - the GPU 'llm' family and generation on the CUDA provider.

Ops (one-node models built by tests/models/test_llm_ops.py, imported), CUDA session against the CPU
reference (an unoptimized session) and, where it runs the case, ONNX Runtime, on random data
(never zeros), float32 and float16: GroupQueryAttention (separate and packed QKV, first prompt
with and without padding, subsequent prompt, decode with a growing past and from a larger
buffer, no past, odd head counts, head sizes 8 to 256 and one over 256 (the CPU reference at run time), rotary
plain and interleaved with partial rotary dims, position_ids, attention_bias broadcasts,
local_window_size at the window's edges, softcap, scale, smooth_softmax, head_sink, long KV),
MatMulNBits (4 and 8 bits, blocks 16 to 256, K not a multiple of the block, zero points packed,
typed and absent, bias, M from 1 to 40 across the GEMV/cuBLAS boundary at 8, N small (K split)
and large, g_idx refused: CPU), com.microsoft RotaryEmbedding, SimplifiedLayerNormalization (both
domains) and SkipSimplifiedLayerNormalization with all four outputs. Each model checks that its
LLM node was placed on the GPU (or, for refused cases, on the CPU).

Generation (tests/models/make_llm.py folders, the kiln_generator_* API through
tests/models/genai_ctypes.py): greedy tokens equal the CPU provider's for 64 steps with the
logits within tolerance at every step, batch 1 and batch 2 right-padded, on the builder-style GQA
folders (symmetric and asymmetric int4, odd head counts) and the ONNX-ops folder; the GQA
folders' LLM nodes all on the GPU; a step past max_length is a clean error; 100 generator
create/free cycles with flat device memory (cudaMemGetInfo) and the same device_mallocs per
generator. (The 10,000-step decode under compute-sanitizer is section e of scripts/test_gpu.sh.)

usage: KILN_LIB=<build>/libkiln.so test_gpu_llm.py   (prints SKIP without a GPU)
  KILN_GPU_TEST_PROVIDER=cpu  puts the "GPU" sessions and generators on the CPU: checks the test
                              itself on a machine without a GPU
  KILN_GPU_LLM_TESTS="ops gen" picks parts (ops = gqa nbits norms, gen, cycles)
"""
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
from checks import check, close, run_feeds, skip_without, summary  # noqa: E402
import kiln  # noqa: E402

PROVIDER = os.environ.get("KILN_GPU_TEST_PROVIDER", "cuda")
PARTS = os.environ.get("KILN_GPU_LLM_TESTS", "ops gen cycles").split()
MS = "com.microsoft"
LLM_OPS = {"GroupQueryAttention", "MatMulNBits", "RotaryEmbedding", "SimplifiedLayerNormalization",
           "SkipSimplifiedLayerNormalization", "SiluMul"}
rng = np.random.default_rng(4033)


def rand(*shape, dtype=np.float32, scale=1.0):
    a = (rng.standard_normal(shape) * scale).astype(dtype)
    a[a == 0] = 0.5
    return a


def compare(name, m, feeds_list, rtol, atol, on_gpu=True, ort_too=True):
    """CUDA session vs the CPU reference (and ORT where it runs the feed) on every feed; a feed
    the reference refuses must be refused on the GPU too. on_gpu: whether the model's LLM node
    must be placed on the GPU (False: refused, on the CPU)."""
    blob = m.SerializeToString()
    try:
        gpu = kiln.Session(blob, provider=PROVIDER)
    except kiln.KilnError as e:
        check(f"{name}: create {PROVIDER} session", False, str(e))
        return
    ref = kiln.Session(blob, unoptimized=True, provider="cpu")
    if PROVIDER == "cuda":
        placed = [(op, prov) for _, op, prov in gpu.nodes() if op in LLM_OPS]
        want = "cuda" if on_gpu else "cpu"
        check(f"{name}: LLM nodes on {want}", placed and all(p == want for _, p in placed), placed)
    ort_s = None
    if ort_too:
        try:
            ort_s = lo.ort_session(m)
        except Exception:  # noqa: BLE001 - ORT lacks the case: the reference alone
            ort_s = None
    run_feeds(name, gpu, ref, feeds_list, rtol, atol, PROVIDER, ort_s)


TOL = {np.float32: (2e-4, 2e-4), np.float16: (1e-2, 1e-2)}


# ---------------------------------------------------------------- GroupQueryAttention

def test_gqa():
    base = [dict(B=2, S=6, seqlens=[5, 5], total=6, past_len=0),      # first prompt
            dict(B=2, S=1, seqlens=[8, 5], total=9, past_len=11),     # decode from a larger buffer
            dict(B=1, S=4, seqlens=[9], total=10, past_len=6)]       # subsequent prompt
    cases = []  # (label, model kwargs, feed kwargs list)
    for N, Nkv, H in [(6, 2, 16), (3, 1, 8), (5, 5, 24), (7, 1, 32), (2, 1, 256), (4, 2, 12)]:
        for packed in (False, True):
            fl = [dict(B=2, S=5, seqlens=[4, 4], total=5, past_len=0),
                  dict(B=2, S=5, seqlens=[4, 2], total=5, past_len=0),
                  dict(B=2, S=1, seqlens=[7, 7], total=8, past_len=7),
                  dict(B=3, S=1, seqlens=[3, 9, 0], total=10, past_len=12),
                  dict(B=1, S=3, seqlens=[6], total=7, past_len=4),
                  dict(B=2, S=4, seqlens=[3, 1], total=4, past_len=9),
                  dict(B=1, S=1, seqlens=[0], total=1, past_len=0)]
            cases.append((f"N={N} Nkv={Nkv} H={H} packed={packed}", dict(packed=packed),
                          [dict(N=N, Nkv=Nkv, H=H, **f) for f in fl]))
    for lws in (0, 1, 2, 3, 5, 8, 9):
        cases.append((f"local_window_size={lws}", dict(local_window_size=lws), [dict(N=4, Nkv=2, H=8, **f) for f in base]))
    for attrs in [dict(softcap=2.5), dict(scale=0.3), dict(smooth_softmax=1), dict(softcap=1.5, local_window_size=3)]:
        cases.append((str(attrs), attrs, [dict(N=4, Nkv=2, H=8, **f) for f in base]))
    cases.append(("head_sink", dict(sink=True), [dict(N=4, Nkv=2, H=8, sink=True, **f) for f in base]))
    cases.append(("head_sink smooth", dict(sink=True, smooth_softmax=1), [dict(N=4, Nkv=2, H=8, sink=True, **f) for f in base]))
    for b0, b1 in [(2, 4), (1, 1), (2, 1), (1, 4)]:
        fl = [dict(N=4, Nkv=2, H=8, bias=(b0 if b0 == 1 else f["B"], b1, f["S"], f["total"]), **f) for f in base]
        cases.append((f"attention_bias {b0, b1}", dict(bias=True), fl))
    for inter in (0, 1):
        for H, rd, packed in [(16, 16, False), (32, 16, False), (48, 48, True), (64, 16, True)]:
            fl = [dict(N=4, Nkv=2, H=H, rd=rd, packed=packed, **f) for f in base]
            cases.append((f"rotary interleaved={inter} H={H} rd={rd} packed={packed}",
                          dict(rotary=True, rotary_interleaved=inter, packed=packed), fl))
    fl = [dict(N=4, Nkv=2, H=16, rd=16, pos=[[0, 1, 2, 3, 4, 5]] * 2, **base[0]),
          dict(N=4, Nkv=2, H=16, rd=16, pos=[[20], [7]], **base[1]),
          dict(N=4, Nkv=2, H=16, rd=16, pos=[[6, 7, 8, 9]], **base[2])]
    cases.append(("rotary position_ids", dict(rotary=True, pos_ids=True), fl))
    # long KV: decode over 700 cached positions, a prompt of 37 over 300
    cases.append(("long KV", dict(rotary=True), [dict(N=8, Nkv=2, H=64, rd=64, max_pos=1024, B=2, S=1, seqlens=[699, 400],
                                                      total=700, past_len=700),
                                                 dict(N=8, Nkv=2, H=64, rd=64, max_pos=1024, B=1, S=37, seqlens=[336],
                                                      total=337, past_len=300)]))
    # decode over a long buffer runs each row's keys split over blocks (kiln_gpu_gqa_splits): runs
    # with no keys (a row of 4 keys), a window, a sink, softcap, smooth softmax and a bias
    long = dict(N=8, Nkv=2, H=64, rd=64, max_pos=1024, B=2, S=1, total=700, past_len=700)
    cases.append(("long KV split: window, sink, softcap", dict(rotary=True, local_window_size=100, sink=True, softcap=2.0),
                  [dict(long, seqlens=[699, 3], sink=True), dict(long, seqlens=[250, 699], sink=True)]))
    cases.append(("long KV split: smooth", dict(rotary=True, smooth_softmax=1), [dict(long, seqlens=[699, 130])]))
    cases.append(("long KV split: bias", dict(rotary=True, bias=True), [dict(long, seqlens=[699, 64], bias=(2, 8, 1, 700))]))
    cases.append(("seqlens_k out of range", {}, [dict(N=4, Nkv=2, H=8, B=2, S=1, seqlens=[8, 11], total=9, past_len=11),
                                                 dict(N=4, Nkv=2, H=8, B=2, S=1, seqlens=[8, -1], total=9, past_len=11)]))
    for dt in (np.float32, np.float16):
        for label, mkw, fl in cases:
            mkw = dict(mkw)
            f0 = fl[0]
            m = lo.gqa_model(f0["N"], f0["Nkv"], f0["H"], dt=dt, past=True, **mkw)
            feeds = []
            for f in fl:
                f = dict(f)
                N, Nkv, H = f.pop("N"), f.pop("Nkv"), f.pop("H")
                feeds.append(lo.gqa_feeds(N=N, Nkv=Nkv, H=H, dt=dt, **f))
            rtol, atol = TOL[dt]
            compare(f"GQA {label} {np.dtype(dt).name}", m, feeds, rtol, atol * 5)
    # on the GPU seqlens_k is read on the device: a bad row fails the run naming the node (the
    # kernels' check word), and the session runs the next good feed right
    m = lo.gqa_model(4, 2, 8, past=True)
    s = kiln.Session(m.SerializeToString(), provider=PROVIDER)
    ref = kiln.Session(m.SerializeToString(), unoptimized=True, provider="cpu")
    good = lo.gqa_feeds(N=4, Nkv=2, H=8, B=2, S=1, seqlens=[8, 5], total=9, past_len=11)
    for S, sl in ((1, [8, 11]), (1, [-1, 5]), (2, [8, 0])):  # past the buffer, negative, shorter than the new rows
        try:
            s.run(lo.gqa_feeds(N=4, Nkv=2, H=8, B=2, S=S, seqlens=sl, total=9, past_len=11))
            check(f"GQA seqlens_k {sl}: refused", False, "it ran")
        except kiln.KilnError as e:
            check(f"GQA seqlens_k {sl}: refused naming the node", "GroupQueryAttention" in str(e), str(e))
        close(f"GQA good feed after seqlens_k {sl}", s.run(good), ref.run(good), 2e-4, 1e-3)
    m = lo.gqa_model(6, 3, 8, past=False)
    compare("GQA no past", m, [lo.gqa_feeds(2, 5, 6, 3, 8, [4, 3], 5), lo.gqa_feeds(1, 1, 6, 3, 8, [0], 1)], 2e-4, 1e-3)
    m = lo.gqa_model(2, 1, 264)
    # the model's hidden size is symbolic: placed on the GPU, the kernel hands the call to the CPU
    # reference at run time (kiln_gpu_fallback)
    compare("GQA head size 264 (run-time fallback)", m, [lo.gqa_feeds(1, 3, 2, 1, 264, [2], 3, past_len=0)], 2e-4,
            1e-3)


# ---------------------------------------------------------------- MatMulNBits

def test_matmul_nbits():
    shapes = ((1,), (3,), (8,), (9,), (2, 5), (40,))
    for bits in (4, 8):
        for bs in (16, 32, 64, 128, 256):
            for K, N in [(bs * 2, 24), (bs * 3 + 5, 17), (bs // 2 + 3, 9), (bs * 4, 300)]:
                for zp in ("packed", "none", "float") if bits == 4 else ("packed", "none"):
                    m, feeds = lo.nbits_case(shapes, K, N, bits, bs, zp=zp, bias=(K % 2 == 1))
                    compare(f"MatMulNBits bits={bits} bs={bs} K={K} N={N} zp={zp}", m, feeds, 2e-4, 2e-4)
    m, feeds = lo.nbits_case(shapes, 300, 33, 4, 32, zp="packed", const=False, bias=True)
    compare("MatMulNBits weights as inputs", m, feeds, 2e-4, 2e-4)
    m, feeds = lo.nbits_case(((1,), (1, 4096), (2, 3)), 4096, 64, 4, 128, zp="packed")
    compare("MatMulNBits K=4096 N=64 (K split)", m, feeds, 5e-4, 5e-4)
    m, feeds = lo.nbits_case(((1,), (4,), (16,)), 512, 4096, 4, 32, zp="packed", bias=True)
    compare("MatMulNBits N=4096", m, feeds, 5e-4, 5e-4)
    # the staged kernel's shared-memory bound: one split of K = 14336 for one row, several for 8
    for K, bs, sdt in ((14336, 128, np.float16), (8192 + 96, 32, np.float32), (4096 + 1, 64, np.float16)):
        m, feeds = lo.nbits_case(((1,), (8,), (2, 3)), K, 70, 4, bs, zp="packed", sdt=sdt, bias=True)
        tol = 2e-2 if sdt == np.float16 else 5e-4
        compare(f"MatMulNBits K={K} bs={bs} {np.dtype(sdt).name} (A staged in splits)", m, feeds, tol, tol)
    for zp in ("none", "float"):
        m, feeds = lo.nbits_case(shapes, 256, 48, 4, 64, zp=zp, g_idx=True)
        compare(f"MatMulNBits g_idx zp={zp} (refused: CPU)", m, feeds, 2e-4, 2e-4, on_gpu=False)
    # float16 in blocks of 128 and 256: the tensor-core kernel (odd K and N, every zero-point
    # form, one to eight rows, several tiles a block)
    for bs in (128, 256):
        for zp in ("packed", "none", "float"):
            for K, N in ((bs * 2, 24), (bs * 3 + 5, 17), (bs // 2 + 3, 9)):
                m, feeds = lo.nbits_case(shapes, K, N, 4, bs, zp=zp, sdt=np.float16, bias=(K % 2 == 1))
                compare(f"MatMulNBits float16 bs={bs} zp={zp} K={K} N={N}", m, feeds, 1e-2, 1e-2)
            m, feeds = lo.nbits_case(((1,), (8,)), 4096, 4100, 4, bs, zp=zp, sdt=np.float16)
            compare(f"MatMulNBits float16 bs={bs} zp={zp} K=4096 N=4100", m, feeds, 1e-2, 1e-2)
    for bits, zp in ((4, "packed"), (4, "float"), (8, "none"), (8, "packed")):
        for K, N in ((200, 40), (96, 20), (1029, 7)):
            m, feeds = lo.nbits_case(shapes, K, N, bits, 32, zp=zp, sdt=np.float16, bias=True)
            compare(f"MatMulNBits float16 bits={bits} zp={zp} K={K} N={N}", m, feeds, 1e-2, 1e-2)


# ---------------------------------------------------------------- norms and rotary

def test_norms():
    for domain in ("", MS):
        for axis, shape in [(-1, (2, 5, 16)), (-1, (3, 33)), (-1, (1, 1, 7)), (1, (2, 3, 8)), (-2, (2, 4, 6)),
                            (-1, (2, 3, 4096)), (-1, (1, 2, 1000)),
                            (-1, (1, 2, 8192)), (-1, (1, 1, 9001))]:
            sshape = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
            for dt in (np.float32, np.float16):
                node = helper.make_node("SimplifiedLayerNormalization", ["X", "scale"], ["Y", "inv_std_var"], domain=domain,
                                        axis=axis, epsilon=1e-6)
                m = lo.model(node, [lo.vi("X", lo.tt(dt), len(shape)), lo.vi("scale", lo.tt(dt), len(sshape))],
                             [lo.out("Y"), lo.out("inv_std_var")])
                sc = rand(*sshape, dtype=dt)
                tol = 1e-5 if dt == np.float32 else 3e-3
                compare(f"SimplifiedLayerNormalization '{domain}' axis={axis} {shape} {np.dtype(dt).name}", m,
                        [{"X": rand(*shape, dtype=dt), "scale": sc}, {"X": rand(*shape, dtype=dt, scale=4), "scale": sc}],
                        tol * 10, tol)
    for xs, ss, bias in [((2, 5, 16), (2, 5, 16), True), ((2, 5, 16), (5, 16), False), ((3, 4, 64), (1, 4, 64), True),
                         ((7, 96), (7, 96), False), ((1, 1, 4096), (1, 1, 4096), True), ((2, 3, 1000), (2, 3, 1000), False)]:
        for dt in (np.float32, np.float16):
            t = lo.tt(dt)
            names = ["input", "skip", "gamma"] + (["bias"] if bias else [])
            node = helper.make_node("SkipSimplifiedLayerNormalization", names,
                                    ["output", "mean", "inv_std_var", "input_skip_bias_sum"], domain=MS, epsilon=1e-5)
            ins = [lo.vi("input", t, len(xs)), lo.vi("skip", t, len(ss)), lo.vi("gamma", t, 1)] + \
                ([lo.vi("bias", t, 1)] if bias else [])
            m = lo.model(node, ins, [lo.out("output"), lo.out("mean"), lo.out("inv_std_var"), lo.out("input_skip_bias_sum")])
            feeds = []
            for sc in (1, 3):
                f = {"input": rand(*xs, dtype=dt, scale=sc), "skip": rand(*ss, dtype=dt), "gamma": rand(xs[-1], dtype=dt)}
                if bias:
                    f["bias"] = rand(xs[-1], dtype=dt)
                feeds.append(f)
            tol = 1e-5 if dt == np.float32 else 3e-3
            compare(f"SkipSimplifiedLayerNormalization x={xs} skip={ss} bias={bias} {np.dtype(dt).name}", m, feeds,
                    tol * 10, tol, ort_too=False)


def test_silu_mul():
    """Mul(Mul(g, Sigmoid(g)), up) as the model builder writes a gated MLP: the GPU passes make it
    kiln.SiluMul (one kernel), checked against the unfused reference."""
    for shape in [(1, 1, 14336), (2, 7, 13), (3, 1000)]:
        for dt in (np.float32, np.float16):
            t = lo.tt(dt)
            nodes = [helper.make_node("Sigmoid", ["G"], ["s"]), helper.make_node("Mul", ["G", "s"], ["a"]),
                     helper.make_node("Mul", ["a", "U"], ["Y"])]
            g = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("G", t, list(shape)),
                                                  helper.make_tensor_value_info("U", t, list(shape))],
                                  [helper.make_tensor_value_info("Y", t, None)])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            m.ir_version = 8
            tol = 1e-6 if dt == np.float32 else 2e-3
            compare(f"SiLU(g) * u {shape} {np.dtype(dt).name}", m,
                    [{"G": rand(*shape, dtype=dt, scale=sc), "U": rand(*shape, dtype=dt)} for sc in (1, 6)], tol * 10, tol)


def gate_up_case(M_shapes, K, N, bs, zp, sdt, bias):
    """A gated MLP's products as the model builder writes them: gate and up MatMulNBits of one A,
    SiLU(gate) * up written out."""
    nodes, inits = [], []
    for p in ("g", "u"):
        m, _ = lo.nbits_case(((1,),), K, N, 4, bs, zp=zp, sdt=sdt, bias=bias)
        node = m.graph.node[0]
        for t in m.graph.initializer:
            t.name = f"{p}_{t.name}"
            inits.append(t)
        ins = [n if i == 0 or not n else f"{p}_{n}" for i, n in enumerate(node.input)]
        nodes.append(helper.make_node("MatMulNBits", ins, [p.upper()], domain=MS, K=K, N=N, bits=4, block_size=bs,
                                      accuracy_level=0))
    nodes += [helper.make_node("Sigmoid", ["G"], ["s"]), helper.make_node("Mul", ["G", "s"], ["a"]),
              helper.make_node("Mul", ["a", "U"], ["Y"])]
    m = lo.model(nodes, [lo.vi("A", lo.tt(sdt), 3)], [lo.out("Y")], inits=inits)
    return m, [{"A": rand(*ms, K, dtype=sdt)} for ms in M_shapes]


def test_gate_up():
    """Gate and up MatMulNBits read by SiLU(gate) * up: the GPU passes make them one product over
    the stacked weights read by kiln.SiluMul in its packed form; against the reference and ORT."""
    for bs, sdt in ((128, np.float16), (32, np.float16), (32, np.float32)):
        for K, N in ((bs * 2, 24), (bs * 3 + 5, 17), (4096, 300)):
            for zp in ("packed", "none", "float"):
                bias = K % 2 == 1
                m, feeds = gate_up_case(((1, 1), (1, 3), (2, 5)), K, N, bs, zp, sdt, bias)
                name = f"gate/up bs={bs} K={K} N={N} zp={zp} bias={bias} {np.dtype(sdt).name}"
                tol = 1e-2 if sdt == np.float16 else 5e-4
                compare(name, m, feeds, tol, tol)
                if PROVIDER != "cuda":
                    continue
                ops = [op for _, op, _ in kiln.Session(m.SerializeToString(), provider=PROVIDER).nodes()]
                check(f"{name}: one product, packed SiluMul", ops.count("MatMulNBits") == 1 and "SiluMul" in ops, ops)


def test_rotary():
    for dt in (np.float32, np.float16):
        for inter in (0, 1):
            for x_shape, nh, rd in [((2, 5, 64), 4, 0), ((1, 3, 96), 3, 16), ((2, 4, 7, 32), 0, 0), ((3, 1, 48), 2, 24),
                                    ((1, 33, 8, 128), 0, 64)]:
                H = (x_shape[2] // nh) if len(x_shape) == 3 else x_shape[3]
                r = rd or H
                attrs = dict(interleaved=inter)
                if nh:
                    attrs["num_heads"] = nh
                if rd:
                    attrs["rotary_embedding_dim"] = rd
                node = helper.make_node("RotaryEmbedding", ["input", "position_ids", "cos_cache", "sin_cache"], ["Y"],
                                        domain=MS, **attrs)
                B, S = x_shape[0], (x_shape[1] if len(x_shape) == 3 else x_shape[2])
                m = lo.model(node, [lo.vi("input", lo.tt(dt), len(x_shape)), lo.vi("position_ids", TensorProto.INT64, 2),
                                    lo.vi("cos_cache", lo.tt(dt), 2), lo.vi("sin_cache", lo.tt(dt), 2)], [lo.out("Y")])
                ang = rng.uniform(0, 6.28, (64, r // 2))
                base = {"input": rand(*x_shape, dtype=dt), "cos_cache": np.cos(ang).astype(dt),
                        "sin_cache": np.sin(ang).astype(dt)}
                feeds = [dict(base, position_ids=rng.integers(0, 64, (B, S)).astype(np.int64)),
                         dict(base, position_ids=np.array([[5]], np.int64)),  # one offset
                         dict(base, position_ids=np.array([[70]], np.int64))]  # past the caches: refused
                rtol, atol = TOL[dt]
                compare(f"RotaryEmbedding(ms) {x_shape} num_heads={nh} rd={rd} interleaved={inter} {np.dtype(dt).name}",
                        m, feeds, rtol, atol)


# ---------------------------------------------------------------- generation

PROMPTS = [[5, 17, 33, 100, 7], [9, 44]]
STEPS = 64


def make(folder, *args):
    subprocess.run([sys.executable, os.path.join(HERE, "..", "models", "make_llm.py"), folder, *args], check=True,
                   stdout=subprocess.DEVNULL)
    return folder


def gen_provider():
    return 1 if PROVIDER == "cuda" else 0


def greedy(folder, prompts, steps, provider, max_length=0):
    g = gc.Generator(folder, batch=len(prompts), max_length=max_length or max(len(p) for p in prompts) + steps,
                     provider=provider)
    g.append_tokens(prompts)
    toks, logits, early = [], [], 0
    for k in range(steps):
        logits.append(g.logits())
        g.generate_next()
        toks.append(g.next_tokens())
        if k == 1:
            early = g.stats().device_mallocs
    st = g.stats()
    g.close()
    return np.array(toks), logits, (st, early)


def test_generation(folder, label, gqa, fp16=False, max_length=0):
    if gqa and PROVIDER == "cuda":
        s = kiln.Session(os.path.join(folder, "model.onnx"), provider="cuda")
        placed = [(n, op, p) for n, op, p in s.nodes() if op in LLM_OPS]
        check(f"{label}: every LLM node on the GPU", placed and all(p == "cuda" for _, _, p in placed),
              [x for x in placed if x[2] != "cuda"])
    for prompts in ([PROMPTS[0]], PROMPTS):
        name = f"{label} batch {len(prompts)}"
        try:
            want, wl, _ = greedy(folder, prompts, STEPS, 0, max_length)
            got, gl, (st, early) = greedy(folder, prompts, STEPS, gen_provider(), max_length)
        except gc.KilnError as e:
            check(f"{name}: generates", False, str(e))
            continue
        same = got.shape == want.shape and (got == want).all()
        first = int(np.argmax((got != want).any(axis=1))) if not same else -1
        if fp16:  # float16 logits round differently on the two sides: near-ties may flip later on
            check(f"{name}: greedy tokens equal the CPU provider's for 16 steps or more", same or first >= 16,
                  f"first difference at step {first}")
        else:
            check(f"{name}: greedy tokens equal the CPU provider's for {STEPS} steps", same, f"first difference at step {first}")
        n = first if first >= 0 else STEPS
        worst = 0.0
        for k in range(n):  # logits compared while the tokens agree
            scale = max(1.0, float(np.abs(wl[k]).max()))
            worst = max(worst, float(np.abs(gl[k] - wl[k]).max()) / scale)
        tol = 2e-2 if fp16 else 2e-3
        check(f"{name}: logits within tolerance at every step", worst < tol, f"max relative diff {worst:.3g}")
        if PROVIDER == "cuda":
            check(f"{name}: one compilation", st.compilations == 1, st.compilations)
            if gqa:  # (the ONNX form's attention rows grow with the context: its arena grows now and then)
                check(f"{name}: no device allocation per decode step", st.device_mallocs == early,
                      f"device_mallocs {early} after 2 steps, {st.device_mallocs} after {STEPS}")
                check(f"{name}: nodes on the GPU", st.nodes_gpu > 0 and st.node_runs_gpu > 0,
                      f"nodes_gpu {st.nodes_gpu}, nodes_cpu {st.nodes_cpu}")
                # a decode step is one CUDA graph: recorded once (the second step), replayed after
                check(f"{name}: decode steps replay one recording", st.graphs_captured <= 2 and
                      st.graphs_replayed >= STEPS - 3, f"captured {st.graphs_captured}, replayed "
                      f"{st.graphs_replayed} of {STEPS} steps; note: {st.graphs_note!r}")


def test_max_length(folder):
    g = gc.Generator(folder, max_length=8, provider=gen_provider())
    g.append_tokens([[5, 6, 7, 8]])
    steps = 0
    while not g.is_done():
        g.generate_next()
        steps += 1
    try:
        g.generate_next()
        check("max_length: a step past it is an error", False, "it ran")
    except gc.KilnError as e:
        check("max_length: a step past it is an error", "max_length" in str(e), str(e))
    check("max_length: 4 generated tokens", steps == 4, steps)
    g.close()
    try:
        gc.Generator(folder, max_length=8, provider=gen_provider()).append_tokens([list(range(5, 14))])
        check("max_length: a prompt longer than it is an error", False, "it ran")
    except gc.KilnError as e:
        check("max_length: a prompt longer than it is an error", "max_length" in str(e), str(e))


class Cudart:
    def __init__(self):
        last = None
        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError as e:
                last = e
        else:
            raise OSError(f"no libcudart: {last}")
        self.lib.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]

    def used(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if self.lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)):
            raise OSError("cudaMemGetInfo failed")
        return total.value - free.value


def test_create_free_cycles(folder, cycles=100):
    rt = Cudart() if PROVIDER == "cuda" else None
    used, mallocs = [], []
    for i in range(cycles):
        g = gc.Generator(folder, batch=2, max_length=24, provider=gen_provider())
        g.append_tokens(PROMPTS)
        for _ in range(4):
            g.generate_next()
        mallocs.append(g.stats().device_mallocs)
        g.close()
        if rt and i in (9, cycles - 1):
            used.append(rt.used())
    check(f"create/free: {cycles} generators ran", len(mallocs) == cycles)
    check("create/free: the same device allocations per generator", len(set(mallocs[5:])) == 1, sorted(set(mallocs)))
    if rt:
        grow = (used[1] - used[0]) / 2**20
        print(f"create/free: {cycles} cycles, device memory used {used[0] / 2**20:.1f} -> {used[1] / 2**20:.1f} MB")
        check("create/free: flat device memory", grow < 8, f"{grow:.1f} MB growth")


def test_shared_model(folder, generators=20, steps=16):
    """One kiln_genai_model for many generators (kiln_generator_create_from): each one's greedy
    tokens equal the CPU provider's (a generator of the folder alone), two stepped in turn and one
    outliving the model's handle too; one compilation; flat device memory."""
    want, _, _ = greedy(folder, PROMPTS, steps, 0)
    max_length = max(len(p) for p in PROMPTS) + steps
    rt = Cudart() if PROVIDER == "cuda" else None
    m = gc.Model(folder, provider=gen_provider())

    def run(g, n):
        return np.array([(g.generate_next(), g.next_tokens())[1] for _ in range(n)])

    used, equal = [], 0
    for i in range(generators):
        g = gc.Generator(model=m, batch=2, max_length=max_length)
        g.append_tokens(PROMPTS)
        equal += bool((run(g, steps) == want).all())
        st = g.stats()
        g.close()
        if rt and i in (4, generators - 1):
            used.append(rt.used())
    check(f"shared model: {generators} generators' greedy tokens equal the CPU provider's", equal == generators,
          f"{equal} of {generators}")
    check("shared model: one compilation", st.compilations == 1, st.compilations)
    if PROVIDER == "cuda":
        check("shared model: decode steps replay recordings", st.graphs_replayed >= generators * (steps - 3),
              f"captured {st.graphs_captured}, replayed {st.graphs_replayed}; note: {st.graphs_note!r}")
    a, b = gc.Generator(model=m, batch=2, max_length=max_length), gc.Generator(model=m, batch=2, max_length=max_length)
    a.append_tokens(PROMPTS)
    b.append_tokens(PROMPTS)
    ta, tb = [], []
    for _ in range(steps // 2):
        ta.append(run(a, 1)[0])
        tb.append(run(b, 1)[0])
    m.close()  # a and b keep the model
    ta, tb = np.concatenate([ta, run(a, steps // 2)]), np.concatenate([tb, run(b, steps // 2)])
    check("shared model: two generators stepped in turn, the handle freed halfway", (ta == want).all() and (tb == want).all())
    a.close()
    b.close()
    if rt:
        grow = (used[1] - used[0]) / 2**20
        check("shared model: flat device memory", grow < 8, f"{grow:.1f} MB growth over {generators - 5} generators")


def main():
    global lo, gc
    if skip_without(PROVIDER):
        return 0
    try:
        import test_llm_ops as lo  # noqa: E402 - the op models (imports onnxruntime)
    except ImportError as e:
        print(f"SKIP: tests/models/test_llm_ops.py cannot be imported ({e})")
        return 0
    os.environ.setdefault("KILN_LIB", os.path.join(HERE, "..", "..", "build", "libkiln.so"))
    import genai_ctypes as gc  # noqa: E402
    if "ops" in PARTS or "gqa" in PARTS:
        test_gqa()
    if "ops" in PARTS or "nbits" in PARTS:
        test_matmul_nbits()
    if "ops" in PARTS or "norms" in PARTS:
        test_norms()
        test_rotary()
        test_silu_mul()
        test_gate_up()
    if "gen" in PARTS or "cycles" in PARTS:
        with tempfile.TemporaryDirectory() as work:
            # accuracy_level 1 on every GQA folder: the GPU's MatMulNBits computes in float32 at
            # every level, while at level 4 the CPU quantizes A to int8 per block as ORT does
            folders = [("gqa sym", make(os.path.join(work, "gqa_sym"), "--form", "gqa", "--accuracy-level", "1"), True),
                       ("gqa asym", make(os.path.join(work, "gqa_asym"), "--form", "gqa", "--asymmetric",
                                         "--accuracy-level", "1"), True),
                       ("gqa heads 6/2", make(os.path.join(work, "gqa_62"), "--form", "gqa", "--heads", "6", "--kv-heads", "2",
                                              "--hidden", "96", "--layers", "3", "--seed", "5", "--accuracy-level", "1"), True),
                       ("gqa heads 3/1", make(os.path.join(work, "gqa_31"), "--form", "gqa", "--heads", "3", "--kv-heads", "1",
                                              "--hidden", "48", "--asymmetric", "--seed", "6", "--accuracy-level", "1"), True),
                       ("onnx form", make(os.path.join(work, "onnx")), False)]
            fp16 = make(os.path.join(work, "gqa_fp16"), "--form", "gqa", "--dtype", "fp16", "--random-weights", "--asymmetric",
                        "--accuracy-level", "1", "--external-data", "--intermediate", "160")
            # a 700-position buffer: on the GPU a decode row's keys run in several blocks (runs of 16
            # keys and more, kiln_gpu_gqa_splits), the new row written by the block of the last run
            # and the runs combined by the last block to finish (the tickets)
            long = make(os.path.join(work, "gqa_long"), "--form", "gqa", "--heads", "8", "--kv-heads", "2", "--hidden",
                        "128", "--context", "1024", "--seed", "7", "--accuracy-level", "1")
            if "gen" in PARTS:
                for label, folder, gqa in folders:
                    test_generation(folder, label, gqa)
                test_generation(long, "gqa heads 8/2, max_length 700", True, max_length=700)
                test_generation(fp16, "gqa float16", True, fp16=True)
                test_max_length(folders[0][1])
            if "cycles" in PARTS:
                test_create_free_cycles(folders[0][1])
                test_shared_model(folders[0][1])
    return summary()


if __name__ == "__main__":
    sys.exit(main())
