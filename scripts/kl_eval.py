#!/usr/bin/env python3
"""Compares quantized GGUF models with their full-precision original through llama.cpp.

Runs the built-in evaluation text (scripts/texts.py: Debian fortunes files disjoint from the
calibration text) or any text file through the base model and each quantized model with
llama-cpp-python, in chunks of --ctx tokens, and reports per model:
  kl      mean KL(base || quantized) of the next-token distributions, nats per token
  top1    share of positions where both models' most likely next token agree
  rel_l2  ||logits_q - logits_base|| / ||logits_base|| over all positions
  ppl     perplexity of the quantized model on the text (base model's ppl in the header)

Usage:
  python scripts/kl_eval.py BASE.gguf Q1.gguf [Q2.gguf ...] [--tokens 2048] [--ctx 256]
         [--text FILE] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import texts  # noqa: E402


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def iter_logits(path: Path, chunks: list[list[int]], ctx: int, threads: int):
    """Yields the logits [len(chunk), n_vocab] of each chunk in turn, each run from an empty
    context (one model load; for large vocabularies, where all chunks at once do not fit)."""
    import llama_cpp

    m = llama_cpp.Llama(str(path), n_ctx=ctx, n_batch=ctx, logits_all=True, verbose=False,
                        n_threads=threads)
    try:
        for c in chunks:
            m.reset()
            m.eval(c)
            yield np.array(m.scores[: len(c)], dtype=np.float32)
    finally:
        del m


def model_logits(path: Path, chunks: list[list[int]], ctx: int, threads: int) -> list[np.ndarray]:
    """Logits [len(chunk), n_vocab] of every chunk, each run from an empty context."""
    return list(iter_logits(path, chunks, ctx, threads))


def tokenize(path: Path, text: bytes) -> list[int]:
    import llama_cpp

    m = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    return m.tokenize(text, add_bos=False, special=False)


def compare(base: list[np.ndarray], quant: list[np.ndarray], chunks: list[list[int]]) -> dict:
    kl_sum, n, agree, num, den, nll = 0.0, 0, 0, 0.0, 0.0, 0.0
    for b, q, c in zip(base, quant, chunks):
        lb, lq = _log_softmax(b), _log_softmax(q)
        kl_sum += float((np.exp(lb) * (lb - lq)).sum())
        agree += int((b.argmax(-1) == q.argmax(-1)).sum())
        n += b.shape[0]
        num += float(((q.astype(np.float64) - b) ** 2).sum())
        den += float((b.astype(np.float64) ** 2).sum())
        nll -= float(lq[np.arange(len(c) - 1), c[1:]].sum())
    targets = sum(len(c) - 1 for c in chunks)
    return {"kl": kl_sum / n, "top1": agree / n, "rel_l2": (num / den) ** 0.5,
            "ppl": float(np.exp(nll / targets))}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("quantized", type=Path, nargs="+")
    ap.add_argument("--text", type=Path, help="text file (default: the built-in evaluation text)")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens to evaluate (default 2048)")
    ap.add_argument("--ctx", type=int, default=256, help="tokens per chunk (default 256)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    args = ap.parse_args(argv)

    text = args.text.read_bytes() if args.text else texts.build_text("evaluation")
    ids = tokenize(args.base, text)
    import llama_cpp

    vocab = llama_cpp.Llama(str(args.base), vocab_only=True, verbose=False)
    bos = vocab.token_bos() if vocab.metadata.get("tokenizer.ggml.add_bos_token", "true") != "false" else -1
    body = args.ctx - (1 if bos >= 0 else 0)
    chunks = []
    for start in range(0, min(len(ids), args.tokens), body):
        c = ids[start:start + body]
        if len(c) < 16:
            break
        chunks.append(([bos] if bos >= 0 else []) + c)
    base = model_logits(args.base, chunks, args.ctx, args.threads)
    base_ppl = compare(base, base, chunks)["ppl"]
    results = []
    print(f"base {args.base.name}: ppl {base_ppl:.3f} over {sum(map(len, chunks))} tokens")
    print(f"{'model':40s} {'kl':>9s} {'top1':>6s} {'rel_l2':>8s} {'ppl':>9s}")
    for q in args.quantized:
        r = compare(base, model_logits(q, chunks, args.ctx, args.threads), chunks)
        r["model"] = str(q)
        results.append(r)
        print(f"{q.name:40s} {r['kl']:9.5f} {r['top1']:6.3f} {r['rel_l2']:8.4f} {r['ppl']:9.3f}")
    if args.json:
        args.json.write_text(json.dumps({"base": str(args.base), "base_ppl": base_ppl,
                                         "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
