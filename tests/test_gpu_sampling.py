"""GPU tier: cupyops.sample, every rung and impl="auto", against cupyops.reference.sample.

- The reference draws with the same Philox uniforms and keep rules in float64. A token
  must be the reference's, or one it accepts (``reference.sample_accepts``, tol 1e-5): the
  kernel's float32 weights put the uniform, or top-p's cut, within 1e-5 of a step of the
  reference's cumulative mass. Top-k membership and greedy rows are exact integer facts:
  no tolerance there. Every test also counts the rows that needed the tolerance: a handful
  at most (the boundaries are that rare), so a kernel cannot pass by being near.
- Hypothesis draws vocabularies (1, 17, 1823, 32000, 128256 and any size up to 3000), 1..64
  rows, every dtype, options as numbers or per-row arrays (on the device, with the values
  the device reads without a check: temperature <= 0 or NaN, top_k < 0, top_p <= 0, >= 1 or
  NaN), one seed or a seed a row, and placements (CuPy, NumPy, rows padded apart, a start
  off 16 bytes).
- Greedy is argmax (first index on ties; NaN never, +inf as the largest value); top_k=1 is
  greedy where the maximum is unique; the distribution over many uniforms passes a
  chi-square test; a seed gives the same tokens every time; torch in gives torch int64 out;
  a captured CUDA graph replays with a new seed written into the seed array.
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cupyops
from cupyops import reference
from cupyops.ops import sampling
from gpu_helpers import _cp, dt, host

pytestmark = pytest.mark.gpu

IMPLS = ("naive", "fused", "cluster", "auto")
DTYPES = ("float32", "float16", "bfloat16")
VOCABS = (1, 17, 1823, 32000, 128256)
TOL = 1e-5
HYPO = settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def place(values, mode):
    """``values`` as the operator gets it: NumPy, CuPy, rows padded 40 elements apart (NaN in
    the padding: a read past the row shows), or starting one element past 16 bytes."""
    if mode == "numpy":
        return values
    cp = _cp()
    if mode == "cupy":
        return cp.asarray(values)
    if mode == "padded":
        base = np.full((values.shape[0], values.shape[1] + 40), np.nan, values.dtype)
        base[:, : values.shape[1]] = values
        return cp.asarray(base)[:, : values.shape[1]]
    if mode == "offset":
        flat = np.full(values.size + 1, np.nan, values.dtype)
        flat[1:] = values.ravel()
        return cp.asarray(flat)[1:].reshape(values.shape)
    raise ValueError(mode)


# How often a right kernel's row needs the tolerance: measured (H100, 6 batches x 4 option
# sets x 64 rows of 128256 logits a rung and dtype) 0.07-0.13 % for naive (its float32 block
# scan), 0 for fused and cluster; NEAR_RATE leaves a factor of 4 over the most.
NEAR_RATE = 0.005


def near_limit(rows, rate=NEAR_RATE, false_alarm=1e-4):
    """The most rows of ``rows`` that a right kernel may need the tolerance for: the least k
    with P(more than k) <= ``false_alarm`` for rows near at ``rate`` each (binomial): 1 for
    a few rows, 4 of 64. (1 + 1 % of the rows failed a right naive rung's 2 of 64.) A kernel
    that is near on a fixed share of rows, not on rare boundaries, still fails."""
    k, tail = 0, 1.0 - (1.0 - rate) ** rows  # tail: P(more than k)
    while tail > false_alarm:
        k += 1
        tail -= math.comb(rows, k) * rate**k * (1.0 - rate) ** (rows - k)
    return max(k, 1)


def assert_reference_draw(values, tokens, max_near=None, **options):
    """Every token is the reference's draw or within TOL of a boundary of it; returns the
    count of those near ones (bounded by ``max_near``: default ``near_limit``)."""
    got = host(tokens)
    assert got.dtype == np.int64 and got.shape == (values.shape[0],), (got.dtype, got.shape)
    opts = {k: host(v) if hasattr(v, "shape") else v for k, v in options.items()}
    ok, exact = reference.sample_accepts(values, got, tol=TOL, **opts)
    bad = np.flatnonzero(~ok)
    if bad.size:
        want = reference.sample(values, **opts)
        raise AssertionError(f"{bad.size} rows, first {bad[:8]}: tokens {got[bad[:8]]}, reference {want[bad[:8]]}")
    near = int((~exact).sum())
    limit = near_limit(values.shape[0]) if max_near is None else max_near
    assert near <= limit, f"{near} of {values.shape[0]} rows only within tolerance of the reference"
    return near


def logits(rng, batch, vocab, dtype, scale=2.0, ties=False):
    x = rng.standard_normal((batch, vocab)) * scale
    if ties:  # few distinct values: ties at the maximum and at the top-k / top-p cuts
        x = np.round(x)
    return x.astype(dt(dtype))


# ------------------------------------------------------------------ against the reference
@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    vocab = draw(st.one_of(st.sampled_from(VOCABS), st.integers(1, 3000)))
    batch = draw(st.integers(1, 64 if vocab < 100_000 else 24))
    mode = draw(st.sampled_from(("cupy", "numpy", "padded", "offset")))
    device = mode != "numpy"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def per_row(values):
        a = np.asarray(values)
        return _cp().asarray(a) if device else a

    opts = {}
    t = draw(st.sampled_from(("one", "zero", "rows")))
    if t == "one":
        opts["temperature"] = draw(st.sampled_from((0.3, 0.7, 1.0, 1.6)))
    elif t == "zero":
        opts["temperature"] = 0.0
    else:
        temps = rng.choice([0.0, 0.5, 1.0, 1.5], batch)
        if device:  # what the kernel reads unchecked: <= 0 and NaN are greedy
            temps[rng.random(batch) < 0.1] = draw(st.sampled_from((-1.0, np.nan)))
        opts["temperature"] = per_row(temps.astype(draw(st.sampled_from((np.float32, np.float64)))))
    k = draw(st.sampled_from(("none", "one", "rows")))
    if k == "one":
        opts["top_k"] = draw(st.sampled_from((0, 1, 2, 5, 50, max(vocab - 1, 0), vocab + 3)))
    elif k == "rows":
        ks = rng.choice([0, 1, 3, 40, vocab, vocab + 7] + ([-1] if device else []), batch)
        opts["top_k"] = per_row(ks.astype(draw(st.sampled_from((np.int32, np.int64)))))
    p = draw(st.sampled_from(("none", "one", "rows")))
    if p == "one":
        opts["top_p"] = draw(st.sampled_from((1.0, 0.95, 0.8, 0.5, 0.1)))
    elif p == "rows":
        ps = rng.choice([1.0, 0.9, 0.6, 0.2] + ([0.0, 1.5, np.nan] if device else []), batch)
        opts["top_p"] = per_row(ps.astype(np.float32))
    s = draw(st.sampled_from(("one", "rows", "array0")))
    if s == "one":
        opts["seed"] = draw(st.integers(0, 2**64 - 1))
    elif s == "rows":
        opts["seed"] = per_row(rng.integers(0, 2**63, batch, dtype=np.int64))
    else:
        opts["seed"] = _cp().asarray(np.uint64(draw(st.integers(0, 2**64 - 1)))) if device else \
            draw(st.integers(0, 2**64 - 1))
    x = logits(rng, batch, vocab, dtype, scale=draw(st.sampled_from((0.5, 2.0, 8.0))), ties=draw(st.booleans()))
    return x, mode, opts


@pytest.mark.parametrize("impl", IMPLS)
@HYPO
@given(case=cases())
def test_matches_reference(impl, case):
    x, mode, opts = case
    tokens = cupyops.sample(place(x, mode), impl=impl, **opts)
    assert isinstance(tokens, np.ndarray if mode == "numpy" else _cp().ndarray), type(tokens)
    assert_reference_draw(x, tokens, **opts)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_llama_vocab_batch_64(impl, dtype):
    # Llama 3's vocabulary, a decode batch, the usual serving options, one seed
    rng = np.random.default_rng()
    x = logits(rng, 64, 128256, dtype, scale=3.0)
    xd = _cp().asarray(x)
    for opts in (dict(temperature=0.8, top_k=50, top_p=0.95), dict(temperature=1.0, top_p=0.9), dict(temperature=0.6),
                 dict(temperature=1.0, top_k=1000)):
        seed = int(rng.integers(0, 2**63))
        assert_reference_draw(x, cupyops.sample(xd, seed=seed, impl=impl, **opts), seed=seed, **opts)


# ------------------------------------------------------------------ greedy and top-k = 1
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_is_argmax_with_ties(impl, dtype):
    cp = _cp()
    rng = np.random.default_rng()
    x = logits(rng, 48, 1823, dtype, scale=1.0, ties=True)  # integers in ~[-4, 4]: the max tied
    x[1, 1000] = x[1, 1500] = 50  # a tie far along the row
    x[2, :] = -np.inf
    x[3, 5] = np.nan  # NaN reads as -inf, never the argmax
    x[4, [7, 900]] = np.inf  # +inf: the largest value, the first of the tie
    want = np.argmax(np.where(np.isnan(x.astype(np.float32)), -np.inf, x.astype(np.float32)), axis=1)
    assert want[2] == 0 and want[4] == 7 and want[1] == 1000
    got = cupyops.sample(cp.asarray(x), temperature=0.0, seed=3, impl=impl)
    np.testing.assert_array_equal(host(got), want)
    temps = cp.zeros(48, cp.float32)
    np.testing.assert_array_equal(host(cupyops.sample(cp.asarray(x), temperature=temps, impl=impl)), want)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_1_is_greedy(impl, dtype):
    cp = _cp()
    rng = np.random.default_rng()
    x = logits(rng, 64, 32000, dtype, scale=2.0, ties=True)
    top = x.astype(np.float32).max(axis=1) + 1
    for i in range(64):  # rows 0..31: one maximum; rows 32..63: two or three tied
        x[i, rng.choice(32000, 1 if i < 32 else 2 + i % 2, replace=False)] = top[i]
    xd = cp.asarray(x)
    greedy = host(cupyops.sample(xd, temperature=0.0, impl=impl))
    v = x.astype(np.float32)
    unique = (v == v.max(axis=1, keepdims=True)).sum(axis=1) == 1
    assert unique[:32].all() and not unique[32:].any()
    for seed in range(4):
        got = host(cupyops.sample(xd, top_k=1, temperature=1.3, seed=seed, impl=impl))
        np.testing.assert_array_equal(got[unique], greedy[unique])
        # a tied maximum: one of the tied tokens (top-k keeps ties with the k-th)
        assert (v[np.arange(64), got] == v.max(axis=1)).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_tokens_stay_inside_top_k_and_top_p(impl):
    cp = _cp()
    rng = np.random.default_rng()
    x = logits(rng, 64, 1823, "bfloat16", scale=3.0)
    xd = cp.asarray(x)
    v = x.astype(np.float64)
    for k, p in ((10, None), (None, 0.5), (200, 0.3)):
        allowed = np.ones_like(v, bool)
        if k:
            allowed &= v >= np.sort(v, axis=1)[:, -k][:, None]
        if p:  # the reference's set, widened by TOL at the cut
            for i in range(64):
                e = np.where(allowed[i], np.exp(v[i] - v[i].max()), 0)
                order = np.argsort(-np.where(allowed[i], v[i], -np.inf), kind="stable")
                above = np.cumsum(e[order]) - e[order]  # mass strictly above each, in order
                allowed[i] &= v[i] >= v[i][order][np.flatnonzero(above < (p + TOL) * e.sum())[-1]]
        for seed in range(8):
            got = host(cupyops.sample(xd, top_k=k, top_p=p, seed=seed, impl=impl))
            assert allowed[np.arange(64), got].all(), (k, p, seed)


# ------------------------------------------------------------------ the distribution
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("per_row", [False, True])
def test_frequencies_follow_the_distribution(impl, per_row):
    # 2^17 draws from one small distribution (rows of one broadcast row: row stride 0), top-k
    # and top-p cutting two tokens: chi-square against the renormalised probabilities. The
    # seeds are fixed: the outcome is the same every run, and a biased draw fails.
    cp = _cp()
    row = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -2.0, 0.3, 1.5, -3.0], np.float32)
    n = 1 << 17
    x = cp.broadcast_to(cp.asarray(row)[None], (n, row.size))
    seed = cp.arange(n, dtype=cp.int64) * 7919 + 11 if per_row else 20260101
    k, p, T = 7, 0.9, 1.2
    got = host(cupyops.sample(x, temperature=T, top_k=k, top_p=p, seed=seed, impl=impl))
    e = np.exp((row.astype(np.float64) - row.max()) / np.float32(T))
    keep = row >= np.sort(row)[-k]
    order = np.argsort(-np.where(keep, row, -np.inf))
    mass = np.cumsum(np.where(keep, e, 0)[order]) / np.where(keep, e, 0).sum()
    keep &= row >= row[order[np.argmax(mass >= np.float32(p))]]
    prob = np.where(keep, e, 0) / np.where(keep, e, 0).sum()
    counts = np.bincount(got, minlength=row.size)
    assert (counts[~keep] == 0).all(), counts
    expected = n * prob[keep]
    chi2 = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    z = ((chi2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))  # Wilson-Hilferty
    assert z < 4.0, f"chi2 {chi2:.1f} on {df} dof (z = {z:.2f}): counts {counts}, expected {expected.round()}"
    # and the uniforms themselves: the draws agree with the reference's on a slice of the rows
    assert_reference_draw(np.broadcast_to(row, (2048, row.size)), got[:2048], temperature=T, top_k=k, top_p=p,
                          seed=host(seed)[:2048] if per_row else seed)


# ------------------------------------------------------------------ determinism, seeds
@pytest.mark.parametrize("impl", IMPLS)
def test_same_seed_same_tokens(impl):
    cp = _cp()
    rng = np.random.default_rng()
    x = cp.asarray(logits(rng, 64, 128256, "bfloat16", scale=2.0))
    opts = dict(temperature=1.0, top_p=0.95, seed=123456789)
    first = host(cupyops.sample(x, impl=impl, **opts))
    cp.empty(32 << 20, cp.uint8).fill(255)  # disturb the memory pool in between
    for _ in range(3):
        np.testing.assert_array_equal(host(cupyops.sample(x, impl=impl, **opts)), first)
    other = host(cupyops.sample(x, impl=impl, **{**opts, "seed": 987654321}))
    assert (other != first).mean() > 0.5  # another seed, other draws (most rows: a wide top-p)
    fresh = [host(cupyops.sample(x, impl=impl, temperature=1.0, top_p=0.95)) for _ in range(2)]
    assert (fresh[0] != fresh[1]).mean() > 0.5  # seed=None: a new seed each call


@pytest.mark.parametrize("impl", IMPLS)
def test_a_seed_a_row_follows_the_request_not_its_position(impl):
    cp = _cp()
    rng = np.random.default_rng()
    x = logits(rng, 16, 32000, "float16", scale=2.0)
    x[11] = x[3]
    seeds = rng.integers(0, 2**63, 16, dtype=np.int64)
    seeds[11] = seeds[3]
    got = host(cupyops.sample(cp.asarray(x), top_k=100, seed=cp.asarray(seeds), impl=impl))
    assert got[3] == got[11]
    alone = host(cupyops.sample(cp.asarray(x[3:4]), top_k=100, seed=cp.asarray(seeds[3:4]), impl=impl))
    assert alone[0] == got[3]
    assert_reference_draw(x, got, top_k=100, seed=seeds)


def test_rungs_agree_where_the_reference_is_exact():
    # fused's integer masses and naive's float32 ones: the same token wherever the
    # reference's is clear of every boundary
    cp = _cp()
    rng = np.random.default_rng()
    x = logits(rng, 64, 32000, "bfloat16", scale=2.0)
    xd = cp.asarray(x)
    opts = dict(temperature=0.9, top_k=64, top_p=0.9, seed=99)
    got = {i: host(cupyops.sample(xd, impl=i, **opts)) for i in ("naive", "fused", "cluster")}
    ok, exact = zip(*(reference.sample_accepts(x, t, **opts) for t in got.values()))
    assert all(o.all() for o in ok)
    every = np.logical_and.reduce(exact)
    assert every.sum() >= 62
    assert (got["naive"][every] == got["fused"][every]).all() and (got["fused"] == got["cluster"]).all()


# ------------------------------------------------------------------ arrays and frameworks
def test_numpy_in_numpy_out_and_empty_batch():
    rng = np.random.default_rng()
    x = logits(rng, 5, 100, "float32")
    got = cupyops.sample(x, top_k=10, seed=4)
    assert isinstance(got, np.ndarray) and got.dtype == np.int64
    np.testing.assert_array_equal(got, host(cupyops.sample(_cp().asarray(x), top_k=10, seed=4)))
    empty = cupyops.sample(_cp().zeros((0, 7), _cp().float32), seed=1)
    assert empty.shape == (0,) and empty.dtype == np.int64


@pytest.mark.parametrize("impl", ("naive", "fused", "cluster"))
def test_fast_path_replays_with_a_seed_array(impl):
    cp = _cp()
    rng = np.random.default_rng()
    x = logits(rng, 8, 4099, "bfloat16")
    xd = cp.asarray(x)
    seed = cp.asarray(np.array([5, 6, 7, 8, 9, 10, 11, 12], np.int64))
    temps = cp.asarray(np.linspace(0.0, 1.5, 8).astype(np.float32))
    first = cupyops.sample(xd, temperature=temps, top_k=40, top_p=0.9, seed=seed, impl=impl)
    assert sampling._FAST.cupy  # the call was remembered
    for new in (1, 2):
        seed[...] = cp.asarray(np.arange(8, dtype=np.int64) * 1000 + new)
        got = cupyops.sample(xd, temperature=temps, top_k=40, top_p=0.9, seed=seed, impl=impl)
        assert_reference_draw(x, got, temperature=temps, top_k=40, top_p=0.9, seed=seed)
    assert_reference_draw(x, first, temperature=temps, top_k=40, top_p=0.9,
                          seed=np.array([5, 6, 7, 8, 9, 10, 11, 12], np.int64))


def test_cuda_graph_replays_with_a_new_seed():
    cp = _cp()
    rng = np.random.default_rng()
    x = logits(rng, 32, 32000, "bfloat16", scale=2.0)
    xd = cp.asarray(x)
    seed = cp.asarray(np.uint64(1))
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        cupyops.sample(xd, temperature=0.9, top_p=0.9, seed=seed)  # compile and remember outside
        stream.synchronize()
        stream.begin_capture()
        tokens = cupyops.sample(xd, temperature=0.9, top_p=0.9, seed=seed)
        graph = stream.end_capture()
    draws = []
    for s in (17, 2**63 + 5):
        with stream:
            seed.fill(np.uint64(s))
            graph.launch(stream)
        stream.synchronize()
        assert_reference_draw(x, tokens, temperature=0.9, top_p=0.9, seed=s)
        draws.append(host(tokens).copy())
    assert (draws[0] != draws[1]).any()


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    x = logits(rng, 6, 32000, "float32", scale=2.0)
    xt = torch.from_numpy(x).to("cuda", torch.bfloat16)
    want = reference.sample(xt.float().cpu().numpy().astype(dt("bfloat16")), temperature=0.7, top_k=20, seed=9)
    for _ in range(2):
        got = cupyops.sample(xt, temperature=0.7, top_k=20, seed=9)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.int64 and got.device == xt.device
        ok, _ = reference.sample_accepts(xt.float().cpu().numpy().astype(dt("bfloat16")), got.cpu().numpy(),
                                         temperature=0.7, top_k=20, seed=9)
        assert ok.all(), (got.cpu().numpy(), want)
    # per-row torch options and a torch seed tensor (the fast path's torch replay on the second call)
    temps = torch.tensor([0.0, 0.5, 1.0, 1.0, 2.0, 0.0], device="cuda")
    seeds = torch.arange(6, device="cuda", dtype=torch.int64) + 40
    for _ in range(2):
        got = cupyops.sample(xt, temperature=temps, top_p=0.8, seed=seeds)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
        ok, _ = reference.sample_accepts(xt.float().cpu().numpy().astype(dt("bfloat16")), got.cpu().numpy(),
                                         temperature=temps.cpu().numpy(), top_p=0.8, seed=seeds.cpu().numpy())
        assert ok.all()
    assert got[0].item() == int(xt[0].float().argmax()) and got[5].item() == int(xt[5].float().argmax())
