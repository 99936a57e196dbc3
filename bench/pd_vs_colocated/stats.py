"""Statistics of bench/pd_vs_colocated: percentiles, per-run summaries, goodput under SLOs, the
highest rate both systems sustain, and the issue's target. Pure functions over pd-bench's
per-request records (`pd-bench --json OUT --save-requests`, key "requests"), so that they can be
unit-tested (tests/python/test_pd_vs_colocated.py) and re-run on saved JSON.

A record is a dict with at least: "class" (workload class name), "ok" (bool), "ttft_s" (float or
None), "tpot_s" (float or None: requests with one output token have none), "error" (when not ok).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


def percentile(values, q):
    """The q-quantile (0 <= q <= 1) interpolated linearly between the closest ranks, as numpy's
    default and pd-bench do: rank q * (n - 1) of the sorted values. None for no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Slo:
    """Service-level objectives a request must meet to count towards goodput.

    ttft_ms: TTFT objective per workload class (a class not listed uses `default_ttft_ms`; None
    there = not checked). tpot_ms: TPOT objective for every request (None = not checked); a
    request without a TPOT (one output token) meets it.
    """
    ttft_ms: dict = field(default_factory=dict)
    default_ttft_ms: float | None = None
    tpot_ms: float | None = None

    def ttft_for(self, cls):
        return self.ttft_ms.get(cls, self.default_ttft_ms)

    def describe(self):
        parts = [f"TTFT <= {v:g} ms ({k})" for k, v in sorted(self.ttft_ms.items())]
        if self.default_ttft_ms is not None:
            parts.append(f"TTFT <= {self.default_ttft_ms:g} ms (other classes)")
        if self.tpot_ms is not None:
            parts.append(f"TPOT <= {self.tpot_ms:g} ms (all)")
        return ", ".join(parts) if parts else "none"


def meets_slo(rec, slo):
    """True when the request completed and met its class's TTFT objective and the TPOT one."""
    if not rec.get("ok") or rec.get("ttft_s") is None:
        return False
    ttft_ms = 1000.0 * rec["ttft_s"]
    limit = slo.ttft_for(rec.get("class"))
    if limit is not None and ttft_ms > limit:
        return False
    tpot = rec.get("tpot_s")
    if slo.tpot_ms is not None and tpot is not None and 1000.0 * tpot > slo.tpot_ms:
        return False
    return True


def summarize(records, duration_s, slo, classes=None):
    """Statistics of one run over the records of `classes` (None: all).

    duration_s: the measured phase's wall time (pd-bench's "duration_s"), the denominator of the
    throughputs. Returns a dict: sent, completed, failed, errors {status: n}, ttft_ms / tpot_ms
    {p50, p99, mean, n}, good, goodput (good requests / s), attainment (good / sent), throughput
    (completed / s).
    """
    recs = [r for r in records if classes is None or r.get("class") in classes]
    ok = [r for r in recs if r.get("ok")]
    errors = {}
    for r in recs:
        if not r.get("ok"):
            key = r.get("error") or "unknown"
            errors[key] = errors.get(key, 0) + 1

    def dist(key):
        xs = [1000.0 * r[key] for r in ok if r.get(key) is not None]
        return {"n": len(xs), "mean": sum(xs) / len(xs) if xs else None,
                "p50": percentile(xs, 0.5), "p99": percentile(xs, 0.99)}

    good = sum(1 for r in recs if meets_slo(r, slo))
    dur = duration_s if duration_s and duration_s > 0 else None
    return {
        "sent": len(recs), "completed": len(ok), "failed": len(recs) - len(ok), "errors": errors,
        "ttft_ms": dist("ttft_s"), "tpot_ms": dist("tpot_s"),
        "good": good,
        "goodput": good / dur if dur else None,
        "attainment": good / len(recs) if recs else None,
        "throughput": len(ok) / dur if dur else None,
    }


def sustains(run, min_completed, max_ttft_p50_ms):
    """A system sustains a rate when it keeps up with it, whatever the SLO says about latency:
    it sent something, at least `min_completed` of the requests sent completed (no error, no
    timeout), and the median TTFT of the short requests stays within `max_ttft_p50_ms` (under
    overload the waiting queue grows and every later request waits longer, so the median runs
    away). run: {"all": summary, "chat": summary} as `summarize` returns them."""
    a, c = run["all"], run.get("chat") or run["all"]
    if not a.get("sent"):
        return False
    if a["completed"] / a["sent"] < min_completed:
        return False
    if c.get("sent") == 0:  # no short requests in this run: completion alone decides
        return True
    p50 = c["ttft_ms"]["p50"]
    return p50 is not None and p50 <= max_ttft_p50_ms


def highest_common_rate(by_rate, min_completed, max_ttft_p50_ms):
    """by_rate: {rate: {"colocated": run, "disaggregated": run}} with runs as for `sustains`.
    The highest rate that both systems sustain, or None."""
    best = None
    for rate in sorted(by_rate):
        runs = by_rate[rate]
        if all(k in runs and sustains(runs[k], min_completed, max_ttft_p50_ms)
               for k in ("colocated", "disaggregated")):
            best = rate
    return best


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def evaluate_target(by_rate, min_completed, max_ttft_p50_ms, max_tpot_ratio=0.5):
    """The issue's target: at the highest rate both sustain, p99 TPOT (all requests) of the
    disaggregated cluster <= max_tpot_ratio x colocated, with goodput no lower. by_rate as for
    `highest_common_rate`. Returns a dict: rate (None when no rate is sustained by both),
    tpot_p99_ratio, goodput_colocated, goodput_disaggregated, tpot_ok, goodput_ok, met (None when
    it cannot be evaluated)."""
    rate = highest_common_rate(by_rate, min_completed, max_ttft_p50_ms)
    out = {"rate": rate, "tpot_p99_ratio": None, "goodput_colocated": None,
           "goodput_disaggregated": None, "tpot_ok": None, "goodput_ok": None, "met": None,
           "max_tpot_ratio": max_tpot_ratio, "min_completed": min_completed,
           "max_ttft_p50_ms": max_ttft_p50_ms}
    if rate is None:
        return out
    c, d = by_rate[rate]["colocated"]["all"], by_rate[rate]["disaggregated"]["all"]
    r = ratio(d["tpot_ms"]["p99"], c["tpot_ms"]["p99"])
    out.update(tpot_p99_ratio=r, goodput_colocated=c["goodput"],
               goodput_disaggregated=d["goodput"])
    out["tpot_ok"] = r is not None and r <= max_tpot_ratio
    out["goodput_ok"] = (c["goodput"] is not None and d["goodput"] is not None
                         and d["goodput"] >= c["goodput"])
    out["met"] = out["tpot_ok"] and out["goodput_ok"]
    return out


# ---------------------------------------------------------------------------------------------
# Confidence intervals (issue 19: ">= 50 requests per rate, at least 3 seeds, and bootstrap
# confidence intervals on every percentile").


def _resample(groups, rng):
    """One bootstrap resample of records kept in groups (one group per seed's run): each group is
    resampled with replacement to its own size, so that every resample has each seed's share and
    a seed whose run went differently (a busier machine) cannot vanish or dominate by chance."""
    out = []
    for g in groups:
        out.extend(g[rng.randrange(len(g))] for _ in range(len(g)))
    return out


def _interval(values, n_boot, level):
    """The central `level` interval of the bootstrap values (None entries dropped), or None when
    fewer than 90 % of the n_boot resamples had a value."""
    vals = [v for v in values if v is not None]
    if len(vals) < 0.9 * n_boot:
        return None
    a = (1.0 - level) / 2.0
    return percentile(vals, a), percentile(vals, 1.0 - a)


def bootstrap_ci(groups, statistic, n_boot=2000, level=0.95, seed=0):
    """Percentile-bootstrap interval (lo, hi) of statistic(records) over the records in `groups`
    (a list of lists; empty groups are dropped). None when there are no records or the statistic
    is None on the data. Resamples where the statistic is None (say, no TPOT in a resample) are
    skipped; an interval needs most resamples to have one."""
    groups = [list(g) for g in groups if g]
    if not groups or statistic([r for g in groups for r in g]) is None:
        return None
    rng = random.Random(seed)
    return _interval((statistic(_resample(groups, rng)) for _ in range(n_boot)), n_boot, level)


def ratio_ci(groups_num, groups_den, statistic, n_boot=2000, level=0.95, seed=0):
    """Interval of statistic(num) / statistic(den), the two systems resampled independently
    (their requests are different requests; only the arrival times are shared)."""
    num = [list(g) for g in groups_num if g]
    den = [list(g) for g in groups_den if g]
    if not num or not den:
        return None
    rng = random.Random(seed)
    return _interval((ratio(statistic(_resample(num, rng)), statistic(_resample(den, rng)))
                      for _ in range(n_boot)), n_boot, level)


def tpot_ms_quantile(q):
    """statistic: the q-quantile of the completed requests' TPOT in ms."""
    def f(recs):
        return percentile([1000.0 * r["tpot_s"] for r in recs
                           if r.get("ok") and r.get("tpot_s") is not None], q)
    return f


def goodput_of(slo, duration_s):
    """statistic: requests meeting `slo` per second of `duration_s` (the arrival windows of all
    the runs pooled)."""
    def f(recs):
        return sum(1 for r in recs if meets_slo(r, slo)) / duration_s if duration_s else None
    return f


def evaluate_target_ci(runs, slo, duration_s, rate, max_tpot_ratio=0.5, n_boot=2000, seed=0):
    """The target at `rate` with intervals. runs: {"colocated": [records of each seed's run],
    "disaggregated": [...]} (lists of record lists); duration_s: the arrival windows summed over
    seeds (the same for both systems). Met when the 95 % interval of the disaggregated p99 TPOT
    lies below max_tpot_ratio x the interval of the colocated one (the intervals do not
    overlap) and the disaggregated goodput is no lower (point estimates; the goodput
    intervals are reported beside them)."""
    c, d = runs["colocated"], runs["disaggregated"]
    p99 = tpot_ms_quantile(0.99)
    pooled_c = [r for g in c for r in g]
    pooled_d = [r for g in d for r in g]
    gp = goodput_of(slo, duration_s)
    out = {
        "rate": rate, "max_tpot_ratio": max_tpot_ratio,
        "tpot_p99_colocated": p99(pooled_c), "tpot_p99_disaggregated": p99(pooled_d),
        "tpot_p99_colocated_ci": bootstrap_ci(c, p99, n_boot, seed=seed),
        "tpot_p99_disaggregated_ci": bootstrap_ci(d, p99, n_boot, seed=seed + 1),
        "tpot_p99_ratio_ci": ratio_ci(d, c, p99, n_boot, seed=seed + 2),
        "goodput_colocated": gp(pooled_c), "goodput_disaggregated": gp(pooled_d),
        "goodput_colocated_ci": bootstrap_ci(c, gp, n_boot, seed=seed + 3),
        "goodput_disaggregated_ci": bootstrap_ci(d, gp, n_boot, seed=seed + 4),
        "seeds": min(len(c), len(d)),
    }
    out["tpot_p99_ratio"] = ratio(out["tpot_p99_disaggregated"], out["tpot_p99_colocated"])
    ci_c, ci_d = out["tpot_p99_colocated_ci"], out["tpot_p99_disaggregated_ci"]
    out["tpot_ok"] = (ci_c is not None and ci_d is not None
                      and ci_d[1] < max_tpot_ratio * ci_c[0])
    out["goodput_ok"] = (out["goodput_colocated"] is not None
                         and out["goodput_disaggregated"] is not None
                         and out["goodput_disaggregated"] >= out["goodput_colocated"])
    out["met"] = out["tpot_ok"] and out["goodput_ok"]
    return out


def counter_delta(before, after, name, labels=None):
    """Sum over the samples of Prometheus metric `name` whose labels include `labels` (a dict) of
    after - before, from two /metrics texts. 0 when the metric is absent."""
    def total(text):
        s = 0.0
        for line in (text or "").splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, lab = head.partition("{")
            if metric != name:
                continue
            if labels and not all(f'{k}="{v}"' in lab for k, v in labels.items()):
                continue
            try:
                s += float(value)
            except ValueError:
                pass
        return s
    return total(after) - total(before)
