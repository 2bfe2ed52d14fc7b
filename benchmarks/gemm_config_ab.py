"""wgmma_ws's tile configurations side by side with cupy.matmul (cuBLAS), in interleaved
rounds: each round times cuBLAS and every configuration once per (shape, layout, dtype), so
that a ratio compares two numbers taken moments apart on one GPU. Every configuration's
output is checked on a sample of rows against the float64 reference before it is timed.
CUDA events, L2 flushed, median of ``--repeats``.

    python benchmarks/gemm_config_ab.py [--shapes 512x28672x4096,...] [--layouts nt,nn]
        [--dtypes bfloat16,float16] [--configs auto,128x128c2,128x176c2,auto@g16] [--rounds 2]
        [--interleave] [--json PATH]

A configuration's ``@gN`` suffix walks the tiles in groups of N tile rows
(``_gemm_wgmma.GROUP_ROWS``). ``nt`` is ``x @ w.T`` (B stored N x K, cuBLAS given
``w.T``), ``nn`` is ``a @ b``. A configuration that does not take a layout (128x176c2 on
``nn``) is left out of it.
``--interleave``: in each round the calls of cuBLAS and every configuration interleave
(``time_gpu_interleaved``) instead of each being timed in turn.
"""
import argparse
import json
import sys
from pathlib import Path

import cupy as cp

from cupyops import reference
from cupyops.bench.runners import random_normal
from cupyops.bench.timing import L2Flusher, time_gpu, time_gpu_interleaved
from cupyops.ops import _gemm_wgmma as W

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_sweep import problem, sampled_reference  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="512x28672x4096")
    ap.add_argument("--layouts", default="nt")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--configs", default="auto," + ",".join(W.CONFIGS["wgmma_ws"]))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--interleave", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    flush = L2Flusher()
    rows_out = []
    for shape in args.shapes.split(","):
        M, N, K = (int(x) for x in shape.split("x"))
        for dt in args.dtypes.split(","):
            a = random_normal((M, K), dt, 1)
            b = random_normal((K, N), dt, 2)
            bt = cp.ascontiguousarray(b.T)
            sample, ref = sampled_reference(a, b)
            d = cp.empty((M, N), a.dtype)
            for lay in args.layouts.split(","):
                p = problem(a, b if lay == "nn" else bt, d, False, lay == "nt")
                calls = {"cublas": (lambda: cp.matmul(a, b)) if lay == "nn" else (lambda: cp.matmul(a, bt.T))}
                for cfg in args.configs.split(","):
                    name, _, group = cfg.partition("@g")  # (auto@g16: the walk in groups of 16 tile rows)
                    c = None if name == "auto" else name
                    if c is not None and not W.takes_layout(W.tile_of("wgmma_ws", c), lay == "nt"):
                        continue

                    def run(c=c, group=int(group) if group else W.GROUP_ROWS):
                        default, W.GROUP_ROWS = W.GROUP_ROWS, group
                        try:
                            W.launch("wgmma_ws", p, c)
                        finally:
                            W.GROUP_ROWS = default

                    d.fill(float("nan"))
                    run()
                    err = reference.rel_error(d[sample].get(), ref)
                    if not err <= reference.gemm_tolerance(dt, K):
                        print(f"WRONG {shape} {dt} {lay} {cfg}: rel error {err:.3g}", flush=True)
                        continue
                    calls[cfg] = run
                for r in range(args.rounds):
                    if args.interleave:
                        us = {n: t.median_ms * 1e3
                              for n, t in time_gpu_interleaved(calls, repeats=args.repeats, flush=flush).items()}
                    else:
                        us = {n: time_gpu(f, flush=flush, repeats=args.repeats, warmup=3).median_ms * 1e3
                              for n, f in calls.items()}
                    line = " ".join(f"{n} {v:8.2f} ({us['cublas'] / v:.3f}x)" for n, v in us.items() if n != "cublas")
                    mode = "i " if args.interleave else ""
                    print(f"{mode}{shape} {dt} {lay} r{r}: cublas {us['cublas']:8.2f} us | {line}", flush=True)
                    rows_out.append({"shape": [M, N, K], "dtype": dt, "layout": lay, "round": r, "us": us,
                                     "interleaved": args.interleave})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows_out, fh, indent=0)


if __name__ == "__main__":
    main()
