"""What the benchmark runs: ops, dtypes, shapes, suites, the plan of (case, impls), and the
bytes each case must move at the least.

Pure Python and NumPy only (no CuPy, no GPU), so the CPU tests cover all of it. Every
parse error is a ValueError whose message names the option and lists what it accepts;
the CLI turns it into a usage error.
"""
import math
import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

OPS = ("trace", "sum", "max", "softmax", "layer_norm", "rms_norm", "matmul", "scaled_matmul", "attention",
       "silu_and_mul", "gelu_and_mul", "add_rms_norm", "rope")
# The fused LLM operators (issue 19). Their shapes: silu/gelu_and_mul x's [tokens, 2d];
# add_rms_norm x's [tokens, hidden]; rope (tokens, q_heads, kv_heads, head_dim), q
# [tokens, q_heads, head_dim] and k [tokens, kv_heads, head_dim].
FUSED_OPS = ("silu_and_mul", "gelu_and_mul", "add_rms_norm", "rope")
# gelu_and_mul's form timed (the operator's default, as torch.nn.functional.gelu's)
GELU_APPROXIMATE = "none"
# The GEMM-shaped ops: (M, N, K) shapes, operand layouts, multiply-adds as their work.
GEMM_OPS = ("matmul", "scaled_matmul")
_OP_ALIASES = {
    "amax": "max",
    "layernorm": "layer_norm",
    "layer-norm": "layer_norm",
    "rmsnorm": "rms_norm",
    "rms-norm": "rms_norm",
    "gemm": "matmul",
    "fp8": "scaled_matmul",
    "scaled_mm": "scaled_matmul",
    "attn": "attention",
    "sdpa": "attention",
    "silu": "silu_and_mul",
    "swiglu": "silu_and_mul",
    "gelu": "gelu_and_mul",
    "geglu": "gelu_and_mul",
    "fused_add_rms_norm": "add_rms_norm",
    "add-rms-norm": "add_rms_norm",
    "rotary": "rope",
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
    # float8 e4m3 operands (uint8 bits in CuPy), bfloat16 out, per-tensor scales
    "scaled_matmul": ("float8_e4m3",),
    "attention": FLOAT_DTYPES,
    **{op: FLOAT_DTYPES for op in FUSED_OPS},
}
_DTYPE_ALIASES = {
    "fp32": "float32", "f32": "float32", "float": "float32",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64", "f64": "float64", "double": "float64",
    "i32": "int32", "i64": "int64", "i8": "int8",
    "e4m3": "float8_e4m3", "fp8": "float8_e4m3", "float8": "float8_e4m3",
}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8,
            "int8": 1, "float8_e4m3": 1}

# Vendor baselines per op. CuPy has no layer/RMS norm of its own.
BASELINES = {
    "trace": ("cupy", "torch"),
    "sum": ("cupy", "torch"),
    "max": ("cupy", "torch"),
    "softmax": ("cupy", "torch"),
    "layer_norm": ("torch",),
    "rms_norm": ("torch",),
    "matmul": ("cupy", "torch"),  # cupy.matmul = cuBLAS (TF32 off); int8: torch._int_mm
    "scaled_matmul": ("torch",),  # torch._scaled_mm (cuBLASLt), use_fast_accum off as by default
    # torch.nn.functional.scaled_dot_product_attention, one row per backend (sdpa_kernel);
    # prefill cases get the two fast ones, decode cases all four (see attention_baselines)
    "attention": ("torch-flash", "torch-cudnn", "torch-efficient", "torch-math"),
    # the PyTorch eager compositions the fused operators replace (runners.baseline_call)
    **{op: ("torch",) for op in FUSED_OPS},
}
# SDPA backend of each attention baseline: the name in torch.nn.attention.SDPBackend
SDPA_BACKENDS = {"torch-flash": "FLASH_ATTENTION", "torch-cudnn": "CUDNN_ATTENTION",
                 "torch-efficient": "EFFICIENT_ATTENTION", "torch-math": "MATH"}
BASELINE_NAMES = ("cupy", "torch", *SDPA_BACKENDS)

# Which reference.TOLERANCE table applies. Softmax goes with the norms: it divides by a
# row sum after an exp, so float32 lands near 1e-6..1e-5, above the pure-reduction bar.
TOLERANCE_KIND = {
    "trace": "reduce", "sum": "reduce", "max": "reduce",
    "softmax": "norm", "layer_norm": "norm", "rms_norm": "norm", "matmul": "gemm",
    "scaled_matmul": "scaled_matmul", "attention": "attention",
    **{op: "norm" for op in FUSED_OPS},
}
NORM_EPS = {"layer_norm": 1e-5, "rms_norm": 1e-6, "add_rms_norm": 1e-6}

# Reductions are benchmarked along the last axis; sum also over the whole array.
DEFAULT_AXES = {"sum": (-1, None), "max": (-1,)}

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

# matmul operand layouts. nn: a @ b with b stored K x N (row-major), what matmul(a, b)
# of two plain arrays is; nt: an LLM linear layer, x @ w.T with the weight w stored N x K
# and w.T a view (no copy), so b is K-contiguous (column-major). Every impl and baseline of
# a case gets the same operands in the same layout.
LAYOUTS = ("nn", "nt")
# The layouts each GEMM op takes (8-bit wgmma and torch._scaled_mm read b K-major: nt), and
# the output dtype of an op whose result is not its input's.
OP_LAYOUTS = {"matmul": LAYOUTS, "scaled_matmul": ("nt",)}
OUT_DTYPE = {"scaled_matmul": "bfloat16"}
LAYOUT_HELP = "nn (a @ b, b stored K x N) or nt (x @ w.T, w stored N x K, w.T a view)"


class AttnShape(NamedTuple):
    """An attention problem's sizes: q [B, Sq, Hq, D], k and v [B, Skv, Hkv, D] ("bshd").
    Spelled with named dimensions, B4xHq16xHkv16xSq4096xSkv4096xD128 (see
    parse_attention_shape), so it can never be mistaken for a 6-D array shape."""

    B: int
    Hq: int
    Hkv: int
    Sq: int
    Skv: int
    D: int

    def __str__(self):
        return (f"B{self.B}xHq{self.Hq}xHkv{self.Hkv}xSq{self.Sq}xSkv{self.Skv}"
                f"xD{self.D}")


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
# At most this many query rows is a decode (KV-cache) case: memory-bound, reported in GB/s
# too, and the only cases the decode rung is timed on.
DECODE_MAX_Q = 16
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
# The ops a suite runs when no --op is given.
SUITE_OPS = {"quick": tuple(op for op in OPS if op != "attention"), "full": OPS}


@dataclass(frozen=True)
class Case:
    """One input to time every impl on: op, dtype, shape and (for reductions) axis;
    attention: an AttnShape and its mask (causal, causal_align); matmul: (M, N, K) and
    the operand layout (LAYOUTS)."""

    op: str
    dtype: str
    shape: tuple
    axis: object = -1  # -1, or None for a reduction over everything (trace: None)
    causal: bool = False  # attention only
    causal_align: str = "top_left"  # attention only: "top_left" | "bottom_right"
    layout: str = "nn"  # matmul only: "nn" | "nt"; "" for the other ops

    def __post_init__(self):
        if self.op == "attention":
            object.__setattr__(self, "shape", AttnShape(*self.shape))
            object.__setattr__(self, "axis", None)
            if not self.causal:  # one spelling per mask, so equal cases compare equal
                object.__setattr__(self, "causal_align", "top_left")
        if self.op not in GEMM_OPS:  # one spelling again: no layout outside the GEMMs
            object.__setattr__(self, "layout", "")
        elif self.layout not in OP_LAYOUTS[self.op]:
            raise ValueError(f"{self.op} layout {self.layout!r}: {', '.join(OP_LAYOUTS[self.op])} only")

    @property
    def numel(self):
        if self.op == "rope":  # q's and k's elements
            T, Hq, Hkv, D = self.shape
            return T * (Hq + Hkv) * D
        return math.prod(self.shape)

    @property
    def cols(self):
        """Length of the last axis: the row the row-wise ops work on (matmul: N, the
        output's row; rope: a token's elements of q and k)."""
        if self.op == "rope":
            return self.numel // self.shape[0]
        return self.shape[1] if self.op in GEMM_OPS else self.shape[-1]

    @property
    def rows(self):
        """Rows of the output checked row by row (matmul: M; rope: tokens)."""
        return self.shape[0] if self.op in GEMM_OPS else self.numel // self.cols

    @property
    def work(self):
        """What makes a rung slow: elements, or multiply-adds (M*N*K) for matmul."""
        return self.numel  # matmul's shape is (M, N, K)

    @property
    def row_wise(self):
        """True when each output row depends only on the same input row (so a subset of
        rows can be checked on its own; matmul: row i of the output is row i of A times B)."""
        return self.op in ("softmax", "layer_norm", "rms_norm", *GEMM_OPS, *FUSED_OPS) or (
            self.op in ("sum", "max") and self.axis == -1
        )

    @property
    def mask(self):
        """Attention: "none", "causal" (top-left) or "causal_br"; "" for the other ops."""
        if self.op != "attention":
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
        return self.op == "attention" and self.shape.Sq <= DECODE_MAX_Q

    @property
    def shape_str(self):
        if self.op == "attention":
            return str(self.shape)
        return "x".join(str(d) for d in self.shape)

    @property
    def axis_str(self):
        if self.op in ("trace", "attention", *GEMM_OPS):
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
        if not any(dt in OP_DTYPES[op] for op in ops):
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
    layouts select among the suite's (see _attention_cases, _matmul_cases); a dtype an op
    does not take is left out for that op only. Attention shapes (named dimensions) go to
    attention only, the others to the other ops; when several ops are selected, an op given
    no shape of its kind is left out."""
    cases = []
    for op in ops:
        if shapes:
            mine = [s for s in shapes if isinstance(s, AttnShape) == (op == "attention")]
            if not mine:
                if len(ops) > 1:
                    continue
                if op == "attention":
                    raise ValueError("--shape: attention takes named dimensions, e.g. "
                                     "B4xHq16xHkv16xSq4096xSkv4096xD128")
                raise ValueError(f"--shape: {op} takes plain dimensions (e.g. 16384x8192), "
                                 f"not an attention shape")
            shapes_for_op = tuple(mine)
        else:
            shapes_for_op = None
        if op == "attention":
            cases += _attention_cases(suite, dtypes, shapes_for_op, masks)
            continue
        if op == "rope" or (shapes_for_op and len(ops) > 1 and "rope" in ops):
            # rope's shapes are TxHqxHkvxD (4-D); among several ops, 4-D shapes go to it alone
            if shapes_for_op:
                kept = tuple(s for s in shapes_for_op if (len(s) == 4) == (op == "rope"))
                if not kept:
                    if len(ops) > 1:
                        continue
                    raise ValueError("--shape: rope takes tokens x q_heads x kv_heads x head_dim, "
                                     "e.g. 16384x32x8x128")
                shapes_for_op = kept
        if op in GEMM_OPS:
            if shapes_for_op and len(ops) > 1:  # the 2-D shapes are the other ops'
                shapes_for_op = tuple(s for s in shapes_for_op if len(s) == 3)
                if not shapes_for_op:
                    continue
            cases += _matmul_cases(suite, dtypes, shapes_for_op, layouts, op)
            continue
        suite_shapes, suite_dtypes = suite_spec(suite, op)
        op_shapes = shapes_for_op or suite_shapes
        op_dtypes = [d for d in (dtypes or suite_dtypes) if d in OP_DTYPES[op]]
        if op in DEFAULT_AXES:
            op_axes = axes or DEFAULT_AXES[op]
        elif op == "trace":
            op_axes = (None,)
        else:
            op_axes = (-1,)
        if op == "trace":
            for s in op_shapes:
                if len(s) != 2:
                    raise ValueError(f"--shape: trace needs a 2-D shape, got {'x'.join(map(str, s))}")
        if op in ("silu_and_mul", "gelu_and_mul"):
            for s in op_shapes:
                if s[-1] % 2:
                    raise ValueError(f"--shape: {op} takes x [..., 2d], an even last dimension, got "
                                     f"{'x'.join(map(str, s))}")
        for axis in op_axes:
            for shape in op_shapes:
                for dtype in op_dtypes:
                    cases.append(Case(op, dtype, tuple(shape), axis))
    return cases


def _matmul_cases(suite, dtypes, shapes, layouts, op="matmul"):
    """The suite's cases of a GEMM op (matmul, scaled_matmul), group by group (MATMUL_*,
    SCALED_MATMUL_*), each in layout, shape, dtype order; or each explicit shape in
    --layout's layouts (default nn; scaled_matmul: nt) and the dtypes of every suite group.
    --layout keeps the suite's cases of those layouts; --dtype replaces each group's
    dtypes. A case met twice (4096^3 nt is a square and a Llama projection) is kept once,
    where first met."""
    groups = suite_spec(suite, op)
    if shapes:
        for s in shapes:
            if len(s) != 3:
                raise ValueError(f"--shape: {op} takes MxNxK, got {'x'.join(map(str, s))}")
        suite_dtypes = tuple(dict.fromkeys(d for _, _, ds in groups for d in ds))
        entries = [(shapes, layouts or OP_LAYOUTS[op][:1], suite_dtypes)]
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
                    if dtype not in OP_DTYPES[op] or layout not in OP_LAYOUTS[op]:
                        continue
                    case = Case(op, dtype, tuple(shape), None, layout=layout)
                    if case in seen:
                        continue
                    seen.add(case)
                    cases.append(case)
    return cases


def _attention_cases(suite, dtypes, shapes, masks):
    """The suite's attention cases, or each explicit shape under --causal's masks (default
    unmasked) in --dtype's dtypes (default float16 and bfloat16). --dtype and --causal
    also filter/replace the suite's."""
    if shapes:
        entries = [(s, masks or ("none",), _HALF) for s in shapes]
    else:
        entries = []
        for shape, suite_masks, suite_dtypes in suite_spec(suite, "attention"):
            m = tuple(x for x in suite_masks if x in masks) if masks else suite_masks
            if m:
                entries.append((shape, m, suite_dtypes))
    cases = []
    for shape, shape_masks, shape_dtypes in entries:
        for mask in shape_masks:
            causal, align = MASKS[mask]
            for dtype in (dtypes or shape_dtypes):
                if dtype in OP_DTYPES["attention"]:
                    cases.append(Case("attention", dtype, shape, None, causal, align))
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

# Attention's slow rungs, left out unless --no-skip-slow (in every suite, as for GEMM):
# - naive materialises the B*Hq*Sq*Skv float32 score matrix in device memory: past 2 GiB
#   (every prefill acceptance case holds 4-8 GiB of scores) it is a memory hog whose time
#   says nothing new;
# - naive, tiled and flash_v1 multiply on CUDA cores at ~10-30 TFLOP/s: above 2^40 FLOP
#   (1.1 TFLOP) one call takes 40-110 ms, and the ~10 calls a timed rung costs (compile,
#   two validation calls, warm-up, >= 3 repeats) several seconds. Every prefill acceptance
#   case is 2.7e11-5.5e11 FLOP, so the ladder is timed on all of them;
# - decode keeps one query row's state per warp: past DECODE_MAX_Q query rows it is no
#   longer a decode case.
ATTN_NAIVE_SCORE_LIMIT = 2**31  # bytes of float32 scores
ATTN_SIMT_FLOP_LIMIT = 2**40
ATTN_SIMT_RUNGS = ("naive", "tiled", "flash_v1")
ATTENTION_SLOW_RULE = ("attention: naive when its B*Hq*Sq*Skv float32 scores exceed 2 GiB, "
                       "naive/tiled/flash_v1 above 2^40 FLOP, decode above 16 query rows")


def attention_score_bytes(case):
    B, Hq, _, Sq, Skv, _ = case.shape
    return 4 * B * Hq * Sq * Skv


def attention_skip(name, case):
    """Why the slow-rung rule leaves attention rung ``name`` out of ``case``, or None."""
    if "naive" in name and attention_score_bytes(case) > ATTN_NAIVE_SCORE_LIMIT:
        return (f"slow rung: {attention_score_bytes(case) / 2**30:.1f} GiB of float32 scores "
                f"> 2 GiB (--no-skip-slow runs it)")
    if name in ATTN_SIMT_RUNGS and flops(case) > ATTN_SIMT_FLOP_LIMIT:
        return (f"slow rung: CUDA cores, {flops(case) / 1e12:.2f} TFLOP > 2^40 FLOP "
                f"(--no-skip-slow runs it)")
    if name == "decode" and case.shape.Sq > DECODE_MAX_Q:
        return (f"decode rung: {case.shape.Sq} query rows > {DECODE_MAX_Q} "
                f"(--no-skip-slow runs it)")
    return None


def attention_baselines(case, wanted=None):
    """SDPA backends timed on an attention case: flash and cuDNN, and for decode cases
    also the memory-efficient and math backends. An explicit request (``wanted``) may name
    any of the four; 'torch' stands for the case's default set."""
    default = tuple(BASELINES["attention"]) if case.decode else ("torch-flash", "torch-cudnn")
    if not wanted:
        return default
    return tuple(b for b in BASELINES["attention"]
                 if b in wanted or ("torch" in wanted and b in default))


def impls_for(case, ladder, requested=None, baselines=True, skip_slow=False,
              slow_limit=SLOW_LIMIT, gemm_skip_slow=True):
    """The impls to run on ``case``: ladder order, then 'auto', then baselines."""
    ladder = list(ladder)
    if case.op == "attention":
        base_names = attention_baselines(case, requested)
    else:
        base_names = BASELINES[case.op]
    wanted = requested if requested else [*ladder, "auto", *base_names]
    if case.op in ("attention", *GEMM_OPS):
        skip_slow, slow_limit = gemm_skip_slow, GEMM_SLOW_LIMIT
    out = []
    for name in ladder + ["auto"]:
        if name not in wanted:
            continue
        skip = None
        if not skip_slow or name == "auto":
            pass
        elif case.op == "attention":
            skip = attention_skip(name, case)
        elif is_slow_rung(name, ladder) and case.work > slow_limit:
            what = "multiply-adds" if case.op in GEMM_OPS else "elements"
            skip = f"slow rung on {case.work} > {slow_limit} {what} (--no-skip-slow runs it)"
        out.append(Impl(name, "auto" if name == "auto" else "variant", skip))
    if baselines:
        out += [Impl(b, "baseline") for b in base_names if b in wanted or case.op == "attention"]
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
    return ITEMSIZE[OUT_DTYPE.get(op, dtype)]


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
    if case.op in ("silu_and_mul", "gelu_and_mul"):
        return numel * s + numel // 2 * s  # x [.., 2d] read, y [.., d] written
    if case.op == "add_rms_norm":
        return 4 * numel * s + n * s  # x, residual read; normed, sum written; + weight
    if case.op == "rope":  # q and k read and written, int64 positions read (cos/sin computed)
        return 2 * numel * s + case.shape[0] * 8
    if case.op in GEMM_OPS:
        M, N, K = case.shape
        return (M * K + K * N) * s + M * N * result_itemsize(case.op, case.dtype)
    if case.op == "attention":  # Q and O [B, Sq, Hq, D], K and V [B, Skv, Hkv, D]
        B, Hq, Hkv, Sq, Skv, D = case.shape
        return (2 * B * Sq * Hq * D + 2 * B * Skv * Hkv * D) * s
    raise ValueError(f"unknown op {case.op!r}")


def visible_pairs(Sq, Skv, causal=False, causal_offset=0):
    """(query, key) pairs attention computes: Sq * Skv, or under a causal mask the exact
    count sum_i clamp(i + causal_offset + 1, 0, Skv) (row i sees keys j <= i + offset;
    top_left: offset 0, bottom_right: Skv - Sq)."""
    if not causal:
        return Sq * Skv
    seen = np.clip(np.arange(Sq, dtype=np.int64) + (causal_offset + 1), 0, Skv)
    return int(seen.sum())


def flops(case):
    """Floating-point (int8: integer) operations of the case: 2 M N K for matmul;
    attention 4 B Hq D (visible query-key pairs): 2 for each multiply-add of S = Q K^T and
    of O = P V (the softmax's exponentials are not counted); None for the memory-bound ops
    (their metric is bandwidth)."""
    if case.op in GEMM_OPS:
        M, N, K = case.shape
        return 2 * M * N * K
    if case.op == "attention":
        B, Hq, _, Sq, Skv, D = case.shape
        return 4 * B * Hq * D * visible_pairs(Sq, Skv, case.causal, case.causal_offset)
    return None


def reports_bandwidth(case):
    """Whether GB/s (and % of copy bandwidth) mean something for the case: not for
    attention prefill, which is compute-bound (its Q+K+V+O bytes are a tiny floor)."""
    return case.op != "attention" or case.decode


def sample_rows(case, limit=CHECK_LIMIT):
    """Rows to validate: None (all) when the case is small or not row-wise, else an evenly
    spaced sorted subset always holding the first and the last row."""
    if case.op == "attention":
        return None  # sampled its own way: attention_sample
    if case.op in GEMM_OPS:
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


# Attention is validated on a sample: the float64 host reference of all of B4 H16 S4096
# D128 is 2e11 multiply-adds. ATTN_CHECK_ROWS query rows (first and last included) of a few
# batches and heads; the NaN-poisoned out= still covers the whole output on the GPU.
ATTN_CHECK_ROWS = 64


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
    """Allowed rel_error from reference.TOLERANCE; integer results must be exact."""
    if case.dtype in ("int32", "int64", "int8"):
        return 0.0
    tol = table[TOLERANCE_KIND[case.op]][OUT_DTYPE.get(case.op, case.dtype)]  # (by output dtype)
    if case.op == "matmul" and case.dtype == "float32":
        # K products summed in float32: the rounding error grows as sqrt(K) (cuBLAS too)
        tol = max(tol, 2e-7 * math.sqrt(case.shape[2]))
    return tol
