# %% [markdown]
# # Walking the softmax ladder
#
# Open `examples/softmax_ladder.ipynb` (or this file, in Jupyter with jupytext or VS Code) on a
# machine with a GPU.
# Softmax of a (rows, n) array must read x once and write y once: that is the floor. Each
# rung of `cupyops.variants("softmax")` removes a reason for missing it.

# %%
import cupy as cp

import cupyops
from cupyops import reference
from cupyops.bench.timing import L2Flusher, copy_bandwidth, time_gpu

for name, why in cupyops.variants("softmax").items():
    print(f"{name:8s} {why}")

# %%
rows, n, dtype = 16384, 8192, cp.float16
x = cp.random.standard_normal((rows, n), dtype=cp.float32).astype(dtype)
flush = L2Flusher()
bw = copy_bandwidth(flush=flush)  # GB/s, bytes read + written, this GPU, now
floor_ms = 2 * x.nbytes / bw / 1e6
print(f"copy bandwidth {bw:.0f} GB/s -> floor {floor_ms:.3f} ms")

# %% Validate every rung against the float64 reference, then time it.
ref = reference.softmax(x[:64])  # a row subset keeps the host reference quick
results = {}
for impl in [*cupyops.variants("softmax"), "auto"]:
    y = cupyops.softmax(x, impl=impl)
    err = reference.rel_error(y[:64], ref)
    ms = time_gpu(lambda: cupyops.softmax(x, impl=impl), repeats=20, flush=flush).median_ms
    results[impl] = ms
    print(f"{impl:8s} rel err {err:.1e}  {ms:.3f} ms  {floor_ms / ms:6.1%} of the floor")

# %% A picture of the ladder (matplotlib).
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3))
ax.barh(list(results), [floor_ms / ms for ms in results.values()])
ax.axvline(1.0, color="k", lw=0.8)
ax.set_xlabel("fraction of the copy-bandwidth floor")
ax.set_title(f"softmax {rows}x{n} {cp.dtype(dtype).name}")
fig.tight_layout()
