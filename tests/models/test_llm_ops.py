#!/usr/bin/env python3
"""The LLM operators against ONNX Runtime: com.microsoft GroupQueryAttention (separate and packed
QKV, first prompt with and without right padding, subsequent prompt, decode, past and present in
separate buffers and as one max_length buffer, rotary plain and interleaved with partial rotary
dims, position_ids, attention_bias, local_window_size at the window's edges, softcap,
smooth_softmax, head_sink, scale, odd head counts), com.microsoft MatMulNBits (4 and 8 bits,
blocks 16 to 256, K not a multiple of the block, zero points packed, unpacked and absent, bias,
float16), com.microsoft RotaryEmbedding and SimplifiedLayerNormalization (com.microsoft and the
default domain, as ONNX Runtime registers it), each as a one-node model on random data (never
zeros), in an optimised and a reference kiln session; the ONNX forms (RotaryEmbedding 23,
RMSNormalization 23, Attention 23/24 with nonpad_kv_seqlen, TensorScatter 24) against onnx's
ReferenceEvaluator where ONNX Runtime lacks them.

MatMulNBits runs at accuracy_level 0 (fp32 arithmetic) and at level 4, where kiln, as ONNX
Runtime does, quantizes A to int8 per block for 4-bit weights with packed or no zero points (float
zero points stay fp32 in both).

usage: test_llm_ops.py   (libkiln.so from build/ or $KILN_LIB)
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402

MS = "com.microsoft"
rng = np.random.default_rng(33)
ort.set_default_logger_severity(4)


def rand(*shape, dtype=np.float32, scale=1.0):
    a = (rng.standard_normal(shape) * scale).astype(dtype)
    a[a == 0] = 0.5  # never zeros
    return a


def tt(dt):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def model(nodes, inputs, outputs, inits=(), opsets=(("", 21), (MS, 1)), ir=10):
    nodes = nodes if isinstance(nodes, list) else [nodes]
    g = helper.make_graph(nodes, "llm", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = ir
    return m


def vi(name, dt, rank):
    return helper.make_tensor_value_info(name, dt, [f"{name}_{i}" for i in range(rank)])


def out(name):
    return onnx.ValueInfoProto(name=name)


def ort_session(m):
    so = ort.SessionOptions()
    so.log_severity_level = 4
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def kiln_sessions(m):
    blob = m.SerializeToString()
    return [("fast", kiln.Session(blob, num_threads=2)), ("ref", kiln.Session(blob, unoptimized=True))]


def close(name, got, want, rtol, atol):
    ok = len(got) == len(want)
    detail = f"{len(got)} outputs vs {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return check(name, False, f"output {k}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}")
        d = np.abs(g.astype(np.float64) - w.astype(np.float64))
        if not np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True):
            return check(name, False, f"output {k}: max diff {d.max()} at {np.unravel_index(d.argmax(), d.shape)}")
    return check(name, ok, detail)


def compare(name, m, feeds_list, rtol=1e-4, atol=1e-5, expect_fail=False):
    """Runs every feed through ORT and both kiln sessions; with expect_fail, both must refuse."""
    try:
        ref = ort_session(m)
    except Exception as e:  # noqa: BLE001
        check(f"{name}: ORT loads it", False, str(e).splitlines()[0][:200])
        return
    try:
        sessions = kiln_sessions(m)
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
                    check(f"{name} [{tag}] {shapes}", False, f"ORT refuses ({str(e).splitlines()[0][:160]}) but kiln ran")
                except kiln.KilnError:
                    check(f"{name} [{tag}] {shapes} (both refuse)", expect_fail)
            continue
        for tag, s in sessions:
            try:
                got = s.run(feeds)
            except kiln.KilnError as e:
                check(f"{name} [{tag}] {shapes}", False, f"kiln failed: {e}")
                continue
            close(f"{name} [{tag}] {shapes}", got, want, rtol, atol)


# ---------------------------------------------------------------- GroupQueryAttention

def gqa_model(N, Nkv, H, dt=np.float32, packed=False, past=True, rotary=False, pos_ids=False, bias=False,
              sink=False, **attrs):
    t = tt(dt)
    names = ["query", "" if packed else "key", "" if packed else "value", "past_key" if past else "",
             "past_value" if past else "", "seqlens_k", "total_sequence_length",
             "cos_cache" if rotary else "", "sin_cache" if rotary else "", "position_ids" if pos_ids else "",
             "attention_bias" if bias else "", "head_sink" if sink else ""]
    while names and names[-1] == "":
        names.pop()
    if rotary:
        attrs["do_rotary"] = 1
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"], domain=MS,
                            num_heads=N, kv_num_heads=Nkv, **attrs)
    ins = [vi("query", t, 3)]
    if not packed:
        ins += [vi("key", t, 3), vi("value", t, 3)]
    if past:
        ins += [vi("past_key", t, 4), vi("past_value", t, 4)]
    ins += [vi("seqlens_k", TensorProto.INT32, 1), helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    if rotary:
        ins += [vi("cos_cache", t, 2), vi("sin_cache", t, 2)]
    if pos_ids:
        ins += [vi("position_ids", TensorProto.INT64, 2)]
    if bias:
        ins += [vi("attention_bias", t, 4)]
    if sink:
        ins += [vi("head_sink", t, 1)]
    return model(node, ins, [out("output"), out("present_key"), out("present_value")])


def gqa_feeds(B, S, N, Nkv, H, seqlens, total, past_len=None, dt=np.float32, packed=False, rd=None, max_pos=64,
              pos=None, bias=None, sink=False):
    f = {}
    if packed:
        f["query"] = rand(B, S, (N + 2 * Nkv) * H, dtype=dt)
    else:
        f["query"], f["key"], f["value"] = rand(B, S, N * H, dtype=dt), rand(B, S, Nkv * H, dtype=dt), rand(B, S, Nkv * H, dtype=dt)
    if past_len is not None:
        f["past_key"], f["past_value"] = rand(B, Nkv, past_len, H, dtype=dt), rand(B, Nkv, past_len, H, dtype=dt)
    f["seqlens_k"] = np.array(seqlens, np.int32)
    f["total_sequence_length"] = np.array(total, np.int32)
    if rd:
        ang = rng.uniform(0, 6.28, (max_pos, rd // 2))
        f["cos_cache"], f["sin_cache"] = np.cos(ang).astype(dt), np.sin(ang).astype(dt)
    if pos is not None:
        f["position_ids"] = np.array(pos, np.int64)
    if bias is not None:
        f["attention_bias"] = rand(*bias, dtype=dt)
    if sink:
        f["head_sink"] = rand(N, dtype=dt)
    return f


def test_gqa():
    cases = []  # (label, model kwargs, list of feed kwargs)
    for N, Nkv, H in [(6, 2, 16), (3, 1, 8), (5, 5, 24)]:  # ORT wants head_size % 8 == 0
        for packed in (False, True):
            kw = dict(packed=packed)
            feeds = [
                # first prompt, no padding
                dict(B=2, S=5, seqlens=[4, 4], total=5, past_len=0),
                # first prompt, right padding
                dict(B=2, S=5, seqlens=[4, 2], total=5, past_len=0),
                # decode with a growing past (separate buffers)
                dict(B=2, S=1, seqlens=[7, 7], total=8, past_len=7),
                # decode from one max_length buffer, rows at different lengths
                dict(B=3, S=1, seqlens=[3, 9, 0], total=10, past_len=12),
                # subsequent prompt (batch 1)
                dict(B=1, S=3, seqlens=[6], total=7, past_len=4),
                # first prompt written into a max_length buffer
                dict(B=2, S=4, seqlens=[3, 1], total=4, past_len=9),
            ]
            cases.append((f"N={N} Nkv={Nkv} H={H} packed={packed}", kw, [dict(N=N, Nkv=Nkv, H=H, packed=packed, **f) for f in feeds]))
    base = [dict(B=2, S=6, seqlens=[5, 5], total=6, past_len=0), dict(B=2, S=1, seqlens=[8, 5], total=9, past_len=11),
            dict(B=1, S=4, seqlens=[9], total=10, past_len=6)]
    for lws in (0, 1, 2, 3, 5, 8):
        cases.append((f"local_window_size={lws}", dict(local_window_size=lws), [dict(N=4, Nkv=2, H=8, **f) for f in base]))
    for attrs in [dict(softcap=2.5), dict(scale=0.3), dict(smooth_softmax=1), dict(softcap=1.5, local_window_size=3)]:
        cases.append((str(attrs), attrs, [dict(N=4, Nkv=2, H=8, **f) for f in base]))
    cases.append(("head_sink", dict(sink=True), [dict(N=4, Nkv=2, H=8, sink=True, **f) for f in base]))
    cases.append(("head_sink smooth", dict(sink=True, smooth_softmax=1), [dict(N=4, Nkv=2, H=8, sink=True, **f) for f in base]))
    for bshape in [(2, 4, None), (1, 1, None), (2, 1, None), (1, 4, None)]:
        fl = []
        for f in base:
            b0 = bshape[0] if bshape[0] == 1 else f["B"]
            fl.append(dict(N=4, Nkv=2, H=8, bias=(b0, bshape[1], f["S"], f["total"]), **f))
        cases.append((f"attention_bias {bshape[:2]}", dict(bias=True), fl))
    for inter in (0, 1):
        for H, rd, packed in [(16, 16, False), (32, 16, False), (48, 48, True), (64, 16, True)]:  # ORT: H % 16, cos dim 1 % 8
            fl = [dict(N=4, Nkv=2, H=H, rd=rd, packed=packed, **f) for f in base]
            cases.append((f"rotary interleaved={inter} H={H} rd={rd} packed={packed}",
                          dict(rotary=True, rotary_interleaved=inter, packed=packed), fl))
    # position_ids (decode and subsequent prompt; the first prompt with 0..S-1)
    fl = [dict(N=4, Nkv=2, H=16, rd=16, pos=[[0, 1, 2, 3, 4, 5]] * 2, **base[0]),
          dict(N=4, Nkv=2, H=16, rd=16, pos=[[20], [7]], **base[1]),
          dict(N=4, Nkv=2, H=16, rd=16, pos=[[6, 7, 8, 9]], **base[2])]
    cases.append(("rotary position_ids", dict(rotary=True, pos_ids=True), fl))
    # prompts long enough for several row blocks and key tiles of the CPU's blocked kernel
    # (kernels_gqa.c: 8 query rows x 16 keys; heads of 16k dims): odd lengths, right padding,
    # a subsequent prompt over a long past, a shared max_length buffer
    long = [dict(B=2, S=37, seqlens=[36, 20], total=37, past_len=0),
            dict(B=1, S=19, seqlens=[52], total=53, past_len=34),
            dict(B=2, S=23, seqlens=[22, 22], total=23, past_len=64)]
    for H, N, Nkv in [(64, 4, 2), (128, 3, 1), (32, 2, 2)]:
        cases.append((f"long prompts N={N} Nkv={Nkv} H={H}", dict(rotary=True),
                      [dict(N=N, Nkv=Nkv, H=H, rd=H, max_pos=64, **f) for f in long]))
    for attrs in [dict(softcap=2.0), dict(smooth_softmax=1)]:
        cases.append((f"long prompts {attrs}", attrs, [dict(N=4, Nkv=2, H=16, **f) for f in long]))
    # (windows without padding rows: on a padding row of a first prompt ORT's window differs from
    # the reference's, which takes the row's causal length as the padded total)
    unpadded = [dict(long[0], seqlens=[36, 36])] + long[1:]
    for lws in (5, 17):
        cases.append((f"long prompts local_window_size={lws}", dict(local_window_size=lws),
                      [dict(N=4, Nkv=2, H=16, **f) for f in unpadded]))
    cases.append(("long prompts head_sink", dict(sink=True), [dict(N=4, Nkv=2, H=16, sink=True, **f) for f in long]))
    cases.append(("long prompts attention_bias", dict(bias=True),
                  [dict(N=4, Nkv=2, H=16, bias=(f["B"], 4, f["S"], f["total"]), **f) for f in long]))
    # decode steps and short prompts on the CPU's grouped kernel (the query heads of a KV head
    # together, up to 8 at a time; heads of 16k dims): attributes, bias, sinks, 16 heads a group
    short = [dict(B=2, S=1, seqlens=[8, 5], total=9, past_len=11), dict(B=1, S=3, seqlens=[40], total=41, past_len=45),
             dict(B=2, S=1, seqlens=[33, 17], total=34, past_len=34)]
    for attrs in [dict(softcap=2.0), dict(local_window_size=3), dict(local_window_size=20), dict(smooth_softmax=1)]:
        cases.append((f"decode {attrs}", attrs, [dict(N=4, Nkv=2, H=16, **f) for f in short]))
    cases.append(("decode head_sink", dict(sink=True), [dict(N=4, Nkv=2, H=16, sink=True, **f) for f in short]))
    cases.append(("decode attention_bias", dict(bias=True),
                  [dict(N=4, Nkv=2, H=16, bias=(f["B"], 4, f["S"], f["total"]), **f) for f in short]))
    cases.append(("decode 16 query heads a KV head", dict(rotary=True),
                  [dict(N=16, Nkv=1, H=64, rd=64, **f) for f in short]))
    # errors: seqlens past the buffer, positions past the caches
    bad = [dict(N=4, Nkv=2, H=8, B=2, S=1, seqlens=[8, 11], total=9, past_len=11),
           dict(N=4, Nkv=2, H=8, B=2, S=1, seqlens=[8, -1], total=9, past_len=11),
           dict(N=4, Nkv=2, H=8, B=1, S=1, seqlens=[40], total=41, past_len=20)]
    cases.append(("seqlens_k out of range", {}, bad))
    cases.append(("position past the rotary cache", dict(rotary=True, pos_ids=True),
                  [dict(N=4, Nkv=2, H=16, rd=16, pos=[[200], [7]], **base[1])]))
    for label, mkw, fl in cases:
        f0 = fl[0]
        dt = mkw.pop("dt", np.float32)
        m = gqa_model(f0["N"], f0["Nkv"], f0["H"], dt=dt, past=True, **mkw)
        feeds = []
        for f in fl:
            f = dict(f)
            N, Nkv, H = f.pop("N"), f.pop("Nkv"), f.pop("H")
            feeds.append(gqa_feeds(N=N, Nkv=Nkv, H=H, dt=dt, **f))
        compare(f"GQA {label}", m, feeds, rtol=1e-4, atol=2e-5, expect_fail="range" in label or "past the" in label)
    # an attention_bias row of -inf for every key: that row's output is zeros (as ORT), not NaN,
    # on the blocked prompt kernel and the grouped decode kernel
    m = gqa_model(4, 2, 16, bias=True)
    fl = []
    for f in (dict(B=1, S=5, seqlens=[4], total=5, past_len=0), dict(B=2, S=1, seqlens=[8, 5], total=9, past_len=11)):
        fd = gqa_feeds(N=4, Nkv=2, H=16, bias=(f["B"], 4, f["S"], f["total"]), **f)
        fd["attention_bias"][0, 1, f["S"] - 1, :] = -np.inf
        fl.append(fd)
    compare("GQA attention_bias masking every key of a row", m, fl, rtol=1e-4, atol=2e-5)
    # no past inputs at all (prompt only)
    m = gqa_model(6, 3, 8, past=False)
    compare("GQA no past", m, [gqa_feeds(2, 5, 6, 3, 8, [4, 3], 5), gqa_feeds(1, 1, 6, 3, 8, [0], 1)])
    # float16
    m = gqa_model(4, 2, 16, dt=np.float16, rotary=True)
    compare("GQA float16", m, [gqa_feeds(N=4, Nkv=2, H=16, dt=np.float16, rd=16, **f) for f in base], rtol=5e-3, atol=5e-3)


# ---------------------------------------------------------------- MatMulNBits

def nbits_case(M_shape, K, N, bits, bs, zp="packed", sdt=np.float32, bias=False, const=True, g_idx=False, acc=0):
    nb = (K + bs - 1) // bs
    blob = bs * bits // 8
    B = rng.integers(0, 256, (N, nb, blob), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.2, N * nb).astype(sdt)
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "scales")]
    names = ["A", "B", "scales"]
    if zp == "packed":
        zb = rng.integers(0, 256, N * ((nb * bits + 7) // 8), dtype=np.uint8)
        inits.append(numpy_helper.from_array(zb, "zp"))
        names.append("zp")
    elif zp == "float":
        inits.append(numpy_helper.from_array(rng.uniform(0, 2 ** bits - 1, N * nb).astype(sdt), "zp"))
        names.append("zp")
    if g_idx:
        names += [""] * (4 - len(names)) + ["g_idx"]
        inits.append(numpy_helper.from_array((np.arange(K) // bs).astype(np.int32), "g_idx"))
    if bias:
        names += [""] * (5 - len(names)) + ["bias"]
        inits.append(numpy_helper.from_array(rand(N, dtype=sdt), "bias"))
    ins = [helper.make_tensor_value_info("A", tt(sdt), None)]  # any rank
    if not const:  # weights fed at run time: the kernel cannot prepare them
        ins += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    node = helper.make_node("MatMulNBits", names, ["Y"], domain=MS, K=K, N=N, bits=bits, block_size=bs, accuracy_level=acc)
    m = model(node, ins, [out("Y")], inits=inits)
    feeds = []
    for ms in M_shape if isinstance(M_shape[0], tuple) else [M_shape]:
        f = {"A": rand(*ms, K, dtype=sdt)}
        if not const:
            f.update({t.name: numpy_helper.to_array(t) for t in inits})
        feeds.append(f)
    return m, feeds


def test_matmul_nbits():
    shapes = ((1,), (3,), (2, 5), (40,))
    for bits in (4, 8):
        for bs in (16, 32, 64, 128, 256):
            for K, N in [(bs * 2, 24), (bs * 3 + 5, 17), (bs // 2 + 3, 9)]:
                for zp in ("packed", "none", "float") if bits == 4 else ("packed", "none"):  # ORT: float zp 4-bit only
                    m, feeds = nbits_case(shapes, K, N, bits, bs, zp=zp, bias=(K % 2 == 1))
                    # ORT's M > 1 path dequantizes and runs its sgemm: float32 sums in another order
                    compare(f"MatMulNBits bits={bits} bs={bs} K={K} N={N} zp={zp}", m, feeds, rtol=2e-4, atol=2e-4)
    m, feeds = nbits_case(shapes, 300, 33, 4, 32, zp="packed", const=False, bias=True)
    compare("MatMulNBits weights as inputs", m, feeds, rtol=2e-4, atol=2e-4)
    # accuracy_level 4: A quantized to int8 per block, then exact integer dot products per block
    for bs in (16, 32, 64, 128, 256):
        for K, N in [(bs * 2, 24), (bs * 3 + 5, 17), (bs // 2 + 3, 9), (4096 + bs // 2, 41)]:
            for zp in ("packed", "none", "float"):
                m, feeds = nbits_case(shapes, K, N, 4, bs, zp=zp, bias=(K % 2 == 1), acc=4)
                compare(f"MatMulNBits accuracy_level 4 bs={bs} K={K} N={N} zp={zp}", m, feeds, rtol=2e-4, atol=2e-4)
    m, feeds = nbits_case(shapes, 300, 33, 4, 32, zp="packed", const=False, bias=True, acc=4)
    compare("MatMulNBits accuracy_level 4 weights as inputs", m, feeds, rtol=2e-4, atol=2e-4)
    for zp in ("none", "float"):
        m, feeds = nbits_case(shapes, 256, 48, 4, 64, zp=zp, g_idx=True)
        compare(f"MatMulNBits g_idx zp={zp}", m, feeds, rtol=2e-4, atol=2e-4)
    # g_idx with packed zero points: ORT's result does not follow the documented layout; kiln refuses it
    m, feeds = nbits_case(shapes, 256, 48, 4, 64, zp="packed", g_idx=True)
    for tag, s in kiln_sessions(m):
        try:
            s.run(feeds[0])
            check(f"MatMulNBits g_idx with packed zero points [{tag}] refused", False, "kiln ran")
        except kiln.KilnError as e:
            check(f"MatMulNBits g_idx with packed zero points [{tag}] refused", "g_idx" in str(e), str(e))
    m, feeds = nbits_case(((1,), (1, 4096)), 4096, 64, 4, 128, zp="packed")
    compare("MatMulNBits K=4096", m, feeds, rtol=5e-4, atol=5e-4)
    m, feeds = nbits_case(shapes, 200, 40, 4, 32, zp="packed", sdt=np.float16, bias=True)
    compare("MatMulNBits float16", m, feeds, rtol=1e-2, atol=1e-2)
    m, feeds = nbits_case(shapes, 96, 20, 8, 32, zp="none", sdt=np.float16)
    compare("MatMulNBits float16 8 bits", m, feeds, rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------- norms and rotary

def test_simplified_layer_norm():
    for domain in ("", MS):
        for axis, shape in [(-1, (2, 5, 16)), (-1, (3, 33)), (-1, (1, 1, 7)), (1, (2, 3, 8)), (-2, (2, 4, 6))]:
            x = rand(*shape)
            sshape = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
            sc = rand(*sshape)
            for dt, tol in ((np.float32, 1e-5), (np.float16, 3e-3)):
                node = helper.make_node("SimplifiedLayerNormalization", ["X", "scale"], ["Y", "inv_std_var"], domain=domain,
                                        axis=axis, epsilon=1e-6)
                m = model(node, [vi("X", tt(dt), len(shape)), vi("scale", tt(dt), len(sshape))], [out("Y"), out("inv_std_var")])
                try:
                    ort_session(m)
                except Exception:  # noqa: BLE001
                    check(f"ORT has SimplifiedLayerNormalization in domain '{domain}' {np.dtype(dt).name}", domain == MS)
                    continue
                compare(f"SimplifiedLayerNormalization '{domain}' axis={axis} {np.dtype(dt).name}", m,
                        [{"X": x.astype(dt), "scale": sc.astype(dt)}, {"X": rand(*shape).astype(dt) * 4, "scale": sc.astype(dt)}],
                        rtol=tol * 10, atol=tol)


def test_ms_rotary():
    for inter in (0, 1):
        for x_shape, nh, rd in [((2, 5, 64), 4, 0), ((1, 3, 96), 3, 16), ((2, 4, 7, 32), 0, 0), ((3, 1, 48), 2, 24)]:
            dt = np.float32
            H = (x_shape[2] // nh) if len(x_shape) == 3 else x_shape[3]
            r = rd or H
            attrs = dict(interleaved=inter)
            if nh:
                attrs["num_heads"] = nh
            if rd:
                attrs["rotary_embedding_dim"] = rd
            node = helper.make_node("RotaryEmbedding", ["input", "position_ids", "cos_cache", "sin_cache"], ["Y"], domain=MS, **attrs)
            B, S = x_shape[0], (x_shape[1] if len(x_shape) == 3 else x_shape[2])
            m = model(node, [vi("input", tt(dt), len(x_shape)), vi("position_ids", TensorProto.INT64, 2),
                             vi("cos_cache", tt(dt), 2), vi("sin_cache", tt(dt), 2)], [out("Y")])
            ang = rng.uniform(0, 6.28, (32, r // 2))
            base = {"input": rand(*x_shape), "cos_cache": np.cos(ang).astype(dt), "sin_cache": np.sin(ang).astype(dt)}
            feeds = [dict(base, position_ids=rng.integers(0, 32, (B, S)).astype(np.int64)),
                     dict(base, position_ids=np.array([[3]], np.int64).reshape(1, 1) if B * S == 1 else
                          np.tile(np.arange(S, dtype=np.int64) + 2, (B, 1)))]
            compare(f"RotaryEmbedding(ms) {x_shape} num_heads={nh} rd={rd} interleaved={inter}", m, feeds)


# ---------------------------------------------------------------- the ONNX forms

def compare_onnx(name, m, feeds_list, rtol=1e-4, atol=1e-5):
    """Against ORT when it runs the op, else against onnx's ReferenceEvaluator."""
    try:
        ort_session(m)
        return compare(name, m, feeds_list, rtol, atol)
    except Exception:  # noqa: BLE001
        pass
    from onnx.reference import ReferenceEvaluator
    ev = ReferenceEvaluator(m)
    sessions = kiln_sessions(m)
    for feeds in feeds_list:
        want = ev.run(None, feeds)
        for tag, s in sessions:
            shapes = " ".join(f"{k}={v.shape}" for k, v in feeds.items())
            try:
                got = s.run(feeds)
            except kiln.KilnError as e:
                check(f"{name} (onnx reference) [{tag}] {shapes}", False, f"kiln failed: {e}")
                continue
            close(f"{name} (onnx reference) [{tag}] {shapes}", got, want, rtol, atol)


def test_onnx_forms():
    # RMSNormalization 23
    for axis, shape in [(-1, (2, 5, 16)), (1, (2, 3, 8)), (-1, (3, 33))]:
        sshape = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
        node = helper.make_node("RMSNormalization", ["X", "scale"], ["Y"], axis=axis, epsilon=1e-6)
        m = model(node, [vi("X", TensorProto.FLOAT, len(shape)), vi("scale", TensorProto.FLOAT, len(sshape))], [out("Y")],
                  opsets=(("", 23),))
        compare_onnx(f"RMSNormalization-23 axis={axis}", m, [{"X": rand(*shape), "scale": rand(*sshape)}])
    # RotaryEmbedding 23: 4-D [B, N, S, H] and 3-D with num_heads, position_ids, partial rotary
    for inter in (0, 1):
        for shape, attrs in [((2, 3, 5, 16), {}), ((2, 5, 48), {"num_heads": 3}), ((1, 2, 4, 32), {"rotary_embedding_dim": 16})]:
            H = shape[3] if len(shape) == 4 else shape[2] // attrs["num_heads"]
            rd = attrs.get("rotary_embedding_dim", H)
            B, S = shape[0], shape[2] if len(shape) == 4 else shape[1]
            node = helper.make_node("RotaryEmbedding", ["X", "cos_cache", "sin_cache", "position_ids"], ["Y"],
                                    interleaved=inter, **attrs)
            m = model(node, [vi("X", TensorProto.FLOAT, len(shape)), vi("cos_cache", TensorProto.FLOAT, 2),
                             vi("sin_cache", TensorProto.FLOAT, 2), vi("position_ids", TensorProto.INT64, 2)], [out("Y")],
                      opsets=(("", 23),))
            ang = rng.uniform(0, 6.28, (20, rd // 2))
            compare_onnx(f"RotaryEmbedding-23 {shape} {attrs} interleaved={inter}", m,
                         [{"X": rand(*shape), "cos_cache": np.cos(ang).astype(np.float32),
                           "sin_cache": np.sin(ang).astype(np.float32),
                           "position_ids": rng.integers(0, 20, (B, S)).astype(np.int64)}])
    # Attention 23 and 24: GQA heads, past, causal, nonpad_kv_seqlen (24)
    for opset in (23, 24):
        for causal in (0, 1):
            node = helper.make_node("Attention", ["Q", "K", "V", "", "past_key", "past_value"],
                                    ["Y", "present_key", "present_value"], is_causal=causal)
            ins = [vi(n, TensorProto.FLOAT, 4) for n in ("Q", "K", "V", "past_key", "past_value")]
            m = model(node, ins, [out("Y"), out("present_key"), out("present_value")], opsets=(("", opset),))
            feeds = []
            for B, Hq, Hkv, S, P, D in [(2, 6, 2, 3, 4, 8), (1, 3, 3, 1, 6, 16)]:
                feeds.append({"Q": rand(B, Hq, S, D), "K": rand(B, Hkv, S, D), "V": rand(B, Hkv, S, D),
                              "past_key": rand(B, Hkv, P, D), "past_value": rand(B, Hkv, P, D)})
            compare_onnx(f"Attention-{opset} causal={causal} past", m, feeds)
    # 24: K and V are the whole (max_length) cache, nonpad_kv_seqlen the valid keys per batch row
    for causal in (0, 1):
        node = helper.make_node("Attention", ["Q", "K", "V", "", "", "", "nonpad_kv_seqlen"], ["Y"], is_causal=causal)
        m = model(node, [vi(n, TensorProto.FLOAT, 4) for n in ("Q", "K", "V")] + [vi("nonpad_kv_seqlen", TensorProto.INT64, 1)],
                  [out("Y")], opsets=(("", 24),))
        feeds = [{"Q": rand(B, Hq, S, D), "K": rand(B, Hkv, T, D), "V": rand(B, Hkv, T, D),
                  "nonpad_kv_seqlen": rng.integers(S, T + 1, B).astype(np.int64)}
                 for B, Hq, Hkv, S, T, D in [(2, 6, 2, 1, 9, 8), (3, 4, 4, 2, 7, 16)]]
        compare_onnx(f"Attention-24 nonpad_kv_seqlen causal={causal}", m, feeds)
    # TensorScatter 24: a KV-cache update at write_indices, linear and circular
    for mode in ("linear", "circular"):
        node = helper.make_node("TensorScatter", ["past_cache", "update", "write_indices"], ["present_cache"], mode=mode, axis=2)
        m = model(node, [vi("past_cache", TensorProto.FLOAT, 4), vi("update", TensorProto.FLOAT, 4),
                         vi("write_indices", TensorProto.INT64, 1)], [out("present_cache")], opsets=(("", 24),))
        idx = np.array([1, 5], np.int64) if mode == "linear" else np.array([6, 7], np.int64)
        compare_onnx(f"TensorScatter-24 mode={mode}", m,
                     [{"past_cache": rand(2, 3, 8, 4), "update": rand(2, 3, 2, 4), "write_indices": idx}])


def main():
    test_gqa()
    test_onnx_forms()
    test_matmul_nbits()
    test_simplified_layer_norm()
    test_ms_rotary()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
