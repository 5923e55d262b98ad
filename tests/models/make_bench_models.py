#!/usr/bin/env python3
"""Generates the CPU benchmark models of the performance work (random weights, real
architectures, symbolic batch / sequence / image dims) with onnx.helper.

usage: make_bench_models.py OUT_DIR

  resnet50.onnx      image float [batch, 3, H, W] -> logits [batch, 1000] (bottleneck blocks,
                     BatchNormalization, global average pool)
  mobilenetv2.onnx   image float [batch, 3, H, W] -> logits [batch, 1000] (inverted residuals,
                     depthwise convolutions, Clip(0, 6))
  bert_base.onnx     input_ids, attention_mask int64 [batch, seq] -> hidden [batch, seq, 768]
                     (12 layers, 12 heads, FFN 3072, exact GELU)
  minilm_l6.onnx     the same with 6 layers, hidden 384, FFN 1536
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)


class Graph:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, hint):
        self.n += 1
        return f"{hint}_{self.n}"

    def op(self, op_type, inputs, **attrs):
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(op_type), **attrs))
        return out

    def const(self, array, hint="w"):
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, shape, fan_in):
        return self.const((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32))


def conv_bn(g, x, c_in, c_out, k, stride=1, group=1, act="relu"):
    w = g.weight((c_out, c_in // group, k, k), c_in // group * k * k)
    y = g.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
    y = g.op("BatchNormalization", [y, g.const(np.ones(c_out, np.float32) + rng.standard_normal(c_out).astype(np.float32) * 0.1),
                                    g.const(rng.standard_normal(c_out).astype(np.float32) * 0.1),
                                    g.const(rng.standard_normal(c_out).astype(np.float32) * 0.1),
                                    g.const(np.abs(rng.standard_normal(c_out)).astype(np.float32) + 0.5)], epsilon=1e-5)
    if act == "relu":
        y = g.op("Relu", [y])
    elif act == "relu6":
        y = g.op("Clip", [y, g.const(np.array(0, np.float32)), g.const(np.array(6, np.float32))])
    return y


def classifier(g, x, c):
    x = g.op("GlobalAveragePool", [x])
    x = g.op("Flatten", [x], axis=1)
    return g.op("Gemm", [x, g.weight((c, 1000), c), g.const(np.zeros(1000, np.float32))])


def resnet50():
    g = Graph()
    x = conv_bn(g, "image", 3, 64, 7, 2)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for stage, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]):
        for b in range(blocks):
            s = stride if b == 0 else 1
            y = conv_bn(g, x, c_in, width, 1)
            y = conv_bn(g, y, width, width, 3, s)
            y = conv_bn(g, y, width, width * 4, 1, act=None)
            short = x if (b > 0) else conv_bn(g, x, c_in, width * 4, 1, s, act=None)
            x = g.op("Relu", [g.op("Add", [y, short])])
            c_in = width * 4
    return g, classifier(g, x, c_in), [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, "H", "W"])]


def mobilenetv2():
    g = Graph()
    x = conv_bn(g, "image", 3, 32, 3, 2, act="relu6")
    c_in = 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            y = x if t == 1 else conv_bn(g, x, c_in, hidden, 1, act="relu6")
            y = conv_bn(g, y, hidden, hidden, 3, stride, group=hidden, act="relu6")
            y = conv_bn(g, y, hidden, c, 1, act=None)
            x = g.op("Add", [x, y]) if stride == 1 and c_in == c else y
            c_in = c
    x = conv_bn(g, x, c_in, 1280, 1, act="relu6")
    return g, classifier(g, x, 1280), [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, "H", "W"])]


def encoder(layers, d, heads, ffn, vocab=30522, max_len=512):
    g = Graph()
    hd = d // heads
    x = g.op("Gather", [g.const((rng.standard_normal((vocab, d)) * 0.02).astype(np.float32)), "input_ids"])
    shape = g.op("Shape", ["input_ids"])
    seq = g.op("Gather", [shape, g.const(np.array([1], np.int64))])
    batch = g.op("Gather", [shape, g.const(np.array([0], np.int64))])
    pos = g.op("Slice", [g.const((rng.standard_normal((max_len, d)) * 0.02).astype(np.float32)),
                         g.const(np.array([0], np.int64)), seq, g.const(np.array([0], np.int64))])
    x = g.op("Add", [x, pos])
    one = g.const(np.ones(d, np.float32))
    zero = g.const(np.zeros(d, np.float32))
    x = g.op("LayerNormalization", [x, one, zero], axis=-1, epsilon=1e-12)
    # additive mask [batch, 1, 1, seq]: 0 where attended, -10000 where padded
    m = g.op("Cast", [g.op("Unsqueeze", ["attention_mask", g.const(np.array([1, 2], np.int64))])], to=TensorProto.FLOAT)
    m = g.op("Mul", [g.op("Sub", [g.const(np.array(1, np.float32)), m]), g.const(np.array(-10000, np.float32))])
    heads_shape = g.op("Concat", [batch, seq, g.const(np.array([heads, hd], np.int64))], axis=0)
    model_shape = g.op("Concat", [batch, seq, g.const(np.array([d], np.int64))], axis=0)
    scale = g.const(np.array(1 / np.sqrt(hd), np.float32))
    for _ in range(layers):
        qkv = []
        for _t in "qkv":
            y = g.op("Add", [g.op("MatMul", [x, g.weight((d, d), d)]), g.const(np.zeros(d, np.float32))])
            qkv.append(g.op("Transpose", [g.op("Reshape", [y, heads_shape])], perm=[0, 2, 1, 3]))
        q, k, v = qkv
        s = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale]), m])
        a = g.op("Softmax", [s], axis=-1)
        o = g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [a, v])], perm=[0, 2, 1, 3]), model_shape])
        o = g.op("Add", [g.op("MatMul", [o, g.weight((d, d), d)]), g.const(np.zeros(d, np.float32))])
        x = g.op("LayerNormalization", [g.op("Add", [x, o]), one, zero], axis=-1, epsilon=1e-12)
        h = g.op("Add", [g.op("MatMul", [x, g.weight((d, ffn), d)]), g.const(np.zeros(ffn, np.float32))])
        h = g.op("Mul", [g.op("Mul", [h, g.const(np.array(0.5, np.float32))]),
                         g.op("Add", [g.op("Erf", [g.op("Div", [h, g.const(np.array(np.sqrt(2), np.float32))])]),
                                      g.const(np.array(1, np.float32))])])
        h = g.op("Add", [g.op("MatMul", [h, g.weight((ffn, d), ffn)]), g.const(np.zeros(d, np.float32))])
        x = g.op("LayerNormalization", [g.op("Add", [x, h]), one, zero], axis=-1, epsilon=1e-12)
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])]
    return g, x, inputs


def save(g, out, inputs, name, path, out_shape):
    g.nodes[-1].output[0] = name
    graph = helper.make_graph(g.nodes, os.path.basename(path), inputs,
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, out_shape)], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    g, y, ins = resnet50()
    save(g, y, ins, "logits", os.path.join(out, "resnet50.onnx"), ["batch", 1000])
    g, y, ins = mobilenetv2()
    save(g, y, ins, "logits", os.path.join(out, "mobilenetv2.onnx"), ["batch", 1000])
    g, y, ins = encoder(12, 768, 12, 3072)
    save(g, y, ins, "hidden", os.path.join(out, "bert_base.onnx"), ["batch", "seq", 768])
    g, y, ins = encoder(6, 384, 12, 1536)
    save(g, y, ins, "hidden", os.path.join(out, "minilm_l6.onnx"), ["batch", "seq", 384])
    return 0


if __name__ == "__main__":
    sys.exit(main())
