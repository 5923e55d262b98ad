#!/usr/bin/env python3
"""Generates kiln's test and demo models (random weights, real architectures) with onnx.helper.

usage: make_models.py OUT_DIR

  encoder.onnx  tokens int64 [batch, seq] -> hidden [batch, seq, 64], pooled [batch, 64]:
                embedding, positional table sliced to seq through Shape->Gather->Slice,
                2 attention blocks with Shape-derived Reshapes, LayerNorm, GELU MLP.
  convnet.onnx  image float [batch, H, W, 3] (NHWC) -> Transpose to NCHW, strided Convs,
                Resize 2x nearest, Concat skip connection, Conv head; output [batch, 8, H', W'].
  mlp.onnx      x float [batch, 32] -> Gemm, Relu, MatMul, Softmax -> probs [batch, 10].
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
rng = np.random.default_rng(0)


def init(name, shape, scale=0.1, dtype=np.float32):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(dtype), name)


def const_i64(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


class Builder:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def tmp(self, hint):
        self.n += 1
        return f"{hint}_{self.n}"

    def op(self, op_type, inputs, hint=None, n_out=1, **attrs):
        outs = [self.tmp(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.tmp(op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def weight(self, name, shape, scale=0.1):
        self.inits.append(init(name, shape, scale))
        return name

    def ints(self, name, values):
        self.inits.append(const_i64(name, values))
        return name


def encoder(d=64, heads=4, vocab=100, max_len=512, layers=2):
    b = Builder()
    hd = d // heads
    emb = b.weight("embedding", (vocab, d), 1.0)
    pos = b.weight("positions", (max_len, d), 0.5)
    x = b.op("Gather", [emb, "tokens"], "embedded")
    shape = b.op("Shape", ["tokens"], "tok_shape")
    seq = b.op("Gather", [shape, b.ints("one", [1])], "seq")            # [1]
    batch = b.op("Gather", [shape, b.ints("zero", [0])], "batch")       # [1]
    p = b.op("Slice", [pos, b.ints("start0", [0]), seq, b.ints("axis0", [0])], "pos_slice")
    x = b.op("Add", [x, p], "x")
    heads_shape = b.op("Concat", [batch, seq, b.ints("heads_hd", [heads, hd])], "heads_shape", axis=0)
    model_shape = b.op("Concat", [batch, seq, b.ints("d_model", [d])], "model_shape", axis=0)
    b.inits.append(numpy_helper.from_array(np.array(1.0 / np.sqrt(hd), np.float32), "scale"))
    scale = "scale"
    for i in range(layers):
        b.inits.append(numpy_helper.from_array((1 + rng.standard_normal(d) * 0.1).astype(np.float32), f"ln{i}_g"))
        g = f"ln{i}_g"
        beta = b.weight(f"ln{i}_b", (d,), 0.1)
        h = b.op("LayerNormalization", [x, g, beta], "ln", axis=-1, epsilon=1e-5)
        qkv = []
        for t in "qkv":
            w = b.weight(f"w{t}{i}", (d, d), 1.0 / np.sqrt(d))
            y = b.op("MatMul", [h, w], t)
            y = b.op("Reshape", [y, heads_shape], t + "_heads")
            qkv.append(b.op("Transpose", [y], t + "_t", perm=[0, 2, 1, 3]))
        q, k, v = qkv
        kt = b.op("Transpose", [k], "kt", perm=[0, 1, 3, 2])
        s = b.op("Mul", [b.op("MatMul", [q, kt], "scores"), scale], "scaled")
        a = b.op("Softmax", [s], "attn", axis=-1)
        o = b.op("Transpose", [b.op("MatMul", [a, v], "ctx")], "ctx_t", perm=[0, 2, 1, 3])
        o = b.op("Reshape", [o, model_shape], "ctx_flat")
        o = b.op("MatMul", [o, b.weight(f"wo{i}", (d, d), 1.0 / np.sqrt(d))], "proj")
        x = b.op("Add", [x, o], "res1")
        m = b.op("MatMul", [x, b.weight(f"w1_{i}", (d, 2 * d), 1.0 / np.sqrt(d))], "ff1")
        m = b.op("Add", [m, b.weight(f"b1_{i}", (2 * d,), 0.1)], "ff1b")
        m = b.op("Relu", [m], "ff1r")
        m = b.op("MatMul", [m, b.weight(f"w2_{i}", (2 * d, d), 1.0 / np.sqrt(2 * d))], "ff2")
        x = b.op("Add", [x, m], "res2")
    b.nodes[-1].output[0] = "hidden"
    pooled = b.op("ReduceMean", ["hidden"], "pooled", axes=[1], keepdims=0)
    b.nodes[-1].output[0] = "pooled"
    graph = helper.make_graph(
        b.nodes, "encoder",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", d]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", d])],
        b.inits)
    return graph


def convnet():
    b = Builder()
    x = b.op("Transpose", ["image"], "nchw", perm=[0, 3, 1, 2])
    c1 = b.op("Relu", [b.op("Conv", [x, b.weight("c1w", (8, 3, 3, 3), 0.3), b.weight("c1b", (8,))], "c1",
                                pads=[1, 1, 1, 1], strides=[2, 2])], "c1r")
    c2 = b.op("Relu", [b.op("Conv", [c1, b.weight("c2w", (8, 8, 3, 3), 0.2), b.weight("c2b", (8,))], "c2",
                                pads=[1, 1, 1, 1], strides=[2, 2])], "c2r")
    b.inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales"))
    up = b.op("Resize", [c2, "", "up_scales"], "up", mode="nearest")
    # the upsampled map is c1's size rounded up to even: crop it to c1's size
    c1_shape = b.op("Shape", [c1], "c1_shape")
    hw = b.op("Slice", [c1_shape, b.ints("s2", [2]), b.ints("s4", [4])], "c1_hw")
    upc = b.op("Slice", [up, b.ints("zz", [0, 0]), hw, b.ints("ax23", [2, 3])], "up_crop")
    cat = b.op("Concat", [c1, upc], "skip", axis=1)
    out = b.op("Conv", [cat, b.weight("c3w", (8, 16, 1, 1), 0.2)], "head")
    b.nodes[-1].output[0] = "features"
    graph = helper.make_graph(
        b.nodes, "convnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", "H", "W", 3])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8, "H2", "W2"])],
        b.inits)
    return graph


def mlp():
    b = Builder()
    h = b.op("Relu", [b.op("Gemm", ["x", b.weight("w1", (32, 64)), b.weight("b1", (64,))], "fc1")], "fc1r")
    logits = b.op("MatMul", [h, b.weight("w2", (64, 10), 0.3)], "logits")
    b.op("Softmax", [logits], "probs", axis=-1)
    b.nodes[-1].output[0] = "probs"
    graph = helper.make_graph(
        b.nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
        b.inits)
    return graph


def save(graph, path):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kiln")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    save(encoder(), os.path.join(out, "encoder.onnx"))
    save(convnet(), os.path.join(out, "convnet.onnx"))
    save(mlp(), os.path.join(out, "mlp.onnx"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
