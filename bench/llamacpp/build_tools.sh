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
# Environment: PDSERVE_CACHE (default ~/.cache/pdserve), JOBS (default 2), LLAMA_ISA (native or
# avx2, default native).
# The build is CPU-native (the options of scripts/ggml_cpu_flags.sh, as for the llama-cpp-python
# that scripts/setup.sh builds: GGML_NATIVE, or on an AMX CPU the same sets without AMX, whose
# matmul crashes in this llama.cpp), without CURL, OpenSSL or the web UI. It takes about 10
# minutes on 2 cores; later calls return at once. Tools built with other options than today's
# (bin/.cmake_args records them) are built again.
# LLAMA_ISA=avx2 builds the same tools for AVX2 CPUs only (the flags of build_avx2_lib.sh: every
# AVX-512 and AVX-VNNI extension off) into bin-avx2/: what llama.cpp runs on a machine without
# AVX-512, the reference for pdserve's AVX2 kernels (PDSERVE_CPU_ISA=avx2) on an AVX-512 machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="$(sed -n 's/^llama_cpp_python==\([0-9.]*\).*/\1/p' "$ROOT/requirements-dev.txt")"
[[ -n "$VERSION" ]] || { echo "build_tools: no llama_cpp_python==X in requirements-dev.txt" >&2; exit 2; }
CACHE="${PDSERVE_CACHE:-$HOME/.cache/pdserve}/llamacpp-$VERSION"
ISA="${LLAMA_ISA:-native}"
case "$ISA" in
  native) BIN="$CACHE/bin"; BUILD="$CACHE/build"
          read -r -a ISA_FLAGS < <("$ROOT/scripts/ggml_cpu_flags.sh") ;;
  avx2) BIN="$CACHE/bin-avx2"; BUILD="$CACHE/build-avx2"
        ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                   -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF
                   -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF) ;;
  *) echo "build_tools: LLAMA_ISA must be native or avx2, not $ISA" >&2; exit 2 ;;
esac
ALL=(llama-server llama-bench llama-batched-bench llama-imatrix llama-quantize)
if (($#)); then
  for t in "$@"; do
    [[ " ${ALL[*]} " == *" $t "* ]] || { echo "build_tools: unknown tool $t (${ALL[*]})" >&2; exit 2; }
  done
  TOOLS=("$@")
else
  TOOLS=("${ALL[@]}")
fi
missing() { for t in "${TOOLS[@]}"; do [[ -x "$BIN/$t" ]] || echo "$t"; done; }
same_options() { [[ "$(cat "$BIN/.cmake_args" 2>/dev/null)" == "${ISA_FLAGS[*]}" ]]; }
if same_options && [[ -z "$(missing)" ]]; then
  echo "$BIN"
  exit 0
fi
mkdir -p "$CACHE"
# One build at a time per version: a second caller waits, then finds its tools built.
exec 9>"$CACHE/.build.lock"
flock 9
# Tools built with other options (say before scripts/ggml_cpu_flags.sh left AMX out) go.
if [[ -d "$BIN" ]] && ! same_options; then
  echo "build_tools: $BIN was built with other options, rebuilding with ${ISA_FLAGS[*]}" >&2
  rm -rf "$BIN" "$BUILD"
fi
mapfile -t MISSING < <(missing)
if ((${#MISSING[@]} == 0)); then
  echo "$BIN"
  exit 0
fi
SRC="$("$ROOT/scripts/llama_cpp_src.sh" | tail -1)"
echo "build_tools: ${MISSING[*]} of llama-cpp-python $VERSION's llama.cpp ($ISA) -> $BIN" \
  "(about 10 min on 2 cores for the first tool, a minute or two for each later one)" >&2
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
if [[ ! -f "$BUILD/build.ninja" ]]; then
  rm -rf "$BUILD"
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${ISA_FLAGS[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_APP=OFF \
    -DBUILD_SHARED_LIBS=OFF "${LAUNCHER[@]}" >"$BUILD.configure.log" 2>&1 \
    || { tail -30 "$BUILD.configure.log" >&2; rm -rf "$BUILD"; exit 1; }
fi
cmake --build "$BUILD" -j "${JOBS:-2}" --target "${MISSING[@]}" >"$BUILD.log" 2>&1 \
  || { tail -30 "$BUILD.log" >&2; exit 1; }
if [[ "$ISA" == avx2 ]]; then
  CPU_LIB="$BUILD/ggml/src/libggml-cpu.a"
  [[ -f "$CPU_LIB" ]] || { echo "build_tools: $CPU_LIB missing, cannot check it" >&2; exit 1; }
  if objdump -d "$CPU_LIB" | grep -q -m1 -E 'zmm|%k[1-7]'; then
    echo "build_tools: AVX-512 instructions in the AVX2 build's libggml-cpu.a" >&2; exit 1
  fi
fi
mkdir -p "$BIN"
for t in "${MISSING[@]}"; do cp "$BUILD/bin/$t" "$BIN/$t.tmp" && mv "$BIN/$t.tmp" "$BIN/$t"; done
echo "${ISA_FLAGS[*]}" > "$BIN/.cmake_args"
echo "$VERSION" > "$CACHE/VERSION"
echo "$BIN"
