"""ort_families.py - the model families of the ORT-forms matrix, built with onnx.helper (small,
random weights from a fixed seed, symbolic batch / length / image dims), and the feeds each is
tested at. Each builder returns a Family: the float ModelProto, the list of feeds (three or more
shapes; batch 1 and more, odd sizes), calibration feeds for quantize_static, and, for the
transformers, the model type and sizes optimize_model needs.

  bert       input_ids, attention_mask, token_type_ids [batch, seq] -> last_hidden_state; the
             exporter's pattern (Gather embeddings, Range positions, mask (1 - m) * -10000, Q/K/V
             MatMul + Add, Reshape/Transpose heads, Div by sqrt(d), Softmax, erf Gelu, post-LN)
  gpt2       input_ids [batch, seq] -> logits; pre-LN, fused c_attn + Split, causal mask by Where
             on a slice of a lower-triangular buffer, tanh Gelu, tied LM head
  resnet     image [batch, 3, H, W] -> logits; Conv+BN+Relu stem, MaxPool, two basic blocks
             (one strided with a 1x1 projection), GlobalAveragePool, Flatten, Gemm
  mobilenet  image [batch, 3, H, W] -> logits; Clip(0, 6), inverted residuals with depthwise
             3x3 convolutions, GlobalAveragePool, Gemm
  bilstm     input_ids [batch, seq] -> tag logits [batch, seq, 5]; embedding, bidirectional LSTM,
             linear head
  segnet     feature map [batch, 16, H, W] (H, W even) -> mask [batch, 8, H, W], pooled [batch, 16];
             AveragePool, Resize (nearest, x2), GlobalMaxPool: the rest of the nchwc operators
             (ReorderInput of a 16-channel input, AveragePool, Upsample, GlobalMaxPool) at
             ORT_ENABLE_ALL, QLinearAveragePool in QOperator form
  tts        tokens [1, T] -> audio [1, 1, 2F], durations [T]; embedding -> Conv1d + bidirectional
             LSTM encoder -> duration predictor (1..4 frames per token) -> upsampling by the
             predicted durations (F = sum of durations, data-dependent) -> ConvTranspose (x2) ->
             Conv -> Tanh
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

I64, F32 = TensorProto.INT64, TensorProto.FLOAT


class Family:
    def __init__(self, name, model, feeds, calib, model_type=None, heads=0, hidden=0):
        self.name, self.model, self.feeds, self.calib = name, model, feeds, calib
        self.model_type, self.heads, self.hidden = model_type, heads, hidden


class G:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def op(self, op_type, inputs, outputs=1, **attrs):
        self.n += 1
        outs = [f"{op_type.lower()}_{self.n}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"{op_type}_{self.n}", **attrs))
        return outs[0] if outputs == 1 else outs

    def const(self, array):
        self.n += 1
        name = f"c_{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def w(self, shape, scale):
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32))

    def i64(self, *v):
        return self.const(np.array(v, np.int64))

    def f32(self, v):
        return self.const(np.array(v, np.float32))

    def model(self, inputs, outputs, out_names, opset=17):
        """The ModelProto whose graph outputs are `outputs` renamed to `out_names` (types from out_types)."""
        ren = dict(zip(outputs, out_names))
        for nd in self.nodes:
            nd.output[:] = [ren.get(x, x) for x in nd.output]
            nd.input[:] = [ren.get(x, x) for x in nd.input]
        outs = [helper.make_tensor_value_info(n, *self.out_types[n]) for n in out_names]
        g = helper.make_graph(self.nodes, "family", inputs, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="pytorch")
        m.ir_version = 8
        return m


def linear(g, x, n_in, n_out):
    return g.op("Add", [g.op("MatMul", [x, g.w((n_in, n_out), n_in ** -0.5)]), g.w((n_out,), 0.1)])


def layer_norm(g, x, d):
    return g.op("LayerNormalization", [x, g.const((1 + g.rng.standard_normal(d) * 0.1).astype(np.float32)),
                                       g.w((d,), 0.1)], axis=-1, epsilon=1e-5)


def text_feeds(rng, vocab, shapes, names=("input_ids",), mask=False, types=False):
    feeds = []
    for b, s in shapes:
        f = {"input_ids": rng.integers(0, vocab, (b, s)).astype(np.int64)}
        if mask:
            m = np.ones((b, s), np.int64)
            if s > 2:
                m[1:, s // 2 + 1:] = rng.integers(0, 2, (b - 1, s - s // 2 - 1))
            f["attention_mask"] = m
        if types:
            f["token_type_ids"] = rng.integers(0, 2, (b, s)).astype(np.int64)
        feeds.append(f)
    return feeds


def bert(H=32, heads=4, V=60, P=64, L=2):
    g = G(1)
    hd = H // heads
    we = g.op("Gather", [g.w((V, H), 1.0), "input_ids"])
    shape = g.op("Shape", ["input_ids"])
    seq = g.op("Gather", [shape, g.const(np.array(1, np.int64))])
    pos = g.op("Unsqueeze", [g.op("Range", [g.const(np.array(0, np.int64)), seq, g.const(np.array(1, np.int64))]), g.i64(0)])
    pe = g.op("Gather", [g.w((P, H), 0.5), pos])
    se = g.op("Gather", [g.w((2, H), 0.5), "token_type_ids"])
    x = layer_norm(g, g.op("Add", [g.op("Add", [we, pe]), se]), H)
    m4 = g.op("Cast", [g.op("Unsqueeze", [g.op("Unsqueeze", ["attention_mask", g.i64(1)]), g.i64(2)])], to=F32)
    madd = g.op("Mul", [g.op("Sub", [g.f32(1.0), m4]), g.f32(-10000.0)])
    for _ in range(L):
        def proj(t):
            y = g.op("Reshape", [linear(g, x, H, H), g.i64(0, 0, heads, hd)])
            return g.op("Transpose", [y], perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3])
        q, k, v = proj("q"), proj("k"), proj("v")
        s = g.op("Add", [g.op("Div", [g.op("MatMul", [q, k]), g.f32(np.sqrt(hd))]), madd])
        p = g.op("Softmax", [s], axis=3)
        ctx = g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [p, v])], perm=[0, 2, 1, 3]), g.i64(0, 0, H)])
        x = layer_norm(g, g.op("Add", [linear(g, ctx, H, H), x]), H)
        f1 = linear(g, x, H, 4 * H)
        ge = g.op("Mul", [g.op("Mul", [f1, g.op("Add", [g.op("Erf", [g.op("Div", [f1, g.f32(np.sqrt(2))])]), g.f32(1.0)])]),
                          g.f32(0.5)])
        x = layer_norm(g, g.op("Add", [linear(g, ge, 4 * H, H), x]), H)
    g.out_types = {"last_hidden_state": (F32, ["batch", "seq", H])}
    ins = [helper.make_tensor_value_info(n, I64, ["batch", "seq"]) for n in ("input_ids", "attention_mask", "token_type_ids")]
    m = g.model(ins, [x], ["last_hidden_state"])
    r = np.random.default_rng(11)
    feeds = text_feeds(r, V, [(1, 1), (1, 7), (2, 13), (3, 16)], mask=True, types=True)
    calib = text_feeds(r, V, [(1, 8), (2, 12), (1, 16), (2, 5)], mask=True, types=True)
    return Family("bert", m, feeds, calib, "bert", heads, H)


def gpt2(H=32, heads=4, V=64, P=64, L=2):
    g = G(2)
    hd = H // heads
    wte = g.w((V, H), 0.5)
    shape = g.op("Shape", ["input_ids"])
    seq = g.op("Gather", [shape, g.const(np.array(1, np.int64))])
    pos = g.op("Unsqueeze", [g.op("Range", [g.const(np.array(0, np.int64)), seq, g.const(np.array(1, np.int64))]), g.i64(0)])
    x = g.op("Add", [g.op("Gather", [wte, "input_ids"]), g.op("Gather", [g.w((P, H), 0.3), pos])])
    causal = g.const(np.tril(np.ones((P, P), bool)).reshape(1, 1, P, P))
    seq1 = g.op("Unsqueeze", [seq, g.i64(0)])
    bias = g.op("Slice", [causal, g.i64(0, 0), g.op("Concat", [seq1, seq1], axis=0), g.i64(2, 3)])
    for _ in range(L):
        h = layer_norm(g, x, H)
        q, k, v = g.op("Split", [linear(g, h, H, 3 * H), g.i64(H, H, H)], outputs=3, axis=2)
        def heads_of(t, perm):
            return g.op("Transpose", [g.op("Reshape", [t, g.i64(0, 0, heads, hd)])], perm=perm)
        q, k, v = heads_of(q, [0, 2, 1, 3]), heads_of(k, [0, 2, 3, 1]), heads_of(v, [0, 2, 1, 3])
        a = g.op("Div", [g.op("MatMul", [q, k]), g.f32(np.sqrt(hd))])
        a = g.op("Where", [bias, a, g.f32(-3.4028234663852886e38)])
        ctx = g.op("MatMul", [g.op("Softmax", [a], axis=-1), v])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.i64(0, 0, H)])
        x = g.op("Add", [x, linear(g, ctx, H, H)])
        h = linear(g, layer_norm(g, x, H), H, 4 * H)
        t = g.op("Tanh", [g.op("Mul", [g.f32(np.sqrt(2 / np.pi)), g.op("Add", [h, g.op("Mul", [g.f32(0.044715),
                                                                                              g.op("Pow", [h, g.f32(3.0)])])])])])
        h = g.op("Mul", [g.op("Mul", [g.f32(0.5), h]), g.op("Add", [g.f32(1.0), t])])
        x = g.op("Add", [x, linear(g, h, 4 * H, H)])
    x = layer_norm(g, x, H)
    logits = g.op("MatMul", [x, g.op("Transpose", [wte], perm=[1, 0])])
    g.out_types = {"logits": (F32, ["batch", "seq", V])}
    m = g.model([helper.make_tensor_value_info("input_ids", I64, ["batch", "seq"])], [logits], ["logits"])
    r = np.random.default_rng(12)
    return Family("gpt2", m, text_feeds(r, V, [(1, 1), (1, 9), (2, 17), (3, 6)]),
                  text_feeds(r, V, [(1, 8), (2, 12), (1, 16)]), "gpt2", heads, H)


def conv_bn(g, x, cin, cout, k, stride=1, group=1, act="relu"):
    y = g.op("Conv", [x, g.w((cout, cin // group, k, k), (2.0 / (cin // group * k * k)) ** 0.5)], kernel_shape=[k, k],
             strides=[stride, stride], pads=[k // 2] * 4, group=group)
    r = g.rng
    y = g.op("BatchNormalization", [y, g.const((1 + r.standard_normal(cout) * 0.1).astype(np.float32)), g.w((cout,), 0.1),
                                    g.w((cout,), 0.1), g.const((np.abs(r.standard_normal(cout)) + 0.5).astype(np.float32))])
    if act == "relu":
        y = g.op("Relu", [y])
    elif act == "relu6":
        y = g.op("Clip", [y, g.f32(0.0), g.f32(6.0)])
    return y


def image_feeds(rng, shapes):
    return [{"image": rng.standard_normal((b, 3, h, w)).astype(np.float32)} for b, h, w in shapes]


def head(g, x, c, n=10):
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    return g.op("Gemm", [x, g.w((c, n), c ** -0.5), g.w((n,), 0.1)])


def resnet():
    g = G(3)
    x = conv_bn(g, "image", 3, 16, 3, 2)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for cin, cout, s in [(16, 16, 1), (16, 32, 2)]:
        y = conv_bn(g, conv_bn(g, x, cin, cout, 3, s), cout, cout, 3, act=None)
        short = x if s == 1 and cin == cout else conv_bn(g, x, cin, cout, 1, s, act=None)
        x = g.op("Relu", [g.op("Add", [y, short])])
    y = head(g, x, 32)
    g.out_types = {"logits": (F32, ["batch", 10])}
    m = g.model([helper.make_tensor_value_info("image", F32, ["batch", 3, "H", "W"])], [y], ["logits"])
    r = np.random.default_rng(13)
    return Family("resnet", m, image_feeds(r, [(1, 32, 32), (2, 33, 47), (3, 17, 29)]),
                  image_feeds(r, [(1, 32, 32), (2, 24, 40), (1, 40, 24)]))


def mobilenet():
    g = G(4)
    x = conv_bn(g, "image", 3, 16, 3, 2, act="relu6")
    c = 16
    for t, cout, s in [(2, 16, 1), (2, 32, 2), (2, 32, 1)]:
        hid = c * t
        y = conv_bn(g, x, c, hid, 1, act="relu6")
        y = conv_bn(g, y, hid, hid, 3, s, group=hid, act="relu6")
        y = conv_bn(g, y, hid, cout, 1, act=None)
        x = g.op("Add", [x, y]) if s == 1 and c == cout else y
        c = cout
    x = conv_bn(g, x, c, 64, 1, act="relu6")
    y = head(g, x, 64)
    g.out_types = {"logits": (F32, ["batch", 10])}
    m = g.model([helper.make_tensor_value_info("image", F32, ["batch", 3, "H", "W"])], [y], ["logits"])
    r = np.random.default_rng(14)
    return Family("mobilenet", m, image_feeds(r, [(1, 32, 32), (2, 35, 41), (3, 19, 27)]),
                  image_feeds(r, [(1, 32, 32), (2, 24, 40), (1, 40, 24)]))


def segnet():
    g = G(7)
    x = conv_bn(g, "features", 16, 16, 3)
    y = g.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    y = conv_bn(g, y, 16, 32, 3)
    y = g.op("Resize", [y, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest",
             coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    y = g.op("Conv", [g.op("Add", [conv_bn(g, y, 32, 16, 1, act=None), x]), g.w((8, 16, 3, 3), (2.0 / 144) ** 0.5)],
             kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    pooled = g.op("Flatten", [g.op("GlobalMaxPool", [x])], axis=1)
    g.out_types = {"mask": (F32, ["batch", 8, "H", "W"]), "pooled": (F32, ["batch", 16])}
    m = g.model([helper.make_tensor_value_info("features", F32, ["batch", 16, "H", "W"])], [y, pooled], ["mask", "pooled"],
                opset=17)
    r = np.random.default_rng(17)
    feeds = [{"features": r.standard_normal((b, 16, h, w)).astype(np.float32)} for b, h, w in [(1, 16, 16), (2, 10, 22), (3, 6, 14)]]
    calib = [{"features": r.standard_normal((b, 16, h, w)).astype(np.float32)} for b, h, w in [(1, 16, 16), (2, 8, 12)]]
    return Family("segnet", m, feeds, calib)


def lstm(g, x, cin, h):
    """x [T, B, cin] -> [T, B, 2h] through a bidirectional LSTM"""
    y = g.op("LSTM", [x, g.w((2, 4 * h, cin), cin ** -0.5), g.w((2, 4 * h, h), h ** -0.5), g.w((2, 8 * h), 0.1)],
             outputs=3, hidden_size=h, direction="bidirectional")[0]
    y = g.op("Transpose", [y], perm=[0, 2, 1, 3])  # [T, B, 2, h]
    return g.op("Reshape", [y, g.i64(0, 0, 2 * h)])


def bilstm(V=50, E=16, H=16, T=5):
    g = G(5)
    x = g.op("Transpose", [g.op("Gather", [g.w((V, E), 1.0), "input_ids"])], perm=[1, 0, 2])  # [S, B, E]
    y = lstm(g, x, E, H)
    y = g.op("Transpose", [y], perm=[1, 0, 2])
    y = linear(g, y, 2 * H, T)
    g.out_types = {"logits": (F32, ["batch", "seq", T])}
    m = g.model([helper.make_tensor_value_info("input_ids", I64, ["batch", "seq"])], [y], ["logits"])
    r = np.random.default_rng(15)
    return Family("bilstm", m, text_feeds(r, V, [(1, 1), (1, 9), (2, 17), (3, 6)]),
                  text_feeds(r, V, [(1, 8), (2, 12), (1, 16)]))


TTS_LENGTHS = [16, 16, 10, 55, 5]


def tts(V=40, E=16, H=8):
    g = G(6)
    x = g.op("Transpose", [g.op("Gather", [g.w((V, E), 1.0), "tokens"])], perm=[0, 2, 1])  # [1, E, T]
    x = g.op("Relu", [g.op("Conv", [x, g.w((E, E, 3), (E * 3) ** -0.5), g.w((E,), 0.1)], kernel_shape=[3], pads=[1, 1])])
    enc = lstm(g, g.op("Transpose", [x], perm=[2, 0, 1]), E, H)  # [T, 1, 2H]
    enc = g.op("Transpose", [enc], perm=[1, 0, 2])  # [1, T, 2H]
    d = g.op("Sigmoid", [linear(g, enc, 2 * H, 1)])
    d = g.op("Round", [g.op("Add", [g.op("Mul", [d, g.f32(3.0)]), g.f32(1.0)])])
    dur = g.op("Cast", [g.op("Reshape", [d, g.i64(-1)])], to=I64)  # [T], 1..4
    ends = g.op("CumSum", [dur, g.const(np.array(0, np.int64))])
    total = g.op("ReduceSum", [dur], keepdims=0)
    frames = g.op("Range", [g.const(np.array(0, np.int64)), total, g.const(np.array(1, np.int64))])  # [F]
    past = g.op("GreaterOrEqual", [g.op("Unsqueeze", [frames, g.i64(1)]), g.op("Unsqueeze", [ends, g.i64(0)])])
    idx = g.op("ReduceSum", [g.op("Cast", [past], to=I64), g.i64(1)], keepdims=0)  # [F] token of each frame
    up = g.op("Transpose", [g.op("Gather", [enc, idx], axis=1)], perm=[0, 2, 1])  # [1, 2H, F]
    y = g.op("ConvTranspose", [up, g.w((2 * H, 8, 4), (2 * H * 4) ** -0.5), g.w((8,), 0.1)], kernel_shape=[4], strides=[2],
             pads=[1, 1])
    y = g.op("LeakyRelu", [y], alpha=0.1)
    y = g.op("Tanh", [g.op("Conv", [y, g.w((1, 8, 3), 24 ** -0.5), g.w((1,), 0.1)], kernel_shape=[3], pads=[1, 1])])
    g.out_types = {"audio": (F32, [1, 1, "frames"]), "durations": (I64, ["tokens_len"])}
    m = g.model([helper.make_tensor_value_info("tokens", I64, [1, "T"])], [y, dur], ["audio", "durations"])
    r = np.random.default_rng(16)
    feeds = [{"tokens": r.integers(0, V, (1, t)).astype(np.int64)} for t in TTS_LENGTHS]
    calib = [{"tokens": r.integers(0, V, (1, t)).astype(np.int64)} for t in (12, 20, 7)]
    return Family("tts", m, feeds, calib)


FAMILIES = [bert, gpt2, resnet, mobilenet, segnet, bilstm, tts]
