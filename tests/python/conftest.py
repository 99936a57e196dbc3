"""Shared pytest fixtures for tests/python: repository paths, the pdctl and pd-serve binaries,
synthetic models.

The synthetic models of scripts/synth_models.py are written once per session into a temporary
folder, each on first use. Forward-pass tests record what they measured through `forward_report`;
the table is printed at the end of the run (also without -s) and, when PD_FORWARD_REPORT names a
file, written there as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

import synth_models  # noqa: E402

_FORWARD_RESULTS = pytest.StashKey[list]()
_MEASUREMENTS = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def pdctl() -> Path:
    """The pdctl binary: $PDCTL, else build/bin/pdctl in the repository. Fails when missing."""
    path = Path(os.environ.get("PDCTL", REPO_ROOT / "build" / "bin" / "pdctl"))
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"pdctl not found at {path}: build it (cmake --build build) or set PDCTL")
    return path


@pytest.fixture(scope="session")
def pd_serve_bin() -> Path:
    """The pd-serve binary: $PD_SERVE, else next to $PDCTL, else build/bin/pd-serve."""
    default = Path(os.environ["PDCTL"]).parent if "PDCTL" in os.environ else Path("build/bin")
    path = Path(os.environ.get("PD_SERVE", default / "pd-serve"))
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"pd-serve not found at {path}: build it or set PD_SERVE")
    return path


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory) -> Callable[[str], Path]:
    """Returns a function: variant name -> path of its GGUF, written on first request."""
    outdir = tmp_path_factory.mktemp("synth_models")
    written: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in written:
            written[name] = synth_models.write_variant(synth_models.VARIANTS[name], outdir)
        return written[name]

    return get


@pytest.fixture(scope="session")
def forward_report(request) -> list:
    """A list the tests append measurement dicts to; printed by pytest_terminal_summary."""
    return request.config.stash.setdefault(_FORWARD_RESULTS, [])


@pytest.fixture(scope="session")
def measurement(request) -> Callable[[str], None]:
    """measurement("text") records one line, printed under 'measurements' at the end of the run."""
    lines = request.config.stash.setdefault(_MEASUREMENTS, [])
    return lines.append


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(_MEASUREMENTS, [])
    if lines:
        terminalreporter.write_sep("=", "measurements")
        for line in lines:
            terminalreporter.write_line(line)
    rows = config.stash.get(_FORWARD_RESULTS, [])
    if not rows:
        return
    tr = terminalreporter
    tr.write_sep("=", "forward pass vs llama.cpp goldens")
    tr.write_line(f"{'variant':18s} {'prompt':>6s} {'check':7s} {'measured':>10s} {'limit':>8s} "
                  f"{'llama.cpp vs f64':>16s}  result")
    for r in sorted(rows, key=lambda r: (r["variant"], r["prompt_len"], r["check"])):
        if r["check"] == "logits":
            measured, limit = f"{r['rel_l2']:.3e}", f"{r['tolerance']:.0e}"
        else:
            div = r.get("first_divergence")
            measured, limit = ("exact" if div is None else f"diff@{div}"), "exact"
        floor = r.get("llama_vs_f64")
        tr.write_line(f"{r['variant']:18s} {r['prompt_len']:6d} {r['check']:7s} {measured:>10s} "
                      f"{limit:>8s} {'' if floor is None else f'{floor:.1e}':>16s}  "
                      f"{'ok' if r['passed'] else 'FAIL'}")
    out = os.environ.get("PD_FORWARD_REPORT")
    if out:
        Path(out).write_text(json.dumps(rows, indent=1) + "\n")
        tr.write_line(f"written to {out}")
