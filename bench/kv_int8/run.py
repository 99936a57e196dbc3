#!/usr/bin/env python3
"""INT8 KV cache vs F16 KV cache on the default model: KV bytes and next-token KL divergence.

Builds the held-out evaluation text (scripts/texts.py), runs it through bench/kv_int8/kv_kl.cc
(one forward pass per KV type over the same tokens, logits of every position, exact KL over the
full vocabulary in F64) and writes bench/results/kv_int8_<date>.md with the command, the machine,
the numbers and the pass/fail of the targets:
  * INT8 KV bytes <= 0.52 x F16 (the design's "half": (head_dim + 4) / (2 * head_dim) with one F32
    scale per token and head, 0.508 at head_dim 256);
  * mean KL(F16 KV || INT8 KV) <= 1e-3 nats over >= 2,000 positions.
Beside them: F32 KV (KL(F16 || F32): what F16 itself costs) and, unless --no-floor, F16 KV on the
scalar kernels ("f16/scalar": the same arithmetic up to the order of F32 additions), the KL that
rounding-level noise alone causes in this model; a KV format cannot be judged below that floor.

Usage:
  python bench/kv_int8/run.py [--kv-kl build/bin/kv_kl] [--model M.gguf] [--tokens 2048]
                              [--ctx 2048] [--threads 2] [--out bench/results/kv_int8_DATE.md]
Exit status 1 when a target is missed. 2,048 positions take about 8 CPU-minutes (4 minutes on 2
idle cores; 5.5 CPU-minutes with --no-floor).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import f32_weights  # noqa: E402
import texts  # noqa: E402

KL_TARGET = 1e-3
BYTES_TARGET = 0.52
MIN_POSITIONS = 2000


def machine() -> str:
    lines = [f"{platform.machine()}, {os.cpu_count()} CPUs"]
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                lines.append(ln.split(":", 1)[1].strip())
                break
    except OSError:
        pass
    return "; ".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv-kl", type=Path, default=Path(os.environ.get(
        "KV_KL", REPO_ROOT / "build" / "bin" / "kv_kl")), help="the kv_kl binary")
    ap.add_argument("--model", type=Path, default=REPO_ROOT / "models" / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--tokens", type=int, default=2048, help="positions to evaluate")
    ap.add_argument("--ctx", type=int, default=2048, help="positions per sequence")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-floor", action="store_true",
                    help="skip the f16/scalar noise-floor run (about a third of the time)")
    f32_weights.add_args(ap, "KV format")
    ap.add_argument("--out", type=Path, help="markdown report (default bench/results/"
                    "kv_int8_<date>.md)")
    args = ap.parse_args(argv)
    if not args.kv_kl.is_file():
        print(f"run.py: {args.kv_kl} not found: build the kv_kl target or pass --kv-kl",
              file=sys.stderr)
        return 2
    date = datetime.date.today().isoformat()
    out = args.out or REPO_ROOT / "bench" / "results" / f"kv_int8_{date}.md"

    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "evaluation.txt"
        text.write_bytes(texts.build_text("evaluation"))
        js = Path(tmp) / "kv_kl.json"
        model = args.model
        if args.f32_weights:
            model = Path(tmp) / "model-f32.gguf"
            print(f"run.py: dequantizing {args.model} to F32 ({model})", file=sys.stderr)
            f32_weights.dequantize(args.pdctl, args.model, model, args.threads)
        cmd = [str(args.kv_kl), "--model", str(model), "--text", str(text),
               "--types", "f16", "int8", "f32", "--tokens", str(args.tokens),
               "--ctx", str(args.ctx), "--threads", str(args.threads), "--json", str(js)]
        if not args.no_floor:
            cmd.append("--floor")
        load = os.getloadavg()[0]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        cpu_s = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            return proc.returncode
        r = json.loads(js.read_text())

    by = {t["kv_type"]: t for t in r["types"]}
    i8, f32, floor = by["int8"], by["f32"], by.get("f16/scalar")
    hd = r["head_dim"]
    formula = (hd + 4) / (2 * hd)
    ok_kl = i8["mean_kl"] <= KL_TARGET and r["positions"] >= MIN_POSITIONS
    ok_bytes = i8["bytes_vs_reference"] <= BYTES_TARGET
    try:
        rel_model = args.model.resolve().relative_to(REPO_ROOT)
    except ValueError:
        rel_model = args.model
    command = "python bench/kv_int8/run.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    why_floor = ("" if args.f32_weights else
                 ", whose Q8_K activation quantization turns any rounding-level change into a few "
                 "1e-3 of KL")
    floor_text = "" if floor is None else (
        f", and the same F16 KV on the scalar kernels, which differ only in the order of F32 "
        f"additions, is {floor['mean_kl']:.3e} from it: the noise floor of these weights"
        f"{why_floor}. INT8 KV is {i8['mean_kl'] / floor['mean_kl']:.1f}x that floor")
    weights = (", with every weight dequantized to F32 by `pdctl quantize --override '.*=f32'` "
               "(so matmul inputs stay F32: no Q8_K requantization amplifies rounding)"
               if args.f32_weights else " (weights as stored in the file)")
    ppl_floor = "" if floor is None else (
        f", F16 KV on the scalar kernels {floor['ppl']:.3f} "
        f"({100 * (floor['ppl'] / by['f16']['ppl'] - 1):+.2f}%)")
    rows = "\n".join(
        f"| {t['kv_type']} | {t['mean_kl']:.3e} | {t['max_kl']:.3e} | {t['top1']:.4f} | "
        f"{t['ppl']:.4f} | {t['cache_bytes']:,} | {t['bytes_vs_reference']:.4f} |"
        for t in r["types"])
    md = f"""# INT8 KV cache vs F16 KV cache ({date})

Command: `{command.strip()}` (runs `{args.kv_kl}`, bench/kv_int8/kv_kl.cc).

Model `{rel_model}`{weights}: {r['n_layer']} layers, {r['n_kv_heads']} KV head(s) of {hd}, vocabulary
{r['n_vocab']:,}. Text: the held-out evaluation text of scripts/texts.py, tokenized by the model's
tokenizer with BOS, {r['sequences']} sequence(s) of up to {r['ctx']} positions, {r['positions']:,}
positions in all, prefilled in chunks of 256 tokens with the logits of every position; KV blocks
of {r['block_size']} tokens; CPU backend, {args.threads} threads; {r['seconds']:.0f} s wall,
{cpu_s:.0f} s of user CPU (1-minute load average {load:.1f} at the start: the machine may be shared).
Machine: {machine()}.

KL is KL(F16 KV || type) of the next-token distributions over the full vocabulary (F64
log-softmax), in nats, averaged over positions; top1 is agreement of the argmax with F16 KV; ppl is
the model's perplexity on the text with that cache; bytes are the whole cache at {r['ctx']}
positions (`KvCache::BytesFor`).

| KV type | mean KL | max KL | top1 | ppl | cache bytes | bytes / F16 |
| --- | --- | --- | --- | --- | --- | --- |
{rows}

## Targets

* Bytes: INT8 stores per token and head `head_dim` int8 values plus one F32 scale, F16 stores
  `2 * head_dim` bytes: (head_dim + 4) / (2 * head_dim) = ({hd} + 4) / (2 * {hd}) = {formula:.4f}
  (measured {i8['bytes_vs_reference']:.4f}). Exactly half would need the scales elsewhere; F16
  scales would give ({hd} + 2) / (2 * {hd}) = {(hd + 2) / (2 * hd):.4f}. Target <= {BYTES_TARGET}:
  **{'met' if ok_bytes else 'MISSED'}**.
* Quality: mean KL(F16 || INT8) = {i8['mean_kl']:.3e} over {r['positions']:,} positions, target
  <= {KL_TARGET:g} over >= {MIN_POSITIONS:,}: **{'met' if ok_kl else 'MISSED'}**. For scale, F16
  KV itself is {f32['mean_kl']:.3e} from F32 KV (KL(F16 || F32)){floor_text}.
* Perplexity on the text: F16 KV {by['f16']['ppl']:.3f}, INT8 KV {i8['ppl']:.3f}
  ({100 * (i8['ppl'] / by['f16']['ppl'] - 1):+.2f}%), F32 KV {f32['ppl']:.3f}
  ({100 * (f32['ppl'] / by['f16']['ppl'] - 1):+.2f}%){ppl_floor}.
"""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(f"written to {out}")
    return 0 if ok_kl and ok_bytes else 1


if __name__ == "__main__":
    sys.exit(main())
