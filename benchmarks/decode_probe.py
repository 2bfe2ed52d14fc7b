"""Probe of the attention `decode` rung against SDPA (issue 4's decode shapes: bf16, q_len 1,
Hq 32, Hkv 8, head_dim 128, batch 16 and 64, 4096 and 32768 keys): each variant of the
launch plan (``variants()``) is checked against SDPA's cuDNN output and timed like the
benchmark (CUDA events, L2 flushed by a read before each repeat, median), side by side with
SDPA's cuDNN and flash backends. (Session 5 probed a 4-6 stage K/V ring for launches of
one block an SM here: slower than 3 stages everywhere; NOTES item 37.)

    python benchmarks/decode_probe.py [--json PATH] [--repeats N] [--splits 2,4]
"""
import argparse
import contextlib
import dataclasses
import json
from unittest import mock

import cupy as cp
import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import cupyops
from cupyops.bench.timing import L2Flusher, time_gpu
from cupyops.ops import _attention_decode as dec

SHAPES = [(16, 4096), (64, 4096), (16, 32768), (64, 32768)]  # (B, Skv)
Hq, Hkv, D = 32, 8, 128


def variants(forced_splits=()):
    """name -> context manager that changes the plan (module settings) for the variant:
    the default plan, the plan with every block's shared memory as sized, and each S of
    ``forced_splits`` in place of choose_splits' choice."""
    out = {"default": contextlib.nullcontext, "as_sized": lambda: mock.patch.object(dec, "plan", _as_sized)}
    for S in forced_splits:
        out[f"S{S}"] = lambda S=S: mock.patch.object(dec, "choose_splits", lambda tiles, *a, **k: min(S, tiles))
    return out


_planned = dec.plan


def _as_sized(*a, **k):
    """The plan with each launch asking for the shared memory its kernel uses, so as many
    blocks an SM are resident as fit (two at head_dim 128): the plan before B64 went to one
    an SM (NOTES 44)."""
    pl = _planned(*a, **k)
    return dataclasses.replace(pl, launch_smem=pl.smem)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--splits", default="", help="comma-separated S to force as extra variants, e.g. 2,4")
    args = ap.parse_args()
    cupyops.warmup(["attention"])
    flush = L2Flusher()
    bf16 = cupyops._dtypes.to_dtype("bfloat16")
    F = torch.nn.functional
    results = []
    for B, Skv in SHAPES:
        q = cp.random.standard_normal((B, 1, Hq, D), dtype=cp.float32).astype(bf16)
        k = cp.random.standard_normal((B, Skv, Hkv, D), dtype=cp.float32).astype(bf16)
        v = cp.random.standard_normal((B, Skv, Hkv, D), dtype=cp.float32).astype(bf16)
        tq, tk, tv = (torch.from_dlpack(a).transpose(1, 2) for a in (q, k, v))
        nbytes = q.nbytes * 2 + k.nbytes + v.nbytes
        line = {"B": B, "Skv": Skv, "bytes": nbytes, "us": {}}
        ref = None
        def sdpa():
            return F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)

        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel(backend):  # entered once, outside the timed calls
                got = sdpa()
                if ref is None:
                    ref = cp.from_dlpack(got.transpose(1, 2).contiguous()).astype(cp.float32)
                line["us"][name] = time_gpu(sdpa, flush=flush, repeats=args.repeats).median_ms * 1e3
        for name, ctx in variants([int(v) for v in args.splits.split(",") if v]).items():
            dec._PLANS.clear()
            with ctx():
                fn = lambda: cupyops.attention(q, k, v, impl="decode")  # noqa: E731
                err = float(cp.abs(fn().astype(cp.float32) - ref).max())
                if not np.isfinite(err) or err > 2e-2:
                    print(f"  {name}: WRONG (max error {err:.3g})", flush=True)
                    continue
                line["us"][name] = time_gpu(fn, flush=flush, repeats=args.repeats).median_ms * 1e3
        dec._PLANS.clear()
        results.append(line)
        print(f"B{B} Skv{Skv} ({nbytes / 1e6:.0f} MB)", flush=True)
        for name, us in line["us"].items():
            print(f"  {name:8s} {us:8.1f} us {nbytes / us / 1e3:6.0f} GB/s  vs cudnn "
                  f"{line['us']['cudnn'] / us:.3f}x", flush=True)
        del q, k, v, tq, tk, tv, ref
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
