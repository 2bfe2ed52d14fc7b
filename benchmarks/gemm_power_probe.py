"""Clocks and power of long GEMMs: ours against cuBLAS, each run back to back for a while.

A GEMM of 8192^3 at 1.3-1.4 PFLOP/s (FP8) or ~750 TFLOP/s (bf16) keeps an H100 at its power
limit, where the clock falls: a kernel that spends more energy per FLOP (more instructions
issued, more shared-memory traffic) then runs at a lower clock than one that spends less,
whatever its cycles per tile. This probe runs each call ``--seconds`` back to back (no L2
flush: these shapes do not fit it) while nvidia-smi samples the SM clock and the board
power every 50 ms, and prints the time a call, the mean clock and power over the run, and
the time a call scaled to the other side's clock (what the kernel's cycles alone would give).

    python benchmarks/gemm_power_probe.py [--seconds 3] [--tag NAME] [--shapes MxNxK,...] [--kinds fp8,bf16]
"""
import argparse
import subprocess
import time

import cupy as cp
import torch

from cupyops.ops import fp8
from cupyops.ops import gemm as G


def sampled(fn, seconds):
    """(us a call, mean SM MHz, mean W) of ``fn`` run back to back for ``seconds``."""
    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)  # (nvidia-smi's start)
    start, n = time.perf_counter(), 0
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    ev0.record()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            fn()
        n += 20
        ev1.record()
        ev1.synchronize()
    ms = cp.cuda.get_elapsed_time(ev0, ev1)
    smi.terminate()
    out, _ = smi.communicate()
    rows = [[float(x) for x in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    rows = rows[2:-1] or rows  # (the edges of the window)
    mhz = sum(r[0] for r in rows) / len(rows)
    watts = sum(r[1] for r in rows) / len(rows)
    return ms * 1e3 / n, mhz, watts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--tag", default="")
    ap.add_argument("--shapes", default="8192x8192x8192,4096x28672x4096")
    ap.add_argument("--kinds", default="fp8,bf16")
    args = ap.parse_args()
    cases = []
    for M, N, K in (tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")):
        x = torch.randn(M, K, device="cuda")
        w = torch.randn(N, K, device="cuda")
        sa, sb = (x.abs().max() / 448).float().reshape(()), (w.abs().max() / 448).float().reshape(())
        a8, w8 = (x / sa).to(torch.float8_e4m3fn), (w / sb).to(torch.float8_e4m3fn)
        a, b = cp.from_dlpack(a8.view(torch.uint8)), cp.from_dlpack(w8.view(torch.uint8)).T
        dsa, dsb = cp.from_dlpack(sa), cp.from_dlpack(sb)
        if "fp8" in args.kinds:
            cases.append((f"fp8 {M}x{N}x{K}", lambda a=a, b=b, dsa=dsa, dsb=dsb: fp8.scaled_matmul(a, b, dsa, dsb),
                          lambda a8=a8, w8=w8, sa=sa, sb=sb: torch._scaled_mm(
                              a8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)))
        xb, wb = cp.from_dlpack(x.bfloat16()), cp.from_dlpack(w.bfloat16())
        if "bf16" in args.kinds:
            cases.append((f"bf16 {M}x{N}x{K} nt", lambda xb=xb, wb=wb: G.matmul(xb, wb.T),
                          lambda xb=xb, wb=wb: cp.matmul(xb, wb.T)))
    for name, ours, theirs in cases:
        u_us, u_mhz, u_w = sampled(ours, args.seconds)
        t_us, t_mhz, t_w = sampled(theirs, args.seconds)
        print(f"{args.tag} {name}: ours {u_us:8.1f} us {u_mhz:6.0f} MHz {u_w:5.0f} W | theirs {t_us:8.1f} us "
              f"{t_mhz:6.0f} MHz {t_w:5.0f} W | ratio {t_us / u_us:.3f}x, at equal clocks "
              f"{t_us * t_mhz / (u_us * u_mhz):.3f}x", flush=True)


if __name__ == "__main__":
    main()
