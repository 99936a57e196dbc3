#!/usr/bin/env python3
"""Compares `pdctl quantize` methods (rtn, importance, gptq) per base type on one model.

For every type x method it quantizes MODEL (with --eval-hessian, so that every method's x_err is
the exact output error on the calibration inputs), then measures through llama.cpp the KL
divergence of the next-token distributions from the original on the built-in evaluation text
(scripts/kl_eval.py). Prints one row per type and method:
  x_err   mean over the quantized block matrices (blk.*) of ||X (W - Q)^T|| / ||X W^T||
  w_err   mean over the same matrices of ||W - Q|| / ||W||
  kl      mean KL(original || quantized), nats per token, evaluation text
  top1    agreement of the most likely next token

Usage:
  python scripts/quant_methods.py MODEL.gguf [--types q4_K q3_K] [--methods rtn gptq]
         [--pdctl build/bin/pdctl] [--tokens 1024] [--calib-tokens 16384] [--keep-head]
         [--json OUT.json]
--keep-head leaves token_embd/output to the policy; by default they are pinned to q8_0 so that
the comparison is about the block matrices (and runs in seconds: the k-quant searches on a 32k-row
embedding dominate a full run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kl_eval  # noqa: E402
import texts  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
TYPES = ["q8_0", "q6_K", "q5_K", "q4_K", "q4_0", "q3_K", "q2_K"]
METHODS = ["rtn", "importance", "gptq"]


def parse_table(report: str) -> list[dict]:
    rows = []
    for line in report.splitlines()[1:]:
        if not line.strip():
            break
        c = line.split()
        rows.append({"name": c[0], "type": c[2], "w_err": c[4], "x_err": c[5].rstrip("~"),
                     "method": c[6]})
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--pdctl", type=Path, default=REPO_ROOT / "build" / "bin" / "pdctl")
    ap.add_argument("--tokens", type=int, default=1024, help="evaluation tokens")
    ap.add_argument("--calib-tokens", type=int, default=16384)
    ap.add_argument("--keep-head", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import llama_cpp

    vocab = llama_cpp.Llama(str(args.model), vocab_only=True, verbose=False)
    ids = vocab.tokenize(texts.build_text("evaluation"), add_bos=False)
    chunks = [[vocab.token_bos()] + ids[i:i + 255] for i in range(0, args.tokens, 255)]
    base = kl_eval.model_logits(args.model, chunks, 256, 2)
    pin = [] if args.keep_head else ["--override", r"token_embd\.weight=q8_0",
                                     "--override", r"output\.weight=q8_0"]
    results = []
    print(f"{'type':6s} {'method':11s} {'x_err':>8s} {'w_err':>8s} {'kl':>9s} {'top1':>6s}")
    with tempfile.TemporaryDirectory() as tmp:
        for t in args.types:
            for m in args.methods:
                out = Path(tmp) / f"{t}-{m}.gguf"
                p = subprocess.run([str(args.pdctl), "quantize", str(args.model), str(out),
                                    "--type", t, "--method", m, "--eval-hessian",
                                    "--calib-tokens", str(args.calib_tokens), *pin],
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    print(p.stderr, file=sys.stderr)
                    return 1
                rows = [r for r in parse_table(p.stdout)
                        if r["name"].startswith("blk.") and r["x_err"] != "-"]
                x = sum(float(r["x_err"]) for r in rows) / len(rows)
                w = sum(float(r["w_err"]) for r in rows) / len(rows)
                c = kl_eval.compare(base, kl_eval.model_logits(out, chunks, 256, 2), chunks)
                out.unlink()
                res = {"type": t, "method": m, "x_err": x, "w_err": w, "kl": c["kl"],
                       "top1": c["top1"]}
                results.append(res)
                print(f"{t:6s} {m:11s} {x:8.5f} {w:8.5f} {c['kl']:9.5f} {c['top1']:6.3f}",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
