#!/usr/bin/env bash
# The whole test suite: a warnings-as-errors build with every test (unit, ONNX conformance,
# model and CLI tests against ONNX Runtime), then an AddressSanitizer + UndefinedBehaviorSanitizer
# build running the unit and conformance tests, then a ThreadSanitizer build running the
# threading tests. Run scripts/setup.sh once before.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"

cmake -B build -DKILN_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

cmake -B build-asan -DKILN_WERROR=ON -DKILN_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"
ctest --test-dir build-asan --output-on-failure -j"$jobs" -L 'unit|conformance'

cmake -B build-tsan -DKILN_WERROR=ON -DKILN_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-tsan -j"$jobs" --target test_threads
ctest --test-dir build-tsan --output-on-failure -L threads
