#!/usr/bin/env python3
"""GPU benchmark: kiln's CUDA provider against PyTorch eager and torch.compile on the same
models and inputs, on the GPU machine. Figures, not a test: it fails only when it cannot run.

  resnet50  torchvision ResNet-50, random weights, batch 1 and 32, 3x224x224
  mobilenet_v3, efficientnet_b0, convnext_tiny, vit_b_16
            the torchvision models of those names (MobileNetV3-Large for mobilenet_v3), the same way
  bert      transformers BertModel (bert-base BertConfig, random init), seq 128, batch 1 and 32
  gpt2      transformers GPT2LMHeadModel (gpt2 config, random init), one decode step with a KV cache
            of 128 positions (inputs input_ids, attention_mask, past_key_values.N.key/value; outputs
            logits and present.N.key/value), batch 1 and 32
  encoder   the TTS-like encoder of tests/models/make_models.py, batch 1, lengths 16, 64, 128, 256, 512
            (PyTorch runs a port of it on the ONNX model's own weights)

each in fp32 and fp16 (fp16: model.half() before the export). ResNet-50 and BERT are exported
from PyTorch here (opset 17, dynamic batch / sequence axes). kiln is timed through a ctypes
loop over kiln_session_run_with_outputs with the values wrapped once: the inputs are PyTorch's
device tensors and the outputs land in bound device tensors (ONNX Runtime's IOBinding), as
PyTorch's stay on the GPU; a second kiln column times numpy in and out through
kiln_session_run, host copies included. Times are medians over repeated runs after warm-up,
each run synchronised (torch.cuda.synchronize; kiln's runs return complete). fp32 runs strict fp32 in
PyTorch (no TF32), as kiln does. Each model's kiln output is checked once against PyTorch's
(max abs diff printed) so that a fast but wrong result shows. Per model also: how long the
session took to create, and a second one of the same file (the kernel cache warm), and the
first run at batch sizes the session has not seen against repeat runs there (issue 31: at
most 1.2x).

usage: bench_gpu.py [--kiln-lib PATH] [--md FILE] [--models resnet50,bert,encoder,...]
                    [--dtypes fp32,fp16] [--budget SECONDS] [--no-compile] [--quick] [--model-dir DIR]
                    [--profile 'batch 32'|all]
  --md       also write the table as markdown (default $OUT/bench_gpu.md when OUT is set)
  --budget   wall-clock budget (default 230 s): torch.compile runs last, in order of
             importance, while the budget lasts; what is left out says so in the table
"""
import argparse
import ctypes as C
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import kiln  # noqa: E402

T_START = time.monotonic()


def elapsed():
    return time.monotonic() - T_START


def log(msg):
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


# ---- timing ----

def median_ms(fn, warmup, min_runs=10, max_runs=100, min_time=1.0):
    for _ in range(warmup):
        fn()
    times = []
    t_end = time.perf_counter() + min_time
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() < t_end):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


class KilnLoop:
    """kiln_session_run on pre-wrapped inputs. Host I/O (device=None): numpy inputs, copied to the
    GPU and the outputs back on every call, outputs freed without conversion. Device I/O (device=
    (torch input tensors by name, torch output tensors)): the inputs are read where PyTorch holds
    them and the outputs written into the bound tensors, as ONNX Runtime's IOBinding does."""

    def __init__(self, sess, feeds, device=None):
        lib = sess._lib
        self.sess, self.lib = sess, lib
        self.arrays = [np.ascontiguousarray(a) for a in feeds.values()]
        self.handles, self.storage = [], []
        names = [o["name"] for o in sess.outputs]

        def wrap(fn, dtype, shape, ptr, nbytes):
            h = C.c_void_p()
            dims = (C.c_int64 * max(len(shape), 1))(*shape)
            st = fn(kiln._CODES[np.dtype(dtype)], len(shape), dims, C.c_void_p(ptr), nbytes, C.byref(h))
            if st:
                raise kiln.KilnError(st, "cannot wrap a tensor")
            return h
        if device is None:
            for a in self.arrays:
                self.handles.append(wrap(lib.kiln_value_wrap_tensor, a.dtype, a.shape, a.ctypes.data, a.nbytes))
        else:
            tin, tout = device
            for n, a in zip(feeds, self.arrays):
                t = tin[n].contiguous()
                self.arrays.append(t)  # kept alive
                self.handles.append(wrap(lib.kiln_value_wrap_device_tensor, a.dtype, a.shape, t.data_ptr(),
                                         t.numel() * t.element_size()))
            for t in tout:
                dt = str(t.dtype).replace("torch.", "")
                self.storage.append(wrap(lib.kiln_value_wrap_device_tensor, dt, tuple(t.shape), t.data_ptr(),
                                         t.numel() * t.element_size()))
        self.n_in, self.n_out = len(self.handles), len(names)
        self.in_names = (C.c_char_p * self.n_in)(*[n.encode() for n in feeds])
        self.in_vals = (C.c_void_p * self.n_in)(*[h.value for h in self.handles])
        self.out_names = (C.c_char_p * self.n_out)(*[n.encode() for n in names])
        self.outs = (C.c_void_p * self.n_out)()
        self.bind = None
        if device is not None:
            bind = (kiln._lib.OutputBinding * self.n_out)()
            for j in range(self.n_out):
                bind[j].on_device = True
                bind[j].storage = self.storage[j].value if j < len(self.storage) else None
            self.bind = bind

    def __call__(self):
        lib = self.lib
        if self.bind is None:
            st = lib.kiln_session_run(self.sess._h, self.n_in, self.in_names, self.in_vals, self.n_out,
                                      self.out_names, self.outs)
        else:
            st = lib.kiln_session_run_with_outputs(self.sess._h, self.n_in, self.in_names, self.in_vals, self.n_out,
                                                   self.out_names, self.bind, self.outs)
        if st:
            raise kiln.KilnError(st, lib.kiln_last_error(self.sess._h).decode(errors="replace"))
        for j in range(self.n_out):
            if self.bind is not None and j < len(self.storage):
                ptr_out, ptr_st = lib.kiln_value_data(self.outs[j]), lib.kiln_value_data(self.storage[j])
                if ptr_out != ptr_st:
                    raise RuntimeError("kiln did not write the output into the bound device tensor")
            lib.kiln_value_free(self.outs[j])
            self.outs[j] = None

    def close(self):
        for h in self.handles + self.storage:
            self.lib.kiln_value_free(h)
        self.handles, self.storage = [], []


def kernel_profile(torch, fn, runs=5, top=15):
    """The GPU kernels fn launches (kiln's included: CUPTI sees the whole process), by total
    time over `runs` calls, as torch.profiler's table."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total"):
        try:
            return ka.table(sort_by=key, row_limit=top, max_name_column_width=70)
        except Exception:  # noqa: BLE001 - the key's name changed across torch versions
            continue
    return ka.table(row_limit=top)


def first_runs(label, sess, path, make_inputs, name, created):
    """Session creation (this one, and a second one of the same file: the kernel cache warm) and
    the first run at shapes the session has not seen against repeat runs there: a new shape
    compiles nothing, so the first run should cost about what a repeat does (it plans memory
    and is not yet a replayed CUDA graph). Host I/O on both sides."""
    t = time.perf_counter()
    try:
        again = kiln.Session(path, provider="cuda")
        warm = time.perf_counter() - t
        again.close()
    except Exception:  # noqa: BLE001 - the figure is left out
        warm = None
    out = {"model": label, "create": created, "create_again": warm, "shapes": []}
    for n in ((2, 3, 5) if name != "encoder" else (24, 40, 80)):
        _, feeds = make_inputs(n)
        feeds = {k: v for k, v in feeds.items() if k in {i["name"] for i in sess.inputs}}
        try:
            t = time.perf_counter()
            sess.run(feeds)
            first = (time.perf_counter() - t) * 1e3
            repeat = median_ms(lambda: sess.run(feeds), warmup=2, max_runs=20, min_time=0.2)
        except Exception as e:  # noqa: BLE001 - recorded, not fatal
            log(f"{label} new shape {n}: {e}")
            continue
        out["shapes"].append((n, first, repeat))
        log(f"{label} new shape {n}: first run {first:.3f} ms, repeat {repeat:.3f} ms ({first / repeat:.2f}x)")
    return out


# ---- models ----

def export(torch, model, args, path, input_names, output_names, dynamic_axes, dynamo_first=False):
    """ONNX export at opset 17: the TorchScript exporter, else the dynamo one (dynamo_first: the
    other way round)."""
    errors = []
    kws = [{"dynamo": False, "opset_version": 17}, {"dynamo": True, "opset_version": 17},
           {"dynamo": True, "opset_version": 18}]
    if dynamo_first:
        kws = kws[1:] + kws[:1]
    for kw in kws:
        try:
            with torch.no_grad():
                torch.onnx.export(model, args, path, input_names=input_names, output_names=output_names,
                                  dynamic_axes=dynamic_axes, **kw)
            return f"dynamo={kw['dynamo']} opset {kw['opset_version']}"
        except Exception as e:  # noqa: BLE001 - try the next exporter
            errors.append(f"{kw}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    raise RuntimeError("ONNX export failed: " + " | ".join(errors))


VISION = {"resnet50": "resnet50", "mobilenet_v3": "mobilenet_v3_large", "efficientnet_b0": "efficientnet_b0",
          "convnext_tiny": "convnext_tiny", "vit_b_16": "vit_b_16"}


def trained_like(torch, m):
    """Random weights with the statistics of trained ones where torchvision's initialisation
    leaves outputs constant or vanishing (ViT's head starts at zero; MobileNetV3's logits were
    ~1e-9, 0 in fp16), so the accuracy check compares something: BatchNorm scale, shift and
    running statistics drawn near trained ranges, and weights that start all zero drawn small."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) and mod.affine and mod.track_running_stats:
                mod.weight.uniform_(0.5, 1.5, generator=g)
                mod.bias.normal_(0.0, 0.1, generator=g)
                mod.running_mean.normal_(0.0, 0.1, generator=g)
                mod.running_var.uniform_(0.5, 1.5, generator=g)
            for p in mod.parameters(recurse=False):
                if p.dim() >= 2 and not p.any():
                    p.normal_(0.0, 0.02, generator=g)
    return m


def vision(name, torch, dtype, tmp):
    """A torchvision image classifier (random weights, trained_like), 3x224x224, batch 1 and 32."""
    import torchvision
    m = trained_like(torch, getattr(torchvision.models, VISION[name])(weights=None)).eval().cuda()
    if dtype == "fp16":
        m = m.half()
    tdt = torch.float16 if dtype == "fp16" else torch.float32
    path = os.path.join(tmp, f"{name}_{dtype}.onnx")
    # (the TorchScript exporter writes ViT's attention reshapes with batch 1 as a constant; the
    # dynamo one specializes a dim whose example is 1: the example batch is 2)
    how = export(torch, m, (torch.randn(2, 3, 224, 224, device="cuda", dtype=tdt),), path, ["input"], ["logits"],
                 {"input": {0: "batch"}, "logits": {0: "batch"}}, dynamo_first=name == "vit_b_16")

    def inputs(batch):
        x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=tdt)
        return (x,), {"input": x.cpu().numpy()}
    return m, path, how, inputs, [("batch 1", 1), ("batch 32", 32)]


def bert(torch, dtype, tmp, seq=128):
    from transformers import BertConfig, BertModel
    cfg = BertConfig()  # bert-base: 12 layers, hidden 768, 12 heads
    torch.manual_seed(0)
    try:  # PyTorch runs its fastest attention; the export traces the plain one (same weights)
        fast = BertModel(BertConfig(attn_implementation="sdpa"), add_pooling_layer=False)
        plain = BertModel(BertConfig(attn_implementation="eager"), add_pooling_layer=False)
        plain.load_state_dict(fast.state_dict())
    except Exception:  # noqa: BLE001 - older transformers: one model
        fast = plain = BertModel(cfg, add_pooling_layer=False)
    fast, plain = fast.eval().cuda(), plain.eval().cuda()
    if dtype == "fp16":
        fast, plain = fast.half(), plain.half()
    path = os.path.join(tmp, f"bert_{dtype}.onnx")

    class Wrap(torch.nn.Module):  # tuple in, last_hidden_state out
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(0, cfg.vocab_size, (1, seq), device="cuda")
    how = export(torch, Wrap(plain), (ids, torch.ones_like(ids)), path, ["input_ids", "attention_mask"],
                 ["last_hidden_state"], {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                                         "last_hidden_state": {0: "batch", 1: "seq"}})

    def inputs(batch):
        i = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
        mask = torch.ones_like(i)
        return (i, mask), {"input_ids": i.cpu().numpy(), "attention_mask": mask.cpu().numpy()}
    return Wrap(fast).eval(), path, how, inputs, [(f"batch 1 seq {seq}", 1), (f"batch 32 seq {seq}", 32)]


def gpt2(torch, dtype, tmp, past=128):
    """GPT-2 (124M shape, random init) as a decode step: one new token a row against a KV cache of
    `past` positions, logits and the presents out; PyTorch runs its SDPA attention, the export
    traces the plain one (same weights)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config()
    torch.manual_seed(0)
    try:
        fast = GPT2LMHeadModel(GPT2Config(attn_implementation="sdpa"))
        plain = GPT2LMHeadModel(GPT2Config(attn_implementation="eager"))
        plain.load_state_dict(fast.state_dict())
    except Exception:  # noqa: BLE001 - older transformers: one model
        fast = plain = GPT2LMHeadModel(cfg)
    fast, plain = fast.eval().cuda(), plain.eval().cuda()
    if dtype == "fp16":
        fast, plain = fast.half(), plain.half()
    tdt = torch.float16 if dtype == "fp16" else torch.float32
    L, H, D = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head
    path = os.path.join(tmp, f"gpt2_{dtype}.onnx")

    class Step(torch.nn.Module):  # flat tensors in and out: ids, mask, past k/v per layer
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, *kv):
            try:
                from transformers import DynamicCache
                cache = DynamicCache()
                for i in range(L):
                    cache.update(kv[2 * i], kv[2 * i + 1], i)
            except ImportError:  # older transformers: the tuple form
                cache = tuple((kv[2 * i], kv[2 * i + 1]) for i in range(L))
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            pk = out.past_key_values
            if hasattr(pk, "layers"):
                flat = [t for layer in pk.layers for t in (layer.keys, layer.values)]
            elif hasattr(pk, "key_cache"):
                flat = [t for i in range(L) for t in (pk.key_cache[i], pk.value_cache[i])]
            else:
                flat = [t for kvp in pk for t in kvp]
            return (out.logits, *flat)

    def inputs(batch):
        ids = torch.randint(0, cfg.vocab_size, (batch, 1), device="cuda")
        mask = torch.ones(batch, past + 1, dtype=torch.int64, device="cuda")
        kv = [torch.randn(batch, H, past, D, device="cuda", dtype=tdt) for _ in range(2 * L)]
        feeds = {"input_ids": ids.cpu().numpy(), "attention_mask": mask.cpu().numpy()}
        for i in range(L):
            feeds[f"past_key_values.{i}.key"] = kv[2 * i].cpu().numpy()
            feeds[f"past_key_values.{i}.value"] = kv[2 * i + 1].cpu().numpy()
        return (ids, mask, *kv), feeds

    names = [f"past_key_values.{i}.{t}" for i in range(L) for t in ("key", "value")]
    outs = ["logits"] + [f"present.{i}.{t}" for i in range(L) for t in ("key", "value")]
    axes = {"input_ids": {0: "batch"}, "attention_mask": {0: "batch", 1: "total"}, "logits": {0: "batch"}}
    axes.update({n: {0: "batch", 2: "past"} for n in names})
    axes.update({n: {0: "batch", 2: "total"} for n in outs[1:]})
    how = export(torch, Step(plain), inputs(2)[0], path, ["input_ids", "attention_mask", *names], outs, axes)
    return Step(fast).eval(), path, how, inputs, [("batch 1 past 128", 1), ("batch 32 past 128", 32)]


class NumpyOps:
    @staticmethod
    def layer_norm(x, g, b, eps):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b

    @staticmethod
    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    relu = staticmethod(lambda x: np.maximum(x, 0))
    permute = staticmethod(lambda x, p: x.transpose(p))
    swap_last = staticmethod(lambda x: np.swapaxes(x, -1, -2))
    mean1 = staticmethod(lambda x: x.mean(1))
    cat_last = staticmethod(lambda a, b: np.concatenate([a, b], -1))


def torch_ops(torch):
    class TorchOps:
        layer_norm = staticmethod(lambda x, g, b, eps: torch.nn.functional.layer_norm(x, g.shape, g, b, eps))
        softmax = staticmethod(lambda x: torch.softmax(x, -1))
        relu = staticmethod(torch.relu)
        permute = staticmethod(lambda x, p: x.permute(*p))
        swap_last = staticmethod(lambda x: x.transpose(-1, -2))
        mean1 = staticmethod(lambda x: x.mean(1))
        cat_last = staticmethod(lambda a, b: torch.cat([a, b], -1))
    return TorchOps


def encoder_forward(W, tokens, F, layers=2, heads=4):
    """The graph of make_models.encoder(), op for op: returns (hidden, pooled, frames)."""
    b, s = tokens.shape
    d = W["embedding"].shape[1]
    x = W["embedding"][tokens] + W["positions"][:s]
    for i in range(layers):
        h = F.layer_norm(x, W[f"ln{i}_g"], W[f"ln{i}_b"], 1e-5)
        q, k, v = (F.permute((h @ W[f"w{t}{i}"]).reshape(b, s, heads, d // heads), (0, 2, 1, 3)) for t in "qkv")
        a = F.softmax((q @ F.swap_last(k)) * W["scale"])
        o = F.permute(a @ v, (0, 2, 1, 3)).reshape(b, s, d)
        x = x + o @ W[f"wo{i}"]
        x = x + F.relu(x @ W[f"w1_{i}"] + W[f"b1_{i}"]) @ W[f"w2_{i}"]
    return x, F.mean1(x), F.cat_last(x, x).reshape(b, 2 * s, d)


def encoder_onnx(dtype, tmp):
    """The make_models encoder; fp16: every float initializer and output in float16."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    spec = importlib.util.spec_from_file_location("make_models", os.path.join(HERE, "..", "tests", "models", "make_models.py"))
    mm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mm)
    graph = mm.encoder()
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    if dtype == "fp16":
        for i, init in enumerate(graph.initializer):
            if init.data_type == TensorProto.FLOAT:
                graph.initializer[i].CopyFrom(numpy_helper.from_array(weights[init.name].astype(np.float16), init.name))
        for o in graph.output:
            o.type.tensor_type.elem_type = TensorProto.FLOAT16
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", mm.OPSET)], producer_name="kiln")
    model.ir_version = 8
    path = os.path.join(tmp, f"encoder_{dtype}.onnx")
    onnx.save(model, path)
    return path, weights


def encoder(torch, dtype, tmp, lengths):
    path, weights = encoder_onnx(dtype, tmp)
    tdt = torch.float16 if dtype == "fp16" else torch.float32
    F = torch_ops(torch)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for n, w in weights.items():
                t = torch.from_numpy(np.array(w))
                self.register_buffer(n, t.to(tdt) if t.is_floating_point() else t)

        def forward(self, tokens):
            return encoder_forward({n: getattr(self, n) for n in weights}, tokens, F)

    def inputs(length):
        t = torch.randint(0, 100, (1, length), device="cuda")
        return (t,), {"tokens": t.cpu().numpy()}
    return Encoder().eval().cuda(), path, "onnx.helper (make_models.py)", inputs, [(f"seq {n}", n) for n in lengths]


# ---- the run ----

def fmt_ms(v):
    return f"{v:.3f}" if isinstance(v, float) else v


def ratio(a, b):
    return f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) and b > 0 else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln-lib", default=os.environ.get("KILN_LIB"))
    ap.add_argument("--md", default=os.path.join(os.environ["OUT"], "bench_gpu.md") if os.environ.get("OUT") else None)
    ap.add_argument("--models", default="resnet50,bert,encoder",
                    help="of resnet50, mobilenet_v3, efficientnet_b0, convnext_tiny, vit_b_16, bert, gpt2, encoder")
    ap.add_argument("--dtypes", default="fp32,fp16")
    ap.add_argument("--budget", type=float, default=230.0)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--profile", help="print kiln's GPU kernels (torch.profiler) for the shapes whose label "
                    "contains this text ('batch 32'), or 'all'")
    ap.add_argument("--model-dir", help="write the exported ONNX files here (default: a temporary folder)")
    ap.add_argument("--quick", action="store_true", help="batch 1 only, encoder lengths 16/128/512, fewer runs")
    a = ap.parse_args()
    if a.kiln_lib:
        os.environ["KILN_LIB"] = a.kiln_lib
    models = [m for m in a.models.split(",") if m]
    dtypes = [d for d in a.dtypes.split(",") if d]
    bad = [m for m in models if m not in ("bert", "gpt2", "encoder", *VISION)] + [d for d in dtypes if d not in ("fp32", "fp16")]
    if bad:
        ap.error(f"unknown model or dtype: {bad}")
    try:
        import torch
    except ImportError as e:
        print(f"SKIP bench_gpu: no PyTorch ({e})")
        return 0
    if not torch.cuda.is_available():
        print("SKIP bench_gpu: PyTorch sees no CUDA device")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)
    lengths = [16, 128, 512] if a.quick else [16, 64, 128, 256, 512]
    max_runs = 30 if a.quick else 100
    gpu = torch.cuda.get_device_name(0)
    log(f"{gpu}; torch {torch.__version__}; kiln library {kiln.library()._name}")

    rows, compile_jobs, new_shapes = [], [], []
    tmp = a.model_dir or tempfile.mkdtemp(prefix="kiln-bench-")
    os.makedirs(tmp, exist_ok=True)
    builders = {"bert": bert, "gpt2": gpt2, **{v: (lambda torch, dtype, tmp, v=v: vision(v, torch, dtype, tmp)) for v in VISION}}
    for name in models:
        for dtype in dtypes:
            label = f"{name} {dtype}"
            try:
                if name == "encoder":
                    model, path, how, make_inputs, shapes = encoder(torch, dtype, tmp, lengths)
                else:
                    model, path, how, make_inputs, shapes = builders[name](torch, dtype, tmp)
                if a.quick:
                    shapes = [s for s in shapes if "batch 32" not in s[0]]
                log(f"{label}: model ready ({how})")
            except Exception as e:  # noqa: BLE001 - a model that cannot be built is a row, not an abort
                traceback.print_exc()
                rows.append({"model": label, "shape": "-", "note": f"build/export failed: {e}"})
                continue
            created = None
            try:
                t = time.perf_counter()
                sess = kiln.Session(path, provider="cuda")
                created = time.perf_counter() - t
            except Exception as e:  # noqa: BLE001
                sess = None
                kiln_error = f"kiln session: {e}"
                log(f"{label}: {kiln_error}")
            for si, (shape_label, n) in enumerate(shapes):
                row = {"model": label, "shape": shape_label, "note": ""}
                rows.append(row)
                targs, feeds = make_inputs(n)
                tin = dict(zip(feeds, targs))
                if sess is not None:  # an exporter may drop an input it traced as unused
                    feeds = {k: v for k, v in feeds.items() if k in {i["name"] for i in sess.inputs}}
                with torch.no_grad():
                    ref = model(*targs)
                ref = ref[0] if isinstance(ref, tuple) else ref
                if sess is None:
                    row["kiln"] = "error"
                    row["note"] = kiln_error
                else:
                    try:
                        outs = sess.run(feeds)
                        got = outs[0]
                        want = ref.float().cpu().numpy()
                        if si == 0 or name == "encoder":
                            diff = float(np.max(np.abs(got.astype(np.float64) - want))) if got.size else 0.0
                            scale = float(np.max(np.abs(want))) if want.size else 0.0
                            row["diff"] = f"{diff:.3g} (max |ref| {scale:.3g})"
                            log(f"{label} {shape_label}: kiln vs PyTorch max abs diff {diff:.4g}, max |ref| {scale:.4g}")
                        loop = KilnLoop(sess, feeds)
                        row["kiln_host"] = median_ms(loop, warmup=5, max_runs=max_runs)
                        loop.close()
                        tout = [torch.empty(o.shape, dtype=getattr(torch, str(o.dtype)), device="cuda") for o in outs]
                        loop = KilnLoop(sess, feeds, device=(tin, tout))
                        loop()
                        torch.cuda.synchronize()
                        bound = tout[0].cpu().numpy()
                        if not np.array_equal(bound, got):
                            # a repeated shape may run another GEMM algorithm than its first run
                            # (which borrows its shape class's): rounding apart, the two agree
                            d = float(np.max(np.abs(bound.astype(np.float64) - got))) if got.size else 0.0
                            top = float(np.max(np.abs(got))) if got.size else 0.0
                            if not d <= (1e-2 if dtype == "fp16" else 1e-4) * max(top, 1.0):
                                raise RuntimeError(f"device-bound output differs from the host run's by {d:.3g}")
                            row["note"] = f"bound run vs first run {d:.2g}"
                        row["kiln"] = median_ms(loop, warmup=5, max_runs=max_runs)
                        if a.profile and (a.profile == "all" or a.profile in shape_label):
                            log(f"{label} {shape_label}: kiln's kernels over 5 runs\n" + kernel_profile(torch, loop))
                        loop.close()
                    except Exception as e:  # noqa: BLE001
                        row["kiln"] = "error"
                        row["note"] = f"kiln: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                        log(f"{label} {shape_label}: {row['note']}")

                def eager(model=model, targs=targs):
                    model(*targs)
                    torch.cuda.synchronize()
                row["eager"] = median_ms(eager, warmup=3, max_runs=max_runs)
                row["compile"] = "skipped (budget)" if not a.no_compile else "-"
                log(f"{label} {shape_label}: kiln {fmt_ms(row.get('kiln'))} ms (host I/O "
                    f"{fmt_ms(row.get('kiln_host'))} ms), eager {row['eager']:.3f} ms")
                # compile order: batch 1 / the first shape of each model first, fp16 before fp32
                prio = (si, 0 if dtype == "fp16" else 1)
                compile_jobs.append((prio, label, model, targs, row, name))
            if sess is not None and not a.quick:
                new_shapes.append(first_runs(label, sess, path, make_inputs, name, created))
            if sess is not None:
                st = sess.stats()
                for r in rows:
                    if r["model"] == label:
                        r["nodes"] = f"{st['nodes_gpu']}/{st['nodes_cpu']}"
                        r["graphs"] = st["graphs_replayed"]
                        if st.get("graphs_note"):
                            r["note"] = (r["note"] + "; " if r["note"] else "") + "not recorded: " + st["graphs_note"]
                            log(f"{label}: not recorded: {st['graphs_note']}")
                sess.close()
            torch.cuda.empty_cache()

    # torch.compile, most important first, while the budget lasts: mode reduce-overhead (CUDA
    # graphs) for the first shape of each model (batch 1), the default mode for the others; one
    # compiled module per model, dtype and mode (a later shape recompiles or runs dynamic,
    # counted in its compile time)
    compiled = {}
    if not a.no_compile:
        for prio, label, model, targs, row, name in sorted(compile_jobs, key=lambda j: j[0]):
            left = a.budget - elapsed()
            mode = "reduce-overhead" if prio[0] == 0 else "default"
            key = (label, mode)
            first = key not in compiled
            need = 75 if first else 40  # rough cost of a (re)compile
            if left < need:
                log(f"{label} {row['shape']}: torch.compile skipped, {left:.0f} s of the budget left")
                continue
            try:
                if first:
                    compiled[key] = torch.compile(model, mode=mode)
                cm = compiled[key]
                t = time.monotonic()
                with torch.no_grad():
                    cm(*targs)
                torch.cuda.synchronize()
                took = time.monotonic() - t

                def run_compiled(cm=cm, targs=targs):
                    cm(*targs)
                    torch.cuda.synchronize()
                row["compile"] = median_ms(run_compiled, warmup=3, max_runs=max_runs)
                row["note"] = (row["note"] + "; " if row["note"] else "") + f"compile {took:.0f} s"
                log(f"{label} {row['shape']}: torch.compile {row['compile']:.3f} ms (compiled in {took:.0f} s)")
            except Exception as e:  # noqa: BLE001 - a compile failure is printed and recorded
                msg = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
                row["compile"] = "failed"
                row["note"] = (row["note"] + "; " if row["note"] else "") + f"torch.compile: {msg}"
                log(f"{label} {row['shape']}: torch.compile failed: {msg}")

    header = ["model", "shape", "kiln ms", "kiln host I/O ms", "eager ms", "compile ms", "kiln/eager", "kiln/compile",
              "GPU/CPU nodes", "graph replays", "kiln vs PyTorch max abs diff", "note"]
    table = [[r["model"], r["shape"], fmt_ms(r.get("kiln", "-")), fmt_ms(r.get("kiln_host", "-")),
              fmt_ms(r.get("eager", "-")),
              fmt_ms(r.get("compile", "-")), ratio(r.get("kiln"), r.get("eager")), ratio(r.get("kiln"), r.get("compile")),
              r.get("nodes", "-"), str(r.get("graphs", "-")), r.get("diff", ""), r.get("note", "")] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    print()
    for line in [header] + table:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
    if new_shapes:
        print("\nsession creation and first runs at new shapes (host I/O):")
        for ns in new_shapes:
            shapes = ", ".join(f"{n}: {f:.2f}/{r:.2f} ms ({f / r:.2f}x)" for n, f, r in ns["shapes"])
            print(f"  {ns['model']}: created in {ns['create'] or 0:.2f} s (again {ns['create_again'] or 0:.2f} s); "
                  f"first/repeat at new batch {shapes}")
    print("ratios < 1: kiln faster. kiln ms: inputs and outputs on the GPU (IOBinding), as PyTorch's; "
          "kiln host I/O ms: numpy in and out, copies included.")
    if a.md:
        with open(a.md, "w") as f:
            f.write(f"# kiln CUDA provider vs PyTorch on {gpu}\n\n")
            f.write(f"torch {torch.__version__}; `python3 scripts/bench_gpu.py {' '.join(sys.argv[1:])}`; "
                    "median ms per call after warm-up, each call synchronised; fp32 without TF32 on both sides. "
                    "kiln ms: inputs read from PyTorch's device tensors and outputs written into bound device "
                    "tensors (kiln_session_run_with_outputs, ONNX Runtime's IOBinding), as PyTorch's stay on the "
                    "GPU; kiln host I/O ms: numpy inputs copied to the device and outputs back on every call. "
                    "Ratios (of kiln ms) < 1: kiln faster.\n\n")
            f.write("| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n")
            for line in table:
                f.write("| " + " | ".join(str(x).replace("|", "\\|") for x in line) + " |\n")
            if new_shapes:
                f.write("\n| model | session created (s) | again, kernel cache warm (s) | first / repeat run at new "
                        "batch sizes (ms) |\n|---|---|---|---|\n")
                for ns in new_shapes:
                    shapes = ", ".join(f"{n}: {fr:.2f} / {r:.2f} ({fr / r:.2f}x)" for n, fr, r in ns["shapes"])
                    f.write(f"| {ns['model']} | {ns['create'] or 0:.2f} | {ns['create_again'] or 0:.2f} | {shapes} |\n")
        log(f"markdown table written to {a.md}")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
