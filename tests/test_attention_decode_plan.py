"""CPU tier for the decode rung of attention (cupyops/ops/_attention_decode.py): its plans
name compiled kernels, stay within the grid and shared-memory limits, split the KV sequence
into non-empty chunks of whole tiles, size the workspace right; supports() names the
argument it rejects; and a NumPy model of the split / merge arithmetic (base-2 online
softmax per split, merge through the LSE) matches a direct float64 softmax, empty splits
and rows that see no key included."""
import itertools
import types

import numpy as np
import pytest

from cupyops import _launch
from cupyops.ops import _attention_decode as M

DTYPES = M.DTYPES["decode"]
SMEM_OPTIN = 227 * 1024

SHAPES = [
    # (B, Hq, Hkv, Sq, Skv, D)
    (16, 32, 8, 1, 4096, 128),
    (64, 32, 8, 1, 4096, 128),
    (16, 32, 8, 1, 32768, 128),
    (64, 32, 8, 1, 32768, 128),
    (1, 1, 1, 1, 1, 1),
    (1, 8, 1, 16, 100000, 64),
    (3, 12, 4, 5, 1823, 80),
    (2, 32, 1, 16, 17, 256),
    (1, 4, 4, 1, 0, 128),
    (7, 6, 3, 16, 65, 33),
    (1, 64, 64, 1, 1 << 20, 128),
    (128, 32, 8, 2, 4096, 200),
    (70000, 2, 1, 1, 64, 64),
]


def _plans():
    for (B, Hq, Hkv, Sq, Skv, D), dtype in itertools.product(SHAPES, DTYPES):
        for causal, off in ((False, 0), (True, 0), (True, Skv - Sq)):
            for sms in (132, 78, 1):
                yield (dtype, B, Hq, Hkv, Sq, Skv, D, causal, off, sms), M.plan(
                    dtype, B, Hq, Hkv, Sq, Skv, D, causal, off, sm_count=sms)


def test_plans_are_valid():
    names = set(M.KERNELS.name_expressions)
    for (dtype, B, Hq, Hkv, Sq, Skv, D, causal, off, sms), pl in _plans():
        where = (dtype, B, Hq, Hkv, Sq, Skv, D, causal, off, sms)
        assert pl.name in names and pl.merge_name in names, where
        assert pl.block == (M.THREADS, 1, 1) and pl.merge_block == (M.THREADS, 1, 1)
        assert 1 <= pl.grid[0] <= 2**31 - 1 and pl.grid[1:] == (1, 1), where
        assert 1 <= pl.merge_grid[0] <= 2**31 - 1 and pl.merge_grid[1:] == (1, 1), where
        assert pl.smem <= pl.launch_smem <= SMEM_OPTIN, where
        # one block an SM (two, with the driver's 1 KB each, do not fit), only for launches
        # of more blocks than fit two an SM
        if pl.launch_smem > pl.smem:
            assert pl.launch_smem * 2 > M.SMEM_PER_SM - 2048 and pl.grid[0] > pl.blocks_per_sm * sms, where
        q_bytes = M.MMA_ROW_TILE * pl.dt * 2 if dtype != "float32" else pl.rt * pl.dt * 4
        ring = pl.stages * 256 * pl.dt
        assert pl.smem == ring + q_bytes + 8 * (16 if dtype != "float32" else pl.rt), where
        assert M.state_bytes(dtype, pl.dt, pl.rt) <= ring, where
        assert pl.dt >= D and pl.dt in M.DT_TIERS
        rows = (Hq // Hkv) * Sq
        assert pl.nrt == _launch.cdiv(rows, pl.rt) and (pl.rt == 16 or rows <= pl.rt or pl.rt == max(
            M.F32_ROW_TILES[pl.dt])), where
        assert pl.grid[0] == B * Hkv * pl.splits * pl.nrt, where
        assert pl.merge_grid[0] == _launch.cdiv(B * Hq * Sq, M.MERGE_ROWS), where
        # splits: whole tiles, covering every key some row sees, none empty
        assert pl.chunk % pl.bk == 0 and pl.chunk > 0, where
        assert 1 <= pl.splits <= M.MAX_SPLITS
        assert pl.splits * pl.chunk >= pl.kv, where
        if pl.splits > 1:
            assert (pl.splits - 1) * pl.chunk < pl.kv, where
        assert pl.kv == max(M.visible_keys(i, Skv, causal, off) for i in range(Sq))
        # workspace
        if pl.splits > 1:
            assert pl.work_o == B * Hq * Sq * pl.splits * D and pl.work_lse == B * Hq * Sq * pl.splits
        else:
            assert pl.work_o == pl.work_lse == 0
        assert 1 <= pl.blocks_per_sm <= 3


def test_name_expressions_cover_every_dtype_and_tier():
    names = M.KERNELS.name_expressions
    for dtype, cuda in (("float32", "float"), ("float16", "__half"), ("bfloat16", "__nv_bfloat16")):
        assert f"attention_decode_merge<{cuda}>" in names
        for dt in M.DT_TIERS:
            assert any(n.startswith(f"attention_decode<{cuda}, {dt}, ") for n in names), (dtype, dt)
    assert M.KERNEL_FILES == [M.KERNELS]


def test_smem_and_occupancy_numbers():
    # one stage is 256 * DT bytes for every dtype (BK halves for float32)
    for dtype, dt in itertools.product(DTYPES, M.DT_TIERS):
        item = 4 if dtype == "float32" else 2
        assert 2 * M.tile_keys(dtype) * dt * item == 256 * dt
    bf = M.plan("bfloat16", 16, 32, 8, 1, 4096, 128)
    assert bf.smem == 3 * 32768 + 16 * 128 * 2 + 16 * 8 and bf.blocks_per_sm == 2
    assert M.plan("bfloat16", 16, 32, 8, 1, 4096, 64).blocks_per_sm == 3
    assert M.plan("bfloat16", 16, 32, 8, 1, 4096, 256).blocks_per_sm == 1
    assert M.plan("float32", 1, 16, 1, 1, 4096, 64).blocks_per_sm == 2  # RT 16: registers
    # issue 4's decode shapes: B16 (128 blocks) two an SM as sized; B64 (512 blocks, two
    # waves) asks for over half an SM's shared memory, so one block an SM
    assert bf.launch_smem == bf.smem
    b64 = M.plan("bfloat16", 64, 32, 8, 1, 32768, 128)
    assert b64.grid[0] == 512 and b64.smem == bf.smem and b64.launch_smem == M.SMEM_PER_SM // 2
    assert 2 * (b64.launch_smem + 1024) > M.SMEM_PER_SM >= b64.launch_smem + 1024
    d64 = M.plan("bfloat16", 64, 32, 8, 1, 32768, 64)  # other tiers keep their residency
    assert d64.launch_smem == d64.smem


@pytest.mark.parametrize("B, Skv", [(16, 4096), (16, 32768), (64, 4096), (64, 32768)])
def test_acceptance_shapes_stream_unsplit_on_every_sm(B, Skv):
    # Measured on an H200: B * Hkv = 128 blocks (one an SM) already saturate HBM, and a
    # split costs a merge launch; so these run unsplit, with no workspace.
    pl = M.plan("bfloat16", B, 32, 8, 1, Skv, 128, sm_count=132)
    assert pl.rt == 16 and pl.nrt == 1  # the 4 query heads of a KV head share one block
    assert pl.splits == 1 and pl.work_o == 0
    assert pl.grid[0] >= 0.9 * 132


@pytest.mark.parametrize("B, S", [(1, 16), (2, 8), (4, 4), (8, 2)])
def test_few_sequences_split_to_fill_the_gpu(B, S):
    pl = M.plan("bfloat16", B, 32, 8, 1, 32768, 128, sm_count=132)
    assert pl.splits == S and pl.grid[0] == 128
    assert pl.work_o == B * 32 * S * 128 and pl.work_lse == B * 32 * S


def test_split_cost_model():
    # one wave that saturates HBM costs bytes / bandwidth + a wave; a second split adds a merge
    t1 = M.split_cost_us(1, 64, 128, 264, 65536, 65536)
    assert t1 == pytest.approx(128 * 64 * 65536 / M.HBM_BYTES_PER_US + M.WAVE_US)
    t2 = M.split_cost_us(2, 64, 128, 264, 65536, 65536)
    assert t2 == pytest.approx(t1 + M.MERGE_US)
    # too few blocks to saturate: each streams at its own rate
    t = M.split_cost_us(1, 10, 4, 264, 65536, 65536)
    assert t == pytest.approx(10 * 65536 / M.BLOCK_BYTES_PER_US + M.WAVE_US)


def test_one_sequence_is_split_across_the_gpu():
    pl = M.plan("bfloat16", 1, 32, 8, 1, 32768, 128, sm_count=132)
    assert pl.grid[0] >= 0.9 * 132 and pl.splits * pl.chunk >= 32768


def test_causal_top_left_decode_reads_one_key():
    pl = M.plan("bfloat16", 4, 32, 8, 1, 32768, 128, causal=True, causal_offset=0)
    assert pl.kv == 1 and pl.splits == 1
    pl = M.plan("bfloat16", 4, 32, 8, 1, 32768, 128, causal=True, causal_offset=-5)
    assert pl.kv == 0 and pl.splits == 1 and pl.grid[0] == 4 * 8


def test_choose_splits_edges():
    assert M.choose_splits(0, 10, 264) == 1
    assert M.choose_splits(1, 1, 264) == 1
    assert M.choose_splits(1000, 10**6, 264) == 1
    S = M.choose_splits(512, 1, 264)
    assert 64 <= S <= 512
    # no empty trailing split for any count
    for tiles in range(1, 200):
        for pairs in (1, 3, 50, 300):
            S = M.choose_splits(tiles, pairs, 264)
            per = _launch.cdiv(tiles, S)
            assert (S - 1) * per < tiles


def _problem(**kw):
    base = {"dtype": "bfloat16", "B": 2, "Hq": 8, "Hkv": 2, "Sq": 1, "Skv": 100, "D": 128,
            "window_left": -1, "window_right": -1, "windowed": False, "softcap": 0.0}
    base.update(kw)
    return types.SimpleNamespace(**base)


@pytest.mark.parametrize("kw, prefix", [
    ({"dtype": "float64"}, "dtype: "),
    ({"dtype": "int8"}, "dtype: "),
    ({"Sq": 17}, "q_len: "),
    ({"Sq": 0}, "q_len: "),
    ({"D": 257}, "head_dim: "),
    ({"D": 0}, "head_dim: "),
    ({"Hq": 6, "Hkv": 4}, "k: "),
])
def test_supports_names_the_argument(kw, prefix):
    reason = M.supports("decode", _problem(**kw))
    assert reason is not None and reason.startswith(prefix), reason


def test_supports_the_claimed_range():
    for dtype, Sq, D in itertools.product(DTYPES, (1, 7, 16), (1, 63, 64, 65, 128, 200, 256)):
        assert M.supports("decode", _problem(dtype=dtype, Sq=Sq, D=D)) is None
    assert M.supports("flash", _problem()).startswith("impl: ")
    assert set(M.VARIANTS) == set(M.DTYPES) == {"decode"}


def test_plan_errors_name_the_argument():
    with pytest.raises(TypeError, match="^dtype: "):
        M.plan("float64", 1, 1, 1, 1, 1, 64)
    with pytest.raises(ValueError, match="^head_dim: "):
        M.plan("float32", 1, 1, 1, 1, 1, 300)


# ---------------------------------------------------------------- NumPy model of split + merge
def _split_partial(s2, v, lo, hi, bk):
    """One split as the kernel computes it: tiles of bk keys, online softmax in base 2 with
    -inf scores for keys not seen, 'no key yet' subtracting 0. Returns (o normalised, lse2)."""
    m, l, acc = -np.inf, 0.0, np.zeros(v.shape[1])
    for t0 in range(lo, hi, bk):
        sc = s2[t0:min(hi, t0 + bk)]
        mnew = max(m, sc.max()) if sc.size else m
        mu = 0.0 if mnew == -np.inf else mnew
        alpha = np.exp2(m - mu)
        p = np.exp2(sc - mu)
        l = l * alpha + p.sum()
        acc = acc * alpha + p @ v[t0:t0 + len(sc)]
        m = mnew
    if l == 0:
        return np.zeros_like(acc), -np.inf
    return acc / l, m + np.log2(l)


def _merge(parts):
    lses = np.array([p[1] for p in parts])
    M_ = lses.max()
    if M_ == -np.inf:
        return np.zeros_like(parts[0][0]), -np.inf
    w = np.exp2(lses - M_)
    o = sum(wi * p[0] for wi, p in zip(w, parts)) / w.sum()
    return o, (M_ + np.log2(w.sum())) * np.log(2)


@pytest.mark.parametrize("Skv, Sq, causal, off, scale", [
    (1000, 1, False, 0, 0.1), (1000, 4, True, 996, 0.1), (300, 16, True, -5, 0.3),
    (257, 3, True, 0, 1.0), (5000, 2, False, 0, 40.0), (64, 1, True, -1, 0.1),
])
def test_split_merge_model_matches_softmax(Skv, Sq, causal, off, scale):
    rng = np.random.default_rng(Skv + Sq)
    D = 24
    q = rng.standard_normal((Sq, D))
    k = rng.standard_normal((Skv, D))
    v = rng.standard_normal((Skv, D))
    bk = M.tile_keys("bfloat16")
    kv = max(M.visible_keys(i, Skv, causal, off) for i in range(Sq))
    tiles = _launch.cdiv(kv, bk)
    for S in (1, 2, 3, 7):
        chunk = max(1, _launch.cdiv(tiles, S)) * bk  # as plan() derives it from S
        S = max(1, _launch.cdiv(kv, chunk))
        for i in range(Sq):
            vis = M.visible_keys(i, Skv, causal, off)
            s = scale * (k @ q[i])
            s2 = np.where(np.arange(Skv) < vis, s * np.log2(np.e), -np.inf)
            parts = []
            for sp in range(S):
                lo, hi = sp * chunk, min(Skv, (sp + 1) * chunk)
                parts.append(_split_partial(s2, v, lo, max(lo, min(hi, vis)), bk))
            o, lse = _merge(parts)
            if vis <= 0:
                assert lse == -np.inf and not o.any()
                continue
            ref_lse = np.logaddexp.reduce(s[:vis])
            ref_o = np.exp(s[:vis] - ref_lse) @ v[:vis]
            np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(o, ref_o, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- shared memory
def test_supports_refuses_a_tier_whose_shared_memory_the_gpu_cannot_give(monkeypatch):
    # An A100-class opt-in (163 KB): the head_dim-256 ring (~205 KB) cannot launch there,
    # so supports() says so and auto falls back; 128 still fits. With no GPU visible the
    # check is left to the launch (see test_supports_the_claimed_range).
    from cupyops import _launch

    props = types.SimpleNamespace(smem_per_block_optin=163 * 1024)
    monkeypatch.setattr(_launch, "device_props", lambda device_id=None: props)
    reason = M.supports("decode", _problem(D=256))
    assert reason is not None and reason.startswith("head_dim: decode's head_dim-256 tier needs"), reason
    assert M.supports("decode", _problem(D=128)) is None
