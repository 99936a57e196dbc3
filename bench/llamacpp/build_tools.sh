#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-server, llama-bench, llama-batched-bench) from the source
# that the llama-cpp-python sdist of requirements-dev.txt ships, into a cache folder outside the
# tree, once per version. They are the reference the benchmarks compare against, never a part of
# pdserve.
#
#   bench/llamacpp/build_tools.sh          # prints the bin folder on its last line
#
# Environment: PDSERVE_CACHE (default ~/.cache/pdserve), JOBS (default 2).
# The build is CPU-native (GGML_NATIVE, like the llama-cpp-python that pip builds here), without
# CURL, OpenSSL or the web UI. It takes about 10 minutes on 2 cores; later calls return at once.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="$(sed -n 's/^llama_cpp_python==\([0-9.]*\).*/\1/p' "$ROOT/requirements-dev.txt")"
[[ -n "$VERSION" ]] || { echo "build_tools: no llama_cpp_python==X in requirements-dev.txt" >&2; exit 2; }
CACHE="${PDSERVE_CACHE:-$HOME/.cache/pdserve}/llamacpp-$VERSION"
TOOLS=(llama-server llama-bench llama-batched-bench)
have_all() { for t in "${TOOLS[@]}"; do [[ -x "$CACHE/bin/$t" ]] || return 1; done; }
if have_all; then
  echo "$CACHE/bin"
  exit 0
fi
SRC="$("$ROOT/scripts/llama_cpp_src.sh" | tail -1)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "build_tools: llama.cpp of llama-cpp-python $VERSION -> $CACHE (about 10 min on 2 cores)" >&2
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_APP=OFF \
  -DBUILD_SHARED_LIBS=OFF >"$WORK/configure.log" 2>&1 \
  || { tail -30 "$WORK/configure.log" >&2; exit 1; }
cmake --build "$WORK/build" -j "${JOBS:-2}" --target "${TOOLS[@]}" >"$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log" >&2; exit 1; }
mkdir -p "$CACHE/bin"
for t in "${TOOLS[@]}"; do cp "$WORK/build/bin/$t" "$CACHE/bin/"; done
echo "$VERSION" > "$CACHE/VERSION"
echo "$CACHE/bin"
