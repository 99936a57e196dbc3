#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/gguf_fuzzer: small valid and invalid GGUF files.

Valid files come from the `gguf` package (the writer llama.cpp's converters use), so the seeds
look like real checkpoints: tiny llama and qwen2 models in F32 / F16 / BF16 / Q8_0, a
vocabulary-only file, a custom alignment, every metadata type. Invalid ones are hand-made bytes,
each broken in one way the reader must refuse. Every file is a few KiB at most; the whole corpus
stays far below 1 MB. Output is deterministic (fixed seed), so rerunning rewrites the same bytes.

Usage: .venv/bin/python tests/fuzz/make_corpus.py [OUTDIR]   (default: tests/fuzz/corpus/gguf)
"""

from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

HERE = Path(__file__).resolve().parent
MAGIC = 0x46554747  # "GGUF"


# ---------------------------------------------------------------------------------------------
# Valid files through the gguf package
# ---------------------------------------------------------------------------------------------

def written(fill) -> bytes:
    """Runs fill(writer) on a fresh GGUFWriter and returns the file's bytes."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.gguf"
        w = gguf.GGUFWriter(str(path), arch=fill.arch)
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


def tensor(w, name, cols, rows=None, qtype=Q.F32, rng=None):
    """Adds a tensor with ggml shape [cols] or [cols, rows] of type qtype."""
    shape = (cols,) if rows is None else (rows, cols)  # numpy order is reversed
    x = rng.standard_normal(shape).astype(np.float32) * 0.1
    if qtype == Q.F32:
        w.add_tensor(name, x)
    elif qtype == Q.F16:
        w.add_tensor(name, x.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)


def tiny_model(arch, n_embd=8, n_head=2, n_head_kv=1, n_ff=16, n_layer=1, n_vocab=6,
               wtype=Q.F32, embd_type=Q.F32, bias=False, tied=False, rope_freqs=False,
               extra=None):
    def fill(w):
        rng = np.random.default_rng(1234)
        hd = n_embd // n_head
        w.add_name("tiny")
        w.add_context_length(128)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        w.add_tokenizer_model("llama")
        w.add_token_list([f"t{i}" for i in range(n_vocab)])
        w.add_token_scores([float(-i) for i in range(n_vocab)])
        w.add_token_types([1] * n_vocab)
        if extra:
            extra(w)
        tensor(w, "token_embd.weight", n_embd, n_vocab, embd_type, rng)
        tensor(w, "output_norm.weight", n_embd, None, Q.F32, rng)
        if not tied:
            tensor(w, "output.weight", n_embd, n_vocab, wtype, rng)
        if rope_freqs:
            tensor(w, "rope_freqs.weight", hd // 2, None, Q.F32, rng)
        for i in range(n_layer):
            p = f"blk.{i}."
            tensor(w, p + "attn_norm.weight", n_embd, None, Q.F32, rng)
            tensor(w, p + "attn_q.weight", n_embd, n_head * hd, wtype, rng)
            tensor(w, p + "attn_k.weight", n_embd, n_head_kv * hd, wtype, rng)
            tensor(w, p + "attn_v.weight", n_embd, n_head_kv * hd, wtype, rng)
            tensor(w, p + "attn_output.weight", n_head * hd, n_embd, wtype, rng)
            if bias:
                tensor(w, p + "attn_q.bias", n_head * hd, None, Q.F32, rng)
                tensor(w, p + "attn_k.bias", n_head_kv * hd, None, Q.F32, rng)
                tensor(w, p + "attn_v.bias", n_head_kv * hd, None, Q.F32, rng)
            tensor(w, p + "ffn_norm.weight", n_embd, None, Q.F32, rng)
            tensor(w, p + "ffn_gate.weight", n_embd, n_ff, wtype, rng)
            tensor(w, p + "ffn_up.weight", n_embd, n_ff, wtype, rng)
            tensor(w, p + "ffn_down.weight", n_ff, n_embd, wtype, rng)
    fill.arch = arch
    return written(fill)


def vocab_only() -> bytes:
    def fill(w):
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["a", "b", "ab", "<|endoftext|>"])
        w.add_token_types([1, 1, 1, 3])
        w.add_token_merges(["a b"])
        w.add_eos_token_id(3)
    fill.arch = "qwen2"
    return written(fill)


def every_type() -> bytes:
    def fill(w):
        w.add_uint8("t.u8", 200)
        w.add_int8("t.i8", -100)
        w.add_uint16("t.u16", 60000)
        w.add_int16("t.i16", -30000)
        w.add_uint32("t.u32", 4000000000)
        w.add_int32("t.i32", -2000000000)
        w.add_float32("t.f32", 1.5)
        w.add_uint64("t.u64", 2**63 + 5)
        w.add_int64("t.i64", -(2**62))
        w.add_float64("t.f64", -3.25)
        w.add_bool("t.bool", True)
        w.add_string("t.str", "hello")
        for vt in (V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.FLOAT32, V.UINT64,
                   V.INT64, V.FLOAT64, V.BOOL):
            vals = [True, False] if vt == V.BOOL else [1, 2, 3]
            w.add_key_value(f"a.{vt.name.lower()}", vals, V.ARRAY, sub_type=vt)
        w.add_array("a.string", ["x", "", "yz"])
        w.add_custom_alignment(64)
        rng = np.random.default_rng(7)
        tensor(w, "f32", 4, 2, Q.F32, rng)
        tensor(w, "f16", 4, 2, Q.F16, rng)
        tensor(w, "bf16", 4, 2, Q.BF16, rng)
        tensor(w, "q8_0", 32, 2, Q.Q8_0, rng)
    fill.arch = "llama"
    return written(fill)


# ---------------------------------------------------------------------------------------------
# Hand-made bytes
# ---------------------------------------------------------------------------------------------

def s(x: bytes | str) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def info(name, dims, ttype, offset) -> bytes:
    return (s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<I", ttype) + struct.pack("<Q", offset))


def gguf_file(kvs=(), infos=(), data=b"", version=3, magic=MAGIC, align=32, n_tensors=None,
         n_kv=None) -> bytes:
    head = struct.pack("<IIQQ", magic, version, len(infos) if n_tensors is None else n_tensors,
                       len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(infos)
    if infos:
        head += b"\0" * (-len(head) % align)
    return head + data


ARCH = kv("general.architecture", 8, s("llama"))


def hand_made() -> dict[str, bytes]:
    nested = struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 4, 2) + struct.pack("<II", 1, 2) \
        + struct.pack("<IQ", 8, 1) + s("x")
    f32x8 = np.arange(8, dtype=np.float32).tobytes()
    return {
        "nested_arrays.gguf": gguf_file([ARCH, kv("n", 9, nested),
                                    kv("after", 4, struct.pack("<I", 7))]),
        "bad_magic.bin": gguf_file([ARCH], magic=0x47475546),
        "version1.gguf": gguf_file([ARCH], version=1),
        "version2.gguf": gguf_file([ARCH], [info("t", [8], 0, 0)], f32x8, version=2),
        "dup_key.gguf": gguf_file([ARCH, ARCH]),
        "bool2.gguf": gguf_file([kv("b", 7, b"\x02")]),
        "q4_K_tensor.gguf": gguf_file([ARCH], [info("blk.0.ffn_up.weight", [256, 1], 12, 0)],
                                 b"\0" * 144),
        "huge_array_count.gguf": gguf_file([kv("a", 9, struct.pack("<IQ", 4, 2**62) + b"\0" * 16)]),
        "huge_string_len.gguf": gguf_file([kv("s", 8, struct.pack("<Q", 2**64 - 1) + b"abc")]),
        "misaligned_offset.gguf": gguf_file([ARCH], [info("t", [8], 0, 4)], f32x8 + b"\0" * 4),
        "overlap.gguf": gguf_file([ARCH], [info("a", [16], 0, 0), info("b", [8], 0, 32)],
                             b"\0" * 64),
        "five_dims.gguf": gguf_file([ARCH], [info("t", [1, 1, 1, 1, 1], 0, 0)], b"\0" * 4),
        "bad_alignment.gguf": gguf_file([kv("general.alignment", 4, struct.pack("<I", 3))]),
        "huge_tensor_count.gguf": gguf_file([ARCH], n_tensors=2**40),
        "data_outside.gguf": gguf_file([ARCH], [info("t", [8], 0, 1 << 20)], f32x8),
    }


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "corpus" / "gguf"
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "llama_tiny_f32.gguf": tiny_model("llama", rope_freqs=True),
        "qwen2_tiny_f16_bias_tied.gguf": tiny_model("qwen2", wtype=Q.F16, bias=True, tied=True),
        "llama_tiny_q8_0_bf16.gguf": tiny_model("llama", n_embd=32, n_ff=32, wtype=Q.Q8_0,
                                                 embd_type=Q.BF16),
        "llama_yarn.gguf": tiny_model("llama", extra=lambda w: (
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN), w.add_rope_scaling_factor(4.0))),
        "llama_linear_rope.gguf": tiny_model("llama", extra=lambda w: (
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR), w.add_rope_scaling_factor(2.0))),
        "vocab_only.gguf": vocab_only(),
        "every_type.gguf": every_type(),
        **hand_made(),
    }
    files["truncated.gguf"] = files["llama_tiny_f32.gguf"][:-5]
    total = 0
    for name, data in sorted(files.items()):
        (out / name).write_bytes(data)
        total += len(data)
    print(f"wrote {len(files)} files, {total} bytes, to {out}")
    assert total < 1_000_000, "keep the committed corpus small"


if __name__ == "__main__":
    main()
