"""One checked attention launch, as every attention kernel file's launcher receives it.

``cupyops.ops.attention`` checks the arguments, resolves the layout into element strides
and allocates the outputs; it then hands an ``AttentionProblem`` to the launcher module of
the chosen rung (``_attention_simt``, ``_attention_flash``, ``_attention_decode``), which
picks the launch geometry. The meaning of every field is the contract in
kernels/attention_common.cuh (ATTN_PARAMS).

A launcher module exposes:

- ``VARIANTS``: {impl: one line on what the rung adds}
- ``DTYPES``: {impl: the dtype names it claims}
- ``KERNEL_FILES``: its KernelFile objects
- ``supports(impl, p)``: None when the rung can run ``p``, else the reason (a string that
  names the argument, e.g. "head_dim: flash supports 64, 128, got 80")
- ``launch(impl, p)``: run it on CuPy's current stream, writing ``p.O`` (and ``p.LSE``
  unless it is None); any workspace comes from CuPy's memory pool.
- optionally ``fast_launches(impl, p)``: (its launches as (fn, grid, block, smem, args),
  the workspace bytes) for a memoized fast call (cupyops/_fast.py) that replays them on
  other operands of the same layout, or None where they cannot be replayed.
"""
import dataclasses

import numpy as np

from .. import _arrays, _launch

MAX_HEAD_DIM = 256  # the largest head_dim any rung (and attention()) accepts

_SCALARS = {}  # memoized scalar arguments (making a NumPy scalar costs ~0.5 us; a call has 21)


@dataclasses.dataclass
class AttentionProblem:
    dtype: str  # float32, float16, bfloat16 (q, k, v and O share it)
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Skv: int
    D: int  # head_dim
    # CuPy arrays (any view with a unit stride on the head_dim axis); when supports() is
    # asked before the operands exist, attention._Fresh stand-ins with the shape, dtype,
    # strides and data.ptr 0 (CuPy's pool is 512-byte aligned) of the copy to come
    Q: object
    K: object
    V: object
    O: object
    LSE: object  # float32 [B, Hq, Sq] contiguous, or None
    q_strides: tuple  # (batch, seq, head) element strides
    k_strides: tuple
    v_strides: tuple
    o_strides: tuple
    scale: float
    causal: bool
    causal_offset: int  # top_left: 0; bottom_right: Skv - Sq
    # Packed sequences (attention_varlen, which only hands them to flash3): int32
    # [B + 1] CuPy arrays, sequence b being query rows [cu_q[b], cu_q[b + 1]) of Q and O and
    # keys [cu_k[b], cu_k[b + 1]) of K and V, whose batch axis is then 1 (batch strides 0)
    # and whose rows number total_q and total_k. Sq and Skv are then the longest sequence's
    # lengths (the grid's extent), LSE is float32 [Hq, total_q], causal_offset is unused and
    # bottom_right says which alignment every sequence takes (offset Skv_b - Sq_b, or 0).
    cu_q: object = None
    cu_k: object = None
    total_q: int = 0
    total_k: int = 0
    bottom_right: bool = False
    # Sliding window: keys i + causal_offset - window_left .. i + causal_offset +
    # window_right (-1: that side unlimited; causal_offset is then the alignment's offset
    # with or without a causal mask); softcap > 0: scaled scores capped at
    # softcap * tanh(s / softcap), 0: none. Only rungs whose supports() accepts them get
    # other values (masks_reason).
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0

    @property
    def varlen(self):
        return self.cu_q is not None

    @property
    def windowed(self):
        return self.window_left >= 0 or self.window_right >= 0

    def varlen_args(self):
        """The packed-sequence kernel arguments after a rung's own (cu_q, cu_k, total_q,
        total_k, bottom_right): null offsets for a padded batch."""
        if self.cu_q is None:
            return (_arrays.NULL_PTR, _arrays.NULL_PTR, np.int32(0), np.int32(0), np.int32(0))
        return (self.cu_q, self.cu_k, np.int32(self.total_q), np.int32(self.total_k),
                np.int32(1 if self.bottom_right else 0))

    @property
    def group(self):
        """Query heads per KV head."""
        return self.Hq // self.Hkv

    def args(self):
        """Kernel arguments in ATTN_PARAMS order, with the C types the kernels expect."""
        lse = self.LSE if self.LSE is not None else _arrays.NULL_PTR
        key = (self.B, self.Hq, self.Hkv, self.Sq, self.Skv, self.D, self.q_strides, self.k_strides,
               self.v_strides, self.o_strides, self.scale, self.causal, self.causal_offset, self.window_left,
               self.window_right, self.softcap)
        return (self.Q, self.K, self.V, self.O, lse) + _launch.memo(_SCALARS, key, self._scalars)

    def _scalars(self):
        i32, i64 = np.int32, np.int64
        return (
            i32(self.B), i32(self.Hq), i32(self.Hkv), i32(self.Sq), i32(self.Skv), i32(self.D),
            *(i64(s) for s in self.q_strides), *(i64(s) for s in self.k_strides),
            *(i64(s) for s in self.v_strides), *(i64(s) for s in self.o_strides),
            np.float32(self.scale), i32(1 if self.causal else 0), i32(self.causal_offset),
            i32(self.window_left), i32(self.window_right), np.float32(self.softcap),
        )

    def shape_key(self):
        """What a launch plan depends on (not the pointers or strides)."""
        return (self.dtype, self.B, self.Hq, self.Hkv, self.Sq, self.Skv, self.D, self.causal,
                self.causal_offset, self.LSE is not None, self.varlen, self.window_left, self.window_right,
                self.softcap)

    def aligned16(self):
        """Whether Q, K, V and O can be moved in 16-byte pieces (the tensor-core rungs'
        cp.async copies need it): every pointer and stride a multiple of 16 bytes, and
        head_dim a multiple of 16 bytes."""
        item = np.dtype(self.O.dtype).itemsize
        for arr, strides in ((self.Q, self.q_strides), (self.K, self.k_strides),
                             (self.V, self.v_strides), (self.O, self.o_strides)):
            if arr.data.ptr % 16 or any((s * item) % 16 for s in strides) or (self.D * item) % 16:
                return False
        return True


def masks_reason(p, rung, window=False, softcap=False):
    """Why rung ``rung``, which takes sliding windows where ``window`` and soft caps where
    ``softcap``, cannot take problem ``p``'s, naming the argument; None when it can."""
    if p.windowed and not window:
        return f"window: {rung} does not support sliding windows"
    if p.softcap and not softcap:
        return f"softcap: {rung} does not support logit soft-capping"
    return None


MAX_GRID_YZ = 65535  # one block row per query head, one block plane per batch element


def tensor_core_reason(p, rung, dtypes, head_dims):
    """Why a tensor-core rung (``flash``, ``flash3``: 16-bit types, a few head_dims,
    a grid of (query tiles, heads, batch), the scale folded into exp2 of raw-score maxima)
    cannot take problem ``p``, naming the argument; None when it can."""
    if p.dtype not in dtypes:
        return f"q: {rung} supports {', '.join(dtypes)}, got {p.dtype}"
    if p.D not in head_dims:
        return f"head_dim: {rung} supports {', '.join(map(str, head_dims))}, got {p.D}"
    if p.Hq > MAX_GRID_YZ or p.B > MAX_GRID_YZ:
        return f"q: {rung} supports at most {MAX_GRID_YZ} query heads and batch elements, got {p.Hq}, {p.B}"
    if not p.scale > 0:  # the running max is taken on raw scores (scale folded into exp2)
        return f"scale: {rung} needs a positive scale, got {p.scale}"
    return None


def tile_config(p, rung, configs, config, reason):
    """The tile configuration a tensor-core rung launches ``p`` with: ``config``, or the
    first of ``configs[p.D]`` (the default); a ValueError naming the argument where the
    problem (``reason``: tensor_core_reason's answer) or the configuration is refused."""
    if reason:
        raise ValueError(reason)
    cfgs = configs[p.D]
    cfg = config or next(iter(cfgs))
    if cfg not in cfgs:
        raise ValueError(f"config: {cfg!r} is not a {rung} configuration for head_dim {p.D}; "
                         f"expected one of: {', '.join(cfgs)}")
    return cfg
