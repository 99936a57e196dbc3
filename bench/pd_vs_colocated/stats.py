"""Statistics of bench/pd_vs_colocated: percentiles, per-run summaries, goodput under SLOs, the
highest rate both systems sustain, and the issue's target. Pure functions over pd-bench's
per-request records (`pd-bench --json OUT --save-requests`, key "requests"), so that they can be
unit-tested (tests/python/test_pd_vs_colocated.py) and re-run on saved JSON.

A record is a dict with at least: "class" (workload class name), "ok" (bool), "ttft_s" (float or
None), "tpot_s" (float or None: requests with one output token have none), "error" (when not ok).
"""

from __future__ import annotations

import math
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
