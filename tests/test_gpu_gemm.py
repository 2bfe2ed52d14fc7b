"""GPU tier for the GEMM ladder: every rung (and ``auto``) of matmul / gemm, for every
dtype it claims, against the float64 (int8: exact integer) reference.

Hypothesis draws M, N, K (1, 17, non-multiples of every tile), the four transpose
combinations, alpha/beta with and without c, batch stacks with broadcasting, and how the
operands are laid out (contiguous, a transposed view, an element-offset view whose data
pointer is not 16-byte aligned). Every result is also computed into an ``out=`` poisoned
with NaN (int32: a sentinel), which must be the array returned, fully written.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cupyops
from cupyops import _dtypes, _launch, reference
from cupyops.ops import gemm as G

pytestmark = pytest.mark.gpu

SENTINEL = -123456789
HYPO = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
AWKWARD = [1, 2, 3, 8, 16, 17, 31, 64, 65, 100, 127, 128, 129, 200, 255, 257, 300]
LAYOUTS = [(ta, tb) for ta in (False, True) for tb in (False, True)]


def _cp():
    import cupy

    return cupy


def rungs():
    return [pytest.param(impl, d, id=f"{impl}-{d}")
            for impl in [*cupyops.variants("matmul"), "auto"]
            for d in (G.GEMM_TYPES if impl == "auto" else G.dtypes_of(impl))]


def require(impl):
    """The sm_90a rungs run on compute capability 9.0 alone."""
    if impl in G._gemm_wgmma.VARIANTS and not G._gemm_wgmma.runs_here(_launch.device_props()):
        pytest.skip(f"{impl} needs an sm_90 GPU")


def max_m(impl):
    return G._gemm_skinny.MAX_M if impl == "skinny" else None


def rand(rng, shape, dtype):
    if dtype == "int8":
        return rng.integers(-128, 127, size=shape, endpoint=True).astype(np.int8)
    return rng.standard_normal(shape).astype(_dtypes.to_dtype(dtype))


def tol(dtype, K):
    # float32: the K-term float32 dot products; the reference rounded to fp16/bf16 output
    # is the floor of the half types (rel error of rounding ~ 2^-11 / 2^-8).
    return reference.gemm_tolerance(dtype, K)


def layout(rng, values, how, cp):
    """values (host, contiguous) as the device operand: contiguous, a transposed view of a
    Fortran-ordered copy (unit stride on the second-last axis), or offset by one element
    (misaligned pointer, and with it every 16-byte path's fallback)."""
    if how == "contiguous" or values.ndim < 2:
        return cp.asarray(values)
    if how == "fortran":
        return cp.asarray(np.ascontiguousarray(np.swapaxes(values, -1, -2))).swapaxes(-1, -2)
    flat = cp.asarray(np.concatenate([np.zeros(1, values.dtype), values.ravel()]))
    return flat[1:].reshape(values.shape)


def poisoned(shape, dtype):
    cp = _cp()
    out = cp.empty(shape, dtype)
    out.fill(SENTINEL if dtype == np.int32 else np.nan)
    return out


def check(got, ref, dtype, K, what, magnitude=None):
    """``magnitude`` (float32 only): |a| @ |b|, the scale a float32 dot product's rounding
    error is bounded by (|error| <= K u sum |a_k b_k|). Normalising by it instead of by the
    result keeps the bound meaningful when the terms cancel: a 5-term dot product whose
    result is a tenth of its terms' size had measured 1.09e-5 against ||ref||."""
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert got.dtype == _dtypes.to_dtype(G.OUT_TYPES[dtype]), f"{what}: dtype {got.dtype}"
    if dtype == "int8":
        bad = got != ref
        assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} differ: {got[bad][:5]} vs {ref[bad][:5]}"
    elif magnitude is not None and dtype == "float32":
        diff = np.linalg.norm(np.ravel(got.astype(np.float64) - ref))  # NaN fails the bound
        err = diff / max(np.linalg.norm(np.ravel(magnitude)), np.finfo(np.float64).tiny)
        assert err <= tol(dtype, K), f"{what}: error {err:.3g} of |a| @ |b| > {tol(dtype, K):.3g}"
    else:
        err = reference.rel_error(got, ref)
        assert err <= tol(dtype, K), f"{what}: rel error {err:.3g} > {tol(dtype, K):.3g}"


def run_gemm(impl, dtype, M, N, K, ta, tb, alpha, beta, batch_a, batch_b, with_c, how, seed):
    require(impl)
    cp = _cp()
    rng = np.random.default_rng(seed)
    a_shape = tuple(batch_a) + ((K, M) if ta else (M, K))
    b_shape = tuple(batch_b) + ((N, K) if tb else (K, N))
    a, b = rand(rng, a_shape, dtype), rand(rng, b_shape, dtype)
    batch = np.broadcast_shapes(tuple(batch_a), tuple(batch_b))
    dout = G.OUT_TYPES[dtype]
    c = None
    if with_c:
        c = (rng.integers(-1000, 1000, size=tuple(batch) + (M, N)).astype(np.int32) if dtype == "int8"
             else rand(rng, tuple(batch) + (M, N), dout))
    if dtype == "int8":
        alpha, beta = int(alpha), int(beta)
    if c is None:
        beta = 0
    ref = reference.gemm(a, b, c, alpha, beta, ta, tb)
    da, db = layout(rng, a, how, cp), layout(rng, b, how, cp)
    dc = None if c is None else cp.asarray(c)
    what = f"{impl} {dtype} M={M} N={N} K={K} ta={ta} tb={tb} batch={batch_a}/{batch_b} {how}"
    got = cupyops.gemm(da, db, dc, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, impl=impl)
    check(got, ref, dtype, K, what)
    out = poisoned(ref.shape, _dtypes.to_dtype(dout))
    res = cupyops.gemm(da, db, dc, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, out=out, impl=impl)
    assert res is out
    check(out, ref, dtype, K, what + " out=")


@st.composite
def problems(draw, impl):
    mm = max_m(impl)
    M = draw(st.sampled_from([m for m in AWKWARD if mm is None or m <= mm]))
    N = draw(st.sampled_from(AWKWARD))
    K = draw(st.sampled_from(AWKWARD + [513, 1000]))
    ta, tb = draw(st.sampled_from(LAYOUTS))
    alpha = draw(st.sampled_from([1.0, -2.0, 0.5, 3.0]))
    beta = draw(st.sampled_from([0.0, 1.0, -0.5, 2.0]))
    batches = draw(st.sampled_from([((), ()), ((3,), ()), ((), (2,)), ((2,), (2,)),
                                    ((2, 1), (1, 3)), ((4,), (1,))]))
    with_c = draw(st.booleans())
    how = draw(st.sampled_from(["contiguous", "fortran", "offset"]))
    seed = draw(st.integers(0, 2**31 - 1))
    return M, N, K, ta, tb, alpha, beta, batches[0], batches[1], with_c, how, seed


@pytest.mark.parametrize("impl,dtype", rungs())
@HYPO
@given(data=st.data())
def test_gemm_matches_reference(impl, dtype, data):
    M, N, K, ta, tb, alpha, beta, ba, bb, with_c, how, seed = data.draw(problems(impl))
    if dtype == "int8" and alpha not in (1.0, -2.0, 3.0):
        alpha = 1.0
    if dtype == "int8" and beta not in (0.0, 1.0, 2.0):
        beta = 1.0
    run_gemm(impl, dtype, M, N, K, ta, tb, alpha, beta, ba, bb, with_c, how, seed)


# Shapes that reach each launcher's paths: full tiles, partial tiles, long K (pipelines of
# many stages; the skinny kernel's split-K), the decode shapes.
SHAPES = [(256, 256, 256), (1823, 781, 517), (129, 257, 1000), (512, 384, 2048), (64, 4096, 4096),
          (1, 4096, 4096), (16, 1000, 3000), (7, 11008, 1024), (300, 40, 5000)]


@pytest.mark.parametrize("M,N,K", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("impl,dtype", rungs())
def test_gemm_shapes_every_layout(impl, dtype, M, N, K):
    if impl == "skinny" and M > G._gemm_skinny.MAX_M:
        pytest.skip("skinny is for small M")
    if impl in ("naive", "tiled") and M * N * K > 2**31:
        pytest.skip("the textbook rungs are too slow for this size")
    for i, (ta, tb) in enumerate(LAYOUTS):
        run_gemm(impl, dtype, M, N, K, ta, tb, 1.0 if i % 2 else 2.0, 0.0 if i < 2 else -1.0,
                 (), (), i >= 2, "contiguous", 1000 * M + i)


@pytest.mark.parametrize("impl,dtype", rungs())
def test_in_place_c_is_out(impl, dtype):
    require(impl)
    cp = _cp()
    rng = np.random.default_rng()
    M = 33 if impl == "skinny" else 200
    a, b = rand(rng, (M, 300), dtype), rand(rng, (300, 150), dtype)
    dout = _dtypes.to_dtype(G.OUT_TYPES[dtype])
    c = rng.integers(-50, 50, size=(M, 150)).astype(dout)
    ref = reference.gemm(a, b, c, 2, 3)
    dc = cp.asarray(c)
    res = cupyops.gemm(cp.asarray(a), cp.asarray(b), dc, alpha=2, beta=3, out=dc, impl=impl)
    assert res is dc
    check(dc, ref, dtype, 300, f"{impl} {dtype} c is out")


@pytest.mark.parametrize("impl,dtype", rungs())
def test_beta_zero_never_reads_c(impl, dtype):
    require(impl)
    cp = _cp()
    rng = np.random.default_rng()
    M = 5 if impl == "skinny" else 70
    a, b = rand(rng, (M, 40), dtype), rand(rng, (40, 90), dtype)
    dout = _dtypes.to_dtype(G.OUT_TYPES[dtype])
    c = cp.full((M, 90), SENTINEL if dtype == "int8" else np.nan, dout)
    got = cupyops.gemm(cp.asarray(a), cp.asarray(b), c, beta=0, impl=impl)
    check(got, reference.matmul(a, b).astype(np.int32) if dtype == "int8" else reference.matmul(a, b),
          dtype, 40, f"{impl} {dtype} beta=0 with NaN c")


@pytest.mark.parametrize("dtype", G.GEMM_TYPES)
def test_matmul_numpy_semantics(dtype):
    rng = np.random.default_rng()
    cp = _cp()
    cases = [((5,), (5,)), ((5,), (5, 7)), ((3, 5), (5,)), ((2, 3, 4, 5), (5, 6)),
             ((4, 1, 9, 17), (3, 17, 2)), ((70, 33), (33, 65)), ((1, 1), (1, 1))]
    for sa, sb in cases:
        a, b = rand(rng, sa, dtype), rand(rng, sb, dtype)
        ref = reference.matmul(a, b)
        if dtype == "int8":
            ref = ref.astype(np.int32)
        # few-term products (5 terms, 1x1) can cancel: float32 is judged against |a| @ |b|
        mag = np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
        got = cupyops.matmul(cp.asarray(a), cp.asarray(b))
        assert got.shape == mag.shape
        check(got, np.asarray(ref), dtype, sa[-1], f"matmul {sa} @ {sb}", mag)
        host = cupyops.matmul(a, b)  # NumPy in, NumPy out
        assert isinstance(host, (np.ndarray, np.generic)), type(host)
        check(np.asarray(host), np.asarray(ref), dtype, sa[-1], f"numpy matmul {sa} @ {sb}", mag)


@pytest.mark.parametrize("dtype", G.GEMM_TYPES)
def test_k_zero_and_empty_results(dtype):
    cp = _cp()
    dout = _dtypes.to_dtype(G.OUT_TYPES[dtype])
    a = cp.zeros((6, 0), _dtypes.to_dtype(dtype))
    b = cp.zeros((0, 4), _dtypes.to_dtype(dtype))
    z = cupyops.matmul(a, b)
    assert z.dtype == dout and z.shape == (6, 4) and not bool(cp.any(z != 0))
    c = cp.arange(24, dtype=dout).reshape(6, 4)
    y = cupyops.gemm(a, b, c, alpha=1, beta=2)
    assert np.array_equal(y.get(), 2 * c.get())
    assert cupyops.matmul(cp.zeros((0, 5), a.dtype), cp.zeros((5, 3), a.dtype)).shape == (0, 3)


def test_strided_and_reversed_operands_are_copied_not_misread():
    cp = _cp()
    rng = np.random.default_rng()
    a, b = rand(rng, (60, 2 * 50), "float32"), rand(rng, (50, 40), "float32")
    da = cp.asarray(a)[:, ::2]  # no unit stride in either axis
    db = cp.asarray(b)[::-1]
    got = cupyops.matmul(da, db)
    check(got, reference.matmul(a[:, ::2], b[::-1]), "float32", 50, "strided/reversed")


def assert_repeats_bitwise(call, raw):
    """call() twice with the memory pool disturbed in between must give the same bits (no
    float atomics; the partials added in a fixed order). Returns the first result."""
    cp = _cp()
    first = call()
    cp.empty(7 * 1024 * 1024, np.uint8).fill(255)
    again = call()
    assert np.array_equal(first.get().view(raw), again.get().view(raw))
    return first


def test_skinny_split_k_is_bitwise_deterministic():
    cp = _cp()
    rng = np.random.default_rng()
    for dtype in ("float32", "bfloat16"):
        a = cp.asarray(rand(rng, (4, 8192), dtype))
        b = cp.asarray(rand(rng, (8192, 2048), dtype))
        assert_repeats_bitwise(lambda: cupyops.matmul(a, b, impl="skinny"),
                               np.uint32 if dtype == "float32" else np.uint16)


def test_mma_split_k_is_bitwise_deterministic():
    # decode shapes run mma as split-K (fp32 partials added in a fixed order by a second
    # kernel); the result must not depend on which split finished first
    cp = _cp()
    rng = np.random.default_rng()
    for dtype in ("float16", "bfloat16"):
        a = cp.asarray(rand(rng, (4, 8192), dtype))
        b = cp.asarray(rand(rng, (8192, 2048), dtype))
        (p,) = G._problems(dtype, False, False, 4, 2048, 8192, a, b, None, cp.empty((4, 2048), a.dtype),
                           (), 1, 0, cp)
        assert G._gemm_mma.split_plan("mma", p) is not None
        first = assert_repeats_bitwise(lambda: cupyops.matmul(a, b, impl="mma"), np.uint16)
        check(first, reference.matmul(a.get(), b.get()), dtype, 8192, f"mma split-K {dtype}")


def test_int8_is_exact_at_large_k():
    cp = _cp()
    rng = np.random.default_rng()
    a, b = rand(rng, (300, 8192), "int8"), rand(rng, (8192, 200), "int8")
    for impl in ("auto", "mma", "naive"):
        got = cupyops.matmul(cp.asarray(a), cp.asarray(b), impl=impl)
        check(got, reference.matmul(a, b).astype(np.int32), "int8", 8192, f"int8 {impl}")


def test_gemm_on_a_side_stream():
    cp = _cp()
    rng = np.random.default_rng()
    a, b = rand(rng, (3, 2048), "float16"), rand(rng, (2048, 1024), "float16")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        got = cupyops.matmul(cp.asarray(a), cp.asarray(b))
        big = cupyops.matmul(cp.asarray(rand(rng, (256, 512), "float16")), cp.asarray(b[:512]))
    s.synchronize()
    check(got, reference.matmul(a, b), "float16", 2048, "side stream skinny")
    assert big.shape == (256, 1024)


def config_cases():
    for impl, mod in G._LAUNCHERS.items():
        for cfg in mod.CONFIGS.get(impl, ()):
            for dtype in G.dtypes_of(impl):
                yield pytest.param(impl, dtype, cfg, id=f"{impl}-{dtype}-{cfg}")


@pytest.mark.parametrize("impl,dtype,cfg", list(config_cases()))
def test_every_tile_config_every_layout(impl, dtype, cfg):
    require(impl)
    # auto picks one configuration per shape; the sweep and users may force any other, and
    # each is its own instantiation (warp layout, ring depth, fragment mapping): all must be
    # right on partial tiles, several k-tiles, every layout, aligned and misaligned.
    cp = _cp()
    rng = np.random.default_rng()
    M = 40 if impl == "skinny" else 300
    N, K = 520, 700
    for i, (ta, tb) in enumerate(LAYOUTS):
        if impl == "wgmma_ws" and not G._gemm_wgmma.takes_layout(G._gemm_wgmma.tile_of(impl, cfg), tb):
            continue  # (a K-major B alone: the plan test checks the refusal)
        for how in ("contiguous", "offset"):
            a = rand(rng, (K, M) if ta else (M, K), dtype)
            b = rand(rng, (N, K) if tb else (K, N), dtype)
            ref = reference.gemm(a, b, None, 1, 0, ta, tb)
            if dtype == "int8":
                ref = ref.astype(np.int32)
            da, db = layout(rng, a, how, cp), layout(rng, b, how, cp)
            d = poisoned((M, N), _dtypes.to_dtype(G.OUT_TYPES[dtype]))
            (p,) = G._problems(dtype, ta, tb, M, N, K, da, db, None, d, (), 1, 0, cp)
            G._LAUNCHERS[impl].launch(impl, p, cfg)
            check(d, ref, dtype, K, f"{impl} {dtype} {cfg} ta={ta} tb={tb} {how}")



def tma_cases():
    for cfg in G._gemm_mma.CONFIGS["mma"]:
        for dtype in G._gemm_mma.TMA_TYPES:
            yield pytest.param(dtype, cfg, id=f"{dtype}-{cfg}")


@pytest.mark.parametrize("dtype,cfg", list(tma_cases()))
def test_tma_feed_every_config_every_layout(dtype, cfg, monkeypatch):
    # sm_90: aligned 16-bit operands that are both K-contiguous (trans_b) run gemm_mma_tma
    # (tensor copies, mbarriers); the other layouts keep cp.async. Every extent is a
    # multiple of 8 elements (16-byte rows) and none is a multiple of a tile, so every edge
    # is a zero-filled box; the stacks cover the batch coordinate and a broadcast operand.
    # The same cases with the feed switched off run the cp.async kernel on the same operands.
    cp = _cp()
    if _launch.device_props().cc < 90:
        pytest.skip("tensor copies need sm_90")
    mod = G._gemm_mma
    launched = []
    real = mod.KERNELS.function
    monkeypatch.setattr(mod.KERNELS, "function", lambda name: launched.append(name) or real(name))
    rng = np.random.default_rng()
    M, N, K = 296, 520, 712
    for feed in (True, False):
        monkeypatch.setattr(mod, "TMA_FEED", feed)
        for ta, tb in LAYOUTS:
            for batch_a, batch_b in (((), ()), ((3,), (1,)), ((2,), (2,))):
                a = rand(rng, batch_a + ((K, M) if ta else (M, K)), dtype)
                b = rand(rng, batch_b + ((N, K) if tb else (K, N)), dtype)
                batch = np.broadcast_shapes(batch_a, batch_b)
                c = rand(rng, batch + (M, N), dtype)
                ref = reference.gemm(a, b, c, 1.5, -0.5, ta, tb)
                d = poisoned(batch + (M, N), _dtypes.to_dtype(dtype))
                del launched[:]
                for p in G._problems(dtype, ta, tb, M, N, K, cp.asarray(a), cp.asarray(b), cp.asarray(c), d,
                                     batch, 1.5, -0.5, cp):
                    mod.launch("mma", p, cfg)
                what = f"mma {dtype} {cfg} feed={'tma' if feed else 'cp.async'} ta={ta} tb={tb} {batch_a}/{batch_b}"
                check(d, ref, dtype, K, what)
                tma = feed and not ta and tb
                assert launched and all(n.startswith("gemm_mma_tma<" if tma else "gemm_mma<") for n in launched), (
                    what, launched)


def wgmma_configs():
    for impl in G._gemm_wgmma.VARIANTS:
        for cfg in G._gemm_wgmma.CONFIGS[impl] or (None,):
            yield pytest.param(impl, cfg, id=f"{impl}-{cfg}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("impl,cfg", list(wgmma_configs()))
def test_wgmma_runs_its_kernel_every_layout(impl, cfg, dtype, monkeypatch):
    # Aligned operands (every extent a multiple of 8 elements, none of a tile) must run the
    # wgmma kernel itself, not mma's fallback: every layout (both transpose immediates),
    # zero-filled edge boxes in M, N and K, several k-tiles, stacks with the batch
    # coordinate and a broadcast operand, NaN-poisoned D. alpha / beta with C stores
    # directly; beta == 0 takes wgmma_ws's epilogue of tensor stores, except for a D
    # whose rows a tensor map cannot describe (N = 517).
    require(impl)
    cp = _cp()
    mod = G._gemm_wgmma
    launched, by_tma = [], []
    real = mod.KERNELS.function
    monkeypatch.setattr(mod.KERNELS, "function", lambda name: launched.append(name) or real(name))
    real_map = mod.output_map
    monkeypatch.setattr(mod, "output_map", lambda p, t: by_tma.append(real_map(p, t)[1]) or real_map(p, t))
    rng = np.random.default_rng()
    for M, N, K in ((296, 520, 712), (64, 256, 64), (8, 8, 8), (200, 1000, 136), (136, 517, 64)):
        for ta, tb in LAYOUTS:
            if N % 8 and not tb:
                continue  # B's rows of 517 elements: no tensor map, mma runs (the next test)
            if not mod.takes_layout(mod.tile_of(impl, cfg), tb):
                continue  # (128x176c2: a K-major B alone)
            for (batch_a, batch_b), (alpha, beta) in zip((((), ()), ((3,), (1,)), ((2,), (2,)), ((), ())),
                                                         ((1.5, -0.5), (1.5, -0.5), (2.0, 0.0), (-1.0, 0.0))):
                a = rand(rng, batch_a + ((K, M) if ta else (M, K)), dtype)
                b = rand(rng, batch_b + ((N, K) if tb else (K, N)), dtype)
                batch = np.broadcast_shapes(batch_a, batch_b)
                c = rand(rng, batch + (M, N), dtype) if beta else None
                ref = reference.gemm(a, b, c, alpha, beta, ta, tb)
                d = poisoned(batch + (M, N), _dtypes.to_dtype(dtype))
                del launched[:], by_tma[:]
                dc = None if c is None else cp.asarray(c)
                for p in G._problems(dtype, ta, tb, M, N, K, cp.asarray(a), cp.asarray(b), dc, d, batch, alpha,
                                     beta, cp):
                    mod.launch(impl, p, cfg)
                what = f"{impl} {cfg} {dtype} {M}x{N}x{K} ta={ta} tb={tb} {batch_a}/{batch_b} beta={beta}"
                check(d, ref, dtype, K, what)
                t = mod.tile_of(impl, cfg)
                names = {mod._name(impl, dtype, "true" if ta else "false", "true" if tb else "false", t)}
                assert launched and set(launched) == names, (what, launched)
                if impl == "wgmma_ws":
                    assert by_tma == [int(beta == 0 and N % 8 == 0)] * len(by_tma) and by_tma, (what, by_tma)


def test_wgmma_falls_back_to_mma_where_no_tensor_map_fits(monkeypatch):
    # a misaligned start or a row of an odd number of elements cannot be a tensor map:
    # the product runs mma, and is right
    require("wgmma_ws")
    cp = _cp()
    rng = np.random.default_rng()
    for M, N, K, how in ((130, 300, 257, "contiguous"), (128, 256, 512, "offset")):
        a, b = rand(rng, (M, K), "bfloat16"), rand(rng, (K, N), "bfloat16")
        da, db = layout(rng, a, how, cp), layout(rng, b, how, cp)
        (p,) = G._problems("bfloat16", False, False, M, N, K, da, db, None, poisoned((M, N), a.dtype), (), 1, 0, cp)
        assert G._gemm_wgmma.tensor_maps(p, G._gemm_wgmma.tile_of("wgmma_ws", "128x256")) is None
        got = cupyops.matmul(da, db, impl="wgmma_ws")
        check(got, reference.matmul(a, b), "bfloat16", K, f"fallback {how} {M}x{N}x{K}")


def test_auto_runs_wgmma_ws_on_hopper(monkeypatch):
    require("wgmma_ws")
    cp = _cp()
    launched = []
    real = G._gemm_wgmma.launch
    monkeypatch.setattr(G._gemm_wgmma, "launch", lambda impl, p, config=None: launched.append(impl) or real(impl, p))
    rng = np.random.default_rng()
    a = cp.asarray(rand(rng, (1024, 512), "float16"))
    cupyops.matmul(a, a.T)
    assert launched == ["wgmma_ws"]
    cupyops.matmul(a[:8], a.T)  # decode-sized: mma's split-K
    assert launched == ["wgmma_ws"]
    b = cp.asarray(rand(rng, (4096, 256), "float16"))
    cupyops.matmul(a[:128, :256].copy(), b[:256])  # few tiles, short K: no split either way
    assert launched == ["wgmma_ws", "wgmma_ws"]
    got = cupyops.matmul(cp.asarray(rand(rng, (128, 4096), "float16")), b)  # mma would split K: it runs
    assert launched == ["wgmma_ws", "wgmma_ws"] and got.shape == (128, 256)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cfg", list(G._gemm_wgmma.CONFIGS["wgmma_ws"]))
@pytest.mark.parametrize("group", [None, 3])
def test_wgmma_ws_blocks_walk_several_tiles(cfg, dtype, group, monkeypatch):
    # more tiles than SMs (170 of 128x256, 221 of 128x192, 323 of 128x128, 90 pairs of
    # 128x256 and 126 of 128x176 on 66 cluster slots), so each persistent block carries its
    # ring's phases, its staging buffer and the producer's run-ahead from one tile to the
    # next; beta == 0 (tensor stores) and beta != 0 (direct stores), a @ b and x @ w.T
    # (128x176c2: x @ w.T alone, both epilogues). The walk in groups of the default rows
    # (17 tile rows: a group of 16 and one of 1, walked right to left) and of 3 (groups of
    # alternating direction, the last one short)
    require("wgmma_ws")
    if group is not None:
        monkeypatch.setattr(G._gemm_wgmma, "GROUP_ROWS", group)
    cp = _cp()
    rng = np.random.default_rng()
    M, N, K = 2056, 2312, 200
    for tb, beta in ((False, 0.0), (True, -0.5), (True, 0.0)):
        if not G._gemm_wgmma.takes_layout(G._gemm_wgmma.tile_of("wgmma_ws", cfg), tb):
            continue  # (128x176c2: a K-major B alone)
        a = rand(rng, (M, K), dtype)
        b = rand(rng, (N, K) if tb else (K, N), dtype)
        c = rand(rng, (M, N), dtype) if beta else None
        ref = reference.gemm(a, b, c, 1.0, beta, False, tb)
        d = poisoned((M, N), _dtypes.to_dtype(dtype))
        (p,) = G._problems(dtype, False, tb, M, N, K, cp.asarray(a), cp.asarray(b),
                           None if c is None else cp.asarray(c), d, (), 1.0, beta, cp)
        G._gemm_wgmma.launch("wgmma_ws", p, cfg)
        check(d, ref, dtype, K, f"wgmma_ws {cfg} {dtype} {M}x{N}x{K} tb={tb} beta={beta}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_ws_streamk_hands_partials_over(dtype, monkeypatch):
    # stream-K with ranges of one k-tile, so that nearly every shared tile is cut into
    # pieces held by two or more blocks (a tile of 4 k-tiles in up to 4 ranges; one tile of
    # 64 k-tiles in 64): whole waves before the shared tiles (170 tiles on 132 SMs), edges in
    # M, N and K, a stack with a broadcast operand, beta != 0 (direct stores, C read once
    # by the finishing block) and beta == 0 (tensor stores), both operand majors; then the
    # same call again, which must give the same bits (the partials are added in a fixed
    # order)
    require("wgmma_ws")
    cp = _cp()
    mod = G._gemm_wgmma
    monkeypatch.setattr(mod, "SK_MIN_K_TILES", 1)
    rng = np.random.default_rng()
    cases = [((2056, 2312, 200), (), (), False, True, 1.0, -0.5), ((2056, 2312, 200), (), (), True, False, 2.0, 0.0),
             ((296, 520, 712), (3,), (1,), False, False, 1.5, -0.5), ((296, 520, 712), (2,), (2,), True, True, -1.0, 0.0),
             ((128, 256, 4096), (), (), False, True, 1.0, 0.0), ((72, 264, 136), (2,), (), False, True, 1.0, 0.5)]
    for (M, N, K), batch_a, batch_b, ta, tb, alpha, beta in cases:
        a = rand(rng, batch_a + ((K, M) if ta else (M, K)), dtype)
        b = rand(rng, batch_b + ((N, K) if tb else (K, N)), dtype)
        batch = np.broadcast_shapes(batch_a, batch_b)
        c = rand(rng, batch + (M, N), dtype) if beta else None
        ref = reference.gemm(a, b, c, alpha, beta, ta, tb)
        outs = []
        for _ in range(2):
            d = poisoned(batch + (M, N), _dtypes.to_dtype(dtype))
            for p in G._problems(dtype, ta, tb, M, N, K, cp.asarray(a), cp.asarray(b),
                                 None if c is None else cp.asarray(c), d, batch, alpha, beta, cp):
                sk = mod.streamk_plan(p, mod.tile_of("wgmma_ws", "128x256sk"), _launch.device_props().sm_count)
                assert sk.sk_blocks > 0
                mod.launch("wgmma_ws", p, "128x256sk")
            outs.append(d)
        what = f"wgmma_ws 128x256sk {dtype} {M}x{N}x{K} ta={ta} tb={tb} {batch_a}/{batch_b} beta={beta}"
        check(outs[0], ref, dtype, K, what)
        assert bool((outs[0].view(cp.uint16) == outs[1].view(cp.uint16)).all()), what
