"""CPU tier for the paged-KV operators (cupyops/ops/paged.py): every bad argument of
attention_paged, kv_cache_append and merge_attention_states raises a TypeError/ValueError
naming it before anything touches a GPU (NumPy operands: no CuPy needed), host block
tables / lengths / positions are checked on the host; registration and instantiations; the
paged launch plan; the group-of-16-keys arithmetic the paged kernel's addressing relies
on; and the float64 references against the contiguous ones (gathered pages, append then
attend, merge of two halves)."""
import itertools

import numpy as np
import pytest

import cupyops
from cupyops import _dtypes, reference
from cupyops.ops import _attention_decode as M
from cupyops.ops import paged

F16 = np.float16
I32 = np.int32


def case(B=2, Sq=1, Hq=4, Hkv=2, D=8, P=16, num_pages=6, max_pages=3, dtype=F16):
    """Valid NumPy arguments of attention_paged: q, k_cache, v_cache, block_table, seq_lens."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, Sq, Hq, D)).astype(dtype)
    kc = rng.standard_normal((num_pages, P, Hkv, D)).astype(dtype)
    vc = rng.standard_normal((num_pages, P, Hkv, D)).astype(dtype)
    table = (np.arange(B * max_pages) % num_pages).reshape(B, max_pages).astype(I32)
    lens = np.full(B, P + 1, I32)
    return q, kc, vc, table, lens


Q, KC, VC, TABLE, LENS = case()


# ------------------------------------------------------------------ attention_paged errors
@pytest.mark.parametrize("call, exc, match", [
    (lambda: cupyops.attention_paged(Q.astype(np.float32), KC, VC, TABLE, LENS), TypeError,
     r"^q: attention_paged supports float16, bfloat16, got float32"),
    (lambda: cupyops.attention_paged(Q.astype(np.int32), KC, VC, TABLE, LENS), TypeError, r"^q: dtype int32"),
    (lambda: cupyops.attention_paged(Q[0], KC, VC, TABLE, LENS), ValueError, r"^q: expected a 4-D array"),
    (lambda: cupyops.attention_paged(case(Sq=17)[0], KC, VC, TABLE, LENS), ValueError,
     r"^q: q_len \(axis 1\) must be in 1..16 \(decode\), got 17; for longer chunks pass q packed"),
    (lambda: cupyops.attention_paged(Q, KC.astype(np.float32), VC, TABLE, LENS), TypeError,
     r"^k_cache: dtype float32 does not match q's float16"),
    (lambda: cupyops.attention_paged(Q, KC, VC[:, :, :1], TABLE, LENS), ValueError,
     r"^v_cache: expected k_cache's shape"),
    (lambda: cupyops.attention_paged(Q, KC[None], VC[None], TABLE, LENS), ValueError,
     r"^k_cache: expected a 4-D array"),
    (lambda: cupyops.attention_paged(*case(P=24)), ValueError,
     r"^k_cache: page_size \(axis 1\) must be a power of two in 16..256, got 24"),
    (lambda: cupyops.attention_paged(*case(P=8)), ValueError, r"^k_cache: page_size .* got 8"),
    (lambda: cupyops.attention_paged(*case(P=512, num_pages=2)), ValueError, r"^k_cache: page_size .* got 512"),
    (lambda: cupyops.attention_paged(Q, case(D=16)[1], case(D=16)[2], TABLE, LENS), ValueError,
     r"^k_cache: head_dim 16 does not match q's 8"),
    (lambda: cupyops.attention_paged(case(Hq=3)[0], KC, VC, TABLE, LENS), ValueError,
     r"^k_cache: kv_heads \(2\) must divide q_heads \(3\)"),
    (lambda: cupyops.attention_paged(*case(D=300)), ValueError, r"^q: head_dim must be in 1..256, got 300"),
    (lambda: cupyops.attention_paged(Q, KC[:0], VC[:0], TABLE, LENS), ValueError,
     r"^k_cache: needs at least one page"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE.astype(np.int64), LENS), TypeError,
     r"^block_table: expected int32, got int64"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE[0], LENS), ValueError, r"^block_table: expected a 2-D"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, window=(None, "0")), TypeError,
     r"^window: the right side must be an int or None, got str"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, softcap=float("nan")), ValueError,
     r"^softcap: must be a finite float32 >= 0"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE[:1], LENS), ValueError,
     r"^block_table: expected 2 rows \(q's batch\)"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS.astype(np.uint32)), TypeError,
     r"^seq_lens: expected int32, got uint32"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS[:1]), ValueError,
     r"^seq_lens: expected shape \(2,\) \(q's batch\)"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS[:, None]), ValueError, r"^seq_lens: expected a 1-D"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, causal=1), TypeError, r"^causal: expected a bool"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, scale="x"), TypeError, r"^scale: expected a real"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, scale=float("nan")), ValueError,
     r"^scale: must be finite"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, return_lse=None), TypeError,
     r"^return_lse: expected a bool"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, impl="flash"), ValueError,
     r"^impl: unknown variant 'flash' for attention_paged; expected one of auto, decode, gather"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, impl="gather"), ValueError,
     r"^impl: 'gather' runs packed chunked prefill: give cu_seqlens_q"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, max_seqlen_q=1), ValueError,
     r"^max_seqlen_q: only with cu_seqlens_q"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, out=np.empty((2, 1, 4, 9), F16)), ValueError,
     r"^out: expected shape"),
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, out=np.empty(Q.shape, np.float32)), TypeError,
     r"^out: expected dtype float16"),
    (lambda: cupyops.attention_paged(Q, KC, VC, np.zeros((2, 2**27), I32), LENS), ValueError,
     r"^block_table: 134217728 pages of 16 tokens exceed"),
    # int32 key counts with the kernels' look-ahead headroom: 2^31 - 16 keys is too many too
    (lambda: cupyops.attention_paged(Q, KC, VC, np.zeros((2, 2**27 - 1), I32), LENS), ValueError,
     r"^block_table: 134217727 pages of 16 tokens exceed 2147482623"),
])
def test_attention_paged_argument_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("lens, table, match", [
    ([49, 1], TABLE, r"^seq_lens: seq_lens\[0\] = 49 is outside 0..48 \(block_table's 3 pages of 16 tokens\)"),
    ([1, -1], TABLE, r"^seq_lens: seq_lens\[1\] = -1 is outside 0..48"),
    ([17, 1], [[0, 6, 1], [2, 3, 4]], r"^block_table: block_table\[0, 1\] = 6 is not a page of the cache \(0..5\), "
                                      r"and sequence 0 uses it"),
    ([17, 1], [[0, 1, 1], [-1, 3, 4]], r"^block_table: block_table\[1, 0\] = -1 is not a page"),
])
def test_host_lengths_and_pages_are_checked(lens, table, match):
    with pytest.raises(ValueError, match=match):
        cupyops.attention_paged(Q, KC, VC, np.asarray(table, I32), np.asarray(lens, I32))


def test_host_check_passes_entries_no_sequence_uses():
    # pages past a sequence's length are never read: any value is fine there (vLLM pads
    # its tables with garbage), and so is a length of 0 or the table's whole capacity
    table = np.array([[0, 1, -7], [5, 2**30, -1]], I32)
    paged._check_host_pages(table, np.array([32, 16], I32), None, 16, 6, "seq_lens")
    paged._check_host_pages(table, np.array([0, 0], I32), None, 16, 6, "seq_lens")
    paged._check_host_pages(np.array([[0, 1, 2]], I32), np.array([48], I32), None, 16, 6, "seq_lens")
    # positions: the pages of the new tokens only
    paged._check_host_pages(table, np.array([30, 10], I32), 2, 16, 6, "positions")
    with pytest.raises(ValueError, match=r"^block_table: block_table\[0, 2\] = -7"):
        paged._check_host_pages(table, np.array([31, 10], I32), 2, 16, 6, "positions")
    with pytest.raises(ValueError, match=r"^positions: positions\[1\] = 47 puts its 2 new tokens outside 0..47"):
        paged._check_host_pages(np.zeros((2, 3), I32), np.array([0, 47], I32), 2, 16, 6, "positions")


def test_mixed_residence_is_refused():
    class FakeCupy:  # an array whose type claims CuPy: the residence check looks at that alone
        __module__ = "cupy"
        dtype = np.dtype(I32)
        ndim, shape = 2, TABLE.shape

    with pytest.raises(TypeError, match=r"^block_table: must live where the caches do"):
        cupyops.attention_paged(Q, KC, VC, FakeCupy(), LENS)


# ------------------------------------------------------------------ packed chunked prefill errors
PQ = np.random.default_rng(1).standard_normal((5, 4, 8)).astype(F16)  # 5 packed query rows
CUQ = np.array([0, 3, 5], I32)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: cupyops.attention_paged(Q, KC, VC, TABLE, LENS, cu_seqlens_q=CUQ), ValueError,
     r"^q: with cu_seqlens_q, q is packed \[total_q, q_heads, head_dim\], got shape \(2, 1, 4, 8\)"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS, cu_seqlens_q=CUQ.astype(np.int64)), TypeError,
     r"^cu_seqlens_q: expected int32 offsets, got int64"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS, cu_seqlens_q=CUQ[:2]), ValueError,
     r"^block_table: expected 1 rows \(cu_seqlens_q's batch\)"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS[:1], cu_seqlens_q=CUQ), ValueError,
     r"^seq_lens: expected shape \(2,\) \(cu_seqlens_q's batch\)"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS, cu_seqlens_q=np.array([0, 4, 3], I32)), ValueError,
     r"^cu_seqlens_q: offsets must not decrease, got 4 then 3 at index 2"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS, cu_seqlens_q=np.array([0, 3, 6], I32)), ValueError,
     r"^cu_seqlens_q: the last offset 6 is past the 5 packed tokens"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS, cu_seqlens_q=CUQ, max_seqlen_q=2), ValueError,
     r"^max_seqlen_q: 2 is less than the longest sequence \(3\)"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS, cu_seqlens_q=CUQ, max_seqlen_q=6), ValueError,
     r"^max_seqlen_q: must be in 0..5"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS, cu_seqlens_q=CUQ, impl="decode"), ValueError,
     r"^impl: 'decode' takes q \[batch, q_len, q_heads, head_dim\] without cu_seqlens_q"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, np.array([49, 1], I32), cu_seqlens_q=CUQ), ValueError,
     r"^seq_lens: seq_lens\[0\] = 49 is outside 0..48"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS, cu_seqlens_q=CUQ, window=(1, 2, 3)), TypeError,
     r"^window: expected \(left, right\) or None"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS, cu_seqlens_q=CUQ, scale=float("inf")), ValueError,
     r"^scale: must be finite"),
    (lambda: cupyops.attention_paged(PQ, KC, VC, TABLE, LENS, cu_seqlens_q=CUQ, out=np.empty((5, 4, 9), F16)),
     ValueError, r"^out: expected shape"),
    (lambda: cupyops.attention_paged(PQ, KC.astype(np.float32), VC, TABLE, LENS, cu_seqlens_q=CUQ), TypeError,
     r"^k_cache: dtype float32 does not match q's float16"),
])
def test_paged_prefill_argument_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ------------------------------------------------------------------ kv_cache_append errors
def _append_args(B=2, N=1, H=2, D=8, P=16, num_pages=6, max_pages=3):
    rng = np.random.default_rng(1)
    kc = np.zeros((num_pages, P, H, D), F16)
    vc = np.zeros((num_pages, P, H, D), F16)
    k = rng.standard_normal((B, N, H, D)).astype(F16)
    v = rng.standard_normal((B, N, H, D)).astype(F16)
    table = (np.arange(B * max_pages) % num_pages).reshape(B, max_pages).astype(I32)
    return kc, vc, k, v, table, np.zeros(B, I32)


KC2, VC2, K2, V2, T2, P2 = _append_args()


@pytest.mark.parametrize("call, exc, match", [
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2.astype(np.float64), V2, T2, P2), TypeError, r"^k: dtype float64"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2[0], V2, T2, P2), ValueError, r"^k: expected a 4-D array"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2, V2.astype(np.float32), T2, P2), TypeError,
     r"^v: dtype float32 does not match k's float16"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2, V2[:, :, :1], T2, P2), ValueError, r"^v: expected k's shape"),
    (lambda: cupyops.kv_cache_append(KC2.astype(np.float32), VC2, K2, V2, T2, P2), TypeError,
     r"^k_cache: dtype float32 does not match k's float16"),
    (lambda: cupyops.kv_cache_append(*_append_args(P=48)), ValueError, r"^k_cache: page_size \(axis 1\) must be"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, *_append_args(H=1)[2:4], T2, P2), ValueError,
     r"^k: kv_heads 1 does not match k_cache's 2"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, *_append_args(D=16)[2:4], T2, P2), ValueError,
     r"^k_cache: head_dim 8 does not match k's 16"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2, V2, T2.astype(np.int16), P2), TypeError,
     r"^block_table: expected int32, got int16"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2, V2, T2[:1], P2), ValueError,
     r"^block_table: expected 2 rows \(k's batch\)"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2, V2, T2, P2.astype(np.int64)), TypeError,
     r"^positions: expected int32, got int64"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2, V2, T2, P2[:1]), ValueError, r"^positions: expected shape \(2,\)"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2, V2, T2, np.array([0, 48], I32)), ValueError,
     r"^positions: positions\[1\] = 48 puts its 1 new tokens outside 0..47"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2, V2, T2, np.array([-1, 0], I32)), ValueError,
     r"^positions: positions\[0\] = -1"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, K2, V2, np.array([[9, 0, 0], [0, 0, 0]], I32), P2), ValueError,
     r"^block_table: block_table\[0, 0\] = 9 is not a page of the cache \(0..5\)"),
    (lambda: cupyops.kv_cache_append(KC2, KC2, K2, V2, T2, P2), ValueError, r"^v_cache: must not overlap k_cache"),
    (lambda: cupyops.kv_cache_append(KC2, VC2, KC2[:2, :1], V2, T2, P2), ValueError, r"^k: must not overlap k_cache"),
])
def test_kv_cache_append_argument_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_kv_cache_append_refuses_a_read_only_host_cache():
    kc = KC2.copy()
    kc.flags.writeable = False
    with pytest.raises(ValueError, match=r"^k_cache: must be writeable"):
        cupyops.kv_cache_append(kc, VC2, K2, V2, T2, P2)


# ------------------------------------------------------------------ merge_attention_states errors
OA = np.ones((3, 2, 8), F16)
LA = np.zeros((3, 2), np.float32)


@pytest.mark.parametrize("args, exc, match", [
    ((OA.astype(np.float64), LA, OA, LA), TypeError, r"^o_a: dtype float64"),
    ((OA[0], LA, OA, LA), ValueError, r"^o_a: expected a 3-D array"),
    ((OA[:, :, :0], LA, OA[:, :, :0], LA), ValueError, r"^o_a: head_dim \(axis 2\) must be at least 1"),
    ((OA, LA, OA.astype(np.float32), LA), TypeError, r"^o_b: dtype float32 does not match o_a's float16"),
    ((OA, LA, OA[:2], LA), ValueError, r"^o_b: expected o_a's shape \(3, 2, 8\)"),
    ((OA, LA.astype(np.float64), OA, LA), TypeError, r"^lse_a: expected float32, got float64"),
    ((OA, LA, OA, LA.T), ValueError, r"^lse_b: expected shape \(3, 2\) \(o_a's tokens, heads\), got \(2, 3\)"),
])
def test_merge_argument_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        cupyops.merge_attention_states(*args)


# ------------------------------------------------------------------ registration, kernels, plan
def test_registered_out_of_the_ladders():
    assert set(cupyops.ops.PAGED_OPS) == {"attention_paged", "kv_cache_append", "merge_attention_states"}
    assert not set(cupyops.ops.PAGED_OPS) & set(cupyops.OPS)
    for op in cupyops.ops.PAGED_OPS:
        assert [kf.filename for kf in cupyops.ops.kernel_files(op)] == ["attention_decode.cu"]
        assert cupyops.variants(op) and getattr(cupyops, op) is not None
    assert list(cupyops.variants("attention_paged")) == ["decode", "gather"]


def test_every_paged_instantiation_is_named():
    names = set(M.KERNELS.name_expressions)
    for dtype in _dtypes.FLOAT_TYPES:
        t = _dtypes.cuda_type(dtype)
        assert f"attention_merge_states<{t}>" in names and f"kv_cache_append<{t}>" in names
        assert f"kv_cache_gather<{t}>" in names
        for dt in M.DT_TIERS:
            assert (f"attention_decode_paged<{t}, {dt}, 16, {M.STAGES[dt]}>" in names) == (dtype in M.PAGED_DTYPES)


@pytest.mark.parametrize("B, Hq, Hkv, Sq, capacity, D", [
    (64, 32, 8, 1, 4096, 128), (1, 32, 8, 1, 32768, 128), (3, 12, 4, 5, 1824, 80), (2, 8, 1, 16, 16, 256),
    (5, 4, 4, 2, 0, 64), (128, 8, 8, 1, 256 * 256, 40),
])
def test_paged_plan(B, Hq, Hkv, Sq, capacity, D):
    for dtype, sms in itertools.product(M.PAGED_DTYPES, (132, 78)):
        pl = M.plan(dtype, B, Hq, Hkv, Sq, capacity, D, sm_count=sms, paged=True)
        flat = M.plan(dtype, B, Hq, Hkv, Sq, capacity, D, sm_count=sms)
        assert pl.name in M.KERNELS.name_expressions and pl.name.startswith("attention_decode_paged<")
        # the contiguous kernel's geometry for a sequence of the table's capacity, at the
        # residency its shared memory allows (never one block an SM by request)
        assert (pl.grid, pl.splits, pl.chunk, pl.rt, pl.smem, pl.work_o) == (
            flat.grid, flat.splits, flat.chunk, flat.rt, flat.smem, flat.work_o)
        assert pl.launch_smem == pl.smem
        assert pl.chunk % pl.bk == 0 and pl.splits * pl.chunk >= capacity
    with pytest.raises(TypeError, match="^dtype: decode supports float16, bfloat16"):
        M.plan("float32", 1, 1, 1, 1, 16, 64, paged=True)


def test_acceptance_shape_plan():
    # unsplit as the contiguous rung, but two blocks an SM where the contiguous launch asks
    # for one (the page walk's latency wants the second block's copies in flight)
    pl = M.plan("bfloat16", 64, 32, 8, 1, 4096, 128, paged=True)
    flat = M.plan("bfloat16", 64, 32, 8, 1, 4096, 128)
    assert pl.splits == 1 and pl.grid[0] == 512 and pl.work_o == 0
    assert flat.launch_smem > M.SMEM_PER_SM // 2 - 1024 and 2 * (pl.launch_smem + 1024) <= M.SMEM_PER_SM


@pytest.mark.parametrize("dtype", M.PAGED_DTYPES)
@pytest.mark.parametrize("dt", M.DT_TIERS)
def test_a_copy_group_never_straddles_a_page(dtype, dt):
    # kernels/attention_decode.cu Ring: thread tid copies chunk tid % CH of rows j0 + u *
    # RSTEP (j0 = tid / CH) of each tile; copies go in groups of 16 keys, and the paged
    # policy looks up ONE page a group. Every group's rows must then share a page, for
    # every page size, split start (a multiple of the chunk) and tile.
    vec = 16 // _dtypes.itemsize(dtype)
    ch = dt // vec
    rstep = M.THREADS // ch
    bk = M.tile_keys(dtype)
    upg = 16 // rstep
    for P, k0 in itertools.product(M.PAGE_SIZES, (0, bk, 5 * bk, 64 * bk)):
        for kt, j0 in itertools.product(range(0, 4 * bk, bk), range(rstep)):
            for g in range(bk // 16):
                rows = [k0 + kt + 16 * g + j0 + uu * rstep for uu in range(upg)]
                assert len({r // P for r in rows}) == 1, (P, k0, kt, j0, g)
                # and the policy's first-row slot plus uu * RSTEP is each row's slot
                slot0 = (k0 + kt + 16 * g + j0) % P
                assert [slot0 + uu * rstep for uu in range(upg)] == [r % P for r in rows]
    assert all(pl % M.tile_keys(dtype) == 0 for pl in (M.plan(dtype, 1, 8, 1, 1, 100000, dt, paged=True).chunk,))


# ------------------------------------------------------------------ references
def _paged_copy(rng, k, v, P, lens, spare=2):
    """k, v [B, S, H, D] as a paged cache with shuffled pages: (k_cache, v_cache, table)."""
    B, S, H, D = k.shape
    need = [-(-int(n) // P) for n in lens]
    num_pages = sum(need) + spare
    order = rng.permutation(num_pages)
    kc = np.full((num_pages, P, H, D), np.nan)
    vc = np.full((num_pages, P, H, D), np.nan)
    table = np.full((B, max(need) + 1), -1, I32)
    at = 0
    for b in range(B):
        for p in range(need[b]):
            page = order[at]
            at += 1
            table[b, p] = page
            n = min(P, int(lens[b]) - p * P)
            kc[page, :n], vc[page, :n] = k[b, p * P:p * P + n], v[b, p * P:p * P + n]
    return kc, vc, table


def test_paged_reference_equals_the_contiguous_one():
    rng = np.random.default_rng(3)
    B, S, Hq, Hkv, D, Sq, P = 3, 70, 4, 2, 8, 3, 16
    k, v = rng.standard_normal((2, B, S, Hkv, D))
    q = rng.standard_normal((B, Sq, Hq, D))
    lens = np.array([70, 1, 33], I32)
    kc, vc, table = _paged_copy(rng, k, v, P, lens)
    out, lse = reference.attention_paged(q, kc, vc, table, lens, return_lse=True)
    for b in range(B):
        want, want_lse = reference.attention(q[b:b + 1], k[b:b + 1, :lens[b]], v[b:b + 1, :lens[b]], causal=True,
                                             causal_align="bottom_right", return_lse=True)
        np.testing.assert_allclose(out[b:b + 1], want, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(lse[b:b + 1]), np.isneginf(want_lse))
    assert np.isneginf(lse[1, :, :2]).all() and not out[1, :2].any()  # length 1: two rows see nothing


def test_packed_paged_reference_equals_the_decode_one():
    # packed rows of each sequence's last tokens = the decode form's rows, sequence by
    # sequence; rows outside every sequence (the last one here) are zeros with LSE -inf
    rng = np.random.default_rng(4)
    B, S, Hq, Hkv, D, P = 3, 70, 4, 2, 8, 16
    k, v = rng.standard_normal((2, B, S, Hkv, D))
    lens = np.array([70, 1, 33], I32)
    kc, vc, table = _paged_copy(rng, k, v, P, lens)
    cu = np.array([0, 5, 8, 8], I32)
    q = rng.standard_normal((9, Hq, D))
    out, lse = reference.attention_paged(q, kc, vc, table, lens, return_lse=True, cu_seqlens_q=cu, window=(20, 0))
    assert out.shape == q.shape and lse.shape == (Hq, 9)
    for b in range(2):
        qb = q[cu[b]:cu[b + 1]][None]
        want, want_lse = reference.attention_paged(qb, kc, vc, table[b:b + 1], lens[b:b + 1], return_lse=True,
                                                   window=(20, 0))
        np.testing.assert_allclose(out[cu[b]:cu[b + 1]], want[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(lse[:, cu[b]:cu[b + 1]], want_lse[0])
    assert not out[8].any() and np.isneginf(lse[:, 8]).all()


def test_append_reference_then_paged_equals_contiguous():
    rng = np.random.default_rng(4)
    B, S, H, D, P = 2, 40, 2, 8, 16
    k, v = rng.standard_normal((2, B, S, H, D))
    table = np.array([[4, 0, 2], [1, 5, 3]], I32)
    kc = np.zeros((6, P, H, D))
    vc = np.zeros((6, P, H, D))
    kc, vc = reference.kv_cache_append(kc, vc, k[:, :30], v[:, :30], table, np.zeros(B, I32))
    for t in range(30, S):  # decode steps, one token each
        kc, vc = reference.kv_cache_append(kc, vc, k[:, t:t + 1], v[:, t:t + 1], table, np.full(B, t, I32))
    got_k, got_v = reference.paged_kv(kc, vc, table, S, 1)
    np.testing.assert_array_equal(got_k, k[1])
    np.testing.assert_array_equal(got_v, v[1])
    # out of range: skipped
    kc2, _ = reference.kv_cache_append(kc, vc, k[:, :1], v[:, :1], table, np.array([48, -1], I32))
    np.testing.assert_array_equal(kc2, kc)


def test_merge_reference_of_two_halves_is_the_whole():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 1, 4, 8))
    k, v = rng.standard_normal((2, 2, 50, 2, 8))
    o, lse = reference.attention(q, k, v, return_lse=True)
    oa, la = reference.attention(q, k[:, :20], v[:, :20], return_lse=True)
    ob, lb = reference.attention(q, k[:, 20:], v[:, 20:], return_lse=True)
    mo, ml = reference.merge_attention_states(oa[:, 0], la[..., 0], ob[:, 0], lb[..., 0])
    np.testing.assert_allclose(mo, o[:, 0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ml, lse[..., 0], rtol=1e-12)
    none = np.full_like(la[..., 0], -np.inf)
    mo, ml = reference.merge_attention_states(np.full_like(oa[:, 0], np.nan), none, ob[:, 0], lb[..., 0])
    np.testing.assert_array_equal(mo, ob[:, 0])
    np.testing.assert_array_equal(ml, lb[..., 0])
    mo, ml = reference.merge_attention_states(oa[:, 0], none, ob[:, 0], none)
    assert not mo.any() and np.isneginf(ml).all()
