#!/usr/bin/env python3
"""kiln / ONNX Runtime latency of the ORT-tool forms of tests/models/ort_families.py (the forms
test_ort_forms.py checks), through bench_peer.measure: both on the same inputs, 2 threads, taking
turns. A benchmark, not a test.

usage: bench_ort_forms.py [--kiln build/kiln] [--forms qd_s8,...] [--only FAMILY,...] [--rounds N] [--runs N]
"""
import argparse
import os
import sys
import tempfile

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "common"))
import bench_peer  # noqa: E402
import ort_families  # noqa: E402
import test_ort_forms  # noqa: E402

# a benchmark shape per family: the largest of its test feeds, fed as the test feeds them
DEFAULT_FORMS = "qd_s8,qd_u8,qs_qdq,qs_qop,opt_qd_s8,opt_qd_u8,ort_all"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "build", "kiln"))
    ap.add_argument("--forms", default=DEFAULT_FORMS)
    ap.add_argument("--only")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    fams = [b() for b in ort_families.FAMILIES]
    if a.only:
        fams = [f for f in fams if f.name in a.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for fam in fams:
            src = os.path.join(d, f"{fam.name}.onnx")
            onnx.save(fam.model, src)
            feeds = max(fam.feeds, key=lambda f: sum(v.size for v in f.values()))
            shapes = {k: list(v.shape) for k, v in feeds.items()}
            # the family's own feeds (valid ids, masks of 0/1), not bench_peer's random integers
            bench_peer.make_inputs = lambda model, shapes, rng, feeds=feeds: dict(feeds)
            for form in a.forms.split(","):
                path = test_ort_forms.make_form(fam, form, src, d)
                if path is None:
                    continue
                try:
                    r = bench_peer.measure(path, shapes, 2, a.runs, 3, a.kiln, a.rounds)
                except RuntimeError as e:
                    print(f"{fam.name} {form}: {str(e)[:200]}")
                    continue
                rows.append((fam.name, form, r["shape"], r["kiln"]["median_ms"], r["ort"]["median_ms"], r["ratio"]))
                print(f"{fam.name:<10} {form:<10} {r['shape']:<40} kiln {r['kiln']['median_ms']:8.3f} ms  "
                      f"ORT {r['ort']['median_ms']:8.3f} ms  ratio {r['ratio']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
