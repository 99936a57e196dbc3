#!/usr/bin/env python3
"""Regenerates the tokenizer goldens in testdata/tokenizer/reference/ with llama.cpp itself.

For every vocabulary testdata/tokenizer/ggml-vocab-NAME.gguf and every string of
testdata/tokenizer/corpus.jsonl (one JSON object per line: {"id", "note", "hex"}; the string is
stored as hex so that it can hold any bytes, invalid UTF-8 included) this runs llama.cpp's own
tokenizer through the llama_cpp package (llama-cpp-python, low-level API, vocabulary-only load) and
writes

  reference/NAME.jsonl      one line per corpus string, same order:
      {"id": N,
       "ids": [...],          llama_tokenize(add_special=false, parse_special=false)
       "ids_special": [...],  llama_tokenize(add_special=true,  parse_special=false)
       "ids_parse": [...],    llama_tokenize(add_special=false, parse_special=true)
       "detok": "hex"}        llama_detokenize(ids, remove_special=false, unparse_special=false)
    or {"id": N, "crash": true} when llama.cpp aborts on the string (it does for byte-level BPE on
    4-byte sequences above U+10FFFF).
  reference/NAME.meta.json  n_vocab, bos, eos, eot, add_bos, add_eos, the EOG ids, every token
    whose attributes are not plain "normal", and 64-bit FNV-1a digests of all token pieces
    (each as a little-endian u32 length and the bytes; llama_token_to_piece with special=false
    and special=true).

There are no vocabularies for the llama3 and qwen2 pre-tokenizers in testdata, so two variants of
the GPT-2 vocabulary are checked as well: the same tokens and merges with tokenizer.ggml.pre set to
"llama-bpe" and to "qwen2" (written to a temporary GGUF here; the C++ test builds the same variant
in memory). Their goldens are reference/gpt-2.llama-bpe.* and reference/gpt-2.qwen2.*.

Each vocabulary runs in a worker process so that an abort costs one string, not the run. The
output is deterministic: run it twice and nothing changes. `--check` regenerates into memory and
exits 1 if any file differs from what is committed.

Usage (from the repository root): .venv/bin/python scripts/make_tokenizer_reference.py [--check]
"""

import argparse
import ctypes
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "testdata", "tokenizer")


def fnv1a64(data):
    """64-bit FNV-1a as 16 hex digits (simple enough to recompute in the C++ test)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


# ----------------------------------------------------------------------------------------------
# worker: one vocabulary, strings in on stdin (hex per line), JSON out on stdout


class Vocab:
    def __init__(self, path):
        import llama_cpp  # imported here so that --help works without the package

        self.lib = llama_cpp
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError("cannot load " + path)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)

    def tokenize(self, data, add_special, parse_special):
        lib = self.lib
        n = len(data) * 2 + 16
        while True:
            buf = (lib.llama_token * n)()
            got = lib.llama_tokenize(self.vocab, data, len(data), buf, n, add_special, parse_special)
            if got >= 0:
                return list(buf[:got])
            n = -got

    def detokenize(self, ids, remove_special, unparse_special):
        lib = self.lib
        arr = (lib.llama_token * max(1, len(ids)))(*ids)
        n = 64 + 16 * len(ids)
        while True:
            buf = ctypes.create_string_buffer(n)
            got = lib.llama_detokenize(self.vocab, arr, len(ids), buf, n, remove_special, unparse_special)
            if got >= 0:
                return buf.raw[:got]
            n = -got

    def piece(self, token, special):
        lib = self.lib
        n = 64
        while True:
            buf = ctypes.create_string_buffer(n)
            got = lib.llama_token_to_piece(self.vocab, token, buf, n, 0, special)
            if got >= 0:
                return buf.raw[:got]
            n = -got

    def meta(self):
        lib = self.lib
        v = self.vocab
        n = lib.llama_vocab_n_tokens(v)
        normal = 1 << 2  # LLAMA_TOKEN_ATTR_NORMAL
        attrs = []
        eog = []
        digests = {}
        for special in (False, True):
            data = bytearray()
            for t in range(n):
                p = self.piece(t, special)
                data += struct.pack("<I", len(p)) + p
            digests["pieces_fnv1a64_special" if special else "pieces_fnv1a64"] = fnv1a64(bytes(data))
        for t in range(n):
            a = int(lib.llama_vocab_get_attr(v, t))
            if a != normal:
                attrs.append([t, a])
            if lib.llama_vocab_is_eog(v, t):
                eog.append(t)
        meta = {
            "n_vocab": n,
            "bos": int(lib.llama_vocab_bos(v)),
            "eos": int(lib.llama_vocab_eos(v)),
            "eot": int(lib.llama_vocab_eot(v)),
            "add_bos": bool(lib.llama_vocab_get_add_bos(v)),
            "add_eos": bool(lib.llama_vocab_get_add_eos(v)),
            "eog": eog,
            "attrs": attrs,
        }
        meta.update(digests)
        return meta


def worker(path):
    # llama.cpp logs to stderr; the parent discards it.
    vocab = Vocab(path)
    out = sys.stdout
    for line in sys.stdin:
        line = line.strip()
        if line == "META":
            out.write(json.dumps(vocab.meta(), sort_keys=True) + "\n")
            out.flush()
            continue
        ident, hexstr = line.split(" ", 1) if " " in line else (line, "")
        data = bytes.fromhex(hexstr)
        ids = vocab.tokenize(data, False, False)
        rec = {
            "id": int(ident),
            "ids": ids,
            "ids_special": vocab.tokenize(data, True, False),
            "ids_parse": vocab.tokenize(data, False, True),
            "detok": vocab.detokenize(ids, False, False).hex(),
        }
        out.write(json.dumps(rec, sort_keys=True) + "\n")
        out.flush()


# ----------------------------------------------------------------------------------------------
# parent


class WorkerProcess:
    def __init__(self, path):
        # On abort ggml may print a backtrace (running gdb, whose output lands on stdout).
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=env)

    def ask(self, line):
        """The worker's answer, or None if it died on this line."""
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None
        answer = self.proc.stdout.readline()
        if answer.startswith("{"):
            return json.loads(answer)
        self.proc.kill()  # it aborted (or is printing a backtrace)
        self.proc.wait()
        return None

    def close(self):
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait()


def reference_for(path, corpus):
    lines = []
    w = WorkerProcess(path)
    for item in corpus:
        rec = w.ask("%d %s" % (item["id"], item["hex"]))
        if rec is None:
            rec = {"id": item["id"], "crash": True}
            w = WorkerProcess(path)
        lines.append(json.dumps(rec, sort_keys=True))
    meta = w.ask("META")
    w.close()
    if meta is None:
        raise RuntimeError("worker died computing metadata for " + path)
    meta_text = "{\n" + ",\n".join(
        " %s: %s" % (json.dumps(k), json.dumps(meta[k])) for k in sorted(meta)) + "\n}\n"
    return "\n".join(lines) + "\n", meta_text


# name -> (base vocabulary, tokenizer.ggml.pre to substitute)
VARIANTS = {
    "gpt-2.llama-bpe": ("gpt-2", "llama-bpe"),
    "gpt-2.qwen2": ("gpt-2", "qwen2"),
}


def write_variant(base_path, pre, out_path):
    """Copies every key of `base_path` (a vocabulary-only GGUF) with tokenizer.ggml.pre = `pre`."""
    import gguf

    reader = gguf.GGUFReader(base_path)
    assert len(reader.tensors) == 0, "variants are made of vocabulary-only files"
    writer = gguf.GGUFWriter(out_path, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[1]) if vtype == gguf.GGUFValueType.ARRAY else None
        value = pre if key == "tokenizer.ggml.pre" else field.contents()
        writer.add_key_value(key, value, vtype, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    ap.add_argument("--corpus", default=os.path.join(DATA, "corpus.jsonl"))
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return 0

    with open(args.corpus) as f:
        corpus = [json.loads(line) for line in f if line.strip()]
    outdir = os.path.join(DATA, "reference")
    os.makedirs(outdir, exist_ok=True)
    differ = []
    tmpdir = tempfile.TemporaryDirectory()
    jobs = []
    for path in sorted(glob.glob(os.path.join(DATA, "ggml-vocab-*.gguf"))):
        jobs.append((os.path.basename(path)[len("ggml-vocab-"):-len(".gguf")], path))
    for name, (base, pre) in sorted(VARIANTS.items()):
        path = os.path.join(tmpdir.name, name + ".gguf")
        write_variant(os.path.join(DATA, "ggml-vocab-%s.gguf" % base), pre, path)
        jobs.append((name, path))
    for name, path in jobs:
        jsonl, meta = reference_for(path, corpus)
        crashes = jsonl.count('"crash": true')
        for fname, content in ((name + ".jsonl", jsonl), (name + ".meta.json", meta)):
            target = os.path.join(outdir, fname)
            if args.check:
                old = open(target).read() if os.path.exists(target) else None
                if old != content:
                    differ.append(target)
            else:
                with open(target, "w") as f:
                    f.write(content)
        print("%-16s %d strings, %d where llama.cpp aborts" % (name, len(corpus), crashes))
    if args.check:
        for t in differ:
            print("differs:", t)
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
