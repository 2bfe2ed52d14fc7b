"""Launch plans shared by the row-wise operators (softmax, layer_norm, rms_norm).

Each of them has the same rungs above its textbook ones: `fused` (row in registers),
`cluster` (sm_90: a long row's registers spread over a thread-block cluster) and `staged`
(rows, or a cluster's share of a long row, copied to shared memory by cp.async), plus one
rung that handles any row length (`online`, `welford`, `twopass`). A plan is chosen once
per (op, impl, row length, dtype, device) and memoized, so a small call pays for the
choice once.
"""
import numpy as np

from .. import _arrays, _dtypes, _fast, _launch
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

    def launch(self, rows, args, aligned):
        _fast.launch_checked([self.launch_spec(rows, args, aligned)])

    def launch_spec(self, rows, args, aligned):
        """(fn, grid, block, smem, args) of the launch over ``rows`` rows (``args``: the
        op's own, this plan's tail appended)."""
        return self.fn, self.grid(rows), (self.block,), self.smem, args + self._tail(aligned)

    def fast_variants(self, rows, n, itemsize, args):
        """The launch lists of a FastCall (``_fast.build``) over ``rows`` rows of n
        elements: the scalar path for rows off 16 bytes, the 16-byte one for aligned rows
        where the row length allows it."""
        vec_ok = n % (16 // itemsize) == 0
        return tuple([self.launch_spec(rows, args, aligned)] for aligned in (False, vec_ok))


_ALIGNED = (np.int32(0), np.int32(1))
_shape_args = {}


def shape_args(rows, n):
    """(np.int64(rows), np.int32(n)), memoized: making NumPy scalars costs about half a
    microsecond each, a visible share of a small call's host time."""
    return _launch.memo(_shape_args, (rows, n), lambda: (np.int64(rows), np.int32(n)))


# Ops whose staged rung stages several input rows per row: op -> (the op whose staging
# sizes apply, input rows a row). add_rms_norm stages x's row and residual's together,
# planned as one row of 2n elements with rms_norm's sizes (its bytes in flight and shared
# memory are what the sizes are about); the weight, when staged, takes one such row. These
# stage whole rows only: where the pair is too long for one block (a cluster plan), the
# register rung takes the row, then the fallback.
STAGE_AS = {"add_rms_norm": ("rms_norm", 2)}

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
        stage_as, inputs = STAGE_AS.get(op, (op, 1))
        sp = _launch.staged_row_plan(inputs * n, _dtypes.itemsize(dt), stage_as, props)
        if sp is not None and (inputs == 1 or sp.cluster == 1):
            kernel = f"{op}_staged"
            fn, name = get(template_name(kernel, t) if inputs > 1 else template_name(kernel, t, sp.cluster))
            _launch.request_smem(fn, sp.smem, props, f"{op} (staged, n={n})")
            return RowPlan(fn, name, sp.block, rows_per_block=sp.rows_per_block, cluster=sp.cluster,
                           smem=sp.smem, tail=(sp.chunk, sp.group) + (() if op == "softmax" else (sp.params,)))
        impl = fallback if inputs == 1 else "fused"  # (fused falls back in turn where it cannot)
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
