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
  - `exact_form` rewrites the model (and the feeds) so: the int8 B of every u8s8 op of U8S8_OPS,
    constant or fed, and the int8 constants of DequantizeLinear (QDQ files' weights);
  - `session_options` adds ORT's own session.x64quantprecision = 1 (its Avx2WeightS8ToU8Transformer
    converts the same way) for what a rewrite cannot express: DynamicQuantizeLSTM's W and R (its
    kernel takes int8 ones only at load); not for a model with an int8 x constant int8 op, exact
    as it is and without an s8u8 kernel. (For the other ops the option is no stand-in: it makes
    QGemm's weights uint8, which ORT has no kernel for, and fails on QDQ files sharing a zero point.)
Both are probed here before use; a machine where neither ORT is exact fails the tests. On an
exact machine nothing changes: ORT as it is, bit for bit.
"""
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

PRECISION_KEY = "session.x64quantprecision"

# (domain, op type) -> (index of the uint8 operand A or None when the op quantizes A to uint8
# itself, index of A's zero point, index of the 8-bit operand B, index of B's zero point)
U8S8_OPS = {
    ("", "MatMulInteger"): (0, 2, 1, 3),
    ("", "QLinearMatMul"): (0, 2, 3, 5),
    ("", "QLinearConv"): (0, 2, 3, 5),
    ("com.microsoft", "MatMulIntegerToFloat"): (0, 4, 1, 5),
    ("com.microsoft", "DynamicQuantizeMatMul"): (None, None, 1, 3),
    ("com.microsoft", "QGemm"): (0, 2, 3, 5),
    ("com.microsoft", "QAttention"): (0, 6, 1, 7),
}

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
    Probed once per process through ORT itself; where they saturate, also checks that the exact
    forms above are exact here: u8u8 products, constant and fed, and the session option taking
    effect (RuntimeError otherwise: the tests would have nothing exact to compare with)."""
    if "exact" not in _state:
        exact = _probe(TensorProto.INT8, True) and _probe(TensorProto.INT8, False)
        if not exact:
            if not (_probe(TensorProto.UINT8, True) and _probe(TensorProto.UINT8, False)):
                raise RuntimeError("ORT saturates u8s8 products and its u8u8 ones are not exact either")
            if not _probe(TensorProto.INT8, True, precision=True):
                raise RuntimeError(f"ORT saturates u8s8 products and {PRECISION_KEY}=1 does not make them exact")
        _state["exact"] = exact
    return _state["exact"]


def mode():
    """One line saying what the int8 tests compare with on this machine."""
    if u8s8_exact():
        return "ORT u8s8: exact (VNNI): integer results compared with ORT's as they are"
    return ("ORT u8s8: saturating (AVX2 without VNNI): compared with ORT computing them exactly as u8u8, the int8 "
            f"operand as uint8 + 128 (rewritten by the test; DynamicQuantizeLSTM's by {PRECISION_KEY}=1)")


def announce():
    print(mode(), flush=True)


def _graph_types(g):
    types = {v.name: v.type.tensor_type.elem_type for v in g.input}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def _spec(node):
    spec = U8S8_OPS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
    return spec if spec and len(node.input) > spec[2] else None


def _a_type(node, spec, types):
    """A's element type: its own where known, else its zero point's (the same type), else None;
    uint8 for an op that quantizes A itself."""
    ai, azi = spec[0], spec[1]
    if ai is None:
        return TensorProto.UINT8
    t = types.get(node.input[ai])
    if t is None and azi is not None and len(node.input) > azi:
        t = types.get(node.input[azi])
    return t


def _s8s8_const(m):
    """Whether model m has an op of int8 A by constant int8 B (the session option would make it
    s8u8, which ORT does not run)."""
    types, inits = _graph_types(m.graph), {t.name for t in m.graph.initializer}
    for node in m.graph.node:
        spec = _spec(node)
        if spec and _a_type(node, spec, types) == TensorProto.INT8:
            b = node.input[spec[2]]
            if b in inits and types.get(b) == TensorProto.INT8:
                return True
    return False


def _load(model):
    if isinstance(model, onnx.ModelProto):
        return model
    return onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model)


def _needs_precision(m):
    """Constant int8 weights that only ORT's transformer converts: DynamicQuantizeLSTM's (its kernel
    takes int8 ones only at load)."""
    inits = {t.name: t.data_type for t in m.graph.initializer}
    return any(n.op_type == "DynamicQuantizeLSTM" and len(n.input) > 2 and inits.get(n.input[1]) == TensorProto.INT8
               for n in m.graph.node)


def session_options(so=None, model=None):
    """so (or new SessionOptions) for the ORT whose outputs the tests expect for `model` (bytes,
    a path or a ModelProto, as exact_form returned it): on a saturating machine with ORT's
    precision option where _needs_precision and no int8 x constant int8 op, else as given."""
    so = so or ort.SessionOptions()
    if not u8s8_exact():
        m = _load(model)
        if _needs_precision(m) and not _s8s8_const(m):
            so.add_session_config_entry(PRECISION_KEY, "1")
    return so


def exact_form(model, feeds_list=()):
    """(model, feeds_list) for ORT to compute exactly. On a saturating machine the model comes back
    serialized with, as uint8 + 128 with zero point + 128 (new initializers; 128 where a zero
    point was absent), the int8 B of each op of U8S8_OPS taking uint8 A (A's type its own or its
    zero point's; B constant, or a graph input retyped and fed + 128), and the int8 constant of
    each DequantizeLinear (the same float values: QDQ files' weights, which ORT fuses into u8s8 ops
    on such a machine). Unchanged on an exact machine."""
    if u8s8_exact():
        return model, feeds_list
    m = _load(model)
    g = m.graph
    types = _graph_types(g)
    try:
        inferred = onnx.shape_inference.infer_shapes(m).graph.value_info
        types.update({v.name: v.type.tensor_type.elem_type for v in inferred if v.name not in types})
    except Exception:  # types left unknown: A's zero point's then
        pass
    inits = {t.name: t for t in g.initializer}
    shifted, made = set(), {}

    def u8(name, shape=()):
        """The uint8 + 128 initializer of int8 initializer `name` ('' : 128 of `shape`)."""
        key = name or f"zero_point_128_{len(made)}"
        if key not in made:
            q = numpy_helper.to_array(inits[name]).astype(np.int16) if name else np.zeros(shape, np.int16)
            made[key] = f"{key}_u8"
            g.initializer.append(numpy_helper.from_array((q + 128).astype(np.uint8), made[key]))
        return made[key]

    def set_input(node, i, name):
        while len(node.input) <= i:
            node.input.append("")
        node.input[i] = name

    for node in g.node:
        if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
            x = node.input[0]
            z = node.input[2] if len(node.input) > 2 else ""
            if x not in inits or types.get(x) != TensorProto.INT8 or (z and z not in inits):
                continue
            shape = numpy_helper.to_array(inits[node.input[1]]).shape if not z and node.input[1] in inits else ()
            node.input[0] = u8(x)
            set_input(node, 2, u8(z, shape))
            continue
        spec = _spec(node)
        if not spec or types.get(node.input[spec[2]]) != TensorProto.INT8:
            continue
        _, _, bi, zi = spec
        a_type = _a_type(node, spec, types)
        if a_type is None:
            raise NotImplementedError(f"{node.op_type} {node.name}: A's type not known; no exact form written for it")
        if a_type != TensorProto.UINT8:
            continue  # s8s8: exact as it is
        b, z = node.input[bi], node.input[zi] if len(node.input) > zi else ""
        if z and z not in inits:
            raise NotImplementedError(f"{node.op_type}: B's zero point {z} is not constant; no exact form written for it")
        if b in inits:
            node.input[bi] = u8(b)
        else:
            shifted.add(b)
        set_input(node, zi, u8(z))
    for v in g.input:
        if v.name in shifted:
            v.type.tensor_type.elem_type = TensorProto.UINT8
    unused = (set(made) & set(inits)) - _used(g)
    kept = [t for t in g.initializer if t.name not in unused]
    del g.initializer[:]
    g.initializer.extend(kept)
    shift = lambda k, v: (v.astype(np.int16) + 128).astype(np.uint8) if k in shifted else v  # noqa: E731
    return m.SerializeToString(), [{k: shift(k, v) for k, v in f.items()} for f in feeds_list]


def _used(g):
    """Every name the nodes of g and of its subgraphs read."""
    names = set()
    for node in g.node:
        names.update(node.input)
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                names |= _used(sub)
    return names


def expected_session(model, so=None):
    """The ORT session whose outputs the tests expect for `model` (bytes or a path): on
    exact_form's model with session_options (so's settings kept). Feeds of the inputs exact_form
    retypes must go through exact_form as well."""
    model, _ = exact_form(model)
    return ort.InferenceSession(model, session_options(so, model), providers=["CPUExecutionProvider"])
