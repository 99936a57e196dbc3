"""Every architecture the engine runs, served: pd-serve and a local cluster give `pdctl generate`'s
greedy tokens.

For each row of ARCHS a tiny synthetic model is built (a Hugging Face folder from
test_hf_checkpoint's cases, served as a folder: converted at each start), then one prompt is
completed greedily three ways, which must give the same token ids:

  * `pdctl generate` (one process, the whole prompt in one forward);
  * `pd-serve` over OpenAI HTTP (the scheduler, streaming, `include_token_ids`);
  * `pdctl up --prefill 1 --decode 1` (router, prefill node, decode node): the prompt's KV is
    computed on the prefill node and streamed to the decode node (its
    pdserve_kv_transfer_bytes_total must grow), which decodes on it.

The prompt plus the completion run past Mistral's window (8), so the window is exercised on both
sides of the KV transfer. Correctness against llama.cpp and the transformers definitions is
test_hf_checkpoint.py's job; this file checks that every architecture survives serving.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable

import pytest

pytest.importorskip("safetensors.numpy")
pytest.importorskip("tokenizers")
openai = pytest.importorskip("openai")

import test_hf_checkpoint as hf  # noqa: E402  tests/python: synthetic Hugging Face checkpoints
import synth_models  # noqa: E402  scripts/: synthetic GGUF variants

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"
N_TOKENS = 12
TIMEOUT_S = 120
# Read by pd-serve and by every daemon of `pdctl up` (each ignores the others' sections). Every
# prompt goes to the prefill node (the default keeps prompts under 512 tokens on the decode
# node). No chat template is named: each architecture's is detected (pd-serve refuses to start
# without one).
CONFIG = """\
router:
  disaggregate_min_prompt: 0
"""


def hf_folder(case: str, **changes) -> Callable[[Path], Path]:
    """A row's model: test_hf_checkpoint's CASES[case] with config.json `changes`, written as a
    Hugging Face folder."""
    def build(dir: Path) -> Path:
        hf.make_checkpoint(dir / case, case, **changes)
        return dir / case
    return build


def gguf_variant(variant: str) -> Callable[[Path], Path]:
    """A row's model: scripts/synth_models.py's VARIANTS[variant], written as a GGUF."""
    def build(dir: Path) -> Path:
        return synth_models.write_variant(synth_models.VARIANTS[variant], dir)
    return build


# One row per architecture the engine runs: (test id, how its model is built). Another
# architecture is one more row. Output heads are untied: with these random weights a tied head
# repeats the last token, which would hide a decode node working on the wrong KV.
ARCHS = [
    ("llama", hf_folder("llama")),
    ("qwen2", hf_folder("qwen2_bias", tie_word_embeddings=False)),
    ("qwen3", hf_folder("qwen3")),
    ("phi3", hf_folder("phi3")),
    ("gemma2", hf_folder("gemma2_softcap", tie_word_embeddings=False)),
    ("gemma3", hf_folder("gemma3", tie_word_embeddings=False)),
    ("mistral_window", hf_folder("mistral_window")),
    # Mixtures of experts: Hugging Face Qwen3-MoE and Mixtral folders, and a Qwen3-MoE GGUF
    # whose experts are Q8_0 (the quantized kernels on row blocks of stacked tensors).
    ("qwen3moe", hf_folder("qwen3moe", tie_word_embeddings=False)),
    ("mixtral", hf_folder("mixtral")),
    ("qwen3moe_q8_0", gguf_variant("qwen3moe_q8_0")),
]


def _generate(pdctl: Path, model: Path) -> list[int]:
    proc = subprocess.run([str(pdctl), "generate", "-m", str(model), "-p", PROMPT, "-n",
                           str(N_TOKENS), "--temperature", "0", "--ignore-eos", "--print-ids",
                           "--threads", "1"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [int(t) for t in [ln for ln in proc.stdout.splitlines() if ln.strip()][-1].split()]


def _complete(http_url: str, model: str) -> list[int]:
    """Greedy ids of PROMPT from an OpenAI endpoint, streamed with include_token_ids."""
    client = openai.OpenAI(base_url=f"{http_url}/v1", api_key="none", timeout=TIMEOUT_S)
    chunks = list(client.completions.create(
        model=model, prompt=PROMPT, max_tokens=N_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True, "include_token_ids": True},
        extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == N_TOKENS
    return [t for ch in chunks if ch.choices for t in ch.choices[0].model_extra["token_ids"]]


def _counter(metrics_url: str, name: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in
               re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -9


def _serve(pdctl: Path, model: Path, config: Path) -> list[int]:
    proc = subprocess.Popen([str(pdctl.parent / "pd-serve"), "--config", str(config), "-m",
                             str(model), "--grpc-port", "0", "--http-port", "0", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = None
        for line in proc.stdout:
            m = re.match(r"^pd-serve ready: grpc=\S+ http=(\S+) model=(\S+)$", line.strip())
            if m:
                break
        assert m, proc.stderr.read()[-3000:]
        got = _complete(*m.groups())
        assert _stop(proc) == 0
        return got
    finally:
        _stop(proc)


def _cluster(pdctl: Path, model: Path, config: Path, tmp_path: Path) -> list[int]:
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [str(pdctl), "up", "--config", str(config), "--prefill", "1", "--decode", "1",
             "-m", str(model),
             "--grpc-port", "0", "--http-port", "0", "--threads", "1", "--log-dir",
             str(tmp_path / "logs")], stdout=o, stderr=e)
    try:
        end = time.monotonic() + TIMEOUT_S
        while "router  pid=" not in out.read_text():
            assert proc.poll() is None, err.read_text()[-3000:]
            assert time.monotonic() < end, "pdctl up did not get ready"
            time.sleep(0.1)
        text = out.read_text()
        http_url = re.search(r"^pdctl up ready: grpc=\S+ http=(\S+)$", text, re.M).group(1)
        prefill_metrics = re.search(r"^\s+prefill\s+p0\s+.*metrics=(\S+)$", text, re.M).group(1)
        before = _counter(prefill_metrics, "pdserve_kv_transfer_bytes_total")
        # The router names the model after the file or folder, as pd-serve does.
        got = _complete(http_url, model.name.removesuffix(".gguf"))
        after = _counter(prefill_metrics, "pdserve_kv_transfer_bytes_total")
        assert after > before, "the prefill node streamed no KV"
        assert _stop(proc) == 0, err.read_text()[-3000:]
        return got
    finally:
        _stop(proc)


@pytest.mark.parametrize("build", [b for _, b in ARCHS], ids=[n for n, _ in ARCHS])
def test_serving_gives_generate_tokens(build, pdctl, tmp_path):
    model = build(tmp_path)
    want = _generate(pdctl, model)
    assert len(want) == N_TOKENS and len(set(want)) > 3, want  # not one token repeated
    config = tmp_path / "serve.yaml"
    config.write_text(CONFIG)
    assert _serve(pdctl, model, config) == want, "pd-serve"
    assert _cluster(pdctl, model, config, tmp_path) == want, "pdctl up (router, prefill, decode)"
