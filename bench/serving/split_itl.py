#!/usr/bin/env python3
"""Splits the decode class's inter-token gaps of a pd-bench --mix run (JSON written with
--save-requests) by whether a long-class prompt was being prefilled (between its send and its first
token) when the gap ended; prints p50/p99 of both and each decode request's send/TTFT/TPOT.

  python3 bench/serving/split_itl.py bench/results/serving_2026-11-29/b_chunk16_r2.json
"""
import json
import sys


def pct(v, q):  # numpy's default (linear between closest ranks)
    v = sorted(v)
    k = (len(v) - 1) * q / 100
    i = int(k)
    return v[i] if i + 1 >= len(v) else v[i] + (v[i + 1] - v[i]) * (k - i)


d=json.load(open(sys.argv[1]))
R=d["requests"]
wins=[(r["send_s"], r["send_s"]+r["ttft_s"]) for r in R if r["class"]=="long" and r["ok"]]
def inwin(t): return any(a<=t<=b for a,b in wins)
ins,outs=[],[]
for r in R:
    if r["class"]!="decode" or not r["ok"]: continue
    t=r["send_s"]+r["ttft_s"]
    for g in r["itl_s"]:
        t+=g
        (ins if inwin(t) else outs).append(g*1000)
for name,v in (("gaps while a long prompt is being prefilled",ins),("gaps with no long prompt in prefill",outs)):
    if v:
        print(f"{name}: n={len(v)} mean={sum(v) / len(v):.1f} p50={pct(v, 50):.1f} "
              f"p99={pct(v, 99):.1f} max={max(v):.1f} ms")
dec=[r for r in R if r["class"]=="decode" and r["ok"]]
for r in sorted(dec,key=lambda r:r["send_s"]):
    print(f"  decode req send={r['send_s']:.1f}s ttft={r['ttft_s']:.1f}s tpot={r['tpot_s']*1000:.1f}ms end={r['send_s']+r['e2e_s']:.1f}s")
print("long prefill windows:", [(round(a,1),round(b,1)) for a,b in wins])
