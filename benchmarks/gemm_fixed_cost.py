"""A call's fixed cost on the 512-token GEMM shapes: wgmma_ws (auto's configuration and
single 128x128 tiles) against cupy.matmul (cuBLAS), bfloat16 x @ w.T, 512 x 4096 x K for
K from one k-tile (64) to 4096. The time at K = 64 is almost all start and end (launch,
barriers, the first copies from a cold L2, the epilogue); the slope over K is the main
loop's cost a k-tile. CUDA events, L2 flushed, median of 40, each configuration measured
twice in a row and the second kept (the first brings the clocks up).

    python benchmarks/gemm_fixed_cost.py [--tag NAME]
"""
import argparse
import sys
from pathlib import Path

import cupy as cp

from cupyops.bench.runners import random_normal
from cupyops.bench.timing import L2Flusher, time_gpu
from cupyops.ops import _gemm_wgmma as W

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_sweep import problem  # noqa: E402

KS = (64, 512, 2048, 4096)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="", help="a label printed first on every line (an A/B's tree)")
    args = ap.parse_args()
    flush = L2Flusher()
    M, N = 512, 4096
    for K in KS:
        a = random_normal((M, K), "bfloat16", 1)
        w = random_normal((N, K), "bfloat16", 2)
        d = cp.empty((M, N), a.dtype)
        p = problem(a, w, d, False, True)
        calls = {"cublas": lambda: cp.matmul(a, w.T), "auto": lambda: W.launch("wgmma_ws", p, None),
                 "128x128": lambda: W.launch("wgmma_ws", p, "128x128")}
        for _ in range(2):
            us = {name: time_gpu(f, flush=flush, repeats=40).median_ms * 1e3 for name, f in calls.items()}
        print(f"{args.tag} {M}x{N}x{K}: " + " ".join(f"{n} {v:7.2f} us" for n, v in us.items()) +
              f"  auto/cublas {us['cublas'] / us['auto']:.3f}", flush=True)


if __name__ == "__main__":
    main()
