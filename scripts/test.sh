#!/usr/bin/env bash
# The whole test suite: an AddressSanitizer + UndefinedBehaviorSanitizer build running the unit
# and conformance tests, a ThreadSanitizer build running the threading tests (generators of one
# model on two threads among them), a 60-second fuzzing smoke run, the HIP compile check of the
# GPU kernels, and last the warnings-as-errors build (with the CUDA provider when a CUDA toolkit
# is installed) with every test (unit, ONNX conformance, model, CLI, cross-provider oracle and GPU
# tests, which print SKIP and the reason where no GPU is usable), whose ctest summary closes the
# output. Run scripts/setup.sh once before.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"

# The CUDA toolkit's compiler, when installed but not on PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

# Sanitizer and fuzzing builds leave the CUDA provider out (no GPU runs here); the last build has it.
cmake -B build-asan -DKILN_WERROR=ON -DKILN_CUDA=OFF -DKILN_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"
ctest --test-dir build-asan --output-on-failure -j"$jobs" -L 'unit|conformance'

cmake -B build-tsan -DKILN_WERROR=ON -DKILN_CUDA=OFF -DKILN_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-tsan -j"$jobs" --target test_threads test_threadpool test_scratch test_cache test_genai
ctest --test-dir build-tsan --output-on-failure -L threads

# Fuzz smoke: a libFuzzer build (clang) fuzzes from the seeds for 60 seconds. A crash or sanitizer
# report fails; inputs that only run long or need much memory (a valid model may) do not.
CC=clang cmake -B build-fuzz -DKILN_CUDA=OFF -DKILN_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_model
rm -rf build-fuzz/corpus build-fuzz/crash-* build-fuzz/leak-* build-fuzz/oom-* build-fuzz/timeout-* && mkdir -p build-fuzz/corpus
fuzz_rc=0
./build-fuzz/tests/fuzz_model build-fuzz/corpus tests/fuzz/seeds tests/fuzz/regressions -max_len=65536 \
    -fork=1 -ignore_timeouts=1 -ignore_ooms=1 -max_total_time=60 -timeout=10 -rss_limit_mb=3072 \
    -artifact_prefix=build-fuzz/ || fuzz_rc=$?
# fork mode still exits non-zero after an ignored OOM or timeout: only crashes and leaks count
if compgen -G 'build-fuzz/crash-*' >/dev/null || compgen -G 'build-fuzz/leak-*' >/dev/null; then
    echo "fuzz: crash or leak found (build-fuzz/crash-* / leak-*)"
    exit 1
fi
if ((fuzz_rc)) && ! compgen -G 'build-fuzz/oom-*' >/dev/null && ! compgen -G 'build-fuzz/timeout-*' >/dev/null; then
    echo "fuzz: exit status $fuzz_rc with no artifact"
    exit 1
fi
((fuzz_rc == 0)) || echo "fuzz: exit status $fuzz_rc from ignored OOM/timeout inputs: $(ls build-fuzz/oom-* build-fuzz/timeout-* 2>/dev/null | tr '\n' ' ')"

# The GPU kernels compile for an AMD GPU too (HIP, compile only).
bash scripts/check_hip.sh

cmake -B build -DKILN_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
