#!/usr/bin/env python3
"""llama.cpp's own next-token KL "noise floor": KV cache type and summation-order changes.

Companion to bench/kv_int8/run.py (our engine's INT8 KV cache vs F16): runs the same held-out
evaluation text (scripts/texts.py, the model's tokenizer, BOS, first --positions positions, one
sequence) through llama.cpp itself (llama-cpp-python, CPU, logits of every position) once per
configuration, and reports per configuration, against the reference (F16 K and V, flash attention
off, --threads threads, n_batch 512):
  * mean and max KL(reference || config) of the next-token distributions over the full vocabulary,
    in nats, from F64 log-softmax of the F32 logits;
  * top-1 agreement with the reference; the largest absolute logit difference;
  * the perplexity of the text under each configuration;
  * KV cache bytes per token per layer (K + V) for the configuration's types (Q8_0: 34 bytes per
    32 values).
Configurations (one llama.cpp context each, a fresh KV cache each):
  f16           F16 K/V, flash attention off (the reference)
  f16-repeat    the reference again (run-to-run determinism)
  f32           F32 K/V, flash attention off
  f16-fa        F16 K/V, flash attention on
  q8_0-fa       Q8_0 K/V, flash attention on (llama.cpp requires it for a quantized V cache);
                also compared with f16-fa, which differs from it only in the KV type
  q8_0k-f16v    Q8_0 K, F16 V, flash attention off (K quantization alone)
  q8_0-nofa     Q8_0 K/V, flash attention off: expected to be refused; the error is recorded
  f16-1thread   the reference on 1 thread
  f16-batch64   the reference with n_batch = n_ubatch = 64 (other matmul batch shapes)
  f16-batch1    the reference one token per llama_decode (matrix-vector kernels throughout)
A configuration that fails records llama.cpp's error (its log's error lines) instead of numbers.

The reference's logits (positions x vocabulary F32, 2 GiB at 2,048 x 262,144) go to a memmap in a
temporary directory (--tmp, default /tmp), as do those of f16-fa; at most one run's logits are in
memory at a time (llama-cpp-python's own `scores` array). Each llama.cpp pass over 2,048 positions
takes well under a minute on 2 cores; the KL arithmetic about as long again.

Usage:
  python bench/kv_int8/llamacpp_kv_floor.py [--model M.gguf] [--positions 2048] [--threads 2]
      [--configs f16,f32,...] [--out bench/results/kv_int8_llamacpp_floor_DATE.md]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import texts  # noqa: E402  (the same text builder as bench/kv_int8/run.py)

import llama_cpp  # noqa: E402

F32, F16, Q8_0 = llama_cpp.GGML_TYPE_F32, llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_Q8_0
TYPE_NAMES = {F32: "f32", F16: "f16", Q8_0: "q8_0"}
# Bytes per value: F32 4, F16 2, Q8_0 34 bytes per block of 32 (one F16 scale + 32 int8).
TYPE_BYTES = {F32: 4.0, F16: 2.0, Q8_0: 34.0 / 32.0}

# Our engine's numbers (bench/results/kv_int8_2026-11-29.md), quoted for comparison.
ENGINE_2026_11_29 = [
    ("int8 (ours)", "KL(F16 \\|\\| INT8)", 1.244e-2, 1.312e-1, 0.9351, 26.1042),
    ("f32 (ours)", "KL(F16 \\|\\| F32)", 5.800e-3, 5.392e-2, 0.9531, 25.9561),
    ("f16/scalar (ours)", "KL(F16 \\|\\| F16 on scalar kernels)", 5.540e-3, 4.636e-2, 0.9556, 26.0415),
]
ENGINE_F16_PPL = 25.9769


@dataclass
class Config:
    name: str
    type_k: int
    type_v: int
    flash_attn: bool
    threads: Optional[int] = None  # None: --threads
    n_batch: int = 512
    also_vs: Optional[str] = None  # a second reference (a config saved to disk)
    note: str = ""


CONFIGS = [
    Config("f16", F16, F16, False, note="reference"),
    Config("f16-repeat", F16, F16, False, note="reference again"),
    Config("f32", F32, F32, False),
    Config("f16-fa", F16, F16, True),
    Config("q8_0-fa", Q8_0, Q8_0, True, also_vs="f16-fa"),
    Config("q8_0k-f16v", Q8_0, F16, False, note="K quantized only"),
    Config("q8_0-nofa", Q8_0, Q8_0, False, note="expected to be refused"),
    Config("f16-1thread", F16, F16, False, threads=1),
    Config("f16-batch64", F16, F16, False, n_batch=64),
    Config("f16-batch1", F16, F16, False, n_batch=1, note="one token per llama_decode"),
]
REFERENCE = "f16"
SAVED = {REFERENCE} | {c.also_vs for c in CONFIGS if c.also_vs}


# ---- llama.cpp log capture ------------------------------------------------------------------
# llama.cpp reports why a context cannot be made only in its log; collect the log so that a
# failed configuration can record the exact error (and a good one llama.cpp's KV cache size).
_LOG: list[tuple[int, str]] = []


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    _LOG.append((level, text.decode("utf-8", "replace")))


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
# ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5.
LOG_ERROR, LOG_WARN = 4, 3


def log_lines(since: int, levels: tuple[int, ...]) -> list[str]:
    return [t.strip() for lv, t in _LOG[since:] if lv in levels and t.strip()]


def kv_size_lines(since: int) -> list[str]:
    """llama.cpp's own account of the KV cache it made (one line per cache: global and SWA)."""
    return [" ".join(t.split()) for _, t in _LOG[since:] if t.startswith("llama_kv_cache: size")]


# ---- text and tokens --------------------------------------------------------------------------
def tokens_for(model: Path, positions: int) -> tuple[list[int], bool, int]:
    """[BOS] + the first positions-1 tokens of the evaluation text, as run.py/kv_kl.cc cut them
    (Encode(text, add_special=false, parse_special=false), BOS when the model adds one).
    Returns (tokens, bos_added, total text tokens)."""
    vocab = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    try:
        text = texts.build_text("evaluation")
        ids = vocab.tokenize(text, add_bos=False, special=False)
        bos = bool(vocab._model.add_bos_token())
        seq = ([vocab.token_bos()] if bos else []) + ids
        if len(seq) < positions:
            raise SystemExit(f"the text has only {len(seq)} positions, --positions {positions}")
        return seq[:positions], bos, len(ids)
    finally:
        vocab.close()


def pdctl_ids(pdctl: Path, model: Path) -> list[int]:
    """Our engine's tokenizer on the same text (`pdctl tokenize --no-special`), for a cross-check."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(texts.build_text("evaluation"))
        f.flush()
        out = subprocess.run([str(pdctl), "tokenize", "-m", str(model), "--no-special",
                              "--file", f.name], capture_output=True, text=True, check=True)
    return [int(x) for x in out.stdout.split()]


# ---- statistics -------------------------------------------------------------------------------
def log_softmax64(x: np.ndarray) -> np.ndarray:
    y = x.astype(np.float64)
    y -= y.max(axis=1, keepdims=True)
    y -= np.log(np.exp(y).sum(axis=1, keepdims=True))
    return y


def own_stats(logits: np.ndarray, toks: list[int], chunk: int) -> dict:
    """Per-run numbers that need no reference: perplexity and the argmax of every position."""
    n = logits.shape[0]
    nll, argmax = 0.0, np.empty(n, dtype=np.int64)
    nxt = np.asarray(toks[1:] + [0], dtype=np.int64)
    for i in range(0, n, chunk):
        j = min(n, i + chunk)
        lp = log_softmax64(logits[i:j])
        argmax[i:j] = logits[i:j].argmax(axis=1)
        rows = np.arange(j - i)
        has_next = np.arange(i, j) < n - 1
        nll -= lp[rows[has_next], nxt[i:j][has_next]].sum()
    return {"ppl": float(np.exp(nll / (n - 1))), "argmax": argmax,
            "finite": bool(np.isfinite(logits).all())}


def compare(ref: np.ndarray, cur: np.ndarray, ref_argmax: np.ndarray, cur_argmax: np.ndarray,
            chunk: int) -> dict:
    """KL(ref || cur) per position (F64), top-1 agreement, largest |logit difference|."""
    n = ref.shape[0]
    kl = np.empty(n, dtype=np.float64)
    max_abs = 0.0
    for i in range(0, n, chunk):
        j = min(n, i + chunk)
        r, c = ref[i:j], cur[i:j]
        max_abs = max(max_abs, float(np.abs(r - c).max()))
        lr, lc = log_softmax64(r), log_softmax64(c)
        kl[i:j] = (np.exp(lr) * (lr - lc)).sum(axis=1)
    return {"mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
            "top1": float((ref_argmax == cur_argmax).mean()), "max_abs_dlogit": max_abs,
            "identical": max_abs == 0.0}


# ---- runs -------------------------------------------------------------------------------------
@dataclass
class Result:
    cfg: Config
    threads: int
    kv_bytes: float = 0.0
    seconds: float = 0.0
    error: str = ""
    ppl: float = float("nan")
    vs: dict = field(default_factory=dict)  # reference name -> compare() dict
    kv_log: list = field(default_factory=list)


def kv_bytes_per_token_layer(cfg: Config, n_head_kv: int, head_k: int, head_v: int) -> float:
    return n_head_kv * (head_k * TYPE_BYTES[cfg.type_k] + head_v * TYPE_BYTES[cfg.type_v])


def run_config(cfg: Config, args, toks: list[int], saved: dict, saved_stats: dict,
               tmp: Path, geometry: tuple[int, int, int]) -> Result:
    threads = cfg.threads or args.threads
    res = Result(cfg, threads, kv_bytes=kv_bytes_per_token_layer(cfg, *geometry))
    n = len(toks)
    mark = len(_LOG)
    llm = None
    try:
        try:
            llm = llama_cpp.Llama(
                str(args.model), n_ctx=n, n_batch=cfg.n_batch, n_ubatch=cfg.n_batch,
                n_threads=threads, n_threads_batch=threads, logits_all=True,
                flash_attn=cfg.flash_attn, type_k=cfg.type_k, type_v=cfg.type_v,
                seed=args.seed, n_gpu_layers=0, verbose=False)
            res.kv_log = kv_size_lines(mark)
            t0 = time.perf_counter()
            llm.eval(toks)
            res.seconds = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - a refused configuration is a result, not a crash
            errs = log_lines(mark, (LOG_ERROR,)) or log_lines(mark, (LOG_WARN,))
            res.error = "; ".join(errs + [f"{type(e).__name__}: {e}"])
            return res
        logits = llm.scores[:n]
        st = own_stats(logits, toks, args.chunk)
        res.ppl = st["ppl"]
        if not st["finite"]:
            res.error = "non-finite logits"
        for ref_name in filter(None, [REFERENCE, cfg.also_vs]):
            if ref_name == cfg.name:
                continue
            if ref_name not in saved:
                res.vs[ref_name] = None  # reference failed or not run
                continue
            res.vs[ref_name] = compare(saved[ref_name], logits, saved_stats[ref_name]["argmax"],
                                       st["argmax"], args.chunk)
        if cfg.name in SAVED:
            mm = np.lib.format.open_memmap(tmp / f"{cfg.name}.npy", mode="w+",
                                           dtype=np.float32, shape=logits.shape)
            mm[:] = logits
            mm.flush()
            saved[cfg.name] = mm
            saved_stats[cfg.name] = st
        return res
    finally:
        if llm is not None:
            llm.close()
            del llm


# ---- report -----------------------------------------------------------------------------------
def fmt_kl(d: Optional[dict]) -> tuple[str, str, str, str]:
    if d is None:
        return ("n/a",) * 4
    return (f"{d['mean_kl']:.3e}", f"{d['max_kl']:.3e}", f"{d['top1']:.4f}",
            "0 (bit-identical)" if d["identical"] else f"{d['max_abs_dlogit']:.3g}")


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for ln in out.splitlines():
            if ln.startswith("Model name"):
                return f"{ln.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs"


def report(args, argv, results: list[Result], toks, bos, n_text, geometry, tok_check, load0,
           load1, wall) -> str:
    date = datetime.date.today().isoformat()
    n_head_kv, head_k, head_v = geometry
    f16_bytes = n_head_kv * (head_k + head_v) * 2.0
    try:
        rel_model = args.model.resolve().relative_to(REPO_ROOT)
    except ValueError:
        rel_model = args.model
    command = "python bench/kv_int8/llamacpp_kv_floor.py " + " ".join(shlex.quote(a) for a in argv)
    by = {r.cfg.name: r for r in results}
    ref_ppl = by[REFERENCE].ppl if REFERENCE in by else float("nan")

    rows = []
    for r in results:
        c = r.cfg
        kv = f"{TYPE_NAMES[c.type_k]}/{TYPE_NAMES[c.type_v]}"
        head = (f"| {c.name} | {kv} | {'on' if c.flash_attn else 'off'} | {r.threads} | "
                f"{c.n_batch} | ")
        tail = f" | {r.kv_bytes:,.0f} | {r.kv_bytes / f16_bytes:.4f} |"
        if r.error and not r.vs:
            err = r.error.replace("|", "\\|").replace("\n", " ")
            rows.append(head + f"**failed**: `{err}` | | | | |" + tail)
            continue
        if c.name == REFERENCE:
            kl = ("0 (reference)", "0", "1.0000", "0")
        else:
            kl = fmt_kl(r.vs.get(REFERENCE))
        ppl = f"{r.ppl:.4f} ({100 * (r.ppl / ref_ppl - 1):+.2f}%)"
        rows.append(head + " | ".join(kl) + f" | {ppl}" + tail)
    pair_rows = []
    for r in results:
        if r.cfg.also_vs and r.cfg.also_vs in r.vs:
            kl = fmt_kl(r.vs[r.cfg.also_vs])
            pair_rows.append(f"| KL({r.cfg.also_vs} \\|\\| {r.cfg.name}) | " + " | ".join(kl) + " |")
    engine_rows = "\n".join(
        f"| {name} | {what} | {m:.3e} | {mx:.3e} | {t1:.4f} | {ppl:.4f} "
        f"({100 * (ppl / ENGINE_F16_PPL - 1):+.2f}%) |"
        for name, what, m, mx, t1, ppl in ENGINE_2026_11_29)
    seen, kv_logs = set(), []
    for r in results:
        key = (r.cfg.type_k, r.cfg.type_v)
        if r.kv_log and key not in seen:
            seen.add(key)
            kv_logs.append(f"* {TYPE_NAMES[key[0]]}/{TYPE_NAMES[key[1]]} ({r.cfg.name}): "
                           + "; ".join(f"`{x}`" for x in r.kv_log))
    kv_logs = "\n".join(kv_logs)
    timings = ", ".join(f"{r.cfg.name} {r.seconds:.1f} s" for r in results if r.seconds)
    return f"""# llama.cpp's own KV-type and summation-order KL floor ({date})

Command: `{command.strip()}` (llama-cpp-python {llama_cpp.__version__}, CPU).

Question: our engine measured mean KL(F16 KV || INT8 KV) = 1.24e-2, KL(F16 || F32 KV) = 5.8e-3 and
F16 KV on another summation order 5.5e-3 (bench/results/kv_int8_2026-11-29.md). Is a ~5e-3 floor a
property of the model and its quantized-activation numerics, i.e. present in llama.cpp too?

Model `{rel_model}`: {n_head_kv} KV head(s), K head size {head_k}, V head size {head_v}. Text: the
held-out evaluation text of scripts/texts.py (as bench/kv_int8/run.py builds it), tokenized by
llama.cpp's tokenizer without special tokens ({n_text:,} tokens){', with BOS' if bos else ''}; the
first {len(toks):,} positions as one sequence, logits of every position (`logits_all=True`),
n_ctx {len(toks)}. {tok_check}
Machine: {machine()}; llama.cpp CPU features: `{llama_cpp.llama_print_system_info().decode().strip()}`.
Load average (1, 5, 15 min) before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after:
{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} (the machine is shared); {wall:.0f} s wall in all.
llama.cpp eval time per pass: {timings}.

KL is KL({REFERENCE} || config) of the next-token distributions over the full vocabulary (F64
log-softmax of the F32 logits), in nats, over {len(toks):,} positions; top1 is agreement of the
argmax with {REFERENCE}; max |dlogit| the largest absolute logit difference; ppl the perplexity of
the text ({len(toks) - 1:,} predictions) with that configuration; KV bytes are per token per layer,
K + V ({n_head_kv} x ({head_k} + {head_v}) values; Q8_0 = 34 bytes per 32 values).

| config | K/V type | flash attn | threads | n_batch | mean KL | max KL | top1 | max \\|dlogit\\| | ppl | KV bytes / token / layer | bytes / F16 |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}

Same KV type comparison under flash attention (the only change is the KV type):

| pair | mean KL | max KL | top1 | max \\|dlogit\\| |
| --- | --- | --- | --- | --- |
{chr(10).join(pair_rows) or '| (not run) | | | | |'}

Our engine, for comparison (bench/results/kv_int8_2026-11-29.md, same text and positions; INT8
stores {n_head_kv} x ({head_k} + 4) x 2 = {n_head_kv * (head_k + 4) * 2:,} bytes per token per
layer, {n_head_kv * (head_k + 4) * 2 / f16_bytes:.4f} of F16):

| config | what | mean KL | max KL | top1 | ppl |
| --- | --- | --- | --- | --- | --- |
{engine_rows}

llama.cpp's own KV cache size lines (the whole cache at n_ctx {len(toks)}; Gemma 3 keeps a global
and a sliding-window cache, the latter full-size here, llama.cpp's default `swa_full`):

{kv_logs or '(none captured)'}
"""


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        description=__doc__.split("\nUsage:")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Configurations: " + ", ".join(c.name for c in CONFIGS) + f" (reference "
               f"{REFERENCE}). See the module docstring for what each one changes.")
    ap.add_argument("--model", type=Path,
                    default=REPO_ROOT / "models" / "gemma-3-270m-q4_k_m.gguf", help="GGUF model")
    ap.add_argument("--positions", type=int, default=2048,
                    help="positions to evaluate, BOS included (default 2048)")
    ap.add_argument("--threads", type=int, default=2, help="threads (default 2)")
    ap.add_argument("--seed", type=int, default=1234, help="llama.cpp seed (default 1234)")
    ap.add_argument("--configs", default=",".join(c.name for c in CONFIGS),
                    help="comma-separated configurations to run (default: all; the reference "
                         f"{REFERENCE} is always run first)")
    ap.add_argument("--chunk", type=int, default=32, help="rows per F64 KL chunk (default 32)")
    ap.add_argument("--tmp", type=Path, default=Path("/tmp"),
                    help="directory for the reference logits memmaps (default /tmp)")
    ap.add_argument("--pdctl", type=Path, default=REPO_ROOT / "build" / "bin" / "pdctl",
                    help="pdctl binary to cross-check the token ids with our tokenizer "
                         "(skipped when missing)")
    ap.add_argument("--out", type=Path, help="markdown report (default bench/results/"
                    "kv_int8_llamacpp_floor_<date>.md)")
    args = ap.parse_args(argv)
    if not args.model.is_file():
        ap.error(f"{args.model} not found")
    names = [s.strip() for s in args.configs.split(",") if s.strip()]
    unknown = set(names) - {c.name for c in CONFIGS}
    if unknown:
        ap.error(f"unknown configuration(s) {sorted(unknown)}")
    chosen = [c for c in CONFIGS if c.name == REFERENCE or c.name in names]
    date = datetime.date.today().isoformat()
    out = args.out or REPO_ROOT / "bench" / "results" / f"kv_int8_llamacpp_floor_{date}.md"

    load0 = os.getloadavg()
    t_start = time.perf_counter()
    toks, bos, n_text = tokens_for(args.model, args.positions)
    tok_check = "Token ids not cross-checked with our tokenizer (no pdctl)."
    if args.pdctl.is_file():
        try:
            ours = pdctl_ids(args.pdctl, args.model)
            body = toks[1:] if bos else toks
            same = ours[:len(body)] == body
            tok_check = (f"Cross-check: our tokenizer (`{args.pdctl.relative_to(REPO_ROOT) if args.pdctl.is_relative_to(REPO_ROOT) else args.pdctl} "
                         f"tokenize --no-special`) gives {'the same' if same else 'DIFFERENT'} "
                         f"first {len(body):,} token ids ({len(ours):,} tokens in all).")
            print(tok_check, flush=True)
        except (OSError, subprocess.CalledProcessError, ValueError) as e:
            tok_check = f"Token cross-check with pdctl failed: {e}."

    meta = llama_cpp.Llama(str(args.model), vocab_only=True, verbose=False)
    try:
        arch = meta.metadata["general.architecture"]
        n_head_kv = int(meta.metadata.get(f"{arch}.attention.head_count_kv", 1))
        n_embd = int(meta.metadata[f"{arch}.embedding_length"])
        n_head = int(meta.metadata[f"{arch}.attention.head_count"])
        head_k = int(meta.metadata.get(f"{arch}.attention.key_length", n_embd // n_head))
        head_v = int(meta.metadata.get(f"{arch}.attention.value_length", head_k))
    finally:
        meta.close()
    geometry = (n_head_kv, head_k, head_v)
    print(f"{len(toks)} positions (BOS {bos}), {n_head_kv} kv heads x K {head_k} / V {head_v}",
          flush=True)

    results: list[Result] = []
    saved: dict = {}
    saved_stats: dict = {}
    with tempfile.TemporaryDirectory(prefix="llamacpp_kv_floor.", dir=args.tmp) as tmp:
        for cfg in chosen:
            t0 = time.perf_counter()
            r = run_config(cfg, args, toks, saved, saved_stats, Path(tmp), geometry)
            results.append(r)
            d = r.vs.get(REFERENCE)
            msg = (f"error: {r.error}" if r.error and not r.vs else
                   f"ppl {r.ppl:.4f}" + (f", mean KL {d['mean_kl']:.3e}, max {d['max_kl']:.3e}, "
                                         f"top1 {d['top1']:.4f}" if d else "")
                   + "".join(f"; vs {k}: mean KL {v['mean_kl']:.3e}" for k, v in r.vs.items()
                             if k != REFERENCE and v))
            print(f"{cfg.name:12s} eval {r.seconds:5.1f} s, total {time.perf_counter() - t0:5.1f} s:"
                  f" {msg}", flush=True)
        saved.clear()
    load1 = os.getloadavg()
    md = report(args, argv, results, toks, bos, n_text, geometry, tok_check, load0, load1,
                time.perf_counter() - t_start)
    print(md)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
