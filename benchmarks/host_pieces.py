"""The host-time pieces of a fast call (cupyops/_fast.py) on this machine, microseconds a
call, each the median of 5 rounds as cupyops-bench measures (no GPU work queued but the
launches): the output allocation forms torch and CuPy offer, torch's raw caching-allocator
block, the stream and device queries, and a bare DirectLaunch of a tiny kernel.
    python benchmarks/host_pieces.py
"""
import cupy as cp
import torch

import cupyops
from cupyops import _launch
from cupyops.bench.timing import host_overhead_us
from cupyops.ops import _rows
from cupyops.ops import softmax as sm

x = torch.randn((8, 4096), device="cuda").to(torch.bfloat16)
shape, dev, bf16 = (8, 4096), x.get_device(), torch.bfloat16
stream = torch._C._cuda_getCurrentRawStream(dev)
raw_alloc, raw_delete = torch._C._cuda_cudaCachingAllocator_raw_alloc, torch._C._cuda_cudaCachingAllocator_raw_delete
xc = cp.random.standard_normal(shape, dtype=cp.float32)
cupyops.softmax(xc)
plan = _rows.plan(sm.KERNELS, "softmax", "auto", 4096, "float32", "online")
fn, grid, block, smem, args = plan.launch_spec(8, (xc, xc, *_rows.shape_args(8, 4096)), aligned=True)
direct = _launch.DirectLaunch(fn, grid, block, smem, (_launch.ADDRESS, _launch.ADDRESS, *args[2:]))
y = cp.empty_like(xc)
pieces = {
    "torch.empty(shape, dtype=, device=int)": lambda: torch.empty(shape, dtype=bf16, device=dev),
    "torch.empty(shape, dtype=, device=obj)": lambda: torch.empty(shape, dtype=bf16, device=x.device),
    "x.new_empty(shape)": lambda: x.new_empty(shape),
    "torch.empty_like(x)": lambda: torch.empty_like(x),
    "raw_alloc + raw_delete (64 KiB)": lambda: raw_delete(raw_alloc(65536, stream)),
    "cp.ndarray(shape, float32)": lambda: cp.ndarray(shape, cp.float32),
    "cp.cuda.alloc(64 KiB)": lambda: cp.cuda.alloc(65536),
    "torch._C._cuda_getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(dev),
    "cp.cuda.runtime.getDevice": cp.cuda.runtime.getDevice,
    "cp.cuda.get_current_stream().ptr": lambda: cp.cuda.get_current_stream().ptr,
    "x.data_ptr()": x.data_ptr,
    "(x.shape, x.stride(), x.dtype, x.get_device())": lambda: (x.shape, x.stride(), x.dtype, x.get_device()),
    "(xc.shape, xc.strides, xc.dtype)": lambda: (xc.shape, xc.strides, xc.dtype),
    "DirectLaunch (softmax 8x4096)": lambda: direct(0, (xc.data.ptr, y.data.ptr)),
    "cupyops.softmax(xc)": lambda: cupyops.softmax(xc),
    "torch.softmax(x)": lambda: torch.softmax(x, -1),
}
for name, f in pieces.items():
    print(f"  {name:48s} {host_overhead_us(f, calls=5000):6.2f} us")
