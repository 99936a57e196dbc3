"""Unigram tokenizers (tokenizer.ggml.model "t5"): `pdctl tokenize -m FOLDER` on Hugging Face
Unigram tokenizer.json folders, against Hugging Face's `tokenizers` and against llama.cpp.

Unigram models are trained here with `tokenizers`' UnigramTrainer on the corpus of
test_hf_tokenizer.py, one folder per supported shape:
  - ugm-metaspace: Metaspace pre-tokenizer (prepend_scheme always, split), no normalizer, a T5-like
    post-processor that adds </s>;
  - ugm-bytes: the same with byte_fallback (the 256 <0xXX> pieces added, score 0, as SentencePiece
    gives them);
  - ugm-precompiled: transformers' SentencePiece layout, a Precompiled normalizer (a charsmap built
    here in SentencePiece's format: darts-clone double array + NUL-terminated strings) followed by
    Strip(right) and Replace(" {2,}", U+2581) -> precompiled_charsmap + remove_extra_whitespaces;
  - ugm-wsplit: WhitespaceSplit then Metaspace -> remove_extra_whitespaces.
Each folder is tokenized by `tokenizers` (add_special_tokens=True) and by pdctl over the edge-case
corpus (its valid UTF-8 strings) plus normalization cases; ids must be equal but for the
differences listed in KNOWN, each checked to occur. llama.cpp (llama-cpp-python, vocabulary-only)
tokenizes the GGUF pdserve converts each folder to (written by gguf-py from the same metadata); its
ids must equal pdserve's but for KNOWN_LLAMA_CPP. An NFKC normalizer is refused, naming it.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import (Tokenizer, decoders, models, normalizers,  # noqa: E402
                        pre_tokenizers, processors, trainers)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hf_tokenizer import (_WORKER, ROOT, architecture_keys, edge_texts,  # noqa: E402
                               pdctl_ids, run_pdctl, training_corpus)

SP = "\u2581"
SPECIALS = ["<pad>", "</s>", "<unk>"]
KINDS = ["ugm-metaspace", "ugm-bytes", "ugm-precompiled", "ugm-wsplit"]

# What the test charsmap maps (a small part of SentencePiece's nmt_nfkc): whitespace to a space,
# full-width ASCII, ligatures and compatibility characters, a zero-width space to nothing.
CHARSMAP = {"\t": " ", "\n": " ", "\r": " ", "\u00a0": " ", "\u3000": " ", "\u2003": " ",
            "\ufb01": "fi", "\ufb02": "fl", "\u2122": "TM", "\u2026": "...", "\u2460": "1",
            "\u00b2": "2", "\u216b": "XII", "\u200b": ""}
CHARSMAP.update({chr(0xFF01 + i): chr(0x21 + i) for i in range(0x5E)})  # full-width ASCII


def build_charsmap(mapping):
    """SentencePiece's precompiled charsmap for `mapping` (key -> replacement): uint32 LE size of
    the trie, the darts-clone double array (a unit: label bits 0-7, has-value bit 8, offset to the
    children in bits 10-30; value units have bit 31 and the value in bits 0-30), then the
    NUL-terminated replacement strings the values point into. The array is whole blocks of 256
    units, as darts-clone writes it."""
    strings = bytearray()
    trie = {}
    for key in sorted(mapping):
        node = trie
        for b in key.encode():
            node = node.setdefault(b, {})
        node[None] = len(strings)
        strings += mapping[key].encode() + b"\0"
    units = {}
    bases = set()  # one node per base: a shared base would give one node the other's children

    def free(i):
        return i != 0 and i not in units

    def place(node, index, label):
        wanted = sorted(b for b in node if b is not None) + ([0] if None in node else [])
        base = 256
        while base in bases or not all(free(base ^ c) for c in wanted):
            base += 1
        bases.add(base)
        offset = index ^ base
        assert offset < (1 << 21)
        units[index] = (offset << 10) | ((None in node) << 8) | label
        if None in node:
            units[base] = (1 << 31) | node[None]
        for c in wanted:
            if c:
                units[base ^ c] = 0  # reserved; filled by its own place()
        for c in wanted:
            if c:
                place(node[c], base ^ c, c)

    place(trie, 0, 0)
    n = (max(units) // 256 + 1) * 256
    array = b"".join(units.get(i, 0).to_bytes(4, "little") for i in range(n))
    return len(array).to_bytes(4, "little") + array + bytes(strings)


def train(kind, lines):
    tok = Tokenizer(models.Unigram())
    if kind == "ugm-precompiled":
        tok.normalizer = normalizers.Sequence([
            normalizers.Precompiled(build_charsmap(CHARSMAP)),
            normalizers.Strip(left=False, right=True),
            normalizers.Replace(tokenizers.Regex(" {2,}"), SP)])
    meta = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="always", split=True)
    if kind == "ugm-wsplit":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), meta])
    else:
        tok.pre_tokenizer = meta
    tok.decoder = decoders.Metaspace(replacement=SP, prepend_scheme="always", split=True)
    trainer = trainers.UnigramTrainer(vocab_size=900, special_tokens=SPECIALS, unk_token="<unk>",
                                      show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tj = json.loads(tok.to_str())
    vocab = tj["model"]["vocab"]
    # Scores made multiples of 2^-10, so that float32 (a GGUF's scores) holds them exactly and
    # every path sum is exact: segmentations of repeated text ("aaaa...") tie exactly and both
    # encoders break the tie the same way. With the trained float64 scores the sums differ in
    # their last bits, by the order of the additions and by float32 rounding, and which path
    # wins is noise (a known difference for real models: the GGUF's scores are float32).
    for piece in vocab:
        piece[1] = round(piece[1] * 1024) / 1024
    if kind == "ugm-bytes":
        have = {p for p, _ in vocab}
        vocab += [[f"<0x{b:02X}>", 0.0] for b in range(256) if f"<0x{b:02X}>" not in have]
        tj["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(tj))
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", eos)])
    return tok


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("unigram")
    lines = training_corpus() + [" ".join(CHARSMAP)] * 3
    out = {}
    for kind in KINDS:
        tok = train(kind, lines)
        d = root / kind
        d.mkdir()
        tok.save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(json.dumps(
            {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}))
        out[kind] = (d, Tokenizer.from_file(str(d / "tokenizer.json")))
    return out


@pytest.fixture(scope="module")
def texts():
    return edge_texts() + [
        "", " ", "  leading", "trailing  ", "a  b   c", "x\u0301y\u0302z", "</s>text",
        "text</s>", " </s> x", "<pad><unk>", "12345 1234567", "\u00c9COLE \u00e9cole",
        "\uff21\uff22\uff23 \uff46\uff49\uff4e\uff45", "\ufb01ne \u2122 \u2026 \u2460\u00b2\u216b",
        "a\u00a0b\u3000c\u2003d", "x\u200by", "tab\there\nnew\r\nline", "\u2581lead \u2581 mid",
        "\u2603\u2603 snow \U0001f9ed"]


def fragments(text):
    """The runs of text between special tokens, as both tokenizers cut them."""
    return [f for f in re.split("|".join(map(re.escape, SPECIALS)), text) if f]


def _starts_space(text):
    return any(f.startswith((" ", SP)) for f in fragments(text))


def _starts_escape(text):
    return any(f.startswith(SP) for f in fragments(text))


def _other_space(text):
    return any(c.isspace() and c != " " for c in text)


# Token texts llama.cpp (and pdserve) make control tokens wherever they are in a vocabulary (EOG,
# EOT and FIM texts): where the trainer learned one as a piece, parse_special takes it out of the
# text as a special token, which Hugging Face does not.
LLAMA_CPP_CONTROL = ["<|endoftext|>", "<|im_end|>", "<|end|>", "<|eot_id|>", "<end_of_turn>",
                     "<|end_of_text|>", "<EOT>", "<|eom_id|>", "<|fim_prefix|>", "<|fim_suffix|>",
                     "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<eos>",
                     "<PAD>", "[PAD]", "<PRE>", "<SUF>", "<MID>", "[EOS]", "[EOT]"]


def _control_text(text):
    return any(c in text for c in LLAMA_CPP_CONTROL)


# Hugging Face vs pdserve (= llama.cpp but for byte fallback), by kind: a predicate on the text.
KNOWN = {
    # Metaspace puts no U+2581 before a run that starts with a space or U+2581 (the space becomes
    # it); llama.cpp's space prefix goes before the first non-space byte, so " x" is "▁▁x".
    "ugm-metaspace": lambda t: _starts_space(t) or _control_text(t),
    # Hugging Face's trie holds the byte pieces too: the text "<0x41>" is that piece.
    "ugm-bytes": lambda t: (_starts_space(t) or _control_text(t) or
                            bool(re.search("<0x[0-9A-F]{2}>", t))),
    # remove_extra_whitespaces: llama.cpp puts a U+2581 before every word, also before a word that
    # is itself U+2581... (Hugging Face keeps that one). Strip(right) removes any Unicode
    # whitespace at the end, llama.cpp only spaces (what the charsmap leaves as other whitespace).
    "ugm-precompiled": lambda t: (_starts_escape(t) or (bool(t) and t[-1].isspace()) or
                                  _control_text(t)),
    # WhitespaceSplit cuts at any Unicode whitespace; llama.cpp merges ASCII spaces only.
    "ugm-wsplit": lambda t: (any(w.startswith(SP) for w in t.split()) or _other_space(t) or
                             _control_text(t)),
}


@pytest.mark.parametrize("kind", KINDS)
def test_pdctl_matches_hf_tokenizers(kind, folders, texts, pdctl, tmp_path, measurement):
    folder, hf = folders[kind]
    ours = pdctl_ids(pdctl, folder, texts, tmp_path)
    known = KNOWN[kind]
    bad, known_seen, same = [], 0, 0
    for text, ids in zip(texts, ours):
        want = hf.encode(text, add_special_tokens=True).ids
        if ids == want:
            same += 1
            continue
        if known(text):
            known_seen += 1
            continue
        bad.append(f"{text[:40]!r}: tokenizers {want[:14]}, pdserve {ids[:14]}")
    measurement(f"unigram {kind}: {same} of {len(texts)} strings equal to tokenizers, "
                f"{known_seen} known differences")
    assert not bad, f"{len(bad)} of {len(texts)} strings differ for {kind}:\n" + "\n".join(bad[:10])
    assert known_seen > 0  # the known difference is real (or the list is stale)


def test_byte_fallback_is_used(folders, texts, pdctl, tmp_path):
    """ugm-bytes spells characters outside its vocabulary with byte tokens, never <unk>."""
    folder, hf = folders["ugm-bytes"]
    text = "\u2603 \U0001f9ed"
    ours = pdctl_ids(pdctl, folder, [text], tmp_path)[0]
    assert hf.token_to_id("<unk>") not in ours
    byte_ids = [hf.token_to_id(f"<0x{b:02X}>") for b in text.encode()[:3]]
    assert ours[1:4] == byte_ids, ours  # after the "▁"
    assert ours == hf.encode(text).ids


def test_refusals_name_what(tmp_path, pdctl):
    cases = []
    nfkc = Tokenizer(models.Unigram([("<unk>", 0.0), (SP + "a", -1.0), ("a", -2.0)], 0, False))
    nfkc.normalizer = normalizers.NFKC()
    nfkc.pre_tokenizer = pre_tokenizers.Metaspace()
    nfkc.decoder = decoders.Metaspace()
    cases.append((nfkc, 'normalizer: normalizer "NFKC" is not supported for a Unigram model'))
    bare = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0, False))
    cases.append((bare, "a Unigram model needs a Metaspace pre-tokenizer"))
    no_unk = Tokenizer(models.Unigram([("a", -1.0)], None, False))
    no_unk.pre_tokenizer = pre_tokenizers.Metaspace()
    cases.append((no_unk, "model.unk_id: a Unigram model without an unknown token"))
    for i, (tok, message) in enumerate(cases):
        d = tmp_path / f"refused{i}"
        d.mkdir()
        tok.save(str(d / "tokenizer.json"))
        out = run_pdctl(pdctl, tmp_path, "-m", d, "--text", "hello")
        assert out.returncode == 1
        assert message in out.stderr.decode(), out.stderr.decode()
    # A charsmap that is not one is refused with the JSON path.
    d = tmp_path / "bad-charsmap"
    d.mkdir()
    tj = json.loads(cases[0][0].to_str())
    tj["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": "AQAAAA=="}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    out = run_pdctl(pdctl, tmp_path, "-m", d, "--text", "hello")
    assert out.returncode != 0
    assert "normalizer.precompiled_charsmap" in out.stderr.decode(), out.stderr.decode()


# ---- llama.cpp on the GGUF pdserve converts each folder to ------------------------------------

def write_gguf(folder: Path, path: Path):
    """The vocabulary GGUF of `folder` with the metadata pdserve derives for it (docs/models.md:
    tokens, scores and types by id, the whitespace flags, the charsmap as a uint8 array, the
    special ids), written by gguf-py with a llama.cpp test vocabulary's architecture keys so that
    llama.cpp loads it."""
    import gguf

    tj = json.loads((folder / "tokenizer.json").read_text())
    model = tj["model"]
    tokens = [p for p, _ in model["vocab"]]
    scores = [float(s) for _, s in model["vocab"]]
    added = {a["content"]: a for a in tj["added_tokens"]}
    types = []
    for i, t in enumerate(tokens):
        if i == model["unk_id"]:
            types.append(gguf.TokenType.UNKNOWN)
        elif t in added:
            types.append(gguf.TokenType.CONTROL)
        elif model.get("byte_fallback") and re.fullmatch(r"<0x[0-9A-F]{2}>", t):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    norm = tj.get("normalizer") or {}
    steps = norm.get("normalizers", [norm]) if norm else []
    pre = tj["pre_tokenizer"]
    wsplit = pre["type"] == "Sequence"
    remove_extra = wsplit or any(s.get("type") == "Replace" for s in steps)
    charsmap = next((s["precompiled_charsmap"] for s in steps if s.get("type") == "Precompiled"),
                    None)
    arch, keys = architecture_keys("ggml-vocab-llama-spm.gguf")
    w = gguf.GGUFWriter(str(path), arch)
    for key, value, vtype in keys:
        w.add_key_value(key, value, vtype)
    w.add_tokenizer_model("t5")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(True)
    w.add_remove_extra_whitespaces(remove_extra)
    if charsmap:
        import base64

        blob = base64.b64decode(charsmap)
        w.add_key_value("tokenizer.ggml.precompiled_charsmap", list(blob),
                        gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT8)
    w.add_unk_token_id(model["unk_id"])
    w.add_eos_token_id(tokens.index("</s>"))
    w.add_pad_token_id(tokens.index("<pad>"))
    w.add_add_bos_token(False)
    w.add_add_eos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def llama_cpp_ids(folders, texts, tmp_path_factory):
    pytest.importorskip("llama_cpp")
    root = tmp_path_factory.mktemp("unigram_gguf")
    request = ""
    for kind, (folder, _) in folders.items():
        path = root / f"{kind}.gguf"
        write_gguf(folder, path)
        request += str(path) + "\n" + "".join(t.encode().hex() + "\n" for t in texts) + "END\n"
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    out = subprocess.run([sys.executable, "-c", _WORKER, str(ROOT)], input=request,
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    answers = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(answers) == len(folders) * len(texts)
    return {kind: answers[i * len(texts):(i + 1) * len(texts)] for i, kind in enumerate(folders)}


@pytest.mark.parametrize("kind", KINDS)
def test_llama_cpp_matches_pdctl(kind, folders, texts, llama_cpp_ids, pdctl, tmp_path,
                                 measurement):
    folder, hf = folders[kind]
    theirs = llama_cpp_ids[kind]
    ours = pdctl_ids(pdctl, folder, texts, tmp_path)
    unk = hf.token_to_id("<unk>")
    byte_ids = {hf.token_to_id(f"<0x{b:02X}>") for b in range(256)} - {None}
    bad, by_bytes, by_nul = [], 0, 0
    for t, a, b in zip(texts, theirs, ours):
        if a == b:
            continue
        # Byte fallback: llama.cpp's Unigram encoder has none and gives <unk> instead.
        if byte_ids & set(b) and unk in a:
            by_bytes += 1
        # U+0000: llama.cpp reads token texts as C strings, so the trained piece "\x00" is not
        # found (as in test_hf_tokenizer.py).
        elif "\x00" in t:
            by_nul += 1
        else:
            bad.append(f"{t[:40]!r}: llama.cpp {a[:14]}, pdserve {b[:14]}")
    measurement(f"unigram {kind}: {len(texts) - len(bad) - by_bytes - by_nul} of {len(texts)} "
                f"strings equal to llama.cpp; known: {by_bytes} byte fallback, {by_nul} U+0000")
    assert not bad, f"{len(bad)} of {len(texts)} strings differ for {kind}:\n" + "\n".join(bad[:10])
    if kind == "ugm-bytes":
        assert by_bytes > 0
