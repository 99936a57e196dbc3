#!/usr/bin/env bash
# On the GPU machine, after stage_cluster.sh's parts have arrived (see there): assembles the
# default model, checks its SHA-256, unpacks the daemons, and runs the README's first command on
# the GPU: `pdctl up` (pd-router + pd-prefill + pd-decode on loopback) continuing a prompt through
# the router's OpenAI /v1/completions, greedy, with its time to first token and tokens/s. Then
# the same with half the layers on the CPU (--gpu-layers), and on the CPU alone, so the log shows
# the three continuations side by side (greedy: they should agree for the first tokens, and where
# they part, the CUDA parity tests say why).
#
#   OUT=dir bash .gpu-cluster/run_cluster.sh       # writes $OUT/cluster.log too
#
# Exit status: 0 all three runs answered; 1 a run failed; 2 no cuBLAS 13; 4 model parts missing
# (the machine went cold between calls: send them again); 5 the model's checksum is wrong.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT"; exec > >(tee -a "$OUT/cluster.log") 2>&1; fi
echo "==== machine ($(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
# The parts: copied to /tmp/pd-parts by the calls before this one, or carried in this one.
n="$(cat "$HERE/parts")"
mkdir -p /tmp/pd-parts
find "$ROOT" -maxdepth 2 -path "$ROOT/.gpu-model-*/part.*" -exec cp {} /tmp/pd-parts/ \;
missing=""
for i in $(seq 0 $((n - 1))); do
  [[ -f "/tmp/pd-parts/part.$(printf %02d "$i")" ]] || missing="$missing $((i + 1))"
done
[[ -z "$missing" ]] || { echo "model parts missing:$missing (send them again, back to back)"; exit 4; }

W=/tmp/pd-cluster
rm -rf "$W" && mkdir -p "$W"
tar -C "$W" -xJf "$HERE/stage.tar.xz"
model_name="$(awk '{print $2}' "$HERE/model.sha256")"
# Parts are named part.00, part.01, ...: join them in that order.
cat /tmp/pd-parts/part.* > "$W/$model_name"
(cd "$W" && sha256sum -c "$HERE/model.sha256") || { echo "model checksum mismatch"; exit 5; }

source "$HERE/cuda_libs.sh"
export LD_LIBRARY_PATH="$W/pd/lib$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$W/pd/ucx"
PROMPT="${PROMPT:-Once upon a time, in a small village by the sea, there lived}"
layers="$("$W/pd/bin/pdctl" plan -m "$W/$model_name" --ctx 4096 --gpu-mem 1000000000 2>/dev/null \
  | sed -n 's/^model: .*, \([0-9]*\) layers, .*/\1/p')"
half=$(( ${layers:-18} / 2 ))

RC=0
run() {  # name, then pdctl up's backend flags
  local name="$1"; shift
  echo "==== pdctl up --prefill 1 --decode 1 $* ($name)"
  timeout 300 "$W/pd/bin/pdctl" up --prefill 1 --decode 1 -m "$W/$model_name" \
    --complete "$PROMPT" -n 48 --log-dir "$W/logs-$name" "$@"
  local rc=$?
  if ((rc != 0)); then
    RC=1
    echo "---- $name failed (exit $rc); the daemons' logs:"
    tail -n 30 "$W/logs-$name"/* 2>/dev/null
  fi
}
run gpu --backend cuda
run split --backend cuda --gpu-layers "$half"
run cpu --backend cpu
((RC == 0)) && echo "CLUSTER CHECKS PASSED" || echo "CLUSTER CHECKS FAILED"
exit "$RC"
