"""fp16_bert.py - a small half-precision BERT-like encoder layer built with onnx.helper in the
patterns torch.onnx.export writes for model.half(): float16 embeddings and weights,
LayerNormalization over a float32 X (Cast up) with float16 Scale and B and its output cast back
(and one with a float16 X and float32 parameters), position ids and the attention mask from
shape arithmetic (Shape, Gather, Range, Unsqueeze, Concat), the mask cast to float16 and turned
into -65504 fills (Sub, Mul), attention scores Softmax'ed in float32 between Casts, GELU through
Erf, Pow with a float32 exponent of a float16 base, Where over a boolean mask.

bert(mixed=True) is that graph; bert(mixed=False) casts the parameters to X's type first, the
valid ONNX graph (LayerNormalization's X, Scale and B share one type T) that ONNX Runtime runs
as the reference for the mixed one."""
import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

V, P, H, HEADS, F = 50, 64, 32, 4, 64


def bert(mixed=True, seed=0):
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def w(name, shape, dtype=np.float16, scale=0.2):
        inits.append(nh.from_array((rng.standard_normal(shape) * scale).astype(dtype), name))
        return name

    def c(name, value, dtype):
        inits.append(nh.from_array(np.array(value, dtype), name))
        return name

    def n(op, ins, outs, **kw):
        nodes.append(h.make_node(op, ins, outs if isinstance(outs, list) else [outs], **kw))
        return outs

    def layernorm(x, tag, x_dtype):
        """LayerNormalization with parameters of the other float type than x_dtype."""
        pdt = np.float16 if x_dtype == T.FLOAT else np.float32
        s = f"{tag}_s"
        inits.append(nh.from_array((1 + 0.1 * rng.standard_normal(H)).astype(pdt), s))
        b = w(f"{tag}_b", [H], pdt, 0.1)
        if not mixed:
            s, b = n("Cast", [s], f"{s}_c", to=x_dtype), n("Cast", [b], f"{b}_c", to=x_dtype)
        return n("LayerNormalization", [x, s, b], f"{tag}_y", axis=-1, epsilon=1e-5)

    # embeddings: word + position (position ids from the input's shape)
    word = n("Gather", [w("word", [V, H]), "input_ids"], "word_e")
    shp = n("Shape", ["input_ids"], "ids_shape")
    seq = n("Gather", [shp, c("one_i", 1, np.int64)], "seq")
    pos = n("Range", [c("zero_i", 0, np.int64), seq, "one_i"], "pos")
    pos_e = n("Gather", [w("pos_w", [P, H]), pos], "pos_e")
    emb = n("Add", [word, pos_e], "emb")
    emb32 = n("Cast", [emb], "emb32", to=T.FLOAT)
    ln0 = n("Cast", [layernorm(emb32, "ln0", T.FLOAT)], "ln0_16", to=T.FLOAT16)  # [B, S, H] fp16

    # the additive mask: (1 - mask) * -65504, [B, 1, 1, S]
    m = n("Unsqueeze", ["attention_mask", c("axes12", [1, 2], np.int64)], "mask4")
    m16 = n("Cast", [m], "mask16", to=T.FLOAT16)
    inv = n("Sub", [c("one_h", 1.0, np.float16), m16], "mask_inv")
    add_mask = n("Mul", [inv, c("neg_h", -65504.0, np.float16)], "mask_add")

    # attention: [B, S, H] -> [B, heads, S, dh]
    dh = H // HEADS
    b_dim = n("Gather", [shp, c("zero_i1", [0], np.int64)], "b_dim")
    s_dim = n("Gather", [shp, c("one_i1", [1], np.int64)], "s_dim")
    split = n("Concat", [b_dim, s_dim, c("heads_dh", [HEADS, dh], np.int64)], "split_shape", axis=0)
    merge = n("Concat", [b_dim, s_dim, c("h_only", [H], np.int64)], "merge_shape", axis=0)
    heads = {}
    for nm in ("q", "k", "v"):
        proj = n("Add", [n("MatMul", [ln0, w(f"w{nm}", [H, H])], f"{nm}_mm"), w(f"b{nm}", [H])], f"{nm}_p")
        perm = [0, 2, 3, 1] if nm == "k" else [0, 2, 1, 3]
        heads[nm] = n("Transpose", [n("Reshape", [proj, split], f"{nm}_r")], f"{nm}_t", perm=perm)
    scores = n("Div", [n("MatMul", [heads["q"], heads["k"]], "qk"), c("sqrt_dh", np.sqrt(dh), np.float16)], "qk_s")
    scores = n("Add", [scores, add_mask], "qk_m")
    probs = n("Cast", [n("Softmax", [n("Cast", [scores], "qk32", to=T.FLOAT)], "probs32", axis=-1)], "probs",
              to=T.FLOAT16)
    ctx = n("Transpose", [n("MatMul", [probs, heads["v"]], "ctx_h")], "ctx_t", perm=[0, 2, 1, 3])
    ctx = n("Reshape", [ctx, merge], "ctx")
    attn = n("Add", [n("MatMul", [ctx, w("wo", [H, H])], "o_mm"), w("bo", [H])], "o_p")
    res1 = n("Add", [attn, ln0], "res1")
    ln1 = layernorm(res1, "ln1", T.FLOAT16)  # a float16 X with float32 parameters

    # feed-forward with GELU through Erf, then a masked Where and the last LayerNormalization
    f1 = n("Add", [n("MatMul", [ln1, w("w1", [H, F])], "f1_mm"), w("b1", [F])], "f1")
    erf = n("Erf", [n("Div", [f1, c("sqrt2", np.sqrt(2), np.float16)], "f1_d")], "f1_erf")
    f1_g = n("Mul", [f1, n("Add", [erf, c("one_h2", 1.0, np.float16)], "f1_e1")], "f1_g")
    gelu = n("Mul", [f1_g, c("half_h", 0.5, np.float16)], "gelu")
    f2 = n("Add", [n("MatMul", [gelu, w("w2", [F, H])], "f2_mm"), w("b2", [H])], "f2")
    sq = n("Pow", [f2, c("two_f", 2.0, np.float32)], "f2_sq")  # a float16 base, a float32 exponent
    f2 = n("Add", [f2, n("Mul", [sq, c("milli_h", 1e-3, np.float16)], "f2_sq_s")], "f2_p")
    keep = n("Cast", [n("Unsqueeze", ["attention_mask", c("axes2", [2], np.int64)], "mask3")], "mask3b", to=T.BOOL)
    f2 = n("Where", [keep, f2, c("zero_h", 0.0, np.float16)], "f2_w")
    res2 = n("Cast", [n("Add", [f2, ln1], "res2")], "res2_32", to=T.FLOAT)
    out = n("Cast", [layernorm(res2, "ln2", T.FLOAT)], "hidden", to=T.FLOAT16)

    g = h.make_graph(nodes, "fp16_bert",
                     [h.make_tensor_value_info("input_ids", T.INT64, ["batch", "seq"]),
                      h.make_tensor_value_info("attention_mask", T.INT64, ["batch", "seq"])],
                     [h.make_tensor_value_info(out, T.FLOAT16, ["batch", "seq", H])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    return m.SerializeToString()


def feeds(batch, seq, seed=1):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    for b in range(batch):
        mask[b, rng.integers(1, seq + 1):] = 0
    return {"input_ids": rng.integers(0, V, (batch, seq)).astype(np.int64), "attention_mask": mask}
