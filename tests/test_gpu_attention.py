"""GPU tier for attention: every rung of ``cupyops.variants("attention")`` (so a rung that
registers later is covered with no edit here) and ``auto``, for every dtype it claims,
against the float64 reference.

Hypothesis draws q_len != kv_len (1, odd, 17, 100, 257, ...), GQA and MQA head counts,
both causal alignments and no mask (rows that see no key included), head_dim from
HEAD_DIMS filtered by the rung's own supports(), both layouts and views (padded rows,
every other head, a misaligned data pointer, a head_dim axis that is not unit-stride and
must be copied), scales, and large-magnitude queries (a nearly one-hot softmax). Each case
runs without ``out=`` and into an ``out=`` poisoned with NaN, with the LSE: finite entries
within a tight absolute tolerance, -inf entries exactly.

CuPy is imported inside the tests only, so the file collects (and skips, see conftest.py)
on machines without a GPU.
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cupyops
from cupyops import _dtypes, reference
from cupyops.ops import attention as A

pytestmark = pytest.mark.gpu

HYPO = settings(max_examples=12, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
HEAD_DIMS = [1, 3, 8, 16, 32, 40, 64, 80, 96, 128, 160, 256]
Q_LENS = [1, 2, 5, 16, 17, 64, 100, 257]
KV_LENS = [1, 3, 17, 64, 100, 257, 300]
HEADS = [(1, 1), (4, 4), (4, 2), (6, 3), (8, 1), (3, 1)]  # (q_heads, kv_heads): MHA, GQA, MQA
VIEWS = ["contiguous", "padded", "heads", "offset", "copied"]
SCALES = [None, None, 0.5, 0.03, -0.7]
# LSE: natural-log units. The scores' float32 error is ~1e-5 even for 30x queries; 1e-3
# is a 0.1 % error of the softmax normaliser.
LSE_ATOL, LSE_RTOL = 1e-3, 1e-5


def _cp():
    import cupy

    return cupy


def rungs():
    return [pytest.param(impl, d, id=f"{impl}-{d}")
            for impl in [*cupyops.variants("attention"), "auto"]
            for d in (_dtypes.FLOAT_TYPES if impl == "auto" else A.dtypes_of(impl))]


def skip_unless_runs_here(impl):
    """A rung for one architecture (its launcher has ``runs_here``: flash3 on sm_90) is
    skipped on other GPUs, where ``auto`` never takes it."""
    from cupyops import _launch

    mod = A._LAUNCHERS.get(impl)
    if hasattr(mod, "runs_here") and not mod.runs_here(_launch.device_props()):
        pytest.skip(f"{impl} does not run on this GPU")


def support_reason(impl, dtype, B, Hq, Hkv, Sq, Skv, D, causal=False, align="top_left", scale=None, window=None,
                   softcap=None):
    """Why rung ``impl`` refuses contiguous bshd operands of this problem (its own
    supports(), on the problem attention() would build), or None."""
    t = _dtypes.to_dtype(dtype)
    qs, ks = (B, Sq, Hq, D), (B, Skv, Hkv, D)
    masks = A.check_masks(window, softcap, causal, Sq + Skv)
    offset = Skv - Sq if (causal or masks.windowed) and align == "bottom_right" else 0
    p = A._problem(dtype, (B, Hq, Hkv, Sq, Skv, D), "bshd", [A._Fresh(qs, t), A._Fresh(ks, t), A._Fresh(ks, t)],
                   A._Fresh(qs, t), None, 1 / math.sqrt(D) if scale is None else scale, causal, offset, masks)
    return A._LAUNCHERS[impl].supports(impl, p)


def supported(impl, dtype, B, Hq, Hkv, Sq, Skv, D, causal=False, align="top_left", scale=None):
    """Whether rung ``impl`` accepts contiguous bshd operands of this problem."""
    return impl == "auto" or support_reason(impl, dtype, B, Hq, Hkv, Sq, Skv, D, causal, align, scale) is None


# ---------------------------------------------------------------------------- operands
def to_layout(x, layout):
    """A bshd host array in ``layout`` (contiguous)."""
    return x if layout == "bshd" else np.ascontiguousarray(x.transpose(0, 2, 1, 3))


def from_layout(x, layout):
    return x if layout == "bshd" else x.transpose(0, 2, 1, 3)


def place(x, layout, view, cp):
    """``x`` (bshd, host) as the device operand of a call in ``layout``. Memory a view skips
    holds NaN, so a kernel that reads it fails."""
    a = to_layout(x, layout)
    nan = np.array(np.nan).astype(a.dtype)
    if view == "contiguous":
        return cp.asarray(a)
    if view == "padded":  # rows of head_dim + 16 bytes: strides still whole 16-byte vectors
        pad = 16 // a.itemsize
        buf = np.full(a.shape[:-1] + (a.shape[-1] + pad,), nan, a.dtype)
        buf[..., :a.shape[-1]] = a
        return cp.asarray(buf)[..., :a.shape[-1]]
    if view == "heads":  # every other head of a buffer with twice the heads
        ax = 2 if layout == "bshd" else 1
        shape = list(a.shape)
        shape[ax] *= 2
        buf = np.full(shape, nan, a.dtype)
        sel = [slice(None)] * 4
        sel[ax] = slice(None, None, 2)
        buf[tuple(sel)] = a
        return cp.asarray(buf)[tuple(sel)]
    if view == "offset":  # contiguous, one element past an aligned allocation
        flat = np.full(a.size + 1, nan, a.dtype)
        flat[1:] = a.ravel()
        return cp.asarray(flat)[1:].reshape(a.shape)
    if view == "copied":  # head_dim stride 2: the operator must make it contiguous
        buf = np.full(a.shape[:-1] + (2 * a.shape[-1],), nan, a.dtype)
        buf[..., ::2] = a
        return cp.asarray(buf)[..., ::2]
    raise ValueError(view)


def make_qkv(rng, dtype, B, Sq, Skv, Hq, Hkv, D, big=False):
    t = _dtypes.to_dtype(dtype)
    q = rng.standard_normal((B, Sq, Hq, D)) * (30.0 if big else 1.0)
    k = rng.standard_normal((B, Skv, Hkv, D))
    v = rng.standard_normal((B, Skv, Hkv, D))
    return q.astype(t), k.astype(t), v.astype(t)


# ---------------------------------------------------------------------------- checks
def check_out(got, ref, dtype, layout, what, no_key_rows=()):
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    assert got.dtype == _dtypes.to_dtype(dtype), f"{what}: dtype {got.dtype}"
    got = from_layout(got, layout).astype(np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    err = reference.rel_error(got, ref)
    tol = reference.TOLERANCE["attention"][dtype]
    assert err <= tol, f"{what}: rel error {err:.3g} > {tol:.3g}"
    if len(no_key_rows):
        assert np.all(got[:, no_key_rows] == 0), f"{what}: a row that sees no key is not exactly 0"


def check_lse(lse, ref_lse, what):
    got = lse.get() if hasattr(lse, "get") else np.asarray(lse)
    assert got.dtype == np.float32 and got.shape == ref_lse.shape, f"{what}: lse {got.dtype} {got.shape}"
    got = got.astype(np.float64)
    assert not np.isnan(got).any(), f"{what}: NaN in lse"
    inf = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(got), inf), f"{what}: -inf entries of lse differ"
    assert np.all(np.isfinite(got[~inf])), f"{what}: lse has inf where the reference is finite"
    diff = np.abs(got[~inf] - ref_lse[~inf])
    limit = LSE_ATOL + LSE_RTOL * np.abs(ref_lse[~inf])
    assert np.all(diff <= limit), f"{what}: lse off by up to {diff.max():.3g}"


def run_case(impl, dtype, B, Sq, Skv, Hq, Hkv, D, causal=False, align="top_left", scale=None,
             layout="bshd", view="contiguous", big=False, seed=0, window=None, softcap=None):
    """Check one call twice (plain, and out= poisoned + LSE); False when the rung refused the
    problem (as its supports() says it may, e.g. for a misaligned view). Rows that see no key
    (those whose reference LSE is -inf: the mask is the same for every batch and head) must
    be exactly zero."""
    cp = _cp()
    rng = np.random.default_rng(seed)
    q, k, v = make_qkv(rng, dtype, B, Sq, Skv, Hq, Hkv, D, big)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, causal_align=align, scale=scale, return_lse=True,
                                       window=window, softcap=softcap)
    dq, dk, dv = (place(x, layout, view, cp) for x in (q, k, v))
    kw = dict(causal=causal, causal_align=align, scale=scale, window=window, softcap=softcap, layout=layout, impl=impl)
    what = (f"{impl} {dtype} B={B} Sq={Sq} Skv={Skv} heads={Hq}/{Hkv} D={D} causal={causal} {align} "
            f"scale={scale} window={window} softcap={softcap} {layout} {view} big={big}")
    try:
        got = cupyops.attention(dq, dk, dv, **kw)
    except ValueError as exc:
        if impl != "auto" and str(exc).startswith(f"impl: {impl!r} cannot run this problem"):
            return False
        raise
    no_key = np.flatnonzero(np.isneginf(ref_lse).all(axis=(0, 1)))
    check_out(got, ref, dtype, layout, what, no_key)
    out = cp.full(to_layout(q, layout).shape, np.nan, dtype=q.dtype)
    res, lse = cupyops.attention(dq, dk, dv, return_lse=True, out=out, **kw)
    assert res is out, f"{what}: out= is not the array returned"
    check_out(out, ref, dtype, layout, what + " out=", no_key)
    check_lse(lse, ref_lse, what)
    return True


# ---------------------------------------------------------------------------- hypothesis
@st.composite
def cases(draw, impl, dtype):
    B = draw(st.sampled_from([1, 2, 3]))
    Hq, Hkv = draw(st.sampled_from(HEADS))
    causal = draw(st.booleans())
    align = draw(st.sampled_from(A.CAUSAL_ALIGNS))
    scale = draw(st.sampled_from(SCALES))
    q_lens = [s for s in Q_LENS if any(supported(impl, dtype, B, Hq, Hkv, s, 64, d, causal, align, scale)
                                       for d in HEAD_DIMS)]
    assume(q_lens)
    Sq = draw(st.sampled_from(q_lens))
    Skv = draw(st.sampled_from(KV_LENS))
    dims = [d for d in HEAD_DIMS if supported(impl, dtype, B, Hq, Hkv, Sq, Skv, d, causal, align, scale)]
    assume(dims)
    D = draw(st.sampled_from(dims))
    layout = draw(st.sampled_from(A.LAYOUTS))
    view = draw(st.sampled_from(VIEWS))
    big = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(B=B, Sq=Sq, Skv=Skv, Hq=Hq, Hkv=Hkv, D=D, causal=causal, align=align, scale=scale,
                layout=layout, view=view, big=big, seed=seed)


@pytest.mark.parametrize("impl,dtype", rungs())
@HYPO
@given(data=st.data())
def test_attention_matches_reference(impl, dtype, data):
    skip_unless_runs_here(impl)
    case = data.draw(cases(impl, dtype))
    if not run_case(impl, dtype, **case):
        # a rung may refuse only what its supports() refuses: here, a view it cannot read
        assert case["view"] in ("offset", "padded", "heads"), f"{impl} refused a problem it claims: {case}"
        assume(False)


# Cases that reach each rung's paths: several query and key tiles with partial last ones,
# rows that see no key (bottom_right, q_len > kv_len), causal tiles skipped, decode shapes,
# head_dim at and between every flash_v1 tier.
FIXED = [
    # B, Sq, Skv, Hq, Hkv, D, causal, align
    (1, 257, 300, 4, 2, 128, True, "bottom_right"),
    (2, 300, 100, 2, 1, 64, True, "bottom_right"),
    (1, 130, 129, 2, 2, 256, True, "top_left"),
    (3, 65, 1, 3, 1, 40, False, "top_left"),
    (1, 1, 1000, 8, 1, 128, False, "top_left"),
    (2, 16, 777, 8, 2, 64, True, "bottom_right"),
    (1, 200, 200, 1, 1, 160, True, "top_left"),
    (1, 70, 513, 2, 1, 1, True, "bottom_right"),
    (1, 64, 64, 1, 1, 32, True, "top_left"),
]


@pytest.mark.parametrize("impl,dtype", rungs())
def test_fixed_shapes(impl, dtype):
    skip_unless_runs_here(impl)
    ran = 0
    for i, (B, Sq, Skv, Hq, Hkv, D, causal, align) in enumerate(FIXED):
        dims = [d for d in (D, 128, 64) if supported(impl, dtype, B, Hq, Hkv, Sq, Skv, d, causal, align)]
        if not dims:
            continue
        for layout, view in (("bshd", "contiguous"), ("bhsd", "padded"), ("bshd", "offset")):
            ran += run_case(impl, dtype, B, Sq, Skv, Hq, Hkv, dims[0], causal, align, layout=layout,
                            view=view, seed=100 + i)
    if not ran:
        pytest.skip(f"{impl} supports none of the fixed shapes")


# ---------------------------------------------------------------------------- long sequences
LONG = 131072


@pytest.mark.parametrize("impl", [i for i in ("flash_v1", "flash", "flash3") if i in cupyops.variants("attention")])
def test_long_causal_sequence_in_linear_memory(impl):
    skip_unless_runs_here(impl)
    # batch 1, 8 heads, head_dim 128, bf16, causal: 134 GFLOP a head. The call may allocate
    # the output and O(B*S*H) more, never the S x S scores (128 GiB per head in float32).
    cp = _cp()
    bf16 = _dtypes.to_dtype("bfloat16")
    shape = (1, LONG, 8, 128)
    rs = cp.random.RandomState(seed=7)
    q, k, v = (rs.standard_normal(shape, dtype=cp.float32).astype(bf16) for _ in range(3))
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    pool.free_all_blocks()
    before = pool.total_bytes()
    out, lse = cupyops.attention(q, k, v, causal=True, return_lse=True, impl=impl)
    grew = pool.total_bytes() - before
    assert grew < 4 * q.nbytes, f"{impl}: the call took {grew / 2**20:.0f} MiB of pool memory (q: {q.nbytes / 2**20:.0f} MiB)"
    assert out.shape == shape and lse.shape == (1, 8, LONG)

    # reference for sampled query rows only: row i sees keys 0..i (top_left causal, S == S)
    rng = np.random.default_rng()
    rows = sorted({0, 1, 63, 64, 127, 4095, 65536, LONG - 2, LONG - 1, *rng.integers(0, LONG, 6).tolist()})
    scale = 1 / math.sqrt(128)
    got = out[0, rows].astype(cp.float64).get()  # (rows, heads, D)
    got_lse = lse[0][:, rows].get().astype(np.float64)  # (heads, rows)
    want = np.empty_like(got)
    want_lse = np.empty_like(got_lse)
    for h in range(8):
        kh = k[0, :, h].astype(cp.float64)
        vh = v[0, :, h].astype(cp.float64)
        for n, i in enumerate(rows):
            s = scale * (kh[: i + 1] @ q[0, i, h].astype(cp.float64))
            m = float(s.max())
            e = cp.exp(s - m)
            total = float(e.sum())
            want[n, h] = ((e @ vh[: i + 1]) / total).get()
            want_lse[h, n] = m + math.log(total)
    err = reference.rel_error(got, want)
    assert err <= reference.TOLERANCE["attention"]["bfloat16"], f"{impl}: sampled rows rel error {err:.3g}"
    assert np.all(np.abs(got_lse - want_lse) <= LSE_ATOL + LSE_RTOL * np.abs(want_lse)), f"{impl}: lse"


# ---------------------------------------------------------------------------- API behaviour
def test_empty_sizes_and_no_keys():
    cp = _cp()
    f16 = np.float16
    for shape_q, shape_kv in [((0, 5, 4, 8), (0, 7, 2, 8)), ((2, 0, 4, 8), (2, 7, 2, 8)),
                              ((2, 5, 0, 8), (2, 7, 1, 8)), ((2, 5, 0, 8), (2, 7, 0, 8))]:
        q, k, v = cp.ones(shape_q, f16), cp.ones(shape_kv, f16), cp.ones(shape_kv, f16)
        for impl in [*cupyops.variants("attention"), "auto"]:
            if impl != "auto" and "float16" not in A.dtypes_of(impl):
                continue
            out, lse = cupyops.attention(q, k, v, return_lse=True, impl=impl)
            assert out.shape == shape_q and lse.shape == (shape_q[0], shape_q[2], shape_q[1])
    q, k = cp.ones((2, 5, 4, 8), f16), cp.ones((2, 0, 2, 8), f16)
    out = cp.full(q.shape, np.nan, f16)
    res, lse = cupyops.attention(q, k, k, return_lse=True, out=out)
    assert res is out and not bool(cp.any(out != 0))  # no key: zeros, LSE -inf
    assert bool(cp.all(cp.isneginf(lse)))


def test_numpy_in_numpy_out():
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, "float32", 2, 9, 13, 4, 2, 24)
    ref, ref_lse = reference.attention(q, k, v, causal=True, return_lse=True)
    out = cupyops.attention(q, k, v, causal=True)
    assert isinstance(out, np.ndarray)
    check_out(out, ref, "float32", "bshd", "numpy")
    out, lse = cupyops.attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    check_lse(lse, ref_lse, "numpy")
    buf = np.full(q.shape, np.nan, np.float32)
    assert cupyops.attention(q, k, v, causal=True, out=buf) is buf
    check_out(buf, ref, "float32", "bshd", "numpy out=")


def test_cupy_in_cupy_out_on_a_side_stream():
    cp = _cp()
    rng = np.random.default_rng()
    q, k, v = make_qkv(rng, "bfloat16", 2, 300, 500, 8, 2, 128)
    ref = reference.attention(q, k, v, causal=True, causal_align="bottom_right")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        dq, dk, dv = cp.asarray(q), cp.asarray(k), cp.asarray(v)
        results = {impl: cupyops.attention(dq, dk, dv, causal=True, causal_align="bottom_right", impl=impl)
                   for impl in [*cupyops.variants("attention"), "auto"]
                   if impl == "auto" or supported(impl, "bfloat16", 2, 8, 2, 300, 500, 128, True, "bottom_right")}
    s.synchronize()
    for impl, got in results.items():
        assert type(got).__module__.startswith("cupy")
        check_out(got, ref, "bfloat16", "bshd", f"side stream {impl}")


@pytest.mark.parametrize("impl", [*cupyops.variants("attention"), "auto"])
def test_bitwise_deterministic(impl):
    cp = _cp()
    rng = np.random.default_rng()
    dtype = "float16" if impl == "auto" else A.dtypes_of(impl)[-1]
    for Sq in (1, 333):
        if not supported(impl, dtype, 2, 8, 4, Sq, 1000, 128, True, "bottom_right"):
            continue
        q, k, v = (cp.asarray(x) for x in make_qkv(rng, dtype, 2, Sq, 1000, 8, 4, 128))
        first, lse1 = cupyops.attention(q, k, v, causal=True, causal_align="bottom_right", return_lse=True, impl=impl)
        cp.empty(7 * 1024 * 1024, np.uint8).fill(255)  # disturb the memory pool in between
        again, lse2 = cupyops.attention(q, k, v, causal=True, causal_align="bottom_right", return_lse=True, impl=impl)
        assert np.array_equal(first.get().view(np.uint16), again.get().view(np.uint16)), impl
        assert np.array_equal(lse1.get().view(np.uint32), lse2.get().view(np.uint32)), impl


def test_out_must_not_overlap_the_inputs():
    cp = _cp()
    x = cp.ones((1, 8, 2, 16), cp.float32)
    y = cp.ones((1, 8, 2, 16), cp.float32)
    with pytest.raises(ValueError, match="^out: must not overlap the input"):
        cupyops.attention(x, y, y, out=x)
    with pytest.raises(ValueError, match="^out: must not overlap the input k"):
        cupyops.attention(x, y, x[:, :, :1].copy().repeat(2, axis=2), out=y)


def test_a_refused_problem_leaves_out_untouched():
    # find, for each rung, a problem its supports() refuses; the call must fail before any
    # launch, naming impl, and out= keeps its poison
    cp = _cp()
    for impl in cupyops.variants("attention"):
        for dtype in A.dtypes_of(impl):
            bad = next(((Sq, D) for Sq in (1, 100) for D in HEAD_DIMS
                        if not supported(impl, dtype, 1, 2, 2, Sq, 64, D)), None)
            if bad is None:
                continue
            Sq, D = bad
            t = _dtypes.to_dtype(dtype)
            q, k = cp.ones((1, Sq, 2, D), t), cp.ones((1, 64, 2, D), t)
            out = cp.full(q.shape, 5, t)
            with pytest.raises(ValueError, match=f"^impl: {impl!r} cannot run this problem: "):
                cupyops.attention(q, k, k, out=out, impl=impl)
            assert bool(cp.all(out == 5))
