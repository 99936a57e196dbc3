#!/usr/bin/env bash
# Builds llama.cpp's shared libraries (libllama, libggml, libggml-base, libggml-cpu) from the source
# that the llama-cpp-python sdist of requirements-dev.txt ships, for AVX2 CPUs only: GGML_NATIVE
# off, AVX/AVX2/FMA/F16C/BMI2 on, every AVX-512 and AVX-VNNI extension off. That is the build pip
# makes (-march=native) on a CPU without AVX-512, so on an AVX-512 machine it gives the orders
# such CPUs run. It is the reference of pdserve's AVX2 kernel set (PDSERVE_CPU_ISA=avx2), for
# tests/python/test_matmul_sweep.py and the AVX2 half of tests/python/test_gemma_reference.py;
# never a part of pdserve.
#
#   bench/llamacpp/build_avx2_lib.sh     # prints the lib folder on its last line
#
# llama-cpp-python runs on it with LLAMA_CPP_LIB_PATH=<that folder> (the libraries find each
# other through RUNPATH $ORIGIN). Environment: PDSERVE_CACHE (default ~/.cache/pdserve), JOBS
# (default 2). About 4 minutes on 2 cores; later calls return at once.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="$(sed -n 's/^llama_cpp_python==\([0-9.]*\).*/\1/p' "$ROOT/requirements-dev.txt")"
[[ -n "$VERSION" ]] || { echo "build_avx2_lib: no llama_cpp_python==X in requirements-dev.txt" >&2; exit 2; }
OUT="${PDSERVE_CACHE:-$HOME/.cache/pdserve}/llamacpp-$VERSION/avx2-lib"
LIBS=(libllama.so libggml.so libggml-base.so libggml-cpu.so)
have_all() { for l in "${LIBS[@]}"; do [[ -f "$OUT/$l" ]] || return 1; done; }
if have_all; then
  echo "$OUT"
  exit 0
fi
PIP="$ROOT/.venv/bin/pip"
[[ -x "$PIP" ]] || { echo "build_avx2_lib: $PIP missing (run scripts/setup.sh)" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "build_avx2_lib: AVX2-only llama.cpp of llama-cpp-python $VERSION -> $OUT" >&2
"$PIP" download --no-binary :all: --no-deps -q -d "$WORK" "llama_cpp_python==$VERSION" >&2
tar xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
[[ -f "$SRC/CMakeLists.txt" ]] || { echo "build_avx2_lib: no vendor/llama.cpp in the sdist" >&2; exit 2; }
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF \
  -DGGML_AVX512_BF16=OFF -DGGML_OPENMP=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF >"$WORK/configure.log" 2>&1 \
  || { tail -30 "$WORK/configure.log" >&2; exit 1; }
cmake --build "$WORK/build" -j "${JOBS:-2}" --target llama >"$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log" >&2; exit 1; }
mkdir -p "$OUT"
# The versioned files with their SONAME links; BUILD_WITH_INSTALL_RPATH gave them RUNPATH $ORIGIN.
for l in "${LIBS[@]}"; do cp -P "$WORK"/build/bin/"$l"* "$OUT/"; done
# No AVX-512 instruction (zmm or opmask registers) may have slipped in.
if objdump -d "$OUT/libggml-cpu.so" | grep -q -m1 -E 'zmm|%k[1-7]'; then
  echo "build_avx2_lib: AVX-512 instructions in libggml-cpu.so" >&2; rm -rf "$OUT"; exit 1
fi
echo "$VERSION" > "$OUT/VERSION"
echo "$OUT"
