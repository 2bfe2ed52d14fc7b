"""One product of a cupyops GEMM rung and of cupy.matmul (cuBLAS), inside a profiler range,
for Nsight Compute (issue 3: where the mma.sync and float32 rungs lose to cuBLAS):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section WarpStateStats \
        python3 benchmarks/gemm_profile.py [dtype] [impl] [M] [N] [K]

Defaults: bfloat16, mma, 4096^3 (a @ b, both row-major). It prints the event times of
both calls (timing.time_then_profile), then runs each once inside the profiler range."""
import sys

import cupy as cp

import cupyops
from cupyops.bench.runners import random_normal
from cupyops.bench.timing import L2Flusher, time_then_profile

dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
impl = sys.argv[2] if len(sys.argv) > 2 else "mma"
M, N, K = (int(v) for v in sys.argv[3:6]) if len(sys.argv) > 5 else (4096, 4096, 4096)
a = random_normal((M, K), dtype, 1)
b = random_normal((K, N), dtype, 2)
calls = {f"cupyops {impl}": lambda: cupyops.matmul(a, b, impl=impl), "cupy.matmul": lambda: cp.matmul(a, b)}
flops = 2.0 * M * N * K
for name, ms in time_then_profile(calls, flush=L2Flusher(), repeats=10).items():
    print(f"{name:16s} {dtype} {M}x{N}x{K}: {ms:8.4f} ms {flops / ms / 1e9:7.1f} TFLOP/s (events)", flush=True)
