#!/usr/bin/env python3
"""Turns Nsight Compute's CSV (`ncu --csv --metrics gpu__time_duration.sum --log-file F`) of
cuda_model_test's ProfileDecodeStep into a table: per kernel (name and grid), launches and
microseconds per decode step, and the share of the step.

    python3 ncu_summary.py NCU_CSV STEPS

ncu runs each kernel alone, at base clocks and with cold caches, so its durations are longer than
in a running step (about 1.4x on the H200 of 2026-12-04); the shares are what to read. Standard
library only: the GPU machine has no extra packages."""
import collections
import csv
import re
import sys


def short(name: str) -> str:
    name = re.sub(r"\(.*", "", name.replace("void ", "", 1))  # the return type, the parameters
    name = name.replace("<unnamed>::", "").replace("(anonymous namespace)::", "")
    head, lt, args = name.partition("<")
    head = head.split("::")[-1]  # the namespaces
    return (head + lt + args)[:60]


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    path, steps = sys.argv[1], int(sys.argv[2])
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        print(f"{path}: no ncu CSV header (did ncu profile any kernel?)")
        return 1
    rows = [r for r in csv.DictReader(lines[start:]) if r.get("Metric Name") == "gpu__time_duration.sum"]
    if not rows:
        print(f"{path}: no gpu__time_duration.sum rows")
        return 1
    per = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3}.get(r["Metric Unit"], 1e-3)
        key = (short(r["Kernel Name"]), r.get("Grid Size", ""))
        per[key][0] += 1
        per[key][1] += float(r["Metric Value"].replace(",", "")) * scale
    total = sum(v[1] for v in per.values())
    print(f"{len(rows)} kernels over {steps} steps: {total / steps:.1f} us of kernel time per step")
    print("| kernel | grid | launches per step | us per step | share |")
    print("| --- | --- | ---: | ---: | ---: |")
    for (name, grid), (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {grid} | {n / steps:.1f} | {us / steps:.1f} | {100 * us / total:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
