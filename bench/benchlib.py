"""Small helpers shared by the bench/ scripts: what machine a result was measured on."""

from __future__ import annotations

import datetime
import os
import platform
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

# The CPU flags that decide which kernels run (engine/backend/cpu: AVX2 + FMA, AVX-512, VNNI).
KERNEL_FLAGS = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                "avx512_vnni", "avx512_bf16", "avx_vnni"]


def cpu_facts() -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; ("?", set()) when unreadable."""
    model, flags = "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def machine() -> str:
    """One line: CPU model, CPU count, the best ISA and the kernel-relevant flags, OS kernel."""
    model, flags = cpu_facts()
    isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "scalar")
    return (f"{model}, {os.cpu_count()} CPUs, best ISA {isa} (flags: "
            f"{' '.join(f for f in KERNEL_FLAGS if f in flags) or 'none'}), kernel "
            f"{platform.release()}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server under test (pd-serve, pdctl up, llama-server) in its own process group, output
    to `log`. ready() waits until GET /v1/models answers 200; stop() sends SIGTERM to the group,
    then SIGKILL after 30 s."""

    def __init__(self, name: str, args: list[str], port: int, log: Path, cwd=None):
        self.name, self.port, self.log = name, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=cwd)

    def ready(self, timeout_s: float) -> None:
        """Raises RuntimeError when the process exits first or `timeout_s` passes."""
        end = time.time() + timeout_s
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before it was ready")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.url} not ready after {timeout_s} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def dig(d, *keys):
    """d[k1][k2]... for nested JSON results; None as soon as a level is missing."""
    for k in keys:
        if d is None:
            return None
        d = d.get(k)
    return d


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (pdctl up's daemons)."""
    out, pending = [], [pid]
    while pending:
        p = pending.pop()
        out.append(p)
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            kids = []
        pending.extend(int(k) for k in kids)
    return out


def result_file(name: str, out: str | None) -> Path:
    """`out` when given, else bench/results/<name>_<UTC date>.md."""
    if out:
        return Path(out)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return Path(__file__).resolve().parent / "results" / f"{name}_{date}.md"


def sample_tree(pid: int) -> tuple[float, int, int]:
    """(RSS MiB, threads, open file descriptors) summed over `pid` and its descendants."""
    rss, threads, fds = 0.0, 0, 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) / 1024
                elif line.startswith("Threads:"):
                    threads += int(line.split()[1])
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            pass
    return rss, threads, fds
