#!/usr/bin/env bash
# Unpacks the llama.cpp source that the llama-cpp-python sdist of requirements-dev.txt ships into
# a cache folder outside the tree, once per version, and prints its path (vendor/llama.cpp) on its
# last line. The reference for tokenizer test vectors (tests/python/test_llama_vocab_vectors.py)
# and for the tools the benchmarks build (bench/llamacpp/build_tools.sh); never a part of pdserve.
#
#   scripts/llama_cpp_src.sh
#
# Environment: PDSERVE_CACHE (default ~/.cache/pdserve). Needs .venv (scripts/setup.sh) and PyPI.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(sed -n 's/^llama_cpp_python==\([0-9.]*\).*/\1/p' "$ROOT/requirements-dev.txt")"
[[ -n "$VERSION" ]] || { echo "llama_cpp_src: no llama_cpp_python==X in requirements-dev.txt" >&2; exit 2; }
DEST="${PDSERVE_CACHE:-$HOME/.cache/pdserve}/llamacpp-src-$VERSION"
SRC="$DEST/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [[ -f "$SRC/CMakeLists.txt" ]]; then
  echo "$SRC"
  exit 0
fi
PIP="$ROOT/.venv/bin/pip"
[[ -x "$PIP" ]] || { echo "llama_cpp_src: $PIP missing (run scripts/setup.sh)" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "llama_cpp_src: llama-cpp-python $VERSION sdist -> $DEST" >&2
"$PIP" download --no-binary :all: --no-deps -q -d "$WORK" "llama_cpp_python==$VERSION" >&2
mkdir -p "$WORK/x"
tar xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK/x"
[[ -f "$WORK/x/llama_cpp_python-$VERSION/vendor/llama.cpp/CMakeLists.txt" ]] \
  || { echo "llama_cpp_src: no vendor/llama.cpp in the sdist" >&2; exit 2; }
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST"
mv "$WORK/x" "$DEST"  # whole or not at all: a half-unpacked folder never looks done
echo "$SRC"
