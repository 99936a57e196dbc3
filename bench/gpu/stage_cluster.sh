#!/usr/bin/env bash
# Stages the end-to-end GPU check of issue 22 — the default model through `pdctl up --backend
# cuda` — for a GPU machine that has none of our dependencies and no network:
#
#   bench/gpu/stage_cluster.sh [MODEL]       # default: models/gemma-3-270m-q4_k_m.gguf
#
# It writes, in the repository root (all ignored by git through .git/info/exclude):
#   .gpu-cluster/   stage.tar.xz (pdctl, pd-router, pd-prefill, pd-decode without debug info, the
#                   shared libraries they link outside glibc/libstdc++/CUDA, UCX's cma module),
#                   model.sha256, run_cluster.sh
#   .gpu-model-N/   the model in parts of PART_MIB MiB (default: what fits beside the tracked
#                   tree in one call's 64 MB, less 1 MiB; 24 MiB with a 36 MiB tree)
#
# Why parts: a device call carries at most 64 MB (10^6 bytes) together with the tracked tree, and
# the default model is 241 MiB. A warm machine (30 s idle) keeps /tmp between calls but not the
# repository copy, carried paths included (seen 2026-12-04), so each call copies its part to
# /tmp/pd-parts, back to back, and the last call carries the stage (16 MiB) with the last part
# (the smallest) and runs the check:
#
#   device run, carry [.gpu-model-1]: mkdir -p /tmp/pd-parts && cp .gpu-model-1/* /tmp/pd-parts/
#   ... one call per part but the last, back to back
#   device run, carry [.gpu-cluster, .gpu-model-N]: OUT=$OUT bash .gpu-cluster/run_cluster.sh
#
# run_cluster.sh says which parts it lacks if the machine went cold between calls.
# The binaries come from PD_GPU_STAGE_BUILD (default: build), configured with CUDA arch 90.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${PD_GPU_STAGE_BUILD:-$ROOT/build}"
MODEL="${1:-$ROOT/models/gemma-3-270m-q4_k_m.gguf}"
if [[ -z "${PART_MIB:-}" ]]; then
  tree=$(git -C "$ROOT" ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
  PART_MIB=$(( (64000000 - tree) / 1048576 - 1 ))
fi
((PART_MIB > 0)) || { echo "the tracked tree leaves no room for a model part in a call" >&2; exit 1; }
STAGE="$ROOT/.gpu-cluster"
[[ -f "$MODEL" ]] || { echo "no model at $MODEL (make setup fetches the default one)" >&2; exit 1; }
grep -q 'CMAKE_CUDA_ARCHITECTURES:STRING=.*90' "$BUILD/CMakeCache.txt" ||
  { echo "$BUILD is not configured with CUDA arch 90 (sm_90, the H200)" >&2; exit 1; }
cmake --build "$BUILD" --target pdctl pd-router pd-prefill pd-decode -j "${PD_JOBS:-2}"

EXCLUDE="$ROOT/.git/info/exclude"
for p in '.gpu-cluster/' '.gpu-model-*/'; do
  grep -qxF "$p" "$EXCLUDE" 2>/dev/null || echo "$p" >> "$EXCLUDE"
done

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/pd/bin" "$TMP/pd/lib" "$TMP/pd/ucx"
source "$ROOT/bench/gpu/stage_lib.sh"
for bin in pdctl pd-router pd-prefill pd-decode; do
  stage_binary "$BUILD/bin/$bin" "$TMP/pd/bin" "$TMP/pd/lib"
done
# UCX loads its transports as modules from a compiled-in directory; run_cluster.sh points
# UCX_MODULE_DIR here. cma is the one the loopback cluster uses besides the built-in posix,
# sysv, self and tcp (ib and rdmacm need RDMA libraries the GPU machine does not have).
UCX_DIR="$(dirname "$(readlink -f "$(ldconfig -p | awk '/libucp.so.0 / {print $NF; exit}')")")/ucx"
cp -L "$UCX_DIR/libuct_cma.so.0" "$TMP/pd/ucx/"
ln -s libuct_cma.so.0 "$TMP/pd/ucx/libuct_cma.so"

rm -rf "$STAGE" "$ROOT"/.gpu-model-*
mkdir -p "$STAGE"
tar -C "$TMP" -cJf "$STAGE/stage.tar.xz" pd
cp "$ROOT/bench/gpu/run_cluster.sh" "$ROOT/bench/gpu/cuda_libs.sh" "$STAGE/"
(cd "$(dirname "$MODEL")" && sha256sum "$(basename "$MODEL")") > "$STAGE/model.sha256"
split -b "${PART_MIB}M" -d -a 2 "$MODEL" "$TMP/part."
n=0
for part in "$TMP"/part.*; do
  n=$((n + 1))
  mkdir -p "$ROOT/.gpu-model-$n"
  mv "$part" "$ROOT/.gpu-model-$n/${part##*/}"
done
echo "$n" > "$STAGE/parts"
echo "staged: .gpu-cluster ($(du -sh "$STAGE" | cut -f1)) and $n model parts of ${PART_MIB} MiB"
echo "send .gpu-cluster, then .gpu-model-1 .. .gpu-model-$n, one path a call, back to back; the"
echo "call with .gpu-model-$n runs: OUT=\$OUT bash .gpu-cluster/run_cluster.sh"
