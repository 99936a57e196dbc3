"""llama.cpp's published tokenizer test vectors, for every vocabulary its source ships with them.

The llama-cpp-python sdist of requirements-dev.txt carries llama.cpp's models/ggml-vocab-*.gguf
with NAME.gguf.inp (texts separated by "\\n__ggml_vocab_test__\\n") and NAME.gguf.out (the ids of
each, tokenized without special tokens, one line per text): what llama.cpp's test-tokenizer-0
checks. scripts/llama_cpp_src.sh unpacks that source into a cache once (a PyPI download of
about 75 MB). Every vocabulary with vectors is run through
`pdctl tokenize --hex-lines --no-special`, BERT's WordPiece (`bert-bge`) included. testdata/tokenizer
keeps seven of these vocabularies for the C++ tests, which run without a network.
"""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEP = b"\n__ggml_vocab_test__\n"

# The vocabularies of llama.cpp 0.3.36 that come with .inp/.out vectors.
WITH_VECTORS = ["bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4",
                "gpt-2", "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact",
                "starcoder"]


@pytest.fixture(scope="module")
def models() -> Path:
    out = subprocess.run([str(ROOT / "scripts" / "llama_cpp_src.sh")], capture_output=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr.decode()
    return Path(out.stdout.decode().strip().splitlines()[-1]) / "models"


def test_the_list_is_what_llama_cpp_ships(models):
    shipped = sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")]
                     for p in models.glob("ggml-vocab-*.gguf.inp"))
    assert shipped == sorted(WITH_VECTORS)


@pytest.mark.parametrize("vocab", WITH_VECTORS)
def test_vectors(vocab, models, pdctl, tmp_path):
    gguf = models / f"ggml-vocab-{vocab}.gguf"
    texts = (models / f"ggml-vocab-{vocab}.gguf.inp").read_bytes().split(SEP)
    if texts and texts[-1] == b"":
        texts.pop()  # the last separator leaves an empty remainder, not a case
    want = [[int(t) for t in line.split()]
            for line in (models / f"ggml-vocab-{vocab}.gguf.out").read_text().splitlines()]
    assert len(want) == len(texts) and len(texts) > 10
    hex_file = tmp_path / "texts.hex"
    hex_file.write_text("".join(t.hex() + "\n" for t in texts))
    out = subprocess.run([str(pdctl), "tokenize", "-m", str(gguf), "--hex-lines", str(hex_file),
                          "--no-special"], capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode()
    got = [[int(t) for t in line.split()] for line in out.stdout.decode().split("\n")[:-1]]
    bad = [f"{texts[i][:50]!r}: llama.cpp {want[i][:16]}, pdserve {got[i][:16]}"
           for i in range(len(texts)) if got[i] != want[i]]
    assert not bad, f"{len(bad)} of {len(texts)} differ:\n" + "\n".join(bad[:8])
