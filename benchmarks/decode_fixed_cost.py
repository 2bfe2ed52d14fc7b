"""The fixed cost of an attention `decode` call against SDPA's cuDNN backend (issue 4): bf16,
q_len 1, Hq 32, Hkv 8, head_dim 128, batch 16 at 64, 512 and 4096 keys and batch 64 at
4096, each timed like the benchmark (CUDA events, median) with the L2 flushed before every
call and with a warm L2. A gap that stays the same from 64 to 4096 keys is per launch, not
per key (NOTES item 41). Two rounds; the first brings the clocks up from idle and is not
printed.

    python benchmarks/decode_fixed_cost.py
"""
import cupy as cp
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import cupyops
from cupyops.bench.timing import L2Flusher, time_gpu

F = torch.nn.functional
SHAPES = ((16, 64), (16, 512), (16, 4096), (64, 4096))  # (B, Skv)
Hq, Hkv, D = 32, 8, 128


def main():
    bf16 = cupyops._dtypes.to_dtype("bfloat16")
    flush = L2Flusher()
    for rnd in range(2):
        for B, Skv in SHAPES:
            q = cp.random.standard_normal((B, 1, Hq, D), dtype=cp.float32).astype(bf16)
            k = cp.random.standard_normal((B, Skv, Hkv, D), dtype=cp.float32).astype(bf16)
            v = cp.random.standard_normal((B, Skv, Hkv, D), dtype=cp.float32).astype(bf16)
            tq, tk, tv = (torch.from_dlpack(a).transpose(1, 2) for a in (q, k, v))
            calls = {"ours": lambda: cupyops.attention(q, k, v, impl="decode"),
                     "cudnn": lambda: F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)}
            us = {}
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # entered once, outside the timing
                for fn in calls.values():
                    fn()
                cp.cuda.runtime.deviceSynchronize()
                for name, fn in calls.items():
                    for warm in (False, True):
                        us[name, warm] = time_gpu(fn, flush=None if warm else flush).median_ms * 1e3
            if rnd:
                line = [f"B{B} kv{Skv}:"]
                for warm, label in ((False, "flushed"), (True, "| warm L2")):
                    o, c = us["ours", warm], us["cudnn", warm]
                    line.append(f"{label} ours {o:7.1f} cudnn {c:7.1f} gap {o - c:5.1f} us")
                print(" ".join(line), flush=True)


if __name__ == "__main__":
    main()
