"""The float8 GEMM of kernels/gemm_fp8.cu (sm_90a: e4m3 wgmma + TMA), and its launcher.

``launch(impl, p)`` runs rung ``impl`` on the ``Fp8Problem`` ``p`` on CuPy's current stream,
on a compute-capability 9.0 GPU (H100, H200) alone; ``cupyops.ops.fp8.scaled_matmul`` has
checked the arguments and laid the operands out as the kernel needs them:

- ``wgmma_ws``: a producer warpgroup issuing tensor copies and two consumer warpgroups
  (setmaxnreg) around a full/empty mbarrier ring, 128 x BN tiles (``CONFIGS``), one
  persistent block an SM over the tiles in grouped order; e4m3 wgmmas whose partial sums
  are added into float32 accumulators every 128 K (the fp8 tensor cores' own running sum
  keeps ~14 bits); scales and bias applied in the epilogue.

Both operands are K-major (8-bit wgmma has no transpose): A stored M x K, B stored N x K,
each read through a 3-D tensor map (K, rows, 1) of 1-byte elements with the 128-byte
swizzle, in boxes of 128 K x 128 rows (A) and 128 K x BN rows (B). A tensor map needs a
16-byte aligned start and a row stride that is a multiple of 16 bytes (``k_major_ld``).
"""
import dataclasses

import numpy as np

from .. import _arrays, _dtypes, _launch, _tma
from .._kernels import SPLIT_COMPILE, KernelFile, template_name

VARIANTS = {
    "wgmma_ws": "sm_90a: e4m3 wgmma (k32, both operands K-major) from a TMA ring, a producer and "
    "two consumer warpgroups, 128x192 or 128x256 tiles, persistent; partial sums promoted to "
    "float32 every 128 K; scales and bias in the epilogue",
}
OUT_TYPES = ("bfloat16", "float16", "float32")

ARCH = "sm_90a"
BM = 128  # rows of a tile (64 a consumer warpgroup)
BK = 128  # K of a stage: 128 one-byte elements, the 128-byte swizzle's row
# config -> (BN, STAGES): as many stages of (BM + BN) x BK bytes as fit in 227 KB beside the
# epilogue's staging
TILES = {"128x256": (256, 4), "128x192": (192, 4), "128x128": (128, 6)}
STAGING = 2 * 64 * 128 * 2  # the tensor-store epilogue's: 16 KB a consumer warpgroup
CONFIGS = {"wgmma_ws": tuple(TILES)}
DEFAULT_CONFIG = None  # None: pick_config's choice; the sweeps set a tile here
# Relative speed of one tile column a wave (the wave model of pick_config), from
# benchmarks/fp8_probe.py --configs all on an H100 (NOTES): the 192-wide tile ran ~2 %
# faster than the 256-wide one where both fill their last wave alike; 128 lost everywhere.
EFFICIENCY = {256: 1.0, 192: 1.02, 128: 0.9}
THREADS = 384  # a producer and two consumer warpgroups
# Tile rows of a group of the persistent walk (gemm_sm90.cuh TileOrder, serpentine): 8, where
# the 16-bit GEMM takes 16; 16 measured 0-1.4 % behind at 4096 x 28672 x 4096 and 8192^3
# (NOTES 132). The probes' A/B sets it.
GROUP_ROWS = 8
ALIGN = _tma.ALIGN  # bytes: a tensor map's start and row stride
BIAS_NONE, BIAS_F32, BIAS_OUT = 0, 1, 2  # the kernel's bias_kind


def smem(config):
    """Dynamic shared memory: the ring of (BM + BN) x BK bytes a stage, the epilogue's
    staging, the ring's 1024-byte alignment, and two 8-byte mbarriers a stage."""
    bn, stages = TILES[config]
    return stages * (BM + bn) * BK + STAGING + _tma.SWIZZLE_ATOM_BYTES + 16 * stages


def _name(out_dtype, config):
    return template_name("scaled_matmul_wgmma_ws", _dtypes.cuda_type(out_dtype), *TILES[config])


KERNELS = KernelFile("gemm_fp8.cu", [_name(d, c) for d in OUT_TYPES for c in TILES], options=SPLIT_COMPILE,
                     arch=ARCH)
KERNEL_FILES = [KERNELS]


@dataclasses.dataclass
class Fp8Problem:
    """One checked launch: D (M x N, C-contiguous, out_dtype) = A @ B^T scaled, biased.
    A and B are uint8 device arrays of e4m3 bits stored rows x K (K-major) with row strides
    lda / ldb in bytes. A scale is either a host scalar (``scale_a`` None, ``sa0`` the
    value) or a float32 device array read at index ``m * sa_step`` (step 0: one value)."""

    M: int
    N: int
    K: int
    A: object
    B: object
    lda: int
    ldb: int
    D: object
    out_dtype: str
    scale_a: object = None
    sa_step: int = 0
    sa0: float = 1.0
    scale_b: object = None
    sb_step: int = 0
    sb0: float = 1.0
    bias: object = None
    bias_kind: int = BIAS_NONE

    def args(self):
        """The kernel's arguments before the two tensor maps, with its C types."""
        null = _arrays.NULL_PTR
        return (
            self.D, np.int32(self.M), np.int32(self.N), np.int32(self.K), np.int64(self.N),
            null if self.scale_a is None else self.scale_a, np.int32(self.sa_step), np.float32(self.sa0),
            null if self.scale_b is None else self.scale_b, np.int32(self.sb_step), np.float32(self.sb0),
            null if self.bias is None else self.bias, np.int32(self.bias_kind),
        )

    def shape_key(self):
        return (self.M, self.N, self.K, self.out_dtype)


def k_major_ld(shape, strides, ptr):
    """The row stride (bytes) under which a tensor map reads the rows x K uint8 view of
    this ``shape`` / byte ``strides`` / device address, or None when it cannot (a copy is
    needed): K must be the unit-stride axis, the start 16-byte aligned, the rows a multiple
    of 16 bytes apart and not overlapping. A single row needs no row stride: K itself
    (a multiple of 16 where the caller checked K) stands in."""
    rows, K = shape
    s_rows, s_k = strides
    if ptr % ALIGN or (s_k != 1 and K > 1):
        return None
    if rows == 1:
        return -(-K // ALIGN) * ALIGN
    if s_rows % ALIGN or s_rows < K:
        return None
    return s_rows


def pick_config(M, N, sm_count=132):
    """The tile of an M x N output: fewest waves of tiles over the SMs, each wave costing its
    tile's columns over the tile's measured speed (``EFFICIENCY``)."""
    def cost(cfg):
        bn = TILES[cfg][0]
        return _launch.cdiv(_launch.cdiv(M, BM) * _launch.cdiv(N, bn), sm_count) * bn / EFFICIENCY[bn]

    return min(TILES, key=cost)


def plan(M, N, out_dtype, sm_count=132, config=None):
    """The ``_launch.Launch`` of ``wgmma_ws`` for an M x N output (a plain function of
    numbers: the CPU tier checks it): one persistent block an SM, at most one a tile."""
    if out_dtype not in OUT_TYPES:
        raise TypeError(f"out_dtype: {out_dtype!r} is not one of {', '.join(OUT_TYPES)}")
    config = pick_config(M, N, sm_count) if config is None else config
    if config not in TILES:
        raise ValueError(f"config: unknown scaled_matmul tile {config!r}; expected one of {', '.join(TILES)}")
    tiles = _launch.cdiv(M, BM) * _launch.cdiv(N, TILES[config][0])
    return _launch.Launch(KERNELS, _name(out_dtype, config), (max(1, min(tiles, sm_count)), 1, 1), (THREADS,),
                          smem(config), "scaled_matmul impl='wgmma_ws'")


def map_specs(M, N, K, lda, ldb, config):
    """(dims, byte strides, box) of the tensor maps of A (M x K) and B (N x K): K
    innermost, then the rows, then a batch of one (its stride is never stepped, but must
    be a multiple of 16 bytes: a whole operand)."""
    return [((K, rows, 1), (ld, ld * rows), (BK, box_rows, 1))
            for rows, ld, box_rows in ((M, lda, BM), (N, ldb, TILES[config][0]))]


def tensor_maps(p, config):
    """The tensor maps of A and B (128 bytes each). The caller has made both operands
    describable (``k_major_ld``); a refusal by the driver is an error here."""
    maps = []
    for arr, name, (dims, strides, box) in zip((p.A, p.B), ("a", "b"), map_specs(p.M, p.N, p.K, p.lda, p.ldb, config)):
        m = _tma.encode_tiled(arr.data.ptr, dims, strides, box, _tma.SWIZZLE_128B, _tma.DATA_UINT8)
        if m is None:
            raise RuntimeError(f"scaled_matmul: the driver refused the tensor map of {name} (dims {dims}, byte "
                               f"strides {strides}, box {box}, address {arr.data.ptr:#x})")
        maps.append(m)
    return tuple(maps)


def output_map(p):
    """(tensor map of D, 1) for the epilogue of tensor stores, or (NO_MAP, 0) where it
    stores directly: float32 D (the staging holds 16-bit outputs), a bias or per-column
    scales of B (the kernel applies those in the direct stores alone), or a D that a map
    cannot describe (rows of a number of elements that is not a multiple of 8). D is
    (N, M, 1) in boxes of 64 x 64 x 1, the 128-byte swizzle."""
    if p.out_dtype == "float32" or p.bias_kind != BIAS_NONE or p.sb_step != 0:
        return _tma.NO_MAP, 0
    strides = (2 * p.N, 2 * p.N * p.M)
    if not _tma.describable(p.D.data.ptr, *strides):
        return _tma.NO_MAP, 0
    m = _tma.encode_tiled(p.D.data.ptr, (p.N, p.M, 1), strides, (64, 64, 1))
    return (_tma.NO_MAP, 0) if m is None else (m, 1)


def runs_here(props):
    """Does this GPU run gemm_fp8.cu (sm_90 with the driver's tensor-map encoder)?"""
    return gpu_error(props) is None


def gpu_error(props):
    """Why this GPU cannot run the float8 GEMM (None when it can)."""
    why = _tma.sm90a_reason(KERNELS, props, "the float8 GEMM")
    return why if why is None or KERNELS.runs_on(props.cc) else f"{why}; there is no fallback kernel"


_PLANS = {}  # memoized Launch per (Fp8Problem.shape_key, device)


def launch(impl, p, config=None):
    """Run rung ``impl`` on problem ``p`` (M, N, K > 0) on CuPy's current stream, in tile
    ``config`` (default: ``DEFAULT_CONFIG`` where a sweep set one, else ``pick_config``)."""
    if impl not in VARIANTS:
        raise ValueError(f"impl: unknown scaled_matmul rung {impl!r}; expected one of {', '.join(VARIANTS)}")
    props = _launch.device_props()
    why = gpu_error(props)
    if why is not None:
        raise ValueError(f"impl: {impl!r}: {why}")
    config = config or DEFAULT_CONFIG or pick_config(p.M, p.N, props.sm_count)
    d_map, by_tma = output_map(p)
    maps = tensor_maps(p, config) + (d_map, np.int32(by_tma), np.int32(GROUP_ROWS))
    key = (p.shape_key(), config, _launch.current_device())
    _launch.memo(_PLANS, key, lambda: plan(p.M, p.N, p.out_dtype, props.sm_count, config))(p.args() + maps)
