"""Every pre-tokenizer type llama.cpp's vocabulary loader accepts, against llama.cpp itself.

For each `tokenizer.ggml.pre` name, GPT-2's test vocabulary (testdata/tokenizer) is rewritten with
that name, and the edge-case corpus (testdata/tokenizer/corpus.jsonl: whitespace runs, digits, CJK,
emoji, combining marks, invalid UTF-8, special-token text) is tokenized by llama.cpp (the
llama-cpp-python of requirements-dev.txt, one worker process per vocabulary so that an abort costs
one string) and by `pdctl tokenize --hex-lines`. The ids must be equal with and without BOS/EOS.
Strings on which llama.cpp aborts are skipped (it does on 4-byte sequences above U+10FFFF).

The names are llama.cpp's, as its vocabulary loader spells them (src/llama-vocab.cpp of the
vendored llama.cpp); the test fails when llama.cpp refuses one, so the list cannot drift from the
reference.

WordPiece (tokenizer.ggml.model "bert", which has no pre-tokenizer types) is run the same way on
llama.cpp's BGE vocabulary (testdata/tokenizer/ggml-vocab-bert-bge.gguf), as it is and with its
normalizer and add_* keys set.
"""

import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "testdata" / "tokenizer"

# Every name llama.cpp 0.3.36's loader (llama-cpp-python 0.3.36) accepts for a BPE vocabulary.
LLAMA_CPP_PRE = [
    "default", "minicpm5", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
    "midm-2.0", "lfm2", "jina-v5-nano", "deepseek-llm", "deepseek-coder", "deepseek-v3",
    "spark2_5", "youtu", "falcon", "mpt", "starcoder", "gpt-2", "phi-2", "jina-es", "jina-de",
    "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "jais-2",
    "gemma4", "granite-embed-multi-311m", "sarvam-moe", "jina-v1-en", "jina-v2-code",
    "roberta-bpe", "whitespace", "refact", "command-r", "qwen2", "deepseek-r1-qwen", "kormo",
    "f2llmv2", "qwen35", "stablelm2", "olmo", "dbrx", "smaug-bpe", "poro-chat", "chatglm-bpe",
    "glm4", "glm5", "viking", "jais", "tekken", "smollm", "codeshell", "bloom", "gpt3-finnish",
    "exaone", "exaone4", "exaone-moe", "chameleon", "minerva-7b", "megrez", "gpt-4o", "llama4",
    "kanana2", "talkie", "granite-embed-multi-97m", "tiny_aya", "cohere2moe", "superbpe",
    "trillion", "granite-docling", "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder",
    "hunyuan", "hunyuan-dense", "hy_v4", "joyai-llm", "kimi-k2", "ufakzeka", "grok-2", "afmoe",
    "laguna", "minimax-m2", "solar-open", "mellum2",
]
# BPE over raw UTF-8: on this byte-level vocabulary, llama.cpp throws for every string with a byte
# that is no token by itself (no <0xXX> tokens here), so fewer strings are comparable.
RAW_UTF8 = {"gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace"}


# One llama.cpp process for every vocabulary: "LOAD path" answers "ok" or "refused"; a hex line
# answers [ids, ids_special]. It dies on the strings llama.cpp aborts on; the parent then starts a
# new one, reloads the vocabulary and goes on with the next string.
_WORKER = r"""
import ctypes, json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "scripts"))
import make_tokenizer_reference as ref
import llama_cpp
vocab = None
for line in sys.stdin:
    line = line.rstrip("\n")
    if line.startswith("LOAD "):
        try:
            vocab = ref.Vocab(line[5:])
            print("ok", flush=True)
        except RuntimeError:
            vocab = None
            print("refused", flush=True)
        continue
    data = bytes.fromhex(line)
    print(json.dumps([vocab.tokenize(data, False, False), vocab.tokenize(data, True, False)]),
          flush=True)
"""


class LlamaCpp:
    def __init__(self):
        self.proc = None
        self.path = None

    def _start(self):
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(ROOT)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)

    def _kill(self):
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def load(self, path):
        """Loads a vocabulary; False when llama.cpp refuses it."""
        self.path = str(path)
        if self.proc is None:
            self._start()
        self.proc.stdin.write("LOAD " + self.path + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer:
            self._kill()
        return answer == "ok"

    def tokenize_all(self, hexes):
        """[ids, ids_special] per string, None where llama.cpp aborts. The strings are written by
        a thread while the answers are read, so the pipe never waits on a round trip."""
        out = []
        while len(out) < len(hexes):
            if self.proc is None:
                assert self.load(self.path)
            todo = hexes[len(out):]
            proc = self.proc

            def feed():
                try:
                    for h in todo:
                        proc.stdin.write(h + "\n")
                    proc.stdin.flush()
                except (BrokenPipeError, ValueError):
                    pass

            writer = threading.Thread(target=feed)
            writer.start()
            for _ in todo:
                answer = proc.stdout.readline()
                if not answer:
                    break
                out.append(json.loads(answer))
            else:
                writer.join()
                continue
            writer.join()
            self._kill()  # it aborted on the next string
            out.append(None)
        return out

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()


def variant(base: bytes, pre: str) -> bytes:
    """`base` (a vocabulary-only GGUF: no tensors, so no offsets) with tokenizer.ggml.pre = pre:
    the key's string value is replaced in place (GGUF value type 8, u64 length, bytes)."""
    key = b"tokenizer.ggml.pre"
    at = base.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    vtype, length = struct.unpack_from("<IQ", base, at)
    assert vtype == 8, vtype
    end = at + 12 + length
    value = pre.encode()
    return base[:at + 4] + struct.pack("<Q", len(value)) + value + base[end:]


@pytest.fixture(scope="module")
def gpt2_bytes():
    return (DATA / "ggml-vocab-gpt-2.gguf").read_bytes()


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("llama_cpp")
    worker = LlamaCpp()
    yield worker
    worker.close()


# Beside the corpus: digit runs in several scripts (the digit-grouping types: tiny_aya, afmoe) and
# Han mixed with other letters (kimi-k2 splits Han runs from the letters around them).
EXTRA = ["\u4e2d\u6587English\u6df7\u5408text's", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
         "\u6c49\u5b57abc\u4e2d \u3005\u3007\u2e80 I'LL", "12345678", "ab1234cd56789", "\u0661\u0662\u0663\u0664\u0665 and \u0666\u0667",
         "x\u00b2\u00b3\u2074\u2075y 7", "3.14159 2,718,281,828", "\u2167\u2168 1\u00bd2345"]


@pytest.fixture(scope="module")
def corpus():
    with open(DATA / "corpus.jsonl") as f:
        items = [json.loads(line) for line in f if line.strip()]
    items += [{"id": 10000 + i, "note": "digit groups", "hex": text.encode().hex()}
              for i, text in enumerate(EXTRA)]
    return items


def _ours(pdctl, vocab, hex_file, flag):
    out = subprocess.run([str(pdctl), "tokenize", "-m", str(vocab), "--hex-lines", str(hex_file),
                          flag], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    lines = out.stdout.decode().split("\n")
    assert lines[-1] == ""
    return [[int(t) for t in line.split()] for line in lines[:-1]]


@pytest.mark.parametrize("pre", LLAMA_CPP_PRE)
def test_pretokenizer_matches_llama_cpp(pre, llama, gpt2_bytes, corpus, pdctl, tmp_path):
    vocab = tmp_path / f"gpt-2.{pre}.gguf"
    vocab.write_bytes(variant(gpt2_bytes, pre))
    # llama.cpp must know the name (or this list is stale).
    assert llama.load(vocab), f"llama.cpp refuses tokenizer.ggml.pre '{pre}'"
    _compare(llama, pdctl, vocab, corpus, tmp_path, 0.9 if pre in RAW_UTF8 else 0.95)


def _compare(llama, pdctl, vocab, corpus, tmp_path, min_share):
    """Asserts that pdserve gives llama.cpp's ids for every corpus string llama.cpp survives, with
    and without special tokens, and that it survives at least `min_share` of them."""
    expected = llama.tokenize_all([item["hex"] for item in corpus])
    hex_file = tmp_path / "corpus.hex"
    hex_file.write_text("".join(item["hex"] + "\n" for item in corpus))
    plain = _ours(pdctl, vocab, hex_file, "--no-special")
    special = _ours(pdctl, vocab, hex_file, "--no-parse")
    assert len(plain) == len(corpus) and len(special) == len(corpus)
    bad = []
    compared = 0
    for item, rec, ids, ids_special in zip(corpus, expected, plain, special):
        if rec is None:  # llama.cpp aborted on this string: nothing to compare
            continue
        compared += 1
        if [ids, ids_special] != rec:
            bad.append(f"#{item['id']} ({item.get('note', '')}) {bytes.fromhex(item['hex'])[:40]!r}:"
                       f" llama.cpp {rec[0][:12]} / {rec[1][:3]}...,"
                       f" pdserve {ids[:12]} / {ids_special[:3]}...")
    assert compared > len(corpus) * min_share
    assert not bad, (f"{len(bad)} of {compared} strings differ for {vocab.name}:\n"
                     + "\n".join(bad[:8]))


# WordPiece: BGE's vocabulary (uncased) with these keys added; llama.cpp reads every one of them.
WPM_VARIANTS = {
    "as-is": {},
    "cased": {"tokenizer.ggml.normalizer.lowercase": False},
    "accents": {"tokenizer.ggml.normalizer.strip_accents": False},
    "lowercase-only": {"tokenizer.ggml.normalizer.lowercase": True,
                       "tokenizer.ggml.normalizer.strip_accents": False},
    # WordPiece adds [CLS] and [SEP] whatever these say, in llama.cpp and in pdserve.
    "add-flags": {"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True,
                  "tokenizer.ggml.add_sep_token": False},
}


def with_keys(base, extra, out):
    """Copies every key of the vocabulary-only GGUF `base` to `out`, then the bool keys `extra`."""
    import gguf

    reader = gguf.GGUFReader(str(base))
    assert len(reader.tensors) == 0
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in extra:
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[1]) if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for key, value in extra.items():
        writer.add_bool(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("name", list(WPM_VARIANTS))
def test_wordpiece_matches_llama_cpp(name, llama, corpus, pdctl, tmp_path):
    vocab = tmp_path / f"bert-bge.{name}.gguf"
    with_keys(DATA / "ggml-vocab-bert-bge.gguf", WPM_VARIANTS[name], vocab)
    assert llama.load(vocab), "llama.cpp refuses the vocabulary"
    # llama.cpp aborts on the 5 strings with a 4-byte form above U+10FFFF.
    _compare(llama, pdctl, vocab, corpus, tmp_path, 0.98)


def test_unknown_name_is_refused_by_both(llama, gpt2_bytes, pdctl, tmp_path):
    vocab = tmp_path / "gpt-2.no-such-pre.gguf"
    vocab.write_bytes(variant(gpt2_bytes, "no-such-pre"))
    assert not llama.load(vocab)
    out = subprocess.run([str(pdctl), "tokenize", "-m", str(vocab), "--text", "Hello"],
                         capture_output=True, timeout=60)
    assert out.returncode != 0
    assert "unknown tokenizer.ggml.pre 'no-such-pre'" in out.stderr.decode()
