"""bench_python.py - per-call overhead of run() from Python: kiln.InferenceSession against
onnxruntime.InferenceSession on a one-node model (Add of two [1, 16] floats), both on one
thread, median over many calls of each in this one process (interleaved rounds).

usage: python3 scripts/bench_python.py [--calls N] [--rounds R] [--shape 1x16]
       (kiln from python/ with libkiln.so from $KILN_LIB or build/, or the installed package)"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import kiln  # noqa: E402


def model(shape):
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "add",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, shape),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def per_call(run, calls):
    """Median of `calls` timed calls, in microseconds."""
    ts = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        t0 = clock()
        run()
        ts.append(clock() - t0)
    return statistics.median(ts) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shape", default="1x16")
    a = ap.parse_args()
    shape = [int(d) for d in a.shape.split("x")]
    buf = model(shape)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    o = ort.InferenceSession(buf, so, providers=["CPUExecutionProvider"])
    ko = kiln.SessionOptions()
    ko.intra_op_num_threads = 1
    k = kiln.InferenceSession(buf, ko)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    feeds = {"a": x, "b": x}
    assert np.array_equal(k.run(None, feeds)[0], o.run(None, feeds)[0])
    cases = {
        "run(None, feeds)": (lambda: k.run(None, feeds), lambda: o.run(None, feeds)),
        "run(['y'], feeds)": (lambda: k.run(["y"], feeds), lambda: o.run(["y"], feeds)),
    }
    for f in (cases["run(None, feeds)"][0], cases["run(None, feeds)"][1]):  # warm up
        per_call(f, 2000)
    print(f"kiln {kiln.__version__} ({kiln.library()._name}), onnxruntime {ort.__version__}, "
          f"Add of two {shape} float32, {a.calls} calls x {a.rounds} rounds, medians in us")
    for name, (kf, of) in cases.items():
        kt, ot = [], []
        for _ in range(a.rounds):
            kt.append(per_call(kf, a.calls))
            ot.append(per_call(of, a.calls))
        km, om = statistics.median(kt), statistics.median(ot)
        print(f"{name:20s} kiln {km:7.2f}  onnxruntime {om:7.2f}  ratio {km / om:.2f}")


if __name__ == "__main__":
    main()
