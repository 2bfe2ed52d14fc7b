"""The CUDA-core (FFMA) GEMM rungs of kernels/gemm_simt.cu, and their launchers.

``launch(impl, p, config=None)`` launches rung ``impl`` on the ``GemmProblem`` ``p`` on
CuPy's current stream. ``gemm_naive`` serves every dtype (the universal reference rung);
the other rungs are float32 only.

``config`` (``gemm_pipelined`` only; see ``CONFIGS``) forces a block-tile configuration,
spelled ``<BM>x<BN>x<BK>s<STAGES>`` (block tile BM x BN, k slices BK deep, a ring of
STAGES slices in shared memory):

- ``128x128x32s2`` (the default for large problems): 256 threads with 8x8 outputs each,
  <= 128 registers so two blocks share an SM (their barriers overlap), k slices 32 deep in
  a ring of two (68 KB of shared memory a block, opt-in past 48 KB): one barrier, wait and
  set of copies per 32 k-steps. Measured on an H100 (benchmarks/gemm_sweep.py, two runs):
  0.6-1.1 % faster than ``128x128x16s3``; three 32-deep stages (101 KB a block, 0.8-1.3 %
  slower: two such blocks leave the L1 20 KB) and two 16-deep ones (3 % slower) were not.
- ``128x128x16s3``: 16-deep slices in a ring of three (50 KB), the default until
  session 6; 16-deep slices halved the per-slice bookkeeping (copies, wait, barrier) per
  FFMA compared with 8: ~86 % of the loop's instructions are FFMAs.
- ``128x128x8s3``: the same with the classic 8-deep slices (25 KB): the check on the
  deeper slices (~82 % FFMAs).
- ``128x256x16s3``: 256 threads with 8x16 outputs each (~230 registers, one block an SM,
  74 KB): 6 LDS.128 per 128 FFMAs instead of 4 per 64, ~90 % FFMAs, but a barrier stalls
  the SM's only block.
- ``64x64x8s4``: 128 threads with 8x4 outputs each, 17 KB: four times the blocks of
  128x128, for problems whose 128x128 tiles would leave SMs idle.

``None`` picks by shape: 128x128x32s2 when the stack has at least one 128x128 tile per SM,
else 64x64x8s4.
"""
from .. import _dtypes, _launch
from .._kernels import KernelFile, template_name
from ._gemm_problem import LAYOUTS, check_rung

VARIANTS = {
    "naive": "one thread per output, a K loop from global memory: the reference rung, any dtype",
    "tiled": "32x32 tiles staged in shared memory, one output per thread: each load feeds 32 FMAs",
    "regblock": "128x128 block tile, 8x8 outputs per thread as outer products from registers, "
    "k-major shared tiles read with 16-byte LDS, 16-byte global loads",
    "pipelined": "cp.async multi-stage shared-memory ring, double-buffered register fragments, "
    "grouped block order for L2 reuse, 16-byte stores: the top FFMA rung",
}
DTYPES = {
    "naive": ("float32", "float16", "bfloat16", "int8"),
    "tiled": ("float32",),
    "regblock": ("float32",),
    "pipelined": ("float32",),
}

# config name -> (BM, BN, BK, STAGES, TM, TN): block tile, k slice, ring depth, thread tile
_PIPELINED = {
    "128x128x32s2": (128, 128, 32, 2, 8, 8),
    "128x128x16s3": (128, 128, 16, 3, 8, 8),
    "128x128x8s3": (128, 128, 8, 3, 8, 8),
    "128x256x16s3": (128, 256, 16, 3, 8, 16),
    "64x64x8s4": (64, 64, 8, 4, 8, 4),
}
CONFIGS = {"naive": (), "tiled": (), "regblock": (), "pipelined": tuple(_PIPELINED)}
DEFAULT_CONFIG = "128x128x32s2"
SMALL_CONFIG = "64x64x8s4"

_MAX_GRID_X = 2**31 - 1
_MAX_GRID_Y = 65535


def pipelined_threads(cfg):
    """Threads of a gemm_pipelined block: 32 * (BM / (4 TM)) * (BN / (8 TN)) (SimtTile)."""
    bm, bn, _, _, tm, tn = _PIPELINED[cfg]
    return 32 * (bm // (4 * tm)) * (bn // (8 * tn))


def pipelined_smem(cfg):
    """Dynamic shared memory of gemm_pipelined: STAGES slices of As[BK][BM+4], Bs[BK][BN+4]."""
    bm, bn, bk, stages, _, _ = _PIPELINED[cfg]
    return stages * bk * (bm + 4 + bn + 4) * 4


def pick_config(p, sm_count):
    """The tile configuration for problem ``p`` on a GPU of ``sm_count`` SMs."""
    tiles = _launch.cdiv(p.M, 128) * _launch.cdiv(p.N, 128) * p.batch
    return DEFAULT_CONFIG if tiles >= sm_count else SMALL_CONFIG


def _name(impl, dtype, ta, tb, cfg=None):
    args = [_dtypes.cuda_type(dtype), ta, tb]
    if impl == "pipelined":
        args += list(_PIPELINED[cfg])
    return template_name(f"gemm_{impl}", *args)


def _expressions():
    names = []
    for impl in VARIANTS:
        for dtype in DTYPES[impl]:
            for ta, tb in LAYOUTS:
                if impl == "pipelined":
                    names += [_name(impl, dtype, ta, tb, cfg) for cfg in _PIPELINED]
                else:
                    names.append(_name(impl, dtype, ta, tb))
    return names


KERNELS = KernelFile("gemm_simt.cu", _expressions())
KERNEL_FILES = [KERNELS]


def geometry(impl, p, config=None, sm_count=132):
    """(kernel name, grid, block, dynamic shared memory bytes) for rung ``impl`` on ``p``;
    a plain function of numbers so the CPU tier can check it."""
    check_rung("gemm_simt", impl, p.dtype, config, VARIANTS, DTYPES, CONFIGS)
    ta, tb = p.layout()
    gz = p.grid_z()
    cdiv = _launch.cdiv
    if impl == "naive":
        return (_name(impl, p.dtype, ta, tb), (cdiv(p.N, 16), min(cdiv(p.M, 16), _MAX_GRID_Y), gz), (16, 16), 0)
    if impl == "tiled":
        return (_name(impl, p.dtype, ta, tb), (cdiv(p.N, 32), min(cdiv(p.M, 32), _MAX_GRID_Y), gz), (32, 32), 0)
    if impl == "regblock":
        tiles = cdiv(p.M, 128) * cdiv(p.N, 128)
        return (_name(impl, p.dtype, ta, tb), (min(tiles, _MAX_GRID_X), 1, gz), (256,), 0)
    cfg = config or pick_config(p, sm_count)
    bm, bn = _PIPELINED[cfg][:2]
    tiles = cdiv(p.M, bm) * cdiv(p.N, bn)
    return (_name(impl, p.dtype, ta, tb, cfg), (min(tiles, _MAX_GRID_X), 1, gz),
            (pipelined_threads(cfg),), pipelined_smem(cfg))


def launch(impl, p, config=None):
    """Run rung ``impl`` of gemm_simt on problem ``p`` on CuPy's current stream."""
    if p.M == 0 or p.N == 0 or p.batch == 0:
        return  # nothing to write
    props = _launch.device_props()
    name, grid, block, smem = geometry(impl, p, config, props.sm_count)
    fn = KERNELS.function(name)
    if smem:
        _launch.request_smem(fn, smem, props, f"gemm_{impl}")
    fn(grid, block, p.args(), shared_mem=smem)
