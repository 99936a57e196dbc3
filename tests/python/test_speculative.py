"""Speculative decoding through the real servers and tools (docs/speculative.md), on the default
model (Gemma 3 270M) with the n-gram drafter: greedy outputs with and without speculation are the
same text, stop strings cut an accepted run where they cut the plain one, the OpenAI usage and
/metrics report drafts, a request can turn it off, pdctl --spec agrees with pdctl, and a draft
model with another vocabulary is refused naming the first differing token.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest

READY = re.compile(r"^pd-serve ready: grpc=(\S+) http=(\S+) model=(\S+)$")
MODEL = "models/gemma-3-270m-q4_k_m.gguf"

PASSAGE = ("The river town woke before the sun. Fishermen carried nets down the stone steps, "
           "bakers pulled the first loaves from brick ovens, and the ferry bell rang twice to say "
           "the water was calm enough to cross.")
PROMPTS = [
    f"Passage:\n{PASSAGE}\n\nThe same passage, copied word for word:\n",
    "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Once upon a time, in a village at the edge of a great forest, there lived a girl who",
    "The history of the bicycle begins in the early nineteenth century, when",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,",
]


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, model: str):
        self.proc, self.url, self.model = proc, url, model
        self.stderr: list[str] = []

    def metrics(self) -> dict[str, float]:
        out = {}
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("pdserve_spec_"):
                    name, value = line.rsplit(" ", 1)
                    out[name] = float(value)
        return out


@pytest.fixture(scope="module")
def server(pd_serve_bin: Path, repo_root: Path, tmp_path_factory):
    # A fixed draft length: whether the adaptive K drafts depends on the start-up timing of a
    # loaded CI machine, and these tests need drafts to check that they change nothing.
    cfg = tmp_path_factory.mktemp("spec") / "serve.yaml"
    cfg.write_text("speculative: {drafter: ngram, fixed_k: 4}\n")
    proc = subprocess.Popen(
        [str(pd_serve_bin), "--grpc-port", "0", "--http-port", "0", "--threads", "2",
         "--shutdown-grace", "1", "--model", str(repo_root / MODEL), "--config", str(cfg)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    srv = None
    end = time.monotonic() + 120
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        m = READY.match(line.strip())
        if m:
            srv = Server(proc, m.group(2), m.group(3))
            threading.Thread(target=lambda: srv.stderr.extend(proc.stderr), daemon=True).start()
            break
    if srv is None:
        proc.kill()
        pytest.fail(f"pd-serve did not get ready: {proc.stderr.read()}")
    yield srv
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=30) == 0, "".join(srv.stderr[-50:])
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def complete(client, server, prompt: str, speculative: bool, **kw):
    return client.completions.create(model=server.model, prompt=prompt, max_tokens=48,
                                     temperature=0, extra_body={"speculative": speculative,
                                                                "ignore_eos": True}, **kw)


def test_greedy_text_is_the_same_with_and_without(client, server):
    before = server.metrics()
    accepted_total = 0
    for p in PROMPTS:
        plain = complete(client, server, p, speculative=False)
        spec = complete(client, server, p, speculative=True)
        assert spec.choices[0].text == plain.choices[0].text, p
        assert spec.usage.completion_tokens == plain.usage.completion_tokens == 48
        assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
        assert plain.usage.completion_tokens_details.rejected_prediction_tokens == 0
        accepted_total += spec.usage.completion_tokens_details.accepted_prediction_tokens
    # The copying and counting prompts are what n-gram lookup predicts.
    assert accepted_total >= 48
    after = server.metrics()
    gained = {k: after[k] - before.get(k, 0) for k in after}
    assert gained["pdserve_spec_accepted_tokens_total"] == accepted_total
    assert gained["pdserve_spec_draft_tokens_total"] >= accepted_total
    assert gained["pdserve_spec_drafts_total"] > 0
    assert gained['pdserve_spec_position_drafted_total{position="1"}'] > 0
    assert gained['pdserve_spec_position_accepted_total{position="1"}'] > 0


def test_streamed_speculative_text_equals_the_plain_text(client, server):
    p = PROMPTS[0]
    plain = complete(client, server, p, speculative=False).choices[0].text
    chunks = client.completions.create(model=server.model, prompt=p, max_tokens=48,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain


def test_stop_string_cuts_an_accepted_run_where_it_cuts_the_plain_one(client, server):
    p = PROMPTS[1]
    plain = complete(client, server, p, speculative=False).choices[0].text
    words = plain.split()
    assert len(words) > 4
    stop = " " + words[3]  # a word well inside what n-gram lookup drafts
    a = complete(client, server, p, speculative=False, stop=[stop])
    b = complete(client, server, p, speculative=True, stop=[stop])
    assert a.choices[0].text == b.choices[0].text == plain[:plain.index(stop)]
    assert a.choices[0].finish_reason == b.choices[0].finish_reason == "stop"


def test_sampled_requests_run_and_report_drafts(client, server):
    r = client.completions.create(model=server.model, prompt=PROMPTS[1], max_tokens=32,
                                  temperature=0.7, seed=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 32
    d = r.usage.completion_tokens_details
    assert d.accepted_prediction_tokens >= 0 and d.rejected_prediction_tokens >= 0


@pytest.mark.parametrize("drafter", ["ngram", "self-head"])
def test_pdctl_spec_matches_pdctl(pdctl: Path, repo_root: Path, drafter: str):
    def run(*extra):
        out = subprocess.run([str(pdctl), "generate", "-m", str(repo_root / MODEL), "-p",
                              PROMPTS[2], "-n", "40", "--temp", "0", "--ignore-eos", "-t", "2",
                              "--print-ids", *extra], capture_output=True, text=True, timeout=300,
                             cwd=repo_root)
        assert out.returncode == 0, out.stderr
        return out
    plain = run()
    spec = run("--spec", drafter, "--spec-k", "6")
    assert spec.stdout == plain.stdout
    m = re.search(drafter + r", K <= 6 \| (\d+) target steps for (\d+) tokens .*"
                  r"drafted (\d+), accepted (\d+)", spec.stderr)
    assert m, spec.stderr
    # Whether the adaptive K drafts here depends on the machine's timing: only the counts' sense.
    steps, tokens, drafted, accepted = map(int, m.groups())
    assert tokens == 40 and 0 <= accepted <= drafted and steps <= tokens
    if drafter == "self-head" and drafted > 0:
        # Its proposals are the model's own choices whenever its 32768-token head holds them.
        assert accepted * 2 >= drafted, spec.stderr


def test_draft_with_another_vocabulary_is_refused(pd_serve_bin: Path, repo_root: Path,
                                                  synth_model):
    draft = synth_model("llama2_f32")
    out = subprocess.run([str(pd_serve_bin), "--grpc-port", "0", "--http-port", "0",
                          "--model", str(repo_root / MODEL), "--spec", str(draft)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "not the model's vocabulary" in out.stderr, out.stderr
    assert "token" in out.stderr


def test_bad_spec_values_are_refused(pd_serve_bin: Path, repo_root: Path, tmp_path: Path):
    out = subprocess.run([str(pd_serve_bin), "--spec", str(tmp_path / "missing.gguf"),
                          "--model", str(repo_root / MODEL), "--grpc-port", "0",
                          "--http-port", "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "speculative.drafter" in out.stderr, out.stderr
    out = subprocess.run([str(pd_serve_bin), "--spec-k", "40", "--model", str(repo_root / MODEL)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "speculative.max_k" in out.stderr, out.stderr
