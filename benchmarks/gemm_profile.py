"""One product of a cupyops GEMM rung and of cupy.matmul (cuBLAS), inside a profiler range,
for Nsight Compute (issue 3: where the mma.sync and float32 rungs lose to cuBLAS):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section WarpStateStats \
        python3 benchmarks/gemm_profile.py [dtype] [impl] [M] [N] [K]

Defaults: bfloat16, mma, 4096^3 (a @ b, both row-major). Without ncu it prints the
event times of both calls instead."""
import sys

import cupy as cp

import cupyops
from cupyops.bench.runners import random_normal
from cupyops.bench.timing import L2Flusher, time_gpu

dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
impl = sys.argv[2] if len(sys.argv) > 2 else "mma"
M, N, K = (int(v) for v in sys.argv[3:6]) if len(sys.argv) > 5 else (4096, 4096, 4096)
a = random_normal((M, K), dtype, 1)
b = random_normal((K, N), dtype, 2)
calls = {f"cupyops {impl}": lambda: cupyops.matmul(a, b, impl=impl), "cupy.matmul": lambda: cp.matmul(a, b)}
for fn in calls.values():  # compile, pick algorithms, warm up
    fn()
    fn()
cp.cuda.runtime.deviceSynchronize()
flush = L2Flusher()
flops = 2.0 * M * N * K
for rnd in range(2):  # the first round brings the clocks up from idle; the second is reported
    for name, fn in calls.items():
        ms = time_gpu(fn, flush=flush, repeats=10).median_ms
        if rnd:
            print(f"{name:16s} {dtype} {M}x{N}x{K}: {ms:8.4f} ms {flops / ms / 1e9:7.1f} TFLOP/s (events)",
                  flush=True)
cp.cuda.profiler.start()
for fn in calls.values():
    flush()
    fn()
cp.cuda.runtime.deviceSynchronize()
cp.cuda.profiler.stop()
