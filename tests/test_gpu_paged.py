"""GPU tier for the paged-KV operators (cupyops/ops/paged.py): attention_paged against the
float64 reference, kv_cache_append then attention_paged against attention() on the
contiguous equivalent, merge_attention_states of two halves against the whole, the
documented handling of bad GPU-resident values, torch tensors, the fast path and CUDA-graph
capture.

Caches are built with each sequence's pages in shuffled order; every slot and page no
sequence uses holds NaN and every table entry past a sequence's pages holds garbage, so a
kernel that reads anything it should not fails. Outputs are poisoned with NaN before the
out= calls. CuPy is imported inside the tests only (see conftest.py)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cupyops
from cupyops import _dtypes, reference
from cupyops.ops import _attention_decode as M
from test_gpu_attention import check_lse

pytestmark = pytest.mark.gpu

HYPO = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
I32 = np.int32
LENS = [1, 2, 15, 16, 17, 64, 100, 255, 257, 1000, 1823]
HEADS = [(1, 1), (4, 4), (4, 2), (8, 1), (6, 3), (32, 8)]  # (q_heads, kv_heads): MHA, GQA, MQA
HEAD_DIMS = [1, 3, 40, 64, 80, 128, 256]  # 1 and 3: rows not a multiple of 16 bytes (element loads)


def _cp():
    import cupy

    return cupy


def cdiv(a, b):
    return -(-a // b)


# ---------------------------------------------------------------------------- operands
def build_cache(rng, dtype, lens, P, Hkv, D, spare=2, extra_cols=0):
    """Host (k_cache, v_cache, block_table): len_b random tokens a sequence in pages taken
    in shuffled order; unused slots and pages NaN, unused table entries garbage."""
    t = _dtypes.to_dtype(dtype)
    need = [cdiv(int(n), P) for n in lens]
    num_pages = sum(need) + spare
    order = rng.permutation(num_pages)
    kc = np.full((num_pages, P, Hkv, D), np.nan, np.float32)
    vc = np.full((num_pages, P, Hkv, D), np.nan, np.float32)
    width = max(1, max(need, default=0) + extra_cols)
    table = rng.integers(-2**31, 2**31 - 1, (len(lens), width)).astype(I32)
    at = 0
    for b, n in enumerate(lens):
        for p in range(need[b]):
            page = int(order[at])
            at += 1
            table[b, p] = page
            m = min(P, int(n) - p * P)
            kc[page, :m] = rng.standard_normal((m, Hkv, D))
            vc[page, :m] = rng.standard_normal((m, Hkv, D))
    return kc.astype(t), vc.astype(t), table


def place_caches(kc, vc, view, cp):
    """The caches on the device: separate arrays, the K and V halves of one [num_pages, 2,
    page_size, ...] buffer (FlashInfer's layout), or starting one element off a 16-byte
    boundary (the kernel's element loads)."""
    if view == "separate":
        return cp.asarray(kc), cp.asarray(vc)
    if view == "halves":
        buf = cp.asarray(np.stack([kc, vc], axis=1))
        return buf[:, 0], buf[:, 1]
    if view == "offset":
        out = []
        for c in (kc, vc):
            flat = cp.full(c.size + 1, np.nan, c.dtype)
            flat[1:] = cp.asarray(c).ravel()
            out.append(flat[1:].reshape(c.shape))
        return tuple(out)
    raise ValueError(view)


def place_q(q, view, cp):
    if view == "contiguous":
        return cp.asarray(q)
    if view == "heads":  # every other head of a buffer with twice the heads
        buf = np.full(q.shape[:2] + (2 * q.shape[2],) + q.shape[3:], np.nan, q.dtype)
        buf[:, :, ::2] = q
        return cp.asarray(buf)[:, :, ::2]
    if view == "offset":
        flat = cp.full(q.size + 1, np.nan, q.dtype)
        flat[1:] = cp.asarray(q).ravel()
        return flat[1:].reshape(q.shape)
    raise ValueError(view)


def check_out(got, ref, dtype, what, no_key=None):
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    assert got.dtype == _dtypes.to_dtype(dtype) and got.shape == ref.shape, f"{what}: {got.dtype} {got.shape}"
    got = got.astype(np.float64)
    err = reference.rel_error(got, ref)
    tol = reference.TOLERANCE["attention"][dtype]
    assert err <= tol, f"{what}: rel error {err:.3g} > {tol:.3g}"
    if no_key is not None and no_key.any():
        assert np.all(got[no_key] == 0), f"{what}: a row that sees no key is not exactly 0"


def run_paged(dtype, lens, Sq, Hq, Hkv, D, P, causal=True, scale=None, cache_view="separate",
              q_view="contiguous", extra_cols=0, seed=0, window=None, softcap=None):
    """One case, twice: a plain call, and into a NaN-poisoned out= with the LSE."""
    cp = _cp()
    rng = np.random.default_rng(seed)
    kc, vc, table = build_cache(rng, dtype, lens, P, Hkv, D, extra_cols=extra_cols)
    q = rng.standard_normal((len(lens), Sq, Hq, D)).astype(_dtypes.to_dtype(dtype))
    lens = np.asarray(lens, I32)
    ref, ref_lse = reference.attention_paged(q, kc, vc, table, lens, causal=causal, scale=scale, return_lse=True,
                                             window=window, softcap=softcap)
    # [batch, q_len]: rows that see no key (causal rows before the sequence's first token,
    # rows a window leaves none)
    no_key = np.isneginf(ref_lse).all(axis=1)
    dq = place_q(q, q_view, cp)
    dk, dv = place_caches(kc, vc, cache_view, cp)
    dt, dl = cp.asarray(table), cp.asarray(lens)
    what = (f"{dtype} lens={lens.tolist()} Sq={Sq} heads={Hq}/{Hkv} D={D} P={P} causal={causal} scale={scale} "
            f"window={window} softcap={softcap} {cache_view} q:{q_view} +{extra_cols} pages")
    kw = dict(causal=causal, scale=scale, window=window, softcap=softcap)
    got = cupyops.attention_paged(dq, dk, dv, dt, dl, **kw)
    check_out(got, ref, dtype, what, no_key)
    out = cp.full(q.shape, np.nan, q.dtype)
    res, lse = cupyops.attention_paged(dq, dk, dv, dt, dl, out=out, return_lse=True, **kw)
    assert res is out
    check_out(out, ref, dtype, what + " out=", no_key)
    check_lse(lse, ref_lse, what)


# ---------------------------------------------------------------------------- attention_paged
@st.composite
def paged_cases(draw):
    B = draw(st.sampled_from([1, 2, 3, 5]))
    Hq, Hkv = draw(st.sampled_from(HEADS))
    Sq, D = draw(st.sampled_from([1, 1, 2, 5, 16])), draw(st.sampled_from(HEAD_DIMS))
    # at least 8 output numbers: the norm-wise relative error of a handful of weighted sums
    # that happen to lie near zero (a flat softmax over random values) measures their
    # cancellation, not the kernel (one number: 6 % at bf16 in one draw)
    assume(B * Sq * Hq * D >= 8)
    return dict(
        lens=draw(st.lists(st.sampled_from(LENS), min_size=B, max_size=B)),
        Sq=Sq, Hq=Hq, Hkv=Hkv, D=D,
        P=draw(st.sampled_from(M.PAGE_SIZES)), causal=draw(st.booleans()),
        scale=draw(st.sampled_from([None, None, 0.5, -0.7])),
        cache_view=draw(st.sampled_from(["separate", "separate", "halves", "offset"])),
        q_view=draw(st.sampled_from(["contiguous", "heads", "offset"])),
        extra_cols=draw(st.sampled_from([0, 0, 1, 3])), seed=draw(st.integers(0, 2**31 - 1)))


@pytest.mark.parametrize("dtype", M.PAGED_DTYPES)
@HYPO
@given(case=paged_cases())
def test_paged_matches_reference(dtype, case):
    run_paged(dtype, **case)


# Cases that reach the split and merge path: one long sequence split across the GPU; a
# long and a short one (most of the short one's splits past its end: empty blocks); a table
# far wider than the sequences (planned for its capacity); every row of a 16-token query
# group seeing nothing; the largest page and head_dim.
FIXED = [
    # lens, Sq, Hq, Hkv, D, P, extra_cols
    ([5000], 1, 32, 8, 128, 16, 0),
    ([4000, 3], 1, 8, 1, 128, 64, 0),
    ([100, 50, 1], 2, 4, 2, 64, 16, 200),
    ([5, 40], 16, 8, 2, 128, 32, 0),
    ([2000, 700], 4, 16, 4, 256, 256, 1),
    ([12000], 1, 4, 1, 80, 128, 0),
]


@pytest.mark.parametrize("dtype", M.PAGED_DTYPES)
@pytest.mark.parametrize("i", range(len(FIXED)))
def test_paged_fixed_cases(dtype, i):
    lens, Sq, Hq, Hkv, D, P, extra = FIXED[i]
    run_paged(dtype, lens, Sq, Hq, Hkv, D, P, causal=True, extra_cols=extra, seed=i)
    run_paged(dtype, lens, Sq, Hq, Hkv, D, P, causal=False, cache_view="halves", extra_cols=extra, seed=i)


def test_bad_device_values_are_clamped_or_read_as_zeros():
    # seq_lens above the table's capacity count as the capacity, below 0 as 0; a table
    # entry a sequence uses that is not a page of the cache reads as a page of zeros
    cp = _cp()
    rng = np.random.default_rng(11)
    P, width, Hq, Hkv, D = 16, 3, 4, 2, 64
    lens_ref = np.array([48, 0, 20, 30], I32)
    kc, vc, table = build_cache(rng, "bfloat16", lens_ref, P, Hkv, D)
    assert table.shape[1] == width
    table[2, 1], table[3, 1] = -3, 10**6
    zero = kc.shape[0]  # the reference's page of zeros
    ref_table = table.copy()
    ref_table[2, 1] = ref_table[3, 1] = zero
    kz = np.concatenate([kc, np.zeros_like(kc[:1])])
    vz = np.concatenate([vc, np.zeros_like(vc[:1])])
    q = rng.standard_normal((4, 2, Hq, D)).astype(kc.dtype)
    ref, ref_lse = reference.attention_paged(q, kz, vz, ref_table, lens_ref, return_lse=True)
    out, lse = cupyops.attention_paged(cp.asarray(q), cp.asarray(kc), cp.asarray(vc), cp.asarray(table),
                                       cp.asarray(np.array([1000, -5, 20, 30], I32)), return_lse=True)
    check_out(out, ref, "bfloat16", "clamped", np.array([[False] * 2, [True] * 2, [False] * 2, [False] * 2]))
    check_lse(lse, ref_lse, "clamped")


# ---------------------------------------------------------------------------- packed chunked prefill
def run_packed(dtype, lens, chunks, Hq, Hkv, D, P, causal=True, window=None, softcap=None, cache_view="separate",
               extra_cols=0, seed=0, max_q=True, host=False):
    """attention_paged with cu_seqlens_q: sequence b's last chunks[b] tokens (packed, with two
    NaN rows outside every sequence at the end of q) against the float64 reference; a
    plain call (zeros on the outside rows), then into a NaN-poisoned out= with the LSE (the
    outside rows left as they were). ``max_q``: max_seqlen_q given (with device operands
    nothing is read on the host); ``host``: NumPy operands (the gather sized by the lengths'
    sum, not the table's capacity)."""
    cp = _cp()
    rng = np.random.default_rng(seed)
    t = _dtypes.to_dtype(dtype)
    kc, vc, table = build_cache(rng, dtype, lens, P, Hkv, D, extra_cols=extra_cols)
    cu = np.concatenate([[0], np.cumsum(chunks)]).astype(I32)
    total = int(cu[-1])
    q = rng.standard_normal((total + 2, Hq, D)).astype(t)
    q[total:] = np.nan
    lens = np.asarray(lens, I32)
    kw = dict(causal=causal, window=window, softcap=softcap)
    ref, ref_lse = reference.attention_paged(q, kc, vc, table, lens, return_lse=True, cu_seqlens_q=cu, **kw)
    no_key = np.isneginf(ref_lse).all(axis=0)
    what = (f"{dtype} lens={lens.tolist()} chunks={list(chunks)} heads={Hq}/{Hkv} D={D} P={P} causal={causal} "
            f"window={window} softcap={softcap} {cache_view} +{extra_cols} max_q={max_q} host={host}")
    if max_q:
        kw["max_seqlen_q"] = int(max(chunks, default=0))
    if host:
        args = (q, kc, vc, table, lens)
        cuq = cu
    else:
        dk, dv = place_caches(kc, vc, cache_view, cp)
        args = (cp.asarray(q), dk, dv, cp.asarray(table), cp.asarray(lens))
        cuq = cp.asarray(cu)
    got = cupyops.attention_paged(*args, cu_seqlens_q=cuq, impl="gather", **kw)
    check_out(got, ref, dtype, what, no_key)
    out = np.full(q.shape, np.nan, t) if host else cp.full(q.shape, np.nan, t)
    res, lse = cupyops.attention_paged(*args, cu_seqlens_q=cuq, out=out, return_lse=True, **kw)
    assert res is out
    got = out if host else out.get()
    assert np.isnan(got[total:].astype(np.float32)).all(), f"{what}: out= rows outside every sequence written"
    check_out(got[:total], ref[:total], dtype, what + " out=", no_key[:total])
    check_lse(lse[:, :total], ref_lse[:, :total], what)


@st.composite
def packed_cases(draw):
    B = draw(st.sampled_from([1, 2, 3, 5]))
    Hq, Hkv = draw(st.sampled_from(HEADS))
    lens = draw(st.lists(st.sampled_from(LENS), min_size=B, max_size=B))
    # a chunk up to its sequence's length, or longer (its first rows then see no key)
    chunks = [draw(st.sampled_from([0, 1, 7, min(n, 300), n, n + 3])) for n in lens]
    D = draw(st.sampled_from([64, 128, 40, 3]))
    assume(sum(chunks) * Hq * D >= 8 or not sum(chunks))  # (as paged_cases: no handful of numbers)
    return dict(lens=lens, chunks=chunks, Hq=Hq, Hkv=Hkv, D=D,
                P=draw(st.sampled_from(M.PAGE_SIZES)), causal=draw(st.booleans()),
                window=draw(st.sampled_from([None, None, (30, 0), (100, 5)])),
                softcap=draw(st.sampled_from([None, None, 20.0])),
                cache_view=draw(st.sampled_from(["separate", "halves", "offset"])),
                extra_cols=draw(st.sampled_from([0, 2])), seed=draw(st.integers(0, 2**31 - 1)),
                max_q=draw(st.booleans()))


@pytest.mark.parametrize("dtype", _dtypes.FLOAT_TYPES)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=packed_cases())
def test_packed_prefill_matches_reference(dtype, case):
    run_packed(dtype, **case)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_packed_prefill_fixed_and_host(dtype):
    # a chunked prefill of the kind (1024 new tokens on 3072 cached, GQA, head_dim
    # 128: flash3 runs it on sm_90), a sequence with nothing new, and the same on NumPy
    run_packed(dtype, [4096, 50, 700], [1024, 0, 700], 32, 8, 128, 16, seed=1)
    run_packed(dtype, [4096, 50, 700], [1024, 0, 700], 32, 8, 128, 256, causal=False, max_q=False, seed=2)
    run_packed(dtype, [17, 300], [5, 300], 4, 2, 64, 16, host=True, seed=3)


def test_packed_prefill_bad_device_values():
    # device lengths above the capacity count as the capacity, below 0 as 0; a page entry
    # outside the cache reads as zeros (as decode reads them)
    cp = _cp()
    rng = np.random.default_rng(13)
    P, Hq, Hkv, D = 16, 4, 2, 64
    lens_ref = np.array([48, 0, 20], I32)
    kc, vc, table = build_cache(rng, "bfloat16", lens_ref, P, Hkv, D)
    table[2, 1] = -3
    ref_table = table.copy()
    ref_table[2, 1] = kc.shape[0]
    kz = np.concatenate([kc, np.zeros_like(kc[:1])])
    vz = np.concatenate([vc, np.zeros_like(vc[:1])])
    cu = np.array([0, 4, 6, 9], I32)
    q = rng.standard_normal((9, Hq, D)).astype(kc.dtype)
    ref, ref_lse = reference.attention_paged(q, kz, vz, ref_table, lens_ref, return_lse=True, cu_seqlens_q=cu)
    out, lse = cupyops.attention_paged(cp.asarray(q), cp.asarray(kc), cp.asarray(vc), cp.asarray(table),
                                       cp.asarray(np.array([1000, -5, 20], I32)), cu_seqlens_q=cp.asarray(cu),
                                       max_seqlen_q=4, return_lse=True)
    check_out(out, ref, "bfloat16", "clamped", np.isneginf(ref_lse).all(axis=0))
    check_lse(lse, ref_lse, "clamped")


# ---------------------------------------------------------------------------- kv_cache_append
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_append_then_attend_equals_attention_on_the_contiguous_cache(dtype):
    cp = _cp()
    rng = np.random.default_rng(12)
    t = _dtypes.to_dtype(dtype)
    prompts, steps, Hq, Hkv, D, P = [37, 100, 5], 3, 8, 2, 128, 16
    B, total = len(prompts), max(prompts) + steps + 4
    k = rng.standard_normal((B, total, Hkv, D)).astype(t)
    v = rng.standard_normal((B, total, Hkv, D)).astype(t)
    width = cdiv(total, P)
    num_pages = B * width + 2
    table = rng.permutation(num_pages)[:B * width].reshape(B, width).astype(I32)
    kc = cp.full((num_pages, P, Hkv, D), np.nan, t)
    vc = cp.full((num_pages, P, Hkv, D), np.nan, t)
    dtab = cp.asarray(table)
    for b, n in enumerate(prompts):  # prefill: one sequence at a time (its own length)
        assert cupyops.kv_cache_append(kc, vc, cp.asarray(k[b:b + 1, :n]), cp.asarray(v[b:b + 1, :n]),
                                       dtab[b:b + 1], cp.asarray(np.zeros(1, I32))) is None
    lens = np.array(prompts, I32)
    for step, n_new in enumerate([1] * steps + [4]):  # decode steps, then 4 tokens at once (speculative)
        new_k = np.stack([k[b, lens[b]:lens[b] + n_new] for b in range(B)])
        new_v = np.stack([v[b, lens[b]:lens[b] + n_new] for b in range(B)])
        cupyops.kv_cache_append(kc, vc, cp.asarray(new_k), cp.asarray(new_v), dtab, cp.asarray(lens))
        lens = lens + n_new
        q = rng.standard_normal((B, n_new, Hq, D)).astype(t)
        got, lse = cupyops.attention_paged(cp.asarray(q), kc, vc, dtab, cp.asarray(lens), return_lse=True)
        for b in range(B):
            n = int(lens[b])
            want, want_lse = cupyops.attention(cp.asarray(q[b:b + 1]), cp.asarray(k[b:b + 1, :n]),
                                               cp.asarray(v[b:b + 1, :n]), causal=True, causal_align="bottom_right",
                                               return_lse=True, impl="decode")
            ref, ref_lse = reference.attention(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=True,
                                               causal_align="bottom_right", return_lse=True)
            what = f"{dtype} step {step} seq {b} len {n}"
            check_out(got[b:b + 1], ref, dtype, what)
            check_lse(lse[b:b + 1], ref_lse, what)
            # the contiguous decode rung: the same math in the same order up to the split plan
            diff = float(cp.abs(got[b:b + 1].astype(cp.float32) - want.astype(cp.float32)).max())
            assert diff <= 2 * float(cp.abs(want.astype(cp.float32)).max()) * 2.0**-7, what
            check_lse(want_lse, ref_lse, what + " (contiguous)")


@pytest.mark.parametrize("dtype", _dtypes.FLOAT_TYPES)
def test_append_writes_exactly_its_slots_and_skips_bad_values(dtype):
    cp = _cp()
    rng = np.random.default_rng(13)
    t = _dtypes.to_dtype(dtype)
    B, N, H, D, P, num_pages = 4, 5, 2, 40, 16, 9
    kc = rng.standard_normal((num_pages, P, H, D)).astype(t)
    vc = rng.standard_normal((num_pages, P, H, D)).astype(t)
    k = rng.standard_normal((B, N, H, D)).astype(t)
    v = rng.standard_normal((B, N, H, D)).astype(t)
    table = np.array([[3, 1, 7], [0, 2, 4], [5, -1, 6], [8, 10**7, 8]], I32)
    # sequence 0 crosses a page; 1 runs off the table's end (last 2 skipped); 2 and 3 hit a
    # bad entry (skipped) after 3 and 1 good tokens; positions on the device, unchecked
    positions = np.array([14, 46, 13, 15], I32)
    want_k, want_v = reference.kv_cache_append(kc, vc, k, v, table, positions)
    for view in ("separate", "halves", "offset"):
        dk, dv = place_caches(kc, vc, view, cp)
        cupyops.kv_cache_append(dk, dv, cp.asarray(k), cp.asarray(v), cp.asarray(table), cp.asarray(positions))
        assert np.array_equal(dk.get().view(np.uint8), want_k.view(np.uint8)), view
        assert np.array_equal(dv.get().view(np.uint8), want_v.view(np.uint8)), view
    # host arrays: checked first (that table would raise), then written in place
    kh, vh = kc.copy(), vc.copy()
    good = np.array([[3, 1, 7], [0, 2, 4], [5, 6, 7], [8, 0, 8]], I32)  # no slot written twice
    pos = np.array([14, 40, 13, 15], I32)
    assert cupyops.kv_cache_append(kh, vh, k, v, good, pos) is None
    want_k, want_v = reference.kv_cache_append(kc, vc, k, v, good, pos)
    assert np.array_equal(kh.view(np.uint8), want_k.view(np.uint8))
    assert np.array_equal(vh.view(np.uint8), want_v.view(np.uint8))


# ---------------------------------------------------------------------------- merge
@pytest.mark.parametrize("dtype", _dtypes.FLOAT_TYPES)
def test_merge_of_two_halves_equals_attention_over_the_whole(dtype):
    cp = _cp()
    rng = np.random.default_rng(14)
    t = _dtypes.to_dtype(dtype)
    B, Hq, Hkv, D, S, cut = 4, 8, 2, 128, 300, 100
    q = cp.asarray(rng.standard_normal((B, 1, Hq, D)).astype(t))
    k = cp.asarray(rng.standard_normal((B, S, Hkv, D)).astype(t))
    v = cp.asarray(rng.standard_normal((B, S, Hkv, D)).astype(t))
    o, lse = cupyops.attention(q, k, v, return_lse=True)
    oa, la = cupyops.attention(q, k[:, :cut], v[:, :cut], return_lse=True)
    ob, lb = cupyops.attention(q, k[:, cut:], v[:, cut:], return_lse=True)
    ref_o, ref_lse = reference.attention(q, k, v, return_lse=True)
    args = (oa[:, 0], la[..., 0], ob[:, 0], lb[..., 0])
    mo, ml = cupyops.merge_attention_states(*args)
    assert mo.dtype == t and mo.shape == (B, Hq, D) and ml.dtype == np.float32 and ml.shape == (B, Hq)
    check_out(mo, ref_o[:, 0], dtype, "merge vs whole")
    check_lse(ml, ref_lse[..., 0], "merge vs whole")
    # against the reference merge of the same (rounded) halves: only float32 math apart
    want_o, want_lse = reference.merge_attention_states(*args)
    assert reference.rel_error(mo, want_o) <= {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    assert np.allclose(ml.get(), want_lse, rtol=1e-6, atol=1e-6)
    # any strides: a transposed LSE, o one element off a 16-byte boundary (element loads)
    la_t = cp.ascontiguousarray(la[..., 0].T).T
    flat = cp.full(oa[:, 0].size + 1, np.nan, t)
    flat[1:] = oa[:, 0].ravel()
    mo2, ml2 = cupyops.merge_attention_states(flat[1:].reshape(B, Hq, D), la_t, ob[:, 0], lb[..., 0])
    assert np.array_equal(mo2.get().view(np.uint8), mo.get().view(np.uint8))
    assert np.array_equal(ml2.get(), ml.get())
    # a side that saw no key leaves the other bit for bit, whatever its o holds; both: 0, -inf
    none = cp.full((B, Hq), -np.inf, np.float32)
    junk = cp.full((B, Hq, D), np.nan, t)
    so, sl = cupyops.merge_attention_states(junk, none, ob[:, 0], lb[..., 0])
    assert np.array_equal(so.get().view(np.uint8), cp.ascontiguousarray(ob[:, 0]).get().view(np.uint8))
    assert np.array_equal(sl.get(), lb[..., 0].get())
    zo, zl = cupyops.merge_attention_states(junk, none, junk, none)
    assert not bool(cp.any(zo != 0)) and bool(cp.all(cp.isneginf(zl)))
    # NumPy in, NumPy out
    ho, hl = cupyops.merge_attention_states(*(a.get() for a in args))
    assert isinstance(ho, np.ndarray) and np.array_equal(ho.view(np.uint8), mo.get().view(np.uint8))
    assert np.array_equal(hl, ml.get())


# ---------------------------------------------------------------------------- host, fast path, torch
def test_numpy_in_numpy_out():
    rng = np.random.default_rng(15)
    lens = [33, 7]
    kc, vc, table = build_cache(rng, "float16", lens, 16, 2, 64)
    q = rng.standard_normal((2, 3, 4, 64)).astype(np.float16)
    ref, ref_lse = reference.attention_paged(q, kc, vc, table, np.array(lens, I32), return_lse=True)
    out, lse = cupyops.attention_paged(q, kc, vc, table, np.array(lens, I32), return_lse=True)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    check_out(out, ref, "float16", "numpy")
    check_lse(lse, ref_lse, "numpy")


def test_fast_path_reads_the_current_device_values():
    # the second call of a signature is the memoized fast call: it must read seq_lens and
    # the table anew (nothing about them is remembered but their layout)
    cp = _cp()
    rng = np.random.default_rng(16)
    lens = np.array([300, 20, 150], I32)
    kc, vc, table = build_cache(rng, "bfloat16", lens, 16, 2, 128)
    q = cp.asarray(rng.standard_normal((3, 1, 8, 128)).astype(kc.dtype))
    dk, dv, dt, dl = cp.asarray(kc), cp.asarray(vc), cp.asarray(table), cp.asarray(lens)
    first = cupyops.attention_paged(q, dk, dv, dt, dl)
    again = cupyops.attention_paged(q, dk, dv, dt, dl)
    assert np.array_equal(first.get().view(np.uint16), again.get().view(np.uint16))
    shorter = np.array([17, 20, 1], I32)
    dl[...] = cp.asarray(shorter)
    got = cupyops.attention_paged(q, dk, dv, dt, dl)
    check_out(got, reference.attention_paged(q, kc, vc, table, shorter), "bfloat16", "fast path, new lengths")


def test_torch_tensors_and_cuda_graph_capture():
    torch = pytest.importorskip("torch")
    cp = _cp()
    rng = np.random.default_rng(17)
    B, Hq, Hkv, D, P = 3, 8, 2, 128, 16
    lens = np.array([40, 17, 90], I32)
    kc, vc, table = build_cache(rng, "bfloat16", lens + 1, P, Hkv, D, extra_cols=1)  # room for a token more
    t = lambda a: torch.from_dlpack(cp.asarray(a))  # noqa: E731 - a CUDA tensor of a host array
    tq = t(rng.standard_normal((B, 1, Hq, D)).astype(kc.dtype))
    tkc, tvc, ttab, tlens = t(kc), t(vc), t(table), t(lens)
    got = cupyops.attention_paged(tq, tkc, tvc, ttab, tlens)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16 and got.shape == (B, 1, Hq, D)
    want = cupyops.attention_paged(*(cp.from_dlpack(x) for x in (tq, tkc, tvc, ttab, tlens)))
    assert torch.equal(got, torch.from_dlpack(want))
    assert torch.equal(cupyops.attention_paged(tq, tkc, tvc, ttab, tlens), got)  # the fast call
    o, lse = cupyops.attention_paged(tq, tkc, tvc, ttab, tlens, return_lse=True)
    mo, ml = cupyops.merge_attention_states(o[:, 0], lse[..., 0], o[:, 0], lse[..., 0])
    assert isinstance(mo, torch.Tensor) and isinstance(ml, torch.Tensor) and ml.dtype == torch.float32
    assert torch.allclose(mo.float(), o[:, 0].float(), rtol=1e-2, atol=1e-2)
    assert torch.allclose(ml, lse[..., 0] + float(np.log(2)), rtol=1e-5, atol=1e-5)

    # one decode step (append the new token, attend) captured in a graph, replayed on new values
    tk_new = t(rng.standard_normal((B, 1, Hkv, D)).astype(kc.dtype))
    tv_new = t(rng.standard_normal((B, 1, Hkv, D)).astype(kc.dtype))
    tpos = t(lens)
    tlen1 = t(lens + 1)

    def step():
        cupyops.kv_cache_append(tkc, tvc, tk_new, tv_new, ttab, tpos)
        return cupyops.attention_paged(tq, tkc, tvc, ttab, tlen1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph asks
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    # new values in the same tensors: other queries and tokens, one position earlier
    g = torch.Generator(device="cpu").manual_seed(3)
    for x in (tq, tk_new, tv_new):
        x.copy_(torch.randn(x.shape, generator=g).to(x.device, x.dtype))
    tpos.copy_(t(lens - 1))
    tlen1.copy_(t(lens))
    graph.replay()
    torch.cuda.synchronize()
    kc2, vc2 = reference.kv_cache_append(kc, vc, tk_new.cpu().view(torch.int16).numpy().view(kc.dtype),
                                         tv_new.cpu().view(torch.int16).numpy().view(kc.dtype), table, lens - 1)
    ref = reference.attention_paged(tq.cpu().view(torch.int16).numpy().view(kc.dtype), kc2, vc2, table, lens)
    check_out(cp.from_dlpack(out), ref, "bfloat16", "graph replay")
