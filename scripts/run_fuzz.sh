#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and fuzzes each for SECONDS (default 60).
#
#   scripts/run_fuzz.sh [SECONDS] [TARGET...]
#
# Targets (tests/fuzz/fuzz_targets.h): gguf safetensors tokenizer chat_template openai_request
# node_protocol kv_frame; all of them when none is named. They run one after the other, each a
# single process on one core. Each runs over a temporary COPY of tests/fuzz/corpus/<target>, so
# the committed seed corpus never grows; new interesting inputs are thrown away with the copy
# (unless FUZZ_MERGE_INTO_CORPUS=1, below). A crash, leak, timeout or sanitizer report stops that
# target: the reproducer is kept under $FUZZ_BUILD_DIR/fuzz_artifacts/ and the script exits
# non-zero after the remaining targets ran. Reproduce with the command printed on the target's
# FAIL line; once fixed, copy the reproducer into tests/fuzz/corpus/<target>/ so that
# fuzz_corpus_test (ctest) replays it from then on.
#
# Prints one "FUZZ SUMMARY:" line per target and a last one for the whole run.
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS (build parallelism, default 2),
# FUZZ_LOG_DIR (keep each target's libFuzzer log there as <target>.log; scripts/fuzz_nightly.sh
# reads them), FUZZ_MERGE_INTO_CORPUS=1 (after a clean run, merge the inputs that add coverage,
# minimized by libFuzzer's -merge, into tests/fuzz/corpus/<target>/: only on purpose, to commit).
set -euo pipefail

all_targets=(gguf safetensors tokenizer chat_template openai_request node_protocol kv_frame)
seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -eq 0 ]]; then
  echo "usage: $0 [SECONDS] [TARGET...]   (a positive number of seconds per target, default 60;" \
       "targets: ${all_targets[*]})" >&2
  exit 2
fi
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then targets=("${all_targets[@]}"); fi
for t in "${targets[@]}"; do
  if [[ ! " ${all_targets[*]} " == *" $t "* ]]; then
    echo "$0: unknown target '$t' (known: ${all_targets[*]})" >&2
    exit 2
  fi
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${FUZZ_BUILD_DIR:-build-fuzz}"
jobs="${FUZZ_JOBS:-2}"

binaries=()
for t in "${targets[@]}"; do binaries+=("${t}_fuzzer"); done
echo "== configuring and building $build/fuzz/{$(IFS=,; echo "${binaries[*]}")}"
if ! CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DPDSERVE_FUZZ=ON -DPDSERVE_CUDA=OFF \
       -DPDSERVE_TESTS=OFF -DPDSERVE_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null ||
   ! cmake --build "$build" --target "${binaries[@]}" -j "$jobs"; then
  echo "FUZZ SUMMARY: FAIL could not configure/build the fuzzers in $build (see above)"
  exit 1
fi

# What each target reads at most (bytes) and may take per input (seconds). The node and KV
# targets run real threads (engines, transports) and wait for them, hence the longer timeout.
max_len() {
  case "$1" in
    gguf) echo 16384 ;;
    openai_request | kv_frame) echo 8192 ;;
    *) echo 4096 ;;
  esac
}
timeout_s() {
  case "$1" in
    node_protocol | kv_frame) echo 30 ;;
    *) echo 10 ;;
  esac
}

work="$(mktemp -d "${TMPDIR:-/tmp}/pd_fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$build/fuzz_artifacts"
if [[ -n "${FUZZ_LOG_DIR:-}" ]]; then mkdir -p "$FUZZ_LOG_DIR"; fi

failed=()
total_execs=0
for t in "${targets[@]}"; do
  bin="$build/fuzz/${t}_fuzzer"
  corpus="$work/$t"
  mkdir -p "$corpus"
  cp tests/fuzz/corpus/"$t"/* "$corpus/"
  seeds="$(ls "$corpus" | wc -l)"
  dict=()
  if [[ -f "tests/fuzz/$t.dict" ]]; then dict=(-dict="tests/fuzz/$t.dict"); fi
  echo "== $t: fuzzing for ${seconds}s over a copy of tests/fuzz/corpus/$t ($seeds inputs)"
  log="$work/$t.log"
  set +e
  ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}" \
    "$bin" "$corpus" "${dict[@]}" \
    -max_total_time="$seconds" \
    -max_len="$(max_len "$t")" \
    -timeout="$(timeout_s "$t")" \
    -rss_limit_mb=2048 \
    -print_final_stats=1 \
    -artifact_prefix="$build/fuzz_artifacts/$t-" >"$log" 2>&1
  rc=$?
  set -e
  tail -n 25 "$log"
  if [[ -n "${FUZZ_LOG_DIR:-}" ]]; then cp "$log" "$FUZZ_LOG_DIR/$t.log"; fi

  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  new_units="$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)"
  reports='^==[0-9]+==ERROR|runtime error:|deadly signal|PD_CHECK failed|ERROR: libFuzzer: (timeout|out-of-memory)'
  crashes="$(grep -cE "$reports" "$log" || true)"
  artifact="$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)"
  total_execs=$((total_execs + ${execs:-0}))
  if [[ "$rc" -eq 0 ]]; then
    fate="discarded with the corpus copy"
    if [[ "${FUZZ_MERGE_INTO_CORPUS:-0}" == 1 ]]; then fate="merged into the corpus below"; fi
    echo "FUZZ SUMMARY: PASS ${t}_fuzzer ran ${seconds}s, ${execs:-?} executions, 0 crashes," \
         "${new_units:-0} new inputs ($fate)"
    if [[ "${FUZZ_MERGE_INTO_CORPUS:-0}" == 1 ]]; then
      before="$(ls tests/fuzz/corpus/"$t" | wc -l)"
      "$bin" -merge=1 -max_len="$(max_len "$t")" -timeout="$(timeout_s "$t")" \
        tests/fuzz/corpus/"$t" "$corpus" >"$work/$t.merge.log" 2>&1 ||
        { echo "merge into tests/fuzz/corpus/$t failed:"; tail -n 20 "$work/$t.merge.log"; }
      after="$(ls tests/fuzz/corpus/"$t" | wc -l)"
      echo "merged $((after - before)) new inputs into tests/fuzz/corpus/$t ($after files)"
    fi
  else
    echo "FUZZ SUMMARY: FAIL ${t}_fuzzer exited with $rc after ${execs:-?} executions" \
         "(${crashes} sanitizer/crash reports); reproducer: ${artifact:-none written};" \
         "reproduce: $bin ${artifact:-<input>}"
    failed+=("$t")
  fi
done

if [[ ${#failed[@]} -eq 0 ]]; then
  echo "FUZZ SUMMARY: PASS all ${#targets[@]} targets (${targets[*]}), ${seconds}s each," \
       "$total_execs executions, 0 crashes"
  exit 0
fi
echo "FUZZ SUMMARY: FAIL ${#failed[@]} of ${#targets[@]} targets found a problem: ${failed[*]}"
exit 1
