"""Probe of the memory-bound family's last gaps (issue 2): float32 sums against CuPy's CUB,
2-byte whole-array sums, 2-byte row max. (Commit c35bc3e also probed an L2::128B/256B
prefetch hint on the 16-byte loads and cp.async: no change anywhere; it was removed.)

Each variant changes one thing for the whole process (a launch-plan function of
cupyops/ops/reduce.py, or the rung), is checked against CuPy on the same input,
and is timed like the benchmark (CUDA events, read flush before each repeat, median), side
by side with cupy and torch and with a device copy moving the same bytes.

    python benchmarks/reduce_probe.py [--json PATH] [--only sum,max,softmax,...] [--variants a,b]
"""
import argparse
import contextlib
import functools
import json
import time
from unittest import mock

import cupy as cp
import numpy as np

import cupyops
from cupyops.bench.timing import L2Flusher, copy_bandwidth, copy_ms_for, time_gpu
from cupyops.ops import reduce

try:
    import torch
except ImportError:  # the probe runs without PyTorch too
    torch = None

CASES = [  # (op, dtype, shape, axis)
    ("sum", "float32", (4096, 4096), -1),
    ("sum", "float32", (4096, 4096), None),
    ("sum", "float32", (16384, 8192), -1),
    ("sum", "float32", (16384, 8192), None),
    ("sum", "float32", (65536, 1024), None),
    ("sum", "float32", (1024, 131072), -1),
    ("sum", "float32", (1024, 131072), None),
    ("max", "float32", (4096, 4096), -1),
    ("max", "float32", (1024, 131072), -1),
    ("sum", "float16", (65536, 1024), -1),
    ("sum", "float16", (65536, 1024), None),
    ("sum", "bfloat16", (65536, 1024), None),
    ("sum", "bfloat16", (16384, 8192), None),
    ("sum", "bfloat16", (4096, 4096), None),
    ("max", "float16", (65536, 1024), -1),
    ("max", "bfloat16", (65536, 1024), -1),
    ("softmax", "bfloat16", (65536, 1024), -1),
    ("layer_norm", "bfloat16", (16384, 8192), -1),
    ("layer_norm", "bfloat16", (65536, 1024), -1),
    ("rms_norm", "float16", (65536, 1024), -1),
]


# ------------------------------------------------------------------ variants
def patched(module, name, value, **more):
    """A context that sets module.name = value (and the ``more`` names) and puts them back."""
    return mock.patch.multiple(module, **{name: value, **more})


def variants():
    """name -> (applies(op, dtype, axis), context manager factory, impl)"""
    red = lambda op, dt, ax: op in ("sum", "max")  # noqa: E731
    whole = lambda op, dt, ax: op == "sum" and ax is None  # noqa: E731
    f32 = lambda op, dt, ax: op in ("sum", "max") and dt == "float32"  # noqa: E731
    v = {"current": (lambda *a: True, contextlib.nullcontext, "auto")}
    split = lambda op, dt, ax: op == "sum" and (ax is None or dt == "float32")  # noqa: E731
    v["segments"] = (split, lambda: patched(reduce, "FLAT_MAX_ROWS", 0), "auto")
    for per_sm in (2, 3, 4):
        v[f"flat/{per_sm}"] = (split, lambda b=per_sm: patched(reduce, "flat_plan", functools.partial(
            reduce.flat_plan, per_sm=b)), "auto")
    # the segment path's two finishes (the flat path is off for these)
    v["two_pass"] = (split, lambda: patched(reduce, "FLAT_MAX_ROWS", 0, ONE_LAUNCH_SPLITS=0), "auto")
    v["one_launch"] = (split, lambda: patched(reduce, "FLAT_MAX_ROWS", 0, ONE_LAUNCH_SPLITS=1 << 30), "auto")
    v["vector"] = (f32, contextlib.nullcontext, "vector")
    v["block"] = (red, contextlib.nullcontext, "block")
    for b, cap in ((1, 256), (2, 256), (4, 256), (8, 256), (2, 512), (4, 512)):
        v[f"batches{b}/{cap}"] = (
            red, lambda b=b, c=cap: patched(reduce, "vector_group",
                                            functools.partial(reduce.vector_group, batches=b, cap=c)), "vector")
    for block in (256, 512):  # more rows a block when the groups are small
        v[f"block{block}"] = (red, lambda b=block: patched(reduce, "VECTOR_BLOCK", b), "vector")
    for min_len, per_sm in ((8192, 64), (32768, 64), (65536, 64), (16384, 16), (16384, 32), (16384, 128)):
        v[f"seg{min_len // 1024}k/{per_sm}"] = (
            whole, lambda a=min_len, b=per_sm: patched(reduce, "split_plan", functools.partial(
                reduce.split_plan, min_len=a, per_sm=b)), "auto")
    return v


# ------------------------------------------------------------------ calls
def ours(op, x, axis, impl):
    if op == "sum":
        return lambda: cupyops.sum(x, axis=axis, impl=impl)
    if op == "max":
        return lambda: cupyops.max(x, axis=axis, impl=impl)
    if op == "softmax":
        return lambda: cupyops.softmax(x, impl=impl)
    w = cp.ones(x.shape[-1], x.dtype)
    if op == "layer_norm":
        b = cp.zeros(x.shape[-1], x.dtype)
        return lambda: cupyops.layer_norm(x, w, b, impl=impl)
    return lambda: cupyops.rms_norm(x, w, impl=impl)


def baselines(op, x, axis):
    out = {}
    if op in ("sum", "max"):
        out["cupy"] = (lambda: x.sum(axis=axis)) if op == "sum" else (lambda: x.max(axis=axis))
    if torch is not None:
        t = torch.from_dlpack(x)
        n = x.shape[-1]
        if op == "sum":
            out["torch"] = (lambda: t.sum()) if axis is None else (lambda: t.sum(-1))
        elif op == "max":
            out["torch"] = lambda: t.amax(-1)
        elif op == "softmax":
            out["torch"] = lambda: torch.softmax(t, -1)
        elif op == "layer_norm":
            w, b = torch.ones(n, dtype=t.dtype, device=t.device), torch.zeros(n, dtype=t.dtype, device=t.device)
            out["torch"] = lambda: torch.nn.functional.layer_norm(t, (n,), w, b)
        else:
            w = torch.ones(n, dtype=t.dtype, device=t.device)
            out["torch"] = lambda: torch.nn.functional.rms_norm(t, (n,), w)
    return out


def nbytes_of(op, x, axis):
    if op in ("sum", "max"):
        rows = 1 if axis is None else x.shape[0]
        return x.nbytes + rows * x.itemsize
    return 2 * x.nbytes


def close(a, b, dt):
    a = cp.asnumpy(a).astype(np.float64)
    b = cp.asnumpy(b).astype(np.float64)
    tol = 1e-4 if dt == "float32" else 2e-2
    return bool(np.allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max()))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--only", help="comma-separated ops")
    ap.add_argument("--variants", help="comma-separated variant names (default: all)")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.only or c[0] in args.only.split(",")]
    t0 = time.perf_counter()
    dev = cp.cuda.runtime.getDevice()
    cupyops.warmup(["sum", "softmax", "layer_norm"])
    print(f"compiled in {time.perf_counter() - t0:.1f} s", flush=True)

    flush = L2Flusher()
    copy_bw = copy_bandwidth(1 << 30, flush=flush)
    print(f"copy bandwidth (1 GiB) {copy_bw:.0f} GB/s", flush=True)
    table = variants()
    if args.variants:
        table = {k: v for k, v in table.items() if k in args.variants.split(",")}
    results = []
    for op, dt, shape, axis in cases:
        x = cp.random.standard_normal(shape, dtype=cp.float32).astype(
            cupyops._dtypes.to_dtype(dt))
        nbytes = nbytes_of(op, x, axis)
        same = copy_ms_for(nbytes, flush=flush)
        base = baselines(op, x, axis)
        ref = base["cupy"]() if "cupy" in base else None
        line = {"op": op, "dtype": dt, "shape": "x".join(map(str, shape)),
                "axis": "all" if axis is None else axis, "bytes": nbytes, "copy_ms": same, "ms": {}}
        for name, fn in base.items():
            line["ms"][name] = time_gpu(fn, flush=flush).median_ms
        for name, (applies, ctx, impl) in table.items():
            if not applies(op, dt, axis):
                continue
            with ctx():
                fn = ours(op, x, axis, impl)
                got = fn()
                if ref is not None and not close(got, ref, dt):
                    line["ms"][name] = None
                    print(f"  {name}: WRONG RESULT", flush=True)
                    continue
                line["ms"][name] = time_gpu(fn, flush=flush).median_ms
        results.append(line)
        ax = line["axis"]
        best_base = min((v for k, v in line["ms"].items() if k in base), default=None)
        print(f"{op} {dt} {line['shape']} axis={ax}  same-bytes copy {same * 1e3:.1f} us "
              f"({nbytes / same / 1e6:.0f} GB/s)", flush=True)
        for name, ms in line["ms"].items():
            if ms is None:
                continue
            vs = f"  vs best base {best_base / ms:.3f}x" if best_base else ""
            print(f"  {name:16s} {ms * 1e3:8.1f} us  {100 * nbytes / (ms * 1e-3) / 1e9 / copy_bw:6.1f} % copy"
                  f"  {100 * same / ms:6.1f} % same-bytes copy{vs}", flush=True)
        del x
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_bandwidth_GBps": copy_bw, "device": cp.cuda.runtime.getDeviceProperties(dev)["name"].decode(),
                       "results": results}, f, indent=1)
    print(f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
