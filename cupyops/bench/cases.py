"""What the benchmark runs: ops, dtypes, shapes, suites, the plan of (case, impls), and the
bytes each case must move at the least.

The facts of each operator (dtypes, bytes, flops, tolerance, baselines, how its shapes
look) are its description in ``operators``; this module holds the generic rules that read
them, plus the suites' shapes. Pure Python and NumPy only (no CuPy, no GPU), so the CPU
tests cover all of it. Every parse error is a ValueError whose message names the option and
lists what it accepts; the CLI turns it into a usage error.
"""
import re
from dataclasses import dataclass

import numpy as np

from . import operators
from .operators import (ATTN_CHECK_ROWS, DECODE_MAX_Q, EXACT_DTYPES, FLOAT_DTYPES, ITEMSIZE, LAYOUTS,
                        OPERATORS, SDPA_BACKENDS, AttnShape, operator)

visible_pairs = operators.visible_pairs  # attention's work, counted where the other facts are

OPS = tuple(OPERATORS)
_OP_ALIASES = {alias: op for op, spec in OPERATORS.items() for alias in spec.aliases}

_DTYPE_ALIASES = {
    "fp32": "float32", "f32": "float32", "float": "float32",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64", "f64": "float64", "double": "float64",
    "i32": "int32", "i64": "int64", "i8": "int8",
    "e4m3": "float8_e4m3", "fp8": "float8_e4m3", "float8": "float8_e4m3",
}
BASELINE_NAMES = ("cupy", "torch", *SDPA_BACKENDS)

# Textbook rungs are only timed up to this many elements when slow rungs are skipped.
SLOW_LIMIT = 2**24
# Row-wise outputs are validated on an evenly spaced subset of rows above this many input
# elements: the float64 host reference of a 2^27-element case costs seconds per variant,
# while a NaN-poisoned out= catches unwritten elements over the whole output on the GPU.
CHECK_LIMIT = 2**22

_BIG_SHAPES = ((16384, 8192), (65536, 1024), (1024, 131072))
_HALF = ("float16", "bfloat16")
# matmul shapes are (M, N, K). LLM inference: decode (M = 1, 16 token rows against a
# 4096x4096 or 4096x11008 weight), a prefill MLP projection, and the big square.
_LLM_GEMMS = ((1, 4096, 4096), (16, 4096, 4096), (1, 11008, 4096), (4096, 4096, 11008),
              (8192, 8192, 8192))
_SQUARE_GEMMS = ((4096, 4096, 4096), (8192, 8192, 8192))
_HOPPER_SQUARES = ((2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192))
# Llama-3-8B's prefill projections as x @ w.T: q/k/v fused (N = 4096 + 2 * 1024), o, gate
# and up fused (2 * 14336), down; at 4096 and at 512 tokens.
_LLAMA3_8B_PREFILL = tuple((m, n, k) for m in (4096, 512)
                           for n, k in ((6144, 4096), (4096, 4096), (28672, 4096),
                                        (4096, 14336)))
_TRACE_SHAPE = (5977, 7890)  # awkward, non-square: the acceptance shape for trace

# the GEMMs' operand layouts (operators.LAYOUTS), as --layout's errors spell them
LAYOUT_HELP = "nn (a @ b, b stored K x N) or nt (x @ w.T, w stored N x K, w.T a view)"

# Attention masks: name -> (causal, causal_align) as cupyops.attention takes them. "causal"
# is PyTorch SDPA's is_causal (row i sees keys j <= i); "causal_br" aligns the mask to the
# bottom right (row i sees j <= i + Skv - Sq: the KV-cache convention).
MASKS = {"none": (False, "top_left"), "causal": (True, "top_left"),
         "causal_br": (True, "bottom_right")}
_MASK_ALIASES = {
    "none": "none", "no": "none", "off": "none", "false": "none", "0": "none",
    "full": "none", "noncausal": "none", "non-causal": "none",
    "causal": "causal", "yes": "causal", "on": "causal", "true": "causal", "1": "causal",
    "top_left": "causal", "top-left": "causal", "tl": "causal",
    "causal_br": "causal_br", "causal-br": "causal_br", "bottom_right": "causal_br",
    "bottom-right": "causal_br", "br": "causal_br",
}
# The acceptance cases: (shape, masks, dtypes). Prefill: MHA with D = 128 and
# D = 64, causal and not, and GQA 32:8 at 8192 tokens (causal, as in a decoder's prefill);
# decode: one new token per sequence against a 4K or 32K KV cache, batch 16 and 64, GQA
# 32:8. For Sq = 1 a bottom-right causal mask sees every key: decode runs unmasked.
ATTENTION_CASES = (
    (AttnShape(4, 16, 16, 4096, 4096, 128), ("none", "causal"), _HALF),
    (AttnShape(4, 32, 32, 4096, 4096, 64), ("none", "causal"), _HALF),
    (AttnShape(1, 32, 8, 8192, 8192, 128), ("causal",), _HALF),
    # the Hopper attention issue's additions: head_dim 256 (Gemma class), short and very
    # long sequences, and chunked prefill (a 1024-token chunk against an 8192-token cache,
    # judged against the square causal case of its head_dim in TFLOP/s)
    (AttnShape(2, 8, 8, 4096, 4096, 256), ("none", "causal"), _HALF),
    (AttnShape(16, 16, 16, 1024, 1024, 128), ("none",), _HALF),
    (AttnShape(1, 16, 16, 16384, 16384, 128), ("none",), _HALF),
    (AttnShape(4, 16, 16, 1024, 8192, 128), ("causal_br",), _HALF),
    *((AttnShape(b, 32, 8, 1, skv, 128), ("none",), ("bfloat16",))
      for b in (16, 64) for skv in (4096, 32768)),
)
# matmul: groups of (shapes, layouts, dtypes), expanded layout by layout, a case met twice
# kept once. The full suite keeps the GEMM issue's nn set in every dtype (compared across
# sessions) and adds the Hopper GEMM acceptance set in the 16-bit dtypes only: squares
# in both layouts, Llama-3-8B prefill as the model runs it (nt). float32 and int8 stay off
# the new shapes, where the float32 rungs would make the run long for nothing targeted.
MATMUL_QUICK = ((_LLM_GEMMS, ("nn",), _HALF),)
MATMUL_FULL = (
    (_LLM_GEMMS + _SQUARE_GEMMS[:1], ("nn",), FLOAT_DTYPES + ("int8",)),
    (_HOPPER_SQUARES, LAYOUTS, _HALF),
    (_LLAMA3_8B_PREFILL, ("nt",), _HALF),
)
# scaled_matmul (FP8 issue's acceptance set): e4m3 x e4m3 -> bfloat16, x @ w.T as
# torch._scaled_mm takes it (w stored N x K), the squares and the 4096-token Llama shapes.
SCALED_MATMUL_QUICK = ((((4096, 4096, 4096),), ("nt",), ("float8_e4m3",)),)
SCALED_MATMUL_FULL = ((_SQUARE_GEMMS + tuple(s for s in _LLAMA3_8B_PREFILL if s[0] == 4096), ("nt",),
                       ("float8_e4m3",)),)
# The fused operators at the acceptance size, 16384 tokens of hidden 4096 (Llama-3-8B:
# 32 query heads and 8 key/value heads of 128 for rope), and a quarter of it for quick.
_FUSED_FULL = {"silu_and_mul": (16384, 8192), "gelu_and_mul": (16384, 8192), "add_rms_norm": (16384, 4096),
               "rope": (16384, 32, 8, 128)}
_FUSED_QUICK = {op: (s[0] // 4,) + s[1:] for op, s in _FUSED_FULL.items()}
# suite -> op ("*" = any other op) -> (shapes, dtypes); attention: ATTENTION_CASES;
# matmul, scaled_matmul: MATMUL_*, SCALED_MATMUL_*
SUITES = {
    # One mid-size shape, the 4-byte and the bf16 path: a smoke run of every rung that
    # still fills the GPU (64 MiB of float32 is above any L2). Attention is not in the
    # default selection of this suite (SUITE_OPS): `--op attention` runs its acceptance set.
    "quick": {
        "trace": ((_TRACE_SHAPE,), ("float32",)),
        "matmul": MATMUL_QUICK,
        "scaled_matmul": SCALED_MATMUL_QUICK,
        "attention": ATTENTION_CASES,
        **{op: ((shape,), ("float32", "bfloat16")) for op, shape in _FUSED_QUICK.items()},
        "*": (((4096, 4096),), ("float32", "bfloat16")),
    },
    # The acceptance shapes: square-ish, many short rows, few very long rows.
    "full": {
        "trace": ((_TRACE_SHAPE,), ("float32",)),
        "matmul": MATMUL_FULL,
        "scaled_matmul": SCALED_MATMUL_FULL,
        "attention": ATTENTION_CASES,
        **{op: ((shape,), FLOAT_DTYPES) for op, shape in _FUSED_FULL.items()},
        "*": (_BIG_SHAPES, FLOAT_DTYPES),
    },
}
# The fused LLM operators (issue 19), as the suites size them: silu/gelu_and_mul x's
# [tokens, 2d]; add_rms_norm x's [tokens, hidden]; rope (tokens, q_heads, kv_heads, head_dim).
FUSED_OPS = tuple(_FUSED_FULL)
# The ops a suite runs when no --op is given.
SUITE_OPS = {"quick": tuple(op for op in OPS if op != "attention"), "full": OPS}


@dataclass(frozen=True)
class Case:
    """One input to time every impl on: op, dtype, shape and (for reductions) axis;
    attention: an AttnShape and its mask (causal, causal_align); matmul: (M, N, K) and
    the operand layout (LAYOUTS). How the shape reads (rows, cols, elements) is the op's
    description's (``spec``)."""

    op: str
    dtype: str
    shape: tuple
    axis: object = -1  # -1, or None for a reduction over everything (trace: None)
    causal: bool = False  # attention only
    causal_align: str = "top_left"  # attention only: "top_left" | "bottom_right"
    layout: str = "nn"  # matmul only: "nn" | "nt"; "" for the other ops

    def __post_init__(self):
        spec = self.spec
        if spec.family == "attention":
            object.__setattr__(self, "shape", AttnShape(*self.shape))
            object.__setattr__(self, "axis", None)
            if not self.causal:  # one spelling per mask, so equal cases compare equal
                object.__setattr__(self, "causal_align", "top_left")
        if not spec.layouts:  # one spelling again: no layout outside the GEMMs
            object.__setattr__(self, "layout", "")
        elif self.layout not in spec.layouts:
            raise ValueError(f"{self.op} layout {self.layout!r}: {', '.join(spec.layouts)} only")

    @property
    def spec(self):
        """The op's description (operators.Operator)."""
        return operator(self.op)

    @property
    def numel(self):
        """Elements (rope: q's and k's)."""
        return self.spec.numel(self.shape)

    @property
    def cols(self):
        """Length of the row the row-wise ops work on (matmul: N, the output's row; rope: a
        token's elements of q and k)."""
        return self.spec.cols(self.shape)

    @property
    def rows(self):
        """Rows of the output checked row by row (matmul: M; rope: tokens)."""
        rows = self.spec.rows
        return rows(self.shape) if rows else self.numel // self.cols

    @property
    def work(self):
        """What makes a rung slow: elements, or multiply-adds (M*N*K) for matmul."""
        return self.numel  # matmul's shape is (M, N, K)

    @property
    def row_wise(self):
        """True when each output row depends only on the same input row (so a subset of
        rows can be checked on its own; matmul: row i of the output is row i of A times B).
        A reduction is row-wise along the last axis only."""
        spec = self.spec
        return spec.row_wise and (not spec.axis_option or self.axis == -1)

    @property
    def mask(self):
        """Attention: "none", "causal" (top-left) or "causal_br"; "" for the other ops."""
        if self.spec.family != "attention":
            return ""
        if not self.causal:
            return "none"
        return "causal" if self.causal_align == "top_left" else "causal_br"

    @property
    def causal_offset(self):
        """Attention: row i sees keys j <= i + causal_offset (the kernels' contract)."""
        return 0 if self.causal_align == "top_left" else self.shape.Skv - self.shape.Sq

    @property
    def decode(self):
        """Attention with at most DECODE_MAX_Q query rows: the memory-bound KV-cache case."""
        return self.spec.family == "attention" and self.shape.Sq <= DECODE_MAX_Q

    @property
    def shape_str(self):
        if isinstance(self.shape, AttnShape):
            return str(self.shape)
        return "x".join(str(d) for d in self.shape)

    @property
    def axis_str(self):
        if not self.spec.has_axis:
            return ""
        return "all" if self.axis is None else str(self.axis)

    @property
    def key(self):
        return (self.op, self.axis_str, self.dtype, self.shape_str, self.mask, self.layout)

    def __str__(self):
        axis = f" axis={self.axis_str}" if self.axis_str else ""
        mask = f" {self.mask}" if self.mask else ""
        layout = f" {self.layout}" if self.layout else ""  # as the report's shape column
        return f"{self.op}{axis}{mask} {self.dtype} {self.shape_str}{layout}"


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
        if not any(dt in operator(op).dtypes for op in ops):
            raise ValueError(f"--dtype: {dt} is not supported by {', '.join(ops)} "
                             f"(the float-only ops take {', '.join(FLOAT_DTYPES)})")
        if dt not in dtypes:
            dtypes.append(dt)
    return tuple(dtypes)


def parse_shape(text):
    """'16384x8192' -> (16384, 8192). 'x', 'X' and '*' all separate dimensions. A shape
    with named dimensions is an attention shape (parse_attention_shape)."""
    t = text.strip().lower().replace("*", "x")
    if re.search(r"[a-wyz]", t):  # letters other than the separator: named dimensions
        return parse_attention_shape(text)
    parts = t.split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"--shape: cannot parse {text!r}; expected positive dimensions "
                         f"joined by 'x', e.g. 16384x8192 (attention: named, e.g. "
                         f"B4xHq16xHkv16xSq4096xSkv4096xD128)")
    return dims


_ATTN_DIMS = {"b": ("B",), "hq": ("Hq",), "hkv": ("Hkv",), "h": ("Hq", "Hkv"),
              "sq": ("Sq",), "skv": ("Skv",), "s": ("Sq", "Skv"), "d": ("D",)}


def parse_attention_shape(text):
    """'B4xHq16xHkv16xSq4096xSkv4096xD128' -> AttnShape(4, 16, 16, 4096, 4096, 128).

    Named dimensions joined by 'x', in any order, case-insensitive: B (batch), Hq and Hkv
    (query and key/value heads; H sets both), Sq and Skv (query and key/value lengths;
    S sets both), D (head_dim). Hkv defaults to Hq; Hq must be a multiple of Hkv (GQA)."""
    err = (f"--shape: cannot parse attention shape {text!r}; expected named dimensions "
           f"joined by 'x', e.g. B4xHq16xHkv16xSq4096xSkv4096xD128 or B4xH16xS4096xD128 "
           f"(B batch, Hq/Hkv heads, Sq/Skv lengths, D head_dim)")
    dims = {}
    for part in text.strip().lower().replace("*", "x").split("x"):
        m = re.fullmatch(r"([a-z]+)(\d+)", part)
        if not m or m.group(1) not in _ATTN_DIMS:
            raise ValueError(err)
        value = int(m.group(2))
        if value <= 0:
            raise ValueError(f"{err}; {part!r} must be positive")
        for name in _ATTN_DIMS[m.group(1)]:
            if name in dims:
                raise ValueError(f"{err}; {name} is given twice")
            dims[name] = value
    dims.setdefault("Hkv", dims.get("Hq"))
    missing = [n for n in AttnShape._fields if dims.get(n) is None]
    if missing:
        raise ValueError(f"{err}; missing {', '.join(missing)}")
    if dims["Hq"] % dims["Hkv"]:
        raise ValueError(f"--shape: {text!r}: Hq ({dims['Hq']}) must be a multiple of Hkv "
                         f"({dims['Hkv']})")
    return AttnShape(**dims)


def _parse_each(values, convert):
    """The items of a repeatable or comma-list option, each through ``convert`` (which raises
    ValueError naming the option for a bad one), duplicates dropped, order kept; None when
    the option was not given."""
    items = split_list(values)
    if not items:
        return None
    out = []
    for item in items:
        value = convert(item)
        if value not in out:
            out.append(value)
    return tuple(out)


def _mask(item):
    mask = _MASK_ALIASES.get(item.lower())
    if mask is None:
        raise ValueError(f"--causal: unknown mask {item!r}; expected none, causal "
                         f"(top_left, PyTorch's is_causal) or causal_br (bottom_right, "
                         f"the KV-cache alignment)")
    return mask


def _layout(item):
    if item.lower() not in LAYOUTS:
        raise ValueError(f"--layout: unknown layout {item!r}; expected {LAYOUT_HELP}")
    return item.lower()


def _axis(item):
    key = item.lower()
    if key in ("-1", "last"):
        return -1
    if key in ("none", "all"):
        return None
    raise ValueError(f"--axis: unknown axis {item!r}; expected -1 (last) or none (all)")


def parse_masks(values):
    """--causal: attention masks, e.g. 'none,causal' -> ('none', 'causal')."""
    return _parse_each(values, _mask)


def parse_layouts(values):
    """--layout: matmul operand layouts, e.g. 'nn,NT' -> ('nn', 'nt')."""
    return _parse_each(values, _layout)


def parse_shapes(values):
    return _parse_each(values, parse_shape)


def parse_axes(values):
    """'-1' / 'last' -> -1, 'none' / 'all' -> None (the whole array)."""
    return _parse_each(values, _axis)


# ----------------------------------------------------------------------------------
# expansion
# ----------------------------------------------------------------------------------
def suite_spec(suite, op):
    try:
        table = SUITES[suite]
    except KeyError:
        raise ValueError(f"--suite: unknown suite {suite!r}; expected one of {', '.join(SUITES)}") from None
    return table.get(op, table["*"])


def suite_ops(suite):
    """The ops a suite runs when --op is not given (quick leaves attention out)."""
    suite_spec(suite, "*")  # the unknown-suite error
    return SUITE_OPS[suite]


def expand_cases(ops, suite="quick", dtypes=None, shapes=None, axes=None, masks=None,
                 layouts=None):
    """Every (op, axis, shape, dtype) to run (attention: (shape, mask, dtype); matmul:
    (layout, shape, dtype)). Explicit dtypes/shapes/axes replace the suite's; masks and
    layouts select among the suite's (see _attention_cases, _gemm_cases); a dtype an op
    does not take is left out for that op only. Attention shapes (named dimensions) go to
    attention only, the others to the other ops; when several ops are selected, an op given
    no shape of its kind is left out, and so is a shape another op claims by its rank
    (rope's 4-D shapes)."""
    claimed = {OPERATORS[op].claims_rank for op in ops} - {None}
    cases = []
    for op in ops:
        spec = operator(op)
        attention = spec.family == "attention"
        shapes_for_op = None
        if shapes:
            mine = [s for s in shapes if isinstance(s, AttnShape) == attention]
            if not mine:
                if len(ops) > 1:
                    continue
                if attention:
                    raise ValueError(f"--shape: {op} takes {spec.shape_help}")
                raise ValueError(f"--shape: {op} takes plain dimensions (e.g. 16384x8192), "
                                 f"not an attention shape")
            shapes_for_op = tuple(mine)
        if attention:
            cases += _attention_cases(op, suite, dtypes, shapes_for_op, masks)
            continue
        if shapes_for_op and claimed:
            if spec.claims_rank:
                kept = tuple(s for s in shapes_for_op if len(s) == spec.claims_rank)
            else:
                kept = tuple(s for s in shapes_for_op if len(s) not in claimed)
            if not kept:
                if len(ops) > 1:
                    continue
                raise ValueError(f"--shape: {op} takes {spec.shape_help}")
            shapes_for_op = kept
        if spec.family == "gemm":
            if shapes_for_op and len(ops) > 1:  # the 2-D shapes are the other ops'
                shapes_for_op = tuple(s for s in shapes_for_op if len(s) == 3)
                if not shapes_for_op:
                    continue
            cases += _gemm_cases(op, suite, dtypes, shapes_for_op, layouts)
            continue
        suite_shapes, suite_dtypes = suite_spec(suite, op)
        op_shapes = shapes_for_op or suite_shapes
        op_dtypes = [d for d in (dtypes or suite_dtypes) if d in spec.dtypes]
        op_axes = (axes or spec.axes) if spec.axis_option else spec.axes
        for s in op_shapes:
            problem = spec.check_shape(s) if spec.check_shape else None
            if problem:
                raise ValueError(f"--shape: {problem}")
        for axis in op_axes:
            for shape in op_shapes:
                for dtype in op_dtypes:
                    cases.append(Case(op, dtype, tuple(shape), axis))
    return cases


def _gemm_cases(op, suite, dtypes, shapes, layouts):
    """The suite's cases of a GEMM op (matmul, scaled_matmul), group by group (MATMUL_*,
    SCALED_MATMUL_*), each in layout, shape, dtype order; or each explicit shape in
    --layout's layouts (default: the op's first, nn; scaled_matmul: nt) and the dtypes of
    every suite group. --layout keeps the suite's cases of those layouts; --dtype replaces
    each group's dtypes. A case met twice (4096^3 nt is a square and a Llama projection) is
    kept once, where first met."""
    spec = operator(op)
    groups = suite_spec(suite, op)
    if shapes:
        for s in shapes:
            problem = spec.check_shape(s)
            if problem:
                raise ValueError(f"--shape: {problem}")
        suite_dtypes = tuple(dict.fromkeys(d for _, _, ds in groups for d in ds))
        entries = [(shapes, layouts or spec.layouts[:1], suite_dtypes)]
    else:
        entries = []
        for group_shapes, group_layouts, group_dtypes in groups:
            kept = tuple(x for x in group_layouts if x in layouts) if layouts else group_layouts
            if kept:
                entries.append((group_shapes, kept, group_dtypes))
        if not entries:
            has = sorted({x for _, ls, _ in groups for x in ls})
            raise ValueError(f"--layout: the {suite} suite runs {op} in {', '.join(has)} "
                             f"only, not {', '.join(layouts)}; give --shape MxNxK or another "
                             f"--suite")
    cases, seen = [], set()
    for entry_shapes, entry_layouts, entry_dtypes in entries:
        for layout in entry_layouts:
            for shape in entry_shapes:
                for dtype in (dtypes or entry_dtypes):
                    if dtype not in spec.dtypes or layout not in spec.layouts:
                        continue
                    case = Case(op, dtype, tuple(shape), None, layout=layout)
                    if case in seen:
                        continue
                    seen.add(case)
                    cases.append(case)
    return cases


def _attention_cases(op, suite, dtypes, shapes, masks):
    """The suite's attention cases, or each explicit shape under --causal's masks (default
    unmasked) in --dtype's dtypes (default: those of the suite's cases, float16 and
    bfloat16). --dtype and --causal also filter/replace the suite's."""
    suite_cases = suite_spec(suite, op)
    if shapes:
        suite_dtypes = tuple(dict.fromkeys(d for _, _, ds in suite_cases for d in ds))
        entries = [(s, masks or ("none",), suite_dtypes) for s in shapes]
    else:
        entries = []
        for shape, suite_masks, shape_dtypes in suite_cases:
            m = tuple(x for x in suite_masks if x in masks) if masks else suite_masks
            if m:
                entries.append((shape, m, shape_dtypes))
    dtypes_taken = operator(op).dtypes
    cases = []
    for shape, shape_masks, shape_dtypes in entries:
        for mask in shape_masks:
            causal, align = MASKS[mask]
            for dtype in (dtypes or shape_dtypes):
                if dtype in dtypes_taken:
                    cases.append(Case(op, dtype, shape, None, causal, align))
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


def slow_reason(name, ladder, case, limit):
    """Why the slow-rung rule leaves rung ``name`` out of ``case``: the op's own rule
    (attention's), else a textbook rung on more than ``limit`` of work; None to run it."""
    spec = case.spec
    if spec.slow_reason:
        return spec.slow_reason(name, case)
    if is_slow_rung(name, ladder) and case.work > limit:
        return f"slow rung on {case.work} > {limit} {spec.work_unit} (--no-skip-slow runs it)"
    return None


def impls_for(case, ladder, requested=None, baselines=True, skip_slow=False,
              slow_limit=SLOW_LIMIT, gemm_skip_slow=True):
    """The impls to run on ``case``: ladder order, then 'auto', then baselines. An op with
    its own slow limit (GEMM, attention) applies it in every suite unless
    ``gemm_skip_slow`` is False (--no-skip-slow)."""
    spec = case.spec
    ladder = list(ladder)
    base_names = spec.baselines_for(case, requested)
    wanted = requested if requested else [*ladder, "auto", *base_names]
    if spec.slow_limit is not None:
        skip_slow, slow_limit = gemm_skip_slow, spec.slow_limit
    out = []
    for name in ladder + ["auto"]:
        if name not in wanted:
            continue
        skip = None
        if skip_slow and name != "auto":
            skip = slow_reason(name, ladder, case, slow_limit)
        out.append(Impl(name, "auto" if name == "auto" else "variant", skip))
    if baselines:
        out += [Impl(b, "baseline") for b in base_names]
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
# the floor: bytes that must move, and the work
# ----------------------------------------------------------------------------------
def bytes_moved(case):
    """Each input read once, each output written once (the op's description counts them)."""
    return case.spec.bytes_moved(case)


def flops(case):
    """Floating-point (int8: integer) operations of the case: 2 M N K for matmul;
    attention 4 B Hq D (visible query-key pairs); None for the memory-bound ops (their
    metric is bandwidth)."""
    count = case.spec.flops
    return count(case) if count else None


def reports_bandwidth(case):
    """Whether GB/s (and % of copy bandwidth) mean something for the case: not for
    attention prefill, which is compute-bound (its Q+K+V+O bytes are a tiny floor)."""
    return case.spec.reports_bandwidth(case)


def sample_rows(case, limit=CHECK_LIMIT):
    """Rows to validate: None (all) when the case is small or not row-wise, else an evenly
    spaced sorted subset always holding the first and the last row."""
    family = case.spec.family
    if family == "attention":
        return None  # sampled its own way: attention_sample
    if family == "gemm":
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


# Attention is validated on a sample of ATTN_CHECK_ROWS query rows of a few batches and
# heads (see operators.ATTN_CHECK_ROWS).
@dataclass(frozen=True)
class AttnSample:
    """Which outputs O[b, i, h, :] of an attention case are compared with the reference:
    every combination of ``batches`` x ``rows`` x ``heads`` (sorted int64 arrays), and the
    key/value heads ``kv_heads`` they read, with ``kv_index[j]`` the position in
    ``kv_heads`` of query head ``heads[j]``'s key/value head."""

    batches: np.ndarray
    rows: np.ndarray
    heads: np.ndarray
    kv_heads: np.ndarray
    kv_index: np.ndarray


def attention_sample(case, max_rows=ATTN_CHECK_ROWS):
    """The sample of attention_sample's docstring: the first and last batch (4 evenly
    spaced batches for decode cases, whose few rows are cheap); query heads 0, 1, Hq/2 + 1
    and Hq - 1, so a GQA case checks heads that share a key/value head with another (1 with
    0) and heads whose key/value head is not h % Hkv (Hq/2 + 1); and max_rows evenly spaced
    query rows (all when Sq <= max_rows; 0 means all)."""
    B, Hq, Hkv, Sq, _, _ = case.shape
    spread = lambda n, k: np.unique(np.linspace(0, n - 1, min(n, k)).round().astype(np.int64))  # noqa: E731
    batches = spread(B, 4 if case.decode else 2)
    rows = spread(Sq, Sq if max_rows <= 0 else max_rows)
    heads = np.unique(np.array([0, 1, Hq // 2 + 1, Hq - 1], dtype=np.int64).clip(0, Hq - 1))
    group = Hq // Hkv
    kv_of = heads // group
    kv_heads = np.unique(kv_of)
    kv_index = np.searchsorted(kv_heads, kv_of)
    return AttnSample(batches, rows, heads, kv_heads, kv_index)


def tolerance(case, table):
    """Allowed rel_error from reference.TOLERANCE (the op's kind, by output dtype), widened
    where the op's error grows with its size; integer results must be exact."""
    if case.dtype in EXACT_DTYPES:
        return 0.0
    spec = case.spec
    tol = table[spec.tolerance_kind][spec.result_dtype(case.dtype)]
    if spec.widen_tolerance:
        tol = spec.widen_tolerance(case, tol)
    return tol
