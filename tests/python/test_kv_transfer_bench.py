"""kv_transfer_bench (bench/kv_transfer/) on a small geometry: it runs over the in-process and the
UCX transport, its RESULT lines carry what run.sh parses, and --import puts every layer in the
receiver's cache, landed by the transport or imported by an engine-like thread (INT8 wire into an
F16 cache included). Speed is not checked here (bench/ does
that); only that the figures are there and consistent. The binary: $KV_TRANSFER_BENCH, else next
to $PDCTL, else build/bin.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Path:
    if os.environ.get("KV_TRANSFER_BENCH"):
        path = Path(os.environ["KV_TRANSFER_BENCH"])
    elif os.environ.get("PDCTL"):
        path = Path(os.environ["PDCTL"]).parent / "kv_transfer_bench"
    else:
        path = REPO_ROOT / "build" / "bin" / "kv_transfer_bench"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"kv_transfer_bench not found at {path}: build it (cmake --build build)")
    return path


SMALL = ["--n-layer", "3", "--n-kv-heads", "2", "--head-dim", "64", "--cache-tokens", "256",
         "--tokens", "40,100", "--reps", "3", "--warmup", "1"]


def run(bench: Path, *args: str) -> list[dict[str, str]]:
    out = subprocess.run([str(bench), *SMALL, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [dict(f.split("=", 1) for f in line.split()[1:])
            for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert rows, out.stdout
    return rows


def check(rows: list[dict[str, str]], wires: list[str], imported: bool) -> None:
    assert [(int(r["tokens"]), r["wire"]) for r in rows] == [(t, w) for t in (40, 100) for w in wires]
    for r in rows:
        blocks = (int(r["tokens"]) + 15) // 16
        span = 16 * 2 * 64 * 2 if r["wire"] == "f16" else 16 * 2 * (64 + 4)
        assert int(r["layer_msg_bytes"]) == 2 * blocks * span + 48
        assert int(r["bytes"]) == 3 * 2 * blocks * span
        assert 0 < float(r["best_ms"]) <= float(r["median_ms"])
        # gbps = bytes / median, up to the rounding of the printed median (3 decimals of a ms).
        ms = float(r["median_ms"])
        assert int(r["bytes"]) / (ms + 5e-4) / 1e6 - 1e-3 <= float(r["gbps"])
        assert float(r["gbps"]) <= int(r["bytes"]) / max(ms - 5e-4, 1e-6) / 1e6 + 1e-3
        assert ("import_ms" in r) == imported
        if imported:
            assert float(r["import_ms"]) >= 0
            # The last layer is imported after the sender's first Push and after its own transfer
            # began: landed is positive, and at least the importer's busy time.
            assert float(r["landed_ms"]) >= float(r["import_ms"])


def test_inproc_both_wires(bench: Path) -> None:
    check(run(bench, "--transport", "inproc"), ["f16", "int8"], imported=False)


@pytest.mark.parametrize("mode", ["land", "engine"])
def test_ucx_shared_memory_with_import(bench: Path, mode: str) -> None:
    rows = run(bench, "--no-peer-failure", "--import", mode)
    check(rows, ["f16", "int8"], imported=True)
    assert {r["receiver_kv"] for r in rows} == {"f16", "int8"}
    assert {r["import"] for r in rows} == {mode}


@pytest.mark.parametrize("mode", ["land", "engine"])
def test_int8_wire_into_an_f16_cache(bench: Path, mode: str) -> None:
    rows = run(bench, "--transport", "inproc", "--wire", "int8", "--receiver-kv", "f16",
               "--import", mode)
    check(rows, ["int8"], imported=True)
    assert {r["receiver_kv"] for r in rows} == {"f16"}


def test_bad_options_are_named(bench: Path) -> None:
    out = subprocess.run([str(bench), *SMALL, "--receiver-kv", "q8"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1
    assert "--receiver-kv must be f16 or int8, not q8" in out.stderr
    out = subprocess.run([str(bench), *SMALL, "--import", "yes"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    assert "--import" in out.stderr and "yes" in out.stderr
