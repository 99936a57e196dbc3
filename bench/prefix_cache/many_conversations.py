#!/usr/bin/env python3
"""Prefix-cache hit rate and TTFT on many concurrent chat conversations, per system.

Many conversations of several turns each share a few system prompts; each turn sends the whole
history. What a prefix cache can save is the system prompts (shared across conversations) and each
conversation's own history (shared across its turns). In a cluster, where a turn lands decides
whether its history is in that node's cache: `random` placement finds it on 1 of N decode nodes,
`kv_aware` (router.decode_policy, docs/cluster.md) sends each turn where its prefix is cached.

Systems (each alone on the machine, same model, same KV memory per engine):
  pd-serve-nocache   pd-serve --no-prefix-cache
  pd-serve           pd-serve (prefix cache on: the default)
  pd-serve-compress  pd-serve with prefix_cache.compress_idle_ms (--compress-idle-ms): cached blocks
                     idle that long are held in INT8, two per block of memory
  cluster-random     pdctl up --prefill P --decode D, router.decode_policy random
  cluster-kv_aware   the same with router.decode_policy kv_aware (the default)

With prefill nodes (--prefill, default 1) a turn whose uncached part is long is prefilled there,
on top of the prefill node's own cache, which holds every conversation it computed: that hides
part of what placement decides. --prefill 0 leaves every prefill to the chosen decode node, so the
hit rate is that of decode placement alone.

The load is pd-bench's multi-turn mode (bench/pd_bench/README.md); the hit rate is the sum of the
cached prompt tokens the server reports (usage.prompt_tokens_details.cached_tokens) over the sum
of prompt tokens. Prints a markdown table with the machine and the command.

  .venv/bin/python bench/prefix_cache/many_conversations.py \\
      --out bench/results/prefix_cache_many_conversations_<date>.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi_turn import ROOT, Server, free_port, machine, write_report  # noqa: E402

import subprocess  # noqa: E402


def cluster_config(a: argparse.Namespace, policy: str, path: Path) -> None:
    text = (ROOT / "configs" / "cluster-local.yaml").read_text()
    lines = []
    for line in text.splitlines():
        if line.strip().startswith("decode_policy:"):
            line = f"  decode_policy: {policy}"
        elif line.strip().startswith("memory_mib:"):
            line = f"  memory_mib: {a.kv_mib}"
        lines.append(line)
    if a.fill_generated:
        lines.append("prefix_cache: {fill_generated: true}")
    path.write_text("\n".join(lines) + "\n")


def start(system: str, a: argparse.Namespace, logdir: Path) -> Server:
    port = free_port()
    log = logdir / f"{system}.log"
    if system in ("pd-serve", "pd-serve-nocache", "pd-serve-compress"):
        args = [str(a.bin_dir / "pd-serve"), "-m", str(a.model), "--threads", str(a.threads),
                "--kv-mib", str(a.kv_mib), "--http-port", str(port), "--grpc-port", "0"]
        if system == "pd-serve-nocache":
            args.append("--no-prefix-cache")
        if system == "pd-serve-compress" or (a.fill_generated and system == "pd-serve"):
            config = logdir / f"{system}.yaml"
            keys = ([f"compress_idle_ms: {a.compress_idle_ms}"] if system == "pd-serve-compress"
                    else []) + (["fill_generated: true"] if a.fill_generated else [])
            config.write_text(f"prefix_cache: {{{', '.join(keys)}}}\n")
            args += ["--config", str(config)]
    elif system.startswith("cluster-"):
        config = logdir / f"{system}.yaml"
        cluster_config(a, system.split("-", 1)[1], config)
        args = [str(a.bin_dir / "pdctl"), "up", "--config", str(config),
                "--prefill", str(a.prefill), "--decode", str(a.decode), "-m", str(a.model),
                "--http-port", str(port), "--grpc-port", "0"]
    else:
        raise SystemExit(f"unknown system '{system}'")
    s = Server(system, args, port, log)
    try:
        s.ready(a.start_timeout)
    except RuntimeError as e:
        s.stop()
        raise SystemExit(f"{system}: {e}; log: {log}\n{log.read_text()[-2000:]}")
    return s


def run_bench(url: str, a: argparse.Namespace, out: Path) -> dict:
    target = url.removeprefix("http://")
    cmd = [str(a.bin_dir / "pd-bench"), "--api", "http", "--target", target, "--multi-turn",
           "--conversations", str(a.conversations), "--turns", str(a.turns),
           "--concurrency", str(a.concurrency), "--system-prompts", str(a.system_prompts),
           "--system-words", str(a.system_words), "--user-words", str(a.user_words),
           "--output-tokens", str(a.output_tokens), "--think-time-ms", str(a.think_ms),
           "--seed", str(a.seed), "--no-progress", "--json", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def fmt(x, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems",
                    default="pd-serve-nocache,pd-serve,cluster-random,cluster-kv_aware")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--bin-dir", type=Path, default=ROOT / "build" / "bin")
    ap.add_argument("--threads", type=int, default=2, help="pd-serve threads")
    ap.add_argument("--decode", type=int, default=3, help="cluster decode nodes")
    ap.add_argument("--prefill", type=int, default=1, help="cluster prefill nodes (0: none)")
    ap.add_argument("--kv-mib", type=int, default=64, help="KV memory per engine (MiB)")
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--system-prompts", type=int, default=3)
    ap.add_argument("--system-words", type=int, default=300)
    ap.add_argument("--user-words", type=int, default=40)
    ap.add_argument("--output-tokens", type=int, default=24)
    ap.add_argument("--think-ms", type=int, default=300)
    ap.add_argument("--fill-generated", action="store_true",
                    help="prefix_cache.fill_generated on every engine: an idle engine files each "
                         "finished answer's blocks (docs/kv_cache.md, \"Filing answers\")")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--compress-idle-ms", type=int, default=200,
                    help="pd-serve-compress: prefix_cache.compress_idle_ms")
    ap.add_argument("--start-timeout", type=float, default=180)
    ap.add_argument("--out", type=Path, help="also write the report here")
    a = ap.parse_args()
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    logdir = Path(tempfile.mkdtemp(prefix="many_conversations."))
    results = {}
    for system in systems:
        print(f"{system}: starting", file=sys.stderr)
        s = start(system, a, logdir)
        try:
            results[system] = run_bench(s.url, a, logdir / f"{system}.json")
        finally:
            s.stop()
        t = results[system]["turns"]
        print(f"{system}: hit rate {fmt(t['cache_hit_rate'])}", file=sys.stderr)

    lines = [f"# Prefix cache on many conversations ({datetime.date.today()})", "",
             f"{a.conversations} conversations of {a.turns} turns, {a.concurrency} at a time, "
             f"{a.system_prompts} shared system prompts of {a.system_words} words, user messages "
             f"of {a.user_words} words, {a.output_tokens} tokens per answer, {a.think_ms} ms think "
             f"time (pd-bench --multi-turn, HTTP). KV memory {a.kv_mib} MiB per engine; "
             f"pd-serve {a.threads} threads; cluster: {a.prefill} prefill + {a.decode} decode "
             "nodes, "
             f"1 thread each, model `{a.model.name}`.", "",
             f"Machine: {machine()}.", "",
             "Command: `" + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]) + "`", "",
             "| system | hit rate, all turns | hit rate, turns 2+ | TTFT p50 turn 1 ms | "
             "TTFT p50 turns 2+ ms | turns 2+ / turn 1 | failed |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in systems:
        t = results[s]["turns"]
        first = t["per_turn"][0]["ttft_ms"]["p50"] if t["per_turn"] else None
        later = t["turns_2plus"]["ttft_ms"]["p50"]
        failed = results[s]["overall"]["failed"]
        lines.append(f"| {s} | {fmt(t['cache_hit_rate'])} | {fmt(t['cache_hit_rate_turns_2plus'])}"
                     f" | {fmt(first, '.0f')} | {fmt(later, '.0f')} | "
                     f"{fmt(t['ttft_p50_ratio_turns_2plus_to_turn_1'], '.2f')} | {failed} |")
    rnd, kva = results.get("cluster-random"), results.get("cluster-kv_aware")
    if rnd and kva and rnd["turns"]["cache_hit_rate"]:
        ratio = kva["turns"]["cache_hit_rate"] / rnd["turns"]["cache_hit_rate"]
        lines += ["", f"KV-aware routing / random placement, cluster hit rate: {ratio:.2f}x "
                  "(issue 18's target: >= 2x)"]
    write_report(lines, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
