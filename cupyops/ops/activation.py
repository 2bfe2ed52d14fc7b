"""silu_and_mul and gelu_and_mul: the gated activations of an LLM's MLP fused with their
multiply (kernels/activation.cu)."""
import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _fast, _launch
from .._kernels import KernelFile, template_name
from . import _rows

_NAIVE = ("block per row, threads striding over it one element at a time (vLLM's original "
          "kernel): one pass, 2- or 4-byte accesses")
_VECTOR = ("16-byte vectors, a vector column of 4 rows a thread with its 8 loads in flight "
           "together; unaligned rows element by element")
VARIANTS = {
    "silu_and_mul": {"naive": _NAIVE, "vector": _VECTOR},
    "gelu_and_mul": {"naive": _NAIVE, "vector": _VECTOR},
}
APPROXIMATIONS = ("none", "tanh")  # gelu_and_mul's approximate=, as torch.nn.functional.gelu's

# The vector rung's block (its kernels' __launch_bounds__) and rows a thread (AND_MUL_UNROLL).
VECTOR_BLOCK = 256
VECTOR_UNROLL = 4


def _kernel(op, rung, t, tanh):
    if op == "silu_and_mul":
        return template_name(f"silu_and_mul_{rung}", t)
    return template_name(f"gelu_and_mul_{rung}", t, int(tanh))


def _expressions():
    names = []
    for d in _dtypes.FLOAT_TYPES:
        t = _dtypes.cuda_type(d)
        for rung in ("naive", "vector"):
            names += [_kernel("silu_and_mul", rung, t, False), _kernel("gelu_and_mul", rung, t, False),
                      _kernel("gelu_and_mul", rung, t, True)]
    return names


KERNELS = KernelFile("activation.cu", _expressions())
KERNEL_FILES = [KERNELS]


# the fast path's signatures (cupyops/_fast.py): x's layout and the options, for calls with no out=
_FAST = {"silu_and_mul": _fast.FastCalls(_fast.Declared(arrays=("x",), options={"impl": str}, fixed=("out",))),
         "gelu_and_mul": _fast.FastCalls(_fast.Declared(arrays=("x",), options={"approximate": str, "impl": str},
                                                        fixed=("out",)))}


@foreign_arrays(fast=_FAST["silu_and_mul"])
def silu_and_mul(x, *, out=None, impl="auto"):
    """``silu(a) * b`` for ``x = [a | b]`` split in halves along the last axis: x
    ``[..., 2d]`` -> ``[..., d]``, as vLLM's ``SiluAndMul`` and the PyTorch composition
    ``F.silu(x[..., :d]) * x[..., d:]`` (SwiGLU's gate). silu(a) = a / (1 + exp(-a)).
    float32, float16, bfloat16; the math is float32, rounded once to the dtype (PyTorch's
    composition rounds silu(a) to the dtype before the multiply: within an ulp of this)."""
    return _act_and_mul("silu_and_mul", x, False, out, impl)


@foreign_arrays(fast=_FAST["gelu_and_mul"])
def gelu_and_mul(x, approximate="none", *, out=None, impl="auto"):
    """``gelu(a) * b`` for ``x = [a | b]`` split in halves along the last axis: x
    ``[..., 2d]`` -> ``[..., d]``, as vLLM's ``GeluAndMul(approximate)`` and the PyTorch
    composition ``F.gelu(x[..., :d], approximate=approximate) * x[..., d:]`` (GeGLU).
    approximate="none": gelu(a) = a/2 (1 + erf(a / sqrt 2)); "tanh": a/2 (1 + tanh(sqrt(2/pi)
    (a + 0.044715 a^3))). The math is float32, rounded once to the dtype."""
    if type(approximate) is not str:
        raise TypeError(f"approximate: expected 'none' or 'tanh', got {type(approximate).__name__}")
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    return _act_and_mul("gelu_and_mul", x, approximate == "tanh", out, impl)


def _act_and_mul(op, x, tanh, out, impl):
    x = _arrays.as_input(x, "x")
    dt = _arrays.check_dtype(x, "x", _dtypes.FLOAT_TYPES)
    _arrays.check_ndim(x, "x", min_ndim=1)
    if x.shape[-1] % 2:
        raise ValueError(f"x: the last axis holds [a | b] and must have an even length, got {x.shape[-1]}")
    d = x.shape[-1] // 2
    shape = tuple(x.shape[:-1]) + (d,)
    out = _arrays.check_out(out, x, shape, x.dtype)
    _arrays.check_impl(impl, VARIANTS[op], op)
    call = None if _arrays.is_cupy(x) else _arrays.HostCall()
    _arrays.cupy_module()
    y = _arrays.device_out(out, call, shape, x.dtype)
    if y.size:
        xd = _arrays.to_device(x, call)
        rows = y.size // d
        launches = _launches(op, impl, dt, tanh, xd, y, rows, d)
        aligned = _launch.rows_aligned(_launch.vec_width(dt), d, xd, y)
        _fast.launch_checked(launches[aligned])
        if out is None and call is None and xd is x:  # the caller's own array: remember the call
            _FAST[op].offer(lambda: _fast.build(launches, (xd,), y))
    return _arrays.finish(y, out, call)


def _launches(op, impl, dt, tanh, xd, y, rows, d):
    """(the launch list for x or y off 16 bytes, the one for both aligned), each
    ``[(fn, grid, block, smem, args)]`` (the aligned one the unaligned where d is not a
    multiple of the vector width)."""
    naive, vector = _plans(op, impl, dt, tanh, rows, d)
    base = (xd, y, *_rows.shape_args(rows, d))
    if naive is not None:
        fn, grid, block = naive
        return ([(fn, grid, block, 0, base)],) * 2
    return tuple([(fn, grid, (VECTOR_BLOCK,), 0, base + tail)] for fn, grid, tail in vector)


_plans_memo = {}


def _plans(op, impl, dt, tanh, rows, d):
    """(naive launch (fn, grid, block) or None, vector launches [(fn, grid, tail) unaligned,
    aligned] or None), memoized per shape and device."""
    key = (op, impl, dt, tanh, rows, d, _arrays.cupy_module().cuda.runtime.getDevice())
    return _launch.memo(_plans_memo, key, lambda: _choose(op, impl, dt, tanh, rows, d))


def _choose(op, impl, dt, tanh, rows, d):
    t = _dtypes.cuda_type(dt)
    if impl == "naive":
        block = min(1024, _launch.cdiv(d, 32) * 32)
        return (KERNELS.function(_kernel(op, "naive", t, tanh)), (rows,), (block,)), None
    fn = KERNELS.function(_kernel(op, "vector", t, tanh))
    vec = _launch.vec_width(dt)
    vector = []
    for aligned in (False, d % vec == 0):
        tx, grid = vector_geometry(rows, d // vec if aligned else d)
        vector.append((fn, (grid,), (np.int32(tx), np.int32(aligned))))
    return None, vector


def vector_geometry(rows, cols):
    """(tx, blocks) of the vector rung over ``rows`` rows of ``cols`` columns (16-byte
    vectors or elements): tx threads of a 256-thread block across the columns, 256 / tx
    rows of VECTOR_UNROLL each down them."""
    tx = min(VECTOR_BLOCK, _launch.pow2_ceil(cols))
    ty = VECTOR_BLOCK // tx
    return tx, _launch.cdiv(cols, tx) * _launch.cdiv(rows, ty * VECTOR_UNROLL)
