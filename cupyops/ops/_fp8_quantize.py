"""The float8 quantizer of kernels/quantize.cu (portable CUDA), and its launchers.

``cupyops.ops.fp8.quantize_fp8`` checks the arguments and allocates q and the scale; these
functions pick the launches, each a (kernel, grid, block, args) tuple (plain functions of
numbers and arrays: the CPU tier checks them), and ``run`` issues them on CuPy's current
stream:

- per tensor (``tensor_launches``): with no scale given, ``quantize_fp8_amax`` (one
  resident wave of blocks, a partial amax each) and then ``quantize_fp8_tensor`` (each
  block reduces the partials, block 0 stores the scale, all convert); with a scale, the
  second kernel alone.
- per row (``rows_launches``): ``quantize_fp8_rows``, G threads a row, the amax pass
  (unless the scales are given) and the conversion pass over the row.

Every thread converts 16 elements at a time (16-byte loads in, one 16-byte store of q) where
the tensor's start (per row: every row's start) is 16-byte aligned; elsewhere the same
loops go one element at a time.
"""
import numpy as np

from .. import _dtypes, _launch
from .._kernels import KernelFile, template_name

VARIANTS = {
    "vector": "16 elements a thread (16-byte loads, one 16-byte store of e4m3), saturating "
    "round-to-nearest-even; per tensor: an amax pass of one resident wave then the conversion "
    "pass; per row: G threads a row, amax then conversion over the row (second read from L1)",
}
DTYPES = ("float32", "float16", "bfloat16")

CHUNK = 16  # elements a thread converts at a time (= qf8::CHUNK)
THREADS = 256  # block of the per-tensor kernels (= qf8::THREADS)
# per-tensor grids: one wave of blocks that the kernels' launch bounds keep resident (8 of
# the amax pass at <= 32 registers, 6 of the conversion pass at <= 42)
AMAX_BLOCKS_PER_SM = 8
TENSOR_BLOCKS_PER_SM = 6
AMAX_CHUNKS_PER_THREAD = 4  # the amax pass's fewest chunks a thread before it adds blocks
ROW_BLOCK = 256  # threads of a per-row block, unless a row's group is larger
ROW_GROUP = (4, 512)  # threads a row: powers of two in this range (group_reduce's G)
MAX_GRID_X = 2**31 - 1


def name(kernel, dtype):
    """The instantiation of quantize_fp8_<kernel> for x's dtype."""
    return template_name(f"quantize_fp8_{kernel}", _dtypes.cuda_type(dtype))


KERNELS = KernelFile("quantize.cu", [name(k, d) for k in ("amax", "tensor", "rows") for d in DTYPES])
KERNEL_FILES = [KERNELS]


def tensor_plan(n, sm_count):
    """(P, grid): the amax pass's blocks (each leaves one partial) and the conversion
    pass's blocks for a tensor of n elements; both at most one resident wave, whose
    threads stride through the tensor."""
    chunks = _launch.cdiv(n, CHUNK)
    P = max(1, min(_launch.cdiv(chunks, THREADS * AMAX_CHUNKS_PER_THREAD), AMAX_BLOCKS_PER_SM * sm_count))
    grid = max(1, min(_launch.cdiv(chunks, THREADS), TENSOR_BLOCKS_PER_SM * sm_count))
    return P, grid


def rows_plan(rows, n):
    """(G, block, grid) for rows of n elements: G threads a row, a power of two sized so
    that each thread has about two 16-element chunks of its row, in blocks of
    max(G, ROW_BLOCK) threads (block / G rows each)."""
    lo, hi = ROW_GROUP
    G = min(hi, max(lo, _launch.pow2_ceil(_launch.cdiv(_launch.cdiv(n, CHUNK), 2))))
    block = max(G, ROW_BLOCK)
    grid = _launch.cdiv(rows, block // G)
    if grid > MAX_GRID_X:
        raise ValueError(f"x: {rows} rows are more than one launch covers ({MAX_GRID_X * (block // G)})")
    return G, block, grid


def _aligned(*arrays):
    return all(a.data.ptr % 16 == 0 for a in arrays)


def tensor_launches(dtype, x, q, scale, compute, sm_count, alloc):
    """The launches, (kernel name, grid, block, args), that make q = e4m3(x / scale) over
    the whole (contiguous, nonempty) x; ``compute``: find the scale from x's amax and store
    it in ``scale`` (float32, one element), else read it. ``alloc(P)``: a float32 array of
    P partials."""
    n = x.size
    P, grid = tensor_plan(n, sm_count)
    aligned = np.int32(_aligned(x, q))
    launches = []
    if compute:
        partial = alloc(P)
        launches.append((name("amax", dtype), (P,), (THREADS,), (x, np.int64(n), aligned, partial)))
    else:
        partial, P = scale, 0  # (never read with P == 0)
    launches.append((name("tensor", dtype), (grid,), (THREADS,),
                     (x, q, np.int64(n), aligned, partial, np.int32(P), scale)))
    return launches


def rows_launches(dtype, x, q, scale, R, n, compute):
    """The launch that makes q = e4m3(x / scale[row]) for R contiguous rows of n elements;
    ``compute``: find each row's scale from its amax and store it in scale[row], else
    read it."""
    G, block, grid = rows_plan(R, n)
    aligned = np.int32(n % CHUNK == 0 and _aligned(x, q))
    return [(name("rows", dtype), (grid,), (block,),
             (x, q, np.int64(R), np.int64(n), np.int32(G), aligned, scale, np.int32(compute)))]


def run(launches):
    """Launch them in order on CuPy's current stream."""
    for kernel, grid, block, args in launches:
        KERNELS.function(kernel)(grid, block, args)
