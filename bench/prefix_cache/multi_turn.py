#!/usr/bin/env python3
"""Time to first token per turn of one chat conversation with a long system prompt.

Chat clients send the whole conversation every turn, so a server that reuses the KV of the prefix
it has already computed answers turn 2..N in the time of their new tokens, and one that does not
recomputes the whole conversation each turn. This script measures that, the way a user sees it:

  * starts each system on the same model and thread count: `pd-serve` (prefix cache on, the
    default), `pd-serve-nocache` (`--no-prefix-cache`), the cluster
    (`pdctl up --prefill 1 --decode 2 --pin-cores`: one core per daemon; `cluster-unpinned`: the
    same with --threads threads per daemon on any core), and llama.cpp's `llama-server` (built by
    bench/llamacpp/build_tools.sh from the llama-cpp-python sdist; the reference);
    `cluster-pull` / `cluster-nopull`: `pdctl up --prefill 2 --decode 1` with the prefill nodes
    taken in turn (`router.prefill_policy: round_robin`) and every turn of at least 256 new
    tokens disaggregated, with the prefix pull (docs/cluster.md) on or off: each turn's prefill
    node lacks what the other one computed, which the decode node holds;
  * runs one conversation through the official `openai` client against each: a system prompt of
    --system-words words (1600: about 2,400 tokens), then --turns user turns (a question, after
    a pasted passage of --user-words words when > 0), greedy, --max-tokens each, every turn
    sending the whole history (system, user and assistant messages so far);
  * times each turn from the request to the first streamed content chunk (TTFT);
  * prints one markdown table (TTFT per turn and system, turns 2..N / turn 1, and the ratio to
    llama-server measured in the same run) with the machine and the command.

  .venv/bin/python bench/prefix_cache/multi_turn.py
  .venv/bin/python bench/prefix_cache/multi_turn.py --systems pd-serve,llama-server --turns 5 \
      --out bench/results/prefix_cache_multi_turn_<date>.md
  .venv/bin/python bench/prefix_cache/multi_turn.py --systems cluster-nopull,cluster-pull \
      --user-words 400

Issue 18's targets read off this table: TTFT of turns 2..5 <= 0.1x turn 1 on pd-serve and the
cluster, and no turn slower than llama-server.
"""

from __future__ import annotations

import argparse
import datetime
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import benchlib  # noqa: E402

# Plain English words for a deterministic system prompt; about one token each for Gemma's,
# Llama's and Qwen's vocabularies.
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there one all we their has been if more when will would who "
    "so no out up into do any time my than only its new some could these two may first then other "
    "also over after most made such where many through before even back years way well down should "
    "because each just those people how too little state good very make world still own see men "
    "work long here both between life being under never day same another know while last might us "
    "great old year off come since against go came right used take three place small found part "
    "house water city river table garden letter story morning window school music market family"
).split()

QUESTIONS = [
    "Summarize the rules above in one sentence.",
    "Which rule matters most for a new visitor, and why?",
    "Give one example of the second rule in practice.",
    "What would you change about the rules?",
    "Write a short closing line for the notice.",
    "List three words that describe the place.",
    "Who should read these rules first?",
    "How long should a visit last?",
]


def system_prompt(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    lines = [" ".join(words[i:i + 12]).capitalize() + "." for i in range(0, len(words), 12)]
    return "You keep the house rules of a small museum by the river. The rules:\n" + "\n".join(
        f"{i + 1}. {line}" for i, line in enumerate(lines))


Server = benchlib.ServerProcess
free_port = benchlib.free_port


def start(system: str, a: argparse.Namespace, logdir: Path) -> Server:
    port = free_port()
    log = logdir / f"{system}.log"
    if system in ("pd-serve", "pd-serve-nocache"):
        args = [str(a.bin_dir / "pd-serve"), "-m", str(a.model), "--threads", str(a.threads),
                "--ctx", str(a.ctx), "--http-port", str(port), "--grpc-port", "0"]
        if system == "pd-serve-nocache":
            args.append("--no-prefix-cache")
    elif system in ("cluster", "cluster-unpinned"):
        args = [str(a.bin_dir / "pdctl"), "up", "--prefill", "1", "--decode", "2", "-m",
                str(a.model), "--http-port", str(port), "--grpc-port", "0"]
        # Pinned: one core per daemon (3 daemons on this machine's cores, round robin).
        # Unpinned: every daemon may use --threads threads on any core; in one conversation only
        # one daemon works at a time (idle engine threads sleep), so it gets the whole machine.
        args += ["--pin-cores"] if system == "cluster" else ["--threads", str(a.threads)]
    elif system in ("cluster-pull", "cluster-nopull"):
        config = logdir / f"{system}.yaml"
        config.write_text(
            f"model: {{context: {a.ctx}}}\n"
            "router: {prefill_policy: round_robin, disaggregate_min_prompt: 256}\n"
            f"kv_transfer: {{prefix_pull: {'true' if system == 'cluster-pull' else 'false'}}}\n")
        args = [str(a.bin_dir / "pdctl"), "up", "--prefill", "2", "--decode", "1", "-m",
                str(a.model), "--http-port", str(port), "--grpc-port", "0", "--pin-cores",
                "--config", str(config)]
    elif system == "llama-server":
        args = [str(a.llama_bin / "llama-server"), "-m", str(a.model), "-t", str(a.threads),
                "-tb", str(a.threads), "-c", str(a.ctx), "-np", "1", "--port", str(port),
                "--host", "127.0.0.1"]
    else:
        raise SystemExit(
            f"unknown system '{system}' (pd-serve, pd-serve-nocache, cluster, cluster-unpinned, "
            "cluster-pull, cluster-nopull, llama-server)")
    s = Server(system, args, port, log)
    try:
        s.ready(a.start_timeout)
    except RuntimeError as e:
        s.stop()
        raise SystemExit(f"{system}: {e}; log: {log}\n{log.read_text()[-2000:]}")
    return s


def passage(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return " ".join(" ".join(words[i:i + 12]).capitalize() + "." for i in range(0, n_words, 12))


def converse(url: str, a: argparse.Namespace, system: str) -> list[dict]:
    from openai import OpenAI
    client = OpenAI(base_url=url + "/v1", api_key="none", timeout=a.request_timeout)
    model = client.models.list().data[0].id
    messages = [{"role": "system", "content": system}]
    turns = []
    for t in range(a.turns):
        question = QUESTIONS[t % len(QUESTIONS)]
        if a.user_words > 0:
            note = passage(a.user_words, a.seed + 1 + t)
            question = f"A visitor left this note:\n{note}\n{question}"
        messages.append({"role": "user", "content": question})
        t0 = time.perf_counter()
        first = None
        text = []
        usage = None
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=a.max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter()
                text.append(chunk.choices[0].delta.content)
        end = time.perf_counter()
        reply = "".join(text)
        messages.append({"role": "assistant", "content": reply})
        turns.append({"ttft_s": (first or end) - t0, "e2e_s": end - t0,
                      "prompt_tokens": usage.prompt_tokens if usage else None,
                      "completion_tokens": usage.completion_tokens if usage else None,
                      "cached_tokens": cached_tokens(usage)})
        time.sleep(a.think)
    return turns


def cached_tokens(usage) -> int | None:
    """usage.prompt_tokens_details.cached_tokens, or None when the server does not report it."""
    details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
    value = getattr(details, "cached_tokens", None) if details is not None else None
    return value if isinstance(value, int) else None


def ttft_phases(url: str) -> dict[str, tuple[float, float]]:
    """The router's pdserve_router_ttft_phase_seconds: phase -> (count, sum of seconds)."""
    import urllib.request
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, list[float]] = {}
    for m in re.finditer(r'^pdserve_router_ttft_phase_seconds_(count|sum)\{phase="([a-z_]+)"\} '
                         r'(\S+)$', text, re.M):
        entry = out.setdefault(m.group(2), [0.0, 0.0])
        entry[0 if m.group(1) == "count" else 1] = float(m.group(3))
    return {k: (v[0], v[1]) for k, v in out.items()}


def write_report(lines: list[str], out: Path | None) -> None:
    """Prints the markdown report and, with --out, writes it there too."""
    report = "\n".join(lines) + "\n"
    print(report)
    if out:
        out.write_text(report)


def machine() -> str:
    return benchlib.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default="pd-serve-nocache,pd-serve,cluster,llama-server")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--bin-dir", type=Path, default=ROOT / "build" / "bin")
    ap.add_argument("--llama-bin", type=Path,
                    help="folder with llama-server (default: bench/llamacpp/build_tools.sh's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--system-words", type=int, default=1600,
                    help="words of the system prompt (1600: about 2,400 Gemma tokens)")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--user-words", type=int, default=0,
                    help="words of a passage pasted into each user turn (0: questions only)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--think", type=float, default=0.5, help="seconds between turns")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start-timeout", type=float, default=180)
    ap.add_argument("--request-timeout", type=float, default=300)
    ap.add_argument("--out", type=Path, help="also write the report here")
    a = ap.parse_args()
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    if "llama-server" in systems and a.llama_bin is None:
        out = subprocess.run([str(ROOT / "bench/llamacpp/build_tools.sh")], check=True,
                             capture_output=True, text=True).stdout
        a.llama_bin = Path(out.strip().splitlines()[-1])
    if not a.model.is_file():
        raise SystemExit(f"model not found: {a.model}")

    prompt = system_prompt(a.system_words, a.seed)
    results: dict[str, list[dict]] = {}
    phases: dict[str, dict[str, tuple[float, float]]] = {}
    logdir = Path(tempfile.mkdtemp(prefix="multi_turn."))
    for system in systems:
        print(f"{system}: starting", file=sys.stderr)
        s = start(system, a, logdir)
        try:
            results[system] = converse(s.url, a, prompt)
            if system.startswith("cluster"):
                phases[system] = ttft_phases(s.url)
        finally:
            s.stop()
        print(f"{system}: TTFT " + ", ".join(f"{t['ttft_s']:.2f}" for t in results[system]) + " s",
              file=sys.stderr)

    ref = results.get("llama-server")
    lines = [f"# Multi-turn chat: time to first token per turn ({datetime.date.today()})", "",
             f"One conversation: a system prompt of {a.system_words} words, "
             f"{a.turns} user turns"
             + (f" (each pasting a {a.user_words}-word passage)" if a.user_words else "") +
             f", {a.max_tokens} greedy tokens each, the whole history sent "
             f"every turn (openai client, streamed). Threads {a.threads}, context {a.ctx}, model "
             f"`{a.model.name}`.", "",
             f"Machine: {machine()}.", "",
             "Command: `" + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]) + "`", "",
             "| turn | prompt tokens | " + " | ".join(f"{s} TTFT s" for s in systems) +
             (" | " + " | ".join(f"{s} / llama-server" for s in systems if s != "llama-server")
              if ref else "") + " |",
             "|" + " ---: |" * (2 + len(systems) + (len(systems) - 1 if ref else 0))]
    for t in range(a.turns):
        row = [str(t + 1)]
        pt = next((r[t]["prompt_tokens"] for r in results.values() if r[t]["prompt_tokens"]), None)
        row.append(str(pt) if pt else "-")
        row += [f"{results[s][t]['ttft_s']:.3f}" for s in systems]
        if ref:
            row += [f"{results[s][t]['ttft_s'] / ref[t]['ttft_s']:.2f}x" for s in systems
                    if s != "llama-server"]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Cached prompt tokens reported per turn (`usage.prompt_tokens_details.cached_tokens`; "
              "n/a: not reported):", ""]
    for s in systems:
        lines.append(f"- {s}: " + ", ".join(
            "n/a" if x.get("cached_tokens") is None else str(x["cached_tokens"])
            for x in results[s]))
    lines.append("")
    for s in systems:
        r = results[s]
        if len(r) > 1:
            later = statistics.median(x["ttft_s"] for x in r[1:])
            target = ("the reference" if s == "llama-server" else
                      "the cache off" if s == "pd-serve-nocache" else
                      "issue 18's target: <= 0.10")
            lines.append(f"- {s}: median TTFT of turns 2..{a.turns} / turn 1 = "
                         f"{later / r[0]['ttft_s']:.2f} ({target})")
    if phases:
        lines += ["", "The router's TTFT phases over the whole run "
                  "(`pdserve_router_ttft_phase_seconds`: count, mean s):", ""]
        for s_, ph in phases.items():
            lines.append(f"- {s_}: " + ", ".join(
                f"{name} {int(c)} x {tot / c:.3f}" for name, (c, tot) in sorted(ph.items()) if c))
    write_report(lines, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
