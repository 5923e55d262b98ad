#!/usr/bin/env python3
"""Odd value names and many outputs, through the API (the python/kiln package, checked against ONNX
Runtime and numpy) and the CLI (`kiln run --output-dir`, `kiln info --json`): names with '#',
'/', ':', '.', spaces and non-ASCII characters; empty names of absent optional inputs; 40
outputs; an output that is a graph input, an initializer or a Constant's output; one value
listed twice as an output; two outputs whose file names collide.

usage: test_names.py KILN_CLI   (libkiln.so from build/ or $KILN_LIB)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402
import kiln  # noqa: E402



def safe_name(name):
    """The CLI's file name for an output: each character outside [A-Za-z0-9._-] becomes '_'."""
    s = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return "_" if s in ("", ".", "..") else s


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def tensor_vi(name, shape, dt=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


def peer(model, feeds):
    """ONNX Runtime's outputs, or None when it refuses the model."""
    try:
        s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        print(f"  (ONNX Runtime refuses {model.graph.name}: {str(e).splitlines()[0][:100]})")
        return None
    return s.run([o.name for o in model.graph.output], feeds)


def check_model(label, model, feeds, expected, cli, collide=False):
    """API against `expected` (a list of arrays, one per graph output) and ONNX Runtime; CLI
    info --json and run --output-dir against the API."""
    out_names = [o.name for o in model.graph.output]
    sess = kiln.Session(model.SerializeToString())
    inits = {t.name for t in model.graph.initializer}
    want_inputs = [i.name for i in model.graph.input if i.name not in inits]
    check(f"{label}: input names", [i["name"] for i in sess.inputs] == want_inputs, sess.inputs)
    check(f"{label}: output names", [o["name"] for o in sess.outputs] == out_names, sess.outputs)
    got = sess.run(feeds)
    check(f"{label}: output count", len(got) == len(out_names), len(got))
    for name, g, e in zip(out_names, got, expected):
        check(f"{label}: '{name}' value", g.shape == e.shape and np.allclose(g, e), f"{g} vs {e}")
    # fetching a subset by name, in another order
    sub = out_names[::-1][:3]
    got_sub = sess.run(feeds, sub)
    for name, g in zip(sub, got_sub):
        check(f"{label}: '{name}' fetched by name", np.allclose(g, expected[out_names.index(name)]))
    ref = peer(model, feeds)
    if ref is not None:
        for name, g, r in zip(out_names, got, ref):
            check(f"{label}: '{name}' vs ONNX Runtime", g.shape == r.shape and np.allclose(g, r, atol=1e-5))
    sess.close()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        onnx.save(model, path)
        info = subprocess.run([cli, "info", path, "--json"], capture_output=True)
        check(f"{label}: info --json exit", info.returncode == 0, info.stderr)
        try:
            doc = json.loads(info.stdout.decode("utf-8"))
            check(f"{label}: info --json outputs", [o["name"] for o in doc["outputs"]] == out_names,
                  [o["name"] for o in doc["outputs"]])
            check(f"{label}: info --json inputs", [i["name"] for i in doc["inputs"]] ==
                  [i["name"] for i in kiln.Session(path).inputs])
        except (ValueError, KeyError) as e:
            check(f"{label}: info --json is valid JSON", False, f"{e}: {info.stdout[:300]!r}")
        args = [cli, "run", path, "--output-dir", os.path.join(tmp, "out")]
        for k, (name, arr) in enumerate(feeds.items()):
            f = os.path.join(tmp, f"in{k}.npy")
            np.save(f, arr)
            args += ["--input", f"{name}={f}"]
        run = subprocess.run(args, capture_output=True)
        if collide:
            check(f"{label}: colliding file names are an error", run.returncode != 0, run.stdout)
            err = run.stderr.decode("utf-8", "replace")
            check(f"{label}: the error names the file", "collide" in err or "same file" in err, err)
            out = os.path.join(tmp, "out")
            check(f"{label}: nothing written", not os.path.exists(out) or not os.listdir(out))
            return
        check(f"{label}: run exit", run.returncode == 0, run.stderr)
        files = sorted(os.listdir(os.path.join(tmp, "out"))) if os.path.isdir(os.path.join(tmp, "out")) else []
        want = sorted({safe_name(n) + ".npy" for n in out_names})
        check(f"{label}: output files", files == want, f"{files} vs {want}")
        for name, e in zip(out_names, expected):
            f = os.path.join(tmp, "out", safe_name(name) + ".npy")
            if os.path.exists(f):
                a = np.load(f)
                check(f"{label}: file of '{name}'", a.shape == e.shape and np.allclose(a, e), f"{a} vs {e}")


def test_odd_names(cli):
    x_name = "in put#1/é:x.y"
    names = ["out/0:é ü#.", "a b", "日本語", "..dots..", "tab\there", "quote\"and\\back", "-lead-dash",
             "x=y"]
    nodes = [helper.make_node("Relu", [x_name], [names[0]], name="relu/1 #é")]
    for k, n in enumerate(names[1:]):
        nodes.append(helper.make_node("Identity" if k % 2 else "Neg", [names[0]], [n], name=f"node:{k}"))
    model = make_model(nodes, [tensor_vi(x_name, ["batch size", 3])], [tensor_vi(n, None) for n in names])
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    r = np.maximum(x, 0)
    expected = [r] + [(-r if k % 2 == 0 else r) for k in range(len(names) - 1)]
    check_model("odd names", model, {x_name: x}, expected, cli)


def test_absent_optional_inputs(cli):
    mx = numpy_helper.from_array(np.array(2.5, np.float32), "max:val/1")
    sizes = numpy_helper.from_array(np.array([1, 1, 4, 6], np.int64), "sizes #é")
    nodes = [helper.make_node("Clip", ["X", "", "max:val/1"], ["clipped/out"]),
             helper.make_node("Resize", ["clipped/out", "", "", "sizes #é"], ["resized:0"], mode="nearest"),
             helper.make_node("Dropout", ["X"], ["dropped", ""])]
    model = make_model(nodes, [tensor_vi("X", [1, 1, 2, 3])],
                       [tensor_vi(n, None) for n in ("clipped/out", "resized:0", "dropped")],
                       [mx, sizes])
    x = np.array([[[[-1, 2, 3], [4, 0.5, 6]]]], np.float32)
    c = np.minimum(x, 2.5)
    resized = c.repeat(2, axis=2).repeat(2, axis=3)
    check_model("absent optional inputs", model, {"X": x}, [c, resized, x], cli)


def test_many_outputs(cli, n=40):
    nodes, outs, expected = [], [], []
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    inits = []
    for k in range(n):
        name = f"out #{k}/é:{k}.v"
        inits.append(numpy_helper.from_array(np.array(k, np.float32), f"k/{k}"))
        nodes.append(helper.make_node("Add", ["X", f"k/{k}"], [name]))
        outs.append(tensor_vi(name, None))
        expected.append(x + k)
    model = make_model(nodes, [tensor_vi("X", [2, 3])], outs, inits)
    check_model(f"{n} outputs", model, {"X": x}, expected, cli)


def test_special_outputs(cli):
    """An output that is a graph input, an initializer, a Constant's output, and one value twice."""
    w = np.array([1, 2, 3], np.float32)
    inits = [numpy_helper.from_array(w, "W:init/0")]
    c = np.array([[7, 8, 9]], np.float32)
    nodes = [helper.make_node("Constant", [], ["c/onst é"], value=numpy_helper.from_array(c)),
             helper.make_node("Add", ["X in", "W:init/0"], ["sum.0"])]
    outs = [tensor_vi("X in", None), tensor_vi("W:init/0", None), tensor_vi("c/onst é", None),
            tensor_vi("sum.0", None), tensor_vi("sum.0", None)]
    model = make_model(nodes, [tensor_vi("X in", [2, 3])], outs, inits)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    check_model("special outputs", model, {"X in": x}, [x, w, c, x + w, x + w], cli)


def test_colliding_file_names(cli):
    names = ["a:b", "a/b", "a b"]
    nodes = [helper.make_node("Identity", ["X"], [n]) for n in names]
    model = make_model(nodes, [tensor_vi("X", [2])], [tensor_vi(n, None) for n in names])
    x = np.array([1, 2], np.float32)
    check_model("colliding file names", model, {"X": x}, [x, x, x], cli, collide=True)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    cli = sys.argv[1]
    for t in (test_odd_names, test_absent_optional_inputs, test_many_outputs, test_special_outputs,
              test_colliding_file_names):
        try:
            t(cli)
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            check(t.__name__, False, e)
    return summary("test_names: ")


if __name__ == "__main__":
    sys.exit(main())
