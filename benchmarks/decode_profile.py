"""One decode call of cupyops and of SDPA's cuDNN and flash backends, inside a profiler
range, for Nsight Compute (issue 4: the decode gap to cuDNN at short KV lengths):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section LaunchStats --section Occupancy python3 benchmarks/decode_profile.py [B] [Skv]

bf16, q_len 1, Hq 32, Hkv 8, head_dim 128 (the issue's decode shapes); defaults B 16,
Skv 4096. It prints the event times of the three calls (timing.time_then_profile), then
runs each once inside the profiler range."""
import sys

import cupy as cp
import torch

import cupyops
from cupyops.bench.timing import L2Flusher, time_then_profile

B = int(sys.argv[1]) if len(sys.argv) > 1 else 16
Skv = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
Hq, Hkv, D = 32, 8, 128
q = cp.random.standard_normal((B, 1, Hq, D), dtype=cp.float32).astype(cupyops._dtypes.to_dtype("bfloat16"))
k = cp.random.standard_normal((B, Skv, Hkv, D), dtype=cp.float32).astype(q.dtype)
v = cp.random.standard_normal((B, Skv, Hkv, D), dtype=cp.float32).astype(q.dtype)
tq, tk, tv = (torch.from_dlpack(a).transpose(1, 2) for a in (q, k, v))
F = torch.nn.functional
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

calls = {"cupyops decode": lambda: cupyops.attention(q, k, v, impl="decode")}
for name, backend in (("sdpa cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa flash", SDPBackend.FLASH_ATTENTION)):
    def call(backend=backend):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
    calls[name] = call
for name, ms in time_then_profile(calls, flush=L2Flusher()).items():
    print(f"{name:16s} {ms * 1e3:8.1f} us (events)", flush=True)
