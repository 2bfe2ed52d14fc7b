"""GPU tier (GUIDE.md section 4): every variant of every operator, ``impl="auto"`` included,
against the float64 NumPy references of ``cupyops.reference``, for every dtype it claims.

- Hypothesis draws shapes (awkward lengths: 1, 3, 17, 781, 1823, non-multiples of the
  16-byte vectors), axes, keepdims, input placement (CuPy, NumPy, strided / transposed /
  reversed views, a view whose data pointer is not 16-byte aligned) and a seed for fresh
  random data; explicit cases reach every launch path (warp / block / cluster rows, the
  fallbacks past a cluster, split reductions, strided and moved axes).
- Every operator runs twice: without ``out=`` and into an ``out=`` poisoned with NaN (a
  sentinel for integers), which must be the array returned; an unwritten element fails.
- Floats compare as ``reference.rel_error <= TOLERANCE`` by dtype (plus the error of the
  reference itself rounded to the output dtype, see ``limit``); integers and max exactly.

CuPy is imported inside the tests only, so the file collects (and skips, see conftest.py)
on machines without a GPU.
"""
import math
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cupyops
from cupyops import _dtypes, reference

pytestmark = pytest.mark.gpu

INTS = ("int32", "int64")
REDUCE_DTYPES = ("int32", "int64", "float32", "float64", "float16", "bfloat16")
ROW_DTYPES = ("float32", "float16", "bfloat16")
FLOAT_REDUCE = ("float32", "float64", "float16", "bfloat16")
SUM_RESULT = {"int32": "int64", "int64": "int64", "float32": "float32", "float64": "float64",
              "float16": "float16", "bfloat16": "bfloat16"}
SENTINEL = -123456789  # poison of integer outputs
GAP_INT = 999_999  # integers in memory a view skips: outside the data's range
STATS_TOL = {"float32": 1e-5, "float16": 1e-4, "bfloat16": 1e-4}  # float32 statistics
MODES = ("cupy", "numpy", "strided", "offset", "transposed", "reversed")

HYPO = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def impls(op):
    return [*cupyops.variants(op), "auto"]


def grid(ops, dtypes):
    """(op, impl, dtype) for every rung of every op in ``ops``."""
    return [pytest.param(op, impl, d, id=f"{op}-{impl}-{d}")
            for op in ops for impl in impls(op) for d in dtypes]


def _cupy():
    import cupy

    return cupy


def is_cupy(a):
    return type(a).__module__.startswith("cupy")


def host(a):
    return a.get() if is_cupy(a) else np.asarray(a)


def dt(name):
    return _dtypes.to_dtype(name)


# ---------------------------------------------------------------------------- inputs
def rand(rng, shape, dtype, loc=0.0, scale=1.0):
    """Fresh random data (never all zeros): integers in [-1000, 1000] (int32 sums stay
    exact), floats N(loc, scale**2)."""
    if dtype in INTS:
        a = rng.integers(-1000, 1000, size=shape, endpoint=True)
    else:
        a = rng.standard_normal(shape) * scale + loc
    return np.asarray(a).astype(dt(dtype))


def sum_loc(dtype):
    # Sums of N(3, 1) do not cancel, so a relative-error bound measures the kernel and not
    # the data's conditioning; half types stay at N(0, 1) so long sums fit float16's range.
    return 3.0 if dtype in ("float32", "float64") else 0.0


def gap(dtype):
    return GAP_INT if dtype in INTS else np.nan


def place(values, mode):
    """``values`` (a contiguous NumPy array) as the operator gets it in ``mode``.
    strided / offset views have NaN (or GAP_INT) in the memory they skip, so an operator
    that reads it fails."""
    if mode == "numpy":
        return values
    cp = _cupy()
    if values.ndim == 0 or mode == "cupy":
        return cp.asarray(values)
    name = values.dtype.name
    if mode == "strided":  # every other element of the last axis
        base = np.full(values.shape[:-1] + (2 * values.shape[-1],), gap(name), values.dtype)
        base[..., ::2] = values
        return cp.asarray(base)[..., ::2]
    if mode == "offset":  # contiguous, one element past an aligned allocation
        flat = np.full(values.size + 1, gap(name), values.dtype)
        flat[1:] = values.ravel()
        return cp.asarray(flat)[1:].reshape(values.shape)
    if mode == "transposed":
        return cp.asarray(np.ascontiguousarray(values.T)).T
    if mode == "reversed":  # negative stride on axis 0
        return cp.asarray(np.ascontiguousarray(values[::-1]))[::-1]
    raise ValueError(mode)


def poisoned(shape, dtype, mode):
    """An ``out=`` array full of NaN (SENTINEL for integers), NumPy for NumPy input, and
    misaligned (data pointer not 16-byte aligned) in "offset" mode."""
    fill = SENTINEL if dtype in INTS else np.nan
    skip = int(mode == "offset")
    buf = np.full(math.prod(shape) + skip, fill, dt(dtype))
    if mode != "numpy":
        buf = _cupy().asarray(buf)
    return buf[skip:].reshape(shape)


def poison_pool(shape, dtype):
    """Leave two NaN (SENTINEL) blocks of this size in CuPy's memory pool, so arrays an
    operator allocates itself (trace's result, layer_norm's statistics) start poisoned
    rather than holding an old, possibly right, result."""
    cp = _cupy()
    fill = SENTINEL if dtype in INTS else np.nan
    bufs = [cp.asarray(np.full(shape, fill, dt(dtype))) for _ in range(2)]
    del bufs


def check_kind(res, mode):
    if mode == "numpy":
        assert not is_cupy(res) and isinstance(res, (np.ndarray, np.generic)), type(res)
    else:
        assert isinstance(res, _cupy().ndarray), type(res)


# ---------------------------------------------------------------------------- comparisons
def sum_tol(dtype, terms):
    """TOLERANCE["reduce"], except float32 sums of many terms (one thread summing in
    sequence: naive rows, reduce_strided, trace_naive, the naive second pass), whose bound
    grows with sqrt(terms): reference.float32_sum_tolerance. Integer tests check the
    indexing exactly."""
    if dtype in INTS:
        return None  # exact
    if dtype == "float32":
        return reference.float32_sum_tolerance(terms)
    return reference.TOLERANCE["reduce"][dtype]


def _rounding_floor(ref, dtype):
    """rel_error of the reference rounded to ``dtype``: no ``dtype`` output can do better
    (float16 softmax rows of 3e5 elements are subnormal, ~3e-3 off at best)."""
    with np.errstate(over="ignore", invalid="ignore"):
        floor = reference.rel_error(np.asarray(ref, np.float64).astype(dt(dtype)), ref)
    return floor if np.isfinite(floor) else 0.0


def assert_matches(got, ref, dtype, tol=None, exact=False, what=""):
    """Shape, dtype, then: integers (and ``exact``) equal, floats within tol."""
    got = np.asarray(host(got))
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert got.dtype == dt(dtype), f"{what}: dtype {got.dtype} != {dtype}"
    if dtype in INTS:
        bad = got.astype(np.int64) != ref.astype(np.int64)
        assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} differ: {got[bad][:5]} vs {ref[bad][:5]}"
    elif exact:
        assert np.array_equal(got.astype(np.float64), ref.astype(np.float64), equal_nan=True), what
    else:
        err = reference.rel_error(got, ref)
        limit = tol + _rounding_floor(ref, dtype)
        assert err <= limit, f"{what}: rel error {err:.3g} > {limit:.3g}"


def row_errors(got, ref, axis=-1):
    """rel_error of each row along ``axis`` (inf where NaN positions differ)."""
    g = np.moveaxis(np.asarray(host(got), np.float64), axis, -1)
    r = np.moveaxis(np.asarray(ref, np.float64), axis, -1)
    g, r = g.reshape(-1, g.shape[-1]), r.reshape(-1, r.shape[-1])
    nan_g, nan_r = np.isnan(g), np.isnan(r)
    g, r = np.where(nan_g & nan_r, 0.0, g), np.where(nan_g & nan_r, 0.0, r)
    with np.errstate(invalid="ignore"):
        num = np.linalg.norm(g - r, axis=1)
    den = np.linalg.norm(r, axis=1)
    err = np.where(den > 0, num / np.where(den > 0, den, 1.0), num)
    return np.where((nan_g != nan_r).any(axis=1), np.inf, err)


def assert_rows_match(got, ref, dtype, axis=-1, what="", row_cond=0.0):
    """softmax / norms: the whole array and every row within TOLERANCE["norm"] (a row is
    checked on its own, so one large row cannot hide an error in a small one). ``row_cond``:
    each row's own relative error no float32 computation avoids (layer_norm's x - mean of a
    row whose mean is far larger than its spread), added to its tolerance."""
    tol = reference.TOLERANCE["norm"][dtype]
    assert_matches(got, ref, dtype, tol=tol + float(np.max(row_cond, initial=0.0)), what=what)
    with np.errstate(over="ignore", invalid="ignore"):
        floor = np.nan_to_num(row_errors(np.asarray(ref, np.float64).astype(dt(dtype)), ref, axis), posinf=0.0)
    err = row_errors(got, ref, axis)
    bad = ~(err <= tol + floor + np.ravel(row_cond))
    assert not bad.any(), f"{what}: {int(bad.sum())} rows off, worst rel error {err.max():.3g} (tol {tol:g})"


def assert_same_bits(a, b):
    a, b = np.asarray(host(a)), np.asarray(host(b))
    assert a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------- runners
def plain_and_poisoned(fn, x, out_shape, out_dtype, mode):
    """fn(x) and fn(x, out=<poisoned>): returns both, after checking out= is returned and
    both are arrays of the input's kind. Same alignment -> same kernel -> same bits."""
    plain = fn(x)
    out = poisoned(out_shape, out_dtype, mode)
    res = fn(x, out=out)
    assert res is out
    check_kind(plain, mode)
    check_kind(res, mode)
    if mode != "offset":  # a misaligned out= may take the scalar path: other rounding
        assert_same_bits(plain, res)
    return plain, res


def reduced_shape(shape, axis, keepdims):
    nd = len(shape)
    if axis is None:
        axes = set(range(nd))
    else:
        axes = {a % nd for a in (axis if isinstance(axis, tuple) else (axis,))}
    terms = math.prod(shape[a] for a in axes)
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape)), terms
    return tuple(d for i, d in enumerate(shape) if i not in axes), terms


def run_reduce(op, impl, dtype, values, mode="cupy", axis=None, keepdims=False, sum_dtype=None):
    out_shape, terms = reduced_shape(values.shape, axis, keepdims)
    kw = dict(axis=axis, keepdims=keepdims, impl=impl)
    if op == "sum":
        out_dtype = sum_dtype or SUM_RESULT[dtype]
        if sum_dtype is not None:
            kw["dtype"] = dt(sum_dtype)
        ref = reference.sum(values, axis=axis)
    else:
        out_dtype = dtype
        ref = reference.max(values, axis=axis)
    ref = np.asarray(ref).reshape(out_shape)
    fn = getattr(cupyops, op)
    what = f"{op}[{impl}] {dtype} {values.shape} axis={axis} keepdims={keepdims} {mode}"
    for res in plain_and_poisoned(lambda x, **o: fn(x, **kw, **o), place(values, mode),
                                  out_shape, out_dtype, mode):
        if op == "max":
            assert_matches(res, ref, out_dtype, exact=True, what=what)
        else:
            assert_matches(res, ref, out_dtype, tol=sum_tol(out_dtype, terms), what=what)


def run_trace(impl, dtype, values, mode="cupy"):
    x = place(values, mode)
    out_dtype = SUM_RESULT[dtype]
    poison_pool((), out_dtype)
    res = cupyops.trace(x, impl=impl)
    check_kind(res, mode)
    if mode == "numpy":
        assert isinstance(res, np.generic), type(res)
    n = min(values.shape)
    assert_matches(res, reference.trace(values), out_dtype, tol=sum_tol(out_dtype, n),
                   what=f"trace[{impl}] {dtype} {values.shape} {mode}")


def run_softmax(impl, dtype, values, mode="cupy", axis=-1):
    ref = reference.softmax(values, axis=axis)
    what = f"softmax[{impl}] {dtype} {values.shape} axis={axis} {mode}"
    results = plain_and_poisoned(lambda x, **o: cupyops.softmax(x, axis=axis, impl=impl, **o),
                                 place(values, mode), values.shape, dtype, mode)
    for res in results:
        assert_rows_match(res, ref, dtype, axis, what=what)
    return results[0]


def _params(rng, dtype, n, mode, count):
    """``count`` random (n,) parameters (weight, bias) as host values and as passed."""
    where = mode if mode in ("numpy", "offset") else "cupy"
    vals = [rand(rng, (n,), dtype) for _ in range(count)]
    return vals, [place(v, where) for v in vals]


def assert_stats(mean, rstd, mean_ref, rstd_ref, values, dtype, mode, what):
    """float32 statistics of shape x.shape[:-1]: mean against the row's RMS (its scale;
    a mean near 0 has no relative precision), rstd relative."""
    tol = STATS_TOL[dtype]
    for s in (mean, rstd):
        check_kind(s, mode)
        assert np.asarray(host(s)).dtype == np.float32 and np.shape(s) == values.shape[:-1], what
    x = values.astype(np.float64)
    rms = np.maximum(np.sqrt(np.mean(x * x, axis=-1)), 1e-30)
    with np.errstate(invalid="ignore"):
        mean_err = np.abs(np.asarray(host(mean), np.float64) - mean_ref) / rms
        rstd_err = np.abs(np.asarray(host(rstd), np.float64) - rstd_ref) / rstd_ref
    assert np.all(mean_err <= tol), f"{what}: mean off by {np.nanmax(mean_err):.3g} x rms (tol {tol:g})"
    assert np.all(rstd_err <= tol), f"{what}: rstd off by {np.nanmax(rstd_err):.3g} (tol {tol:g})"


def run_layer_norm(impl, dtype, values, rng, mode="cupy", weight=True, bias=True, eps=1e-5):
    (w, b), (wx, bx) = _params(rng, dtype, values.shape[-1], mode, 2)
    w, wx = (w, wx) if weight else (None, None)
    b, bx = (b, bx) if bias else (None, None)
    y_ref, mean_ref, rstd_ref = reference.layer_norm(values, w, b, eps)
    what = f"layer_norm[{impl}] {dtype} {values.shape} w={weight} b={bias} eps={eps} {mode}"
    # x - mean in float32 carries two roundings of |mean| (the mean's, the subtraction's)
    # against the row's spread: rows of a few close values are that ill-conditioned
    # whatever the kernel (Hypothesis found two values whose row came out 1.1e-5 off; a
    # NumPy float32 emulation of the two-pass sums over 2e5 such pairs stays within a
    # quarter of this allowance)
    std = np.std(np.asarray(values, np.float64), axis=-1)
    mean_abs = np.abs(np.asarray(mean_ref, np.float64))
    cond = 2 * np.finfo(np.float32).eps * np.divide(mean_abs, std, out=np.zeros_like(std), where=std > 0)
    x = place(values, mode)
    for res in plain_and_poisoned(lambda x, **o: cupyops.layer_norm(x, wx, bx, eps, impl=impl, **o),
                                  x, values.shape, dtype, mode):
        assert_rows_match(res, y_ref, dtype, what=what, row_cond=cond)
    out = poisoned(values.shape, dtype, mode)
    poison_pool(values.shape[:-1], "float32")  # last: the statistics get these blocks
    y, mean, rstd = cupyops.layer_norm(x, wx, bx, eps, return_stats=True, out=out, impl=impl)
    assert y is out
    assert_rows_match(y, y_ref, dtype, what=what + " (return_stats)", row_cond=cond)
    assert_stats(mean, rstd, mean_ref, rstd_ref, values, dtype, mode, what)


def run_rms_norm(impl, dtype, values, rng, mode="cupy", weight=True, eps=1e-6):
    (w,), (wx,) = _params(rng, dtype, values.shape[-1], mode, 1)
    w, wx = (w, wx) if weight else (None, None)
    ref = reference.rms_norm(values, w, eps)
    what = f"rms_norm[{impl}] {dtype} {values.shape} w={weight} eps={eps} {mode}"
    for res in plain_and_poisoned(lambda x, **o: cupyops.rms_norm(x, wx, eps, impl=impl, **o),
                                  place(values, mode), values.shape, dtype, mode):
        assert_rows_match(res, ref, dtype, what=what)


def run_row_op(op, impl, dtype, values, rng, mode="cupy"):
    if op == "softmax":
        run_softmax(impl, dtype, values, mode)
    elif op == "layer_norm":
        run_layer_norm(impl, dtype, values, rng, mode)
    else:
        run_rms_norm(impl, dtype, values, rng, mode)


# ---------------------------------------------------------------------------- strategies
AWKWARD = (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 63, 65, 127, 129, 255, 256, 257,
           511, 513, 781, 1023, 1024, 1025, 1823, 2047, 2049)
ROW_AWKWARD = AWKWARD + (2048, 4095, 4096, 4097, 8191)  # around the register plans' limits
SMALL = st.sampled_from((1, 2, 3, 5, 8, 9, 17))
SEEDS = st.integers(0, 2**64 - 1)
MODE = st.sampled_from(MODES)


def dims(awkward):
    return st.one_of(st.sampled_from(awkward), st.integers(1, 1100))


@st.composite
def shapes(draw, min_ndim, max_ndim, awkward=AWKWARD, long_last=False):
    """One long awkward dimension (last, or anywhere), the others small."""
    ndim = draw(st.integers(min_ndim, max_ndim))
    if ndim == 0:
        return ()
    rest = [draw(SMALL) for _ in range(ndim - 1)]
    rest.insert(ndim - 1 if long_last else draw(st.integers(0, ndim - 1)), draw(dims(awkward)))
    return tuple(rest)


def axis_choices(ndim):
    choices = [None, *range(-ndim, ndim)]
    if ndim >= 2:
        choices += [(0, ndim - 1), (ndim - 2, ndim - 1), tuple(range(ndim))]
    if ndim == 3:
        choices += [(0, 1), (-1, 0)]
    return choices


# ============================================================================ tests
def test_warmup_compiles_every_kernel_file():
    # first in the file: the NVRTC compiles (or disk-cache loads) happen here
    attention = [kf.filename for kf in cupyops.ops.attention.KERNEL_FILES]  # one file per registered rung module
    assert attention[0] == "attention.cu"
    # the sm_90a files compile only where a cc 9.0 GPU can run them
    hopper = _cupy().cuda.Device().compute_capability == "90"
    gemm = ["gemm_simt.cu", "gemm_mma.cu", *(["gemm_wgmma.cu"] if hopper else []), "gemm_skinny.cu"]
    fp8 = ["quantize.cu", *(["gemm_fp8.cu"] if hopper else [])]
    assert sorted(cupyops.warmup()) == sorted([*gemm, *fp8, "norm.cu", "reduce.cu", "softmax.cu", *attention,
                                               "activation.cu", "rope.cu", "sampling.cu"])
    assert cupyops.warmup("attention") == attention
    assert cupyops.warmup("matmul") == gemm
    assert cupyops.warmup("scaled_matmul") == fp8
    assert cupyops.warmup("softmax") == ["softmax.cu"]
    assert cupyops.warmup(["trace", "sum", "max"]) == ["reduce.cu"]
    assert cupyops.warmup(["layer_norm", "rms_norm"]) == ["norm.cu"]
    assert cupyops.warmup(["silu_and_mul", "gelu_and_mul", "add_rms_norm", "rope"]) == [
        "activation.cu", "norm.cu", "rope.cu"]


def test_small_calls_from_several_threads_agree():
    # memoized plans and shape arguments are shared by every thread: same kernel, same bits
    from concurrent.futures import ThreadPoolExecutor

    cp = _cupy()
    dev = cp.cuda.runtime.getDevice()
    x = cp.asarray(np.random.default_rng(0).standard_normal((3, 1000), dtype=np.float32))
    want = cupyops.softmax(x).get()

    def other(_):
        cp.cuda.Device(dev).use()
        return cupyops.softmax(x).get()

    with ThreadPoolExecutor(4) as pool:
        for got in pool.map(other, range(8)):
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(cupyops.softmax(x).get(), want)


def test_one_plan_serves_calls_with_and_without_weight():
    # a row plan is memoized per (op, impl, n, dtype): the same plan launches with a weight
    # array in one call and a null pointer in the next
    cp = _cupy()
    rng = np.random.default_rng(1)
    xh = rng.standard_normal((5, 768), dtype=np.float32)
    wh, bh = rng.standard_normal(768, dtype=np.float32), rng.standard_normal(768, dtype=np.float32)
    x, w, b = cp.asarray(xh), cp.asarray(wh), cp.asarray(bh)
    for args in ((), (w, b), (), (w, None), (None, b)):
        got = cupyops.layer_norm(x, *args).get()
        want = reference.layer_norm(xh, *[None if a is None else a.get() for a in args])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for weight in (None, w, None):
        got = cupyops.rms_norm(x, weight).get()
        want = reference.rms_norm(xh, None if weight is None else wh)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_threads_asking_for_one_file_share_a_single_compile(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    cp = _cupy()
    kf = cupyops.ops.softmax.KERNELS
    dev = cp.cuda.runtime.getDevice()
    builds = []
    real_build = type(kf)._build

    def counting_build(self):
        builds.append(threading.get_ident())
        return real_build(self)

    monkeypatch.setattr(type(kf), "_build", counting_build)
    monkeypatch.setattr(kf, "_modules", {})  # forget the module: the next use builds it
    monkeypatch.setattr(kf, "_functions", {})
    name = kf.name_expressions[0]

    def first_use(_):
        cp.cuda.Device(dev).use()
        kf.function(name)
        return kf._modules[dev]

    with ThreadPoolExecutor(8) as pool:
        modules = list(pool.map(first_use, range(8)))
    assert len(builds) == 1
    assert all(m is modules[0] for m in modules)
    wait = cupyops._kernels.warmup_async(["softmax", "sum"])
    assert wait() == ["softmax.cu", "reduce.cu"]
    assert len(builds) == 1  # already compiled: nothing rebuilt


# ---------------------------------------------------------------------------- hypothesis
@pytest.mark.parametrize("op,impl,dtype", grid(["trace"], REDUCE_DTYPES))
@HYPO
@given(m=dims(AWKWARD), n=dims(AWKWARD), mode=MODE, seed=SEEDS)
def test_trace_matches_reference(op, impl, dtype, m, n, mode, seed):
    rng = np.random.default_rng(seed)
    run_trace(impl, dtype, rand(rng, (m, n), dtype, loc=sum_loc(dtype)), mode)


@pytest.mark.parametrize("op,impl,dtype", grid(["sum", "max"], REDUCE_DTYPES))
@HYPO
@given(data=st.data())
def test_sum_max_match_reference(op, impl, dtype, data):
    shape = data.draw(shapes(0, 3), "shape")
    axis = data.draw(st.sampled_from(axis_choices(len(shape))), "axis")
    keepdims = data.draw(st.booleans(), "keepdims")
    mode = data.draw(MODE, "mode")
    rng = np.random.default_rng(data.draw(SEEDS, "seed"))
    values = rand(rng, shape, dtype, loc=sum_loc(dtype) if op == "sum" else 0.0)
    run_reduce(op, impl, dtype, values, mode, axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("op,impl,dtype", grid(["softmax"], ROW_DTYPES))
@HYPO
@given(data=st.data())
def test_softmax_matches_reference(op, impl, dtype, data):
    shape = data.draw(shapes(1, 3, ROW_AWKWARD, long_last=True), "shape")
    axis = data.draw(st.sampled_from([-1, *range(len(shape))]), "axis")
    scale = data.draw(st.sampled_from((1.0, 10.0, 100.0)), "scale")  # 100: nearly one-hot
    mode = data.draw(MODE, "mode")
    rng = np.random.default_rng(data.draw(SEEDS, "seed"))
    run_softmax(impl, dtype, rand(rng, shape, dtype, scale=scale), mode, axis=axis)


@pytest.mark.parametrize("op,impl,dtype", grid(["layer_norm", "rms_norm"], ROW_DTYPES))
@HYPO
@given(data=st.data())
def test_norms_match_reference(op, impl, dtype, data):
    shape = data.draw(shapes(1, 3, ROW_AWKWARD, long_last=True), "shape")
    mode = data.draw(MODE, "mode")
    weight = data.draw(st.booleans(), "weight")
    loc = data.draw(st.sampled_from((0.0, 3.0)), "loc")
    rng = np.random.default_rng(data.draw(SEEDS, "seed"))
    values = rand(rng, shape, dtype, loc=loc)
    if op == "layer_norm":
        bias = data.draw(st.booleans(), "bias")
        eps = data.draw(st.sampled_from((1e-5, 1e-3)), "eps")
        run_layer_norm(impl, dtype, values, rng, mode, weight=weight, bias=bias, eps=eps)
    else:
        eps = data.draw(st.sampled_from((1e-6, 1e-3)), "eps")
        run_rms_norm(impl, dtype, values, rng, mode, weight=weight, eps=eps)


# ---------------------------------------------------------------------------- launch paths
# (shape, axis, keepdims): which path of kernels/reduce.cu each one takes
REDUCE_CASES = [
    ((37, 200), -1, False),  # vector: a warp per row, 16-byte loads
    ((37, 201), 1, True),  # odd rows: unaligned scalar loads; keepdims
    ((5, 8192), -1, False),  # a 256-thread block per row
    ((5, 40000), -1, False),  # a 2-way split (vector: a flat wave of blocks)
    ((3, 200000), -1, False),  # split plan: few long rows (vector: flat, finished in one launch)
    ((3, 200001), -1, False),  # split plan, unaligned rows (flat: scalar head and tail a row)
    ((100, 70001), -1, False),  # many long unaligned rows: segments, finished in one launch
    ((2500, 2000), None, False),  # axis=None, 5e6 elements: one row, split + second pass
    ((40000, 3), -1, False),  # many tiny rows, no split
    ((1000, 37), 0, False),  # reduce_strided over axis 0
    ((7, 513, 9), 1, True),  # reduce_strided over a middle axis, keepdims
    ((6, 5, 301), (0, 2), False),  # non-trailing tuple: moved last, then rows
    ((6, 5, 301), (1, 2), False),  # trailing tuple: rows
    ((3, 4, 5), None, True),  # everything, keepdims
]


@pytest.mark.parametrize("shape,axis,keepdims", REDUCE_CASES,
                         ids=[f"{'x'.join(map(str, s))}-axis{str(a).replace(' ', '')}-kd{int(k)}"
                              for s, a, k in REDUCE_CASES])
@pytest.mark.parametrize("op,impl,dtype", grid(["sum", "max"], REDUCE_DTYPES))
def test_reduce_paths(op, impl, dtype, shape, axis, keepdims):
    rng = np.random.default_rng()
    values = rand(rng, shape, dtype, loc=sum_loc(dtype) if op == "sum" else 0.0)
    run_reduce(op, impl, dtype, values, axis=axis, keepdims=keepdims)


# Row lengths for softmax / layer_norm / rms_norm and, for float32 (float16 / bfloat16),
# the path "auto" takes on sm_90: fused warp (<=128 / <=256 elements), fused block
# (<=16384), cluster (<=131072), then the online / welford / twopass fallback.
ROW_SHAPES = [(64, 100), (33, 200), (5, 1025), (4, 8192), (3, 8191), (3, 16384), (3, 16385),
              (3, 40000), (2, 40001), (2, 131072), (2, 300000)]
ROW_OPS = ["softmax", "layer_norm", "rms_norm"]


@pytest.mark.parametrize("shape", ROW_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op,impl,dtype", grid(ROW_OPS, ROW_DTYPES))
def test_row_op_paths(op, impl, dtype, shape):
    # "fused" past 16384 falls back to online / welford / twopass; "cluster" and "auto"
    # past 131072 too (300000: no cluster of 8 blocks holds the row in registers).
    rng = np.random.default_rng()
    run_row_op(op, impl, dtype, rand(rng, shape, dtype), rng)


@pytest.mark.parametrize("op", ROW_OPS)
@pytest.mark.parametrize("dtype", ROW_DTYPES)
def test_auto_row_longer_than_any_cluster(op, dtype):
    rng = np.random.default_rng()
    run_row_op(op, "auto", dtype, rand(rng, (1, 600000), dtype), rng)


VIEW_ROW_SHAPES = [(33, 200), (4, 8192), (3, 40000), (2, 131072)]
VIEW_REDUCE_CASES = [((37, 200), -1), ((5, 8192), -1), ((3, 200000), -1), ((1000, 2000), None)]


@pytest.mark.parametrize("mode", ["strided", "offset", "reversed"])
@pytest.mark.parametrize("op,impl,dtype", grid(["sum", "max", *ROW_OPS], ["float32", "bfloat16"]))
def test_views_and_misaligned_pointers_on_every_path(op, impl, dtype, mode):
    # "offset": input (and out=, weight, bias) 4 or 2 bytes past a 16-byte boundary, so
    # the 16-byte-vector paths must notice and take their scalar loads
    rng = np.random.default_rng()
    if op in ("sum", "max"):
        for shape, axis in VIEW_REDUCE_CASES:
            values = rand(rng, shape, dtype, loc=sum_loc(dtype) if op == "sum" else 0.0)
            run_reduce(op, impl, dtype, values, mode, axis=axis)
    else:
        for shape in VIEW_ROW_SHAPES:
            run_row_op(op, impl, dtype, rand(rng, shape, dtype), rng, mode)


@pytest.mark.parametrize("dtype", ROW_DTYPES)
def test_softmax_fast_path_repeats_and_rechecks_layout(dtype):
    # the second call of a (shape, dtype, axis, impl) takes softmax's memoized fast path;
    # it must give the same bits, a fresh output each call, and still notice an offset
    # (misaligned) or non-contiguous input of the same shape and dtype
    cp = _cupy()
    from cupyops.ops import softmax as S

    rng = np.random.default_rng()
    values = rand(rng, (3, 1000), dtype)
    x = cp.asarray(values)
    first = cupyops.softmax(x)
    # (keys: ((x's shape, strides, dtype), axis, impl), device)
    assert any(k[0][0][0] == (3, 1000) and k[0][0][2] == x.dtype for k in S._FAST.cupy)
    second = cupyops.softmax(x)
    assert second.data.ptr != first.data.ptr
    assert_same_bits(first, second)
    assert_rows_match(second, reference.softmax(values), dtype)
    for mode in ("offset", "strided"):
        other = rand(rng, (3, 1000), dtype)
        got = cupyops.softmax(place(other, mode))
        assert_rows_match(got, reference.softmax(other), dtype, what=mode)
    with pytest.raises(ValueError, match="axis"):
        cupyops.softmax(x, axis=2)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", ROW_DTYPES)
def test_norm_fast_path_repeats_and_rechecks_layout(op, dtype):
    # as softmax's: the second call of a signature takes the memoized fast path (same bits,
    # a fresh output), and an offset or strided input, an offset weight, or another eps of
    # the same shapes still goes the checked way and gives the right rows
    cp = _cupy()
    from cupyops.ops import norm as N

    rng = np.random.default_rng()
    fn = getattr(cupyops, op)
    values = rand(rng, (5, 1024), dtype)
    w_values = rand(rng, (1024,), dtype)
    b_values = rand(rng, (1024,), dtype)
    x, w, b = cp.asarray(values), cp.asarray(w_values), cp.asarray(b_values)
    params = (w,) if op == "rms_norm" else (w, b)
    host = (w_values,) if op == "rms_norm" else (w_values, b_values)

    def ref(v, eps, ps=host):
        if op == "rms_norm":
            return reference.rms_norm(v, ps[0], eps)
        return reference.layer_norm(v, ps[0], ps[1], eps)[0]

    eps = 1e-5
    first = fn(x, *params, eps=eps)
    assert any(k[0][0][0] == (5, 1024) for k in N._FAST[op].cupy)
    second = fn(x, *params, eps=eps)
    assert second.data.ptr != first.data.ptr
    assert_same_bits(first, second)
    assert_rows_match(second, ref(values, eps), dtype)
    for mode in ("offset", "strided"):
        other = rand(rng, (5, 1024), dtype)
        assert_rows_match(fn(place(other, mode), *params, eps=eps), ref(other, eps), dtype, what=mode)
    w_off = place(w_values, "offset")
    got = fn(x, w_off, *params[1:], eps=eps)
    assert_rows_match(got, ref(values, eps), dtype, what="offset weight")
    assert_rows_match(fn(x, *params, eps=0.5), ref(values, 0.5), dtype, what="another eps")


@pytest.mark.parametrize("op,impl,dtype", grid(["softmax"], ROW_DTYPES))
def test_softmax_over_other_axes(op, impl, dtype):
    rng = np.random.default_rng()
    for shape, axis in [((300, 7), 0), ((5, 1823, 3), 1), ((40000, 2), 0), ((3, 4, 781), -1)]:
        run_softmax(impl, dtype, rand(rng, shape, dtype), axis=axis)


SUM_DTYPE_PAIRS = [("float16", "float32"), ("bfloat16", "float32"), ("float16", "float64"),
                   ("float32", "float64"), ("bfloat16", "bfloat16"), ("int32", "int32"),
                   ("int32", "int64"), ("int32", "float32"), ("int32", "float64"),
                   ("int64", "float64")]


@pytest.mark.parametrize("din,dout", SUM_DTYPE_PAIRS, ids=[f"{a}-to-{b}" for a, b in SUM_DTYPE_PAIRS])
@pytest.mark.parametrize("impl", impls("sum"))
def test_sum_dtype_argument(impl, din, dout):
    rng = np.random.default_rng()
    for shape, axis in [((37, 200), -1), ((3, 200000), -1), ((1000, 37), 0),
                        ((6, 5, 301), (0, 2)), ((2500, 2000), None)]:
        values = rand(rng, shape, din, loc=sum_loc(dout))  # loc by the result dtype: no cancellation in float32 sums
        run_reduce("sum", impl, din, values, axis=axis, sum_dtype=dout)


# ---------------------------------------------------------------------------- special values
BIG = {"int32": 2**30, "int64": 2**40}  # int64: sums need > 53 bits (inexact in float64)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op,impl", [(op, i) for op in ("trace", "sum", "max") for i in impls(op)])
def test_integer_results_are_exact(op, impl, dtype):
    # int32 near 2**30: the int64 result passes 2**31; max of all-negative values checks
    # the identity (INT_MIN, not 0)
    rng = np.random.default_rng()

    def big(shape):
        v = rng.integers(BIG[dtype] - 1000, BIG[dtype] + 1000, size=shape).astype(dt(dtype))
        return -v if op == "max" else v

    if op == "trace":
        values = big((300, 301))
        assert reference.trace(values) > 2**31
        run_trace(impl, dtype, values)
        return
    for shape, axis in [((5, 7), None), ((3, 200000), -1), ((40, 8192), -1), ((1000, 37), 0),
                        ((6, 5, 301), (0, 2)), ((2500, 2000), None)]:
        values = big(shape)
        if op == "sum":
            assert np.min(reference.sum(values, axis=axis)) > 2**31
        run_reduce(op, impl, dtype, values, axis=axis)


@pytest.mark.parametrize("op,impl,dtype", grid(["trace"], REDUCE_DTYPES))
def test_trace_of_a_long_strided_diagonal(op, impl, dtype):
    # a (9000, 9000) view x[i, j] = base[i + j]: the diagonal is base[::2] (9000 elements,
    # enough for trace_unrolled's 8 loads in flight), base[1::2] is NaN / GAP_INT
    cp = _cupy()
    rng = np.random.default_rng()
    n = 9000
    base = rand(rng, (2 * n - 1,), dtype, loc=sum_loc(dtype))
    base[1::2] = gap(dtype)
    dev = cp.asarray(base)
    x = cp.ndarray((n, n), dev.dtype, memptr=dev.data, strides=(dev.itemsize, dev.itemsize))
    out_dtype = SUM_RESULT[dtype]
    poison_pool((), out_dtype)
    res = cupyops.trace(x, impl=impl)
    check_kind(res, "cupy")
    assert_matches(res, reference.sum(base[::2]), out_dtype, tol=sum_tol(out_dtype, n),
                   what=f"trace[{impl}] {dtype} strided diagonal of {n}")


@pytest.mark.parametrize("op,impl,dtype", grid(["max"], FLOAT_REDUCE))
def test_max_propagates_nan(op, impl, dtype):
    rng = np.random.default_rng()
    for shape, axis in [((5, 200), -1), ((4, 8192), -1), ((3, 200000), -1), ((2500, 2000), None),
                        ((1000, 37), 0), ((6, 5, 301), (0, 2))]:
        values = rand(rng, shape, dtype)
        values.reshape(-1)[rng.choice(values.size, size=3, replace=False)] = np.nan
        assert np.isnan(reference.max(values, axis=axis)).any()
        run_reduce("max", impl, dtype, values, axis=axis)


@pytest.mark.parametrize("n", [17, 200, 8192, 40000, 300000])
@pytest.mark.parametrize("op,impl,dtype", grid(["softmax"], ROW_DTYPES))
def test_softmax_masked_rows(op, impl, dtype, n):
    # row 1 all -inf -> NaN (as NumPy); row 2 half -inf (whole cluster blocks of -inf in a
    # finite row); row 3 a random 30% mask; masked positions must come out exactly 0
    rng = np.random.default_rng()
    values = rand(rng, (4, n), dtype)
    values[1] = -np.inf
    values[2, : n // 2 + 1] = -np.inf
    values[3, rng.random(n) < 0.3] = -np.inf
    values[3, -1] = 1.0
    got = host(run_softmax(impl, dtype, values)).astype(np.float64)
    assert np.isnan(got[1]).all()
    assert not np.isnan(got[[0, 2, 3]]).any()
    masked = np.isneginf(values.astype(np.float64))
    masked[1] = False
    assert (got[masked] == 0).all()


@pytest.mark.parametrize("n", [200, 8192, 40000, 131072, 300000])
@pytest.mark.parametrize("op,impl,dtype", grid(["softmax"], ROW_DTYPES))
def test_softmax_huge_magnitudes_are_nearly_one_hot(op, impl, dtype, n):
    rng = np.random.default_rng()
    values = rand(rng, (3, n), dtype)
    values[0] = rand(rng, (n,), dtype, scale=1e3)  # exp(x - max) underflows for all but a few
    run_softmax(impl, dtype, values)  # checked row by row


# ---------------------------------------------------------------------------- API behaviour
# (the others: test_gpu_gemm.py, test_gpu_attention.py, test_gpu_fused.py, test_gpu_sampling.py)
@pytest.mark.parametrize("op", [op for op in cupyops.OPS if op not in (
    "matmul", "gemm", "attention", "silu_and_mul", "gelu_and_mul", "add_rms_norm", "rope", "sample")])
def test_numpy_in_numpy_out_and_cupy_in_cupy_out(op):
    rng = np.random.default_rng()
    for mode in ("numpy", "cupy"):
        if op == "trace":
            run_trace("auto", "float32", rand(rng, (33, 40), "float32", loc=3.0), mode)
        elif op in ("sum", "max"):
            values = rand(rng, (6, 33), "float32", loc=3.0)
            res = getattr(cupyops, op)(place(values, mode))  # axis=None: a scalar
            check_kind(res, mode)
            if mode == "numpy":
                assert isinstance(res, np.generic), type(res)
            else:
                assert res.shape == ()
            run_reduce(op, "auto", "float32", values, mode, axis=-1)
        elif op == "layer_norm":
            values = rand(rng, (6, 33), "float32")
            y, mean, rstd = cupyops.layer_norm(place(values, mode), return_stats=True)
            for a in (y, mean, rstd):
                check_kind(a, mode)
            run_layer_norm("auto", "float32", values, rng, mode)
        else:
            run_row_op(op, "auto", "float32", rand(rng, (6, 33), "float32"), rng, mode)


def test_out_beside_a_reversed_view_is_not_an_overlap():
    # x = rows 0..R-1 of buf, reversed (its data pointer is row R-1); out = rows R..2R-1 of
    # the same allocation. They share no element (np.shares_memory says so), so out= must
    # be accepted: an overlap test on [x.data.ptr, x.data.ptr + x.nbytes) ignores strides.
    cp = _cupy()
    rng = np.random.default_rng()
    R, n = 4, 1000
    values = rand(rng, (2 * R, n), "float32")
    assert not np.shares_memory(values[:R][::-1], values[R:])
    buf = cp.asarray(values)
    res = cupyops.softmax(buf[:R][::-1], out=buf[R:])
    assert_rows_match(res, reference.softmax(values[:R][::-1]), "float32")
    flat = cp.asarray(values).ravel()
    x, out = flat[: R * n].reshape(R, n)[::-1], flat[R * n: R * n + R]  # out: row R's start
    out.fill(np.nan)
    res = cupyops.sum(x, axis=-1, out=out)
    assert res is out
    assert_matches(res, reference.sum(values[:R][::-1], axis=-1), "float32", tol=sum_tol("float32", n))


DETERMINISM_CASES = [("sum", (10_000_000,)), ("softmax", (64, 131072)),
                     ("layer_norm", (64, 131072)), ("rms_norm", (64, 131072))]


@pytest.mark.parametrize("op,shape", DETERMINISM_CASES, ids=[c[0] for c in DETERMINISM_CASES])
def test_auto_is_bitwise_deterministic(op, shape):
    # no float atomics anywhere: the same input gives the same bits (the split sum and the
    # cluster rows on sm_90 included)
    cp = _cupy()
    rng = np.random.default_rng()
    values = rand(rng, shape, "float32", loc=3.0 if op == "sum" else 0.0)
    x = cp.asarray(values)
    fn = getattr(cupyops, op)
    first = fn(x)
    cp.empty(7 * 1024 * 1024, np.uint8).fill(255)  # disturb the memory pool in between
    assert_same_bits(first, fn(x))
    if op == "sum":
        assert_matches(first, reference.sum(values), "float32", tol=sum_tol("float32", values.size))
    else:
        ref = getattr(reference, op)(values)
        assert_rows_match(first, ref[0] if op == "layer_norm" else ref, "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,axis", [((10_000_000,), None), ((3, 200000), -1), ((2, 200001), -1),
                                        ((65, 100000), -1)])
def test_split_sums_finish_in_one_launch_and_leave_tickets_zeroed(shape, axis, dtype, monkeypatch):
    # the vector rung's split rows are finished by their last block, on the flat path (at
    # most FLAT_MAX_ROWS rows) and on the segment path (up to ONE_LAUNCH_SPLITS segments);
    # the ticket counters must be back at zero for the next launch on the stream, and the
    # two-pass path agrees
    cp = _cupy()
    from cupyops import _arrays
    from cupyops.ops import reduce as R

    rng = np.random.default_rng()
    values = rand(rng, shape, dtype, loc=1.0 if dtype == "float32" else 0.0)  # no fp16 overflow
    x = cp.asarray(values)
    flat = cupyops.sum(x, axis=axis, impl="vector")
    assert not _arrays.tickets(128).any()
    monkeypatch.setattr(R, "FLAT_MAX_ROWS", 0)
    segments = cupyops.sum(x, axis=axis, impl="vector")
    assert not _arrays.tickets(128).any()
    monkeypatch.setattr(R, "ONE_LAUNCH_SPLITS", 0)
    two = cupyops.sum(x, axis=axis, impl="vector")
    for got in (flat, segments, two):
        assert_matches(got, reference.sum(values, axis=axis), dtype, tol=sum_tol(dtype, values.size))


def test_stream_semantics():
    # everything (inputs, pooled temporaries, outputs) on a non-blocking stream: after
    # s.synchronize() the results, read on that stream, are complete and right
    cp = _cupy()
    rng = np.random.default_rng()
    long_rows = rand(rng, (3, 200000), "float32", loc=3.0)
    rows = rand(rng, (8, 40000), "float32")
    square = rand(rng, (3000, 3000), "float32", loc=3.0)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        xl, xr, xs = cp.asarray(long_rows), cp.asarray(rows), cp.asarray(square)
        outs = {op: poisoned(shape, "float32", "cupy") for op, shape in
                [("sum", (3,)), ("max", (3,)), ("softmax", rows.shape),
                 ("layer_norm", rows.shape), ("rms_norm", rows.shape)]}
        got = {
            "sum": cupyops.sum(xl, axis=-1, out=outs["sum"]),
            "max": cupyops.max(xl, axis=-1, out=outs["max"]),
            "sum_all": cupyops.sum(xl),
            "softmax": cupyops.softmax(xr, out=outs["softmax"]),
            "layer_norm": cupyops.layer_norm(xr, out=outs["layer_norm"]),
            "rms_norm": cupyops.rms_norm(xr, out=outs["rms_norm"]),
            "trace": cupyops.trace(xs),
        }
        from_host = cupyops.softmax(rows)  # NumPy in: staged through pinned memory on s
    s.synchronize()
    got = {k: v.get(stream=s) for k, v in got.items()}
    tol = sum_tol("float32", long_rows.shape[1])
    assert_matches(got["sum"], reference.sum(long_rows, axis=-1), "float32", tol=tol)
    assert_matches(got["sum_all"], reference.sum(long_rows), "float32", tol=sum_tol("float32", long_rows.size))
    assert_matches(got["max"], reference.max(long_rows, axis=-1), "float32", exact=True)
    assert_matches(got["trace"], reference.trace(square), "float32", tol=sum_tol("float32", 3000))
    assert_rows_match(got["softmax"], reference.softmax(rows), "float32")
    assert_rows_match(from_host, reference.softmax(rows), "float32")
    assert_rows_match(got["layer_norm"], reference.layer_norm(rows)[0], "float32")
    assert_rows_match(got["rms_norm"], reference.rms_norm(rows), "float32")


def test_benchmark_hold_sees_its_release_before_the_next_engage():
    # cupyops-bench queues each batch of repeats behind a hold kernel and releases it; the
    # next batch's hold is engaged microseconds later. The first hold must still see its
    # own release (it polls every 2 us) instead of spinning to its 1 s timeout.
    cp = _cupy()
    from cupyops.bench import timing

    hold = timing._Hold()
    hold.engage()
    after_first = cp.cuda.Event()
    after_first.record()
    hold.release()
    hold.engage()  # immediately: the first hold has very likely not polled yet
    t0 = time.perf_counter()
    after_first.synchronize()
    waited = time.perf_counter() - t0
    hold.release()
    cp.cuda.get_current_stream().synchronize()
    assert not hold.timed_out()
    assert waited < 0.5, f"the first hold waited {waited:.3f} s for a later release"


def test_benchmark_times_a_case_side_by_side():
    # time_side_by_side: the calls that fit the budget interleave, each timed between its
    # own events; a call ten times longer reads about ten times longer, whatever the order
    cp = _cupy()
    from cupyops.bench import timing

    a = cp.random.standard_normal((2048, 2048), dtype=cp.float32)
    b = cp.random.standard_normal((1024, 1024), dtype=cp.float32)
    fns = {"big": lambda: a @ a, "small": lambda: b @ b, "twice": lambda: (b @ b, b @ b)}
    for _ in range(20):  # (clocks up from idle)
        a @ a
    t = timing.time_side_by_side(fns, repeats=20, warmup=2, flush=timing.L2Flusher())
    assert set(t) == set(fns) and all(v.repeats == 24 for v in t.values())  # (whole rounds of 6)
    ms = {k: v.median_ms for k, v in t.items()}
    assert 3 < ms["big"] / ms["small"] < 16 and 1.3 < ms["twice"] / ms["small"] < 3, ms
