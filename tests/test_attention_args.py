"""CPU tier for attention: bad input raises TypeError/ValueError naming the argument before
anything touches a GPU (NumPy operands: no CuPy or GPU needed), ``out`` untouched; the
variant table and how it is built; auto's choices; the CUDA-core launch plans; the layout
lowering; the float64 reference against the textbook formula."""
import importlib.util
import math
import types

import numpy as np
import pytest

import cupyops
from cupyops import _dtypes, reference
from cupyops.ops import _attention_simt as S
from cupyops.ops import attention as A

F32 = np.float32


def qkv(B=2, Sq=5, Skv=7, Hq=4, Hkv=2, D=8, dtype=F32, layout="bshd"):
    rng = np.random.default_rng(0)
    shapes = [(B, Sq, Hq, D), (B, Skv, Hkv, D), (B, Skv, Hkv, D)]
    if layout == "bhsd":
        shapes = [(b, h, s, d) for b, s, h, d in shapes]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


Q, K, V = qkv()


# ------------------------------------------------------------------------- argument errors
@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.int8, np.complex64, np.float64])
def test_rejects_dtypes(dtype):
    q, k, v = (x.astype(dtype) for x in (Q, K, V))
    with pytest.raises(TypeError, match=r"^q: dtype .* is not supported; expected one of float32, float16, bfloat16"):
        cupyops.attention(q, k, v)


def test_mixed_dtypes_name_the_operand():
    with pytest.raises(TypeError, match=r"^k: dtype float16 does not match q's float32; mixed dtypes"):
        cupyops.attention(Q, K.astype(np.float16), V)
    with pytest.raises(TypeError, match=r"^v: dtype float64 does not match q's float32"):
        cupyops.attention(Q, K, V.astype(np.float64))


def test_operands_must_be_4d():
    with pytest.raises(ValueError, match=r"^q: expected a 4-D array, got 3-D"):
        cupyops.attention(Q[0], K, V)
    with pytest.raises(ValueError, match=r"^k: expected a 4-D array, got 5-D"):
        cupyops.attention(Q, K[None], V)
    with pytest.raises(ValueError, match=r"^v: expected a 4-D array, got 2-D"):
        cupyops.attention(Q, K, V[0, 0])


def test_shape_mismatches():
    with pytest.raises(ValueError, match=r"^k: batch size 2 does not match q's 3"):
        cupyops.attention(qkv(B=3)[0], K, V)
    with pytest.raises(ValueError, match=r"^k: head_dim 16 does not match q's 8"):
        cupyops.attention(Q, *qkv(D=16)[1:])
    with pytest.raises(ValueError, match=r"^v: expected k's shape \(2, 7, 2, 8\), got \(2, 6, 2, 8\)"):
        cupyops.attention(Q, K, V[:, :6])
    with pytest.raises(ValueError, match=r"^k: kv_heads \(3\) must divide q_heads \(4\)"):
        cupyops.attention(Q, *qkv(Hkv=3)[1:])
    with pytest.raises(ValueError, match=r"^k: kv_heads \(0\) must divide q_heads \(4\)"):
        cupyops.attention(Q, *qkv(Hkv=0)[1:])


def test_layout_decides_which_axis_is_heads():
    # the same arrays: bshd reads heads 4 (q) and 2 (k); bhsd reads 5 and 7, which do not divide
    with pytest.raises(ValueError, match=r"^k: kv_heads \(7\) must divide q_heads \(5\)"):
        cupyops.attention(Q, K, V, layout="bhsd")
    with pytest.raises(ValueError, match=r"^layout: expected one of 'bshd', 'bhsd', got 'sbhd'"):
        cupyops.attention(Q, K, V, layout="sbhd")
    with pytest.raises(ValueError, match=r"^layout: expected one of"):
        cupyops.attention(Q, K, V, layout=None)


@pytest.mark.parametrize("D", [0, 257, 512])
def test_head_dim_range(D):
    with pytest.raises(ValueError, match=rf"^q: head_dim must be in 1\.\.256, got {D}"):
        cupyops.attention(*qkv(D=D))


def test_flags_and_causal_align():
    with pytest.raises(TypeError, match=r"^causal: expected a bool, got int"):
        cupyops.attention(Q, K, V, causal=1)
    with pytest.raises(TypeError, match=r"^return_lse: expected a bool, got str"):
        cupyops.attention(Q, K, V, return_lse="yes")
    with pytest.raises(ValueError, match=r"^causal_align: expected one of 'top_left', 'bottom_right', got 'left'"):
        cupyops.attention(Q, K, V, causal=True, causal_align="left")
    with pytest.raises(ValueError, match=r"^causal_align: expected one of"):  # checked even when not causal
        cupyops.attention(Q, K, V, causal_align="diagonal")


@pytest.mark.parametrize("scale,exc,msg", [
    ("0.5", TypeError, "^scale: expected a real number or None, got str"),
    (True, TypeError, "^scale: expected a real number or None, got bool"),
    (1 + 2j, TypeError, "^scale: expected a real number or None, got complex"),
    (float("nan"), ValueError, "^scale: must be finite, got nan"),
    (float("-inf"), ValueError, "^scale: must be finite, got -inf"),
    (1e39, ValueError, "^scale: 1e\\+39 is out of float32 range"),
])
def test_bad_scale(scale, exc, msg):
    with pytest.raises(exc, match=msg):
        cupyops.attention(Q, K, V, scale=scale)


def test_unknown_impl_lists_the_ladder():
    with pytest.raises(ValueError, match=r"^impl: unknown variant 'fast' for attention; expected one of auto, naive, tiled, flash_v1"):
        cupyops.attention(Q, K, V, impl="fast")


def test_operands_must_live_together():
    fake = type("FakeCupy", (), {"__module__": "cupy.fake", "dtype": np.dtype(F32), "ndim": 4, "shape": K.shape})()
    with pytest.raises(TypeError, match=r"^k: must live where q does"):
        cupyops.attention(Q, fake, V)


def test_out_checks_leave_out_untouched():
    for out, exc, msg in [
        (np.full((2, 5, 4, 9), 7, F32), ValueError, r"^out: expected shape \(2, 5, 4, 8\), got \(2, 5, 4, 9\)"),
        (np.full((2, 5, 4, 8), 7, np.float16), TypeError, r"^out: expected dtype float32, got float16"),
        (np.full((8, 4, 5, 2), 7, F32).T, ValueError, r"^out: must be C-contiguous"),
        (np.full((2, 4, 5, 8), 7, F32), ValueError, r"^out: expected shape \(2, 5, 4, 8\)"),  # bhsd-shaped for bshd
    ]:
        before = out.copy()
        with pytest.raises(exc, match=msg):
            cupyops.attention(Q, K, V, out=out)
        assert np.array_equal(out, before)
    with pytest.raises(TypeError, match=r"^out: expected a NumPy array like the input"):
        cupyops.attention(Q, K, V, out=[0.0])
    # arguments checked after out fail too, and leave it alone
    poison = np.full(Q.shape, -7.0, F32)
    with pytest.raises(ValueError, match="^impl"):
        cupyops.attention(Q, K, V, out=poison, impl="nope")
    assert np.all(poison == -7.0)


def test_out_takes_the_layout_of_q():
    qb, kb, vb = qkv(layout="bhsd")
    with pytest.raises(ValueError, match=r"^out: expected shape \(2, 4, 5, 8\), got \(2, 5, 4, 8\)"):
        cupyops.attention(qb, kb, vb, layout="bhsd", out=np.zeros((2, 5, 4, 8), F32))


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_valid_call_without_cupy_says_what_is_missing():
    with pytest.raises(RuntimeError, match=r"needs CuPy"):
        cupyops.attention(Q, K, V, causal=True, causal_align="bottom_right", return_lse=True)


# ------------------------------------------------------------------------- rungs that refuse
def _fake_module(name, dtypes, refuse):
    """A launcher module registering rung ``name`` that claims ``dtypes`` and refuses the
    problems for which ``refuse(p)`` gives a reason."""
    mod = types.SimpleNamespace(VARIANTS={name: "a test double"}, DTYPES={name: dtypes}, KERNEL_FILES=[])
    mod.supports = lambda impl, p: refuse(p)
    mod.launch = lambda impl, p: pytest.fail("a refused problem must never launch")
    return mod


@pytest.fixture
def fake_rungs(monkeypatch):
    """A tensor-core-like 'flash' (float16/bfloat16, head_dim 64/128, aligned rows) and a
    'decode' (q_len <= 16) registered in place of whatever the real modules hold."""
    flash = _fake_module("flash", ("float16", "bfloat16"),
                         lambda p: None if p.D in (64, 128) and p.aligned16() else f"head_dim: flash supports 64, 128, got {p.D}")
    decode = _fake_module("decode", _dtypes.FLOAT_TYPES,
                          lambda p: None if p.Sq <= 16 else f"q_len: decode supports 1..16, got {p.Sq}")
    launchers, ladder = A.build_ladder((S, flash, decode))
    monkeypatch.setattr(A, "_LAUNCHERS", launchers)
    monkeypatch.setattr(A, "LADDER", ladder)
    return flash, decode


def test_impl_that_does_not_claim_the_dtype(fake_rungs):
    with pytest.raises(TypeError, match=r"^impl: 'flash' supports float16, bfloat16, not float32"):
        cupyops.attention(Q, K, V, impl="flash")


def test_impl_that_cannot_run_the_shape_gives_its_reason(fake_rungs):
    q, k, v = qkv(D=80, dtype=np.float16)
    out = np.full(q.shape, 3, np.float16)
    with pytest.raises(ValueError, match=r"^impl: 'flash' cannot run this problem: head_dim: flash supports 64, 128, got 80"):
        cupyops.attention(q, k, v, impl="flash", out=out)
    assert np.all(out == 3)
    q, k, v = qkv(Sq=17, D=64, dtype=np.float16)
    with pytest.raises(ValueError, match=r"^impl: 'decode' cannot run this problem: q_len: decode supports 1\.\.16, got 17"):
        cupyops.attention(q, k, v, impl="decode")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_empty_problems_consult_no_rung(fake_rungs):
    # nothing would be launched, so a rung's limits do not apply: the call gets past every
    # check and only then needs CuPy, to allocate the empty result
    for q, k, v in (qkv(Sq=0, D=80, dtype=np.float16), qkv(Skv=0, D=80, dtype=np.float16)):
        with pytest.raises(RuntimeError, match="needs CuPy"):
            cupyops.attention(q, k, v, impl="flash")


# ------------------------------------------------------------------------- variant table
def test_variant_table():
    v = cupyops.variants("attention")
    ladder = ["naive", "tiled", "flash_v1", "flash", "flash3", "decode"]
    assert list(v)[:3] == ladder[:3]
    assert list(v) == [impl for impl in ladder if impl in v]  # the ladder's order, whatever is registered
    for impl, line in v.items():
        assert line.startswith("[") and len(line) > 30, (impl, line)
    for impl in ("naive", "tiled", "flash_v1"):
        assert A.dtypes_of(impl) == _dtypes.FLOAT_TYPES
        assert v[impl].startswith("[float32, float16, bfloat16] ")


def test_ladder_is_built_from_the_modules_in_order():
    later = types.SimpleNamespace(VARIANTS={"flash": "x", "extra": "y"}, DTYPES={"flash": ("bfloat16",), "extra": ("float32",)})
    launchers, ladder = A.build_ladder((S, later))
    assert list(ladder) == ["naive", "tiled", "flash_v1", "flash", "extra"]
    assert launchers["flash"] is later and launchers["tiled"] is S
    assert ladder["flash"] == "[bfloat16] x"


def test_kernel_files_of_the_family():
    files = [kf.filename for kf in cupyops.ops.kernel_files("attention")]
    assert files[0] == "attention.cu"
    expected = [kf.filename for mod in A.LAUNCHER_MODULES for kf in mod.KERNEL_FILES]
    assert files == list(dict.fromkeys(expected))


def test_every_float_dtype_and_tier_is_instantiated():
    exprs = S.KERNELS.name_expressions
    for d in _dtypes.FLOAT_TYPES:
        t = _dtypes.cuda_type(d)
        for k in ("naive_scores", "naive_softmax", "naive_pv", "tiled"):
            assert f"attention_{k}<{t}>" in exprs
        for tier in S.FLASH_V1_TIERS:
            assert f"attention_flash_v1<{t}, {tier}>" in exprs


# ------------------------------------------------------------------------- auto
def probe(dtype="float16", B=1, Hq=8, Hkv=8, Sq=128, Skv=128, D=128, causal=False, offset=0, scale=None):
    """The problem attention() would build for contiguous bshd operands (nothing allocated)."""
    t = _dtypes.to_dtype(dtype)
    qs, ks = (B, Sq, Hq, D), (B, Skv, Hkv, D)
    return A._problem(dtype, (B, Hq, Hkv, Sq, Skv, D), "bshd",
                      [A._Fresh(qs, t), A._Fresh(ks, t), A._Fresh(ks, t)], A._Fresh(qs, t), None,
                      1 / math.sqrt(D) if scale is None else scale, causal, offset)


@pytest.mark.parametrize("dtype,Sq,D,expected", [
    ("float16", 1, 128, "decode"), ("bfloat16", 16, 80, "decode"), ("float32", 4, 256, "decode"),
    ("float16", 17, 128, "flash"), ("bfloat16", 4096, 64, "flash"),
    ("float16", 4096, 80, "flash_v1"), ("float32", 4096, 128, "flash_v1"), ("bfloat16", 17, 256, "flash_v1"),
])
def test_auto_choice(fake_rungs, dtype, Sq, D, expected):
    assert A.auto_impl(probe(dtype, Sq=Sq, D=D)) == expected


def test_auto_falls_through_rungs_that_refuse(fake_rungs, monkeypatch):
    _, decode = fake_rungs
    monkeypatch.setattr(decode, "supports", lambda impl, p: "k: not today")
    assert A.auto_impl(probe("float16", Sq=1, D=64)) == "flash"
    p = probe("float16", Sq=1, D=64)
    p.Q = types.SimpleNamespace(data=types.SimpleNamespace(ptr=2), dtype=np.dtype(np.float16))  # misaligned q
    assert A.auto_impl(p) == "flash_v1"


def test_auto_without_the_upper_rungs(monkeypatch):
    launchers, _ = A.build_ladder((S,))
    monkeypatch.setattr(A, "_LAUNCHERS", launchers)
    assert A.auto_impl(probe("float16", Sq=1, D=64)) == "flash_v1"
    assert A.auto_impl(probe("bfloat16", Sq=4096, D=128)) == "flash_v1"


def test_auto_with_the_registered_modules_names_a_rung_that_accepts():
    for hopper in (False, True):
        for dtype in _dtypes.FLOAT_TYPES:
            for Sq, D in ((1, 128), (16, 64), (1000, 128), (1000, 80), (3, 256)):
                p = probe(dtype, Sq=Sq, D=D)
                impl = A.auto_impl(p, hopper=hopper)
                assert impl in A.LADDER
                assert A._LAUNCHERS[impl].supports(impl, p) is None, (dtype, Sq, D, impl)
                assert (impl == "flash3") == (hopper and Sq > A.DECODE_MAX_Q and dtype != "float32" and D != 80)


def test_auto_takes_flash3_only_on_a_gpu_that_runs_it():
    p = probe("bfloat16", Sq=4096, D=128)
    assert A.auto_impl(p, hopper=True) == "flash3"
    assert A.auto_impl(p) == "flash"
    assert A.auto_impl(probe("bfloat16", Sq=1, D=128), hopper=True) == "decode"


# ------------------------------------------------------------------------- lowering
def test_strides_of_both_layouts_and_unit_axes():
    x = np.zeros((2, 5, 4, 8), F32)
    assert A._strides(x, "bshd") == (160, 32, 8)
    assert A._strides(x, "bhsd") == (160, 8, 32)  # axis 1 is heads
    assert A._strides(np.zeros((1, 5, 1, 8), F32), "bshd") == (0, 8, 0)  # never stepped
    view = np.zeros((2, 5, 6, 16), F32)[:, :, ::2, :8]  # every other head, half of each row
    assert A._strides(view, "bshd") == (480, 96, 32)
    assert not A._needs_copy(view)
    assert A._needs_copy(np.zeros((2, 5, 4, 16), F32)[..., ::2])  # head_dim not unit-stride
    assert A._needs_copy(np.zeros((2, 5, 4, 8), F32)[:, ::-1])  # negative stride
    assert not A._needs_copy(np.zeros((2, 5, 4, 2), F32)[..., ::2])  # head_dim 1: never stepped
    assert not A._needs_copy(np.zeros((2, 1, 4, 8), F32)[:, ::-1])  # extent 1: never stepped


def test_fresh_stands_for_a_contiguous_pool_array():
    f = A._Fresh((2, 3, 4, 5), _dtypes.to_dtype("bfloat16"))
    assert f.strides == np.zeros((2, 3, 4, 5), np.float16).strides and f.data.ptr == 0 and f.size == 120
    assert probe("float16", D=64).aligned16() and not probe("float16", D=40 + 2).aligned16()


def test_problem_fields():
    p = probe("float32", B=3, Hq=8, Hkv=2, Sq=10, Skv=20, D=40, causal=True, offset=10)
    assert (p.group, p.q_strides, p.k_strides, p.o_strides) == (4, (3200, 320, 40), (1600, 80, 40), (3200, 320, 40))
    assert p.causal and p.causal_offset == 10


# ------------------------------------------------------------------------- launch plans
SMEM_OPTIN_SM80 = 166912  # A100 MaxSharedMemoryPerBlockOptin: every plan fits sm_80 too
PLAN_SHAPES = [(1, 1, 1, 1, 1), (2, 8, 2, 17, 300), (1, 8, 8, 131072, 131072), (70000, 1, 1, 1, 1),
               (3, 32, 1, 100, 7), (1, 70000, 1, 65, 3), (4, 2, 2, 5, 0)]


@pytest.mark.parametrize("B,Hq,Hkv,Sq,Skv", PLAN_SHAPES)
def test_every_plan_names_an_instantiated_kernel_within_limits(B, Hq, Hkv, Sq, Skv):
    for impl in S.VARIANTS:
        for dt in S.DTYPES[impl]:
            for D in (1, 3, 8, 32, 33, 40, 64, 80, 96, 128, 129, 160, 255, 256):
                p = probe(dt, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Skv=Skv, D=D)
                assert S.supports(impl, p) is None
                pl = S.plan(impl, p, 132)
                assert pl.launches
                for ln in pl.launches:
                    assert ln.name in S.KERNELS.name_expressions, ln.name
                    assert 1 <= ln.grid[0] < 2**31 and ln.grid[1] == ln.grid[2] == 1, ln
                    assert 1 <= math.prod(ln.block) <= 1024
                    assert ln.smem <= SMEM_OPTIN_SM80, (ln.name, ln.smem)
                if impl == "naive":
                    assert pl.workspace == B * Hq * Sq * Skv
                    assert len(pl.launches) == (3 if Skv else 2)
                else:
                    assert pl.workspace == 0 and len(pl.launches) == 1
                if impl == "flash_v1":
                    tier = int(pl.launches[0].name.split(", ")[1].rstrip(">"))
                    assert tier >= D and (tier == S.FLASH_V1_TIERS[0] or S.FLASH_V1_TIERS[S.FLASH_V1_TIERS.index(tier) - 1] < D)


def test_flash_v1_shared_memory_by_tier():
    # Q + V + max(K, P) tiles of floats, rows padded by 4: two blocks an SM up to tier 128
    assert [S.flash_v1_smem(t) for t in S.FLASH_V1_TIERS] == [35840, 52224, 101376, 133120]
    assert 2 * (S.flash_v1_smem(128) + 1024) <= 228 * 1024
    assert S.tiled_smem(256) == 84480 and S.tiled_smem(1) == (16 + 64 + 16 * 33 + 32) * 4


def test_supports_of_the_cuda_core_rungs():
    assert S.supports("flash_v1", probe("float32", D=256)) is None
    assert S.supports("flash", probe()).startswith("impl: unknown CUDA-core attention rung 'flash'")
    assert S.supports("tiled", probe(D=300)) == "head_dim: tiled supports 1..256, got 300"
    with pytest.raises(ValueError, match="^head_dim: naive supports 1..256"):
        S.plan("naive", probe(D=0, scale=1.0), 132)


def test_vec_flags():
    p = probe("bfloat16", D=64)
    assert S.vec_flags(p) == S.VEC_Q | S.VEC_K | S.VEC_V
    p.K = types.SimpleNamespace(data=types.SimpleNamespace(ptr=8))  # misaligned pointer
    p.v_strides = (64, 12, 4)  # a stride that is not whole 16-byte vectors
    assert S.vec_flags(p) == S.VEC_Q
    assert S.vec_flags(probe("bfloat16", D=60)) == 0  # head_dim not whole vectors
    assert S.vec_flags(probe("float32", D=60)) == S.VEC_Q | S.VEC_K | S.VEC_V


# ------------------------------------------------------------------------- reference
def direct(q, k, v, scale, seen, softcap=None):
    """Textbook attention, one (batch, head, row) at a time, bshd; seen(i, j) -> bool; each
    scaled score s capped at softcap * tanh(s / softcap) where softcap is given."""
    B, Sq, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    out = np.zeros((B, Sq, Hq, D))
    lse = np.full((B, Hq, Sq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            for i in range(Sq):
                js = [j for j in range(Skv) if seen(i, j)]
                if not js:
                    continue
                s = np.array([scale * float(np.dot(q[b, i, h], k[b, j, hk])) for j in js])
                if softcap:
                    s = np.array([softcap * math.tanh(x / softcap) for x in s])
                w = np.exp(s) / np.sum(np.exp(s))
                out[b, i, h] = sum(wj * v[b, j, hk] for wj, j in zip(w, js))
                lse[b, h, i] = math.log(np.sum(np.exp(s)))
    return out, lse


@pytest.mark.parametrize("Sq,Skv", [(5, 7), (7, 5), (1, 4), (4, 1), (6, 6)])
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
def test_reference_matches_the_textbook_formula(Sq, Skv, causal, align):
    q, k, v = (x.astype(np.float64) for x in qkv(B=2, Sq=Sq, Skv=Skv, Hq=6, Hkv=2, D=5))
    offset = Skv - Sq if align == "bottom_right" else 0
    want, want_lse = direct(q, k, v, 0.7, lambda i, j: not causal or j <= i + offset)
    got, lse = reference.attention(q, k, v, causal=causal, causal_align=align, scale=0.7, return_lse=True)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    np.testing.assert_allclose(lse[np.isfinite(lse)], want_lse[np.isfinite(want_lse)], rtol=1e-12)


@pytest.mark.parametrize("Sq,Skv", [(5, 9), (9, 5), (6, 6)])
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (False, "bottom_right"), (True, "top_left"),
                                          (True, "bottom_right")])
@pytest.mark.parametrize("window", [(2, 1), (0, 0), (3, None), (None, 2), (-1, 0), (1, -1)])
def test_reference_windows_and_caps_match_the_textbook_formula(Sq, Skv, causal, align, window):
    q, k, v = (x.astype(np.float64) for x in qkv(B=1, Sq=Sq, Skv=Skv, Hq=4, Hkv=2, D=5))
    q *= 3  # scores large enough for the cap to bend them
    offset = Skv - Sq if align == "bottom_right" else 0
    left, right = (None if w in (None, -1) else w for w in window)

    def seen(i, j):
        return ((not causal or j <= i + offset) and (left is None or j >= i + offset - left)
                and (right is None or j <= i + offset + right))

    for cap in (None, 2.5):
        want, want_lse = direct(q, k, v, 0.7, seen, softcap=cap)
        got, lse = reference.attention(q, k, v, causal=causal, causal_align=align, scale=0.7, return_lse=True,
                                       window=window, softcap=cap)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
        np.testing.assert_allclose(lse[np.isfinite(lse)], want_lse[np.isfinite(want_lse)], rtol=1e-12)


@pytest.mark.parametrize("window,exc,msg", [
    (3, TypeError, r"^window: expected \(left, right\) or None, got 3"),
    ((1, 2, 3), TypeError, r"^window: expected \(left, right\) or None"),
    ((1.5, 0), TypeError, r"^window: the left side must be an int or None, got float"),
    ((0, True), TypeError, r"^window: the right side must be an int or None, got bool"),
    ((-2, 0), ValueError, r"^window: the left side must be >= 0 \(or -1 / None: unlimited\), got -2"),
])
def test_bad_window(window, exc, msg):
    with pytest.raises(exc, match=msg):
        cupyops.attention(Q, K, V, window=window)


@pytest.mark.parametrize("softcap,exc,msg", [
    ("30", TypeError, "^softcap: expected a positive real number or None, got str"),
    (True, TypeError, "^softcap: expected a positive real number or None, got bool"),
    (-1.0, ValueError, r"^softcap: must be a finite float32 >= 0 \(0: no cap\), got -1.0"),
    (float("inf"), ValueError, "^softcap: must be a finite float32"),
    (1e39, ValueError, "^softcap: must be a finite float32"),
    (1e-30, ValueError, r"^softcap: must be 0 \(no cap\) or at least 1e-06, got 1e-30"),
])
def test_bad_softcap(softcap, exc, msg):
    with pytest.raises(exc, match=msg):
        cupyops.attention(Q, K, V, softcap=softcap)


def test_masks_as_the_kernels_take_them():
    m = A.check_masks(None, None, False, 100)
    assert (m.window_left, m.window_right, m.softcap, m.windowed) == (-1, -1, 0.0, False)
    m = A.check_masks((4, 2), 30, False, 100)
    assert (m.window_left, m.window_right, m.softcap, m.windowed) == (4, 2, 30.0, True)
    m = A.check_masks((4, 2), None, True, 100)  # the causal mask already hides the right side
    assert (m.window_left, m.window_right) == (4, -1)
    m = A.check_masks((np.int64(100), None), 0, False, 100)  # a side that reaches every key hides none
    assert (m.window_left, m.window_right, m.softcap, m.windowed) == (-1, -1, 0.0, False)
    m = A.check_masks([-1, 0], None, False, 100)  # FlashAttention's -1, a list
    assert (m.window_left, m.window_right) == (-1, 0)


def test_rungs_that_cannot_take_masks_say_which_argument():
    from cupyops.ops._attention_problem import masks_reason

    p = types.SimpleNamespace(windowed=True, softcap=0.0)
    assert masks_reason(p, "flash3") == "window: flash3 does not support sliding windows"
    assert masks_reason(p, "flash3", window=True) is None
    p = types.SimpleNamespace(windowed=False, softcap=30.0)
    assert masks_reason(p, "decode", window=True) == "softcap: decode does not support logit soft-capping"


def test_reference_alignments_and_rows_that_see_nothing():
    q, k, v = qkv(Sq=6, Skv=3)
    out, lse = reference.attention(q, k, v, causal=True, causal_align="bottom_right", return_lse=True)
    # bottom_right, q_len 6 > kv_len 3: rows 0..2 see no key (zeros, -inf); row 5 sees all
    assert np.all(out[:, :3] == 0) and np.all(np.isneginf(lse[:, :, :3]))
    assert np.all(np.isfinite(lse[:, :, 3:]))
    full = reference.attention(q, k, v)
    np.testing.assert_allclose(out[:, 5], full[:, 5], rtol=1e-12)
    top = reference.attention(q, k, v, causal=True)  # top_left: row 0 sees key 0 alone
    g = Q.shape[2] // K.shape[2]
    np.testing.assert_allclose(top[:, 0], np.repeat(v[:, 0].astype(np.float64), g, axis=1), rtol=1e-6)
    np.testing.assert_allclose(top[:, 2:], full[:, 2:], rtol=1e-12)  # rows >= kv_len - 1 see every key


def test_reference_gqa_maps_query_heads_to_kv_heads():
    q, k, v = qkv(Hq=6, Hkv=2)
    out = reference.attention(q, k, v)
    for h in range(6):  # heads 0-2 read kv head 0, heads 3-5 kv head 1
        one = reference.attention(q[:, :, h:h + 1], k[:, :, h // 3:h // 3 + 1], v[:, :, h // 3:h // 3 + 1])
        np.testing.assert_allclose(out[:, :, h], one[:, :, 0], rtol=1e-12)
    mqa = reference.attention(q, k[:, :, :1], v[:, :, :1])  # MQA: one kv head for all
    np.testing.assert_allclose(mqa[:, :, 4], reference.attention(q[:, :, 4:5], k[:, :, :1], v[:, :, :1])[:, :, 0])


def test_reference_layouts_scale_and_empty_keys():
    q, k, v = qkv()
    out = reference.attention(q, k, v, scale=0.25)
    t = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v)]
    np.testing.assert_allclose(reference.attention(*t, scale=0.25, layout="bhsd"), out.transpose(0, 2, 1, 3), rtol=1e-12)
    assert not np.allclose(out, reference.attention(q, k, v))
    none, lse = reference.attention(q, k[:, :0], v[:, :0], return_lse=True)
    assert none.shape == q.shape and np.all(none == 0) and np.all(np.isneginf(lse)) and lse.shape == (2, 4, 5)


def test_reference_takes_half_types():
    for name in ("float16", "bfloat16"):
        q, k, v = (x.astype(_dtypes.to_dtype(name)) for x in qkv())
        out = reference.attention(q, k, v)
        assert out.dtype == np.float64
        want = reference.attention(*(x.astype(np.float64) for x in (q, k, v)))
        np.testing.assert_array_equal(out, want)


def test_attention_tolerances():
    tol = reference.TOLERANCE["attention"]
    assert set(tol) == set(_dtypes.FLOAT_TYPES)
    assert tol["float32"] <= 1e-4 and tol["float16"] < tol["bfloat16"] <= 2e-2


def test_rungs_refuse_head_dims_whose_shared_memory_the_gpu_cannot_give(monkeypatch):
    # A GPU with a 99 KB opt-in (consumer Ampere/Ada): flash_v1's head_dim-256 tier needs
    # more, so it says so instead of failing at launch; smaller tiers still run.
    import types as _types

    from cupyops import _launch
    from cupyops.ops import _attention_simt as S

    props = _types.SimpleNamespace(smem_per_block_optin=99 * 1024)
    monkeypatch.setattr(_launch, "device_props", lambda device_id=None: props)
    p = _types.SimpleNamespace(dtype="float16", Hq=4, Hkv=2, D=256)
    reason = S.supports("flash_v1", p)
    assert reason is not None and reason.startswith("head_dim: flash_v1's head_dim-256 tier needs"), reason
    p.D = 64
    assert S.supports("flash_v1", p) is None
