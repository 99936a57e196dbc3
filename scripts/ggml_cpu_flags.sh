#!/usr/bin/env bash
# Prints the ggml CMake options that build llama.cpp for this CPU, on one line: the reference
# builds (llama-cpp-python in .venv by scripts/setup.sh, llama.cpp's tools by
# bench/llamacpp/build_tools.sh) take them.
#
# Normally -DGGML_NATIVE=ON (-march=native, what pip builds by default). On a CPU with AMX the
# same instruction sets one by one, AMX left out: llama-cpp-python 0.3.36's AMX matmul
# (ggml_backend_amx_mul_mat) crashes with SIGSEGV on the default model on a Sapphire Rapids
# guest (2 vCPUs, kernel 6.18), in llama-bench, llama-server and the Python binding alike, and
# the reference must run. Its AVX-512 VNNI kernels stay in.
set -euo pipefail
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() { [[ "$flags" == *" $1 "* ]]; }
if ! has amx_tile; then
  echo "-DGGML_NATIVE=ON"
  exit 0
fi
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }
avx512=OFF
if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then avx512=ON; fi
echo "-DGGML_NATIVE=OFF -DGGML_SSE42=$(onoff sse4_2) -DGGML_AVX=$(onoff avx)" \
  "-DGGML_AVX2=$(onoff avx2) -DGGML_FMA=$(onoff fma) -DGGML_F16C=$(onoff f16c)" \
  "-DGGML_BMI2=$(onoff bmi2) -DGGML_AVX_VNNI=$(onoff avx_vnni) -DGGML_AVX512=$avx512" \
  "-DGGML_AVX512_VBMI=$(onoff avx512vbmi) -DGGML_AVX512_VNNI=$(onoff avx512_vnni)" \
  "-DGGML_AVX512_BF16=$(onoff avx512_bf16) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF" \
  "-DGGML_AMX_BF16=OFF"
