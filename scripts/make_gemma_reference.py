#!/usr/bin/env python3
"""Makes llama.cpp reference outputs for the default model (Gemma 3 270M, Q4_K_M).

Writes testdata/reference/gemma3/reference.json with, all from llama.cpp (llama-cpp-python, CPU,
F32 KV cache, flash attention off, 2 threads):
  * the model file's SHA-256;
  * `eval`: the evaluation text (scripts/texts.py, held out from quantizer calibration) tokenized
    by llama.cpp with BOS, cut into WINDOWS windows of WINDOW tokens (each starting with BOS, run
    in a fresh context); for every position, the TOPK most likely next tokens with their log
    probabilities (log-softmax over the full vocabulary);
  * `greedy`: for each prompt of testdata/gemma/prompts.txt, its ids (BOS added) and the 64-token
    greedy continuation (EOS ignored) with the top-1 minus top-2 logit margin at every step;
  * `tokenize`: llama.cpp's ids for every string of testdata/tokenizer/corpus.jsonl and for the
    whole evaluation text, without special tokens.

Running it twice on the same machine gives identical output.

With --isa avx2 it runs llama.cpp's AVX2-only build instead (bench/llamacpp/build_avx2_lib.sh,
loaded through LLAMA_CPP_LIB_PATH: the orders of CPUs without AVX-512, which pdserve runs under
PDSERVE_CPU_ISA=avx2) and writes reference_avx2.json, without the tokenizer section (the ids do
not depend on the build).

Usage: python scripts/make_gemma_reference.py [--model PATH] [--out PATH] [--isa native|avx2]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import texts  # noqa: E402

WINDOW = 512
WINDOWS = 4
TOPK = 32
N_GREEDY = 64
SETTINGS = dict(n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2, seed=1234,
                type_k=0, type_v=0, flash_attn=False, n_gpu_layers=0, logits_all=True,
                use_mmap=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=REPO / "models" / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--isa", choices=["native", "avx2"], default="native")
    args = ap.parse_args()
    ref_dir = REPO / "testdata" / "reference" / "gemma3"
    if args.out is None:
        args.out = ref_dir / ("reference.json" if args.isa == "native" else "reference_avx2.json")
    if args.isa == "avx2":
        import os
        import subprocess
        lib = os.environ.get("PDSERVE_LLAMACPP_AVX2_LIB") or subprocess.run(
            ["bash", str(REPO / "bench" / "llamacpp" / "build_avx2_lib.sh")], check=True,
            capture_output=True, text=True).stdout.strip().splitlines()[-1]
        os.environ["LLAMA_CPP_LIB_PATH"] = lib  # read when llama_cpp is imported
    import llama_cpp

    llm = llama_cpp.Llama(str(args.model), verbose=False, **SETTINGS)
    out: dict = {"model_sha256": sha256(args.model), "settings": SETTINGS,
                 "llama_cpp_python": llama_cpp.__version__, "window": WINDOW, "topk": TOPK,
                 "isa": args.isa}

    eval_text = texts.build_text("evaluation")
    eval_ids = llm.tokenize(eval_text, add_bos=False, special=False)
    body = WINDOW - 1
    windows = []
    for w in range(WINDOWS):
        ids = [llm.token_bos()] + eval_ids[w * body:(w + 1) * body]
        llm.reset()
        llm.eval(ids)
        lp = log_softmax(np.array(llm.scores[:len(ids)], dtype=np.float32))
        top = np.argsort(-lp, axis=1, kind="stable")[:, :TOPK].astype(np.int32)
        top_lp = np.take_along_axis(lp, top, axis=1).astype(np.float32)
        windows.append({"ids": ids, "top_ids_b64": b64(top), "top_logprobs_b64": b64(top_lp)})
        print(f"eval window {w}: {len(ids)} positions", file=sys.stderr)
    out["eval"] = windows

    greedy = []
    for line in (REPO / "testdata" / "gemma" / "prompts.txt").read_text().splitlines():
        ids = llm.tokenize(line.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        gen, margins = [], []
        for step in range(N_GREEDY):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            tok = int(np.argmax(row))
            top2 = np.partition(row.astype(np.float64), -2)[-2:]
            gen.append(tok)
            margins.append(float(top2[1] - top2[0]))
            if step + 1 < N_GREEDY:
                llm.eval([tok])
        greedy.append({"prompt": line, "prompt_ids": ids, "greedy_ids": gen, "margins": margins})
        print(f"greedy: {line[:40]!r}", file=sys.stderr)
    out["greedy"] = greedy

    if args.isa == "avx2":
        llm.close()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, separators=(",", ":")) + "\n")
        print(args.out)
        return 0

    corpus = [bytes.fromhex(json.loads(l)["hex"]) for l in
              (REPO / "testdata" / "tokenizer" / "corpus.jsonl").read_text().splitlines() if l]
    tok = []
    for s in corpus:
        try:
            tok.append(llm.tokenize(s, add_bos=False, special=False))
        except Exception as e:  # llama.cpp refuses some invalid byte sequences
            tok.append({"error": str(e)})
    out["tokenize"] = {"corpus": tok, "eval_text_ids": eval_ids}
    llm.close()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
