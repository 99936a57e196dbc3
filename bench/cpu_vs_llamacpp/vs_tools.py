#!/usr/bin/env python3
"""pdserve against llama.cpp's own llama-bench and llama-batched-bench: prefill at 512 to 16k
tokens, and decode of 1, 4 and 16 sequences per step after a prompt each.

Issue 19's prefill and batched-decode targets name these two tools, so this script runs them
(built by bench/llamacpp/build_tools.sh from the llama.cpp that llama-cpp-python ships) next to
`pdctl bench` on the same model file, thread count and KV type (f16), and prints two tables:

  prefill: pp tokens | threads | llama-bench best of flash attention off/on | pdserve | ratio
  decode:  sequences | threads | llama-batched-bench S_TG best of fa off/on | pdserve | ratio |
           pdserve over its own 1-sequence rate | roofline (sequences x DRAM GB/s / bytes/token)

What is held equal: prefill is one prompt of N tokens from an empty cache (llama-bench -p N -n 0;
`pdctl bench --pp N`), ids differ (llama-bench draws random ids, pdctl a fixed spread; speed does
not depend on them). Decode: each of B sequences first holds its own P-token prompt (untimed),
then G steps of one token per sequence with logits for every row (llama-batched-bench -npp P
-ntg G -npl B, its S_TG; `pdctl bench --batch B --batch-pp P --tg G`, which also takes each
row's best token on the backend as the scheduler does, a cost llama.cpp's figure leaves out). llama.cpp gets the better of flash
attention off and on for each row; pdserve runs as shipped. Medians over --reps runs
(llama-batched-bench measures once per call, so it is called --reps times).

--isa avx2 caps pdserve's kernels (PDSERVE_CPU_ISA=avx2) to report the path a machine without
AVX-512 takes. llama.cpp then runs as on such a machine too: its tools built for AVX2 only
(build_tools.sh with LLAMA_ISA=avx2, the flags pip's -march=native build gets on a CPU without
AVX-512). --llama-isa native keeps llama.cpp CPU-native instead, which makes the ratio a lower
bound (pdserve without AVX-512 against llama.cpp with it).

  .venv/bin/python bench/cpu_vs_llamacpp/vs_tools.py --build-dir build
  .venv/bin/python bench/cpu_vs_llamacpp/vs_tools.py --build-dir build --pp 512,4096,16384 \\
      --threads 1,2 --batches 1,4,16 --reps 3 --json /tmp/vs_tools.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import (ROOT, dram_bandwidth, last_json, load_av, wait_for_idle,  # noqa: E402
                 weight_bytes_per_token)


def run(cmd: list[str], env: dict | None = None, timeout: float = 3600) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


def tools_dir(isa: str) -> Path:
    out = run(["bash", str(ROOT / "bench" / "llamacpp" / "build_tools.sh"), "llama-bench",
               "llama-batched-bench"], env={**os.environ, "LLAMA_ISA": isa})
    return Path(out.strip().splitlines()[-1])


def llama_bench(tools: Path, model: Path, threads: int, pp: int, reps: int) -> dict:
    """{fa: [tok/s per rep]} for flash attention off (0) and on (1)."""
    out = run([str(tools / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", str(pp),
               "-n", "0", "-fa", "0,1", "-r", str(reps), "-o", "json"])
    res: dict[int, list[float]] = {}
    for r in json.loads(out):
        res[int(r["flash_attn"])] = [float(v) for v in r["samples_ts"]]
    return res


def llama_batched(tools: Path, model: Path, threads: int, npp: int, ntg: int,
                  batches: list[int], fa: int) -> dict[int, float]:
    """{sequences: S_TG tok/s} from one llama-batched-bench call."""
    ctx = max(batches) * (npp + ntg)
    out = run([str(tools / "llama-batched-bench"), "-m", str(model), "-t", str(threads), "-c",
               str(ctx), "-b", "2048", "-ub", "512", "-npp", str(npp), "-ntg", str(ntg), "-npl",
               ",".join(map(str, batches)), "-fa", "on" if fa else "off", "--output-format",
               "jsonl"])
    res = {}
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            res[int(r["pl"])] = float(r["speed_tg"])
    return res


def pdctl_bench(pdctl: Path, model: Path, threads: int, env: dict, *extra: str) -> dict:
    return last_json(run([str(pdctl), "bench", "-m", str(model), "-t", str(threads),
                          "--kv-type", "f16", *extra], env=env))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pp", default="512,4096,16384", help="prompt lengths for the prefill table")
    ap.add_argument("--long-threads", default="",
                    help="thread counts for prompts over 4096 tokens (default: all of --threads)")
    ap.add_argument("--batches", default="1,4,16", help="sequences per decode step")
    ap.add_argument("--npp", type=int, default=128, help="prompt tokens per decoding sequence")
    ap.add_argument("--ntg", type=int, default=128, help="decode steps")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-isa", choices=["native", "avx2"], default=None,
                    help="llama.cpp's build: CPU-native, or AVX2 only (default: avx2 with "
                         "--isa avx2, else native)")
    ap.add_argument("--isa", choices=["avx512", "avx2"], default=None,
                    help="cap pdserve's kernels (PDSERVE_CPU_ISA); llama.cpp stays native")
    ap.add_argument("--skip", choices=["prefill", "decode"], action="append", default=[])
    ap.add_argument("--wait-idle", type=float, default=0,
                    help="before each measurement wait up to this many seconds for idle CPUs")
    ap.add_argument("--json", type=Path, help="also write every raw result here")
    args = ap.parse_args()
    build = args.build_dir if args.build_dir.is_absolute() else ROOT / args.build_dir
    pdctl = build / "bin" / "pdctl"
    threads = [int(t) for t in args.threads.split(",")]
    long_threads = ([int(t) for t in args.long_threads.split(",")] if args.long_threads
                    else threads)
    pps = [int(p) for p in args.pp.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    env = dict(os.environ)
    if args.isa:
        env["PDSERVE_CPU_ISA"] = args.isa
    llama_isa = args.llama_isa or ("avx2" if args.isa == "avx2" else "native")
    tools = tools_dir(llama_isa)
    per_token, _ = weight_bytes_per_token(args.model)

    def idle() -> None:
        if args.wait_idle > 0:
            wait_for_idle(args.wait_idle)

    med = statistics.median
    raw: dict = {"model": str(args.model), "isa": args.isa or "native", "llama_isa": llama_isa,
                 "load_before": load_av(), "prefill": [], "decode": [], "bandwidth": {}}
    kernels = "?"
    for t in threads:
        for pp in pps if "prefill" not in args.skip else []:
            if pp > 4096 and t not in long_threads:
                continue
            idle()
            lb = llama_bench(tools, args.model, t, pp, args.reps)
            idle()
            ours = pdctl_bench(pdctl, args.model, t, env, "--pp", str(pp), "--tg", "1", "-r",
                               str(args.reps), "--ctx", str(max(pp, 256)))
            kernels = ours["kernels"]
            row = {"threads": t, "pp": pp, "llama_fa0": lb.get(0, []), "llama_fa1": lb.get(1, []),
                   "pdserve": ours["pp_tok_s"], "kernels": kernels}
            raw["prefill"].append(row)
            print(f"pp{pp} t={t}: llama-bench fa0 {row['llama_fa0']} fa1 {row['llama_fa1']} "
                  f"pdserve {row['pdserve']}", file=sys.stderr)
        if "decode" in args.skip:
            continue
        idle()
        raw["bandwidth"][t] = dram_bandwidth(build, t)
        lbb: dict[int, dict[int, list[float]]] = {0: {}, 1: {}}
        for _ in range(args.reps):
            for fa in (0, 1):
                idle()
                for b, v in llama_batched(tools, args.model, t, args.npp, args.ntg, batches,
                                          fa).items():
                    lbb[fa].setdefault(b, []).append(v)
        ctx = max(batches) * (args.npp + args.ntg) + 256
        for b in batches:
            idle()
            ours = pdctl_bench(pdctl, args.model, t, env, "--pp", "8", "--tg", str(args.ntg),
                               "-r", str(args.reps), "--ctx", str(ctx), "--batch", str(b),
                               "--batch-pp", str(args.npp))
            kernels = ours["kernels"]
            row = {"threads": t, "sequences": b, "llama_fa0": lbb[0].get(b, []),
                   "llama_fa1": lbb[1].get(b, []), "pdserve": ours["tg_batch_tok_s"],
                   "bandwidth_gbps": raw["bandwidth"][t], "kernels": kernels}
            raw["decode"].append(row)
            print(f"decode B={b} t={t}: llama fa0 {row['llama_fa0']} fa1 {row['llama_fa1']} "
                  f"pdserve {row['pdserve']}", file=sys.stderr)
    raw["load_after"] = load_av()

    def best(row: dict) -> tuple[float, str]:
        cands = [(med(row[k]), k[-1]) for k in ("llama_fa0", "llama_fa1") if row[k]]
        return max(cands)

    print(f"model {args.model.name}; pdserve kernels: {kernels}; llama.cpp: "
          f"{'CPU-native' if llama_isa == 'native' else 'AVX2-only'} build; "
          f"KV f16 for both; medians of {args.reps}")
    if raw["prefill"]:
        print("\n| prompt tokens | threads | llama-bench tok/s (best: fa) | pdserve tok/s | "
              "pdserve / llama.cpp |\n| ---: | ---: | ---: | ---: | ---: |")
        for r in raw["prefill"]:
            v, fa = best(r)
            ours = med(r["pdserve"])
            print(f"| {r['pp']} | {r['threads']} | {v:.1f} (fa {fa}) | {ours:.1f} | "
                  f"{ours / v:.2f}x |")
    if raw["decode"]:
        print(f"\n| sequences | threads | llama-batched-bench S_TG tok/s (best: fa) | pdserve tok/s "
              f"| pdserve / llama.cpp | pdserve / its 1 sequence | roofline tok/s |\n"
              f"| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        one = {r["threads"]: med(r["pdserve"]) for r in raw["decode"] if r["sequences"] == 1}
        for r in raw["decode"]:
            v, fa = best(r)
            ours = med(r["pdserve"])
            roof = r["sequences"] * r["bandwidth_gbps"] * 1e9 / per_token
            self_ratio = f"{ours / one[r['threads']]:.2f}x" if r["threads"] in one else "-"
            print(f"| {r['sequences']} | {r['threads']} | {v:.1f} (fa {fa}) | {ours:.1f} | "
                  f"{ours / v:.2f}x | {self_ratio} | {roof:.0f} ({100 * ours / roof:.0f}%; "
                  f"{r['bandwidth_gbps']:.1f} GB/s) |")
    print(f"\nprompt of {args.npp} tokens per decoding sequence, {args.ntg} steps; load average "
          f"{raw['load_before']} before, {raw['load_after']} after")
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
