"""pd-serve as a user starts it: the default model, ports picked by the OS, SIGTERM to stop.

The gRPC API itself is exercised from C++ (tests/frontend/grpc_service_test.cc and
pd_serve_test.cc): the venv has no grpcio. Here: the ready line, the HTTP health endpoint on the
announced port, a clean exit on SIGTERM, and config errors naming the key.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

READY = re.compile(r"^pd-serve ready: grpc=(\S+) http=(\S+) model=(\S+)$")


@pytest.fixture(scope="session")
def pd_serve(pdctl: Path) -> Path:
    """The pd-serve binary: $PD_SERVE, else next to pdctl."""
    path = Path(os.environ.get("PD_SERVE", pdctl.parent / "pd-serve"))
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"pd-serve not found at {path}: build it or set PD_SERVE")
    return path


def _wait_ready(proc: subprocess.Popen, timeout: float) -> re.Match:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        m = READY.match(line.strip())
        if m:
            return m
    proc.kill()
    pytest.fail(f"pd-serve did not get ready: {proc.stderr.read()}")


def test_default_model_ready_line_health_and_sigterm(pd_serve: Path, repo_root: Path):
    default_model = repo_root / "models" / "gemma-3-270m-q4_k_m.gguf"
    assert default_model.is_file(), "the default model is not installed (scripts/setup.sh)"
    proc = subprocess.Popen(
        [str(pd_serve), "--grpc-port", "0", "--http-port", "0", "--threads", "2"],
        cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = _wait_ready(proc, timeout=120)
        grpc_addr, http_url, model = m.groups()
        assert model == "gemma-3-270m-q4_k_m"
        assert re.fullmatch(r"127\.0\.0\.1:\d+", grpc_addr)
        assert not grpc_addr.endswith(":0")
        with urllib.request.urlopen(f"{http_url}/health", timeout=10) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("daemon", ["pd-serve", "pd-router", "pd-prefill", "pd-decode"])
def test_bad_flags_exit_2_like_bad_configs(pd_serve: Path, daemon: str):
    # Every daemon documents 2 for bad flags and bad configs; CLI11's own codes (105-114) varied
    # by the kind of flag error. --help exits 0.
    binary = pd_serve.parent / daemon
    for args, why in ((["--bogus"], "--bogus"), (["--grpc-port", "many"], "many"),
                      (["--grpc-port"], "grpc-port")):
        r = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (daemon, args, r.returncode, r.stderr)
        assert why in r.stderr, (daemon, args, r.stderr)
    assert subprocess.run([str(binary), "--help"], capture_output=True,
                          timeout=30).returncode == 0


def test_unknown_config_key_is_named(pd_serve: Path, tmp_path: Path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("kv:\n  dtype: f16\n  memroy_mib: 64\n")
    r = subprocess.run([str(pd_serve), "--config", str(cfg)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2
    assert "kv.memroy_mib: unknown key" in r.stderr


def test_every_shipped_config_is_accepted(pd_serve: Path, repo_root: Path):
    # The config is read and validated before the model is opened: with a missing model the
    # error must be about the model, never about the config.
    for cfg in sorted((repo_root / "configs").glob("*.yaml")):
        r = subprocess.run([str(pd_serve), "--config", str(cfg), "--model", "/nonexistent.gguf"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1, (cfg, r.stderr)
        assert "/nonexistent.gguf" in r.stderr, (cfg, r.stderr)
