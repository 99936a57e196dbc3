"""A model with every weight dequantized to F32, for the benches that need one.

bench/quant_quality uses it as its baseline (the best trained weights available); bench/kv_int8
and bench/kv_transfer/int8_wire_kl.py evaluate on it with --f32-weights, where matmul inputs are
not requantized to Q8_K, so rounding-level changes do not turn into KL of their own.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def command(pdctl: Path, model: Path, out: Path, threads: int = 2) -> list[str]:
    """`pdctl quantize` writing `model` with every tensor overridden to f32."""
    return [str(pdctl), "quantize", str(model), str(out), "--type", "q8_0", "--override",
            ".*=f32", "-t", str(threads)]


def dequantize(pdctl: Path, model: Path, out: Path, threads: int = 2) -> str:
    """Writes `out` (general.file_type set to 0 = ALL_F32: pdctl names the base type's) and checks
    that every tensor is F32. Returns the command line; raises RuntimeError if pdctl fails."""
    import gguf

    cmd = command(pdctl, model, out, threads)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited with {p.returncode}:\n{p.stderr[-3000:]}")
    r = gguf.GGUFReader(out, "r+")
    r.fields["general.file_type"].parts[-1][0] = 0  # LLAMA_FTYPE_ALL_F32
    types = {t.tensor_type.name for t in r.tensors}
    del r
    if types != {"F32"}:
        raise RuntimeError(f"{out}: tensor types {sorted(types)}, expected only F32")
    return shlex.join(cmd)


def add_args(ap: argparse.ArgumentParser, what: str) -> None:
    """--f32-weights and --pdctl: `what` is the format whose own error the run then measures."""
    ap.add_argument("--f32-weights", action="store_true",
                    help="run the model with every weight dequantized to F32 (pdctl quantize "
                    "--override '.*=f32'): matmul inputs are then not requantized to Q8_K, which "
                    "turns rounding-level changes into KL of their own, so what remains is the "
                    f"{what}'s own error")
    ap.add_argument("--pdctl", type=Path, default=REPO_ROOT / "build" / "bin" / "pdctl",
                    help="for --f32-weights")
