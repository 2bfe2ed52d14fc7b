"""Tensor maps for sm_90 tensor copies (TMA), encoded on the host through the CUDA driver.

A tensor map (``CUtensorMap``, 128 bytes) describes a strided global array and the box one
``cp.async.bulk.tensor`` moves into shared memory, with the swizzle it applies there.
``cuTensorMapEncodeTiled`` lives in the driver library (``libcuda``), which CuPy does not
wrap, so it is called here through ctypes. A kernel takes the map by value as a
``__grid_constant__`` parameter (``cuops::TmaMap`` in kernels/ptx.cuh); the map is the
128 ``bytes`` that ``_launch.launch_with_structs`` passes by value.

``encode_tiled`` returns None when the driver has no such entry point or refuses the
description (a stride that is not a multiple of 16 bytes, a misaligned address, a box or
dimension out of range): the callers then keep their cp.async path.
"""
import ctypes
import functools


MAP_BYTES = 128
NO_MAP = bytes(MAP_BYTES)  # a map argument a kernel is told not to read
# The 128-byte swizzle repeats every 1024 bytes of shared memory: a ring of swizzled stages
# starts at such a boundary, and its kernel asks for this much more shared memory to find one.
SWIZZLE_ATOM_BYTES = 1024
ALIGN = 16  # bytes: a tensor map's start address and every one of its strides


def describable(address, *strides):
    """Can a tensor map describe an array at device ``address`` whose outer dimensions
    step ``strides`` bytes? (A 16-byte aligned start, strides nonzero multiples of 16.)"""
    return address % ALIGN == 0 and all(s > 0 and s % ALIGN == 0 for s in strides)

# CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
# CUtensorMapFloatOOBfill (cuda.h): the values used here.
DATA_UINT8 = 0  # 1-byte elements moved as they are (float8 e4m3 bits)
DATA_UINT16 = 1  # 16-bit elements moved as they are (float16 and bfloat16 alike)
INTERLEAVE_NONE = 0
SWIZZLE_32B = 1
SWIZZLE_128B = 3
L2_PROMOTION_256B = 3
OOB_FILL_ZEROS = 0

_u64p = ctypes.POINTER(ctypes.c_uint64)
_u32p = ctypes.POINTER(ctypes.c_uint32)


@functools.lru_cache(maxsize=None)
def _encoder():
    """cuTensorMapEncodeTiled from the driver library, or None where there is none."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, _u64p, _u64p, _u32p, _u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


def available():
    return _encoder() is not None


def sm90a_reason(kernels, props, what):
    """Why this GPU (``props``: _launch.DeviceProps) cannot run ``what``, the sm_90a
    kernels of KernelFile ``kernels`` (wgmma and tensor copies), or None when it can. The
    one wording of the Hopper rungs' refusal."""
    if not kernels.runs_on(props.cc):
        return f"{what} runs on compute capability 9.0 GPUs (H100, H200) alone; this is {props.name} (sm_{props.cc})"
    if not available():
        return f"{what} needs the driver's cuTensorMapEncodeTiled (libcuda), which is not available"
    return None


@functools.lru_cache(maxsize=1024)
def encode_tiled(address, dims, strides, box, swizzle=SWIZZLE_128B, data_type=DATA_UINT16):
    """The tensor map of the array at device ``address`` with extents ``dims`` (elements,
    innermost first), byte ``strides`` of dimensions 1.. (one fewer than ``dims``), moved in
    boxes of ``box`` elements (``MAP_BYTES`` bytes), or None if the driver refuses it.
    Memoized: a map is a pure function of its arguments (the benchmark's repeated calls and
    a model's repeated shapes encode once)."""
    fn = _encoder()
    rank = len(dims)
    if fn is None or len(strides) != rank - 1 or len(box) != rank:
        return None
    # CUtensorMap is a 64-byte-aligned type: the map is written at the first such address
    buf = ctypes.create_string_buffer(MAP_BYTES + 64)
    out = (ctypes.addressof(buf) + 63) & ~63
    c_dims = (ctypes.c_uint64 * rank)(*dims)
    c_strides = (ctypes.c_uint64 * max(rank - 1, 1))(*strides)
    c_box = (ctypes.c_uint32 * rank)(*box)
    c_elem = (ctypes.c_uint32 * rank)(*([1] * rank))
    err = fn(out, data_type, rank, address, c_dims, c_strides, c_box, c_elem, INTERLEAVE_NONE,
             swizzle, L2_PROMOTION_256B, OOB_FILL_ZEROS)
    if err != 0:
        return None
    return ctypes.string_at(out, MAP_BYTES)

