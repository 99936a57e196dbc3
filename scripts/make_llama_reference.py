#!/usr/bin/env python3
"""Makes llama.cpp golden outputs for the synthetic models of scripts/synth_models.py.

For each variant the script writes the model (deterministic bytes), runs it in llama.cpp through
llama-cpp-python on three fixed prompts given as token ids, and stores in
testdata/reference/llama/<variant>.json:
  * the model file's SHA-256 and size, so a test can tell when the synthetic model drifted;
  * the llama.cpp settings and library versions used;
  * per prompt: the prompt ids, the float32 logits of the last prompt position (base64 of the raw
    little-endian bytes), and the 32-token greedy continuation (EOS ignored, exactly 32 tokens),
    with the top-1 minus top-2 logit margin of every greedy step;
  * a cross-check against an independent float64 NumPy forward pass written from the GGUF
    (weights dequantized, activations kept in float64): the relative L2 error of llama.cpp's
    logits against it, and whether its greedy continuation agrees. It shows that llama.cpp reads
    the synthetic files the way they were meant (rope layout, GQA grouping, rope scaling, biases,
    tied head) and what error an implementation that keeps activations in full precision should
    expect against these goldens. For F16 / BF16 / Q8_0 weights a second NumPy pass rounds each
    matmul input the way ggml's CPU backend does (to F16, to BF16, to Q8_0 blocks) and records
    how close that gets.

Noise floor of the reduced-precision goldens. ggml rounds matmul inputs to the weight's
vec_dot_type, so llama.cpp's F16 / BF16 / Q8_0 logits carry that rounding noise. An implementation
that rounds the same way matches closely until one rounding lands on the other side of a tie
(an input that differs by one float32 ulp); from there the difference cascades to the size of the
rounding noise itself. `crosscheck_numpy_f64` in each golden shows both numbers per prompt.

llama.cpp settings (see SETTINGS): CPU only, n_ctx 512, n_batch = n_ubatch = 512, 2 threads, F32 K
and V caches, flash attention off, logits for every position. Each prompt runs in a fresh context;
greedy decoding is argmax over llama.cpp's logits, one token per decode call.

Running the script twice on the same machine writes identical files.

Usage:
  python scripts/make_llama_reference.py                       # all variants
  python scripts/make_llama_reference.py --variant llama2_f32  # one
  python scripts/make_llama_reference.py --check               # regenerate in memory, compare
  python scripts/make_llama_reference.py --sensitivity         # how far bugs move the logits
"""

from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import json
import math
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import numpy as np

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth_models  # noqa: E402

REPO_ROOT = synth_models.REPO_ROOT
DEFAULT_OUT = REPO_ROOT / "testdata" / "reference" / "llama"
FORMAT_VERSION = 1
PROMPT_LENGTHS = (1, 7, 40)
N_GREEDY = 32
PROMPT_SEED = 20240607

GGML_TYPE_F32 = 0
SETTINGS: dict[str, Any] = {
    "n_ctx": 512,
    "n_batch": 512,
    "n_ubatch": 512,
    "n_threads": 2,
    "n_threads_batch": 2,
    "seed": 1234,
    "type_k": GGML_TYPE_F32,
    "type_v": GGML_TYPE_F32,
    "flash_attn": False,
    "n_gpu_layers": 0,
    "logits_all": True,
    "use_mmap": True,
}
SETTINGS_NOTE = (
    "llama_cpp.Llama(**settings); a fresh context per prompt; Llama.eval(prompt_ids) as one batch, "
    "then greedy = argmax of the last row of scores, eval([token]) per step, 32 steps, EOS ignored; "
    "type_k/type_v 0 = GGML_TYPE_F32; flash_attn False = LLAMA_FLASH_ATTN_TYPE_DISABLED")


# ---------------------------------------------------------------------------------------------
# Prompts


def make_prompts(v: synth_models.Variant, model_path: Path) -> list[list[int]]:
    """Three prompts of PROMPT_LENGTHS ids: normal tokens from a fixed RNG, BOS first when the
    tokenizer adds one (tokenizer.ggml.add_bos_token)."""
    reader = gguf.GGUFReader(model_path)
    fields = reader.fields
    token_type = np.asarray(fields["tokenizer.ggml.token_type"].contents())
    normal_ids = np.flatnonzero(token_type == int(gguf.TokenType.NORMAL))
    add_bos = ("tokenizer.ggml.add_bos_token" in fields
               and bool(fields["tokenizer.ggml.add_bos_token"].contents()))
    bos = int(fields["tokenizer.ggml.bos_token_id"].contents()) if add_bos else None
    rng = np.random.default_rng(PROMPT_SEED + v.seed)
    prompts = []
    for n in PROMPT_LENGTHS:
        head = [bos] if bos is not None else []
        body = rng.choice(normal_ids, size=n - len(head), replace=True)
        prompts.append(head + [int(t) for t in body])
    return prompts


# ---------------------------------------------------------------------------------------------
# llama.cpp


def run_llama(model_path: Path, prompt: list[int]) -> tuple[np.ndarray, list[int], list[float]]:
    """Returns (last-position logits [n_vocab] float32, 32 greedy ids, top-2 margins)."""
    import llama_cpp  # imported lazily: --help and the NumPy path work without it

    llm = llama_cpp.Llama(str(model_path), verbose=False, **SETTINGS)
    try:
        llm.eval(prompt)
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)
        ids, margins = [], []
        for step in range(N_GREEDY):
            row = llm.scores[llm.n_tokens - 1]
            tok = int(np.argmax(row))
            ids.append(tok)
            margins.append(_top2_margin(row))
            if step + 1 < N_GREEDY:
                llm.eval([tok])
        return logits, ids, margins
    finally:
        llm.close()


def _top2_margin(row: np.ndarray) -> float:
    top2 = np.partition(np.asarray(row, dtype=np.float64), -2)[-2:]
    return float(top2[1] - top2[0])


# ---------------------------------------------------------------------------------------------
# Independent NumPy forward pass (float64)


class NumpyModel:
    """Float64 forward pass of a llama/qwen2/qwen3/qwen3moe/phi3 GGUF, from the GGUF conventions.

    Weights are dequantized to float32 and then held in float64; nothing is rounded on the way.
    Rotary pairs are (2i, 2i+1) for llama (GGUF stores Q/K rows in that order) and (i, i + d/2)
    for qwen2, qwen3 and phi3 (NeoX). theta_i = pos * base^(-2i/d) * freq_scale / rope_freqs[i].
    The head size is attention.key_length when given. qwen3 RMS-normalizes each head of Q and K
    (attn_q_norm / attn_k_norm) before rope. phi3's fused matrices are split by rows: attn_qkv
    into q, k, v; ffn_up (2 * n_ff rows) into gate (first half) and up. A phi3 sliding window
    lets each position see the last `window` positions. Experts (ffn_gate_inp): see _experts.
    """

    def __init__(self, path: Path, ggml_rounding: bool = False):
        self.ggml_rounding = ggml_rounding
        r = gguf.GGUFReader(path)
        f = r.fields
        arch = f["general.architecture"].contents()

        def kv(key: str, default: Any = None) -> Any:
            full = f"{arch}.{key}"
            return f[full].contents() if full in f else default

        self.arch = arch
        self.n_embd = int(kv("embedding_length"))
        self.n_layer = int(kv("block_count"))
        self.n_head = int(kv("attention.head_count"))
        self.n_head_kv = int(kv("attention.head_count_kv", self.n_head))
        self.eps = float(kv("attention.layer_norm_rms_epsilon"))
        self.base = float(kv("rope.freq_base", 10000.0))
        self.head_dim = int(kv("attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(kv("rope.dimension_count", self.head_dim))
        self.freq_scale = 1.0
        if kv("rope.scaling.type") == "linear":
            self.freq_scale = 1.0 / float(kv("rope.scaling.factor"))
        self.neox = arch in ("qwen2", "qwen3", "qwen3moe", "phi3")
        self.n_expert_used = int(kv("expert_used_count", 0))
        self.window = int(kv("attention.sliding_window", 0)) if arch == "phi3" else 0
        self.w: dict[str, np.ndarray] = {}
        self.wtype: dict[str, gguf.GGMLQuantizationType] = {}
        for t in r.tensors:
            self.wtype[t.name] = t.tensor_type
            data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
            self.w[t.name] = np.asarray(data, dtype=np.float64).reshape(
                tuple(int(x) for x in reversed(t.shape)))
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]
            self.wtype["output.weight"] = self.wtype["token_embd.weight"]
        self._split_fused()
        self.use_rope_freqs = True
        self.use_qk_norm = True  # only for --sensitivity: False forgets the per-head QK norm
        self.gqa_interleaved = False  # only for --sensitivity: the wrong query-to-kv-head map

    def _split_fused(self, swap_gate_up: bool = False) -> None:
        """Splits phi3's fused matrices into the per-projection names last_logits reads.
        swap_gate_up (only for --sensitivity) takes the halves of ffn_up the wrong way round."""
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        for il in range(self.n_layer):
            p = f"blk.{il}."
            if p + "attn_qkv.weight" in self.w:
                qkv, t = self.w[p + "attn_qkv.weight"], self.wtype[p + "attn_qkv.weight"]
                assert qkv.shape[0] == q_dim + 2 * kv_dim, qkv.shape
                for name, rows in (("attn_q", slice(0, q_dim)),
                                   ("attn_k", slice(q_dim, q_dim + kv_dim)),
                                   ("attn_v", slice(q_dim + kv_dim, q_dim + 2 * kv_dim))):
                    self.w[p + name + ".weight"], self.wtype[p + name + ".weight"] = qkv[rows], t
            if p + "ffn_up.weight" not in self.w:
                continue  # experts (ffn_*_exps)
            if p + "ffn_gate.weight" not in self.w or p + "ffn_up_fused" in self.w:
                fused = self.w.setdefault(p + "ffn_up_fused", self.w[p + "ffn_up.weight"])
                n_ff = fused.shape[0] // 2
                gate, up = fused[:n_ff], fused[n_ff:]
                if swap_gate_up:
                    gate, up = up, gate
                t = self.wtype[p + "ffn_up.weight"]
                self.w[p + "ffn_gate.weight"], self.wtype[p + "ffn_gate.weight"] = gate, t
                self.w[p + "ffn_up.weight"] = up

    @property
    def inv_freq(self) -> np.ndarray:
        half = self.n_rot // 2
        inv_freq = self.base ** (-2.0 * np.arange(half) / self.n_rot) * self.freq_scale
        if self.use_rope_freqs and "rope_freqs.weight" in self.w:
            inv_freq = inv_freq / self.w["rope_freqs.weight"]
        return inv_freq

    def _mm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x @ W^T for W = self.w[name] ([n_out, n_in]); x: [..., n_in]."""
        if self.ggml_rounding:
            x = round_like_ggml_cpu(x, self.wtype[name])
        return x @ self.w[name].T

    def _rms_norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: [n_tokens, n_heads, head_dim]."""
        ang = pos[:, None] * self.inv_freq[None, :]  # [n_tokens, n_rot/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        half = self.n_rot // 2
        if self.neox:
            a, b = x[..., :half], x[..., half:self.n_rot]
            out[..., :half] = a * cos - b * sin
            out[..., half:self.n_rot] = a * sin + b * cos
        else:
            a, b = x[..., 0:self.n_rot:2], x[..., 1:self.n_rot:2]
            out[..., 0:self.n_rot:2] = a * cos - b * sin
            out[..., 1:self.n_rot:2] = a * sin + b * cos
        return out

    def last_logits(self, tokens: list[int]) -> np.ndarray:
        """Logits [n_vocab] of the last position, recomputing the whole sequence."""
        w = self.w
        n = len(tokens)
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        pos = np.arange(n, dtype=np.float64)
        x = w["token_embd.weight"][np.asarray(tokens)]  # [n, d]
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        if self.window > 0:  # position i sees i - window + 1 .. i
            mask = mask + np.tril(np.full((n, n), -np.inf), k=-self.window)
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self._rms_norm(x, w[p + "attn_norm.weight"])
            q = self._mm(h, p + "attn_q.weight")
            k = self._mm(h, p + "attn_k.weight")
            v = self._mm(h, p + "attn_v.weight")
            if p + "attn_q.bias" in w:
                q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
            q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
            if p + "attn_q_norm.weight" in w and self.use_qk_norm:
                q = self._rms_norm(q, w[p + "attn_q_norm.weight"])
                k = self._rms_norm(k, w[p + "attn_k_norm.weight"])
            q = self._rope(q, pos)
            k = self._rope(k, pos)
            group = nh // nkv  # query head j reads kv head j // group
            if self.gqa_interleaved:
                k, v = np.tile(k, (1, group, 1)), np.tile(v, (1, group, 1))
            else:
                k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", s, v).reshape(n, nh * hd)
            x = x + self._mm(o, p + "attn_output.weight")
            h = self._rms_norm(x, w[p + "ffn_norm.weight"])
            if p + "ffn_gate_inp.weight" in w:
                x = x + self._experts(h, p)
                continue
            g = self._mm(h, p + "ffn_gate.weight")
            u = self._mm(h, p + "ffn_up.weight")
            x = x + self._mm((g / (1.0 + np.exp(-g))) * u, p + "ffn_down.weight")
        h = self._rms_norm(x[-1], w["output_norm.weight"])
        return self._mm(h, "output.weight")

    def _experts(self, h: np.ndarray, p: str) -> np.ndarray:
        """Mixture of experts (qwen3moe, Mixtral): softmax over the router's logits, the
        n_expert_used most probable experts per token, their SwiGLU outputs weighted by their
        probabilities renormalized to sum 1."""
        w = self.w
        logits = self._mm(h, p + "ffn_gate_inp.weight")  # [n, n_expert]
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :self.n_expert_used]
        out = np.zeros_like(h)
        gate, up, down = (w[p + f"ffn_{m}_exps.weight"] for m in ("gate", "up", "down"))
        for t in range(h.shape[0]):
            weights = probs[t, top[t]] / probs[t, top[t]].sum()
            for e, wt in zip(top[t], weights):
                x = h[t]
                if self.ggml_rounding:
                    x = round_like_ggml_cpu(x, self.wtype[p + "ffn_gate_exps.weight"])
                g, u = gate[e] @ x, up[e] @ x
                a = (g / (1.0 + np.exp(-g))) * u
                if self.ggml_rounding:
                    a = round_like_ggml_cpu(a, self.wtype[p + "ffn_down_exps.weight"])
                out[t] += wt * (down[e] @ a)
        return out

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        seq, out = list(prompt), []
        for _ in range(n):
            tok = int(np.argmax(self.last_logits(seq)))
            out.append(tok)
            seq.append(tok)
        return out


def round_like_ggml_cpu(x: np.ndarray, wtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """Rounds matmul inputs the way ggml's CPU backend does before a dot product with weights of
    type `wtype` (the weight type's vec_dot_type): F16 and BF16 round to nearest even; Q8_0 splits
    each row into blocks of 32, scales by 127 / max|x|, rounds to nearest even and keeps the scale
    max|x| / 127 as F16. F32 weights leave the input alone."""
    T = gguf.GGMLQuantizationType
    if wtype == T.F32:
        return x
    if wtype == T.F16:
        return x.astype(np.float32).astype(np.float16).astype(np.float64)
    if wtype == T.BF16:
        b = gguf.quants.quantize(x.astype(np.float32), T.BF16)
        return gguf.quants.dequantize(b, T.BF16).astype(np.float64).reshape(x.shape)
    if wtype == T.Q8_0:
        x32 = x.astype(np.float32)
        blocks = x32.reshape(-1, 32)
        amax = np.abs(blocks).max(axis=1, keepdims=True)
        with np.errstate(divide="ignore"):
            inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        q = np.rint(blocks * inv)
        d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float64)
        return (q * d).reshape(x.shape)
    raise NotImplementedError(f"no rounding model for {wtype.name}")


def _drop_biases(m: NumpyModel) -> None:
    for name in [n for n in m.w if n.endswith(".bias")]:
        del m.w[name]


# Plausible implementation mistakes, as edits of a NumpyModel; each applies only where it changes
# something. Used by --sensitivity to show how far above the tolerances a real bug lands.
BUGS: dict[str, tuple[Any, Any]] = {
    "rope pairs swapped (normal<->neox)": (lambda m: True, lambda m: setattr(m, "neox", not m.neox)),
    "rope base 10000": (lambda m: m.base != 10000.0, lambda m: setattr(m, "base", 10000.0)),
    "rope_freqs.weight ignored": (lambda m: "rope_freqs.weight" in m.w,
                                  lambda m: setattr(m, "use_rope_freqs", False)),
    "linear rope scaling ignored": (lambda m: m.freq_scale != 1.0,
                                    lambda m: setattr(m, "freq_scale", 1.0)),
    "qkv bias ignored": (lambda m: any(n.endswith(".bias") for n in m.w), _drop_biases),
    "gqa heads interleaved": (lambda m: m.n_head_kv not in (1, m.n_head),
                              lambda m: setattr(m, "gqa_interleaved", True)),
    "qk norm ignored": (lambda m: any(n.endswith("attn_q_norm.weight") for n in m.w),
                        lambda m: setattr(m, "use_qk_norm", False)),
    "fused gate/up halves swapped": (lambda m: any(n.endswith("ffn_up_fused") for n in m.w),
                                     lambda m: m._split_fused(swap_gate_up=True)),
    "rms eps 1e-5 <-> 1e-6": (lambda m: True,
                              lambda m: setattr(m, "eps", 1e-6 if m.eps > 5e-6 else 1e-5)),
}


def sensitivity(path: Path, prompts: list[list[int]]) -> dict[str, float]:
    """Largest rel-L2 change of the final logits over the prompts for each applicable bug."""
    good = NumpyModel(path)
    ref = [good.last_logits(p) for p in prompts]
    out = {}
    for name, (applies, apply) in BUGS.items():
        bad = copy.copy(good)
        bad.w = dict(good.w)
        if not applies(bad):
            continue
        apply(bad)
        out[name] = max(rel_l2(bad.last_logits(p), r) for p, r in zip(prompts, ref))
    return out


def rel_l2(a: np.ndarray, ref: np.ndarray) -> float:
    a64, r64 = np.asarray(a, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(a64 - r64) / np.linalg.norm(r64))


def _sig(x: float, digits: int = 3) -> float:
    """Rounds to a few significant digits so that the JSON text is stable."""
    return float(f"{x:.{digits}g}")


# ---------------------------------------------------------------------------------------------
# Goldens


def encode_f32(a: np.ndarray) -> str:
    return base64.b64encode(np.asarray(a, dtype="<f4").tobytes()).decode("ascii")


def decode_f32(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype="<f4")


def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("llama_cpp_python", "gguf", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def _system_info() -> str:
    """llama.cpp's CPU feature line: the kernels (and so the rounding) behind the goldens."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode().strip()


def make_golden(v: synth_models.Variant, model_dir: Path, crosscheck: bool = True) -> dict:
    path = synth_models.write_variant(v, model_dir)
    prompts = make_prompts(v, path)
    np_model = NumpyModel(path) if crosscheck else None
    np_rounded = (NumpyModel(path, ggml_rounding=True)
                  if crosscheck and v.weight_type != "f32" else None)
    n_vocab = None
    entries = []
    for prompt in prompts:
        logits, ids, margins = run_llama(path, prompt)
        n_vocab = logits.shape[0]
        entry: dict[str, Any] = {
            "prompt_ids": prompt,
            "final_logits_f32_b64": encode_f32(logits),
            "final_logits_sha256": hashlib.sha256(logits.astype("<f4").tobytes()).hexdigest(),
            "greedy_ids": ids,
            "greedy_top2_margin": [round(m, 5) for m in margins],
            "logits_stats": _logit_stats(logits),
        }
        if np_model is not None:
            ref = np_model.last_logits(prompt)
            np_ids = np_model.greedy(prompt, N_GREEDY)
            diverge = next((i for i, (a, b) in enumerate(zip(ids, np_ids)) if a != b), None)
            check = {
                "rel_l2_llama_vs_numpy": _sig(rel_l2(logits, ref)),
                "greedy_first_divergence": diverge,
            }
            if np_rounded is not None:
                check["rel_l2_llama_vs_numpy_ggml_rounding"] = _sig(
                    rel_l2(logits, np_rounded.last_logits(prompt)))
            entry["crosscheck_numpy_f64"] = check
        entries.append(entry)
    return {
        "format": FORMAT_VERSION,
        "variant": v.name,
        "description": v.description,
        "model": {
            "file": path.name,
            "sha256": synth_models.sha256_file(path),
            "size_bytes": path.stat().st_size,
            "arch": v.arch,
            "vocab": v.vocab,
            "n_vocab": n_vocab,
            "n_embd": v.n_embd,
            "n_layer": v.n_layer,
            "n_head": v.n_head,
            "n_head_kv": v.n_head_kv,
            "head_dim": v.head_dim,
            "n_ff": v.n_ff,
            **({"n_expert": v.n_expert, "n_expert_used": v.n_expert_used,
                "n_ff_expert": v.ff_expert} if v.n_expert else {}),
            "weight_type": v.weight_type,
            "tied_output": v.tied_output,
        },
        "generator": {"script": "scripts/make_llama_reference.py", **_versions(),
                      "llama_cpp_system_info": _system_info()},
        "llama_cpp_settings": SETTINGS,
        "llama_cpp_settings_note": SETTINGS_NOTE,
        "n_greedy": N_GREEDY,
        "prompts": entries,
    }


def _logit_stats(logits: np.ndarray) -> dict[str, float]:
    """Shows the logits are not degenerate: softmax neither one-hot nor uniform."""
    l64 = logits.astype(np.float64)
    p = np.exp(l64 - l64.max())
    p /= p.sum()
    entropy = float(-(p * np.log(np.maximum(p, 1e-300))).sum())
    return {"std": _sig(float(l64.std())), "max_prob": _sig(float(p.max())),
            "entropy_nats": _sig(entropy), "uniform_entropy_nats": _sig(math.log(len(p)))}


def dump(golden: dict) -> str:
    return json.dumps(golden, indent=1, sort_keys=False) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run llama.cpp (llama-cpp-python) on the synthetic models and write golden "
        "logits and greedy continuations to testdata/reference/llama/<variant>.json.")
    parser.add_argument("--variant", action="append", choices=sorted(synth_models.VARIANTS),
                        metavar="NAME", help="variant (repeatable; default: all)")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT,
                        help=f"where the goldens go (default: {DEFAULT_OUT.relative_to(REPO_ROOT)})")
    parser.add_argument("--model-dir", type=Path,
                        help="keep the generated models here (default: a temporary folder)")
    parser.add_argument("--no-crosscheck", action="store_true",
                        help="skip the float64 NumPy cross-check")
    parser.add_argument("--sensitivity", action="store_true",
                        help="print how much plausible bugs change the logits; write nothing")
    parser.add_argument("--check", action="store_true",
                        help="regenerate and compare with the stored goldens; write nothing")
    args = parser.parse_args(argv)

    names = args.variant or list(synth_models.VARIANTS)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or Path(tmp)
        failures = 0
        for name in names:
            if args.sensitivity:
                v = synth_models.VARIANTS[name]
                path = synth_models.write_variant(v, model_dir)
                for bug, err in sensitivity(path, make_prompts(v, path)).items():
                    print(f"{name:16s} {bug:36s} rel_l2 {err:.2e}")
                continue
            golden = make_golden(synth_models.VARIANTS[name], model_dir,
                                 crosscheck=not args.no_crosscheck)
            text = dump(golden)
            out = args.out_dir / f"{name}.json"
            summary = " ".join(
                f"[len {len(e['prompt_ids'])}: numpy rel_l2 "
                f"{e.get('crosscheck_numpy_f64', {}).get('rel_l2_llama_vs_numpy', 'n/a')}, "
                f"greedy diverges at {e.get('crosscheck_numpy_f64', {}).get('greedy_first_divergence')}"
                f", min margin {min(e['greedy_top2_margin']):.3g}]"
                for e in golden["prompts"])
            if args.check:
                if args.no_crosscheck and out.is_file():
                    stored = json.loads(out.read_text())
                    for entry in stored["prompts"]:
                        entry.pop("crosscheck_numpy_f64", None)
                    same = stored == json.loads(text)
                else:
                    same = out.is_file() and out.read_text() == text
                failures += not same
                print(f"{name}: {'identical' if same else 'DIFFERS'} {summary}")
            else:
                args.out_dir.mkdir(parents=True, exist_ok=True)
                out.write_text(text)
                print(f"{out} {summary}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
