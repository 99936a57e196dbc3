#!/usr/bin/env bash
# GPU checks for the CUDA backend, in one go, for a machine with an NVIDIA GPU (H100/H200), nvcc,
# CMake and ninja, and no internet.
#
#   bench/gpu/run_gpu_checks.sh            # from anywhere inside the checkout
#
# What it does:
#   1. Prints the machine: GPU (nvidia-smi, read only), nvcc, cmake, ninja.
#   2. Checks that Abseil and GoogleTest can be found by CMake (Debian's libabsl-dev and
#      libgtest-dev/libgmock-dev, or any prefix listed in PD_DEPS_PREFIX). If not, it says which
#      one is missing and stops: nothing here can be built without them.
#   3. Configures the whole project with -DPDSERVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90. If that
#      fails (a dependency only other modules need, e.g. PCRE2, or another module mid-edit), it
#      configures a minimal project instead: common/, engine/quant/, engine/backend/ and
#      tests/engine/backend/ through their own CMakeLists.txt, nothing else.
#   4. Builds only cuda_backend_test (and what it links), runs it: the
#      CPU-parity tests plus the timing of MatMul f16 4096x4096 x n={1,16,512} and RmsNorm.
#
# Environment:
#   OUT              when set, the whole log is also written to $OUT/gpu_checks.log
#   PD_DEPS_PREFIX   extra install prefixes for Abseil/GoogleTest, ':'-separated (CMAKE_PREFIX_PATH)
#   PD_GPU_BUILD_DIR build directory (default: <repo>/build-gpu)
#   PD_CUDA_ARCH     CMAKE_CUDA_ARCHITECTURES (default 90)
#   PD_JOBS          parallel build jobs (default: nproc)
#   PD_GPU_MINIMAL=1 skip the full project and configure the minimal one directly
#
# Exit status: 0 all passed; 1 a test failed; 2 missing tools or dependencies, or configure/build
# failed; 3 built, but no usable GPU was found (the parity tests skipped themselves).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${PD_GPU_BUILD_DIR:-$ROOT/build-gpu}"
ARCH="${PD_CUDA_ARCH:-90}"
JOBS="${PD_JOBS:-$(nproc 2>/dev/null || echo 4)}"

LOG=""
if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  LOG="$OUT/gpu_checks.log"
  : >"$LOG"
  # Everything below goes to the terminal and to the log.
  exec > >(tee -a "$LOG") 2>&1
fi

section() { printf '\n==== %s ====\n' "$*"; }
die() {
  local code="$1"
  shift
  printf '\nGPU CHECKS FAILED: %s\n' "$*"
  exit "$code"
}
T0=$SECONDS
elapsed() { echo "$((SECONDS - T0))s"; }

# ---- 1. machine -----------------------------------------------------------------------------------
section "machine"
echo "repo:  $ROOT"
echo "build: $BUILD"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv \
    || echo "nvidia-smi failed"
else
  echo "nvidia-smi: not found"
fi
NVCC="${CUDACXX:-}"
if [[ -z "$NVCC" ]]; then
  if command -v nvcc >/dev/null 2>&1; then NVCC="$(command -v nvcc)"
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc
  fi
fi
[[ -n "$NVCC" ]] || die 2 "nvcc not found (put it on PATH or set CUDACXX)"
"$NVCC" --version | tail -2
command -v cmake >/dev/null 2>&1 || die 2 "cmake not found"
cmake --version | head -1
GENERATOR=()
if command -v ninja >/dev/null 2>&1; then
  GENERATOR=(-G Ninja)
  echo "ninja $(ninja --version)"
else
  echo "ninja: not found, using Unix Makefiles"
fi

CMAKE_ARGS=("${GENERATOR[@]}" -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH"
            -DCUDAToolkit_ROOT="$(dirname "$(dirname "$NVCC")")"
            -DPDSERVE_CUDA=ON -DPDSERVE_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo)
if [[ -n "${PD_DEPS_PREFIX:-}" ]]; then
  CMAKE_ARGS+=("-DCMAKE_PREFIX_PATH=${PD_DEPS_PREFIX//:/;}")
fi

# ---- 2. dependencies --------------------------------------------------------------------------------
section "dependencies"
PROBE="$BUILD/probe"
rm -rf "$PROBE" && mkdir -p "$PROBE/src"
cat >"$PROBE/src/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(pd_probe LANGUAGES CXX)
find_package(absl CONFIG QUIET)
find_package(GTest QUIET)
find_package(CUDAToolkit QUIET)
set(report "")
foreach(what absl GTest CUDAToolkit)
  if(${what}_FOUND)
    string(APPEND report " ${what}=1")
  else()
    string(APPEND report " ${what}=0")
  endif()
endforeach()
if(TARGET CUDA::cublas)
  string(APPEND report " cublas=1")
else()
  string(APPEND report " cublas=0")
endif()
message(STATUS "PD_PROBE${report} (CUDA libraries: ${CUDAToolkit_LIBRARY_DIR})")
EOF
PROBE_OUT="$(cmake -S "$PROBE/src" -B "$PROBE/build" "${CMAKE_ARGS[@]}" 2>&1)"
echo "$PROBE_OUT" | grep PD_PROBE || { echo "$PROBE_OUT"; die 2 "CMake could not run a probe project"; }
MISSING=()
grep -q "absl=1" <<<"$PROBE_OUT" || MISSING+=("Abseil (Debian: libabsl-dev)")
grep -q "GTest=1" <<<"$PROBE_OUT" || MISSING+=("GoogleTest+GoogleMock (Debian: libgtest-dev libgmock-dev)")
grep -q "CUDAToolkit=1" <<<"$PROBE_OUT" || MISSING+=("the CUDA toolkit (CMake's FindCUDAToolkit found none)")
grep -q "cublas=1" <<<"$PROBE_OUT" || MISSING+=("cuBLAS (libcublas in the CUDA toolkit)")
if ((${#MISSING[@]})); then
  for m in "${MISSING[@]}"; do echo "MISSING: $m"; done
  die 2 "this machine lacks what is listed as MISSING above. It has no internet, so install nothing here: stage an \
install prefix (headers, libraries and CMake config files) on a machine that has them, carry it \
into the checkout and point PD_DEPS_PREFIX at it."
fi
echo "Abseil, GoogleTest, the CUDA toolkit and cuBLAS found"

# ---- 3. configure -------------------------------------------------------------------------------------
MODE=full
if [[ "${PD_GPU_MINIMAL:-0}" == 1 ]]; then
  MODE=minimal
else
  section "configure (full project) [$(elapsed)]"
  if ! cmake -S "$ROOT" -B "$BUILD/full" "${CMAKE_ARGS[@]}" >"$BUILD/configure-full.log" 2>&1; then
    echo "full configure failed; its errors:"
    grep -A6 "CMake Error" "$BUILD/configure-full.log" | head -40
    MODE=minimal
  fi
fi
if [[ "$MODE" == minimal ]]; then
  section "configure (minimal: common, quant, backend, backend tests) [$(elapsed)]"
  MIN_SRC="$BUILD/minimal-src"
  mkdir -p "$MIN_SRC"
  # Mirrors the root CMakeLists.txt settings the backend needs, and reuses each folder's own
  # CMakeLists.txt so no source list is duplicated here.
  cat >"$MIN_SRC/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(pdserve_gpu_checks LANGUAGES C CXX CUDA)
set(PD_ROOT "$ROOT")
set(PD_HAVE_CUDA ON)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O2 -g")
find_package(absl REQUIRED)
find_package(Threads REQUIRED)
find_package(CUDAToolkit REQUIRED)
find_package(GTest REQUIRED)
include(GoogleTest)
include(\${PD_ROOT}/cmake/pd.cmake)
include_directories(\${PD_ROOT})
enable_testing()
add_subdirectory(\${PD_ROOT}/common common)
add_subdirectory(\${PD_ROOT}/engine/quant engine/quant)
add_subdirectory(\${PD_ROOT}/engine/backend engine/backend)
add_library(pd_test_main STATIC \${PD_ROOT}/tests/test_main.cc)
target_link_libraries(pd_test_main PUBLIC GTest::gtest GTest::gmock pd_common)
add_subdirectory(\${PD_ROOT}/tests/engine/backend tests/engine/backend)
EOF
  cmake -S "$MIN_SRC" -B "$BUILD/minimal" "${CMAKE_ARGS[@]}" >"$BUILD/configure-minimal.log" 2>&1 \
    || { grep -A8 "CMake Error" "$BUILD/configure-minimal.log" | head -60
         die 2 "minimal configure failed (log: $BUILD/configure-minimal.log)"; }
fi
BIN_DIR="$BUILD/$MODE"
echo "configured ($MODE) in $BIN_DIR"
grep -E "CMAKE_CUDA_ARCHITECTURES:" "$BIN_DIR/CMakeCache.txt" || true

# ---- 4. build and run -----------------------------------------------------------------------------------
section "build cuda_backend_test [$(elapsed)]"
cmake --build "$BIN_DIR" --target cuda_backend_test -j "$JOBS" >"$BUILD/build.log" 2>&1 \
  || { grep -E -B2 -A12 "error|Error" "$BUILD/build.log" | head -80
       die 2 "build failed (log: $BUILD/build.log)"; }
TEST_BIN="$BIN_DIR/tests/cuda_backend_test"
[[ -x "$TEST_BIN" ]] || die 2 "built, but $TEST_BIN is missing"
echo "built in $(elapsed)"

section "cuda_backend_test (parity with the CPU backend, then timings) [$(elapsed)]"
TEST_LOG="$BUILD/cuda_backend_test.log"
(cd "$ROOT" && "$TEST_BIN" --gtest_color=no) 2>&1 | tee "$TEST_LOG"
RC=${PIPESTATUS[0]}

section "summary [$(elapsed)]"
grep -E "^\[timing\]" "$TEST_LOG" || true
if grep -q "needs a CUDA GPU:" "$TEST_LOG"; then
  grep -m1 "needs a CUDA GPU:" "$TEST_LOG"
  die 3 "no usable GPU: the parity tests skipped themselves"
fi
((RC == 0)) || die 1 "cuda_backend_test failed (exit $RC)"
echo "GPU CHECKS PASSED"
[[ -n "$LOG" ]] && echo "log: $LOG"
exit 0
