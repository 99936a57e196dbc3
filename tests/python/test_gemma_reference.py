"""The default model (Gemma 3 270M, Q4_K_M) against llama.cpp on the same file.

References come from scripts/make_gemma_reference.py (llama.cpp through llama-cpp-python, built
natively on an AVX-512 machine). The targets of the Gemma issue are top-1 agreement >= 99% and
mean KL(llama.cpp || ours) <= 1e-3 over 2,048 positions of held-out text, and identical greedy
64-token continuations of the 20 prompts of testdata/gemma/prompts.txt (a divergence explained
only where llama.cpp's two best logits are within 1e-4).

This model amplifies a one-ulp difference anywhere into a different Q8 activation code a few
layers on (llama.cpp against itself with its repacked kernels off agrees on only 96% of top-1
tokens), so the targets need the same bits as llama.cpp, not merely close ones. Our CPU backend
reproduces the summation orders of ggml's x86 kernels (docs/numerics.md; checked tensor by tensor
with scripts/compare_intermediates.py): measured top-1 1.0000, mean KL 3e-9, 20/20 identical.
ggml's attention order depends on the vector width it was built for, so the targets are asserted
where the CPU has what the reference machine had (AVX512F/DQ/VL/VNNI); elsewhere the tests hold
the regression floors of an unmatched order (a real bug, e.g. a wrong rope base or norm, gives
KL > 0.1).

The AVX2 path is checked the same way against its own reference, reference_avx2.json (made by
make_gemma_reference.py --isa avx2 from llama.cpp's AVX2-only build,
bench/llamacpp/build_avx2_lib.sh): our side runs under PDSERVE_CPU_ISA=avx2, and the targets hold
on any CPU with AVX2 + FMA + F16C (both builds fix their orders at compile time).

KL is computed over llama.cpp's 32 most likely tokens plus one bucket for the rest of the
vocabulary (both distributions coarsened the same way), which is a lower bound of the full KL by
the data-processing inequality; the uncovered mass is reported with it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _same_orders_as_reference() -> bool:
    """The CPU has the instruction sets whose ggml orders the reference was made with."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return {"avx512f", "avx512dq", "avx512vl", "avx512_vnni", "avx2", "fma"} <= flags


def _has_avx2() -> bool:
    try:
        return {"avx2", "fma", "f16c"} <= set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False


SAME_ORDERS = _same_orders_as_reference()
MODEL = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"
REF = REPO / "testdata" / "reference" / "gemma3" / "reference.json"
REF_AVX2 = REPO / "testdata" / "reference" / "gemma3" / "reference_avx2.json"
OUR_TOP = 64
# Per kernel set: (reference, PDSERVE_CPU_ISA for our side, whether the targets apply here).
ISAS = {"native": (REF, "", SAME_ORDERS), "avx2": (REF_AVX2, "avx2", _has_avx2())}


def _load(path: Path) -> dict:
    if not MODEL.exists():
        pytest.fail(f"{MODEL} is missing: run `make setup` (it assembles the default model)")
    data = json.loads(path.read_text())
    h = hashlib.sha256(MODEL.read_bytes()).hexdigest()
    assert h == data["model_sha256"], "the default model file differs from the referenced one"
    return data


@pytest.fixture(scope="module")
def ref() -> dict:
    return _load(REF)


@pytest.fixture(scope="module", params=list(ISAS))
def isa_ref(request) -> tuple[str, dict, dict, bool]:
    """(name, reference, environment for pdctl, targets apply)."""
    path, cap, targets = ISAS[request.param]
    if request.param == "avx2" and not _has_avx2():
        pytest.skip("CPU without AVX2/FMA/F16C")
    env = dict(os.environ, PDSERVE_CPU_ISA=cap)
    env.pop("PDSERVE_CPU_NO_VNNI", None)
    return request.param, _load(path), env, targets


def _decode(s: str, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=dtype)


# _our_top's answers by (pdctl, environment, KV type, prompt): the F16 test's log-loss passes and
# the F32 test read the same windows (pdctl logits is deterministic for a given kernel set).
_OUR_TOP_CACHE: dict = {}


def _our_top(pdctl: Path, ids: list[int], tmp_path: Path, env: dict,
             kv_type: str = "f32") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    key = (str(pdctl), tuple(sorted(env.items())), kv_type, tuple(ids))
    if key not in _OUR_TOP_CACHE:
        _OUR_TOP_CACHE[key] = _run_our_top(pdctl, ids, tmp_path, env, kv_type)
    return _OUR_TOP_CACHE[key]


def _run_our_top(pdctl: Path, ids: list[int], tmp_path: Path, env: dict,
                 kv_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out = tmp_path / "top.bin"
    subprocess.run([str(pdctl), "logits", "-m", str(MODEL), "--prompt-ids", " ".join(map(str, ids)),
                    "--all", "--top", str(OUR_TOP), "--kv-type", kv_type, "-o", str(out)],
                   check=True, capture_output=True, timeout=600, env=env)
    rec = np.dtype([("lse", "<f4"), ("ids", "<i4", OUR_TOP), ("logits", "<f4", OUR_TOP)])
    r = np.fromfile(out, dtype=rec)
    assert len(r) == len(ids)
    return r["lse"], r["ids"], r["logits"]


def _eval_agreement(pdctl, ref: dict, tmp_path: Path, env: dict,
                    kv_type: str) -> tuple[int, float, list[float], list[float]]:
    """(positions, top-1 agreement, KL per position, llama.cpp's mass outside its top-k)."""
    k = ref["topk"]
    agree = total = 0
    kls, uncovered = [], []
    for w in ref["eval"]:
        ids = w["ids"]
        n = len(ids)
        ref_ids = _decode(w["top_ids_b64"], np.int32).reshape(n, k)
        ref_lp = _decode(w["top_logprobs_b64"], np.float32).reshape(n, k).astype(np.float64)
        lse, our_ids, our_logits = _our_top(pdctl, ids, tmp_path, env, kv_type)
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
    return total, agree / total, kls, uncovered


def _text_log_loss(pdctl, ref: dict, tmp_path: Path, env: dict, kv_type: str) -> float:
    """Mean negative log-probability of the evaluation text's next tokens, with a token outside
    our listed top tokens scored at the last listed one's (the same bound for every setting)."""
    nll = []
    for w in ref["eval"]:
        ids = w["ids"]
        lse, our_ids, our_logits = _our_top(pdctl, ids, tmp_path, env, kv_type)
        for i in range(len(ids) - 1):
            row = dict(zip(our_ids[i].tolist(), our_logits[i].tolist()))
            nll.append(float(lse[i]) - row.get(ids[i + 1], float(our_logits[i, -1])))
    return float(np.mean(nll))


def test_eval_text_top1_and_kl(pdctl, isa_ref, tmp_path, measurement):
    isa, ref, env, targets = isa_ref
    k = ref["topk"]
    total, top1, kls, uncovered = _eval_agreement(pdctl, ref, tmp_path, env, "f32")
    mean_kl = float(np.mean(kls))
    measurement(f"gemma3 eval ({isa}): {total} positions, top-1 agreement {top1:.4f}, mean KL {mean_kl:.3e}, "
          f"max KL {max(kls):.3e}, mass outside llama.cpp's top-{k}: {np.mean(uncovered):.3e}")
    assert total >= 2000
    if targets:
        assert top1 >= 0.99, f"top-1 agreement {top1:.4f} misses the 99% target"
        assert mean_kl <= 1e-3, f"mean KL {mean_kl:.3e} misses the 1e-3 target"
    else:
        assert top1 >= 0.94, f"top-1 agreement {top1:.4f} fell below the regression floor"
        assert mean_kl <= 6e-3, f"mean KL {mean_kl:.3e} rose above the regression floor"


def test_f16_kv_stays_within_the_floor_of_an_unmatched_order(pdctl, isa_ref, tmp_path,
                                                              measurement):
    """The F16 K/V cache (the serving default) is not llama.cpp's bits: it rounds K and V to F16,
    a prompt's attention sums in the GEMM order, and with AVX512-VNNI the head's and the layers'
    Q8_0 / Q5_0 matmuls take pdserve's own order (docs/numerics.md). On this model any one-ulp
    change is amplified (see the module docstring): measured against the F32 reference, F16 in
    ggml's order gives mean KL 4.4e-3 and top-1 0.945, in the GEMM order 4.5e-3 and 0.954, with
    the own-order layers 4.4e-3 and 0.940 (124 against 94 top-1 flips of 2,048, all at
    llama.cpp top-2 margins under 0.53 nats, as the other orders' under 0.49); the text's mean
    log-loss moves by under 0.003 nats in every case. Held here to the regression floor of an
    unmatched order and to the text's log-loss; a real bug (a wrong position, a dropped key)
    gives KL > 0.1 and costs the text tenths of a nat."""
    isa, ref, env, targets = isa_ref
    total, top1, kls, _ = _eval_agreement(pdctl, ref, tmp_path, env, "f16")
    mean_kl = float(np.mean(kls))
    loss_f16 = _text_log_loss(pdctl, ref, tmp_path, env, "f16")
    loss_f32 = _text_log_loss(pdctl, ref, tmp_path, env, "f32")
    measurement(f"gemma3 eval ({isa}, F16 KV): {total} positions, top-1 agreement {top1:.4f}, "
                f"mean KL {mean_kl:.3e}, max KL {max(kls):.3e}, text log-loss {loss_f16:.4f} "
                f"(F32 KV {loss_f32:.4f})")
    assert total >= 2000
    assert top1 >= 0.93, f"top-1 agreement {top1:.4f} fell below the regression floor"
    assert mean_kl <= 6e-3, f"mean KL {mean_kl:.3e} rose above the regression floor"
    assert abs(loss_f16 - loss_f32) <= 0.01, \
        f"the text's log-loss moved from {loss_f32:.4f} (F32 KV) to {loss_f16:.4f} nats"


def test_greedy_continuations(pdctl, isa_ref, measurement):
    isa, ref, env, targets = isa_ref
    unexplained = []
    exact = 0
    for g in ref["greedy"]:
        p = subprocess.run([str(pdctl), "generate", "-m", str(MODEL), "--prompt-ids",
                            " ".join(map(str, g["prompt_ids"])), "-n", "64", "--temperature", "0",
                            "--ignore-eos", "--print-ids", "--kv-type", "f32"],
                           check=True, capture_output=True, timeout=600, env=env)
        ours = [int(t) for t in p.stdout.decode().strip().splitlines()[-1].split()]
        gold = g["greedy_ids"]
        div = next((i for i, (a, b) in enumerate(zip(ours, gold)) if a != b), None)
        if div is not None and g["margins"][div] >= 1e-4:
            unexplained.append((g["prompt"], div, g["margins"][div]))
        exact += div is None
        if div is not None:
            measurement(f"gemma3 greedy ({isa}) {g['prompt'][:30]!r}: diverges at step {div} "
                        f"(llama.cpp top-2 margin there {g['margins'][div]:.2e})")
    measurement(f"gemma3 greedy ({isa}): {exact}/{len(ref['greedy'])} continuations of 64 tokens "
                "identical")
    if targets:  # the target: every continuation identical, or diverging at a near-tie
        assert not unexplained, f"greedy continuations diverge: {unexplained}"
    else:  # regression floor of an unmatched order (see the module docstring)
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
