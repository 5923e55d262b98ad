"""ort_int8.py - whether this machine's ONNX Runtime multiplies uint8 by int8 exactly, and the exact
ORT the int8 tests compare kiln with where it does not.

ORT's u8s8 GEMM (MLAS) sums int32 products on x86-64 with AVX-512 VNNI or AVX-VNNI: exact. On
AVX2 without VNNI (the AMD EPYCs, older Xeons) it multiplies with vpmaddubsw, which saturates each
pair of adjacent products at int16: [255, 255] . [127, 127] = 64770 comes back as 32767. Its u8u8,
s8s8 and s8u8 products are exact everywhere. kiln's integer products are exact on every CPU, so
on a saturating machine ORT's u8s8 results (MatMulInteger, QLinearMatMul, QLinearConv, QGemm,
MatMulIntegerToFloat, DynamicQuantizeMatMul, QAttention, DynamicQuantizeLSTM and the models made
of them) are not the expected values: an expected value must not depend on the CPU computing it.

There the tests compare with ORT computing the same products exactly, in the u8u8 form: an int8
operand q with zero point z is the uint8 operand q + 128 with zero point z + 128 (the same
differences q - z, so the same int32 sums and the same outputs as ORT on a VNNI machine):
  - constant int8 weights: ORT's own session option session.x64quantprecision = 1 (its
    Avx2WeightS8ToU8Transformer converts them so, DynamicQuantizeLSTM's W and R included; not for
    a model with an int8 x constant int8 op, exact as it is, for which ORT has no s8u8 kernel);
  - int8 operands fed at run time (MatMulInteger's or QLinearMatMul's B): `exact_form` rewrites
    the model and the feeds the same way.
Both forms are probed here before use; a machine where neither ORT is exact fails the tests.
On an exact machine nothing changes: ORT as it is, bit for bit.
"""
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

PRECISION_KEY = "session.x64quantprecision"

# (domain, op type) -> (index of the uint8 operand A or None when the op quantizes A to uint8
# itself, index of the 8-bit operand B, index of B's zero point)
U8S8_OPS = {
    ("", "MatMulInteger"): (0, 1, 3),
    ("", "QLinearMatMul"): (0, 3, 5),
    ("com.microsoft", "MatMulIntegerToFloat"): (0, 1, 5),
    ("com.microsoft", "DynamicQuantizeMatMul"): (None, 1, 3),
    ("com.microsoft", "QGemm"): (0, 3, 5),
    ("com.microsoft", "QAttention"): (0, 1, 7),
}
# ops whose int8 weights the session option converts too, besides U8S8_OPS
CONVERTED_OPS = {("", "QLinearConv"): (0, 3, 5)}

_state = {}


def _probe_model(bdt, const_b):
    """MatMulInteger A [2, 4] uint8 by B [4, 3] (constant or fed), no zero points."""
    B = helper.make_tensor_value_info("B", bdt, [4, 3])
    g = helper.make_graph([helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "probe",
                          [helper.make_tensor_value_info("A", TensorProto.UINT8, [2, 4])] + ([] if const_b else [B]),
                          [helper.make_tensor_value_info("Y", TensorProto.INT32, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _probe(bdt, const_b, precision=False):
    """Whether ORT's MatMulInteger of 255s by 127s (uint8 B: by 255s) is exact."""
    bnp = np.int8 if bdt == TensorProto.INT8 else np.uint8
    A, B = np.full((2, 4), 255, np.uint8), np.full((4, 3), np.iinfo(bnp).max, bnp)
    m = _probe_model(bdt, const_b)
    if const_b:
        m.graph.initializer.append(numpy_helper.from_array(B, "B"))
    so = ort.SessionOptions()
    if precision:
        so.add_session_config_entry(PRECISION_KEY, "1")
    feeds = {"A": A} if const_b else {"A": A, "B": B}
    y = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return np.array_equal(y, A.astype(np.int64) @ B.astype(np.int64))


def u8s8_exact():
    """True where ORT's uint8 x int8 products are exact (VNNI), False where they saturate (AVX2).
    Probed once per process through ORT itself; where they saturate, also checks that both exact
    forms above are exact here (RuntimeError otherwise: the tests then have nothing exact)."""
    if "exact" not in _state:
        exact = _probe(TensorProto.INT8, True) and _probe(TensorProto.INT8, False)
        if not exact:
            if not _probe(TensorProto.INT8, True, precision=True):
                raise RuntimeError(f"ORT saturates u8s8 products and {PRECISION_KEY}=1 does not make them exact")
            if not _probe(TensorProto.UINT8, False):
                raise RuntimeError("ORT saturates u8s8 products and its u8u8 ones are not exact either")
        _state["exact"] = exact
    return _state["exact"]


def mode():
    """One line saying what the int8 tests compare with on this machine."""
    if u8s8_exact():
        return "ORT u8s8: exact (VNNI): integer results compared with ORT's as they are"
    return (f"ORT u8s8: saturating (AVX2 without VNNI): compared with ORT computing them exactly, int8 weights as "
            f"uint8 + 128 ({PRECISION_KEY}=1; fed int8 operands shifted by the test)")


def announce():
    print(mode(), flush=True)


def _graph_types(g):
    types = {v.name: v.type.tensor_type.elem_type for v in g.input}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def _s8s8_const(m):
    """Whether model m has an op of int8 A by constant int8 B (the session option would make it
    s8u8, which ORT does not run)."""
    types, inits = _graph_types(m.graph), {t.name for t in m.graph.initializer}
    for node in m.graph.node:
        spec = {**U8S8_OPS, **CONVERTED_OPS}.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if spec and spec[0] is not None and len(node.input) > spec[1]:
            a, b = node.input[spec[0]], node.input[spec[1]]
            if types.get(a) == TensorProto.INT8 and b in inits and types.get(b) == TensorProto.INT8:
                return True
    return False


def session_options(so=None, model=None):
    """so (or new SessionOptions) for an ORT whose results the tests expect: on a saturating
    machine with constant int8 weights computed as uint8 (exact), unless `model` (bytes, a path
    or a ModelProto) has an int8 x constant int8 op; else as given."""
    so = so or ort.SessionOptions()
    if not u8s8_exact():
        if isinstance(model, (bytes, str)):
            model = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model, load_external_data=False)
        if model is None or not _s8s8_const(model):
            so.add_session_config_entry(PRECISION_KEY, "1")
    return so


def exact_form(blob, feeds_list):
    """(blob, feeds_list) for ORT to compute exactly: on a saturating machine, every int8 graph
    input that a u8s8 op of U8S8_OPS takes as its B becomes uint8, fed + 128, with that op's zero
    point + 128 (a new initializer; 128 where it had none). Unchanged on an exact machine."""
    if u8s8_exact():
        return blob, feeds_list
    m = onnx.load_from_string(blob)
    g = m.graph
    types = _graph_types(g)
    inits = {t.name: t for t in g.initializer}
    shifted = set()
    for i, node in enumerate(g.node):
        spec = U8S8_OPS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if not spec or len(node.input) <= spec[1]:
            continue
        ai, bi, zi = spec
        b = node.input[bi]
        if b in inits or types.get(b) != TensorProto.INT8:
            continue  # constant weights: the session option
        if ai is not None and types.get(node.input[ai]) != TensorProto.UINT8:
            continue  # s8s8 / s8u8: exact as it is
        z = node.input[zi] if len(node.input) > zi else ""
        if z and z not in inits:
            raise NotImplementedError(f"{node.op_type}: B's zero point {z} is fed; no exact form written for it")
        zv = numpy_helper.to_array(inits[z]).astype(np.int16) if z else np.zeros((), np.int16)
        name = f"{b}_zero_point_u8_{i}"
        g.initializer.append(numpy_helper.from_array((zv + 128).astype(np.uint8), name))
        while len(node.input) <= zi:
            node.input.append("")
        node.input[zi] = name
        shifted.add(b)
    for v in g.input:
        if v.name in shifted:
            v.type.tensor_type.elem_type = TensorProto.UINT8
    shift = lambda k, v: (v.astype(np.int16) + 128).astype(np.uint8) if k in shifted else v  # noqa: E731
    return m.SerializeToString(), [{k: shift(k, v) for k, v in f.items()} for f in feeds_list]
