#!/usr/bin/env python3
"""Two builds' attention_bench side by side: time per call, speedup, and whether the outputs are
the same bits (the bench prints a hash of each output).

  bench/attention/compare.py OLD_BIN NEW_BIN [--rounds N] [attention_bench flags...]

e.g. with main built in ../main/build:
  bench/attention/compare.py ../main/build/bin/attention_bench build/bin/attention_bench
The binaries run alternately, one configuration at a time, N rounds (default 2), and each line
keeps the best time seen: on a shared machine a slow spell then hits both builds alike.
"""
import subprocess
import sys

DEFAULTS = {"--ctx": "512,2048,4096,16384", "--rows": "1,128,512", "--kv": "f16,f32",
            "--threads": "1,2"}


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
    old_bin, new_bin, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    opts, extra, rounds = dict(DEFAULTS), [], 2
    i = 0
    while i < len(rest):
        if rest[i] == "--rounds":
            rounds = int(rest[i + 1])
        elif rest[i] in opts:
            opts[rest[i]] = rest[i + 1]
        else:
            extra += rest[i:i + 2]
        i += 2
    best: dict = {}
    isa = ""
    for _ in range(rounds):
        for kv in opts["--kv"].split(","):
            for ctx in opts["--ctx"].split(","):
                for n in opts["--rows"].split(","):
                    for thr in opts["--threads"].split(","):
                        args = ["--kv", kv, "--ctx", ctx, "--rows", n, "--threads", thr, *extra]
                        for which, binary in (("old", old_bin), ("new", new_bin)):
                            isa, res = run(binary, args)
                            for key, (ms, h) in res.items():
                                prev = best.get((which, key))
                                if prev is not None and prev[1] != h:
                                    h = "UNSTABLE"
                                best[(which, key)] = (min(ms, prev[0]) if prev else ms, h)
    print(f"attention kernels: {isa}; Gemma 3 270M shapes (4 q heads / 1 kv head, head_dim 256)")
    print(f"{'kv':4} {'ctx':>6} {'rows':>5} {'thr':>3} {'old ms':>10} {'new ms':>10} "
          f"{'speedup':>8}  bits")
    same_all = True
    keys = sorted({k for (w, k) in best if w == "old"}, key=lambda k: (k[0], k[2], k[1], k[3]))
    for key in keys:
        if ("new", key) not in best:
            continue
        (mo, ho), (mn, hn) = best[("old", key)], best[("new", key)]
        same = ho == hn and ho != "UNSTABLE"
        same_all &= same
        kv, ctx, n, thr = key
        print(f"{kv:4} {ctx:>6} {n:>5} {thr:>3} {mo:>10.3f} {mn:>10.3f} {mo / mn:>7.2f}x  "
              f"{'same' if same else 'DIFFERENT'}")
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
