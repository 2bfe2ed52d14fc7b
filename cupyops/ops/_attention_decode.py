"""The ``decode`` rung of attention (kernels/attention_decode.cu), and its launcher.

At q_len 1..16 against a long KV sequence attention is a stream over K and V (bf16, Hkv 8,
head_dim 128, 32768 keys: 134 MB of K + V per batch element against a few KB of queries),
so its floor is K + V bytes over the read bandwidth. ``attention_decode<T, DT, RT, STAGES>``
reads K/V once per KV head: a block holds every query row of one KV head's group (group *
q_len rows, RT at a time), streams K/V tiles through a cp.async ring in shared memory, and
the KV sequence is split over S blocks so that a few sequences still fill every SM; the S
partial results are merged through their log-sum-exp, in split order, by
``attention_decode_merge<T>``. fp16/bf16 use mma.sync, float32 the CUDA cores.

``plan`` is a plain function of numbers (the CPU tier checks it); ``launch`` memoizes it per
shape and device.
"""
import dataclasses

import numpy as np

from .. import _arrays, _dtypes, _fast, _launch
from .._kernels import KernelFile, template_name
from ._attention_problem import MAX_HEAD_DIM

VARIANTS = {
    "decode": "q_len 1..16 (decode): K/V streamed once per KV head through a cp.async ring, "
    "the KV sequence split across blocks to fill the GPU, splits merged through their LSE "
    "in a fixed order; mma.sync for fp16/bf16",
}
DTYPES = {"decode": ("float32", "float16", "bfloat16")}

MAX_Q_LEN = 16
DT_TIERS = (64, 128, 256)  # head_dim tiers compiled (zero-padded up to the tier)
# STAGES of the K/V ring per tier: 256 * DT bytes a stage; chosen so that the ring of one
# block plus its query tile leaves room for 3 (DT 64), 2 (128) or 1 (256) blocks an SM,
# each with STAGES - 1 tiles (32 to 128 KB) in flight.
STAGES = {64: 4, 128: 3, 256: 3}
# float32: rows a block, per tier (CUDA-core accumulators: RT x DT / 32 floats a lane; 16 rows
# x 8 columns would not fit the registers at DT 256)
F32_ROW_TILES = {64: (4, 8, 16), 128: (4, 8, 16), 256: (4, 8)}
MMA_ROW_TILE = 16  # fp16/bf16: one m16 row tile of mma.sync
NW = 4  # warps a block (kernels/attention_decode.cu decode::NW)
THREADS = 32 * NW
MERGE_ROWS = NW  # rows a merge block (one warp each)
MAX_SPLITS = 1024
# The split model (choose_splits), fitted to H200 sweeps (bf16, B 16 x Hkv 8 = 128 blocks a
# split): a block streams about its in-flight bytes ((STAGES - 1) tiles) per LATENCY_US, but
# no more than BLOCK_BYTES_PER_US however deep its ring (head_dim 256, 128 KB in flight, ran
# 45 GB/s a block at 64 blocks and 17 % faster split over 128), so ~128 blocks, one an SM,
# already saturate HBM (HBM_BYTES_PER_US; 32768 keys ran 4.5 TB/s unsplit, 3 % faster than
# at S = 2); more blocks only share it. head_dim 64 (48 KB in flight) also ran fastest
# unsplit at 128 blocks, hence LATENCY_US 1.4. The merge launch costs MERGE_US (4096 keys:
# 77 us unsplit, 78 us for the split kernel alone at S = 2, 84 us with the merge), and a wave
# of blocks WAVE_US to start and drain.
LATENCY_US = 1.4
HBM_BYTES_PER_US = 4.5e6
BLOCK_BYTES_PER_US = 45e3
MERGE_US = 5.0
WAVE_US = 2.0
SMEM_PER_SM = 228 * 1024  # of which the driver reserves 1 KB a block
_MAX_GRID_X = 2**31 - 1



def _name(dtype, dt, rt):
    return template_name("attention_decode", _dtypes.cuda_type(dtype), dt, rt, STAGES[dt])


def _merge_name(dtype):
    return template_name("attention_decode_merge", _dtypes.cuda_type(dtype))


def _expressions():
    names = []
    for dtype in DTYPES["decode"]:
        for dt in DT_TIERS:
            for rt in (F32_ROW_TILES[dt] if dtype == "float32" else (MMA_ROW_TILE,)):
                names.append(_name(dtype, dt, rt))
        names.append(_merge_name(dtype))
    return names


KERNELS = KernelFile("attention_decode.cu", _expressions())
KERNEL_FILES = [KERNELS]


def tile_keys(dtype):
    """BK, the keys of one K/V tile: 16 a warp (mma) or 8 (float32)."""
    return NW * (8 if dtype == "float32" else 16)


def head_dim_tier(D):
    for dt in DT_TIERS:
        if D <= dt:
            return dt
    raise ValueError(f"head_dim: decode supports 1..{MAX_HEAD_DIM}, got {D}")


def row_tile(dtype, dt, rows):
    """RT, the query rows a block holds, for ``rows`` = group * q_len rows of a KV head."""
    if dtype != "float32":
        return MMA_ROW_TILE
    for rt in F32_ROW_TILES[dt]:
        if rows <= rt:
            return rt
    return F32_ROW_TILES[dt][-1]


def min_blocks(dtype, dt, rt):
    """decode::MinBlocks: the resident blocks an SM the kernel is compiled for (ptxas keeps
    its registers within 64K / (128 * this))."""
    if dt == 64:
        return 2 if dtype == "float32" and rt == 16 else 3
    return 2 if dt == 128 else 1


def smem_bytes(dtype, dt, rt):
    """Dynamic shared memory of attention_decode<T, DT, RT, STAGES[DT]>."""
    item = _dtypes.itemsize(dtype)
    ring = STAGES[dt] * 2 * tile_keys(dtype) * dt * item
    q = MMA_ROW_TILE * dt * item if dtype != "float32" else rt * dt * 4
    rows = MMA_ROW_TILE if dtype != "float32" else rt
    return ring + q + 8 * rows  # ring, query tile, the query rows' 64-bit offsets


def state_bytes(dtype, dt, rt):
    """Shared memory the warps' states (output, max, sum) and the rows' warp weights take
    at the end (they reuse the ring)."""
    rtp = MMA_ROW_TILE if dtype != "float32" else rt
    return NW * rtp * (dt + 3) * 4


def visible_keys(i, Skv, causal, causal_offset):
    """attn::visible_keys: the keys query row i sees."""
    if not causal:
        return Skv
    last = i + causal_offset
    return 0 if last < 0 else min(last + 1, Skv)


def split_cost_us(S, tiles, pairs, slots, tile_bytes, inflight_bytes, hbm=HBM_BYTES_PER_US):
    """Modelled time (us) of S splits of ``tiles`` K/V tiles of ``tile_bytes`` each, for
    ``pairs`` blocks a split (B * Hkv * row tiles) on ``slots`` resident blocks (SMs x
    blocks an SM). Blocks run in waves of ``slots``; a wave of n blocks streams at
    min(hbm, n * per-block rate) and costs WAVE_US more; S > 1 adds the merge launch."""
    blocks = pairs * S
    per_block = _launch.cdiv(tiles, S) * tile_bytes
    block_rate = min(inflight_bytes / LATENCY_US, BLOCK_BYTES_PER_US)
    full, rem = divmod(blocks, slots)
    t = 0.0
    for n, count in ((slots, full), (rem, 1 if rem else 0)):
        if count:
            t += count * (n * per_block / min(hbm, n * block_rate) + WAVE_US)
    return t + (MERGE_US if S > 1 else 0.0)


def choose_splits(tiles, pairs, slots, tile_bytes=32768, inflight_bytes=65536, hbm=HBM_BYTES_PER_US):
    """S, the splits of a KV sequence of ``tiles`` tiles: the cheapest by split_cost_us, ties
    to fewer splits (fewer partials; no merge at S = 1); never one with empty trailing
    splits."""
    if tiles <= 1 or pairs <= 0:
        return 1
    best, best_cost = 1, None
    top = min(tiles, MAX_SPLITS, max(1, 4 * slots // pairs + 1))
    for S in range(1, top + 1):
        per = _launch.cdiv(tiles, S)
        if S > 1 and _launch.cdiv(tiles, per) < S:
            continue  # the same chunk as a smaller S: trailing splits would be empty
        cost = split_cost_us(S, tiles, pairs, slots, tile_bytes, inflight_bytes, hbm)
        if best_cost is None or cost < best_cost * (1 - 1e-9):
            best, best_cost = S, cost
    return best


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    name: str  # name expression of the split kernel
    merge_name: str  # of the merge kernel (launched only when splits > 1)
    dt: int  # head_dim tier
    rt: int  # query rows a block
    nrt: int  # row tiles a KV head (cdiv(group * q_len, rt))
    stages: int
    bk: int  # keys a tile
    kv: int  # keys any row sees (the splits cover [0, kv))
    splits: int  # S
    chunk: int  # keys a split (a multiple of bk)
    grid: tuple
    block: tuple
    smem: int  # dynamic shared memory bytes the kernel uses
    launch_smem: int  # asked for at launch: smem, or over half an SM's to keep one block an SM
    blocks_per_sm: int  # resident blocks an SM the split choice assumed
    work_o: int  # float32 elements of the partial outputs (0 when splits == 1)
    work_lse: int  # float32 elements of the partial LSEs (0 when splits == 1)
    merge_grid: tuple
    merge_block: tuple


def plan(dtype, B, Hq, Hkv, Sq, Skv, D, causal=False, causal_offset=0, sm_count=132,
         smem_per_sm=SMEM_PER_SM):
    """The launch of ``attention_decode`` (and its merge) for one problem: a plain function
    of numbers, so the CPU tier can check it."""
    if dtype not in DTYPES["decode"]:
        raise TypeError(f"dtype: decode supports {', '.join(DTYPES['decode'])}, got {dtype}")
    dt = head_dim_tier(D)
    group = Hq // Hkv
    rows = group * Sq
    rt = row_tile(dtype, dt, rows)
    nrt = _launch.cdiv(rows, rt)
    bk = tile_keys(dtype)
    smem = smem_bytes(dtype, dt, rt)
    blocks_per_sm = max(1, min(smem_per_sm // (smem + 1024), min_blocks(dtype, dt, rt)))
    # keys beyond the last one any row sees are never split (top-left causal decode: 1 key)
    kv = max((visible_keys(i, Skv, causal, causal_offset) for i in range(Sq)), default=0)
    tiles = _launch.cdiv(kv, bk)
    pairs = B * Hkv * nrt
    tile_bytes = 2 * bk * D * _dtypes.itemsize(dtype)  # K + V bytes of a full tile
    inflight = (STAGES[dt] - 1) * 2 * bk * dt * _dtypes.itemsize(dtype)
    S = choose_splits(tiles, pairs, blocks_per_sm * sm_count, tile_bytes, inflight)
    chunk = _launch.cdiv(tiles, S) * bk if tiles else bk
    blocks = pairs * S
    if blocks > _MAX_GRID_X:
        raise ValueError(f"attention decode: {blocks} blocks exceed the grid limit {_MAX_GRID_X}")
    # A launch of more blocks than fit at once streams faster one block an SM (NOTES 44):
    # B64 x Hkv 8, bf16, head_dim 128, 32768 keys (512 blocks) ran 3142 GB/s one an SM
    # against 3104 two an SM, level at 4096 keys: half the concurrent K/V streams. The
    # launch then asks for over half an SM's shared memory (the kernel uses smem of it).
    # Measured for the 2-byte head_dim-128 tier only; the others keep their residency.
    launch_smem = smem
    if dtype != "float32" and dt == 128 and blocks_per_sm > 1 and blocks > blocks_per_sm * sm_count:
        launch_smem = max(smem, smem_per_sm // 2)
    nrows = B * Hq * Sq
    merge_blocks = _launch.cdiv(nrows, MERGE_ROWS)
    if merge_blocks > _MAX_GRID_X:
        raise ValueError(f"attention decode: {nrows} query rows exceed the merge grid limit")
    return DecodePlan(
        name=_name(dtype, dt, rt), merge_name=_merge_name(dtype), dt=dt, rt=rt, nrt=nrt,
        stages=STAGES[dt], bk=bk, kv=kv, splits=S, chunk=chunk, grid=(max(1, blocks), 1, 1),
        block=(THREADS, 1, 1), smem=smem, launch_smem=launch_smem, blocks_per_sm=blocks_per_sm,
        work_o=nrows * S * D if S > 1 else 0, work_lse=nrows * S if S > 1 else 0,
        merge_grid=(max(1, merge_blocks), 1, 1), merge_block=(THREADS, 1, 1),
    )


def supports(impl, p):
    """None when the decode rung can run ``p``, else the reason, naming the argument."""
    if impl != "decode":
        return f"impl: {impl!r} is not a decode rung; expected decode"
    if p.dtype not in DTYPES["decode"]:
        return f"dtype: decode supports {', '.join(DTYPES['decode'])}, got {p.dtype}"
    if not 1 <= p.Sq <= MAX_Q_LEN:
        return f"q_len: decode supports 1..{MAX_Q_LEN}, got {p.Sq}"
    if not 1 <= p.D <= MAX_HEAD_DIM:
        return f"head_dim: decode supports 1..{MAX_HEAD_DIM}, got {p.D}"
    if p.Hkv < 1 or p.Hq % p.Hkv:
        return f"k: decode needs kv_heads to divide q_heads ({p.Hq}), got {p.Hkv}"
    # the head_dim-256 tier's ring needs more than an A100-class GPU's opt-in: auto falls back
    dt = head_dim_tier(p.D)
    rt = row_tile(p.dtype, dt, (p.Hq // p.Hkv) * p.Sq)
    return _launch.smem_reason(smem_bytes(p.dtype, dt, rt), f"head_dim: decode's head_dim-{dt} tier")


_PLANS = {}  # memoized plans (AttentionProblem.shape_key, SMs)


def launch(impl, p):
    """Run the decode rung on problem ``p`` on CuPy's current stream."""
    if impl != "decode":
        raise ValueError(f"impl: unknown decode rung {impl!r}; expected decode")
    if p.B == 0 or p.Hq == 0 or p.Sq == 0 or p.D == 0:
        return  # nothing to write
    _fast.launch_checked(*launches(p))


def fast_launches(impl, p):
    """``p``'s launches and workspace bytes for a fast call (cupyops/_fast.py): the plan is
    a function of the shapes and the kernel checks alignment itself."""
    return launches(p) if impl == "decode" and p.B and p.Hq and p.Sq and p.D else None


def launches(p):
    """The split kernel and, for more than one split, the merge, as (fn, grid, block, smem,
    args) each (the partial outputs and LSEs ``_fast.Work`` pieces 0 and 1), and the
    workspace bytes."""
    props = _launch.device_props()
    pl = _launch.memo(_PLANS, (p.shape_key(), props.sm_count),
                      lambda: plan(p.dtype, p.B, p.Hq, p.Hkv, p.Sq, p.Skv, p.D, p.causal,
                                   p.causal_offset, props.sm_count, props.smem_per_sm))
    fn = KERNELS.function(pl.name)
    _launch.request_smem(fn, pl.launch_smem, props, "attention impl='decode'")
    args = p.args()
    i32 = np.int32
    if pl.splits > 1:
        work_o, work_lse, work = _fast.Work(0), _fast.Work(1), (4 * pl.work_o, 4 * pl.work_lse)
    else:
        work_o = work_lse = _arrays.NULL_PTR  # one split writes O and LSE itself
        work = ()
    out = [(fn, pl.grid, pl.block, pl.launch_smem,
            args + (work_o, work_lse, i32(pl.splits), i32(pl.chunk), i32(pl.nrt)))]
    if pl.splits > 1:
        out.append((KERNELS.function(pl.merge_name), pl.merge_grid, pl.merge_block, 0,
                    args + (work_o, work_lse, i32(pl.splits))))
    return out, work
