"""layer_norm and rms_norm over the last axis (kernels/norm.cu)."""
import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _fast, _launch
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
    "add_rms_norm": {
        "twopass": "block per row: add (sum written), then re-read the sum for the write "
        "pass: 5 rows of bytes moved for 4",
        "fused": "x and residual rows in registers, 16-byte loads of both in flight: each "
        "read once, sum and output written once; rows too long for one block fall back to "
        "twopass",
        "staged": "x and residual rows copied to shared memory by cp.async (several short "
        "rows a block, planned as one row of both): bytes in flight bounded by shared "
        "memory, not registers; rows too long to stage go to fused",
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
        names += [template_name("add_rms_norm_twopass", t), template_name("add_rms_norm_staged", t)]
        names += [template_name("add_rms_norm_fused", t, vecs) for vecs in _launch.ROW_VECS[d]]
    return names


KERNELS = KernelFile("norm.cu", _expressions())
KERNEL_FILES = [KERNELS]


def _fast_spec_add_rms_norm(sig, x, residual, weight, eps, inplace, impl, out0, out1):
    """add_rms_norm's fast-path signature: the arrays' layouts, eps, inplace and impl, for
    calls with no out=."""
    if (out0 is not None or out1 is not None or type(eps) is not float or type(inplace) is not bool
            or type(impl) is not str):
        return None
    # in place, x and residual are both written: where they lie against each other is part
    # of the call (the checked path refuses an overlap)
    where = _fast.placement(x, residual) if inplace else None
    return (sig(x), sig(residual), sig(weight), eps, inplace, impl, where), (x, residual, weight)


# the fast path's signatures (cupyops/_fast.py): layer_norm's and rms_norm's, the arrays'
# layouts, eps and impl for calls with no out= or statistics; add_rms_norm's its own
_FAST = {"layer_norm": _fast.FastCalls(_fast.Declared(arrays=("x", "weight", "bias"), fixed=("return_stats", "out"),
                                                      options={"eps": float, "impl": str})),
         "rms_norm": _fast.FastCalls(_fast.Declared(arrays=("x", "weight"), fixed=("out",),
                                                    options={"eps": float, "impl": str})),
         "add_rms_norm": _fast.FastCalls(_fast_spec_add_rms_norm)}


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


@foreign_arrays(fast=_FAST["layer_norm"])
def layer_norm(x, weight=None, bias=None, eps=1e-5, *, return_stats=False, out=None, impl="auto"):
    """LayerNorm over the last axis: ``(x - mean) / sqrt(var + eps) * weight + bias`` with the
    biased variance, as ``torch.nn.functional.layer_norm``. weight and bias have shape
    (n,) and x's dtype. With ``return_stats=True`` returns ``(y, mean, rstd)``, the
    statistics as float32 arrays of shape ``x.shape[:-1]``."""
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
        _norm_rows("layer_norm", impl, dt, xd, wd, bd, y, mean, rstd, x.size // n, n, eps,
                   remember=out is None and not return_stats and call is None
                   and xd is x and wd is weight and bd is bias)
    elif return_stats and mean.size:  # rows of length 0: NumPy's mean of nothing is NaN
        mean.fill(np.nan)
        rstd.fill(np.nan)
    y = _arrays.finish(y, out, call)
    if not return_stats:
        return y
    return y, _arrays.finish(mean, None, call), _arrays.finish(rstd, None, call)


@foreign_arrays(fast=_FAST["rms_norm"])
def rms_norm(x, weight=None, eps=1e-6, *, out=None, impl="auto"):
    """RMSNorm over the last axis: ``x / sqrt(mean(x**2) + eps) * weight``, as
    ``torch.nn.functional.rms_norm``."""
    x, dt, weight, _, eps, out = _check(x, weight, None, eps, out, impl, "rms_norm")
    call = None if _arrays.is_cupy(x) else _arrays.HostCall()
    _arrays.cupy_module()
    y = _arrays.device_out(out, call, x.shape, x.dtype)
    n = x.shape[-1]
    if x.size:
        xd = _arrays.to_device(x, call)
        wd = _arrays.to_device(weight, call) if weight is not None else None
        _norm_rows("rms_norm", impl, dt, xd, wd, None, y, None, None, x.size // n, n, eps,
                   remember=out is None and call is None and xd is x and wd is weight)
    return _arrays.finish(y, out, call)


_p = _arrays.arg_or_null


def _norm_rows(op, impl, dt, xd, wd, bd, y, mean, rstd, rows, n, eps, remember=False):
    """Launch ``op`` over the rows; ``remember``: the launch read the caller's own arrays
    (no copies) into a new output, so the call is offered to the fast path."""
    aligned = _launch.rows_aligned(16 // xd.itemsize, n, xd, y, wd, bd)
    eps = np.float32(eps)
    if op == "layer_norm":
        args = (xd, _p(wd), _p(bd), y, _p(mean), _p(rstd), *_rows.shape_args(rows, n), eps)
    else:
        args = (xd, _p(wd), y, *_rows.shape_args(rows, n), eps)
    fallback = "welford" if op == "layer_norm" else "twopass"
    plan = _rows.plan(KERNELS, op, impl, n, dt, fallback)
    plan.launch(rows, args, aligned)
    if remember:
        inputs = (xd, wd, bd) if op == "layer_norm" else (xd, wd)
        _FAST[op].offer(lambda: _fast.build(plan.fast_variants(rows, n, xd.itemsize, args), inputs, y))


# ------------------------------------------------------------------ add + RMS norm
def add_rms_norm(x, residual, weight, eps=1e-6, *, inplace=False, out=None, impl="auto"):
    """Residual add fused with RMSNorm over the last axis (vLLM's ``fused_add_rms_norm``):
    returns ``(normed, s)`` with ``s = x + residual`` and ``normed = s / sqrt(mean(s**2) +
    eps) * weight``.

    The sum is computed in float32 and rounded to the dtype, and the norm is computed from
    that ROUNDED sum, exactly as the PyTorch composition ``s = x + residual;
    F.rms_norm(s, (n,), weight, eps)`` does, so ``s`` is bit for bit PyTorch's. The
    normalised value times weight is rounded once (vLLM and Hugging Face's LlamaRMSNorm
    round ``s * rstd`` to the dtype before multiplying by weight: within an ulp of this).

    x and residual: the same shape and dtype (float32, float16, bfloat16); weight: shape
    ``(n,)`` and the same dtype, or None. ``inplace=True`` (vLLM's contract): x receives
    ``normed`` and residual receives ``s``, and ``(x, residual)`` are returned; CuPy arrays
    must then be C-contiguous and must not overlap. ``out=(normed_out, s_out)``: two
    C-contiguous arrays of x's shape and dtype to write instead of new ones (not with
    inplace); they are returned."""
    out0, out1 = _arrays.out_pair(out, "normed, sum")
    res = _add_rms_norm(x, residual, weight, eps, inplace, impl, out0, out1)
    if inplace:
        return x, residual
    if out0 is not None:  # (out=(None, None) asks for new arrays, as out=None)
        return out0, out1
    return res[0], res[1]


def _check_add_rms_norm(x, residual, weight, eps, inplace, impl, out0, out1):
    given = (x, residual)
    x = _arrays.as_input(x, "x")
    dt = _arrays.check_dtype(x, "x", _dtypes.FLOAT_TYPES)
    _arrays.check_ndim(x, "x", min_ndim=1)
    residual = _arrays.check_param(residual, "residual", x, x.shape)
    if residual is None:
        raise TypeError("residual: expected an array, got None")
    weight = _arrays.check_param(weight, "weight", x, (x.shape[-1],))
    eps = _arrays.check_eps(eps)
    if type(inplace) is not bool:
        raise TypeError(f"inplace: expected True or False, got {inplace!r}")
    _arrays.check_impl(impl, VARIANTS["add_rms_norm"], "add_rms_norm")
    if inplace and (out0 is not None or out1 is not None):
        raise ValueError("out: not with inplace=True (the results go to x and residual)")
    outs = []
    for name, o in (("out[0]", out0), ("out[1]", out1)):
        o = _arrays.check_out(o, x, x.shape, x.dtype, name=name)
        if o is not None:
            _arrays.check_no_overlap(name, o, [("residual", residual), ("weight", weight), *outs])
            outs.append((name, o))
    if inplace:
        for name, a, g in (("x", x, given[0]), ("residual", residual, given[1])):
            if a is not g:  # (a list made into a new array: the results would go nowhere)
                raise TypeError(f"{name}: inplace=True needs an array to write into, got {type(g).__name__}")
            if _arrays.is_cupy(a) and not a.flags.c_contiguous:
                raise ValueError(f"{name}: must be C-contiguous for inplace=True")
            if not _arrays.is_cupy(a) and not a.flags.writeable:
                raise ValueError(f"{name}: must be writeable for inplace=True")
        _arrays.check_no_overlap("residual", residual, [("x", x)])
        _arrays.check_no_overlap("weight", weight, [("x", x), ("residual", residual)])
    return x, dt, residual, weight, eps, out0, out1


@foreign_arrays(fast=_FAST["add_rms_norm"])
def _add_rms_norm(x, residual, weight, eps, inplace, impl, out0, out1):
    """add_rms_norm on arrays (the public function's arguments, out= as two): returns
    (normed, sum) packed in one new (2, *x.shape) array, or nothing where they went to
    out= or in place."""
    x, dt, residual, weight, eps, out0, out1 = _check_add_rms_norm(x, residual, weight, eps, inplace, impl, out0, out1)
    call = None if _arrays.is_cupy(x) else _arrays.HostCall()
    cp = _arrays.cupy_module()
    n = x.shape[-1]
    xd = _arrays.to_device(x, call)
    rd = _arrays.to_device(residual, call)
    wd = _arrays.to_device(weight, call) if weight is not None else None
    packed = None
    if inplace:
        y, s = xd, rd
    elif out0 is not None:
        y, s = _arrays.device_out(out0, call, x.shape, x.dtype), _arrays.device_out(out1, call, x.shape, x.dtype)
    else:
        packed = cp.empty((2,) + tuple(x.shape), x.dtype)
        y, s = packed, None  # the kernels put the sum after the normed rows
    if x.size:
        rows = x.size // n
        aligned = _launch.rows_aligned(16 // xd.itemsize, n, xd, rd, wd, y, s)
        args = (xd, rd, _p(wd), y, _p(s), *_rows.shape_args(rows, n), np.float32(eps))
        plan = _rows.plan(KERNELS, "add_rms_norm", impl, n, dt, "twopass")
        plan.launch(rows, args, aligned)
        if call is None and xd is x and rd is residual and wd is weight and out0 is None:
            inputs = (xd, rd, wd)
            # in place the launches name only the inputs; the fast call's output is a token
            result = packed if packed is not None else cp.empty((0,), x.dtype)
            _FAST["add_rms_norm"].offer(lambda: _fast.build(plan.fast_variants(rows, n, xd.itemsize, args), inputs,
                                                            result))
            return result
    targets = (x, residual) if inplace else (out0, out1) if out0 is not None else None
    return _arrays.finish_pair(packed, call, (xd, rd) if inplace else (y, s), targets)
