#!/usr/bin/env python3
"""test_gpu_python.py - GPU tensors through the Python package, with PyTorch on the device:
torch CUDA tensors fed to run() and to an IOBinding in place (the session's copies_to_device
stays 0), outputs handed out in device memory and consumed by torch.from_dlpack in place (the
torch tensor's data_ptr is the kiln value's device pointer), preallocated torch outputs written
in place, fp32 / fp16 / int64, equality with the CPU provider, non-contiguous tensors refused
with a clear error, a producer's side stream, 100 runs with flat device memory, and lifetimes
(the session and the binding freed before the consumed tensors).

usage: KILN_LIB=<build>/libkiln.so test_gpu_python.py   (prints SKIP and exits 0 without torch,
       a GPU or a CUDA build of kiln)
"""
import gc
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402
from kiln import tensor as ktensor  # noqa: E402

CUDA = ["CUDAExecutionProvider"]
ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.int64: TensorProto.INT64}
TOL = {np.float32: 1e-4, np.float16: 1e-2, np.int64: 0}
rng = np.random.default_rng(11)
torch = None


def blob_of(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "py", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def model(npt):
    """x [N, 64] -> y = Relu(x @ W + B) [N, 32] and z = x * 2 [N, 64] (floats); int64: y = x * 3 + 5
    and z = x * 2."""
    e = ELEM[npt]
    x = helper.make_tensor_value_info("x", e, ["N", 64])
    outs = [helper.make_tensor_value_info("y", e, None), helper.make_tensor_value_info("z", e, None)]
    two = numpy_helper.from_array(np.array(2, npt), "two")
    if npt is np.int64:
        inits = [numpy_helper.from_array(np.array(3, npt), "W"), numpy_helper.from_array(np.array(5, npt), "B"), two]
        nodes = [helper.make_node("Mul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"])]
    else:
        inits = [numpy_helper.from_array((rng.standard_normal((64, 32)) * 0.2).astype(npt), "W"),
                 numpy_helper.from_array(rng.standard_normal(32).astype(npt), "B"), two]
        nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["xb"]),
                 helper.make_node("Relu", ["xb"], ["y"])]
    nodes.append(helper.make_node("Mul", ["x", "two"], ["z"]))
    return blob_of(nodes, [x], outs, inits)


def big_model():
    """x [N, 1024] float -> y = x + 1: 4 MB outputs at N = 1024, so a leak of 100 shows."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1024])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    return blob_of([helper.make_node("Add", ["x", "one"], ["y"])], [x], [y], [one])


def sample(npt, n=8):
    if npt is np.int64:
        return rng.integers(-1000, 1000, (n, 64)).astype(np.int64)
    return rng.standard_normal((n, 64)).astype(npt)


def close(name, got, want, npt):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    ok = got.shape == want.shape
    err = float(np.max(np.abs(got - want))) if ok and got.size else 0.0
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    check(name, ok and err <= TOL[npt] * scale, f"shape {got.shape} vs {want.shape}, max error {err:.3g}")


def stat_delta(sess, before, field):
    return sess.stats()[field] - before[field]


def test_dtype(npt):
    tag = np.dtype(npt).name
    blob = model(npt)
    cpu, gpu = kiln.InferenceSession(blob), kiln.InferenceSession(blob, providers=CUDA)
    st = gpu.stats()
    check(f"{tag}: every node on the GPU", st["nodes_cpu"] == 0, f"nodes_cpu {st['nodes_cpu']}")
    tdt = getattr(torch, tag)
    for n in (8, 3):  # two bindings of N
        x = sample(npt, n)
        want = cpu.run(None, {"x": x})
        xt = torch.from_numpy(x).cuda()

        # run() with a torch CUDA tensor as the feed: read in place, numpy outputs
        before = gpu.stats()
        got = gpu.run(None, {"x": xt})
        close(f"{tag} N={n}: run(torch feed) y", got[0], want[0], npt)
        close(f"{tag} N={n}: run(torch feed) z", got[1], want[1], npt)
        check(f"{tag} N={n}: run(torch feed) copies nothing to the device",
              stat_delta(gpu, before, "copies_to_device") == 0, f"{gpu.stats()['copies_to_device']} vs {before}")
        v = kiln.from_dlpack(xt)
        check(f"{tag}: from_dlpack borrows the torch tensor", v.data_ptr() == xt.data_ptr() and
              v.device_name() == "cuda" and v.shape() == [n, 64], f"{v.data_ptr():#x} vs {xt.data_ptr():#x}")

        # IOBinding: a raw device pointer in, outputs on the device (kiln's and preallocated)
        io = gpu.io_binding()
        io.bind_input("x", "cuda", 0, npt, [n, 64], xt.data_ptr())
        io.bind_output("y", "cuda")
        zt = torch.full((n, 64), -7, dtype=tdt, device="cuda")
        io.bind_output("z", "cuda", 0, npt, [n, 64], zt.data_ptr())
        for rep in range(3):  # the third run of the binding replays a CUDA graph
            before = gpu.stats()
            gpu.run_with_iobinding(io)
            yv, zv = io.get_outputs()
            check(f"{tag} N={n} #{rep}: IOBinding copies nothing across", stat_delta(gpu, before, "copies_to_device")
                  == 0 and stat_delta(gpu, before, "copies_to_host") == 0, str(gpu.stats()))
            check(f"{tag} N={n} #{rep}: outputs on the device", yv.device_name() == "cuda" and
                  zv.device_name() == "cuda", f"{yv} {zv}")
            check(f"{tag} N={n} #{rep}: preallocated output written in place", zv.data_ptr() == zt.data_ptr(),
                  f"{zv.data_ptr():#x} vs {zt.data_ptr():#x}")
            close(f"{tag} N={n} #{rep}: preallocated z", zt.cpu().numpy(), want[1], npt)
            yt = torch.from_dlpack(yv)
            check(f"{tag} N={n} #{rep}: torch consumes y in place", yt.data_ptr() == yv.data_ptr() and
                  yt.is_cuda and yt.dtype == tdt and tuple(yt.shape) == want[0].shape,
                  f"{yt.data_ptr():#x} vs {yv.data_ptr():#x}, {yt.dtype}, {tuple(yt.shape)}")
            close(f"{tag} N={n} #{rep}: IOBinding y", yt.cpu().numpy(), want[0], npt)
            close(f"{tag} N={n} #{rep}: copy_outputs_to_cpu", io.copy_outputs_to_cpu()[0], want[0], npt)
        # OrtValue made from numpy on the device, fed by run_with_ort_values
        ov = kiln.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
        before = gpu.stats()
        got = gpu.run_with_ort_values(["y"], {"x": ov})
        check(f"{tag} N={n}: ortvalue_from_numpy(cuda) feeds in place",
              ov.device_name() == "cuda" and stat_delta(gpu, before, "copies_to_device") == 0, str(ov))
        close(f"{tag} N={n}: run_with_ort_values", got[0].numpy(), want[0], npt)
        check(f"{tag} N={n}: OrtValue(cuda).numpy() copies back", np.array_equal(ov.numpy(), x), "")
        check(f"{tag} N={n}: torch reads an OrtValue(cuda)", np.array_equal(torch.from_dlpack(ov).cpu().numpy(), x),
              "")
    # host feeds still count their upload (the counter works)
    before = gpu.stats()
    gpu.run(None, {"x": sample(npt)})
    check(f"{tag}: a numpy feed is one copy to the device", stat_delta(gpu, before, "copies_to_device") == 1,
          str(gpu.stats()["copies_to_device"]))


def test_refusals():
    gpu = kiln.InferenceSession(model(np.float32), providers=CUDA)
    xt = torch.from_numpy(sample(np.float32, 64)).cuda()
    for name, feed in (("transposed", xt.t().contiguous().t()), ("every other column", torch.cat([xt, xt], 1)[:, ::2]),
                       ("every other row", torch.cat([xt, xt])[::2])):
        if feed.is_contiguous():
            check(f"non-contiguous {name}: the case is non-contiguous", False, "")
            continue
        try:
            gpu.run(None, {"x": feed})
            check(f"non-contiguous {name}: refused", False, "ran")
        except kiln.KilnError as e:
            check(f"non-contiguous {name}: refused clearly", "non-contiguous" in str(e) and "contiguous()" in str(e),
                  str(e))
    cpu = kiln.InferenceSession(model(np.float32))
    try:
        cpu.run(None, {"x": xt})
        check("a CPU session refuses device feeds", False, "ran")
    except kiln.KilnError as e:
        check("a CPU session refuses device feeds clearly", "device provider" in str(e), str(e))
    try:
        gpu.run(None, {"x": xt.to(torch.float64)})
        check("a float64 feed for a float input is refused", False, "ran")
    except kiln.KilnError as e:
        check("a float64 feed for a float input is refused", "x" in str(e), str(e))


def test_side_stream():
    """The producer's work on its own stream is done before kiln reads (from_dlpack hands over on
    the legacy stream and waits), and a consumer on a side stream reads finished outputs."""
    blob = big_model()
    cpu, gpu = kiln.InferenceSession(blob), kiln.InferenceSession(blob, providers=CUDA)
    side = torch.cuda.Stream()
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        x = a @ a  # long enough to be in flight when run() starts
        x = x[:1024, :1024].contiguous() * 1e-3
        (y,) = gpu.run(None, {"x": x})
        want = x.cpu().numpy() + 1
    check("side stream: the feed was complete", np.allclose(y, want, rtol=1e-5, atol=1e-5),
          f"max error {float(np.max(np.abs(y - want))):.3g}")
    io = gpu.io_binding()
    io.bind_ortvalue_input("x", kiln.from_dlpack(x))
    io.bind_output("y", "cuda")
    gpu.run_with_iobinding(io)
    with torch.cuda.stream(side):
        yt = torch.from_dlpack(io.get_outputs()[0]) * 2
    side.synchronize()
    check("side stream: a consumer there reads the output", np.allclose(yt.cpu().numpy(), 2 * want, rtol=1e-5,
                                                                         atol=1e-5), "")
    del cpu


def test_flat_memory():
    gpu = kiln.InferenceSession(big_model(), providers=CUDA)
    xt = torch.randn(1024, 1024, device="cuda")
    io = gpu.io_binding()
    io.bind_ortvalue_input("x", kiln.from_dlpack(xt))
    exported = len(ktensor._exported)

    def cycle():
        io.bind_output("y", "cuda")
        gpu.run_with_iobinding(io)
        yt = torch.from_dlpack(io.get_outputs()[0])
        s = float(yt[0, 0])
        io.clear_binding_outputs()
        del yt
        return s

    for _ in range(10):
        cycle()
    gc.collect()
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    mallocs0 = gpu.stats()["device_mallocs"]
    for _ in range(100):
        cycle()
    gc.collect()
    torch.cuda.synchronize()
    free1 = torch.cuda.mem_get_info()[0]
    check("100 runs: device memory flat (4 MB outputs, consumed by torch and dropped)",
          free0 - free1 < 64 << 20, f"{(free0 - free1) / 2**20:.1f} MB less free")
    check("100 runs: no device allocation by runs", gpu.stats()["device_mallocs"] == mallocs0,
          f"{gpu.stats()['device_mallocs'] - mallocs0}")
    check("100 runs: every export released", len(ktensor._exported) == exported,
          f"{len(ktensor._exported)} vs {exported}")


def test_lifetimes():
    """Consumed outputs outlive the session and the binding; an imported input outlives the
    torch name that made it."""
    blob = model(np.float32)
    x = sample(np.float32, 5)
    want = kiln.InferenceSession(blob).run(None, {"x": x})
    exported = len(ktensor._exported)
    gpu = kiln.InferenceSession(blob, providers=CUDA)
    xt = torch.from_numpy(x).cuda()
    v = kiln.from_dlpack(xt)
    del xt  # v holds the torch tensor through its DLPack deleter
    gc.collect()
    io = gpu.io_binding()
    io.bind_ortvalue_input("x", v)
    io.bind_output("y", "cuda")
    io.bind_output("z", "cuda")
    gpu.run_with_iobinding(io)
    yt, zt = (torch.from_dlpack(o) for o in io.get_outputs())
    ptr = yt.data_ptr()
    del io, gpu, v
    gc.collect()
    torch.cuda.synchronize()
    junk = [torch.full((5, 32), 123.0, device="cuda") for _ in range(8)]  # would reuse freed memory
    close("lifetime: y after the session is freed", yt.cpu().numpy(), want[0], np.float32)
    close("lifetime: z after the session is freed", zt.cpu().numpy(), want[1], np.float32)
    check("lifetime: the consumed tensor still points at kiln's buffer", yt.data_ptr() == ptr, "")
    del yt, zt, junk
    gc.collect()
    check("lifetime: the exports are released with the tensors", len(ktensor._exported) == exported,
          f"{len(ktensor._exported)} vs {exported}")


def test_cupy():
    try:
        import cupy
    except ImportError:
        print("(cupy not installed: its checks skipped)")
        return
    blob = model(np.float32)  # once: each call draws new weights
    gpu = kiln.InferenceSession(blob, providers=CUDA)
    x = sample(np.float32, 4)
    io = gpu.io_binding()
    io.bind_ortvalue_input("x", kiln.from_dlpack(cupy.asarray(x)))
    io.bind_output("y", "cuda")
    gpu.run_with_iobinding(io)
    yv = io.get_outputs()[0]
    yc = cupy.from_dlpack(yv)
    check("cupy consumes an output in place", yc.data.ptr == yv.data_ptr(), f"{yc.data.ptr:#x}")
    close("cupy: values", cupy.asnumpy(yc), kiln.InferenceSession(blob).run(["y"], {"x": x})[0],
          np.float32)


def main():
    global torch
    try:
        import torch as t
    except ImportError as e:
        print(f"SKIP: no torch ({e})")
        return 0
    torch = t
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA GPU")
        return 0
    try:
        kiln.InferenceSession(big_model(), providers=CUDA)
    except (kiln.KilnError, OSError) as e:
        print(f"SKIP: no CUDA session ({e})")
        return 0
    for npt in (np.float32, np.float16, np.int64):
        test_dtype(npt)
    test_refusals()
    test_side_stream()
    test_flat_memory()
    test_lifetimes()
    test_cupy()
    return summary("test_gpu_python: ")


if __name__ == "__main__":
    sys.exit(main())
