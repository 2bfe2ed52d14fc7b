"""Tile-configuration sweep for the GEMM rungs: every ``config`` a launcher accepts
(cupyops/ops/_gemm_*.py CONFIGS), on the acceptance shapes, validated on a sample of rows
against the float64 reference, then timed (CUDA events, L2 flushed, median), side by side
with cupy.matmul (cuBLAS). The defaults in the launchers are chosen from this.

    python benchmarks/gemm_sweep.py [--json PATH] [--only pipelined,mma,skinny,mma_decode]
                                    [--feeds tma,cp.async]
Prints one line per configuration: impl dtype MxNxK layout config ms TFLOP/s ratio-to-cuBLAS.
For the 16-bit ``mma`` rows each configuration runs once per stage feed (``--feeds``: the
sm_90 tensor copies, where the device has them, and cp.async), labelled config/feed.
"""
import argparse
import json

import cupy as cp
import numpy as np

from cupyops import reference
from cupyops.bench.runners import random_normal
from cupyops.bench.timing import L2Flusher, time_gpu
from cupyops.ops import gemm as G

CASES = {
    "pipelined": [("float32", (4096, 4096, 4096)), ("float32", (8192, 8192, 8192))],
    "mma": [("float16", (4096, 4096, 4096)), ("bfloat16", (4096, 4096, 4096)), ("float16", (8192, 8192, 8192)),
            ("bfloat16", (8192, 8192, 8192)), ("float16", (4096, 4096, 11008)),
            ("int8", (8192, 8192, 8192))],
    "skinny": [(d, s) for d in ("float16", "bfloat16") for s in
               ((1, 4096, 4096), (16, 4096, 4096), (1, 11008, 4096), (64, 4096, 4096))],
}
# the sm_90a rungs: the squares and Llama-3-8B prefill projections (4096 and 512 tokens)
_HOPPER = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (4096, 6144, 4096), (4096, 28672, 4096),
           (4096, 4096, 14336), (512, 6144, 4096), (512, 4096, 14336), (512, 4096, 4096), (512, 28672, 4096)]
CASES["wgmma"] = CASES["wgmma_ws"] = [(d, s) for s in _HOPPER for d in ("bfloat16", "float16")]
# the mma rung's tiles on the decode shapes ("--only mma_decode"): where a wide N gives
# its plain tiles a full wave, it competes with skinny
CASES["mma_decode"] = CASES["skinny"] + [("float16", (16, 11008, 4096)), ("float16", (64, 11008, 4096)),
                                         ("float16", (1, 8192, 4096)), ("float16", (16, 8192, 4096))]


def sampled_reference(a, b):
    """(rows, the float64 reference of those rows of a @ b): up to 32 rows spread over M,
    what a configuration's output is checked on before it is timed (int8: exact int32)."""
    M = a.shape[0]
    rows = np.unique(np.linspace(0, M - 1, min(M, 32)).round().astype(np.int64))
    ref = reference.matmul(a[rows].get(), b.get())
    return rows, ref.astype(np.int32) if a.dtype == np.int8 else ref


def problem(a, b, d, ta, tb):
    M, N = d.shape
    K = a.shape[0] if ta else a.shape[1]
    dt = "int8" if a.dtype == np.int8 else a.dtype.name
    (p,) = G._problems(dt, ta, tb, M, N, K, a, b, None, d, (), 1, 0, cp)
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--only", default="pipelined,mma,skinny")
    ap.add_argument("--layouts", default="nn,nt", help="nn: a @ b; nt: a @ b.T (B stored N x K)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--feeds", default="tma,cp.async", help="stage feeds of the 16-bit mma rows")
    ap.add_argument("--shapes", help="only these MxNxK (comma list)")
    args = ap.parse_args()
    flush = L2Flusher()
    results = []
    for which in args.only.split(","):
        impl = which.removesuffix("_decode")
        mod = G._LAUNCHERS[impl]
        for dt, (M, N, K) in CASES[which]:
            if args.shapes and f"{M}x{N}x{K}" not in args.shapes.split(","):
                continue
            a = random_normal((M, K), dt, 1)
            b = random_normal((K, N), dt, 2)
            bt = cp.ascontiguousarray(b.T)
            rows, ref = sampled_reference(a, b)
            flops = 2 * M * N * K
            d = cp.empty((M, N), np.int32 if dt == "int8" else a.dtype)
            base = None
            if dt != "int8":
                base = time_gpu(lambda: cp.matmul(a, b), repeats=args.repeats, warmup=2, flush=flush).median_ms
                print(f"{'cublas':10s} {dt:9s} {M}x{N}x{K:<6d} nn {'':14s} {base:8.4f} ms "
                      f"{flops / base / 1e9:7.1f} TFLOP/s", flush=True)
            for lay in args.layouts.split(","):
                p = problem(a, b if lay == "nn" else bt, d, False, lay == "nt")
                feeds = args.feeds.split(",") if impl == "mma" and dt in G._gemm_mma.TMA_TYPES else [None]
                for cfg, feed in [(c, f) for c in (None, *mod.CONFIGS.get(impl, ())) for f in feeds]:
                    label = (cfg or "default") + (f"/{feed}" if feed else "")
                    if feed:
                        G._gemm_mma.TMA_FEED = feed == "tma"
                    try:
                        d.fill(0)
                        mod.launch(impl, p, cfg)
                        err = reference.rel_error(d[rows].get(), ref)
                    except Exception as exc:  # a config that cannot run this shape
                        print(f"  {impl} {dt} {M}x{N}x{K} {lay} {label}: {type(exc).__name__}: {exc}")
                        continue
                    tol = reference.gemm_tolerance(dt, K)
                    if not err <= tol:
                        print(f"  WRONG {impl} {dt} {M}x{N}x{K} {lay} {label}: rel error {err:.3g}", flush=True)
                        continue
                    ms = time_gpu(lambda: mod.launch(impl, p, cfg), repeats=args.repeats, warmup=2,
                                  flush=flush).median_ms
                    ratio = base / ms if base else float("nan")
                    results.append({"impl": impl, "dtype": dt, "shape": [M, N, K], "layout": lay,
                                    "config": label, "ms": ms, "tflops": flops / ms / 1e9,
                                    "vs_cublas": ratio})
                    print(f"{impl:10s} {dt:9s} {M}x{N}x{K:<6d} {lay} {label:14s} {ms:8.4f} ms "
                          f"{flops / ms / 1e9:7.1f} TFLOP/s {ratio:5.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=0)


if __name__ == "__main__":
    main()
