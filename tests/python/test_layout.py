"""The folder dependency rule (scripts/check_layout.py, docs/architecture.md): the tree follows it,
and a file that breaks it is named."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_layout.py"


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True)


def test_the_tree_follows_the_folder_rule():
    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_an_include_upwards_or_sideways_is_named(tmp_path):
    write(tmp_path, "engine/a.h", '#include "node/n.h"\n')  # engine/ knows nothing of nodes
    write(tmp_path, "node/n.h", '#include "engine/a.h"\n')  # fine: downwards
    write(tmp_path, "prefill_node/p.cc", '#include "decode_node/d.h"\n')  # a sibling daemon
    write(tmp_path, "decode_node/d.h", '#include "pdserve/node/v1/node.pb.h"\n')  # proto: fine
    write(tmp_path, "kvtransfer/k.cc", '#include "router/r.h"\n')  # kvtransfer knows no router
    write(tmp_path, "router/r.h", "")
    r = run(tmp_path)
    assert r.returncode == 1
    lines = [l for l in r.stdout.splitlines() if "may not include" in l]
    assert sorted(l.split(":")[0] for l in lines) == [
        "engine/a.h", "kvtransfer/k.cc", "prefill_node/p.cc"]


def test_headers_outside_the_tree_are_not_folders(tmp_path):
    # "common/x.h" that does not exist in the tree (a system header of the same name) is not ours.
    write(tmp_path, "engine/a.cc", '#include "router/missing.h"\n#include "absl/status/status.h"\n')
    assert run(tmp_path).returncode == 0
