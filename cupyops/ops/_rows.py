"""Launch plans shared by the row-wise operators (softmax, layer_norm, rms_norm).

Each of them has the same rungs above its textbook ones: `fused` (row in registers),
`cluster` (sm_90: a long row's registers spread over a thread-block cluster) and `staged`
(rows, or a cluster's share of a long row, copied to shared memory by cp.async), plus one
rung that handles any row length (`online`, `welford`, `twopass`). A plan is chosen once
per (op, impl, row length, dtype, device) and memoized, so a small call pays for the
choice once.
"""
import numpy as np

from .. import _arrays, _dtypes, _launch
from .._kernels import template_name

# What the staged rung adds, the same for every row-wise operator.
STAGED_DOC = ("rows (or a cluster's share of a long row) copied to shared memory by cp.async: "
              "bytes in flight bounded by shared memory, not registers (the win for 2-byte types)")


class RowPlan:
    """A kernel and how to launch it over `rows` rows: the grid, the block, the dynamic
    shared memory and the trailing kernel arguments (after the op's own)."""

    __slots__ = ("fn", "block", "rows_per_block", "cluster", "smem", "tail", "takes_aligned", "name")

    def __init__(self, fn, name, block, *, rows_per_block=1, cluster=1, smem=0, tail=(), takes_aligned=True):
        self.fn, self.name, self.block = fn, name, block
        self.rows_per_block, self.cluster, self.smem = rows_per_block, cluster, smem
        self.tail = tuple(np.int32(v) for v in tail)
        self.takes_aligned = takes_aligned

    def grid(self, rows):
        return (rows * self.cluster if self.cluster > 1 else _launch.cdiv(rows, self.rows_per_block),)

    def _tail(self, aligned):
        return self.tail + (_ALIGNED[aligned],) if self.takes_aligned else self.tail

    def scalar_args(self, rows, n, aligned, extra=()):
        """The kernel's arguments after its arrays (x, y[, weight, bias, ...]): (rows, n),
        the op's own scalars ``extra`` (the norms' eps), and this plan's tail."""
        return shape_args(rows, n) + tuple(extra) + self._tail(aligned)

    def launch(self, rows, args, aligned):
        grid, args = self.grid(rows), args + self._tail(aligned)
        # CuPy's shared_mem= keyword alone costs 0.5-1.9 us a call on the H100 hosts
        # (NOTES item 38): passed only when needed
        if self.smem:
            self.fn(grid, (self.block,), args, shared_mem=self.smem)
        else:
            self.fn(grid, (self.block,), args)


_ALIGNED = (np.int32(0), np.int32(1))
_shape_args = {}


def shape_args(rows, n):
    """(np.int64(rows), np.int32(n)), memoized: making NumPy scalars costs about half a
    microsecond each, a visible share of a small call's host time."""
    return _launch.memo(_shape_args, (rows, n), lambda: (np.int64(rows), np.int32(n)))


_plans = {}


def plan(kernels, op, impl, n, dt, fallback, simple_block=512):
    """The memoized RowPlan of ``op`` for rows of n elements of dtype ``dt``.
    ``fallback``: the rung that takes any row length, used when the asked rung can't."""
    key = (op, impl, n, dt, _arrays.cupy_module().cuda.runtime.getDevice())
    return _launch.memo(_plans, key, lambda: _choose(kernels, op, impl, n, dt, fallback, simple_block))


def _choose(kernels, op, impl, n, dt, fallback, simple_block):
    t = _dtypes.cuda_type(dt)
    props = _launch.device_props()

    def get(name):
        return kernels.function(name), name

    if impl == "auto":
        # Measured: float32 rows that fit in registers are as fast fused as staged and
        # skip the shared-memory round trip; 2-byte types need staging to keep enough
        # bytes in flight (registers hold them widened to float).
        impl = "fused" if dt == "float32" and _launch.fused_row_plan(n, dt) else "staged"
    if impl == "staged":
        sp = _launch.staged_row_plan(n, _dtypes.itemsize(dt), op, props)
        if sp is not None:
            fn, name = get(template_name(f"{op}_staged", t, sp.cluster))
            _launch.request_smem(fn, sp.smem, props, f"{op} (staged, n={n})")
            return RowPlan(fn, name, sp.block, rows_per_block=sp.rows_per_block, cluster=sp.cluster,
                           smem=sp.smem, tail=(sp.chunk, sp.group) + (() if op == "softmax" else (sp.params,)))
        impl = fallback
    if impl in ("fused", "cluster"):
        fp = _launch.fused_row_plan(n, dt)
        if fp is not None:
            vecs, g = fp
            block = max(g, 256)
            fn, name = get(template_name(f"{op}_fused", t, vecs))
            return RowPlan(fn, name, block, rows_per_block=block // g, tail=(g,))
        if impl == "cluster" and props.cc >= 90:
            cp_ = _launch.cluster_row_plan(n, dt)
            if cp_ is not None:
                vecs, cl, g, chunk = cp_
                fn, name = get(template_name(f"{op}_cluster", t, vecs, cl))
                return RowPlan(fn, name, g, cluster=cl, tail=(chunk,))
        impl = fallback
    fn, name = get(template_name(f"{op}_{impl}", t))
    return RowPlan(fn, name, simple_block, takes_aligned=impl == "online")


# ------------------------------------------------------------------ the memoized fast path
# A call of a row-wise operator that passed every check once with the same (array types,
# shapes, dtypes, scalars, impl, device) maps to its launch, so a repeated call skips the
# checks and the plan lookup and pays for the output allocation and the launch only
# (benchmarks/host_overhead.py on the H100 hosts: the checks and lookups cost more than the
# kernel launch itself). Only C-contiguous CuPy arrays take it; anything else returns None
# from the fast call and goes the checked way.
class FastCalls(dict):
    """One row operator's memo of fast calls (``fast_rows``) by call signature: a key the
    operator builds from its arguments (None: a call the fast path cannot take)."""

    def find(self, key):
        """The fast call of ``key``, or None (none yet, or not an array: an unhashable
        shape or dtype, which the checked path then names)."""
        try:
            return self.get(key)
        except TypeError:
            return None

    def remember(self, key, make):
        """After a checked launch: ``make()`` the fast call of ``key`` once."""
        if key is not None:
            _launch.memo(self, key, make)


def c_strides(shape, itemsize):
    """The byte strides of a C-contiguous array of ``shape``."""
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def fast_rows(p, shape, dtype, arrays, extra=(), **launch_kw):
    """The fast call of plan ``p`` on C-contiguous rows of ``shape`` and ``dtype``:
    ``call(*arrays)`` with the kernel's arrays in its order (None for an absent weight or
    bias: a null pointer; the output, marked by the string "out" in ``arrays``, is made
    here from CuPy's current allocator) returns the output, or None when an input is not
    C-contiguous (1-D parameters: unit-stride). Everything that depends only on the shape is
    computed once: the grid, the block and the scalar arguments, packed into a
    ``DirectLaunch`` for 16-byte-aligned rows and one for others, so a call writes the
    addresses and launches. (``launch_kw``: DirectLaunch's stand-ins, for the CPU tier.)"""
    cp = _arrays.cupy_module()
    n = shape[-1]
    rows = _launch.cdiv(int(np.prod(shape, dtype=np.int64)), n)
    vec_ok = n % (16 // dtype.itemsize) == 0
    # [unaligned, aligned]: the 16-byte path needs every row (and parameter) 16-byte aligned
    launches = tuple(_launch.DirectLaunch(p.fn, p.grid(rows), (p.block,), p.smem, len(arrays),
                                          p.scalar_args(rows, n, aligned=a, extra=extra), **launch_kw)
                     for a in (False, vec_ok))
    x_strides, p_strides = c_strides(shape, dtype.itemsize), (dtype.itemsize,)
    out_at = arrays.index("out")

    def call(*given):
        addrs, any_bits = [], 0
        for i, a in enumerate(given):
            if a is None:
                addrs.append(0)
                continue
            if a.strides != (x_strides if i == 0 else p_strides):
                return None
            ptr = a.data.ptr
            addrs.append(ptr)
            any_bits |= ptr
        y = cp.ndarray(shape, dtype)  # cp.empty less a Python call
        yp = y.data.ptr
        addrs.insert(out_at, yp)
        launches[not (any_bits | yp) & 15](*addrs)
        return y

    return call
