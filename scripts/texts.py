#!/usr/bin/env python3
"""Builds the calibration and evaluation texts of the quantizer from Debian's `fortunes` package.

The texts are English fortune-cookie entries (quotes, jokes, aphorisms) from the files of
/usr/share/games/fortunes that testdata/texts/manifest.json lists: `calibration` from one fixed
list of files, `evaluation` from another, disjoint one. Every source file's SHA-256 is checked
against the manifest first; a file that is missing or differs stops the build with a clear message,
so the texts are the same bytes on every machine (scripts/setup.sh installs the package).

Text format (pdctl builds the same bytes in C++, engine/quant/quantize/texts.cc; the manifest
records each text's SHA-256 and tests/python/test_quantize.py compares the two):
  * a file's entries are the runs of lines between lines that are exactly "%";
  * each entry is stripped of leading/trailing whitespace (space, tab, CR, LF); empty ones dropped;
  * the entries of all files, in manifest order and file order, are joined by one blank line,
    and the text ends with a newline.

Usage:
  python scripts/texts.py calibration            # the text on stdout
  python scripts/texts.py evaluation -o eval.txt
  python scripts/texts.py --check                # verify the sources and both texts' checksums
  python scripts/texts.py --print-sha256         # checksums of the sources and the texts
As a module: build_text("evaluation") -> bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
MANIFEST = REPO_ROOT / "testdata" / "texts" / "manifest.json"
KINDS = ("calibration", "evaluation")


class TextSourceError(RuntimeError):
    """A source file is missing or is not the one the manifest pins."""


def load_manifest(path: Path = MANIFEST) -> dict:
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    files = {k: [e["file"] for e in manifest["texts"][k]] for k in KINDS}
    overlap = set(files["calibration"]) & set(files["evaluation"])
    if overlap:
        raise ValueError(f"{path}: calibration and evaluation share {sorted(overlap)}")
    return manifest


def source_dir(manifest: dict) -> Path:
    """$PD_FORTUNES_DIR, else the manifest's folder (/usr/share/games/fortunes)."""
    return Path(os.environ.get("PD_FORTUNES_DIR") or manifest["dir"])


def entries(data: bytes) -> list[bytes]:
    """The stripped, non-empty entries of one fortune file."""
    out, cur = [], []
    for line in data.split(b"\n"):
        if line == b"%":
            out.append(b"\n".join(cur))
            cur = []
        else:
            cur.append(line)
    out.append(b"\n".join(cur))
    stripped = (e.strip(b" \t\r\n") for e in out)
    return [e for e in stripped if e]


def read_source(manifest: dict, entry: dict) -> bytes:
    path = source_dir(manifest) / entry["file"]
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TextSourceError(
            f"cannot read {path} ({e.strerror}): install Debian's {manifest['package']} package "
            f"(scripts/setup.sh) or set PD_FORTUNES_DIR") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise TextSourceError(
            f"{path}: SHA-256 {digest} differs from {entry['sha256']} pinned in {MANIFEST}: "
            f"the texts come from {manifest['package']} {manifest['package_version']}")
    return data


def build_text(kind: str, manifest: Optional[dict] = None) -> bytes:
    """The `calibration` or `evaluation` text (bytes, UTF-8)."""
    manifest = manifest or load_manifest()
    parts: list[bytes] = []
    for entry in manifest["texts"][kind]:
        parts.extend(entries(read_source(manifest, entry)))
    return b"\n\n".join(parts) + b"\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", nargs="?", choices=KINDS, help="text to write")
    ap.add_argument("-o", "--out", type=Path, help="write to this file instead of stdout")
    ap.add_argument("--check", action="store_true",
                    help="verify every source file and both texts against the manifest")
    ap.add_argument("--print-sha256", action="store_true",
                    help="print the SHA-256 of every source file and of both texts")
    args = ap.parse_args(argv)
    try:
        manifest = load_manifest()
        if args.check or args.print_sha256:
            ok = True
            for kind in KINDS:
                for e in manifest["texts"][kind]:
                    data = read_source(manifest, e)
                    if args.print_sha256:
                        print(f"{kind:12s} {e['file']:12s} {len(data):8d}  "
                              f"{hashlib.sha256(data).hexdigest()}")
                text = build_text(kind, manifest)
                digest = hashlib.sha256(text).hexdigest()
                if args.print_sha256:
                    print(f"{kind:12s} {'(text)':12s} {len(text):8d}  {digest}")
                if digest != manifest["texts_sha256"][kind]:
                    print(f"texts.py: the {kind} text's SHA-256 {digest} differs from the "
                          f"manifest's {manifest['texts_sha256'][kind]}", file=sys.stderr)
                    ok = False
            if args.check and ok:
                print("texts.py: sources and texts match the manifest")
            return 0 if ok else 1
        if args.kind is None:
            ap.error("give a text kind (calibration or evaluation), --check or --print-sha256")
        text = build_text(args.kind, manifest)
    except TextSourceError as e:
        print(f"texts.py: error: {e}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_bytes(text)
    else:
        sys.stdout.buffer.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
