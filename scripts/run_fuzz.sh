#!/usr/bin/env bash
# Builds the GGUF fuzzer (clang, libFuzzer + ASan + UBSan) and fuzzes for SECONDS (default 60).
#
#   scripts/run_fuzz.sh [SECONDS]
#
# Runs over a temporary COPY of tests/fuzz/corpus/gguf, so the committed seed corpus never grows;
# new interesting inputs are thrown away with the copy. A crash, leak, timeout or sanitizer report
# stops the run: the reproducer is kept under $FUZZ_BUILD_DIR/fuzz_artifacts/ and the script exits
# non-zero. Reproduce with:  $FUZZ_BUILD_DIR/fuzz/gguf_fuzzer <artifact>
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS (build parallelism, default 2).
set -euo pipefail

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -eq 0 ]]; then
  echo "usage: $0 [SECONDS]   (a positive number of seconds, default 60)" >&2
  exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${FUZZ_BUILD_DIR:-build-fuzz}"
jobs="${FUZZ_JOBS:-2}"

echo "== configuring and building $build/fuzz/gguf_fuzzer"
if ! CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DPDSERVE_FUZZ=ON -DPDSERVE_CUDA=OFF \
       -DPDSERVE_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null ||
   ! cmake --build "$build" --target gguf_fuzzer -j "$jobs"; then
  echo "FUZZ SUMMARY: FAIL could not configure/build $build/fuzz/gguf_fuzzer (see above)"
  exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/gguf_fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$build/fuzz_artifacts"
cp tests/fuzz/corpus/gguf/* "$work/corpus/"
seeds="$(ls "$work/corpus" | wc -l)"

echo "== fuzzing for ${seconds}s over a copy of tests/fuzz/corpus/gguf ($seeds seeds)"
log="$work/fuzz.log"
set +e
ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}" \
UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}" \
  "$build/fuzz/gguf_fuzzer" "$work/corpus" \
  -dict=tests/fuzz/gguf.dict \
  -max_total_time="$seconds" \
  -max_len=16384 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$build/fuzz_artifacts/" 2>&1 | tee "$log"
rc="${PIPESTATUS[0]}"
set -e

execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
new_units="$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)"
reports='^==[0-9]+==ERROR|runtime error:|deadly signal|ERROR: libFuzzer: (timeout|out-of-memory)'
crashes="$(grep -cE "$reports" "$log" || true)"
artifact="$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)"
if [[ "$rc" -eq 0 ]]; then
  echo "FUZZ SUMMARY: PASS gguf_fuzzer ran ${seconds}s, ${execs:-?} executions, 0 crashes," \
       "${new_units:-0} new inputs (discarded with the corpus copy)"
  exit 0
fi
echo "FUZZ SUMMARY: FAIL gguf_fuzzer exited with $rc after ${execs:-?} executions" \
     "(${crashes} sanitizer/crash reports); reproducer: ${artifact:-none written}"
exit 1
