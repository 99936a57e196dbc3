#!/usr/bin/env python3
"""Two builds' attention_bench side by side: time per call, speedup, and whether the outputs are
the same bits (the bench prints a hash of each output).

  bench/attention/compare.py OLD_BIN NEW_BIN [attention_bench flags...]

e.g. with a build of main in ../main-build:
  bench/attention/compare.py ../main-build/bin/attention_bench build/bin/attention_bench --ctx 2048
The two binaries run one after the other (each reports its best of >= 3 calls per line); on a
shared machine, run it twice and trust lines that agree.
"""
import subprocess
import sys


def run(binary: str, args: list[str]) -> tuple[str, dict]:
    out = subprocess.run([binary, *args], check=True, capture_output=True, text=True).stdout
    isa, rows = "", {}
    for line in out.splitlines():
        if line.startswith("# attention kernels"):
            isa = line.split("(")[-1].rstrip(")")
        elif line and not line.startswith(("#", "kv ")):
            kv, ctx, n, thr, ms, _, h = line.split()
            rows[(kv, int(ctx), int(n), int(thr))] = (float(ms), h)
    return isa, rows


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    old_bin, new_bin, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    isa, old = run(old_bin, args)
    _, new = run(new_bin, args)
    print(f"attention kernels: {isa}; Gemma 3 270M shapes (4 q heads / 1 kv head, head_dim 256)")
    print(f"{'kv':4} {'ctx':>6} {'rows':>5} {'thr':>3} {'old ms':>10} {'new ms':>10} "
          f"{'speedup':>8}  bits")
    same_all = True
    for key in sorted(old, key=lambda k: (k[0], k[2], k[1], k[3])):
        if key not in new:
            continue
        (mo, ho), (mn, hn) = old[key], new[key]
        same = ho == hn
        same_all &= same
        kv, ctx, n, thr = key
        print(f"{kv:4} {ctx:>6} {n:>5} {thr:>3} {mo:>10.3f} {mn:>10.3f} {mo / mn:>7.2f}x  "
              f"{'same' if same else 'DIFFERENT'}")
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
