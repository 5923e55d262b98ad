#!/usr/bin/env python3
"""CLI tests: `kiln info/run/bench` on generated models, .npy round trips of every ONNX numeric
dtype through an Identity model, and one-line errors with a non-zero exit for bad usage.

usage: test_cli.py KILN_BINARY MODELS_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, summary  # noqa: E402



def kiln(*args):
    return subprocess.run([KILN, *args], capture_output=True, text=True)


def test_info(models):
    r = kiln("info", os.path.join(models, "encoder.onnx"), "--json")
    check("info --json exit", r.returncode == 0, r.stderr)
    info = json.loads(r.stdout)
    check("info inputs", info["inputs"][0]["shape"] == ["batch", "seq"], info["inputs"])
    check("info outputs", info["outputs"][0]["shape"] == ["batch", "seq", 64], info["outputs"])
    check("info histogram", info["operators"].get("MatMul", 0) > 0 and info["unsupported"] == [], info["operators"])
    check("info initializer bytes", info["initializer_bytes"] > 100000, info["initializer_bytes"])
    r = kiln("info", os.path.join(models, "encoder.onnx"))
    check("info text", r.returncode == 0 and "tokens: int64 [batch, seq]" in r.stdout, r.stdout)


def test_run_matches_ort(models, tmp):
    path = os.path.join(models, "encoder.onnx")
    rng = np.random.default_rng(5)
    ref = ort.InferenceSession(path)
    args = ["run", path, "--output-dir", tmp]
    inputs = []
    for i, (b, s) in enumerate([(1, 7), (2, 30)]):
        x = rng.integers(0, 100, size=(b, s)).astype(np.int64)
        np.save(os.path.join(tmp, f"tok{i}.npy"), x)
        args += ["--input", f"tokens={os.path.join(tmp, f'tok{i}.npy')}"]
        inputs.append(x)
    r = kiln(*args)
    check("run two shapes exit", r.returncode == 0, r.stderr)
    check("run prints shapes", "hidden: float32 [2, 30, 64]" in r.stdout, r.stdout)
    for i, x in enumerate(inputs):
        want = ref.run(None, {"tokens": x})
        for name, w in zip(["hidden", "pooled"], want):
            got = np.load(os.path.join(tmp, f"{name}.{i + 1}.npy"))
            check(f"run output {name} shape set {i + 1}", got.shape == w.shape and np.allclose(got, w, 1e-4, 1e-4),
                  f"{got.shape} vs {w.shape}")
    r = kiln("bench", path, "--shape", "tokens=1x16", "--runs", "3", "--warmup", "1", "--json")
    check("bench --json", r.returncode == 0 and json.loads(r.stdout)["runs"] == 3, r.stdout + r.stderr)
    r = kiln("bench", path, "--shape", "tokens=2x7", "--runs", "2", "--warmup", "1", "--profile")
    lines = [l.strip() for l in r.stdout.splitlines()]
    check("bench --profile", r.returncode == 0 and any(l.startswith("profile: 2 runs") for l in lines) and
          "by op type:" in lines and "costliest nodes:" in lines and
          any("MatMul" in l and "nodes" in l for l in lines) and any("-> [2x7x" in l for l in lines),
          r.stdout + r.stderr)
    # the node times are the events' own (kiln_node_event.ms): every node listed took some time
    per_run = [float(l.split(",")[1].split()[0]) for l in lines if l.startswith("profile: 2 runs")]
    node_ms = [float(l.split()[0]) for l in lines if l.endswith("]") and "->" in l and "%" in l]
    check("bench --profile times from the events", per_run and per_run[0] > 0 and node_ms and
          all(t >= 0 for t in node_ms) and max(node_ms) <= per_run[0] + 1e-3, r.stdout)


def identity_model(path, elem_type, name="x"):
    g = helper.make_graph([helper.make_node("Identity", [name], ["y/out:0"])], "id",
                          [helper.make_tensor_value_info(name, elem_type, None)],
                          [helper.make_tensor_value_info("y/out:0", elem_type, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, path)


def test_npy_dtypes(tmp):
    rng = np.random.default_rng(7)
    cases = [
        (TensorProto.FLOAT, np.float32), (TensorProto.DOUBLE, np.float64), (TensorProto.FLOAT16, np.float16),
        (TensorProto.BFLOAT16, ml_dtypes.bfloat16), (TensorProto.INT8, np.int8), (TensorProto.UINT8, np.uint8),
        (TensorProto.INT16, np.int16), (TensorProto.UINT16, np.uint16), (TensorProto.INT32, np.int32),
        (TensorProto.UINT32, np.uint32), (TensorProto.INT64, np.int64), (TensorProto.UINT64, np.uint64),
        (TensorProto.BOOL, np.bool_), (TensorProto.COMPLEX64, np.complex64), (TensorProto.COMPLEX128, np.complex128),
        (TensorProto.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn), (TensorProto.FLOAT8E5M2, ml_dtypes.float8_e5m2),
        (TensorProto.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz), (TensorProto.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz),
        (TensorProto.INT4, ml_dtypes.int4), (TensorProto.UINT4, ml_dtypes.uint4),
        (TensorProto.STRING, np.str_),
    ]
    for elem, dt in cases:
        model = os.path.join(tmp, f"id_{elem}.onnx")
        identity_model(model, elem)
        if dt is np.str_:
            x = np.array([["a", "héllo"], ["", "漢字"]])
        elif dt is np.bool_:
            x = rng.integers(0, 2, size=(3, 4)).astype(np.bool_)
        else:
            x = (rng.standard_normal((3, 5)) * 3).astype(dt)
        src = os.path.join(tmp, "in.npy")
        np.save(src, x)
        out = os.path.join(tmp, f"out_{elem}")
        r = kiln("run", model, "--input", f"x={src}", "--output-dir", out)
        name = onnx.TensorProto.DataType.Name(elem)
        if r.returncode:
            check(f"npy {name}", False, r.stderr)
            continue
        got = np.load(os.path.join(out, "y_out_0.npy"))  # '/' and ':' replaced by '_'
        same = got.dtype == x.dtype and got.shape == x.shape and np.array_equal(got.view(np.uint8) if dt not in (np.str_,) else got,
                                                                                   x.view(np.uint8) if dt not in (np.str_,) else x)
        check(f"npy {name}", same, f"{got.dtype} {got.shape} vs {x.dtype} {x.shape}")


def test_verify(models):
    """verify compares the served path with the reference value by value; a planted layout bug
    (the test-only fault hook reverses one node's output; a LayerNormalization, as attention fusion
    removes the encoder's Transposes) is named, and told apart from wrong
    values by the sorted comparison."""
    enc = os.path.join(models, "encoder.onnx")
    r = kiln("verify", enc, "--shape", "tokens=2x9")
    check("verify clean exit 0", r.returncode == 0 and " 0 differ" in r.stdout, r.stdout[-500:] + r.stderr)
    r = kiln("verify", enc, "--shape", "tokens=2x9", "--test-fault-node", "LayerNormalization_66")
    out = r.stdout
    check("verify fault exit 1", r.returncode == 1, f"rc={r.returncode}")
    check("verify names the node", "first divergence: node 'LayerNormalization_66' (LayerNormalization axis=-1 epsilon=1e-05)" in out,
          out[-600:])
    check("verify sees wrong places", "output 'ln_65': SAME VALUES, WRONG PLACES" in out, out[-600:])
    check("verify lists input shapes", "inputs: 'res2_63' float32[2, 9, 64]" in out, out[-600:])
    # everything before the planted bug agrees
    before = out.split("ln_65")[0]
    check("verify values before the fault agree", "DIFFERENT" not in before and "WRONG" not in before, before[-300:])
    r = kiln("verify", os.path.join(models, "convnet.onnx"), "--shape", "image=1x19x23x3", "--rtol", "1e-5")
    check("verify convnet", r.returncode == 0, r.stdout[-400:] + r.stderr)


def test_errors(models, tmp):
    bad = os.path.join(tmp, "bad.onnx")
    with open(bad, "wb") as f:
        f.write(b"\x08\x07garbage that is not a model")
    enc = os.path.join(models, "encoder.onnx")
    cases = [
        ("missing model", ["run", os.path.join(tmp, "nope.onnx")]),
        ("malformed model", ["info", bad]),
        ("unknown option", ["run", enc, "--frobnicate"]),
        ("unknown command", ["compile", enc]),
        ("wrong input name", ["run", enc, "--shape", "tokenz=1x4"]),
        ("symbolic dims without --shape", ["run", enc]),
        ("bad shape syntax", ["run", enc, "--shape", "tokens=1xQ"]),
        ("missing npy", ["run", enc, "--input", f"tokens={tmp}/none.npy"]),
        ("unknown provider", ["run", enc, "--shape", "tokens=1x4", "--provider", "tpu"]),
    ]
    for name, args in cases:
        r = kiln(*args)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        check(f"error: {name}", r.returncode != 0 and len(lines) >= 1 and lines[0].startswith("kiln: ") and
              "Traceback" not in r.stderr and r.returncode < 128, f"rc={r.returncode} stderr={r.stderr!r}")


def test_cuda_provider(models):
    """--provider cuda: runs where a GPU is usable, else one clean line saying why."""
    enc = os.path.join(models, "encoder.onnx")
    for cmd in (["run", enc, "--shape", "tokens=2x9", "--provider", "cuda"],
                ["bench", enc, "--shape", "tokens=2x9", "--provider", "cuda", "--runs", "2"],
                ["info", enc, "--provider", "cuda"]):
        r = kiln(*cmd)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        if r.returncode == 0:
            check(f"cuda {cmd[0]} runs on the GPU", "Traceback" not in r.stderr, r.stderr)
        else:
            check(f"cuda {cmd[0]} without a GPU: clean error", r.returncode == 1 and len(lines) == 1 and
                  lines[0].startswith("kiln: CUDA provider:"), f"rc={r.returncode} stderr={r.stderr!r}")


def test_generate_cli(tmp):
    """kiln generate and kiln bench-llm on a tests/models/make_llm.py folder, against onnxruntime-genai."""
    here = os.path.dirname(os.path.abspath(__file__))
    folder = os.path.join(tmp, "llm")
    subprocess.check_call([sys.executable, os.path.join(here, "..", "models", "make_llm.py"), folder],
                          stdout=subprocess.DEVNULL)
    r = kiln("generate", folder, "--prompt-tokens", "5,17,33,100", "-g", "16", "--json")
    check("generate --json exit", r.returncode == 0, r.stderr)
    got = json.loads(r.stdout)["tokens"] if r.returncode == 0 else [[]]
    try:
        import onnxruntime_genai as og
        m = og.Model(folder)
        p = og.GeneratorParams(m)
        p.set_search_options(max_length=20, do_sample=False)
        g = og.Generator(m, p)
        g.append_tokens(np.array([[5, 17, 33, 100]], dtype=np.int32))
        want = []
        while not g.is_done():
            g.generate_next_token()
            want.append(int(g.get_next_tokens()[0]))
        check("generate: greedy tokens equal onnxruntime-genai's", got == [want], f"{got} vs {want}")
    except ImportError as e:
        print(f"SKIP generate vs onnxruntime-genai: {e}")
    r = kiln("generate", folder, "--prompt-tokens", "5,17,33,100", "--prompt-tokens", "9,44", "-g", "8", "--json")
    rows = json.loads(r.stdout)["tokens"] if r.returncode == 0 else []
    check("generate: two prompts, one row each", len(rows) == 2 and all(len(x) == 8 for x in rows), r.stdout + r.stderr)
    check("generate: the padded batch's first row is the prompt alone", rows and rows[0] == got[0][:8], (rows, got))
    r = kiln("generate", folder, "--prompt-tokens", "9,44", "-g", "8")
    check("generate: text output is the ids", r.returncode == 0 and r.stdout.split() == [str(t) for t in rows[1]],
          r.stdout + r.stderr)
    samp = ["generate", folder, "--prompt-tokens", "5,17", "-g", "12", "--temperature", "1.5", "--top-k", "40",
            "--top-p", "0.95", "--seed", "4", "--json"]
    a, b = kiln(*samp), kiln(*samp)
    check("generate: seeded sampling repeats", a.returncode == 0 and a.stdout == b.stdout, a.stdout + a.stderr)
    r = kiln("bench-llm", "-i", folder, "-l", "8", "-g", "6", "-r", "3", "-w", "1", "-b", "2", "--json")
    check("bench-llm --json exit", r.returncode == 0, r.stderr)
    if r.returncode == 0:
        j = json.loads(r.stdout)
        check("bench-llm figures", j["prompt"]["n"] == 3 and j["generation"]["n"] == 15 and
              j["prompt"]["tokens_per_s"] > 0 and j["generation"]["tokens_per_s"] > 0 and j["sampling"]["n"] == 3 and
              j["e2e"]["n"] == 3 and j["peak_rss_bytes"] > 0, j)
    r = kiln("bench-llm", "-i", folder, "-l", "4", "-g", "4", "-r", "2", "-w", "0")
    check("bench-llm text", r.returncode == 0 and "Prompt processing (time to first token):" in r.stdout and
          "Token generation:" in r.stdout and "Peak working set size (bytes):" in r.stdout, r.stdout + r.stderr)
    gqa = os.path.join(tmp, "llm_gqa")
    subprocess.check_call([sys.executable, os.path.join(here, "..", "models", "make_llm.py"), gqa, "--form", "gqa"],
                          stdout=subprocess.DEVNULL)
    cases = [
        ("generate: missing folder", ["generate", os.path.join(tmp, "nope"), "--prompt-tokens", "1", "-g", "2"]),
        ("generate: bad token list", ["generate", folder, "--prompt-tokens", "1,x", "-g", "2"]),
        ("generate: no -g", ["generate", folder, "--prompt-tokens", "1,2"]),
        ("generate: greedy and sampling", ["generate", folder, "--prompt-tokens", "1", "-g", "2", "--greedy",
                                           "--temperature", "0.5"]),
        ("generate: past context_length", ["generate", folder, "--prompt-tokens", "1", "-g", "100000"]),
        ("generate: token outside the vocabulary", ["generate", folder, "--prompt-tokens", "1,999999", "-g", "2"]),
        ("bench-llm: no folder", ["bench-llm", "-l", "4"]),
        ("bench-llm: bad count", ["bench-llm", "-i", folder, "-r", "0"]),
    ]
    for name, args in cases:
        r = kiln(*args)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        check(f"error: {name}", r.returncode == 1 and len(lines) == 1 and lines[0].startswith("kiln: "),
              f"rc={r.returncode} stderr={r.stderr!r}")
    r = kiln("generate", gqa, "--prompt-tokens", "1,2", "-g", "2")
    if r.returncode == 0:
        check("generate: builder-style GQA folder runs", len(r.stdout.split()) == 2, r.stdout)
    else:
        check("generate: builder-style GQA folder without the operators: one clean line", r.returncode == 1 and
              r.stderr.startswith("kiln: ") and "not supported" in r.stderr, r.stderr)
        print(f"SKIP generate on the GQA folder: {r.stderr.strip()}")


def main():
    global KILN
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    KILN, models = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        for test in (test_info, lambda m: test_run_matches_ort(m, tmp), lambda m: test_npy_dtypes(tmp), test_verify,
                     lambda m: test_errors(m, tmp), test_cuda_provider, lambda m: test_generate_cli(tmp)):
            try:
                test(models)
            except Exception as e:  # one broken test does not hide the others
                check("test crashed", False, repr(e))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
