# %% [markdown]
# # Walking the GEMM ladder, on a roofline
#
# Open this as a notebook (`examples/gemm_ladder.ipynb`, or Jupyter / VS Code on this file)
# on a machine with a GPU. A linear layer `x @ w.T` with x of M tokens and a 4096 x 4096
# weight does 2 * M * 4096 * 4096 flops and moves at least the weight, the input and the
# output once: at a few tokens (decode) the bytes set the floor, at thousands (prefill)
# the tensor cores do. A roofline puts both on one plot: attained TFLOP/s against flops
# per byte moved, under the GPU's copy-bandwidth slope and its best measured compute.
# Each rung of `cupyops.variants("matmul")` is a line across the token counts.

# %%
import cupy as cp
import numpy as np

import cupyops
from cupyops import reference
from cupyops.bench.timing import L2Flusher, copy_bandwidth, time_gpu

for name, why in cupyops.variants("matmul").items():
    print(f"{name:9s} {why[:100]}")

# %% The layer and the token counts: from one decode step to a prefill batch.
N = K = 4096
TOKENS = [1, 16, 64, 256, 1024, 4096]
dtype = cp.float16
rs = cp.random.RandomState(0)
w = rs.standard_normal((N, K), dtype=cp.float32).astype(dtype)  # nn.Linear's weight, N x K
flush = L2Flusher()
bw = copy_bandwidth(flush=flush)  # GB/s, bytes read + written, this GPU, now
print(f"copy bandwidth {bw:.0f} GB/s")

# %% Validate each rung on a row sample against the float64 reference, then time it.
RUNGS = [name for name in cupyops.variants("matmul") if name not in ("naive", "tiled", "regblock", "pipelined")]
points = {}  # rung -> [(flops per byte, TFLOP/s)]
for M in TOKENS:
    x = rs.standard_normal((M, K), dtype=cp.float32).astype(dtype)
    rows = np.unique(np.linspace(0, M - 1, 8).round().astype(int))
    ref = reference.gemm(x[rows].get(), w.get(), None, 1.0, 0.0, False, True)
    flops, nbytes = 2 * M * N * K, x.nbytes + w.nbytes + M * N * x.itemsize
    calls = {impl: (lambda impl=impl: cupyops.matmul(x, w.T, impl=impl)) for impl in [*RUNGS, "auto"]}
    calls["cuBLAS"] = lambda: cp.matmul(x, w.T)
    for label, fn in calls.items():
        try:
            y = fn()
        except (TypeError, ValueError) as exc:  # a rung that does not take this problem says why
            print(f"M={M:5d} {label:9s} skipped: {str(exc)[:80]}")
            continue
        err = reference.rel_error(y[rows].get(), ref)
        ms = time_gpu(fn, repeats=10, flush=flush).median_ms
        points.setdefault(label, []).append((flops / nbytes, flops / ms / 1e9))
        print(f"M={M:5d} {label:9s} rel err {err:.1e}  {ms:8.4f} ms  {flops / ms / 1e9:7.1f} TFLOP/s")

# %% The roofline (matplotlib): the copy-bandwidth slope and the best compute measured here.
import matplotlib.pyplot as plt

peak = max(tf for pts in points.values() for _, tf in pts)
ai = np.logspace(-0.5, 3.5, 100)
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.plot(ai, np.minimum(ai * bw / 1e3, peak), color="k", lw=1, label=f"roof: {bw:.0f} GB/s, {peak:.0f} TFLOP/s")
for label, pts in points.items():
    xs, ys = zip(*pts)
    ax.plot(xs, ys, marker="o", lw=1, label=label, **({"color": "k", "ls": "--"} if label == "cuBLAS" else {}))
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("flops per byte moved (x, w, y once)")
ax.set_ylabel("TFLOP/s")
ax.set_title(f"x @ w.T, w {N}x{K} {np.dtype(dtype).name}, M = {TOKENS[0]}..{TOKENS[-1]} tokens")
ax.legend(fontsize=7)
fig.tight_layout()
