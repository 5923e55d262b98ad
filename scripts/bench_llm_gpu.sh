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
# KILN_LLM_8B=1: an 8B-shaped folder as well (Llama-3.1-8B dims: 32 layers, hidden 4096, 32/8
# heads, MLP 14336, vocab 128256; int4 block 128 with zero points, float16; random packed
# weights, ~4 GB in model.onnx.data): decode at -l 128 -g 128 and prefill at 1024 and 4096 tokens
if [[ -n ${KILN_LLM_8B:-} ]]; then
    big=$work/llm_8b
    [[ -f $big/genai_config.json ]] ||
        python3 tests/models/make_llm.py "$big" --form gqa --layers 32 --hidden 4096 --heads 32 --kv-heads 8 \
            --intermediate 14336 --vocab 128256 --block 128 --asymmetric --dtype fp16 --random-weights \
            --external-data --accuracy-level 1 --context 8192 >/dev/null
    for lg in "128 128" "1024 8" "4096 8"; do
        set -- $lg
        echo "== kiln bench-llm -i llm_8b -l $1 -g $2 -r 2 -w 1 --provider cuda"
        "$KILN" bench-llm -i "$big" -l "$1" -g "$2" -r 2 -w 1 --provider cuda |
            grep -E "tokens/s|avg \(us\)|Peak|CUDA graphs"
    done
fi
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
