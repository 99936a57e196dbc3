"""bench/serving/vs_llama_server.py against a real pd-serve, with and without the step-time
budget (the llama-server reference is built by bench/llamacpp/build_tools.sh, too slow for CI):
a tiny run of the issue-19 serving table on the default model."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_serving_table_against_pd_serve(pdctl, tmp_path):
    bin_dir = Path(pdctl).parent
    out_md = tmp_path / "serving.md"
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/serving/vs_llama_server.py"), "--systems",
         "pd-serve,pd-serve-nobudget", "--bin-dir", str(bin_dir), "--concurrency", "3",
         "--prompt-tokens", "24", "--output-tokens", "6", "--rounds", "1", "--min-requests", "3",
         "--out-dir", str(tmp_path / "json"), "--out", str(out_md)],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [l.split("|") for l in out.stdout.splitlines() if re.match(r"^\| 3 \|", l)]
    assert [r[2].strip() for r in rows] == ["pd-serve", "pd-serve-nobudget"]
    for r in rows:
        assert int(r[3]) == 3 and int(r[4]) == 0, r  # 3 requests, none failed
        assert float(r[5]) > 0  # output tok/s
        assert r[6].strip() == "-"  # no llama-server in the run: no ratio
    assert "machine: " in out_md.read_text() and "(target >= 2x" not in out.stdout
    assert (tmp_path / "json" / "pd-serve_c3.json").exists()


def test_transfer_tail_against_ttft_through_pdctl_up(pdctl):
    """bench/kv_transfer/tail_vs_ttft.py: a real cluster disaggregates a 600-token prompt, and the
    router's transfer phase is set against the client's TTFT."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/kv_transfer/tail_vs_ttft.py"), "--n", "1", "--words",
         "600", "--bin-dir", str(Path(pdctl).parent)],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert re.search(r"\| transfer \| 1 \| \d+\.\d \|", out.stdout), out.stdout
    share = float(re.search(r"transfer tail / TTFT \(means\): ([\d.]+) %", out.stdout).group(1))
    assert 0 < share < 100
