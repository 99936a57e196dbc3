"""Hugging Face checkpoints: `pdctl convert` against llama.cpp, and pdserve serving the folder.

Each case writes a small synthetic checkpoint as transformers would save it (config.json,
safetensors written with the `safetensors` package, a byte-level BPE tokenizer.json trained with
the `tokenizers` package; no PyTorch), then checks three things on one prompt:

  * llama.cpp (llama-cpp-python) on the GGUF that `pdctl convert` wrote, against pdserve reading
    the folder itself (`pdctl logits -m FOLDER`): last-position logits within rel L2 1e-4 (F32
    weights, F32 KV), and 32 greedy tokens identical;
  * pdserve against an independent float64 NumPy forward pass written from the transformers
    definitions (rotate-half RoPE on the unpermuted Q/K, Gemma's 1 + w norms, windows, scaling):
    this catches a conversion mistake that llama.cpp and pdserve would share;
  * converted files whose weights are rounded (BF16, Q8_0) within those types' tolerances.
"""

from __future__ import annotations

import json
import math
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")
tokenizers = pytest.importorskip("tokenizers")

import make_llama_reference  # scripts/: run_llama (llama.cpp's logits and greedy ids)

TIMEOUT_S = 300
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Once upon a time, in a small village by the sea, there lived an old fisherman.",
    "Numbers 12345 and 678, symbols !?#, tabs\tand\nnewlines.",
    "def main():\n    return 42\n",
]


def _tokenizer(folder: Path, specials: tuple[str, ...] = ()) -> int:
    """Trains a byte-level BPE tokenizer (GPT-2's pre-tokenizer) with <|endoftext|> and `specials`
    as special tokens; returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", *specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab_size()


CASES = {
    # name: (class, config overrides, stored dtype, shards)
    "llama": ("LlamaForCausalLM", {}, "F32", 1),
    "llama_tied_linear_rope": ("LlamaForCausalLM", {
        "tie_word_embeddings": True, "rope_scaling": {"type": "linear", "factor": 2.0}}, "F32", 2),
    "llama3_rope": ("LlamaForCausalLM", {"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}}, "F32", 1),
    "mistral": ("MistralForCausalLM", {"sliding_window": None, "head_dim": 24}, "F32", 1),
    # A window of 8 on every layer; the 13-token prompt and its 32 greedy tokens run past it, so
    # this case is checked against the float64 reference only (llama.cpp ignores the window:
    # test_mistral_window compares them where the window does not bite).
    "mistral_window": ("MistralForCausalLM", {"sliding_window": 8}, "F32", 1),
    "qwen2_bias": ("Qwen2ForCausalLM", {"tie_word_embeddings": True}, "F32", 1),
    # Per-head Q/K norms; head_dim 32 on hidden 64 with 4 heads (q rows != hidden).
    "qwen3": ("Qwen3ForCausalLM", {}, "F32", 1),
    # Fused qkv_proj and gate_up_proj; a window (64) longer than the 45 positions run.
    "phi3": ("Phi3ForCausalLM", {}, "F32", 1),
    "gemma3": ("Gemma3ForCausalLM", {}, "F32", 1),
    # Caps small enough to bite on this model's scores and logits.
    "gemma2_softcap": ("Gemma2ForCausalLM", {"attn_logit_softcapping": 2.0,
                                             "final_logit_softcapping": 3.0}, "F32", 1),
    "llama_bf16": ("LlamaForCausalLM", {}, "BF16", 2),
    # Mixtures of experts: 8 experts of 32 rows, 2 per token (Qwen3-MoE); 4 of 96, 2 per token,
    # in BF16 over two shards (Mixtral, whose experts are w1 / w3 / w2).
    "qwen3moe": ("Qwen3MoeForCausalLM", {}, "F32", 1),
    "mixtral": ("MixtralForCausalLM", {}, "F32", 1),
    "mixtral_bf16": ("MixtralForCausalLM", {}, "BF16", 2),
}


def _config(cls: str, n_vocab: int, overrides: dict) -> dict:
    c = {"architectures": [cls], "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "vocab_size": n_vocab, "tie_word_embeddings": False, "hidden_act": "silu",
         "bos_token_id": None, "eos_token_id": 0}
    if cls == "Gemma3ForCausalLM":
        c.update({"num_hidden_layers": 6, "head_dim": 16, "query_pre_attn_scalar": 16,
                  "sliding_window": 4, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                  "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                  "rms_norm_eps": 1e-6})
        del c["hidden_act"]
    if cls == "Gemma2ForCausalLM":
        c.update({"num_hidden_layers": 4, "head_dim": 16, "query_pre_attn_scalar": 16,
                  "sliding_window": 4, "hidden_activation": "gelu_pytorch_tanh",
                  "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
                  "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0})
        del c["hidden_act"]
    if cls == "Qwen2ForCausalLM":
        c.update({"use_sliding_window": False, "sliding_window": 4096})
    if cls == "Qwen3ForCausalLM":
        c.update({"head_dim": 32, "attention_bias": False, "use_sliding_window": False,
                  "sliding_window": None, "max_window_layers": 2, "tie_word_embeddings": False,
                  "rope_theta": 1000000.0, "rms_norm_eps": 1e-6})
    if cls == "Qwen3MoeForCausalLM":
        c.update({"head_dim": 32, "attention_bias": False, "use_sliding_window": False,
                  "sliding_window": None, "max_window_layers": 2, "rope_theta": 1000000.0,
                  "rms_norm_eps": 1e-6, "num_experts": 8, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "norm_topk_prob": True,
                  "decoder_sparse_step": 1, "mlp_only_layers": []})
    if cls == "MixtralForCausalLM":
        c.update({"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None,
                  "rope_theta": 1000000.0})
    if cls == "Phi3ForCausalLM":
        c.update({"sliding_window": 64, "original_max_position_embeddings": 256,
                  "rope_scaling": None, "attention_bias": False})
    c.update(overrides)
    return c


def _weights(c: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, F, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or H // nh
    gemma = c["architectures"][0].startswith("Gemma")
    qwen = c["architectures"][0].startswith("Qwen2")
    qwen3 = c["architectures"][0].startswith("Qwen3")
    moe = _moe_names(c)
    phi3 = c["architectures"][0].startswith("Phi3")

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float32)

    def norm(n):  # Gemma stores w of (1 + w)
        base = 0.0 if gemma else 1.0
        return (base + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": (0.5 * rng.standard_normal((c["vocab_size"], H)))
         .astype(np.float32), "model.norm.weight": norm(H)}
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(c["vocab_size"], H)
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = mat(nh * hd, H)
        w[p + "self_attn.k_proj.weight"] = mat(nkv * hd, H)
        w[p + "self_attn.v_proj.weight"] = mat(nkv * hd, H)
        w[p + "self_attn.o_proj.weight"] = mat(H, nh * hd)
        w[p + "mlp.gate_proj.weight"] = mat(F, H)
        w[p + "mlp.up_proj.weight"] = mat(F, H)
        w[p + "mlp.down_proj.weight"] = mat(H, F)
        if qwen:
            for n, rows in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.1 * rng.standard_normal(rows)).astype(
                    np.float32)
        if qwen3 or c["architectures"][0].startswith("Gemma3"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm(H)
            w[p + "post_feedforward_layernorm.weight"] = norm(H)
        if moe is not None:  # a router and the experts in place of the dense MLP
            block, (gn, un, dn), n_exp, fe = moe
            for n in ("gate", "up", "down"):
                del w[p + f"mlp.{n}_proj.weight"]
            w[p + f"{block}.gate.weight"] = (3.0 * mat(n_exp, H)).astype(np.float32)
            for e in range(n_exp):
                q = f"{p}{block}.experts.{e}."
                w[q + f"{gn}.weight"] = mat(fe, H)
                w[q + f"{un}.weight"] = mat(fe, H)
                w[q + f"{dn}.weight"] = mat(H, fe)
        if phi3:  # transformers' Phi3 stores them fused: rows q, k, v; rows gate, up
            w[p + "self_attn.qkv_proj.weight"] = np.concatenate(
                [w.pop(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            w[p + "mlp.gate_up_proj.weight"] = np.concatenate(
                [w.pop(p + "mlp.gate_proj.weight"), w.pop(p + "mlp.up_proj.weight")])
    return w


def _moe_names(c: dict):
    """(block, (gate, up, down) names, experts, expert rows) of a mixture of experts, or None."""
    cls = c["architectures"][0]
    if cls == "Qwen3MoeForCausalLM":
        return "mlp", ("gate_proj", "up_proj", "down_proj"), c["num_experts"], \
            c["moe_intermediate_size"]
    if cls == "MixtralForCausalLM":
        return "block_sparse_moe", ("w1", "w3", "w2"), c["num_local_experts"], \
            c["intermediate_size"]
    return None


def _to_bf16(a: np.ndarray) -> np.ndarray:
    """Rounds float32 to bfloat16 (nearest even), returned as float32 values."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def _save(folder: Path, w: dict[str, np.ndarray], dtype: str, shards: int) -> None:
    """Writes model.safetensors, or `shards` files with model.safetensors.index.json."""
    names = sorted(w)

    def encoded(name):
        if dtype == "BF16" and w[name].ndim == 2:
            # safetensors' NumPy API has no bfloat16: write the bytes and patch the header.
            return (_to_bf16(w[name]).view(np.uint32) >> 16).astype(np.uint16)
        return w[name]

    groups = [names[i::shards] for i in range(shards)]
    files = ["model.safetensors"] if shards == 1 else [
        f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for group, fname in zip(groups, files):
        path = folder / fname
        safetensors_numpy.save_file({n: encoded(n) for n in group}, str(path))
        if dtype == "BF16":
            raw = path.read_bytes()
            n = int.from_bytes(raw[:8], "little")
            header = raw[8:8 + n].rstrip(b" ").replace(b'"U16"', b'"BF16"')
            header += b" " * (-len(header) % 8)
            path.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n:])
    if shards > 1:
        index = {"metadata": {"total_size": sum(a.nbytes for a in w.values())},
                 "weight_map": {n: files[i] for i, g in enumerate(groups) for n in g}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def make_checkpoint(folder: Path, name: str, **changes) -> tuple[dict, dict[str, np.ndarray]]:
    """Writes CASES[name] (config.json keys in `changes` on top) into `folder`."""
    cls, overrides, dtype, shards = CASES[name]
    folder.mkdir(parents=True, exist_ok=True)
    # llama.cpp looks up Phi-3's <s>, </s> and <unk> in any model whose name contains "phi3"
    # (llama-vocab.cpp) and cannot load one without them.
    n_tok = _tokenizer(folder, ("<s>", "</s>", "<unk>") if cls == "Phi3ForCausalLM" else ())
    c = _config(cls, n_tok + 20, {**overrides, **changes})  # embedding padded past the tokenizer
    (folder / "config.json").write_text(json.dumps(c, indent=1))
    w = _weights(c, np.random.default_rng(zlib.crc32(name.encode())))
    _save(folder, w, dtype, shards)
    if dtype == "BF16":
        w = {k: _to_bf16(v) if v.ndim == 2 else v for k, v in w.items()}
    return c, w


# ---- the float64 reference, from the transformers definitions ----

def _rms(x, w, eps, gemma):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * ((1.0 + w) if gemma else w)


def _inv_freq(c: dict, hd: int, theta: float, scaled: bool) -> np.ndarray:
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    rs = c.get("rope_scaling") if scaled else None
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = np.where(wavelen < old / high, inv, np.where(wavelen > old / low, inv / factor, mid))
    return inv


def _gelu_tanh(g: np.ndarray, ggml_table: bool) -> np.ndarray:
    """GELU (tanh form). ggml_table: as ggml's CPU backend computes it, through a table indexed by
    the input rounded to F16, holding F16 results (llama.cpp, and pdserve bit for bit)."""
    if ggml_table:
        g = np.where(np.abs(g) < 10, g.astype(np.float16).astype(np.float64), g)
    y = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    if ggml_table:
        y = np.where(g <= -10, 0.0, np.where(g >= 10, g, y.astype(np.float16).astype(np.float64)))
    return y


def _every_layer_window(c: dict) -> int | None:
    """The window transformers' Mistral and Phi3 put on every layer (None: full attention)."""
    cls = c["architectures"][0]
    if cls == "MistralForCausalLM" and c.get("use_sliding_window", True):
        return c.get("sliding_window")
    if cls == "Phi3ForCausalLM":
        return c.get("sliding_window")
    return None


def hf_forward(c: dict, w: dict[str, np.ndarray], ids: list[int],
               ggml_gelu: bool = False) -> np.ndarray:
    """Last-position logits of the transformers model, in float64 (ggml_gelu: _gelu_tanh)."""
    W = {k: v.astype(np.float64) for k, v in w.items()}
    every_window = _every_layer_window(c)
    H, L = c["hidden_size"], c["num_hidden_layers"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or H // nh
    eps = c["rms_norm_eps"]
    gemma = c["architectures"][0].startswith("Gemma")
    gemma2 = c["architectures"][0].startswith("Gemma2")
    moe = _moe_names(c)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    rs = c.get("rope_scaling") or {}
    if rs.get("type", rs.get("rope_type")) == "linear":
        pos = pos / rs["factor"]
    x = W["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * math.sqrt(H)

    def rope(v, inv):  # v: [T, heads, hd], rotate-half
        ang = pos[:, None] * inv[None, :]
        cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
        rot = np.concatenate([-v[..., hd // 2:], v[..., :hd // 2]], axis=-1)
        return v * cos + rot * sin

    for i in range(L):
        p = f"model.layers.{i}."
        if gemma:
            sliding = (i % 2 == 0) if gemma2 else (i + 1) % 6 != 0
            window = c["sliding_window"] if sliding else None
            theta = c["rope_local_base_freq"] if sliding and not gemma2 else c["rope_theta"]
            inv = _inv_freq(c, hd, theta, not sliding)
        else:  # Mistral's and Phi-3's windows keep the model's rope
            window = every_window
            inv = _inv_freq(c, hd, c["rope_theta"], True)
        h = _rms(x, W[p + "input_layernorm.weight"], eps, gemma)
        if p + "self_attn.qkv_proj.weight" in W:  # Phi3: split as its forward does
            qkv = h @ W[p + "self_attn.qkv_proj.weight"].T
            q, k, v = np.split(qkv, [nh * hd, (nh + nkv) * hd], axis=-1)
        else:
            q = h @ W[p + "self_attn.q_proj.weight"].T
            k = h @ W[p + "self_attn.k_proj.weight"].T
            v = h @ W[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in W:
            q += W[p + "self_attn.q_proj.bias"]
            k += W[p + "self_attn.k_proj.bias"]
            v += W[p + "self_attn.v_proj.bias"]
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in W:  # Gemma 3 (1 + w), Qwen3 (w)
            q = _rms(q, W[p + "self_attn.q_norm.weight"], eps, gemma)
            k = _rms(k, W[p + "self_attn.k_norm.weight"], eps, gemma)
        q, k = rope(q, inv), rope(k, inv)
        scale = (c["query_pre_attn_scalar"] if gemma else hd) ** -0.5
        mask = np.tril(np.ones((T, T), dtype=bool))
        if window is not None:
            mask &= (np.arange(T)[:, None] - np.arange(T)[None, :]) < window
        out = np.zeros((T, nh, hd))
        for head in range(nh):
            g = head // (nh // nkv)
            s = (q[:, head] @ k[:, g].T) * scale
            if gemma2:
                cap = c["attn_logit_softcapping"]
                s = np.tanh(s / cap) * cap
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            out[:, head] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, g]
        o = out.reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        if gemma:
            o = _rms(o, W[p + "post_attention_layernorm.weight"], eps, True)
            x = x + o
            h = _rms(x, W[p + "pre_feedforward_layernorm.weight"], eps, True)
            g = h @ W[p + "mlp.gate_proj.weight"].T
            act = _gelu_tanh(g, ggml_gelu)
            m = (act * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
            x = x + _rms(m, W[p + "post_feedforward_layernorm.weight"], eps, True)
        else:
            x = x + o
            h = _rms(x, W[p + "post_attention_layernorm.weight"], eps, False)
            if moe is not None:
                # transformers' sparse MoE blocks: softmax over the router's logits, the top
                # num_experts_per_tok, their weights renormalized (Mixtral always; Qwen3-MoE with
                # norm_topk_prob), the weighted sum of the chosen experts' SwiGLU outputs.
                block, (gn, un, dn), _, _ = moe
                logits = h @ W[p + f"{block}.gate.weight"].T
                probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
                probs /= probs.sum(axis=-1, keepdims=True)
                top = np.argsort(-probs, axis=-1, kind="stable")[:, :c["num_experts_per_tok"]]
                m = np.zeros_like(h)
                for t in range(T):
                    wts = probs[t, top[t]] / probs[t, top[t]].sum()
                    for e, wt in zip(top[t], wts):
                        q = f"{p}{block}.experts.{e}."
                        g = W[q + f"{gn}.weight"] @ h[t]
                        act = g / (1 + np.exp(-g))
                        m[t] += wt * (W[q + f"{dn}.weight"] @ (act * (W[q + f"{un}.weight"] @ h[t])))
                x = x + m
                continue
            if p + "mlp.gate_up_proj.weight" in W:  # Phi3: gate first, then up
                g, up = np.split(h @ W[p + "mlp.gate_up_proj.weight"].T, 2, axis=-1)
            else:
                g, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
            act = g / (1 + np.exp(-g))
            x = x + (act * up) @ W[p + "mlp.down_proj.weight"].T
    x = _rms(x[-1:], W["model.norm.weight"], eps, gemma)[0]
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    logits = head @ x
    if gemma2:
        cap = c["final_logit_softcapping"]
        logits = np.tanh(logits / cap) * cap
    return logits


def hf_greedy(c: dict, w: dict[str, np.ndarray], ids: list[int], n: int = 32) -> list[int]:
    """n greedy ids of the float64 transformers forward (each step recomputes the sequence)."""
    seq, out = list(ids), []
    for _ in range(n):
        out.append(int(np.argmax(hf_forward(c, w, seq))))
        seq.append(out[-1])
    return out


def rel_l2(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def _pdctl_logits(pdctl, model: Path, ids: list[int], out: Path) -> np.ndarray:
    proc = subprocess.run([str(pdctl), "logits", "-m", str(model), "--prompt-ids",
                           " ".join(map(str, ids)), "--threads", "2", "--kv-type", "f32",
                           "--out", str(out)], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.fromfile(out, dtype=np.float32)


def _pdctl_greedy(pdctl, model: Path, ids: list[int]) -> list[int]:
    proc = subprocess.run([str(pdctl), "generate", "-m", str(model), "--prompt-ids",
                           " ".join(map(str, ids)), "-n", "32", "--temperature", "0",
                           "--ignore-eos", "--print-ids", "--kv-type", "f32", "--threads", "2"],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1]
    return [int(t) for t in line.split()]


def _convert(pdctl, folder: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(pdctl), "convert", str(folder), str(out), *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.mark.parametrize("name", list(CASES))
def test_convert_matches_llama_cpp_and_transformers(name, pdctl, tmp_path):
    folder = tmp_path / name
    c, w = make_checkpoint(folder, name)
    gguf = tmp_path / f"{name}.gguf"
    proc = _convert(pdctl, folder, gguf)
    assert proc.returncode == 0, proc.stderr
    ids = [int(t) for t in np.random.default_rng(7).integers(1, 250, size=13)]
    ours = _pdctl_logits(pdctl, folder, ids, tmp_path / "ours.f32")
    assert ours.shape == (c["vocab_size"],)
    gemma = c["architectures"][0].startswith("Gemma")
    # Gemma's GELU: llama.cpp (and pdserve with it) round through an F16 table, 2e-4 here.
    ref = hf_forward(c, w, ids, ggml_gelu=gemma)
    err_ref = rel_l2(ours, ref)
    if gemma:
        assert rel_l2(ours, hf_forward(c, w, ids)) <= 1e-3
    lc_logits, lc_ids, _ = make_llama_reference.run_llama(gguf, ids)
    err_lc = rel_l2(ours, lc_logits)
    tol = 1e-3 if CASES[name][2] == "BF16" else 1e-4
    print(f"{name}: pdserve vs llama.cpp {err_lc:.2e}, vs float64 transformers {err_ref:.2e}")
    window = _every_layer_window(c)
    if window is not None and window < len(ids) + 32:
        # llama.cpp runs full attention here (it ignores the window: docs/models.md), so the
        # window must make a difference; the model's own definition is the float64 pass.
        assert err_lc > 1e-2, f"the window of {window} changed nothing: rel L2 {err_lc:.3g}"
        assert err_ref <= 1e-4, f"pdserve vs the float64 transformers forward: {err_ref:.3g}"
        assert _pdctl_greedy(pdctl, folder, ids) == hf_greedy(c, w, ids)
        return
    assert err_lc <= tol, f"pdserve vs llama.cpp on the converted GGUF: rel L2 {err_lc:.3g}"
    # BF16 weights: pdserve rounds activations to BF16 too; the float64 pass does not. Gemma 3:
    # the F16 GELU table, imitated in float64, still leaves one-ulp flips (up to 8e-5 seen); a
    # mapping mistake costs 1e-2 or more (a query scale of 17 instead of 16: 8e-3).
    limit = 1e-2 if CASES[name][2] == "BF16" else 1e-3 if name == "gemma3" else 1e-4
    assert err_ref <= limit, (
        f"pdserve vs the float64 transformers forward: rel L2 {err_ref:.3g}")
    if CASES[name][2] == "F32":
        assert _pdctl_greedy(pdctl, folder, ids) == lc_ids


def test_convert_quantized_and_float_types(pdctl, tmp_path):
    folder = tmp_path / "llama"
    c, w = make_checkpoint(folder, "llama")
    ids = [5, 17, 42, 99, 7, 120, 33]
    ref = hf_forward(c, w, ids)
    for typ, tol in (("f16", 1e-2), ("bf16", 3e-2), ("q8_0", 5e-2)):
        gguf = tmp_path / f"llama-{typ}.gguf"
        proc = _convert(pdctl, folder, gguf, "--type", typ)
        assert proc.returncode == 0, proc.stderr
        lc_logits, _, _ = make_llama_reference.run_llama(gguf, ids)
        ours = _pdctl_logits(pdctl, gguf, ids, tmp_path / f"{typ}.f32")
        assert rel_l2(lc_logits, ref) <= tol, (typ, rel_l2(lc_logits, ref))
        assert rel_l2(ours, lc_logits) <= tol / 5, (typ, rel_l2(ours, lc_logits))


def test_convert_refuses_what_it_cannot_run(pdctl, tmp_path):
    folder = tmp_path / "llama"
    c, _ = make_checkpoint(folder, "llama")
    out = tmp_path / "out.gguf"

    def expect(fragment: str) -> None:
        proc = _convert(pdctl, folder, out)
        assert proc.returncode == 2, proc.stderr
        assert fragment in proc.stderr, proc.stderr
        assert not out.exists() and not Path(str(out) + ".tmp").exists()

    def with_config(**changes) -> None:
        (folder / "config.json").write_text(json.dumps({**c, **changes}))

    with_config(architectures=["FalconForCausalLM"])
    expect("architecture FalconForCausalLM is not supported")
    with_config(hidden_act="gelu")
    expect("hidden_act 'gelu' is not supported")
    with_config(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    expect("rope_scaling type 'yarn' is not supported")
    with_config(num_hidden_layers=3)
    expect("model.layers.2")
    # Qwen2's window (on the layers from max_window_layers on) does not run yet; Llama has none
    # (transformers' Llama ignores the key, and so does the converter).
    with_config(architectures=["Qwen2ForCausalLM"], use_sliding_window=True, sliding_window=16)
    expect("sliding-window attention is not supported for Qwen2ForCausalLM")
    with_config(architectures=["Phi3ForCausalLM"], rope_scaling={
        "type": "longrope", "long_factor": [1.0] * 8, "short_factor": [1.0] * 8})
    expect("rope_scaling type 'longrope' is not supported for Phi3ForCausalLM")
    with_config(hidden_size="64")
    expect('"hidden_size" is not an integer')
    (folder / "config.json").write_text("{not json")
    expect("not valid JSON")
    (folder / "config.json").write_text(json.dumps(c))
    (folder / "tokenizer.json").unlink()
    expect("tokenizer.json")
    proc = _convert(pdctl, tmp_path / "nowhere", out)
    assert proc.returncode == 2 and "not a Hugging Face checkpoint folder" in proc.stderr


def test_convert_refuses_expert_layouts_it_cannot_run(pdctl, tmp_path):
    """Qwen3-MoE without renormalized expert weights or with dense layers among the expert ones,
    and a checkpoint missing an expert: refused naming what, nothing written."""
    folder = tmp_path / "qwen3moe"
    c, w = make_checkpoint(folder, "qwen3moe")
    out = tmp_path / "out.gguf"

    def expect(fragment: str, **changes) -> None:
        (folder / "config.json").write_text(json.dumps({**c, **changes}))
        proc = _convert(pdctl, folder, out)
        assert proc.returncode == 2, proc.stderr
        assert fragment in proc.stderr, proc.stderr
        assert not out.exists() and not Path(str(out) + ".tmp").exists()

    expect("norm_topk_prob: false", norm_topk_prob=False)
    expect("dense layers among the expert layers", mlp_only_layers=[1])
    expect("dense layers among the expert layers", decoder_sparse_step=2)
    expect('"num_experts_per_tok"', num_experts_per_tok=9)
    expect("must be a 2-D float matrix of 9 rows (one per expert)", num_experts=9)
    del w["model.layers.1.mlp.experts.5.down_proj.weight"]
    _save(folder, w, "F32", 1)
    expect("blk.1.ffn_down_exps.weight: expert 5 of 8 is missing from the checkpoint")


def test_pd_serve_serves_the_folder_quantized_at_load(pdctl, tmp_path):
    """pd-serve -m FOLDER --quantize q8_0: converted and quantized in memory, served over OpenAI
    HTTP, giving the greedy tokens that `pdctl generate` gives on the same folder and type."""
    import re
    import signal

    from openai import OpenAI

    folder = tmp_path / "tiny-llama"
    make_checkpoint(folder, "llama")
    gen = subprocess.run([str(pdctl), "generate", "-m", f"{folder}/", "--quantize", "q8_0",
                          "-p", "The quick brown", "-n", "12", "--temperature", "0",
                          "--ignore-eos", "--print-ids", "--threads", "2"],
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    assert gen.returncode == 0, gen.stderr[-3000:]
    want = [int(t) for t in [ln for ln in gen.stdout.splitlines() if ln.strip()][-1].split()]
    proc = subprocess.Popen([str(pdctl.parent / "pd-serve"), "-m", f"{folder}/", "--quantize",
                             "q8_0", "--grpc-port", "0", "--http-port", "0", "--threads", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = None
        for line in proc.stdout:
            m = re.match(r"^pd-serve ready: grpc=\S+ http=(\S+) model=(\S+)$", line.strip())
            if m:
                break
        assert m, proc.stderr.read()
        http_url, model = m.groups()
        assert model == "tiny-llama"
        client = OpenAI(base_url=f"{http_url}/v1", api_key="none")
        chunks = list(client.completions.create(
            model=model, prompt="The quick brown", max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True, "include_token_ids": True},
            extra_body={"ignore_eos": True}))
        got = [t for ch in chunks if ch.choices for t in ch.choices[0].model_extra["token_ids"]]
        assert chunks[-1].usage.completion_tokens == 12
        assert got == want
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cluster_serves_the_folder(pdctl, tmp_path):
    folder = tmp_path / "tiny-qwen"
    make_checkpoint(folder, "qwen2_bias")
    proc = subprocess.run([str(pdctl), "up", "--prefill", "1", "--decode", "1", "-m", str(folder),
                           "--complete", "The quick brown fox", "-n", "8"],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "The quick brown fox" in proc.stdout


def _gguf_u32(path: Path, key: str) -> int | None:
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get(key)
    return None if field is None else int(field.parts[field.data[0]][0])


def test_mistral_window(pdctl, tmp_path):
    """Mistral's window (8) on every layer: written as llama.attention.sliding_window; llama.cpp
    agrees where the window does not bite, the float64 pass past it; prefill in chunks of 5
    (pd-serve, crossing the window's edge) gives the ids of one whole prefill (pdctl)."""
    import re
    import signal
    import urllib.request

    from openai import OpenAI

    folder = tmp_path / "tiny-mistral"
    c, w = make_checkpoint(folder, "mistral_window")
    gguf = tmp_path / "mistral.gguf"
    proc = _convert(pdctl, folder, gguf)
    assert proc.returncode == 0, proc.stderr
    assert _gguf_u32(gguf, "llama.attention.sliding_window") == 8

    # Within the window (6 prompt tokens: positions 0..7 for the first 3 greedy tokens).
    short = [5, 17, 42, 99, 7, 120]
    ours = _pdctl_logits(pdctl, folder, short, tmp_path / "short.f32")
    lc_logits, lc_ids, _ = make_llama_reference.run_llama(gguf, short)
    err_lc, err_ref = rel_l2(ours, lc_logits), rel_l2(ours, hf_forward(c, w, short))
    assert err_lc <= 1e-4 and err_ref <= 1e-4, (err_lc, err_ref)
    ours_ids = _pdctl_greedy(pdctl, folder, short)
    assert ours_ids[:3] == lc_ids[:3]
    assert ours_ids == hf_greedy(c, w, short)

    # Three windows long.
    long = [int(t) for t in np.random.default_rng(11).integers(1, 250, size=24)]
    ours = _pdctl_logits(pdctl, folder, long, tmp_path / "long.f32")
    err_ref = rel_l2(ours, hf_forward(c, w, long))
    err_full = rel_l2(ours, make_llama_reference.run_llama(gguf, long)[0])
    print(f"mistral_window: short prompt vs llama.cpp {err_lc:.2e}; 24 tokens vs float64 "
          f"{err_ref:.2e}, vs llama.cpp (full attention) {err_full:.2e}")
    assert err_ref <= 1e-4 and err_full > 1e-2, (err_ref, err_full)
    assert _pdctl_greedy(pdctl, folder, long) == hf_greedy(c, w, long)

    # Chunked prefill across the window's edge: pd-serve in chunks of 5 vs pdctl's whole prompt.
    prompt = CORPUS[1]
    gen = subprocess.run([str(pdctl), "generate", "-m", str(folder), "-p", prompt, "-n", "24",
                          "--temperature", "0", "--ignore-eos", "--print-ids", "--kv-type", "f32",
                          "--threads", "2"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert gen.returncode == 0, gen.stderr[-3000:]
    want = [int(t) for t in [ln for ln in gen.stdout.splitlines() if ln.strip()][-1].split()]
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("scheduler:\n  prefill_chunk: 5\n  min_prefill_chunk: 1\n"
                   "  step_time_stretch: 0\nkv:\n  dtype: f32\nprefix_cache:\n  enabled: false\n"
                   "speculative:\n  drafter: off\n")
    serve = subprocess.Popen([str(pdctl.parent / "pd-serve"), "--config", str(cfg), "-m",
                              str(folder), "--grpc-port", "0", "--http-port", "0", "--threads",
                              "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = None
        for line in serve.stdout:
            m = re.match(r"^pd-serve ready: grpc=\S+ http=(\S+) model=(\S+)$", line.strip())
            if m:
                break
        assert m, serve.stderr.read()
        client = OpenAI(base_url=f"{m.group(1)}/v1", api_key="none")
        chunks = list(client.completions.create(
            model=m.group(2), prompt=prompt, max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True, "include_token_ids": True},
            extra_body={"ignore_eos": True}))
        got = [t for ch in chunks if ch.choices for t in ch.choices[0].model_extra["token_ids"]]
        n_prompt = chunks[-1].usage.prompt_tokens
        assert n_prompt > 2 * 8  # past the window
        assert got == want
        with urllib.request.urlopen(f"{m.group(1)}/metrics", timeout=10) as r:
            steps = re.search(r"^pdserve_prefill_step_seconds_count (\S+)$", r.read().decode(),
                              re.M)
        assert steps and float(steps.group(1)) >= -(-n_prompt // 5), "not prefilled in chunks"
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
