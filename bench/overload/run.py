#!/usr/bin/env python3
"""Overload at 3x capacity (issue 21): pd-serve and the cluster (pdctl up) under Poisson arrivals
at three times the rate they sustain, with admission control on (frontend/admission.h).

For each target this script
  1. starts it with `admission: {max_waiting, ttft_slo_ms}` on free ports,
  2. measures its capacity: completed requests/s of a closed loop at --capacity-concurrency
     streams (the highest rate it sustains: more arrivals only queue),
  3. runs pd-bench open loop at --factor x that rate for --duration seconds, saving every
     request's record, while sampling the server processes' RSS, threads and file descriptors
     every second,
  4. reports: how many requests were refused (HTTP 429) and how fast (client-side, send to the
     end of the 429 response: the refusal happens before tokenization), the TTFT of the admitted
     ones against the SLO, other errors, and the memory over the run.

  bench/overload/run.py                           # both targets, about 6 minutes
  bench/overload/run.py --targets serve --duration 30

The result goes to stdout and, as markdown, to --out (default
bench/results/overload_<UTC date>.md).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import benchlib  # noqa: E402


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))
    return s[k]


class Sampler(threading.Thread):
    def __init__(self, root_pid: int):
        super().__init__(daemon=True)
        self.root, self.rows, self.stop = root_pid, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.rows.append(benchlib.sample_tree(self.root))
            self.stop.wait(1.0)


def pd_bench(args, port: int, extra: list[str], out: Path) -> dict:
    cmd = [str(ROOT / "build/bin/pd-bench"), "--api", "http", "--target", f"127.0.0.1:{port}",
           "--prompt-tokens", str(args.prompt_tokens), "--output-tokens", str(args.output_tokens),
           "--temperature", "0", "--timeout", "300", "--no-progress", "--json", str(out)] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def start(target: str, args, work: Path) -> benchlib.ServerProcess:
    config = work / f"{target}.yaml"
    config.write_text(
        f"admission: {{max_waiting: {args.max_waiting}, ttft_slo_ms: {args.slo_ms}}}\n"
        "scheduler: {max_running_seqs: 16}\n")
    port = benchlib.free_port()
    if target == "serve":
        cmd = [str(ROOT / "build/bin/pd-serve"), "--config", str(config), "--http-port", str(port),
               "--grpc-port", "0"]
    else:
        cmd = [str(ROOT / "build/bin/pdctl"), "up", "--prefill", "1", "--decode", "1", "--config",
               str(config), "--http-port", str(port), "--grpc-port", "0"]
    server = benchlib.ServerProcess(target, cmd, port, work / f"{target}.log")
    server.ready(300)
    return server


def run_target(target: str, args, work: Path) -> dict:
    server = start(target, args, work)
    try:
        pd_bench(args, server.port, ["--concurrency", "2", "-n", "4"], work / f"{target}_warm.json")
        cap = pd_bench(args, server.port,
                       ["--concurrency", str(args.capacity_concurrency), "-n",
                        str(3 * args.capacity_concurrency)], work / f"{target}_capacity.json")
        capacity = cap["overall"]["request_throughput"]
        unloaded = pd_bench(args, server.port, ["--concurrency", "1", "-n", "4"],
                            work / f"{target}_unloaded.json")
        rate = args.factor * capacity
        sampler = Sampler(server.proc.pid)
        sampler.start()
        t0 = time.time()
        over = pd_bench(args, server.port,
                        ["--rate", f"{rate:.3f}", "--duration", str(args.duration), "-n", "100000",
                         "--seed", "7", "--save-requests"], work / f"{target}_overload.json")
        wall = time.time() - t0
        time.sleep(2)
        sampler.stop.set()
        sampler.join()
    finally:
        server.stop()
    recs = over.get("requests", [])
    refused = [r for r in recs if r.get("error") == "http_429"]
    admitted = [r for r in recs if r.get("ok")]
    other = {}
    for r in recs:
        if not r.get("ok") and r.get("error") != "http_429":
            other[r.get("error")] = other.get(r.get("error"), 0) + 1
    refuse_ms = [1000 * r["e2e_s"] for r in refused]
    ttft_ms = [1000 * r["ttft_s"] for r in admitted if r.get("ttft_s", -1) >= 0]
    # When the slow ones were sent: the first seconds (before admission has measured anything)
    # or throughout.
    slow = sorted(((r["ttft_s"], r["send_s"]) for r in admitted if r.get("ttft_s", -1) >= 0),
                  reverse=True)[:5]
    print(f"overload: {target}: slowest admitted (TTFT s, sent at s): "
          + ", ".join(f"({t:.2f}, {s:.1f})" for t, s in slow), file=sys.stderr)
    rows = sampler.rows
    third = max(1, len(rows) // 3)
    return {
        "target": target, "capacity_rps": capacity, "rate_rps": rate, "wall_s": wall,
        "unloaded_ttft_p50_ms": benchlib.dig(unloaded, "overall", "ttft_ms", "p50"),
        "sent": len(recs), "admitted": len(admitted), "refused": len(refused), "other": other,
        "refuse_p50_ms": pct(refuse_ms, 50), "refuse_p99_ms": pct(refuse_ms, 99),
        "refuse_max_ms": max(refuse_ms) if refuse_ms else float("nan"),
        "ttft_p50_ms": pct(ttft_ms, 50), "ttft_p99_ms": pct(ttft_ms, 99),
        "rss_first_third_mib": statistics.mean(r[0] for r in rows[:third]) if rows else 0,
        "rss_last_third_mib": statistics.mean(r[0] for r in rows[-third:]) if rows else 0,
        "rss_max_mib": max((r[0] for r in rows), default=0),
        "threads_max": max((r[1] for r in rows), default=0),
        "fds_first": rows[0][2] if rows else 0, "fds_last": rows[-1][2] if rows else 0,
    }


def table(results: list[dict], args) -> str:
    head = ("| target | capacity req/s | offered req/s | sent | admitted | refused 429 | "
            "other errors | 429 latency p50 / p99 / max ms (target <= 20) | admitted TTFT p50 / "
            f"p99 ms (SLO {args.slo_ms}) | unloaded TTFT p50 ms | RSS MiB first third / last third "
            "/ max | threads max | fds first / last |")
    lines = [head, "|" + " --- |" * 14]
    for r in results:
        lines.append(
            f"| {r['target']} | {r['capacity_rps']:.2f} | {r['rate_rps']:.2f} | {r['sent']} | "
            f"{r['admitted']} | {r['refused']} | {r['other'] or 0} | {r['refuse_p50_ms']:.1f} / "
            f"{r['refuse_p99_ms']:.1f} / {r['refuse_max_ms']:.1f} | {r['ttft_p50_ms']:.0f} / "
            f"{r['ttft_p99_ms']:.0f} | {r['unloaded_ttft_p50_ms'] or float('nan'):.0f} | "
            f"{r['rss_first_third_mib']:.0f} / {r['rss_last_third_mib']:.0f} / "
            f"{r['rss_max_mib']:.0f} | {r['threads_max']} | {r['fds_first']} / {r['fds_last']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="serve,cluster")
    ap.add_argument("--duration", type=int, default=60, help="seconds of overload per target")
    ap.add_argument("--factor", type=float, default=3.0, help="offered rate / capacity")
    ap.add_argument("--slo-ms", type=int, default=3000, help="admission.ttft_slo_ms")
    ap.add_argument("--max-waiting", type=int, default=64, help="admission.max_waiting")
    ap.add_argument("--capacity-concurrency", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = benchlib.result_file("overload", args.out)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for t in args.targets.split(","):
            print(f"overload: {t} ...", file=sys.stderr, flush=True)
            results.append(run_target(t, args, Path(tmp)))
    cmd = "bench/overload/run.py " + " ".join(sys.argv[1:])
    text = (f"# Overload at {args.factor:g}x capacity\n\n"
            f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n"
            f"- Machine: {benchlib.machine()}\n"
            f"- Command: `{cmd}`\n"
            f"- Workload: pd-bench over HTTP, prompts {args.prompt_tokens} tokens, outputs "
            f"{args.output_tokens}, Poisson arrivals at {args.factor:g}x the closed-loop "
            f"throughput at {args.capacity_concurrency} streams, {args.duration} s; "
            f"`admission: {{max_waiting: {args.max_waiting}, ttft_slo_ms: {args.slo_ms}}}`; "
            "the default model\n\n" + table(results, args) + "\n")
    print(text)
    out.write_text(text)
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
