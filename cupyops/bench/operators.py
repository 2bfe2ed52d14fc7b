"""The benchmarked operators, each described once.

An ``Operator`` says everything ``cupyops-bench`` and the tests need to know about one
operator: its dtypes, how its case's inputs are made, its float64 reference (from
``cupyops.reference``), how a cupyops rung is called, its vendor baselines, the bytes it
must move and the flops it does, and the tolerance its error is judged by. The generic code
reads these fields and does not test an operator's name (the suite tables aside): ``cases`` (options, suites, the plan,
bytes and flops), ``runners`` (inputs, calls, validation), ``cli`` and ``report``; so do
tests/test_operators.py (every description complete and consistent) and
tests/test_gpu_operators.py (every rung x every dtype against the reference).

Adding an operator to the benchmark touches two places:
  1. its ``Operator(...)`` here, in ``OPERATORS`` at the place the CLI should list it;
  2. its shapes in ``cases.SUITES``, unless the default 2-D ``"*"`` shapes fit it.
(The operator itself lives elsewhere: its kernels, its ``cupyops/ops`` module, its
``cupyops.reference`` function, and the kernel files ``_kernels.warmup_async`` starts
compiling for it.)

Importable without CuPy or PyTorch (the CPU tier imports it): the functions that make
inputs or call into them import CuPy, cupyops or ``runners`` when called, on the GPU.
Their ``data`` argument is a ``runners.CaseData``: the case, its device arrays (``x``,
``weight``, ...), the rows checked (``rows``, None for all) and the reference.
"""
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import numpy as np

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
REDUCE_DTYPES = FLOAT_DTYPES + ("float64", "int32", "int64")
EXACT_DTYPES = ("int32", "int64", "int8")  # integer results are compared exactly
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8,
            "int8": 1, "float8_e4m3": 1}


@dataclass(frozen=True)
class Operator:
    """One operator as the benchmark and the tests see it. ``case`` arguments are
    cases.Case, ``data`` arguments runners.CaseData (see the module docstring)."""

    name: str
    dtypes: tuple  # what it is benchmarked and tested in (float8_e4m3: uint8 bits in CuPy)
    tolerance_kind: str  # the reference.TOLERANCE table its rel_error is judged by
    make_inputs: Callable  # (case, seed) -> {CaseData field: device array}; "x" always
    reference: Callable  # data -> float64 result(s) on the checked rows (tuple: several)
    call: Callable  # (data, impl) -> call(out=None) running cupyops' rung ``impl``
    # baseline name -> (data, torch) -> no-argument callable, the vendor's version of the
    # case; timed in this order. "cupy" needs CuPy only; every other name PyTorch.
    baselines: dict
    bytes_moved: Callable  # case -> bytes that must move: inputs read once, outputs written once
    flops: Optional[Callable] = None  # case -> operations; None: memory-bound (GB/s only)
    aliases: tuple = ()  # other spellings --op takes
    # how its cases are shaped: "array" (plain dimensions), "gemm" ((M, N, K) and an
    # operand layout), "attention" (an AttnShape and a mask)
    family: str = "array"
    axes: tuple = (-1,)  # the axes its cases run along; (None,): the op has no axis
    axis_option: bool = False  # --axis replaces ``axes`` (the reductions)
    # output row i depends on input row i alone, so a subset of rows can be checked; for
    # an op with an axis option only when it runs along the last axis
    row_wise: bool = True
    result_dtype: Callable = lambda dtype: dtype  # noqa: E731 - input dtype -> result dtype
    widen_tolerance: Optional[Callable] = None  # (case, tol) -> tol where error grows with size
    check_shape: Optional[Callable] = None  # shape -> what is wrong with it for this op, or None
    # among several ops, shapes of this many dimensions go to this op alone, and it takes no
    # other (rope's tokens x q_heads x kv_heads x head_dim); shape_help says what it takes
    claims_rank: Optional[int] = None
    shape_help: str = ""
    numel: Callable = math.prod  # shape -> elements (of all inputs the rows span)
    cols: Callable = lambda shape: shape[-1]  # noqa: E731 - shape -> a checked row's length
    rows: Optional[Callable] = None  # shape -> rows checked (default: numel // cols)
    layouts: tuple = ()  # gemm: the operand layouts it takes, the first the default
    # textbook rungs are left out above this much work in every suite unless
    # --no-skip-slow; None: --skip-slow and --slow-limit decide
    slow_limit: Optional[int] = None
    work_unit: str = "elements"  # what case.work counts, in skip reasons
    slow_reason: Optional[Callable] = None  # (rung, case) -> why it is left out, replacing the textbook rule
    choose_baselines: Optional[Callable] = None  # (case, requested) -> baselines, replacing the default
    reports_bandwidth: Callable = lambda case: True  # noqa: E731 - GB/s means something
    takes_out: bool = True  # its call takes out= (trace returns a scalar)
    header_lines: tuple = ()  # what the report's header adds when it ran
    # small shapes the GPU test runs every rung on (awkward sizes where the rungs allow)
    test_shapes: tuple = ()

    @property
    def has_axis(self):
        return self.axes != (None,)

    def result_itemsize(self, dtype):
        """Bytes per output element (integer sums widen to int64, int8 GEMM to int32)."""
        return ITEMSIZE[self.result_dtype(dtype)]

    def baselines_for(self, case, requested=None):
        """The baselines timed on ``case``: all of them, or those ``requested`` names."""
        if self.choose_baselines:
            return self.choose_baselines(case, requested)
        return tuple(b for b in self.baselines if not requested or b in requested)


def _gpu():
    """The GPU-side helpers (random inputs, row gathers), imported when first needed."""
    from . import runners

    return runners


def _cupyops():
    import cupyops

    return cupyops


def _ref():
    from .. import reference

    return reference


def _host_x(data, name="x"):
    """An input's checked rows on the host."""
    return _gpu().host_rows(data, getattr(data, name))


def _host_all(a):
    return None if a is None else a.get()


def _shape_text(shape):
    return "x".join(map(str, shape))


def _torch_inputs(data, torch):
    t = data.torch_args(torch)
    return t, torch.nn.functional


# ==================================================================================
# reductions: trace, sum, max
# ==================================================================================
def _widen_int(dtype):
    """Integer sums and traces widen to int64, as in NumPy."""
    return "int64" if dtype in ("int32", "int64") else dtype


def _x_only(case, seed):
    return {"x": _gpu().random_normal(case.shape, case.dtype, seed)}


def _sum_inputs(case, seed):
    """x for sum and trace; float32 and float64 as N(3, 1), whose sums do not cancel, so that
    a relative error measures the kernel and not the data's conditioning (a sum of n N(0, 1)
    terms is ~sqrt(n) times smaller than the sum of their magnitudes, and its relative error
    that much larger: the GPU tier drew 5e-6 for 67451 terms); half types stay at N(0, 1) so
    long sums fit float16's range (tests/test_gpu_ops.py draws its sums the same way)."""
    x = _gpu().random_normal(case.shape, case.dtype, seed)
    if case.dtype in ("float32", "float64"):
        x += 3
    return {"x": x}


def _sum_tolerance(case, tol):
    """float32: reference.float32_sum_tolerance of the terms of a result."""
    if case.dtype != "float32":
        return tol
    return _ref().float32_sum_tolerance(case.numel if case.axis is None else case.cols, tol)


def _trace_bytes(case):
    """Only the diagonal elements count (the DRAM moves a 32-byte sector per element, so
    trace's GB/s understates the traffic)."""
    return min(case.shape) * ITEMSIZE[case.dtype] + TRACE.result_itemsize(case.dtype)


def _reduce_bytes(case):
    out_elems = 1 if case.axis is None else case.rows
    return case.numel * ITEMSIZE[case.dtype] + out_elems * case.spec.result_itemsize(case.dtype)


def _trace_2d(shape):
    return None if len(shape) == 2 else f"trace needs a 2-D shape, got {_shape_text(shape)}"


def _cupy_reduce(name):
    def make(data, torch):
        import cupy

        x, axis, fn = data.x, data.case.axis, getattr(cupy, name)
        return lambda: fn(x, axis=axis)

    return make


def _torch_reduce(name):
    def make(data, torch):
        x, fn = data.torch_args(torch)["x"], getattr(torch, name)
        return (lambda: fn(x)) if data.case.axis is None else (lambda: fn(x, dim=-1))

    return make


def _reduce_call(name):
    def call(data, impl):
        x, axis, fn = data.x, data.case.axis, getattr(_cupyops(), name)
        return lambda out=None: fn(x, axis=axis, out=out, impl=impl)

    return call


def _reduce_reference(name):
    def ref(data):
        return np.asarray(getattr(_ref(), name)(_host_x(data), axis=data.case.axis))

    return ref


def _trace_call(data, impl):
    x, trace = data.x, _cupyops().trace
    return lambda out=None: trace(x, impl=impl)


def _cupy_trace(data, torch):
    import cupy

    x = data.x
    return lambda: cupy.trace(x)


def _torch_trace(data, torch):
    x = data.torch_args(torch)["x"]
    return lambda: torch.trace(x)


TRACE = Operator(
    "trace", REDUCE_DTYPES, "reduce",
    make_inputs=_sum_inputs,  # (a sum too: of the diagonal)
    reference=lambda data: np.asarray(_ref().trace(_host_x(data))),
    call=_trace_call, takes_out=False,
    baselines={"cupy": _cupy_trace, "torch": _torch_trace},
    bytes_moved=_trace_bytes, result_dtype=_widen_int,
    axes=(None,), row_wise=False, check_shape=_trace_2d,
    test_shapes=((37, 53), (1, 1)),
)
SUM = Operator(
    "sum", REDUCE_DTYPES, "reduce",
    make_inputs=_sum_inputs, reference=_reduce_reference("sum"), call=_reduce_call("sum"),
    widen_tolerance=_sum_tolerance,
    baselines={"cupy": _cupy_reduce("sum"), "torch": _torch_reduce("sum")},
    bytes_moved=_reduce_bytes, result_dtype=_widen_int,
    axes=(-1, None), axis_option=True,
    test_shapes=((37, 1823),),
)
MAX = Operator(
    "max", REDUCE_DTYPES, "reduce", aliases=("amax",),
    make_inputs=_x_only, reference=_reduce_reference("max"), call=_reduce_call("max"),
    baselines={"cupy": _cupy_reduce("max"), "torch": _torch_reduce("amax")},
    bytes_moved=_reduce_bytes,
    axes=(-1,), axis_option=True,
    test_shapes=((37, 1823),),
)


# ==================================================================================
# row-wise: softmax, layer_norm, rms_norm
# ==================================================================================
NORM_EPS = {"layer_norm": 1e-5, "rms_norm": 1e-6, "add_rms_norm": 1e-6}


def _norm_inputs(case, seed, bias=False, residual=False):
    """x N(0, 1); a weight of ones plus noise (and a small bias) so that both sides really
    multiply and add; add_rms_norm's residual N(0, 1)."""
    random_normal = _gpu().random_normal
    x = random_normal(case.shape, case.dtype, seed)
    n = case.cols
    inputs = {"x": x, "weight": (1.0 + 0.1 * random_normal((n,), "float32", seed + 1)).astype(x.dtype)}
    if bias:
        inputs["bias"] = (0.1 * random_normal((n,), "float32", seed + 2)).astype(x.dtype)
    if residual:
        inputs["residual"] = random_normal(case.shape, case.dtype, seed + 3)
    return inputs


def _rows_bytes(reads, writes, params=0):
    """``reads`` and ``writes`` arrays of the case's size, plus ``params`` rows of length
    cols (weights, biases), in the input's dtype."""
    def count(case):
        s = ITEMSIZE[case.dtype]
        return (reads + writes) * case.numel * s + params * case.cols * s

    return count


def _softmax_call(data, impl):
    x, softmax = data.x, _cupyops().softmax
    return lambda out=None: softmax(x, axis=-1, out=out, impl=impl)


def _cupy_softmax(data, torch):
    from cupyx.scipy.special import softmax

    x = data.x
    return lambda: softmax(x, axis=-1)


def _torch_softmax(data, torch):
    x = data.torch_args(torch)["x"]
    return lambda: torch.softmax(x, -1)


def _layer_norm_call(data, impl):
    x, w, b, eps, fn = data.x, data.weight, data.bias, NORM_EPS["layer_norm"], _cupyops().layer_norm
    return lambda out=None: fn(x, w, b, eps=eps, out=out, impl=impl)


def _torch_layer_norm(data, torch):
    t, F = _torch_inputs(data, torch)
    x, w, b, n, eps = t["x"], t["weight"], t["bias"], data.case.cols, NORM_EPS["layer_norm"]
    return lambda: F.layer_norm(x, (n,), w, b, eps)


def _rms_norm_call(data, impl):
    x, w, eps, fn = data.x, data.weight, NORM_EPS["rms_norm"], _cupyops().rms_norm
    return lambda out=None: fn(x, w, eps=eps, out=out, impl=impl)


def _torch_rms_norm(data, torch):
    t, F = _torch_inputs(data, torch)
    x, w, n, eps = t["x"], t["weight"], data.case.cols, NORM_EPS["rms_norm"]
    return lambda: F.rms_norm(x, (n,), w, eps)


# Softmax is judged with the norms: it divides by a row sum after an exp, so float32 lands
# near 1e-6..1e-5, above the pure-reduction bar.
SOFTMAX = Operator(
    "softmax", FLOAT_DTYPES, "norm",
    make_inputs=_x_only,
    reference=lambda data: _ref().softmax(_host_x(data), axis=-1),
    call=_softmax_call,
    baselines={"cupy": _cupy_softmax, "torch": _torch_softmax},
    bytes_moved=_rows_bytes(1, 1),
    test_shapes=((37, 1823),),
)
LAYER_NORM = Operator(
    "layer_norm", FLOAT_DTYPES, "norm", aliases=("layernorm", "layer-norm"),
    make_inputs=lambda case, seed: _norm_inputs(case, seed, bias=True),
    reference=lambda data: _ref().layer_norm(_host_x(data), _host_all(data.weight), _host_all(data.bias),
                                             NORM_EPS["layer_norm"])[0],
    call=_layer_norm_call,
    baselines={"torch": _torch_layer_norm},  # CuPy has no layer norm
    bytes_moved=_rows_bytes(1, 1, params=2),  # + weight + bias
    test_shapes=((37, 1823),),
)
RMS_NORM = Operator(
    "rms_norm", FLOAT_DTYPES, "norm", aliases=("rmsnorm", "rms-norm"),
    make_inputs=_norm_inputs,
    reference=lambda data: _ref().rms_norm(_host_x(data), _host_all(data.weight), NORM_EPS["rms_norm"]),
    call=_rms_norm_call,
    baselines={"torch": _torch_rms_norm},  # CuPy has no RMS norm
    bytes_moved=_rows_bytes(1, 1, params=1),  # + weight
    test_shapes=((37, 1823),),
)


# ==================================================================================
# GEMM: matmul, scaled_matmul
# ==================================================================================
# Operand layouts. nn: a @ b with b stored K x N (row-major), what matmul(a, b) of two
# plain arrays is; nt: an LLM linear layer, x @ w.T with the weight w stored N x K and w.T a
# view (no copy), so b is K-contiguous (column-major). Every impl and baseline of a case
# gets the same operands in the same layout.
LAYOUTS = ("nn", "nt")
# GEMM's textbook rungs run at a few TFLOP/s: past this many multiply-adds they are left
# out unless --no-skip-slow, in every suite (the default suite has 8192^3 products).
GEMM_SLOW_LIMIT = 2**31


def _gemm_3d(name):
    def check(shape):
        return None if len(shape) == 3 else f"{name} takes MxNxK, got {_shape_text(shape)}"

    return check


def _gemm_bytes(case):
    M, N, K = case.shape
    return (M * K + K * N) * ITEMSIZE[case.dtype] + M * N * case.spec.result_itemsize(case.dtype)


def _gemm_flops(case):
    M, N, K = case.shape
    return 2 * M * N * K


def _host_b(data):
    """The K x N operand on the host, from the memory as allocated: the nt view's .get()
    would first make a contiguous copy of W on the GPU."""
    b = data.weight
    return b.T.get().T if data.case.layout == "nt" else b.get()


def matmul_operands(case, seed):
    """(A, W, B) of a matmul case: A M x K; W the second operand as allocated (nn: K x N,
    nt: N x K); B the K x N operand every call gets, W itself (nn) or W.T (nt)."""
    random_normal = _gpu().random_normal
    M, N, K = case.shape
    a = random_normal((M, K), case.dtype, seed)
    if case.layout == "nt":
        w = random_normal((N, K), case.dtype, seed + 1)
        return a, w, w.T
    w = random_normal((K, N), case.dtype, seed + 1)
    return a, w, w


def _matmul_inputs(case, seed):
    a, _, b = matmul_operands(case, seed)
    return {"x": a, "weight": b}


def _matmul_tolerance(case, tol):
    """reference.gemm_tolerance of the case's K (float32: grows as sqrt(K))."""
    return _ref().gemm_tolerance(case.dtype, case.shape[2], tol)


def _matmul_call(data, impl):
    x, w, matmul = data.x, data.weight, _cupyops().matmul
    return lambda out=None: matmul(x, w, out=out, impl=impl)


def _cupy_matmul(data, torch):
    import cupy

    if data.case.dtype == "int8":  # NumPy semantics: int8 @ int8 -> int8, another product
        raise TypeError("cupy.matmul of int8 returns int8 (no int32 accumulation)")
    x, w = data.x, data.weight  # nt: the transposed view, the very array cupyops gets
    return lambda: cupy.matmul(x, w)


def _torch_matmul(data, torch):
    t = data.torch_args(torch)
    x, w = t["x"], t["weight"]
    if data.case.dtype == "int8":  # int8 x int8 -> int32 (cuBLASLt); needs M > 16
        # B in the case's layout, like every other impl. nn (row-major K x N) is not
        # cuBLASLt's fast int8 layout (it measured 125-129 TOP/s on an H200): the "vs
        # torch" of int8 nn cases is against that layout only. nt's view (A row-major, B
        # column-major: the "TN" pairing of cuBLASLt's int8 kernels) goes to cuBLASLt as a
        # transposed operand (cublasCommonArgs in PyTorch's Blas.cpp); a torch that refuses
        # it leaves the row skipped, its error the note (cli.run_baseline).
        return lambda: torch._int_mm(x, w)
    return lambda: torch.matmul(x, w)  # nt: x @ w.T, as F.linear without bias


def _scaled_matmul_inputs(case, seed):
    """x (M x K) and w (N x K) drawn N(0, 1), quantised by cupyops.quantize_fp8 with one
    scale each (e4m3 bits as uint8, scales float32 0-d device arrays); every call gets x,
    b = w.T (K x N, K-major: the layout torch._scaled_mm and the 8-bit wgmma need) and the
    scales."""
    random_normal, quantize = _gpu().random_normal, _cupyops().quantize_fp8
    M, N, K = case.shape
    a, sa = quantize(random_normal((M, K), "float32", seed))
    w, sb = quantize(random_normal((N, K), "float32", seed + 1))
    return {"x": a, "weight": w.T, "scales": (sa, sb)}


def _scaled_matmul_reference(data):
    """The float64 product of the dequantised operands."""
    sa, sb = data.scales
    return _ref().scaled_matmul(_host_x(data), data.weight.T.get().T, float(sa), float(sb))


def _scaled_matmul_call(data, impl):
    x, w, (sa, sb), fn = data.x, data.weight, data.scales, _cupyops().scaled_matmul
    return lambda out=None: fn(x, w, sa, sb, out=out, impl=impl)


def _torch_scaled_mm(data, torch):
    """e4m3 x e4m3 -> bfloat16, per-tensor scales, b column-major; use_fast_accum off."""
    t = data.torch_args(torch)
    a8, b8 = t["x"].view(torch.float8_e4m3fn), t["weight"].view(torch.float8_e4m3fn)
    sa, sb = t["scales"]
    return lambda: torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


_GEMM_FIELDS = dict(family="gemm", axes=(None,), bytes_moved=_gemm_bytes, flops=_gemm_flops,
                    rows=lambda shape: shape[0], cols=lambda shape: shape[1],  # the output's rows: M of N
                    slow_limit=GEMM_SLOW_LIMIT, work_unit="multiply-adds")
MATMUL = Operator(
    "matmul", FLOAT_DTYPES + ("int8",), "gemm", aliases=("gemm",),
    make_inputs=_matmul_inputs,
    reference=lambda data: _ref().matmul(_host_x(data), _host_b(data)),
    call=_matmul_call,
    # cupy.matmul = cuBLAS (TF32 off); int8: torch._int_mm
    baselines={"cupy": _cupy_matmul, "torch": _torch_matmul},
    result_dtype=lambda dtype: "int32" if dtype == "int8" else dtype,
    widen_tolerance=_matmul_tolerance, check_shape=_gemm_3d("matmul"), layouts=LAYOUTS,
    header_lines=(
        "matmul layouts, after the shape: nn = a @ b, b stored K x N (row-major); "
        "nt = x @ w.T, w stored N x K (a linear layer's weight), w.T a view; "
        "cupyops, cupy.matmul and torch.matmul (int8: torch._int_mm) get the "
        "same operands",),
    test_shapes=((33, 72, 64), (128, 256, 128)),
    **_GEMM_FIELDS,
)
# float8 e4m3 operands (uint8 bits in CuPy), bfloat16 out, per-tensor scales; x @ w.T only
# (8-bit wgmma and torch._scaled_mm read b K-major)
SCALED_MATMUL = Operator(
    "scaled_matmul", ("float8_e4m3",), "scaled_matmul", aliases=("fp8", "scaled_mm"),
    make_inputs=_scaled_matmul_inputs, reference=_scaled_matmul_reference, call=_scaled_matmul_call,
    baselines={"torch": _torch_scaled_mm},  # torch._scaled_mm (cuBLASLt)
    result_dtype=lambda dtype: "bfloat16", check_shape=_gemm_3d("scaled_matmul"), layouts=("nt",),
    header_lines=(
        "scaled_matmul: e4m3 x e4m3 -> bfloat16 with one float32 scale per operand (in device "
        "memory), x @ w.T (w stored N x K); cupyops and torch._scaled_mm (use_fast_accum off) "
        "get the same operands; the reference is the float64 product of the dequantised operands",),
    test_shapes=((128, 256, 128), (64, 192, 384)),
    **_GEMM_FIELDS,
)


# ==================================================================================
# attention
# ==================================================================================
class AttnShape(NamedTuple):
    """An attention problem's sizes: q [B, Sq, Hq, D], k and v [B, Skv, Hkv, D] ("bshd").
    Spelled with named dimensions, B4xHq16xHkv16xSq4096xSkv4096xD128 (see
    cases.parse_attention_shape), so it can never be mistaken for a 6-D array shape."""

    B: int
    Hq: int
    Hkv: int
    Sq: int
    Skv: int
    D: int

    def __str__(self):
        return (f"B{self.B}xHq{self.Hq}xHkv{self.Hkv}xSq{self.Sq}xSkv{self.Skv}"
                f"xD{self.D}")


# At most this many query rows is a decode (KV-cache) case: memory-bound, reported in GB/s
# too, and the only cases the decode rung is timed on.
DECODE_MAX_Q = 16
# SDPA backend of each attention baseline: the name in torch.nn.attention.SDPBackend
SDPA_BACKENDS = {"torch-flash": "FLASH_ATTENTION", "torch-cudnn": "CUDNN_ATTENTION",
                 "torch-efficient": "EFFICIENT_ATTENTION", "torch-math": "MATH"}
# Attention is validated on a sample: the float64 host reference of all of B4 H16 S4096
# D128 is 2e11 multiply-adds. ATTN_CHECK_ROWS query rows (first and last included) of a few
# batches and heads (cases.attention_sample); the NaN-poisoned out= still covers the whole
# output on the GPU.
ATTN_CHECK_ROWS = 64

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


def visible_pairs(Sq, Skv, causal=False, causal_offset=0, window=None):
    """(query, key) pairs attention computes, counted exactly row by row without the mask
    (reference.attention_mask's, summed): row i sees keys [lo, hi) with hi = Skv, cut to
    j <= i + offset under a causal mask and j <= i + offset + right under a window (left,
    right), and lo = i + offset - left under a left side (None or -1: unlimited); top_left:
    offset 0, bottom_right: Skv - Sq."""
    left, right = window if window is not None else (None, None)
    left, right = (-1 if w is None else w for w in (left, right))
    if not causal and left < 0 and right < 0:
        return Sq * Skv
    diag = np.arange(Sq, dtype=np.int64) + causal_offset  # each row's key at offset 0
    hi = np.full(Sq, Skv, dtype=np.int64)
    if causal:
        hi = np.minimum(hi, diag + 1)
    if right >= 0:
        hi = np.minimum(hi, diag + right + 1)
    lo = np.maximum(diag - left, 0) if left >= 0 else np.zeros(Sq, dtype=np.int64)
    return int(np.clip(hi - lo, 0, None).sum())


def _attention_flops(case):
    """4 B Hq D (visible query-key pairs): 2 for each multiply-add of S = Q K^T and of
    O = P V (the softmax's exponentials are not counted)."""
    B, Hq, _, Sq, Skv, D = case.shape
    return 4 * B * Hq * D * visible_pairs(Sq, Skv, case.causal, case.causal_offset)


def _attention_bytes(case):
    """Q and O [B, Sq, Hq, D], K and V [B, Skv, Hkv, D]."""
    B, Hq, Hkv, Sq, Skv, D = case.shape
    return (2 * B * Sq * Hq * D + 2 * B * Skv * Hkv * D) * ITEMSIZE[case.dtype]


def attention_score_bytes(case):
    B, Hq, _, Sq, Skv, _ = case.shape
    return 4 * B * Hq * Sq * Skv


def attention_skip(name, case):
    """Why the slow-rung rule leaves attention rung ``name`` out of ``case``, or None."""
    if "naive" in name and attention_score_bytes(case) > ATTN_NAIVE_SCORE_LIMIT:
        return (f"slow rung: {attention_score_bytes(case) / 2**30:.1f} GiB of float32 scores "
                f"> 2 GiB (--no-skip-slow runs it)")
    if name in ATTN_SIMT_RUNGS and _attention_flops(case) > ATTN_SIMT_FLOP_LIMIT:
        return (f"slow rung: CUDA cores, {_attention_flops(case) / 1e12:.2f} TFLOP > 2^40 FLOP "
                f"(--no-skip-slow runs it)")
    if name == "decode" and case.shape.Sq > DECODE_MAX_Q:
        return (f"decode rung: {case.shape.Sq} query rows > {DECODE_MAX_Q} "
                f"(--no-skip-slow runs it)")
    return None


def attention_baselines(case, wanted=None):
    """SDPA backends timed on an attention case: flash and cuDNN, and for decode cases
    also the memory-efficient and math backends. An explicit request (``wanted``) may name
    any of the four; 'torch' stands for the case's default set."""
    default = tuple(SDPA_BACKENDS) if case.decode else ("torch-flash", "torch-cudnn")
    if not wanted:
        return default
    return tuple(b for b in SDPA_BACKENDS if b in wanted or ("torch" in wanted and b in default))


def _attention_inputs(case, seed):
    random_normal = _gpu().random_normal
    B, Hq, Hkv, Sq, Skv, D = case.shape
    return {"x": random_normal((B, Sq, Hq, D), case.dtype, seed),
            "k": random_normal((B, Skv, Hkv, D), case.dtype, seed + 1),
            "v": random_normal((B, Skv, Hkv, D), case.dtype, seed + 2)}


def _attention_reference(data):
    """float64 attention of the sampled outputs (data.sample), each query row under the
    causal mask of its place in the whole problem; the scale is the operator's default,
    1/sqrt(head_dim), as SDPA's."""
    gpu, case, smp = _gpu(), data.case, data.sample
    all_keys = np.arange(case.shape.Skv, dtype=np.int64)
    return gpu.reference_rows(
        gpu.gather_bshd(data.x, smp.batches, smp.rows, smp.heads),
        gpu.gather_bshd(data.k, smp.batches, all_keys, smp.kv_heads),
        gpu.gather_bshd(data.v, smp.batches, all_keys, smp.kv_heads),
        smp.rows, q_len=case.shape.Sq, kv_index=smp.kv_index, causal=case.causal,
        causal_align=case.causal_align, scale=1.0 / math.sqrt(case.shape.D))


def _attention_call(data, impl):
    c, x, k, v, attention = data.case, data.x, data.k, data.v, _cupyops().attention
    causal, align = c.causal, c.causal_align
    return lambda out=None: attention(x, k, v, causal=causal, causal_align=align, out=out, impl=impl)


def _sdpa(name):
    def make(data, torch):
        return _gpu().sdpa_call(data, name, torch)

    return make


ATTENTION = Operator(
    "attention", FLOAT_DTYPES, "attention", aliases=("attn", "sdpa"), family="attention",
    make_inputs=_attention_inputs, reference=_attention_reference, call=_attention_call,
    # torch.nn.functional.scaled_dot_product_attention, one row per backend (sdpa_kernel);
    # prefill cases get the two fast ones, decode cases all four (attention_baselines)
    baselines={name: _sdpa(name) for name in SDPA_BACKENDS}, choose_baselines=attention_baselines,
    bytes_moved=_attention_bytes, flops=_attention_flops,
    # prefill is compute-bound: its Q+K+V+O bytes are a tiny floor
    reports_bandwidth=lambda case: case.decode,
    # (slow_limit only has to be set: attention_skip is its own rule, with its own limits)
    axes=(None,), row_wise=False, slow_limit=GEMM_SLOW_LIMIT, slow_reason=attention_skip,
    shape_help="named dimensions, e.g. B4xHq16xHkv16xSq4096xSkv4096xD128",
    header_lines=(
        ("attention: q [B, Sq, Hq, D], k and v [B, Skv, Hkv, D] (bshd), scale 1/sqrt(D); "
         "TFLOP/s = 4*B*Hq*D*(visible query-key pairs) / time, causal pairs counted exactly "
         "(mask causal: row i sees keys j <= i; causal_br: j <= i + Skv - Sq); decode cases "
         f"(Sq <= {DECODE_MAX_Q}) also GB/s of Q+K+V+O, each read or written once"),
        ("attention validation: float64 reference on a sample: first and last batch (decode: "
         f"4 batches), query heads 0, 1, Hq/2+1, Hq-1, {ATTN_CHECK_ROWS} query rows (--check-limit 0: "
         "all); out= poisoned with NaN over the whole output; slow rungs left out unless "
         f"--no-skip-slow: {ATTENTION_SLOW_RULE}"),
        ("attention baselines: torch.nn.functional.scaled_dot_product_attention with one "
         "backend each (torch-flash, torch-cudnn; decode also torch-efficient, torch-math) "
         "on the same memory as [B, H, S, D] views; enable_gqa for GQA; a backend that "
         "refuses is listed as unavailable, and any copy it needed (made before timing) is "
         "noted in its row"),
    ),
    # prefill (GQA 4:2, a head_dim every rung takes) and decode (one query row, 300 keys)
    test_shapes=(AttnShape(2, 4, 2, 77, 77, 64), AttnShape(3, 4, 2, 1, 300, 128)),
)


# ==================================================================================
# the fused LLM operators (issue 19): silu_and_mul, gelu_and_mul, add_rms_norm, rope
# ==================================================================================
# gelu_and_mul's form timed (the operator's default, as torch.nn.functional.gelu's)
GELU_APPROXIMATE = "none"
# rope's positions: drawn from [0, ROPE_MAX_POS), the rows of the torch baseline's cache
ROPE_MAX_POS = 32768
ROPE_BASE = 10000.0


def _even_last(name):
    def check(shape):
        if shape[-1] % 2:
            return f"{name} takes x [..., 2d], an even last dimension, got {_shape_text(shape)}"
        return None

    return check


def _and_mul_bytes(case):
    """x [.., 2d] read, y [.., d] written."""
    s = ITEMSIZE[case.dtype]
    return case.numel * s + case.numel // 2 * s


def _silu_and_mul_call(data, impl):
    x, fn = data.x, _cupyops().silu_and_mul
    return lambda out=None: fn(x, out=out, impl=impl)


def _gelu_and_mul_call(data, impl):
    x, fn, approx = data.x, _cupyops().gelu_and_mul, GELU_APPROXIMATE
    return lambda out=None: fn(x, approx, out=out, impl=impl)


def _torch_and_mul(activation):
    """The PyTorch eager code the operator replaces: F.silu(a) * b, F.gelu(a) * b."""
    def make(data, torch):
        t, F = _torch_inputs(data, torch)
        x = t["x"]
        d = x.shape[-1] // 2
        if activation == "silu":
            return lambda: F.silu(x[..., :d]) * x[..., d:]
        approx = GELU_APPROXIMATE
        return lambda: F.gelu(x[..., :d], approximate=approx) * x[..., d:]

    return make


def _add_rms_norm_call(data, impl):
    x, r, w, eps, fn = data.x, data.residual, data.weight, NORM_EPS["add_rms_norm"], _cupyops().add_rms_norm
    return lambda out=None: fn(x, r, w, eps, out=out, impl=impl)  # out: a pair (normed, sum)


def _torch_add_rms_norm(data, torch):
    """r = x + residual, then F.rms_norm(r); both returned."""
    t, F = _torch_inputs(data, torch)
    x, res, w, n, eps = t["x"], t["residual"], t["weight"], data.case.cols, NORM_EPS["add_rms_norm"]

    def add_rms_norm():
        r = x + res
        return F.rms_norm(r, (n,), w, eps), r

    return add_rms_norm


def _rope_inputs(case, seed):
    """q [T, Hq, D], k [T, Hkv, D] N(0, 1), int64 positions uniform in [0, ROPE_MAX_POS),
    neox style over all of D, cos/sin from base (cupyops' default path); the torch baseline
    gets vLLM's cos_sin_cache of those angles in the case's dtype (made here, untimed)."""
    import cupy

    random_normal = _gpu().random_normal
    T, Hq, Hkv, D = case.shape
    q = random_normal((T, Hq, D), case.dtype, seed)
    k = random_normal((T, Hkv, D), case.dtype, seed + 1)
    positions = cupy.random.RandomState(seed + 2).randint(0, ROPE_MAX_POS, size=T, dtype=cupy.int64)
    cos, sin = _ref().rope_cos_sin(np.arange(ROPE_MAX_POS), D, ROPE_BASE)
    cache = cupy.asarray(np.concatenate([cos, sin], axis=1).astype(q.dtype))
    return {"x": q, "k": k, "positions": positions, "cos_sin_cache": cache}


def _rope_reference(data):
    """(q, k) of the checked tokens, each [tokens checked, heads * D] (rows of the check)."""
    T, Hq, Hkv, D = data.case.shape
    q = _host_x(data).reshape(-1, Hq, D)
    k = _host_x(data, "k").reshape(-1, Hkv, D)
    pos = data.positions.get() if data.rows is None else data.positions[data.rows].get()
    ref_q, ref_k = _ref().rope(q, k, pos, D, ROPE_BASE)
    return ref_q.reshape(len(pos), -1), ref_k.reshape(len(pos), -1)


def _rope_call(data, impl):
    x, k, pos, fn = data.x, data.k, data.positions, _cupyops().rope
    return lambda out=None: fn(x, k, pos, base=ROPE_BASE, out=out, impl=impl)  # out: a pair (q, k)


def _torch_rope(data, torch):
    """vLLM's forward_native: the cache rows at the positions, each half of the rotated
    dims turned, q and k (runners.torch_rope)."""
    t = data.torch_args(torch)
    x, k, positions, cache = t["x"], t["k"], t["positions"], t["cos_sin_cache"]
    torch_rope = _gpu().torch_rope
    return lambda: torch_rope(torch, x, k, positions, cache)


def _rope_bytes(case):
    """q and k read and written, int64 positions read (cos/sin computed, not read)."""
    return 2 * case.numel * ITEMSIZE[case.dtype] + case.shape[0] * 8


SILU_AND_MUL = Operator(
    "silu_and_mul", FLOAT_DTYPES, "norm", aliases=("silu", "swiglu"),
    make_inputs=_x_only,
    reference=lambda data: _ref().silu_and_mul(_host_x(data)),
    call=_silu_and_mul_call, baselines={"torch": _torch_and_mul("silu")},
    bytes_moved=_and_mul_bytes, check_shape=_even_last("silu_and_mul"),
    test_shapes=((37, 2 * 781),),
)
GELU_AND_MUL = Operator(
    "gelu_and_mul", FLOAT_DTYPES, "norm", aliases=("gelu", "geglu"),
    make_inputs=_x_only,
    reference=lambda data: _ref().gelu_and_mul(_host_x(data), GELU_APPROXIMATE),
    call=_gelu_and_mul_call, baselines={"torch": _torch_and_mul("gelu")},
    bytes_moved=_and_mul_bytes, check_shape=_even_last("gelu_and_mul"),
    test_shapes=((37, 2 * 781),),
)
ADD_RMS_NORM = Operator(
    "add_rms_norm", FLOAT_DTYPES, "norm", aliases=("fused_add_rms_norm", "add-rms-norm"),
    make_inputs=lambda case, seed: _norm_inputs(case, seed, residual=True),
    reference=lambda data: _ref().add_rms_norm(_host_x(data), _host_x(data, "residual"), _host_all(data.weight),
                                               NORM_EPS["add_rms_norm"]),
    call=_add_rms_norm_call, baselines={"torch": _torch_add_rms_norm},
    bytes_moved=_rows_bytes(2, 2, params=1),  # x, residual read; normed, sum written; + weight
    test_shapes=((37, 1823),),
)
# shape (tokens, q_heads, kv_heads, head_dim); a checked row is a token's q and k
ROPE = Operator(
    "rope", FLOAT_DTYPES, "norm", aliases=("rotary",),
    make_inputs=_rope_inputs, reference=_rope_reference, call=_rope_call,
    baselines={"torch": _torch_rope}, bytes_moved=_rope_bytes,
    numel=lambda shape: shape[0] * (shape[1] + shape[2]) * shape[3],
    cols=lambda shape: (shape[1] + shape[2]) * shape[3],
    claims_rank=4, shape_help="tokens x q_heads x kv_heads x head_dim, e.g. 16384x32x8x128",
    test_shapes=((37, 4, 2, 64), (17, 8, 1, 128)),
)

# In the order the CLI lists them.
OPERATORS = {op.name: op for op in (TRACE, SUM, MAX, SOFTMAX, LAYER_NORM, RMS_NORM, MATMUL, SCALED_MATMUL,
                                    ATTENTION, SILU_AND_MUL, GELU_AND_MUL, ADD_RMS_NORM, ROPE)}


def operator(name):
    """The description of op ``name``; ValueError for an op the benchmark does not know."""
    try:
        return OPERATORS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}") from None
