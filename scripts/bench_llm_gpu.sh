#!/usr/bin/env bash
# bench_llm_gpu.sh - kiln bench-llm on the CUDA provider (a benchmark: figures, never a verdict).
# Makes a builder-style random-weight folder (tests/models/make_llm.py --form gqa: 8 layers,
# hidden 2048, 16/4 heads, vocab 32000, int4 block 32, context 1024) and runs
# `kiln bench-llm -l 128 -g 128 -r 3 -w 1 --provider cuda` on it, then the same at batch 4, then
# scripts/profile_llm_step.py (one decode step through `kiln bench --profile`).
# Run on the GPU machine after scripts/gpu_bundle.sh here (carry .gpu), or with KILN=path.
#
# usage: bash scripts/bench_llm_gpu.sh [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-.gpu/kiln} # test_gpu.sh exports its own, with the library path set
export LD_LIBRARY_PATH="$(dirname "$KILN"):/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work=${1:-$(mktemp -d)}
dir=$work/llm_8x2048
[[ -f $dir/genai_config.json ]] ||
    python3 tests/models/make_llm.py "$dir" --form gqa --layers 8 --hidden 2048 --heads 16 --kv-heads 4 \
        --vocab 32000 --context 1024 --max-length 1024 --accuracy-level 1 >/dev/null
for b in 1 4; do
    echo "== kiln bench-llm -i llm_8x2048 -l 128 -g 128 -r 3 -w 1 -b $b --provider cuda"
    "$KILN" bench-llm -i "$dir" -l 128 -g 128 -r 3 -w 1 -b "$b" --provider cuda
done
# where the GPU time goes: Nsight Systems' kernel summary of a short generation, when nsys is
# there; else one decode step through kiln bench --profile (host-fed KV cache: its copies and
# the per-node synchronisation of an observer make that a coarse view)
if command -v nsys >/dev/null; then
    nsys profile --stats=false -o "$work/llm" --force-overwrite true \
        "$KILN" bench-llm -i "$dir" -l 128 -g 64 -r 1 -w 1 --provider cuda >/dev/null 2>&1 &&
        nsys stats --report cuda_gpu_kern_sum --format csv "$work/llm.nsys-rep" 2>/dev/null | head -25
else
    python3 scripts/profile_llm_step.py "$dir" --position 200 --kiln "$KILN" --provider cuda
fi
