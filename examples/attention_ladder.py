# %% [markdown]
# # Walking the attention ladder
#
# Open `examples/attention_ladder.ipynb` (or this file, in Jupyter with jupytext or VS Code) on a
# machine with a GPU.
# Causal attention over S tokens does 2 * S * (S + 1) * head_dim flops per head and moves
# only O(S * head_dim) bytes, so it is the tensor cores, not memory, that set the floor.
# Each rung of `cupyops.variants("attention")` removes a reason for missing it: the
# score matrix in memory (naive), the trips to DRAM (tiled), the second sweep (flash_v1),
# the CUDA cores (flash).

# %%
import cupy as cp
import numpy as np

import cupyops
from cupyops import reference
from cupyops.bench.timing import L2Flusher, time_gpu

for name, why in cupyops.variants("attention").items():
    print(f"{name:9s} {why}")

# %% A prefill-sized problem: [batch, len, heads, head_dim] ("bshd"), causal.
B, S, H, D, dtype = 1, 2048, 16, 128, cp.float16
rs = cp.random.RandomState(0)
q, k, v = (rs.standard_normal((B, S, H, D), dtype=cp.float32).astype(dtype) for _ in range(3))
flops = 4 * B * H * D * (S * (S + 1) // 2)  # QK^T and PV over the visible (query, key) pairs
flush = L2Flusher()

# %% Validate every rung against the float64 reference (two heads keep it quick), then time it.
heads = [0, H - 1]
ref = reference.attention(q[:, :, heads].get(), k[:, :, heads].get(), v[:, :, heads].get(), causal=True)
results = {}
for impl in [*cupyops.variants("attention"), "auto"]:
    try:
        o = cupyops.attention(q, k, v, causal=True, impl=impl)
    except (TypeError, ValueError) as exc:  # a rung that does not take this problem says why
        print(f"{impl:9s} skipped: {exc}")
        continue
    err = reference.rel_error(o[:, :, heads].get(), ref)
    ms = time_gpu(lambda: cupyops.attention(q, k, v, causal=True, impl=impl), repeats=10, flush=flush).median_ms
    results[impl] = flops / ms / 1e9
    print(f"{impl:9s} rel err {err:.1e}  {ms:8.3f} ms  {results[impl]:7.1f} TFLOP/s")

# %% The same inputs through PyTorch's scaled_dot_product_attention, when it is installed.
try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tq, tk, tv = (torch.from_dlpack(x).transpose(1, 2) for x in (q, k, v))  # [B, H, S, D] views
    for label, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        with sdpa_kernel(backend):
            fn = lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)  # noqa: E731
            fn()
            ms = time_gpu(fn, repeats=10, flush=flush).median_ms
        results[label] = flops / ms / 1e9
        print(f"{label:10s} {ms:8.3f} ms  {results[label]:7.1f} TFLOP/s")
except Exception as exc:  # noqa: BLE001 - no torch, or a backend that refuses: no baseline
    print(f"no SDPA baseline: {exc}")

# %% A picture of the ladder (matplotlib).
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3))
ax.barh(list(results), list(results.values()))
ax.set_xscale("log")
ax.set_xlabel("TFLOP/s (log scale)")
ax.set_title(f"causal attention B{B} S{S} H{H} D{D} {np.dtype(dtype).name}")
fig.tight_layout()
