"""The CUDA-core attention rungs of kernels/attention.cu, and their launchers (the
launcher-module interface is described in _attention_problem.py).

- ``naive``: three launches (scores into a float32 workspace of B * Hq * Sq * Skv elements
  from CuPy's pool, the row softmax in place, P @ V). Every dtype, head_dim 1..256.
- ``tiled``: one launch, a block per 16 query rows of one (batch, head); head_dim 1..256
  (dynamic shared memory grows with it: ``tiled_smem``).
- ``flash_v1``: one launch, a block per 64 query rows of one (batch, head), instantiated per
  head_dim tier (``FLASH_V1_TIERS``: the smallest tier >= head_dim runs, zero-padded).

``plan(impl, p, sm_count)`` is the one place that chooses kernels and geometry; it is a
plain function of numbers, so the CPU tier checks it.
"""
import dataclasses

import numpy as np

from .. import _arrays, _dtypes, _launch
from .._kernels import KernelFile, template_name
from ._attention_problem import MAX_HEAD_DIM

VARIANTS = {
    "naive": "scores in a float32 B*Hq*Sq*Skv workspace, a block per row for a three-pass "
    "softmax, then P @ V: O(N^2) memory, the reference rung",
    "tiled": "a block per 16 query rows, Q/K/V and score tiles in shared memory (no workspace); "
    "two sweeps over K: row max and sum first, then P @ V with the final statistics",
    "flash_v1": "FlashAttention on CUDA cores: one sweep with the online softmax, 64x64 tiles, "
    "4x4 register tiles, 16-byte loads, causal tiles skipped; any head_dim up to 256",
}
DTYPES = {impl: _dtypes.FLOAT_TYPES for impl in VARIANTS}

NAIVE_THREADS = 256  # scores and P @ V: a thread per element
NAIVE_ROW_THREADS = 128  # softmax: a block per row
TILED_BQ, TILED_BK, TILED_THREADS = 16, 32, 256
FLASH_V1_TIERS = (32, 64, 128, 256)
FLASH_V1_BQ, FLASH_V1_THREADS = 64, 256
# grid-stride kernels: this many blocks per SM cover the GPU many times over; more only
# adds block scheduling
_STRIDE_BLOCKS_PER_SM = 32
_MAX_GRID_X = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Launch:
    name: str
    grid: tuple
    block: tuple
    smem: int  # dynamic shared memory bytes


@dataclasses.dataclass(frozen=True)
class Plan:
    launches: tuple  # Launch, in order
    workspace: int  # float32 elements of the naive rung's score matrix (0 for the others)


def head_dim_tier(D):
    """The flash_v1 instantiation for head_dim D: the smallest tier >= D."""
    for t in FLASH_V1_TIERS:
        if D <= t:
            return t
    raise ValueError(f"head_dim: flash_v1 supports 1..{FLASH_V1_TIERS[-1]}, got {D}")


def flash_v1_bk(tier):
    """Keys a K/V tile of attention_flash_v1 (FlashV1<DT>::BK): 64, or 32 at tier 256 where
    three 64-row float tiles would not fit in shared memory."""
    return 64 if tier <= 128 else 32


def flash_v1_smem(tier):
    """FlashV1<DT>::SMEM: Q and V tiles, and the K tile that P then replaces (rows padded
    by 4 floats)."""
    ds, bk = tier + 4, flash_v1_bk(tier)
    return (FLASH_V1_BQ * ds + bk * ds + max(bk * ds, FLASH_V1_BQ * (bk + 4))) * 4


def tiled_smem(D):
    """attention_tiled: Q, K, V tiles (row stride D | 1), the score tile, two row stats."""
    dp = D | 1
    return (TILED_BQ * dp + 2 * TILED_BK * dp + TILED_BQ * (TILED_BK + 1) + 2 * TILED_BQ) * 4


def _name(kernel, dtype, *args):
    return template_name(f"attention_{kernel}", _dtypes.cuda_type(dtype), *args)


def _expressions():
    names = []
    for dtype in _dtypes.FLOAT_TYPES:
        names += [_name(k, dtype) for k in ("naive_scores", "naive_softmax", "naive_pv", "tiled")]
        names += [_name("flash_v1", dtype, t) for t in FLASH_V1_TIERS]
    return names


KERNELS = KernelFile("attention.cu", _expressions())
KERNEL_FILES = [KERNELS]


def supports(impl, p):
    """None when rung ``impl`` can run ``p``, else the reason (naming the argument)."""
    if impl not in VARIANTS:
        return f"impl: unknown CUDA-core attention rung {impl!r}; expected one of {', '.join(VARIANTS)}"
    if p.dtype not in DTYPES[impl]:
        return f"q: {impl} supports {', '.join(DTYPES[impl])}, got {p.dtype}"
    if not 1 <= p.D <= MAX_HEAD_DIM:
        return f"head_dim: {impl} supports 1..{MAX_HEAD_DIM}, got {p.D}"
    if p.Hkv < 1 or p.Hq % p.Hkv:
        return f"k: kv_heads ({p.Hkv}) must divide q_heads ({p.Hq})"
    if impl == "tiled":
        return _launch.smem_reason(tiled_smem(p.D), f"head_dim: tiled at head_dim {p.D}")
    if impl == "flash_v1":
        tier = head_dim_tier(p.D)
        return _launch.smem_reason(flash_v1_smem(tier), f"head_dim: flash_v1's head_dim-{tier} tier")
    return None


# attention_flash_v1's last argument: bits of the operands whose rows can be read in 16-byte
# pieces (attention.cu VEC_Q, VEC_K, VEC_V)
VEC_Q, VEC_K, VEC_V = 1, 2, 4


def vec_flags(p):
    """Which of Q, K, V flash_v1 may read 16 bytes at a time: the data pointer, the three
    strides and head_dim all whole 16-byte vectors."""
    n = 16 // _dtypes.itemsize(p.dtype)
    flags = 0
    for bit, arr, strides in ((VEC_Q, p.Q, p.q_strides), (VEC_K, p.K, p.k_strides), (VEC_V, p.V, p.v_strides)):
        if arr.data.ptr % 16 == 0 and p.D % n == 0 and all(s % n == 0 for s in strides):
            flags |= bit
    return flags


def _stride_grid(total, threads, sm_count):
    return (max(1, min(_launch.cdiv(total, threads), sm_count * _STRIDE_BLOCKS_PER_SM)), 1, 1)


def plan(impl, p, sm_count=132):
    """The launches of rung ``impl`` on ``p`` (B, Hq, Sq > 0): kernels, grids, blocks,
    shared memory, and the naive rung's workspace."""
    reason = supports(impl, p)
    if reason:
        raise ValueError(reason)
    if impl == "naive":
        scores = p.B * p.Hq * p.Sq * p.Skv
        rows = p.B * p.Hq * p.Sq
        launches = []
        if scores:  # Skv == 0: no score to compute; the softmax still writes the -inf LSE
            launches.append(Launch(_name("naive_scores", p.dtype), _stride_grid(scores, NAIVE_THREADS, sm_count),
                                   (NAIVE_THREADS, 1, 1), 0))
        launches.append(Launch(_name("naive_softmax", p.dtype), _stride_grid(rows, 1, sm_count),
                               (NAIVE_ROW_THREADS, 1, 1), 0))
        launches.append(Launch(_name("naive_pv", p.dtype), _stride_grid(rows * p.D, NAIVE_THREADS, sm_count),
                               (NAIVE_THREADS, 1, 1), 0))
        return Plan(tuple(launches), scores)
    if impl == "tiled":
        items = p.B * p.Hq * _launch.cdiv(p.Sq, TILED_BQ)
        return Plan((Launch(_name("tiled", p.dtype), (min(items, _MAX_GRID_X), 1, 1), (TILED_THREADS, 1, 1),
                            tiled_smem(p.D)),), 0)
    tier = head_dim_tier(p.D)
    items = p.B * p.Hq * _launch.cdiv(p.Sq, FLASH_V1_BQ)
    return Plan((Launch(_name("flash_v1", p.dtype, tier), (min(items, _MAX_GRID_X), 1, 1),
                        (FLASH_V1_THREADS, 1, 1), flash_v1_smem(tier)),), 0)


def launch(impl, p):
    """Run rung ``impl`` on problem ``p`` on CuPy's current stream."""
    reason = supports(impl, p)
    if reason:
        raise ValueError(reason)
    if p.B == 0 or p.Hq == 0 or p.Sq == 0:
        return  # nothing to write
    props = _launch.device_props()
    pl = plan(impl, p, props.sm_count)
    fns = [KERNELS.function(ln.name) for ln in pl.launches]
    for fn, ln in zip(fns, pl.launches):  # every opt-in checked before the first launch
        if ln.smem:
            _launch.request_smem(fn, ln.smem, props, f"attention impl={impl!r} (head_dim {p.D})")
    args = p.args()
    if impl == "naive":
        cp = _arrays.cupy_module()
        args += (cp.empty(max(pl.workspace, 1), dtype=np.float32),)
    elif impl == "flash_v1":
        args += (np.int32(vec_flags(p)),)
    for fn, ln in zip(fns, pl.launches):
        fn(ln.grid, ln.block, args, shared_mem=ln.smem)
