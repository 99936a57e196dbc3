#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-server, llama-bench, llama-batched-bench, llama-imatrix,
# llama-quantize) from the source that the llama-cpp-python sdist of requirements-dev.txt ships,
# into a cache folder outside the tree, once per version. They are the reference the benchmarks
# compare against, never a part of pdserve.
#
#   bench/llamacpp/build_tools.sh                               # every tool
#   bench/llamacpp/build_tools.sh llama-imatrix llama-quantize  # only these
#
# Prints the bin folder on its last line. Only the tools missing from the bin folder are built;
# the build folder is kept beside it ($CACHE/build), so that a tool added later (to this list or
# on the command line) compiles only itself, not llama.cpp again.
#
# Environment: PDSERVE_CACHE (default ~/.cache/pdserve), JOBS (default 2).
# The build is CPU-native (GGML_NATIVE, like the llama-cpp-python that pip builds here), without
# CURL, OpenSSL or the web UI. It takes about 10 minutes on 2 cores; later calls return at once.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="$(sed -n 's/^llama_cpp_python==\([0-9.]*\).*/\1/p' "$ROOT/requirements-dev.txt")"
[[ -n "$VERSION" ]] || { echo "build_tools: no llama_cpp_python==X in requirements-dev.txt" >&2; exit 2; }
CACHE="${PDSERVE_CACHE:-$HOME/.cache/pdserve}/llamacpp-$VERSION"
ALL=(llama-server llama-bench llama-batched-bench llama-imatrix llama-quantize)
if (($#)); then
  for t in "$@"; do
    [[ " ${ALL[*]} " == *" $t "* ]] || { echo "build_tools: unknown tool $t (${ALL[*]})" >&2; exit 2; }
  done
  TOOLS=("$@")
else
  TOOLS=("${ALL[@]}")
fi
missing() { for t in "${TOOLS[@]}"; do [[ -x "$CACHE/bin/$t" ]] || echo "$t"; done; }
if [[ -z "$(missing)" ]]; then
  echo "$CACHE/bin"
  exit 0
fi
mkdir -p "$CACHE"
# One build at a time per version: a second caller waits, then finds its tools built.
exec 9>"$CACHE/.build.lock"
flock 9
mapfile -t MISSING < <(missing)
if ((${#MISSING[@]} == 0)); then
  echo "$CACHE/bin"
  exit 0
fi
SRC="$("$ROOT/scripts/llama_cpp_src.sh" | tail -1)"
BUILD="$CACHE/build"
echo "build_tools: ${MISSING[*]} of llama-cpp-python $VERSION's llama.cpp -> $CACHE/bin" \
  "(about 10 min on 2 cores for the first tool, a minute or two for each later one)" >&2
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
if [[ ! -f "$BUILD/build.ninja" ]]; then
  rm -rf "$BUILD"
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_APP=OFF \
    -DBUILD_SHARED_LIBS=OFF "${LAUNCHER[@]}" >"$CACHE/configure.log" 2>&1 \
    || { tail -30 "$CACHE/configure.log" >&2; rm -rf "$BUILD"; exit 1; }
fi
cmake --build "$BUILD" -j "${JOBS:-2}" --target "${MISSING[@]}" >"$CACHE/build.log" 2>&1 \
  || { tail -30 "$CACHE/build.log" >&2; exit 1; }
mkdir -p "$CACHE/bin"
for t in "${MISSING[@]}"; do cp "$BUILD/bin/$t" "$CACHE/bin/$t.tmp" && mv "$CACHE/bin/$t.tmp" "$CACHE/bin/$t"; done
echo "$VERSION" > "$CACHE/VERSION"
echo "$CACHE/bin"
