"""The default model (Gemma 3 270M, Q4_K_M) against llama.cpp on the same file.

References come from scripts/make_gemma_reference.py (llama.cpp through llama-cpp-python). The
targets of the Gemma issue are top-1 agreement >= 99% and mean KL(llama.cpp || ours) <= 1e-3 over
2,048 positions of held-out text, and identical greedy 64-token continuations of the 20 prompts of
testdata/gemma/prompts.txt (a divergence explained only where llama.cpp's two best logits are
within 1e-4). They are NOT met yet (the issue stays open): we measure top-1 0.960, mean KL 3.8e-3,
8/20 identical (0.951, 4.6e-3, 7/20 before Q8_0 activations were quantized like ggml-cpu's x86
quantize_row_q8_0: id = 127 / amax, ties to even). For scale, llama.cpp against itself on the same file with its repacked kernels
switched off (use_extra_bufts=false) gives top-1 0.960 and mean KL 5.2e-3 on the same positions:
the Q4_K_M activation-quantization noise of this small model is of that size, and any kernel that
rounds in a different order lands there. The assertions below are regression floors at that level
(a real bug, e.g. a wrong rope base or norm, gives KL > 0.1); the measured figures are printed
under 'measurements' at the end of the run.

KL is computed over llama.cpp's 32 most likely tokens plus one bucket for the rest of the
vocabulary (both distributions coarsened the same way), which is a lower bound of the full KL by
the data-processing inequality; the uncovered mass is reported with it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"
REF = REPO / "testdata" / "reference" / "gemma3" / "reference.json"
OUR_TOP = 64


@pytest.fixture(scope="module")
def ref() -> dict:
    if not MODEL.exists():
        pytest.fail(f"{MODEL} is missing: run `make setup` (it assembles the default model)")
    data = json.loads(REF.read_text())
    h = hashlib.sha256(MODEL.read_bytes()).hexdigest()
    assert h == data["model_sha256"], "the default model file differs from the referenced one"
    return data


def _decode(s: str, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=dtype)


def _our_top(pdctl: Path, ids: list[int], tmp_path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out = tmp_path / "top.bin"
    subprocess.run([str(pdctl), "logits", "-m", str(MODEL), "--prompt-ids", " ".join(map(str, ids)),
                    "--all", "--top", str(OUR_TOP), "--kv-type", "f32", "-o", str(out)],
                   check=True, capture_output=True, timeout=600)
    rec = np.dtype([("lse", "<f4"), ("ids", "<i4", OUR_TOP), ("logits", "<f4", OUR_TOP)])
    r = np.fromfile(out, dtype=rec)
    assert len(r) == len(ids)
    return r["lse"], r["ids"], r["logits"]


def test_eval_text_top1_and_kl(pdctl, ref, tmp_path, measurement):
    k = ref["topk"]
    agree = total = 0
    kls, uncovered = [], []
    for w in ref["eval"]:
        ids = w["ids"]
        n = len(ids)
        ref_ids = _decode(w["top_ids_b64"], np.int32).reshape(n, k)
        ref_lp = _decode(w["top_logprobs_b64"], np.float32).reshape(n, k).astype(np.float64)
        lse, our_ids, our_logits = _our_top(pdctl, ids, tmp_path)
        for i in range(n):
            total += 1
            agree += int(our_ids[i, 0] == ref_ids[i, 0])
            ours = dict(zip(our_ids[i].tolist(), (our_logits[i].astype(np.float64) - lse[i]).tolist()))
            floor = float(our_logits[i, -1]) - float(lse[i])  # tokens we did not list are below this
            q = np.array([ours.get(t, floor) for t in ref_ids[i].tolist()])
            p = ref_lp[i]
            pk, qk = np.exp(p), np.exp(q)
            p_rest, q_rest = max(1 - pk.sum(), 1e-12), max(1 - qk.sum(), 1e-12)
            kl = float(np.sum(pk * (p - q)) + p_rest * (np.log(p_rest) - np.log(q_rest)))
            kls.append(kl)
            uncovered.append(p_rest)
    top1 = agree / total
    mean_kl = float(np.mean(kls))
    measurement(f"gemma3 eval: {total} positions, top-1 agreement {top1:.4f}, mean KL {mean_kl:.3e}, "
          f"max KL {max(kls):.3e}, mass outside llama.cpp's top-{k}: {np.mean(uncovered):.3e}")
    assert total >= 2000
    assert top1 >= 0.94, f"top-1 agreement {top1:.4f} fell below the regression floor"
    assert mean_kl <= 6e-3, f"mean KL {mean_kl:.3e} rose above the regression floor"


def test_greedy_continuations(pdctl, ref, measurement):
    unexplained = []
    exact = 0
    for g in ref["greedy"]:
        p = subprocess.run([str(pdctl), "generate", "-m", str(MODEL), "--prompt-ids",
                            " ".join(map(str, g["prompt_ids"])), "-n", "64", "--temperature", "0",
                            "--ignore-eos", "--print-ids", "--kv-type", "f32"],
                           check=True, capture_output=True, timeout=600)
        ours = [int(t) for t in p.stdout.decode().strip().splitlines()[-1].split()]
        gold = g["greedy_ids"]
        div = next((i for i, (a, b) in enumerate(zip(ours, gold)) if a != b), None)
        if div is not None and g["margins"][div] >= 1e-4:
            unexplained.append((g["prompt"], div, g["margins"][div]))
        exact += div is None
        if div is not None:
            measurement(f"gemma3 greedy {g['prompt'][:30]!r}: diverges at step {div} "
                        f"(llama.cpp top-2 margin there {g['margins'][div]:.2e})")
    measurement(f"gemma3 greedy: {exact}/{len(ref['greedy'])} continuations of 64 tokens identical")
    # Regression floor (target: all 20 identical or explained; see the module docstring).
    assert exact >= 5, f"only {exact}/20 greedy continuations identical; diverging: {unexplained}"


def test_tokenization_matches_llamacpp(pdctl, ref, tmp_path, measurement):
    """The evaluation text and the corpus strings tokenize to llama.cpp's ids (no special tokens)."""
    eval_text = tmp_path / "eval.txt"
    import sys
    sys.path.insert(0, str(REPO / "scripts"))
    import texts
    eval_text.write_bytes(texts.build_text("evaluation"))
    p = subprocess.run([str(pdctl), "tokenize", "-m", str(MODEL), "--no-special", "--file",
                        str(eval_text)], check=True, capture_output=True, timeout=300)
    ours = [int(t) for t in p.stdout.split()]
    assert ours == ref["tokenize"]["eval_text_ids"]
    corpus = [bytes.fromhex(json.loads(line)["hex"]) for line in
              (REPO / "testdata" / "tokenizer" / "corpus.jsonl").read_text().splitlines() if line]
    checked = 0
    for i in range(0, len(corpus), 8):  # every 8th string: each call loads the 262k vocabulary
        gold = ref["tokenize"]["corpus"][i]
        if isinstance(gold, dict):
            continue  # llama.cpp refused the string
        f = tmp_path / "s.txt"
        f.write_bytes(corpus[i])
        p = subprocess.run([str(pdctl), "tokenize", "-m", str(MODEL), "--no-special", "--file",
                            str(f)], check=True, capture_output=True, timeout=60)
        assert [int(t) for t in p.stdout.split()] == gold, f"corpus string {i}: {corpus[i]!r}"
        checked += 1
    measurement(f"gemma3 tokenization: evaluation text ({len(ours)} ids) and {checked} corpus "
                f"strings identical to llama.cpp")
