"""Argument checking, dtype policy, output allocation and the host <-> device bridge.

Every public operator validates *all* of its arguments through these helpers before
anything touches the GPU, so bad input raises a TypeError/ValueError naming the argument
and an ``out=`` array is never half-written. The checks work on NumPy arrays with no CuPy
installed; only ``to_device``/``finish`` need a GPU.
"""
import operator

import numpy as np

from . import _dtypes

try:
    from numpy.exceptions import AxisError, TooHardError
except ImportError:  # numpy < 1.25
    from numpy import AxisError, TooHardError


# A null device pointer as a kernel argument (an absent weight, an unused workspace): CuPy's
# launch does not take None for a pointer in every version.
NULL_PTR = np.uint64(0)


def arg_or_null(a):
    """A kernel argument for an optional array: the array, or a null pointer for None."""
    return NULL_PTR if a is None else a


def is_cupy(a):
    # Looking at the type's module avoids importing CuPy (slow) in the host-only path.
    return type(a).__module__.startswith("cupy")


def as_input(x, name):
    """Return ``x`` as an ndarray (CuPy arrays are kept; anything else goes through NumPy)."""
    if is_cupy(x) or isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x)
    except Exception as exc:  # ragged lists, objects...
        raise TypeError(f"{name}: expected an array, got {type(x).__name__} ({exc})") from None


def check_dtype(x, name, allowed):
    """Return the dtype name of ``x`` or raise TypeError listing what ``name`` accepts."""
    dt = _dtypes.dtype_name(x.dtype)
    if dt not in allowed:
        raise TypeError(f"{name}: dtype {dt} is not supported; expected one of {', '.join(allowed)}")
    return dt


def check_ndim(x, name, ndim=None, min_ndim=None):
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got {x.ndim}-D with shape {x.shape}")
    if min_ndim is not None and x.ndim < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dimension(s), got shape {x.shape}")


def normalize_axis(axis, ndim, name="axis"):
    try:
        axis = operator.index(axis)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(axis).__name__}") from None
    if not -ndim <= axis < ndim:
        raise AxisError(f"{name}: {axis} is out of bounds for an array of dimension {ndim}")
    return axis % ndim


def normalize_axes(axis, ndim, name="axis"):
    """None -> all axes; int or tuple -> sorted tuple of distinct non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        axes = tuple(normalize_axis(a, ndim, name) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"{name}: repeated axis in {axis}")
        return tuple(sorted(axes))
    return (normalize_axis(axis, ndim, name),)


def check_eps(eps, name="eps"):
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a number, got {type(eps).__name__}") from None
    if not eps > 0 or not np.isfinite(eps):
        raise ValueError(f"{name}: must be a finite number > 0, got {eps}")
    return eps


def check_param(p, name, x, shape):
    """An optional per-feature parameter (weight/bias): same dtype family, exact shape."""
    if p is None:
        return None
    p = as_input(p, name)
    if is_cupy(p) != is_cupy(x):
        raise TypeError(f"{name}: must live where x does ({_where(x)} array), got a {_where(p)} array")
    check_dtype(p, name, (x.dtype.name,))
    if tuple(p.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(p.shape)}")
    return p


def check_out(out, x, shape, dtype, name="out"):
    """``out`` must be an array of the same kind as ``x``, C-contiguous, exact shape and dtype."""
    if out is None:
        return None
    if is_cupy(out) != is_cupy(x) or not (is_cupy(out) or isinstance(out, np.ndarray)):
        raise TypeError(f"{name}: expected a {_where(x)} array like the input, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype).name}, got {out.dtype.name}")
    if not out.flags.c_contiguous:
        raise ValueError(f"{name}: must be C-contiguous")
    if is_cupy(out) and out.size and _shares_memory_with(out, x):
        raise ValueError(f"{name}: must not overlap the input")
    return out


def _shares_memory_with(out, x):
    """Whether the byte ranges spanned by two CuPy arrays overlap (strides may be negative:
    data.ptr is the first element, not the lowest address)."""
    (olo, ohi), (xlo, xhi) = _extent(out), _extent(x)
    return olo < xhi and xlo < ohi


def _extent(a):
    lo = hi = a.data.ptr
    for d, s in zip(a.shape, a.strides):
        if d == 0:
            return lo, lo
        if s < 0:
            lo += (d - 1) * s
        else:
            hi += (d - 1) * s
    return lo, hi + a.itemsize


def _where(a):
    return "CuPy" if is_cupy(a) else "NumPy"


def check_impl(impl, table, op):
    if impl != "auto" and impl not in table:
        names = ", ".join(["auto", *table])
        raise ValueError(f"impl: unknown variant {impl!r} for {op}; expected one of {names}")
    return impl


# ----------------------------------------------------------------------------------
# host <-> device
# ----------------------------------------------------------------------------------
class HostCall:
    """What a NumPy-in call must keep until its result is back: pinned staging buffers."""

    __slots__ = ("keep",)

    def __init__(self):
        self.keep = []


def to_device(x, call):
    """CuPy array (contiguous) for ``x``. NumPy input goes through pinned memory on the
    current stream; ``call`` is None for CuPy input and a HostCall otherwise."""
    cp = _cupy()
    if call is None:
        return x if x.flags.c_contiguous else cp.ascontiguousarray(x)
    import cupyx

    pinned = cupyx.empty_pinned(x.shape, x.dtype)
    pinned[...] = x
    call.keep.append(pinned)  # the async copy reads it until the stream gets there
    d = cp.empty(x.shape, x.dtype)
    d.set(pinned, stream=cp.cuda.get_current_stream())
    return d


def finish(y, out, call):
    """Return the result the caller expects: the CuPy array as is, or, for NumPy input,
    the data copied back through pinned memory (this is the only synchronisation)."""
    if call is None:
        return y
    import cupyx

    stream = _cupy().cuda.get_current_stream()
    host = cupyx.empty_pinned(y.shape, y.dtype)
    y.get(stream=stream, out=host, blocking=True)
    call.keep.clear()
    if out is not None:
        out[...] = host
        return out
    return np.array(host, copy=True) if host.ndim else host[()]


def device_out(out, call, shape, dtype):
    """The device array a kernel writes: ``out`` itself for CuPy, else a new pooled array."""
    cp = _cupy()
    if out is not None and call is None:
        return out
    return cp.empty(shape, dtype)


_CUPY = None


def _cupy():
    """Import CuPy and check that a GPU is visible, once; clear error otherwise."""
    global _CUPY
    if _CUPY is not None:
        return _CUPY
    try:
        import cupy
    except ImportError as exc:
        raise RuntimeError(
            "cupyops needs CuPy to run an operator: in a cupyops checkout, pip install \".[cuda13]\" "
            f"(\".[cuda12]\" for a CUDA 12 driver) (import failed: {exc})"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver
        raise RuntimeError(f"cupyops needs a CUDA GPU; none is usable here ({exc})") from None
    if count == 0:
        raise RuntimeError("cupyops needs a CUDA GPU; none is visible")
    from . import _fast

    _fast.cupy_loaded(cupy)
    _CUPY = cupy
    return cupy


def cupy_module():
    return _cupy()


# ------------------------------------------------------------------ ticket counters
_TICKETS = {}


def tickets(n):
    """A zeroed uint32 device array of at least ``n`` counters for the current device and
    stream, for kernels whose last block to finish a piece of work reduces the partials
    of the others ("last block done": a fixed-order reduction, so no float atomics).

    Contract: every kernel that takes it leaves each counter it used back at zero, so the
    next launch on the same stream finds them zeroed without a memset. One array per
    (device, stream): launches on different streams may run at once and never share one.
    """
    cp = cupy_module()
    key = (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr)
    buf = _TICKETS.get(key)
    if buf is None and len(_TICKETS) >= 64:  # programs that make a stream per request
        _TICKETS.clear()  # (pooled memory; a launch in flight keeps its own reference)
    if buf is None or buf.size < n:
        size = 1 << max(10, (int(n) - 1).bit_length())
        buf = cp.zeros(size, dtype=np.uint32)  # on the current stream: ordered before use
        _TICKETS[key] = buf
    return buf


# ------------------------------------------------------------------ two-output operators
def finish_pair(packed, call, results, targets):
    """The end of a two-result operator (add_rms_norm, rope): CuPy in (``call`` None), the
    packed device result; NumPy in, its two device ``results`` copied back into
    ``targets`` (the caller's arrays for inplace, or the out= pair) and None, or, where
    there are no targets, the packed result brought back whole."""
    if call is None:
        return packed
    if targets is not None:
        for r, t in zip(results, targets):
            finish(r, t, call)
        return None
    return finish(packed, None, call)


def out_pair(out, names):
    """``out=`` of an operator with two results: None, or a pair of arrays, returned as two
    values (which the operator then takes as two arguments, so that foreign arrays in the
    pair are converted like any other). ``names``: what the pair holds, for the message."""
    if out is None:
        return None, None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out: expected a pair of arrays ({names}), got {type(out).__name__}")
    if (out[0] is None) != (out[1] is None):
        raise TypeError(f"out: expected a pair of arrays ({names}), got None in it")
    return out[0], out[1]


def check_no_overlap(name, a, others):
    """ValueError naming ``name`` when array ``a`` shares memory with one of ``others``
    ((name, array) pairs; None entries and arrays of the other kind pass)."""
    if a is None or not a.size:
        return
    for other_name, b in others:
        if b is None or not b.size or is_cupy(a) != is_cupy(b):
            continue
        if _shares_elements(a, b) if is_cupy(a) else _host_shares_elements(a, b):
            raise ValueError(f"{name}: must not overlap {other_name}")


def _host_shares_elements(a, b):
    """np.shares_memory with a bound on its work: a problem too hard (or too large) to
    settle counts as an overlap, as for device arrays."""
    try:
        return bool(np.shares_memory(a, b, max_work=10**6))
    except (TooHardError, OverflowError):
        return True


class _Layout:
    """A host array description of a device array's memory (address, shape, byte strides):
    what NumPy's overlap solver needs. NumPy reads no memory through it."""

    def __init__(self, a):
        self.__array_interface__ = {"shape": tuple(a.shape), "typestr": f"|V{a.itemsize}",
                                    "data": (a.data.ptr, True), "strides": tuple(a.strides), "version": 3}


def _shares_elements(a, b):
    """Whether CuPy arrays a and b share an element: byte ranges first (cheap), then, where
    those overlap, NumPy's exact answer on their layouts (q and k as head slices of one
    qkv buffer interleave without sharing any element). A problem too hard to settle
    counts as an overlap."""
    if not _shares_memory_with(a, b):
        return False
    try:
        return bool(np.shares_memory(np.asarray(_Layout(a)), np.asarray(_Layout(b)), max_work=10**6))
    except (TooHardError, OverflowError):
        return True
