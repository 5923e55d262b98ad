#!/usr/bin/env bash
# bench_gemv_gpu.sh - builds scripts/bench_gemv_gpu.cu with src/gpu/k_llm.cu (nvcc, sm_90) and
# runs it: the int4 GEMV's microseconds and bandwidth per 8B-model shape, and a decode step's 161
# GEMVs as one CUDA graph. For the GPU machine (nvcc there); arguments go to the program.
#   KILN_GEMV_NVCC_FLAGS  extra nvcc flags (e.g. -D... to try a kernel setting)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${TMPDIR:-/tmp}/kiln_bench_gemv
# shellcheck disable=SC2086
nvcc -arch=sm_90 -O3 -std=c++17 -Isrc -Iinclude ${KILN_GEMV_NVCC_FLAGS:-} scripts/bench_gemv_gpu.cu src/gpu/k_llm.cu -o "$out"
"$out" "$@"
