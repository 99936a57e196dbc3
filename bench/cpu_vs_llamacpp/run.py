#!/usr/bin/env python3
"""pdserve vs llama.cpp on the CPU: prompt processing, decoding, memory and the bandwidth roofline.

For each thread count, runs `pdctl bench` (pdserve) and llama_side.py (llama.cpp through
llama-cpp-python) on the same GGUF file with the same synthetic token ids, the same context
(4096) and the same KV-cache type (f16), and prints ONE markdown table:

  system | threads | pp512 tok/s | tg128 tok/s | peak RSS | ours / llama.cpp | % of roofline

pp512: one forward of a 512-token prompt from an empty cache (logits of the last position).
tg128: 128 single-token forwards from an empty cache, full logits each step (pdserve also takes
each step's best token from its 262k logits on the backend, as its scheduler does for greedy
sampling; llama.cpp's rate is its own t_eval counter).
Rates are medians over --reps repetitions after a warm-up, each system in its own process.
Roofline: DRAM read bandwidth measured in the same run (gemv_bench dram_read, 2 GiB buffer, the
same thread count) / bytes of weights read per decoded token (from the GGUF: every tensor once,
the tied head/embedding included, plus one embedding row for the lookup when the head is a
separate tensor).

With --cold, also times the model load and the first forward (8 tokens) with the model file out
of the page cache (a fresh copy written with O_DIRECT, then POSIX_FADV_DONTNEED; residency
checked with fincore) and warm.

  .venv/bin/python bench/cpu_vs_llamacpp/run.py                # build-perf, threads 1 and 2
  .venv/bin/python bench/cpu_vs_llamacpp/run.py --build-dir build --threads 2 --reps 5 --cold
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def sh(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def last_json(out: str) -> dict:
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON in output:\n{out}")


def weight_bytes_per_token(model: Path) -> tuple[int, int]:
    """(bytes read per decoded token, bytes of all tensors) from the GGUF's tensor table.

    Runs in a child process: GGUFReader maps the whole file, and Linux keeps a process's peak
    RSS across fork + exec, so mapping it here would inflate every child's ru_maxrss."""
    out = sh([sys.executable, __file__, "--bytes-of", str(model)])
    per_token, total = json.loads(out)
    return per_token, total


def _bytes_of(model: Path) -> tuple[int, int]:
    import gguf  # gguf-py, installed with llama-cpp-python's requirements

    r = gguf.GGUFReader(str(model))
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    rows = {t.name: int(t.shape[-1]) for t in r.tensors}
    total = sum(sizes.values())
    per_token = total
    if "output.weight" in sizes and "token_embd.weight" in sizes:
        # Separate head: the embedding table is only looked up (one row per token).
        emb = sizes["token_embd.weight"]
        per_token = total - emb + emb // rows["token_embd.weight"]
    return per_token, total


def dram_bandwidth(build: Path, threads: int) -> float:
    """GB/s of gemv_bench's dram_read/<threads> (sum of a 2 GiB buffer)."""
    out = sh([str(build / "bin" / "gemv_bench"), f"--benchmark_filter=dram_read/{threads}/",
              "--benchmark_min_time=1", "--benchmark_format=json"])
    runs = json.loads(out)["benchmarks"]
    return max(r["GBps"] for r in runs)


def ours(pdctl: Path, model: Path, threads: int, pp: int, tg: int, reps: int) -> dict:
    return last_json(sh([str(pdctl), "bench", "-m", str(model), "-t",
                         str(threads), "--pp", str(pp), "--tg", str(tg), "-r", str(reps),
                         "--kv-type", "f16", "--ctx", "4096"]))


def llama(model: Path, threads: int, pp: int, tg: int, reps: int) -> dict:
    return last_json(sh([sys.executable, str(HERE / "llama_side.py"), "--model", str(model),
                         "--threads", str(threads), "--pp", str(pp), "--tg", str(tg), "--reps",
                         str(reps), "--ctx", "4096"]))


def cold_copy(model: Path, tmpdir: Path) -> Path:
    """A copy of `model` whose pages are not in the page cache."""
    dst = tmpdir / model.name
    subprocess.run(["dd", f"if={model}", f"of={dst}", "bs=4M", "oflag=direct", "status=none"],
                   check=True)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return dst


def resident_mib(path: Path) -> float:
    try:
        out = sh(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)])
        return int(out.split()[0]) / 2**20
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return float("nan")


def wait_for_idle(max_wait_s: float) -> float:
    """Waits until both CPUs were >= 95% idle over 3 s (/proc/stat), at most max_wait_s.
    Returns the idle fraction of the last window."""
    import time

    def snap() -> tuple[int, int]:
        f = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return f[3] + f[4], sum(f)

    t_end = time.time() + max_wait_s
    while True:
        i0, a0 = snap()
        time.sleep(3)
        i1, a1 = snap()
        idle = (i1 - i0) / max(1, a1 - a0)
        if idle >= 0.95 or time.time() > t_end:
            return idle


def load_av() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build-perf")
    ap.add_argument("--pdctl", type=Path, help="pdctl binary (default: <build-dir>/bin/pdctl)")
    ap.add_argument("--skip-llama", action="store_true", help="measure pdserve only")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate the two systems this many times per thread count")
    ap.add_argument("--cold", action="store_true", help="also time cold and warm loads")
    ap.add_argument("--json", type=Path, help="also write every raw result here")
    ap.add_argument("--wait-idle", type=float, default=0,
                    help="before each measurement wait up to this many seconds for idle CPUs")
    ap.add_argument("--bytes-of", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bytes_of:
        print(json.dumps(_bytes_of(args.bytes_of)))
        return
    build = args.build_dir if args.build_dir.is_absolute() else ROOT / args.build_dir
    threads = [int(t) for t in args.threads.split(",")]
    pdctl = args.pdctl or build / "bin" / "pdctl"

    per_token, total = weight_bytes_per_token(args.model)
    raw: dict = {"model": str(args.model), "bytes_per_token": per_token, "tensor_bytes": total,
                 "load_before": load_av(), "runs": [], "bandwidth": {}, "cold": []}
    print(f"model {args.model.name}: {total / 2**20:.1f} MiB of tensors, "
          f"{per_token / 2**20:.1f} MiB read per decoded token; load average {raw['load_before']}",
          file=sys.stderr)
    for t in threads:
        if args.wait_idle > 0:
            wait_for_idle(args.wait_idle)
        raw["bandwidth"][t] = dram_bandwidth(build, t)
        print(f"DRAM read, {t} thread(s): {raw['bandwidth'][t]:.1f} GB/s", file=sys.stderr)
        for _ in range(args.rounds):
            for name, fn in (("pdserve", lambda: ours(pdctl, args.model, t, args.pp, args.tg,
                                                      args.reps)),
                             ("llama.cpp", lambda: llama(args.model, t, args.pp, args.tg,
                                                         args.reps))):
                if name == "llama.cpp" and args.skip_llama:
                    continue
                idle = wait_for_idle(args.wait_idle) if args.wait_idle > 0 else float("nan")
                r = fn()
                r["idle_before"] = idle
                r["load_before"] = load_av()
                r["bandwidth_gbps"] = raw["bandwidth"][t]
                raw["runs"].append(r)
                print(f"  {name} t={t}: pp {r['pp_tok_s']} tg {r['tg_tok_s']} rss "
                      f"{r['peak_rss_mib']:.0f} MiB (idle before {idle:.2f}, load "
                      f"{r['load_before']})", file=sys.stderr)

    if args.cold:
        with tempfile.TemporaryDirectory(dir=ROOT / "models") as d:
            for name in ("pdserve", "llama.cpp"):
                for state in ("cold", "warm"):
                    path = cold_copy(args.model, Path(d)) if state == "cold" else args.model
                    res = resident_mib(path)
                    t = max(threads)
                    r = (ours(pdctl, path, t, 8, 8, 1) if name == "pdserve"
                         else llama(path, t, 8, 8, 1))
                    raw["cold"].append({"system": name, "state": state, "resident_mib": res,
                                        "load_s": r["load_s"],
                                        "first_token_s": r["first_token_s"], "threads": t})
                    if state == "cold":
                        os.remove(path)
    raw["load_after"] = load_av()

    def med(v: list[float]) -> float:
        return statistics.median(v)

    rows = {}
    for r in raw["runs"]:
        key = ("pdserve" if r["system"] == "pdserve" else "llama.cpp", r["threads"])
        agg = rows.setdefault(key, {"pp": [], "tg": [], "rss": [], "bw": r["bandwidth_gbps"],
                                    "system": r["system"]})
        agg["pp"] += r["pp_tok_s"]
        agg["tg"] += r["tg_tok_s"]
        agg["rss"].append(r["peak_rss_mib"])
    lines = ["| system | threads | pp512 tok/s | tg128 tok/s | peak RSS MiB | ours / llama.cpp "
             "(pp, tg) | % of roofline (tg) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for t in threads:
        for sysname in ("pdserve", "llama.cpp"):
            a = rows.get((sysname, t))
            if a is None:
                continue
            roof = a["bw"] * 1e9 / per_token
            ratio = ""
            if sysname == "pdserve" and ("llama.cpp", t) in rows:
                b = rows[("llama.cpp", t)]
                ratio = f"{med(a['pp']) / med(b['pp']):.2f}x, {med(a['tg']) / med(b['tg']):.2f}x"
            lines.append(f"| {a['system']} | {t} | {med(a['pp']):.1f} | {med(a['tg']):.1f} | "
                         f"{max(a['rss']):.0f} | {ratio} | {100 * med(a['tg']) / roof:.0f}% "
                         f"(of {roof:.0f} tok/s at {a['bw']:.1f} GB/s) |")
    print("\n".join(lines))
    if raw["cold"]:
        print("\n| system | page cache | resident MiB before | load s | first token s (8-token "
              "prompt) |\n| --- | --- | ---: | ---: | ---: |")
        for c in raw["cold"]:
            print(f"| {c['system']} | {c['state']} | {c['resident_mib']:.0f} | {c['load_s']:.3f} | "
                  f"{c['first_token_s']:.3f} |")
    print(f"\nload average (1/5/15 min): {raw['load_before']} before, {raw['load_after']} after")
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
