#!/usr/bin/env python3
"""The folder dependency rule of docs/architecture.md, checked on every #include.

Each top-level folder may include only the folders listed for it below (itself included);
generated protobuf headers ("pdserve/...") count as proto/. A file that includes a folder above
it or a sibling it must not is reported with its line, and the exit status is 1.

  python3 scripts/check_layout.py [ROOT]      # ROOT: the checkout (default: this script's parent)

Runs in ctest as `layout_check` (tests/CMakeLists.txt).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# folder -> the folders its files may include. Lower layers first; read with
# docs/architecture.md, "Folders and what they may use".
ALLOWED: dict[str, set[str]] = {
    "common": {"common"},
    "engine": {"common", "engine"},
    "proto": {"common", "engine", "proto"},
    "kvtransfer": {"common", "engine", "kvtransfer"},
    "frontend": {"common", "engine", "proto", "frontend"},
    "node": {"common", "engine", "proto", "kvtransfer", "frontend", "node"},
    "decode_node": {"common", "engine", "proto", "kvtransfer", "node", "decode_node"},
    "prefill_node": {"common", "engine", "proto", "kvtransfer", "node", "prefill_node"},
    "router": {"common", "engine", "proto", "frontend", "router"},
}
PRODUCT = set(ALLOWED)
# Binaries' mains, benchmarks and tests sit on top: they may use every product folder.
ALLOWED["tools"] = PRODUCT | {"tools"}
ALLOWED["bench"] = PRODUCT | {"bench"}
ALLOWED["tests"] = PRODUCT | {"tools", "bench", "tests"}

SOURCE_SUFFIXES = {".h", ".cc", ".cu", ".cuh", ".inc"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of_include(path: str, root: Path) -> str | None:
    """The top-level folder an include names, or None for a header outside the tree."""
    first = path.split("/", 1)[0]
    if first == "pdserve":
        return "proto"  # generated from proto/pdserve/**.proto
    if first in ALLOWED and (root / path).exists():
        return first
    return None


def check(root: Path) -> list[str]:
    problems = []
    for folder, allowed in sorted(ALLOWED.items()):
        base = root / folder
        if not base.is_dir():
            continue
        for f in sorted(base.rglob("*")):
            if f.suffix not in SOURCE_SUFFIXES or not f.is_file():
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = folder_of_include(m.group(1), root)
                if target is not None and target not in allowed:
                    rel = f.relative_to(root)
                    problems.append(f"{rel}:{n}: {folder}/ may not include {target}/ "
                                    f"(\"{m.group(1)}\"); {folder}/ may use: "
                                    f"{', '.join(sorted(allowed - {folder}))}")
    return problems


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"layout check: {len(problems)} include(s) break the folder rule "
              "(docs/architecture.md)")
        return 1
    print(f"layout check: every include follows the folder rule ({len(ALLOWED)} folders)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
