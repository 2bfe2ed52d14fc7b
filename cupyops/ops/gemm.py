"""matmul and gemm: the GEMM ladder (kernels/gemm_simt.cu, gemm_mma.cu, gemm_skinny.cu).

    D = alpha * op(A) @ op(B) + beta * C

This module owns the NumPy semantics: argument checks (before any launch), 1-D operands,
broadcast batch dimensions, transposes, ``out=``. It turns every call into launches of
one GemmProblem each (cupyops/ops/_gemm_problem.py) and leaves the launch geometry to the
kernel family's launcher.

No operand is ever copied to transpose it: a row-major matrix, a transposed view
(Fortran order, ``x.T``) and ``trans_a``/``trans_b`` all map onto the kernels' TA/TB
layouts with a leading dimension. Only an operand with no unit stride in its last two
axes (``x[:, ::2]``), a negative stride or a stride that is not a whole number of elements
is made contiguous first; so is a ``c`` that broadcasts along N (a column or a scalar),
which becomes a full M x N (x batch) array. Batch dimensions that
the kernels cannot address with one stride (e.g. a (4, 1) stack against a (1, 3) stack)
become a loop of launches over the outer ones.
"""
import itertools
import math
import numbers

import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _fast, _launch
from . import _gemm_mma, _gemm_simt, _gemm_skinny, _gemm_wgmma
from ._gemm_problem import GemmProblem

GEMM_TYPES = ("float32", "float16", "bfloat16", "int8")
_F32_MAX = float(np.finfo(np.float32).max)
OUT_TYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "int8": "int32"}

_LAUNCHERS = {}
LADDER = {}
for _mod in (_gemm_simt, _gemm_mma, _gemm_wgmma, _gemm_skinny):
    for _impl, _line in _mod.VARIANTS.items():
        _LAUNCHERS[_impl] = _mod
        dts = ", ".join(d for d in GEMM_TYPES if d in _mod.DTYPES[_impl])
        LADDER[_impl] = f"[{dts}] {_line}"
VARIANTS = {"matmul": LADDER, "gemm": LADDER}
KERNEL_FILES = [_gemm_simt.KERNELS, _gemm_mma.KERNELS, _gemm_wgmma.KERNELS, _gemm_skinny.KERNELS]


def dtypes_of(impl):
    return tuple(d for d in GEMM_TYPES if d in _LAUNCHERS[impl].DTYPES[impl])


def auto_impl(dtype, M, N, K, hopper_sms=0, single=True):
    """The rung ``impl="auto"`` runs: for decode-like M (the product is a stream over B)
    float16 / bfloat16 run ``mma``, which splits K when its tiles are few
    (_gemm_mma.split_plan), float32 and int8 the skinny split-K kernel; otherwise the top
    rung of the dtype: for float16 / bfloat16 on a GPU of ``hopper_sms`` SMs that runs the
    sm_90a rungs (0: the GPU does not) ``wgmma_ws``, except where ``mma`` would split K
    (a ``single`` product with few tiles: wgmma_ws has no split-K, and those mid-sized M
    are not measured yet); elsewhere ``mma``. Measured on an H100 (benchmarks/gemm_sweep.py --only
    skinny,mma_decode; results/h100-gemm-sweep-decode*.txt), fp16/bf16 against cuBLAS:
    1x4096x4096 mma 0.81-0.86x, skinny 0.78-0.79x; 16x4096x4096 0.81-0.91x against
    0.66-0.68x; 1x11008x4096 0.96-0.97x against 0.86-0.87x; 64x4096x4096 0.73-0.75x
    against 0.31-0.33x."""
    if M <= _gemm_skinny.MAX_M:
        return "mma" if dtype in ("float16", "bfloat16") else "skinny"
    if dtype == "float32":
        return "pipelined"
    if (hopper_sms and dtype in _gemm_wgmma.DTYPES["wgmma_ws"]
            and not (single and _gemm_mma.splits_k(dtype, M, N, K, 1, hopper_sms))):
        return "wgmma_ws"
    return "mma"


def _wgmma_props():
    """The current GPU's properties where it runs the sm_90a rungs, else None. (Without
    CuPy or a GPU: CuPy's error, which says what is missing.)"""
    _arrays.cupy_module()
    props = _launch.device_props()
    return props if _gemm_wgmma.runs_here(props) else None


# ------------------------------------------------------------------------- public API
# the fast path's signature (cupyops/_fast.py): the operands' layouts and impl, for calls with no out=
_FAST = _fast.FastCalls(_fast.Declared(arrays=("a", "b"), options={"impl": str}, fixed=("out",)))


@foreign_arrays(fast=_FAST)
def matmul(a, b, *, out=None, impl="auto"):
    """``numpy.matmul``: 2-D products and stacks with broadcast batch dimensions; a 1-D
    operand is a row (a) or a column (b) vector whose axis is dropped from the result.
    float32 -> float32; float16/bfloat16 -> same dtype (float32 accumulation);
    int8 -> int32, exact."""
    a = _arrays.as_input(a, "a")
    b = _arrays.as_input(b, "b")
    for x, name in ((a, "a"), (b, "b")):
        if x.ndim == 0:
            raise ValueError(f"{name}: matmul needs at least 1 dimension, got a 0-d array")
    squeeze = []
    if a.ndim == 1:
        a = a[None, :]
        squeeze.append(-2)
    if b.ndim == 1:
        b = b[:, None]
        squeeze.append(-1)
    return _gemm(a, b, None, 1.0, 0.0, False, False, out, impl, squeeze, "matmul")


@foreign_arrays()
def gemm(a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None,
         impl="auto"):
    """BLAS-style ``alpha * op(a) @ op(b) + beta * c``; op transposes the last two axes
    when ``trans_a`` / ``trans_b`` (inside the kernels: no transposed copy). Stacks
    broadcast as in matmul; ``c`` broadcasts to the result and may be ``out`` itself.
    When beta == 0, c is not read. int8: alpha and beta must be integers."""
    a = _arrays.as_input(a, "a")
    b = _arrays.as_input(b, "b")
    _arrays.check_ndim(a, "a", min_ndim=2)
    _arrays.check_ndim(b, "b", min_ndim=2)
    for flag, name in ((trans_a, "trans_a"), (trans_b, "trans_b")):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    return _gemm(a, b, c, alpha, beta, bool(trans_a), bool(trans_b), out, impl, [], "gemm")


# ------------------------------------------------------------------------- checking
def _scalar(v, name, integer):
    if type(v) is float and not integer and abs(v) <= _F32_MAX:  # the common case, cheaply
        return v
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(v).__name__}")
    if not math.isfinite(float(v)):
        raise ValueError(f"{name}: must be finite, got {v}")
    if integer:
        if float(v) != int(v) or not -2**31 <= int(v) < 2**31:
            raise ValueError(f"{name}: int8 GEMM takes an integer in the int32 range, got {v!r}")
        return int(v)
    v = float(v)
    if abs(v) > _F32_MAX:  # the kernels take alpha and beta as float32
        raise ValueError(f"{name}: {v} is out of float32 range")
    return v


def _core(x, trans):
    """(rows, cols) of op(x)."""
    r, c = x.shape[-2], x.shape[-1]
    return (c, r) if trans else (r, c)


def _gemm(a, b, c, alpha, beta, ta, tb, out, impl, squeeze, op):
    dt = _arrays.check_dtype(a, "a", GEMM_TYPES)
    if _arrays.is_cupy(b) != _arrays.is_cupy(a):
        raise TypeError("b: must live where a does (both CuPy or both NumPy arrays)")
    if _dtypes.dtype_name(b.dtype) != dt:
        raise TypeError(f"b: dtype {_dtypes.dtype_name(b.dtype)} does not match a's {dt}; "
                        "mixed dtypes are not supported")
    M, K = _core(a, ta)
    Kb, N = _core(b, tb)
    if Kb != K:
        raise ValueError(f"b: inner dimensions do not match: op(a) is {M}x{K} and op(b) is "
                         f"{Kb}x{N} (shapes {tuple(a.shape)} and {tuple(b.shape)})")
    try:  # (plain 2-D products skip NumPy's broadcasting: decode calls are ~10 us of GPU)
        batch = () if a.ndim == b.ndim == 2 else np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    except ValueError:
        raise ValueError(f"b: batch dimensions {tuple(b.shape[:-2])} do not broadcast with "
                         f"a's {tuple(a.shape[:-2])}") from None
    full = tuple(batch) + (M, N)
    out_shape = list(full)
    for ax in sorted(squeeze):
        del out_shape[ax]
    out_shape = tuple(out_shape)
    dout = OUT_TYPES[dt]
    out_dtype = _dtypes.to_dtype(dout)
    integer = dt == "int8"
    alpha = _scalar(alpha, "alpha", integer)
    beta = _scalar(beta, "beta", integer)
    if c is not None:
        c = _arrays.as_input(c, "c")
        if _arrays.is_cupy(c) != _arrays.is_cupy(a):
            raise TypeError("c: must live where a does (both CuPy or both NumPy arrays)")
        _arrays.check_dtype(c, "c", (dout,))
        try:
            np.broadcast_shapes(tuple(c.shape), full)
        except ValueError:
            raise ValueError(f"c: shape {tuple(c.shape)} does not broadcast to the result "
                             f"{full}") from None
        if np.broadcast_shapes(tuple(c.shape), full) != full:
            raise ValueError(f"c: shape {tuple(c.shape)} would broadcast the result beyond {full}")
    elif beta != 0:
        raise ValueError("beta: a nonzero beta needs c")
    _arrays.check_impl(impl, LADDER, op)
    if impl == "auto":
        # (the GPU is asked only where its answer can change the rung)
        hopper = _wgmma_props() if dt in _gemm_wgmma.DTYPES["wgmma_ws"] and M > _gemm_skinny.MAX_M else None
        impl = auto_impl(dt, M, N, K, hopper.sm_count if hopper else 0, single=not batch)
    elif dt not in dtypes_of(impl):
        raise TypeError(f"impl: {impl!r} supports {', '.join(dtypes_of(impl))}, not {dt}")
    if impl == "skinny" and M > _gemm_skinny.MAX_M:
        raise ValueError(f"impl: 'skinny' is for M <= {_gemm_skinny.MAX_M} rows, got M={M}")
    if impl in _gemm_wgmma.VARIANTS:  # (before anything is allocated or copied)
        _arrays.cupy_module()
        _gemm_wgmma.require_gpu(impl, _launch.device_props())
    # out: exact shape and dtype, C-contiguous, not overlapping a or b; it may be c itself
    # (the kernels read each element of C before writing the same element of D) but not
    # partially overlap it.
    out = _arrays.check_out(out, a, out_shape, out_dtype)
    if c is not None and beta == 0:
        c = None  # BLAS: C is not read (nor copied to the device, nor checked for overlap)
    if out is not None and _arrays.is_cupy(out) and out.size:
        if _arrays._shares_memory_with(out, b):
            raise ValueError("out: must not overlap the input b")
        if c is not None and _arrays._shares_memory_with(out, c) and not _same_view(out, c, full):
            raise ValueError("out: may be c itself, but must not partially overlap c")

    call = None if _arrays.is_cupy(a) else _arrays.HostCall()
    cp = _arrays.cupy_module()
    y = _arrays.device_out(out, call, out_shape, out_dtype)
    if y.size == 0:
        return _arrays.finish(y, out, call)
    if call is not None:
        a, b = _arrays.to_device(a, call), _arrays.to_device(b, call)
        if c is not None:
            c = _arrays.to_device(c, call)
    d = y if not squeeze else y.reshape(full)
    if K == 0:
        impl = "naive"  # D = beta * C (or 0): every kernel agrees; the simplest launches
    problems = list(_problems(dt, ta, tb, M, N, K, a, b, c, d, batch, alpha, beta, cp))
    for p in problems:
        _LAUNCHERS[impl].launch(impl, p)
    replay = getattr(_LAUNCHERS[impl], "fast_launches", None)
    if op == "matmul" and call is None and out is None and not squeeze and len(problems) == 1 and replay:
        # a plain product of the caller's own operands: offered to the fast path (build()
        # refuses launches that read a copy)
        _FAST.offer(lambda: _fast.build_from_launcher(replay(impl, problems[0]), (a, b), y))
    return _arrays.finish(y, out, call)


def _same_view(out, c, full):
    """Is c (broadcast to ``full``) exactly the memory of out?"""
    return tuple(c.shape) == full and c.data.ptr == out.data.ptr and c.strides == out.reshape(full).strides


# ------------------------------------------------------------------------- lowering
def _matrix(x, trans, cp):
    """x (a CuPy array, ``(..., r, c)``) as kernel storage: (array, trans, ld). A view with
    unit stride on its second-last axis is a transposed matrix: flip ``trans``."""
    item = x.itemsize
    if any(s < 0 or s % item for s in x.strides):
        x = cp.ascontiguousarray(x)
    r, c = x.shape[-2], x.shape[-1]
    sr, sc = x.strides[-2] // item, x.strides[-1] // item
    if sc == 1 or c == 1:
        return x, trans, (sr if r > 1 else _pad(c, item))
    if sr == 1 or r == 1:
        return x, not trans, (sc if c > 1 else _pad(r, item))
    x = cp.ascontiguousarray(x)  # neither axis has unit stride (r, c > 1 here)
    return x, trans, x.strides[-2] // item


def _pad(n, item):
    """A leading dimension for a single-row matrix (never used to step): n rounded up to
    16 bytes, so that alignment checks on it pass."""
    v = 16 // item
    return -(-n // v) * v


def _problems(dt, ta, tb, M, N, K, a, b, c, d, batch, alpha, beta, cp):
    """One GemmProblem per launch: the batch dimensions every operand can step through
    with one stride form the kernel's batch; any outer ones are looped here."""
    a, ta, lda = _matrix(a, ta, cp)
    b, tb, ldb = _matrix(b, tb, cp)
    ops = {"a": a, "b": b, "d": d}
    ldc = 0
    if c is not None:
        if tuple(c.shape) != tuple(d.shape):
            c = cp.broadcast_to(c, d.shape)
        if c.strides[-1] != c.itemsize and N > 1 or any(s < 0 for s in c.strides):
            c = cp.ascontiguousarray(c)
        ldc = c.strides[-2] // c.itemsize if M > 1 else N
        ops["c"] = c
    nb = len(batch)
    if nb == 0:  # one product: none of the stride bookkeeping below (host time per call)
        yield GemmProblem(dtype=dt, ta=ta, tb=tb, M=M, N=N, K=K, A=a, B=b, C=c, D=d, lda=lda, ldb=ldb,
                          ldc=ldc, ldd=N, sA=0, sB=0, sC=0, sD=0, batch=1, alpha=alpha, beta=beta)
        return
    # every operand seen with the full batch shape (stride 0 where it broadcasts)
    views = {k: cp.broadcast_to(v, tuple(batch) + tuple(v.shape[-2:])) for k, v in ops.items()}
    strides = {k: [s // v.itemsize for s in v.strides[:nb]] for k, v in views.items()}
    dims = [i for i in range(nb) if batch[i] != 1]
    # grow the kernel's batch from the innermost dimension outwards while every operand
    # steps through the merged dimensions with one stride
    inner = []
    for i in reversed(dims):
        if inner:
            j = inner[0]
            if not all(st[i] == st[j] * batch[j] for st in strides.values()):
                break
        inner.insert(0, i)
    outer = [i for i in dims if i not in inner]
    count = math.prod(batch[i] for i in inner) if inner else 1
    bstride = {k: (st[inner[-1]] if inner else 0) for k, st in strides.items()}
    for idx in itertools.product(*(range(batch[i]) for i in outer)):
        sel = [0] * nb
        for i, v in zip(outer, idx):
            sel[i] = v
        base = {k: v[tuple(sel)] if nb else v for k, v in views.items()}
        yield GemmProblem(
            dtype=dt, ta=ta, tb=tb, M=M, N=N, K=K,
            A=base["a"], B=base["b"], C=base.get("c"), D=base["d"],
            lda=lda, ldb=ldb, ldc=ldc, ldd=N,
            sA=bstride["a"], sB=bstride["b"], sC=bstride.get("c", 0), sD=bstride["d"],
            batch=count, alpha=alpha, beta=beta,
        )
