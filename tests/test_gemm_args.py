"""CPU tier for matmul / gemm: bad input raises TypeError/ValueError naming the argument
before anything touches a GPU (NumPy operands: no CuPy or GPU needed), ``out`` untouched;
the variant table; the batch lowering's choice of strides and launches."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cupyops
from cupyops.ops import gemm as G

A = np.ones((4, 8), np.float32)
B = np.ones((8, 5), np.float32)


@pytest.mark.parametrize("dtype", [np.bool_, np.complex64, np.int32, np.float64, np.uint8])
def test_rejects_dtypes(dtype):
    with pytest.raises(TypeError, match=r"^a: dtype .* is not supported; expected one of float32, float16, bfloat16, int8"):
        cupyops.matmul(np.ones((2, 3), dtype), np.ones((3, 2), dtype))


def test_mixed_dtypes_name_b():
    with pytest.raises(TypeError, match=r"^b: dtype float16 does not match a's float32"):
        cupyops.matmul(A, B.astype(np.float16))


def test_inner_dimension_mismatch():
    with pytest.raises(ValueError, match=r"^b: inner dimensions do not match: op\(a\) is 4x8 and op\(b\) is 7x5"):
        cupyops.matmul(A, np.ones((7, 5), np.float32))
    with pytest.raises(ValueError, match=r"^b: inner dimensions"):
        cupyops.gemm(A, B, trans_b=True)
    # trans_a turns 8x4 storage into the 4x8 operand
    with pytest.raises(ValueError, match=r"^b: inner dimensions do not match: op\(a\) is 8x4"):
        cupyops.gemm(A, B, trans_a=True)


def test_ndim_rules():
    with pytest.raises(ValueError, match="^a: matmul needs at least 1 dimension"):
        cupyops.matmul(np.float32(1), B)
    with pytest.raises(ValueError, match="^b: matmul needs at least 1 dimension"):
        cupyops.matmul(A, np.float32(1))
    with pytest.raises(ValueError, match="^a: expected at least 2 dimension"):
        cupyops.gemm(np.ones(8, np.float32), B)


def test_batch_dimensions_must_broadcast():
    with pytest.raises(ValueError, match=r"^b: batch dimensions \(3,\) do not broadcast"):
        cupyops.matmul(np.ones((2, 4, 8), np.float32), np.ones((3, 8, 5), np.float32))


def test_scalars():
    with pytest.raises(TypeError, match="^alpha: expected a real number"):
        cupyops.gemm(A, B, alpha="2")
    with pytest.raises(ValueError, match="^beta: a nonzero beta needs c"):
        cupyops.gemm(A, B, beta=1.0)
    with pytest.raises(ValueError, match="^alpha: must be finite"):
        cupyops.gemm(A, B, alpha=float("inf"))
    with pytest.raises(ValueError, match="^alpha: .* out of float32 range"):
        cupyops.gemm(A, B, alpha=1e39)
    a8, b8 = A.astype(np.int8), B.astype(np.int8)
    with pytest.raises(ValueError, match="^alpha: int8 GEMM takes an integer"):
        cupyops.gemm(a8, b8, alpha=0.5)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="^alpha: must be finite"):
            cupyops.gemm(a8, b8, alpha=bad)
    with pytest.raises(ValueError, match="^beta: int8 GEMM takes an integer in the int32 range"):
        cupyops.gemm(a8, b8, np.zeros((4, 5), np.int32), beta=2**31)
    with pytest.raises(TypeError, match="^trans_a: expected a bool"):
        cupyops.gemm(A, B, trans_a=1)


def test_c_checks():
    with pytest.raises(TypeError, match="^c: dtype float16 is not supported; expected one of float32"):
        cupyops.gemm(A, B, np.ones((4, 5), np.float16), beta=1)
    with pytest.raises(TypeError, match="^c: dtype float32 is not supported; expected one of int32"):
        cupyops.gemm(A.astype(np.int8), B.astype(np.int8), np.ones((4, 5), np.float32), beta=1)
    with pytest.raises(ValueError, match=r"^c: shape \(4, 6\) does not broadcast"):
        cupyops.gemm(A, B, np.ones((4, 6), np.float32), beta=1)
    with pytest.raises(ValueError, match=r"^c: shape \(2, 4, 5\) would broadcast the result"):
        cupyops.gemm(A, B, np.ones((2, 4, 5), np.float32), beta=1)


def test_out_checks_leave_out_untouched():
    for out, exc, msg in [
        (np.full((4, 6), 7, np.float32), ValueError, r"^out: expected shape \(4, 5\)"),
        (np.full((4, 5), 7, np.float16), TypeError, "^out: expected dtype float32"),
        (np.full((5, 4), 7, np.float32).T, ValueError, "^out: must be C-contiguous"),
    ]:
        before = out.copy()
        with pytest.raises(exc, match=msg):
            cupyops.matmul(A, B, out=out)
        assert np.array_equal(out, before)
    with pytest.raises(TypeError, match="^out: expected dtype int32"):
        cupyops.matmul(A.astype(np.int8), B.astype(np.int8), out=np.zeros((4, 5), np.int8))


def test_impl_checks():
    with pytest.raises(ValueError, match="^impl: unknown variant 'fast' for matmul"):
        cupyops.matmul(A, B, impl="fast")
    with pytest.raises(TypeError, match="^impl: 'pipelined' supports float32, not float16"):
        cupyops.matmul(A.astype(np.float16), B.astype(np.float16), impl="pipelined")
    with pytest.raises(TypeError, match="^impl: 'wmma' supports float16, bfloat16, not int8"):
        cupyops.matmul(A.astype(np.int8), B.astype(np.int8), impl="wmma")
    with pytest.raises(ValueError, match="^impl: 'skinny' is for M <= 64"):
        cupyops.matmul(np.ones((65, 8), np.float32), B, impl="skinny")


def test_mixed_placement():
    with pytest.raises(TypeError, match="^b: must live where a does"):
        cupyops.matmul(A, type("FakeCupy", (), {"__module__": "cupy.fake", "dtype": np.float32,
                                                "ndim": 2, "shape": (8, 5)})())


def test_variant_table():
    v = cupyops.variants("matmul")
    assert list(v) == ["naive", "tiled", "regblock", "pipelined", "wmma", "mma", "wgmma", "wgmma_ws", "skinny"]
    assert cupyops.variants("gemm") == v
    for impl, line in v.items():
        assert line.startswith("[") and len(line) > 20, (impl, line)
    assert G.dtypes_of("naive") == G.GEMM_TYPES
    assert G.dtypes_of("mma") == ("float16", "bfloat16", "int8")
    assert G.dtypes_of("skinny") == G.GEMM_TYPES
    assert G.dtypes_of("wgmma") == G.dtypes_of("wgmma_ws") == ("float16", "bfloat16")


@pytest.mark.parametrize("dtype,M,expected", [("float32", 1, "skinny"), ("float16", 1, "mma"),
                                              ("bfloat16", 64, "mma"), ("int8", 64, "skinny"),
                                              ("float32", 64, "skinny"), ("float32", 65, "pipelined"),
                                              ("bfloat16", 4096, "mma"), ("int8", 8192, "mma")])
def test_auto_choice(dtype, M, expected):
    assert G.auto_impl(dtype, M, 4096, 4096) == expected


class _FakeCupy:
    """Just enough of cupy for the batch lowering (NumPy arrays stand in for device ones)."""

    @staticmethod
    def broadcast_to(x, shape):
        return np.broadcast_to(x, shape)

    @staticmethod
    def ascontiguousarray(x):
        return np.ascontiguousarray(x)


def _lower(a, b, c=None, ta=False, tb=False):
    M, K = (a.shape[-1], a.shape[-2]) if ta else a.shape[-2:]
    N = b.shape[-2] if tb else b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    d = np.empty(tuple(batch) + (M, N), np.float32)
    return list(G._problems("float32", ta, tb, M, N, K, a, b, c, d, batch, 1.0, 1.0 if c is not None else 0.0,
                            _FakeCupy))


def test_lowering_strides_and_layouts():
    a = np.ones((6, 4, 8), np.float32)
    b = np.ones((8, 5), np.float32)
    (p,) = _lower(a, b)  # b broadcast over the stack: one launch, batch stride 0
    assert (p.batch, p.sA, p.sB, p.sD, p.lda, p.ldb, p.ldd) == (6, 32, 0, 20, 8, 5, 5)
    assert (p.ta, p.tb) == (False, False)
    (p,) = _lower(np.asfortranarray(np.ones((4, 8), np.float32)), b)  # a.T-style view: TA flips
    assert (p.ta, p.lda) == (True, 4)
    (p,) = _lower(np.ones((8, 4), np.float32).T, np.ones((5, 8), np.float32), tb=True)
    assert (p.ta, p.tb, p.lda, p.ldb) == (True, True, 4, 8)
    ps = _lower(np.ones((4, 1, 3, 8), np.float32), np.ones((1, 2, 8, 5), np.float32))
    # (4, 1) against (1, 2): the inner dimension is one stride for every operand, the outer
    # one is not (b does not move along it) -> 4 launches of a batch of 2
    assert len(ps) == 4 and all(p.batch == 2 and p.sA == 0 and p.sB == 40 and p.sD == 15 for p in ps)
    (p,) = _lower(np.ones((4, 8), np.float32), b, c=np.ones(5, np.float32))  # c: a row, broadcast
    assert (p.ldc, p.sC) == (0, 0)


def _problem(dt, M, N, K, tb=False, batch=1):
    from cupyops.ops._gemm_problem import GemmProblem

    return GemmProblem(dt, False, tb, M, N, K, None, None, None, None, K, K if tb else N, N, N,
                       0, 0, 0, 0, batch, 1.0, 0.0)


@pytest.mark.parametrize("M,N,K,expected", [(1, 4096, 4096, "n1k8"), (16, 4096, 4096, "n1k8"),
                                            (1, 11008, 4096, "n2k4")])
def test_skinny_picks_the_best_filled_wave(M, N, K, expected):
    # measured on an H200 (benchmarks/NOTES.md item 21)
    assert G._gemm_skinny.pick_config(_problem("float16", M, N, K), 132) == expected


@pytest.mark.parametrize("dt", G.GEMM_TYPES)
@pytest.mark.parametrize("M,N,K,tb,batch", [(1, 4096, 4096, False, 1), (16, 11008, 4096, True, 1),
                                            (64, 17, 1823, False, 3), (5, 1, 1, True, 70000),
                                            (33, 300, 0, False, 1)])
def test_skinny_plans_cover_the_problem(dt, M, N, K, tb, batch):
    sk = G._gemm_skinny
    p = _problem(dt, M, N, K, tb, batch)
    for cfg in (None, *sk.CONFIGS["skinny"]):
        pl = sk.plan(p, cfg, 132)
        assert pl.rg * pl.mt >= M and pl.nt * pl.bn >= N and pl.splits * pl.ks >= K
        assert pl.grid[2] == min(batch, 65535) and 32 * pl.wk * pl.wn <= 256
        assert (pl.work > 0) == (pl.splits > 1)
        assert pl.name in sk.KERNELS.name_expressions and pl.smem <= SMEM_OPTIN


SHAPES = [(1, 1, 1), (17, 1823, 129), (4096, 4096, 4096), (8192, 8192, 8192), (300, 40, 5000),
          (2**20, 2**16, 8)]
SMEM_OPTIN = 232448  # H100/H200 MaxSharedMemoryPerBlockOptin


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_every_plan_names_an_instantiated_kernel_within_limits(M, N, K):
    # what the launchers would launch, for every rung, dtype, layout and config: the kernel
    # must be one the module compiles, the grid legal, the shared memory within the opt-in
    mods = {"simt": (G._gemm_simt, G._gemm_simt.geometry), "mma": (G._gemm_mma, G._gemm_mma.plan)}
    for mod, plan in mods.values():
        for impl in mod.VARIANTS:
            for dt in mod.DTYPES[impl]:
                for ta in (False, True):
                    for tb in (False, True):
                        p = _problem(dt, M, N, K, tb, batch=70000 if M == 1 else 1)
                        p.ta = ta
                        for cfg in (None, *mod.CONFIGS.get(impl, ())):
                            # mma: the cp.async feed, and the sm_90 tensor-copy one
                            for tma in (False, True) if mod is G._gemm_mma else (False,):
                                pl = plan(impl, p, cfg, 132, tma=True) if tma else plan(impl, p, cfg, 132)
                                name, grid, block, smem = pl
                                assert name in mod.KERNELS.name_expressions, name
                                assert name.startswith("gemm_mma_tma<") == (
                                    tma and impl == "mma" and dt in ("float16", "bfloat16") and not ta and tb), name
                                assert grid[0] < 2**31 and grid[1] <= 65535 and grid[2] <= 65535
                                assert 0 < grid[0] * grid[1] and 1 <= _prod(block) <= 1024
                                assert smem <= SMEM_OPTIN, (name, smem)


def _prod(t):
    out = 1
    for v in t:
        out *= v
    return out


def test_mma_split_k_plan():
    # decode shapes whose 64x128 tiles leave most SMs idle split K (fp16/bf16, one product)
    p = _problem("float16", 1, 4096, 4096, False)
    sp = G._gemm_mma.split_plan("mma", p, None, 132)
    assert sp is not None and sp.name in G._gemm_mma.KERNELS.name_expressions
    assert sp.reduce in G._gemm_mma.KERNELS.name_expressions
    assert sp.grid == (32, 1, sp.splits) and sp.splits * sp.ks >= 4096 > (sp.splits - 1) * sp.ks
    assert sp.ks % 64 == 0 and sp.ks >= 256 and 32 * sp.splits <= 2 * 132 + 32
    assert G._gemm_mma.split_plan("mma", _problem("float16", 1, 8192, 4096, False), None, 132) is None
    assert sp.smem <= SMEM_OPTIN
    for p, cfg in ((_problem("float16", 4096, 4096, 4096, False), None),  # fills the GPU
                   (_problem("float16", 1, 11008, 4096, False), None),  # 86 tiles: enough
                   (_problem("int8", 1, 4096, 4096, False), None),  # not instantiated
                   (_problem("float16", 1, 4096, 4096, False, batch=2), None),  # a stack
                   (_problem("bfloat16", 1, 4096, 500, False), None),  # K too short to split
                   (_problem("float16", 1, 4096, 4096, False), "64x128")):  # forced tile
        assert G._gemm_mma.split_plan("mma", p, cfg, 132) is None
    assert G._gemm_mma.split_plan("wmma", _problem("float16", 1, 4096, 4096, False), None, 132) is None


@settings(max_examples=200, deadline=None)
@given(M=st.integers(1, 200), N=st.integers(1, 5000), K=st.integers(1, 20000))
def test_mma_split_k_covers_k(M, N, K):
    sp = G._gemm_mma.split_plan("mma", _problem("bfloat16", M, N, K, True), None, 132)
    if sp is not None:
        assert sp.splits >= 2 and sp.ks % 64 == 0
        assert (sp.splits - 1) * sp.ks < K <= sp.splits * sp.ks  # no empty split, all of K
        assert sp.splits <= 65535 and sp.grid[0] * 3 <= 132


class _Dev:
    """A stand-in for a CuPy array: only the device address tma_maps reads."""

    def __init__(self, ptr):
        self.data = type("Ptr", (), {"ptr": ptr})()


def _tma_problem(ta, tb, M=300, N=520, K=712, lda=None, ldb=None, sA=0, sB=0, batch=1, a_ptr=1 << 20):
    from cupyops.ops._gemm_problem import GemmProblem

    lda = lda or (M if ta else K)
    ldb = ldb or (K if tb else N)
    return GemmProblem("bfloat16", ta, tb, M, N, K, _Dev(a_ptr), _Dev(2 << 20), None, None, lda, ldb, N, N,
                       sA, sB, 0, 0, batch, 1.0, 0.0)


def test_tma_maps_describe_both_k_contiguous_operands(monkeypatch):
    # A (M x K) and B (N x K) as (K, rows, batch) 16-bit elements, rows ld * 2 bytes apart,
    # in boxes of 64 x (tile rows) x 1
    mod = G._gemm_mma
    calls = []
    monkeypatch.setattr(mod._tma, "encode_tiled", lambda *a: calls.append(a) or ("map", len(calls)))
    p = _tma_problem(False, True, M=296, sA=712 * 296 + 8, batch=3)
    assert mod.tma_maps(p, "128x256") == (("map", 1), ("map", 2))
    (a_ptr, a_dims, a_strides, a_box), (b_ptr, b_dims, b_strides, b_box) = calls
    assert (a_ptr, b_ptr) == (1 << 20, 2 << 20)
    assert a_dims == (712, 296, 3) and a_strides == (2 * 712, 2 * p.sA) and a_box == (64, 128, 1)
    # B does not step with the batch (sB = 0): one entry, whose stride is never used
    assert b_dims == (712, 520, 1) and b_strides[0] == 2 * 712 and b_strides[1] % 16 == 0
    assert b_box == (64, 256, 1)


def test_tma_maps_refuse_what_tensor_copies_cannot_read(monkeypatch):
    mod = G._gemm_mma
    monkeypatch.setattr(mod._tma, "encode_tiled", lambda *a: "map")
    assert mod.tma_maps(_tma_problem(False, True), "128x128") == ("map", "map")
    for p in (_tma_problem(False, True, a_ptr=(1 << 20) + 2),  # start not 16-byte aligned
              _tma_problem(False, True, K=701),  # rows 1402 bytes apart
              _tma_problem(False, True, sA=712 * 300 + 4, batch=2),  # batch stride
              _tma_problem(False, True, K=0),  # nothing to copy
              _tma_problem(False, False), _tma_problem(True, True), _tma_problem(True, False)):  # layouts
        assert mod.tma_maps(p, "128x128") is None
    p = _tma_problem(False, True)
    p.dtype = "int8"  # the int8 rung keeps cp.async
    assert mod.tma_maps(p, "128x128") is None
    monkeypatch.setattr(mod._tma, "encode_tiled", lambda *a: None)  # the driver refuses
    assert mod.tma_maps(_tma_problem(False, True), "128x128") is None
