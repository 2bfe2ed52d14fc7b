"""softmax over one axis (kernels/softmax.cu). The last axis is the fast path; another axis
is moved last (one copy each way)."""

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _fast, _launch
from .._kernels import KernelFile, template_name
from . import _rows

VARIANTS = {
    "softmax": {
        "naive": "block per row, three passes over memory (max, sum of exp, write): reads x 3x",
        "online": "max and sum in one pass with rescaling, then the write pass: reads x 2x; "
        "16-byte loads; any row length",
        "fused": "row held in registers by a group of threads sized to it: reads x once, "
        "writes once; rows too long for one block fall back to online",
        "cluster": "sm_90: a row too long for one block spread over a cluster of up to 8 blocks, "
        "(max, sum) swapped through distributed shared memory: still one read, one write",
        "staged": _rows.STAGED_DOC,
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
        names += [template_name("softmax_staged", t, cl) for cl in (1, *_launch.CLUSTER_SIZES)]
    return names


KERNELS = KernelFile("softmax.cu", _expressions())
KERNEL_FILES = [KERNELS]


# the fast path's signature (cupyops/_fast.py): x's layout, axis and impl, for calls with no out=
_FAST = _fast.FastCalls(_fast.Declared(arrays=("x",), options={"axis": int, "impl": str}, fixed=("out",)))


@foreign_arrays(fast=_FAST)
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
            args = softmax_rows(impl, xd, y, dt)
            if xd is x and out is None:  # the caller's own array was read: remember the call
                rows, n = x.size // x.shape[-1], x.shape[-1]
                _FAST.offer(lambda: _fast.build(_plan(impl, n, dt).fast_variants(rows, n, x.itemsize, args), (x,), y))
        else:
            xt = cp.ascontiguousarray(cp.moveaxis(xd, axis, -1))
            yt = cp.empty_like(xt)
            softmax_rows(impl, xt, yt, dt)
            y[...] = cp.moveaxis(yt, -1, axis)
    return _arrays.finish(y, out, call)


def _plan(impl, n, dt):
    return _rows.plan(KERNELS, "softmax", impl, n, dt, "online", simple_block=256 if impl == "naive" else 512)


def softmax_rows(impl, xd, y, dt):
    """Softmax of the rows of contiguous ``xd`` (last axis) into contiguous ``y``; returns
    the kernel's arguments before the plan's tail."""
    n = xd.shape[-1]
    rows = xd.size // n
    args = (xd, y, *_rows.shape_args(rows, n))
    _plan(impl, n, dt).launch(rows, args, _launch.rows_aligned(16 // xd.itemsize, n, xd, y))
    return args
