"""softmax over one axis (kernels/softmax.cu). The last axis is the fast path; another axis
is moved last (one copy each way)."""

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _launch
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


# Steady-state fast path for the common call softmax(cupy_array) (last axis, no out=): a
# (type, shape, dtype, axis, impl, device) that passed every check once maps to its fast
# call (_rows.fast_rows: C-contiguous inputs; the checked path copies the others).
_FAST = _rows.FastCalls()


def _fast_key(x, axis, impl):
    """``_FAST``'s key of a call (x of any kind), or None when the call cannot take it. The
    lookup and the store both build it here; it is most of a repeated call's Python work."""
    if type(axis) is not int or type(impl) is not str:
        return None
    try:
        return (type(x), x.shape, x.dtype, axis, impl, _arrays.current_device_or_none())
    except AttributeError:  # not an array: the checked path says what is wrong
        return None


@foreign_arrays()
def softmax(x, axis=-1, out=None, *, impl="auto"):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``; float32, float16, bfloat16 with
    float32 math. A row of all -inf gives NaN, as in NumPy."""
    axis_arg = axis
    if out is None:
        fast = _FAST.find(_fast_key(x, axis, impl))
        if fast is not None:
            y = fast(x)
            if y is not None:
                return y
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
            # only a C-contiguous CuPy input (xd is x) would take the fast path next time; CuPy
            # is loaded now, so the key holds the device
            if xd is x and out is None:
                _FAST.remember(_fast_key(x, axis_arg, impl), lambda: _fast_call(impl, x.shape, x.dtype, dt))
        else:
            xt = cp.ascontiguousarray(cp.moveaxis(xd, axis, -1))
            yt = cp.empty_like(xt)
            softmax_rows(impl, xt, yt, dt)
            y[...] = cp.moveaxis(yt, -1, axis)
    return _arrays.finish(y, out, call)


def _fast_call(impl, shape, dtype, dt):
    """softmax of a C-contiguous CuPy array of this shape and dtype whose checks already
    passed (_rows.fast_rows), or None for another layout (the caller takes the checked
    path)."""
    return _rows.fast_rows(_plan(impl, shape[-1], dt), shape, dtype, ("x", "out"))


def _plan(impl, n, dt):
    return _rows.plan(KERNELS, "softmax", impl, n, dt, "online", simple_block=256 if impl == "naive" else 512)


def softmax_rows(impl, xd, y, dt):
    """Softmax of the rows of contiguous ``xd`` (last axis) into contiguous ``y``."""
    n = xd.shape[-1]
    rows = xd.size // n
    p = _plan(impl, n, dt)
    p.launch(rows, (xd, y, *_rows.shape_args(rows, n)), _launch.rows_aligned(16 // xd.itemsize, n, xd, y))
