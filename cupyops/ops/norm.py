"""layer_norm and rms_norm over the last axis (kernels/norm.cu)."""
import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _launch
from .._kernels import KernelFile, template_name
from . import _rows

VARIANTS = {
    "layer_norm": {
        "twopass": "block per row: mean pass, variance pass, write pass: reads x 3x",
        "welford": "mean and M2 in one pass (Welford per thread, Chan across threads), "
        "then the write pass: reads x 2x",
        "fused": "row in registers, 16-byte loads, statistics from registers: reads x once; "
        "rows too long for one block fall back to welford",
        "cluster": "sm_90: long rows spread over a cluster of up to 8 blocks, (count, mean, M2) "
        "swapped through distributed shared memory: still one read",
        "staged": _rows.STAGED_DOC,
    },
    "rms_norm": {
        "twopass": "block per row: sum-of-squares pass, then the write pass: reads x 2x",
        "fused": "row in registers, 16-byte loads: reads x once; rows too long for one block "
        "fall back to twopass",
        "cluster": "sm_90: long rows spread over a cluster of up to 8 blocks, sums of squares "
        "swapped through distributed shared memory: still one read",
        "staged": _rows.STAGED_DOC,
    },
}


def _expressions():
    names = []
    for d in _dtypes.FLOAT_TYPES:
        t = _dtypes.cuda_type(d)
        names += [template_name(k, t) for k in ("layer_norm_twopass", "layer_norm_welford", "rms_norm_twopass")]
        for vecs in _launch.ROW_VECS[d]:
            for op in ("layer_norm", "rms_norm"):
                names.append(template_name(f"{op}_fused", t, vecs))
                names += [template_name(f"{op}_cluster", t, vecs, cl) for cl in _launch.CLUSTER_SIZES]
        for op in ("layer_norm", "rms_norm"):
            names += [template_name(f"{op}_staged", t, cl) for cl in (1, *_launch.CLUSTER_SIZES)]
    return names


KERNELS = KernelFile("norm.cu", _expressions())
KERNEL_FILES = [KERNELS]


# Steady-state fast path (as softmax's): a call of (x, weight, bias) types, shapes and
# dtypes, eps, impl and device that passed every check once, with C-contiguous CuPy arrays
# and no out= (layer_norm: no return_stats), maps to its fast call (_rows.fast_rows).
_FAST = _rows.FastCalls()


def _sig(a):
    return None if a is None else (type(a), a.shape, a.dtype)


def _fast_key(op, x, weight, bias, eps, impl):
    """``_FAST``'s key of a call (arguments of any kind), or None when it cannot take it."""
    if type(impl) is not str or type(eps) is not float:
        return None
    try:
        return (op, type(x), x.shape, x.dtype, _sig(weight), _sig(bias), eps, impl,
                _arrays.current_device_or_none())
    except AttributeError:  # not arrays: the checked path says what is wrong
        return None


def _fast_call(op, impl, shape, dtype, dt, eps):
    n = shape[-1]
    p = _rows.plan(KERNELS, op, impl, n, dt, "welford" if op == "layer_norm" else "twopass")
    arrays = ("x", "w", "b", "out", "mean", "rstd") if op == "layer_norm" else ("x", "w", "out")
    return _rows.fast_rows(p, shape, dtype, arrays, extra=(np.float32(eps),))


def _take_fast(op, x, weight, bias, eps, impl):
    """The fast call's result, or None (no fast call for this signature, or a layout it
    does not take)."""
    fast = _FAST.find(_fast_key(op, x, weight, bias, eps, impl))
    if fast is None:
        return None
    return fast(x, weight, bias, None, None) if op == "layer_norm" else fast(x, weight)


def _remember(op, x, weight, bias, eps, impl, dt, taken):
    """After a checked launch: memoize the fast call when the launch read the caller's own
    arrays (``taken``: no copies were made) on CuPy's side."""
    if taken:
        _FAST.remember(_fast_key(op, x, weight, bias, eps, impl),
                       lambda: _fast_call(op, impl, x.shape, x.dtype, dt, eps))


def _check(x, weight, bias, eps, out, impl, op):
    x = _arrays.as_input(x, "x")
    dt = _arrays.check_dtype(x, "x", _dtypes.FLOAT_TYPES)
    _arrays.check_ndim(x, "x", min_ndim=1)
    n = x.shape[-1]
    weight = _arrays.check_param(weight, "weight", x, (n,))
    bias = _arrays.check_param(bias, "bias", x, (n,))
    eps = _arrays.check_eps(eps)
    out = _arrays.check_out(out, x, x.shape, x.dtype)
    _arrays.check_impl(impl, VARIANTS[op], op)
    return x, dt, weight, bias, eps, out


@foreign_arrays()
def layer_norm(x, weight=None, bias=None, eps=1e-5, *, return_stats=False, out=None, impl="auto"):
    """LayerNorm over the last axis: ``(x - mean) / sqrt(var + eps) * weight + bias`` with the
    biased variance, as ``torch.nn.functional.layer_norm``. weight and bias have shape
    (n,) and x's dtype. With ``return_stats=True`` returns ``(y, mean, rstd)``, the
    statistics as float32 arrays of shape ``x.shape[:-1]``."""
    if out is None and not return_stats:
        y = _take_fast("layer_norm", x, weight, bias, eps, impl)
        if y is not None:
            return y
    args = (x, weight, bias, eps)
    x, dt, weight, bias, eps, out = _check(x, weight, bias, eps, out, impl, "layer_norm")
    call = None if _arrays.is_cupy(x) else _arrays.HostCall()
    cp = _arrays.cupy_module()
    y = _arrays.device_out(out, call, x.shape, x.dtype)
    mean = rstd = None
    if return_stats:
        mean = cp.empty(x.shape[:-1], np.float32)
        rstd = cp.empty(x.shape[:-1], np.float32)
    n = x.shape[-1]
    if x.size:
        xd = _arrays.to_device(x, call)
        wd = _arrays.to_device(weight, call) if weight is not None else None
        bd = _arrays.to_device(bias, call) if bias is not None else None
        _norm_rows("layer_norm", impl, dt, xd, wd, bd, y, mean, rstd, x.size // n, n, eps)
        if out is None and not return_stats and call is None:
            _remember("layer_norm", *args, impl, dt, xd is x and wd is weight and bd is bias)
    elif return_stats and mean.size:  # rows of length 0: NumPy's mean of nothing is NaN
        mean.fill(np.nan)
        rstd.fill(np.nan)
    y = _arrays.finish(y, out, call)
    if not return_stats:
        return y
    return y, _arrays.finish(mean, None, call), _arrays.finish(rstd, None, call)


@foreign_arrays()
def rms_norm(x, weight=None, eps=1e-6, *, out=None, impl="auto"):
    """RMSNorm over the last axis: ``x / sqrt(mean(x**2) + eps) * weight``, as
    ``torch.nn.functional.rms_norm``."""
    if out is None:
        y = _take_fast("rms_norm", x, weight, None, eps, impl)
        if y is not None:
            return y
    args = (x, weight, None, eps)
    x, dt, weight, _, eps, out = _check(x, weight, None, eps, out, impl, "rms_norm")
    call = None if _arrays.is_cupy(x) else _arrays.HostCall()
    _arrays.cupy_module()
    y = _arrays.device_out(out, call, x.shape, x.dtype)
    n = x.shape[-1]
    if x.size:
        xd = _arrays.to_device(x, call)
        wd = _arrays.to_device(weight, call) if weight is not None else None
        _norm_rows("rms_norm", impl, dt, xd, wd, None, y, None, None, x.size // n, n, eps)
        if out is None and call is None:
            _remember("rms_norm", *args, impl, dt, xd is x and wd is weight)
    return _arrays.finish(y, out, call)


def _p(a):
    return _arrays.NULL_PTR if a is None else a


def _norm_rows(op, impl, dt, xd, wd, bd, y, mean, rstd, rows, n, eps):
    aligned = _launch.rows_aligned(16 // xd.itemsize, n, xd, y, wd, bd)
    eps = np.float32(eps)
    if op == "layer_norm":
        args = (xd, _p(wd), _p(bd), y, _p(mean), _p(rstd), *_rows.shape_args(rows, n), eps)
    else:
        args = (xd, _p(wd), y, *_rows.shape_args(rows, n), eps)
    fallback = "welford" if op == "layer_norm" else "twopass"
    _rows.plan(KERNELS, op, impl, n, dt, fallback).launch(rows, args, aligned)
