"""The Hopper GEMM rungs of kernels/gemm_wgmma.cu (sm_90a: wgmma + TMA), and their launcher.

``launch(impl, p)`` runs rung ``impl`` on the ``GemmProblem`` ``p`` on CuPy's current
stream, for float16 and bfloat16 on a compute-capability 9.0 GPU (H100, H200):

- ``wgmma``: one warpgroup, 64 x 256 block tiles, a 4-stage ring filled by tensor copies,
  wgmma straight from shared memory, every k-tile waited for before its stage is refilled.
- ``wgmma_ws``: a producer warpgroup and two consumer warpgroups (setmaxnreg) around a
  full/empty mbarrier ring, 128 x 256 tiles, one persistent block an SM over the tiles in
  grouped order. With beta == 0 its epilogue stages the tile in shared memory and writes
  it by tensor stores (``output_map``), which run on while the next tile starts. ``config`` (``CONFIGS``): ``128x256`` runs blocks on their own;
  ``128x256c2`` (the default) pairs blocks in clusters of 2 that take two tiles stacked
  along M: each block copies its A and half of the shared B columns, multicast to both, so
  B crosses L2 once for the pair. The persistent grid is as many clusters as the driver
  says fit at once (``_launch.max_active_clusters``).

Both read A and B through tensor maps (cupyops/_tma.py): 3-D (elements, rows, batch)
with the 128-byte swizzle wgmma's descriptors expect; a K-contiguous operand moves in boxes
of 64 K x (tile rows), an M/N-contiguous one in boxes of 64 x 64 that wgmma reads
transposed. A tensor map needs a 16-byte aligned start and row and batch strides that are
multiples of 16 bytes (and a nonzero row stride): a problem whose operands are otherwise
runs ``mma`` (gemm_mma.cu), which takes any layout, as does every problem on another GPU
under ``impl="auto"``. Naming a wgmma rung on a GPU other than sm_90 is an error.
"""
import numpy as np

from .. import _launch, _tma
from .._kernels import SPLIT_COMPILE, KernelFile, template_name
from . import _gemm_mma
from ._gemm_problem import LAYOUTS, check_rung

VARIANTS = {
    "wgmma": "sm_90a: wgmma from 128-byte-swizzled shared memory filled by tensor copies (TMA) "
    "in a 4-stage mbarrier ring, one warpgroup on 64x256 tiles, each k-tile waited for",
    "wgmma_ws": "sm_90a: warp-specialised (a TMA producer warpgroup, two wgmma consumer "
    "warpgroups, setmaxnreg) around full/empty mbarriers, 128x256 tiles, persistent over "
    "the tiles in grouped order",
}
DTYPES = {impl: ("float16", "bfloat16") for impl in VARIANTS}
# config -> blocks a cluster (wgmma_ws)
CLUSTERS = {"128x256": 1, "128x256c2": 2}
CONFIGS = {"wgmma": (), "wgmma_ws": tuple(CLUSTERS)}
DEFAULT_CONFIG = {"wgmma": None, "wgmma_ws": "128x256"}

ARCH = "sm_90a"
CC = 90  # the compute capability an sm_90a cubin runs on
BK = 64  # K of a stage: 128 bytes of a 16-bit type (the swizzle's row)
BN = 256
BM = {"wgmma": 64, "wgmma_ws": 128}
THREADS = {"wgmma": 128, "wgmma_ws": 384}
STAGES = {"wgmma": 4, "wgmma_ws": 4}
RING_ALIGN = 1024  # the 128-byte swizzle repeats every 1024 bytes: stages start aligned
PIECE = 64  # rows of an M/N-contiguous operand's box (64 x 64 elements, 8 KB)
_MAX_GRID_X = 2**31 - 1


STAGING = {"wgmma": 0, "wgmma_ws": 2 * 64 * 128 * 2}  # the epilogue's: 16 KB a consumer warpgroup


def smem(impl):
    """Dynamic shared memory of rung ``impl``: the ring of (BM + BN) x 64 16-bit elements a
    stage, the epilogue's staging (wgmma_ws), the 1024-byte alignment, and two 8-byte
    mbarriers a stage."""
    return STAGES[impl] * (BM[impl] + BN) * BK * 2 + STAGING[impl] + RING_ALIGN + 16 * STAGES[impl]


def cluster_of(impl, config):
    """Blocks a cluster for rung ``impl`` under ``config`` (None: the rung's default)."""
    config = config or DEFAULT_CONFIG[impl]
    return CLUSTERS[config] if config else 1


def _name(impl, dtype, ta, tb, cluster=1):
    from .. import _dtypes

    extra = (cluster,) if impl == "wgmma_ws" else ()
    return template_name("gemm_" + impl, _dtypes.cuda_type(dtype), ta, tb, STAGES[impl], *extra)


def _expressions():
    names = []
    for impl in VARIANTS:
        for cfg in CONFIGS[impl] or (None,):
            for dtype in DTYPES[impl]:
                names += [_name(impl, dtype, ta, tb, cluster_of(impl, cfg)) for ta, tb in LAYOUTS]
    return names


KERNELS = KernelFile("gemm_wgmma.cu", _expressions(), options=SPLIT_COMPILE, arch=ARCH)
KERNEL_FILES = [KERNELS]


def plan(impl, p, config=None, sm_count=132, clusters=None):
    """The ``_launch.Launch`` of rung ``impl`` on problem ``p`` (a plain function of numbers:
    the CPU tier checks it). ``clusters``: how many clusters of the configuration fit on
    the GPU at once (default: SMs / cluster size)."""
    check_rung("gemm_wgmma", impl, p.dtype, config, VARIANTS, DTYPES, CONFIGS)
    cl = cluster_of(impl, config)
    if impl == "wgmma_ws":  # persistent: a cluster a slot walks units of cl tiles along M
        units = _launch.cdiv(p.M, BM[impl] * cl) * _launch.cdiv(p.N, BN) * p.batch
        grid = (cl * min(units, clusters or sm_count // cl), 1, 1)
    else:
        tiles = _launch.cdiv(p.M, BM[impl]) * _launch.cdiv(p.N, BN)
        grid = (min(tiles, _MAX_GRID_X), 1, p.grid_z())
    return _launch.Launch(KERNELS, _name(impl, p.dtype, *p.layout(), cl), grid, (THREADS[impl],), smem(impl),
                          f"gemm impl={impl!r}", cl)


def map_specs(impl, p, cluster=1):
    """(dims, byte strides, box) of the tensor maps of A and B, or None where K == 0.
    Each map is 3-D: the contiguous extent first, then the other, then the batch (one entry
    for a broadcast operand or a single product). K-contiguous operands (A stored M x K,
    B stored N x K) move in boxes of 64 K x the rows a block copies (B: 1/cluster of the
    tile's); M/N-contiguous ones in boxes of 64 M/N x 64 K, several a stage."""
    if p.K == 0:
        return None
    specs = []
    for ld, stride, rows, tile_rows, mn_major in ((p.lda, p.sA, p.M, BM[impl], p.ta),
                                                  (p.ldb, p.sB, p.N, BN // cluster, not p.tb)):
        entries = p.batch if stride else 1
        inner, outer = (rows, p.K) if mn_major else (p.K, rows)
        batch_bytes = 2 * (stride if stride else ld * outer)  # (unused with one entry)
        box = (PIECE, BK, 1) if mn_major else (BK, tile_rows, 1)
        specs.append(((inner, outer, entries), (2 * ld, batch_bytes), box))
    return specs


def tensor_maps(impl, p, cluster=1):
    """The tensor maps of A and B (128 bytes each), or None where a map cannot describe an
    operand (start not 16-byte aligned, a row or batch stride that is not a nonzero
    multiple of 16 bytes, or the driver refuses): the problem then runs ``mma``."""
    specs = map_specs(impl, p, cluster)
    if specs is None:
        return None
    maps = []
    for arr, (dims, strides, box) in zip((p.A, p.B), specs):
        row, batch = strides
        if arr.data.ptr % 16 or row <= 0 or row % 16 or batch % 16:
            return None
        m = _tma.encode_tiled(arr.data.ptr, dims, strides, box)
        if m is None:
            return None
        maps.append(m)
    return tuple(maps)


NO_MAP = bytes(128)  # stands for mapD where the epilogue stores directly (never read then)


def output_map(p):
    """(tensor map of D, 1) for wgmma_ws's epilogue of tensor stores, or (NO_MAP, 0) where it
    stores directly: beta != 0 (C is read element by element, and may be D), or a D that a
    map cannot describe (rows of a number of elements that is not a multiple of 8). D is
    (N, M, batch) in boxes of 64 x 64 x 1, the 128-byte swizzle."""
    if p.C is not None and p.beta != 0:
        return NO_MAP, 0
    entries = p.batch if p.sD else 1
    strides = (2 * p.ldd, 2 * (p.sD if p.sD else p.ldd * p.M))
    if p.D.data.ptr % 16 or strides[0] <= 0 or strides[0] % 16 or strides[1] % 16:
        return NO_MAP, 0
    m = _tma.encode_tiled(p.D.data.ptr, (p.N, p.M, entries), strides, (PIECE, PIECE, 1))
    return (NO_MAP, 0) if m is None else (m, 1)


def runs_here(props):
    """Does this GPU run the wgmma rungs (sm_90 with the driver's tensor-map encoder)?"""
    return KERNELS.runs_on(props.cc) and _tma.available()


_PLANS = {}  # memoized Launch per (impl, GemmProblem.shape_key, config, device)
_SLOTS = {}  # clusters that fit at once, per (kernel name, device)


def _cluster_slots(name, cluster, props, device):
    """How many clusters of kernel ``name`` run at once (None: one block an SM)."""
    if cluster == 1:
        return None

    def query():
        fn = KERNELS.function(name)
        _launch.request_smem(fn, smem("wgmma_ws"), props, "gemm impl='wgmma_ws'")
        return _launch.max_active_clusters(fn, cluster, (THREADS["wgmma_ws"],), smem("wgmma_ws")) or 0

    return _launch.memo(_SLOTS, (name, device), query) or None


def launch(impl, p, config=None):
    """Run rung ``impl`` of gemm_wgmma on problem ``p`` on CuPy's current stream."""
    check_rung("gemm_wgmma", impl, p.dtype, config, VARIANTS, DTYPES, CONFIGS)
    if p.M == 0 or p.N == 0 or p.batch == 0:
        return  # nothing to write
    props = _launch.device_props()
    if not runs_here(props):
        raise ValueError(f"impl: {impl!r} needs a compute-capability 9.0 GPU (H100, H200) and a driver with "
                         f"tensor maps; this is {props.name} (sm_{props.cc})")
    cl = cluster_of(impl, config)
    maps = tensor_maps(impl, p, cl)
    if maps is None:
        _gemm_mma.launch("mma", p)
        return
    device = _launch.current_device()

    def build():
        slots = _cluster_slots(_name(impl, p.dtype, *p.layout(), cl), cl, props, device)
        return plan(impl, p, config, props.sm_count, slots)

    args = p.args() + maps
    if impl == "wgmma_ws":
        d_map, by_tma = output_map(p)
        args += (d_map, np.int32(by_tma))
    _launch.memo(_PLANS, (impl, p.shape_key(), config, device), build)(args)
