"""What the benchmark runs: ops, dtypes, shapes, suites, the plan of (case, impls), and the
bytes each case must move at the least.

Pure Python and NumPy only (no CuPy, no GPU), so the CPU tests cover all of it. Every
parse error is a ValueError whose message names the option and lists what it accepts;
the CLI turns it into a usage error.
"""
import math
from dataclasses import dataclass

import numpy as np

OPS = ("trace", "sum", "max", "softmax", "layer_norm", "rms_norm", "matmul")
_OP_ALIASES = {
    "amax": "max",
    "layernorm": "layer_norm",
    "layer-norm": "layer_norm",
    "rmsnorm": "rms_norm",
    "rms-norm": "rms_norm",
    "gemm": "matmul",
}

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
REDUCE_DTYPES = FLOAT_DTYPES + ("float64", "int32", "int64")
OP_DTYPES = {
    "trace": REDUCE_DTYPES,
    "sum": REDUCE_DTYPES,
    "max": REDUCE_DTYPES,
    "softmax": FLOAT_DTYPES,
    "layer_norm": FLOAT_DTYPES,
    "rms_norm": FLOAT_DTYPES,
    "matmul": FLOAT_DTYPES + ("int8",),
}
_DTYPE_ALIASES = {
    "fp32": "float32", "f32": "float32", "float": "float32",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64", "f64": "float64", "double": "float64",
    "i32": "int32", "i64": "int64", "i8": "int8",
}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8,
            "int8": 1}

# Vendor baselines per op. CuPy has no layer/RMS norm of its own.
BASELINES = {
    "trace": ("cupy", "torch"),
    "sum": ("cupy", "torch"),
    "max": ("cupy", "torch"),
    "softmax": ("cupy", "torch"),
    "layer_norm": ("torch",),
    "rms_norm": ("torch",),
    "matmul": ("cupy", "torch"),  # cupy.matmul = cuBLAS (TF32 off); int8: torch._int_mm
}
BASELINE_NAMES = ("cupy", "torch")

# Which reference.TOLERANCE table applies. Softmax goes with the norms: it divides by a
# row sum after an exp, so float32 lands near 1e-6..1e-5, above the pure-reduction bar.
TOLERANCE_KIND = {
    "trace": "reduce", "sum": "reduce", "max": "reduce",
    "softmax": "norm", "layer_norm": "norm", "rms_norm": "norm", "matmul": "gemm",
}
NORM_EPS = {"layer_norm": 1e-5, "rms_norm": 1e-6}

# Reductions are benchmarked along the last axis; sum also over the whole array.
DEFAULT_AXES = {"sum": (-1, None), "max": (-1,)}

# Textbook rungs are only timed up to this many elements when slow rungs are skipped.
SLOW_LIMIT = 2**24
# Row-wise outputs are validated on an evenly spaced subset of rows above this many input
# elements: the float64 host reference of a 2^27-element case costs seconds per variant,
# while a NaN-poisoned out= catches unwritten elements over the whole output on the GPU.
CHECK_LIMIT = 2**22

_BIG_SHAPES = ((16384, 8192), (65536, 1024), (1024, 131072))
# matmul shapes are (M, N, K). LLM inference: decode (M = 1, 16 token rows against a
# 4096x4096 or 4096x11008 weight), a prefill MLP projection, and the big square.
_LLM_GEMMS = ((1, 4096, 4096), (16, 4096, 4096), (1, 11008, 4096), (4096, 4096, 11008),
              (8192, 8192, 8192))
_SQUARE_GEMMS = ((4096, 4096, 4096), (8192, 8192, 8192))
_TRACE_SHAPE = (5977, 7890)  # awkward, non-square: the acceptance shape for trace
# suite -> op ("*" = any other op) -> (shapes, dtypes)
SUITES = {
    # One mid-size shape, the 4-byte and the bf16 path: a smoke run of every rung that
    # still fills the GPU (64 MiB of float32 is above any L2).
    "quick": {
        "trace": ((_TRACE_SHAPE,), ("float32",)),
        "matmul": (_LLM_GEMMS, ("float16", "bfloat16")),
        "*": (((4096, 4096),), ("float32", "bfloat16")),
    },
    # The acceptance shapes: square-ish, many short rows, few very long rows.
    "full": {
        "trace": ((_TRACE_SHAPE,), ("float32",)),
        "matmul": (_LLM_GEMMS + _SQUARE_GEMMS[:1], FLOAT_DTYPES + ("int8",)),
        "*": (_BIG_SHAPES, FLOAT_DTYPES),
    },
}


@dataclass(frozen=True)
class Case:
    """One input to time every impl on: op, dtype, shape and (for reductions) axis."""

    op: str
    dtype: str
    shape: tuple
    axis: object = -1  # -1, or None for a reduction over everything (trace: None)

    @property
    def numel(self):
        return math.prod(self.shape)

    @property
    def cols(self):
        """Length of the last axis: the row the row-wise ops work on (matmul: N, the
        output's row)."""
        return self.shape[1] if self.op == "matmul" else self.shape[-1]

    @property
    def rows(self):
        """Rows of the output checked row by row (matmul: M)."""
        return self.shape[0] if self.op == "matmul" else self.numel // self.cols

    @property
    def work(self):
        """What makes a rung slow: elements, or multiply-adds (M*N*K) for matmul."""
        return self.numel  # matmul's shape is (M, N, K)

    @property
    def row_wise(self):
        """True when each output row depends only on the same input row (so a subset of
        rows can be checked on its own; matmul: row i of the output is row i of A times B)."""
        return self.op in ("softmax", "layer_norm", "rms_norm", "matmul") or (
            self.op in ("sum", "max") and self.axis == -1
        )

    @property
    def shape_str(self):
        return "x".join(str(d) for d in self.shape)

    @property
    def axis_str(self):
        if self.op in ("trace", "matmul"):
            return ""
        return "all" if self.axis is None else str(self.axis)

    @property
    def key(self):
        return (self.op, self.axis_str, self.dtype, self.shape_str)

    def __str__(self):
        axis = f" axis={self.axis_str}" if self.axis_str else ""
        return f"{self.op}{axis} {self.dtype} {self.shape_str}"


@dataclass(frozen=True)
class Impl:
    """One thing to time on a case: a cupyops variant, impl='auto', or a vendor baseline.
    ``skip`` holds the reason when it is planned but not run."""

    name: str
    kind: str  # "variant" | "auto" | "baseline"
    skip: object = None


# ----------------------------------------------------------------------------------
# parsing
# ----------------------------------------------------------------------------------
def split_list(values):
    """Flatten repeated and comma-separated option values, drop blanks, keep first order."""
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    seen = []
    for v in values:
        for item in str(v).split(","):
            item = item.strip()
            if item and item not in seen:
                seen.append(item)
    return seen


def parse_ops(values):
    names = split_list(values)
    if not names:
        return OPS
    ops = []
    for name in names:
        op = _OP_ALIASES.get(name.lower(), name.lower())
        if op not in OPS:
            raise ValueError(f"--op: unknown op {name!r}; expected one of {', '.join(OPS)}")
        if op not in ops:
            ops.append(op)
    return tuple(ops)


def parse_dtypes(values, ops=OPS):
    """Dtype names (aliases allowed); each must be supported by at least one of ``ops``."""
    names = split_list(values)
    if not names:
        return None
    known = sorted(ITEMSIZE)
    dtypes = []
    for name in names:
        dt = _DTYPE_ALIASES.get(name.lower(), name.lower())
        if dt not in ITEMSIZE:
            raise ValueError(f"--dtype: unknown dtype {name!r}; expected one of {', '.join(known)}")
        if not any(dt in OP_DTYPES[op] for op in ops):
            raise ValueError(f"--dtype: {dt} is not supported by {', '.join(ops)} "
                             f"(the float-only ops take {', '.join(FLOAT_DTYPES)})")
        if dt not in dtypes:
            dtypes.append(dt)
    return tuple(dtypes)


def parse_shape(text):
    """'16384x8192' -> (16384, 8192). 'x', 'X' and '*' all separate dimensions."""
    t = text.strip().lower().replace("*", "x")
    parts = t.split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"--shape: cannot parse {text!r}; expected positive dimensions "
                         f"joined by 'x', e.g. 16384x8192")
    return dims


def parse_shapes(values):
    items = split_list(values)
    if not items:
        return None
    shapes = []
    for item in items:
        s = parse_shape(item)
        if s not in shapes:
            shapes.append(s)
    return tuple(shapes)


def parse_axes(values):
    """'-1' / 'last' -> -1, 'none' / 'all' -> None (the whole array)."""
    items = split_list(values)
    if not items:
        return None
    axes = []
    for item in items:
        key = item.lower()
        if key in ("-1", "last"):
            axis = -1
        elif key in ("none", "all"):
            axis = None
        else:
            raise ValueError(f"--axis: unknown axis {item!r}; expected -1 (last) or none (all)")
        if axis not in axes:
            axes.append(axis)
    return tuple(axes)


# ----------------------------------------------------------------------------------
# expansion
# ----------------------------------------------------------------------------------
def suite_spec(suite, op):
    try:
        table = SUITES[suite]
    except KeyError:
        raise ValueError(f"--suite: unknown suite {suite!r}; expected one of {', '.join(SUITES)}") from None
    return table.get(op, table["*"])


def expand_cases(ops, suite="quick", dtypes=None, shapes=None, axes=None):
    """Every (op, axis, shape, dtype) to run. Explicit dtypes/shapes/axes replace the
    suite's; a dtype an op does not take is left out for that op only."""
    cases = []
    for op in ops:
        suite_shapes, suite_dtypes = suite_spec(suite, op)
        op_shapes = shapes or suite_shapes
        op_dtypes = [d for d in (dtypes or suite_dtypes) if d in OP_DTYPES[op]]
        if op in DEFAULT_AXES:
            op_axes = axes or DEFAULT_AXES[op]
        elif op in ("trace", "matmul"):
            op_axes = (None,)
        else:
            op_axes = (-1,)
        if op == "trace":
            for s in op_shapes:
                if len(s) != 2:
                    raise ValueError(f"--shape: trace needs a 2-D shape, got {'x'.join(map(str, s))}")
        if op == "matmul":
            op_shapes = [s for s in op_shapes if len(s) == 3] if shapes and len(ops) > 1 else op_shapes
            for s in op_shapes:
                if len(s) != 3:
                    raise ValueError(f"--shape: matmul takes MxNxK, got {'x'.join(map(str, s))}")
        for axis in op_axes:
            for shape in op_shapes:
                for dtype in op_dtypes:
                    cases.append(Case(op, dtype, tuple(shape), axis))
    return cases


def check_impl_names(requested, variants, ops):
    """Every requested impl must be a variant of some selected op, 'auto' or a baseline."""
    if not requested:
        return
    valid = ["auto", *BASELINE_NAMES]
    for op in ops:
        valid += [v for v in variants.get(op, ()) if v not in valid]
    for name in requested:
        if name not in valid:
            raise ValueError(f"--impl: unknown impl {name!r} for {', '.join(ops)}; "
                             f"expected one of {', '.join(valid)}")


def is_slow_rung(name, ladder):
    """The textbook rung (first of the ladder) and anything called naive; for GEMM also
    the one-output-per-thread shared-memory rung."""
    return (len(ladder) > 1 and name == ladder[0]) or "naive" in name or name == "tiled"


# GEMM's textbook rungs run at a few TFLOP/s: past this many multiply-adds they are left
# out unless --no-skip-slow, in every suite (the default suite has 8192^3 products).
GEMM_SLOW_LIMIT = 2**31


def impls_for(case, ladder, requested=None, baselines=True, skip_slow=False,
              slow_limit=SLOW_LIMIT, gemm_skip_slow=True):
    """The impls to run on ``case``: ladder order, then 'auto', then baselines."""
    ladder = list(ladder)
    wanted = requested if requested else [*ladder, "auto", *BASELINES[case.op]]
    if case.op == "matmul":
        skip_slow, slow_limit = gemm_skip_slow, GEMM_SLOW_LIMIT
    out = []
    for name in ladder + ["auto"]:
        if name not in wanted:
            continue
        skip = None
        if skip_slow and name != "auto" and is_slow_rung(name, ladder) and case.work > slow_limit:
            what = "multiply-adds" if case.op == "matmul" else "elements"
            skip = f"slow rung on {case.work} > {slow_limit} {what} (--no-skip-slow runs it)"
        out.append(Impl(name, "auto" if name == "auto" else "variant", skip))
    if baselines:
        out += [Impl(b, "baseline") for b in BASELINES[case.op] if b in wanted]
    return out


def build_plan(cases, variants, requested=None, baselines=True, skip_slow=False,
               slow_limit=SLOW_LIMIT, gemm_skip_slow=True):
    """[(case, [Impl, ...]), ...]; cases left with nothing to run are dropped."""
    plan = []
    for case in cases:
        impls = impls_for(case, variants.get(case.op, ()), requested, baselines,
                          skip_slow, slow_limit, gemm_skip_slow)
        if impls:
            plan.append((case, impls))
    return plan


# ----------------------------------------------------------------------------------
# the floor: bytes that must move
# ----------------------------------------------------------------------------------
def result_itemsize(op, dtype):
    """Bytes per output element. Integer sums and traces widen to int64 as in NumPy."""
    if op in ("sum", "trace") and dtype in ("int32", "int64"):
        return 8
    if op == "matmul" and dtype == "int8":
        return 4
    return ITEMSIZE[dtype]


def bytes_moved(case):
    """Each input read once, each output written once. For trace only the diagonal
    elements count (the DRAM actually moves a 32-byte sector per element, so trace's
    GB/s understates the traffic)."""
    s = ITEMSIZE[case.dtype]
    numel, n = case.numel, case.cols
    if case.op == "trace":
        return min(case.shape) * s + result_itemsize("trace", case.dtype)
    if case.op in ("sum", "max"):
        out_elems = 1 if case.axis is None else case.rows
        return numel * s + out_elems * result_itemsize(case.op, case.dtype)
    if case.op == "softmax":
        return 2 * numel * s
    if case.op == "layer_norm":
        return 2 * numel * s + 2 * n * s  # + weight + bias
    if case.op == "rms_norm":
        return 2 * numel * s + n * s  # + weight
    if case.op == "matmul":
        M, N, K = case.shape
        return (M * K + K * N) * s + M * N * result_itemsize("matmul", case.dtype)
    raise ValueError(f"unknown op {case.op!r}")


def flops(case):
    """Floating-point (int8: integer) operations of the case: 2 M N K for matmul, None for
    the memory-bound ops (their metric is bandwidth)."""
    if case.op == "matmul":
        M, N, K = case.shape
        return 2 * M * N * K
    return None


def sample_rows(case, limit=CHECK_LIMIT):
    """Rows to validate: None (all) when the case is small or not row-wise, else an evenly
    spaced sorted subset always holding the first and the last row."""
    if case.op == "matmul":
        # the float64 host reference costs M*N*K multiply-adds: keep it to ~64 rows' worth
        if limit <= 0 or case.work <= 16 * limit:
            return None
        k = 64
    elif not case.row_wise or limit <= 0 or case.numel <= limit:
        return None
    else:
        k = max(2, limit // case.cols)
    if k >= case.rows:
        return None
    return np.unique(np.linspace(0, case.rows - 1, k).round().astype(np.int64))


def tolerance(case, table):
    """Allowed rel_error from reference.TOLERANCE; integer results must be exact."""
    if case.dtype in ("int32", "int64", "int8"):
        return 0.0
    tol = table[TOLERANCE_KIND[case.op]][case.dtype]
    if case.op == "matmul" and case.dtype == "float32":
        # K products summed in float32: the rounding error grows as sqrt(K) (cuBLAS too)
        tol = max(tol, 2e-7 * math.sqrt(case.shape[2]))
    return tol
