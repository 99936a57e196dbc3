#!/usr/bin/env bash
# The nightly fuzz run: every libFuzzer target (scripts/run_fuzz.sh) for SECONDS each (default
# 600, the floor), one after the other on one core, then a markdown report of what ran.
#
#   scripts/fuzz_nightly.sh [--seconds N] [--merge] [--out FILE] [TARGET...]
#
#   --seconds N  per target (default 600; less than 600 is allowed for trying the script out,
#                and the report says so)
#   --merge      merge the inputs that found new coverage, minimized, into
#                tests/fuzz/corpus/<target>/ for committing (off by default: a nightly run
#                changes nothing in the checkout unless asked to)
#   --out FILE   the report (default bench/results/fuzz_nightly_<date>.md)
#
# The report lists per target: seconds, executions, executions per second, coverage, corpus size,
# new inputs, crashes and the result; with the machine, date, commit and command. The exit status
# is run_fuzz.sh's: non-zero when any target found a crash (its reproducer is in
# build-fuzz/fuzz_artifacts/, named in the report).
set -euo pipefail

seconds=600
merge=0
out=""
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --merge) merge=1; shift ;;
    --out) out="$2"; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -eq 0 ]]; then
  echo "$0: --seconds needs a positive number" >&2
  exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
date="$(date +%Y-%m-%d)"
out="${out:-bench/results/fuzz_nightly_$date.md}"
mkdir -p "$(dirname "$out")"
logs="$(mktemp -d "${TMPDIR:-/tmp}/pd_fuzz_nightly.XXXXXX")"
trap 'rm -rf "$logs"' EXIT

command="scripts/fuzz_nightly.sh --seconds $seconds"
if [[ $merge == 1 ]]; then command+=" --merge"; fi
if [[ ${#targets[@]} -gt 0 ]]; then command+=" ${targets[*]}"; fi
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
start_s=$(date +%s)
set +e
FUZZ_LOG_DIR="$logs" FUZZ_MERGE_INTO_CORPUS="$merge" \
  scripts/run_fuzz.sh "$seconds" "${targets[@]}" 2>&1 | tee "$logs/run_fuzz.out"
rc="${PIPESTATUS[0]}"
set -e
wall_s=$(( $(date +%s) - start_s ))

# One row per target from its libFuzzer log (final stats, and the last status line).
row() {
  local t="$1" log="$logs/$1.log"
  if [[ ! -f "$log" ]]; then
    echo "| $t | - | - | - | - | - | - | - | not run (build failed?) |"
    return
  fi
  local execs eps new cov corp crashes result
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  eps="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  new="$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)"
  cov="$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 | sed 's/cov: //; s/ ft: / \/ /')"
  corp="$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1 | sed 's/corp: //')"
  crashes="$(grep -cE '^==[0-9]+==ERROR|runtime error:|deadly signal|PD_CHECK failed|ERROR: libFuzzer: (timeout|out-of-memory)' "$log" || true)"
  if grep -q "FUZZ SUMMARY: PASS ${t}_fuzzer" "$logs/run_fuzz.out"; then
    result="PASS"
  else
    result="FAIL: $(sed -n "s/.*FUZZ SUMMARY: FAIL ${t}_fuzzer //p" "$logs/run_fuzz.out" | head -1)"
  fi
  echo "| $t | $seconds | ${execs:-?} | ${eps:-?} | ${cov:-?} | ${corp:-?} | ${new:-?} | $crashes | $result |"
}

all=(gguf safetensors tokenizer chat_template openai_request node_protocol kv_frame)
if [[ ${#targets[@]} -eq 0 ]]; then targets=("${all[@]}"); fi
cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
{
  echo "# Nightly fuzzing, $date"
  echo
  echo "libFuzzer with ASan + UBSan over every fuzz target (tests/fuzz/fuzz_targets.h), ${seconds} s"
  echo "each, one target at a time (one process, one core). Started $started, $wall_s s in all"
  echo "(build included). Overall: $([[ $rc -eq 0 ]] && echo "**PASS**, 0 crashes" || echo "**FAIL**")."
  if [[ "$seconds" -lt 600 ]]; then
    echo
    echo "Shorter than the nightly's 600 s per target: a trial of the script, not a nightly run."
  fi
  echo
  echo "| target | seconds | executions | exec/s | coverage (edges / features) | corpus (inputs/size) | new inputs | crashes | result |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
  for t in "${targets[@]}"; do row "$t"; done
  echo
  echo "New inputs are those that reached new coverage during the run; they were"
  if [[ $merge == 1 ]]; then
    echo "merged (minimized) into tests/fuzz/corpus/<target>/ (--merge)."
  else
    echo "discarded with the run's corpus copy (--merge keeps them)."
  fi
  echo
  echo "- Machine: $cpu, $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB RAM," \
       "$(uname -sr); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- Compiler: $(clang --version | head -1)"
  echo "- Commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "- Command: \`$command\`"
  echo "- Per-target reproduction of a crash: the FAIL line's command (run_fuzz.sh); the reproducer"
  echo "  then goes into tests/fuzz/corpus/<target>/, which fuzz_corpus_test replays in ctest."
} >"$out"
echo "report: $out"
exit "$rc"
