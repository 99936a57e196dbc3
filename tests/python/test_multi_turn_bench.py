"""bench/prefix_cache/multi_turn.py runs a conversation against a real pd-serve and reports TTFT per
turn (the llama-server reference is built by bench/llamacpp/build_tools.sh, too slow for CI)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_multi_turn_reports_every_turn_against_pd_serve(pdctl):
    bin_dir = Path(pdctl).parent
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/prefix_cache/multi_turn.py"), "--systems", "pd-serve",
         "--bin-dir", str(bin_dir), "--system-words", "60", "--turns", "3", "--max-tokens", "4",
         "--think", "0"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [l for l in out.stdout.splitlines() if re.match(r"^\| \d+ \|", l)]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "2", "3"]
    prompt_tokens = [int(r.split("|")[2]) for r in rows]
    # Every turn sends the whole history: the prompt grows turn by turn.
    assert prompt_tokens[0] > 60 and prompt_tokens == sorted(prompt_tokens)
    assert all(float(r.split("|")[3]) > 0 for r in rows)
    assert "pd-serve: median TTFT of turns 2..3 / turn 1" in out.stdout
    # The prefix cache reports what it reused: nothing on turn 1, whole blocks after.
    cached = next(l for l in out.stdout.splitlines() if l.startswith("- pd-serve: 0,"))
    later = [int(x) for x in cached.split(":")[1].split(",")[1:]]
    assert all(c > 0 and c % 16 == 0 for c in later), cached


def test_many_conversations_reports_hit_rates(pdctl):
    """bench/prefix_cache/many_conversations.py drives pd-bench's multi-turn mode: with the cache
    off the hit rate is 0, with it on it is positive (tiny workload: 2 conversations x 2 turns)."""
    bin_dir = Path(pdctl).parent
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/prefix_cache/many_conversations.py"), "--systems",
         "pd-serve-nocache,pd-serve", "--bin-dir", str(bin_dir), "--conversations", "2",
         "--turns", "2", "--concurrency", "2", "--system-prompts", "1", "--system-words", "40",
         "--user-words", "8", "--output-tokens", "4", "--think-ms", "0"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {l.split("|")[1].strip(): l.split("|") for l in out.stdout.splitlines()
            if l.startswith("| pd-serve")}
    assert float(rows["pd-serve-nocache"][2]) == 0
    assert float(rows["pd-serve"][2]) > 0 and float(rows["pd-serve"][3]) > 0
    assert rows["pd-serve"][7].strip() == "0"  # failed


def test_unknown_system_is_refused(pdctl):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/prefix_cache/multi_turn.py"), "--systems", "vllm",
         "--bin-dir", str(Path(pdctl).parent)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "unknown system 'vllm'" in out.stderr
