#!/usr/bin/env python3
"""PyTorch reference for the CUDA backend's timings, measured in the same run on the same GPU.

Reads the `[timing]` lines that cuda_backend_test printed (its Timing test), runs the same shapes
through PyTorch the same way (200 / 1000 back-to-back ops timed on the host between two
synchronisations, after 3 warm-up ops), and prints a markdown table: ours, PyTorch, ours/PyTorch
speed ratio, and the physical limit of the shape on an H200 (HBM3e 4.8 TB/s; dense F16 tensor
peak 989 TFLOP/s), with our share of it.

    python3 torch_reference.py TEST_LOG
"""

import re
import sys
import time

import torch

HBM_BPS = 4.8e12
F16_FLOPS = 989e12


def per_op_us(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> int:
    log = open(sys.argv[1]).read()
    mm = {int(n): float(us) for n, us in re.findall(r"MatMul f16 m=4096 k=4096 n=(\d+)\s+([\d.]+) us/op", log)}
    rn = {int(r): float(us) for r, us in re.findall(r"RmsNorm rows=(\d+)\s+cols=4096\s+([\d.]+) us/op", log)}
    if not mm or not rn:
        print("no [timing] lines in the test log (the Timing test failed or did not run)")
        return 1
    dev = torch.device("cuda")
    print(f"reference: torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    g = torch.Generator(device=dev).manual_seed(1)
    m = k = 4096
    w = (torch.rand(m, k, device=dev, generator=g) * 2 - 1).half()
    rows = []
    for n in sorted(mm):
        x = torch.rand(n, k, device=dev, generator=g) * 2 - 1
        # Same work as ours: F32 activations rounded to F16, F16 x F16 -> F32 result.
        ref = per_op_us(lambda: torch.matmul(x.half(), w.t()).float(), 200)
        flops = 2.0 * m * k * n
        nbytes = 2.0 * m * k + 4.0 * n * k + 4.0 * n * m
        limit = max(nbytes / HBM_BPS, flops / F16_FLOPS) * 1e6
        what = "HBM" if nbytes / HBM_BPS > flops / F16_FLOPS else "F16 peak"
        rows.append((f"MatMul f16 4096x4096, n={n}", mm[n], ref, limit, what))
    wn = torch.rand(k, device=dev, generator=g) + 0.5
    for r in sorted(rn):
        x = torch.rand(r, k, device=dev, generator=g) * 2 - 1
        ref = per_op_us(lambda: torch.nn.functional.rms_norm(x, (k,), wn, 1e-6), 1000)
        nbytes = 8.0 * r * k + 4.0 * k
        rows.append((f"RmsNorm rows={r} cols=4096", rn[r], ref, nbytes / HBM_BPS * 1e6, "HBM"))
    print()
    print("| op | ours us | PyTorch us | speed ours/PyTorch | limit us | bound | ours % of limit |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for name, ours, ref, limit, what in rows:
        print(f"| {name} | {ours:.2f} | {ref:.2f} | {ref / ours:.2f}x | {limit:.2f} | {what} | "
              f"{100 * limit / ours:.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
