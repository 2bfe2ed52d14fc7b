"""One attention call of a cupyops rung and of PyTorch SDPA's cuDNN backend, inside a
profiler range, for Nsight Compute (issue 17: where flash3 loses to cuDNN):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section WarpStateStats --section SourceCounters \
        python3 benchmarks/attention_profile.py [dtype] [impl] [B] [H] [S] [D] [causal]

Defaults: bfloat16, flash3, B4 H16 S4096 D128, no mask ("bshd" tensors, the layout SDPA
gets as a transposed view). It prints the event times of both calls
(timing.time_then_profile), then runs each once inside the profiler range."""
import sys

import cupyops
from cupyops.bench.runners import random_normal
from cupyops.bench.timing import L2Flusher, time_then_profile

args = sys.argv[1:]
dtype = args[0] if len(args) > 0 else "bfloat16"
impl = args[1] if len(args) > 1 else "flash3"
B, H, S, D = (int(v) for v in args[2:6]) if len(args) > 5 else (4, 16, 4096, 128)
causal = len(args) > 6 and args[6] in ("1", "causal", "true", "True")
q, k, v = (random_normal((B, S, H, D), dtype, seed) for seed in (1, 2, 3))
calls = {f"cupyops {impl}": lambda: cupyops.attention(q, k, v, causal=causal, layout="bshd", impl=impl)}
try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tq, tk, tv = (torch.from_dlpack(x).transpose(1, 2) for x in (q, k, v))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    calls["sdpa cudnn"] = cudnn
except ImportError:
    pass
pairs = S * (S + 1) // 2 if causal else S * S
flops = 4.0 * B * H * D * pairs
for name, ms in time_then_profile(calls, flush=L2Flusher(), repeats=10).items():
    print(f"{name:16s} {dtype} B{B} H{H} S{S} D{D} causal={causal}: {ms:8.4f} ms "
          f"{flops / ms / 1e9:7.1f} TFLOP/s (events)", flush=True)
