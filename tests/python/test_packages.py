"""test_packages.py - three public PyPI packages that use ONNX Runtime internally and ship their
ONNX files, run end to end through kiln's drop-in path (kiln.install_as_onnxruntime() before the
package is imported, in a fresh process) and through ONNX Runtime on the same inputs; outputs
compared with the tolerances of scripts/bench_packages.py (OCR texts equal, boxes 1 px, scores
1e-3; VAD probabilities atol 1e-4 and timestamps equal; diacritized strings equal). Each kiln
run must show that kiln's sessions ran (their statistics) with `onnxruntime` resolving to kiln.
ORT is the exact one of tests/common/ort_int8.py (the text2tashkeel models are int8 BiLSTMs: on a
CPU where ORT's uint8 x int8 products saturate, AVX2 without VNNI, ORT computes them as uint8 x
uint8, exact, so the strings must still be equal; where they are exact, ORT as it is).

The packages are pinned in requirements.txt; the test installs them from
it when they are missing (pip, from PyPI) and skips only when pip cannot reach the registry.
No timings are checked here: scripts/bench_packages.py measures them."""
import importlib.util
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_packages  # noqa: E402

MODULES = {"rapidocr": "rapidocr_onnxruntime", "vad": "faster_whisper", "tashkeel": "text2tashkeel"}


def _install_missing():
    missing = [m for m in MODULES.values() if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    req = os.path.join(HERE, "..", "..", "requirements.txt")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-r", req], capture_output=True, text=True)
    if p.returncode:
        return f"pip install -r requirements.txt failed: {p.stderr.strip()[-400:]}"
    importlib.invalidate_caches()
    return None


@pytest.fixture(scope="module")
def workdir():
    why = _install_missing()
    if why:
        pytest.skip(why)
    if os.environ.get("KILN_TEST_INSTALLED"):
        pytest.skip("runs kiln from python/ in fresh processes")
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.mark.parametrize("name", bench_packages.PACKAGES)
def test_package_pipeline_equals_onnxruntime(workdir, name):
    want = bench_packages.run_in_fresh_process(name, "ort", 0, workdir, exact_int8=True)
    got = bench_packages.run_in_fresh_process(name, "kiln", 0, workdir)
    assert want["kiln_runs"] is None and got["kiln_sessions"] >= 1 and got["kiln_runs"] >= 1, got
    rows = bench_packages.compare(name, got["output"], want["output"])
    assert rows, "nothing compared"
    bad = [f"{what}: {detail}" for what, ok, detail in rows if not ok]
    assert not bad, "\n".join([want["ort_mode"]] + bad)
    if name == "rapidocr":  # the pipeline found the drawn text at all
        assert [t for _, t, _ in got["output"]] == ["Hello kiln 2024", "ONNX Runtime drop-in"]
    if name == "vad":
        assert got["output"][1], "no speech found in the vowel-like waveform"
