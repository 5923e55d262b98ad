#!/usr/bin/env python3
"""test_gpu_attn.py - the GPU 'attn' family (src/gpu/ops_attn.c): the default-domain Attention
(opsets 23, 24 and 25), RotaryEmbedding (opset 23) and TensorScatter (opset 24) on the CUDA
provider against the CPU reference (an unoptimized CPU session), on random data (never zeros),
float32, float16 and bfloat16 (bf16 through Cast nodes from float32 inputs), one session fed
several shapes each:

Attention: 4-D [B, H, S, D] and 3-D [B, S, H*D] inputs, head counts odd and grouped (kv heads
dividing q heads, 1 to 9 heads), head sizes 8 to 256 (odd ones, V's head size unlike K's), S = 1
decode with a past, prompts with and without a past, long KV (T up to 700), masks bool and float
(with -inf entries) in every broadcast rank (1 to 4, size-1 dims, a last dim shorter than T, rows
with every key masked), is_causal without and with a past (the diagonal offset), scale, softcap,
every qk_matmul_output_mode with the qk_matmul_output output, present_key / present_value with
and without a past (and a past with no present output), opset 24's nonpad_kv_seqlen (with
is_causal, lengths 0 to T), opset 25's sliding windows, softmax_precision float for bfloat16, a
refused call (past with nonpad_kv_seqlen) refused like the reference; RotaryEmbedding: 4-D and
3-D (num_heads), position_ids and batch caches, interleaved, partial rotary dims, an
out-of-range position refused like the reference; TensorScatter: linear and circular (wrapping),
write_indices given or not, axis -2 and 1, float and integer dtypes, an out-of-range write
refused; and the opset-24 KV cache pattern (TensorScatter into the caches, then Attention with
nonpad_kv_seqlen). Each case checks that its attn nodes were placed on the GPU, that nodes ran
there (node_runs_gpu) and that none fell back to its CPU kernel at run time (graphs_note).

usage: KILN_LIB=<build>/libkiln.so test_gpu_attn.py [substring filter]   (prints SKIP without a GPU)
  KILN_GPU_TEST_PROVIDER=cpu  puts the "GPU" sessions on the CPU: checks the test itself (model
                              building, feeds, reference runs) on a machine without a GPU
  KILN_GPU_ATTN_TESTS="attn rotary scatter cache" picks parts
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from checks import check, close, skip_without, summary  # noqa: E402
import kiln  # noqa: E402

PROVIDER = os.environ.get("KILN_GPU_TEST_PROVIDER", "cuda")
PARTS = os.environ.get("KILN_GPU_ATTN_TESTS", "attn rotary scatter cache").split()
FILTER = sys.argv[1] if len(sys.argv) > 1 else ""
ATTN_OPS = {"Attention", "RotaryEmbedding", "TensorScatter"}

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
BOOL, I64, I32, U8 = TensorProto.BOOL, TensorProto.INT64, TensorProto.INT32, TensorProto.UINT8
NP = {F32: np.float32, F16: np.float16, BOOL: np.bool_, I64: np.int64, I32: np.int32, U8: np.uint8}
DNAME = {F32: "f32", F16: "f16", BF16: "bf16"}
# error allowed relative to the output's magnitude (max finite |reference|, at least 1), and absolute
TOL = {F32: (2e-4, 2e-4), F16: (1e-2, 1e-2), BF16: (3e-2, 3e-2)}
rng = np.random.default_rng(2324)


def rand(*shape, scale=1.0):
    a = rng.standard_normal(shape) * scale
    a[a == 0] = 0.5
    return a.astype(np.float32)


def vi(name, dt, rank_or_shape):
    shape = [f"{name}{i}" for i in range(rank_or_shape)] if isinstance(rank_or_shape, int) else rank_or_shape
    return helper.make_tensor_value_info(name, dt, shape)


def model(nodes, inputs, outputs, opset):
    g = helper.make_graph(nodes, "attn", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m.SerializeToString()


def wrap(op_node_fn, float_inputs, dt, opset, other_inputs=(), n_out=1, outs=None, out_dtypes=None):
    """A model of the op node over float inputs for dtype dt, test_gpu_cnn.py's cast_wrap: bf16
    gets Cast nodes around (its inputs and outputs stay float32); f32 / f16 take the inputs
    directly (Identity). op_node_fn() builds the node (or a list of nodes) reading '<name>_c'
    for the float inputs and writing 'Y<k>_c' for k in outs (default range(n_out))."""
    outs = list(range(n_out)) if outs is None else list(outs)
    nodes, ins, ys = [], [], []
    for name, rank in float_inputs:
        if dt == BF16:
            ins.append(vi(name, F32, rank))
            nodes.append(helper.make_node("Cast", [name], [name + "_c"], to=BF16))
        else:
            ins.append(vi(name, dt, rank))
            nodes.append(helper.make_node("Identity", [name], [name + "_c"]))
    op = op_node_fn()
    nodes += op if isinstance(op, list) else [op]
    for k in outs:
        odt = (out_dtypes or {}).get(k, dt)
        if dt == BF16 and odt == BF16:
            nodes.append(helper.make_node("Cast", [f"Y{k}_c"], [f"Y{k}"], to=F32))
            ys.append(helper.make_tensor_value_info(f"Y{k}", F32, None))
        else:
            nodes.append(helper.make_node("Identity", [f"Y{k}_c"], [f"Y{k}"]))
            ys.append(helper.make_tensor_value_info(f"Y{k}", odt, None))
    return model(nodes, ins + list(other_inputs), ys, opset)


def node_outputs(outs, n):
    names = [f"Y{k}_c" if k in outs else "" for k in range(n)]
    while names and not names[-1]:
        names.pop()
    return names


def feed_np(a, dt):
    """Float feeds: float32 for bf16 (cast in the model), else the dtype."""
    return a.astype(np.float32) if dt == BF16 else a.astype(NP[dt])


def compare(name, blob, feeds_list, dt, tol=None):
    """The provider's session vs the CPU reference on every feed; a feed the reference refuses
    must be refused there too. On CUDA: the attn nodes placed on the GPU, nodes run there, and
    none fallen back to its CPU kernel at run time."""
    if FILTER and FILTER not in name:
        return
    rtol, atol = tol or TOL.get(dt, (0, 0))
    try:
        gpu = kiln.Session(blob, provider=PROVIDER)
        ref = kiln.Session(blob, unoptimized=True)
    except kiln.KilnError as e:
        check(f"{name}: create sessions", False, str(e))
        return
    if PROVIDER == "cuda":
        placed = [(op, prov) for _, op, prov in gpu.nodes() if op in ATTN_OPS]
        check(f"{name}: attn nodes on cuda", placed and all(p == "cuda" for _, p in placed), placed)
    for feeds in feeds_list:
        shapes = " ".join(f"{k}={list(v.shape)}" for k, v in feeds.items())
        label = f"{name} [{shapes}]"
        try:
            want = ref.run(feeds)
        except kiln.KilnError as e:
            try:
                gpu.run(feeds)
                check(f"{label} refused like the reference", False, f"reference: {e}; {PROVIDER} ran")
            except kiln.KilnError:
                check(f"{label} refused like the reference", True)
            continue
        runs0 = gpu.stats()["node_runs_gpu"]
        try:
            got = gpu.run(feeds)
        except kiln.KilnError as e:
            check(label, False, f"{PROVIDER} session failed: {e}")
            continue
        close(f"{label} vs reference", got, want, rtol, atol)
        if PROVIDER == "cuda":
            st = gpu.stats()
            check(f"{label}: ran on the GPU", st["node_runs_gpu"] > runs0, f"node_runs_gpu {runs0} -> {st['node_runs_gpu']}")
            check(f"{label}: no CPU fallback", "fell back" not in st["graphs_note"], st["graphs_note"])


# ---------------------------------------------------------------- Attention

def mask_shape(form, B, H, S, T):
    """attn_mask shapes by name: letters are dims of [B, H, S, T], '1' a size-1 dim; a trailing
    '-k' shortens the last dim by k (the reference masks the keys past it)."""
    short = 0
    if "-" in form:
        form, k = form.split("-")
        short = int(k)
    size = {"B": B, "H": H, "S": S, "T": T, "1": 1}
    shape = [size[c] for c in form]
    shape[-1] = max(1, shape[-1] - short)
    return shape


def mask_values(kind, shape, dt, all_masked_row=False):
    if kind == "bool":
        m = rng.random(shape) > 0.3
        if all_masked_row and len(shape) >= 2:
            m[..., 0, :] = False
        return m
    m = rand(*shape, scale=2.0)
    m[rng.random(shape) < 0.1] = -np.inf
    if all_masked_row and len(shape) >= 2:
        m[..., 0, :] = -np.inf
    return feed_np(m, dt)


def attn_case(name, dt, *, rank=4, Hq, Hkv, Dk, Dv=None, shapes, attrs=None, mask=None, past=False, nonpad=None,
              outs=(0,), opset=23, tol=None, all_masked_row=False):
    """One Attention model run on several (B, S, L, P) shapes. mask: None or (kind, form)
    (mask_shape, mask_values); past: past_key / past_value inputs of P rows; nonpad: a function
    (B, T) -> lengths [B] for opset 24's nonpad_kv_seqlen; outs: which of Y, present_key,
    present_value, qk_matmul_output the node lists."""
    Dv = Dv or Dk
    attrs = dict(attrs or {})
    if rank == 3:
        attrs.update(q_num_heads=Hq, kv_num_heads=Hkv)
    floats = [("Q", rank), ("K", rank), ("V", rank)]
    others = []
    mname = ""
    if mask:
        kind, form = mask
        mrank = len(form.split("-")[0])
        if kind == "bool":
            others.append(vi("M", BOOL, mrank))
            mname = "M"
        else:
            floats.append(("M", mrank))
            mname = "M_c"
    if past:
        floats += [("PK", 4), ("PV", 4)]
    if nonpad:
        others.append(vi("NP", I64, 1))
    ins = ["Q_c", "K_c", "V_c", mname, "PK_c" if past else "", "PV_c" if past else "", "NP" if nonpad else ""]
    while not ins[-1]:
        ins.pop()
    blob = wrap(lambda: helper.make_node("Attention", ins, node_outputs(outs, 4), **attrs), floats, dt, opset,
                others, outs=outs)
    feeds = []
    for B, S, L, P in shapes:
        T = P + L
        if rank == 4:
            f = {"Q": rand(B, Hq, S, Dk), "K": rand(B, Hkv, L, Dk), "V": rand(B, Hkv, L, Dv)}
        else:
            f = {"Q": rand(B, S, Hq * Dk), "K": rand(B, L, Hkv * Dk), "V": rand(B, L, Hkv * Dv)}
        f = {k: feed_np(v, dt) for k, v in f.items()}
        if past:
            f["PK"] = feed_np(rand(B, Hkv, P, Dk), dt)
            f["PV"] = feed_np(rand(B, Hkv, P, Dv), dt)
        if mask:
            f["M"] = mask_values(mask[0], mask_shape(mask[1], B, Hq, S, T), dt, all_masked_row)
        if nonpad:
            f["NP"] = np.asarray(nonpad(B, T), dtype=np.int64)
        feeds.append(f)
    compare(name, blob, feeds, dt, tol)


def test_attention():
    F32_ONLY, ALL = (F32,), (F32, F16, BF16)
    bf16_sm = {"softmax_precision": 1}  # float softmax: the reference's bf16 accumulator drifts on long rows
    for dt in ALL:
        sm = bf16_sm if dt == BF16 else {}
        d = DNAME[dt]
        # plain prompts, 4-D and 3-D, odd heads and grouped KV heads
        for rank, Hq, Hkv, D in [(4, 4, 4, 16), (4, 6, 2, 32), (3, 7, 1, 8), (3, 5, 5, 24), (4, 9, 3, 40)]:
            attn_case(f"attn {d} rank{rank} Hq{Hq} Hkv{Hkv} D{D}", dt, rank=rank, Hq=Hq, Hkv=Hkv, Dk=D, attrs=sm,
                      shapes=[(2, 5, 5, 0), (1, 7, 7, 0), (3, 1, 9, 0), (1, 13, 4, 0)])
        # head sizes, V's unlike K's
        for Dk, Dv in [(13, 13), (64, 64), (80, 48), (128, 128), (200, 72), (256, 256)]:
            attn_case(f"attn {d} Dk{Dk} Dv{Dv}", dt, Hq=4, Hkv=2, Dk=Dk, Dv=Dv, attrs=sm,
                      shapes=[(1, 3, 11, 0), (2, 1, 5, 0)])
        # decode with a past, present outputs; prompt after a past
        attn_case(f"attn {d} decode past present", dt, rank=3, Hq=6, Hkv=2, Dk=32, past=True, outs=(0, 1, 2),
                  attrs=sm, shapes=[(2, 1, 1, 7), (1, 1, 1, 30), (3, 1, 1, 1), (2, 4, 4, 9)])
        attn_case(f"attn {d} causal past", dt, Hq=4, Hkv=1, Dk=24, past=True, outs=(0, 1, 2),
                  attrs=dict(sm, is_causal=1), shapes=[(2, 1, 1, 8), (1, 5, 5, 11), (2, 6, 3, 4)])
        attn_case(f"attn {d} causal", dt, rank=3, Hq=3, Hkv=3, Dk=16, attrs=dict(sm, is_causal=1),
                  shapes=[(2, 37, 37, 0), (1, 5, 9, 0), (1, 9, 5, 0)])
        # masks
        attn_case(f"attn {d} bool mask B1ST", dt, Hq=4, Hkv=2, Dk=16, mask=("bool", "B1ST"), attrs=sm,
                  shapes=[(2, 6, 6, 0), (1, 1, 9, 0)], all_masked_row=True)
        attn_case(f"attn {d} float mask BHST", dt, Hq=3, Hkv=1, Dk=32, mask=("float", "BHST"), attrs=sm,
                  shapes=[(2, 5, 7, 0), (1, 3, 3, 0)], all_masked_row=True)
        # long KV
        attn_case(f"attn {d} long", dt, Hq=2, Hkv=1, Dk=64, attrs=sm, shapes=[(1, 2, 700, 0), (1, 1, 333, 0)])
        attn_case(f"attn {d} long decode", dt, rank=3, Hq=4, Hkv=2, Dk=32, past=True, outs=(0, 1, 2),
                  attrs=dict(sm, is_causal=1), shapes=[(1, 1, 1, 699), (2, 1, 1, 257)])
        # softcap and scale, the qk output
        attn_case(f"attn {d} softcap scale", dt, Hq=4, Hkv=2, Dk=16, attrs=dict(sm, softcap=2.0, scale=0.7),
                  shapes=[(2, 4, 9, 0)])
        attn_case(f"attn {d} qk mode 3", dt, Hq=4, Hkv=2, Dk=16, mask=("bool", "ST"), outs=(0, 3),
                  attrs=dict(sm, qk_matmul_output_mode=3), shapes=[(2, 4, 9, 0), (1, 1, 70, 0)])
    # bf16 with the default (bf16) softmax precision, short rows
    attn_case("attn bf16 softmax bf16", BF16, Hq=2, Hkv=1, Dk=16, shapes=[(2, 3, 6, 0)])
    # mask broadcast ranks and short last dims
    for kind in ("bool", "float"):
        for form in ("T", "ST", "HST", "1H1T", "B11T", "BHST", "S1", "ST-3", "B1ST-1"):
            attn_case(f"attn f32 {kind} mask {form}", F32, Hq=3, Hkv=1, Dk=8, mask=(kind, form), past=True,
                      outs=(0, 1, 2), shapes=[(2, 4, 4, 3), (1, 1, 1, 6)])
    attn_case("attn f16 float mask causal past", F16, rank=3, Hq=4, Hkv=2, Dk=16, mask=("float", "B1ST"), past=True,
              attrs={"is_causal": 1}, shapes=[(2, 3, 3, 5), (2, 1, 1, 12)])
    # every qk_matmul_output_mode, with masks, causal and softcap
    for mode in range(4):
        for dt in F32_ONLY + (F16,):
            attn_case(f"attn {DNAME[dt]} qk mode {mode}", dt, Hq=4, Hkv=2, Dk=16, mask=("float", "BHST"), past=True,
                      outs=(0, 1, 2, 3), attrs={"qk_matmul_output_mode": mode, "is_causal": 1, "softcap": 3.0},
                      shapes=[(2, 3, 3, 4), (1, 1, 1, 9)])
    attn_case("attn f32 qk only", F32, rank=3, Hq=2, Hkv=2, Dk=8, outs=(0, 3), shapes=[(1, 3, 5, 0)])
    # a past with no present output (workspace), Y only
    attn_case("attn f32 past no present", F32, Hq=6, Hkv=3, Dk=32, past=True, attrs={"is_causal": 1},
              shapes=[(2, 1, 1, 10), (1, 3, 3, 2)])
    attn_case("attn f32 present no past", F32, rank=3, Hq=2, Hkv=1, Dk=16, outs=(0, 1, 2), shapes=[(2, 3, 3, 0)])
    # opset 24: nonpad_kv_seqlen (K and V are the whole cache)
    for causal in (0, 1):
        for dt in (F32, F16, BF16):
            attn_case(f"attn {DNAME[dt]} nonpad causal={causal}", dt, Hq=4, Hkv=2, Dk=16, opset=24,
                      attrs=dict(bf16_sm if dt == BF16 else {}, is_causal=causal),
                      nonpad=lambda B, T: [max(0, T - 2 * b) for b in range(B)],
                      shapes=[(2, 1, 12, 0), (3, 3, 9, 0)])
    attn_case("attn f32 nonpad zero and full", F32, rank=3, Hq=3, Hkv=1, Dk=8, opset=24, outs=(0, 1, 2),
              nonpad=lambda B, T: [0, T, 5][:B], shapes=[(3, 2, 7, 0)])
    attn_case("attn f32 nonpad with past refused", F32, Hq=2, Hkv=1, Dk=8, opset=24, past=True,
              nonpad=lambda B, T: [T] * B, shapes=[(1, 1, 1, 4)])
    # opset 25: sliding windows
    for left, right in [(3, -1), (-1, 2), (2, 0)]:
        attn_case(f"attn f32 window {left} {right}", F32, Hq=2, Hkv=1, Dk=8, opset=25, past=True,
                  attrs={"left_window_size": left, "right_window_size": right},
                  shapes=[(2, 5, 5, 4), (1, 1, 1, 9)])


def written_attention(dt, B, S, H, D):
    """BERT's self-attention as exporters write it out, in dt (float16 / bfloat16 as such, no
    casts): heads split by Reshape + Transpose from [B, S, H*D] Q, K, V, K transposed again,
    MatMul, Div by sqrt(D), Add of a [B, 1, 1, S] mask, Softmax, MatMul, heads merged back."""
    t = lambda n, perm, o: helper.make_node("Transpose", [n], [o], perm=perm)  # noqa: E731
    nodes = []
    for x in "QKV":
        nodes += [helper.make_node("Reshape", [x, "heads"], [x + "4"]), t(x + "4", [0, 2, 1, 3], x + "h")]
    nodes += [t("Kh", [0, 1, 3, 2], "Kt"), helper.make_node("MatMul", ["Qh", "Kt"], ["s"]),
              helper.make_node("Div", ["s", "root"], ["sd"]), helper.make_node("Add", ["sd", "M"], ["sm"]),
              helper.make_node("Softmax", ["sm"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "Vh"], ["o"]),
              t("o", [0, 2, 1, 3], "ot"), helper.make_node("Reshape", ["ot", "merged"], ["Y"])]
    ins = [helper.make_tensor_value_info(x, dt, ["b", "s", H * D]) for x in "QKV"]
    ins.append(helper.make_tensor_value_info("M", dt, ["b", 1, 1, "s"]))
    inits = [numpy_helper.from_array(np.array([0, 0, H, D], np.int64), "heads"),
             numpy_helper.from_array(np.array([0, 0, H * D], np.int64), "merged"),
             numpy_helper.from_array(feed_np(np.array(np.sqrt(D), np.float32), dt) if dt != BF16 else
                                     np.array(np.sqrt(D), np.float32), "root")]
    g = helper.make_graph(nodes, "written", ins, [helper.make_tensor_value_info("Y", dt, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    feeds = {x: feed_np(rand(B, S, H * D), dt) for x in "QKV"}
    mask = np.where(rng.random((B, 1, 1, S)) < 0.2, -10000.0, 0.0)
    feeds["M"] = feed_np(mask, dt)
    return m.SerializeToString(), feeds


def test_attention_flash():
    """Calls the tensor-core kernel takes (float16 and bfloat16, head sizes 32 and 64, 16 query
    rows or more): tails of query and key tiles, grouped KV heads, 3-D and 4-D, masks (a short
    last dim, all-masked rows), causal after a past. Under KILN_GPU_FLASH=0 the same calls check
    the kernel of every case."""
    for dt in (F16, BF16):
        sm = {"softmax_precision": 1} if dt == BF16 else {}
        d = DNAME[dt]
        attn_case(f"flash {d} D64", dt, Hq=4, Hkv=4, Dk=64, attrs=sm,
                  shapes=[(2, 64, 64, 0), (1, 197, 197, 0), (3, 16, 100, 0), (1, 130, 5, 0)])
        attn_case(f"flash {d} rank3 GQA D32", dt, rank=3, Hq=6, Hkv=2, Dk=32, attrs=sm,
                  shapes=[(2, 33, 70, 0), (1, 17, 17, 0)])
        attn_case(f"flash {d} causal past", dt, Hq=4, Hkv=1, Dk=64, past=True, outs=(0, 1, 2),
                  attrs=dict(sm, is_causal=1), shapes=[(2, 20, 20, 9), (1, 65, 65, 3)])
        attn_case(f"flash {d} causal", dt, rank=3, Hq=2, Hkv=2, Dk=64, attrs=dict(sm, is_causal=1),
                  shapes=[(1, 100, 100, 0), (2, 16, 40, 0)])
        attn_case(f"flash {d} bool mask B1ST", dt, Hq=4, Hkv=2, Dk=32, mask=("bool", "B1ST"), attrs=sm,
                  shapes=[(2, 40, 40, 0), (1, 16, 77, 0)], all_masked_row=True)
        attn_case(f"flash {d} float mask B11T", dt, rank=3, Hq=12, Hkv=12, Dk=64, mask=("float", "B11T"), attrs=sm,
                  shapes=[(2, 128, 128, 0)])
        attn_case(f"flash {d} float mask ST-3", dt, Hq=2, Hkv=1, Dk=64, mask=("float", "ST-3"), attrs=sm,
                  shapes=[(1, 20, 30, 0)])
        attn_case(f"flash {d} scale", dt, Hq=3, Hkv=1, Dk=32, attrs=dict(sm, scale=0.3), shapes=[(2, 50, 61, 0)])
    # attention written out (float16: numpy has no bfloat16 feeds): fused by the GPU pipeline
    # unless KILN_GPU_FLASH=0, and the same numbers either way
    for B, S in ((2, 128), (1, 197)):
        blob, feeds = written_attention(F16, B, S, 12, 64)
        name = f"written attention f16 B{B} S{S}"
        if FILTER and FILTER not in name:
            continue
        try:
            gpu = kiln.Session(blob, provider=PROVIDER)
            want = kiln.Session(blob, unoptimized=True).run(feeds)
            got = gpu.run(feeds)
        except kiln.KilnError as e:
            check(name, False, str(e))
            continue
        close(f"{name} vs reference", got, want, *TOL[F16])
        if PROVIDER == "cuda":
            ops = [op for _, op, _ in gpu.nodes()]
            fused = os.environ.get("KILN_GPU_FLASH") != "0"
            check(f"{name}: Attention {'fused' if fused else 'not fused'}", ("Attention" in ops) == fused, ops)


# ---------------------------------------------------------------- RotaryEmbedding

def rotary_case(name, dt, *, rank, H, D, rd=0, interleaved=0, with_pos=True, shapes, bad_pos=False):
    attrs = {"interleaved": interleaved}
    if rd:
        attrs["rotary_embedding_dim"] = rd
    if rank == 3:
        attrs["num_heads"] = H
    half = (rd or D) // 2
    max_pos = 40
    floats = [("X", rank), ("C", 2 if with_pos else 3), ("Sn", 2 if with_pos else 3)]
    others = [vi("P", I64, 2)] if with_pos else []
    ins = ["X_c", "C_c", "Sn_c"] + (["P"] if with_pos else [])
    blob = wrap(lambda: helper.make_node("RotaryEmbedding", ins, ["Y0_c"], **attrs), floats, dt, 23, others)
    feeds = []
    for B, S in shapes:
        x = rand(B, H, S, D) if rank == 4 else rand(B, S, H * D)
        ang = rng.random((max_pos, half) if with_pos else (B, S, half)) * 6.0
        f = {"X": feed_np(x, dt), "C": feed_np(np.cos(ang), dt), "Sn": feed_np(np.sin(ang), dt)}
        if with_pos:
            p = rng.integers(0, max_pos, size=(B, S)).astype(np.int64)
            if bad_pos:
                p[-1, -1] = max_pos
            f["P"] = p
        feeds.append(f)
    compare(name, blob, feeds, dt)


def test_rotary():
    for dt in (F32, F16, BF16):
        d = DNAME[dt]
        for rank in (3, 4):
            for inter in (0, 1):
                rotary_case(f"rotary {d} rank{rank} interleaved={inter}", dt, rank=rank, H=3, D=16, interleaved=inter,
                            shapes=[(2, 5), (1, 1), (3, 7)])
                rotary_case(f"rotary {d} rank{rank} interleaved={inter} rd 6 of 10", dt, rank=rank, H=5, D=10, rd=6,
                            interleaved=inter, shapes=[(2, 3), (1, 9)])
            rotary_case(f"rotary {d} rank{rank} batch caches", dt, rank=rank, H=2, D=64, with_pos=False,
                        shapes=[(2, 5), (1, 1)])
        rotary_case(f"rotary {d} odd head rd 4", dt, rank=4, H=7, D=9, rd=4, shapes=[(2, 3)])
    rotary_case("rotary f32 position out of range refused", F32, rank=4, H=2, D=8, shapes=[(2, 3)], bad_pos=True)


# ---------------------------------------------------------------- TensorScatter

def scatter_case(name, dt, *, cache, upd, axis=None, mode=None, windex=None, shapes_note="", bad=False):
    """cache / upd: the shapes; windex: write indices [batch] or None."""
    attrs = {}
    if axis is not None:
        attrs["axis"] = axis
    if mode:
        attrs["mode"] = mode
    rank = len(cache)
    ins = ["X_c", "U_c"] + (["W"] if windex is not None else [])
    others = [vi("W", I64, 1)] if windex is not None else []
    node = lambda: helper.make_node("TensorScatter", ins, ["Y0_c"], **attrs)  # noqa: E731
    if dt in (F32, F16, BF16):
        blob = wrap(node, [("X", rank), ("U", rank)], dt, 24, others)
        x, u = feed_np(rand(*cache), dt), feed_np(rand(*upd), dt)
    else:
        nodes = [helper.make_node("Identity", ["X"], ["X_c"]), helper.make_node("Identity", ["U"], ["U_c"]), node(),
                 helper.make_node("Identity", ["Y0_c"], ["Y0"])]
        blob = model(nodes, [vi("X", dt, rank), vi("U", dt, rank)] + others, [helper.make_tensor_value_info("Y0", dt, None)],
                     24)
        if dt == BOOL:
            x, u = rng.random(cache) > 0.5, rng.random(upd) > 0.5
        else:
            x = rng.integers(-1000, 1000, size=cache).astype(NP[dt])
            u = rng.integers(-1000, 1000, size=upd).astype(NP[dt])
    f = {"X": x, "U": u}
    if windex is not None:
        f["W"] = np.asarray(windex, dtype=np.int64)
    compare(name + shapes_note, blob, [f], dt)


def test_scatter():
    for dt in (F32, F16, BF16, I64, I32, BOOL, U8):
        d = DNAME.get(dt, TensorProto.DataType.Name(dt).lower())
        scatter_case(f"scatter {d} linear", dt, cache=[2, 3, 10, 8], upd=[2, 3, 4, 8], windex=[0, 6])
        scatter_case(f"scatter {d} circular", dt, cache=[3, 2, 7, 5], upd=[3, 2, 3, 5], mode="circular",
                     windex=[5, 6, -2])
    scatter_case("scatter f32 no indices", F32, cache=[2, 4, 9, 16], upd=[2, 4, 9, 16])
    scatter_case("scatter f32 axis 1", F32, cache=[3, 12, 6], upd=[3, 5, 6], axis=1, windex=[0, 7, 3])
    scatter_case("scatter f16 axis 2 of 5", F16, cache=[2, 3, 8, 2, 4], upd=[2, 3, 1, 2, 4], axis=2, windex=[7, 0])
    scatter_case("scatter f32 circular axis 1", F32, cache=[2, 6, 3], upd=[2, 6, 3], axis=1, mode="circular",
                 windex=[4, 13])
    scatter_case("scatter f32 out of range refused", F32, cache=[2, 3, 10, 8], upd=[2, 3, 4, 8], windex=[0, 7])


# ---------------------------------------------------------------- the opset-24 KV cache pattern

def test_cache():
    """TensorScatter writes the new K/V rows into fixed-size caches at each batch row's length,
    then Attention reads the caches with nonpad_kv_seqlen = length + new rows (causal)."""
    for dt in (F32, F16, BF16):
        Hq, Hkv, D, M = 6, 2, 32, 24
        nodes = [helper.make_node("TensorScatter", ["KC_c", "K_c", "W"], ["KN"]),
                 helper.make_node("TensorScatter", ["VC_c", "V_c", "W"], ["VN"]),
                 helper.make_node("Add", ["W", "S"], ["NP"]),
                 helper.make_node("Attention", ["Q_c", "KN", "VN", "", "", "", "NP"], ["Y0_c"], is_causal=1,
                                  **({"softmax_precision": 1} if dt == BF16 else {}))]
        floats = [("Q", 4), ("K", 4), ("V", 4), ("KC", 4), ("VC", 4)]
        blob = wrap(lambda: nodes, floats, dt, 24, [vi("W", I64, 1), vi("S", I64, [1])])
        feeds = []
        for B, S, lens in [(2, 1, [5, 11]), (3, 4, [0, 9, 20]), (1, 1, [23])]:
            f = {"Q": rand(B, Hq, S, D), "K": rand(B, Hkv, S, D), "V": rand(B, Hkv, S, D),
                 "KC": rand(B, Hkv, M, D), "VC": rand(B, Hkv, M, D)}
            f = {k: feed_np(v, dt) for k, v in f.items()}
            f["W"] = np.asarray(lens, dtype=np.int64)
            f["S"] = np.asarray([S], dtype=np.int64)
            feeds.append(f)
        compare(f"kv cache {DNAME[dt]}", blob, feeds, dt)


def main():
    if skip_without(PROVIDER):
        return 0
    if os.environ.get("KILN_GPU_FLASH") == "0":  # the child below: those calls on the CUDA-core kernel
        test_attention_flash()
        return summary("test_gpu_attn (KILN_GPU_FLASH=0): ")
    if "attn" in PARTS:
        test_attention()
        test_attention_flash()
        if PROVIDER == "cuda":
            import subprocess
            r = subprocess.run([sys.executable, __file__] + sys.argv[1:], env=dict(os.environ, KILN_GPU_FLASH="0"),
                               capture_output=True, text=True)
            tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
            check("the flash cases again with KILN_GPU_FLASH=0 (CUDA cores)", r.returncode == 0, " | ".join(tail))
    if "rotary" in PARTS:
        test_rotary()
    if "scatter" in PARTS:
        test_scatter()
    if "cache" in PARTS:
        test_cache()
    return summary("test_gpu_attn: ")


if __name__ == "__main__":
    sys.exit(main())
