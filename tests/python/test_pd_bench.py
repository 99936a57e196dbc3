"""pd-bench against a real pd-serve: a synthetic model served on loopback (ports picked by the
server), a few requests over gRPC and over the OpenAI-compatible HTTP API, and the JSON report
checked for sane values. The binaries: $PD_SERVE / $PD_BENCH, else next to $PDCTL, else build/bin.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _binary(env: str, name: str) -> Path:
    if os.environ.get(env):
        path = Path(os.environ[env])
    elif os.environ.get("PDCTL"):
        path = Path(os.environ["PDCTL"]).parent / name
    else:
        path = REPO_ROOT / "build" / "bin" / name
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{name} not found at {path}: build it (cmake --build build) or set {env}")
    return path


@pytest.fixture(scope="module")
def pd_bench() -> Path:
    return _binary("PD_BENCH", "pd-bench")


@pytest.fixture(scope="module")
def server(synth_model):
    """A pd-serve on ports 0; yields {"grpc": HOST:PORT, "http": HOST:PORT}."""
    model = synth_model("llama2_f32")
    proc = subprocess.Popen(
        [str(_binary("PD_SERVE", "pd-serve")), "-m", str(model), "--grpc-port", "0",
         "--http-port", "0", "--threads", "2", "--max-running-seqs", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                if line.startswith("pd-serve ready:") or not line:
                    break
            if proc.poll() is not None:
                break
        m = re.search(r"grpc=(\S+) http=http://(\S+)", line)
        if not m:
            proc.kill()
            pytest.fail(f"pd-serve did not become ready: {line!r}\n{proc.stderr.read()}")
        yield {"grpc": m.group(1), "http": m.group(2)}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_bench(pd_bench: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess,
                                                                     dict | None]:
    out = tmp_path / "bench.json"
    if out.exists():
        out.unlink()
    p = subprocess.run([str(pd_bench), *args, "--json", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    return p, (json.loads(out.read_text()) if out.exists() else None)


def check_dist(d: dict, n: int) -> None:
    assert d["n"] == n
    if n:
        assert 0 <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"]
        assert d["mean"] >= 0


@pytest.mark.parametrize("api", ["grpc", "http"])
def test_fixed_lengths_over_both_apis(pd_bench, server, tmp_path, api):
    p, j = run_bench(pd_bench, tmp_path, "--api", api, "--target", server[api],
                     "--concurrency", "3", "-n", "6", "--warmup", "1", "--prompt-tokens", "16",
                     "--output-tokens", "8", "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000",
                     "--save-requests")
    assert p.returncode == 0, p.stderr
    assert "TTFT p99 (ms)" in p.stdout and "output throughput (tok/s)" in p.stdout
    o = j["overall"]
    assert (o["requests"], o["completed"], o["failed"], o["errors"]) == (6, 6, 0, {})
    # ignore_eos + max_tokens: every request produces exactly its output length.
    assert o["output_tokens"] == 48 and o["output_tokens_mean"] == 8
    # 16 words of the prompt list are 16 tokens in the SPM vocabulary, plus BOS.
    assert o["prompt_tokens_requested_mean"] == 16
    assert o["prompt_tokens_server_mean"] == 17
    for key in ("ttft_ms", "e2e_ms", "tpot_ms"):
        check_dist(o[key], 6)
    assert 0 < o["itl_ms"]["n"] <= 6 * 7
    assert o["ttft_ms"]["p50"] <= o["e2e_ms"]["max"]
    assert o["duration_s"] > 0 and o["request_throughput"] > 0
    assert o["output_throughput"] == pytest.approx(48 / o["duration_s"])
    assert o["total_token_throughput"] == pytest.approx((48 + 6 * 17) / o["duration_s"])
    assert o["good_requests"] == 6 and o["goodput"] == pytest.approx(o["request_throughput"])
    reqs = j["requests"]
    assert len(reqs) == 6 and all(r["ok"] for r in reqs)
    for r in reqs:
        assert 0 <= r["ttft_s"] <= r["e2e_s"]
        assert r["output_tokens"] == 8 and r["prompt_tokens"] == 17
        assert r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / 7)
    assert j["config"]["api"] == api and j["config"]["model"]


@pytest.mark.parametrize("api", ["grpc", "http"])
def test_multi_turn_reads_cached_tokens_over_both_apis(pd_bench, server, tmp_path, api):
    """--multi-turn against a real pd-serve: every turn sends the whole conversation, and from
    turn 2 the server reports whole 16-token blocks of it as served from its prefix cache."""
    p, j = run_bench(pd_bench, tmp_path, "--api", api, "--target", server[api], "--multi-turn",
                     "--conversations", "3", "--turns", "3", "--concurrency", "3",
                     "--system-prompts", "1", "--system-words", "48", "--user-words", "12",
                     "--output-tokens", "4", "--think-time-ms", "0", "--seed", str(len(api)),
                     "--save-requests")
    assert p.returncode == 0, p.stderr
    t = j["turns"]
    assert [x["turn"] for x in t["per_turn"]] == [1, 2, 3]
    assert t["cached_tokens_reported"] is True
    assert 0 < t["cache_hit_rate_turns_2plus"] < 1
    by_conv: dict[int, list[dict]] = {}
    for r in j["requests"]:
        assert r["ok"]
        by_conv.setdefault(r["conversation"], []).append(r)
    for turns in by_conv.values():
        turns.sort(key=lambda r: r["turn"])
        for prev, cur in zip(turns, turns[1:]):
            assert cur["prompt_tokens"] > prev["prompt_tokens"]
            # Turn k+1 starts with turn k's prompt: its blocks are in the cache.
            assert cur["cached_tokens"] >= (prev["prompt_tokens"] - 3) // 16 * 16
            assert cur["cached_tokens"] % 16 == 0


def test_mix_reports_each_class(pd_bench, server, tmp_path):
    p, j = run_bench(pd_bench, tmp_path, "--api", "grpc", "--target", server["grpc"], "-n", "10",
                     "--mix", "short:prompt=8,output=6,concurrency=2;long:prompt=64,output=2,rate=8")
    assert p.returncode == 0, p.stderr
    classes = j["classes"]
    assert set(classes) == {"short", "long"}
    assert classes["short"]["completed"] + classes["long"]["completed"] == 10
    assert j["overall"]["completed"] == 10
    if classes["short"]["completed"]:
        assert classes["short"]["output_tokens_mean"] == 6
        assert classes["short"]["prompt_tokens_server_mean"] == 9
    if classes["long"]["completed"]:
        assert classes["long"]["output_tokens_mean"] == 2
        assert classes["long"]["prompt_tokens_server_mean"] == 65


def test_dist_file_with_classes_over_http(pd_bench, server, tmp_path):
    dist = tmp_path / "dist.csv"
    dist.write_text("prompt_len,output_len,class\n10,3,a\n12,5,a\n40,2,b\n")
    p, j = run_bench(pd_bench, tmp_path, "--api", "http", "--target", server["http"], "-n", "8",
                     "--rate", "20", "--dist", str(dist), "--seed", "3")
    assert p.returncode == 0, p.stderr
    assert set(j["classes"]) == {"a", "b"}
    assert j["overall"]["completed"] == 8 and j["overall"]["failed"] == 0
    for name, c in j["classes"].items():
        if c["completed"]:
            # The server's prompt count: the row's length plus BOS.
            assert c["prompt_tokens_server_mean"] == c["prompt_tokens_requested_mean"] + 1


@pytest.mark.parametrize("api,status", [("grpc", "INVALID_ARGUMENT"), ("http", "http_400")])
def test_refused_requests_are_counted_by_status(pd_bench, server, tmp_path, api, status):
    # Longer than any context the server accepts.
    p, j = run_bench(pd_bench, tmp_path, "--api", api, "--target", server[api], "-n", "3",
                     "--concurrency", "3", "--prompt-tokens", "9000", "--output-tokens", "4")
    assert p.returncode == 1  # nothing completed
    o = j["overall"]
    assert o["completed"] == 0 and o["failed"] == 3 and o["errors"] == {status: 3}
    assert o["ttft_ms"]["n"] == 0 and o["ttft_ms"]["p50"] is None


def test_unreachable_server_is_a_clear_error(pd_bench, tmp_path):
    p, j = run_bench(pd_bench, tmp_path, "--api", "http", "--target", "127.0.0.1:1", "-n", "1")
    assert p.returncode == 1 and j is None
    assert "127.0.0.1:1" in p.stderr
