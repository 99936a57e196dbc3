#!/usr/bin/env bash
# Builds the CUDA backend's test here (a machine with the CUDA toolkit and the project's Debian
# packages, no GPU needed) and stages it for a GPU machine that has the driver and CUDA runtime
# but none of our build dependencies (no Abseil, no GoogleTest, no internet):
#
#   bench/gpu/stage.sh [STAGE_DIR]          # default: <repo>/.gpu-stage
#   PD_GPU_STAGE_BUILD=build bench/gpu/stage.sh   # reuse a build dir configured with CUDA arch 90
#
# The stage holds cuda_backend_test (op parity and timings), cuda_model_test (whole models, CPU
# offload splits, the decode/prefill bench), the shared libraries they link (Debian's Abseil),
# and run_staged.sh. cuBLAS and the CUDA runtime are NOT copied (hundreds of MiB): run_staged.sh
# finds the GPU machine's own copies of the same major version (libcublas.so.13). The stage is
# about 12 MiB; add it to .git/info/exclude so it never lands in a commit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STAGE="${1:-$ROOT/.gpu-stage}"
BUILD="${PD_GPU_STAGE_BUILD:-$ROOT/build-gpu-stage}"
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDSERVE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90
fi
cmake --build "$BUILD" --target cuda_backend_test cuda_model_test -j "${PD_JOBS:-2}"
rm -rf "$STAGE" && mkdir -p "$STAGE/lib"
source "$ROOT/bench/gpu/stage_lib.sh"
for bin in cuda_backend_test cuda_model_test; do
  stage_binary "$BUILD/tests/$bin" "$STAGE" "$STAGE/lib"
done
cp "$ROOT/bench/gpu/run_staged.sh" "$ROOT/bench/gpu/torch_reference.py" \
  "$ROOT/bench/gpu/ncu_summary.py" "$ROOT/bench/gpu/cuda_libs.sh" "$STAGE/"
echo "staged in $STAGE: $(du -sh "$STAGE" | cut -f1), $(ls "$STAGE/lib" | wc -l) libraries"
