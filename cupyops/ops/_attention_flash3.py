"""The Hopper FlashAttention rung of kernels/attention_flash3.cu (sm_90a: wgmma + TMA, a
producer and two or three consumer warpgroups), and its launcher (the launcher-module
interface is described in _attention_problem.py).

``attention_flash3<T, D, BC, STAGES, SCHED, NC, MASKS>``: work tiles of (64 NC query rows,
query head, batch element) handed round robin to the blocks, one block an SM (a persistent
grid) or one a tile; K and V tiles of BC keys through STAGES-deep rings; the consumers' schedule
SCHED (0 serial, 1 FlashAttention-3's intra-warpgroup overlap of softmax and GEMMs, 2 that
and pingpong between the consumer warpgroups). ``config`` (see ``CONFIGS``) forces one;
``None`` takes ``default_config``'s.

Q, K and V are read through 4-D tensor maps (head_dim, rows, heads, batch) of their own
strides, so any layout whose head_dim axis is contiguous runs without a copy, as long as
a map can describe it: 16-byte aligned tensors with strides that are multiples of 16
bytes (``supports`` says so otherwise).

Sliding windows and soft caps: a launch with a window runs its configuration's WINDOW
instantiation, one with a cap (and a window or not) its WINDOW | CAP one, so that a plain
launch runs a kernel in which every window and cap term has folded away (``masks``). A
work tile loads and multiplies only the K/V tiles its rows' windows reach, and masks only
the tiles at their edges (the kernel file's header says how).

It runs on compute capability 9.0 alone (``runs_here``): ``auto`` takes it there and
falls back to ``flash`` elsewhere.
"""
import collections

import numpy as np

from .. import _dtypes, _launch, _tma
from .._kernels import SPLIT_COMPILE, KernelFile, template_name
from ._attention_problem import masks_reason, tensor_core_reason, tile_config

VARIANTS = {
    "flash3": "FlashAttention-3 on Hopper (sm_90a): a TMA producer warpgroup and two (or three) wgmma "
    "consumer warpgroups of 64 query rows, K and V tiles through mbarrier rings, S = Q K^T from shared memory, "
    "P V with P in registers, the softmax of one tile overlapping the GEMMs of the next and the "
    "consumers taking turns on the tensor cores (float16, bfloat16; head_dim 64, 96, 128, 256)",
}
DTYPES = {"flash3": ("float16", "bfloat16")}
ARCH = "sm_90a"
BR = 128  # query rows of a work tile with two consumer warpgroups (64 each), the most tiles
SERIAL, OVERLAP, PINGPONG = 0, 1, 2  # the consumers' schedule (the kernel's SCHED)


class Config(collections.namedtuple("Config", "bc stages sched persistent consumers", defaults=(2,))):
    """A kernel configuration: key tiles of ``bc`` keys through ``stages``-deep rings, the
    consumers' schedule, a persistent grid or one block a work tile, and the consumer
    warpgroups (the kernel's NC: a work tile of 64 query rows each)."""

    @property
    def rows(self):
        return 64 * self.consumers

    @property
    def threads(self):
        return 128 * (self.consumers + 1)


# head_dim -> {config: Config}; the first is the default. Names: m<rows> where a work tile is
# not 128 query rows, c<BC>s<STAGES>, the schedule's letter (none: serial, o: overlap, p:
# pingpong), and "_pg" for a persistent grid (else one block a work tile). A stage holds K
# and V tiles of BC keys (2 * BC * D * 2 bytes) beside Q (rows * D * 2); 227 KB in all. The
# serial, overlap and one-block-a-tile forms stay as the ladder inside the rung
# (benchmarks/attention_sweep.py times each; NOTES has what each bought). Configurations
# that never won are left out (each is a kernel the file compiles on first use): rings of 3
# and 4 stages at head_dim 128 (0-5 % slower), key tiles of 64 at head_dim 256, three
# consumers at 128, and the serial and overlap schedules at 64 and 256 (measured in
# benchmarks/results/h100-attention-flash3-sweep-*.txt and
# attention-flash3-sweeps-session14.txt).
CONFIGS = {
    # FlashAttention-3's head_dim-64 tiles first: 192 query rows, three consumers (NOTES 80, 81)
    64: {"m192c128s3p_pg": Config(128, 3, PINGPONG, True, 3), "m192c128s3p": Config(128, 3, PINGPONG, False, 3),
         "m192c128s2p_pg": Config(128, 2, PINGPONG, True, 3), "m192c128s2p": Config(128, 2, PINGPONG, False, 3),
         "c192s2p_pg": Config(192, 2, PINGPONG, True), "c192s2p": Config(192, 2, PINGPONG, False),
         "c128s2p_pg": Config(128, 2, PINGPONG, True), "c128s2p": Config(128, 2, PINGPONG, False)},
    # head_dim 96 is held as 128 (the kernel's DPAD)
    96: {"c128s2p_pg": Config(128, 2, PINGPONG, True), "c128s2p": Config(128, 2, PINGPONG, False)},
    128: {"c128s2p_pg": Config(128, 2, PINGPONG, True), "c128s2p": Config(128, 2, PINGPONG, False),
          "c128s2o": Config(128, 2, OVERLAP, False), "c128s2": Config(128, 2, SERIAL, False),
          "c176s2p_pg": Config(176, 2, PINGPONG, True), "c176s2p": Config(176, 2, PINGPONG, False)},
    256: {"c80s2p_pg": Config(80, 2, PINGPONG, True), "c80s2p": Config(80, 2, PINGPONG, False)},
}
MAX_WORK_TILES = 2**31 - 1  # the kernel counts work tiles in an int (and a grid's x extent)
# The default under a causal mask (the first of CONFIGS otherwise). Measured (bf16,
# benchmarks/attention_sweep.py, NOTES 72, 81): causal work tiles differ in length up to
# the sequence's tiles, and a persistent grid's fixed round robin leaves SMs idle at the end
# where the hardware, handing out one block a tile, gives the next block to the SM that
# frees first: one block a tile at head_dim 96, 128 and 256 (0.99-1.01x cuDNN at 128
# against 0.98-1.00x). At head_dim 64 the persistent grid won (1.00-1.01x against
# 0.95-0.96x, H100) once the empty warpgroups of a sequence's last 192-row tile stopped
# computing.
CAUSAL_CONFIG = {64: "m192c128s3p_pg", 96: "c128s2p", 128: "c128s2p", 256: "c80s2p"}
# Key tiles: 192 at head_dim 64 and 80 at 256 (FlashAttention-3's choices there) measured
# (bf16, H100, results/h100-attention-flash3-sweep-tiles.txt) against 128 and 64: head_dim 64
# 0.92x cuDNN against 0.87x without a mask, 0.86x against 0.84x causal; head_dim 256 0.98x
# against 0.94x, 1.10x against 1.05x.
# Head_dim 128's key tiles of 176 (FlashAttention-3's choice) were the default from 8192
# keys a row (2-8 % faster than 128 at 16384 keys, NOTES 73, 81) until the tensor-store
# epilogue, which needs the second Q buffer that 176-key rings leave no room for: since
# then tiles of 128 are 1.5-2 % faster at 16384 keys and 3-4.5 % at 8192 (bf16, H100,
# NOTES 117). The 176-key configurations stay as rungs of the ladder.
# A head group's K and V (what its work tiles read again and again) are kept to this share
# of the L2 cache (head_group), by default: 0 (a group is one KV head's query heads) without
# a mask, where the order did not matter within 1 %; half of L2 under a causal mask, where it
# was 8 % faster at head_dim 256 and 1-2 % slower at 64 and 128 (GQA) than one KV head.
L2_SHARE = {False: 0.0, True: 0.5}
HEAD_DIMS = tuple(CONFIGS)


# The kernel's MASKS (fa3::Masks): the instantiations a configuration has.
WINDOW, CAP = 1, 2
MASKS = (0, WINDOW, WINDOW | CAP)


def masks(p):
    """The MASKS instantiation that runs problem ``p``: WINDOW | CAP with a soft cap,
    WINDOW with a sliding window alone, else 0 (no window or cap code)."""
    if p.softcap:
        return WINDOW | CAP
    return WINDOW if p.window_left >= 0 or p.window_right >= 0 else 0


def _name(dtype, hd, cfg, mask=0):
    """The instantiation of a configuration for launches of MASKS ``mask``."""
    c = CONFIGS[hd][cfg]
    return template_name("attention_flash3", _dtypes.cuda_type(dtype), hd, c.bc, c.stages, c.sched, c.consumers,
                         mask)


# (a persistent configuration and its one-block-a-tile twin are one kernel)
KERNELS = KernelFile("attention_flash3.cu", list(dict.fromkeys(
    _name(dt, hd, c, w) for dt in DTYPES["flash3"] for hd in CONFIGS for c in CONFIGS[hd] for w in MASKS)),
    options=SPLIT_COMPILE, arch=ARCH)
KERNEL_FILES = [KERNELS]


def _tile_bytes(hd, cfg):
    """(one Q buffer, a stage of K and V) in bytes: head_dim rounded up to 64."""
    c = CONFIGS[hd][cfg]
    dpad = 64 * -(-hd // 64)
    return c.rows * dpad * 2, 2 * c.bc * dpad * 2


def q_stages(hd, cfg):
    """Q buffers (the kernel's QStages): two where they fit beside the K and V rings (the
    next work tile's Q loads early), else one."""
    stages = CONFIGS[hd][cfg].stages
    q, kv = _tile_bytes(hd, cfg)
    return 2 if 2 * q + stages * kv + _tma.SWIZZLE_ATOM_BYTES + 32 * stages + 32 <= 227 * 1024 else 1


def smem_bytes(hd, cfg):
    """Q's buffers, the rings of K and V tiles, the 1024-byte alignment, the rings'
    barriers and Q's (full and empty, 16 bytes a buffer)."""
    stages, qs = CONFIGS[hd][cfg].stages, q_stages(hd, cfg)
    q, kv = _tile_bytes(hd, cfg)
    return qs * q + stages * kv + _tma.SWIZZLE_ATOM_BYTES + 32 * stages + 16 * qs


def map_spec(arr_ptr, strides, rows, heads, batch, hd, box_rows):
    """(dims, byte strides, box) of the 4-D tensor map of one operand of element
    ``strides`` (batch, row, head), or None where a map cannot describe it. An axis of
    extent 1 is never stepped: its stride is replaced by a describable one."""
    sb, ss, sh = strides
    dims = (hd, rows, heads, batch)
    byte = [2 * ss, 2 * sh, 2 * sb]
    fill = 16 * -(-(2 * hd * max(rows, 1)) // 16)  # any multiple of 16 bytes will do for an unstepped axis
    for i, extent in enumerate(dims[1:]):
        if extent == 1:
            byte[i] = fill
    if not _tma.describable(arr_ptr, *byte):
        return None
    return dims, tuple(byte), (64, box_rows, 1, 1)


def _specs(p, cfg):
    """The tensor maps of Q, K, V and O: (head_dim, rows, heads, batch), or for packed
    sequences (head_dim, packed rows, heads, 1). O's map serves the tensor-store epilogue
    (boxes of 64 rows, as Q's)."""
    bc = CONFIGS[p.D][cfg].bc
    q_rows, kv_rows, batch = (p.total_q, p.total_k, 1) if p.varlen else (p.Sq, p.Skv, p.B)
    return [map_spec(p.Q.data.ptr, p.q_strides, q_rows, p.Hq, batch, p.D, 64),
            map_spec(p.K.data.ptr, p.k_strides, kv_rows, p.Hkv, batch, p.D, bc),
            map_spec(p.V.data.ptr, p.v_strides, kv_rows, p.Hkv, batch, p.D, bc),
            map_spec(p.O.data.ptr, p.o_strides, q_rows, p.Hq, batch, p.D, 64)]


def _checked(impl, p, config):
    """(reason, configuration, map specs): reason None when ``flash3`` can run ``p``, else
    why (naming the argument); the configuration and specs (``_specs``) once the shape
    passes (also when a map cannot describe an operand, the last reason). What
    ``supports`` answers and ``launch`` goes on from, worked out once a call."""
    if impl != "flash3":
        return f"impl: unknown attention_flash3 rung {impl!r}; expected flash3", None, None
    reason = _shape_reason(p) or masks_reason(p, "flash3", window=True, softcap=True)
    if reason is None and not p.aligned16():
        reason = "q: flash3 needs 16-byte aligned rows in q, k, v and out (pointers and strides)"
    if reason is None and work_tiles(p) > MAX_WORK_TILES:
        reason = f"q: flash3 supports at most {MAX_WORK_TILES} work tiles (q_len / {BR} x heads x batch)"
    if reason is not None:
        return reason, None, None
    cfg = config or default_config(p)
    specs = _specs(p, cfg)
    if None in specs:
        reason = "q: flash3 needs q, k, v and out describable by tensor maps (strides multiples of 16 bytes)"
    return reason, cfg, specs


def supports(impl, p, config=None):
    """None when ``flash3`` can run ``p``, else the reason (naming the argument)."""
    return _checked(impl, p, config)[0]


def _shape_reason(p):
    return tensor_core_reason(p, "flash3", DTYPES["flash3"], HEAD_DIMS)


def work_tiles(p, rows=BR):
    """The launch's work tiles: ``rows`` query rows of one (head, batch element) each."""
    return _launch.cdiv(p.Sq, rows) * p.Hq * p.B


def row_keys(p):
    """The most keys one query row sees: kv_len, or a sliding window's width (its left side,
    the diagonal, and its right side, which a causal mask ends at the diagonal)."""
    left = p.window_left if p.window_left >= 0 else p.Skv
    right = 0 if p.causal else (p.window_right if p.window_right >= 0 else p.Skv)
    return max(0, min(p.Skv, left + right + 1))


def head_group(p, l2_bytes, share=None):
    """Query heads a group (the kernel's WorkTiles): as many as share the KV heads whose K
    and V fit in ``share`` (default: L2_SHARE's for the mask) of ``l2_bytes`` (at least one
    KV head's). Under a sliding window a KV head's K and V in use are those of the keys a
    work tile's rows see (the window slides on with the query tiles), not all kv_len."""
    kv_head_bytes = 2 * min(p.Skv, row_keys(p) + BR) * p.D * 2
    share = L2_SHARE[bool(p.causal)] if share is None else share
    kv_heads = max(1, int(l2_bytes * share) // max(kv_head_bytes, 1))
    return max(1, min(p.Hq * p.B, kv_heads * (p.Hq // p.Hkv)))


def default_config(p):
    """The configuration ``config=None`` takes: CAUSAL_CONFIG under a causal mask, else the
    head_dim's first (a persistent grid; for packed sequences its one-block-a-tile twin)."""
    if p.causal:
        return CAUSAL_CONFIG[p.D]
    cfg = next(iter(CONFIGS[p.D]))
    # Packed sequences of mixed lengths make work tiles of unequal length, as a causal mask
    # does: one block a tile (the hardware hands the next to the SM that frees first).
    # Measured (H100, fp16, 8 sequences of 256..4096, head_dim 128, NOTES 91): 569 against
    # 493 TFLOP/s for the persistent grid's fixed round robin.
    if p.varlen and cfg.endswith("_pg") and cfg[:-3] in CONFIGS[p.D]:
        cfg = cfg[:-3]
    return cfg


def plan(p, config=None, sm_count=132):
    """The ``_launch.Launch`` for ``p`` on a GPU of ``sm_count`` SMs (a plain function of
    numbers: the CPU tier checks it): a 1-D grid of one block an SM (persistent) or one a
    work tile."""
    reason = _shape_reason(p)
    cfg = tile_config(p, "flash3", CONFIGS, config or (None if reason else default_config(p)), reason)
    c = CONFIGS[p.D][cfg]
    tiles = work_tiles(p, c.rows)
    grid = (min(tiles, sm_count) if c.persistent else tiles,)
    return _launch.Launch(KERNELS, _name(p.dtype, p.D, cfg, masks(p)), grid, (c.threads,), smem_bytes(p.D, cfg),
                          "attention impl='flash3'")


def runs_here(props):
    """Does this GPU run flash3 (sm_90 with the driver's tensor-map encoder)?"""
    return _tma.sm90a_reason(KERNELS, props, "") is None


def launch(impl, p, config=None, l2_share=None):
    """Run ``flash3`` on problem ``p`` on CuPy's current stream (``l2_share``: head_group's
    share, for sweeps)."""
    if p.B == 0 or p.Hq == 0 or p.Sq == 0:
        return
    props = _launch.device_props()
    why = _tma.sm90a_reason(KERNELS, props, "'flash3'")
    if why:
        raise ValueError(f"impl: {why}")
    reason, cfg, specs = _checked(impl, p, config)
    if reason:
        raise ValueError(reason)
    maps = []
    for arr, name, (dims, strides, box) in zip((p.Q, p.K, p.V, p.O), ("q", "k", "v", "out"), specs):
        m = _tma.encode_tiled(arr.data.ptr, dims, strides, box)
        if m is None:
            raise RuntimeError(f"attention: the driver refused the tensor map of {name} (dims {dims}, byte strides "
                               f"{strides}, box {box})")
        maps.append(m)
    group = np.int32(head_group(p, props.l2_bytes, l2_share))
    plan(p, cfg, props.sm_count)(p.args() + tuple(maps) + (group,) + p.varlen_args())
