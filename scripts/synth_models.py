#!/usr/bin/env python3
"""Writes small synthetic GGUF models with random weights for forward-pass correctness tests.

Each variant is a tiny transformer in llama.cpp's GGUF layout (tensor names, metadata keys, rotary
pair conventions) whose weights come from a fixed seed, so that every run writes the same bytes.
The tokenizer metadata (tokens, scores, token types, merges, special ids) is copied verbatim from one
of the vocabulary-only GGUF files of llama.cpp's tokenizer tests, so the models load in llama.cpp
and in pdserve like real checkpoints do.

The variants cover the paths a forward pass can get wrong: multi-head and grouped-query attention,
normal and NeoX rotary embeddings, linear rope scaling, Llama-3 frequency factors, QKV biases, tied
and separate output heads, and F32 / F16 / BF16 / Q8_0 weights; Qwen3's per-head QK norm with a
head size of its own, and Phi-3's fused QKV and gate/up matrices. Golden outputs for them are made by
scripts/make_llama_reference.py and checked by tests/python/test_forward_reference.py.

Weight scales. Every matrix is N(0, (gain / sqrt(fan_in))^2), so a unit-RMS input gives an output of
RMS about `gain`; norm weights are 1 plus a little noise. Two choices keep random models from being
degenerate:
  * the token embedding is small (std 0.1) next to what the layers add to the residual stream.
    With a tied output head the logit of the current token is about |e_t|^2 / |h|, and a large
    embedding makes every greedy step repeat its input token. The small embedding also makes the
    first RMS norm sensitive to its epsilon (1e-5 vs 1e-6 moves the logits by ~1.5e-3). The untied
    F16 / BF16 variants use std 1.0 instead, which damps llama.cpp's activation-rounding noise;
  * the output norm weights are scaled so that the logits have a standard deviation of about 3: the
    softmax over ~32k-50k tokens is then neither one-hot nor uniform (top probability of a few %).
The seeds of the F16 / BF16 / Q8_0 variants were picked, among a handful, for the widest top-1 vs
top-2 logit margin along llama.cpp's greedy continuations, so that exact greedy comparisons are not
decided by rounding noise.

Usage:
  python scripts/synth_models.py OUTDIR                     # all variants
  python scripts/synth_models.py OUTDIR --variant llama2_f32 --variant qwen2_bias_f32
  python scripts/synth_models.py --list

As a module: `write_variant(VARIANTS["llama2_f32"], outdir)` returns the path written.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import sys
from pathlib import Path
from typing import Optional

import numpy as np

import gguf

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1 style per-frequency rope factors, stored as the `rope_freqs.weight` tensor.

    `original_context_length` is deliberately tiny (64 rather than Llama 3.1's 8192): the factors
    then touch most rotary frequencies, so a forward pass that ignores `rope_freqs.weight` visibly
    differs within the short prompts the tests use.
    """

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context_length: int = 64


@dataclasses.dataclass(frozen=True)
class Variant:
    """Shape, numeric types and seed of one synthetic model."""

    name: str
    description: str
    arch: str  # "llama", "qwen2", "qwen3", "qwen3moe" or "phi3"
    vocab: str  # NAME of testdata/tokenizer/ggml-vocab-NAME.gguf
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    weight_type: str  # storage of 2-D weights, token_embd and output: f32, f16, bf16, q8_0
    tied_output: bool  # True: no output.weight, the head reuses token_embd.weight
    rope_base: float
    rms_eps: float
    seed: int
    context_length: int = 2048
    rope_linear_factor: Optional[float] = None  # llama.rope.scaling.type = linear
    llama3_rope: Optional[Llama3RopeScaling] = None
    qkv_bias: bool = False
    embd_std: float = 0.1  # std of token_embd entries
    logit_std: float = 3.0  # target standard deviation of the final logits
    qk_gain: float = 1.5  # gain of attn_q / attn_k: attention scores have std ~ qk_gain^2
    down_gain: float = 1.5  # gain of ffn_down
    # Per-head size written as attention.key_length / value_length (Qwen3: n_head * head_dim need
    # not be n_embd); None: n_embd / n_head and no keys.
    key_length: Optional[int] = None
    qk_norm: bool = False  # attn_q_norm / attn_k_norm per-head RMS norm weights (Qwen3)
    # Phi-3 layout: one attn_qkv.weight (rows q, k, v) and an ffn_up.weight of 2 * n_ff rows
    # (gate rows first: llama.cpp's ggml_swiglu applies silu to the first half), no ffn_gate.
    fused: bool = False
    sliding_window: Optional[int] = None  # {arch}.attention.sliding_window
    # Mixture of experts (n_expert > 0): ffn_gate_inp (the router, always F32 as llama.cpp's
    # converter writes it) and ffn_{gate,up,down}_exps stacked over n_expert experts of n_ff rows
    # (llama, i.e. Mixtral) or of expert_ff rows (qwen3moe: {arch}.expert_feed_forward_length).
    n_expert: int = 0
    n_expert_used: int = 0
    expert_ff: Optional[int] = None
    router_gain: float = 4.0  # router logits have std ~ router_gain: decisive expert choices

    @property
    def head_dim(self) -> int:
        return self.key_length if self.key_length is not None else self.n_embd // self.n_head

    @property
    def ff_expert(self) -> int:
        return self.expert_ff if self.expert_ff is not None else self.n_ff

    def validate(self) -> None:
        dims = (self.n_embd, self.n_ff, self.head_dim, self.head_dim * self.n_head_kv,
                self.head_dim * self.n_head, self.ff_expert)
        if any(d % 32 for d in dims):
            raise ValueError(f"{self.name}: all dims must be multiples of 32, got {dims}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"{self.name}: n_head must be a multiple of n_head_kv")
        if self.n_expert and not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError(f"{self.name}: n_expert_used must be in 1..n_expert")
        if self.weight_type not in _GGML_TYPES:
            raise ValueError(f"{self.name}: unknown weight type {self.weight_type}")


_GGML_TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "bf16": gguf.GGMLQuantizationType.BF16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}

_FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant(
            name="llama2_f32",
            description="Llama-2 style: MHA, normal rope, separate output head, F32, SPM vocab",
            arch="llama", vocab="llama-spm",
            n_embd=128, n_layer=2, n_head=4, n_head_kv=4, n_ff=352,
            weight_type="f32", tied_output=False,
            rope_base=10000.0, rms_eps=1e-5, seed=1001,
        ),
        Variant(
            name="llama3_gqa_f32",
            description="Llama-3.2 style: GQA 8/2, rope base 5e5 with rope_freqs factors, "
            "tied head, F32, BPE vocab",
            arch="llama", vocab="deepseek-coder",
            n_embd=256, n_layer=2, n_head=8, n_head_kv=2, n_ff=704,
            weight_type="f32", tied_output=True,
            rope_base=500000.0, rms_eps=1e-5, seed=1002, context_length=8192,
            llama3_rope=Llama3RopeScaling(),
        ),
        Variant(
            name="mistral_gqa_f16",
            description="Mistral style: GQA 4/2 with head_dim 64, linear rope scaling x2, F16 "
            "weights, F32 norms, SPM vocab",
            arch="llama", vocab="llama-spm",
            n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=704,
            weight_type="f16", tied_output=False,
            rope_base=1000000.0, rms_eps=1e-5, seed=18003, context_length=4096,
            rope_linear_factor=2.0,
            # llama.cpp rounds activations to F16 before F16 matmuls. Softer attention and an
            # embedding that carries the residual stream keep the effect of that rounding on the
            # logits near 5e-4 (rel L2) instead of 1.7e-3.
            embd_std=1.0, qk_gain=1.0,
        ),
        Variant(
            name="qwen2_bias_f32",
            description="Qwen2 style: GQA 4/2, NeoX rope, QKV bias, tied head, F32, GPT-2 BPE vocab",
            arch="qwen2", vocab="gpt-2",
            n_embd=128, n_layer=2, n_head=4, n_head_kv=2, n_ff=352,
            weight_type="f32", tied_output=True,
            rope_base=1000000.0, rms_eps=1e-6, seed=1004, context_length=4096,
            qkv_bias=True,
        ),
        Variant(
            name="qwen3_gqa_f32",
            description="Qwen3 style: GQA 4/2 with head_dim 64 (n_head * head_dim = 256 != "
            "n_embd 128), per-head QK RMS norm, NeoX rope, no biases, tied head, F32, GPT-2 BPE "
            "vocab",
            arch="qwen3", vocab="gpt-2",
            n_embd=128, n_layer=2, n_head=4, n_head_kv=2, n_ff=352,
            weight_type="f32", tied_output=True,
            rope_base=1000000.0, rms_eps=1e-6, seed=1007, context_length=4096,
            key_length=64, qk_norm=True,
        ),
        Variant(
            name="phi3_f32",
            description="Phi-3-mini-4k style: fused QKV (GQA 2/1, head_dim 96) and gate/up, "
            "NeoX rope, no biases, sliding window 2047 (not reached by the prompts), separate "
            "head, F32, Phi-3 SPM vocab",
            arch="phi3", vocab="phi-3",
            n_embd=192, n_layer=2, n_head=2, n_head_kv=1, n_ff=512,
            weight_type="f32", tied_output=False,
            rope_base=10000.0, rms_eps=1e-5, seed=1008, context_length=4096,
            fused=True, sliding_window=2047,
        ),
        Variant(
            name="qwen3moe_f32",
            description="Qwen3-MoE style: Qwen3 attention (GQA 4/2, head_dim 64, QK norm), 8 "
            "SwiGLU experts of 96 rows with 2 used per token, softmax router with normalized "
            "weights, tied head, F32, GPT-2 BPE vocab",
            arch="qwen3moe", vocab="gpt-2",
            n_embd=128, n_layer=2, n_head=4, n_head_kv=2, n_ff=352,
            weight_type="f32", tied_output=True,
            rope_base=1000000.0, rms_eps=1e-6, seed=1012, context_length=4096,
            key_length=64, qk_norm=True, n_expert=8, n_expert_used=2, expert_ff=96,
        ),
        Variant(
            name="mixtral_f32",
            description="Mixtral style: llama with 4 experts of n_ff = 160 rows, 2 used per "
            "token, GQA 4/2, normal rope, separate head, F32, SPM vocab",
            arch="llama", vocab="llama-spm",
            n_embd=128, n_layer=2, n_head=4, n_head_kv=2, n_ff=160,
            weight_type="f32", tied_output=False,
            rope_base=1000000.0, rms_eps=1e-5, seed=1010, n_expert=4, n_expert_used=2,
        ),
        Variant(
            name="qwen3moe_q8_0",
            description="Qwen3-MoE style with Q8_0 matrices and experts (F32 router and norms): "
            "16 experts of 64 rows, 4 used per token, 3 layers, separate head, GPT-2 BPE vocab",
            arch="qwen3moe", vocab="gpt-2",
            n_embd=128, n_layer=3, n_head=4, n_head_kv=2, n_ff=256,
            weight_type="q8_0", tied_output=False,
            rope_base=1000000.0, rms_eps=1e-6, seed=1011, context_length=4096,
            key_length=32, qk_norm=True, n_expert=16, n_expert_used=4, expert_ff=64,
            embd_std=1.0, qk_gain=1.0,  # as tinyllama_q8_0: less Q8_0 rounding noise
        ),
        Variant(
            name="tinyllama_q8_0",
            description="TinyLlama style: GQA 8/1, Q8_0 matmul weights, embedding and head, F32 norms, "
            "separate head, SPM vocab",
            arch="llama", vocab="llama-spm",
            n_embd=256, n_layer=2, n_head=8, n_head_kv=1, n_ff=704,
            weight_type="q8_0", tied_output=False,
            rope_base=10000.0, rms_eps=1e-5, seed=8005,
            embd_std=1.0, qk_gain=1.0,  # as mistral_gqa_f16: less Q8_0 rounding noise
        ),
        Variant(
            name="llama_bf16",
            description="Llama style: MHA with head_dim 64, BF16 weights, F32 norms, separate "
            "output head, SPM vocab",
            arch="llama", vocab="llama-spm",
            n_embd=128, n_layer=3, n_head=2, n_head_kv=2, n_ff=352,
            weight_type="bf16", tied_output=False,
            rope_base=10000.0, rms_eps=1e-6, seed=4006,
            embd_std=1.0, qk_gain=1.0,  # as mistral_gqa_f16: less BF16 rounding noise
        ),
    ]
}


# The model `make run` serves until a trained default model is supported: bigger than the test
# variants so that pdctl's speed figures mean something (about 60 MB of Q8_0 weights), random
# weights, so its text is gibberish by construction.
DEMO = Variant(
    name="demo-llama-q8_0",
    description="pdserve demo: synthetic Llama, GQA 8/2, Q8_0, SPM vocab, random weights",
    arch="llama", vocab="llama-spm",
    n_embd=512, n_layer=8, n_head=8, n_head_kv=2, n_ff=1408,
    weight_type="q8_0", tied_output=False,
    rope_base=10000.0, rms_eps=1e-5, seed=7,
    embd_std=1.0, qk_gain=1.0,
)


def tokenizer_dir() -> Path:
    """Folder with ggml-vocab-*.gguf: $PD_TOKENIZER_DIR, else testdata/tokenizer in the repo, else
    the checkout's sibling shared/testdata/tokenizer."""
    env = os.environ.get("PD_TOKENIZER_DIR")
    candidates = [Path(env)] if env else []
    candidates += [REPO_ROOT / "testdata" / "tokenizer",
                   REPO_ROOT.parent / "shared" / "testdata" / "tokenizer"]
    for c in candidates:
        if (c / "ggml-vocab-llama-spm.gguf").is_file():
            return c
    raise FileNotFoundError(
        "no tokenizer vocab GGUFs found; set PD_TOKENIZER_DIR (looked in "
        + ", ".join(str(c) for c in candidates) + ")")


def llama3_rope_factors(head_dim: int, base: float, s: Llama3RopeScaling) -> np.ndarray:
    """Per-frequency divisors of the rotary frequencies, Llama 3.1 scheme. Shape [head_dim / 2].

    High frequencies (wavelength below original_context / high_freq_factor) are kept, low ones
    (wavelength above original_context / low_freq_factor) are divided by `factor`, and the band in
    between is interpolated smoothly. llama.cpp divides theta_i by the stored value.
    """
    low_wavelen = s.original_context_length / s.low_freq_factor
    high_wavelen = s.original_context_length / s.high_freq_factor
    factors = []
    for i in range(head_dim // 2):
        freq = base ** (-2.0 * i / head_dim)
        wavelen = 2.0 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(s.factor)
        else:
            smooth = (s.original_context_length / wavelen - s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor)
            factors.append(1.0 / ((1.0 - smooth) / s.factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def _copy_tokenizer_metadata(writer: gguf.GGUFWriter, vocab_path: Path) -> int:
    """Copies every tokenizer.* key of a vocab GGUF byte for byte. Returns the vocabulary size."""
    reader = gguf.GGUFReader(vocab_path)
    n_vocab = None
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(field.parts[i].tobytes()) for i in field.data]
            else:
                val = [field.parts[i][0].item() for i in field.data]
            writer.add_key_value(key, val, vtype, sub_type=sub)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(val)
        elif vtype == gguf.GGUFValueType.STRING:
            writer.add_key_value(key, bytes(field.parts[field.data[0]].tobytes()), vtype)
        else:
            writer.add_key_value(key, field.parts[field.data[0]][0].item(), vtype)
    if n_vocab is None:
        raise ValueError(f"{vocab_path} has no tokenizer.ggml.tokens")
    return n_vocab


class _WeightMaker:
    """Draws weights from one seeded generator in a fixed order."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(
            np.float32)

    def matrix(self, n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        """[n_out, n_in] in numpy order, i.e. ggml ne = {n_in, n_out}."""
        return self.normal((n_out, n_in), gain / math.sqrt(n_in))

    def norm(self, n: int, scale: float = 1.0, noise: float = 0.1) -> np.ndarray:
        return (np.float32(scale) * (1.0 + self.normal((n,), noise))).astype(np.float32)


def _add_weight(writer: gguf.GGUFWriter, name: str, w: np.ndarray, weight_type: str) -> None:
    qtype = _GGML_TYPES[weight_type]
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, w.astype(np.float32))
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, w.astype(np.float16))
    else:
        data = gguf.quants.quantize(w, qtype)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)


def write_variant(v: Variant, outdir: Path, vocab_dir: Optional[Path] = None) -> Path:
    """Writes OUTDIR/<name>.gguf and returns its path. Same bytes on every run."""
    v.validate()
    vocab_dir = vocab_dir or tokenizer_dir()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / f"{v.name}.gguf"
    tmp = path.with_suffix(".gguf.tmp")

    writer = gguf.GGUFWriter(str(tmp), v.arch)
    writer.add_name(v.name)
    writer.add_description(v.description)
    writer.add_file_type(int(_FILE_TYPES[v.weight_type]))
    if v.weight_type == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(v.context_length)
    writer.add_embedding_length(v.n_embd)
    writer.add_block_count(v.n_layer)
    writer.add_feed_forward_length(v.n_ff)
    writer.add_head_count(v.n_head)
    writer.add_head_count_kv(v.n_head_kv)
    writer.add_layer_norm_rms_eps(v.rms_eps)
    writer.add_rope_freq_base(v.rope_base)
    writer.add_rope_dimension_count(v.head_dim)
    if v.key_length is not None:
        writer.add_key_length(v.key_length)
        writer.add_value_length(v.key_length)
    if v.sliding_window is not None:
        writer.add_sliding_window(v.sliding_window)
    if v.n_expert:
        writer.add_expert_count(v.n_expert)
        writer.add_expert_used_count(v.n_expert_used)
        if v.expert_ff is not None:
            writer.add_expert_feed_forward_length(v.expert_ff)
    if v.rope_linear_factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(v.rope_linear_factor)
    n_vocab = _copy_tokenizer_metadata(writer, vocab_dir / f"ggml-vocab-{v.vocab}.gguf")
    writer.add_vocab_size(n_vocab)

    mk = _WeightMaker(v.seed)
    d, hd, ff = v.n_embd, v.head_dim, v.n_ff
    n_q, n_kv = v.n_head * hd, v.n_head_kv * hd

    embd = mk.normal((n_vocab, d), v.embd_std)
    _add_weight(writer, "token_embd.weight", embd, v.weight_type)
    if v.llama3_rope is not None:
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(hd, v.rope_base, v.llama3_rope))

    for il in range(v.n_layer):
        p = f"blk.{il}."
        writer.add_tensor(p + "attn_norm.weight", mk.norm(d))
        wq = mk.matrix(n_q, d, v.qk_gain)
        wk = mk.matrix(n_kv, d, v.qk_gain)
        wv = mk.matrix(n_kv, d)
        if v.fused:
            _add_weight(writer, p + "attn_qkv.weight", np.concatenate([wq, wk, wv]),
                        v.weight_type)
        else:
            _add_weight(writer, p + "attn_q.weight", wq, v.weight_type)
            _add_weight(writer, p + "attn_k.weight", wk, v.weight_type)
            _add_weight(writer, p + "attn_v.weight", wv, v.weight_type)
        if v.qk_norm:
            writer.add_tensor(p + "attn_q_norm.weight", mk.norm(hd))
            writer.add_tensor(p + "attn_k_norm.weight", mk.norm(hd))
        if v.qkv_bias:
            writer.add_tensor(p + "attn_q.bias", mk.normal((n_q,), 0.3))
            writer.add_tensor(p + "attn_k.bias", mk.normal((n_kv,), 0.3))
            writer.add_tensor(p + "attn_v.bias", mk.normal((n_kv,), 0.3))
        _add_weight(writer, p + "attn_output.weight", mk.matrix(d, n_q), v.weight_type)
        writer.add_tensor(p + "ffn_norm.weight", mk.norm(d))
        if v.n_expert:
            fe, ne = v.ff_expert, v.n_expert
            writer.add_tensor(p + "ffn_gate_inp.weight", mk.matrix(ne, d, v.router_gain))
            # [n_expert, rows, cols] in numpy order: ggml ne = {cols, rows, n_expert}.
            _add_weight(writer, p + "ffn_gate_exps.weight",
                        np.stack([mk.matrix(fe, d) for _ in range(ne)]), v.weight_type)
            _add_weight(writer, p + "ffn_up_exps.weight",
                        np.stack([mk.matrix(fe, d) for _ in range(ne)]), v.weight_type)
            _add_weight(writer, p + "ffn_down_exps.weight",
                        np.stack([mk.matrix(d, fe, v.down_gain) for _ in range(ne)]),
                        v.weight_type)
            continue
        gate = mk.matrix(ff, d)
        up = mk.matrix(ff, d)
        if v.fused:
            _add_weight(writer, p + "ffn_up.weight", np.concatenate([gate, up]), v.weight_type)
        else:
            _add_weight(writer, p + "ffn_gate.weight", gate, v.weight_type)
            _add_weight(writer, p + "ffn_up.weight", up, v.weight_type)
        _add_weight(writer, p + "ffn_down.weight", mk.matrix(d, ff, v.down_gain), v.weight_type)

    # logit_j = sum_k W_jk g_k n_k with unit-RMS n: std = g * std(W) * sqrt(d).
    head_std = v.embd_std if v.tied_output else 1.0 / math.sqrt(d)
    writer.add_tensor("output_norm.weight",
                      mk.norm(d, scale=v.logit_std / (head_std * math.sqrt(d))))
    if not v.tied_output:
        _add_weight(writer, "output.weight", mk.matrix(n_vocab, d), v.weight_type)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write small synthetic GGUF models (random weights, fixed seeds, "
        "deterministic bytes) for forward-pass tests.",
        epilog="Variants: " + ", ".join(VARIANTS))
    parser.add_argument("outdir", nargs="?", type=Path, help="folder to write <variant>.gguf into")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), metavar="NAME",
                        help="variant to write (repeatable; default: all)")
    parser.add_argument("--tokenizer-dir", type=Path,
                        help="folder with ggml-vocab-*.gguf (default: $PD_TOKENIZER_DIR, "
                        "testdata/tokenizer, ../shared/testdata/tokenizer)")
    parser.add_argument("--sha256", action="store_true", help="also print each file's SHA-256")
    parser.add_argument("--list", action="store_true", help="list the variants and exit")
    parser.add_argument("--demo", type=Path, metavar="PATH",
                        help="write the demo model (what `make run` serves) to PATH and exit")
    args = parser.parse_args(argv)

    if args.demo is not None:
        path = write_variant(DEMO, args.demo.parent, args.tokenizer_dir)
        if path != args.demo:
            path.replace(args.demo)
        print(args.demo)
        return 0

    if args.list:
        for v in VARIANTS.values():
            print(f"{v.name:18s} {v.description}")
        return 0
    if args.outdir is None:
        parser.error("OUTDIR is required")
    for name in args.variant or list(VARIANTS):
        path = write_variant(VARIANTS[name], args.outdir, args.tokenizer_dir)
        print(f"{path}  {sha256_file(path)}" if args.sha256 else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
