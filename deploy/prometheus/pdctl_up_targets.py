#!/usr/bin/env python3
"""Prometheus targets for a `pdctl up` cluster, from the listing it prints when ready.

`pdctl up` starts the prefill and decode nodes on ports the OS picks, so prometheus.yml reads its
targets from targets/*.json (file service discovery) instead of a static list. Pipe the cluster's
stdout through this script; it passes every line on and, once the listing is complete, writes the
targets file (atomically: Prometheus watches it):

    build/bin/pdctl up | deploy/prometheus/pdctl_up_targets.py
    prometheus --config.file=deploy/prometheus/prometheus.yml

Each target gets the label pool (router, prefill or decode), as in the Kubernetes scrape job.
Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

# "  prefill p0  pid=12 grpc=127.0.0.1:41 metrics=http://127.0.0.1:42/metrics"
# "  router  pid=14 metrics=http://127.0.0.1:8080/metrics logs=/tmp/pdctl-up-x"
LINE = re.compile(r"^\s+(router|prefill|decode)\s.*\bpid=\d+\b.*\bmetrics=https?://([^/\s]+)/metrics")
DEFAULT_OUT = Path(__file__).resolve().parent / "targets" / "pdctl-up.json"


def parse(lines) -> list[dict] | None:
    """Target groups of one listing, or None when the listing has not ended (the router's line
    comes last)."""
    groups = []
    for line in lines:
        m = LINE.match(line)
        if m:
            groups.append({"targets": [m.group(2)], "labels": {"pool": m.group(1)}})
            if m.group(1) == "router":
                return groups
    return None


def write(groups: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=1) + "\n")
    os.replace(tmp, out)


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    seen: list[str] = []
    written = False
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        if written:
            continue
        seen.append(line)
        groups = parse(seen)
        if groups is not None:
            write(groups, out)
            written = True
            print(f"pdctl_up_targets: {len(groups)} targets written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
