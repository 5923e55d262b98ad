#!/usr/bin/env bash
# test_wheel.sh - the installable package end to end: `pip wheel .` builds the kiln wheel from the
# repository (CPU provider; build tree kept in WORK for the next run), a fresh virtual environment
# installs it (numpy from PyPI), and, with no KILN_LIB and outside the repository, imports kiln and
# runs a model through InferenceSession and through `import onnxruntime` after
# kiln.install_as_onnxruntime(), comparing with the values computed here.
# usage: test_wheel.sh REPO WORK   (ctest: label wheel)
set -euo pipefail
repo="$1"
work="$2"
py="${PYTHON:-python3}"
mkdir -p "$work"
rm -rf "$work/wheels" "$work/venv"
"$py" -m pip wheel "$repo" --no-build-isolation --no-deps -q -w "$work/wheels" \
    -C cmake.define.KILN_CUDA=OFF -C build-dir="$work/build"
wheel=$(ls "$work"/wheels/kiln-*-py3-none-*.whl)
echo "built $(basename "$wheel")"
"$py" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$wheel"
"$py" - "$work/add.onnx" <<'PY'
import sys
from onnx import TensorProto as T, helper as h
g = h.make_graph([h.make_node("Add", ["a", "b"], ["y"])], "add",
                 [h.make_tensor_value_info(n, T.FLOAT, ["n", 4]) for n in "ab"],
                 [h.make_tensor_value_info("y", T.FLOAT, ["n", 4])])
open(sys.argv[1], "wb").write(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9).SerializeToString())
PY
cd "$work"
env -u KILN_LIB -u PYTHONPATH "$work/venv/bin/python" - "$work/add.onnx" "$work/venv" <<'PY'
import os, sys
import numpy as np
import kiln
assert os.path.realpath(kiln.__file__).startswith(os.path.realpath(sys.argv[2])), kiln.__file__
lib = kiln.library()._name
assert os.path.dirname(lib) == os.path.dirname(kiln.__file__), lib  # the bundled libkiln.so
s = kiln.InferenceSession(sys.argv[1])
a = np.arange(8, dtype=np.float32).reshape(2, 4)
(y,) = s.run(None, {"a": a, "b": a})
assert np.array_equal(y, 2 * a), y
print("kiln", kiln.__version__, "from", lib, "inputs", s.get_inputs(), "->", y.tolist())
kiln.install_as_onnxruntime()
import onnxruntime as ort
(y,) = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"]).run(None, {"a": a, "b": a})
assert np.array_equal(y, 2 * a)
print("wheel: OK")
PY
