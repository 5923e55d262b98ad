#!/usr/bin/env python3
"""Random-weight Llama-style decoders in onnxruntime-genai's model folder layout (model.onnx +
genai_config.json), for kiln's generator tests and `kiln bench-llm`.

usage: make_llm.py OUT_DIR [--form onnx|gqa] [--layers N] [--hidden H] [--heads N] [--kv-heads N]
                   [--vocab V] [--context C] [--max-length M] [--seed S] [--asymmetric] [--block B]
                   [--accuracy-level L] [--eos IDS] [--intermediate I] [--dtype fp32|fp16]
                   [--random-weights] [--external-data]

--form onnx (default): ONNX ops only - RMS norm written out, rotary written out from position ids
  computed in the graph (cumsum of attention_mask - 1), MatMul attention with an additive mask
  (causal and padding) built from attention_mask, Concat for the KV cache (past_present_share_buffer
  false), SiLU MLP.
--form gqa: the graph onnxruntime-genai's model builder writes for `-e cpu` with int4 weights: the
  attention-mask subgraph (seqlens_k = ReduceSum(mask) - 1, total_sequence_length = mask.shape[1]),
  SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization, packed QKV MatMulNBits (bits 4,
  block 32 or --block, symmetric or --asymmetric zero points), GroupQueryAttention with do_rotary and cos/sin
  caches over a past/present buffer of max_length (past_present_share_buffer true), SiLU MLP;
  --dtype fp16 makes activations, scales, norms, caches and logits float16 (the builder's
  `-e cuda -p int4` io dtype), --random-weights draws the packed weights directly (an 8B-shaped
  model in seconds: no float weights) and --external-data writes them to model.onnx.data.
"""
import argparse
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class G:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def init(self, name, arr):
        self.inits.append(numpy_helper.from_array(np.array(arr, copy=True, order="C"), name))
        return name

    def op(self, op, ins, n_out=1, domain="", name=None, **attrs):
        self.n += 1
        base = name or f"{op.lower()}_{self.n}"
        outs = [f"{base}/out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, ins, outs, name=base, domain=domain or None, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, name, val, dt=np.int64):
        return self.init(name, np.array(val, dtype=dt))


def rope_cache(context, head):
    inv = 1.0 / (10000.0 ** (np.arange(0, head, 2, dtype=np.float64) / head))
    ang = np.arange(context, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def weights(a, rng):
    H, KV, D, hid = a.heads, a.kv_heads, a.hidden // a.heads, a.hidden
    inter = a.intermediate
    s = lambda *shape: (rng.standard_normal(shape) * (1.0 / np.sqrt(shape[0]))).astype(np.float32)
    w = {"embed": (rng.standard_normal((a.vocab, hid)) * 0.5).astype(np.float32),
         "lm_head": s(hid, a.vocab) * 2.0, "norm": (1 + 0.1 * rng.standard_normal(hid)).astype(np.float32)}
    for l in range(a.layers):
        w[l] = {"ln1": (1 + 0.1 * rng.standard_normal(hid)).astype(np.float32),
                "ln2": (1 + 0.1 * rng.standard_normal(hid)).astype(np.float32),
                "q": s(hid, H * D), "k": s(hid, KV * D), "v": s(hid, KV * D), "o": s(H * D, hid),
                "gate": s(hid, inter), "up": s(hid, inter), "down": s(inter, hid)}
    return w


def rms(g, x, wname, eps=1e-5):
    sq = g.op("Mul", [x, x])
    m = g.op("ReduceMean", [sq, g.const("axes_last", [-1])], keepdims=1)
    r = g.op("Sqrt", [g.op("Add", [m, g.const("eps", np.float32(eps), np.float32)])])
    return g.op("Mul", [g.op("Div", [x, r]), wname])


def rotary(g, x, cos, sin, half):
    """x [B, H, S, D], cos/sin [B, 1, S, D/2]: rotate-half (Llama) rotary."""
    x1 = g.op("Slice", [x, g.const("r0", [0]), g.const("rh", [half]), g.const("ax3", [3])])
    x2 = g.op("Slice", [x, g.const("rh", [half]), g.const("rbig", [1 << 30]), g.const("ax3", [3])])
    a = g.op("Sub", [g.op("Mul", [x1, cos]), g.op("Mul", [x2, sin])])
    b = g.op("Add", [g.op("Mul", [x2, cos]), g.op("Mul", [x1, sin])])
    return g.op("Concat", [a, b], axis=3)


def build_onnx(a, w):
    H, KV, D, hid = a.heads, a.kv_heads, a.hidden // a.heads, a.hidden
    g = G()
    # constants shared by name (init() once each)
    seen = set()
    orig_const = g.const

    def const(name, val, dt=np.int64):
        if name not in seen:
            seen.add(name)
            orig_const(name, val, dt)
        return name
    g.const = const
    cos, sin = rope_cache(a.context, D)
    g.init("cos_cache", cos)
    g.init("sin_cache", sin)
    x = g.op("Gather", [g.init("embed_tokens.weight", w["embed"]), "input_ids"], axis=0)
    # sizes: S new positions, T total
    S = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const("one", 1)], axis=0)
    T = g.op("Gather", [g.op("Shape", ["attention_mask"]), g.const("one", 1)], axis=0)
    P = g.op("Sub", [T, S])
    # positions: cumsum(mask) - 1 over all positions, the last S of them, clamped at 0
    cum = g.op("CumSum", ["attention_mask", g.const("one", 1)])
    pos_all = g.op("Max", [g.op("Sub", [cum, g.const("one", 1)]), g.const("zero", 0)])
    pos = g.op("Slice", [pos_all, g.op("Unsqueeze", [P, g.const("ax0", [0])]),
                         g.op("Unsqueeze", [T, g.const("ax0", [0])]), g.const("ax1", [1])])  # [B, S]
    cs = g.op("Unsqueeze", [g.op("Gather", ["cos_cache", pos], axis=0), g.const("ax1", [1])])  # [B,1,S,D/2]
    sn = g.op("Unsqueeze", [g.op("Gather", ["sin_cache", pos], axis=0), g.const("ax1", [1])])
    # mask [B, 1, S, T]: key j allowed for query i when j <= P + i and attention_mask[b, j] == 1
    qpos = g.op("Range", [P, T, g.const("one", 1)])
    kpos = g.op("Range", [g.const("zero", 0), T, g.const("one", 1)])
    causal = g.op("LessOrEqual", [g.op("Unsqueeze", [kpos, g.const("ax0", [0])]),
                                  g.op("Unsqueeze", [qpos, g.const("ax1", [1])])])  # [S, T]
    keyok = g.op("Equal", [g.op("Unsqueeze", ["attention_mask", g.const("ax12", [1, 2])]), g.const("one", 1)])
    allowed = g.op("And", [causal, keyok])  # [B, 1, S, T]
    bias = g.op("Where", [allowed, g.const("f0", np.float32(0), np.float32), g.const("fneg", np.float32(-1e9), np.float32)])
    scale = g.const("scale", np.float32(1.0 / np.sqrt(D)), np.float32)
    outputs = []
    for l in range(a.layers):
        p = f"model.layers.{l}"
        h = rms(g, x, g.init(f"{p}.input_layernorm.weight", w[l]["ln1"]))

        def heads(y, n, nm):
            r = g.op("Reshape", [y, g.const(f"shape_{n}", [0, 0, n, D])])
            return g.op("Transpose", [r], perm=[0, 2, 1, 3], name=f"{p}.{nm}_bhsd")
        q = heads(g.op("MatMul", [h, g.init(f"{p}.q_proj.weight", w[l]["q"])]), H, "q")
        k = heads(g.op("MatMul", [h, g.init(f"{p}.k_proj.weight", w[l]["k"])]), KV, "k")
        v = heads(g.op("MatMul", [h, g.init(f"{p}.v_proj.weight", w[l]["v"])]), KV, "v")
        q = rotary(g, q, cs, sn, D // 2)
        k = rotary(g, k, cs, sn, D // 2)
        pk, pv = f"present.{l}.key", f"present.{l}.value"
        g.nodes.append(helper.make_node("Concat", [f"past_key_values.{l}.key", k], [pk], axis=2, name=f"{p}.kcat"))
        g.nodes.append(helper.make_node("Concat", [f"past_key_values.{l}.value", v], [pv], axis=2, name=f"{p}.vcat"))
        kk, vv = pk, pv
        if H != KV:  # repeat each KV head H/KV times
            def rep(t, nm):
                e = g.op("Expand", [g.op("Unsqueeze", [t, g.const("ax2", [2])]),
                                    g.const(f"rep_{H // KV}", [1, 1, H // KV, 1, 1])])
                return g.op("Reshape", [e, g.const(f"shape_rep{H}", [0, H, -1, D])], name=f"{p}.{nm}_rep")
            kk, vv = rep(pk, "k"), rep(pv, "v")
        sc = g.op("MatMul", [q, g.op("Transpose", [kk], perm=[0, 1, 3, 2])])
        sc = g.op("Add", [g.op("Mul", [sc, scale]), bias])
        att = g.op("MatMul", [g.op("Softmax", [sc], axis=-1), vv])  # [B, H, S, D]
        att = g.op("Reshape", [g.op("Transpose", [att], perm=[0, 2, 1, 3]), g.const("shape_merge", [0, 0, H * D])])
        x = g.op("Add", [x, g.op("MatMul", [att, g.init(f"{p}.o_proj.weight", w[l]["o"])])])
        h = rms(g, x, g.init(f"{p}.post_attention_layernorm.weight", w[l]["ln2"]))
        gate = g.op("MatMul", [h, g.init(f"{p}.mlp.gate_proj.weight", w[l]["gate"])])
        up = g.op("MatMul", [h, g.init(f"{p}.mlp.up_proj.weight", w[l]["up"])])
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        x = g.op("Add", [x, g.op("MatMul", [act, g.init(f"{p}.mlp.down_proj.weight", w[l]["down"])])])
        outputs += [pk, pv]
    h = rms(g, x, g.init("model.norm.weight", w["norm"]))
    g.nodes.append(helper.make_node("MatMul", [h, g.init("lm_head.weight", w["lm_head"])], ["logits"], name="lm_head"))
    return g, [], 21


def quant4(wt, block, asym):
    """wt [K, N] -> MatMulNBits B [N, nb, block/2] uint8, scales [N*nb], zero points [N*ceil(nb/2)] or None."""
    K, N = wt.shape
    nb = (K + block - 1) // block
    wp = np.zeros((nb * block, N), np.float32)
    wp[:K] = wt
    blk = wp.T.reshape(N, nb, block)
    if asym:
        mn, mx = np.minimum(blk.min(-1), 0), np.maximum(blk.max(-1), 0)
        sc = np.where(mx > mn, (mx - mn) / 15.0, 1.0).astype(np.float32)
        zp = np.clip(np.round(-mn / sc), 0, 15).astype(np.uint8)
    else:
        amax = np.abs(blk).max(-1)
        sc = np.where(amax > 0, amax / 7.0, 1.0).astype(np.float32)
        zp = np.full((N, nb), 8, np.uint8)
    q = np.clip(np.round(blk / sc[..., None]) + zp[..., None], 0, 15).astype(np.uint8)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    zpk = None
    if asym:
        zz = np.zeros((N, (nb + 1) // 2 * 2), np.uint8)
        zz[:, :nb] = zp
        zpk = (zz[:, 0::2] | (zz[:, 1::2] << 4)).reshape(-1).astype(np.uint8)
    return packed, sc.reshape(-1), zpk


def random4(K, N, block, asym, rng):
    """quant4's outputs drawn directly (--random-weights): packed nibbles, scales about what
    quant4 gives a weight of std 1/sqrt(K), zero points 8 or random; no float weight made."""
    nb = (K + block - 1) // block
    packed = rng.integers(0, 256, (N, nb, block // 2), dtype=np.uint8)
    sc = (rng.uniform(0.5, 1.5, N * nb) * (2.5 / 7.0 / np.sqrt(K))).astype(np.float32)
    zpk = rng.integers(0, 256, N * ((nb + 1) // 2), dtype=np.uint8) if asym else None
    return packed, sc, zpk


def build_gqa(a, w):
    H, KV, D, hid = a.heads, a.kv_heads, a.hidden // a.heads, a.hidden
    g = G()
    block = a.block
    fdt = np.float16 if a.dtype == "fp16" else np.float32
    rng = np.random.default_rng(a.seed + 1)

    def mmnb(x, wt, name):
        K, N = wt if isinstance(wt, tuple) else wt.shape
        packed, sc, zp = random4(K, N, block, a.asymmetric, rng) if isinstance(wt, tuple) else quant4(wt, block, a.asymmetric)
        ins = [x, g.init(f"{name}.weight_Q4", packed), g.init(f"{name}.weight_scales", sc.astype(fdt))]
        if zp is not None:
            ins.append(g.init(f"{name}.weight_zp", zp))
        return g.op("MatMulNBits", ins, domain="com.microsoft", name=f"{name}/MatMulNBits",
                    K=K, N=N, bits=4, block_size=block, accuracy_level=a.accuracy_level)
    cos, sin = rope_cache(a.context, D)
    g.init("cos_cache", cos.astype(fdt))
    g.init("sin_cache", sin.astype(fdt))

    def vec(name, n, ref):  # a norm's weight: ref() from the float weights, or drawn
        return g.init(name, (ref() if w else 1 + 0.1 * rng.standard_normal(n)).astype(fdt))

    def mat(l, key, K, N):  # a layer's float weight [K, N], or its shape (--random-weights)
        return (K, N) if not w else w[l][key]
    # the builder's attention-mask subgraph
    rs = g.op("ReduceSum", ["attention_mask", g.const("one_axis", [1])], keepdims=0, name="/model/attn_mask_reformat/attn_mask_subgraph/ReduceSum")
    seqlens = g.op("Cast", [g.op("Sub", [rs, g.const("one64", np.int64(1))])], to=TensorProto.INT32,
                   name="/model/attn_mask_reformat/attn_mask_subgraph/Sub/Cast")
    total = g.op("Cast", [g.op("Gather", [g.op("Shape", ["attention_mask"]), g.const("one_idx", np.int64(1))], axis=0)],
                 to=TensorProto.INT32, name="/model/attn_mask_reformat/attn_mask_subgraph/Gather/Cast")
    embed = w["embed"] if w else rng.standard_normal((a.vocab, hid), dtype=np.float32) * 0.5
    x = g.op("Gather", [g.init("model.embed_tokens.weight", embed.astype(fdt)), "input_ids"], axis=0)
    residual = None
    for l in range(a.layers):
        p = f"/model/layers.{l}"
        if residual is None:
            h = g.op("SimplifiedLayerNormalization", [x, vec(f"model.layers.{l}.input_layernorm.weight", hid, lambda: w[l]["ln1"])],
                     name=f"{p}/input_layernorm/LayerNorm", axis=-1, epsilon=1e-5, stash_type=1)
            residual = x
        else:
            h, _, _, residual = g.op("SkipSimplifiedLayerNormalization",
                                     [x, residual, vec(f"model.layers.{l}.input_layernorm.weight", hid, lambda: w[l]["ln1"])], 4,
                                     domain="com.microsoft", name=f"{p}/input_layernorm/SkipLayerNorm", epsilon=1e-5)
        qkv_w = np.concatenate([w[l]["q"], w[l]["k"], w[l]["v"]], axis=1) if w else (hid, (H + 2 * KV) * D)
        qkv = mmnb(h, qkv_w, f"model.layers.{l}.attn.qkv_proj")
        pk, pv = f"present.{l}.key", f"present.{l}.value"
        g.nodes.append(helper.make_node(
            "GroupQueryAttention", [qkv, "", "", f"past_key_values.{l}.key", f"past_key_values.{l}.value", seqlens, total,
                                    "cos_cache", "sin_cache"],
            [f"{p}/attn/GQA/out", pk, pv], name=f"{p}/attn/GroupQueryAttention", domain="com.microsoft",
            num_heads=H, kv_num_heads=KV, scale=float(1.0 / np.sqrt(D)), do_rotary=1, rotary_interleaved=0,
            local_window_size=-1, softcap=0.0))
        o = mmnb(f"{p}/attn/GQA/out", mat(l, "o", H * D, hid), f"model.layers.{l}.attn.o_proj")
        h, _, _, residual = g.op("SkipSimplifiedLayerNormalization",
                                 [o, residual, vec(f"model.layers.{l}.post_attention_layernorm.weight", hid, lambda: w[l]["ln2"])], 4,
                                 domain="com.microsoft", name=f"{p}/post_attention_layernorm/SkipLayerNorm", epsilon=1e-5)
        gate = mmnb(h, mat(l, "gate", hid, a.intermediate), f"model.layers.{l}.mlp.gate_proj")
        up = mmnb(h, mat(l, "up", hid, a.intermediate), f"model.layers.{l}.mlp.up_proj")
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        x = mmnb(act, mat(l, "down", a.intermediate, hid), f"model.layers.{l}.mlp.down_proj")
    h = g.op("SkipSimplifiedLayerNormalization", [x, residual, vec("model.norm.weight", hid, lambda: w["norm"])], 1,
             domain="com.microsoft", name="/model/norm/SkipLayerNorm", epsilon=1e-5)
    packed, sc, zp = quant4(w["lm_head"], block, a.asymmetric) if w else random4(hid, a.vocab, block, a.asymmetric, rng)
    ins = [h, g.init("lm_head.MatMul.weight_Q4", packed), g.init("lm_head.MatMul.weight_scales", sc.astype(fdt))]
    if zp is not None:
        ins.append(g.init("lm_head.MatMul.weight_zp", zp))
    g.nodes.append(helper.make_node("MatMulNBits", ins, ["logits"], name="/lm_head/MatMulNBits", domain="com.microsoft",
                                    K=hid, N=a.vocab, bits=4, block_size=block, accuracy_level=a.accuracy_level))
    return g, [helper.make_opsetid("com.microsoft", 1)], 21


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--form", choices=["onnx", "gqa"], default="onnx")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--asymmetric", action="store_true")
    ap.add_argument("--block", type=int, default=32, help="MatMulNBits block_size (--form gqa)")
    ap.add_argument("--accuracy-level", type=int, default=4,
                    help="MatMulNBits accuracy_level (4: the builder's CPU default, ORT quantizes A to int8 per block)")
    ap.add_argument("--eos", default="2,3", help="eos token ids, comma-separated")
    ap.add_argument("--intermediate", type=int, default=0, help="MLP width (default 2 * hidden)")
    ap.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32",
                    help="activations, scales, norms, caches and logits (--form gqa)")
    ap.add_argument("--random-weights", action="store_true",
                    help="--form gqa: packed int4 weights drawn directly, no float weights (large shapes)")
    ap.add_argument("--external-data", action="store_true", help="weights in model.onnx.data (models over 2 GB)")
    a = ap.parse_args()
    a.intermediate = a.intermediate or 2 * a.hidden
    if a.form != "gqa" and (a.dtype != "fp32" or a.random_weights):
        ap.error("--dtype fp16 and --random-weights are for --form gqa")
    rng = np.random.default_rng(a.seed)
    w = None if a.random_weights else weights(a, rng)
    g, extra_opsets, opset = (build_gqa if a.form == "gqa" else build_onnx)(a, w)
    D = a.hidden // a.heads
    share = a.form == "gqa"
    seq = "max_length" if share else "past_sequence_length"
    tot = "max_length" if share else "total_sequence_length"
    fty = TensorProto.FLOAT16 if a.dtype == "fp16" else TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
           helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])]
    outs = [helper.make_tensor_value_info("logits", fty, ["batch_size", "sequence_length", a.vocab])]
    for l in range(a.layers):
        for kind in ("key", "value"):
            ins.append(helper.make_tensor_value_info(f"past_key_values.{l}.{kind}", fty,
                                                     ["batch_size", a.kv_heads, seq, D]))
            outs.append(helper.make_tensor_value_info(f"present.{l}.{kind}", fty,
                                                      ["batch_size", a.kv_heads, tot, D]))
    graph = helper.make_graph(g.nodes, "llm", ins, outs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)] + extra_opsets,
                              producer_name="kiln make_llm.py")
    model.ir_version = 10
    os.makedirs(a.out_dir, exist_ok=True)
    onnx.save(model, os.path.join(a.out_dir, "model.onnx"), save_as_external_data=a.external_data,
              location="model.onnx.data")
    max_length = a.max_length or a.context
    cfg = {
        "model": {
            "bos_token_id": 1, "context_length": a.context, "eos_token_id": [int(t) for t in a.eos.split(",")], "pad_token_id": 0,
            "type": "llama", "vocab_size": a.vocab,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx", "head_size": D, "hidden_size": a.hidden,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": a.heads, "num_hidden_layers": a.layers, "num_key_value_heads": a.kv_heads,
            },
        },
        "search": {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
                   "max_length": max_length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": share, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 1, "top_p": 1.0},
    }
    with open(os.path.join(a.out_dir, "genai_config.json"), "w") as f:
        json.dump(cfg, f, indent=4)
    print(f"wrote {a.out_dir}: form {a.form}, {a.layers} layers, hidden {a.hidden}, heads {a.heads}/{a.kv_heads}, "
          f"vocab {a.vocab}, context {a.context}, {len(g.nodes)} nodes")


if __name__ == "__main__":
    main()
