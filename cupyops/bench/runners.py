"""GPU side of the benchmark: the inputs of a case, the calls to time (cupyops variants and
vendor baselines), and their validation against ``cupyops.reference`` in float64.

Validation of a cupyops variant, before it is timed:
1. the plain call ``op(x, impl=...)`` (what gets timed) is compared with the reference;
2. the same call with ``out=`` a buffer poisoned with NaN (integer outputs: INT_MIN) must
   return that buffer with every element written: the poison is counted over the whole
   output on the GPU, which also catches a kernel that skips rows we do not compare;
3. the comparison runs on the host in float64 over every row, or over an evenly spaced
   subset of rows on big row-wise cases (see cases.sample_rows).
Baselines get step 1 only; their error is reported, never held against them.
"""
from dataclasses import dataclass, field

import numpy as np

from . import cases as _cases

# Same-size unsigned type per itemsize: gathers, poison and NaN counts go through these
# raw views, so they work for bfloat16 whatever CuPy's ufuncs support for it.
_RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_NAN_BITS = {"float16": 0x7E00, "bfloat16": 0x7FC0, "float32": 0x7FC00000,
             "float64": 0x7FF8000000000000}
_EXP_MASK = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000,
             "float64": 0x7FF0000000000000}


@dataclass
class CaseData:
    case: object
    x: object  # cupy array of case.shape (matmul: A, M x K)
    weight: object = None  # matmul: B, K x N
    bias: object = None
    rows: object = None  # cupy int64 row indices checked, or None for all
    ref: object = None  # float64 reference (on the checked rows)
    tol: float = 0.0
    _torch: dict = field(default_factory=dict)

    def torch_args(self, torch):
        """The same device memory seen by PyTorch (DLPack, no copy), made once per case."""
        if not self._torch:
            conv = lambda a: None if a is None else torch.from_dlpack(a)  # noqa: E731
            self._torch.update(x=conv(self.x), weight=conv(self.weight), bias=conv(self.bias))
        return self._torch


def random_normal(shape, dtype, seed):
    """Fresh N(0, 1) data (never zeros); integers uniform in [-1000, 1000]."""
    import cupy

    from .._dtypes import to_dtype

    rs = cupy.random.RandomState(seed)
    if dtype == "int8":
        return rs.randint(-128, 128, size=shape, dtype="int8")
    if dtype in ("int32", "int64"):
        return rs.randint(-1000, 1001, size=shape, dtype=dtype)
    if dtype == "float64":
        return rs.standard_normal(shape, dtype=cupy.float64)
    return rs.standard_normal(shape, dtype=cupy.float32).astype(to_dtype(dtype))


def prepare(case, *, seed=0, check_limit=_cases.CHECK_LIMIT):
    """Inputs of ``case`` on the GPU and the float64 reference on the rows checked."""
    import cupy

    from .. import reference

    if case.op == "matmul":
        return _prepare_matmul(case, seed, check_limit)
    x = random_normal(case.shape, case.dtype, seed)
    data = CaseData(case, x, tol=_cases.tolerance(case, reference.TOLERANCE))
    if case.op in _cases.NORM_EPS:
        # ones + noise (and a small bias) so both sides really multiply and add
        n = case.cols
        data.weight = (1.0 + 0.1 * random_normal((n,), "float32", seed + 1)).astype(x.dtype)
        if case.op == "layer_norm":
            data.bias = (0.1 * random_normal((n,), "float32", seed + 2)).astype(x.dtype)
    rows = _cases.sample_rows(case, check_limit)
    if rows is not None:
        data.rows = cupy.asarray(rows)
    x_host = host_rows(data, x)
    w_host = None if data.weight is None else data.weight.get()
    b_host = None if data.bias is None else data.bias.get()
    data.ref = reference_output(case, x_host, w_host, b_host)
    if rows is not None:
        data.ref = data.ref.reshape(len(rows), -1)
    return data


def _prepare_matmul(case, seed, check_limit):
    """A (M x K) and B (K x N) as ``matmul(a, b)`` gets them (row-major, what an
    activation times a K x N weight is), and the float64 reference of the rows checked."""
    import cupy

    from .. import reference

    M, N, K = case.shape
    a = random_normal((M, K), case.dtype, seed)
    b = random_normal((K, N), case.dtype, seed + 1)
    data = CaseData(case, a, weight=b, tol=_cases.tolerance(case, reference.TOLERANCE))
    rows = _cases.sample_rows(case, check_limit)
    if rows is not None:
        data.rows = cupy.asarray(rows)
    data.ref = reference.matmul(host_rows(data, a), b.get())
    return data


def reference_output(case, x, weight=None, bias=None):
    from .. import reference

    if case.op == "trace":
        return np.asarray(reference.trace(x))
    if case.op == "sum":
        return np.asarray(reference.sum(x, axis=case.axis))
    if case.op == "max":
        return np.asarray(reference.max(x, axis=case.axis))
    if case.op == "softmax":
        return reference.softmax(x, axis=-1)
    if case.op == "layer_norm":
        return reference.layer_norm(x, weight, bias, _cases.NORM_EPS["layer_norm"])[0]
    if case.op == "rms_norm":
        return reference.rms_norm(x, weight, _cases.NORM_EPS["rms_norm"])
    raise ValueError(f"unknown op {case.op!r}")


def host_rows(data, a):
    """``a`` on the host: whole, or only the checked rows of its (rows, -1) view. The
    gather runs on raw bits (see _RAW)."""
    if data.rows is None:
        return a.get()
    raw = a.reshape(data.case.rows, -1).view(_RAW[a.dtype.itemsize])
    return raw[data.rows].get().view(a.dtype)


def as_cupy(y):
    """cupy array for a result of any library (torch tensors through DLPack)."""
    import cupy

    if type(y).__module__.startswith("torch"):
        return cupy.from_dlpack(y.detach())
    return cupy.asarray(y)


def check(data, y):
    """rel_error of the output ``y`` against the reference (on the checked rows)."""
    from .. import reference

    return reference.rel_error(host_rows(data, as_cupy(y)), data.ref)


def poisoned_like(y):
    """An empty array like ``y`` filled with NaN (integers: their minimum), so an
    element the kernel never writes cannot look like a result."""
    import cupy

    out = cupy.empty(y.shape, y.dtype)
    name = y.dtype.name
    if name in _NAN_BITS:
        out.reshape(-1).view(_RAW[y.dtype.itemsize]).fill(_NAN_BITS[name])
    else:
        out.fill(np.iinfo(y.dtype).min)
    return out


def count_poison(a):
    """Elements of ``a`` that are NaN/Inf (integers: equal to the poison value)."""
    import cupy

    name = a.dtype.name
    flat = a.reshape(-1)
    if name in _EXP_MASK:
        raw_t = _RAW[a.dtype.itemsize]
        mask = raw_t(_EXP_MASK[name])
        return int(cupy.count_nonzero((flat.view(raw_t) & mask) == mask))
    return int(cupy.count_nonzero(flat == np.iinfo(a.dtype).min))


# ----------------------------------------------------------------------------------
# the calls
# ----------------------------------------------------------------------------------
def cupyops_call(data, impl):
    """``call(out=None)`` running cupyops' ``impl`` on the case (trace takes no out=)."""
    import cupyops

    c, x, w, b = data.case, data.x, data.weight, data.bias
    if c.op == "trace":
        return lambda out=None: cupyops.trace(x, impl=impl)
    if c.op == "sum":
        return lambda out=None: cupyops.sum(x, axis=c.axis, out=out, impl=impl)
    if c.op == "max":
        return lambda out=None: cupyops.max(x, axis=c.axis, out=out, impl=impl)
    if c.op == "softmax":
        return lambda out=None: cupyops.softmax(x, axis=-1, out=out, impl=impl)
    if c.op == "layer_norm":
        eps = _cases.NORM_EPS["layer_norm"]
        return lambda out=None: cupyops.layer_norm(x, w, b, eps=eps, out=out, impl=impl)
    if c.op == "rms_norm":
        eps = _cases.NORM_EPS["rms_norm"]
        return lambda out=None: cupyops.rms_norm(x, w, eps=eps, out=out, impl=impl)
    if c.op == "matmul":
        return lambda out=None: cupyops.matmul(x, w, out=out, impl=impl)
    raise ValueError(f"unknown op {c.op!r}")


def baseline_call(data, name, torch=None):
    """A no-argument callable running the vendor's version of the case."""
    c = data.case
    if name == "cupy":
        import cupy

        x = data.x
        if c.op == "trace":
            return lambda: cupy.trace(x)
        if c.op == "sum":
            return lambda: cupy.sum(x, axis=c.axis)
        if c.op == "max":
            return lambda: cupy.max(x, axis=c.axis)
        if c.op == "softmax":
            from cupyx.scipy.special import softmax

            return lambda: softmax(x, axis=-1)
        if c.op == "matmul":
            if c.dtype == "int8":  # NumPy semantics: int8 @ int8 -> int8, another product
                raise TypeError("cupy.matmul of int8 returns int8 (no int32 accumulation)")
            w = data.weight
            return lambda: cupy.matmul(x, w)
        raise ValueError(f"CuPy has no {c.op}")
    if name == "torch":
        if torch is None:
            raise RuntimeError("PyTorch with CUDA is not available")
        F = torch.nn.functional
        t = data.torch_args(torch)
        x, w, b, n = t["x"], t["weight"], t["bias"], c.cols
        if c.op == "trace":
            return lambda: torch.trace(x)
        if c.op == "sum":
            return (lambda: torch.sum(x)) if c.axis is None else (lambda: torch.sum(x, dim=-1))
        if c.op == "max":
            return (lambda: torch.amax(x)) if c.axis is None else (lambda: torch.amax(x, dim=-1))
        if c.op == "softmax":
            return lambda: torch.softmax(x, -1)
        if c.op == "layer_norm":
            eps = _cases.NORM_EPS["layer_norm"]
            return lambda: F.layer_norm(x, (n,), w, b, eps)
        if c.op == "rms_norm":
            eps = _cases.NORM_EPS["rms_norm"]
            return lambda: F.rms_norm(x, (n,), w, eps)
        if c.op == "matmul":
            if c.dtype == "int8":  # int8 x int8 -> int32 (cuBLASLt); needs M > 16
                # B as matmul(a, b) has it (row-major K x N), like every other case. This
                # is not cuBLASLt's fast int8 layout (it measured 125-129 TOP/s on an
                # H200): the "vs torch" of int8 cases is against that layout only.
                return lambda: torch._int_mm(x, w)
            return lambda: torch.matmul(x, w)
    raise ValueError(f"unknown baseline {name!r}")


def validate_cupyops(data, call):
    """Steps 1-3 of the module docstring. Returns (rel_error, failure message or None)."""
    y = as_cupy(call())
    err = check(data, y)
    if data.case.op == "trace":  # scalar result, no out=
        return err, (None if err <= data.tol else f"rel_error {err:.3g} > tol {data.tol:g}")
    out = poisoned_like(y)
    del y  # its memory goes back to the pool before the out= call
    got = call(out=out)
    if got is None or as_cupy(got).data.ptr != out.data.ptr:
        return err, "out=: the call did not return the out array"
    bad = count_poison(out)
    if bad:
        return err, f"out=: {bad} of {out.size} output elements left unwritten (NaN poison)"
    err = max(err, check(data, out))
    if not err <= data.tol:  # also catches NaN
        return err, f"rel_error {err:.3g} > tol {data.tol:g}"
    return err, None
