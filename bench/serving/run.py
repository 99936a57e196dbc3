#!/usr/bin/env python3
"""Serving targets of issue 5, measured with pd-serve + pd-bench on one machine.

For every scenario this script writes a pd-serve config, starts pd-serve on free ports (port 0,
read back from its ready line), sends one tiny priming request, snapshots /metrics, runs pd-bench
(gRPC, --json), snapshots /metrics again, stops the server with SIGTERM, and finally prints
markdown tables.

  (a) decode throughput: fixed concurrency 1, 4, 8, 16; prompt 32, output 128, ignore_eos.
      Target: output tok/s at 16 streams >= 3x the single stream.
  (b) TPOT of running streams while 2048-token prompts arrive: a "decode" class (8 streams,
      prompt 64, output 256, closed loop) alone (baseline), then with a "long" class (prompt 2048,
      output 16, Poisson) against chunked prefill on (one run per --chunks value) and off.
      Target: decode-class p99 TPOT with chunking on <= 2x the baseline.

  bench/serving/run.py                    # everything (about 15-20 min on 2 busy cores)
  bench/serving/run.py --only a           # only (a)
  bench/serving/run.py --only b --chunks 16,64 --long-rate 0.15 --b-duration 90

Raw pd-bench JSON (and the /metrics step-histogram deltas) go to --out (default
bench/results/serving_<UTC date>/).
"""
import argparse
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import benchlib  # noqa: E402


def first_existing(*paths):
    for p in paths:
        if os.path.exists(p):
            return p
    return paths[0]


def uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def log(*a):
    print("[run.py]", *a, file=sys.stderr, flush=True)


class Server:
    def __init__(self, args, name, cfg_yaml, workdir):
        self.args, self.name = args, name
        self.cfg = os.path.join(workdir, f"{name}.yaml")
        with open(self.cfg, "w") as f:
            f.write(cfg_yaml)
        self.cmd = [args.serve, "--config", self.cfg, "-m", args.model, "-t", str(args.threads),
                    "--grpc-port", "0", "--http-port", "0"]
        self.errf = open(os.path.join(workdir, f"{name}.serve.log"), "w")
        self.p = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self.errf, text=True,
                                  cwd=ROOT)
        line = self.p.stdout.readline()  # blocks until ready (or exit)
        m = re.search(r"grpc=(\S+) http=(\S+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"pd-serve did not start: {line!r}; see {self.errf.name}")
        self.grpc, self.http = m.group(1), m.group(2)
        log(f"{name}: pd-serve pid {self.p.pid} grpc={self.grpc} http={self.http}")

    def metrics(self):
        with urllib.request.urlopen(self.http + "/metrics", timeout=30) as r:
            return r.read().decode()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.errf.close()


def parse_hist(text, name):
    """sum, count and cumulative buckets of a Prometheus histogram."""
    out = {"sum": 0.0, "count": 0.0, "buckets": {}}
    for line in text.splitlines():
        if line.startswith(name + "_sum "):
            out["sum"] = float(line.split()[-1])
        elif line.startswith(name + "_count "):
            out["count"] = float(line.split()[-1])
        elif line.startswith(name + "_bucket{"):
            le = re.search(r'le="([^"]+)"', line).group(1)
            out["buckets"][le] = float(line.split()[-1])
    return out


def hist_delta(before, after, name):
    b, a = parse_hist(before, name), parse_hist(after, name)
    d = {"sum_s": a["sum"] - b["sum"], "count": int(a["count"] - b["count"])}
    d["mean_ms"] = 1000 * d["sum_s"] / d["count"] if d["count"] else None
    # upper bucket bound holding the p50 / p99 (a coarse bound from the histogram)
    buckets = sorted(((float(le), a["buckets"][le] - b["buckets"].get(le, 0))
                      for le in a["buckets"]), key=lambda x: x[0])
    for q in (0.5, 0.99):
        key = f"p{int(q * 100)}_le_ms"
        d[key] = None
        for le, c in buckets:
            if d["count"] and c >= q * d["count"]:
                d[key] = le * 1000
                break
    return d


def serve_config(sched, ctx, kv_mib):
    lines = ["model:", f"  context: {ctx}", "scheduler:"]
    lines += [f"  {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in sched.items()]
    lines += ["kv:", f"  memory_mib: {kv_mib}", ""]
    return "\n".join(lines)


def run_scenario(args, name, sched, bench_args, outdir, workdir):
    cfg = serve_config(sched, args.ctx, args.kv_mib)
    load_before = uptime()
    srv = Server(args, name, cfg, workdir)
    try:
        # prime: one tiny request so the first measured step does not pay page faults
        subprocess.run([args.bench, "--api", "grpc", "--target", srv.grpc, "--prompt-tokens", "8",
                        "--output-tokens", "4", "-n", "1", "--no-progress"],
                       capture_output=True, text=True, check=True)
        m0 = srv.metrics()
        jpath = os.path.join(outdir, f"{name}.json")
        cmd = [args.bench, "--api", "grpc", "--target", srv.grpc, "--no-progress",
               "--json", jpath] + bench_args
        log(f"{name}: {' '.join(cmd)}")
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.time() - t0
        with open(os.path.join(outdir, f"{name}.txt"), "w") as f:
            f.write(r.stdout + r.stderr)
        if r.returncode != 0:
            raise RuntimeError(f"pd-bench failed ({r.returncode}): {r.stderr[-2000:]}")
        m1 = srv.metrics()
    finally:
        srv.stop()
    for tag, text in (("before", m0), ("after", m1)):
        with open(os.path.join(outdir, f"{name}.metrics_{tag}.txt"), "w") as f:
            f.write(text)
    with open(jpath) as f:
        res = json.load(f)
    res["_run"] = {
        "name": name, "server_config": cfg, "server_cmd": " ".join(srv.cmd),
        "bench_cmd": " ".join(cmd), "wall_s": wall, "uptime_before": load_before,
        "uptime_after": uptime(),
        "prefill_step": hist_delta(m0, m1, "pdserve_prefill_step_seconds"),
        "decode_step": hist_delta(m0, m1, "pdserve_decode_step_seconds"),
    }
    with open(jpath, "w") as f:
        json.dump(res, f, indent=1)
    log(f"{name}: done in {wall:.0f} s; {res['_run']['uptime_after']}")
    return res


g = benchlib.dig


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def main():
    date = datetime.datetime.utcnow().strftime("%Y-%m-%d")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--serve", default=first_existing(f"{ROOT}/build-fe/bin/pd-serve",
                                                      f"{ROOT}/build/bin/pd-serve"))
    ap.add_argument("--bench", default=first_existing(f"{ROOT}/build-bench/bin/pd-bench",
                                                      f"{ROOT}/build-fe/bin/pd-bench",
                                                      f"{ROOT}/build/bin/pd-bench"))
    ap.add_argument("--model", default=f"{ROOT}/models/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096, help="model.context (>= 2048 + 16 + BOS)")
    ap.add_argument("--kv-mib", type=int, default=512)
    ap.add_argument("--only", choices=["a", "b"])
    ap.add_argument("--concurrencies", default="1,4,8,16")
    ap.add_argument("--a-rounds", type=int, default=2, help="(a): requests = rounds x concurrency")
    ap.add_argument("--a-min-requests", type=int, default=6)
    ap.add_argument("--chunks", default="16,64", help="(b): prefill_chunk values, chunking on")
    ap.add_argument("--b-runs", help="(b): subset of baseline,chunk<N>,nochunk to run")
    ap.add_argument("--decode-streams", type=int, default=8)
    ap.add_argument("--long-rate", type=float, default=0.15)  # seed 1: 10 arrivals in 14.5-58.6 s
    ap.add_argument("--b-duration", type=float, default=75)
    ap.add_argument("--baseline-duration", type=float, default=90)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=f"{ROOT}/bench/results/serving_{date}")
    ap.add_argument("--suffix", default="", help="appended to every run name (reruns)")
    ap.add_argument("--tables", help="only print the tables of these runs' JSON files in --out "
                    "(comma-separated names, e.g. a_c1,a_c16,b_baseline,b_chunk16)")
    args = ap.parse_args()
    if args.tables:
        res = {}
        for n in args.tables.split(","):
            with open(os.path.join(args.out, n + ".json")) as f:
                res[n] = json.load(f)
        print_tables(res)
        return
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="pd_serving_")
    log(f"serve={args.serve} bench={args.bench} out={args.out} logs={workdir}")
    log(uptime())

    results = {}
    if args.only in (None, "a"):
        for c in [int(x) for x in args.concurrencies.split(",")]:
            name = f"a_c{c}{args.suffix}"
            sched = {"max_running_seqs": max(32, c), "token_budget": 512}
            bench = ["--concurrency", str(c), "--prompt-tokens", "32", "--output-tokens", "128",
                     "-n", str(max(args.a_rounds * c, args.a_min_requests)), "--warmup", str(c), "--seed", str(args.seed)]
            results[name] = run_scenario(args, name, sched, bench, args.out, workdir)
    if args.only in (None, "b"):
        ds = args.decode_streams
        decode = f"decode:prompt=64,output=256,concurrency={ds}"
        long_ = f"long:prompt=2048,output=16,rate={args.long_rate}"
        common = ["--seed", str(args.seed), "--timeout", "1200", "--save-requests"]
        runs = [("b_baseline", {"chunked_prefill": True, "prefill_chunk": 64},
                 ["--mix", decode, "--duration", str(args.baseline_duration)])]
        for ch in [int(x) for x in args.chunks.split(",")]:
            runs.append((f"b_chunk{ch}", {"chunked_prefill": True, "prefill_chunk": ch},
                         ["--mix", f"{decode};{long_}", "--duration", str(args.b_duration)]))
        runs.append(("b_nochunk", {"chunked_prefill": False, "prefill_chunk": 512},
                     ["--mix", f"{decode};{long_}", "--duration", str(args.b_duration)]))
        if args.b_runs:
            keep = set(args.b_runs.split(","))
            runs = [r for r in runs if r[0][2:] in keep]
        for name, extra, bench in runs:
            # token_budget = decode streams + one chunk: at most one prefill chunk per step
            chunk = extra["prefill_chunk"] if extra["chunked_prefill"] else 64
            sched = {"max_running_seqs": 16, "token_budget": max(16, ds + chunk), **extra}
            results[name + args.suffix] = run_scenario(args, name + args.suffix, sched,
                                                       bench + common, args.out, workdir)

    with open(os.path.join(args.out, f"summary{args.suffix}.json"), "w") as f:
        json.dump({k: {"overall": v["overall"], "classes": v.get("classes"), "_run": v["_run"]}
                   for k, v in results.items()}, f, indent=1)
    print_tables(results, args.suffix)


def print_tables(results, suffix=""):
    results = {(k[:-len(suffix)] if suffix and k.endswith(suffix) else k): v
               for k, v in results.items()}
    a = {k: v for k, v in results.items() if k.startswith("a_")}
    if a:
        base_key = next((k for k in a if k.startswith("a_c1") and not k.startswith("a_c16")), None)
        base = g(a.get(base_key), "overall", "output_throughput")
        print("\n### (a) decode throughput, prompt 32, output 128 (ignore_eos)\n")
        print("| streams | requests | output tok/s | x single | TPOT p50 ms | TPOT p99 ms | "
              "ITL p99 ms | TTFT p50 ms | mean decode step ms | load before |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for k, v in a.items():
            o, run = v["overall"], v["_run"]
            ratio = o["output_throughput"] / base if base else None
            print(f"| {k[3:]} | {o['completed']} | {fmt(o['output_throughput'])} | {fmt(ratio, 2)} "
                  f"| {fmt(g(o, 'tpot_ms', 'p50'))} | {fmt(g(o, 'tpot_ms', 'p99'))} "
                  f"| {fmt(g(o, 'itl_ms', 'p99'))} | {fmt(g(o, 'ttft_ms', 'p50'))} "
                  f"| {fmt(run['decode_step']['mean_ms'])} "
                  f"| {run['uptime_before'].split('load average:')[-1].strip()} |")
    b = {k: v for k, v in results.items() if k.startswith("b_")}
    if b:
        # the first baseline run listed is the reference
        base_key = next((k for k in b if k.startswith("b_baseline")), None)
        base = g(b.get(base_key), "classes", "decode", "tpot_ms", "p99")
        print("\n### (b) decode class (8 streams, prompt 64, output 256) with / without 2048-token "
              "prompts\n")
        print("| run | decode reqs | TPOT p50 ms | TPOT p99 ms | p99 / baseline | ITL p50 ms | "
              "ITL p99 ms | ITL max ms | decode tok/s | long reqs | long TTFT p50 ms | "
              "long TTFT max-ish (p99) ms | prefill steps (mean ms) | decode steps (mean ms) | "
              "wall s |")
        print("|" + "---|" * 15)
        for k, v in b.items():
            d = g(v, "classes", "decode") or v["overall"]
            lg = g(v, "classes", "long")
            run = v["_run"]
            p99 = g(d, "tpot_ms", "p99")
            ps, dstep = run["prefill_step"], run["decode_step"]
            print(f"| {k[2:]} | {d['completed']} | {fmt(g(d, 'tpot_ms', 'p50'))} | {fmt(p99)} "
                  f"| {fmt(p99 / base if base and p99 else None, 2)} "
                  f"| {fmt(g(d, 'itl_ms', 'p50'))} | {fmt(g(d, 'itl_ms', 'p99'))} "
                  f"| {fmt(g(d, 'itl_ms', 'max'))} | {fmt(d['output_throughput'])} "
                  f"| {lg['completed'] if lg else 0} | {fmt(g(lg, 'ttft_ms', 'p50'), 0)} "
                  f"| {fmt(g(lg, 'ttft_ms', 'p99'), 0)} "
                  f"| {ps['count']} ({fmt(ps['mean_ms'])}) | {dstep['count']} ({fmt(dstep['mean_ms'])}) "
                  f"| {run['wall_s']:.0f} |")


if __name__ == "__main__":
    main()
