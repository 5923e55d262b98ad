#!/usr/bin/env bash
# Installs what kiln needs, builds it, and runs the main job: the generated encoder model
# (dynamic batch and sequence dims) at two shapes in one session.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq cmake gcc make pkg-config libonnx-dev protobuf-c-compiler libprotobuf-c-dev libjson-c-dev \
    python3 python3-pip clang libclang-rt-dev >/dev/null
# HIP's compiler, for the check that the GPU kernels also build for AMD GPUs (scripts/check_hip.sh)
$SUDO apt-get install -y -qq --no-install-recommends hipcc >/dev/null
python3 -m pip install -q -r requirements.txt

# The CUDA toolkit's compiler, when installed but not on PATH (the CUDA provider is built when found).
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"

python3 tests/models/make_models.py build/models
./build/kiln info build/models/encoder.onnx
./build/kiln run build/models/encoder.onnx --shape tokens=1x16 --shape tokens=3x55 --output-dir build/out
