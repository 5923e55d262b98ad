#!/usr/bin/env python3
"""test_gpu_quant.py - the GPU 'quant' family (src/gpu/ops_quant.c): the quantization operators of
ONNX Runtime's quantizer on the CUDA provider against the CPU reference (an unoptimized CPU
session), on random data (never zeros; values on rounding ties and past the saturation bounds),
several shapes each (odd sizes, K not a multiple of 4, batch > 1, one session fed several
shapes). Integer outputs must equal the reference bit for bit, float outputs agree at float32
tolerance:

QuantizeLinear and DequantizeLinear (opsets 10, 13, 19, 21; per tensor, per axis, blocked;
uint8, int8, uint16, int16, int32 into DequantizeLinear; float32 and float16 values and scales;
with and without zero point), com.microsoft QuantizeLinear / DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger (every operand type pair, scalar, per-row and per-column
zero points, broadcast batches, 1-D operands), com.microsoft MatMulIntegerToFloat (bias,
per-column scales and zero points) and DynamicQuantizeMatMul, QLinearMatMul (per-tensor and
per-row / per-column scales) and com.microsoft QGemm (transposes, alpha, every C form, float and
8-bit outputs), ConvInteger and QLinearConv (1-D, 2-D and 3-D; groups, depthwise, strides, pads,
dilations, auto_pad; per-channel weight zero points and scales; bias), com.microsoft QLinearAdd
and QLinearMul (broadcasting, scalar operands on either side, zero points absent or present,
saturating scales), com.microsoft QLinearSigmoid and QLinearLeakyRelu (every code of both types),
QLinearConcat (axes, inputs copied and requantized, absent zero points), QLinearGlobalAveragePool
and QLinearAveragePool (NCHW and channels_last; 1-D to 3-D windows, strides, pads,
count_include_pad, ceil_mode), QLinearSoftmax (opset 1 and 13 rows, one-element rows, saturating
Y scales), QAttention (uint8 x int8 and uint8, per-column weight scales and zero points, every
mask_index form, unidirectional, past and present; float output at float32 tolerance);
DynamicQuantizeLSTM's refusal (on the CPU). Each one-node model checks that its node is placed on the GPU and that the
session has no node falling back to the CPU (nodes_fallback 0); 4-bit and 8-bit-float cases check
the refusal (on the CPU).

Whole models: a small conv net and a small MLP / encoder built in float with onnx.helper and
quantized by onnxruntime.quantization (quantize_dynamic; quantize_static in QDQ and QOperator
formats, a small calibration reader), run on the provider against kiln's CPU reference and CPU
provider (float outputs close); the nodes not on the GPU are listed.

usage: KILN_LIB=<build>/libkiln.so test_gpu_quant.py   (prints SKIP without a GPU)
  KILN_GPU_TEST_PROVIDER=cpu  puts the "GPU" sessions on the CPU: checks the test itself (model
                              building, quantizing, feeds) on a machine without a GPU
  KILN_GPU_QUANT_TESTS="qdq dyn mm conv ew pool attn model" picks parts
"""
import os
import sys
import tempfile

import logging

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from checks import check, close, run_feeds, skip_without, summary  # noqa: E402
import kiln  # noqa: E402

PROVIDER = os.environ.get("KILN_GPU_TEST_PROVIDER", "cuda")
PARTS = os.environ.get("KILN_GPU_QUANT_TESTS", "qdq dyn mm conv ew pool attn model").split()
MS = "com.microsoft"
QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "MatMulIntegerToFloat",
             "DynamicQuantizeMatMul", "QLinearMatMul", "QGemm", "ConvInteger", "QLinearConv",
             "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
             "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSoftmax", "QAttention", "DynamicQuantizeLSTM"}
ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.uint8: TensorProto.UINT8,
        np.int8: TensorProto.INT8, np.uint16: TensorProto.UINT16, np.int16: TensorProto.INT16,
        np.int32: TensorProto.INT32, np.int64: TensorProto.INT64}
RANGE = {np.uint8: (0, 255), np.int8: (-128, 127), np.uint16: (0, 65535), np.int16: (-32768, 32767),
         np.int32: (-(1 << 20), 1 << 20)}
rng = np.random.default_rng(3031)
logging.getLogger().setLevel(logging.ERROR)  # the quantizer's pre-processing advice


def rand(*shape, dtype=np.float32, scale=1.0, shift=0.0):
    a = rng.standard_normal(shape) * scale + shift
    a[a == 0] = 0.5
    return a.astype(dtype)


def rand_int(dtype, *shape, lo=None, hi=None):
    rlo, rhi = RANGE[dtype]
    lo = rlo if lo is None else lo
    hi = rhi if hi is None else hi
    a = rng.integers(lo, hi + 1, size=shape)
    a[a == 0] = 1 if hi >= 1 else -1
    return a.astype(dtype)


def scales(*shape, dtype=np.float32):
    return (rng.uniform(0.01, 0.2, size=shape)).astype(dtype)


def dname(dt):
    return np.dtype(dt).name


def vi(name, dt, shape):
    return helper.make_tensor_value_info(name, ELEM[dt], shape)


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "quant", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 10 if opset >= 21 else 8
    return m


def init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def compare(name, m, feeds_list, on_gpu=True, rtol=1e-5, atol=1e-6):
    """The provider's session vs the CPU reference on every feed; a feed the reference refuses must
    be refused there too. on_gpu: whether the quant nodes must be on the GPU with no node falling
    back (False: refused, on the CPU)."""
    blob = m.SerializeToString()
    try:
        gpu = kiln.Session(blob, provider=PROVIDER)
    except kiln.KilnError as e:
        check(f"{name}: create {PROVIDER} session", False, str(e))
        return
    ref = kiln.Session(blob, unoptimized=True, provider="cpu")
    if PROVIDER == "cuda":
        nodes = gpu.nodes()
        placed = [(op, prov) for _, op, prov in nodes if op in QUANT_OPS]
        want = "cuda" if on_gpu else "cpu"
        check(f"{name}: quant nodes on {want}", placed and all(p == want for _, p in placed), placed)
    run_feeds(name, gpu, ref, feeds_list, rtol, atol, PROVIDER)
    if PROVIDER == "cuda" and on_gpu:
        st = gpu.stats()
        check(f"{name}: no node falls back to the CPU", st["nodes_fallback"] == 0,
              f"nodes_fallback {st['nodes_fallback']}: {[(op, p) for _, op, p in gpu.nodes() if p == 'cpu']}")


def tie_data(shape, s, dtype=np.float32):
    """x / s lands on .5 ties, on integers, between them and far past every saturation bound."""
    q = rng.integers(-40000, 40000, size=shape).astype(np.float64)
    frac = rng.choice([0.5, -0.5, 0.25, 0.0, 0.75, 1.5], size=shape)
    x = (q / rng.choice([1, 1, 100, 1000], size=shape) + frac) * np.broadcast_to(np.asarray(s, np.float64), shape)
    x[x == 0] = 0.5
    return x.astype(dtype)


# ---------------------------------------------------------------- QuantizeLinear, DequantizeLinear

def param_shape(xshape, axis, block):
    """Shape of a per-axis (block 0) or blocked scale for x of xshape; None: per tensor."""
    if axis is None:
        return None
    if not block:
        return (xshape[axis],)
    s = list(xshape)
    s[axis] = -(-xshape[axis] // block)
    return tuple(s)


def expand_param(p, xshape, axis, block):
    """The scale of every element of x (numpy broadcast of the per-axis / blocked parameter)."""
    if axis is None:
        return p.reshape(())
    if not block:
        sh = [1] * len(xshape)
        sh[axis] = xshape[axis]
        return p.reshape(sh)
    return np.repeat(p, block, axis=axis).take(range(xshape[axis]), axis=axis)


def test_quantize():
    # (opset, x dtype, scale dtype, y dtype, axis (None: per tensor), block, zero point)
    cases = [(10, np.float32, np.float32, np.uint8, None, 0, True), (10, np.float32, np.float32, np.int8, None, 0, True),
             (10, np.float32, np.float32, np.uint8, None, 0, False), (13, np.float32, np.float32, np.int8, 1, 0, True),
             (13, np.float32, np.float32, np.uint8, 0, 0, True), (13, np.float32, np.float32, np.uint8, -1, 0, False),
             (19, np.float16, np.float16, np.uint8, None, 0, True), (19, np.float16, np.float16, np.int8, 1, 0, True),
             (21, np.float32, np.float32, np.uint16, None, 0, True), (21, np.float32, np.float32, np.int16, 1, 0, True),
             (21, np.float32, np.float32, np.int8, 1, 4, True), (21, np.float32, np.float32, np.uint8, 2, 3, True),
             (21, np.float16, np.float16, np.int16, -1, 0, True), (21, np.float32, np.float32, np.uint8, 0, 2, False)]
    shapes = [(3, 8, 5), (2, 7, 9), (1, 33, 6)]
    for opset, xdt, sdt, ydt, axis, block, with_zp in cases:
        for xs in shapes:
            ax = None if axis is None else axis % 3
            ps = param_shape(xs, ax, block)
            s = scales(*(ps or ()), dtype=sdt)
            zp = rand_int(ydt, *(ps or ()), lo=RANGE[ydt][0] // 4 if RANGE[ydt][0] else 3, hi=RANGE[ydt][1] // 4)
            x = tie_data(xs, expand_param(s.astype(np.float64), xs, ax, block), xdt)
            attrs = {}
            if axis is not None and opset >= 13:
                attrs["axis"] = axis
            if block:
                attrs["block_size"] = block
            if not with_zp and ydt != np.uint8:
                attrs["output_dtype"] = ELEM[ydt]
            inits = [init("s", s)] + ([init("zp", zp)] if with_zp else [])
            ins = ["x", "s"] + (["zp"] if with_zp else [])
            m = model([helper.make_node("QuantizeLinear", ins, ["y"], **attrs)], [vi("x", xdt, list(xs))],
                      [vi("y", ydt, None)], inits, opset)
            compare(f"QuantizeLinear opset {opset} {dname(xdt)}->{dname(ydt)} axis {axis} block {block} zp {with_zp} "
                    f"{xs}", m, [{"x": x}])
    # one session, several shapes (per axis on dim 1)
    s, zp = scales(4), rand_int(np.int8, 4, lo=-20, hi=20)
    m = model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], axis=1)], [vi("x", np.float32, ["n", 4, "w"])],
              [vi("y", np.int8, None)], [init("s", s), init("zp", zp)], 13)
    compare("QuantizeLinear per axis, several shapes", m,
            [{"x": tie_data((n, 4, w), s.reshape(1, 4, 1))} for n, w in ((1, 1), (2, 17), (5, 64), (3, 1001))])
    # scale and zero point as graph inputs
    m = model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"])],
              [vi("x", np.float32, ["n"]), vi("s", np.float32, []), vi("zp", np.uint8, [])], [vi("y", np.uint8, None)])
    compare("QuantizeLinear scale and zero point as inputs", m,
            [{"x": tie_data((n,), 0.05), "s": np.float32(0.05), "zp": np.uint8(zp0)} for n, zp0 in ((7, 128), (1000, 3))])
    # refused: a 4-bit target
    s4 = np.float32(0.1)
    m = model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"])],
              [vi("x", np.float32, [6])], [vi("y", np.float32, None)],
              [init("s", s4), helper.make_tensor("zp", TensorProto.INT4, [], [1])], 21)
    compare("QuantizeLinear -> DequantizeLinear int4 (refused)", m, [{"x": rand(6)}], on_gpu=False)


def test_dequantize():
    cases = [(10, np.uint8, np.float32, None, 0, True), (10, np.int8, np.float32, None, 0, True),
             (10, np.int32, np.float32, None, 0, False), (13, np.int8, np.float32, 1, 0, True),
             (13, np.uint8, np.float32, 0, 0, False), (19, np.uint8, np.float16, None, 0, True),
             (19, np.int8, np.float16, -1, 0, True), (21, np.uint16, np.float32, None, 0, True),
             (21, np.int16, np.float32, 1, 0, True), (21, np.int8, np.float32, 1, 4, True),
             (21, np.uint8, np.float16, 2, 3, True), (21, np.int32, np.float32, 1, 0, False)]
    for opset, xdt, sdt, axis, block, with_zp in cases:
        for xs in [(3, 8, 5), (2, 7, 9), (1, 33, 6)]:
            ax = None if axis is None else axis % 3
            ps = param_shape(xs, ax, block)
            s = scales(*(ps or ()), dtype=sdt)
            zp = rand_int(xdt, *(ps or ()), lo=RANGE[xdt][0] // 2, hi=RANGE[xdt][1] // 2)
            attrs = {}
            if axis is not None and opset >= 13:
                attrs["axis"] = axis
            if block:
                attrs["block_size"] = block
            inits = [init("s", s)] + ([init("zp", zp)] if with_zp else [])
            ins = ["x", "s"] + (["zp"] if with_zp else [])
            m = model([helper.make_node("DequantizeLinear", ins, ["y"], **attrs)], [vi("x", xdt, list(xs))],
                      [vi("y", sdt, None)], inits, opset)
            compare(f"DequantizeLinear opset {opset} {dname(xdt)}->{dname(sdt)} axis {axis} block {block} zp {with_zp} "
                    f"{xs}", m, [{"x": rand_int(xdt, *xs)}], rtol=0, atol=0)


def test_ms_qdq():
    for ydt in (np.uint8, np.int8, np.uint16, np.int16):
        for axis in (None, 1):
            xs = (2, 6, 11)
            s = scales(*((6,) if axis is not None else ()))
            zp = rand_int(ydt, *((6,) if axis is not None else ()), lo=RANGE[ydt][0] // 4, hi=RANGE[ydt][1] // 4)
            attrs = {"axis": axis} if axis is not None else {}
            q = helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], domain=MS, **attrs)
            d = helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], domain=MS, **attrs)
            m = model([q, d], [vi("x", np.float32, list(xs))], [vi("q", ydt, None), vi("y", np.float32, None)],
                      [init("s", s), init("zp", zp)])
            sx = s.reshape(1, 6, 1) if axis is not None else s
            compare(f"com.microsoft QuantizeLinear -> DequantizeLinear {dname(ydt)} axis {axis}", m,
                    [{"x": tie_data(xs, sx)}], rtol=0, atol=0)


def test_dynamic_quantize():
    m = model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yzp"])], [vi("x", np.float32, ["a", "b"])],
              [vi("y", np.uint8, None), vi("ys", np.float32, None), vi("yzp", np.uint8, None)])
    feeds = [{"x": rand(3, 7, scale=2.0)}, {"x": rand(1, 1)}, {"x": rand(64, 1000, scale=5.0, shift=1.0)},
             {"x": np.abs(rand(5, 9)) + 0.1}, {"x": -np.abs(rand(17, 33)) - 0.1},
             {"x": (rng.integers(-255, 256, size=(8, 129)) / 2.0 * (4.0 / 255)).astype(np.float32)},
             {"x": rand(1, 300000, scale=3.0)}]
    compare("DynamicQuantizeLinear", m, feeds, rtol=0, atol=0)


# ---------------------------------------------------------------- integer matrix products

def mm_cases():
    """(A shape, B shape): batches, broadcast batches, 1-D operands, odd sizes, K % 4 != 0."""
    return [((5, 7), (7, 3)), ((1, 1), (1, 1)), ((33, 65), (65, 17)), ((2, 3, 13), (13, 6)), ((2, 1, 4, 9), (3, 9, 5)),
            ((9,), (9, 4)), ((4, 10), (10,)), ((130, 257), (257, 70)), ((3, 2, 5, 31), (3, 2, 31, 66))]


def test_matmul_integer():
    for adt in (np.uint8, np.int8):
        for bdt in (np.uint8, np.int8):
            for zp_kind in ("none", "scalar", "vector"):
                for ash, bsh in mm_cases():
                    A, B = rand_int(adt, *ash), rand_int(bdt, *bsh)
                    names, ins, inits = ["A", "B"], [vi("A", adt, list(ash)), vi("B", bdt, list(bsh))], []
                    if zp_kind != "none":
                        M = ash[-2] if len(ash) >= 2 else 1
                        N = bsh[-1] if len(bsh) >= 2 else 1
                        vec = zp_kind == "vector" and len(ash) == 2 and len(bsh) == 2
                        azp = rand_int(adt, *((M,) if vec else ()))
                        bzp = rand_int(bdt, *((N,) if vec else ()))
                        names += ["azp", "bzp"]
                        inits += [init("azp", azp), init("bzp", bzp)]
                    elif zp_kind == "vector":
                        continue
                    m = model([helper.make_node("MatMulInteger", names, ["Y"])], ins, [vi("Y", np.int32, None)], inits)
                    compare(f"MatMulInteger {dname(adt)}x{dname(bdt)} zp {zp_kind} {ash}@{bsh}", m, [{"A": A, "B": B}])
    # one session, several M (dynamic rows), per-column B zero point
    B, bzp = rand_int(np.int8, 19, 12), rand_int(np.int8, 12)
    m = model([helper.make_node("MatMulInteger", ["A", "B", "azp", "bzp"], ["Y"])], [vi("A", np.uint8, ["b", "m", 19])],
              [vi("Y", np.int32, None)], [init("B", B), init("azp", np.uint8(131)), init("bzp", bzp)])
    compare("MatMulInteger several shapes", m, [{"A": rand_int(np.uint8, b, r, 19)} for b, r in ((1, 1), (2, 7), (4, 100))])


def test_matmul_integer_to_float():
    for adt in (np.uint8, np.int8):
        for bdt in (np.uint8, np.int8):
            for per_col, bias, azp in ((False, False, False), (True, True, True), (True, False, True), (False, True, False)):
                for ash, bsh in [((5, 7), (7, 3)), ((2, 3, 13), (13, 6)), ((33, 65), (65, 17)), ((1, 4, 255), (255, 66))]:
                    N = bsh[-1]
                    bs = scales(N) if per_col else scales(1)
                    bzp = rand_int(bdt, *((N,) if per_col else (1,)))
                    names = ["A", "B", "as", "bs", "azp" if azp else "", "bzp", "bias" if bias else ""]
                    while names[-1] == "":
                        names.pop()
                    inits = [init("B", rand_int(bdt, *bsh)), init("as", np.float32(0.037)), init("bs", bs),
                             init("bzp", bzp)]
                    if azp:
                        inits.append(init("azp", rand_int(adt)))
                    if bias:
                        inits.append(init("bias", rand(N)))
                    m = model([helper.make_node("MatMulIntegerToFloat", names, ["Y"], domain=MS)],
                              [vi("A", adt, list(ash))], [vi("Y", np.float32, None)], inits)
                    compare(f"MatMulIntegerToFloat {dname(adt)}x{dname(bdt)} per_col {per_col} bias {bias} azp {azp} "
                            f"{ash}@{bsh}", m, [{"A": rand_int(adt, *ash)}])


def test_dynamic_quantize_matmul():
    for bdt in (np.uint8, np.int8):
        for per_col, bias, with_zp in ((False, False, False), (True, True, True), (False, True, True)):
            for ash, bsh in [((5, 7), (7, 3)), ((2, 3, 13), (13, 6)), ((64, 129), (129, 40)), ((1, 1), (1, 9))]:
                N = bsh[-1]
                names = ["A", "B", "bs", "bzp" if with_zp else "", "bias" if bias else ""]
                while names[-1] == "":
                    names.pop()
                inits = [init("B", rand_int(bdt, *bsh)), init("bs", scales(N) if per_col else scales(1))]
                if with_zp:
                    inits.append(init("bzp", rand_int(bdt, *((N,) if per_col else (1,)))))
                if bias:
                    inits.append(init("bias", rand(N)))
                m = model([helper.make_node("DynamicQuantizeMatMul", names, ["Y"], domain=MS)],
                          [vi("A", np.float32, list(ash))], [vi("Y", np.float32, None)], inits)
                compare(f"DynamicQuantizeMatMul {dname(bdt)} per_col {per_col} bias {bias} zp {with_zp} {ash}@{bsh}", m,
                        [{"A": rand(*ash, scale=2.0)}, {"A": np.abs(rand(*ash))}])


def test_qlinear_matmul():
    for adt in (np.uint8, np.int8):
        for bdt in (np.uint8, np.int8):
            for ydt in (np.uint8, np.int8):
                for vec in (False, True):
                    for ash, bsh in [((5, 7), (7, 3)), ((2, 3, 13), (13, 6)), ((33, 65), (65, 17)), ((4, 9), (9,)),
                                     ((130, 257), (257, 70))]:
                        M = ash[-2] if len(ash) >= 2 else 1
                        N = bsh[-1] if len(bsh) >= 2 else 1
                        v = vec and len(ash) == 2 and len(bsh) == 2
                        K = ash[-1]
                        inits = [init("as", scales(*((M,) if v else ()))), init("azp", rand_int(adt, *((M,) if v else ()))),
                                 init("B", rand_int(bdt, *bsh)), init("bs", scales(*((N,) if v else ()))),
                                 init("bzp", rand_int(bdt, *((N,) if v else ()))),
                                 init("ys", np.float32(0.02 * np.sqrt(K))), init("yzp", rand_int(ydt))]
                        m = model([helper.make_node("QLinearMatMul", ["A", "as", "azp", "B", "bs", "bzp", "ys", "yzp"],
                                                    ["Y"])], [vi("A", adt, list(ash))], [vi("Y", ydt, None)], inits)
                        compare(f"QLinearMatMul {dname(adt)}x{dname(bdt)}->{dname(ydt)} vector {v} {ash}@{bsh}", m,
                                [{"A": rand_int(adt, *ash)}])


def test_qgemm():
    for adt, bdt in ((np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)):
        for ta, tb in ((0, 0), (1, 0), (0, 1), (1, 1)):
            for out in (None, np.uint8, np.int8):
                for cform in (None, "N", "MN", "1", "M1"):
                    M, K, N = 13, 37, 21
                    ash, bsh = ((K, M) if ta else (M, K)), ((N, K) if tb else (K, N))
                    per_col = cform in ("N", "MN")
                    inits = [init("as", np.float32(0.05)), init("azp", rand_int(adt)), init("B", rand_int(bdt, *bsh)),
                             init("bs", scales(N) if per_col else scales(1)),
                             init("bzp", rand_int(bdt, *((N,) if per_col else (1,))))]
                    names = ["A", "as", "azp", "B", "bs", "bzp"]
                    if cform or out is not None:
                        names.append("C" if cform else "")
                    if cform:
                        cs = {"N": (N,), "MN": (M, N), "1": (1,), "M1": (M, 1)}[cform]
                        inits.append(init("C", rand_int(np.int32, *cs, lo=-5000, hi=5000)))
                    if out is not None:
                        names += ["ys", "yzp"]
                        inits += [init("ys", np.float32(0.3)), init("yzp", rand_int(out))]
                    attrs = {"transA": ta, "transB": tb, "alpha": 0.75 if ta else 1.0}
                    m = model([helper.make_node("QGemm", names, ["Y"], domain=MS, **attrs)], [vi("A", adt, list(ash))],
                              [vi("Y", out or np.float32, None)], inits)
                    compare(f"QGemm {dname(adt)}x{dname(bdt)} trans {ta}{tb} C {cform} out {out and dname(out)}", m,
                            [{"A": rand_int(adt, *ash)}])


# ---------------------------------------------------------------- convolutions

def conv_cases():
    """(x shape, w shape, attributes)."""
    return [((1, 3, 9, 9), (4, 3, 3, 3), {}), ((2, 4, 8, 7), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
            ((2, 6, 11, 10), (6, 1, 3, 3), {"group": 6, "strides": [2, 2], "pads": [1, 0, 1, 2]}),
            ((1, 5, 13, 12), (7, 5, 2, 3), {"dilations": [2, 1], "auto_pad": "SAME_UPPER"}),
            ((3, 2, 17), (5, 2, 4), {"strides": [3], "pads": [2, 1]}),
            ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1]}),
            ((2, 16, 14, 14), (32, 16, 1, 1), {}), ((1, 32, 10, 10), (16, 32, 3, 3), {"pads": [1, 1, 1, 1]})]


def test_conv_integer():
    for xdt, wdt in ((np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)):
        for zp in ("none", "scalar", "channel"):
            for xs, wsh, attrs in conv_cases():
                M = wsh[0]
                names, inits = ["x", "w"], [init("w", rand_int(wdt, *wsh))]
                if zp != "none":
                    names += ["xzp", "wzp"]
                    inits += [init("xzp", rand_int(xdt)), init("wzp", rand_int(wdt, *((M,) if zp == "channel" else ())))]
                m = model([helper.make_node("ConvInteger", names, ["y"], **attrs)], [vi("x", xdt, list(xs))],
                          [vi("y", np.int32, None)], inits)
                compare(f"ConvInteger {dname(xdt)}x{dname(wdt)} zp {zp} {xs}*{wsh} {attrs}", m, [{"x": rand_int(xdt, *xs)}])


def test_qlinear_conv():
    for xdt, wdt in ((np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)):
        for per_channel, bias in ((False, False), (True, True), (False, True)):
            for xs, wsh, attrs in conv_cases():
                M, K = wsh[0], int(np.prod(wsh[1:]))
                pc = (M,) if per_channel else ()
                names = ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"] + (["B"] if bias else [])
                inits = [init("xs", np.float32(0.05)), init("xzp", rand_int(xdt)), init("w", rand_int(wdt, *wsh)),
                         init("ws", scales(*pc)), init("wzp", rand_int(wdt, *pc) if wdt == np.uint8 else np.zeros(pc, wdt)),
                         init("ys", np.float32(0.1 * np.sqrt(K))), init("yzp", rand_int(xdt))]
                if bias:
                    inits.append(init("B", rand_int(np.int32, M, lo=-3000, hi=3000)))
                m = model([helper.make_node("QLinearConv", names, ["y"], **attrs)], [vi("x", xdt, list(xs))],
                          [vi("y", xdt, None)], inits)
                compare(f"QLinearConv {dname(xdt)}x{dname(wdt)} per_channel {per_channel} bias {bias} {xs}*{wsh} {attrs}",
                        m, [{"x": rand_int(xdt, *xs)}])
    # one session, several batch sizes and image sizes
    inits = [init("xs", np.float32(0.02)), init("xzp", np.uint8(120)), init("w", rand_int(np.int8, 8, 3, 3, 3)),
             init("ws", scales(8)), init("wzp", np.zeros(8, np.int8)), init("ys", np.float32(0.4)), init("yzp", np.uint8(7))]
    m = model([helper.make_node("QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"], ["y"], pads=[1, 1, 1, 1])],
              [vi("x", np.uint8, ["n", 3, "h", "w"])], [vi("y", np.uint8, None)], inits)
    compare("QLinearConv several shapes", m, [{"x": rand_int(np.uint8, n, 3, h, w)} for n, h, w in ((1, 5, 5), (4, 16, 9))])


# ---------------------------------------------------------------- QLinear element-wise

def test_qlinear_binary():
    shapes = [((2, 3, 5), (2, 3, 5)), ((4, 1, 7), (3, 1)), ((), (6, 9)), ((5, 8), ()), ((1,), (1,)), ((2, 64, 33), (33,))]
    for op in ("QLinearAdd", "QLinearMul"):
        for dt in (np.uint8, np.int8):
            for with_zp in (True, False):
                for cs in (0.05, 0.003):  # 0.003: most results saturate
                    for ash, bsh in shapes:
                        names = ["A", "as", "azp" if with_zp else "", "B", "bs", "bzp" if with_zp else "", "cs",
                                 "czp" if with_zp else ""]
                        while names[-1] == "":
                            names.pop()
                        inits = [init("as", np.float32(0.07)), init("bs", np.float32(0.021)), init("cs", np.float32(cs))]
                        if with_zp:
                            inits += [init("azp", rand_int(dt)), init("bzp", rand_int(dt)), init("czp", rand_int(dt))]
                        m = model([helper.make_node(op, names, ["C"], domain=MS)],
                                  [vi("A", dt, list(ash)), vi("B", dt, list(bsh))], [vi("C", dt, None)], inits)
                        compare(f"{op} {dname(dt)} zp {with_zp} C_scale {cs} {ash}+{bsh}", m,
                                [{"A": rand_int(dt, *ash), "B": rand_int(dt, *bsh)}])


def q8_params(dt, with_zp, names):
    """Scale and (with_zp) zero point initializers for prefixes names, and their input names."""
    ins, inits = [], []
    for nm, sc in names:
        ins += [nm + "s", nm + "z" if with_zp else ""]
        inits.append(init(nm + "s", np.float32(sc)))
        if with_zp:
            inits.append(init(nm + "z", rand_int(dt, lo=RANGE[dt][0] // 2, hi=RANGE[dt][1] // 2)))
    while ins[-1] == "":
        ins.pop()
    return ins, inits


def every_code(dt, shape):
    """Random codes of dt with every one of the 256 codes in the first 256 elements."""
    a = rand_int(dt, *shape).reshape(-1)
    lo = RANGE[dt][0]
    k = min(256, a.size)
    a[:k] = (np.arange(256)[:k] + lo).astype(dt)
    return a.reshape(shape)


def test_qlinear_unary():
    for op, attrs in (("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.13})):
        for dt in (np.uint8, np.int8):
            for with_zp in (True, False):
                for xs, ys in ((0.05, 0.004), (0.1, 0.0007), (0.02, 0.05)):  # 0.0007: most results saturate
                    ins, inits = q8_params(dt, with_zp, [("x", xs), ("y", ys)])
                    m = model([helper.make_node(op, ["X"] + ins, ["Y"], domain=MS, **attrs)],
                              [vi("X", dt, ["n", "c", 7])], [vi("Y", dt, None)], inits)
                    compare(f"{op} {dname(dt)} zp {with_zp} scales {xs} {ys}", m,
                            [{"X": every_code(dt, sh)} for sh in ((1, 37, 7), (3, 5, 7), (2, 1001, 7))])


def test_qlinear_concat():
    cases = [([(2, 3, 5), (2, 4, 5)], 1), ([(1, 7), (3, 7), (2, 7)], 0), ([(2, 3, 5), (2, 3, 1), (2, 3, 9)], -1),
             ([(4, 1, 33), (4, 2, 33)], 1), ([(3,), (5,)], 0)]
    for dt in (np.uint8, np.int8):
        for with_zp in (True, False):
            for shapes, axis in cases:
                # the first input shares Y's parameters (copied), the others are requantized
                ys = 0.05
                yz = rand_int(dt, lo=-20 if dt == np.int8 else 100, hi=20 if dt == np.int8 else 140)
                ins, inits = ["ys", "yz" if with_zp else ""], [init("ys", np.float32(ys))]
                if with_zp:
                    inits.append(init("yz", yz))
                inputs, feeds = [], {}
                for k, sh in enumerate(shapes):
                    sc = ys if k == 0 else [0.2, 0.011, 0.08][k % 3]  # 0.2: saturates
                    ins += [f"x{k}", f"s{k}", f"z{k}" if with_zp else ""]
                    inits.append(init(f"s{k}", np.float32(sc)))
                    if with_zp:
                        inits.append(init(f"z{k}", yz if k == 0 else rand_int(dt)))
                    inputs.append(vi(f"x{k}", dt, list(sh)))
                    feeds[f"x{k}"] = rand_int(dt, *sh)
                m = model([helper.make_node("QLinearConcat", ins, ["Y"], domain=MS, axis=axis)], inputs,
                          [vi("Y", dt, None)], inits)
                compare(f"QLinearConcat {dname(dt)} zp {with_zp} {shapes} axis {axis}", m, [feeds])


def test_qlinear_global_pool():
    for dt in (np.uint8, np.int8):
        for with_zp in (True, False):
            for last in (0, 1):
                for shape in ((2, 5, 7, 7), (1, 3, 1, 1), (3, 17, 4, 9), (2, 4, 33), (1, 6, 3, 4, 5), (2, 8, 40, 40)):
                    ins, inits = q8_params(dt, with_zp, [("x", 0.05), ("y", 0.02)])
                    m = model([helper.make_node("QLinearGlobalAveragePool", ["X"] + ins, ["Y"], domain=MS,
                                                channels_last=last)], [vi("X", dt, list(shape))], [vi("Y", dt, None)], inits)
                    compare(f"QLinearGlobalAveragePool {dname(dt)} zp {with_zp} channels_last {last} {shape}", m,
                            [{"X": rand_int(dt, *shape)}])
    # one session, several batch sizes and images
    ins, inits = q8_params(np.uint8, True, [("x", 0.03), ("y", 0.004)])  # 0.004: saturates
    m = model([helper.make_node("QLinearGlobalAveragePool", ["X"] + ins, ["Y"], domain=MS)],
              [vi("X", np.uint8, ["n", 6, "h", "w"])], [vi("Y", np.uint8, None)], inits)
    compare("QLinearGlobalAveragePool several shapes", m,
            [{"X": rand_int(np.uint8, n, 6, h, w)} for n, h, w in ((1, 1, 1), (4, 13, 9), (2, 64, 64))])


def test_qlinear_avgpool():
    cases = [((1, 3, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
             ((2, 5, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
             ((2, 5, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
             ((1, 4, 7, 10), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 1, 1], "ceil_mode": 1}),
             ((3, 2, 17), {"kernel_shape": [4], "strides": [3], "pads": [2, 1]}),
             ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "pads": [1, 0, 1, 0, 1, 1]}),
             ((2, 3, 10, 9), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"})]
    for dt in (np.uint8, np.int8):
        for with_zp in (True, False):
            for last in (0, 1):
                for shape, attrs in cases:
                    if last:  # the same geometry on [N, spatial..., C]
                        shape = (shape[0],) + shape[2:] + (shape[1],)
                    ins, inits = q8_params(dt, with_zp, [("x", 0.04), ("y", 0.03 if with_zp else 0.007)])
                    m = model([helper.make_node("QLinearAveragePool", ["X"] + ins, ["Y"], domain=MS, channels_last=last,
                                                **attrs)], [vi("X", dt, list(shape))], [vi("Y", dt, None)], inits)
                    compare(f"QLinearAveragePool {dname(dt)} zp {with_zp} channels_last {last} {shape} {attrs}", m,
                            [{"X": rand_int(dt, *shape)}])


def test_qlinear_softmax():
    cases = [((2, 3, 5), -1, 13), ((1, 4, 1, 1), -1, 13), ((2, 4, 7, 7), 3, 13), ((3, 6), 1, 12), ((2, 5, 3), 1, 13),
             ((2, 3, 4), 1, 12), ((1, 2, 9, 37), -1, 13), ((4, 1), -1, 13), ((3, 300), 1, 1), ((2, 3, 129), 2, 13)]
    for dt in (np.uint8, np.int8):
        for shape, axis, opset in cases:
            for xs, ys, zp in ((0.05, 1 / 256, None), (0.3, 1 / 255, None), (0.01, 0.004, None), (0.1, 1 / 300, 20)):
                yz = np.array(zp if zp is not None else (0 if dt == np.uint8 else -128), dt)  # 1/300, 20: saturates
                node = helper.make_node("QLinearSoftmax", ["X", "xs", "xz", "ys", "yz"], ["Y"], domain=MS, axis=axis,
                                        opset=opset)
                inits = [init("xs", np.float32(xs)), init("xz", rand_int(dt)), init("ys", np.float32(ys)), init("yz", yz)]
                m = model([node], [vi("X", dt, list(shape))], [vi("Y", dt, None)], inits)
                compare(f"QLinearSoftmax {dname(dt)} {shape} axis {axis} opset {opset} xs {xs} ys {ys:.4g}", m,
                        [{"X": rand_int(dt, *shape)}])
    # one session, several shapes
    node = helper.make_node("QLinearSoftmax", ["X", "xs", "", "ys", "yz"], ["Y"], domain=MS, axis=-1, opset=13)
    inits = [init("xs", np.float32(0.08)), init("ys", np.float32(1 / 256)), init("yz", np.uint8(0))]
    m = model([node], [vi("X", np.uint8, ["b", "s", "t"])], [vi("Y", np.uint8, None)], inits)
    compare("QLinearSoftmax several shapes", m, [{"X": rand_int(np.uint8, b, s, t)} for b, s, t in ((1, 1, 1), (2, 7, 64), (3, 33, 1000))])


# ---------------------------------------------------------------- QAttention

def test_qattention():
    cases = [(1, 5, 16, 2, None, 0, 0), (2, 7, 32, 4, "1d", 0, 0), (3, 1, 16, 4, "2b", 0, 0), (2, 6, 24, 3, "2d", 1, 0),
             (2, 5, 32, 2, "3d", 0, 0), (2, 3, 16, 2, None, 0, 4), (1, 9, 64, 4, "1d", 1, 0), (4, 33, 48, 6, "2d", 0, 0)]
    for xdt, wdt in ((np.uint8, np.int8), (np.uint8, np.uint8)):
        for per_col in (False, True):
            for B, S, Hin, N, mask, uni, P in cases:
                D = Hin
                wsh = (3 * D,) if per_col else ()
                wz = rand_int(wdt, *wsh) if wdt == np.uint8 else rand_int(wdt, *wsh, lo=-3, hi=3)
                inits = [init("W", rand_int(wdt, Hin, 3 * D)), init("bias", rand(3 * D, scale=0.1)),
                         init("xs", np.float32(0.02)), init("ws", rng.uniform(0.003, 0.01, wsh).astype(np.float32)),
                         init("xz", rand_int(xdt)), init("wz", wz)]
                feeds = {"X": rand_int(xdt, B, S, Hin)}
                inputs = [vi("X", xdt, [B, S, Hin])]
                ins = ["X", "W", "bias", "xs", "ws", "", "xz", "wz"]
                T = P + S
                if mask:
                    ins[5] = "mask"
                    mv = {"1d": lambda: rng.integers(1, T + 1, B),
                          "2b": lambda: np.concatenate([rng.integers(1, T + 1, B), rng.integers(0, 1, B)]),
                          "2d": lambda: (rng.random((B, T)) < 0.8).astype(np.int64) | np.eye(1, T, 0, dtype=np.int64),
                          "3d": lambda: (rng.random((B, S, T)) < 0.8).astype(np.int64) | np.eye(1, T, 0, dtype=np.int64)}[mask]()
                    feeds["mask"] = np.asarray(mv).astype(np.int32)
                    inputs.append(vi("mask", np.int32, list(feeds["mask"].shape)))
                outs = [vi("Y", np.float32, None)]
                if P:
                    ins.append("past")
                    feeds["past"] = rand(2, B, N, P, D // N)
                    inputs.append(vi("past", np.float32, [2, B, N, P, D // N]))
                    outs.append(vi("present", np.float32, None))
                node = helper.make_node("QAttention", ins, ["Y"] + (["present"] if P else []), domain=MS, num_heads=N,
                                        unidirectional=uni)
                m = model([node], inputs, outs, inits)
                compare(f"QAttention {dname(xdt)}x{dname(wdt)} per_col {per_col} B{B} S{S} H{Hin} heads{N} mask {mask} "
                        f"uni {uni} past {P}", m, [feeds], rtol=1e-4, atol=1e-5)


def test_dqlstm_refused():
    S, B, I, H = 5, 2, 6, 4
    G = 4 * H
    inits = [init("W", rand_int(np.int8, 1, I, G)), init("R", rand_int(np.int8, 1, H, G)), init("ws", scales(1)),
             init("wz", np.zeros(1, np.int8)), init("rs", scales(1)), init("rz", np.zeros(1, np.int8))]
    node = helper.make_node("DynamicQuantizeLSTM", ["X", "W", "R", "", "", "", "", "", "ws", "wz", "rs", "rz"], ["Y"],
                            domain=MS, hidden_size=H)
    m = model([node], [vi("X", np.float32, [S, B, I])], [vi("Y", np.float32, None)], inits)
    compare("DynamicQuantizeLSTM (refused)", m, [{"X": rand(S, B, I)}], on_gpu=False, rtol=1e-5)


# ---------------------------------------------------------------- whole quantized models

def conv_net():
    """Conv -> Relu -> Conv -> Add (residual) -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax."""
    inits = [init("W1", rand(8, 3, 3, 3, scale=0.3)), init("B1", rand(8, scale=0.1)),
             init("W2", rand(8, 8, 3, 3, scale=0.2)), init("B2", rand(8, scale=0.1)),
             init("WG", rand(10, 8, scale=0.3)), init("BG", rand(10, scale=0.1))]
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["a2"]),
             helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "WG", "BG"], ["z"], transB=1),
             helper.make_node("Softmax", ["z"], ["y"], axis=1)]
    m = model(nodes, [vi("x", np.float32, ["n", 3, 12, 12])], [vi("y", np.float32, None)], inits, 13)
    return m, [{"x": rand(n, 3, 12, 12)} for n in (1, 2, 5)]


def mlp():
    """MatMul -> Add -> Relu -> MatMul -> Add (residual) -> LayerNorm-free encoder-like MLP on [b, s, 32]."""
    H, F = 32, 64
    inits = [init("W1", rand(H, F, scale=H ** -0.5)), init("B1", rand(F, scale=0.1)),
             init("W2", rand(F, H, scale=F ** -0.5)), init("B2", rand(H, scale=0.1)),
             init("W3", rand(H, 5, scale=H ** -0.5))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m1"]), helper.make_node("Add", ["m1", "B1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]), helper.make_node("MatMul", ["r1", "W2"], ["m2"]),
             helper.make_node("Add", ["m2", "B2"], ["a2"]), helper.make_node("Add", ["a2", "x"], ["h"]),
             helper.make_node("MatMul", ["h", "W3"], ["y"])]
    m = model(nodes, [vi("x", np.float32, ["b", "s", H])], [vi("y", np.float32, None)], inits, 13)
    return m, [{"x": rand(b, s, H)} for b, s in ((1, 1), (2, 7), (3, 33))]


def quantized(m, feeds, how):
    """m through onnxruntime.quantization: 'dynamic', 'qdq' or 'qop' (static, calibrated on feeds)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
    import onnx
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f32.onnx"), os.path.join(d, "q.onnx")
        onnx.save(m, src)
        if how == "dynamic":
            quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        else:
            class Reader(CalibrationDataReader):
                def __init__(self):
                    self.it = iter([{k: rand(*v.shape) for k, v in f.items()} for f in feeds for _ in range(2)])

                def get_next(self):
                    return next(self.it, None)

            quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ if how == "qdq" else QuantFormat.QOperator,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
        return onnx.load(dst)


def test_models():
    try:
        import onnxruntime.quantization  # noqa: F401
    except ImportError:
        print("note: onnxruntime.quantization missing, whole-model checks skipped")
        return
    for mname, build in (("conv net", conv_net), ("MLP", mlp)):
        m32, feeds = build()
        for how in ("dynamic", "qdq", "qop"):
            name = f"{mname} {how}"
            try:
                qm = quantized(m32, feeds, how)
            except Exception as e:  # noqa: BLE001 - the quantizer's own failure
                check(f"{name}: quantize", False, repr(e))
                continue
            blob = qm.SerializeToString()
            try:
                gpu = kiln.Session(blob, provider=PROVIDER)
            except kiln.KilnError as e:
                check(f"{name}: create {PROVIDER} session", False, str(e))
                continue
            ref = kiln.Session(blob, unoptimized=True, provider="cpu")
            cpu = kiln.Session(blob, provider="cpu")
            ops = sorted({n.op_type for n in qm.graph.node})
            if PROVIDER == "cuda":
                off = [(nm, op) for nm, op, prov in gpu.nodes() if prov != "cuda"]
                check(f"{name} ({' '.join(ops)}): every node on the GPU", not off, f"not on the GPU: {off}")
            for f in feeds:
                label = f"{name} x={f['x'].shape}"
                try:
                    got = gpu.run(f)
                except kiln.KilnError as e:
                    check(label, False, f"{PROVIDER} session failed: {e}")
                    continue
                # the reference follows the same operations: equal up to float32 rounding; the CPU
                # provider's fused int8 kernels may round a value to the next step
                close(f"{label} vs reference", got, ref.run(f), 1e-4, 1e-5)
                close(f"{label} vs CPU provider", got, cpu.run(f), 3e-2, 3e-2)


def main():
    if skip_without(PROVIDER):
        return 0
    if "qdq" in PARTS:
        test_quantize()
        test_dequantize()
        test_ms_qdq()
    if "dyn" in PARTS:
        test_dynamic_quantize()
    if "mm" in PARTS:
        test_matmul_integer()
        test_matmul_integer_to_float()
        test_dynamic_quantize_matmul()
        test_qlinear_matmul()
        test_qgemm()
    if "conv" in PARTS:
        test_conv_integer()
        test_qlinear_conv()
    if "ew" in PARTS:
        test_qlinear_binary()
        test_qlinear_unary()
        test_qlinear_concat()
    if "pool" in PARTS:
        test_qlinear_global_pool()
        test_qlinear_avgpool()
        test_qlinear_softmax()
    if "attn" in PARTS:
        test_qattention()
        test_dqlstm_refused()
    if "model" in PARTS:
        test_models()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
