"""Where the decode GEMM's time goes: gemm_skinny at (M, N, K) for several M and every
configuration, with and without the L2 flush, beside cupy.matmul. Prints one line each:
M N K config S tiles ms(flushed) ms(warm L2) cublas-ms(flushed) ratio.

    python benchmarks/skinny_probe.py [--dtype float16] [--shapes 4096x4096,11008x4096]
"""
import argparse

import cupy as cp

from cupyops.bench.runners import random_normal
from cupyops.bench.timing import L2Flusher, time_gpu
from cupyops.ops import _gemm_skinny as SK
from cupyops.ops import gemm as G


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--shapes", default="4096x4096,11008x4096", help="NxK list")
    ap.add_argument("--ms", default="1,8,9,16,32,64")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    flush = L2Flusher()
    dt = args.dtype
    for shape in args.shapes.split(","):
        N, K = map(int, shape.split("x"))
        b = random_normal((K, N), dt, 2)
        for M in map(int, args.ms.split(",")):
            a = random_normal((M, K), dt, 1)
            d = cp.empty((M, N), a.dtype)
            (p,) = G._problems(dt, False, False, M, N, K, a, b, None, d, (), 1, 0, cp)
            base = time_gpu(lambda: cp.matmul(a, b), repeats=args.repeats, warmup=3, flush=flush).median_ms
            pick = SK.pick_config(p, 132)
            for cfg in SK.CONFIGS["skinny"]:
                pl = SK.plan(p, cfg, 132)
                t_cold = time_gpu(lambda: SK.launch("skinny", p, cfg), repeats=args.repeats, warmup=3,
                                  flush=flush).median_ms
                t_warm = time_gpu(lambda: SK.launch("skinny", p, cfg), repeats=args.repeats, warmup=3).median_ms
                mark = "*" if cfg == pick else " "
                print(f"{dt} M={M:<3d} N={N} K={K} {cfg:8s}{mark} mt={pl.mt} S={pl.splits} tiles={pl.rg * pl.nt:<4d} "
                      f"kc={pl.kc:<4d} {t_cold * 1e3:7.1f} us  warm {t_warm * 1e3:7.1f} us  cublas {base * 1e3:6.1f} us"
                      f"  {base / t_cold:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
