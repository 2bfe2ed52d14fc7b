"""The Hopper GEMM rungs of kernels/gemm_wgmma.cu (sm_90a: wgmma + TMA), and their launcher.

``launch(impl, p, config=None)`` runs rung ``impl`` on the ``GemmProblem`` ``p`` on CuPy's
current stream, for float16 and bfloat16 on a compute-capability 9.0 GPU (H100, H200):

- ``wgmma``: one warpgroup, 64 x 256 block tiles, a 4-stage ring filled by tensor copies,
  wgmma straight from shared memory, every k-tile waited for before its stage is refilled.
- ``wgmma_ws``: a producer warpgroup and two consumer warpgroups (setmaxnreg) around a
  full/empty mbarrier ring, 128 x BN tiles, one persistent block an SM over the tiles in
  grouped order. With beta == 0 its epilogue stages the tile in shared memory and writes
  it by tensor stores (``output_map``), which run on while the next tile starts.

``config`` (wgmma_ws; ``TILES``): ``128x256`` (4 stages), ``128x192`` (4 stages),
``128x128`` (6 stages), ``128x256c2``, ``128x176c2`` (5 stages) and ``128x128c2``: pairs
of blocks in clusters of 2 that take two tiles stacked along M, each copying its A and
half of the shared B columns, multicast to both (B crosses L2 once for the pair), the
persistent grid as many clusters as the driver says fit at once
(``_launch.max_active_clusters``). ``128x176c2`` takes a K-major B alone (``x @ w.T``:
an N-major B moves in 64-column pieces, ``takes_layout``); its 176 columns cut the
28672-wide Llama MLP weight into 163 tile columns, cuBLAS's tile there. And
``128x256sk``, which ``None`` picks where 128 x 256 wins the wave model and stream-K is
predicted to save at least 1 % (``streamk_gain``: 1-2 % measured at 8192^3 and
4096x28672x4096, a loss where the last round of tiles is nearly full): stream-K for the
tiles past the last whole wave (``streamk_plan``): the k-tiles of those tiles are cut
into ranges, one a block; a block that holds the head of a tile hands its float32 partial
to the block that holds its tail through a workspace, and that block adds them in a fixed
order (results are deterministic for a given SM count) and runs the epilogue once.

``None`` picks by a wave model (``pick_config``): a block's time is taken as BN /
EFFICIENCY[config] and the grid's as the rounds of blocks over the SMs times that; fewer,
wider tiles win ties. The narrower tiles are for problems whose 128 x 256 tiles leave SMs
idle (a 512-token prefill: 512 x 4096 has 64 of them on 132 SMs), where 128 x 128 tiles
go in multicasting pairs.

Both read A and B through tensor maps (cupyops/_tma.py): 3-D (elements, rows, batch)
with the 128-byte swizzle wgmma's descriptors expect; a K-contiguous operand moves in boxes
of 64 K x (tile rows), an M/N-contiguous one in boxes of 64 x 64 that wgmma reads
transposed. A tensor map needs a 16-byte aligned start and row and batch strides that are
nonzero multiples of 16 bytes: a problem whose operands are otherwise runs ``mma``
(gemm_mma.cu), which takes any layout, as does every problem on another GPU under
``impl="auto"``. Naming a wgmma rung on a GPU other than sm_90 is an error.
"""
import dataclasses

import numpy as np

from .. import _launch, _tma
from .._kernels import SPLIT_COMPILE, KernelFile, template_name
from . import _gemm_mma
from ._gemm_problem import LAYOUTS, check_rung

VARIANTS = {
    "wgmma": "sm_90a: wgmma from 128-byte-swizzled shared memory filled by tensor copies (TMA) "
    "in a 4-stage mbarrier ring, one warpgroup on 64x256 tiles, each k-tile waited for",
    "wgmma_ws": "sm_90a: warp-specialised (a TMA producer warpgroup, two wgmma consumer "
    "warpgroups, setmaxnreg) around full/empty mbarriers, persistent over 128x256 (or "
    "128x192, 128x176, 128x128) tiles in grouped order, epilogue by tensor stores",
}
DTYPES = {impl: ("float16", "bfloat16") for impl in VARIANTS}


@dataclasses.dataclass(frozen=True)
class Tile:
    bm: int  # rows of A a block (a tile)
    bn: int  # columns of B a tile
    stages: int  # depth of the ring
    cluster: int = 1  # blocks a cluster, tiles stacked along M
    streamk: bool = False  # the tiles past the last whole wave shared along K by every block


TILES = {
    "wgmma": {None: Tile(64, 256, 4)},
    "wgmma_ws": {"128x256": Tile(128, 256, 4), "128x192": Tile(128, 192, 4), "128x128": Tile(128, 128, 6),
                 "128x256c2": Tile(128, 256, 4, 2), "128x176c2": Tile(128, 176, 5, 2),
                 "128x128c2": Tile(128, 128, 6, 2),
                 "128x256sk": Tile(128, 256, 4, streamk=True)},
}
CONFIGS = {impl: tuple(c for c in TILES[impl] if c is not None) for impl in VARIANTS}
# Relative throughput of a block on each configuration the wave model picks from (a
# narrower tile re-reads A for fewer columns; a pair of 128 x 128 tiles that multicasts B
# reads a quarter less from L2 than two single ones). Guesses that pick each swept shape's
# winner (NOTES 55, 95), not measured ratios: at 4096^3 128 x 192 ran 0.88 and 128 x 128
# 0.91 of 128 x 256, the pair 0.95.
EFFICIENCY = {"128x256": 1.0, "128x192": 0.95, "128x176c2": 0.93, "128x128": 0.85, "128x128c2": 0.9}

ARCH = "sm_90a"
BK = 64  # K of a stage: 128 bytes of a 16-bit type (the swizzle's row)
THREADS = {"wgmma": 128, "wgmma_ws": 384}
STAGING = {"wgmma": 0, "wgmma_ws": 2 * 64 * 128 * 2}  # the epilogue's: 16 KB a consumer warpgroup
PIECE = 64  # rows of an M/N-contiguous operand's box (64 x 64 elements, 8 KB)
_MAX_GRID_X = 2**31 - 1


def tile_of(impl, config):
    """The Tile of rung ``impl`` under ``config`` (a name from CONFIGS; None for wgmma)."""
    return TILES[impl][config]


def takes_layout(tile, tb):
    """Does ``tile`` run with B stored N x K (``tb``) or K x N? An N-major B moves in
    64-column pieces, so its tiles are whole pieces wide (not 176)."""
    return tb or tile.bn % PIECE == 0


def smem(impl, tile):
    """Dynamic shared memory: the ring of (BM + BN) x 64 16-bit elements a stage, the
    epilogue's staging (wgmma_ws), the 1024-byte alignment, two 8-byte mbarriers a stage."""
    return tile.stages * (tile.bm + tile.bn) * BK * 2 + STAGING[impl] + _tma.SWIZZLE_ATOM_BYTES + 16 * tile.stages


def _name(impl, dtype, ta, tb, tile):
    from .. import _dtypes

    t = _dtypes.cuda_type(dtype)
    if impl == "wgmma":
        return template_name("gemm_wgmma", t, ta, tb, tile.stages)
    if tile.streamk:
        return template_name("gemm_wgmma_ws_sk", t, ta, tb, tile.bn, tile.stages)
    return template_name("gemm_wgmma_ws", t, ta, tb, tile.bn, tile.stages, tile.cluster)


def _expressions():
    return [_name(impl, dtype, ta, tb, tile) for impl in VARIANTS for tile in TILES[impl].values()
            for dtype in DTYPES[impl] for ta, tb in LAYOUTS if takes_layout(tile, tb == "true")]


KERNELS = KernelFile("gemm_wgmma.cu", _expressions(), options=SPLIT_COMPILE, arch=ARCH)
KERNEL_FILES = [KERNELS]


def pick_config(p, sm_count):
    """wgmma_ws's tile for problem ``p`` on ``sm_count`` SMs (wave model, module docstring):
    the rounds of blocks over the SMs (a pair takes two tiles stacked along M, so an odd
    row of tiles costs a block that computes zeros) times BN / EFFICIENCY; the wider tile,
    and then the single block, wins a tie. No pairs where M has a single row of tiles.
    Where 128 x 256 wins, its stream-K form where that is predicted to gain
    (``streamk_gain``)."""
    best, best_cost = None, None
    for cfg in EFFICIENCY:
        t = TILES["wgmma_ws"][cfg]
        if p.M <= t.bm * (t.cluster - 1) or not takes_layout(t, p.tb):
            continue
        blocks = _launch.cdiv(p.M, t.bm * t.cluster) * t.cluster * _launch.cdiv(p.N, t.bn) * p.batch
        cost = _launch.cdiv(blocks, sm_count) * t.bn / EFFICIENCY[cfg]
        if best_cost is None or cost < best_cost:
            best, best_cost = cfg, cost
    if best == "128x256" and streamk_gain(p, TILES["wgmma_ws"]["128x256sk"], sm_count) >= SK_MIN_GAIN:
        return "128x256sk"
    return best


# Stream-K: a block's range is at least this many k-tiles where the tiles allow (a partial
# costs its block a 128 KB float32 write and the finishing block a read of it, ~1 us each
# at the L2's share of an SM, against ~0.55 us of wgmmas a k-tile of 128 x 256 on an H100).
SK_MIN_K_TILES = 8
SK_FLAG_WORDS = 64  # the flags (int32, 2 a block) are padded to 256 bytes, gwg::sk_flag_words
# What stream-K costs a call beyond its ranges' k-tiles, in k-tiles of 128 x 256 (the flags'
# memset, a partial written and read by every block at once, the pieces' switches),
# fitted on an H100 to interleaved A/Bs of 128x256sk against 128x256 (NOTES 136): ~18
# k-tiles (~12 us) lost at 4096^3 and 4096 x 6144 x 4096, where it saves 8-12 k-tiles of
# the last wave, and 1-2 % gained at 8192^3 and 4096 x 28672 x 4096, where it saves 60 and
# 53. The wave model takes stream-K where the predicted gain is at least SK_MIN_GAIN of
# the call.
SK_FIXUP_K_TILES = 18
SK_MIN_GAIN = 0.01


@dataclasses.dataclass(frozen=True)
class StreamK:
    dp_tiles: int  # tiles walked whole by the grid (whole waves)
    sk_blocks: int  # blocks that share the k-tiles of the remaining tiles (0: none remain)
    grid: int  # persistent blocks
    flag_bytes: int  # the workspace's flags, zeroed before each launch
    work_bytes: int  # the flags and a float32 partial tile a block
    tiles: int  # the problem's tiles, whole and shared


def streamk_plan(p, tile, sm_count):
    """wgmma_ws's stream-K split of ``p`` on ``sm_count`` SMs (a plain function of numbers):
    the tiles that fill whole waves run whole; the k-tiles of the rest (fewer tiles than
    SMs) are cut into ``sk_blocks`` equal ranges. Where the rest are at most half the SMs,
    each of those tiles is cut into the same number of parts (split-K: ranges on tile
    boundaries, as many parts as fit the SMs with >= ``SK_MIN_K_TILES`` k-tiles each);
    ranges across tile boundaries read B at k offsets apart on tiles that share it and
    measured slower there (NOTES 79, 83). Otherwise as many ranges as the SMs or as give
    each range at least ``SK_MIN_K_TILES`` k-tiles, and never fewer than those tiles."""
    tiles = _launch.cdiv(p.M, tile.bm) * _launch.cdiv(p.N, tile.bn) * p.batch
    kt = _launch.cdiv(p.K, BK)
    dp = tiles // sm_count * sm_count
    rest = tiles - dp
    if 0 < rest <= sm_count // 2:
        # few tiles left: each cut into s equal parts (split-K, ranges on tile boundaries)
        sk_blocks = rest * max(1, min(sm_count // rest, kt // SK_MIN_K_TILES))
    else:
        sk_blocks = min(sm_count, max(rest, rest * kt // SK_MIN_K_TILES)) if rest else 0
    grid = sm_count if dp else sk_blocks
    flags = _launch.cdiv(2 * sk_blocks, SK_FLAG_WORDS) * SK_FLAG_WORDS * 4
    return StreamK(dp, sk_blocks, grid, flags, flags + sk_blocks * tile.bm * tile.bn * 4, tiles)


def streamk_gain(p, tile, sm_count):
    """The share of a data-parallel call of ``tile`` that stream-K is predicted to save: the
    last round's tiles take a whole tile's k-tiles whole, a stream-K range
    (``streamk_plan``) its share plus SK_FIXUP_K_TILES; negative where it loses. 0
    without a whole round of tiles (the fit's shapes all had some; with none, every block
    shares a tile, and item 79 of NOTES measured such calls 7-19 us behind)."""
    sk = streamk_plan(p, tile, sm_count)
    if not sk.sk_blocks or not sk.dp_tiles:
        return 0.0
    kt = _launch.cdiv(p.K, BK)
    rest = sk.tiles - sk.dp_tiles
    data_parallel = _launch.cdiv(sk.tiles, sm_count) * kt
    streamed = sk.dp_tiles // sm_count * kt + _launch.cdiv(rest * kt, sk.sk_blocks) + SK_FIXUP_K_TILES
    return (data_parallel - streamed) / data_parallel


def plan(impl, p, config=None, sm_count=132, clusters=None):
    """(config, ``_launch.Launch``) of rung ``impl`` on problem ``p`` (a plain function of
    numbers: the CPU tier checks it). ``clusters``: how many clusters of a clustered
    configuration fit on the GPU at once (default: SMs / cluster size)."""
    check_rung("gemm_wgmma", impl, p.dtype, config, VARIANTS, DTYPES, CONFIGS)
    if impl == "wgmma_ws" and config is None:
        config = pick_config(p, sm_count)
    t = tile_of(impl, config)
    if not takes_layout(t, p.tb):
        raise ValueError(f"config: {config!r} needs B stored N x K (K-contiguous, as w in x @ w.T): an "
                         f"N-major B moves in 64-column pieces, and its tiles are {t.bn} columns wide")
    if impl == "wgmma_ws" and t.streamk:
        grid = (streamk_plan(p, t, sm_count).grid, 1, 1)
    elif impl == "wgmma_ws":  # persistent: a cluster a slot walks units of `cluster` tiles along M
        units = _launch.cdiv(p.M, t.bm * t.cluster) * _launch.cdiv(p.N, t.bn) * p.batch
        grid = (t.cluster * min(units, clusters or sm_count // t.cluster), 1, 1)
    else:
        tiles = _launch.cdiv(p.M, t.bm) * _launch.cdiv(p.N, t.bn)
        grid = (min(tiles, _MAX_GRID_X), 1, p.grid_z())
    return config, _launch.Launch(KERNELS, _name(impl, p.dtype, *p.layout(), t), grid, (THREADS[impl],),
                                  smem(impl, t), f"gemm impl={impl!r}", t.cluster)


def map_specs(p, tile):
    """(dims, byte strides, box) of the tensor maps of A and B, or None where K == 0.
    Each map is 3-D: the contiguous extent first, then the other, then the batch (one entry
    for a broadcast operand or a single product). K-contiguous operands (A stored M x K,
    B stored N x K) move in boxes of 64 K x the rows a block copies (B: 1/cluster of the
    tile's); M/N-contiguous ones in boxes of 64 M/N x 64 K, several a stage."""
    if p.K == 0:
        return None
    specs = []
    for ld, stride, rows, tile_rows, mn_major in ((p.lda, p.sA, p.M, tile.bm, p.ta),
                                                  (p.ldb, p.sB, p.N, tile.bn // tile.cluster, not p.tb)):
        entries = p.batch if stride else 1
        inner, outer = (rows, p.K) if mn_major else (p.K, rows)
        batch_bytes = 2 * (stride if stride else ld * outer)  # (unused with one entry)
        box = (PIECE, BK, 1) if mn_major else (BK, tile_rows, 1)
        specs.append(((inner, outer, entries), (2 * ld, batch_bytes), box))
    return specs


def tensor_maps(p, tile):
    """The tensor maps of A and B (128 bytes each), or None where a map cannot describe an
    operand (start not 16-byte aligned, a row or batch stride that is not a nonzero
    multiple of 16 bytes, or the driver refuses): the problem then runs ``mma``."""
    specs = map_specs(p, tile)
    if specs is None:
        return None
    maps = []
    for arr, (dims, strides, box) in zip((p.A, p.B), specs):
        if not _tma.describable(arr.data.ptr, *strides):
            return None
        m = _tma.encode_tiled(arr.data.ptr, dims, strides, box)
        if m is None:
            return None
        maps.append(m)
    return tuple(maps)


NO_MAP = _tma.NO_MAP  # stands for mapD where the epilogue stores directly (never read then)


def store_box(tile):
    """(columns, swizzle) of the epilogue's boxes of 64 rows of D (gemm_sm90.cuh
    store_box_cols): 64 in the 128-byte swizzle where the tile is whole such boxes, else
    16 in the 32-byte swizzle."""
    return (PIECE, _tma.SWIZZLE_128B) if tile.bn % PIECE == 0 else (16, _tma.SWIZZLE_32B)


def output_map(p, tile):
    """(tensor map of D, 1) for wgmma_ws's epilogue of tensor stores, or (NO_MAP, 0) where it
    stores directly: beta != 0 (C is read element by element, and may be D), or a D that a
    map cannot describe (rows of a number of elements that is not a multiple of 8). D is
    (N, M, batch) in boxes of ``store_box(tile)`` x 64 x 1."""
    if p.C is not None and p.beta != 0:
        return NO_MAP, 0
    entries = p.batch if p.sD else 1
    strides = (2 * p.ldd, 2 * (p.sD if p.sD else p.ldd * p.M))
    if not _tma.describable(p.D.data.ptr, *strides):
        return NO_MAP, 0
    cols, swizzle = store_box(tile)
    m = _tma.encode_tiled(p.D.data.ptr, (p.N, p.M, entries), strides, (cols, PIECE, 1), swizzle)
    return (NO_MAP, 0) if m is None else (m, 1)


def runs_here(props):
    """Does this GPU run the wgmma rungs (sm_90 with the driver's tensor-map encoder)?"""
    return _tma.sm90a_reason(KERNELS, props, "") is None


def require_gpu(impl, props):
    """Raise the error of naming rung ``impl`` on a GPU that does not run it."""
    why = _tma.sm90a_reason(KERNELS, props, f"{impl!r}")
    if why:
        raise ValueError(f"impl: {why}")


_PLANS = {}  # memoized (Tile, Launch, StreamK or None) per (impl, GemmProblem.shape_key, config, device, ...)
_SLOTS = {}  # clusters that fit at once, per (kernel name, device)


# Tile rows of a group of wgmma_ws's persistent walk (gemm_sm90.cuh TileOrder, serpentine):
# the blocks resident at one time cover that many rows of tiles and the columns that fill
# the grid. 16 rows of 128 x 256 tiles at K = 4096 hold ~33 MB of A and B against ~43 MB for
# 8 (the L2 holds 50 MB): 0.2-1 % ahead of 8 on the 4096-token shapes in one interleaved
# A/B, level in another (NOTES 132). The probes' A/B sets it.
GROUP_ROWS = 16


def _cluster_slots(name, tile, props, device):
    """How many clusters of kernel ``name`` run at once (None: not clustered)."""
    if tile.cluster == 1:
        return None

    def query():
        fn = KERNELS.function(name)
        nbytes = smem("wgmma_ws", tile)
        _launch.request_smem(fn, nbytes, props, "gemm impl='wgmma_ws'")
        return _launch.max_active_clusters(fn, tile.cluster, (THREADS["wgmma_ws"],), nbytes) or 0

    return _launch.memo(_SLOTS, (name, device), query) or None


def launch(impl, p, config=None):
    """Run rung ``impl`` of gemm_wgmma on problem ``p`` on CuPy's current stream."""
    check_rung("gemm_wgmma", impl, p.dtype, config, VARIANTS, DTYPES, CONFIGS)
    if p.M == 0 or p.N == 0 or p.batch == 0:
        return  # nothing to write
    device = _launch.current_device()
    props = _launch.device_props(device)
    require_gpu(impl, props)

    def build():
        cfg, pl = plan(impl, p, config, props.sm_count)
        t = tile_of(impl, cfg)
        if t.cluster > 1:
            slots = _cluster_slots(pl.name, t, props, device)
            if slots is None and config is None:  # auto's pair, and none fits this GPU: single blocks
                cfg = "128x128"
                t, pl = tile_of(impl, cfg), plan(impl, p, cfg, props.sm_count)[1]
            else:
                pl = plan(impl, p, cfg, props.sm_count, slots)[1]
        return t, pl, streamk_plan(p, t, props.sm_count) if t.streamk else None

    # (the stream-K split, and with it the grid, depends on SK_MIN_K_TILES too)
    tile, pl, sk = _launch.memo(_PLANS, (impl, p.shape_key(), config, device, SK_MIN_K_TILES), build)
    maps = tensor_maps(p, tile)
    if maps is None:
        _gemm_mma.launch("mma", p)
        return
    args = p.args() + maps
    if impl == "wgmma_ws":
        d_map, by_tma = output_map(p, tile)
        args += (d_map, np.int32(by_tma), np.int32(GROUP_ROWS))
    if sk is not None:
        work = _streamk_workspace(sk)
        args += (np.uint64(work.ptr if work is not None else 0), np.int64(sk.dp_tiles), np.int32(sk.sk_blocks))
    pl(args)


def _streamk_workspace(sk):
    """The stream-K workspace from CuPy's current allocator, its flags zeroed on the current
    stream (None when no tile is shared). Freed when the caller drops it: the pool hands it
    out again only to work queued after this launch on the same stream."""
    if not sk.sk_blocks:
        return None
    import cupy

    work = cupy.cuda.alloc(sk.work_bytes)
    cupy.cuda.runtime.memsetAsync(work.ptr, 0, sk.flag_bytes, cupy.cuda.get_current_stream().ptr)
    return work
