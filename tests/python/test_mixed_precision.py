"""test_mixed_precision.py - what exporters of half-precision models write, on kiln's CPU
reference and optimized kernels against ONNX Runtime: LayerNormalization (and RMSNormalization)
with parameters of another float type than X (float32 X with float16 Scale and B, and the
reverse; Y follows X, "Y: T"), and a small fp16 BERT-like layer in torch.onnx.export's
patterns (tests/common/fp16_bert.py). ONNX Runtime refuses the mixed node (its type check binds
T once), so its reference is the same graph with the parameters cast to X's type first.

usage: python3 -m pytest -q tests/python   (libkiln.so from $KILN_LIB or build/)"""
import os
import sys

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
if not os.environ.get("KILN_TEST_INSTALLED"):
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import fp16_bert  # noqa: E402
import kiln  # noqa: E402

NP = {T.FLOAT: np.float32, T.FLOAT16: np.float16}


def norm_model(op, x_t, p_t, cast, stats=False, axis=-1, scale_shape=(4, 8), bias=True):
    opset = 23 if op == "RMSNormalization" else 17
    x = h.make_tensor_value_info("x", x_t, ["a", 4, 8])
    outs = [h.make_tensor_value_info("y", x_t, None)]
    if stats:
        outs += [h.make_tensor_value_info("mean", T.FLOAT, None), h.make_tensor_value_info("inv", T.FLOAT, None)]
    rng = np.random.default_rng(3)
    inits = [nh.from_array((1 + 0.3 * rng.standard_normal(scale_shape)).astype(NP[p_t]), "s")]
    names = ["s"]
    if bias and op == "LayerNormalization":
        inits.append(nh.from_array(rng.standard_normal(scale_shape).astype(NP[p_t]), "b"))
        names.append("b")
    nodes = []
    if cast:
        nodes = [h.make_node("Cast", [nm], [nm + "_c"], to=x_t) for nm in names]
        names = [nm + "_c" for nm in names]
    nodes.append(h.make_node(op, ["x"] + names, [o.name for o in outs], axis=axis, epsilon=1e-4))
    g = h.make_graph(nodes, "norm", [x], outs, inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10).SerializeToString()


def sessions(blob):
    ref = kiln.SessionOptions()
    ref.graph_optimization_level = kiln.GraphOptimizationLevel.ORT_DISABLE_ALL
    return [kiln.InferenceSession(blob), kiln.InferenceSession(blob, ref)]


def test_onnx_runtime_refuses_the_mixed_node():
    blob = norm_model("LayerNormalization", T.FLOAT, T.FLOAT16, cast=False)
    with pytest.raises(Exception, match="bound to different types"):
        onnxruntime.InferenceSession(blob, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("x_t,p_t", [(T.FLOAT, T.FLOAT16), (T.FLOAT16, T.FLOAT)])
@pytest.mark.parametrize("stats,axis,scale_shape,bias", [(False, -1, (8,), True), (True, -1, (8,), True),
                                                         (False, 1, (4, 8), False), (True, -2, (1, 8), True)])
def test_layernorm_mixed_against_ort(x_t, p_t, stats, axis, scale_shape, bias):
    mixed = norm_model("LayerNormalization", x_t, p_t, False, stats, axis, scale_shape, bias)
    ort = onnxruntime.InferenceSession(norm_model("LayerNormalization", x_t, p_t, True, stats, axis, scale_shape,
                                                  bias), providers=["CPUExecutionProvider"])
    tol = 2e-3 if x_t == T.FLOAT16 else 1e-5  # float32 parameters are rounded to float16 in ORT's graph
    for s in sessions(mixed):
        assert s.get_outputs()[0].type == ("tensor(float16)" if x_t == T.FLOAT16 else "tensor(float)")
        for a in (3, 1, 6):
            x = np.random.default_rng(a).standard_normal((a, 4, 8)).astype(NP[x_t]) * 2 + 0.5
            got, want = s.run(None, {"x": x}), ort.run(None, {"x": x})
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("x_t,p_t", [(T.FLOAT, T.FLOAT16), (T.FLOAT16, T.FLOAT)])
def test_rmsnorm_mixed(x_t, p_t):
    mixed = norm_model("RMSNormalization", x_t, p_t, False, scale_shape=(8,))
    same = norm_model("RMSNormalization", x_t, p_t, True, scale_shape=(8,))
    x = np.random.default_rng(0).standard_normal((3, 4, 8)).astype(NP[x_t])
    want = kiln.InferenceSession(same).run(None, {"x": x})[0]
    for s in sessions(mixed):
        got = s.run(None, {"x": x})[0]
        assert got.dtype == NP[x_t]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=2e-3)


def test_fp16_bert_like_layer_against_ort():
    ort = onnxruntime.InferenceSession(fp16_bert.bert(mixed=False), providers=["CPUExecutionProvider"])
    for s in sessions(fp16_bert.bert(mixed=True)):
        assert s.get_outputs()[0].type == "tensor(float16)"
        for b, q in ((1, 8), (2, 13), (3, 1)):
            f = fp16_bert.feeds(b, q, seed=b * 100 + q)
            got, want = s.run(None, f)[0], ort.run(None, f)[0]
            assert got.dtype == np.float16 and got.shape == (b, q, fp16_bert.H)
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-2)
