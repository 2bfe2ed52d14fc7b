"""Where the host time of a small call goes: CuPy allocation, a bare RawKernel launch,
cupyops.softmax on a (1, 1024) float32 array, and a decode-shaped matmul (1 x 4096 @
4096 x 4096, float16) against cupy.matmul (microseconds per call, steady state; the matmul
calls also run ~15 us of GPU work each, so their host time is what a caller pays when the
GPU is idle). Each figure is the median of 5 rounds, as cupyops-bench measures it."""
import cupy as cp
import numpy as np

import cupyops
from cupyops import _launch
from cupyops.bench.timing import host_overhead_us
from cupyops.ops import _rows
from cupyops.ops import softmax as sm


def per_call(fn, n=3000):
    """Microseconds a call: the benchmark's measure (median of 5 rounds, collector paused)."""
    return host_overhead_us(fn, calls=n, warmup=200)


x = cp.random.standard_normal((1, 1024), dtype=cp.float32)
y = cp.empty_like(x)
cupyops.softmax(x)
plan = _rows.plan(sm.KERNELS, "softmax", "auto", 1024, "float32", "online")
fn, grid, block, smem, args = plan.launch_spec(1, (x, y, *_rows.shape_args(1, 1024)), aligned=True)
direct = _launch.DirectLaunch(fn, grid, block, smem, (_launch.ADDRESS, _launch.ADDRESS, *args[2:]))
stream = cp.cuda.get_current_stream().ptr
rows = {
    "cp.empty((1, 1024))": lambda: cp.empty((1, 1024), cp.float32),
    "cp.ndarray((1, 1024), float32)": lambda: cp.ndarray((1, 1024), cp.float32),
    "bare RawKernel launch": lambda: fn(grid, block, args),
    "DirectLaunch (packed once)": lambda: direct(stream, (x.data.ptr, y.data.ptr)),
    "softmax_rows (plan + launch)": lambda: sm.softmax_rows("auto", x, y, "float32"),
    "cupyops.softmax(x, out=y)": lambda: cupyops.softmax(x, out=y),
    "cupyops.softmax(x)": lambda: cupyops.softmax(x),
}
try:
    import torch

    xt = torch.randn((1, 1024), device="cuda")
    rows["torch.softmax(x, -1)"] = lambda: torch.softmax(xt, -1)
except ImportError:
    pass
for name, fn in rows.items():
    print(f"{name:32s} {per_call(fn):6.2f} us")


# a signature of no call: every call takes the checked path and files nothing
spec, sm._FAST.spec = sm._FAST.spec, lambda *args, **kwargs: None
print(f"{'cupyops.softmax(x), checked path':32s} {per_call(lambda: cupyops.softmax(x)):6.2f} us")
sm._FAST.spec = spec
print(f"{'cupyops.softmax(x) again':32s} {per_call(lambda: cupyops.softmax(x)):6.2f} us")

a = cp.random.standard_normal((1, 4096), dtype=cp.float32).astype(cp.float16)
w = cp.random.standard_normal((4096, 4096), dtype=cp.float32).astype(cp.float16)
cupyops.matmul(a, w)
for name, fn in {"cupyops.matmul 1x4096 @ 4096x4096": lambda: cupyops.matmul(a, w),
                 "cupy.matmul 1x4096 @ 4096x4096": lambda: cp.matmul(a, w)}.items():
    print(f"{name:32s} {per_call(fn, n=500):6.2f} us")

# The pieces of a softmax call (what cupyops/ops/softmax.py and _rows do besides the launch)
from cupyops import _arrays, _dtypes  # noqa: E402

pieces = {
    "cupy.cuda.runtime.getDevice()": cp.cuda.runtime.getDevice,
    "x.flags.c_contiguous": lambda: x.flags.c_contiguous,
    "x.data.ptr": lambda: x.data.ptr,
    "_arrays.is_cupy(x)": lambda: _arrays.is_cupy(x),
    "as_input + check_dtype": lambda: _arrays.check_dtype(_arrays.as_input(x, "x"), "x", _dtypes.FLOAT_TYPES),
    "normalize_axis(-1, 2)": lambda: _arrays.normalize_axis(-1, 2),
    "rows_aligned(4, 1024, x, y)": lambda: _launch.rows_aligned(4, 1024, x, y),
    "_rows.plan (memoized)": lambda: _rows.plan(sm.KERNELS, "softmax", "auto", 1024, "float32", "online"),
    "np.int32(1024)": lambda: np.int32(1024),
}
print("pieces of a softmax call:")
for name, fn in pieces.items():
    print(f"  {name:32s} {per_call(fn, n=20000):6.2f} us")
