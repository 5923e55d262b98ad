#!/usr/bin/env python3
"""int8 operators against ONNX Runtime (CPU): MatMulInteger, QLinearMatMul, DynamicQuantizeLinear,
DequantizeLinear and com.microsoft MatMulIntegerToFloat / DynamicQuantizeMatMul, each one node, on
random data over odd shapes (M, K, N in 1, 3, 17, 63, 130, ...), batches, u8/s8 combinations,
per-tensor and per-column zero points, weights constant (packed at compile time) or fed. Integer
outputs must equal ORT's bit for bit; float outputs within float32 rounding of the epilogue. Each
model also runs in kiln's reference (unoptimized) session, which must agree the same way.

ORT is the exact one of tests/common/ort_int8.py: as it is where its uint8 x int8 products are exact
(VNNI), computing them as uint8 x uint8 where they saturate (AVX2 without VNNI); the first line
printed says which.

usage: test_int8.py   (libkiln.so from build/ or $KILN_LIB)
"""
import json
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
import ort_int8  # noqa: E402

rng = np.random.default_rng(8)
SIZES = [1, 3, 17, 63, 130]
TP = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8, np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32}


def model(nodes, inputs, outputs, inits=(), ms=False, opset=17):
    g = helper.make_graph(nodes if isinstance(nodes, list) else [nodes], "int8", inputs, outputs, list(inits))
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8
    return m.SerializeToString()


def vi(name, dt, dims):
    return helper.make_tensor_value_info(name, TP[dt], dims)


def q8(dt, *shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, size=shape, dtype=np.int64).astype(dt)


def ort_session(blob):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort_int8.expected_session(blob, so)


def compare(name, blob, feeds_list, exact=True, rtol=1e-5):
    ref_blob, ref_feeds = ort_int8.exact_form(blob, feeds_list)
    try:
        ref = ort_session(ref_blob)
    except Exception as e:  # an ORT build without this combination: nothing to compare with
        print(f"skip {name}: ONNX Runtime refuses it ({str(e).splitlines()[0][:120]})")
        return
    fast, slow = kiln.Session(blob, num_threads=2), kiln.Session(blob, unoptimized=True)
    for feeds, ref_f in zip(feeds_list, ref_feeds):
        shapes = " ".join(f"{k}={v.shape}" for k, v in feeds.items())
        want = ref.run(None, ref_f)
        for label, sess in (("kiln", fast), ("kiln-reference", slow)):
            try:
                got = sess.run(feeds)
            except kiln.KilnError as e:
                check(f"{name} {label} {shapes}", False, f"failed: {e}")
                continue
            for i, (g, w) in enumerate(zip(got, want)):
                g = np.asarray(g)
                if g.shape != w.shape or g.dtype != w.dtype:
                    check(f"{name} {label} {shapes} out{i}", False, f"{g.shape} {g.dtype} vs {w.shape} {w.dtype}")
                    continue
                if exact or not np.issubdtype(w.dtype, np.floating):
                    ok = np.array_equal(g, w)
                    detail = "" if ok else f"{int(np.sum(g != w))} of {w.size} differ"
                else:
                    tol = rtol * (np.max(np.abs(w)) if w.size else 0) + 1e-30
                    ok = np.allclose(g, w, rtol=rtol, atol=tol)
                    detail = "" if ok else f"max diff {np.max(np.abs(g.astype(np.float64) - w)) if w.size else 0}"
                check(f"{name} {label} {shapes} out{i}", ok, detail)


def a_shapes(K):
    """A's shapes for one K: rank 2 and 3 (batch > 1), odd M."""
    out = []
    for m in SIZES:
        out.append([m, K])
    out.append([2, 17, K])
    out.append([3, 1, K])
    return out


def zp_of(dt, per_col, N):
    return q8(dt, N) if per_col else q8(dt)


def test_matmul_integer():
    combos = [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8), (np.int8, np.uint8)]
    for adt, bdt in combos:
        for K, N in [(1, 3), (17, 63), (63, 17), (130, 130), (64, 768)]:
            for per_col in (False, True):
                for const_b in (True, False):
                    B = q8(bdt, K, N)
                    bzp = zp_of(bdt, per_col, N)
                    inits = [numpy_helper.from_array(bzp, "bzp")]
                    inputs = [helper.make_tensor_value_info("A", TP[adt], None), vi("azp", adt, [])]
                    if const_b:
                        inits.append(numpy_helper.from_array(B, "B"))
                    else:
                        inputs.append(vi("B", bdt, [K, N]))
                    blob = model(helper.make_node("MatMulInteger", ["A", "B", "azp", "bzp"], ["Y"]), inputs,
                                 [vi("Y", np.int32, None)], inits)
                    feeds = []
                    for s in a_shapes(K):
                        f = {"A": q8(adt, *s), "azp": q8(adt)}
                        if not const_b:
                            f["B"] = B
                        feeds.append(f)
                    compare(f"MatMulInteger {adt.__name__}x{bdt.__name__} K={K} N={N} "
                            f"{'per-column' if per_col else 'per-tensor'} {'const' if const_b else 'fed'} B",
                            blob, feeds)
    # no zero points at all
    B = q8(np.int8, 33, 65)
    blob = model(helper.make_node("MatMulInteger", ["A", "B"], ["Y"]), [helper.make_tensor_value_info("A", TP[np.uint8], None)],
                 [vi("Y", np.int32, None)], [numpy_helper.from_array(B, "B")])
    compare("MatMulInteger no zero points", blob, [{"A": q8(np.uint8, m, 33)} for m in SIZES])


def test_dynamic_quantize_linear():
    blob = model(helper.make_node("DynamicQuantizeLinear", ["X"], ["Y", "S", "Z"]),
                 [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                 [vi("Y", np.uint8, None), vi("S", np.float32, []), vi("Z", np.uint8, [])])
    feeds = []
    for shape in [[1], [3], [17], [63, 5], [130, 17], [2, 3, 257], [1, 128, 384]]:
        x = (rng.standard_normal(shape) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32)
        feeds.append({"X": x})
        feeds.append({"X": np.abs(x) + np.float32(0.5)})  # all positive: zero point 0
        feeds.append({"X": -np.abs(x) - np.float32(0.5)})  # all negative: zero point 255
    compare("DynamicQuantizeLinear", blob, feeds)


def test_dequantize_linear():
    for dt in (np.uint8, np.int8):
        blob = model(helper.make_node("DequantizeLinear", ["X", "s", "z"], ["Y"]),
                     [helper.make_tensor_value_info("X", TP[dt], None)], [vi("Y", np.float32, None)],
                     [numpy_helper.from_array(np.array(0.037, np.float32), "s"), numpy_helper.from_array(q8(dt), "z")])
        compare(f"DequantizeLinear {dt.__name__}", blob, [{"X": q8(dt, *s)} for s in ([1], [17, 3], [2, 130, 63])])


def test_qlinear_matmul():
    for adt, bdt in [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)]:
        for K, N in [(3, 17), (63, 130), (130, 63), (256, 64)]:
            for per_col in (False, True):
                ydt = adt
                B = q8(bdt, K, N)
                bs = (rng.uniform(0.001, 0.02, N) if per_col else rng.uniform(0.001, 0.02, [])).astype(np.float32)
                inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(bs, "bs"),
                         numpy_helper.from_array(zp_of(bdt, per_col, N), "bzp"),
                         numpy_helper.from_array(np.array(0.021, np.float32), "as"),
                         numpy_helper.from_array(q8(adt), "azp"),
                         numpy_helper.from_array(np.array(rng.uniform(0.05, 0.3) * np.sqrt(K), np.float32), "ys"),
                         numpy_helper.from_array(q8(ydt), "yzp")]
                blob = model(helper.make_node("QLinearMatMul", ["A", "as", "azp", "B", "bs", "bzp", "ys", "yzp"], ["Y"]),
                             [helper.make_tensor_value_info("A", TP[adt], None)], [vi("Y", ydt, None)], inits)
                compare(f"QLinearMatMul {adt.__name__}x{bdt.__name__} K={K} N={N} {'per-column' if per_col else 'per-tensor'}",
                        blob, [{"A": q8(adt, *s)} for s in a_shapes(K)])


def test_matmul_integer_to_float():
    for adt, bdt in [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)]:
        for K, N in [(1, 17), (17, 3), (63, 130), (384, 64)]:
            for per_col in (False, True):
                for bias in (False, True):
                    bs = (rng.uniform(0.001, 0.02, N) if per_col else rng.uniform(0.001, 0.02, [])).astype(np.float32)
                    inits = [numpy_helper.from_array(q8(bdt, K, N), "B"), numpy_helper.from_array(bs, "bs"),
                             numpy_helper.from_array(zp_of(bdt, per_col, N), "bzp")]
                    ins = ["A", "B", "as", "bs", "azp", "bzp"]
                    if bias:
                        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias"))
                        ins.append("bias")
                    blob = model(helper.make_node("MatMulIntegerToFloat", ins, ["Y"], domain="com.microsoft"),
                                 [helper.make_tensor_value_info("A", TP[adt], None), vi("as", np.float32, []),
                                  vi("azp", adt, [])], [vi("Y", np.float32, None)], inits, ms=True)
                    feeds = [{"A": q8(adt, *s), "as": np.array(rng.uniform(0.01, 0.1), np.float32), "azp": q8(adt)}
                             for s in a_shapes(K)]
                    compare(f"MatMulIntegerToFloat {adt.__name__}x{bdt.__name__} K={K} N={N} "
                            f"{'per-column' if per_col else 'per-tensor'}{' bias' if bias else ''}", blob, feeds,
                            exact=False)


def test_dynamic_quantize_matmul():
    for bdt in (np.int8, np.uint8):
        for K, N in [(1, 3), (17, 63), (130, 17), (384, 384)]:
            for per_col in (False, True):
                for bias in (False, True):
                    bs = (rng.uniform(0.001, 0.02, N) if per_col else rng.uniform(0.001, 0.02, [])).astype(np.float32)
                    inits = [numpy_helper.from_array(q8(bdt, K, N), "B"), numpy_helper.from_array(bs, "bs"),
                             numpy_helper.from_array(zp_of(bdt, per_col, N), "bzp")]
                    ins = ["A", "B", "bs", "bzp"]
                    if bias:
                        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias"))
                        ins.append("bias")
                    blob = model(helper.make_node("DynamicQuantizeMatMul", ins, ["Y"], domain="com.microsoft"),
                                 [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)],
                                 [vi("Y", np.float32, None)], inits, ms=True)
                    feeds = [{"A": rng.standard_normal(s).astype(np.float32)} for s in a_shapes(K)]
                    compare(f"DynamicQuantizeMatMul {bdt.__name__} K={K} N={N} "
                            f"{'per-column' if per_col else 'per-tensor'}{' bias' if bias else ''}", blob, feeds,
                            exact=False)


def test_dynamic_quantize_lstm():
    """com.microsoft DynamicQuantizeLSTM (quantize_dynamic's LSTM; text2tashkeel ships it): W
    [dirs, I, 4H] and R [dirs, H, 4H] 8-bit, scales per direction or per column. kiln quantizes X
    and the state to uint8 on the fly as ORT does, so at batch 1 it must equal ORT's kernel (int8
    weights, the only ones ORT takes) within float32 rounding of the gates (atol 1e-4), at batch 3
    within twice ORT's own quantization error (ORT splits the state's quantization); with uint8 weights
    it must stay within activation quantization (0.15) of ONNX's LSTM on the dequantized weights."""
    for wdt in (np.int8, np.uint8):
        for direction, D in (("forward", 1), ("bidirectional", 2), ("reverse", 1)):
            for per_col, Bn in ((False, 1), (True, 1), (False, 3), (True, 3)):
                S, I, H = 7, 17, 12
                shp = [D, 4 * H] if per_col else [D]
                ws, rs = (rng.uniform(0.002, 0.02, shp).astype(np.float32) for _ in range(2))
                # ORT takes int8 weights symmetric only (zero points 0); uint8 ones with any zero point
                wz, rz = (q8(wdt, *shp) if wdt == np.uint8 else np.zeros(shp, wdt) for _ in range(2))
                W, R = q8(wdt, D, I, 4 * H), q8(wdt, D, H, 4 * H)
                Bias = (rng.standard_normal((D, 8 * H)) * 0.1).astype(np.float32)
                names = ["X", "W", "R", "B", "", "h0", "c0", "", "ws", "wz", "rs", "rz"]
                inits = [numpy_helper.from_array(a, k) for a, k in
                         ((W, "W"), (R, "R"), (Bias, "B"), (ws, "ws"), (wz, "wz"), (rs, "rs"), (rz, "rz"))]
                ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in ("X", "h0", "c0")]
                outs = [vi(k, np.float32, None) for k in ("Y", "Yh", "Yc")]
                blob = model(helper.make_node("DynamicQuantizeLSTM", names, ["Y", "Yh", "Yc"], domain="com.microsoft",
                                              hidden_size=H, direction=direction), ins, outs, inits, ms=True)

                def deq(q, s, z):  # [D, K, 4H] -> ONNX's [D, 4H, K]
                    s, z = s.reshape(D, 1, -1), z.astype(np.float32).reshape(D, 1, -1)
                    return np.ascontiguousarray(((q.astype(np.float32) - z) * s).transpose(0, 2, 1))
                ref = model(helper.make_node("LSTM", ["X", "W", "R", "B", "", "h0", "c0"], ["Y", "Yh", "Yc"],
                                             hidden_size=H, direction=direction), ins, outs,
                            [numpy_helper.from_array(deq(W, ws, wz), "W"), numpy_helper.from_array(deq(R, rs, rz), "R"),
                             numpy_helper.from_array(Bias, "B")])
                feeds = {"X": rng.standard_normal((S, Bn, I)).astype(np.float32),
                         "h0": (rng.standard_normal((D, Bn, H)) * 0.5).astype(np.float32),
                         "c0": (rng.standard_normal((D, Bn, H)) * 0.5).astype(np.float32)}
                name = f"DynamicQuantizeLSTM {wdt.__name__} {direction} {'per-column' if per_col else 'per-direction'} batch {Bn}"
                # ORT's kernel takes int8 weights only (quantize_dynamic's LSTM form); uint8 ones
                # are checked against the float LSTM alone
                want_f = ort_session(ref).run(None, feeds)
                want_q = ort_session(blob).run(None, feeds) if wdt == np.int8 else [None] * 3
                for label, sess in (("kiln", kiln.Session(blob, num_threads=2)),
                                    ("kiln-reference", kiln.Session(blob, unoptimized=True))):
                    got = sess.run(feeds)
                    for i, (g, wf, wq) in enumerate(zip(got, want_f, want_q)):
                        g = np.asarray(g)
                        if g.shape != wf.shape:
                            check(f"{name} {label} out{i}", False, f"shape {g.shape} vs {wf.shape}")
                            continue
                        err_f = float(np.max(np.abs(g - wf)))
                        if wq is not None:  # ORT's own kernel: the same quantization, float32 gates
                            err, own = float(np.max(np.abs(g - wq))), float(np.max(np.abs(wf - wq)))
                            tol = 1e-4 if Bn == 1 else 2 * own  # batch > 1: ORT quantizes the state its own way
                            check(f"{name} {label} out{i} == ORT's (atol {tol:.3g})", err <= tol,
                                  f"max diff {err} (ORT's quantized vs float LSTM: {own})")
                        else:  # within activation quantization of the float LSTM
                            check(f"{name} {label} out{i} ~ LSTM(dequantized W, R) (0.15)", err_f <= 0.15,
                                  f"max diff {err_f}")


def kiln_ops(blob):
    """kiln's operator counts after the CPU passes (`kiln info --json`), or None without the tool."""
    tool = os.path.join(os.path.dirname(os.environ.get("KILN_LIB", "")), "kiln")
    if not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
        f.write(blob)
        f.flush()
        out = subprocess.run([tool, "info", f.name, "--json"], capture_output=True, text=True)
    return json.loads(out.stdout)["operators"] if out.returncode == 0 else None


def exact_vs_reference(name, blob, feeds_list):
    """The optimised session (passes, fast kernels) against the reference one, bit for bit."""
    fast, slow = kiln.Session(blob, num_threads=2), kiln.Session(blob, unoptimized=True)
    for feeds in feeds_list:
        shapes = " ".join(f"{k}={v.shape}" for k, v in feeds.items())
        for i, (g, w) in enumerate(zip(fast.run(feeds), slow.run(feeds))):
            g, w = np.asarray(g), np.asarray(w)
            ok = g.shape == w.shape and np.array_equal(g, w)
            check(f"{name} fused == unfused {shapes} out{i}", ok,
                  "" if ok else f"max diff {np.max(np.abs(g.astype(np.float64) - w)) if g.shape == w.shape else g.shape}")


def dynamic_chain(K, Ns, wdt, per_col, bias, swap, x_dims, tap_cast=False):
    """quantize_dynamic's pattern written by hand: DynamicQuantizeLinear(X) shared by one
    MatMulInteger -> Cast -> Mul(., Mul(x_scale, w_scale)) [-> Add(bias)] chain per N in Ns;
    `swap` flips every commutative operand order; `tap_cast` also makes the first Cast's output
    a graph output (the chain must then stay unfused)."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["X"], ["xq", "xs", "xz"])]
    inits, outs = [], []
    for t, N in enumerate(Ns):
        ws = (rng.uniform(0.001, 0.02, N) if per_col else rng.uniform(0.001, 0.02, [])).astype(np.float32)
        inits += [numpy_helper.from_array(q8(wdt, K, N), f"W{t}"), numpy_helper.from_array(ws, f"ws{t}"),
                  numpy_helper.from_array(zp_of(wdt, per_col, N), f"wz{t}")]
        pair = lambda a, b: [b, a] if swap else [a, b]  # noqa: E731
        nodes += [helper.make_node("Mul", pair("xs", f"ws{t}"), [f"s{t}"]),
                  helper.make_node("MatMulInteger", ["xq", f"W{t}", "xz", f"wz{t}"], [f"acc{t}"]),
                  helper.make_node("Cast", [f"acc{t}"], [f"accf{t}"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", pair(f"accf{t}", f"s{t}"), [f"m{t}" if bias else f"Y{t}"])]
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), f"b{t}"))
            nodes.append(helper.make_node("Add", pair(f"m{t}", f"b{t}"), [f"Y{t}"]))
        outs.append(vi(f"Y{t}", np.float32, None))
    if tap_cast:
        outs.append(vi("accf0", np.float32, None))
    return model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_dims)], outs, inits)


def test_quant_matmul_fusion():
    """kiln_pass_fuse_quant_matmul: the fused MatMulIntegerToFloat equals the unfused chain bit for
    bit (same float32 operations in the same order) and ORT within float32 rounding (rtol 1e-5 of
    the output's largest magnitude: ORT's own fusion may round the scale product differently)."""
    case = 0
    for wdt in (np.int8, np.uint8):
        for K, Ns in [(17, [3]), (63, [130, 17]), (384, [384, 384, 1536])]:
            for per_col in (False, True):
                for bias in (False, True):
                    case += 1
                    swap = case % 2 == 0
                    rank3 = case % 3 == 0
                    blob = dynamic_chain(K, Ns, wdt, per_col, bias, swap, ["b", "s", K] if rank3 else ["m", K])
                    name = (f"fused DQL->MatMulInteger {wdt.__name__} K={K} N={Ns} "
                            f"{'per-column' if per_col else 'per-tensor'}{' bias' if bias else ''}{' swapped' if swap else ''}")
                    ops = kiln_ops(blob)
                    if ops is not None:
                        check(f"{name} fuses", ops.get("com.microsoft.MatMulIntegerToFloat") == len(Ns) and
                              "MatMulInteger" not in ops and "Cast" not in ops, str(ops))
                    shapes = ([2, 17, K], [1, 1, K], [3, 43, K]) if rank3 else ([1, K], [5, K], [130, K])
                    feeds = [{"X": (rng.standard_normal(s) * rng.choice([0.1, 1.0, 20.0])).astype(np.float32)}
                             for s in shapes]
                    exact_vs_reference(name, blob, feeds)
                    compare(name, blob, feeds, exact=False)
    # an intermediate read elsewhere: nothing fuses, the outputs are still right
    blob = dynamic_chain(33, [65], np.int8, True, True, False, ["m", 33], tap_cast=True)
    ops = kiln_ops(blob)
    if ops is not None:
        check("tapped Cast stays unfused", "com.microsoft.MatMulIntegerToFloat" not in ops, str(ops))
    feeds = [{"X": rng.standard_normal([7, 33]).astype(np.float32)}]
    exact_vs_reference("tapped Cast", blob, feeds)
    compare("tapped Cast", blob, feeds, exact=False)


def test_quantize_dynamic_encoder():
    """The repo's encoder (tests/models/make_models.py) through quantize_dynamic (QInt8, QUInt8):
    every MatMul fused, and kiln's difference from ORT's quantized model no larger than ORT's own
    quantization error (quantized against float), in max and in rms, per output."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_models  # noqa: E402
    from onnxruntime.quantization import QuantType, quantize_dynamic
    with tempfile.TemporaryDirectory() as d:
        fp = os.path.join(d, "encoder.onnx")
        make_models.save(make_models.encoder(), fp)
        for wt in (QuantType.QInt8, QuantType.QUInt8):
            qp = os.path.join(d, f"encoder_{wt.name}.onnx")
            quantize_dynamic(fp, qp, weight_type=wt)
            blob = open(qp, "rb").read()
            ops = kiln_ops(blob)
            if ops is not None:
                check(f"encoder {wt.name} fuses every MatMulInteger", "MatMulInteger" not in ops and
                      ops.get("com.microsoft.MatMulIntegerToFloat", 0) >= 12, str(ops))
            fsess, qsess = ort_session(open(fp, "rb").read()), ort_session(blob)
            ks = kiln.Session(blob, num_threads=2)
            for b, s in [(1, 5), (2, 37), (3, 128)]:
                feeds = {"tokens": rng.integers(0, 100, size=(b, s)).astype(np.int64)}
                fl, qo = fsess.run(None, feeds), qsess.run(None, feeds)
                for i, (g, w, f) in enumerate(zip(ks.run(feeds), qo, fl)):
                    g = np.asarray(g, np.float64)
                    dk, dq = np.abs(g - w), np.abs(w.astype(np.float64) - f)
                    ok = g.shape == w.shape and dk.max() <= dq.max() and np.sqrt((dk ** 2).mean()) <= np.sqrt((dq ** 2).mean())
                    check(f"encoder {wt.name} [{b}, {s}] out{i} within ORT's quantization error", ok,
                          f"kiln-ORT max {dk.max():.3g} rms {np.sqrt((dk ** 2).mean()):.3g}, "
                          f"ORT int8-float max {dq.max():.3g} rms {np.sqrt((dq ** 2).mean()):.3g}")


# (N, C, H, W | None for 1-D, M, kh, kw, group, attrs): odd sizes, strides, pads, dilations,
# groups, depthwise (group == C, with and without a channel multiplier), pointwise, 1-D
CONV_CASES = [
    (1, 3, 17, 13, 8, 3, 3, 1, dict(pads=[1, 1, 1, 1])),
    (2, 5, 9, 11, 7, 3, 2, 1, dict(strides=[2, 1], pads=[0, 1, 2, 0])),
    (1, 16, 15, 15, 33, 1, 1, 1, {}),
    (2, 8, 7, 9, 12, 1, 1, 1, dict(strides=[2, 2])),
    (1, 6, 13, 12, 9, 3, 3, 3, dict(dilations=[2, 3], pads=[2, 2, 1, 3])),
    (1, 8, 10, 10, 8, 3, 3, 2, dict(auto_pad="SAME_UPPER")),
    (2, 12, 11, 8, 12, 3, 3, 12, dict(pads=[1, 1, 1, 1])),
    (1, 32, 14, 14, 32, 3, 3, 32, dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    (1, 5, 9, 9, 10, 5, 5, 5, dict(pads=[2, 2, 2, 2], dilations=[1, 2])),
    (1, 64, 5, 7, 70, 3, 3, 1, dict(pads=[1, 0, 1, 0])),
    (3, 7, None, 29, 11, 1, 5, 1, dict(strides=[3], pads=[2, 1])),
    (1, 4, None, 31, 4, 1, 3, 4, dict(pads=[1, 1], dilations=[2])),
    # output channels as rows: whole shifted planes (dilated, as wide as the input), GEMM chunks
    # that start inside an image, and few pixels against many channels (pixels as rows)
    (2, 6, 9, 10, 40, 3, 3, 1, dict(pads=[2, 2, 2, 2], dilations=[2, 2])),
    (1, 64, 45, 45, 16, 3, 3, 1, dict(pads=[1, 1, 1, 1])),
    (1, 16, 3, 3, 40, 3, 3, 1, dict(pads=[1, 1, 1, 1])),
]


def conv_shapes(case):
    N, C, H, W, M, kh, kw, group, attrs = case
    x = [N, C, W] if H is None else [N, C, H, W]
    w = [M, C // group, kw] if H is None else [M, C // group, kh, kw]
    return x, w, attrs | dict(group=group)


def conv_label(case, *extra):
    N, C, H, W, M, kh, kw, group, attrs = case
    sp = f"{W}" if H is None else f"{H}x{W}"
    return " ".join([f"N={N} C={C} {sp} M={M} k={kh}x{kw} g={group} {attrs}"] + list(extra))


def test_conv_integer():
    for adt, wdt in [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]:
        for ci, case in enumerate(CONV_CASES):
            xs, ws, attrs = conv_shapes(case)
            per_ch = ci % 2 == 1
            wzp = zp_of(wdt, per_ch, ws[0])
            inits = [numpy_helper.from_array(q8(wdt, *ws), "W"), numpy_helper.from_array(wzp, "wzp")]
            blob = model(helper.make_node("ConvInteger", ["X", "W", "xzp", "wzp"], ["Y"], **attrs),
                         [vi("X", adt, xs), vi("xzp", adt, [])], [vi("Y", np.int32, None)], inits, opset=10)
            feeds = [{"X": q8(adt, *xs), "xzp": q8(adt)} for _ in range(2)]
            name = f"ConvInteger {adt.__name__}x{wdt.__name__} {'per-channel' if per_ch else 'per-tensor'} " + conv_label(case)
            if per_ch:  # ORT's ConvInteger takes a scalar w_zero_point only: the reference kernel is the oracle
                exact_vs_reference(name, blob, feeds)
            else:
                compare(name, blob, feeds)


def test_qlinear_conv():
    for adt, wdt in [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)]:
        for ci, case in enumerate(CONV_CASES):
            for per_ch in (False, True):
                xs, ws, attrs = conv_shapes(case)
                M, K = ws[0], int(np.prod(ws[1:]))
                bias = (ci + per_ch) % 3 != 0
                wsc = (rng.uniform(0.002, 0.02, M) if per_ch else rng.uniform(0.002, 0.02, [])).astype(np.float32)
                # ORT requires symmetric (zero) weight zero points for int8 weights per channel
                wzp = np.zeros(M if per_ch else [], wdt) if wdt == np.int8 else zp_of(wdt, per_ch, M)
                inits = [numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
                         numpy_helper.from_array(q8(adt), "xzp"),
                         numpy_helper.from_array(q8(wdt, *ws), "W"), numpy_helper.from_array(wsc, "ws"),
                         numpy_helper.from_array(wzp, "wzp"),
                         numpy_helper.from_array(np.array(rng.uniform(0.2, 0.6) * np.sqrt(K) * 0.05, np.float32), "ys"),
                         numpy_helper.from_array(q8(adt), "yzp")]
                ins = ["X", "xs", "xzp", "W", "ws", "wzp", "ys", "yzp"]
                if bias:
                    inits.append(numpy_helper.from_array(rng.integers(-5000, 5000, M).astype(np.int32), "B"))
                    ins.append("B")
                blob = model(helper.make_node("QLinearConv", ins, ["Y"], **attrs), [vi("X", adt, xs)],
                             [vi("Y", adt, None)], inits, opset=10)
                feeds = [{"X": q8(adt, *xs)} for _ in range(2)]
                compare(f"QLinearConv {adt.__name__}x{wdt.__name__} {'per-channel' if per_ch else 'per-tensor'}"
                        f"{' bias' if bias else ''} " + conv_label(case), blob, feeds)


def qdq_convnet():
    """A small conv net (strided, depthwise, pointwise, BatchNormalization, residual Add, MaxPool,
    GlobalAveragePool, Gemm) with random weights; input x [N, 3, H, W] float32."""
    nodes, inits = [], []

    def w(name, shape, s=None):
        fan = int(np.prod(shape[1:]))
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * (s or np.sqrt(2.0 / fan))).astype(np.float32), name))
        return name

    def conv(x, cin, cout, k, s=1, g=1, relu=True, name=""):
        y = name + "_c"
        nodes.append(helper.make_node("Conv", [x, w(name + "_w", [cout, cin // g, k, k]), w(name + "_b", [cout], 0.1)], [y],
                                      kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4, group=g))
        if not relu:
            return y
        nodes.append(helper.make_node("Relu", [y], [name + "_r"]))
        return name + "_r"

    x = conv("x", 3, 16, 3, 2, name="c1")
    x = conv(x, 16, 24, 3, 1, name="c2")
    nodes.append(helper.make_node("MaxPool", [x], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    d = conv("p1", 24, 24, 3, 1, g=24, name="dw")
    p = conv(d, 24, 24, 1, 1, relu=False, name="pw")
    inits += [numpy_helper.from_array(v.astype(np.float32), n) for n, v in
              [("bn_s", rng.uniform(0.5, 1.5, 24)), ("bn_b", rng.normal(0, 0.1, 24)), ("bn_m", rng.normal(0, 0.1, 24)),
               ("bn_v", rng.uniform(0.5, 1.5, 24))]]
    nodes.append(helper.make_node("BatchNormalization", [p, "bn_s", "bn_b", "bn_m", "bn_v"], ["pbn"]))
    nodes.append(helper.make_node("Add", ["p1", "pbn"], ["res"]))
    x = conv("res", 24, 40, 3, 2, name="c3")
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    nodes.append(helper.make_node("Gemm", ["flat", w("fc_w", [10, 40]), w("fc_b", [10], 0.1)], ["logits"], transB=1))
    g = helper.make_graph(nodes, "qdq_convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def qdq_mlp():
    """MatMuls with data movement between them: x [B, S, 32] -> MatMul -> Reshape -> Transpose ->
    MatMul -> y."""
    inits = [numpy_helper.from_array((rng.standard_normal([32, 48]) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array(np.array([0, 0, 4, 12], np.int64), "shp"),
             numpy_helper.from_array((rng.standard_normal([12, 20]) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Reshape", ["h", "shp"], ["h4"]),
             helper.make_node("Transpose", ["h4"], ["ht"], perm=[0, 2, 1, 3]), helper.make_node("MatMul", ["ht", "w2"], ["y"])]
    g = helper.make_graph(nodes, "qdq_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4, "S", 20])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_qdq_static():
    """quantize_static in QDQ format (calibration on random data, seeded), per tensor and per channel:
    kiln's QDQ pass must leave int8 kernels (no float Conv / MatMul, no DQ->Q around MaxPool,
    Reshape, Transpose, Flatten) and match ORT at ORT_ENABLE_ALL (its QDQ transformer). Outputs
    are dequantized int8 values: equal to ORT's except where the float ops kiln keeps (Add,
    GlobalAveragePool, Gemm; ORT's QLinearAdd / QLinearGlobalAveragePool / QGemm) round a value
    across a quantization step: at most one step, at most 1% of the elements."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self, shapes):
            self.it = iter([{"x": rng.standard_normal(s).astype(np.float32)} for s in shapes])

        def get_next(self):
            return next(self.it, None)

    forms = [("convnet", qdq_convnet, [[1, 3, 48, 48]] * 6, [(1, 3, 64, 64), (2, 3, 37, 45), (1, 3, 96, 320)],
              {"QLinearConv": 5, "kiln.ChannelLookup": 1, "com.microsoft.QLinearAdd": 1}, ["Conv", "BatchNormalization", "Add"]),
             ("mlp", qdq_mlp, [[2, 7, 32]] * 6, [(1, 1, 32), (2, 7, 32), (3, 33, 32)], {"QLinearMatMul": 2}, ["MatMul"])]
    with tempfile.TemporaryDirectory() as d:
        for name, build, calib, shapes, want_ops, gone in forms:
            fp = os.path.join(d, name + ".onnx")
            onnx.save(build(), fp)
            for per_ch in (False, True):
                for act in (QuantType.QUInt8, QuantType.QInt8):
                    qp = os.path.join(d, f"{name}_{per_ch}_{act.name}.onnx")
                    quantize_static(fp, qp, Reader(calib), quant_format=QuantFormat.QDQ, activation_type=act,
                                    weight_type=QuantType.QInt8, per_channel=per_ch)
                    blob = open(qp, "rb").read()
                    label = f"QDQ {name} {'per-channel' if per_ch else 'per-tensor'} {act.name}"
                    ops = kiln_ops(blob)
                    if ops is not None:
                        check(f"{label} fuses", all(ops.get(k) == v for k, v in want_ops.items()) and
                              not any(g in ops for g in gone), str(ops))
                    ref, ks = ort_session(blob), kiln.Session(blob, num_threads=2)
                    m = onnx.load(qp)
                    out_dq = [n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == m.graph.output[0].name]
                    step = float(numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == out_dq[0].input[1])))
                    for s in shapes:
                        feeds = {"x": rng.standard_normal(s).astype(np.float32)}
                        want, got = ref.run(None, feeds)[0], np.asarray(ks.run(feeds)[0])
                        diff = np.abs(got.astype(np.float64) - want)
                        ok = got.shape == want.shape and diff.max() <= step * 1.0001 and np.mean(diff > 0) <= 0.01
                        check(f"{label} {s}", ok, f"max diff {diff.max():.4g} (step {step:.4g}), "
                              f"{int(np.sum(diff > 0))} of {diff.size} differ")


def test_qdq_resize():
    """DQ -> Resize -> Q with the DQ's scale and zero point (quantize_static's upsampling): nearest
    runs on the 8-bit values (the pair dropped), bit for bit the unoptimised session's and ORT's
    outputs; linear keeps the pair (the float32 blend may round a value across a step from the
    reference's double one: within one step of ORT)."""
    for dt in (np.uint8, np.int8):
        for mode, sc in (("nearest", [1, 1, 2, 2]), ("nearest", [1, 1, 1.5, 0.5]), ("linear", [1, 1, 2, 2])):
            inits = [numpy_helper.from_array(np.array(0.0213, np.float32), "s"), numpy_helper.from_array(q8(dt), "z"),
                     numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
                     numpy_helper.from_array(np.array(sc, np.float32), "S")]
            nodes = [helper.make_node("DequantizeLinear", ["X", "s", "z"], ["xf"]),
                     helper.make_node("Resize", ["xf", "roi", "S"], ["yf"], mode=mode),
                     helper.make_node("QuantizeLinear", ["yf", "s", "z"], ["Y"])]
            blob = model(nodes, [vi("X", dt, ["N", 3, "H", "W"])], [vi("Y", dt, None)], inits, opset=13)
            label = f"QDQ Resize {mode} x{sc[2:]} {dt.__name__}"
            ops = kiln_ops(blob)
            if ops is not None:
                pair = "DequantizeLinear" in ops or "QuantizeLinear" in ops
                check(f"{label}: the DQ/Q pair {'kept' if mode == 'linear' else 'dropped'}", pair == (mode == "linear"),
                      str(ops))
            feeds = [{"X": q8(dt, *shp)} for shp in [(1, 3, 6, 8), (2, 3, 9, 7), (1, 3, 1, 1)]]
            if mode == "nearest":
                exact_vs_reference(label, blob, feeds)
            ref = ort_session(blob)
            ks = kiln.Session(blob, num_threads=2)
            for f in feeds:
                got, want = np.asarray(ks.run(f)[0]), ref.run(None, f)[0]
                diff = np.abs(got.astype(np.int64) - want) if got.shape == want.shape else None
                check(f"{label} {f['X'].shape} vs ORT", diff is not None and diff.max(initial=0) <= (mode == "linear"),
                      "shape" if diff is None else f"max diff {diff.max(initial=0)}")


def test_qdq_batchnorm():
    """DQ -> BatchNormalization -> Q, which the QDQ pass tabulates per channel (kiln.ChannelLookup):
    bit for bit the reference kernels' chain (an unoptimised session), and within one step of ORT's
    three float kernels on at most 1% of the elements; 8-bit types both ways, the scale a constant
    or a DequantizeLinear of int8 weights (as quantize_static writes it), ranks 2 to 4."""
    for xdt, ydt in [(np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8)]:
        for C, shape, dq_scale in [(5, [2, 5, 7, 9], False), (24, [1, 24, 33], True), (3, [4, 3], True),
                                   (16, [3, 16, 1, 70], False)]:
            inits = [numpy_helper.from_array(np.array(0.031, np.float32), "xs"), numpy_helper.from_array(q8(xdt), "xz"),
                     numpy_helper.from_array(np.array(0.027, np.float32), "ys"), numpy_helper.from_array(q8(ydt), "yz"),
                     numpy_helper.from_array(rng.normal(0, 0.3, C).astype(np.float32), "b"),
                     numpy_helper.from_array(rng.normal(0, 0.3, C).astype(np.float32), "mean"),
                     numpy_helper.from_array(rng.uniform(0.3, 2.0, C).astype(np.float32), "var")]
            nodes = [helper.make_node("DequantizeLinear", ["X", "xs", "xz"], ["xf"])]
            if dq_scale:
                inits += [numpy_helper.from_array(rng.integers(-127, 128, C).astype(np.int8), "sq"),
                          numpy_helper.from_array(np.array(0.01, np.float32), "ss"),
                          numpy_helper.from_array(np.array(0, np.int8), "sz")]
                nodes.append(helper.make_node("DequantizeLinear", ["sq", "ss", "sz"], ["scale"]))
            else:
                inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, C).astype(np.float32), "scale"))
            nodes += [helper.make_node("BatchNormalization", ["xf", "scale", "b", "mean", "var"], ["yf"], epsilon=1e-3),
                      helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["Y"])]
            g = helper.make_graph(nodes, "qdq_bn", [vi("X", xdt, shape)], [vi("Y", ydt, None)], inits)
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            m.ir_version = 8
            blob = m.SerializeToString()
            label = f"DQ-BN-Q {xdt.__name__}->{ydt.__name__} {shape}{' DQ scale' if dq_scale else ''}"
            ops = kiln_ops(blob)
            if ops is not None:
                check(f"{label} tabulated", ops.get("kiln.ChannelLookup") == 1 and "BatchNormalization" not in ops, str(ops))
            feeds = [{"X": q8(xdt, *shape)} for _ in range(2)]
            exact_vs_reference(label, blob, feeds)
            ref, ks = ort_session(blob), kiln.Session(blob, num_threads=2)
            for f in feeds:
                want, got = ref.run(None, f)[0].astype(np.int32), np.asarray(ks.run(f)[0]).astype(np.int32)
                diff = np.abs(got - want)
                check(f"{label} vs ORT", diff.max() <= 1 and np.mean(diff > 0) <= 0.01,
                      f"max diff {diff.max()}, {int(np.sum(diff > 0))} of {diff.size} differ")


def test_quantize_linear_maxpool8():
    """The QDQ pass's helpers one node each: per-tensor QuantizeLinear to u8/s8 (values on and near
    the rounding ties, out of range) and 2-D MaxPool on u8/s8 (strides, pads, dilations, odd
    sizes), bit-exact with ORT."""
    for dt in (np.uint8, np.int8):
        blob = model(helper.make_node("QuantizeLinear", ["X", "s", "z"], ["Y"]),
                     [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)], [vi("Y", dt, None)],
                     [numpy_helper.from_array(np.array(0.0173, np.float32), "s"), numpy_helper.from_array(q8(dt), "z")])
        feeds = []
        for shape in ([1], [17], [3, 130], [2, 3, 61, 67]):
            x = (rng.standard_normal(shape) * rng.choice([0.3, 3.0])).astype(np.float32)
            feeds.append({"X": x})
            feeds.append({"X": ((np.round(x / 0.0173 * 2) + 1) / 2 * np.float32(0.0173)).astype(np.float32)})  # ties
            special = x.copy().reshape(-1)
            special[::3] = np.nan
            special[1::7] = np.inf
            special[2::11] = -np.inf
            feeds.append({"X": special.reshape(x.shape)})  # NaN to 0, infinities saturate
        compare(f"QuantizeLinear {dt.__name__}", blob, feeds)
        for shape, attrs in [([1, 3, 17, 13], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
                             ([2, 5, 9, 11], dict(kernel_shape=[2, 2], strides=[2, 2])),
                             ([1, 4, 15, 300], dict(kernel_shape=[3, 2], strides=[1, 3], pads=[1, 0, 2, 1])),
                             ([1, 2, 13, 12], dict(kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 1, 1, 1]))]:
            blob = model(helper.make_node("MaxPool", ["X"], ["Y"], **attrs), [vi("X", dt, shape)], [vi("Y", dt, None)])
            compare(f"MaxPool {dt.__name__} {shape} {attrs}", blob, [{"X": q8(dt, *shape)} for _ in range(2)])


if __name__ == "__main__":
    ort_int8.announce()
    test_matmul_integer()
    test_dynamic_quantize_linear()
    test_dequantize_linear()
    test_qlinear_matmul()
    test_matmul_integer_to_float()
    test_dynamic_quantize_matmul()
    test_dynamic_quantize_lstm()
    test_conv_integer()
    test_qlinear_conv()
    test_quant_matmul_fusion()
    test_qdq_static()
    test_qdq_resize()
    test_qdq_batchnorm()
    test_quantize_linear_maxpool8()
    test_quantize_dynamic_encoder()
    sys.exit(summary())
