#!/usr/bin/env python3
"""pd-serve against llama.cpp's llama-server under concurrent streaming load (issue 19, "Serving").

Both servers get the same model file, threads and slots; the same `pd-bench` run (OpenAI HTTP API,
`/v1/completions`, streaming, ignore_eos) goes to each in turn: C closed-loop streams of random
256-token prompts and 128 output tokens, for every C in --concurrency (16 and 64 by default).
The table gives output tok/s, TTFT p50 / p99 and ITL p50 / p99 per system, the ratio against
llama-server measured in the same run, and the issue's targets:

  output tok/s >= 2x llama-server; TTFT p50 and p99 lower; ITL p99 <= 1.5x the median ITL.

  .venv/bin/python bench/serving/vs_llama_server.py                      # 16 and 64 streams
  .venv/bin/python bench/serving/vs_llama_server.py --concurrency 16 \\
      --systems pd-serve,pd-serve-nobudget,llama-server                   # A/B the step budget
  .venv/bin/python bench/serving/vs_llama_server.py --systems pd-serve \
      --speculative drafter=off                                           # without speculation
  .venv/bin/python bench/serving/vs_llama_server.py --systems pd-serve \
      --bin-dir /tmp/oldbin                       # another build's pd-serve and pd-bench

Systems: `pd-serve` (configs/serve.yaml defaults, slots and KV sized for the run),
`pd-serve-nobudget` (the same with scheduler.step_time_stretch 0: whole 512-token prompt chunks
beside the decode tokens), `llama-server` (built by bench/llamacpp/build_tools.sh from the
llama-cpp-python sdist's source; -np C, continuous batching, flash attention per --llama-fa).
Raw pd-bench JSON goes to --out-dir; --out writes the markdown report with the machine, the
command and the date.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import benchlib  # noqa: E402


def log(*a) -> None:
    print("[vs_llama_server]", *a, file=sys.stderr, flush=True)


def start(system: str, a: argparse.Namespace, conc: int, workdir: Path) -> benchlib.ServerProcess:
    port = benchlib.free_port()
    tokens_per_slot = a.prompt_tokens + a.output_tokens + 64  # BOS, template slack
    if system in ("pd-serve", "pd-serve-nobudget"):
        # KV for every slot at once (f16: 2 bytes x layers x kv heads x head dim x 2 per token;
        # 64 MiB per 4k tokens is ample for the small models this runs), so that neither server
        # preempts; slots = the streams.
        kv_mib = max(256, (conc * tokens_per_slot * a.kv_bytes_per_token) >> 20)
        cfg = workdir / f"{system}_c{conc}.yaml"
        lines = [f"model: {{context: {a.ctx}}}",
                 "scheduler:",
                 f"  max_running_seqs: {max(32, conc)}",
                 f"  token_budget: {max(512, conc)}"]
        if system == "pd-serve-nobudget":
            lines.append("  step_time_stretch: 0")
        else:
            lines += [f"  {kv.split('=', 1)[0]}: {kv.split('=', 1)[1]}" for kv in a.scheduler]
            if a.speculative:
                lines.append("speculative:")
                lines += [f"  {kv.split('=', 1)[0]}: {kv.split('=', 1)[1]}"
                          for kv in a.speculative]
        lines.append(f"kv: {{memory_mib: {kv_mib}}}")
        cfg.write_text("\n".join(lines) + "\n")
        args = [str(a.bin_dir / "pd-serve"), "--config", str(cfg), "-m", str(a.model),
                "--threads", str(a.threads), "--http-port", str(port), "--grpc-port", "0"]
    elif system == "llama-server":
        args = [str(a.llama_bin / "llama-server"), "-m", str(a.model), "-t", str(a.threads),
                "-tb", str(a.threads), "-np", str(conc), "-c", str(conc * tokens_per_slot),
                "-fa", a.llama_fa, "--port", str(port), "--host", "127.0.0.1"]
    else:
        raise SystemExit(f"unknown system '{system}' (pd-serve, pd-serve-nobudget, llama-server)")
    log(f"{system} c={conc}: " + shlex.join(args))
    logfile = workdir / f"{system}_c{conc}.log"
    server = benchlib.ServerProcess(system, args, port, logfile, cwd=ROOT)
    try:
        server.ready(a.start_timeout)
    except RuntimeError as e:
        server.stop()
        raise SystemExit(f"{system}: {e}; log {logfile}:\n{logfile.read_text()[-2000:]}")
    return server


def bench(server: benchlib.ServerProcess, a: argparse.Namespace, conc: int, out: Path) -> dict:
    n = max(a.min_requests, a.rounds * conc)
    cmd = [str(a.bin_dir / "pd-bench"), "--api", "http", "--target", f"127.0.0.1:{server.port}",
           "--concurrency", str(conc), "--prompt-tokens", str(a.prompt_tokens),
           "--output-tokens", str(a.output_tokens), "-n", str(n), "--warmup", str(conc),
           "--seed", str(a.seed), "--temperature", "0", "--no-progress", "--save-requests",
           "--json", str(out)]
    log(f"{server.name} c={conc}: {n} requests")
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    res = json.loads(out.read_text())
    res["_wall_s"] = time.time() - t0
    return res


g = benchlib.dig


def fmt(x, nd=0) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def report(results: dict, a: argparse.Namespace, systems: list[str], argv: str) -> str:
    isa = os.environ.get("PDSERVE_CPU_ISA", "auto (the CPU's best)")
    lines = [
        f"# pd-serve vs llama-server under load, {datetime.date.today().isoformat()}",
        "",
        f"- machine: {benchlib.machine()}",
        f"- pdserve kernel set: {isa}; {a.threads} threads per server",
        f"- model: {a.model.name}; prompts {a.prompt_tokens} random-word tokens (+BOS), "
        f"{a.output_tokens} output tokens (ignore_eos), closed loop, OpenAI HTTP streaming",
        f"- llama-server: {a.llama_bin}, -np = streams, -fa {a.llama_fa}",
        f"- pd-serve scheduler options: {', '.join(a.scheduler) or 'the defaults'}",
        f"- pd-serve speculative options: {', '.join(a.speculative) or 'the defaults'}",
        f"- command: `{argv}`",
        "",
        "| streams | system | requests | failed | output tok/s | x llama-server | TTFT p50 ms "
        "| TTFT p99 ms | ITL p50 ms | ITL p99 ms | ITL p99 / p50 | wall s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    checks = []
    for conc, per in results.items():
        ref = per.get("llama-server")
        ref_tps = g(ref, "overall", "output_throughput")
        for s in systems:
            r = per.get(s)
            if r is None:
                continue
            o = r["overall"]
            tps = o["output_throughput"]
            itl50, itl99 = g(o, "itl_ms", "p50"), g(o, "itl_ms", "p99")
            ratio = tps / ref_tps if ref_tps and s != "llama-server" else None
            lines.append(
                f"| {conc} | {s} | {o['completed']} | {o.get('failed', 0)} "
                f"| {fmt(tps, 1)} | {fmt(ratio, 2)} "
                f"| {fmt(g(o, 'ttft_ms', 'p50'))} | {fmt(g(o, 'ttft_ms', 'p99'))} "
                f"| {fmt(itl50, 1)} | {fmt(itl99, 1)} "
                f"| {fmt(itl99 / itl50 if itl50 and itl99 else None, 2)} | {r['_wall_s']:.0f} |")
            if s == "llama-server" or ref is None:
                continue
            ro = ref["overall"]
            checks.append(
                f"- {conc} streams, {s}: output tok/s {fmt(ratio, 2)}x llama-server (target >= 2x: "
                f"{'met' if ratio and ratio >= 2 else 'missed'}); TTFT p50 "
                f"{fmt(g(o, 'ttft_ms', 'p50'))} vs {fmt(g(ro, 'ttft_ms', 'p50'))} ms, p99 "
                f"{fmt(g(o, 'ttft_ms', 'p99'))} vs {fmt(g(ro, 'ttft_ms', 'p99'))} ms (target lower: "
                f"{'met' if g(o, 'ttft_ms', 'p50') < g(ro, 'ttft_ms', 'p50') and g(o, 'ttft_ms', 'p99') < g(ro, 'ttft_ms', 'p99') else 'missed'}); "
                f"ITL p99 / p50 {fmt(itl99 / itl50 if itl50 else None, 2)} (target <= 1.5: "
                f"{'met' if itl50 and itl99 / itl50 <= 1.5 else 'missed'})")
    return "\n".join(lines + ["", "Targets (issue 19):", ""] + checks) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default="pd-serve,llama-server")
    ap.add_argument("--concurrency", default="16,64", help="comma-separated stream counts")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--bin-dir", type=Path, default=ROOT / "build" / "bin")
    ap.add_argument("--llama-bin", type=Path,
                    help="folder with llama-server (default: bench/llamacpp/build_tools.sh's)")
    ap.add_argument("--llama-fa", default="on", choices=["on", "off", "auto"],
                    help="llama-server flash attention (default on: its faster setting here)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048, help="pd-serve model.context")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="measured requests per stream")
    ap.add_argument("--min-requests", type=int, default=48)
    ap.add_argument("--kv-bytes-per-token", type=int, default=32 * 1024,
                    help="KV bytes per token for sizing pd-serve's cache (default fits models "
                    "up to ~32 KiB/token at f16)")
    ap.add_argument("--scheduler", action="append", default=[], metavar="KEY=VALUE",
                    help="a scheduler option for pd-serve (not -nobudget), e.g. "
                    "step_time_stretch=1.2; repeatable")
    ap.add_argument("--speculative", action="append", default=[], metavar="KEY=VALUE",
                    help="a speculative option for pd-serve (not -nobudget), e.g. drafter=off; "
                    "repeatable")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start-timeout", type=float, default=180)
    ap.add_argument("--out-dir", type=Path, help="raw pd-bench JSON (default: a temp folder)")
    ap.add_argument("--out", type=Path, help="also write the markdown report here")
    a = ap.parse_args()
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    concs = [int(c) for c in a.concurrency.split(",") if c.strip()]
    if not a.model.is_file():
        raise SystemExit(f"model not found: {a.model} (run `make setup`)")
    for tool in ("pd-serve", "pd-bench"):
        if not (a.bin_dir / tool).is_file():
            raise SystemExit(f"{a.bin_dir / tool} not found: build first (make build)")
    if "llama-server" in systems and a.llama_bin is None:
        log("locating llama-server (bench/llamacpp/build_tools.sh; the first build takes ~10 min)")
        out = subprocess.run([str(ROOT / "bench/llamacpp/build_tools.sh")], check=True,
                             capture_output=True, text=True).stdout
        a.llama_bin = Path(out.strip().splitlines()[-1])
    workdir = Path(tempfile.mkdtemp(prefix="vs_llama_server."))
    out_dir = a.out_dir or workdir
    out_dir.mkdir(parents=True, exist_ok=True)
    log(f"logs in {workdir}, JSON in {out_dir}")
    results: dict[int, dict[str, dict]] = {}
    for conc in concs:
        results[conc] = {}
        for s in systems:
            server = start(s, a, conc, workdir)
            try:
                results[conc][s] = bench(server, a, conc, out_dir / f"{s}_c{conc}.json")
            finally:
                server.stop()
            o = results[conc][s]["overall"]
            log(f"{s} c={conc}: {o['output_throughput']:.1f} tok/s, TTFT p50 "
                f"{fmt(g(o, 'ttft_ms', 'p50'))} ms, ITL p50/p99 {fmt(g(o, 'itl_ms', 'p50'), 1)}/"
                f"{fmt(g(o, 'itl_ms', 'p99'), 1)} ms")
    text = report(results, a, systems, shlex.join([sys.executable] + sys.argv))
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
