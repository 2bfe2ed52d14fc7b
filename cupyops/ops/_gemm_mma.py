"""The tensor-core GEMM rungs of kernels/gemm_mma.cu, and their launchers.

``launch(impl, p, config=None)`` launches rung ``impl`` on the ``GemmProblem`` ``p`` on
CuPy's current stream: ``wmma`` (float16, bfloat16) and ``mma`` (float16, bfloat16, and
int8 -> int32 through ``gemm_mma_s8``).

``config`` (``mma`` only; see ``CONFIGS``) forces a block-tile configuration, spelled
``<BM>x<BN>``. Every one stages 128 bytes of K per pipeline stage (BK = 64 for 16-bit
types, 128 for int8) and gives each warp a 64x64 (or 32x64) tile of 16x8 mma outputs:

- ``128x256``: 8 warps (2 x 4) of 64x64, 3 stages, 144 KB of shared memory, one block an
  SM. The default for large problems.
- ``256x128``: the same turned over (8 warps, 4 x 2).
- ``128x128``: 4 warps (2 x 2) of 64x64, 3 stages, 96 KB, two blocks share an SM (one
  block's barriers and epilogue hide under the other's mma). For mid-sized problems.
- ``64x128``: 4 warps (2 x 2) of 32x64, 4 stages, 96 KB, two blocks an SM: four times the
  blocks of the large tiles, for problems that would leave SMs idle.

``None`` picks by a wave model: for each configuration, waves = ceil(tiles / (SMs x
blocks per SM)), cost = waves x (blocks per SM) x BM x BN / efficiency (guessed relative
mma.sync efficiency of the tile shape: 1.0, 1.0, 0.85, 0.7); the cheapest wins, ties to
the larger tile. ``plan()`` is the one place that chooses the kernel, so a later sm_90a
wgmma rung slots in there.

On sm_90 and later, a float16 / bfloat16 ``mma`` product with both operands K-contiguous
(A stored M x K, B stored N x K: ``x @ w.T`` for a linear layer's weight ``w``) and
16-byte aligned (start, rows and batch stride) runs ``gemm_mma_tma``: the same kernel with
its stages filled by tensor copies (TMA: one thread issues one copy per operand a stage,
completion on mbarriers) instead of every thread's cp.async; its operands are described
by tensor maps encoded on the host (``tma_maps``, cupyops/_tma.py). Measured 5-7 % faster
than cp.async there; for M/N-contiguous operands tensor copies were 3-5 % slower (NOTES
50), so the other layouts, unaligned operands, and ``TMA_FEED = False`` (the sweep
compares the two feeds) keep the cp.async feed.

Split-K (``split_plan``): a float16 / bfloat16 product whose 64x128 tiles would cover at
most a third of the SMs (decode shapes: 1 x 4096 @ 4096 x 4096 is 32 tiles) splits K so
that the tiles x splits fill two blocks an SM; each split stores fp32 partials
(``gemm_mma_splitk``) and ``gemm_splitk_reduce`` adds them in order and applies alpha,
beta and C. Only for ``config=None`` and a single product.
"""
import dataclasses

import numpy as np

from .. import _dtypes, _fast, _launch, _tma
from .._kernels import SPLIT_COMPILE, KernelFile, template_name
from ._gemm_problem import LAYOUTS, check_rung

VARIANTS = {
    "wmma": "nvcuda::wmma 16x16x16 tensor-core fragments, 64x64 block tile staged in padded shared "
    "memory, no pipelining: the textbook tensor-core GEMM",
    "mma": "mma.sync from PTX fed by ldmatrix from an XOR-swizzled 3-4 stage cp.async ring "
    "(on sm_90 tensor copies with mbarriers for aligned K-contiguous 16-bit operands), "
    "128x256 block tiles of 64x64 warp tiles, double-buffered fragments, grouped block order; "
    "int8 through mma.m16n8k32, M/N-contiguous int8 operands regrouped from ldmatrix.trans by prmt",
}
DTYPES = {
    "wmma": ("float16", "bfloat16"),
    "mma": ("float16", "bfloat16", "int8"),
}


# config name -> (BM, BN, WM, WN, STAGES, MIN_BLOCKS): block tile, warp tile, ring depth,
# blocks per SM the registers are budgeted for (__launch_bounds__); per dtype family
_MMA = {
    "128x256": (128, 256, 64, 64, 3, 1),
    "256x128": (256, 128, 64, 64, 3, 1),
    "128x128": (128, 128, 64, 64, 3, 2),
    "64x128": (64, 128, 32, 64, 4, 2),
}
# Guessed relative efficiency of a tile shape at full occupancy (for the wave model).
_EFFICIENCY = {"128x256": 1.0, "256x128": 1.0, "128x128": 0.85, "64x128": 0.7}
CONFIGS = {"wmma": (), "mma": tuple(_MMA)}

TMA_TYPES = ("float16", "bfloat16")
TMA_LAYOUT = ("false", "true")  # (TA, TB): both operands K-contiguous
TMA_BOX_K = 64  # elements of K a box holds: 128 bytes of a 16-bit type
# Run gemm_mma_tma where it applies (sm_90+, the layout above, aligned 16-bit operands).
# False: always the cp.async feed (for comparing the two; the GPU tests run both).
TMA_FEED = True

WMMA_TILE = 64
WMMA_THREADS = 128
STAGE_K_BYTES = 128  # bytes of K per pipeline stage, every dtype

_MAX_GRID_X = 2**31 - 1


def mma_params(cfg, dtype):
    """(BM, BN, WM, WN, STAGES, MIN_BLOCKS) of configuration ``cfg`` (the same for every
    dtype: a stage is 128 bytes of K either way)."""
    return _MMA[cfg]


def mma_threads(cfg, dtype):
    bm, bn, wm, wn = mma_params(cfg, dtype)[:4]
    return 32 * (bm // wm) * (bn // wn)


def mma_smem(cfg, dtype, tma=False):
    """Dynamic shared memory of gemm_mma / gemm_mma_s8: the STAGES-deep ring of (BM + BN)
    rows of 128 bytes, or the epilogue's BM x (BN + 8) 32-bit accumulators if larger;
    gemm_mma_tma adds an 8-byte mbarrier a stage and 1 KB to align the ring to 1024 bytes."""
    bm, bn, _, _, stages, _ = mma_params(cfg, dtype)
    base = max(stages * (bm + bn) * STAGE_K_BYTES, bm * (bn + 8) * 4)
    return base + 8 * stages + _tma.SWIZZLE_ATOM_BYTES if tma else base


def pick_config(p, sm_count):
    """The tile configuration for problem ``p`` on a GPU of ``sm_count`` SMs (wave model,
    see the module docstring)."""
    best, best_cost = None, None
    for cfg in ("128x256", "128x128", "64x128"):
        bm, bn, _, _, _, per_sm = mma_params(cfg, p.dtype)
        tiles = _launch.cdiv(p.M, bm) * _launch.cdiv(p.N, bn) * p.batch
        waves = _launch.cdiv(tiles, sm_count * per_sm)
        cost = waves * per_sm * bm * bn / _EFFICIENCY[cfg]
        if best_cost is None or cost < best_cost:
            best, best_cost = cfg, cost
    return best


def _name(impl, dtype, ta, tb, cfg=None, tma=False):
    if tma:
        return template_name("gemm_mma_tma", _dtypes.cuda_type(dtype), ta, tb, *mma_params(cfg, dtype))
    if impl == "wmma":
        return template_name("gemm_wmma", _dtypes.cuda_type(dtype), ta, tb)
    if dtype == "int8":
        return template_name("gemm_mma_s8", ta, tb, *mma_params(cfg, dtype))
    return template_name("gemm_mma", _dtypes.cuda_type(dtype), ta, tb, *mma_params(cfg, dtype))


SPLIT_CONFIG = "64x128"  # the tile split-K runs (the small-M one)
SPLIT_TYPES = ("float16", "bfloat16")
SPLIT_MIN_K_TILES = 4  # each split covers at least this many 128-byte k-tiles
# Split when the plain 64x128 tiles would cover at most a third of the SMs; the splits aim
# at SPLIT_BLOCKS_PER_SM blocks an SM. Measured on an H100 (gemm_sweep --only mma_decode):
# 32 tiles (N = 4096) split 8 ways 0.81-0.91x cuBLAS against 0.50-0.57x unsplit; 64 tiles
# (N = 8192) 0.77x split against 0.80x unsplit.
SPLIT_MAX_TILE_FRACTION = 3
SPLIT_BLOCKS_PER_SM = 2


def _split_name(dtype, ta, tb):
    return template_name("gemm_mma_splitk", _dtypes.cuda_type(dtype), ta, tb, *mma_params(SPLIT_CONFIG, dtype))


def _reduce_name(dtype):
    return template_name("gemm_splitk_reduce", _dtypes.cuda_type(dtype))


def _expressions():
    names = []
    for dtype in DTYPES["wmma"]:
        names += [_name("wmma", dtype, ta, tb) for ta, tb in LAYOUTS]
    for dtype in DTYPES["mma"]:
        for ta, tb in LAYOUTS:
            names += [_name("mma", dtype, ta, tb, cfg) for cfg in _MMA]
        if dtype in TMA_TYPES:
            names += [_name("mma", dtype, *TMA_LAYOUT, cfg, tma=True) for cfg in _MMA]
    for dtype in SPLIT_TYPES:
        names += [_split_name(dtype, ta, tb) for ta, tb in LAYOUTS] + [_reduce_name(dtype)]
    return names


KERNELS = KernelFile("gemm_mma.cu", _expressions(), options=SPLIT_COMPILE)
KERNEL_FILES = [KERNELS]


def plan(impl, p, config=None, sm_count=132, tma=False):
    """(kernel name, grid, block, dynamic shared memory bytes) for rung ``impl`` on ``p``:
    the one place that chooses the kernel; a plain function of numbers so the CPU tier can
    check it. ``tma``: the tensor-copy feed where the dtype and layout have it (the caller
    checks the device, and ``tma_maps`` the operands)."""
    check_rung("gemm_mma", impl, p.dtype, config, VARIANTS, DTYPES, CONFIGS)
    ta, tb = p.layout()
    gz = p.grid_z()
    cdiv = _launch.cdiv
    if impl == "wmma":
        tiles = cdiv(p.M, WMMA_TILE) * cdiv(p.N, WMMA_TILE)
        return _name(impl, p.dtype, ta, tb), (min(tiles, _MAX_GRID_X), 1, gz), (WMMA_THREADS,), 0
    cfg = config or pick_config(p, sm_count)
    bm, bn = mma_params(cfg, p.dtype)[:2]
    tiles = cdiv(p.M, bm) * cdiv(p.N, bn)
    tma = tma and tma_layout(p)
    return (_name(impl, p.dtype, ta, tb, cfg, tma), (min(tiles, _MAX_GRID_X), 1, gz),
            (mma_threads(cfg, p.dtype),), mma_smem(cfg, p.dtype, tma))


def tma_layout(p):
    """Does ``p`` have the dtype and layout gemm_mma_tma is built for?"""
    return p.dtype in TMA_TYPES and p.layout() == TMA_LAYOUT


def tma_maps(p, cfg):
    """The tensor maps gemm_mma_tma takes for A and B of ``p`` under configuration ``cfg``,
    or None where the problem does not qualify (dtype, layout, K = 0, an operand not 16-byte
    aligned, or the driver refuses): the cp.async feed then runs. Each operand is (K, rows,
    batch) 16-bit elements, its rows ld * 2 bytes apart and its batch entries s * 2 (one
    entry for a broadcast operand, or a single product), in boxes of 64 x (BM or BN) x 1."""
    if not tma_layout(p) or p.K == 0:
        return None
    bm, bn = mma_params(cfg, p.dtype)[:2]
    maps = []
    for arr, ld, stride, rows, box_rows in ((p.A, p.lda, p.sA, p.M, bm), (p.B, p.ldb, p.sB, p.N, bn)):
        ptr = arr.data.ptr
        if ptr % 16 or ld % 8 or stride % 8:
            return None
        entries = p.batch if stride else 1
        batch_bytes = 2 * (stride if stride else ld * rows)  # (unused when one entry)
        m = _tma.encode_tiled(ptr, (p.K, rows, entries), (2 * ld, batch_bytes), (TMA_BOX_K, box_rows, 1))
        if m is None:
            return None
        maps.append(m)
    return tuple(maps)


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    name: str  # gemm_mma_splitk instantiation
    reduce: str  # gemm_splitk_reduce instantiation
    splits: int  # S
    ks: int  # K of each split (a multiple of the 128-byte k-tile)
    grid: tuple  # of the split pass: (tiles, 1, S)
    block: tuple
    smem: int
    reduce_grid: tuple


def splits_k(dtype, M, N, K, batch, sm_count=132):
    """Does ``mma`` (with no forced config) run a problem of these sizes as split-K?"""
    if dtype not in SPLIT_TYPES or batch != 1:
        return False
    bm, bn = mma_params(SPLIT_CONFIG, dtype)[:2]
    tiles = _launch.cdiv(M, bm) * _launch.cdiv(N, bn)
    return SPLIT_MAX_TILE_FRACTION * tiles <= sm_count and K >= 2 * SPLIT_MIN_K_TILES * (STAGE_K_BYTES // 2)


def split_plan(impl, p, config=None, sm_count=132):
    """The split-K launch of ``mma`` for ``p``, or None when the plain plan fills the GPU
    (or the problem is not one product of a 16-bit type, or a config was forced)."""
    if impl != "mma" or config is not None or not splits_k(p.dtype, p.M, p.N, p.K, p.batch, sm_count):
        return None
    bm, bn = mma_params(SPLIT_CONFIG, p.dtype)[:2]
    bk = STAGE_K_BYTES // 2
    tiles = _launch.cdiv(p.M, bm) * _launch.cdiv(p.N, bn)
    S = min(_launch.cdiv(SPLIT_BLOCKS_PER_SM * sm_count, tiles), p.K // (SPLIT_MIN_K_TILES * bk), 65535)
    ks = _launch.cdiv(_launch.cdiv(p.K, S), bk) * bk
    S = _launch.cdiv(p.K, ks)  # no empty trailing split
    ta, tb = p.layout()
    reduce_blocks = min(_launch.cdiv(p.M * p.N, 256), 8 * sm_count)
    return SplitPlan(_split_name(p.dtype, ta, tb), _reduce_name(p.dtype), S, ks, (tiles, 1, S),
                     (mma_threads(SPLIT_CONFIG, p.dtype),), mma_smem(SPLIT_CONFIG, p.dtype),
                     (reduce_blocks,))


def split_launches(sp, p, props):
    """The split-K pass and its reduction for ``p`` as (fn, grid, block, smem, args) each
    (the float32 partials a ``_fast.Work`` piece), and the partials' bytes."""
    fn = KERNELS.function(sp.name)
    _launch.request_smem(fn, sp.smem, props, "gemm_mma (split-K)")
    work = _fast.Work(0)
    i32, i64 = np.int32, np.int64
    beta = p.beta if p.C is not None else 0.0
    return [(fn, sp.grid, sp.block, sp.smem,
             (p.A, p.B, work, i32(p.M), i32(p.N), i32(p.K), i64(p.lda), i64(p.ldb), i32(sp.ks), i32(sp.splits))),
            (KERNELS.function(sp.reduce), sp.reduce_grid, (256,), 0,
             (work, p.C if p.C is not None else p.D, p.D, i32(p.M), i32(p.N), i32(sp.splits), i64(p.ldc),
              i64(p.ldd), np.float32(p.alpha), np.float32(beta)))], (4 * sp.splits * p.M * p.N,)


def fast_launches(impl, p):
    """``p``'s launches and workspace bytes for a fast call (cupyops/_fast.py) where they
    can be replayed on other operands of the same layout: split-K's (its plan a function of
    the shapes alone; its kernels check alignment themselves). None for the other plans,
    whose tensor maps hold the operands' addresses."""
    props = _launch.device_props()
    sp = split_plan(impl, p, None, props.sm_count)
    return None if sp is None else split_launches(sp, p, props)


_PLANS = {}  # memoized (plan, config) per (impl, GemmProblem.shape_key, config, SMs, TMA feed)


def _uses_tma(impl, p, props):
    return TMA_FEED and impl == "mma" and tma_layout(p) and props.cc >= 90 and _tma.available()


def launch(impl, p, config=None):
    """Run rung ``impl`` of gemm_mma on problem ``p`` on CuPy's current stream."""
    if p.M == 0 or p.N == 0 or p.batch == 0:
        return  # nothing to write
    props = _launch.device_props()
    tma = _uses_tma(impl, p, props)

    def build():
        sp = split_plan(impl, p, config, props.sm_count)
        if sp is not None:
            return sp, None
        cfg = None if impl == "wmma" else config or pick_config(p, props.sm_count)
        tma_plan = plan(impl, p, cfg, props.sm_count, tma=True) if tma else None
        return plan(impl, p, cfg, props.sm_count), (cfg, tma_plan)

    pl, extra = _launch.memo(_PLANS, (impl, p.shape_key(), config, props.sm_count, tma), build)
    if isinstance(pl, SplitPlan):
        _fast.launch_checked(*split_launches(pl, p, props))
        return
    args = p.args()
    cfg, tma_plan = extra
    maps = tma_maps(p, cfg) if tma_plan else None
    if maps:
        pl = tma_plan
    name, grid, block, smem = pl
    _launch.Launch(KERNELS, name, grid, block, smem, f"gemm_{impl}")(args + maps if maps else args)
