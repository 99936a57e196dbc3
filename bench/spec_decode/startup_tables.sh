#!/usr/bin/env bash
# Starts pd-serve with the self-head drafter N times (default 4) and prints the two cost tables
# it measures at start-up (target step by rows; one row plus head-only rows), which set
# speculative decoding's K (docs/speculative.md, "Adaptive K"). With OTHER_BIN, alternates with
# that pd-serve (another build) to compare how much the tables move between starts.
#
#   bench/spec_decode/startup_tables.sh [N] [OTHER_BIN]
#   THREADS=2 MODEL=models/gemma-3-270m-q4_k_m.gguf (defaults)
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-4}"
other="${2:-}"
threads="${THREADS:-2}"
model="${MODEL:-models/gemma-3-270m-q4_k_m.gguf}"
[[ -x build/bin/pd-serve ]] || { echo "build/bin/pd-serve not found: make build" >&2; exit 2; }
[[ -f "$model" ]] || { echo "$model not found" >&2; exit 2; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for i in $(seq 1 "$n"); do
  for bin in build/bin/pd-serve ${other:+"$other"}; do
    "$bin" --http-port 0 --no-grpc --threads "$threads" --spec self-head --spec-k 8 \
      --max-running-seqs 32 --kv-mib 512 -m "$model" > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
      grep -q "output head over more" "$log" && grep -q "target step cost" "$log" && break
      kill -0 "$pid" 2>/dev/null || { echo "$bin exited:"; tail -5 "$log"; exit 1; }
      sleep 1
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
    echo "$bin #$i: $(grep -o 'target step cost by rows {[^}]*}' "$log" | sed 's/ ms//g')" \
         "| $(grep -o 'output head over more {[^}]*}' "$log" | sed 's/ ms//g')"
  done
done
