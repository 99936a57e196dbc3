#!/usr/bin/env python3
"""Does disaggregation pay? The same workload against a P/D cluster and a colocated server.

Systems (both on this machine, both with the same generated config, model and seed):
  disaggregated  `pdctl up --prefill 1 --decode 1` in one of three layouts (--layout):
                 pinned (default): `--pin-cores`, the prefill node on one CPU, the decode node on
                   another, one engine thread each, the router unpinned
                 idle: `--prefill-idle --threads N` (N: the CPUs this script may use), both
                   nodes on every CPU, the prefill node under SCHED_IDLE (it runs when the
                   decode node leaves a CPU free)
                 shared: both nodes on every CPU at the same priority, N threads each
  colocated      `pd-serve -t 2`: one engine using both cores (no pinning)

Workload (pd-bench, streaming gRPC by default, Poisson arrivals, seeded, identical arrival times
and lengths for both systems at a given rate): a shared Poisson process split by weight into
  chat  prompt uniform 50-200 tokens, output uniform 64-128 tokens (weight 0.85)
  long  prompt uniform 2048-4096 tokens, output 16 tokens        (weight 0.15)
at each rate in --rates for --duration seconds, or longer so that --min-requests (50) arrive (no
new request after it; every request has --timeout seconds, a late one is a failure), once per
seed in --seeds (1,2,3); percentiles pool the seeds, with 95 % bootstrap intervals. Each (rate, system) run starts the system afresh,
primes it with one tiny request, snapshots /metrics, runs pd-bench, snapshots /metrics, stops it.
Runs are interleaved (rate 1 colocated, rate 1 disaggregated, rate 2 ...) so that a drift in the
machine's load hits both systems alike.

Reported per run: TTFT and TPOT p50 / p99 (over all requests, and per class in the JSON),
goodput = requests meeting the SLO per second of the arrival window (--duration), SLO
attainment = those requests / requests sent. The SLO (defaults below, printed with the results):
TTFT <= --slo-ttft-chat-ms for chat, <= --slo-ttft-long-ms for long prompts, TPOT <= --slo-tpot-ms
for every request. A system sustains a rate when it keeps up with it: >= --sustain-completed of
the requests sent complete (no error or timeout) and the chat requests' median TTFT stays within
their TTFT SLO (under overload the queue, and with it the median, runs away). Target (the
issue): at the highest rate both sustain, p99 TPOT disaggregated <= 0.5 x colocated, with goodput
no lower, and intervals that do not overlap.

Which path the cluster took is read from /metrics: the router's
pdserve_router_placements_total{role="prefill"} (0 = every request was prefilled by its decode
node, the colocated fallback of today) and every node metric whose name mentions kv transfer.

  bench/pd_vs_colocated/run.py            # the full run (<= 15 min on an idle 2-core machine)
  bench/pd_vs_colocated/run.py --quick    # smoke test (~2-3 min): 2 rates x 20 s, shorter longs
  bench/pd_vs_colocated/run.py --report-only --out bench/results/pd_vs_colocated_DATE
                                          # tables, plot and .md again from the saved raw JSON

Writes OUT.md (machine, command, workload, SLO, tables, verdict), OUT.png (p99 TPOT and goodput
against rate) and OUT/ (raw pd-bench JSON with the per-request records, /metrics snapshots,
daemon logs), OUT = bench/results/pd_vs_colocated_<UTC date>[_quick] unless --out is given.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import stats  # noqa: E402

# --layout: how the disaggregated system's two nodes share the machine's CPUs.
LAYOUTS = {"pinned": "pinned: one CPU each", "idle": "prefill under SCHED_IDLE, both on every CPU",
           "shared": "both on every CPU"}
SYSTEMS = ("colocated", "disaggregated")


def log(*a):
    print("[pd_vs_colocated]", *a, file=sys.stderr, flush=True)


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def load_avg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def cpus_allowed(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def threads_of(pid):
    """The process's --threads / -t argument (its engine threads) and its OS thread count."""
    out = {}
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
        for flag in ("--threads", "-t"):
            if flag in argv:
                out["engine_threads"] = argv[argv.index(flag) + 1]
        out["os_threads"] = len(os.listdir(f"/proc/{pid}/task"))
        # Field 41 of /proc/PID/stat (after the parenthesised name): the scheduling policy.
        policy = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[38])
        out["policy"] = {0: "normal", 3: "batch", 5: "idle"}.get(policy, str(policy))
    except (OSError, IndexError, ValueError):
        pass
    return out


def get_metrics(url):
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=30) as r:
            return r.read().decode()
    except OSError as e:
        log(f"cannot scrape {url}/metrics: {e}")
        return ""


def host_port(url):
    return re.sub(r"^https?://", "", url).rstrip("/")


def wait_for_file_match(path, pattern, proc, timeout):
    """Waits until the text of `path` matches `pattern` (re.S); returns the match or raises."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            text = ""
        m = re.search(pattern, text, re.S)
        if m:
            return m
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before it was ready: {text[-2000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"not ready after {timeout} s")


def stop(proc, timeout=60):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------------------------------
# The two systems. Each starts on free ports and exposes: target (for pd-bench), metrics URLs,
# the pinning it got, the exact command, stop().


class Colocated:
    name = "colocated"

    def __init__(self, args, cfg, rundir):
        self.cmd = [os.path.join(args.bin_dir, "pd-serve"), "--config", cfg, "-m", args.model,
                    "-t", str(args.colocated_threads), "--grpc-port", "0", "--http-port", "0"]
        self.out = os.path.join(rundir, "pd-serve.stdout")
        self.err = os.path.join(rundir, "pd-serve.log")
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = subprocess.Popen(self.cmd, stdout=o, stderr=e, cwd=ROOT)
        try:
            m = wait_for_file_match(self.out, r"ready: grpc=(\S+) http=(\S+)", self.proc,
                                    args.start_timeout)
        except RuntimeError as e:
            stop(self.proc)
            raise RuntimeError(f"pd-serve: {e}; see {self.err}") from None
        self.grpc, self.http = m.group(1), m.group(2)
        self.metric_urls = {"server": self.http}
        self.pinning = {"pd-serve": {"pid": self.proc.pid, "cpus": cpus_allowed(self.proc.pid),
                                     **threads_of(self.proc.pid)}}

    def target(self, api):
        return self.grpc if api == "grpc" else host_port(self.http)

    def stop(self):
        stop(self.proc)


class Disaggregated:
    name = "disaggregated"

    def __init__(self, args, cfg, rundir):
        self.cmd = [os.path.join(args.bin_dir, "pdctl"), "up", "--prefill", "1", "--decode", "1",
                    "--config", cfg, "--model", args.model, "--grpc-port", "0", "--http-port", "0",
                    "--log-dir", os.path.join(rundir, "logs"),
                    "--start-timeout", str(args.start_timeout)]
        if args.layout == "pinned":
            self.cmd.append("--pin-cores")
        elif args.layout == "idle":
            self.cmd.append("--prefill-idle")
        threads = args.node_threads or (0 if args.layout == "pinned" else
                                         len(os.sched_getaffinity(0)))
        if threads:
            self.cmd += ["--threads", str(threads)]
        self.out = os.path.join(rundir, "pdctl.stdout")
        self.err = os.path.join(rundir, "pdctl.log")
        with open(self.out, "w") as o, open(self.err, "w") as e:
            # A pipe nobody reads would block pdctl once full: files.
            self.proc = subprocess.Popen(self.cmd, stdout=o, stderr=e, cwd=ROOT)
        try:
            m = wait_for_file_match(
                self.out, r"pdctl up ready: grpc=(\S+) http=(\S+)\n(.*)\n\s+router\s+pid=(\d+)",
                self.proc, args.start_timeout + 30)
        except RuntimeError as e:
            stop(self.proc)
            raise RuntimeError(f"pdctl up: {e}; see {self.err}") from None
        self.grpc, self.http = m.group(1), m.group(2)
        self.metric_urls = {"router": self.http}
        self.pinning = {"router": {"pid": int(m.group(4)), "cpus": cpus_allowed(int(m.group(4)))}}
        for node in re.finditer(r"^\s+(prefill|decode)\s+(\S+)\s+pid=(\d+) grpc=(\S+) "
                                r"metrics=(\S+)/metrics", m.group(3), re.M):
            role, name, pid, url = node.group(1), node.group(2), int(node.group(3)), node.group(5)
            self.metric_urls[name] = url
            self.pinning[name] = {"role": role, "pid": pid, "cpus": cpus_allowed(pid),
                                  **threads_of(pid)}

    def target(self, api):
        return self.grpc if api == "grpc" else host_port(self.http)

    def stop(self):
        stop(self.proc)


# ---------------------------------------------------------------------------------------------


def write_config(args, path):
    """One config for every daemon of both systems: a context that holds the longest prompt plus
    its output, the same KV budget per engine, default scheduler otherwise."""
    text = "\n".join([
        "# written by bench/pd_vs_colocated/run.py; read by pd-serve, pd-prefill, pd-decode, "
        "pd-router",
        "model:", f"  context: {args.ctx}",
        "kv:", f"  memory_mib: {args.kv_mib}",
        "scheduler:", f"  max_running_seqs: {args.max_running_seqs}",
        f"  token_budget: {args.token_budget}", f"  prefill_chunk: {args.prefill_chunk}",
        "limits:", "  max_tokens: 4096",
        "shutdown_grace_s: 2"]
        + (["router:", f"  disaggregate_min_prompt: {args.disaggregate_min_prompt}"]
           if args.disaggregate_min_prompt is not None else []) + [""])
    with open(path, "w") as f:
        f.write(text)
    return text


def mix_spec(args):
    return (f"chat:prompt={args.chat_prompt},output={args.chat_output},weight={1 - args.long_frac};"
            f"long:prompt={args.long_prompt},output={args.long_output},weight={args.long_frac}")


def path_info(before, after):
    """Which path the cluster took, from the /metrics snapshots {source: text}."""
    router_b, router_a = before.get("router", ""), after.get("router", "")
    info = {
        "placements_prefill": stats.counter_delta(router_b, router_a,
                                                  "pdserve_router_placements_total",
                                                  {"role": "prefill"}),
        "placements_decode": stats.counter_delta(router_b, router_a,
                                                 "pdserve_router_placements_total",
                                                 {"role": "decode"}),
        "kv_transfer_metrics": {},
        "node_prefill_steps": {},
    }
    for src, text in after.items():
        if src == "router":
            continue
        info["node_prefill_steps"][src] = stats.counter_delta(
            before.get(src, ""), text, "pdserve_prefill_step_seconds_count")
        names = set()
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            name = re.split(r"[{ ]", line, 1)[0]
            if re.search(r"kv_?transfer|kvt_", name):
                names.add(name)
        for name in sorted(names):
            d = stats.counter_delta(before.get(src, ""), text, name)
            info["kv_transfer_metrics"][f"{src}:{name}"] = d
    moved = any(v > 0 for k, v in info["kv_transfer_metrics"].items()
                if k.endswith("_total") or k.endswith("_count"))
    if info["placements_prefill"] > 0 or moved:
        kv_bytes = sum(v for k, v in info["kv_transfer_metrics"].items()
                       if k.endswith("kv_transfer_bytes_total"))
        info["path"] = (f"disaggregated: {info['placements_prefill']:.0f} of "
                        f"{info['placements_decode']:.0f} requests prefilled on the prefill node"
                        + (f", {kv_bytes / 2**20:.0f} MiB of KV transferred" if kv_bytes else
                           ", KV transferred" if moved else ""))
    else:
        info["path"] = "colocated fallback: the decode node prefilled every request"
    return info


def window_s(args, rate):
    """The arrival window at `rate`: --duration, or longer so that about --min-requests arrive."""
    return max(args.duration, args.min_requests / rate if rate > 0 else 0.0)


def run_one(args, system_cls, rate, seed, cfg, outdir):
    name = f"{system_cls.name}_r{rate:g}_s{seed}"
    duration = window_s(args, rate)
    rundir = os.path.join(outdir, name)
    os.makedirs(rundir, exist_ok=True)
    load_before = load_avg()
    t_start = time.time()
    sysobj = system_cls(args, cfg, rundir)
    try:
        target = sysobj.target(args.api)
        subprocess.run([args.bench, "--api", args.api, "--target", target, "--prompt-tokens", "8",
                        "--output-tokens", "4", "-n", "1", "--no-progress"],
                       capture_output=True, text=True, check=True, timeout=120)
        before = {k: get_metrics(u) for k, u in sysobj.metric_urls.items()}
        jpath = os.path.join(rundir, "pd-bench.json")
        cmd = [args.bench, "--api", args.api, "--target", target, "--rate", f"{rate:g}",
               "--duration", f"{duration:g}", "--seed", str(seed), "--mix",
               mix_spec(args), "--timeout", f"{args.timeout:g}", "--no-progress",
               "--save-requests", "--json", jpath]
        log(f"{name}: {shlex.join(cmd)}")
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=duration + args.timeout + 120)
        wall = time.time() - t0
        with open(os.path.join(rundir, "pd-bench.txt"), "w") as f:
            f.write(r.stdout + r.stderr)
        after = {k: get_metrics(u) for k, u in sysobj.metric_urls.items()}
        if r.returncode != 0 and not os.path.exists(jpath):
            raise RuntimeError(f"pd-bench failed ({r.returncode}): {r.stderr[-2000:]}")
    finally:
        sysobj.stop()
    for k in before:
        for tag, snap in (("before", before), ("after", after)):
            with open(os.path.join(rundir, f"metrics_{k}_{tag}.txt"), "w") as f:
                f.write(snap.get(k, ""))
    with open(jpath) as f:
        res = json.load(f)
    res["_run"] = {
        "name": name, "system": system_cls.name, "rate": rate, "seed": seed,
        "duration": duration, "system_cmd": shlex.join(sysobj.cmd),
        "bench_cmd": shlex.join(cmd), "bench_wall_s": wall, "run_wall_s": time.time() - t_start,
        "load_before": load_before, "load_after": load_avg(), "pinning": sysobj.pinning,
        "path": path_info(before, after) if system_cls is Disaggregated else None,
    }
    with open(jpath, "w") as f:
        json.dump(res, f, indent=1)
    log(f"{name}: done in {wall:.0f} s (load {res['_run']['load_after']})")
    return res


# ---------------------------------------------------------------------------------------------
# Report


def slo_of(args):
    return stats.Slo(ttft_ms={"chat": args.slo_ttft_chat_ms, "long": args.slo_ttft_long_ms},
                     tpot_ms=args.slo_tpot_ms)


def fmt(x, nd=0):
    return "-" if x is None else f"{x:.{nd}f}"


def analyse(results, args):
    """{rate: {system: {"all": summary, "chat": ..., "long": ..., "_run": first run,
    "groups": [records of each seed's run], "window_s": arrival windows summed, "seeds": [...]}}},
    the summaries over the records of every seed's run pooled."""
    slo = slo_of(args)
    pooled = {}
    for res in results:
        run = res["_run"]
        window = float(run.get("duration") or res.get("config", {}).get("duration_s")
                       or args.duration)
        e = pooled.setdefault(run["rate"], {}).setdefault(
            run["system"], {"_run": run, "groups": [], "window_s": 0.0, "seeds": []})
        e["groups"].append(res.get("requests", []))
        e["window_s"] += window
        e["seeds"].append(run.get("seed", args.seed))
    for systems in pooled.values():
        for e in systems.values():
            recs = [r for g in e["groups"] for r in g]
            e["all"] = stats.summarize(recs, e["window_s"], slo)
            e["chat"] = stats.summarize(recs, e["window_s"], slo, {"chat"})
            e["long"] = stats.summarize(recs, e["window_s"], slo, {"long"})
    return pooled


def fmt_ci(ci, nd=0):
    return "-" if ci is None else f"[{ci[0]:.{nd}f}, {ci[1]:.{nd}f}]"


def report(by_rate, args, meta):
    slo = slo_of(args)
    verdict = stats.evaluate_target(by_rate, args.sustain_completed, args.slo_ttft_chat_ms)
    L = []
    L.append("| rate req/s | system | sent / ok | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
             "TPOT p99 ms | chat TPOT p99 ms | long TTFT p50 ms | goodput req/s | attainment | "
             "load before |")
    L.append("|" + "---|" * 12)
    for rate in sorted(by_rate):
        for s in SYSTEMS:
            if s not in by_rate[rate]:
                continue
            v = by_rate[rate][s]
            a, c, lg = v["all"], v["chat"], v["long"]
            L.append(f"| {rate:g} | {s} | {a['sent']} / {a['completed']} "
                     f"| {fmt(a['ttft_ms']['p50'])} | {fmt(a['ttft_ms']['p99'])} "
                     f"| {fmt(a['tpot_ms']['p50'], 1)} | {fmt(a['tpot_ms']['p99'], 1)} "
                     f"| {fmt(c['tpot_ms']['p99'], 1)} | {fmt(lg['ttft_ms']['p50'])} "
                     f"| {fmt(a['goodput'], 3)} | {fmt(100 * a['attainment'] if a['attainment'] is not None else None)} % "
                     f"| {v['_run']['load_before']} |")
    table = "\n".join(L)
    L = ["| rate req/s | p99 TPOT colocated ms | p99 TPOT disaggregated ms | ratio (target <= 0.5) "
         "| goodput colocated | goodput disaggregated | both sustain | cluster path |",
         "|" + "---|" * 8]
    for rate in sorted(by_rate):
        d = by_rate[rate]
        c, g = d.get("colocated", {}).get("all"), d.get("disaggregated", {}).get("all")
        if not c or not g:
            continue
        both = all(stats.sustains(d[s], args.sustain_completed, args.slo_ttft_chat_ms)
                   for s in SYSTEMS)
        path = (d["disaggregated"]["_run"].get("path") or {}).get("path", "?")
        L.append(f"| {rate:g} | {fmt(c['tpot_ms']['p99'], 1)} | {fmt(g['tpot_ms']['p99'], 1)} "
                 f"| {fmt(stats.ratio(g['tpot_ms']['p99'], c['tpot_ms']['p99']), 2)} "
                 f"| {fmt(c['goodput'], 3)} | {fmt(g['goodput'], 3)} | {'yes' if both else 'no'} "
                 f"| {path} |")
    L.append("")
    L.append("95 % bootstrap intervals (requests resampled within each seed's run, the two "
             "systems independently):")
    L.append("")
    L.append("| rate req/s | seeds | requests coloc / disagg | p99 TPOT colocated ms | "
             "p99 TPOT disaggregated ms | ratio [95 % CI] | goodput colocated | "
             "goodput disaggregated |")
    L.append("|" + "---|" * 8)
    cis = {}
    for rate in sorted(by_rate):
        d = by_rate[rate]
        if not all(s in d for s in SYSTEMS):
            continue
        e = stats.evaluate_target_ci({s: d[s]["groups"] for s in SYSTEMS}, slo,
                                     d["colocated"]["window_s"], rate)
        cis[rate] = e
        L.append(f"| {rate:g} | {e['seeds']} | {d['colocated']['all']['sent']} / "
                 f"{d['disaggregated']['all']['sent']} "
                 f"| {fmt(e['tpot_p99_colocated'], 1)} {fmt_ci(e['tpot_p99_colocated_ci'], 1)} "
                 f"| {fmt(e['tpot_p99_disaggregated'], 1)} "
                 f"{fmt_ci(e['tpot_p99_disaggregated_ci'], 1)} "
                 f"| {fmt(e['tpot_p99_ratio'], 2)} {fmt_ci(e['tpot_p99_ratio_ci'], 2)} "
                 f"| {fmt(e['goodput_colocated'], 3)} {fmt_ci(e['goodput_colocated_ci'], 3)} "
                 f"| {fmt(e['goodput_disaggregated'], 3)} "
                 f"{fmt_ci(e['goodput_disaggregated_ci'], 3)} |")
    ratios = "\n".join(L)
    if verdict["rate"] is not None and verdict["rate"] in cis:
        e = cis[verdict["rate"]]
        verdict["ci"] = e
        verdict["tpot_point_ok"] = verdict["tpot_ok"]
        verdict["met"] = bool(e["met"])
        verdict["tpot_ok"] = bool(e["tpot_ok"])
    if verdict["rate"] is None:
        v = ("**No rate is sustained by both systems**: the target cannot be evaluated; "
             "lower the rates.")
    else:
        v = ("Highest rate both sustain: "
             f"**{verdict['rate']:g} req/s**. p99 TPOT disaggregated / colocated = "
             f"**{fmt(verdict['tpot_p99_ratio'], 2)}** (point estimate <= 0.5: "
             f"{'yes' if verdict.get('tpot_point_ok', verdict['tpot_ok']) else 'no'}); "
             "goodput disaggregated "
             f"{fmt(verdict['goodput_disaggregated'], 3)} vs colocated "
             f"{fmt(verdict['goodput_colocated'], 3)} req/s (no lower: "
             f"{'met' if verdict['goodput_ok'] else 'missed'}). "
             + (f"With intervals: disaggregated p99 TPOT "
                f"{fmt_ci(verdict['ci']['tpot_p99_disaggregated_ci'], 1)} ms vs 0.5 x colocated "
                f"{fmt_ci(tuple(0.5 * x for x in verdict['ci']['tpot_p99_colocated_ci']), 1)} ms "
                f"({'no overlap' if verdict['ci']['tpot_ok'] else 'not separated'}), ratio 95 % CI "
                f"{fmt_ci(verdict['ci']['tpot_p99_ratio_ci'], 2)}, over "
                f"{verdict['ci']['seeds']} seed(s). "
                if verdict.get("ci") and verdict["ci"]["tpot_p99_colocated_ci"] else "")
             + f"**Target {'MET' if verdict['met'] else 'NOT MET'}.**")
    return table, ratios, v, verdict, slo.describe()


def plot(by_rate, args, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install -r requirements-dev.txt): no plot")
        return False
    rates = sorted(by_rate)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for s, style in (("colocated", "o-"), ("disaggregated", "s-")):
        xs = [r for r in rates if s in by_rate[r] and by_rate[r][s]["all"]["tpot_ms"]["p99"]]
        ax1.plot(xs, [by_rate[r][s]["all"]["tpot_ms"]["p99"] for r in xs], style, label=s)
        xg = [r for r in rates if s in by_rate[r] and by_rate[r][s]["all"]["goodput"] is not None]
        ax2.plot(xg, [by_rate[r][s]["all"]["goodput"] for r in xg], style, label=s)
    xc = [r for r in rates if "colocated" in by_rate[r]
          and by_rate[r]["colocated"]["all"]["tpot_ms"]["p99"]]
    ax1.plot(xc, [0.5 * by_rate[r]["colocated"]["all"]["tpot_ms"]["p99"] for r in xc], "k:",
             label="0.5 x colocated (target)")
    ax1.axhline(args.slo_tpot_ms, color="r", lw=0.8, ls="--", label=f"TPOT SLO {args.slo_tpot_ms:g} ms")
    ax1.set_xlabel("arrival rate (req/s)")
    ax1.set_ylabel("p99 TPOT (ms)")
    ax1.set_title("p99 TPOT against rate")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.plot(rates, rates, color="grey", lw=0.8, ls="--", label="offered rate")
    ax1.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel("arrival rate (req/s)")
    ax2.set_ylabel("goodput (req/s meeting the SLO)")
    ax2.set_title("goodput against rate")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle(f"pdctl up --prefill 1 --decode 1 ({LAYOUTS[args.layout]}) vs pd-serve -t 2 "
                 f"({platform.node()}, {meta_date()})", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def meta_date():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def machine_info():
    return {
        "nproc": sh("nproc"),
        "cpu_model": sh("lscpu | grep -m1 'Model name' | sed 's/.*: *//'"),
        "lscpu": sh("lscpu | head -20 | grep -v '^Flags'"),
        "kernel": platform.release(),
        "git": sh(f"git -C {shlex.quote(ROOT)} rev-parse --short HEAD") + (
            " (dirty)" if sh(f"git -C {shlex.quote(ROOT)} status --porcelain -uno") else ""),
    }


def write_markdown(path, by_rate, args, meta, png_ok):
    table, ratios, verdict_line, verdict, slo_text = report(by_rate, args, meta)
    paths = sorted({(v["disaggregated"]["_run"].get("path") or {}).get("path", "?")
                    for v in by_rate.values() if "disaggregated" in v})
    pins = {}
    for v in by_rate.values():
        for s in SYSTEMS:
            if s in v:
                pins.setdefault(s, v[s]["_run"]["pinning"])
    md = [f"# Disaggregated (1 prefill + 1 decode, {LAYOUTS[args.layout]}) vs colocated pd-serve "
          f"({meta['date']})",
          "", verdict_line, "",
          *(["**Smoke-test configuration (`--quick`): too few requests per run to conclude "
             "anything.**", ""] if meta.get("args", {}).get("quick") else []),
          f"Cluster path seen in /metrics: {'; '.join(paths) or '?'}.",
          "", f"![p99 TPOT and goodput against rate]({os.path.basename(args.out)}.png)"
          if png_ok else "(no plot: matplotlib missing)", "",
          "## Command", "", "```sh", meta["command"], "```", "",
          "## Machine", "",
          f"nproc {meta['machine']['nproc']}, {meta['machine']['cpu_model']}, kernel "
          f"{meta['machine']['kernel']}, tree {meta['machine']['git']}; load average before "
          f"{meta['load_before']}, after {meta['load_after']}; wall {meta['wall_s']:.0f} s.",
          "", "```", meta["machine"]["lscpu"], "```", "",
          "Pinning and engine threads (from /proc, first run of each system): "
          f"`{json.dumps(pins)}`", "",
          "## Workload and SLO", "",
          f"pd-bench `--api {args.api} --mix \"{mix_spec(args)}\" --rate R --duration "
          f"max({args.duration:g}, {args.min_requests}/R) --seed S --timeout {args.timeout:g}` "
          f"for each seed S in {args.seeds}: one Poisson "
          "process split by weight, the same arrival times and lengths for both systems at each "
          "rate; every request streamed with `ignore_eos`. Config for every daemon:", "",
          "```yaml", meta["config"].strip(), "```", "",
          f"SLO: {slo_text}. Goodput = requests meeting it / the arrival windows (summed over "
          f"seeds); attainment = those / requests sent (failed and timed-out requests count "
          f"as missing it). A system sustains a rate when >= "
          f"{100 * args.sustain_completed:.0f} % of the requests sent complete and the chat "
          f"requests' median TTFT is <= {args.slo_ttft_chat_ms:g} ms (it keeps up; latency "
          "aside). TPOT = (E2E - TTFT) / (output tokens - 1) per "
          "request; percentiles over requests, linear interpolation.", "",
          "## Results", "", table, "", ratios, "",
          "Raw pd-bench JSON (per-request records), /metrics snapshots and daemon logs: "
          f"`{os.path.relpath(args.out, ROOT)}/`. Percentiles pool every seed's requests; "
          "the intervals are 95 % percentile-bootstrap intervals (2,000 resamples, requests "
          "resampled within each seed's run). With few requests a p99 is close to the maximum "
          "and its interval is wide: the target counts as met only when the intervals separate.",
          ""]
    with open(path, "w") as f:
        f.write("\n".join(md))
    return verdict, table, ratios, verdict_line


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bin-dir", default=os.environ.get("PD_BIN_DIR", f"{ROOT}/build/bin"),
                    help="pdctl, pd-serve, pd-router, pd-prefill, pd-decode (default $PD_BIN_DIR "
                    "or build/bin)")
    ap.add_argument("--bench", help="pd-bench binary (default: BIN_DIR/pd-bench)")
    ap.add_argument("--model", default=f"{ROOT}/models/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--api", choices=["grpc", "http"], default="grpc")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: rates 0.1,0.25, 20 s each, long prompts 2048-2560, "
                    "timeout 40")
    ap.add_argument("--rates", help="req/s, comma-separated (default 0.08,0.12,0.16,0.2)")
    ap.add_argument("--duration", type=float, help="arrival window per run in s (default 65)")
    ap.add_argument("--timeout", type=float, help="per request, s (default 75)")
    ap.add_argument("--seed", type=int, default=1, help="the seed of runs saved without one")
    ap.add_argument("--seeds", default=None,
                    help="pd-bench seeds: every (rate, system) runs once per seed, the records "
                    "are pooled, and intervals resample within each seed's run (default 1,2,3; "
                    "--quick: 1)")
    ap.add_argument("--min-requests", type=int, default=None,
                    help="arrival window per run at least this many / rate seconds (default 50; "
                    "--quick: 0)")
    ap.add_argument("--long-frac", type=float, default=0.15, help="share of long prompts")
    ap.add_argument("--chat-prompt", default="uniform:50:200")
    ap.add_argument("--chat-output", default="uniform:64:128")
    ap.add_argument("--long-prompt", help="default uniform:2048:4096")
    ap.add_argument("--long-output", default="16")
    ap.add_argument("--ctx", type=int, default=4352, help="model.context (>= longest prompt + "
                    "BOS + its output)")
    ap.add_argument("--kv-mib", type=int, default=512, help="kv.memory_mib per engine")
    ap.add_argument("--max-running-seqs", type=int, default=32)
    ap.add_argument("--token-budget", type=int, default=512)
    ap.add_argument("--prefill-chunk", type=int, default=256,
                    help="half the token budget: a chat prompt can share a step with a long "
                    "prompt's chunk instead of waiting for its whole prefill")
    ap.add_argument("--disaggregate-min-prompt", type=int, default=None,
                    help="router.disaggregate_min_prompt for the cluster: shorter prompts are "
                    "prefilled by the decode node itself (0: every prompt on the prefill node; "
                    "default: the config's default, 512)")
    ap.add_argument("--colocated-threads", type=int, default=2)
    ap.add_argument("--node-threads", type=int, default=0,
                    help="--threads for pdctl up (0: 1 with --layout pinned, else one per CPU this "
                    "script may use)")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="pinned",
                    help="where the cluster's nodes run (module docstring)")
    ap.add_argument("--no-pin-cores", dest="layout", action="store_const", const="shared",
                    help="the same as --layout shared")
    ap.add_argument("--systems", default="colocated,disaggregated")
    ap.add_argument("--slo-ttft-chat-ms", type=float, default=3000)
    ap.add_argument("--slo-ttft-long-ms", type=float, default=60000)
    ap.add_argument("--slo-tpot-ms", type=float, default=150)
    ap.add_argument("--sustain-completed", type=float, default=0.95,
                    help="share of requests that must complete for a rate to be sustained")
    ap.add_argument("--start-timeout", type=float, default=120)
    ap.add_argument("--out", help="output prefix (default bench/results/pd_vs_colocated_<date>"
                    "[_quick])")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild OUT.md / OUT.png from OUT/*/pd-bench.json")
    args = ap.parse_args()
    q = args.quick
    args.rates = args.rates or ("0.1,0.25" if q else "0.08,0.12,0.16,0.2")
    args.duration = args.duration or (20.0 if q else 65.0)
    args.seeds = args.seeds or ("1" if q else "1,2,3")
    args.min_requests = args.min_requests if args.min_requests is not None else (0 if q else 50)
    args.timeout = args.timeout or (40.0 if q else 75.0)
    args.long_prompt = args.long_prompt or ("uniform:2048:2560" if q else "uniform:2048:4096")
    args.bench = args.bench or os.path.join(args.bin_dir, "pd-bench")
    date = meta_date()
    args.out = os.path.abspath(args.out or os.path.join(
        ROOT, "bench", "results", f"pd_vs_colocated_{date}{'_quick' if q else ''}"))
    os.makedirs(args.out, exist_ok=True)
    cfg = os.path.join(args.out, "config.yaml")
    meta_path = os.path.join(args.out, "meta.json")

    if args.report_only:
        with open(meta_path) as f:
            meta = json.load(f)
        # The workload as run; the SLO and --sustain-completed as given now (re-evaluation).
        for k in ("api", "rates", "duration", "timeout", "seed", "seeds", "min_requests",
                  "long_frac", "chat_prompt",
                  "chat_output", "long_prompt", "long_output"):
            if k in meta.get("args", {}):
                setattr(args, k, meta["args"][k])
        results = []
        for p in sorted(glob.glob(os.path.join(args.out, "*", "pd-bench.json"))):
            with open(p) as f:
                res = json.load(f)
            snaps = {}  # the path again from the saved /metrics (the rule may have changed)
            for m in glob.glob(os.path.join(os.path.dirname(p), "metrics_*_*.txt")):
                src, tag = os.path.basename(m)[len("metrics_"):-len(".txt")].rsplit("_", 1)
                with open(m) as f:
                    snaps.setdefault(tag, {})[src] = f.read()
            if res["_run"].get("system") == "disaggregated" and "router" in snaps.get("after", {}):
                res["_run"]["path"] = path_info(snaps.get("before", {}), snaps["after"])
            results.append(res)
    else:
        for b in ["pdctl", "pd-serve", "pd-router", "pd-prefill", "pd-decode"]:
            if not os.access(os.path.join(args.bin_dir, b), os.X_OK):
                sys.exit(f"{args.bin_dir}/{b} not found: build it or pass --bin-dir")
        if not os.access(args.bench, os.X_OK):
            sys.exit(f"{args.bench} not found: build pd-bench or pass --bench")
        argv0 = [os.path.relpath(sys.argv[0], ROOT)]
        if os.path.abspath(sys.executable).startswith(ROOT + os.sep):
            argv0.insert(0, os.path.relpath(sys.executable, ROOT))
        meta = {"date": date, "command": shlex.join(argv0 + sys.argv[1:]),
                "machine": machine_info(), "load_before": load_avg(),
                "config": write_config(args, cfg), "args": vars(args)}
        log(f"out={args.out} bin={args.bin_dir} load {meta['load_before']}")
        systems = {"colocated": Colocated, "disaggregated": Disaggregated}
        wanted = [systems[s] for s in args.systems.split(",")]
        t0 = time.time()
        results = []
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        for seed in seeds:
            for rate in [float(x) for x in args.rates.split(",")]:
                for cls in wanted:
                    results.append(run_one(args, cls, rate, seed, cfg, args.out))
        meta.update(load_after=load_avg(), wall_s=time.time() - t0)
        with open(meta_path, "w") as f:
            json.dump(meta, f, indent=1)
    by_rate = analyse(results, args)
    png_ok = plot(by_rate, args, args.out + ".png")
    verdict, table, ratios, line = write_markdown(args.out + ".md", by_rate, args, meta, png_ok)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"verdict": verdict, "slo": slo_of(args).describe(),
                   "by_rate": {f"{r:g}": {s: {k: v[k] for k in ("all", "chat", "long")}
                                          for s, v in d.items()} for r, d in by_rate.items()}},
                  f, indent=1)
    print(table + "\n\n" + ratios + "\n\n" + line)
    print(f"\nwrote {args.out}.md" + (f", {args.out}.png" if png_ok else "") + f", {args.out}/")


if __name__ == "__main__":
    main()
