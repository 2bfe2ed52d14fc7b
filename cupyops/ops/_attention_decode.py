"""The ``decode`` rung of attention (kernels/attention_decode.cu), and its launcher.

At q_len 1..16 against a long KV sequence attention is a stream over K and V (bf16, Hkv 8,
head_dim 128, 32768 keys: 134 MB of K + V per batch element against a few KB of queries),
so its floor is K + V bytes over the read bandwidth. ``attention_decode<T, DT, RT, STAGES>``
reads K/V once per KV head: a block holds every query row of one KV head's group (group *
q_len rows, RT at a time), streams K/V tiles through a cp.async ring in shared memory, and
the KV sequence is split over S blocks so that a few sequences still fill every SM; the S
partial results are merged through their log-sum-exp, in split order, by
``attention_decode_merge<T>``. fp16/bf16 use mma.sync, float32 the CUDA cores.

Sliding windows and logit soft-capping are runtime arguments (AttentionProblem's
window_left, window_right, softcap). A window cuts the stream: the splits cover only the
keys some row sees (``key_span``), so a left window of W keys over a long cache is planned
and streamed as ~W keys; the cap is a uniform branch a tile in the kernel.

``plan`` is a plain function of numbers (the CPU tier checks it); ``launch`` memoizes it per
shape and device.

The same file serves cupyops.attention_paged (cupyops/ops/paged.py):
``attention_decode_paged<T, DT, RT, STAGES>`` is that kernel with its K/V rows found through
a page table, planned by ``plan(..., paged=True)`` for the table's capacity (or a left
window's span, each sequence's splits starting at its own window) and launched by
``launch_paged``; and the paged cache's helpers, ``kv_cache_append<T>``,
``attention_merge_states<T>`` and ``kv_cache_gather<T>`` (attention_paged's packed prefill)
(``append_launches``, ``merge_states_launches``, ``gather_launches``).
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
# The paged kernel is instantiated for fp16/bf16 (one mma row tile). Its float32 path is
# the same code as the contiguous kernel's and compiles clean (RT 8: 176-242 registers, no
# spills), but its three kernels would add 5 s of NVRTC a target to this file for a KV
# cache dtype serving does not use.
PAGED_DTYPES = ("float16", "bfloat16")
PAGE_SIZES = (16, 32, 64, 128, 256)  # the powers of two the paged kernel takes (16-key groups)
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


def _paged_name(dtype, dt, rt):
    return template_name("attention_decode_paged", _dtypes.cuda_type(dtype), dt, rt, STAGES[dt])


def _merge_states_name(dtype):
    return template_name("attention_merge_states", _dtypes.cuda_type(dtype))


def _append_name(dtype):
    return template_name("kv_cache_append", _dtypes.cuda_type(dtype))


def _gather_name(dtype):
    return template_name("kv_cache_gather", _dtypes.cuda_type(dtype))


def _expressions():
    names = []
    for dtype in DTYPES["decode"]:
        for dt in DT_TIERS:
            for rt in (F32_ROW_TILES[dt] if dtype == "float32" else (MMA_ROW_TILE,)):
                names.append(_name(dtype, dt, rt))
        names.append(_merge_name(dtype))
    for dtype in DTYPES["decode"]:
        if dtype in PAGED_DTYPES:
            names += [_paged_name(dtype, dt, MMA_ROW_TILE) for dt in DT_TIERS]
        names += [_merge_states_name(dtype), _append_name(dtype), _gather_name(dtype)]
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


def first_key(i, win_left, causal_offset):
    """attn::first_key: the first key query row i sees under a left window (0 without)."""
    return 0 if win_left < 0 else max(0, i + causal_offset - win_left)


def key_end(i, Skv, causal, causal_offset, win_right):
    """attn::key_end: one past the last key query row i sees (visible_keys cut by a right
    window); row i sees [first_key, key_end), none where key_end <= first_key."""
    end = visible_keys(i, Skv, causal, causal_offset)
    if win_right < 0:
        return end
    last = i + causal_offset + win_right
    return 0 if last < 0 else min(last + 1, end)


GROUP_KEYS = 16  # decode::GROUP_KEYS: a block's first key, and the split grid's, round down to it


def split_base(win_left, causal_offset):
    """decode::split_base: the first key of the split grid, query position 0's first key (no
    row sees an earlier one) rounded down to GROUP_KEYS; 0 without a left window."""
    return first_key(0, win_left, causal_offset) // GROUP_KEYS * GROUP_KEYS


def key_span(Sq, Skv, causal=False, causal_offset=0, win_left=-1, win_right=-1, paged=False):
    """(lo, hi): the keys the splits cover, [lo, hi). Contiguous: from split_base to the
    last key any row sees (query position Sq - 1's key_end); a sliding window's keys outside
    are in no split, so they are never loaded. Paged (Skv the table's capacity; each
    sequence's offset, seq_len - Sq, lives on the GPU): (0, the longest span a sequence can
    need): the capacity, or with a left window W at most Sq + W + GROUP_KEYS - 1 keys
    (seq_len - split_base(W, seq_len - Sq), the last row being the sequence's last token),
    since each sequence's splits start at its own split_base."""
    if paged:
        if win_left < 0:
            return 0, Skv
        return 0, min(Skv, Sq + win_left + GROUP_KEYS - 1)
    hi = max((key_end(i, Skv, causal, causal_offset, win_right) for i in range(Sq)), default=0)
    lo = split_base(win_left, causal_offset)
    return lo, max(lo, hi)


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
    kv: int  # past the last key any row sees (the splits cover [kv_lo, kv); paged: the span)
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
    kv_lo: int = 0  # the split grid's first key (split_base; paged: each sequence's own)


def plan(dtype, B, Hq, Hkv, Sq, Skv, D, causal=False, causal_offset=0, sm_count=132,
         smem_per_sm=SMEM_PER_SM, paged=False, win_left=-1, win_right=-1):
    """The launch of ``attention_decode`` (and its merge) for one problem: a plain function
    of numbers, so the CPU tier can check it. ``paged``: of ``attention_decode_paged``, with
    Skv the block table's capacity (max_pages * page_size: the lengths live on the GPU, so
    the splits are sized for the longest sequence the table can hold, or for a left
    window's span where that is shorter; a split past a shorter sequence's end is an empty
    block). ``win_left`` / ``win_right``: the sliding window (-1: unlimited side), whose
    keys outside are in no split (key_span)."""
    if dtype not in (PAGED_DTYPES if paged else DTYPES["decode"]):
        raise TypeError(f"dtype: decode supports {', '.join(PAGED_DTYPES if paged else DTYPES['decode'])}, "
                        f"got {dtype}")
    dt = head_dim_tier(D)
    group = Hq // Hkv
    rows = group * Sq
    rt = row_tile(dtype, dt, rows)  # (the paged kernel's one row tile: fp16/bf16 only)
    nrt = _launch.cdiv(rows, rt)
    bk = tile_keys(dtype)
    smem = smem_bytes(dtype, dt, rt)
    blocks_per_sm = max(1, min(smem_per_sm // (smem + 1024), min_blocks(dtype, dt, rt)))
    # keys beyond the last one any row sees are never split (top-left causal decode: 1 key),
    # nor keys before a left window's first (a window of W keys over a long cache streams
    # ~W keys, planned as a sequence of that length)
    kv_lo, kv = key_span(Sq, Skv, causal, causal_offset, win_left, win_right, paged)
    tiles = _launch.cdiv(kv - kv_lo, bk)
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
    # Not for the paged kernel, whose copies wait longer (a page switch every 16-256 keys,
    # the table lookups) and which a second resident block's copies cover: B64 x 4096
    # keys, bf16, on an H200 (benchmarks/paged_decode.py --one-an-sm): 16-token pages 282 us
    # one block an SM against 250 us two (the contiguous rung: 247 us one an SM),
    # 128-token pages 257 against 249.
    launch_smem = smem
    if (not paged and dtype != "float32" and dt == 128 and blocks_per_sm > 1
            and blocks > blocks_per_sm * sm_count):
        launch_smem = max(smem, smem_per_sm // 2)
    nrows = B * Hq * Sq
    merge_blocks = _launch.cdiv(nrows, MERGE_ROWS)
    if merge_blocks > _MAX_GRID_X:
        raise ValueError(f"attention decode: {nrows} query rows exceed the merge grid limit")
    return DecodePlan(
        name=(_paged_name if paged else _name)(dtype, dt, rt), merge_name=_merge_name(dtype), dt=dt, rt=rt, nrt=nrt,
        stages=STAGES[dt], bk=bk, kv=kv, splits=S, chunk=chunk, grid=(max(1, blocks), 1, 1),
        block=(THREADS, 1, 1), smem=smem, launch_smem=launch_smem, blocks_per_sm=blocks_per_sm,
        work_o=nrows * S * D if S > 1 else 0, work_lse=nrows * S if S > 1 else 0,
        merge_grid=(max(1, merge_blocks), 1, 1), merge_block=(THREADS, 1, 1), kv_lo=kv_lo,
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
                                   p.causal_offset, props.sm_count, props.smem_per_sm,
                                   win_left=p.window_left, win_right=p.window_right))
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


# ------------------------------------------------------------------ the paged cache
@dataclasses.dataclass
class PagedProblem:
    """One checked attention_paged launch: ``problem`` holds Q, O, LSE and the options as
    any attention launch (kernels/attention_common.cuh), with K / V the caches, their
    (page, slot, head) element strides in place of (batch, seq, head), Skv the table's
    capacity (max_pages * page_size) and causal_offset unused (each sequence's offset is
    its length - q_len, on the GPU); the rest is what the paged kernel adds."""

    problem: object  # AttentionProblem
    block_table: object  # int32 [B, max_pages], unit column stride
    bt_stride: int  # its row stride, in elements
    seq_lens: object  # int32 [B], contiguous
    page_shift: int  # page_size = 1 << page_shift
    num_pages: int


def paged_supports(p):
    """None when the paged kernel can run ``p`` (its AttentionProblem), else the reason,
    naming the argument."""
    if p.dtype not in PAGED_DTYPES:
        return f"q: attention_paged supports {', '.join(PAGED_DTYPES)}, got {p.dtype}"
    if not 1 <= p.Sq <= MAX_Q_LEN:
        return f"q: q_len must be in 1..{MAX_Q_LEN}, got {p.Sq}"
    if not 1 <= p.D <= MAX_HEAD_DIM:
        return f"q: head_dim must be in 1..{MAX_HEAD_DIM}, got {p.D}"
    dt = head_dim_tier(p.D)
    return _launch.smem_reason(smem_bytes(p.dtype, dt, MMA_ROW_TILE), f"q: head_dim {p.D} (the head_dim-{dt} tier)")


_PAGED_PLANS = {}


def paged_launches(pp):
    """launches() for a PagedProblem: the paged split kernel (its arguments: ATTN_PARAMS,
    the workspace, the split layout, then the table, its row stride, the lengths, the page
    shift and the page count) and, for more than one split, the same merge kernel."""
    p = pp.problem
    props = _launch.device_props()
    pl = _launch.memo(_PAGED_PLANS, (p.shape_key(), props.sm_count),
                      lambda: plan(p.dtype, p.B, p.Hq, p.Hkv, p.Sq, p.Skv, p.D, sm_count=props.sm_count,
                                   smem_per_sm=props.smem_per_sm, paged=True, win_left=p.window_left,
                                   win_right=p.window_right))
    fn = KERNELS.function(pl.name)
    _launch.request_smem(fn, pl.launch_smem, props, "attention_paged")
    args = p.args()
    i32, i64 = np.int32, np.int64
    if pl.splits > 1:
        work_o, work_lse, work = _fast.Work(0), _fast.Work(1), (4 * pl.work_o, 4 * pl.work_lse)
    else:
        work_o = work_lse = _arrays.NULL_PTR
        work = ()
    paged = (pp.block_table, i64(pp.bt_stride), pp.seq_lens, i32(pp.page_shift), i32(pp.num_pages))
    out = [(fn, pl.grid, pl.block, pl.launch_smem,
            args + (work_o, work_lse, i32(pl.splits), i32(pl.chunk), i32(pl.nrt)) + paged)]
    if pl.splits > 1:
        out.append((KERNELS.function(pl.merge_name), pl.merge_grid, pl.merge_block, 0,
                    args + (work_o, work_lse, i32(pl.splits))))
    return out, work


def launch_paged(pp):
    """Run attention_paged's kernels for ``pp`` on CuPy's current stream."""
    _fast.launch_checked(*paged_launches(pp))


def _chunk_grid(items, itemsize, D, what=None):
    """Blocks of THREADS threads, one thread a 16-byte chunk of each of ``items`` rows of D
    elements (kv_cache_append, attention_merge_states, kv_cache_gather a sequence);
    ``what``: the rows' description in the error past the grid limit."""
    chunks = items * _launch.cdiv(D, 16 // itemsize)
    blocks = _launch.cdiv(chunks, THREADS)
    if blocks > _MAX_GRID_X:
        raise ValueError(f"{what or f'{items} rows of head_dim {D}'} exceed the grid limit ({blocks} blocks)")
    return (max(1, blocks), 1, 1)


def append_launches(dtype, k_cache, v_cache, k, v, block_table, positions, dims, strides, page_shift):
    """kv_cache_append's launch: ``dims`` (B, n_new, Hkv, D, num_pages, max_pages),
    ``strides`` the element strides (k_cache's and v_cache's (page, slot, head), k's and
    v's (batch, token, head), block_table's row stride)."""
    B, N, H, D, num_pages, max_pages = dims
    i32, i64 = np.int32, np.int64
    grid = _chunk_grid(B * N * H, _dtypes.itemsize(dtype), D)
    args = (k_cache, v_cache, k, v, block_table, positions, i32(B), i32(N), i32(H), i32(D),
            *(i64(s) for s in strides), i32(page_shift), i32(num_pages), i32(max_pages))
    return [(KERNELS.function(_append_name(dtype)), grid, (THREADS, 1, 1), 0, args)], ()


MAX_GATHER_SEQUENCES = 65535  # kv_cache_gather's grid y: one sequence a row of blocks
# Rows written as zeros after the last gathered sequence: attention_varlen's flash3 reads up
# to a key tile (at most 192 keys) past a sequence's end, masked, but V's rows there still
# meet a zero weight, and 0 * NaN is NaN.
GATHER_TAIL_ROWS = 256


def gather_launches(dtype, k_cache, v_cache, k_out, v_out, cu_k, block_table, seq_lens, dims, strides, page_shift):
    """kv_cache_gather's launch (attention_paged's packed prefill): ``dims`` (B, Hkv, D,
    rows, num_pages, max_pages) with ``rows`` those of k_out / v_out ([rows, Hkv, D],
    C-contiguous), ``strides`` the caches' (page, slot, head) element strides and the
    table's row stride."""
    B, H, D, rows, num_pages, max_pages = dims
    i32, i64 = np.int32, np.int64
    blocks, _, _ = _chunk_grid(((max_pages << page_shift) + GATHER_TAIL_ROWS) * H, _dtypes.itemsize(dtype), D,
                               f"block_table: {max_pages} pages of {1 << page_shift} keys, {H} heads of {D}")
    grid = (blocks, B, 1)
    args = (k_cache, v_cache, k_out, v_out, cu_k, block_table, seq_lens, i32(H), i32(D), i64(rows),
            *(i64(s) for s in strides), i32(page_shift), i32(num_pages), i32(max_pages), i32(GATHER_TAIL_ROWS))
    return [(KERNELS.function(_gather_name(dtype)), grid, (THREADS, 1, 1), 0, args)], ()


def merge_states_lse_offset(rows, D, itemsize):
    """Byte offset of the LSE in attention_merge_states' output buffer (after o, on a
    16-byte boundary)."""
    return _launch.cdiv(rows * D * itemsize, 16) * 16


def merge_states_launches(dtype, o_a, lse_a, o_b, lse_b, out, T, H, D, strides):
    """attention_merge_states' launch: ``out`` the uint8 buffer of o then LSE, ``strides``
    (o_a's, o_b's, lse_a's, lse_b's (token, head) element strides)."""
    i32, i64 = np.int32, np.int64
    rows = T * H
    grid = _chunk_grid(rows, _dtypes.itemsize(dtype), D)
    args = (o_a, lse_a, o_b, lse_b, out, i64(merge_states_lse_offset(rows, D, _dtypes.itemsize(dtype))),
            i64(rows), i32(H), i32(D), *(i64(s) for s in strides))
    return [(KERNELS.function(_merge_states_name(dtype)), grid, (THREADS, 1, 1), 0, args)], ()
