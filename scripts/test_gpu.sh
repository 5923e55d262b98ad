#!/usr/bin/env bash
# test_gpu.sh - the GPU test run of the CUDA provider (issue 4), on a machine with an NVIDIA GPU.
# Runs from the repository root with the bundle of scripts/gpu_bundle.sh in .gpu/ (or a local
# CUDA build in build-gpu/), one section after the other, each under a header and a time limit,
# going on after failures; the last line counts the sections: "N passed, N failed".
#
#   a  the kernel tests, the Python GPU-tensor test and the LLM test, tests/gpu/test_gpu_*.py (one
#      section each; test_gpu_llm.py also runs generation against the CPU provider and 100
#      generator create/free cycles)
#   b  tests/gpu/test_gpu_models.py: the layout case, several outputs, CPU fallback, session
#      lifetimes and threads, dynamic shapes, steady state
#   c  the dynamic-shapes model tests on the CUDA provider (tests/models/test_models.py)
#   d  the ONNX backend conformance suite on the CUDA provider, sharded over parallel runners,
#      each running its tests in children of 64 (conformance --batch)
#   e  compute-sanitizer memcheck: the layout-case model and the encoder through `kiln run`, and
#      10,000 decode steps of a tiny builder-style GQA model through `kiln generate`
#   f  scripts/bench_gpu.py: benchmarks against PyTorch (figures; passes when it completes)
#   g  scripts/bench_llm_gpu.sh: kiln bench-llm on the CUDA provider (figures, as f)
# A section that exits 0 after printing a line starting with SKIP counts as skipped.
#
# usage: bash scripts/test_gpu.sh
#   KILN_GPU_SECTIONS="a b c d e f g"  the sections to run (default all)
#   KILN_GPU_KERNEL_TESTS="llm python"  section a's files to run (test_gpu_NAME.py; default all)
#   KILN_GPU_DIR       where kiln, libkiln.so and tests/conformance are (default .gpu if there,
#                      else build-gpu)
#   OUT                folder for the logs (default /tmp/kiln-gpu-logs): test_gpu.log (all
#                      output), conformance.log, memcheck.log, bench_gpu.md
#   KILN_TEST_LENGTHS  random encoder lengths in section c (default here 200)
#   KILN_CONF_SHARDS   parallel conformance runners (default min(nproc, 12))
#   KILN_BENCH_ARGS    extra arguments for bench_gpu.py (e.g. "--quick")
#   KILN_GPU_DEADLINE  seconds the whole run may take (default 570: the device tool stops a
#                      command at 600); each section's limit is cut to what is left, and a
#                      section with under 20 s left is not started (counted as failed)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SECTIONS=${KILN_GPU_SECTIONS:-a b c d e f g}
LOGS=${OUT:-/tmp/kiln-gpu-logs}
mkdir -p "$LOGS"
WORK=$(mktemp -d /tmp/kiln-gpu.XXXXXX)
exec > >(tee -a "$LOGS/test_gpu.log") 2>&1
TEE_PID=$!
export PYTHONUNBUFFERED=1
T0=$SECONDS
DEADLINE=${KILN_GPU_DEADLINE:-570}

# ---- the build and the libraries it needs ----
if [[ -n ${KILN_GPU_DIR:-} ]]; then BIN=$KILN_GPU_DIR
elif [[ -f .gpu/libkiln.so ]]; then BIN=.gpu
else BIN=build-gpu; fi
BIN=$(cd "$BIN" 2>/dev/null && pwd) || { echo "test_gpu: no build: run scripts/gpu_bundle.sh, carry .gpu"; exit 1; }
# the test binaries travel xz-compressed (scripts/gpu_bundle.sh)
if [[ -f $BIN/tests.tar.xz && ! $BIN/tests/conformance -nt $BIN/tests.tar.xz ]]; then
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' "$BIN/tests.tar.xz" "$BIN" ||
        echo "test_gpu: cannot unpack $BIN/tests.tar.xz"
fi
KILN=$BIN/kiln
export KILN_LIB=$BIN/libkiln.so
CONFORMANCE=$BIN/tests/conformance
[[ -f $BIN/BUILD_INFO ]] && sed 's/^/bundle: /' "$BIN/BUILD_INFO"

# dir_of LIB: a folder holding LIB, searched where CUDA and pip's nvidia packages put it
dir_of() {
    local lib=$1 d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
             /usr/lib/x86_64-linux-gnu; do
        [[ -e $d/$lib ]] && { echo "$d"; return; }
    done
    d=$(python3 - "$lib" 2>/dev/null <<'EOF'
import glob, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(0)
for base in list(nvidia.__path__):
    hits = sorted(glob.glob(os.path.join(base, "*", "lib", sys.argv[1])) + glob.glob(os.path.join(base, "cu*", "lib", sys.argv[1])))
    if hits:
        print(os.path.dirname(hits[0]))
        break
EOF
)
    [[ -n $d ]] && { echo "$d"; return; }
    d=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
    [[ -n $d ]] && { dirname "$d"; return; }
    d=$(find /usr/local /opt /usr/lib -maxdepth 7 -name "$lib" 2>/dev/null | head -1)
    [[ -n $d ]] && dirname "$d"
}
LIBPATH=$BIN
for lib in libcublas.so.13 libcublasLt.so.13 libcudart.so.13; do
    d=$(dir_of "$lib")
    if [[ -z $d ]]; then echo "test_gpu: $lib not found"; continue; fi
    [[ ":$LIBPATH:" == *":$d:"* ]] || LIBPATH=$LIBPATH:$d
done
# cuDNN (the convolutions' library when found; without it they run im2col + cuBLAS)
d=$(dir_of libcudnn.so.9)
if [[ -n $d ]]; then
    [[ ":$LIBPATH:" == *":$d:"* ]] || LIBPATH=$LIBPATH:$d
    export KILN_EXPECT_CUDNN=1
else
    echo "test_gpu: libcudnn.so.9 not found: convolutions run without cuDNN"
fi
# NVRTC (the generated element-wise kernels; without it those chains stay unfused)
d=$(dir_of libnvrtc.so.13)
if [[ -n $d ]]; then
    [[ ":$LIBPATH:" == *":$d:"* ]] || LIBPATH=$LIBPATH:$d
else
    echo "test_gpu: libnvrtc.so.13 not found: element-wise chains run unfused"
fi
export LD_LIBRARY_PATH=$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
SANITIZER=$(command -v compute-sanitizer)
for s in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -z $SANITIZER && -x $s ]] && SANITIZER=$s
done
nvidia-smi -L || echo "test_gpu: nvidia-smi failed"
missing=$(ldd "$KILN" 2>/dev/null | grep 'not found')
[[ -n $missing ]] && echo "test_gpu: $KILN misses libraries: $missing"

# ---- sections ----
PASSED=() FAILED=() SKIPPED=()
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
# section ID TITLE TIMEOUT_S CMD...: runs CMD under a header and a time limit, records the result
section() {
    local id=$1 title=$2 limit=$3
    shift 3
    local t=$SECONDS left=$((DEADLINE - (SECONDS - T0) - 10))
    echo
    echo "==== [$id] $title ===="
    if ((left < 20)); then
        FAILED+=("$id")
        echo "==== [$id] FAIL: not run, $left s left of KILN_GPU_DEADLINE=$DEADLINE ===="
        return
    fi
    ((limit > left)) && limit=$left
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$WORK/section.out"
    local rc=${PIPESTATUS[0]}
    local took=$((SECONDS - t))
    if ((rc == 0)) && grep -q '^SKIP' "$WORK/section.out"; then
        SKIPPED+=("$id")
        echo "==== [$id] SKIPPED ($took s) ===="
    elif ((rc == 0)); then
        PASSED+=("$id")
        echo "==== [$id] PASS ($took s) ===="
    else
        FAILED+=("$id")
        local why="exit $rc"
        ((rc == 124 || rc == 137)) && why="timed out after $limit s"
        echo "==== [$id] FAIL: $why ($took s) ===="
    fi
}

MODELS=$WORK/models
if want c || want e; then
    python3 tests/models/make_models.py "$MODELS" || echo "test_gpu: make_models.py failed"
fi

if want a; then
    found=0
    for t in tests/gpu/test_gpu_*.py; do
        [[ $t == tests/gpu/test_gpu_models.py ]] && continue
        name=$(basename "$t" .py)
        [[ -n ${KILN_GPU_KERNEL_TESTS:-} && " $KILN_GPU_KERNEL_TESTS " != *" ${name#test_gpu_} "* ]] && continue
        found=1
        limit=120
        [[ $t == tests/gpu/test_gpu_llm.py ]] && limit=300 # ops, then generation on both providers
        section "a:$(basename "$t" .py)" "kernels: $t" "$limit" python3 "$t"
    done
    ((found)) || echo "(a) no tests/gpu/test_gpu_*.py kernel tests yet"
fi

want b && section b "models: tests/gpu/test_gpu_models.py" 240 python3 tests/gpu/test_gpu_models.py

want c && KILN_TEST_LENGTHS=${KILN_TEST_LENGTHS:-200} \
    section c "dynamic shapes: tests/models/test_models.py --provider cuda" 300 \
    python3 tests/models/test_models.py "$MODELS" --provider cuda

# shellcheck disable=SC2317  # run through `bash -c conformance`
conformance() {
    local data=$WORK/onnx-data shards=${KILN_CONF_SHARDS:-$(($(nproc) < 12 ? $(nproc) : 12))}
    python3 tests/conformance/prepare_data.py "$data" || return 1
    [[ -x $CONFORMANCE ]] || { echo "no conformance runner at $CONFORMANCE"; return 1; }
    echo "$shards runners side by side; full output in $LOGS/conformance.log"
    local pids=() i rc=0
    for ((i = 0; i < shards; i++)); do
        # --batch: a child runs up to 64 tests, opening the GPU once for them (a crash still
        # fails only its test)
        "$CONFORMANCE" "$data" --provider cuda --expected tests/conformance/expected_failures.txt \
            --shard "$i/$shards" --batch 64 >"$WORK/conf.$i.log" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
    cat "$WORK"/conf.*.log >"$LOGS/conformance.log"
    grep -hE '^(FAIL|FIXED|STALE) ' "$WORK"/conf.*.log | sort -u >"$WORK/conf.bad"
    head -200 "$WORK/conf.bad"
    local nf
    nf=$(wc -l <"$WORK/conf.bad")
    ((nf > 200)) && echo "... $nf lines in all, in conformance.log"
    awk '/ passed, .* failed, .* skipped$/ {p += $1; f += $3; s += $5}
         /^on the GPU: / {g += $4; gp += $12}
         END {printf "conformance on cuda: %d passed, %d failed (expected failures included), %d skipped\n", p, f, s;
              printf "on the GPU: %d tests ran at least one node there, %d of them passed\n", g, gp}' "$WORK"/conf.*.log
    return "$rc"
}

# shellcheck disable=SC2317  # run through `bash -c memcheck`
memcheck() {
    [[ -n $SANITIZER ]] || { echo "compute-sanitizer not found"; return 1; }
    python3 - "$WORK/layout.onnx" <<'EOF' || return 1
import sys
sys.path.insert(0, "tests/gpu")
import test_gpu_models as t
import numpy as np
open(sys.argv[1], "wb").write(t.layout_model(True, np.float32))
EOF
    local rc=0
    : >"$LOGS/memcheck.log"
    for args in "$WORK/layout.onnx --shape image=1x40x40x3 --shape image=2x37x41x3 --shape image=1x40x40x3" \
                "$MODELS/encoder.onnx --shape tokens=1x16 --shape tokens=3x100 --shape tokens=1x16"; do
        echo "compute-sanitizer --tool memcheck --leak-check full kiln run $args --provider cuda"
        # shellcheck disable=SC2086
        "$SANITIZER" --tool memcheck --error-exitcode 99 --leak-check full "$KILN" run $args --provider cuda \
            --output-dir "$WORK/mc_out" >"$WORK/mc.log" 2>&1
        local r=$?
        cat "$WORK/mc.log" >>"$LOGS/memcheck.log"
        grep -E '^kiln|ERROR SUMMARY|LEAK SUMMARY|Invalid|Program hit' "$WORK/mc.log" | head -20
        ((r == 0)) || { echo "exit $r"; rc=1; }
    done
    # 10,000 decode steps over one device KV cache (max_length 10,010): GroupQueryAttention,
    # MatMulNBits and the norms on the GPU, a tiny model so that memcheck keeps within the limit
    python3 tests/models/make_llm.py "$WORK/llm_soak" --form gqa --layers 1 --hidden 32 --heads 2 --kv-heads 1 \
        --vocab 64 --context 10240 --max-length 10010 --seed 77 --eos 1000 >/dev/null || return 1
    echo "compute-sanitizer --tool memcheck --leak-check full kiln generate llm_soak -g 10000 --provider cuda"
    "$SANITIZER" --tool memcheck --error-exitcode 99 --leak-check full "$KILN" generate "$WORK/llm_soak" \
        --prompt-tokens 5,6,7,8 -g 10000 --provider cuda --json >"$WORK/mc.log" 2>&1
    local r=$?
    cat "$WORK/mc.log" >>"$LOGS/memcheck.log"
    grep -E '^kiln|ERROR SUMMARY|LEAK SUMMARY|Invalid|Program hit' "$WORK/mc.log" | head -20
    python3 -c 'import json, sys; t = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])["tokens"][0]
print(f"{len(t)} tokens generated"); sys.exit(len(t) != 10000)' "$WORK/mc.log" || r=1
    ((r == 0)) || { echo "exit $r"; rc=1; }
    return "$rc"
}
export KILN KILN_LIB CONFORMANCE LOGS WORK MODELS SANITIZER
export -f conformance memcheck
want d && section d "conformance: ONNX backend tests on the CUDA provider" 420 bash -c conformance
want e && section e "compute-sanitizer memcheck (kiln run, kiln generate --provider cuda)" 480 bash -c memcheck

# shellcheck disable=SC2086
want f && section f "benchmarks: scripts/bench_gpu.py (figures, not a test)" 330 \
    python3 scripts/bench_gpu.py --kiln-lib "$KILN_LIB" --md "$LOGS/bench_gpu.md" ${KILN_BENCH_ARGS:-}

want g && section g "LLM benchmark: scripts/bench_llm_gpu.sh (figures, not a test)" 540 \
    bash scripts/bench_llm_gpu.sh "$WORK"

rm -rf "$WORK"
echo
echo "sections passed: ${PASSED[*]:-none}"
echo "sections failed: ${FAILED[*]:-none}"
echo "sections skipped: ${SKIPPED[*]:-none}"
echo "total $((SECONDS - T0)) s; logs in $LOGS"
echo "${#PASSED[@]} passed, ${#FAILED[@]} failed, ${#SKIPPED[@]} skipped"
status=$((${#FAILED[@]} == 0 ? 0 : 1))
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit $status
