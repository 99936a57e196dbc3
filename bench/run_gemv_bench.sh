#!/usr/bin/env bash
# Builds and runs bench/gemv_bench (decode GEMV per weight format vs measured DRAM bandwidth) and
# prints one table; writes it with the machine description to bench/results/gemv_<date>.md.
#
#   bench/run_gemv_bench.sh                  # build dir ./build, configured if needed
#   BUILD_DIR=build-kk MIN_TIME=0.5 bench/run_gemv_bench.sh
#   NOTES=path/to/notes.md bench/run_gemv_bench.sh   # appended to the results file
#   RESULTS=/tmp/gemv.md bench/run_gemv_bench.sh     # write the results elsewhere
#
# About 2 minutes on 2 cores. Other load on the machine skews the figures: the load average at
# the start and the end goes into the results file.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-build}"
MIN_TIME="${MIN_TIME:-0.4}"
cd "$ROOT"

if [[ ! -f "$BUILD_DIR/build.ninja" && ! -f "$BUILD_DIR/Makefile" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DPDSERVE_CUDA=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" --target gemv_bench -j"$(nproc)" >/dev/null

mkdir -p bench/results
JSON="$(mktemp /tmp/gemv_bench.XXXXXX.json)"
trap 'rm -f "$JSON"' EXIT
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD_DIR/bin/gemv_bench" --benchmark_min_time="$MIN_TIME" --benchmark_format=json \
  --benchmark_out="$JSON" --benchmark_out_format=json >/dev/null
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

OUT="${RESULTS:-bench/results/gemv_$(date +%Y-%m-%d).md}"
python3 - "$JSON" "$OUT" "$LOAD_BEFORE" "$LOAD_AFTER" "${NOTES:-}" <<'PY'
import json, subprocess, sys

json_path, out_path, load_before, load_after, notes = sys.argv[1:6]
runs = json.load(open(json_path))["benchmarks"]
gbps = {r["name"].split("/real_time")[0]: r["GBps"] for r in runs}
bpw = {}
for r in runs:
    if r["name"].startswith("gemv/"):
        bpw[r["name"].split("/")[1]] = r["bytes_per_weight"]

bw1, bw2 = gbps["dram_read/1"], gbps["dram_read/2"]
formats = ["f32", "f16", "bf16", "q8_0", "q4_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"]

def table(case, title):
    lines = [f"### {title}", "",
             "| format | bytes/weight | 1-thread GB/s | 2-thread GB/s | % of DRAM bandwidth (2 threads) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for f in formats:
        g1, g2 = gbps[f"gemv/{f}/{case}/1"], gbps[f"gemv/{f}/{case}/2"]
        lines.append(f"| {f} | {bpw[f]:.4f} | {g1:.1f} | {g2:.1f} | {100 * g2 / bw2:.0f}% |")
    return lines

def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception:
        return ""

lscpu = sh("lscpu")
keep = ("Model name", "CPU family", "Model:", "BogoMIPS", "CPU(s):", "Thread(s) per core",
        "Core(s) per socket", "Socket(s)", "L1d cache", "L2 cache", "L3 cache", "CPU max MHz",
        "Hypervisor vendor")
machine = [l for l in lscpu.splitlines() if l.startswith(keep)]
mem = sh("free -g | sed -n 2p | awk '{print $2\" GiB total, \"$7\" GiB available\"}'")
flags = sh("grep -o -w -E 'avx2|fma|f16c|avx512f|avx512_vnni|avx_vnni' /proc/cpuinfo | sort -u | tr '\\n' ' '")

header = [
    f"measured DRAM read bandwidth: {bw1:.1f} GB/s on 1 thread, {bw2:.1f} GB/s on 2 threads "
    "(2 GiB buffer, AVX2 loads)",
    "target: >= 80% of DRAM bandwidth on 2 threads",
    f"load average (1/5/15 min): {load_before} before, {load_after} after",
]
body = (table("dram", "DRAM-bound: distinct 8192 x 8192 matrices in turn, >= 1 GiB in all") + [""] +
        table("l3", "L3-resident: one 8192 x 8192 matrix, called repeatedly "
                    "(f32 256 MiB, f16/bf16 128 MiB do not fit a 260 MiB L3)"))
print("\n".join(header + [""] + body))

with open(out_path, "w") as f:
    f.write("# GEMV (decode) throughput of the CPU backend vs DRAM bandwidth\n\n")
    f.write("`bench/run_gemv_bench.sh` (bench/gemv_bench.cc): Backend::MatMul of one F32 activation "
            "row\nagainst 8192 x 8192 weights; GB/s counts weight bytes.\n\n")
    f.write("## Machine\n\n```\n" + "\n".join(machine) + f"\nMemory: {mem}\nFlags: {flags}\n```\n\n")
    f.write("## Results\n\n" + "\n".join(header) + "\n\n" + "\n".join(body) + "\n")
    if notes:
        f.write("\n" + open(notes).read())
print(f"\nwritten to {out_path}")
PY
