"""GPU tier for float8.

quantize_fp8 (portable: any GPU) against cupyops.reference bit for bit: every input dtype,
per tensor and per row, found and given scales (one that saturates half the values),
+-448, NaN, aligned / misaligned / strided x, NumPy in and out, empty arrays. "Bit for
bit" means equal e4m3 values with NaN at the same places: the sign of a zero and the NaN
encoding (0x7F / 0xFF) are not compared.

scaled_matmul (compute capability 9.0 alone; elsewhere the error is checked) against the
float64 product of the dequantised operands: Hypothesis-drawn M, N (1..600), K (multiples
of 16 up to 2000), per-tensor and per-row / per-column scales in every accepted form,
bias of either dtype, the three output dtypes, K-major and row-major b, misaligned and
padded a, NaN-poisoned out=; full tiles, many tiles a block, a long K.

Memory a result is written to is first filled with 0xFF bytes (NaN in every type here)
and handed back to the pool, so an element a kernel leaves unwritten fails.
"""
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cupyops
from cupyops import _dtypes, _launch, reference
from cupyops.ops import _fp8_gemm, fp8

pytestmark = pytest.mark.gpu

HYPO = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = ("float32", "float16", "bfloat16")


def _cp():
    import cupy

    return cupy


def hopper():
    return _fp8_gemm.runs_here(_launch.device_props())


def require_hopper():
    if not hopper():
        pytest.skip("scaled_matmul runs on compute capability 9.0 GPUs alone")


def rand(rng, shape, dtype, mag=1.0):
    return (rng.standard_normal(shape) * mag).astype(_dtypes.to_dtype(dtype))


def place(values, how):
    """values (host) on the device: contiguous, offset by one element (data pointer not
    16-byte aligned), or every other element of the last axis (not contiguous)."""
    cp = _cp()
    if how == "contiguous":
        return cp.asarray(values)
    if how == "offset":
        flat = cp.asarray(np.concatenate([np.zeros(1, values.dtype), values.ravel()]))
        return flat[1:].reshape(values.shape)
    assert how == "strided"
    wide = np.zeros(values.shape[:-1] + (2 * values.shape[-1],), values.dtype)
    wide[..., ::2] = values
    return cp.asarray(wide)[..., ::2]


def disturb(nbytes):
    """Fill pooled memory of this size with 0xFF and free it: the next allocation of the
    size likely gets it back, so an element a kernel does not write shows as NaN."""
    _cp().full(max(int(nbytes), 1), 0xFF, np.uint8)


def assert_same_e4m3(got, want, what):
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    assert got.dtype == np.uint8 and got.shape == want.shape, (what, got.dtype, got.shape, want.shape)
    gv, wv = reference.e4m3_to_float(got), reference.e4m3_to_float(want)
    gn, wn = np.isnan(gv), np.isnan(wv)
    assert np.array_equal(gn, wn), f"{what}: NaN differs at {np.argwhere(gn != wn)[:5].tolist()}"
    bad = ~wn & (gv != wv)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} differ, e.g. at "
                           f"{np.argwhere(bad)[:3].tolist()}: got {gv[bad][:5]} want {wv[bad][:5]}")


def run_quantize(x_host, x_dev, axis, scale, what):
    """quantize_fp8 on the device against the reference fed the same (host) scale."""
    cp = _cp()
    host_scale = scale.get() if isinstance(scale, cp.ndarray) else scale
    want_q, want_s = reference.quantize_fp8(x_host, scale=host_scale, axis=axis)
    disturb(x_host.size)
    q, s = cupyops.quantize_fp8(x_dev, axis=axis, scale=scale)
    assert isinstance(q, cp.ndarray) and isinstance(s, cp.ndarray), what
    assert s.dtype == np.float32 and s.shape == want_s.shape, (what, s.dtype, s.shape, want_s.shape)
    assert_same_e4m3(q, want_q, what)
    got_s = s.get()
    assert np.array_equal(got_s, want_s), f"{what}: scale {got_s.ravel()[:4]} want {want_s.ravel()[:4]}"
    return q, s


# ------------------------------------------------------------------ quantize_fp8
SHAPES = [(1,), (17,), (4096,), (100003,), (1, 1), (3, 16), (5, 17), (17, 4096), (33, 4097), (2, 3, 160),
          (1000, 100), (7, 40000), (2, 131072)]


@st.composite
def quantize_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from(SHAPES))
    axis = draw(st.sampled_from([None, -1]))
    mag = draw(st.sampled_from([1e-3, 1.0, 300.0] + ([] if dtype == "float16" else [1e5])))
    how = draw(st.sampled_from(["contiguous", "offset", "strided"]))
    scale = draw(st.sampled_from(["found", "given", "saturating"]))
    form = draw(st.sampled_from(["number", "array", "keepdims"]))
    nans = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return dtype, shape, axis, mag, how, scale, form, nans, seed


@HYPO
@given(case=quantize_cases())
def test_quantize_matches_reference_bit_for_bit(case):
    dtype, shape, axis, mag, how, scale, form, nans, seed = case
    cp = _cp()
    rng = np.random.default_rng(seed)
    x = rand(rng, shape, dtype, mag)
    if nans:
        x[rng.random(shape) < 0.01] = np.nan
    arg = None
    if scale != "found":
        # the found scale times 1.7 (nothing saturates) or 0.25 (up to 4x 448: many do)
        found = reference.quantize_fp8(x, axis=axis)[1]
        s = (found * np.float32(1.7 if scale == "given" else 0.25)).astype(np.float32)
        if axis is None and form == "number":
            arg = float(s)
        elif axis is not None and form == "keepdims":
            arg = cp.asarray(s[..., None])
        else:
            arg = cp.asarray(s)
    what = f"{dtype} {shape} axis={axis} mag={mag} {how} scale={scale}/{form} nans={nans}"
    run_quantize(x, place(x, how), axis, arg, what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_saturates_rounds_to_even_and_keeps_nan(dtype):
    vals = [0.0, -0.0, 1.0, -1.0, 447.0, 448.0, 449.0, 464.0, 465.0, 480.0, 1e4, -1e4, np.inf, -np.inf, np.nan,
            2.0**-10, 1.5 * 2.0**-9, 1.0625, 1.1875, 17.0, 19.0]
    want = [0.0, 0.0, 1.0, -1.0, 448.0, 448.0, 448.0, 448.0, 448.0, 448.0, 448.0, -448.0, 448.0, -448.0, np.nan,
            0.0, 2.0**-8, 1.0, 1.25, 16.0, 20.0]
    x = np.array(vals * 3, dtype=_dtypes.to_dtype(dtype))  # 63: 3 vector chunks and a scalar tail
    exact = x.astype(np.float64) == np.array(vals * 3)  # bf16 / f16 round some inputs (e.g. 449)
    cp = _cp()
    for how in ("contiguous", "offset"):
        for axis, scale in ((None, 1.0), (-1, cp.ones((), np.float32))):
            q, s = run_quantize(x, place(x, how), axis, scale, f"{dtype} {how} axis={axis}")
            got = reference.e4m3_to_float(q.get())
            ok = np.isclose(got, np.array(want * 3), equal_nan=True, rtol=0, atol=0)
            assert ok[exact].all(), (dtype, how, got[exact & ~ok])


def test_quantize_found_scale_maps_amax_to_448():
    cp = _cp()
    rng = np.random.default_rng()
    x = rand(rng, (64, 1000), "bfloat16", 3.0)
    q, s = cupyops.quantize_fp8(cp.asarray(x), axis=-1)
    v = reference.e4m3_to_float(q.get())
    assert np.all(np.abs(v).max(axis=-1) == 448)
    amax = np.abs(x.astype(np.float32)).max(axis=-1)
    assert np.array_equal(s.get(), (amax / np.float32(448)).astype(np.float32))
    q, s = cupyops.quantize_fp8(cp.asarray(x))
    assert s.shape == () and np.abs(reference.e4m3_to_float(q.get())).max() == 448


def test_quantize_zero_and_nan_rows_get_scale_one():
    cp = _cp()
    x = np.ones((4, 40), np.float32)
    x[1] = 0.0
    x[2] = np.nan
    x[3, 5] = np.nan
    q, s = run_quantize(x, cp.asarray(x), -1, None, "zero / NaN rows")
    assert np.allclose(s.get(), [1 / 448, 1, 1, 1 / 448], rtol=1e-7, atol=0)
    v = reference.e4m3_to_float(q.get())
    assert np.all(v[1] == 0) and np.all(np.isnan(v[2])) and np.isnan(v[3, 5]) and v[3, 4] == 448
    q, s = run_quantize(np.zeros(1000, np.float16), cp.zeros(1000, np.float16), None, None, "all zeros")
    assert float(s) == 1.0 and not q.get().any()


@pytest.mark.parametrize("n", [(1 << 22) + 5, (1 << 20) * 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_large_tensor(n, dtype):
    # many amax blocks (P partials) and a grid-stride conversion over millions of elements
    rng = np.random.default_rng()
    x = rand(rng, (n,), dtype, 2.0)
    x[rng.integers(0, n)] = 7e3 if dtype != "float16" else 6e4  # one outlier sets the scale
    run_quantize(x, _cp().asarray(x), None, None, f"{dtype} n={n}")


def test_quantize_numpy_in_numpy_out():
    rng = np.random.default_rng()
    x = rand(rng, (5, 300), "float32")
    for axis in (None, -1):
        q, s = cupyops.quantize_fp8(x, axis=axis)
        want_q, want_s = reference.quantize_fp8(x, axis=axis)
        assert isinstance(q, np.ndarray) and q.dtype == np.uint8
        assert np.asarray(s).dtype == np.float32 and np.asarray(s).shape == want_s.shape
        assert_same_e4m3(q, want_q, f"numpy axis={axis}")
        assert np.array_equal(np.asarray(s), want_s)


@pytest.mark.parametrize("shape,axis,scale_shape", [((0,), None, ()), ((0, 5), None, ()), ((0, 5), -1, (0,)),
                                                    ((3, 0), -1, (3,)), ((3, 0), None, ())])
def test_quantize_empty(shape, axis, scale_shape):
    cp = _cp()
    q, s = cupyops.quantize_fp8(cp.zeros(shape, np.float32), axis=axis)
    assert q.shape == shape and q.dtype == np.uint8 and s.shape == scale_shape
    assert bool(cp.all(s == 1))


def test_quantize_given_device_scale_is_returned():
    cp = _cp()
    x = cp.asarray(rand(np.random.default_rng(), (6, 64), "bfloat16"))
    given = cp.full((6, 1), 0.01, np.float32)
    q, s = cupyops.quantize_fp8(x, axis=-1, scale=given)
    assert s.shape == (6,) and s.data.ptr == given.data.ptr  # a view, not a copy


# ------------------------------------------------------------------ scaled_matmul
def check_mm(got, ref, dout, what):
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    assert got.shape == ref.shape and got.dtype == _dtypes.to_dtype(dout), (what, got.shape, got.dtype)
    err = reference.rel_error(got, ref)
    tol = reference.TOLERANCE["scaled_matmul"][dout]
    assert err <= tol, f"{what}: rel error {err:.3g} > {tol:.3g}"
    return err


def make_operands(rng, M, N, K, per_row, per_col):
    """e4m3 bits of a (M x K) and of w (N x K, b = w.T), quantised from normal data, with
    their float32 scales (per row / column or per tensor)."""
    qa, sa = reference.quantize_fp8(rand(rng, (M, K), "float32"), axis=-1 if per_row else None)
    qw, sw = reference.quantize_fp8(rand(rng, (N, K), "float32", 0.05), axis=-1 if per_col else None)
    return qa, sa, qw, sw


def scale_arg(s, form, length, row):
    """The scale as a call passes it (and the host value the reference takes)."""
    cp = _cp()
    if form == "float":
        return float(s), float(s)
    if form == "device0d":
        return cp.asarray(s.reshape(())), s
    if form == "device1":
        return cp.asarray(s.reshape(1)), s
    if form == "vector":
        return cp.asarray(s), s
    if form == "vector2d":
        return cp.asarray(s.reshape((length, 1) if row else (1, length))), s
    assert form == "strided"  # every other element of a longer array
    return cp.asarray(np.repeat(s, 2))[::2], s


def place_a(qa, how):
    cp = _cp()
    if how == "padded":  # rows K + 16 bytes apart: read in place with lda = K + 16
        M, K = qa.shape
        wide = np.zeros((M, K + 16), np.uint8)
        wide[:, :K] = qa
        return cp.asarray(wide)[:, :K]
    return place(qa, how)


def place_b(qw, how):
    cp = _cp()
    if how == "kmajor":  # w.T: K-major, read in place
        return cp.asarray(qw).T
    return cp.asarray(np.ascontiguousarray(qw.T))  # row-major K x N: copied to K-major


def run_mm(M, N, K, dout, sa_form, sb_form, bias_kind, a_how, b_how, with_out, seed):
    cp = _cp()
    rng = np.random.default_rng(seed)
    per_row = sa_form in ("vector", "vector2d", "strided")
    per_col = sb_form in ("vector", "vector2d", "strided")
    qa, sa, qw, sw = make_operands(rng, M, N, K, per_row, per_col)
    sa_arg, sa_ref = scale_arg(sa, sa_form, M, True)
    sb_arg, sb_ref = scale_arg(sw, sb_form, N, False)
    bias = bias_d = None
    if bias_kind is not None:
        bias = rand(rng, (N,), dout if bias_kind == "out" else "float32")
        bias_d = cp.asarray(bias)
    ref = reference.scaled_matmul(qa, qw.T, sa_ref, sb_ref, bias)
    a, b = place_a(qa, a_how), place_b(qw, b_how)
    what = (f"{M}x{N}x{K} {dout} scale_a={sa_form} scale_b={sb_form} bias={bias_kind} a={a_how} b={b_how} "
            f"out={with_out}")
    out_dt = _dtypes.to_dtype(dout)
    if with_out:
        out = cp.empty((M, N), out_dt)
        out.fill(np.nan)
        got = fp8.scaled_matmul(a, b, sa_arg, sb_arg, out_dtype=dout, bias=bias_d, out=out)
        assert got is out, what
    else:
        disturb(M * N * out_dt.itemsize)
        got = fp8.scaled_matmul(a, b, sa_arg, sb_arg, out_dtype=dout, bias=bias_d)
    return check_mm(got, ref, dout, what)


@st.composite
def mm_cases(draw):
    M = draw(st.integers(1, 600))
    N = draw(st.integers(1, 600))
    K = 16 * draw(st.integers(1, 125))
    dout = draw(st.sampled_from(fp8.OUT_TYPES))
    sa_form = draw(st.sampled_from(["float", "device0d", "device1", "vector", "vector2d", "strided"]))
    sb_form = draw(st.sampled_from(["float", "device0d", "device1", "vector", "vector2d", "strided"]))
    bias = draw(st.sampled_from([None, "out", "float32"]))
    a_how = draw(st.sampled_from(["contiguous", "offset", "padded"]))
    b_how = draw(st.sampled_from(["kmajor", "rowmajor"]))
    with_out = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return M, N, K, dout, sa_form, sb_form, bias, a_how, b_how, with_out, seed


@HYPO
@given(case=mm_cases())
def test_scaled_matmul_matches_reference(case):
    require_hopper()
    run_mm(*case)


# full tiles, edge tiles, more tiles than SMs (the persistent loop), decode- and
# prefill-like shapes, K of one stage and of many
SHAPES_MM = [(1, 1, 16), (128, 256, 128), (129, 257, 144), (64, 4096, 4096), (7, 11008, 1024),
             (2000, 3000, 1008), (4096, 4096, 4096), (300, 40, 5008)]


@pytest.mark.parametrize("M,N,K", SHAPES_MM, ids=str)
@pytest.mark.parametrize("dout", fp8.OUT_TYPES)
def test_scaled_matmul_shapes(M, N, K, dout):
    require_hopper()
    run_mm(M, N, K, dout, "vector", "vector", "float32", "contiguous", "kmajor", True, M * N + K)
    run_mm(M, N, K, dout, "float", "device0d", None, "contiguous", "rowmajor", False, M + N * K)


@pytest.mark.parametrize("group", [None, 3])
@pytest.mark.parametrize("config", _fp8_gemm.CONFIGS["wgmma_ws"])
def test_every_tile_configuration(config, group, monkeypatch):
    # each configuration, auto's or not: tiles walked by every block (several a block at
    # 2000 x 3000), edge tiles, K not a multiple of the ring; the tensor-store epilogue
    # (16-bit out, per-tensor scales, no bias) and the direct one (per-row / per-column
    # scales, bias); the walk in groups of the default rows and of 3 (16 tile rows at
    # M = 2000: groups of alternating direction, the last one short)
    require_hopper()
    monkeypatch.setattr(_fp8_gemm, "DEFAULT_CONFIG", config)
    if group is not None:
        monkeypatch.setattr(_fp8_gemm, "GROUP_ROWS", group)
    for M, N, K in ((300, 1000, 640), (2000, 3000, 1008), (1, 520, 128)):
        run_mm(M, N, K, "bfloat16", "device0d", "float", None, "contiguous", "kmajor", True, M + N)
        run_mm(M, N, K, "float16", "vector", "vector", "out", "contiguous", "kmajor", False, M * N)
        run_mm(M, N, K, "float32", "float", "device1", "float32", "padded", "kmajor", True, K)


def test_long_k_stays_at_float32_accumulation_level():
    # 64 stages of 128 K: the partials restarted every stage keep the error at the level of
    # one stage's tensor-core sum; left in the tensor core for all of K it would grow
    # towards 1e-2 (the fp8 tensor cores keep ~14 bits of a running sum)
    require_hopper()
    err = run_mm(256, 512, 8192, "float32", "vector", "vector", None, "contiguous", "kmajor", False, 1)
    print(f"scaled_matmul 256x512x8192 float32: rel error {err:.3g}")


def test_k_major_b_is_read_in_place_and_row_major_b_copied(monkeypatch):
    require_hopper()
    cp = _cp()
    seen = []
    real = _fp8_gemm.launch
    monkeypatch.setattr(_fp8_gemm, "launch", lambda impl, p: seen.append(p) or real(impl, p))
    rng = np.random.default_rng()
    qa, sa, qw, sw = make_operands(rng, 100, 300, 256, True, True)
    ref = reference.scaled_matmul(qa, qw.T, sa, sw)
    for a_how, b_how in (("contiguous", "kmajor"), ("padded", "rowmajor"), ("offset", "kmajor")):
        a, b = place_a(qa, a_how), place_b(qw, b_how)
        del seen[:]
        got = fp8.scaled_matmul(a, b, cp.asarray(sa), cp.asarray(sw))
        check_mm(got, ref, "bfloat16", f"a={a_how} b={b_how}")
        (p,) = seen
        assert (p.B.data.ptr == b.data.ptr) == (b_how == "kmajor"), b_how
        assert (p.A.data.ptr == a.data.ptr) == (a_how != "offset"), a_how
        assert p.lda == (256 + 16 if a_how == "padded" else 256) and p.ldb == 256


def test_quantize_then_scaled_matmul():
    # the pipeline an fp8 linear layer runs: activations per row, weights per output channel
    require_hopper()
    cp = _cp()
    rng = np.random.default_rng()
    x, w = rand(rng, (333, 1024), "bfloat16"), rand(rng, (520, 1024), "bfloat16", 0.05)
    qx, sx = cupyops.quantize_fp8(cp.asarray(x), axis=-1)
    qw, sw = cupyops.quantize_fp8(cp.asarray(w), axis=-1)
    y = fp8.scaled_matmul(qx, qw.T, sx, sw)
    check_mm(y, reference.scaled_matmul(qx.get(), qw.get().T, sx.get(), sw.get()), "bfloat16", "quantized linear")
    # and against the unquantised product: e4m3's 3 mantissa bits, ~5 % a product
    assert reference.rel_error(y, reference.matmul(x, w.T)) < 0.15


def test_scaled_matmul_numpy_and_float8_arrays():
    require_hopper()
    cp = _cp()
    import ml_dtypes

    rng = np.random.default_rng()
    qa, sa, qw, sw = make_operands(rng, 70, 90, 160, True, False)
    ref = reference.scaled_matmul(qa, qw.T, sa, sw)
    host = fp8.scaled_matmul(qa, qw.T, sa, float(sw), out_dtype="float32")  # NumPy in, NumPy out
    assert isinstance(host, np.ndarray)
    check_mm(host, ref, "float32", "numpy")
    f8a, f8b = qa.view(ml_dtypes.float8_e4m3fn), qw.view(ml_dtypes.float8_e4m3fn).T
    check_mm(fp8.scaled_matmul(f8a, f8b, sa, float(sw), out_dtype="float32"), ref, "float32", "numpy float8")
    try:
        da = cp.asarray(f8a)
    except Exception as exc:  # CuPy without a float8 dtype: the uint8 form is the way in
        pytest.skip(f"this CuPy holds no float8_e4m3fn arrays ({type(exc).__name__}: {exc})")
    got = fp8.scaled_matmul(da, cp.asarray(qw).view(da.dtype).T, cp.asarray(sa), float(sw),
                                out_dtype="float32")
    check_mm(got, ref, "float32", "cupy float8")


def test_scaled_matmul_k_zero_and_empty():
    cp = _cp()
    # an empty output needs no kernel (any GPU)
    y = fp8.scaled_matmul(cp.zeros((0, 32), np.uint8), cp.zeros((32, 7), np.uint8), 1.0, 1.0)
    assert y.shape == (0, 7) and y.dtype == _dtypes.to_dtype("bfloat16")
    require_hopper()
    y = fp8.scaled_matmul(cp.zeros((5, 0), np.uint8), cp.zeros((0, 7), np.uint8), 2.0, 3.0,
                              out_dtype="float32")
    assert y.shape == (5, 7) and not bool(cp.any(y != 0))
    bias = cp.arange(7, dtype=np.float32)
    y = fp8.scaled_matmul(cp.zeros((5, 0), np.uint8), cp.zeros((0, 7), np.uint8), 2.0, 3.0, bias=bias)
    assert np.array_equal(y.get().astype(np.float32), np.broadcast_to(np.arange(7, dtype=np.float32), (5, 7)))


def test_scaled_matmul_out_must_not_overlap_an_input():
    cp = _cp()
    buf = cp.zeros(4096, np.uint8)
    b = buf[: 32 * 8].reshape(32, 8)
    out = buf.view(_dtypes.to_dtype("bfloat16"))[: 4 * 8].reshape(4, 8)
    with pytest.raises(ValueError, match="^out: must not overlap the input b"):
        fp8.scaled_matmul(cp.zeros((4, 32), np.uint8), b, 1.0, 1.0, out=out)


def test_scaled_matmul_on_a_side_stream():
    require_hopper()
    cp = _cp()
    rng = np.random.default_rng()
    qa, sa, qw, sw = make_operands(rng, 200, 300, 512, True, True)
    a, b, dsa, dsw = cp.asarray(qa), cp.asarray(qw).T, cp.asarray(sa), cp.asarray(sw)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        got = fp8.scaled_matmul(a, b, dsa, dsw, out_dtype="float16")
    s.synchronize()
    check_mm(got, reference.scaled_matmul(qa, qw.T, sa, sw), "float16", "side stream")


def test_other_gpus_get_a_clear_error():
    if hopper():
        pytest.skip("this GPU runs the float8 GEMM")
    cp = _cp()
    props = _launch.device_props()
    a, b = cp.zeros((4, 32), np.uint8), cp.zeros((32, 8), np.uint8)
    name = re.escape(f"{props.name} (sm_{props.cc})")
    with pytest.raises(RuntimeError, match=rf"^scaled_matmul: .*compute capability 9\.0.*{name}"):
        fp8.scaled_matmul(a, b, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"^impl: 'wgmma_ws'"):
        fp8.scaled_matmul(a, b, 1.0, 1.0, impl="wgmma_ws")
