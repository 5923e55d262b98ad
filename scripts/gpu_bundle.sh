#!/usr/bin/env bash
# gpu_bundle.sh - builds the CUDA provider here (build-gpu/, Release, all targets) and gathers
# what a GPU machine without protobuf-c and json-c needs into the ignored folder .gpu/: the kiln
# CLI, libkiln.so, libprotobuf-c.so.1 and libjson-c.so.5, and tests.tar.xz with the conformance runner
# (scripts/test_gpu.sh unpacks it; by hand:
# `tar -xJf .gpu/tests.tar.xz -C .gpu`). Then, on the device: carry [".gpu"] and run
# `bash scripts/test_gpu.sh`.
#
# usage: bash scripts/gpu_bundle.sh
#   KILN_GPU_CMAKE_ARGS  extra configure arguments (default -DKILN_WERROR=OFF: a warning the
#                        Release optimiser finds must not stop a bundle; CI keeps -Werror)
#   KILN_GPU_JOBS        parallel build jobs (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build="build-gpu"
bundle=.gpu
jobs=${KILN_GPU_JOBS:-$(nproc)}

grep -qx '/.gpu/' .gitignore 2>/dev/null || echo '/.gpu/' >>.gitignore
# shellcheck disable=SC2086
cmake -B "$build" -DKILN_CUDA=ON -DCMAKE_BUILD_TYPE=Release ${KILN_GPU_CMAKE_ARGS:--DKILN_WERROR=OFF} >/dev/null
cmake --build "$build" -j "$jobs"

rm -rf "$bundle"
mkdir -p "$bundle/tests"

# add SRC DEST: copies SRC (following links) to .gpu/DEST, stripped
add() {
    local src=$1 dest=$bundle/$2
    [[ -f $src ]] || { echo "gpu_bundle: $src is missing" >&2; exit 1; }
    cp -L "$src" "$dest"
    chmod u+w "$dest"
    strip --strip-unneeded "$dest" 2>/dev/null || true
}
add "$build/kiln" kiln
add "$build/libkiln.so" libkiln.so
# (|| true: awk's early exit can end ldconfig with SIGPIPE, which pipefail would make fatal)
protobuf_c=$(ldconfig -p | awk '/libprotobuf-c\.so\.1 .*x86-64/ {print $NF; exit}' || true)
add "${protobuf_c:-/usr/lib/x86_64-linux-gnu/libprotobuf-c.so.1}" libprotobuf-c.so.1
json_c=$(ldconfig -p | awk '/libjson-c\.so\.5 .*x86-64/ {print $NF; exit}' || true)
add "${json_c:-/usr/lib/x86_64-linux-gnu/libjson-c.so.5}" libjson-c.so.5
# the conformance runner (scripts/test_gpu.sh section d; the only test binary the GPU suite
# runs), xz-compressed: it links the whole library with its GPU code; scripts/test_gpu.sh
# unpacks it into .gpu/tests/
add "$build/tests/conformance" tests/conformance
[[ -f $bundle/tests/conformance ]] || { echo "gpu_bundle: no conformance runner" >&2; exit 1; }
tar -C "$bundle" -cf - tests | xz -T0 -6 >"$bundle/tests.tar.xz"
rm -rf "$bundle/tests"

{
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes')"
    echo "nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    grep -E '^(CMAKE_BUILD_TYPE|CMAKE_CUDA_ARCHITECTURES|KILN_CUDA|KILN_WERROR):' "$build/CMakeCache.txt" || true
} >"$bundle/BUILD_INFO"

if ! LD_LIBRARY_PATH="$bundle:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bundle/kiln" ops >/dev/null; then
    echo "gpu_bundle: warning: .gpu/kiln does not start here"
fi
du -sh "$bundle"
find "$bundle" -type f -printf '%10s  %p\n' | sort -k2
mib=$(du -sm "$bundle" | cut -f1)
if ((mib > 60)); then
    echo "gpu_bundle: .gpu/ is ${mib} MiB, over the 60 MiB the device call allows" >&2
    exit 1
fi
echo "gpu_bundle: done; device call: carry [\".gpu\"], command 'bash scripts/test_gpu.sh'"
