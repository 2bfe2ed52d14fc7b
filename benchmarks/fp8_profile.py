"""One e4m3 product of cupyops' scaled_matmul and of torch._scaled_mm (per-tensor scales,
bfloat16 out, use_fast_accum off: the defaults), inside a profiler range, for Nsight
Compute:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section WarpStateStats \
        python3 benchmarks/fp8_profile.py [M] [N] [K]

Defaults: 8192^3. Prints the event times of both calls first (timing.time_then_profile)."""
import sys

import cupy as cp
import torch

from cupyops.bench.timing import L2Flusher, time_then_profile
from cupyops.ops import fp8

M, N, K = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (8192, 8192, 8192)
x, w = torch.randn(M, K, device="cuda"), torch.randn(N, K, device="cuda")
a8, w8 = (x / 8).to(torch.float8_e4m3fn), (w / 8).to(torch.float8_e4m3fn)
one = torch.ones((), device="cuda")
a = cp.from_dlpack(a8.view(torch.uint8))
b = cp.from_dlpack(w8.view(torch.uint8)).T  # K x N, K-major: no copy
calls = {"cupyops scaled_matmul": lambda: fp8.scaled_matmul(a, b, 1.0, 1.0, out_dtype="bfloat16"),
         "torch._scaled_mm": lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)}
flops = 2.0 * M * N * K
for name, ms in time_then_profile(calls, flush=L2Flusher(), repeats=10).items():
    print(f"{name:22s} e4m3 {M}x{N}x{K}: {ms:8.4f} ms {flops / ms / 1e9:7.1f} TFLOP/s (events)", flush=True)
