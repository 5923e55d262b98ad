#!/usr/bin/env python3
"""kiln bench-llm against onnxruntime-genai on one model folder, the two taking turns.

usage: bench_llm.py DIR [DIR ...] [-l 128] [-g 128] [-r 3] [-w 1] [--rounds 5] [--threads 2]
                    [--kiln build/kiln [--kiln OTHER_BUILD/kiln ...]]

Each round runs `kiln bench-llm -i DIR -l L -g G -r R -w W --json` in its own process, then
onnxruntime-genai's generation loop in another (this script, --peer): a new og.Generator per warm-up
and timed iteration, the same prompt ids, max_length L + G, prompt time = append_tokens plus the
first generate_next_token (model_benchmark's time to first token), generation time = each later
generate_next_token. Both run with the same intra-op thread count. The table shows, per folder,
the median over the rounds of each side's tokens/s and of the per-round ratio kiln/ORT (above 1:
kiln is faster). Several --kiln builds (an A/B) each take their turn in every round and get rows
of their own. A benchmark: it prints figures and never fails on them.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def prompt_ids(L):
    return [4 + (i * 7919) % 50 for i in range(L)]  # what kiln bench-llm feeds


def peer(a):
    import onnxruntime_genai as og
    cfg = og.Config(a.dirs[0])
    cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": a.threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(cfg)
    ids = prompt_ids(a.l)
    prompt, gen = [], []
    for it in range(a.w + a.r):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=a.l + a.g, min_length=a.l + a.g, do_sample=False)
        g = og.Generator(model, params)
        t0 = time.perf_counter()
        g.append_tokens(ids)
        g.generate_next_token()
        t1 = time.perf_counter()
        steps = []
        for _ in range(a.g - 1):
            if g.is_done():
                break
            s = time.perf_counter()
            g.generate_next_token()
            steps.append(time.perf_counter() - s)
        if it >= a.w:
            prompt.append(t1 - t0)
            gen += steps
        del g
    print(json.dumps({"prompt": {"tokens_per_s": a.l / statistics.mean(prompt)},
                      "generation": {"tokens_per_s": 1.0 / statistics.mean(gen)}}))


def run_json(cmd, env):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("-l", type=int, default=128)
    ap.add_argument("-g", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-w", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kiln", action="append", help="a kiln binary (default build/kiln); repeat for an A/B")
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        return peer(a)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    kilns = a.kiln or [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "kiln")]
    rows = []
    med = statistics.median
    for d in a.dirs:
        k = [{"prompt": [], "generation": []} for _ in kilns]
        o = {"prompt": [], "generation": []}
        for _ in range(a.rounds):
            kj = [run_json([kb, "bench-llm", "-i", d, "-l", str(a.l), "-g", str(a.g), "-r", str(a.r), "-w", str(a.w),
                            "--threads", str(a.threads), "--json"], env) for kb in kilns]
            oj = run_json([sys.executable, os.path.abspath(__file__), d, "--peer", "-l", str(a.l), "-g", str(a.g),
                           "-r", str(a.r), "-w", str(a.w), "--threads", str(a.threads)], env)
            for key in o:
                o[key].append(oj[key]["tokens_per_s"])
                for i in range(len(kilns)):
                    k[i][key].append(kj[i][key]["tokens_per_s"])
        for i, kb in enumerate(kilns):
            name = os.path.basename(os.path.normpath(d)) + (f" ({kb})" if len(kilns) > 1 else "")
            rows.append((name, med(k[i]["prompt"]), med(o["prompt"]),
                         med([x / y for x, y in zip(k[i]["prompt"], o["prompt"])]),
                         med(k[i]["generation"]), med(o["generation"]),
                         med([x / y for x, y in zip(k[i]["generation"], o["generation"])])))
            print(f"# {name}: kiln prompt {k[i]['prompt']}, ort {o['prompt']}; kiln gen {k[i]['generation']}, "
                  f"ort {o['generation']}", file=sys.stderr)
    print(f"-l {a.l} -g {a.g} -r {a.r} -w {a.w}, {a.threads} threads, median of {a.rounds} alternating rounds")
    print("| folder | prompt tok/s kiln / ORT-genai | kiln/ORT | generation tok/s kiln / ORT-genai | kiln/ORT |")
    print("|---|---|---|---|---|")
    for name, kp, op, rp, kg, og_, rg in rows:
        print(f"| {name} | {kp:.0f} / {op:.0f} | **{rp:.2f}** | {kg:.0f} / {og_:.0f} | **{rg:.2f}** |")


if __name__ == "__main__":
    main()
