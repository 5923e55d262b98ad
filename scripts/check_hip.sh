#!/usr/bin/env bash
# check_hip.sh - compiles the GPU provider's sources with HIP for an AMD target (compile only,
# nothing is linked or run) to keep the portability layer (src/gpu/rt.h) true: every kernel
# source src/gpu/k_*.cu as HIP, and every C file src/gpu/*.c that includes the GPU headers as
# host C with -DKILN_HIP. One line per file; stops with status 1 at the first file that fails
# (its compiler output is printed).
#
# Needs Debian's hipcc (ROCm 5.2 on Debian 12):  apt-get install -y --no-install-recommends hipcc
# Debian 12 packages no hipBLAS, so C files that include gpu/blas.h are skipped (with a line
# saying so) when hipblas/hipblas.h is missing.
#
# usage: bash scripts/check_hip.sh [file...]     (default: every source above)
#   HIPCC      the compiler (default hipcc)
#   HIP_ARCH   the AMD target (default gfx90a: MI200)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
HIPCC=${HIPCC:-hipcc}
ARCH=${HIP_ARCH:-gfx90a}
if ! command -v "$HIPCC" >/dev/null; then
    echo "check_hip: $HIPCC not found (apt-get install -y --no-install-recommends hipcc)"
    exit 1
fi
FLAGS=(-DKILN_HIP "--offload-arch=$ARCH" -Isrc -Iinclude -Wall -Werror -c -o /dev/null)
have_hipblas=0
echo '#include <hipblas/hipblas.h>' | "$HIPCC" -DKILN_HIP "--offload-arch=$ARCH" -x c -E - >/dev/null 2>&1 && have_hipblas=1

if (($#)); then
    files=("$@")
else
    files=(src/gpu/k_*.cu)
    for f in src/gpu/*.c; do
        grep -q '#include "gpu/' "$f" && files+=("$f")
    done
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
n=0
for f in "${files[@]}"; do
    [[ -e $f ]] || continue
    case $f in
    *.cu) lang=(-x hip -std=c++17) ;;
    *) lang=(-x c -std=c11) ;;
    esac
    if [[ $f == *.c ]] && ((!have_hipblas)) && grep -q '#include "gpu/blas.h"' "$f"; then
        echo "skip  $f (includes gpu/blas.h; no hipblas/hipblas.h here)"
        continue
    fi
    t0=$SECONDS
    if "$HIPCC" "${lang[@]}" "${FLAGS[@]}" "$f" >"$log" 2>&1; then
        echo "ok    $f ($((SECONDS - t0)) s)"
        n=$((n + 1))
    else
        echo "FAIL  $f"
        cat "$log"
        exit 1
    fi
done
echo "check_hip: $n files compiled for $ARCH"
