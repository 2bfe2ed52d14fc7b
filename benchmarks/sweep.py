"""Launch-shape sweep for the top rungs: times each kernel directly with explicit
(G, VECS, block, cluster) choices on the acceptance shapes, so that the plans in
cupyops/_launch.py and cupyops/ops/reduce.py are chosen by measurement.

    python benchmarks/sweep.py [--json PATH] [--only sum,softmax,...]
Prints one line per configuration: op dtype shape config ms %copy-BW.
"""
import argparse
import json

import cupy as cp
import numpy as np

from cupyops import _arrays, _dtypes, _launch, reference
from cupyops._kernels import template_name
from cupyops.bench.timing import L2Flusher, copy_bandwidth, time_gpu
from cupyops.ops import norm, reduce, softmax

SHAPES = [(16384, 8192), (65536, 1024), (1024, 131072)]
# whole-array sums of the acceptance shapes, as the one long row they are reduced as
SUM_SHAPES = SHAPES + [(1, 16384 * 8192), (1, 65536 * 1024)]
DTYPES = ["float32", "float16", "bfloat16"]


def rand(shape, dt):
    return cp.random.standard_normal(shape, dtype=cp.float32).astype(_dtypes.to_dtype(dt))


def groups(lo=4, hi=1024):
    g = lo
    while g <= hi:
        yield g
        g *= 2


def sweep_sum(dt, shape, out):
    R, n = shape
    x = rand(shape, dt)
    vec = 16 // x.itemsize
    dout = reduce.SUM_DEFAULT[dt]
    fn = reduce.KERNELS.function(reduce._name("reduce_rows_vector", "sum", dt, dout))
    y = cp.empty(R, _dtypes.to_dtype(dout))
    ref = reference.sum(x, axis=-1)

    def check():
        got = y.get()
        y.fill(np.nan)
        return reference.rel_error(got, ref)

    for G in groups(hi=512):
        if G * vec > n:
            break
        for block in sorted({max(G, 128), max(G, 256)}):
            if block > 1024:
                continue
            args = (x, y, np.int64(R), np.int64(n), np.int32(1), np.int64(n), np.int32(G), np.int32(1), _arrays.NULL_PTR, _arrays.NULL_PTR)
            yield f"G={G} block={block}", lambda a=args, G=G, b=block: fn((_launch.cdiv(R, b // G),), (b,), a), x.nbytes, check
    yield from _split_configs(dt, x, y, R, n, dout, check)


def _split_configs(dt, x, y, R, n, dout, check):
    """Segment plans (S segments of L elements a row, then a second pass over the
    partials) for the block and vector rungs; S = 1 is one block (group) per row."""
    vec = 16 // x.itemsize
    acc = reduce._OPS["sum"][1][dout]
    for impl in ("block", "vector"):
        for min_len in (8192, 16384, 32768, 65536, 131072):
            S = max(1, n // min_len)
            L = _launch.cdiv(_launch.cdiv(n, S), vec) * vec
            S = _launch.cdiv(n, L)
            if S == 1 and min_len != 131072:
                continue
            partial = cp.empty((R, S), _dtypes.to_dtype(acc))

            def run(impl=impl, S=S, L=L, partial=partial):
                if S == 1:
                    reduce._rows_launch("sum", impl, x, y, R, n, 1, n, dt, dout)
                else:
                    reduce._rows_launch("sum", impl, x, partial, R, n, S, L, dt, acc)
                    reduce._rows_launch("sum", impl, partial, y, R, S, 1, S, acc, dout)
            yield f"{impl} S={S} L={L}", run, x.nbytes, check


def _fused_configs(dt, n):
    vec = 16 // (4 if dt == "float32" else 2)
    for vecs in _launch.ROW_VECS[dt]:
        for G in groups():
            if G * vecs * vec < n or G * vecs * vec >= 4 * n:
                continue
            for block in sorted({max(G, 128), max(G, 256), max(G, 512)}):
                if block <= _launch.row_max_threads(vecs, dt):
                    yield vecs, G, block


def _cluster_configs(dt, n):
    vec = 16 // (4 if dt == "float32" else 2)
    for vecs in _launch.ROW_VECS[dt]:
        for cl in _launch.CLUSTER_SIZES:
            chunk = _launch.cdiv(_launch.cdiv(n, cl), vec) * vec
            for G in (256, 512, 1024):
                if G * vecs * vec >= chunk and G <= _launch.row_max_threads(vecs, dt) and G * vecs * vec < 4 * chunk:
                    yield vecs, cl, G, chunk


def sweep_rows(op, dt, shape, out):
    R, n = shape
    x = rand(shape, dt)
    y = cp.empty_like(x)
    w = rand((n,), dt)
    b = rand((n,), dt)
    t = _dtypes.cuda_type(dt)
    eps = np.float32(1e-5)
    kf = {"softmax": softmax.KERNELS, "layer_norm": norm.KERNELS, "rms_norm": norm.KERNELS}[op]
    base = {
        "softmax": (x, y, np.int64(R), np.int32(n)),
        "layer_norm": (x, w, b, y, _arrays.NULL_PTR, _arrays.NULL_PTR, np.int64(R), np.int32(n), eps),
        "rms_norm": (x, w, y, np.int64(R), np.int32(n), eps),
    }[op]
    nbytes = 2 * x.nbytes
    sub = np.r_[0:3, R - 3:R]  # first and last rows: a config that skips rows fails here
    xs, wh, bh = x[sub].get(), w.get(), b.get()
    ref = {"softmax": lambda: reference.softmax(xs),
           "layer_norm": lambda: reference.layer_norm(xs, wh, bh, 1e-5)[0],
           "rms_norm": lambda: reference.rms_norm(xs, wh, 1e-5)}[op]()

    def check():
        got = y[sub].get()
        y.fill(np.nan)
        return reference.rel_error(got, ref)

    for vecs, G, block in _fused_configs(dt, n):
        fn = kf.function(template_name(f"{op}_fused", t, vecs))
        args = base + (np.int32(G), np.int32(1))
        yield f"fused VECS={vecs} G={G} block={block}", (
            lambda fn=fn, a=args, G=G, bl=block: fn((_launch.cdiv(R, bl // G),), (bl,), a)), nbytes, check
    item = x.itemsize
    for block in (128, 256, 512, 1024):
        for rb in (1, 2, 4, 8, 16, 32):
            G = block // rb
            if G < 4 or rb * n * item > 96 * 1024 or (rb > 1 and rb * n * item > 32 * 1024 * 2):
                continue
            fn = kf.function(template_name(f"{op}_staged", t, 1))
            params = _launch.STAGED_PARAM_ROWS[op] if rb > 1 and n * item <= _launch.SHORT_ROW_BYTES else 0
            smem = (rb + params) * n * item
            _launch.request_smem(fn, smem, _launch.device_props(), "sweep")
            args = base + (np.int32(0), np.int32(G)) + (() if op == "softmax" else (np.int32(params),)) + (np.int32(1),)
            yield f"staged block={block} rows/block={rb}", (
                lambda fn=fn, a=args, bl=block, rb=rb, sm=smem: fn((_launch.cdiv(R, rb),), (bl,), a, shared_mem=sm)), nbytes, check
    if n * item > 32 * 1024:
        for cl in _launch.CLUSTER_SIZES:
            chunk = _launch.cdiv(_launch.cdiv(n, cl), 16 // item) * (16 // item)
            if chunk * item > 200 * 1024:
                continue
            fn = kf.function(template_name(f"{op}_staged", t, cl))
            _launch.request_smem(fn, chunk * item, _launch.device_props(), "sweep")
            for block in (256, 512, 1024):
                args = base + (np.int32(chunk), np.int32(block)) + (() if op == "softmax" else (np.int32(0),)) + (np.int32(1),)
                yield f"staged CL={cl} block={block}", (
                    lambda fn=fn, a=args, bl=block, cl=cl, sm=chunk * item: fn((R * cl,), (bl,), a, shared_mem=sm)), nbytes, check
    if n > 8192:
        for vecs, cl, G, chunk in _cluster_configs(dt, n):
            fn = kf.function(template_name(f"{op}_cluster", t, vecs, cl))
            args = base + (np.int32(chunk), np.int32(1))
            yield f"cluster VECS={vecs} CL={cl} G={G}", (
                lambda fn=fn, a=args, cl=cl, G=G: fn((R * cl,), (G,), a)), nbytes, check


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--only", default="sum,softmax,layer_norm,rms_norm")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    args = ap.parse_args()
    flush = L2Flusher()
    bw = copy_bandwidth(flush=flush)
    bw = bw[0] if isinstance(bw, tuple) else bw
    print(f"copy bandwidth {bw:.0f} GB/s")
    results = []
    for op in args.only.split(","):
        for dt in args.dtypes.split(","):
            for shape in (SUM_SHAPES if op == "sum" else SHAPES):
                gen = sweep_sum(dt, shape, None) if op == "sum" else sweep_rows(op, dt, shape, None)
                best = None
                for label, fn, nbytes, check in gen:
                    fn()
                    err = check()
                    if not err <= 2e-2:
                        print(f"  WRONG {op} {dt} {shape} {label}: rel error {err:.3g}", flush=True)
                        continue
                    ms = time_gpu(fn, repeats=15, warmup=2, flush=flush).median_ms
                    pct = nbytes / (ms * 1e-3) / 1e9 / bw * 100
                    results.append(dict(op=op, dtype=dt, shape=list(shape), config=label, ms=ms, pct=pct))
                    if best is None or ms < best[1]:
                        best = (label, ms, pct)
                print(f"{op:10s} {dt:9s} {shape[0]}x{shape[1]:<7d} best {best[0]:34s} {best[1]:.4f} ms {best[2]:5.1f}%",
                      flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"copy_bw": bw, "results": results}, fh, indent=0)


if __name__ == "__main__":
    main()
