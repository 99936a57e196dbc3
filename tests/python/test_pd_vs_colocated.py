"""bench/pd_vs_colocated: its statistics (percentiles, goodput under per-class SLOs, the highest
rate both systems sustain, the issue's target), its report from saved pd-bench JSON, and the
`pdctl up --pin-cores` it relies on (a real cluster on a synthetic model: every node on one CPU of
its own, round robin, prefill first; the router unpinned). The benchmark itself takes minutes
and is not run here (bench/pd_vs_colocated/run.py --quick).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "bench" / "pd_vs_colocated"))

import stats  # noqa: E402


def rec(cls="chat", ok=True, ttft=0.5, tpot=0.05, error=None):
    r = {"class": cls, "ok": ok, "ttft_s": ttft if ok else None, "tpot_s": tpot if ok else None}
    if not ok:
        r["error"] = error or "timeout"
    return r


def test_percentile_interpolates_like_numpy():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert stats.percentile(xs, 0.5) == 3.0
    assert stats.percentile(xs, 0.0) == 1.0
    assert stats.percentile(xs, 1.0) == 5.0
    assert stats.percentile(xs, 0.99) == pytest.approx(4.96)  # rank 3.96
    assert stats.percentile([1.0, 2.0], 0.25) == pytest.approx(1.25)
    assert stats.percentile([7.0], 0.99) == 7.0
    assert stats.percentile([], 0.5) is None
    assert stats.percentile([None, 2.0], 0.5) == 2.0
    with pytest.raises(ValueError):
        stats.percentile([1.0], 1.5)


def test_slo_per_class_ttft_and_tpot_for_all():
    slo = stats.Slo(ttft_ms={"chat": 1000, "long": 20000}, tpot_ms=100)
    assert stats.meets_slo(rec("chat", ttft=0.9, tpot=0.09), slo)
    assert not stats.meets_slo(rec("chat", ttft=1.1, tpot=0.05), slo)
    assert stats.meets_slo(rec("long", ttft=15.0, tpot=0.05), slo)
    assert not stats.meets_slo(rec("long", ttft=15.0, tpot=0.101), slo)
    assert stats.meets_slo(rec("chat", ttft=0.5, tpot=None), slo)  # one token: no TPOT
    assert not stats.meets_slo(rec(ok=False), slo)
    assert stats.meets_slo(rec("other", ttft=99.0), slo)  # no objective for the class
    assert not stats.meets_slo(rec("other", ttft=2.0), stats.Slo(default_ttft_ms=1000))
    assert "TTFT <= 1000 ms (chat)" in slo.describe() and "TPOT <= 100 ms" in slo.describe()


def test_summarize_counts_failures_against_goodput():
    slo = stats.Slo(ttft_ms={"chat": 1000}, tpot_ms=100)
    recs = [rec(ttft=0.1 * i, tpot=0.01 * i) for i in range(1, 11)]  # TTFT 0.1..1.0, TPOT 10..100
    recs += [rec(ttft=2.0), rec(ok=False, error="DEADLINE_EXCEEDED"), rec("long", ttft=30.0)]
    s = stats.summarize(recs, 20.0, slo, {"chat"})
    assert (s["sent"], s["completed"], s["failed"]) == (12, 11, 1)
    assert s["errors"] == {"DEADLINE_EXCEEDED": 1}
    assert s["good"] == 10  # the 2 s TTFT and the failure miss
    assert s["goodput"] == pytest.approx(0.5)
    assert s["attainment"] == pytest.approx(10 / 12)
    assert s["throughput"] == pytest.approx(11 / 20)
    assert s["tpot_ms"]["n"] == 11
    assert s["ttft_ms"]["p50"] == pytest.approx(600.0)
    assert s["ttft_ms"]["p99"] == pytest.approx(1000 + 0.9 * 1000)  # rank 9.9 of 11 values
    all_ = stats.summarize(recs, 20.0, slo)
    assert all_["sent"] == 13 and all_["good"] == 11  # long: no TTFT objective, TPOT fine
    empty = stats.summarize([], 20.0, slo)
    assert empty["attainment"] is None and empty["tpot_ms"]["p99"] is None


def run_of(p99_tpot, goodput, completed=10, sent=10, chat_ttft_p50=500.0):
    a = {"sent": sent, "completed": completed, "goodput": goodput, "tpot_ms": {"p99": p99_tpot}}
    return {"all": a, "chat": {"ttft_ms": {"p50": chat_ttft_p50}}}


def test_sustains_means_keeping_up():
    assert stats.sustains(run_of(100, 0.1), 0.95, 3000)
    assert not stats.sustains(run_of(100, 0.1, completed=9), 0.95, 3000)  # a timeout
    assert not stats.sustains(run_of(100, 0.1, chat_ttft_p50=3500), 0.95, 3000)  # queue grows
    assert not stats.sustains(run_of(100, 0, completed=0, sent=0), 0.5, 3000)
    assert not stats.sustains(run_of(100, 0.1, chat_ttft_p50=None), 0.95, 3000)


def test_highest_common_rate_and_target():
    by_rate = {
        0.1: {"colocated": run_of(200, 0.1), "disaggregated": run_of(80, 0.1)},
        0.2: {"colocated": run_of(300, 0.19), "disaggregated": run_of(120, 0.19)},
        0.3: {"colocated": run_of(900, 0.1, chat_ttft_p50=9000),
              "disaggregated": run_of(140, 0.28)},
    }
    assert stats.highest_common_rate(by_rate, 0.95, 3000) == 0.2
    v = stats.evaluate_target(by_rate, 0.95, 3000)
    assert v["rate"] == 0.2 and v["tpot_p99_ratio"] == pytest.approx(0.4)
    assert v["tpot_ok"] and v["goodput_ok"] and v["met"]
    by_rate[0.2]["disaggregated"]["all"]["goodput"] = 0.18  # lower goodput: missed
    assert stats.evaluate_target(by_rate, 0.95, 3000)["met"] is False
    by_rate[0.2]["disaggregated"]["all"].update(goodput=0.19, tpot_ms={"p99": 160})  # 0.53
    assert stats.evaluate_target(by_rate, 0.95, 3000)["tpot_ok"] is False
    assert stats.highest_common_rate(by_rate, 0.95, 100) is None
    assert stats.evaluate_target(by_rate, 0.95, 100)["met"] is None


def test_bootstrap_interval_covers_the_quantile_and_narrows_with_data():
    import random
    rng = random.Random(4)
    small = [[rng.expovariate(1.0) for _ in range(20)] for _ in range(3)]
    big = [[rng.expovariate(1.0) for _ in range(2000)] for _ in range(3)]
    med = lambda xs: stats.percentile(xs, 0.5)  # noqa: E731
    lo_s, hi_s = stats.bootstrap_ci(small, med, n_boot=500)
    lo_b, hi_b = stats.bootstrap_ci(big, med, n_boot=500)
    true_median = 0.6931  # ln 2 for Exp(1)
    assert lo_b < true_median < hi_b
    assert hi_b - lo_b < (hi_s - lo_s) / 4  # 100x the data: about 10x narrower
    assert stats.bootstrap_ci(small, med, n_boot=500) == (lo_s, hi_s)  # seeded: reproducible
    assert stats.bootstrap_ci([[1.0] * 10], med) == (1.0, 1.0)
    assert stats.bootstrap_ci([[], []], med) is None
    assert stats.bootstrap_ci([[1.0]], lambda xs: None) is None


def test_bootstrap_resamples_within_each_seed():
    # Two seeds' runs, one on a slower machine: every resample keeps 10 of each, so the median
    # of the pooled records can never leave the gap between them.
    groups = [[1.0] * 10, [5.0] * 10]
    lo, hi = stats.bootstrap_ci(groups, lambda xs: sum(xs) / len(xs), n_boot=300)
    assert lo == hi == 3.0


def test_target_with_intervals_needs_separation():
    import random
    rng = random.Random(1)
    slo = stats.Slo(tpot_ms=1000)

    def runs(mean_tpot_s, n, seeds=3):
        return [[rec(tpot=rng.gauss(mean_tpot_s, 0.1 * mean_tpot_s)) for _ in range(n)]
                for _ in range(seeds)]
    # 3 x 60 requests per system, disaggregated TPOT a third of colocated: separated, met.
    clear = {"colocated": runs(0.090, 60), "disaggregated": runs(0.030, 60)}
    v = stats.evaluate_target_ci(clear, slo, 3 * 60.0, 0.2, n_boot=400)
    assert v["seeds"] == 3
    assert v["tpot_ok"] and v["goodput_ok"] and v["met"]
    lo, hi = v["tpot_p99_ratio_ci"]
    assert lo < v["tpot_p99_ratio"] < hi < 0.5
    # One outlier among 12 colocated requests makes a 0.45 point ratio: not separated.
    few_c = [[rec(tpot=0.02) for _ in range(11)] + [rec(tpot=0.105)]]
    few_d = [[rec(tpot=0.035 + 0.001 * i) for i in range(12)]]
    v = stats.evaluate_target_ci({"colocated": few_c, "disaggregated": few_d}, slo, 60.0, 0.2,
                                 n_boot=400)
    assert v["tpot_p99_ratio"] < 0.5
    assert not v["tpot_ok"] and not v["met"]
    # Lower goodput: missed even when TPOT separates.
    strict = stats.Slo(ttft_ms={"chat": 400})
    slow = {"colocated": [[rec(tpot=0.09, ttft=0.2)] * 60 for _ in range(3)],
            "disaggregated": [[rec(tpot=0.03, ttft=0.5)] * 60 for _ in range(3)]}
    v = stats.evaluate_target_ci(slow, strict, 180.0, 0.2, n_boot=200)
    assert v["goodput_disaggregated"] == 0.0 and not v["goodput_ok"] and not v["met"]


def test_counter_delta_sums_matching_labels():
    before = ('# TYPE pdserve_router_placements_total counter\n'
              'pdserve_router_placements_total{node="d0",role="decode"} 3\n')
    after = ('pdserve_router_placements_total{node="d0",role="decode"} 10\n'
             'pdserve_router_placements_total{node="p0",role="prefill"} 4\n'
             'pdserve_router_placements_total_other 99\n')
    name = "pdserve_router_placements_total"
    assert stats.counter_delta(before, after, name, {"role": "decode"}) == 7
    assert stats.counter_delta(before, after, name, {"role": "prefill"}) == 4
    assert stats.counter_delta(before, after, name) == 11
    assert stats.counter_delta("", "", "nothing") == 0


def fake_run(system, rate, tpots, ttft=0.5):
    reqs = [{"id": i, "class": "chat", "ok": True, "ttft_s": ttft, "tpot_s": t}
            for i, t in enumerate(tpots)]
    return {"config": {"duration_s": 10}, "requests": reqs, "_run": {
        "name": f"{system}_r{rate:g}", "system": system, "rate": rate, "load_before": "0.1 0.1 0.1",
        "pinning": {}, "path": {"path": "colocated fallback"} if system == "disaggregated" else None}}


def test_report_from_saved_runs(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO_ROOT / "bench" / "pd_vs_colocated"))
    import run as bench_run
    out = tmp_path / "res"
    for system, rate, tpots in (("colocated", 0.1, [0.1] * 5), ("disaggregated", 0.1, [0.04] * 5),
                                ("colocated", 0.2, [0.3] * 5), ("disaggregated", 0.2, [0.05] * 5)):
        d = out / f"{system}_r{rate:g}"
        d.mkdir(parents=True)
        (d / "pd-bench.json").write_text(json.dumps(fake_run(system, rate, tpots)))
    meta = {"date": "2026-01-01", "command": "run.py", "load_before": "0", "load_after": "0",
            "wall_s": 1.0, "config": "model: {}",
            "machine": {"nproc": "2", "cpu_model": "x", "lscpu": "", "kernel": "k", "git": "g"},
            "args": {"duration": 10.0}}
    (out / "meta.json").write_text(json.dumps(meta))
    monkeypatch.setattr(sys, "argv", ["run.py", "--report-only", "--out", str(out),
                                      "--slo-tpot-ms", "200"])
    bench_run.main()
    md = (tmp_path / "res.md").read_text()
    # both keep up at both rates; at 0.2 colocated misses TPOT <= 200 ms on every request
    assert "Highest rate both sustain: **0.2 req/s**" in md
    assert "**0.17**" in md and "Target MET" in md
    assert re.search(r"\| 0.2 \| colocated \| 5 / 5 \| 500 \| 500 \| 300.0 \| 300.0 \| "
                     r"300.0 \| - \| 0.000 \| 0 % \|", md)
    assert re.search(r"\| 0.1 \| 100.0 \| 40.0 \| 0.40 \| 0.500 \| 0.500 \| yes \|", md)
    summary_json = json.loads((out / "summary.json").read_text())
    assert summary_json["verdict"]["rate"] == 0.2
    # matplotlib is in requirements-dev.txt: the plot is always drawn.
    assert (tmp_path / "res.png").stat().st_size > 1000


@contextlib.contextmanager
def pdctl_up(pdctl, tmp_path, *flags):
    """A running `pdctl up FLAGS` on loopback: yields (stdout text once ready, stderr path) and
    stops it with SIGTERM after, asserting a clean exit."""
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [str(pdctl), "up", *flags, "--grpc-port", "0", "--http-port", "0", "--log-dir",
             str(tmp_path / "logs")], stdout=o, stderr=e)
    try:
        end = time.time() + 120
        while "router  pid=" not in out.read_text():
            assert proc.poll() is None, err.read_text()
            assert time.time() < end, "pdctl up did not get ready"
            time.sleep(0.2)
        yield out.read_text(), err
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


def nodes_of(text):
    """(role, name, pid) of each node in pdctl up's ready lines."""
    return re.findall(r"^\s+(prefill|decode)\s+(\S+)\s+pid=(\d+)", text, re.M)


def test_pdctl_up_pin_cores(pdctl, synth_model, tmp_path):
    help_text = subprocess.run([str(pdctl), "up", "--help"], capture_output=True,
                               text=True).stdout
    assert "--pin-cores" in help_text, f"{pdctl} up --help lists no --pin-cores"
    cpus = sorted(os.sched_getaffinity(0))
    with pdctl_up(pdctl, tmp_path, "--prefill", "1", "--decode", "2", "--pin-cores", "-m",
                  str(synth_model("llama2_f32"))) as (text, err):
        nodes = nodes_of(text)
        assert [n[1] for n in nodes] == ["p0", "d0", "d1"]

        def allowed(pid):
            status = Path(f"/proc/{pid}/status").read_text()
            return re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)

        for i, (_, name, pid) in enumerate(nodes):
            assert allowed(pid) == str(cpus[i % len(cpus)]), name
        router_pid = re.search(r"router\s+pid=(\d+)", text).group(1)
        assert allowed(router_pid) == allowed(os.getpid())
        assert "pinned to CPU" in err.read_text()
        for _, name, pid in nodes:  # one engine thread per pinned node
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert argv[argv.index(b"--threads") + 1] == b"1", name


def test_pdctl_up_prefill_idle(pdctl, synth_model, tmp_path):
    """--prefill-idle: the prefill node under SCHED_IDLE, the decode node at the normal policy,
    neither pinned, and --pin-cores refused beside it."""
    help_text = subprocess.run([str(pdctl), "up", "--help"], capture_output=True,
                               text=True).stdout
    assert "--prefill-idle" in help_text, f"{pdctl} up --help lists no --prefill-idle"
    both = subprocess.run([str(pdctl), "up", "--prefill-idle", "--pin-cores"],
                          capture_output=True, text=True)
    assert both.returncode == 2 and "excludes" in both.stderr, both.stderr
    with pdctl_up(pdctl, tmp_path, "--prefill", "1", "--decode", "1", "--prefill-idle",
                  "--threads", "2", "-m", str(synth_model("llama2_f32"))) as (text, err):
        nodes = nodes_of(text)
        assert [n[1] for n in nodes] == ["p0", "d0"]

        def policy(pid):  # field 41 of /proc/PID/stat; every thread inherits it
            return {int(Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1]
                        .split()[38]) for t in os.listdir(f"/proc/{pid}/task")}

        idle, normal = 5, 0  # SCHED_IDLE, SCHED_OTHER
        for role, name, pid in nodes:
            assert policy(pid) == ({idle} if role == "prefill" else {normal}), name
            assert os.sched_getaffinity(int(pid)) == os.sched_getaffinity(0), name
        assert "p0 (prefill, pid" in err.read_text() and "SCHED_IDLE" in err.read_text()
