"""CPU tier for sliding windows and logit soft-capping in the decode rung
(cupyops/ops/_attention_decode.py, kernels/attention_decode.cu): the split grid covers the
keys some row sees and starts at the window (so a window of W keys over a long cache is
planned, and streamed, as ~W keys), for the contiguous and the paged launch; and a NumPy
model of the kernel's block logic (its split base, block start, end, mask-free range,
element masks, the cap in base-2 units, empty blocks that write LSE -inf alone, the merge)
matches the float64 reference, loading no key before a block's rows' windows."""
import itertools
import math
import types

import numpy as np
import pytest

from cupyops import _launch, reference
from cupyops.ops import _attention_decode as M

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def _visible(i, Skv, causal, off, wl, wr):
    """The keys row i sees, by the definition (the reference's mask)."""
    return reference.attention_mask(i + 1, Skv, causal, off, (wl, wr))[i]


@pytest.mark.parametrize("Skv, Sq, causal, off, wl, wr", [
    (1000, 1, True, 999, 100, -1), (1000, 4, True, 996, 0, -1), (1000, 16, False, 984, 37, 5),
    (300, 16, True, -5, 3, -1), (300, 3, False, 0, -1, 7), (300, 3, False, 0, 500, 500),
    (64, 16, False, 48, 0, 0), (5000, 2, True, 4998, 4096, -1), (17, 5, False, 12, 2, -1),
    (100, 8, False, -20, 4, 2), (100, 1, False, 150, 10, -1),
])
def test_first_key_and_key_end_are_the_definition(Skv, Sq, causal, off, wl, wr):
    for i in range(Sq):
        seen = _visible(i, Skv, causal, off, wl, wr)
        lo, hi = M.first_key(i, wl, off), M.key_end(i, Skv, causal, off, wr)
        want = np.zeros(Skv, dtype=bool)
        want[lo:max(lo, hi)] = True
        np.testing.assert_array_equal(seen, want, err_msg=str(i))
    # the split grid covers every key some row sees and starts at most 15 keys early
    lo, hi = M.key_span(Sq, Skv, causal, off, wl, wr)
    assert lo % M.GROUP_KEYS == 0 and lo <= hi
    seen = np.zeros(Skv, dtype=bool)
    for i in range(Sq):
        seen |= _visible(i, Skv, causal, off, wl, wr)
    if seen.any():
        keys = np.flatnonzero(seen)
        assert lo <= keys[0] < lo + M.GROUP_KEYS and hi == keys[-1] + 1


@pytest.mark.parametrize("dtype", M.DTYPES["decode"])
@pytest.mark.parametrize("B, Hq, Hkv, Sq, D", [(1, 32, 8, 1, 128), (16, 32, 8, 1, 128), (2, 8, 1, 4, 64)])
@pytest.mark.parametrize("W", [127, 1024, 4095])
def test_a_window_over_a_long_cache_is_planned_as_the_window(dtype, B, Hq, Hkv, Sq, D, W):
    long = M.plan(dtype, B, Hq, Hkv, Sq, 1 << 20, D, causal=True, causal_offset=(1 << 20) - Sq, win_left=W)
    assert (long.kv_lo, long.kv) == (((1 << 20) - Sq - W) // 16 * 16, 1 << 20)
    assert long.kv - long.kv_lo <= W + Sq + M.GROUP_KEYS - 1
    # the launch of a sequence as long as the window's span
    short = M.plan(dtype, B, Hq, Hkv, Sq, long.kv - long.kv_lo, D)
    assert (long.grid, long.chunk, long.splits, long.work_o) == (short.grid, short.chunk, short.splits, short.work_o)
    assert long.chunk % long.bk == 0 and long.splits * long.chunk >= long.kv - long.kv_lo
    if long.splits > 1:
        assert (long.splits - 1) * long.chunk < long.kv - long.kv_lo
    # no window: the plan as before (the splits from key 0)
    flat = M.plan(dtype, B, Hq, Hkv, Sq, 1 << 20, D, causal=True, causal_offset=(1 << 20) - Sq)
    assert flat.kv_lo == 0 and flat.kv == 1 << 20


@pytest.mark.parametrize("Sq, capacity, W", [(1, 32768, 4095), (4, 32768, 127), (16, 4096, 0), (1, 256, 4095),
                                             (2, 4096, -1)])
def test_paged_window_plan_covers_every_sequence(Sq, capacity, W):
    pl = M.plan("bfloat16", 4, 32, 8, Sq, capacity, 128, paged=True, win_left=W)
    span = capacity if W < 0 else min(capacity, Sq + W + M.GROUP_KEYS - 1)
    assert (pl.kv_lo, pl.kv) == (0, span)
    assert pl.splits * pl.chunk >= span
    # every sequence's keys, from its own split base (offset seq_len - Sq), lie in its splits
    for L in range(0, capacity + 1, max(1, capacity // 997)):
        base = M.split_base(W, L - Sq)
        assert base % M.GROUP_KEYS == 0 and base <= max(0, L - Sq - W if W >= 0 else 0)
        assert L - base <= span, (L, base)
    if W >= 0 and Sq + W + 15 < capacity:  # the plan of a sequence of the window's span
        short = M.plan("bfloat16", 4, 32, 8, Sq, span, 128, paged=True)
        assert (pl.grid, pl.splits, pl.chunk) == (short.grid, short.splits, short.chunk)


def test_supports_windows_and_softcap():
    p = types.SimpleNamespace(dtype="bfloat16", B=2, Hq=8, Hkv=2, Sq=1, Skv=100, D=128, window_left=64,
                              window_right=-1, windowed=True, softcap=30.0)
    assert M.supports("decode", p) is None


# ---------------------------------------------------------------- NumPy model of the kernel
def _cap(x, softcap):
    """attn::SoftCap::make(softcap, ln 2) on base-2 scores, as the kernel computes it."""
    cin, cout = 2 * LOG2E * LN2 / softcap, softcap / LN2
    with np.errstate(over="ignore"):
        return cout - 2 * cout / (np.exp2(x * cin) + 1)


def _row_keys(row, R, Sq, Skv, causal, off, wl, wr, k1):
    """decode::row_keys: (first, n)."""
    if row >= R:
        return 0, 0
    i = row % Sq
    first = M.first_key(i, wl, off)
    end = min(M.key_end(i, Skv, causal, off, wr), k1)
    return first, max(0, end - first)


def _model(q, k, v, Sq, Skv_b, off, causal, wl, wr, scale, softcap, S, chunk, rt, bk):
    """decode_split and the merge for one (batch, KV head): q [R, D] (row r = member r //
    Sq at position r % Sq), k, v [>= Skv_b, D]. Returns (o [R, D], lse [R], keys loaded)."""
    R, D = q.shape
    nrt = _launch.cdiv(R, rt)
    sl2 = scale * LOG2E
    work_o = np.full((R, S, D), np.nan)  # an empty split's output is never read
    work_lse = np.full((R, S), np.nan)
    loaded = 0
    for s, t_r in itertools.product(range(S), range(nrt)):
        r0 = t_r * rt
        nrows = min(rt, R - r0)
        ks = M.split_base(wl, off) + s * chunk
        k1 = min(Skv_b, ks + chunk)
        ilo, ihi = 0, Sq - 1
        if nrows < Sq:
            i0 = r0 % Sq
            if i0 + nrows <= Sq:
                ilo, ihi = i0, i0 + nrows - 1
        k0 = max(ks, M.first_key(ilo, wl, off) // 16 * 16)
        kend = max(k0, min(k1, M.key_end(ihi, Skv_b, causal, off, wr)))
        kfirst = M.first_key(ihi, wl, off)
        kfull = min(k1, M.key_end(ilo, Skv_b, causal, off, wr))
        nt = _launch.cdiv(kend - k0, bk)
        if nt == 0 and S > 1:
            work_lse[r0:r0 + nrows, s] = -np.inf
            continue
        loaded += kend - k0
        assert k0 % 16 == 0
        rows = np.arange(r0, r0 + nrows)
        m = np.full(nrows, -np.inf)
        l = np.zeros(nrows)
        acc = np.zeros((nrows, D))
        rk = [_row_keys(r, R, Sq, Skv_b, causal, off, wl, wr, k1) for r in rows]
        for t in range(nt):
            kt = k0 + t * bk
            keys = kt + np.arange(bk)
            live = keys < kend  # the ring zero-fills past kend (nothing read)
            kk = np.where(live[:, None], k[np.minimum(keys, len(k) - 1)], 0.0)
            vv = np.where(live[:, None], v[np.minimum(keys, len(v) - 1)], 0.0)
            sc = (q[rows] @ kk.T) * sl2
            if softcap > 0:
                sc = _cap(sc, softcap)
            full = kt >= kfirst and kt + bk <= kfull
            mask = np.array([[(key - f) % (1 << 32) >= n for key in keys] for f, n in rk])
            if full:
                assert not mask.any(), "a tile taken as mask-free hides a key"
            else:
                sc = np.where(mask, -np.inf, sc)
            mnew = np.maximum(m, sc.max(axis=1))
            mu = np.where(mnew == -np.inf, 0.0, mnew)
            alpha = np.exp2(m - mu)
            p = np.exp2(sc - mu[:, None])
            l = l * alpha + p.sum(axis=1)
            acc = acc * alpha[:, None] + p @ vv
            m = mnew
        with np.errstate(divide="ignore", invalid="ignore"):
            o = np.where(l[:, None] > 0, acc / l[:, None], 0.0)
            lse2 = np.where(l > 0, m + np.log2(l), -np.inf)
        work_o[rows, s] = o
        work_lse[rows, s] = lse2
    assert not np.isnan(work_lse).any(), "a split left a row's LSE unwritten"
    Mx = work_lse.max(axis=1)
    out = np.zeros((R, D))
    lse = np.full(R, -np.inf)
    for r in range(R):
        if Mx[r] == -np.inf:
            continue
        w = np.exp2(work_lse[r] - Mx[r])
        out[r] = sum(w[s] * work_o[r, s] for s in range(S) if work_lse[r, s] != -np.inf) / w.sum()
        lse[r] = (Mx[r] + np.log2(w.sum())) * LN2
    return out, lse, loaded


def _check(q4, k, v, Sq, Skv_b, off, causal, wl, wr, scale, softcap, plan_kw, splits=None):
    """q4 [1, Sq, Hq, D] against k, v [1, Skv_b, 1, D] (one KV head), the model against
    reference.attention; returns the keys the model loaded."""
    _, _, Hq, D = q4.shape
    pl = M.plan(**plan_kw)
    bk, rt = pl.bk, pl.rt
    S, chunk = pl.splits, pl.chunk
    if splits:  # another split count over the same span
        tiles = _launch.cdiv(pl.kv - pl.kv_lo, bk)
        chunk = max(1, _launch.cdiv(tiles, splits)) * bk
        S = max(1, _launch.cdiv(pl.kv - pl.kv_lo, chunk))
    rows = np.stack([q4[0, r % Sq, r // Sq] for r in range(Hq * Sq)])
    o, lse, loaded = _model(rows, k[0, :, 0], v[0, :, 0], Sq, Skv_b, off, causal, wl, wr, scale, softcap, S,
                            chunk, rt, bk)
    align = "bottom_right" if off == Skv_b - Sq else "top_left"
    assert off in (0, Skv_b - Sq)
    ref_o, ref_lse = reference.attention(q4, k, v, causal=causal, causal_align=align, scale=scale,
                                         return_lse=True, window=(wl, wr), softcap=softcap or None)
    ref_rows = np.stack([ref_o[0, r % Sq, r // Sq] for r in range(Hq * Sq)])
    ref_l = np.array([ref_lse[0, r // Sq, r % Sq] for r in range(Hq * Sq)])
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_l))
    fin = ~np.isneginf(ref_l)
    np.testing.assert_allclose(lse[fin], ref_l[fin], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(o, ref_rows, rtol=1e-9, atol=1e-9)
    return loaded


CASES = [
    # (Skv, Sq, Hq, causal, align, wl, wr, softcap)
    (1000, 1, 4, True, "bottom_right", 100, -1, 0.0),
    (1000, 1, 4, True, "bottom_right", 100, -1, 5.0),
    (1000, 4, 4, True, "bottom_right", 0, -1, 0.0),
    (700, 16, 2, False, "bottom_right", 37, 5, 2.0),
    (300, 16, 1, True, "top_left", 3, -1, 0.0),
    (300, 3, 8, False, "top_left", -1, 7, 0.0),
    (300, 3, 8, False, "top_left", -1, -1, 1.5),
    (200, 5, 4, False, "top_left", 250, 250, 0.0),
    (64, 16, 1, False, "bottom_right", 0, 0, 0.0),
    (5000, 2, 4, True, "bottom_right", 1500, -1, 30.0),
    (129, 7, 3, True, "bottom_right", 40, -1, 0.5),
    (129, 7, 3, True, "top_left", 40, -1, 0.0),
    (10, 16, 2, True, "bottom_right", 2, -1, 0.0),  # rows that see nothing
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("Skv, Sq, Hq, causal, align, wl, wr, softcap", CASES)
def test_kernel_model_matches_reference(dtype, Skv, Sq, Hq, causal, align, wl, wr, softcap):
    rng = np.random.default_rng(Skv * 31 + Sq * 7 + Hq + wl)
    D = 16
    q = rng.standard_normal((1, Sq, Hq, D)) * 2
    k = rng.standard_normal((1, Skv, 1, D))
    v = rng.standard_normal((1, Skv, 1, D))
    off = Skv - Sq if align == "bottom_right" else 0
    scale = 0.7
    kw = dict(dtype=dtype, B=1, Hq=Hq, Hkv=1, Sq=Sq, Skv=Skv, D=D, causal=causal, causal_offset=off,
              sm_count=132, win_left=wl, win_right=wr)
    for splits in (None, 1, 2, 5):
        loaded = _check(q, k, v, Sq, Skv, off, causal, wl, wr, scale, softcap, kw, splits)
        if wl >= 0 and causal and align == "bottom_right":
            # only the window's keys (+ a group's rounding a row tile) are loaded
            rows = Hq * Sq
            nrt = _launch.cdiv(rows, M.plan(**kw).rt)
            assert loaded <= nrt * (wl + Sq + M.GROUP_KEYS - 1), loaded


@pytest.mark.parametrize("Sq, Hq, capacity, causal, wl, softcap", [
    (1, 4, 512, True, 100, 0.0), (4, 4, 512, True, 31, 3.0), (16, 2, 256, False, 17, 0.0),
    (2, 8, 1024, True, -1, 10.0), (3, 4, 300, True, 0, 0.0),
])
def test_paged_kernel_model_matches_reference(Sq, Hq, capacity, causal, wl, softcap):
    # The paged kernel: the plan is made for the table's capacity (or the window's span), and
    # each sequence's offset and split base come from its own length.
    rng = np.random.default_rng(capacity + Sq + wl)
    D = 16
    kw = dict(dtype="bfloat16", B=3, Hq=Hq, Hkv=1, Sq=Sq, Skv=capacity, D=D, paged=True, sm_count=132,
              win_left=wl)
    pl = M.plan(**kw)
    k = rng.standard_normal((1, capacity, 1, D))
    v = rng.standard_normal((1, capacity, 1, D))
    for L in sorted({0, 1, Sq, 5, 17, capacity // 3, capacity - 1, capacity}):
        if L < Sq:
            continue
        q = rng.standard_normal((1, Sq, Hq, D))
        loaded = _check(q, k[:, :L], v[:, :L], Sq, L, L - Sq, causal, wl, -1, 0.5, softcap, kw)
        if wl >= 0:  # each row tile of the KV head reads the window once
            assert loaded <= pl.nrt * (wl + Sq + M.GROUP_KEYS - 1), (L, loaded)
        assert pl.splits * pl.chunk >= L - M.split_base(wl, L - Sq)


def test_cap_matches_tanh():
    x = np.linspace(-200, 200, 4001)
    for c in (0.5, 5.0, 50.0):
        np.testing.assert_allclose(_cap(x, c) * LN2, c * np.tanh(x * LN2 / c), atol=1e-12 * c)
    assert math.isclose(_cap(np.float64(-np.inf), 5.0), -5.0 / LN2)  # why the mask comes after the cap
