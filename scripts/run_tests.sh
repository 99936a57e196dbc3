#!/usr/bin/env bash
# Runs the whole suite after `make build`: ctest (C++ unit tests), pytest (end-to-end against
# llama.cpp references), and a bounded libFuzzer run of every fuzz target (GGUF reader, tokenizers,
# chat templates, OpenAI request parser, node messages, KV transfer frames), FUZZ_SECONDS each.
# Every part runs even if an earlier one fails; the exit status is non-zero if any failed. Prints a
# closing summary.
#
#   scripts/run_tests.sh [BUILD_DIR] [FUZZ_SECONDS]   (defaults: build, 20 s per fuzz target)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
FUZZ_SECONDS=${2:-20}  # per target: 6 targets, about 2 minutes plus the build
JOBS=${JOBS:-2}
rc=0

echo "== ctest =="
(cd "$BUILD" && ctest --output-on-failure -j"$JOBS") || rc=1

echo "== AVX2-only llama.cpp reference (cached in ~/.cache/pdserve; ~4 min on 2 cores once) =="
# The reference of the AVX2 halves of test_matmul_sweep.py and test_gemma_reference.py; they skip
# (saying so) if it cannot be built here.
if AVX2_LIB=$(bench/llamacpp/build_avx2_lib.sh | tail -1); then
  export PDSERVE_LLAMACPP_AVX2_LIB="$AVX2_LIB"
else
  echo "build_avx2_lib.sh failed: the AVX2 reference tests will skip"
fi

echo "== pytest =="
PDCTL="$PWD/$BUILD/bin/pdctl" .venv/bin/python -m pytest -q --durations=15 tests/python || rc=1

echo "== fuzz (${FUZZ_SECONDS}s per target) =="
scripts/run_fuzz.sh "$FUZZ_SECONDS" || rc=1

if [ $rc -eq 0 ]; then echo "ALL TEST SUITES PASSED"; else echo "SOME TEST SUITES FAILED"; fi
exit $rc
