"""softmax over one axis (kernels/softmax.cu). The last axis is the fast path; another axis
is moved last (one copy each way)."""
import numpy as np

from .. import _arrays, _dtypes, _launch
from .._kernels import KernelFile, template_name

VARIANTS = {
    "softmax": {
        "naive": "block per row, three passes over memory (max, sum of exp, write): reads x 3x",
        "online": "max and sum in one pass with rescaling, then the write pass: reads x 2x; "
        "16-byte loads; any row length",
        "fused": "row held in registers (warp per short row, block per long row): reads x once, "
        "writes once; rows too long for one block fall back to online",
        "cluster": "sm_90: a row too long for one block spread over a cluster of up to 8 blocks, "
        "(max, sum) swapped through distributed shared memory: still one read, one write",
    }
}


def _expressions():
    names = []
    for d in _dtypes.FLOAT_TYPES:
        t = _dtypes.cuda_type(d)
        names += [template_name("softmax_naive", t), template_name("softmax_online", t)]
        for vecs in _launch.ROW_VECS[d]:
            names.append(template_name("softmax_fused", t, vecs))
            names += [template_name("softmax_cluster", t, vecs, cl) for cl in _launch.CLUSTER_SIZES]
    return names


KERNELS = KernelFile("softmax.cu", _expressions())
KERNEL_FILES = [KERNELS]


def softmax(x, axis=-1, out=None, *, impl="auto"):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``; float32, float16, bfloat16 with
    float32 math. A row of all -inf gives NaN, as in NumPy."""
    x = _arrays.as_input(x, "x")
    dt = _arrays.check_dtype(x, "x", _dtypes.FLOAT_TYPES)
    _arrays.check_ndim(x, "x", min_ndim=1)
    axis = _arrays.normalize_axis(axis, x.ndim)
    out = _arrays.check_out(out, x, x.shape, x.dtype)
    _arrays.check_impl(impl, VARIANTS["softmax"], "softmax")

    call = None if _arrays.is_cupy(x) else _arrays.HostCall()
    cp = _arrays.cupy_module()
    y = _arrays.device_out(out, call, x.shape, x.dtype)
    if x.size:
        xd = _arrays.to_device(x, call)
        if axis == x.ndim - 1:
            softmax_rows(impl, xd, y, dt)
        else:
            xt = cp.ascontiguousarray(cp.moveaxis(xd, axis, -1))
            yt = cp.empty_like(xt)
            softmax_rows(impl, xt, yt, dt)
            y[...] = cp.moveaxis(yt, -1, axis)
    return _arrays.finish(y, out, call)


_plans = {}


class _Plan:
    """How to launch one row length: kernel, block size, rows per block (or blocks per
    row for a cluster), the extra int argument (G or chunk) and whether the kernel takes
    the `aligned` flag."""

    __slots__ = ("fn", "block", "rows_per_block", "cluster", "extra", "takes_aligned")

    def __init__(self, fn, block, rows_per_block=1, cluster=1, extra=None, takes_aligned=True):
        self.fn, self.block, self.rows_per_block = fn, block, rows_per_block
        self.cluster, self.extra, self.takes_aligned = cluster, extra, takes_aligned


def _plan(impl, n, dt):
    """The launch plan for rows of n elements, memoized per device: small calls pay for
    the choice once, not per call."""
    key = (impl, n, dt, _arrays.cupy_module().cuda.runtime.getDevice())
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _choose(impl, n, dt)
    return plan


def _choose(impl, n, dt):
    t = _dtypes.cuda_type(dt)
    if impl in ("auto", "cluster", "fused"):
        plan = _launch.fused_row_plan(n, dt)
        if plan is not None:
            vecs, g = plan
            block = 128 if g == 32 else g
            return _Plan(KERNELS.function(template_name("softmax_fused", t, vecs)), block, block // g, extra=g)
        if impl != "fused" and _launch.device_props().cc >= 90:
            plan = _launch.cluster_row_plan(n, dt)
            if plan is not None:
                vecs, cl, g, chunk = plan
                fn = KERNELS.function(template_name("softmax_cluster", t, vecs, cl))
                return _Plan(fn, g, cluster=cl, extra=chunk)
        impl = "online"
    if impl == "naive":
        return _Plan(KERNELS.function(template_name("softmax_naive", t)), 256, takes_aligned=False)
    return _Plan(KERNELS.function(template_name("softmax_online", t)), 512)


def softmax_rows(impl, xd, y, dt):
    """Softmax of the rows of contiguous ``xd`` (last axis) into contiguous ``y``."""
    n = xd.shape[-1]
    rows = xd.size // n
    p = _plan(impl, n, dt)
    args = (xd, y, np.int64(rows), np.int32(n))
    if p.extra is not None:
        args += (np.int32(p.extra),)
    if p.takes_aligned:
        args += (np.int32(_launch.rows_aligned(16 // xd.itemsize, n, xd, y)),)
    grid = rows * p.cluster if p.cluster > 1 else _launch.cdiv(rows, p.rows_per_block)
    p.fn((grid,), (p.block,), args)
