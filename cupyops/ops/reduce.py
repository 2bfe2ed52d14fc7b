"""trace, sum and max (kernels/reduce.cu).

Fast paths: the whole array and trailing axes are row reductions (R rows of n contiguous
elements); one other axis is a strided reduction; any other set of axes is moved to the
end (one copy) and reduced as rows. Long rows are cut into segments, or (a few rows, the
whole array) strided by a resident wave of blocks; the partials are reduced in a fixed
order by the row's last block or a second pass, so the GPU stays busy without float
atomics (results are bitwise the same run to run on a given GPU).
"""
import builtins

import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _fast, _launch
from .._kernels import KernelFile, template_name

VARIANTS = {
    "trace": {
        "naive": "one thread walks the diagonal: the textbook loop, one load in flight",
        "block": "one 256-thread block, strided loads, shared-memory tree reduction",
        "unrolled": "one 1024-thread block, 8 loads in flight per thread, warp-shuffle reduction",
    },
}
_ROW_LADDER = {
    "naive": "one thread per output row, scalar loop: uncoalesced, the textbook version",
    "block": "one 256-thread block per row, coalesced scalar loads, shared-memory tree",
    "vector": "16-byte loads, 4 in flight per thread, a group of threads sized to the row, "
    "shuffle reductions; long rows split into segments, and a few long rows (the whole "
    "array) strided by one resident wave of blocks, finished in the same launch",
}
VARIANTS["sum"] = dict(_ROW_LADDER)
VARIANTS["max"] = dict(_ROW_LADDER)

# NumPy's result dtype of sum / trace, and which dtype= requests we instantiate.
SUM_DEFAULT = {"int32": "int64", "int64": "int64", "float32": "float32", "float64": "float64",
               "float16": "float16", "bfloat16": "bfloat16"}
SUM_PAIRS = {
    "float16": ("float16", "float32", "float64"),
    "bfloat16": ("bfloat16", "float32", "float64"),
    "float32": ("float32", "float64"),
    "float64": ("float64",),
    "int32": ("int64", "int32", "float32", "float64"),
    "int64": ("int64", "float32", "float64"),
}
# Accumulator dtype (what partials of a split reduction are stored as).
_SUM_ACC = {"float16": "float32", "bfloat16": "float32", "float32": "float32",
            "float64": "float64", "int32": "int64", "int64": "int64"}
_MAX_ACC = {"float16": "float32", "bfloat16": "float32", "float32": "float32",
            "float64": "float64", "int32": "int32", "int64": "int64"}
_OPS = {"sum": ("cuops::SumOp", _SUM_ACC), "max": ("cuops::MaxOp", _MAX_ACC)}
_ROW_KERNELS = {"naive": "reduce_rows_naive", "block": "reduce_rows_block",
                "vector": "reduce_rows_vector"}
_TRACE_KERNELS = {"naive": "trace_naive", "block": "trace_block", "unrolled": "trace_unrolled"}
_TRACE_THREADS = {"naive": 1, "block": 256, "unrolled": 1024}


def _user_pairs(op):
    """The (input, output) dtype pairs a caller can ask ``op`` for."""
    if op == "max":
        return [(d, d) for d in _dtypes.REDUCE_TYPES]
    return [(i, o) for i, outs in SUM_PAIRS.items() for o in outs]


def _pairs(op):
    """Every (input, output) dtype pair a reduction kernel is instantiated for, including
    the (accumulator -> output) pairs of a split reduction's second pass."""
    pairs = _user_pairs(op)
    acc = _OPS[op][1]
    split = [(i, acc[o]) for i, o in pairs] + [(acc[o], o) for _, o in pairs]
    return list(dict.fromkeys(pairs + split))


def _name(kernel, op, din, dout):
    return template_name(kernel, _dtypes.cuda_type(din), _dtypes.cuda_type(dout), _OPS[op][0])


def _expressions():
    names = []
    for op in ("sum", "max"):
        for din, dout in _pairs(op):
            for k in (*_ROW_KERNELS.values(), "reduce_strided"):
                names.append(_name(k, op, din, dout))
        for din, dout in _user_pairs(op):  # reduce_rows_flat finishes its rows itself
            names.append(_name("reduce_rows_flat", op, din, dout))
    for din in _dtypes.REDUCE_TYPES:
        for k in _TRACE_KERNELS.values():
            names.append(template_name(k, _dtypes.cuda_type(din), _dtypes.cuda_type(SUM_DEFAULT[din])))
    return names


KERNELS = KernelFile("reduce.cu", _expressions())
KERNEL_FILES = [KERNELS]


# ---------------------------------------------------------------------------- trace
@foreign_arrays()
def trace(a, *, impl="auto"):
    """Sum of ``a[i, i]`` for i < min(rows, cols), as ``numpy.trace`` of a 2-D array
    (integers are summed exactly in int64; half types accumulate in float32).
    Returns a 0-d CuPy array for CuPy input, a NumPy scalar for NumPy input."""
    a = _arrays.as_input(a, "a")
    din = _arrays.check_dtype(a, "a", _dtypes.REDUCE_TYPES)
    _arrays.check_ndim(a, "a", ndim=2)
    _arrays.check_impl(impl, VARIANTS["trace"], "trace")
    impl = "unrolled" if impl == "auto" else impl
    dout = SUM_DEFAULT[din]

    call = None if _arrays.is_cupy(a) else _arrays.HostCall()
    cp = _arrays.cupy_module()
    if call is None:
        ad = a  # only the diagonal is read: any strides will do, no copy
        itemsize = a.itemsize
        s0, s1 = a.strides
        if s0 % itemsize or s1 % itemsize:
            ad = cp.ascontiguousarray(a)
            s0, s1 = ad.strides
    else:
        ad = _arrays.to_device(a, call)
        itemsize, (s0, s1) = ad.itemsize, ad.strides
    y = cp.empty((), _dtypes.to_dtype(dout))
    n = min(a.shape)
    if n == 0:
        y.fill(0)
    else:
        fn = KERNELS.function(template_name(_TRACE_KERNELS[impl], _dtypes.cuda_type(din),
                                            _dtypes.cuda_type(dout)))
        fn((1,), (_TRACE_THREADS[impl],), (ad, y, np.int64(n), np.int64((s0 + s1) // itemsize)))
    return _arrays.finish(y, None, call)


# ---------------------------------------------------------------------------- sum / max
# the fast path's signatures (cupyops/_fast.py): x's layout, one axis or all, keepdims and
# impl, for calls with no out= and the default result dtype
_FAST = {"sum": _fast.FastCalls(_fast.Declared(arrays=("x",), fixed=("dtype", "out"), options={
            "axis": (type(None), int), "keepdims": bool, "impl": str})),
         "max": _fast.FastCalls(_fast.Declared(arrays=("x",), fixed=("out",), options={
            "axis": (type(None), int), "keepdims": bool, "impl": str}))}


@foreign_arrays(fast=_FAST["sum"])
def sum(x, axis=None, dtype=None, out=None, *, keepdims=False, impl="auto"):  # noqa: A001
    """Sum over ``axis`` (None: all; int or tuple), NumPy semantics: int32 sums to int64,
    half types accumulate in float32 and return their own dtype unless ``dtype`` says."""
    return _reduce("sum", x, axis, dtype, out, keepdims, impl)


@foreign_arrays(fast=_FAST["max"])
def max(x, axis=None, out=None, *, keepdims=False, impl="auto"):  # noqa: A001
    """Maximum over ``axis`` (None: all; int or tuple); NaN propagates as in NumPy."""
    return _reduce("max", x, axis, None, out, keepdims, impl)


def _reduce(op, x, axis, dtype, out, keepdims, impl):
    x = _arrays.as_input(x, "x")
    din = _arrays.check_dtype(x, "x", _dtypes.REDUCE_TYPES)
    if op == "sum":
        dout = SUM_DEFAULT[din] if dtype is None else _dtype_arg(dtype)
        if dout not in SUM_PAIRS[din]:
            raise TypeError(
                f"dtype: cannot sum {din} into {dout}; expected one of {', '.join(SUM_PAIRS[din])}"
            )
    else:
        dout = din
    axes = _arrays.normalize_axes(axis, x.ndim)
    shape = tuple(x.shape)
    n_red = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    kept = [d for i, d in enumerate(shape) if i not in axes]
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keepdims else tuple(kept)
    if op == "max" and n_red == 0:  # as NumPy, even when the result would be empty
        raise ValueError("x: zero-size array to reduction operation max which has no identity")
    out_dtype = _dtypes.to_dtype(dout)
    out = _arrays.check_out(out, x, out_shape, out_dtype)
    _arrays.check_impl(impl, VARIANTS[op], op)
    if impl == "auto":
        impl = auto_impl(x.itemsize, n_red)

    call = None if _arrays.is_cupy(x) else _arrays.HostCall()
    cp = _arrays.cupy_module()
    y = _arrays.device_out(out, call, out_shape, out_dtype)
    if y.size == 0:
        return _arrays.finish(y, out, call)
    if n_red == 0:  # sum over an empty axis
        y.fill(0)
        return _arrays.finish(y, out, call)
    xd = _arrays.to_device(x, call)
    nd = x.ndim
    if nd == 0 or axes == tuple(range(nd - len(axes), nd)):  # trailing axes: rows
        variants = _rows(op, impl, xd, y, y.size, n_red, din, dout)
        if variants is not None and xd is x and out is None:  # one launch on the caller's array
            _FAST[op].offer(lambda: _fast.build(variants(), (x,), y))
    elif len(axes) == 1:
        a = axes[0]
        outer = int(np.prod(shape[:a], dtype=np.int64))
        inner = int(np.prod(shape[a + 1:], dtype=np.int64))
        _strided(op, xd, y, outer, shape[a], inner, din, dout)
    else:  # move the reduced axes last (one copy), then rows
        moved = cp.ascontiguousarray(cp.moveaxis(xd, axes, tuple(range(nd - len(axes), nd))))
        _rows(op, impl, moved, y, y.size, n_red, din, dout)
    return _arrays.finish(y, out, call)


def auto_impl(itemsize, n):
    """`vector` (16-byte loads) for 2- and 4-byte elements: on an H100 it matches or beats
    `block` on every float32 shape once its groups are sized as in vector_group
    (benchmarks/reduce_probe.py; an H200 had measured `block` 1-2 % ahead on long float32
    rows before the benchmark's timing held the host out of the events). 8-byte elements
    in long rows keep the plain coalesced loads of `block`, which already saturate memory."""
    return "block" if itemsize >= 8 and n >= 8192 else "vector"


def _dtype_arg(dtype):
    if isinstance(dtype, str) and dtype == "bfloat16":
        return "bfloat16"
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise TypeError(f"dtype: not a dtype: {dtype!r}") from None


def _strided(op, xd, y, outer, R, inner, din, dout):
    fn = KERNELS.function(_name("reduce_strided", op, din, dout))
    threads = 256
    fn((_launch.cdiv(outer * inner, threads),), (threads,),
       (xd, y, np.int64(outer), np.int64(R), np.int64(inner)))


def split_plan(R, n, sm_count, impl, vec, *, min_len=None, per_sm=None):
    """(S, L): cut each of R rows of n elements into S segments of L elements so that
    there are enough independent pieces of work to fill ``sm_count`` SMs (``per_sm``
    pieces an SM, segments of at least ``min_len`` elements; defaults by rung)."""
    # Measured: many segments (several waves of blocks) beat one wave of long ones, whose
    # slowest block sets the end; 16K-element segments keep the second pass negligible.
    target = (per_sm or {"naive": 256, "block": 64, "vector": 64}[impl]) * sm_count
    min_len = min_len or {"naive": 1024, "block": 16384, "vector": 16384}[impl]
    if R >= target or n < 2 * min_len:
        return 1, n
    S = min(_launch.cdiv(target, R), n // min_len)
    L = _launch.cdiv(_launch.cdiv(n, S), vec) * vec  # keep segments 16-byte aligned
    return _launch.cdiv(n, L), L


# Threads a block of reduce_rows_vector when its groups are smaller (BLOCK / G rows a block).
VECTOR_BLOCK = 128


# Rows of at most this many 16-byte vectors (2 KB) take one batch of loads a thread.
SHORT_ROW_VECTORS = 128


def vector_group(L, itemsize, *, batches=None, cap=256):
    """Threads per virtual row of reduce_rows_vector: enough that each thread runs about
    ``batches`` batches of 4 16-byte loads, 4 to ``cap`` threads. By default one batch for
    rows of at most SHORT_ROW_VECTORS vectors, two otherwise. Measured
    (benchmarks/reduce_probe.py, H100): two batches beat four on 2-byte rows and whole
    arrays (+2-4 %) and on 4096- and 8192-long float32 rows; on 2 KB rows (65536x1024
    2-byte) one batch beat two by 0.2-2.5 % in every paired run (NOTES 45, 47); groups of
    512 lose 4-8 % on float32 segments of 16K elements, which therefore keep 256 threads
    and four batches."""
    nvec = _launch.cdiv(L * itemsize, 16)
    if batches is None:
        batches = 1 if nvec <= SHORT_ROW_VECTORS else 2
    return min(cap, builtins.max(4, _launch.pow2_ceil(_launch.cdiv(nvec, 4 * batches))))


# The `vector` rung finishes a row of at most this many segments in the same launch (the
# row's last block reduces the partials; kernels/reduce.cu) instead of a second launch.
# Measured on an H100 (benchmarks/reduce_probe.py, NOTES item 30): one launch wins with
# up to 1024 segments a row (1024x131072 rows, 8 each: +0.9 %; a 16M-element array: +2 %)
# and loses 3-10 % with 4096-8192 segments on one counter, where the per-block fences and
# tickets cost more than the second launch saves. 0 restores the two passes everywhere.
ONE_LAUNCH_SPLITS = 1024


# The `vector` rung reduces at most this many rows that need splitting with
# reduce_rows_flat (every block of a row strides through all of it; one resident wave of
# FLAT_WAVE_PER_SM blocks an SM, at least FLAT_MIN_BLOCK_ELEMS elements a block), and
# more rows as segments (split_plan). Contiguous segments leave the end of the launch to
# their slowest wave and a second pass: the H100 measured whole-array sums 3-6 us slower
# than the row sums of the same bytes (results/h100-full.md). Measured on an H100
# (benchmarks/reduce_probe.py, two runs, NOTES item 36): the flat path +1.5-5 % over the
# segments on every whole-array sum, and 3 blocks an SM at or above 4 on all 14 pairs.
FLAT_MAX_ROWS = 64
FLAT_THREADS = 256  # = FLAT_THREADS and FLAT_BLOCKS_PER_SM of kernels/reduce.cu
FLAT_BLOCKS_PER_SM = 4  # the kernel's launch bounds: this many are always resident
FLAT_WAVE_PER_SM = 3
FLAT_MIN_BLOCK_ELEMS = 8192


def flat_plan(R, n, sm_count, *, per_sm=FLAT_WAVE_PER_SM):
    """Blocks a row for reduce_rows_flat: R rows together fill ``per_sm`` (at most the
    kernel's FLAT_BLOCKS_PER_SM, so that all are resident) blocks an SM."""
    return builtins.max(1, builtins.min((per_sm * sm_count) // R, _launch.cdiv(n, FLAT_MIN_BLOCK_ELEMS)))


def _rows(op, impl, xd, y, R, n, din, dout):
    """Reduce R rows of n elements of ``xd`` into ``y``. A reduction of one launch returns
    the maker of its fast-call launch lists (off 16 bytes, aligned); the others None."""
    props = _launch.device_props()
    vec = 16 // xd.itemsize
    S, L = split_plan(R, n, props.sm_count, impl, vec)
    if S == 1:
        _rows_launch(op, impl, xd, y, R, n, 1, n, din, dout)
        return lambda: tuple([_row_spec(op, impl, xd, y, R, n, 1, n, din, dout, aligned)]
                             for aligned in (False, n % vec == 0))
    acc = _OPS[op][1][dout]
    cp = _arrays.cupy_module()
    if impl == "vector" and R <= FLAT_MAX_ROWS:
        P = flat_plan(R, n, props.sm_count)
        partial = cp.empty((R, P), _dtypes.to_dtype(acc))
        fn = KERNELS.function(_name("reduce_rows_flat", op, din, dout))
        fn((P, R), (FLAT_THREADS,), (xd, y, np.int64(n), partial, _arrays.tickets(R)))
        return None
    partial = cp.empty((R, S), _dtypes.to_dtype(acc))
    if impl == "vector" and S <= ONE_LAUNCH_SPLITS and vector_group(L, xd.itemsize) >= 128:
        # one segment a block (G == block), which the in-kernel finish needs
        _rows_launch(op, impl, xd, y, R, n, S, L, din, dout, partial, _arrays.tickets(R))
        return None
    _rows_launch(op, impl, xd, partial, R, n, S, L, din, acc)
    _rows_launch(op, impl, partial, y, R, S, 1, S, acc, dout)
    return None


def _rows_launch(op, impl, xd, y, R, n, S, L, din, dout, partial=_arrays.NULL_PTR,
                 tickets=_arrays.NULL_PTR):
    vec = 16 // xd.itemsize
    aligned = _launch.rows_aligned(vec, n, xd) and L % vec == 0
    _fast.launch_checked([_row_spec(op, impl, xd, y, R, n, S, L, din, dout, aligned, partial, tickets)])


def _row_spec(op, impl, xd, y, R, n, S, L, din, dout, aligned, partial=_arrays.NULL_PTR,
              tickets=_arrays.NULL_PTR):
    """(fn, grid, block, smem, args) of one row-reduction launch; ``aligned``: rows start
    on 16-byte boundaries (the `vector` rung's 16-byte loads)."""
    fn = KERNELS.function(_name(_ROW_KERNELS[impl], op, din, dout))
    V = R * S
    args = (xd, y, np.int64(R), np.int64(n), np.int32(S), np.int64(L))
    if impl == "naive":
        return fn, (_launch.cdiv(V, 128),), (128,), 0, args
    if impl == "block":
        return fn, (V,), (256,), 0, args
    G = vector_group(L, xd.itemsize)
    block = builtins.max(G, VECTOR_BLOCK)  # this module's max is the reduction
    return (fn, (_launch.cdiv(V, block // G),), (block,), 0,
            args + (np.int32(G), np.int32(aligned), partial, tickets))
