#!/usr/bin/env python3
"""Generates the subgraph models of the model tests and benchmarks (random weights) with
onnx.helper.

usage: make_vad.py OUT_DIR

  vad.onnx       shaped like a Silero-style voice-activity detector: input float [batch, 512],
                 state float [2, batch, 128], sr int64 scalar -> output [batch, 1], stateN
                 [2, batch, 128]. One If on sr == 16000; each branch (its own weights, outer
                 initializers, and the outer inputs read from inside the branch) pads the audio,
                 runs an STFT-like strided Conv and its magnitude, four Conv1d + Relu layers
                 with strides, a Reshape to [batch, 128], an LSTM-style cell written with
                 MatMul / Add / Split / Sigmoid / Tanh / Mul / Concat, and Linear + Sigmoid.
  loop_rnn.onnx  x float [seq, batch, 16], h0 float [batch, 32] -> h float [batch, 32], ys
                 float [seq, batch, 32]: a Loop over seq (trip count from Shape) whose body reads
                 x[i] (Gather with the iteration number) and outer weights, carries h and scans
                 out each step's h.
  scan_rnn.onnx  x float [batch, seq, 16], h0 float [batch, 32] -> h, ys [batch, seq, 32]: the
                 same cell as a Scan along axis 1 (scan output stacked along axis 1).
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_models import save  # noqa: E402  (the same opset, IR version and full check)

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


class Builder:
    """Nodes of one graph; weights become initializers of the main graph (`inits`)."""

    def __init__(self, prefix, inits, rng):
        self.prefix, self.inits, self.rng, self.nodes, self.n = prefix, inits, rng, [], 0

    def name(self, hint):
        self.n += 1
        return f"{self.prefix}{hint}_{self.n}"

    def op(self, op_type, inputs, n_out=1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, array, hint="c"):
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, shape, fan_in):
        return self.const((self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), "w")

    def conv1d(self, x, c_in, c_out, k, stride=1, pad=None, bias=True):
        pad = k // 2 if pad is None else pad
        ins = [x, self.weight((c_out, c_in, k), c_in * k)]
        if bias:
            ins.append(self.const((self.rng.standard_normal(c_out) * 0.1).astype(np.float32), "b"))
        return self.op("Conv", ins, kernel_shape=[k], strides=[stride], pads=[pad, pad])


def vad_branch(prefix, inits, rng, n_fft, hop):
    """One sample rate's network over the outer values `input` and `state`; returns the
    branch graph (no inputs, outputs `{prefix}out`, `{prefix}stateN`)."""
    b = Builder(prefix, inits, rng)
    x = b.op("Unsqueeze", ["input", b.const(np.array([1], np.int64))])  # [batch, 1, 512]
    x = b.op("Pad", [x, b.const(np.array([0, 0, n_fft // 4, 0, 0, n_fft // 4], np.int64))], mode="reflect")
    bins = n_fft // 2 + 1
    spec = b.conv1d(x, 1, 2 * bins, n_fft, stride=hop, pad=0, bias=False)  # [batch, 2 * bins, frames]
    re, im = b.op("Split", [spec, b.const(np.array([bins, bins], np.int64))], n_out=2, axis=1)
    mag = b.op("Sqrt", [b.op("Add", [b.op("Mul", [re, re]), b.op("Mul", [im, im])])])  # [batch, bins, frames]
    h = mag
    for c_in, c_out, stride in [(bins, 128, 1), (128, 64, 2), (64, 64, 2), (64, 128, 1)]:
        h = b.op("Relu", [b.conv1d(h, c_in, c_out, 3, stride=stride)])
    feat = b.op("Reshape", [h, b.const(np.array([0, -1], np.int64))])  # [batch, 128]
    h0 = b.op("Gather", ["state", b.const(np.array(0, np.int64))], axis=0)  # [batch, 128]
    c0 = b.op("Gather", ["state", b.const(np.array(1, np.int64))], axis=0)
    gates = b.op("Add", [b.op("Add", [b.op("MatMul", [feat, b.weight((128, 512), 128)]),
                                      b.op("MatMul", [h0, b.weight((128, 512), 128)])]),
                         b.const((rng.standard_normal(512) * 0.1).astype(np.float32), "b")])
    gi, gf, gg, go = b.op("Split", [gates, b.const(np.array([128] * 4, np.int64))], n_out=4, axis=1)
    c1 = b.op("Add", [b.op("Mul", [b.op("Sigmoid", [gf]), c0]),
                      b.op("Mul", [b.op("Sigmoid", [gi]), b.op("Tanh", [gg])])])
    h1 = b.op("Mul", [b.op("Sigmoid", [go]), b.op("Tanh", [c1])])
    axes0 = b.const(np.array([0], np.int64))
    state_n = b.op("Concat", [b.op("Unsqueeze", [h1, axes0]), b.op("Unsqueeze", [c1, axes0])], axis=0)
    y = b.op("Add", [b.op("MatMul", [b.op("Relu", [h1]), b.weight((128, 1), 128)]),
                     b.const(np.array([0.1], np.float32), "b")])
    out = b.op("Sigmoid", [y])
    b.nodes.append(helper.make_node("Identity", [out], [f"{prefix}out"], name=f"{prefix}out_id"))
    b.nodes.append(helper.make_node("Identity", [state_n], [f"{prefix}stateN"], name=f"{prefix}state_id"))
    return helper.make_graph(b.nodes, f"{prefix}branch", [],
                             [helper.make_tensor_value_info(f"{prefix}out", F32, ["batch", 1]),
                              helper.make_tensor_value_info(f"{prefix}stateN", F32, [2, "batch", 128])])


def vad(rng):
    inits = []
    then_g = vad_branch("k16_", inits, rng, 256, 128)
    else_g = vad_branch("k8_", inits, rng, 128, 128)
    nodes = [helper.make_node("Equal", ["sr", "sr16k"], ["is16k"], name="is16k"),
             helper.make_node("If", ["is16k"], ["output", "stateN"], name="If_sr", then_branch=then_g,
                              else_branch=else_g)]
    inits.append(numpy_helper.from_array(np.array(16000, np.int64), "sr16k"))
    graph = helper.make_graph(nodes, "vad",
                              [helper.make_tensor_value_info("input", F32, ["batch", 512]),
                               helper.make_tensor_value_info("state", F32, [2, "batch", 128]),
                               helper.make_tensor_value_info("sr", I64, [])],
                              [helper.make_tensor_value_info("output", F32, ["batch", 1]),
                               helper.make_tensor_value_info("stateN", F32, [2, "batch", 128])], inits)
    return graph


def rnn_cell(b, x, h, wx, wh, bias):
    """h' = tanh(x Wx + h Wh + b), [batch, 32]"""
    return b.op("Tanh", [b.op("Add", [b.op("Add", [b.op("MatMul", [x, wx]), b.op("MatMul", [h, wh])]), bias])])


def loop_rnn(rng):
    inits = []
    m = Builder("", inits, rng)
    wx, wh = m.weight((16, 32), 16), m.weight((32, 32), 32)
    bias = m.const((rng.standard_normal(32) * 0.1).astype(np.float32), "b")
    b = Builder("body_", inits, rng)
    xi = b.op("Gather", ["x", "i"], axis=0)  # [batch, 16]
    h1 = rnn_cell(b, xi, "h_in", wx, wh, bias)
    b.nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"))
    b.nodes.append(helper.make_node("Identity", [h1], ["h_out"], name="body_h"))
    b.nodes.append(helper.make_node("Identity", [h1], ["y_out"], name="body_y"))
    body = helper.make_graph(b.nodes, "body",
                             [helper.make_tensor_value_info("i", I64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("h_in", F32, ["batch", 32])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("h_out", F32, ["batch", 32]),
                              helper.make_tensor_value_info("y_out", F32, ["batch", 32])])
    shape = m.op("Shape", ["x"])
    trips = m.op("Gather", [shape, m.const(np.array(0, np.int64))], axis=0)
    m.nodes.append(helper.make_node("Loop", [trips, "", "h0"], ["h", "ys"], name="Loop_rnn", body=body))
    return helper.make_graph(m.nodes, "loop_rnn",
                             [helper.make_tensor_value_info("x", F32, ["seq", "batch", 16]),
                              helper.make_tensor_value_info("h0", F32, ["batch", 32])],
                             [helper.make_tensor_value_info("h", F32, ["batch", 32]),
                              helper.make_tensor_value_info("ys", F32, ["seq", "batch", 32])], inits)


def scan_rnn(rng):
    inits = []
    m = Builder("", inits, rng)
    wx, wh = m.weight((16, 32), 16), m.weight((32, 32), 32)
    bias = m.const((rng.standard_normal(32) * 0.1).astype(np.float32), "b")
    b = Builder("body_", inits, rng)
    h1 = rnn_cell(b, "x_t", "h_in", wx, wh, bias)
    b.nodes.append(helper.make_node("Identity", [h1], ["h_out"], name="body_h"))
    b.nodes.append(helper.make_node("Relu", [h1], ["y_out"], name="body_y"))
    body = helper.make_graph(b.nodes, "body",
                             [helper.make_tensor_value_info("h_in", F32, ["batch", 32]),
                              helper.make_tensor_value_info("x_t", F32, ["batch", 16])],
                             [helper.make_tensor_value_info("h_out", F32, ["batch", 32]),
                              helper.make_tensor_value_info("y_out", F32, ["batch", 32])])
    m.nodes.append(helper.make_node("Scan", ["h0", "x"], ["h", "ys"], name="Scan_rnn", body=body, num_scan_inputs=1,
                                    scan_input_axes=[1], scan_output_axes=[1]))
    return helper.make_graph(m.nodes, "scan_rnn",
                             [helper.make_tensor_value_info("x", F32, ["batch", "seq", 16]),
                              helper.make_tensor_value_info("h0", F32, ["batch", 32])],
                             [helper.make_tensor_value_info("h", F32, ["batch", 32]),
                              helper.make_tensor_value_info("ys", F32, ["batch", "seq", 32])], inits)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    save(vad(rng), os.path.join(out, "vad.onnx"))
    save(loop_rnn(rng), os.path.join(out, "loop_rnn.onnx"))
    save(scan_rnn(rng), os.path.join(out, "scan_rnn.onnx"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
