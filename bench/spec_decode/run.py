#!/usr/bin/env python3
"""Speculative decoding on pd-serve: tokens/s with and without each drafter, acceptance, tokens per
verifying step against (1 - a^(K+1)) / (1 - a), where the time goes, and the draft's size and
cost per token against the target's (docs/speculative.md, "Measured").

For each thread count, workload and drafter (`ngram`, `self`, `self-head` or a draft path), one
pd-serve runs
and serves 1, 4 and 16 concurrent streams, alternating rounds without speculation (the requests
send `speculative: false`: the reference, on the same process) and with it; each stream sends its
requests back to back (/v1/completions or
/v1/chat/completions, greedy by default, ignore_eos so that every request generates max_tokens).
Counters come from the server's /metrics, scraped before and after each measurement.

Workloads (texts written for this benchmark):
  repeat  a passage, then an instruction to copy it: the continuation quotes the prompt, what
          n-gram lookup predicts (rewriting, quoting, code edits in real traffic);
  free    story and essay openings to continue (a pretrained model's strength);
  chat    questions through the chat template.

Usage: .venv/bin/python bench/spec_decode/run.py [--threads 1,2] [--concurrency 1,4,16]
       [--workloads repeat:ngram,free:ngram+self,chat:ngram+self] [--max-tokens 128]
       [--rounds 2] [--out bench/results/spec_decode_DATE.md]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import benchlib  # noqa: E402

PASSAGES = [
    "The river town woke before the sun. Fishermen carried nets down the stone steps, bakers "
    "pulled the first loaves from brick ovens, and the ferry bell rang twice to say the water was "
    "calm enough to cross. By the time the light reached the market square, the stalls were full "
    "of apples, onions, dried fish and bolts of blue cloth, and the old clock above the town hall "
    "had been wound for another week.",
    "To replace the filter, first switch off the pump and close both valves. Unscrew the housing "
    "by turning it counterclockwise, lift out the old cartridge, and rinse the housing with clean "
    "water. Insert the new cartridge with the arrow pointing toward the outlet, check that the "
    "rubber seal sits flat in its groove, and screw the housing back on by hand. Open the valves "
    "slowly, switch the pump on, and look for drips during the first ten minutes.",
    "Photosynthesis takes place in the chloroplasts of plant cells. Light energy is absorbed by "
    "chlorophyll and used to split water molecules, releasing oxygen. The energy is stored in two "
    "carrier molecules, which then drive the fixation of carbon dioxide into sugars in a cycle of "
    "reactions that does not need light directly. Most of the sugar is turned into starch for "
    "storage or into cellulose for the cell walls.",
    "Our quarterly meeting covered three topics. Sales in the northern region grew by eight "
    "percent, mostly from the new line of garden tools. The warehouse move is delayed until "
    "March because the loading bays at the new site are not finished. Finally, the team agreed to "
    "test a four-day week in the support group for two months and to report the results at the "
    "next meeting.",
]

OPENINGS = [
    "Once upon a time, in a village at the edge of a great forest, there lived a girl who",
    "The history of the bicycle begins in the early nineteenth century, when",
    "When Maria opened the letter, she knew at once that her life in the city",
    "The most important thing to understand about volcanoes is that",
    "In the summer of 1969, the small town of Millbrook was preparing for",
    "The old lighthouse keeper climbed the stairs every evening, and on this night",
    "Learning to cook well starts with a few simple habits. The first is",
    "The train left the station twenty minutes late, and the passengers in the last carriage",
]

QUESTIONS = [
    "Write a short story about a cat who learns to swim.",
    "Explain how a refrigerator keeps food cold.",
    "What are three good habits for staying healthy?",
    "Describe a walk through a busy market in the morning.",
    "Why do leaves change colour in autumn?",
    "Give me some tips for learning a new language.",
]


def workload_requests(name: str) -> list[dict]:
    """The request bodies (without max_tokens / sampling) a stream cycles through."""
    if name == "repeat":
        return [{"api": "completions",
                 "prompt": f"Passage:\n{p}\n\nThe same passage, copied word for word:\n"}
                for p in PASSAGES]
    if name == "free":
        return [{"api": "completions", "prompt": o} for o in OPENINGS]
    if name == "chat":
        return [{"api": "chat", "messages": [{"role": "user", "content": q}]} for q in QUESTIONS]
    raise ValueError(f"unknown workload {name}")


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def scrape(url: str) -> dict[str, float]:
    """The pdserve_spec_* counters (and the generation counter) of a server's /metrics."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("#"):
                continue
            m = re.match(r'^(pdserve_spec_\w+|pdserve_generation_tokens_total)(\{[^}]*\})? (\S+)$',
                         line)
            if m:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run_streams(url: str, reqs: list[dict], conc: int, per_stream: int, a,
                speculative: bool = True) -> dict:
    """conc streams, each sending per_stream requests back to back; totals and wall time."""
    lock = threading.Lock()
    totals = {"tokens": 0, "requests": 0, "accepted": 0, "rejected": 0}

    def stream(i: int) -> None:
        for j in range(per_stream):
            base = reqs[(i * per_stream + j) % len(reqs)]
            body = {"max_tokens": a.max_tokens, "temperature": a.temperature, "ignore_eos": True,
                    "seed": 1000 * i + j, "speculative": speculative}
            if base["api"] == "chat":
                body["messages"] = base["messages"]
                path = "/v1/chat/completions"
            else:
                body["prompt"] = base["prompt"]
                path = "/v1/completions"
            r = post(url + path, body, timeout=600)
            u = r["usage"]
            d = u.get("completion_tokens_details") or {}
            with lock:
                totals["tokens"] += u["completion_tokens"]
                totals["requests"] += 1
                totals["accepted"] += d.get("accepted_prediction_tokens", 0)
                totals["rejected"] += d.get("rejected_prediction_tokens", 0)

    t0 = time.time()
    with cf.ThreadPoolExecutor(conc) as ex:
        list(ex.map(stream, range(conc)))
    totals["seconds"] = time.time() - t0
    return totals


def measure(system: str, workload: str, threads: int, a, workdir: Path) -> list[dict]:
    port = benchlib.free_port()
    # DRAFTER@K: a fixed draft length K (speculative.fixed_k) instead of the adaptive one.
    drafter, _, fixed = system.partition("@")
    config = workdir / f"spec-{system.replace('/', '_')}.yaml"
    config.write_text(f"speculative:\n  fixed_k: {int(fixed or 0)}\n")
    args = [str(ROOT / "build/bin/pd-serve"), "--http-port", str(port), "--no-grpc",
            "--config", str(config), "--threads", str(threads), "--spec", drafter,
            "--spec-k", str(max(a.spec_k, int(fixed or 0))), "--max-running-seqs", "32",
            "--kv-mib", "512"]
    if a.model:
        args += ["-m", a.model]
    logfile = workdir / f"pd-serve-{system.replace('/', '_')}-{workload}-t{threads}.log"
    server = benchlib.ServerProcess(system, args, port, logfile, cwd=ROOT)
    rows = []
    try:
        server.ready(900)  # a self-draft may be built on first use
        startup = startup_costs(logfile)
        reqs = workload_requests(workload)
        run_streams(server.url, reqs, 1, 1, a)  # warm-up (page cache, the draft's first prompt)
        run_streams(server.url, reqs, 1, 1, a, speculative=False)
        for conc in a.concurrency:
            # Without and with speculation on the same server, alternating (the request's
            # `speculative` flag): both see the same process, memory and machine noise.
            per_stream = max(a.requests_per_stream, math.ceil(a.min_requests / conc))
            # Unmeasured: the scheduler's gate learns whether drafts pay at this batch size
            # (its warm-up probes), as a server does once in its life, not per measurement.
            for _ in range(a.warmup_rounds):
                run_streams(server.url, reqs, conc, 1, a)
            sums = {False: {"tokens": 0, "seconds": 0.0, "requests": 0},
                    True: {"tokens": 0, "seconds": 0.0, "requests": 0}}
            delta: dict[str, float] = {}
            round_ratios = []
            for rnd in range(a.rounds):
                rate = {}
                # Without first in even rounds, with first in odd ones: a drift of the host
                # (or a favoured slot) cancels over pairs of rounds.
                for spec in ((False, True) if rnd % 2 == 0 else (True, False)):
                    before = scrape(server.url)
                    # --null: the "with" side does not speculate either (an A/A run).
                    t = run_streams(server.url, reqs, conc, per_stream, a,
                                    speculative=spec and not a.null)
                    after = scrape(server.url)
                    rate[spec] = t["tokens"] / t["seconds"]
                    for k in ("tokens", "seconds", "requests"):
                        sums[spec][k] += t[k]
                    if spec:
                        for k in after:
                            delta[k] = delta.get(k, 0) + after.get(k, 0) - before.get(k, 0)
                round_ratios.append(rate[True] / rate[False])
            off, on = sums[False], sums[True]
            rows.append({"system": system, "workload": workload, "threads": threads,
                         "concurrency": conc, "tok_s": on["tokens"] / on["seconds"],
                         "tok_s_off": off["tokens"] / off["seconds"], "seconds": on["seconds"],
                         "requests": on["requests"], "metrics": delta,
                         "round_ratios": round_ratios, "startup": startup})
            log(f"  {workload:6} {system:10} t={threads} conc={conc:2}: "
                f"{off['tokens'] / off['seconds']:7.1f} -> {on['tokens'] / on['seconds']:7.1f} "
                f"tok/s ({on['requests']} requests each way)")
    finally:
        server.stop()
    return rows


def startup_costs(logfile: Path) -> dict:
    """The server's start-up timings from its log: the draft's step and the target's 1-row step
    (ms), and the verifying step of a self-head draft (one row plus head-only rows)."""
    text = logfile.read_text(errors="replace")
    out: dict = {}
    m = re.search(r"draft step ([0-9.]+) ms \(1 row\)", text)
    if m:
        out["draft_ms"] = float(m.group(1))
    m = re.search(r"target step cost by rows \{([^}]*)\}", text)
    if m:
        out["target_rows_ms"] = {int(k): float(v) for k, v in
                                 re.findall(r"(\d+): ([0-9.]+) ms", m.group(1))}
    m = re.search(r"one row and the output head over more \{([^}]*)\}", text)
    if m:
        out["head_rows_ms"] = {int(k): float(v) for k, v in
                               re.findall(r"(\d+): ([0-9.]+) ms", m.group(1))}
    return out


def ms_table(d: dict | None) -> str:
    return ", ".join(f"{k}: {v:.1f}" for k, v in sorted(d.items())) if d else "-"


def spec_figures(m: dict) -> dict:
    drafts = m.get("pdserve_spec_drafts_total", 0)
    drafted = m.get("pdserve_spec_draft_tokens_total", 0)
    accepted = m.get("pdserve_spec_accepted_tokens_total", 0)
    reached = sum(v for k, v in m.items() if k.startswith("pdserve_spec_position_drafted_total"))
    acc_pos = sum(v for k, v in m.items() if k.startswith("pdserve_spec_position_accepted_total"))
    if drafts <= 0:
        return {"drafts": 0}
    a = acc_pos / reached if reached else 0.0  # per-position acceptance (geometric model)
    k = drafted / drafts
    formula = (k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
    return {"drafts": drafts, "drafted": drafted, "accepted": accepted, "a": a, "k": k,
            "per_step": (accepted + drafts) / drafts, "formula": formula,
            "draft_s": m.get("pdserve_spec_draft_seconds_total", 0)}


def model_costs(a, draft_path: str | None) -> list[dict]:
    """File size and single-sequence decode speed (pdctl bench --tg) of the target and draft."""
    out = []
    model = a.model or str(ROOT / "models/gemma-3-270m-q4_k_m.gguf")
    for name, path in [("target", model), ("draft", draft_path)]:
        if not path or not Path(path).exists():
            continue
        for threads in a.threads:
            r = subprocess.run([str(ROOT / "build/bin/pdctl"), "bench", "-m", path, "-t",
                                str(threads), "--pp", "16", "--tg", "64", "-r", "3"],
                               capture_output=True, text=True, cwd=ROOT, timeout=600)
            try:
                j = json.loads(r.stdout[r.stdout.index("{"):])
            except ValueError:
                log(f"pdctl bench {path} failed: {r.stderr[-400:]}")
                continue
            tg = j.get("tg_tok_s")
            if isinstance(tg, list):  # one figure per repetition: the median
                tg = sorted(tg)[len(tg) // 2] if tg else None
            out.append({"model": name, "path": path, "threads": threads,
                        "file_mib": Path(path).stat().st_size / 2**20,
                        "weights_mib": j.get("weights_bytes", 0) / 2**20,
                        "tg_tok_s": tg, "kernels": j.get("kernels")})
    return out


def find_self_draft(a) -> str | None:
    model = Path(a.model or ROOT / "models/gemma-3-270m-q4_k_m.gguf")
    beside = model.with_name(model.stem + ".draft.gguf")
    if beside.exists():
        return str(beside)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdserve/drafts"
    hits = sorted(cache.glob(f"{model.stem}-*.draft.gguf"))
    return str(hits[-1]) if hits else None


def report(rows: list[dict], costs: list[dict], a, argv: str) -> str:
    lines = [f"# Speculative decoding on pd-serve, {dt.date.today()}", "",
             f"- Machine: {benchlib.machine()}",
             f"- Command: `{argv}`",
             f"- Model: {a.model or 'models/gemma-3-270m-q4_k_m.gguf'}; greedy "
             f"(temperature {a.temperature}), max_tokens {a.max_tokens}, ignore_eos; "
             f"--spec-k {a.spec_k}; each stream sends its requests back to back "
             f"(at least {a.min_requests} requests per measurement).",
             "- The reference (tok/s off) is measured on the same server, alternating with the "
             f"speculative runs ({a.rounds} rounds of each, the reference first in even rounds "
             "and second in odd ones; requests send `speculative: false`); "
             "ratio = tokens/s with the drafter / without over all rounds; rounds = the lowest "
             "and highest ratio of single rounds (the host's noise shows there). Before each "
             f"concurrency's rounds, {a.warmup_rounds} unmeasured round(s) with speculation let the "
             "scheduler's gate warm up at that batch size.",
             "- a = accepted / reached draft positions; K = mean draft length; per step = "
             "tokens emitted per verifying step, (accepted + drafts) / drafts; formula = "
             "(1 - a^(K+1)) / (1 - a); draft time = share of the wall time spent in the drafter.",
             ""]
    if a.null:
        lines[-1:-1] = ["- **A/A run (--null)**: the \"with\" side sends `speculative: false` too, so "
                        "every ratio is the alternation's own bias and noise (ideally 1.00x)."]
    if costs:
        lines += ["## Draft and target", "",
                  "| model | threads | file MiB | weights MiB | decode tok/s (1 sequence) | "
                  "ms/token | cost vs target | kernels |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        tgt = {c["threads"]: c for c in costs if c["model"] == "target"}
        for c in costs:
            ms = 1000 / c["tg_tok_s"] if c["tg_tok_s"] else float("nan")
            t = tgt.get(c["threads"])
            rel = (t["tg_tok_s"] / c["tg_tok_s"]) if t and c["tg_tok_s"] else float("nan")
            lines.append(f"| {c['model']} ({Path(c['path']).name}) | {c['threads']} | "
                         f"{c['file_mib']:.1f} | {c['weights_mib']:.1f} | {c['tg_tok_s']:.1f} | "
                         f"{ms:.2f} | {rel:.2f} | {c['kernels']} |")
        lines.append("")
    timed = [r for r in rows if r.get("startup", {}).get("draft_ms")]
    if timed:
        lines += ["## Start-up timings (each server's log)", "",
                  "| drafter | threads | draft step, 1 row (ms) | target step by rows (ms) | "
                  "verifying step, 1 row + head-only rows (ms) |", "| --- | --- | --- | --- | --- |"]
        seen = set()
        for r in timed:
            key = (r["system"], r["threads"])
            if key in seen:
                continue
            seen.add(key)
            st = r["startup"]
            lines.append(f"| {r['system']} | {r['threads']} | {st['draft_ms']:.2f} | "
                         f"{ms_table(st.get('target_rows_ms'))} | "
                         f"{ms_table(st.get('head_rows_ms'))} |")
        lines.append("")
    lines += ["## Throughput", "",
              "| workload | drafter | threads | streams | tok/s off | tok/s with | ratio | "
              "rounds | a | K | per step | formula | draft time |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        f = spec_figures(r["metrics"])
        ratio = r["tok_s"] / r["tok_s_off"]
        if f["drafts"]:
            sf = (f"{f['a']:.2f} | {f['k']:.2f} | {f['per_step']:.2f} | {f['formula']:.2f} | "
                  f"{100 * f['draft_s'] / r['seconds']:.0f} %")
        else:
            sf = "- | - | - | - | 0 %"
        rr = r.get("round_ratios") or []
        spread = f"{min(rr):.2f}-{max(rr):.2f}" if rr else "-"
        lines.append(f"| {r['workload']} | {r['system']} | {r['threads']} | {r['concurrency']} | "
                     f"{r['tok_s_off']:.1f} | {r['tok_s']:.1f} | "
                     f"**{ratio:.2f}x** | {spread} | {sf} |")
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--workloads", default="repeat:ngram,free:ngram+self,chat:ngram+self",
                   help="WORKLOAD:DRAFTER+DRAFTER,... ; a drafter is ngram, self, self-head or a "
                        "path, "
                        "with @K for a fixed draft length (self@2)")
    p.add_argument("--rounds", type=int, default=2,
                   help="alternations of without / with speculation per measurement")
    p.add_argument("--warmup-rounds", type=int, default=1,
                   help="unmeasured rounds (one request per stream, speculating) before each "
                        "concurrency's measurement: the scheduler's gate warms up per batch size")
    p.add_argument("--null", action="store_true",
                   help="A/A check: the speculative side sends speculative: false too, so the "
                        "ratio measures the alternation's own bias and noise (ideally 1.00x)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--spec-k", type=int, default=8)
    p.add_argument("--requests-per-stream", type=int, default=2)
    p.add_argument("--min-requests", type=int, default=8)
    p.add_argument("--out", default="")
    p.add_argument("--json", default="", help="also write the raw rows here (written first)")
    p.add_argument("--from-json", default="", help="only render the report of an earlier --json")
    a = p.parse_args()
    a.threads = [int(x) for x in a.threads.split(",")]
    a.concurrency = [int(x) for x in a.concurrency.split(",")]
    plan = []
    for item in a.workloads.split(","):
        w, systems = item.split(":")
        plan.append((w, systems.split("+")))
    if a.from_json:
        saved = json.loads(Path(a.from_json).read_text())
        text = report(saved["rows"], saved["costs"], a, saved.get("argv", ""))
        print(text)
        if a.out:
            Path(a.out).write_text(text)
        return 0
    workdir = ROOT / "build/bench_spec_decode"
    workdir.mkdir(parents=True, exist_ok=True)
    log(benchlib.machine())
    rows = []
    for threads in a.threads:
        for w, systems in plan:
            for s in systems:
                rows += measure(s, w, threads, a, workdir)
    uses_self = any(s.split("@")[0] == "self" for _, systems in plan for s in systems)
    paths = [s.split("@")[0] for _, systems in plan for s in systems
             if s.split("@")[0] not in ("ngram", "self", "self-head")]
    draft = find_self_draft(a) if uses_self else (paths[0] if paths else None)
    argv = "python " + " ".join(sys.argv)
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "argv": argv}, indent=1))
    costs = model_costs(a, draft)
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "costs": costs, "argv": argv}, indent=1))
    text = report(rows, costs, a, argv)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
