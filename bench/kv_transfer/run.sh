#!/usr/bin/env bash
# KV transfer throughput next to ucx_perftest, in one run (bench/kv_transfer/README.md).
#
#   bench/kv_transfer/run.sh [BUILD_DIR]        (default build dir: build)
#   MODE=shm|tcp  REPS=20  WARMUP=5  ROUNDS=3  TOKENS=1024,4096,16384  MODEL=models/gemma-3-270m-q4_k_m.gguf
#   STAGED=1: copy every layer into a staging buffer (default: f16 goes zero-copy, as pd-prefill
#   sends it)
#   IMPORT=land|engine: every layer goes into the receiver's own KV cache, written by the
#   transport's delivery thread (land: pd-decode on a CPU cache) or imported on an engine-like
#   thread (engine: a device cache); the table adds the importer's busy time and first Push -> last
#   layer in the cache
#
# MODE=shm (default): UCX's default transports with peer-failure detection off, so UCX may use
#   shared memory + CMA between the two processes; ucx_perftest runs with its defaults.
# MODE=tcp: peer-failure detection on (the transport's default) and UCX_TLS=tcp on both sides and
#   for ucx_perftest.
# For each prompt length and wire dtype the benchmark's layer message size is given to
# `ucx_perftest -t tag_bw -s SIZE` (a server/client pair on 127.0.0.1), since the transport sends
# one UCP tag message per layer. A second ucx_perftest column moves one message as large as the
# whole transfer: like the KV cache, its buffers do not stay in the CPU caches between iterations
# (at the layer size they do, which a transfer of distinct layers cannot reuse).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
BIN=$BUILD/bin/kv_transfer_bench
MODE=${MODE:-shm}
REPS=${REPS:-20}
WARMUP=${WARMUP:-5}
TOKENS=${TOKENS:-1024,4096,16384}
MODEL=${MODEL:-models/gemma-3-270m-q4_k_m.gguf}
command -v ucx_perftest >/dev/null || { echo "ucx_perftest missing: apt-get install ucx-utils" >&2; exit 1; }
[ -x "$BIN" ] || { echo "$BIN missing: ninja -C $BUILD kv_transfer_bench" >&2; exit 1; }

flags=(--reps "$REPS" --warmup "$WARMUP")
if [ -f "$MODEL" ]; then flags+=(--model "$MODEL"); fi
if [ "${STAGED:-0}" = 1 ]; then flags+=(--staged); fi
if [ -n "${IMPORT:-}" ]; then flags+=(--import "$IMPORT"); fi
perf_env=()
case "$MODE" in
  shm) flags+=(--no-peer-failure) ;;
  tcp) flags+=(--tls tcp); perf_env=(UCX_TLS=tcp) ;;
  *) echo "MODE must be shm or tcp" >&2; exit 1 ;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ROUNDS=${ROUNDS:-3}

perftest() {  # $1 = message size; prints overall MB/s (2^20 bytes) of tag_bw
  local size=$1 iters port
  iters=$(( 1000000000 / size )); [ "$iters" -lt 20 ] && iters=20
  port=$(( 20000 + RANDOM % 20000 ))
  env "${perf_env[@]}" ucx_perftest -t tag_bw -s "$size" -n "$iters" -p "$port" >"$tmp/srv.txt" 2>&1 &
  local srv=$!
  sleep 0.5
  env "${perf_env[@]}" ucx_perftest 127.0.0.1 -t tag_bw -s "$size" -n "$iters" -p "$port" \
    >"$tmp/cli.txt" 2>&1 || true
  wait "$srv" || true
  awk '/^Final:/ {print $7}' "$tmp/cli.txt"
}

# The machine is shared: each configuration alternates the transport and ucx_perftest ROUNDS
# times, so that both see the same load; the table gives the medians.
echo "# uptime before: $(uptime)"
for t in ${TOKENS//,/ }; do
  for w in f16 int8; do
    for r in $(seq "$ROUNDS"); do
      "$BIN" "${flags[@]}" --tokens "$t" --wire "$w" >"$tmp/one.txt"
      [ -f "$tmp/geometry" ] || { grep '^geometry' "$tmp/one.txt" | tee "$tmp/geometry"; }
      line=$(grep '^RESULT' "$tmp/one.txt")
      size=$(sed -E 's/.*layer_msg_bytes=([0-9]+).*/\1/' <<<"$line")
      total=$(sed -E 's/.* bytes=([0-9]+).*/\1/' <<<"$line")
      echo "$line perftest_mbps=$(perftest "$size") perftest_total_mbps=$(perftest "$total")" |
        tee -a "$tmp/joined.txt"
    done
  done
done
echo "# uptime after: $(uptime)"

python3 - "$tmp/joined.txt" "$MODE" "$ROUNDS" <<'PY'
import statistics, sys
groups = {}
for line in open(sys.argv[1]):
    kv = dict(f.split("=", 1) for f in line.split()[1:])
    groups.setdefault((int(kv["tokens"]), kv["wire"]), []).append(kv)
print(f"\nmode: {sys.argv[2]}, medians of {sys.argv[3]} alternating rounds")
print("| prompt tokens | wire | bytes | layer msg | time | GB/s | ucx_perftest GB/s (tag_bw, layer size) | ratio | ucx_perftest GB/s (one message of the transfer's size) | ratio | perftest's own: transfer size / layer size |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
extra = []
for (tokens, wire), rs in groups.items():
    gbps = statistics.median(float(r["gbps"]) for r in rs)
    ms = statistics.median(float(r["median_ms"]) for r in rs)
    pts = [float(r["perftest_mbps"]) * 1048576 / 1e9 for r in rs if r.get("perftest_mbps")]
    pt = statistics.median(pts) if pts else float("nan")
    tts = [float(r["perftest_total_mbps"]) * 1048576 / 1e9 for r in rs
           if r.get("perftest_total_mbps")]
    tt = statistics.median(tts) if tts else float("nan")
    r0 = rs[0]
    if "import_ms" in r0:
        imode = r0["import"]
        imp = statistics.median(float(r["import_ms"]) for r in rs)
        landed = statistics.median(float(r["landed_ms"]) for r in rs)
        extra.append(f"| {tokens} | {wire} | {ms:.1f} ms | {imp:.1f} ms | {landed:.1f} ms | "
                     f"{landed - ms:+.1f} ms |")
    print(f"| {tokens} | {wire} | {int(float(r0['bytes'])):,} | {int(r0['layer_msg_bytes']):,} | "
          f"{ms:.1f} ms | {gbps:.2f} | {pt:.2f} | {gbps / pt:.0%} | {tt:.2f} | {gbps / tt:.0%} | "
          f"{tt / pt:.0%} |")
if extra:
    print(f"\ninto the receiver's cache (IMPORT={imode}): land = written by the transport's "
          "delivery thread; engine = ImportLayer on one importer thread")
    print("| prompt tokens | wire | transfer (to ACK) | importer busy | first Push -> last layer in the cache | after the ACK |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    print("\n".join(extra))
PY
