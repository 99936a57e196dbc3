#!/usr/bin/env python3
"""The KV transfer's tail against TTFT through a real cluster (issue 19: tail <= 5 % of TTFT for
2k-token prompts through `pdctl up`).

Starts `pdctl up --prefill 1 --decode 1` (threads per daemon: --threads, not pinned), sends N
different prompts of --words random common words (one token each in the Gemma vocabulary, so
~2k tokens) one after another through the OpenAI API (streaming, 4 output tokens), measures each
TTFT at the client, then reads the router's pdserve_router_ttft_phase_seconds: the `transfer`
phase is the tail (last layer pushed -> every layer acknowledged; the rest overlaps the prefill).

  .venv/bin/python bench/kv_transfer/tail_vs_ttft.py [--n 6] [--words 2000] [--threads 2]
"""
import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prefix_cache"))

import benchlib  # noqa: E402
from multi_turn import WORDS, ttft_phases  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=6, help="prompts")
    ap.add_argument("--words", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--bin-dir", type=Path, default=ROOT / "build" / "bin")
    a = ap.parse_args()
    from openai import OpenAI
    port = benchlib.free_port()
    workdir = Path(__import__("tempfile").mkdtemp(prefix="tail_vs_ttft."))
    cfg = workdir / "cluster.yaml"
    cfg.write_text("model: {context: 4096}\nrouter: {disaggregate_min_prompt: 512}\n")
    args = [str(a.bin_dir / "pdctl"), "up", "--prefill", "1", "--decode", "1", "-m", str(a.model),
            "--http-port", str(port), "--grpc-port", "0", "--threads", str(a.threads),
            "--config", str(cfg)]
    s = benchlib.ServerProcess("cluster", args, port, workdir / "cluster.log", cwd=ROOT)
    try:
        s.ready(180)
        client = OpenAI(base_url=s.url + "/v1", api_key="none", timeout=300)
        model = client.models.list().data[0].id
        ttfts, usage = [], []
        for i in range(a.n):
            rng = random.Random(100 + i)
            prompt = " ".join(rng.choice(WORDS) for _ in range(a.words))
            t0, first = time.perf_counter(), None
            for ch in client.completions.create(model=model, prompt=prompt, max_tokens=4,
                                                stream=True, temperature=0,
                                                stream_options={"include_usage": True}):
                if first is None:
                    first = time.perf_counter()
                if ch.usage is not None:
                    usage.append(ch.usage.prompt_tokens)
            ttfts.append(first - t0)
        phases = ttft_phases(s.url)
    finally:
        s.stop()
    mean_ttft = sum(ttfts) / len(ttfts)
    print(f"# KV transfer tail vs TTFT\n\n- machine: {benchlib.machine()}\n- `pdctl up --prefill 1 "
          f"--decode 1 --threads {a.threads}`, {a.n} prompts of {sum(usage) / max(1, len(usage)):.0f}"
          f" tokens (server count), 4 output tokens\n- client TTFT (s): "
          + ", ".join(f"{t:.3f}" for t in ttfts) + f"; mean {mean_ttft:.3f}\n")
    print("| router TTFT phase | requests | mean ms |\n| --- | ---: | ---: |")
    for k, (n, tot) in sorted(phases.items()):
        print(f"| {k} | {n:.0f} | {1000 * tot / n if n else 0:.1f} |")
    n, tot = phases.get("transfer", (0, 0))
    if not n:
        print("\nno request was disaggregated: no transfer phase")
        return 1
    share = tot / n / mean_ttft
    print(f"\ntransfer tail / TTFT (means): {100 * share:.2f} % (target <= 5 %: "
          f"{'met' if share <= 0.05 else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
