"""Where the host time of a decode-sized call goes: cProfile of cupyops calls on CuPy arrays
and on torch tensors (the benchmark's decode operands, cupyops.bench.host), printing each
call's top functions by own time, and the time per call of the same calls replayed from
a CUDA graph.
    python benchmarks/profile_host.py [--calls N] [--ops rms_norm,matmul,...]
"""
import argparse
import cProfile
import pstats

import cupy
import torch

from cupyops import _dtypes
from cupyops.bench import host, timing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--ops", default=",".join(host.OPS))
    ap.add_argument("--top", type=int, default=22)
    args = ap.parse_args()
    arrays = host._operands(cupy, _dtypes.to_dtype("bfloat16"))
    tensors = {k: torch.from_dlpack(v) for k, v in arrays.items()}
    ops = host.decode_ops(torch)
    for op in args.ops.split(","):
        label, ours, theirs = ops[op]
        for who, fn in (("cupy in", lambda: ours(arrays)), ("torch in", lambda: ours(tensors)),
                        ("torch", lambda: theirs(tensors))):
            us = timing.host_overhead_us(fn, calls=args.calls)
            print(f"=== {op} {label} {who}: {us:.1f} us per call")
            if who == "torch":
                continue
            for _ in range(50):
                fn()
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(args.calls):
                fn()
            pr.disable()
            cupy.cuda.Device().synchronize()
            st = pstats.Stats(pr)
            st.sort_stats("tottime").print_stats(args.top)
        graph = {who: host.graph_replay_us(fn, torch=t) for who, fn, t in
                 (("cupyops", lambda: ours(arrays), None), ("torch", lambda: theirs(tensors), torch))}
        print(f"=== {op} {label} graph replay: " + ", ".join(f"{k} {v:.1f} us" for k, v in graph.items())
              + " per call")


if __name__ == "__main__":
    main()
