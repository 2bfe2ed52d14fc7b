"""FP8 against PyTorch on one GPU: ``cupyops.ops.fp8.scaled_matmul`` (e4m3 -> bfloat16, per-tensor
scales) against ``torch._scaled_mm`` on the same operands (a row-major, b the transposed
view of an N x K weight, what _scaled_mm requires), and ``cupyops.quantize_fp8`` against
the bytes it must move. Validated on sampled rows against the float64 reference first.

    python benchmarks/fp8_probe.py [--json PATH] [--shapes MxNxK,...] [--configs all|128x192,...]
        [--interleave ROUNDS]

--interleave: instead of timing torch, then each configuration in turn (the second of two
rounds kept), time them all with their calls interleaved (``time_gpu_interleaved``), ROUNDS
times, a line per configuration and round: an A/B of tiles that the GPU's drift over a
sweep does not decide (quantize_fp8 is left out). A configuration's ``@gN`` suffix walks the
tiles in groups of N tile rows (``_fp8_gemm.GROUP_ROWS``).
"""
import argparse
import json

import cupy as cp
import numpy as np
import torch

import cupyops
from cupyops.ops import _fp8_gemm, fp8
from cupyops import _dtypes, reference
from cupyops.bench.timing import L2Flusher, copy_ms_for, time_gpu, time_gpu_interleaved

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 6144, 4096), (4096, 28672, 4096), (4096, 4096, 14336)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--shapes")
    ap.add_argument("--configs", default="auto",
                    help=f"scaled_matmul tiles, comma list or 'all' ({', '.join(_fp8_gemm.TILES)}; auto: the "
                         f"launcher's pick)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS")
    args = ap.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")] if args.shapes else SHAPES
    configs = list(_fp8_gemm.TILES) if args.configs == "all" else args.configs.split(",")
    default = _fp8_gemm.DEFAULT_CONFIG
    flush = L2Flusher()
    rows = []
    for M, N, K in dict.fromkeys(shapes):
        x = torch.randn(M, K, device="cuda")
        w = torch.randn(N, K, device="cuda")
        sa, sb = x.abs().max() / 448, w.abs().max() / 448
        a8 = (x / sa).to(torch.float8_e4m3fn)
        w8 = (w / sb).to(torch.float8_e4m3fn)
        sa32, sb32 = sa.float().reshape(()), sb.float().reshape(())
        a = cp.from_dlpack(a8.view(torch.uint8))
        b = cp.from_dlpack(w8.view(torch.uint8)).T  # K x N, K-major: no copy
        # both sides read the per-tensor scales from device memory: no host sync a call
        dsa, dsb = cp.from_dlpack(sa32), cp.from_dlpack(sb32)
        ours = lambda: fp8.scaled_matmul(a, b, dsa, dsb, out_dtype="bfloat16")  # noqa: E731
        theirs = lambda: torch._scaled_mm(a8, w8.t(), scale_a=sa32, scale_b=sb32, out_dtype=torch.bfloat16)  # noqa: E731
        check = np.unique(np.linspace(0, M - 1, 16).round().astype(np.int64))
        ref = reference.scaled_matmul(a[check].get(), b.get(), float(sa32), float(sb32))
        t_err = reference.rel_error(theirs()[check].float().cpu().numpy(), ref)
        fl = 2 * M * N * K
        if args.interleave:
            rows += interleaved(args, configs, ours, theirs, (M, N, K), check, ref, flush)
            continue
        for round_ in range(2):  # keep the second round: the first brings the clocks up from an idle GPU
            tms = time_gpu(theirs, repeats=args.repeats, warmup=3, flush=flush).median_ms
            for config in configs:
                _fp8_gemm.DEFAULT_CONFIG = None if config == "auto" else config  # (the launch memo is keyed by config)
                try:
                    err = reference.rel_error(ours()[check].astype(cp.float32).get(), ref)
                    ms = time_gpu(ours, repeats=args.repeats, warmup=3, flush=flush).median_ms
                finally:
                    _fp8_gemm.DEFAULT_CONFIG = default
                if round_ == 0:
                    continue
                if config == "auto":
                    config = f"auto={_fp8_gemm.pick_config(M, N, cp.cuda.Device().attributes['MultiProcessorCount'])}"
                rows.append({"op": "scaled_matmul", "shape": [M, N, K], "config": config, "ms": ms,
                             "torch_ms": tms, "ratio": tms / ms, "tflops": fl / ms / 1e9,
                             "torch_tflops": fl / tms / 1e9, "rel_error": err, "torch_rel_error": t_err})
                print(f"scaled_matmul e4m3->bf16 {M}x{N}x{K} {config}: {ms:.4f} ms {fl / ms / 1e9:6.1f} TFLOP/s | "
                      f"torch._scaled_mm {tms:.4f} ms {fl / tms / 1e9:6.1f} | {tms / ms:.2f}x | err {err:.2e} "
                      f"(torch {t_err:.2e})", flush=True)
    for shape, axis in () if args.interleave else (((16384, 8192), None), ((16384, 8192), -1)):
        for dt in (_dtypes.to_dtype("bfloat16"), np.float32):
            xs = cp.random.standard_normal(shape, dtype=cp.float32).astype(dt)
            ms = time_gpu(lambda: cupyops.quantize_fp8(xs, axis=axis), repeats=args.repeats, warmup=3,
                          flush=flush).median_ms
            moved = xs.nbytes * (2 if axis is None else 1) + xs.size  # per tensor: an amax pass, then the cast
            line = copy_ms_for(moved, flush=flush)  # the same bytes as one device copy
            rows.append({"op": "quantize_fp8", "shape": list(shape), "dtype": np.dtype(dt).name, "axis": axis,
                         "ms": ms, "copy_line_ms": line})
            print(f"quantize_fp8 {np.dtype(dt).name} {shape} axis={axis}: {ms:.4f} ms, bytes at copy bandwidth "
                  f"{line:.4f} ms ({line / ms:.0%})", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=0)


def interleaved(args, configs, ours, theirs, shape, check, ref, flush):
    """--interleave: every configuration checked on the sampled rows, then timed with torch
    in interleaved calls, ``args.interleave`` rounds; the rows of the JSON."""
    M, N, K = shape
    fl = 2 * M * N * K

    def run(config):
        name, _, group = config.partition("@g")  # (auto@g8: the walk in groups of 8 tile rows)
        _fp8_gemm.DEFAULT_CONFIG = None if name == "auto" else name  # (the launch memo is keyed by config)
        _fp8_gemm.GROUP_ROWS = int(group) if group else rows_default
        return ours()

    calls, rows, default, rows_default = {"torch": theirs}, [], _fp8_gemm.DEFAULT_CONFIG, _fp8_gemm.GROUP_ROWS
    for config in configs:
        err = reference.rel_error(run(config)[check].astype(cp.float32).get(), ref)
        if not err <= reference.TOLERANCE["scaled_matmul"]["bfloat16"]:
            print(f"WRONG {M}x{N}x{K} {config}: rel error {err:.3g}", flush=True)
            continue
        calls[config] = lambda c=config: run(c)
    try:
        for r in range(args.interleave):
            t = {n: v.median_ms for n, v in time_gpu_interleaved(calls, repeats=args.repeats, flush=flush).items()}
            for config in calls:
                if config == "torch":
                    continue
                rows.append({"op": "scaled_matmul", "shape": [M, N, K], "config": config, "round": r,
                             "ms": t[config], "torch_ms": t["torch"], "ratio": t["torch"] / t[config]})
                print(f"scaled_matmul e4m3->bf16 {M}x{N}x{K} {config} r{r}: {t[config]:.4f} ms "
                      f"{fl / t[config] / 1e9:6.1f} TFLOP/s | torch._scaled_mm {t['torch']:.4f} ms | "
                      f"{t['torch'] / t[config]:.3f}x", flush=True)
    finally:
        _fp8_gemm.DEFAULT_CONFIG, _fp8_gemm.GROUP_ROWS = default, rows_default
    return rows


if __name__ == "__main__":
    main()
