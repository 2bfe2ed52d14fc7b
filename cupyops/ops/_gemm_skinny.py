"""The small-M (LLM decode) GEMM rung of kernels/gemm_skinny.cu, and its launcher.

For M <= 64 a GEMM is a stream over B: (1, 4096, 4096) fp16 reads 32 MB of B and only 8 KB
of A, so the time is B's bytes over the read bandwidth (~7.5 us at 4.3 TB/s on an H200).
``gemm_skinny<T, TA, TB, MT>`` keeps A (MT rows) in shared memory, streams B with 16-byte
loads (8 in flight per thread), multiplies on the tensor cores for fp16/bf16/int8 (mma.sync
with B as the 16-row operand) and on the CUDA cores for float32, and splits K three ways
(mma lanes, the warps of a block, S blocks) so that a few thousand columns fill every SM.
The S partial tiles are summed in a fixed order by the block that finishes last (ticket
counters from ``_arrays.tickets``), so results are bitwise reproducible.

MT, the rows a block handles, is the smallest instantiated size >= M (float32: 1, 2, 4,
8, 16; the mma types: 8, 16, the mma's 8-wide tiles); for 16 < M <= 64 the blocks of
cdiv(M, 16) row groups of one column tile are launched as neighbours and read B through L2
together (one DRAM read), which keeps the accumulators of a thread at <= 64 registers
instead of instantiating 32- and 64-row tiles.

``config`` (see ``CONFIGS``) picks the block shape, spelled ``n<WN>k<WK>``, with ``x1``
for a target of one block per SM instead of two:

- ``n2k4``: 2 column groups x 4 warps along k (256 threads), two blocks per SM: the
  default; tile 128 (fp16/bf16) or 256 (int8, float32) columns; A is re-read from L2 once
  per 128 columns.
- ``n1k8``: 1 column group x 8 warps along k: the narrowest tile (most tiles, fewest
  splits S and partial tiles), A re-read twice as often.
- ``n4k2``: 4 column groups x 2 warps along k: the widest tile (A re-read least), more
  splits.
- ``n2k4x1``: ``n2k4`` aiming at one block per SM: half the splits (fewer partial tiles,
  longer k loops), fewer bytes in flight.
"""
import dataclasses

import numpy as np

from .. import _arrays, _dtypes, _launch
from .._kernels import SPLIT_COMPILE, KernelFile, template_name
from ._gemm_problem import LAYOUTS

VARIANTS = {
    "skinny": "M <= 64 (decode): B streamed once with 16-byte loads, A in shared memory, "
    "mma.sync for fp16/bf16/int8, deterministic split-K (last block reduces in order)",
}
DTYPES = {"skinny": ("float32", "float16", "bfloat16", "int8")}
MAX_M = 64

# Rows per block instantiated per dtype (mma types: tiles of 8 rows).
MT_SIZES = {"float32": (1, 2, 4, 8, 16), "float16": (8, 16), "bfloat16": (8, 16), "int8": (8, 16)}

# config name -> (WN, WK, target blocks per SM, cap on the rows a block handles or None).
# n1k8w4 / n2k4w4 aim at two waves of blocks (more, shorter splits); n1k8m8 handles
# M = 9..16 as two row groups of 8 (the MT = 8 kernel) instead of one of 16. On an H200
# neither helped (results/h200-gemm-sweep.txt): kept for the sweep, never picked.
_CONFIGS = {
    "n2k4": (2, 4, 2, None),
    "n1k8": (1, 8, 2, None),
    "n4k2": (4, 2, 2, None),
    "n2k4x1": (2, 4, 1, None),
    "n1k8w4": (1, 8, 4, None),
    "n2k4w4": (2, 4, 4, None),
    "n1k8m8": (1, 8, 2, 8),
}
CONFIGS = {"skinny": tuple(_CONFIGS)}
# config=None picks among these by how well the grid fills its last wave (pick_config)
AUTO_CONFIGS = ("n1k8", "n2k4", "n4k2")

KQ = 128  # kernels/gemm_skinny.cu skinny::KQ: split and warp k ranges are multiples of it
A_SMEM = 32 * 1024  # skinny::A_SMEM: shared memory for one chunk of staged A (all warps)
_MAX_GRID_X = 2**31 - 1
_MAX_GRID_Y = 65535


def _expressions():
    names = []
    for dt, mts in MT_SIZES.items():
        for ta, tb in LAYOUTS:
            for mt in mts:
                names.append(_name(dt, ta, tb, mt))
    return names


def _name(dtype, ta, tb, mt):
    return template_name("gemm_skinny", _dtypes.cuda_type(dtype), ta, tb, mt)


KERNELS = KernelFile("gemm_skinny.cu", _expressions(), options=SPLIT_COMPILE)


def warp_columns(dtype, tb):
    """skinny::Shape<T, TB>::WNE: the columns one warp covers."""
    if tb:
        return 32
    return 32 * (16 // _dtypes.itemsize(dtype)) if dtype == "float32" else 32 * (4 // _dtypes.itemsize(dtype))


def pick_mt(dtype, M):
    """The smallest instantiated row count >= M, or 16 (row groups) above 16."""
    for mt in MT_SIZES[dtype]:
        if mt >= M:
            return mt
    return MT_SIZES[dtype][-1]


def split_k(K, S):
    """KS, the k range of a split, exactly as the kernel computes it."""
    return _launch.cdiv(_launch.cdiv(K, S), KQ) * KQ if K else 0


def warp_k(ks, wk):
    """KW, the k range of one warp, exactly as the kernel computes it."""
    return _launch.cdiv(_launch.cdiv(ks, wk), KQ) * KQ


def a_chunk(kw, mt, wk, itemsize):
    """KC, the k a warp's chunk of staged A holds, exactly as the kernel computes it."""
    return min(kw, max(KQ, A_SMEM // (mt * wk * itemsize) // KQ * KQ))


def a_pitch(cols, itemsize, tb):
    """Row pitch in bytes of the staged A chunk (the padding keeps the mma fragment reads
    free of bank conflicts)."""
    return _launch.cdiv(cols * itemsize, 128) * 128 + (64 if tb else 32)


@dataclasses.dataclass(frozen=True)
class SkinnyPlan:
    name: str  # name expression
    mt: int  # rows per block
    wn: int  # warps side by side along n
    wk: int  # warps splitting the block's k range
    rg: int  # row groups (cdiv(M, mt))
    nt: int  # column tiles
    bn: int  # columns per tile
    splits: int  # S, blocks along k (gridDim.y)
    ks: int  # k range of a split
    kc: int  # k of staged A per warp and chunk
    grid: tuple
    block: tuple
    smem: int  # dynamic shared memory bytes
    work: int  # accumulators of workspace (0 when splits == 1)
    tickets: int  # ticket counters used (0 when splits == 1)


def _splits(K, tiles, wk, per_sm, sm_count):
    """Splits of K: as many as keep the grid within `per_sm` resident blocks on every SM,
    i.e. one wave of blocks that all stream at once (rounded down: 1.3 waves would leave a
    tail of blocks streaming alone; more splits only add partial tiles), each warp keeping
    at least one KQ-deep range. Tiles enough for the GPU: one split, no workspace."""
    S = 1
    if K > 0 and tiles < per_sm * sm_count:
        S = min(per_sm * sm_count // tiles, max(1, K // (wk * KQ)), _MAX_GRID_Y)
        # drop empty trailing splits; the kernel recomputes the same KS from this S
        S = _launch.cdiv(K, split_k(K, S))
    return S


def pick_config(p, sm_count):
    """The AUTO_CONFIGS entry whose grid fills its last wave of resident blocks best (ties:
    the narrower tile, listed first). Measured on an H200 (benchmarks/NOTES.md item 21):
    at N = 4096 every tile width fills a wave and the narrow n1k8 streams fastest; at
    N = 11008 n1k8 gets 172 tiles and no split (65 % of a wave) while n2k4 gets 86 tiles x 3
    splits (98 %)."""
    best, best_fill = None, -1.0
    for cfg in AUTO_CONFIGS:
        wn, wk, per_sm, _ = _CONFIGS[cfg]
        mt = pick_mt(p.dtype, p.M)
        tiles = p.batch * _launch.cdiv(p.M, mt) * _launch.cdiv(p.N, wn * warp_columns(p.dtype, p.tb))
        blocks = tiles * _splits(p.K, tiles, wk, per_sm, sm_count)
        slots = per_sm * sm_count
        fill = blocks / (_launch.cdiv(blocks, slots) * slots)
        if fill > best_fill + 1e-9:
            best, best_fill = cfg, fill
    return best


def plan(p, config=None, sm_count=132):
    """The launch of ``gemm_skinny`` for problem ``p``: a plain function of numbers, so the
    CPU tier can check it."""
    if p.dtype not in DTYPES["skinny"]:
        raise TypeError(f"gemm impl='skinny' supports {', '.join(DTYPES['skinny'])}, got {p.dtype}")
    if p.M > MAX_M:
        raise ValueError(f"impl: 'skinny' is for M <= {MAX_M} rows, got M={p.M}")
    if config is None:
        config = pick_config(p, sm_count)
    if config not in _CONFIGS:
        raise ValueError(
            f"config: {config!r} is not a skinny configuration; expected one of: {', '.join(_CONFIGS)}"
        )
    wn, wk, per_sm, max_mt = _CONFIGS[config]
    ta, tb = p.layout()
    itemsize = _dtypes.itemsize(p.dtype)
    mt = pick_mt(p.dtype, p.M)
    if max_mt is not None:
        mt = min(mt, max_mt)
    rg = _launch.cdiv(p.M, mt)
    bn = wn * warp_columns(p.dtype, p.tb)
    nt = _launch.cdiv(p.N, bn)
    tiles = p.batch * rg * nt  # output tiles of the whole stack
    S = _splits(p.K, tiles, wk, per_sm, sm_count)
    ks = split_k(p.K, S)
    kc = a_chunk(warp_k(ks, wk), mt, wk, itemsize)
    a_bytes = mt * a_pitch(wk * kc, itemsize, p.tb)
    red_bytes = wn * wk * 16 * 32 * 4  # 16 accumulators x 32 lanes x 4 bytes a warp
    smem = max(a_bytes, red_bytes)
    if rg * nt > _MAX_GRID_X:
        raise ValueError(f"gemm impl='skinny': N={p.N} needs more than {_MAX_GRID_X} blocks")
    work = p.batch * rg * nt * S * mt * bn if S > 1 else 0
    return SkinnyPlan(
        name=_name(p.dtype, ta, tb, mt), mt=mt, wn=wn, wk=wk, rg=rg, nt=nt, bn=bn, splits=S,
        ks=ks, kc=kc, grid=(rg * nt, S, p.grid_z()), block=(32, wk, wn), smem=smem,
        work=work, tickets=tiles if S > 1 else 0,
    )


_PLANS = {}  # memoized plans (GemmProblem.shape_key, config, SMs)


def launch(impl, p, config=None):
    """Run ``gemm_skinny`` on problem ``p`` on CuPy's current stream."""
    if impl != "skinny":
        raise ValueError(f"impl: unknown gemm_skinny rung {impl!r}; expected skinny")
    if p.M == 0 or p.N == 0 or p.batch == 0:
        return  # nothing to write
    props = _launch.device_props()
    pl = _launch.memo(_PLANS, (p.shape_key(), config, props.sm_count),
                      lambda: plan(p, config, props.sm_count))
    fn = KERNELS.function(pl.name)
    _launch.request_smem(fn, pl.smem, props, "gemm_skinny")
    if pl.splits > 1:
        cp = _arrays.cupy_module()
        work = cp.empty(pl.work, dtype=np.int32 if p.is_int else np.float32)
        tickets = _arrays.tickets(pl.tickets)
    else:
        work = tickets = p.D  # never dereferenced with one split
    fn(pl.grid, pl.block, p.args() + (work, tickets), shared_mem=pl.smem)
