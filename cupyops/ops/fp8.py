"""scaled_matmul and quantize_fp8: the float8 (e4m3) GEMM on Hopper and the quantizer that
feeds it (kernels/gemm_fp8.cu, kernels/quantize.cu).

Float8 arrays: CuPy has no float8 dtype of its own, so an e4m3 operand is a ``uint8``
array holding the e4m3 bit patterns, which is what ``quantize_fp8`` returns (from PyTorch:
``t.view(torch.uint8)``; from ml_dtypes: ``x.view(numpy.uint8)``). An array whose dtype is
``ml_dtypes.float8_e4m3fn`` is accepted as well and read through a ``uint8`` view of the
same bytes: NumPy arrays always, CuPy arrays where the installed CuPy can hold that dtype
(otherwise a TypeError says to pass the uint8 view). e5m2 is not supported.

This module owns the semantics and every argument check (before anything touches a GPU);
cupyops/ops/_fp8_gemm.py and _fp8_quantize.py pick the launch geometry.

Status: ``quantize_fp8`` passed its GPU tests on an H100 and is exported as
``cupyops.quantize_fp8``. ``scaled_matmul``'s kernel (gemm_fp8.cu) compiles for sm_90a but
has not yet run its GPU tests (benchmarks/NOTES.md item 56): until it has, it is reached
here, as ``cupyops.ops.fp8.scaled_matmul``, and not from the package's namespace.
"""
import math
import numbers

import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _launch
from . import _fp8_gemm, _fp8_quantize

E4M3_MAX = 448.0  # the largest finite float8 e4m3 value
FP8_TYPES = ("uint8", "float8_e4m3fn")
OUT_TYPES = _fp8_gemm.OUT_TYPES
_F32_MAX = float(np.finfo(np.float32).max)

VARIANTS = {
    "scaled_matmul": dict(_fp8_gemm.VARIANTS),
    "quantize_fp8": dict(_fp8_quantize.VARIANTS),
}
KERNEL_FILES = [_fp8_quantize.KERNELS, _fp8_gemm.KERNELS]


# ------------------------------------------------------------------------- public API
@foreign_arrays()
def scaled_matmul(a, b, scale_a, scale_b, *, out_dtype="bfloat16", bias=None, out=None, impl="auto"):
    """``(a @ b) * scale_a * scale_b (+ bias)`` for float8 e4m3 ``a`` [M, K] and ``b``
    [K, N], as ``torch._scaled_mm``: the product of the dequantised operands
    ``(a * scale_a) @ (b * scale_b)``, accumulated in float32, the bias added, then rounded
    once to ``out_dtype`` (``"bfloat16"``, ``"float16"`` or ``"float32"``; a dtype works too).

    ``a``, ``b``: ``uint8`` arrays of e4m3 bits (or ``float8_e4m3fn`` arrays, see the module
    docstring). The kernel reads both K-major: ``a`` as stored rows of K (row-major), ``b``
    as the transposed view of an N x K array (``w.T``, an LLM weight as ``x @ w.T``; what
    ``torch._scaled_mm`` calls column-major b). A ``b`` given row-major K x N is first copied
    to K-major (``cupy.ascontiguousarray(b.T)``: N x K more bytes moved, and an allocation);
    so is any operand that is not K-contiguous, not 16-byte aligned or whose rows are not a
    multiple of 16 bytes apart. K must be a multiple of 16: a tensor map's row stride is a
    multiple of 16 bytes (pad K with zeros otherwise).

    ``scale_a``: a float32 per-tensor scale (a Python or NumPy number, or a float32 array of
    one element) or one per row of ``a``: a float32 array of shape [M] or [M, 1].
    ``scale_b``: per tensor likewise, or one per column of ``b``: [N] or [1, N].
    ``bias``: [N], ``out_dtype`` or float32. ``out``: [M, N] of ``out_dtype``, C-contiguous.

    Runs on a compute-capability 9.0 GPU (H100, H200) alone: there is no fallback kernel for
    other GPUs, and calling it there raises NotImplementedError (a RuntimeError) naming the
    GPU (ValueError naming ``impl`` when a rung was asked for by name). NumPy arrays in
    give NumPy out (through the device)."""
    a = _fp8_bits(a, "a")
    b = _fp8_bits(b, "b")
    for x, name in ((a, "a"), (b, "b")):
        _arrays.check_ndim(x, name, ndim=2)
    if _arrays.is_cupy(b) != _arrays.is_cupy(a):
        raise TypeError("b: must live where a does (both CuPy or both NumPy arrays)")
    M, K = a.shape
    Kb, N = b.shape
    if Kb != K:
        raise ValueError(f"b: inner dimensions do not match: a is {M}x{K} and b is {Kb}x{N}")
    if K % 16:
        raise ValueError(f"a: K = {K} is not a multiple of 16: the operands' rows must be a multiple of 16 "
                         f"bytes for the tensor copies (pad K with zeros)")
    for v, name in ((M, "a"), (N, "b"), (K, "a")):
        if v > 2**31 - 256:  # (the kernel rounds M, N and K up to a tile in 32-bit ints)
            raise ValueError(f"{name}: a dimension of {v} is more than the kernel's 32-bit indices address")
    sa = _scale(scale_a, "scale_a", a, M, ((M,), (M, 1)))
    sb = _scale(scale_b, "scale_b", a, N, ((N,), (1, N)))
    dout = _out_dtype(out_dtype)
    out_dt = _dtypes.to_dtype(dout)
    bias_kind = _fp8_gemm.BIAS_NONE
    if bias is not None:
        bias = _arrays.as_input(bias, "bias")
        if _arrays.is_cupy(bias) != _arrays.is_cupy(a):
            raise TypeError("bias: must live where a does (both CuPy or both NumPy arrays)")
        bdt = _arrays.check_dtype(bias, "bias", tuple(dict.fromkeys((dout, "float32"))))
        if tuple(bias.shape) != (N,):
            raise ValueError(f"bias: expected shape ({N},), got {tuple(bias.shape)}")
        bias_kind = _fp8_gemm.BIAS_F32 if bdt == "float32" else _fp8_gemm.BIAS_OUT
    _arrays.check_impl(impl, VARIANTS["scaled_matmul"], "scaled_matmul")
    out = _arrays.check_out(out, a, (M, N), out_dt)
    if out is not None and _arrays.is_cupy(out) and out.size:
        for x, name in ((b, "b"), (sa[0], "scale_a"), (sb[0], "scale_b"), (bias, "bias")):
            if _arrays.is_cupy(x) and _arrays._shares_memory_with(out, x):
                raise ValueError(f"out: must not overlap the input {name}")

    call = None if _arrays.is_cupy(a) else _arrays.HostCall()
    cp = _arrays.cupy_module()
    if M == 0 or N == 0:
        return _arrays.finish(_arrays.device_out(out, call, (M, N), out_dt), out, call)
    props = _launch.device_props()
    why = _fp8_gemm.gpu_error(props)
    if why is not None:
        if impl == "auto":  # no fallback kernel: NotImplementedError (a RuntimeError)
            raise NotImplementedError(f"scaled_matmul: {why}")
        raise ValueError(f"impl: {impl!r}: {why}")
    impl = "wgmma_ws" if impl == "auto" else impl
    y = _arrays.device_out(out, call, (M, N), out_dt)
    bias_d = None if bias is None else cp.ascontiguousarray(_arrays.to_device(bias, call))
    if K == 0:  # an empty sum: the bias alone (no tensor map describes a K of 0)
        y.fill(0)
        if bias_d is not None:
            y[...] = bias_d.astype(out_dt)
        return _arrays.finish(y, out, call)
    # both operands stored rows x K: a itself, b through its transposed view
    a_st, b_st = a, b.T
    if call is not None:
        a_st, b_st = _arrays.to_device(a_st, call), _arrays.to_device(b_st, call)
    A, lda = _k_major(a_st)
    B, ldb = _k_major(b_st)
    p = _fp8_gemm.Fp8Problem(M, N, K, A, B, lda, ldb, y, dout, bias=bias_d, bias_kind=bias_kind)
    p.scale_a, p.sa_step, p.sa0 = _scale_args(sa, call, cp)
    p.scale_b, p.sb_step, p.sb0 = _scale_args(sb, call, cp)
    _fp8_gemm.launch(impl, p)
    return _arrays.finish(y, out, call)


@foreign_arrays(fp8_results=(0,))
def quantize_fp8(x, *, scale=None, axis=None, impl="auto"):
    """Quantise ``x`` (float32, float16 or bfloat16) to float8 e4m3: returns ``(q, scale)``
    with ``q = e4m3(x / scale)`` as ``uint8`` bits of x's shape and ``scale`` float32, so that
    ``q * scale`` dequantises (``scaled_matmul``'s scale_a / scale_b).

    The cast saturates: ``|x / scale|`` beyond 448 (e4m3's largest finite value) gives +-448,
    NaN stays NaN, the rest rounds to nearest even; ``x / scale`` is the correctly rounded
    float32 quotient.

    ``scale=None``: found from the data, ``amax / 448`` with amax the largest ``|x|`` (NaN
    ignored), of the whole tensor (``axis=None``: ``scale`` has shape ()) or of each row
    (``axis=-1``, the last axis: ``scale`` has shape ``x.shape[:-1]``, [rows] for 2-D x). An
    amax of 0 gives scale 1. (CuPy compiles with -ftz: float32 subnormal inputs count as 0.)

    A given ``scale`` is used as it is: with ``axis=None`` a positive number or a float32
    array of one element; with ``axis=-1`` a float32 array of shape ``x.shape[:-1]`` (or
    ``x.shape[:-1] + (1,)``). It is returned as a float32 array of the shape above (a view of
    a given device array). Device scales are not checked: a zero scale gives +-448 (0 / 0:
    NaN).

    A non-contiguous ``x`` is copied first. NumPy arrays in give NumPy out."""
    x = _arrays.as_input(x, "x")
    dt = _arrays.check_dtype(x, "x", _fp8_quantize.DTYPES)
    per_row = _row_axis(axis, x.ndim)
    rows_shape = tuple(x.shape[:-1]) if per_row else ()
    given = _given_scale(scale, x, per_row, rows_shape)
    _arrays.check_impl(impl, VARIANTS["quantize_fp8"], "quantize_fp8")

    call = None if _arrays.is_cupy(x) else _arrays.HostCall()
    cp = _arrays.cupy_module()
    q = cp.empty(x.shape, np.uint8)
    if given is None:
        s = cp.empty(rows_shape, np.float32)
    elif isinstance(given, float):
        s = cp.full(rows_shape, given, np.float32)
    else:
        s = cp.ascontiguousarray(_arrays.to_device(given, call)).reshape(rows_shape)
    if x.size == 0:
        if given is None:
            s.fill(1)  # the amax of nothing is 0
    else:
        xd = _arrays.to_device(x, call)
        if per_row:
            n = x.shape[-1]
            launches = _fp8_quantize.rows_launches(dt, xd, q, s, x.size // n, n, given is None)
        else:
            launches = _fp8_quantize.tensor_launches(dt, xd, q, s, given is None, _launch.device_props().sm_count,
                                                     lambda P: cp.empty(P, np.float32))
        _fp8_quantize.run(launches)
    return _arrays.finish(q, None, call), _arrays.finish(s, None, call)


# ------------------------------------------------------------------------- checking
def _fp8_bits(x, name):
    """x as an array of e4m3 bits (uint8): a float8_e4m3fn array through a view."""
    x = _arrays.as_input(x, name)
    dt = _dtypes.dtype_name(x.dtype)
    if dt == "uint8":
        return x
    if dt == "float8_e4m3fn":
        try:
            return x.view(np.uint8)
        except Exception as exc:  # an array library that holds the dtype but cannot view it
            raise TypeError(f"{name}: cannot read the float8_e4m3fn array as uint8 bits ({exc}); "
                            f"pass {name}.view(uint8)") from None
    raise TypeError(f"{name}: dtype {dt} is not supported; expected uint8 (float8 e4m3 bits) or float8_e4m3fn")


def _out_dtype(v):
    if isinstance(v, str):
        name = v
    else:
        try:
            name = _dtypes.dtype_name(np.dtype(v))
        except TypeError:
            raise TypeError(f"out_dtype: expected a dtype or its name, got {v!r}") from None
    if name not in OUT_TYPES:
        raise TypeError(f"out_dtype: {name!r} is not supported; expected one of {', '.join(OUT_TYPES)}")
    return name


def _host_scalar(v, name):
    """A host number as the float32 the kernels use; positive is not required here."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a number or a float32 array, got {type(v).__name__}")
    v = float(v)
    if not math.isfinite(v) or abs(v) > _F32_MAX:
        raise ValueError(f"{name}: must be a finite float32 value, got {v}")
    return v


def _scale(s, name, a, length, vector_shapes):
    """scaled_matmul's scale_a / scale_b -> ("scalar", value) or (array, step): step 0 for
    one value in device memory, 1 for a vector of ``length``."""
    if isinstance(s, numbers.Real):
        return ("scalar", _host_scalar(s, name))
    s = _arrays.as_input(s, name)
    if not _arrays.is_cupy(s) and s.size == 1 and s.ndim <= 2:  # a host value: a kernel argument
        if s.dtype.kind not in "fiuV":  # (V: ml_dtypes' bfloat16)
            raise TypeError(f"{name}: expected a real scale, got dtype {_dtypes.dtype_name(s.dtype)}")
        return ("scalar", _host_scalar(s.reshape(()), name))
    if _arrays.is_cupy(s) != _arrays.is_cupy(a):
        raise TypeError(f"{name}: must live where a does (both CuPy or both NumPy arrays)")
    _arrays.check_dtype(s, name, ("float32",))
    shape = tuple(s.shape)
    if s.size == 1 and s.ndim <= 2:
        return (s, 0)
    if shape in vector_shapes:
        return (s, 1)
    accepted = " or ".join(str(v) for v in vector_shapes)
    raise ValueError(f"{name}: expected one float32 scale or one a {'row of a' if name == 'scale_a' else 'column of b'}"
                     f" (shape {accepted}), got shape {shape}")


def _scale_args(spec, call, cp):
    """(device array or None, step, scalar) for the kernel."""
    if isinstance(spec[0], str):  # ("scalar", value); (an array never compares to a str)
        return None, 0, spec[1]
    arr, step = spec
    arr = _arrays.to_device(arr, call)
    return cp.ascontiguousarray(arr.reshape(-1)), step, 1.0


def _k_major(x):
    """(array, row stride in bytes) of a rows x K uint8 device view that a tensor map can
    read: the view itself, or a C-contiguous (hence 16-byte aligned) copy."""
    ld = _fp8_gemm.k_major_ld(x.shape, x.strides, x.data.ptr)
    if ld is not None:
        return x, ld
    return x.copy(order="C"), x.shape[1]


def _row_axis(axis, ndim):
    """quantize_fp8's axis -> per row (True) or per tensor (False)."""
    if axis is None:
        return False
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (numbers.Integral, np.integer)):
        raise TypeError(f"axis: expected None or an integer, got {type(axis).__name__}")
    if ndim == 0:
        raise ValueError("axis: a 0-d x has no axis to quantise along; use axis=None")
    ax = _arrays.normalize_axis(axis, ndim)
    if ax != ndim - 1:
        raise ValueError(f"axis: only the last axis (-1) or None is supported, got {axis} for a {ndim}-D x")
    return True


def _given_scale(scale, x, per_row, rows_shape):
    """quantize_fp8's scale -> None (find it), a float (per tensor), or an array."""
    if scale is None:
        return None
    if isinstance(scale, numbers.Real):
        if per_row:
            raise ValueError(f"scale: axis=-1 takes one scale a row, a float32 array of shape {rows_shape}; "
                             f"got the number {scale!r}")
        v = _host_scalar(scale, "scale")
        if not np.float32(v) > 0:
            raise ValueError(f"scale: must be positive (as a float32), got {v!r}")
        return v
    scale = _arrays.as_input(scale, "scale")
    if _arrays.is_cupy(scale) != _arrays.is_cupy(x):
        raise TypeError("scale: must live where x does (both CuPy or both NumPy arrays)")
    _arrays.check_dtype(scale, "scale", ("float32",))
    shape = tuple(scale.shape)
    if per_row:
        if shape not in (rows_shape, rows_shape + (1,)):
            raise ValueError(f"scale: axis=-1 takes one scale a row, shape {rows_shape} or {rows_shape + (1,)}, "
                             f"got {shape}")
    elif scale.size != 1:
        raise ValueError(f"scale: axis=None takes one scale (an array of one element), got shape {shape}")
    return scale
