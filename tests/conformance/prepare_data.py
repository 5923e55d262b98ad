#!/usr/bin/env python3
"""Lays out the ONNX backend test data for the conformance runner.

The pinned onnx wheel ships data/{simple,pytorch-converted,pytorch-operator} but not data/node;
the node tests are generated here from the wheel's own test cases (onnx.backend.test.case.node),
in the same layout as the data directory: <name>/model.onnx and
<name>/test_data_set_<i>/{input,output}_<j>.pb.

usage: prepare_data.py OUT_DIR
"""
import os
import shutil
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
import onnx.backend.test.case.node as node_cases

SHIPPED = ("simple", "pytorch-converted", "pytorch-operator")


def serialize(value, type_proto, name):
    if type_proto.HasField("sequence_type"):
        return numpy_helper.from_list(value, name).SerializeToString()
    if type_proto.HasField("optional_type"):
        return numpy_helper.from_optional(value, name).SerializeToString()
    if type_proto.HasField("map_type"):
        return numpy_helper.from_dict(value, name).SerializeToString()
    if isinstance(value, TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(np.asarray(value), name).SerializeToString()


def write_case(case, root):
    out = os.path.join(root, case.name)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.onnx"), "wb") as f:
        f.write(case.model.SerializeToString())
    graph = case.model.graph
    for i, (inputs, outputs) in enumerate(case.data_sets):
        ds = os.path.join(out, f"test_data_set_{i}")
        os.makedirs(ds, exist_ok=True)
        for j, v in enumerate(inputs):
            with open(os.path.join(ds, f"input_{j}.pb"), "wb") as f:
                f.write(serialize(v, graph.input[j].type, graph.input[j].name))
        for j, v in enumerate(outputs):
            with open(os.path.join(ds, f"output_{j}.pb"), "wb") as f:
                f.write(serialize(v, graph.output[j].type, graph.output[j].name))


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = sys.argv[1]
    src = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    os.makedirs(root, exist_ok=True)
    stamp = os.path.join(root, "VERSION")
    if os.path.exists(stamp) and open(stamp).read().strip() == onnx.__version__:
        return 0
    for d in SHIPPED + ("node",):
        shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    for d in SHIPPED:
        shutil.copytree(os.path.join(src, d), os.path.join(root, d))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases()
    for case in cases:
        write_case(case, os.path.join(root, "node"))
    with open(stamp, "w") as f:
        f.write(onnx.__version__ + "\n")
    print(f"onnx {onnx.__version__}: {len(cases)} node tests generated in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
