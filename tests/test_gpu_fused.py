"""GPU tier: the fused LLM operators (issue 19) -- silu_and_mul, gelu_and_mul, add_rms_norm,
rope -- every rung and impl="auto", against the float64 references of cupyops.reference.

- Hypothesis draws shapes with awkward lengths (1, 17, 1823 columns, head dims that are not
  multiples of a 16-byte vector), placements (CuPy, NumPy, a start off 16 bytes, strided
  views: rope's q and k as head slices of one qkv buffer), options (weight, eps, rotary_dim,
  style, a cos_sin_cache in float32 or the model's dtype, int32/int64 positions) and seeds.
- Every call runs without out= and into NaN-poisoned out= arrays (rope and add_rms_norm: a
  pair), which must come back as given, fully written; in place (add_rms_norm, rope) the
  caller's arrays hold what a separate output gets, bit for bit.
- Floats compare as reference.rel_error <= TOLERANCE["norm"] by dtype plus the error of
  the reference itself rounded to the dtype; add_rms_norm's sum must be the reference's
  rounded sum exactly (the operator's contract: PyTorch's x + residual).
- With torch installed: torch tensors in, torch tensors out (the memoized fast path
  included), against the PyTorch eager compositions the operators replace.
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cupyops
from cupyops import reference
from cupyops.ops import activation as activation_op
from cupyops.ops import norm as norm_op
from cupyops.ops import rope as rope_op
from gpu_helpers import _cp, dt, host

pytestmark = pytest.mark.gpu

DTYPES = ("float32", "float16", "bfloat16")
HYPO = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
AWKWARD = (1, 2, 3, 7, 8, 9, 16, 17, 31, 33, 127, 129, 255, 781, 1024, 1823, 2049, 4096, 4097)
SEEDS = st.integers(0, 2**63 - 1)
MODES = ("cupy", "numpy", "offset", "strided")


def rand(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dt(dtype))


def place(values, mode):
    """``values`` as the operator gets it: NumPy, CuPy, CuPy starting one element past a
    16-byte boundary, or CuPy rows twice as far apart as their length (NaN between)."""
    if mode == "numpy":
        return values
    cp = _cp()
    if mode == "cupy":
        return cp.asarray(values)
    if mode == "offset":
        flat = np.full(values.size + 1, np.nan, values.dtype)
        flat[1:] = values.ravel()
        return cp.asarray(flat)[1:].reshape(values.shape)
    if mode == "strided":
        base = np.full(values.shape[:-1] + (2 * values.shape[-1],), np.nan, values.dtype)
        base[..., : values.shape[-1]] = values
        return cp.asarray(base)[..., : values.shape[-1]]
    raise ValueError(mode)


def poisoned(shape, dtype, mode):
    """An out= array full of NaN, of the input's kind (NumPy for NumPy input), misaligned in
    "offset" mode."""
    skip = int(mode == "offset")
    buf = np.full(math.prod(shape) + skip, np.nan, dt(dtype))
    if mode != "numpy":
        buf = _cp().asarray(buf)
    return buf[skip:].reshape(shape)


def check_kind(a, mode):
    if mode == "numpy":
        assert isinstance(a, np.ndarray), type(a)
    else:
        assert isinstance(a, _cp().ndarray), type(a)


def assert_close(got, ref, dtype, what="", allow=None):
    """rel_error within TOLERANCE["norm"] plus the reference's own rounding to ``dtype``,
    over the whole array and row by row (last axis); NaN only where the reference has it.
    ``allow``: per element, an absolute error allowed where the reference is no larger
    (there the element must be within it, and is left out of the relative comparison)."""
    got = np.asarray(host(got))
    ref = np.asarray(ref, np.float64)
    # the kernels compute in float32 with denormals flushed (-ftz=true): a result below
    # float32's smallest normal (gelu(-13.4) * 3.5 = -8.6e-40, found by Hypothesis) is 0
    ref = np.where(np.abs(ref) < np.finfo(np.float32).tiny, 0.0, ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert got.dtype == dt(dtype), f"{what}: dtype {got.dtype} != {dtype}"
    if allow is not None:
        small = np.abs(ref) <= allow
        bad = small & ~(np.abs(got.astype(np.float64) - ref) <= allow)
        assert not bad.any(), f"{what}: {np.count_nonzero(bad)} tiny outputs off by more than their allowance"
        got = np.where(small, 0, got).astype(got.dtype)
        ref = np.where(small, 0.0, ref)
    tol = reference.TOLERANCE["norm"][dtype]
    with np.errstate(over="ignore", invalid="ignore"):
        floor = reference.rel_error(ref.astype(dt(dtype)), ref)
    err = reference.rel_error(got, ref)
    assert err <= tol + floor, f"{what}: rel error {err:.3g} > {tol + floor:.3g}"
    g = got.astype(np.float64).reshape(-1, got.shape[-1]) if got.size else got
    r = ref.reshape(-1, ref.shape[-1]) if ref.size else ref
    for i in range(0, len(r), max(1, len(r) // 64)):  # rows: one big row cannot hide a small one
        with np.errstate(over="ignore", invalid="ignore"):
            floor = reference.rel_error(r[i].astype(dt(dtype)), r[i])
        e = reference.rel_error(g[i], r[i])
        assert e <= tol + floor, f"{what}: row {i} rel error {e:.3g}"


def same_bits(a, b, what=""):
    a, b = np.asarray(host(a)), np.asarray(host(b))
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert a.tobytes() == b.tobytes(), what


def impls(op):
    return [*cupyops.variants(op), "auto"]


def refuse_checked(m, fast):
    """Within monkeypatch context ``m``, every call through ``fast`` (a ``_fast.FastCalls``)
    must find its signature remembered: the checked path raises, so a test of the fast
    path cannot pass on the checked path's results."""

    def refuse(*args, **kwargs):
        raise AssertionError("the checked path ran: the call's signature was not remembered")

    m.setattr(fast, "checked", refuse)


# ============================================================================ *_and_mul
AND_MUL = [pytest.param(op, impl, d, approx, id=f"{op}-{impl}-{d}" + (f"-{approx}" if op == "gelu_and_mul" else ""))
           for op in ("silu_and_mul", "gelu_and_mul") for impl in impls(op) for d in DTYPES
           for approx in (("none", "tanh") if op == "gelu_and_mul" else ("none",))]


def and_mul(op, x, approx, **kw):
    if op == "silu_and_mul":
        return cupyops.silu_and_mul(x, **kw)
    return cupyops.gelu_and_mul(x, approx, **kw)


def and_mul_ref(op, values, approx):
    return reference.silu_and_mul(values) if op == "silu_and_mul" else reference.gelu_and_mul(values, approx)


def and_mul_allowance(values):
    """The absolute error the kernels may make on act(a) * b below float32's range, |a b|
    2^-125: silu and gelu(tanh) divide a by 1 + exp(..) with __fdividef, which gives 0 once
    the divisor passes 2^126 (erfc underflows alike for gelu), where the exact quotient is
    still a normal float (gelu_and_mul tanh, a near -10: ~1e-37 b, found by Hypothesis)."""
    v = np.asarray(values, np.float64)
    d = v.shape[-1] // 2
    return np.abs(v[..., :d] * v[..., d:]) * 2.0**-125


@pytest.mark.parametrize("op,impl,dtype,approx", AND_MUL)
@HYPO
@given(rows=st.sampled_from((1, 2, 3, 5, 17, 64)), lead=st.sampled_from(((), (2,), (3, 1))),
       d=st.one_of(st.sampled_from(AWKWARD), st.integers(1, 1200)), mode=st.sampled_from(MODES),
       scale=st.sampled_from((1.0, 4.0)), seed=SEEDS)
def test_and_mul_matches_reference(op, impl, dtype, approx, rows, lead, d, mode, scale, seed):
    rng = np.random.default_rng(seed)
    values = rand(rng, lead + (rows, 2 * d), dtype, scale)
    ref = and_mul_ref(op, values, approx)
    x = place(values, mode)
    what = f"{op}[{impl}] {dtype} {values.shape} {mode}"
    plain = and_mul(op, x, approx, impl=impl)
    check_kind(plain, mode)
    allow = and_mul_allowance(values)
    assert_close(plain, ref, dtype, what, allow)
    out = poisoned(ref.shape, dtype, mode)
    got = and_mul(op, x, approx, out=out, impl=impl)
    assert got is out
    assert_close(out, ref, dtype, what + " out=", allow)
    if mode != "offset":  # (a misaligned out= takes the element path: same math, same bits)
        same_bits(plain, out, what)


@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_and_mul"])
def test_and_mul_extremes_and_empty(op):
    # a -> -inf: silu and gelu tend to -0 (exp(-a) overflows to inf on the way); a large:
    # a * b; rows of length 0 and no rows give empty results
    cp = _cp()
    a = np.array([-1e4, -100.0, -88.0, -20.0, 0.0, 20.0, 100.0, 1e4], np.float32)
    x = np.concatenate([a, np.full_like(a, 2.0)])[None, :]
    got = host(and_mul(op, cp.asarray(x), "none")).astype(np.float64)
    want = and_mul_ref(op, x, "none")
    assert np.all(np.isfinite(got)), got
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
    for shape in ((0, 8), (3, 0)):
        y = and_mul(op, cp.empty(shape, np.float32), "none")
        assert y.shape == shape[:-1] + (shape[-1] // 2,)


@pytest.mark.parametrize("dtype", DTYPES)
def test_and_mul_fast_path_repeats_and_rechecks_layout(dtype, monkeypatch):
    cp = _cp()
    rng = np.random.default_rng()
    values = rand(rng, (4, 2 * 1024), dtype)
    x = cp.asarray(values)
    for op, fast in (("silu_and_mul", activation_op._FAST["silu_and_mul"]),
                     ("gelu_and_mul", activation_op._FAST["gelu_and_mul"])):
        first = and_mul(op, x, "tanh")
        assert any(k[0][0][0] == (4, 2048) for k in fast.cupy), f"{op}: nothing remembered"
        other = rand(rng, (4, 2 * 1024), dtype)
        with monkeypatch.context() as m:
            refuse_checked(m, fast)
            second = and_mul(op, x, "tanh")  # the fast path: same bits, a fresh output
            offset = and_mul(op, place(other, "offset"), "tanh")  # same key, misaligned start
        assert second.data.ptr != first.data.ptr
        same_bits(first, second, op)
        assert_close(second, and_mul_ref(op, values, "tanh"), dtype, op)
        assert_close(offset, and_mul_ref(op, other, "tanh"), dtype, f"{op} offset")


# ============================================================================ add_rms_norm
ADD_NORM = [pytest.param(impl, d, id=f"add_rms_norm-{impl}-{d}") for impl in impls("add_rms_norm") for d in DTYPES]
ROW_LENGTHS = AWKWARD + (5120, 8191, 8192, 16384, 20000)  # past the staged and register plans


def add_norm_refs(values, res, w, eps):
    normed, s = reference.add_rms_norm(values, res, w, eps)
    return normed, s


def check_add_norm(normed, s, ref_normed, ref_s, dtype, what):
    assert_close(normed, ref_normed, dtype, what + " normed")
    # the sum is the dtype's rounding of x + residual, exactly (PyTorch's x + residual)
    same_bits(s, np.asarray(ref_s).astype(dt(dtype)), what + " sum")


@pytest.mark.parametrize("impl,dtype", ADD_NORM)
@HYPO
@given(rows=st.sampled_from((1, 2, 3, 17, 40)), lead=st.sampled_from(((), (2,))),
       n=st.one_of(st.sampled_from(ROW_LENGTHS), st.integers(1, 3000)), mode=st.sampled_from(MODES),
       weight=st.booleans(), eps=st.sampled_from((1e-6, 1e-3)), seed=SEEDS)
def test_add_rms_norm_matches_reference(impl, dtype, rows, lead, n, mode, weight, eps, seed):
    cp = _cp()
    rng = np.random.default_rng(seed)
    shape = lead + (rows, n)
    values, res = rand(rng, shape, dtype), rand(rng, shape, dtype, 2.0)
    w = rand(rng, (n,), dtype) if weight else None
    ref_normed, ref_s = add_norm_refs(values, res, w, eps)
    what = f"add_rms_norm[{impl}] {dtype} {shape} w={weight} eps={eps} {mode}"
    x, r = place(values, mode), place(res, mode)
    wx = None if w is None else place(w, "numpy" if mode == "numpy" else "offset" if mode == "offset" else "cupy")
    normed, s = cupyops.add_rms_norm(x, r, wx, eps, impl=impl)
    check_kind(normed, mode)
    check_kind(s, mode)
    check_add_norm(normed, s, ref_normed, ref_s, dtype, what)
    outs = (poisoned(shape, dtype, mode), poisoned(shape, dtype, mode))
    got = cupyops.add_rms_norm(x, r, wx, eps, out=outs, impl=impl)
    assert got[0] is outs[0] and got[1] is outs[1]
    check_add_norm(*outs, ref_normed, ref_s, dtype, what + " out=")
    # in place: x gets normed, residual the sum, the same bits as the separate outputs (the
    # same kernel where the layout is the same)
    if mode in ("cupy", "numpy"):
        xi = values.copy() if mode == "numpy" else cp.asarray(values)
        ri = res.copy() if mode == "numpy" else cp.asarray(res)
        got = cupyops.add_rms_norm(xi, ri, wx, eps, inplace=True, impl=impl)
        assert got[0] is xi and got[1] is ri
        same_bits(xi, normed, what + " inplace normed")
        same_bits(ri, s, what + " inplace sum")


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_fast_path_and_in_place_repeats(dtype, monkeypatch):
    # decode-sized calls: the second call of a signature takes the memoized fast path (same
    # bits as the checked call, a fresh packed output); in place, each repeated call turns
    # the arrays' current values (a residual stream updated layer after layer)
    cp = _cp()
    rng = np.random.default_rng()
    fast = norm_op._FAST["add_rms_norm"]
    values, res, w = rand(rng, (4, 4096), dtype), rand(rng, (4, 4096), dtype), rand(rng, (4096,), dtype)
    x, r, wd = cp.asarray(values), cp.asarray(res), cp.asarray(w)
    first = cupyops.add_rms_norm(x, r, wd)
    assert fast.cupy, "nothing remembered"
    with monkeypatch.context() as m:
        refuse_checked(m, fast)
        second = cupyops.add_rms_norm(x, r, wd)
    assert second[0].data.ptr != first[0].data.ptr
    for a, b in zip(first, second):
        same_bits(a, b, "fast path")
    check_add_norm(*second, *add_norm_refs(values, res, w, 1e-6), dtype, "fast path")
    xi, ri = cp.asarray(values), cp.asarray(res)
    for step in range(3):  # the first call checked, the others fast
        before_x, before_r = xi.get(), ri.get()
        with monkeypatch.context() as m:
            if step:
                refuse_checked(m, fast)
            got = cupyops.add_rms_norm(xi, ri, wd, inplace=True)
        assert got[0] is xi and got[1] is ri
        check_add_norm(xi, ri, *add_norm_refs(before_x, before_r, w, 1e-6), dtype, f"in place, call {step}")
    other = rand(rng, (4, 4096), dtype)
    xo = place(other, "offset")
    with monkeypatch.context() as m:
        refuse_checked(m, fast)
        normed, s = cupyops.add_rms_norm(xo, r, wd)  # same layout, misaligned start
    check_add_norm(normed, s, *add_norm_refs(other, res, w, 1e-6), dtype, "offset x")


def test_add_rms_norm_plans_reach_every_rung():
    # auto: float32 rows that fit in registers go fused, 2-byte rows staged; a pair too long
    # to stage in one block (a cluster plan on sm_90) goes to fused, a row too long for one
    # block's registers to twopass
    from cupyops.ops import _rows

    def name(impl, n, dtype):
        return _rows.plan(norm_op.KERNELS, "add_rms_norm", impl, n, dtype, "twopass").name

    assert name("auto", 4096, "float32").startswith("add_rms_norm_fused<float,")
    assert name("auto", 4096, "bfloat16") == "add_rms_norm_staged<__nv_bfloat16>"
    assert name("staged", 100000, "bfloat16") == "add_rms_norm_twopass<__nv_bfloat16>"
    assert name("fused", 100000, "float32") == "add_rms_norm_twopass<float>"
    hopper = _cp().cuda.Device().compute_capability == "90"
    if hopper:  # 2 x 12288 x 2 bytes > 32 KB: rms_norm's sizes plan a cluster, which pairs don't take
        assert name("staged", 12288, "bfloat16").startswith("add_rms_norm_fused<__nv_bfloat16,")


# ============================================================================ rope
ROPE = [pytest.param(impl, d, id=f"rope-{impl}-{d}") for impl in impls("rope") for d in DTYPES]


@st.composite
def rope_problems(draw):
    tokens = draw(st.sampled_from((1, 2, 5, 17, 64)))
    hq = draw(st.sampled_from((1, 2, 4, 8)))
    hkv = draw(st.sampled_from([h for h in (1, 2, 4) if h <= hq]))
    D = draw(st.sampled_from((2, 6, 16, 34, 64, 80, 128, 256)))
    R = draw(st.sampled_from(sorted({D, max(2, D // 2 // 2 * 2), 2, max(2, (D * 3 // 4) // 2 * 2)})))
    return tokens, hq, hkv, D, R


@pytest.mark.parametrize("impl,dtype", ROPE)
@HYPO
@given(problem=rope_problems(), style=st.sampled_from(("neox", "gptj")),
       cache=st.sampled_from((None, "float32", "model")), pos_dtype=st.sampled_from(("int32", "int64")),
       layout=st.sampled_from(("cupy", "numpy", "qkv", "offset")), max_pos=st.sampled_from((1, 100, 3000, 200000)),
       seed=SEEDS)
def test_rope_matches_reference(impl, dtype, problem, style, cache, pos_dtype, layout, max_pos, seed):
    cp = _cp()
    tokens, hq, hkv, D, R = problem
    if cache is not None:  # (a cache of 200000 rows is 400 MB of float64 on the host)
        max_pos = min(max_pos, 3000)
    rng = np.random.default_rng(seed)
    qv, kv = rand(rng, (tokens, hq, D), dtype), rand(rng, (tokens, hkv, D), dtype)
    pos = rng.integers(0, max_pos, size=tokens).astype(pos_dtype)
    cache_host = None
    if cache is not None:
        cos, sin = reference.rope_cos_sin(np.arange(max_pos), R, 500000.0)
        cache_host = np.concatenate([cos, sin], axis=1).astype(dt("float32" if cache == "float32" else dtype))
    ref_q, ref_k = reference.rope(qv, kv, pos, R, 10000.0, style, cache_host)
    if layout == "numpy":
        q, k, p, c = qv, kv, pos, cache_host
    else:
        p = cp.asarray(pos)
        c = None if cache_host is None else cp.asarray(cache_host)
        if layout == "qkv":  # q and k as head slices of one fused projection's rows
            vv = rand(rng, (tokens, hkv, D), dtype)
            qkv = cp.asarray(np.concatenate([qv, kv, vv], axis=1))
            q, k = qkv[:, :hq], qkv[:, hq:hq + hkv]
        elif layout == "offset":
            q, k = place(qv, "offset"), place(kv, "offset")
        else:
            q, k = cp.asarray(qv), cp.asarray(kv)
    what = f"rope[{impl}] {dtype} q{qv.shape} k{kv.shape} R={R} {style} cache={cache} {pos_dtype} {layout}"
    mode = "numpy" if layout == "numpy" else "cupy"
    q_out, k_out = cupyops.rope(q, k, p, rotary_dim=R, style=style, cos_sin_cache=c, impl=impl)
    check_kind(q_out, mode)
    assert q_out.flags.c_contiguous and k_out.flags.c_contiguous
    assert_close(q_out, ref_q, dtype, what + " q")
    assert_close(k_out, ref_k, dtype, what + " k")
    outs = (poisoned(qv.shape, dtype, "offset" if layout == "offset" else mode),
            poisoned(kv.shape, dtype, "offset" if layout == "offset" else mode))
    got = cupyops.rope(q, k, p, rotary_dim=R, style=style, cos_sin_cache=c, out=outs, impl=impl)
    assert got[0] is outs[0] and got[1] is outs[1]
    assert_close(outs[0], ref_q, dtype, what + " out= q")
    assert_close(outs[1], ref_k, dtype, what + " out= k")
    # in place: the rotated dims turn where they are, the rest of the rows (and of qkv) stays
    qi = qv.copy() if layout == "numpy" else q.copy() if layout != "qkv" else q
    ki = kv.copy() if layout == "numpy" else k.copy() if layout != "qkv" else k
    got = cupyops.rope(qi, ki, p, rotary_dim=R, style=style, cos_sin_cache=c, inplace=True, impl=impl)
    assert got[0] is qi and got[1] is ki
    if layout == "qkv":
        same_bits(qkv[:, hq + hkv:], vv, what + " v untouched")
    assert_close(qi, ref_q, dtype, what + " in place q")
    assert_close(ki, ref_k, dtype, what + " in place k")


def test_rope_positions_outside_the_cache():
    # NumPy positions: checked on the host, before anything runs; device positions: the
    # kernels give those tokens' rotated dims NaN (no host sync), the others are right
    cp = _cp()
    rng = np.random.default_rng()
    q, k = rand(rng, (4, 2, 64), "float32"), rand(rng, (4, 1, 64), "float32")
    cos, sin = reference.rope_cos_sin(np.arange(16), 32, 10000.0)
    cache = np.concatenate([cos, sin], axis=1).astype(np.float32)
    with pytest.raises(ValueError, match="positions: 16 is outside cos_sin_cache's 16 rows"):
        cupyops.rope(q, k, np.array([0, 1, 16, 2]), rotary_dim=32, cos_sin_cache=cache)
    with pytest.raises(ValueError, match="positions: -1 is outside"):
        cupyops.rope(q, k, np.array([0, -1, 3, 2]), rotary_dim=32, cos_sin_cache=cache)
    pos = np.array([0, 16, -3, 5])
    for impl in impls("rope"):
        qo, ko = cupyops.rope(cp.asarray(q), cp.asarray(k), cp.asarray(pos), rotary_dim=32,
                              cos_sin_cache=cp.asarray(cache), impl=impl)
        ref_q, ref_k = reference.rope(q, k, pos, 32, cos_sin_cache=cache)
        for got, ref in ((qo.get(), ref_q), (ko.get(), ref_k)):
            assert np.isnan(got[1:3, :, :32]).all() and np.isnan(ref[1:3, :, :32]).all()
            np.testing.assert_array_equal(got[1:3, :, 32:], ref[1:3, :, 32:])
            np.testing.assert_allclose(got[[0, 3]], ref[[0, 3]], rtol=1e-5, atol=1e-6)


def test_rope_large_positions_and_bases():
    # angles up to ~1e6 rad (a 1M-token context at inv_freq 1): reduced in double, still
    # at float32 accuracy against the reference's float64 cos/sin of the same float32 angle
    cp = _cp()
    rng = np.random.default_rng()
    q, k = rand(rng, (64, 4, 128), "float32"), rand(rng, (64, 2, 128), "float32")
    pos = rng.integers(0, 1 << 20, size=64)
    for base in (10000.0, 500000.0, 1e6):
        for impl in impls("rope"):
            qo, ko = cupyops.rope(cp.asarray(q), cp.asarray(k), cp.asarray(pos), base=base, impl=impl)
            ref_q, ref_k = reference.rope(q, k, pos, base=base)
            assert_close(qo, ref_q, "float32", f"base {base} {impl} q")
            assert_close(ko, ref_k, "float32", f"base {base} {impl} k")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("R", [256, 128])
def test_rope_fused_many_heads_go_round_again(dtype, style, R):
    # more 16-byte work items a token than one batch of the fused block's loads
    # (FUSED_SLOTS x FUSED_MAX_THREADS): the later batches (rotations and passed-through
    # vectors) use the cos/sin table the first batch made
    cp = _cp()
    rng = np.random.default_rng()
    T, Hq, Hkv, D = 3, 64, 8, 256
    vec = 16 // dt(dtype).itemsize
    items = (Hq + Hkv) * ((R if style == "gptj" else R // 2) // vec + (D - R) // vec)
    assert items > rope_op.FUSED_SLOTS * rope_op.FUSED_MAX_THREADS
    qv, kv = rand(rng, (T, Hq, D), dtype), rand(rng, (T, Hkv, D), dtype)
    pos = rng.integers(0, 4096, size=T)
    ref_q, ref_k = reference.rope(qv, kv, pos, R, style=style)
    q, k, p = cp.asarray(qv), cp.asarray(kv), cp.asarray(pos)
    what = f"rope[fused] {dtype} {style} R={R}"
    got = cupyops.rope(q, k, p, rotary_dim=R, style=style, impl="fused")
    assert_close(got[0], ref_q, dtype, what + " q")
    assert_close(got[1], ref_k, dtype, what + " k")
    cupyops.rope(q, k, p, rotary_dim=R, style=style, impl="fused", inplace=True)
    assert_close(q, ref_q, dtype, what + " in place q")
    assert_close(k, ref_k, dtype, what + " in place k")


def test_rope_in_place_refuses_strides_it_would_copy():
    # token strides that are not whole elements: the kernels could rotate only a copy, so in
    # place is refused before anything runs (rather than the caller's array left as it was)
    cp = _cp()
    T, H, D = 4, 2, 16
    buf = cp.zeros(T * (H * D * 4 + 2), cp.uint8)
    q = cp.ndarray((T, H, D), cp.float32, buf.data, strides=(H * D * 4 + 2, D * 4, 4))
    k = cp.zeros((T, 1, D), cp.float32)
    with pytest.raises(ValueError, match="^q: its last axis must be unit-stride and its strides whole elements"):
        cupyops.rope(q, k, cp.arange(T), inplace=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_fast_path_repeats_and_rechecks_layout(dtype, monkeypatch):
    cp = _cp()
    rng = np.random.default_rng()
    qv, kv = rand(rng, (8, 32, 128), dtype), rand(rng, (8, 8, 128), dtype)
    pos = np.arange(100, 108)
    q, k, p = cp.asarray(qv), cp.asarray(kv), cp.asarray(pos)
    first = cupyops.rope(q, k, p)
    assert rope_op._FAST.cupy, "nothing remembered"
    qo = place(qv, "offset")
    with monkeypatch.context() as m:
        refuse_checked(m, rope_op._FAST)
        second = cupyops.rope(q, k, p)
        got = cupyops.rope(qo, k, p)  # same layout, misaligned start
    assert second[0].data.ptr != first[0].data.ptr
    ref = reference.rope(qv, kv, pos)
    for a, b, r in zip(first, second, ref):
        same_bits(a, b, "fast path")
        assert_close(b, r, dtype, "fast path")
    for g, r in zip(got, ref):
        assert_close(g, r, dtype, "offset q")
    qi, ki = cp.asarray(qv), cp.asarray(kv)
    for step in range(2):  # in place, repeated: each call turns the current values (checked, then fast)
        before = qi.get(), ki.get()
        with monkeypatch.context() as m:
            if step:
                refuse_checked(m, rope_op._FAST)
            cupyops.rope(qi, ki, p, inplace=True)
        for g, r in zip((qi, ki), reference.rope(*before, pos)):
            assert_close(g, r, dtype, f"in place, call {step}")


def test_in_place_calls_of_one_layout_with_shared_memory_are_refused_after_a_fast_one():
    # an in-place call remembered for two separate arrays must not let a call of the same
    # layouts whose two written arrays share memory past the checks (the key holds where
    # they lie against each other)
    cp = _cp()
    rng = np.random.default_rng()
    dtype = "bfloat16"
    x, r, w = (cp.asarray(rand(rng, s, dtype)) for s in ((4, 4096), (4, 4096), (4096,)))
    cupyops.add_rms_norm(x, r, w, inplace=True)
    cupyops.add_rms_norm(x, r, w, inplace=True)  # fast
    with pytest.raises(ValueError, match="overlap"):
        cupyops.add_rms_norm(x, x, w, inplace=True)
    q, k = cp.asarray(rand(rng, (8, 4, 128), dtype)), cp.asarray(rand(rng, (8, 4, 128), dtype))
    p = cp.arange(8)
    cupyops.rope(q, k, p, inplace=True)
    cupyops.rope(q, k, p, inplace=True)  # fast
    with pytest.raises(ValueError, match="overlap"):
        cupyops.rope(q, q, p, inplace=True)
    qkv = cp.asarray(rand(rng, (8, 3 * 4 * 128), dtype))  # head slices of one buffer: fine, and fast
    qs, ks = qkv[:, :512].reshape(8, 4, 128), qkv[:, 512:1024].reshape(8, 4, 128)
    for _ in range(2):
        before = qs.get(), ks.get()
        cupyops.rope(qs, ks, p, inplace=True)
        for g, want in zip((qs, ks), reference.rope(*before, np.arange(8))):
            assert_close(g, want, dtype, "qkv slices in place")


# ============================================================================ PyTorch
TORCH_DTYPES = ("float32", "float16", "bfloat16")


def _torch():
    return pytest.importorskip("torch")


def tensor(torch, shape, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=g).to(device="cuda", dtype=getattr(torch, dtype))


def torch_close(got, want, dtype, what, tol=None):
    """torch results: the same type, device and dtype, and close to torch's own (each is a
    rounding of the same float value, or nearly: within the dtype's tolerance)."""
    torch = _torch()
    assert isinstance(got, torch.Tensor) and got.device == want.device and got.dtype == want.dtype, what
    err = reference.rel_error(host(got), host(want).astype(np.float64))
    tol = reference.TOLERANCE["norm"][dtype] if tol is None else tol
    assert err <= tol, f"{what}: rel error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_and_mul_against_torch(dtype):
    torch = _torch()
    F = torch.nn.functional
    x = tensor(torch, (33, 2 * 1823), dtype, 1)
    a, b = x[:, :1823], x[:, 1823:]
    for _ in range(2):  # checked, then the fast path
        torch_close(cupyops.silu_and_mul(x), F.silu(a) * b, dtype, "silu_and_mul")
        for approx in ("none", "tanh"):
            torch_close(cupyops.gelu_and_mul(x, approx), F.gelu(a, approximate=approx) * b, dtype,
                        f"gelu_and_mul {approx}")
    out = torch.full((33, 1823), float("nan"), device="cuda", dtype=getattr(torch, dtype))
    assert cupyops.silu_and_mul(x, out=out) is out
    torch_close(out, F.silu(a) * b, dtype, "silu_and_mul out=")


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_add_rms_norm_against_torch(dtype):
    # the sum bit for bit PyTorch's x + residual, the norm F.rms_norm of that sum
    torch = _torch()
    F = torch.nn.functional
    x, res, w = tensor(torch, (16, 4096), dtype, 1), tensor(torch, (16, 4096), dtype, 2), tensor(torch, (4096,), dtype, 3)
    r = x + res
    want = F.rms_norm(r, (4096,), w, 1e-6)
    for _ in range(2):  # checked, then the fast path
        normed, s = cupyops.add_rms_norm(x, res, w, 1e-6)
        assert torch.equal(s, r)
        torch_close(normed, want, dtype, "normed")
    xi, ri = x.clone(), res.clone()
    got = cupyops.add_rms_norm(xi, ri, w, 1e-6, inplace=True)
    assert got[0] is xi and got[1] is ri and torch.equal(ri, r)
    torch_close(xi, want, dtype, "normed in place")


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_rope_against_torch(dtype, style):
    # vLLM's float32 cache built by torch (its pow, cos, sin), then torch's forward_native
    # rotation; cupyops with that cache computes the same math. From base, cupyops' own
    # float32 angles: its inv_freq (correctly rounded) and torch's float32 pow may differ by
    # an ulp or two, which at positions < 4096 moves an angle by up to ~4096 * 2^-22 rad:
    # float32 results agree to that, not to float32's 1e-5
    torch = _torch()
    from cupyops.bench.runners import torch_rope

    T, Hq, Hkv, D, R, base = 40, 8, 2, 128, 64, 10000.0
    q, k = tensor(torch, (T, Hq, D), dtype, 1), tensor(torch, (T, Hkv, D), dtype, 2)
    positions = torch.randint(0, 4096, (T,), device="cuda")
    inv_freq = 1.0 / (base ** (torch.arange(0, R, 2, dtype=torch.float) / R))
    freqs = torch.outer(torch.arange(4096, dtype=torch.float), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).cuda()
    want_q, want_k = torch_rope(torch, q.float(), k.float(), positions, cache, style)
    want_q, want_k = want_q.to(q.dtype), want_k.to(k.dtype)
    for _ in range(2):  # checked, then the fast path
        got = cupyops.rope(q, k, positions, rotary_dim=R, style=style, cos_sin_cache=cache)
        torch_close(got[0], want_q, dtype, "q, torch's cache")
        torch_close(got[1], want_k, dtype, "k, torch's cache")
        got = cupyops.rope(q, k, positions, rotary_dim=R, base=base, style=style)
        tol = max(reference.TOLERANCE["norm"][dtype], 4096 * 2.0**-22)
        torch_close(got[0], want_q, dtype, "q from base", tol)
        torch_close(got[1], want_k, dtype, "k from base", tol)
    qkv = torch.cat((q, k, k), dim=1)  # in place on head slices of one buffer, as vLLM does
    qi, ki = qkv[:, :Hq], qkv[:, Hq:Hq + Hkv]
    got = cupyops.rope(qi, ki, positions, rotary_dim=R, style=style, cos_sin_cache=cache, inplace=True)
    assert got[0] is qi and got[1] is ki
    torch_close(qi, want_q, dtype, "q in place")
    torch_close(ki, want_k, dtype, "k in place")
    assert torch.equal(qkv[:, Hq + Hkv:], k)  # the v heads untouched
