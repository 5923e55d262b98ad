#!/usr/bin/env python3
"""Generates kiln's test and demo models (random weights, real architectures) with onnx.helper.

usage: make_models.py OUT_DIR

  encoder.onnx  TTS-like encoder: tokens int64 [batch, seq] -> hidden [batch, seq, 64],
                pooled [batch, 64], frames [batch, 2*seq, 64] (a length-dependent output):
                embedding, positional table sliced to seq through Shape->Gather->Slice,
                2 attention blocks with Shape-derived Reshapes, LayerNorm, ReLU MLP.
  decoder.onnx  one decoder step with a KV cache: x [batch, 1, 64], past_k/past_v
                [batch, 4, past, 16] -> y [batch, 1, 64], present_k/present_v [batch, 4, past+1, 16].
  convnet.onnx  conv/upsample network: image float [batch, H, W, 3] (NHWC) -> Transpose to NCHW,
                strided Convs, Resize 2x nearest and ConvTranspose 2x, crops to the skip
                connections' sizes, Concats; accepts every H, W >= 1.
  unet_strict.onnx  the same without the crops: Concat needs H and W divisible by 4, and
                other sizes must be refused with an error naming the node and dims.
  datadep.onnx  data-dependent sizes: x float [n], k int64 [1], trips int64 [] ->
                positives (NonZero -> Gather), top (TopK with k from an input), uniq (Unique),
                cumulative (Loop whose trip count comes from data).
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
    b.op("ReduceMean", ["hidden"], "pooled", axes=[1], keepdims=0)
    b.nodes[-1].output[0] = "pooled"
    # frames: every position repeated twice, [batch, 2*seq, d] (like a duration expansion)
    rep = b.op("Tile", ["hidden", b.ints("tile2", [1, 1, 2])], "tiled")
    frames_shape = b.op("Concat", [batch, b.op("Mul", [seq, b.ints("two", [2])], "seq2"), b.ints("d_model2", [d])],
                        "frames_shape", axis=0)
    b.op("Reshape", [rep, frames_shape], "frames")
    b.nodes[-1].output[0] = "frames"
    graph = helper.make_graph(
        b.nodes, "encoder",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", d]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", d]),
         helper.make_tensor_value_info("frames", TensorProto.FLOAT, ["batch", "frames", d])],
        b.inits)
    return graph


def decoder(d=64, heads=4):
    b = Builder()
    hd = d // heads
    shape = b.op("Shape", ["x"], "x_shape")
    batch = b.op("Gather", [shape, b.ints("zero", [0])], "batch")
    heads_shape = b.op("Concat", [batch, b.ints("one_h_hd", [1, heads, hd])], "heads_shape", axis=0)
    out_shape = b.op("Concat", [batch, b.ints("one_d", [1, d])], "out_shape", axis=0)
    proj = {}
    for t in "qkv":
        y = b.op("MatMul", ["x", b.weight(f"w{t}", (d, d), 1.0 / np.sqrt(d))], t)
        y = b.op("Reshape", [y, heads_shape], t + "_heads")
        proj[t] = b.op("Transpose", [y], t + "_t", perm=[0, 2, 1, 3])
    b.op("Concat", ["past_k", proj["k"]], "present_k", axis=2)
    b.nodes[-1].output[0] = "present_k"
    b.op("Concat", ["past_v", proj["v"]], "present_v", axis=2)
    b.nodes[-1].output[0] = "present_v"
    kt = b.op("Transpose", ["present_k"], "kt", perm=[0, 1, 3, 2])
    b.inits.append(numpy_helper.from_array(np.array(1.0 / np.sqrt(hd), np.float32), "scale"))
    s_ = b.op("Mul", [b.op("MatMul", [proj["q"], kt], "scores"), "scale"], "scaled")
    a = b.op("Softmax", [s_], "attn", axis=-1)
    o = b.op("Transpose", [b.op("MatMul", [a, "present_v"], "ctx")], "ctx_t", perm=[0, 2, 1, 3])
    o = b.op("Reshape", [o, out_shape], "ctx_flat")
    o = b.op("Add", ["x", b.op("MatMul", [o, b.weight("wo", (d, d), 1.0 / np.sqrt(d))], "proj")], "res")
    b.inits.append(numpy_helper.from_array(np.ones(d, np.float32), "ln_g"))
    b.inits.append(numpy_helper.from_array(np.zeros(d, np.float32), "ln_b"))
    b.op("LayerNormalization", [o, "ln_g", "ln_b"], "y", axis=-1)
    b.nodes[-1].output[0] = "y"
    kv = ["batch", heads, "past", hd]
    graph = helper.make_graph(
        b.nodes, "decoder_step",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, d]),
         helper.make_tensor_value_info("past_k", TensorProto.FLOAT, kv),
         helper.make_tensor_value_info("past_v", TensorProto.FLOAT, kv)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1, d]),
         helper.make_tensor_value_info("present_k", TensorProto.FLOAT, ["batch", heads, "total", hd]),
         helper.make_tensor_value_info("present_v", TensorProto.FLOAT, ["batch", heads, "total", hd])],
        b.inits)
    return graph


def datadep():
    b = Builder()
    mask = b.op("Greater", ["x", b.weight("zero_f", ())], "positive_mask")
    b.inits[-1] = numpy_helper.from_array(np.array(0.0, np.float32), "zero_f")
    nz = b.op("NonZero", [mask], "nz")
    idx = b.op("Squeeze", [nz, b.ints("ax0", [0])], "idx")
    b.op("Gather", ["x", idx], "positives")
    b.nodes[-1].output[0] = "positives"
    b.nodes.append(helper.make_node("TopK", ["x", "k"], ["top", "top_idx"], name="TopK", largest=1, sorted=1))
    b.inits.append(numpy_helper.from_array(np.array(3.0, np.float32), "three"))
    r = b.op("Round", [b.op("Mul", ["x", "three"], "x3")], "rounded")
    b.nodes.append(helper.make_node("Unique", [r], ["uniq"], name="Unique", sorted=1))
    # Loop: acc_{i+1} = acc_i + x * (i + 1), trips iterations; cumulative = acc
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["i_f", "one_f"], ["i1"]),
         helper.make_node("Mul", ["x", "i1"], ["xi"]),
         helper.make_node("Add", ["acc", "xi"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, ["n"])])
    b.inits.append(numpy_helper.from_array(np.array(1.0, np.float32), "one_f"))
    b.inits.append(numpy_helper.from_array(np.array(True), "true"))
    zeros = b.op("Mul", ["x", b.weight("zero_m", ())], "zeros")
    b.inits[-1] = numpy_helper.from_array(np.array(0.0, np.float32), "zero_m")
    b.nodes.append(helper.make_node("Loop", ["trips", "true", zeros], ["cumulative"], name="Loop", body=body))
    graph = helper.make_graph(
        b.nodes, "datadep",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("trips", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("positives", TensorProto.FLOAT, ["p"]),
         helper.make_tensor_value_info("top", TensorProto.FLOAT, ["k"]),
         helper.make_tensor_value_info("uniq", TensorProto.FLOAT, ["u"]),
         helper.make_tensor_value_info("cumulative", TensorProto.FLOAT, ["n"])],
        b.inits)
    return graph


def crop_to(b, x, like, hint):
    """Slices x's H and W (axes 2, 3) to those of `like`."""
    hw = b.op("Slice", [b.op("Shape", [like], hint + "_shape"), b.ints(hint + "_s2", [2]), b.ints(hint + "_s4", [4])],
              hint + "_hw")
    return b.op("Slice", [x, b.ints(hint + "_zz", [0, 0]), hw, b.ints(hint + "_ax", [2, 3])], hint + "_crop")


def convnet(strict=False):
    b = Builder()
    x = b.op("Transpose", ["image"], "nchw", perm=[0, 3, 1, 2])
    c1 = b.op("Relu", [b.op("Conv", [x, b.weight("c1w", (8, 3, 3, 3), 0.3), b.weight("c1b", (8,))], "c1",
                                pads=[1, 1, 1, 1], strides=[2, 2])], "c1r")
    c2 = b.op("Relu", [b.op("Conv", [c1, b.weight("c2w", (8, 8, 3, 3), 0.2), b.weight("c2b", (8,))], "c2",
                                pads=[1, 1, 1, 1], strides=[2, 2])], "c2r")
    b.inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales"))
    up = b.op("Resize", [c2, "", "up_scales"], "up", mode="nearest")
    # the upsampled map is c1's size rounded up to even: crop it to c1's size
    cat1 = b.op("Concat", [c1, up if strict else crop_to(b, up, c1, "up")], "skip1", axis=1)
    c3 = b.op("Relu", [b.op("Conv", [cat1, b.weight("c3w", (8, 16, 3, 3), 0.2)], "c3", pads=[1, 1, 1, 1])], "c3r")
    ct = b.op("ConvTranspose", [c3, b.weight("ctw", (8, 4, 2, 2), 0.3), b.weight("ctb", (4,))], "deconv",
              strides=[2, 2])
    cat2 = b.op("Concat", [x, ct if strict else crop_to(b, ct, x, "ct")], "skip2", axis=1)
    b.op("Conv", [cat2, b.weight("c4w", (8, 7, 1, 1), 0.2)], "head")
    b.nodes[-1].output[0] = "features"
    graph = helper.make_graph(
        b.nodes, "unet_strict" if strict else "convnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", "H", "W", 3])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8, "H", "W"])],
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
    save(decoder(), os.path.join(out, "decoder.onnx"))
    save(convnet(), os.path.join(out, "convnet.onnx"))
    save(convnet(strict=True), os.path.join(out, "unet_strict.onnx"))
    save(datadep(), os.path.join(out, "datadep.onnx"))
    save(mlp(), os.path.join(out, "mlp.onnx"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
