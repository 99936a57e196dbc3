#!/usr/bin/env python3
"""Fails when code that runs before the CPUID check of an AVX-512 file could be AVX-512.

The files compiled with -mavx512* (engine/backend/cpu/*avx512*.cc and the like) may use AVX-512
anywhere, so the functions that other files call into them (their exported entry points, which
make the check or run after it) and every function those reach by direct calls inside the same
object before the check must contain no EVEX-encoded instruction: on a CPU without AVX-512 one
such instruction kills the process with SIGILL, whatever PDSERVE_CPU_ISA says. The source rule is
PD_NO_AVX512 (engine/backend/cpu/kernels.h) on those functions; this test checks the machine
code, so it fails on any machine, with or without AVX-512, when the rule is broken.

In 64-bit mode the byte 0x62 at the start of an instruction (after any legacy prefixes) is
always the EVEX prefix. Which functions run before the check: the exported (global) functions
and, transitively, the functions they call (the kernels they hand out are only named, by their
addresses, never called there, so they are not followed).

    scripts/check_no_evex.py OBJECT...      # objects of AVX-512 files (others are skipped)
"""
import re
import subprocess
import sys

LEGACY_PREFIXES = {"66", "67", "f2", "f3", "2e", "36", "3e", "26", "64", "65", "f0"}


def functions(obj):
    """{name: (is_global, [(bytes, text)], [names it calls])} from objdump -dr."""
    syms = subprocess.run(["nm", "--defined-only", obj], capture_output=True, text=True,
                          check=True).stdout
    global_names = {line.split()[2] for line in syms.splitlines()
                    if len(line.split()) == 3 and line.split()[1] == "T"}
    out = subprocess.run(["objdump", "-dr", "--no-addresses", "-w", obj], capture_output=True,
                         text=True, check=True).stdout
    funcs = {}
    cur = None
    for line in out.splitlines():
        m = re.match(r"^<(.+)>:$", line) or re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            cur = m.group(1)
            funcs[cur] = (cur in global_names, [], [])
            continue
        if cur is None:
            continue
        reloc = re.search(r"R_X86_64_(?:PLT32|PC32)\s+(\S+?)(?:[-+]0x[0-9a-f]+)?$", line)
        if reloc and funcs[cur][1] and funcs[cur][1][-1][1].startswith("call"):
            funcs[cur][2].append(reloc.group(1))
            continue
        parts = line.split("\t")
        if len(parts) >= 3 and re.fullmatch(r"\s*([0-9a-f]{2} )*[0-9a-f]{2}\s*", parts[1]):
            raw = parts[1].split()
            text = parts[2].strip()
            funcs[cur][1].append((raw, text))
            call = re.match(r"call\s+\S*\s*<([^>+]+)>", text)
            if call:
                funcs[cur][2].append(call.group(1))
    return funcs


def is_evex(raw):
    i = 0
    while i < len(raw) and raw[i] in LEGACY_PREFIXES:
        i += 1
    return i < len(raw) and raw[i] == "62"


def demangle(names):
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return dict(zip(names, out))


def main(objs):
    checked = 0
    problems = []
    for obj in objs:
        if "avx512" not in obj.rsplit("/", 1)[-1]:
            continue
        funcs = functions(obj)
        names = demangle(list(funcs))
        pending = [f for f, (g, _, _) in funcs.items() if g]
        seen = set()
        while pending:
            f = pending.pop()
            if f in seen or f not in funcs:
                continue
            seen.add(f)
            for raw, text in funcs[f][1]:
                if is_evex(raw):
                    problems.append(f"{obj}: {names.get(f, f)}: EVEX instruction '{text}'")
                    break
            for callee in funcs[f][2]:
                pending.append(callee)
        checked += 1
        print(f"{obj}: {len(seen)} entry-point functions checked")
    if checked == 0:
        print("no AVX-512 object among the arguments", file=sys.stderr)
        return 2
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main([a for arg in sys.argv[1:] for a in arg.split(";") if a]))
