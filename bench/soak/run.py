#!/usr/bin/env python3
"""Soak: hours of mixed traffic with random cancellations against a local cluster (pdctl up),
reporting every minute the daemons' RSS, file descriptors and threads and every node's KV blocks
in use; at the end, once the traffic stopped, every node must be back to 0 KV blocks in use and
0 running sequences (nothing leaked). Nightly, not CI (issue 21).

Traffic: --clients threads, each in a loop picks a request at random: chat or completion,
streaming or not, a prompt of 8..600 words, max_tokens 1..192, and with probability --cancel it
hangs up at a random moment (before the answer starts, or after a random number of stream
events). Requests refused with 429 (admission) are counted, not errors.

  bench/soak/run.py --minutes 120                    # the nightly run
  bench/soak/run.py --minutes 5 --clients 8          # a quick look

Markdown goes to stdout and to --out (default bench/results/soak_<UTC date>.md).
"""
from __future__ import annotations

import argparse
import datetime
import json
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import benchlib  # noqa: E402

WORDS = ("the river carried small boats past the old mill while children counted them from the "
         "bridge and the baker sold warm bread to travellers who had walked since dawn").split()


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return float("nan")


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {"sent": 0, "completed": 0, "cancelled": 0, "refused_429": 0, "errors": 0}
        self.error_kinds: dict[str, int] = {}

    def add(self, key: str, kind: str | None = None):
        with self.lock:
            self.c[key] += 1
            if kind:
                self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


def one_request(host: str, port: int, rng: random.Random, cancel_p: float, counters: Counters):
    chat = rng.random() < 0.5
    stream = rng.random() < 0.7
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 600)))
    body = {"max_tokens": rng.randint(1, 192), "stream": stream, "temperature": 0.8}
    if chat:
        body["messages"] = [{"role": "user", "content": words}]
    else:
        body["prompt"] = words
    data = json.dumps(body).encode()
    path = "/v1/chat/completions" if chat else "/v1/completions"
    cancel = rng.random() < cancel_p
    hang_after = rng.randint(0, 20)  # stream events (or 0: before anything arrives)
    counters.add("sent")
    try:
        with socket.create_connection((host, port), timeout=120) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            if cancel and hang_after == 0:
                time.sleep(rng.random() * 0.5)
                counters.add("cancelled")
                return
            got = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
                if cancel and got.count(b"data: ") >= hang_after:
                    counters.add("cancelled")
                    return
            status = got[9:12]
            if status == b"429":
                counters.add("refused_429")
            elif status == b"200":
                counters.add("completed")
            else:
                counters.add("errors", f"http_{status.decode(errors='replace')}")
    except OSError as e:
        counters.add("errors", type(e).__name__)


def client_loop(host, port, seed, cancel_p, stop: threading.Event, counters):
    rng = random.Random(seed)
    while not stop.is_set():
        one_request(host, port, rng, cancel_p, counters)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=120)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--cancel", type=float, default=0.3, help="probability a request hangs up")
    ap.add_argument("--prefill", type=int, default=1)
    ap.add_argument("--decode", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--bin-dir", default=str(ROOT / "build/bin"),
                    help="where pdctl and the daemons are (copy them aside to keep building "
                         "while a long soak runs)")
    args = ap.parse_args()
    out = benchlib.result_file("soak", args.out)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    with tempfile.TemporaryDirectory() as tmp:
        port = benchlib.free_port()
        cfg = Path(tmp) / "soak.yaml"
        cfg.write_text("router: {disaggregate_min_prompt: 64}\nkv: {memory_mib: 128}\n")
        up = subprocess.Popen(
            [str(Path(args.bin_dir) / "pdctl"), "up", "--prefill", str(args.prefill), "--decode",
             str(args.decode), "--config", str(cfg), "--http-port", str(port), "--grpc-port", "0",
             "--log-dir", str(Path(tmp) / "logs")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        nodes = {}
        node_re = re.compile(r"^\s+(prefill|decode)\s+(\S+)\s+pid=\d+ grpc=\S+ metrics=(\S+)/metrics")
        deadline = time.time() + 300
        while time.time() < deadline and len(nodes) < args.prefill + args.decode:
            line = up.stdout.readline()
            if not line:
                raise SystemExit("pdctl up exited before it was ready")
            m = node_re.match(line)
            if m:
                nodes[m.group(2)] = m.group(3)
        router = f"http://127.0.0.1:{port}"
        counters = Counters()
        stop = threading.Event()
        threads = [threading.Thread(target=client_loop,
                                    args=("127.0.0.1", port, 1000 + i, args.cancel, stop, counters),
                                    daemon=True) for i in range(args.clients)]
        for t in threads:
            t.start()
        rows = []
        start = time.time()
        minute = 0
        while time.time() - start < args.minutes * 60:
            time.sleep(max(0.0, start + 60 * (minute + 1) - time.time()))
            minute += 1
            rss, thr, fds = benchlib.sample_tree(up.pid)
            kv = {n: metric(u, "pdserve_kv_blocks_used") for n, u in nodes.items()}
            with counters.lock:
                c = dict(counters.c)
            rows.append((minute, rss, fds, thr, kv, c))
            print(f"soak: minute {minute}: RSS {rss:.0f} MiB, fds {fds}, threads {thr}, KV used "
                  f"{kv}, {c}", file=sys.stderr, flush=True)
        stop.set()
        for t in threads:
            t.join(180)
        time.sleep(3)
        end_kv = {n: metric(u, "pdserve_kv_blocks_used") for n, u in nodes.items()}
        end_running = {n: metric(u, "pdserve_running_sequences") for n, u in nodes.items()}
        rss, thr, fds = benchlib.sample_tree(up.pid)
        up.terminate()
        up.wait(60)
    first = rows[: max(1, len(rows) // 4)]
    last = rows[-max(1, len(rows) // 4):]
    c = rows[-1][5] if rows else {}
    lines = [f"# Soak: {args.minutes:g} minutes, local cluster ({args.prefill} prefill + "
             f"{args.decode} decode), random cancellations\n",
             f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- Machine: {benchlib.machine()}",
             f"- Command: `bench/soak/run.py {' '.join(sys.argv[1:])}`",
             f"- Commit: {commit}",
             f"- Traffic: {args.clients} clients, chat/completion, 70% streaming, prompts of 8-600 "
             f"words, max_tokens 1-192, {args.cancel:.0%} hang up at a random moment",
             f"- Requests: {c}; errors by kind: {counters.error_kinds or 'none'}",
             f"- After the traffic: KV blocks in use {end_kv}, running sequences {end_running}; "
             f"RSS {rss:.0f} MiB, fds {fds}, threads {thr}",
             f"- Drift, first quarter -> last quarter (means): RSS "
             f"{statistics.mean(r[1] for r in first):.0f} -> "
             f"{statistics.mean(r[1] for r in last):.0f} MiB, fds "
             f"{statistics.mean(r[2] for r in first):.0f} -> "
             f"{statistics.mean(r[2] for r in last):.0f}, threads "
             f"{statistics.mean(r[3] for r in first):.0f} -> "
             f"{statistics.mean(r[3] for r in last):.0f}\n",
             "| minute | RSS MiB (all daemons) | fds | threads | KV blocks in use | sent | completed | "
             "cancelled | 429 | errors |", "|" + " --- |" * 10]
    for minute, r, f, t, kv, cc in rows:
        lines.append(f"| {minute} | {r:.0f} | {f} | {t} | "
                     f"{', '.join(f'{n} {v:.0f}' for n, v in kv.items())} | {cc['sent']} | "
                     f"{cc['completed']} | {cc['cancelled']} | {cc['refused_429']} | "
                     f"{cc['errors']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out.write_text(text)
    leaked = any(v != 0 for v in end_kv.values()) or any(v != 0 for v in end_running.values())
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
