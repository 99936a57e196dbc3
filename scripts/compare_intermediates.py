#!/usr/bin/env python3
"""Compares our forward pass with llama.cpp's, tensor by tensor, on one prompt.

Runs llama.cpp (llama-cpp-python, the settings of the reference goldens: F32 K/V cache, flash
attention off, 2 threads, one batch) with an eval callback that copies named intermediate tensors,
and `pdctl logits --dump-matmul-inputs` on the same token ids, then prints, for every layer, how
many elements of each matmul input are bit-identical and the largest relative difference:

    ours (matmul input)          llama.cpp tensor
    blk.L.attn_q.weight          attn_norm-L     RMSNorm output (times the norm weight)
    blk.L.Qcur / Kcur / Vcur     Qcur-L ...      Q and K after RoPE, V
    blk.L.attn_output.weight     kqv_out-L       attention output, heads concatenated
    blk.L.ffn_gate.weight        ffn_norm-L
    blk.L.ffn_gate / ffn_up      ffn_gate-L ...  the two projections, before the activation
    blk.L.ffn_down.weight        ffn_geglu-L     (or ffn_swiglu-L for SwiGLU models)
    blk.L.ffn_out                ffn_out-L       the feed-forward output, before its post norm
    token_embd / output.weight   result_norm

The first tensor that is not bit-identical tells which op rounds differently; everything after
it inherits the difference (and a small model amplifies it through the activation quantizers).

    .venv/bin/python scripts/compare_intermediates.py [--model M] [--ids "2 651 ..."] [--text T]
        [--pdctl build/bin/pdctl] [--repack on|off]
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
GGML_TYPE_F32 = 0


class GgmlTensor(ctypes.Structure):
    """The head of struct ggml_tensor (ggml.h of the llama.cpp that llama-cpp-python pins)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


def llama_tensors(model: Path, ids: list[int], wanted: set[str], repack: bool) -> dict[str, np.ndarray]:
    import llama_cpp
    import llama_cpp.llama as ll

    got: dict[str, np.ndarray] = {}

    def cb(t_ptr, ask, _user):
        t = GgmlTensor.from_address(t_ptr)
        name = t.name.decode()
        if ask:
            return name in wanted
        if name in wanted and t.type == GGML_TYPE_F32 and t.data:
            ne0, ne1 = t.ne[0], t.ne[1] * t.ne[2] * t.ne[3]
            # Rows may be strided (views); copy row by row.
            rows = [np.ctypeslib.as_array((ctypes.c_float * ne0).from_address(t.data + r * t.nb[1]))
                    for r in range(ne1)] if t.nb[1] != 4 * ne0 else \
                [np.ctypeslib.as_array((ctypes.c_float * (ne0 * ne1)).from_address(t.data))]
            got[name] = np.concatenate(rows).reshape(ne1, ne0).copy()
        return True

    callback = llama_cpp.ggml_backend_sched_eval_callback(cb)
    ctx_default, model_default = llama_cpp.llama_context_default_params, llama_cpp.llama_model_default_params

    def ctx_params():
        p = ctx_default()
        p.cb_eval = callback
        p.cb_eval_user_data = None
        return p

    def model_params():
        p = model_default()
        p.use_extra_bufts = repack
        return p

    ll.llama_cpp.llama_context_default_params = ctx_params
    ll.llama_cpp.llama_model_default_params = model_params
    try:
        llm = llama_cpp.Llama(str(model), n_ctx=max(512, len(ids) + 8), n_batch=512, n_ubatch=512,
                              n_threads=2, n_threads_batch=2, type_k=0, type_v=0, flash_attn=False,
                              n_gpu_layers=0, logits_all=True, verbose=False)
        llm.eval(ids)
        llm.close()
    finally:
        ll.llama_cpp.llama_context_default_params = ctx_default
        ll.llama_cpp.llama_model_default_params = model_default
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=REPO / "models" / "gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--pdctl", type=Path, default=REPO / "build" / "bin" / "pdctl")
    ap.add_argument("--ids", help="space-separated token ids (default: --text tokenized with BOS)")
    ap.add_argument("--text", default="The quick brown fox jumps over the lazy dog. " * 6)
    ap.add_argument("--repack", choices=["on", "off"], default="on",
                    help="llama.cpp's repacked (extra buffer) kernels: on = its default")
    ap.add_argument("--layers", type=int, default=0, help="print only the first N layers (0 = all)")
    args = ap.parse_args()

    import llama_cpp
    if args.ids:
        ids = [int(t) for t in args.ids.split()]
    else:
        tok = llama_cpp.Llama(str(args.model), vocab_only=True, verbose=False)
        ids = tok.tokenize(args.text.encode(), add_bos=True, special=False)
        tok.close()
    import gguf
    reader = gguf.GGUFReader(str(args.model))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    n_layer = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    act = "ffn_geglu" if arch.startswith("gemma") else "ffn_swiglu"
    pairs = []
    for l in range(n_layer):
        pairs += [(f"blk.{l}.attn_q.weight", f"attn_norm-{l}"),
                  (f"blk.{l}.Qcur", f"Qcur-{l}"), (f"blk.{l}.Kcur", f"Kcur-{l}"),
                  (f"blk.{l}.Vcur", f"Vcur-{l}"),
                  (f"blk.{l}.attn_output.weight", f"kqv_out-{l}"),
                  (f"blk.{l}.ffn_gate.weight", f"ffn_norm-{l}"),
                  (f"blk.{l}.ffn_gate", f"ffn_gate-{l}"), (f"blk.{l}.ffn_up", f"ffn_up-{l}"),
                  (f"blk.{l}.ffn_down.weight", f"{act}-{l}"),
                  (f"blk.{l}.ffn_out", f"ffn_out-{l}")]
    pairs.append(("__output__", "result_norm"))
    theirs = llama_tensors(args.model, ids, {p[1] for p in pairs}, args.repack == "on")

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(args.pdctl), "logits", "-m", str(args.model), "--prompt-ids",
                        " ".join(map(str, ids)), "--all", "--top", "1", "--kv-type", "f32",
                        "-o", f"{tmp}/top.bin", "--dump-matmul-inputs", tmp],
                       check=True, capture_output=True, timeout=600)
        out_file = next((f for f in ("token_embd.weight.f32", "output.weight.f32")
                         if Path(tmp, f).exists()), None)
        print(f"{len(ids)} tokens, llama.cpp repack {args.repack}; per tensor: bit-identical "
              f"elements, max |ours - llama.cpp| / max |llama.cpp|")
        first_diff = None
        for ours_name, their_name in pairs:
            layer = ours_name.split(".")[1] if ours_name.startswith("blk.") else None
            if args.layers and layer is not None and int(layer) >= args.layers:
                continue
            path = Path(tmp, (out_file if ours_name == "__output__" else ours_name + ".f32"))
            if their_name not in theirs or not path.exists():
                print(f"{their_name:16s} missing ({'llama.cpp' if their_name not in theirs else 'ours'})")
                continue
            t = theirs[their_name]
            o = np.fromfile(path, dtype=np.float32).reshape(t.shape)
            same = float(np.mean(o.view(np.uint32) == t.view(np.uint32)))
            rel = float(np.max(np.abs(o - t)) / max(float(np.max(np.abs(t))), 1e-30))
            if same < 1.0 and first_diff is None:
                first_diff = their_name
            print(f"{their_name:16s} {same * 100:7.3f}% identical   max rel diff {rel:.3e}")
        print(f"first tensor that differs: {first_diff or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
