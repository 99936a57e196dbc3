"""pdserve's forward pass against llama.cpp on synthetic models.

For every variant of scripts/synth_models.py and every prompt of its golden
(testdata/reference/llama/<variant>.json, made by scripts/make_llama_reference.py):
  * the model is regenerated and must have the golden's SHA-256 (else the goldens are stale);
  * `pdctl logits` must give last-position logits within a relative L2 error of the golden's:
    1e-4 for F32 weights, 1e-3 for F16 / BF16, 1e-2 for Q8_0 (PD_FORWARD_TOL overrides, e.g.
    PD_FORWARD_TOL="bf16=1e-2,q8_0=5e-2");
  * `pdctl generate` greedy (32 tokens, EOS ignored) must print exactly the golden's ids.

pdctl: $PDCTL, default build/bin/pdctl. Each golden also records, per prompt, how far llama.cpp
itself is from an independent float64 forward pass ("llama.cpp vs f64" in the summary table): for
F16 / BF16 / Q8_0 weights that is llama.cpp's activation-rounding noise, the floor below which no
other implementation can be expected to agree with it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import synth_models

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN_DIR = REPO_ROOT / "testdata" / "reference" / "llama"
N_GREEDY = 32
TIMEOUT_S = 300

# Relative L2 error allowed on the final logits, by weight storage type (the targets).
TOLERANCES = {"f32": 1e-4, "f16": 1e-3, "bf16": 1e-3, "q8_0": 1e-2}
# Measured exceptions, per (variant, prompt length). BF16 at 40 tokens: 2.2e-3. llama.cpp multiplies
# BF16 batches of two or more rows with tinyBLAS on AVX512-BF16 (VDPBF16PS), whose pair rounding
# our BF16 kernels do not reproduce yet; the one-ulp differences are amplified by this random
# model (the 1- and 7-token prompts agree within 7e-8). Before attention followed ggml's order it
# happened to land under 1e-3.
CASE_TOLERANCES = {("llama_bf16", 40): 5e-3}


def _tolerances() -> dict[str, float]:
    tol = dict(TOLERANCES)
    for item in filter(None, os.environ.get("PD_FORWARD_TOL", "").split(",")):
        key, _, value = item.partition("=")
        if key.strip() not in tol:
            raise ValueError(f"PD_FORWARD_TOL: unknown weight type {key!r}")
        tol[key.strip()] = float(value)
    return tol


def _load_goldens() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(GOLDEN_DIR.glob("*.json"))}


GOLDENS = _load_goldens()
CASES = [pytest.param(name, i, id=f"{name}-len{len(p['prompt_ids'])}")
         for name, g in GOLDENS.items() for i, p in enumerate(g["prompts"])]


def _golden_logits(prompt: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(prompt["final_logits_f32_b64"]), dtype="<f4")


def _rel_l2(ours: np.ndarray, ref: np.ndarray) -> float:
    ours64, ref64 = ours.astype(np.float64), ref.astype(np.float64)
    return float(np.linalg.norm(ours64 - ref64) / np.linalg.norm(ref64))


def _floor(prompt: dict):
    return prompt.get("crosscheck_numpy_f64", {}).get("rel_l2_llama_vs_numpy")


@pytest.fixture(scope="session")
def checked_model(synth_model):
    """Variant name -> path of its synthetic model, after checking it against the golden."""
    checked: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in checked:
            path = synth_model(name)
            want = GOLDENS[name]["model"]["sha256"]
            got = synth_models.sha256_file(path)
            if got != want:
                pytest.fail(
                    f"{name}: synthetic model drifted (sha256 {got}, golden {want}). The goldens "
                    "no longer describe this model: check the gguf / numpy versions, or regenerate "
                    "with `python scripts/make_llama_reference.py` and review the diff.")
            checked[name] = path
        return checked[name]

    return get


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)}\nexited with {proc.returncode}\nstdout:\n"
                    f"{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def test_goldens_cover_every_variant():
    assert sorted(GOLDENS) == sorted(synth_models.VARIANTS), (
        "testdata/reference/llama and scripts/synth_models.py disagree on the variants; "
        "run scripts/make_llama_reference.py")


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_synthetic_model_matches_golden(name, checked_model):
    checked_model(name)


@pytest.mark.parametrize("name,index", CASES)
def test_golden_is_not_degenerate(name, index):
    g = GOLDENS[name]
    p = g["prompts"][index]
    logits = _golden_logits(p).astype(np.float64)
    assert logits.shape == (g["model"]["n_vocab"],)
    assert np.isfinite(logits).all()
    prob = np.exp(logits - logits.max())
    prob /= prob.sum()
    assert 1e-3 < prob.max() < 0.9, "softmax of the golden logits is uniform or one-hot"
    assert len(p["greedy_ids"]) == N_GREEDY
    assert len(set(p["greedy_ids"])) > N_GREEDY // 2, "greedy continuation loops"


@pytest.mark.parametrize("name,index", CASES)
def test_final_logits(name, index, pdctl, checked_model, forward_report, tmp_path):
    g = GOLDENS[name]
    p = g["prompts"][index]
    model = checked_model(name)
    out = tmp_path / "logits.f32"
    _run([str(pdctl), "logits", "-m", str(model),
          "--prompt-ids", " ".join(map(str, p["prompt_ids"])),
          "--threads", "2", "--kv-type", "f32", "--out", str(out)])

    ref = _golden_logits(p)
    raw = out.read_bytes()
    assert len(raw) == ref.nbytes, (
        f"pdctl wrote {len(raw)} bytes, expected {ref.nbytes} (n_vocab {ref.size} x float32)")
    ours = np.frombuffer(raw, dtype="<f4")
    assert np.isfinite(ours).all(), "non-finite logits"
    err = _rel_l2(ours, ref)
    tol = _tolerances()[g["model"]["weight_type"]]
    tol = max(tol, CASE_TOLERANCES.get((name, len(p["prompt_ids"])), 0.0))
    floor = _floor(p)
    forward_report.append({
        "variant": name, "prompt_len": len(p["prompt_ids"]), "check": "logits",
        "weight_type": g["model"]["weight_type"], "rel_l2": err, "tolerance": tol,
        "llama_vs_f64": floor, "argmax_equal": int(ours.argmax()) == int(ref.argmax()),
        "passed": err <= tol})
    print(f"{name} len {len(p['prompt_ids'])}: rel_l2 {err:.3e} (limit {tol:.0e}, "
          f"llama.cpp vs float64 {floor})")
    assert err <= tol, (
        f"{name}, prompt of {len(p['prompt_ids'])} ids: rel L2 {err:.3e} > {tol:.0e}; "
        f"argmax ours {int(ours.argmax())} vs golden {int(ref.argmax())}; llama.cpp itself is "
        f"{floor} from a float64 forward pass on this prompt")


@pytest.mark.parametrize("name,index", CASES)
def test_greedy(name, index, pdctl, checked_model, forward_report):
    g = GOLDENS[name]
    p = g["prompts"][index]
    model = checked_model(name)
    proc = _run([str(pdctl), "generate", "-m", str(model),
                 "--prompt-ids", " ".join(map(str, p["prompt_ids"])),
                 "-n", str(N_GREEDY), "--temperature", "0", "--ignore-eos", "--print-ids",
                 "--kv-type", "f32"])
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, f"pdctl generate printed nothing; stderr:\n{proc.stderr[-2000:]}"
    try:
        ours = [int(t) for t in lines[-1].split()]
    except ValueError:
        pytest.fail(f"last stdout line is not token ids: {lines[-1]!r}")
    want = p["greedy_ids"]
    div = next((i for i, (a, b) in enumerate(zip(ours, want)) if a != b),
               None if len(ours) == len(want) else min(len(ours), len(want)))
    forward_report.append({
        "variant": name, "prompt_len": len(p["prompt_ids"]), "check": "greedy",
        "weight_type": g["model"]["weight_type"], "first_divergence": div,
        "llama_vs_f64": _floor(p), "passed": div is None})
    if div is not None:
        margins = p["greedy_top2_margin"]
        margin = margins[div] if div < len(margins) else None
        pytest.fail(
            f"{name}, prompt of {len(p['prompt_ids'])} ids: greedy differs from step {div} "
            f"(golden top-1 minus top-2 logit there: {margin})\nours:   {ours}\ngolden: {want}")
