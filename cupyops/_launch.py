"""Device properties, launch geometry and shared-memory sizing.

The geometry helpers are plain functions of numbers (and a ``DeviceProps``), so the CPU
tier tests them without a GPU.
"""
import ctypes
import dataclasses
import functools

import numpy as np

from . import _dtypes

# Dynamic shared memory a block gets without opting in.
DEFAULT_SMEM_LIMIT = 48 * 1024


@dataclasses.dataclass(frozen=True)
class DeviceProps:
    name: str
    cc: int  # 90 for sm_90
    sm_count: int
    max_threads_per_sm: int
    smem_per_block_optin: int  # the most dynamic shared memory one block may opt in to
    smem_per_sm: int
    l2_bytes: int


_props = {}


def current_device():
    import cupy

    return cupy.cuda.runtime.getDevice()


def device_props(device_id=None):
    """Cached properties of the current (or given) device."""
    import cupy

    if device_id is None:
        device_id = cupy.cuda.runtime.getDevice()
    p = _props.get(device_id)
    if p is None:
        a = cupy.cuda.runtime.getDeviceProperties(device_id)
        name = a["name"]
        p = DeviceProps(
            name=name.decode() if isinstance(name, bytes) else str(name),
            cc=a["major"] * 10 + a["minor"],
            sm_count=a["multiProcessorCount"],
            max_threads_per_sm=a["maxThreadsPerMultiProcessor"],
            smem_per_block_optin=a["sharedMemPerBlockOptin"],
            smem_per_sm=a["sharedMemPerMultiprocessor"],
            l2_bytes=a["l2CacheSize"],
        )
        _props[device_id] = p
    return p


# Entries a launch-plan cache holds before it starts over (a program of many distinct
# shapes must not grow it without bound).
MEMO_LIMIT = 4096


def memo(cache, key, build):
    """``cache[key]``, made by ``build()`` on a miss: the launch-plan caches of the
    operators (a plan is a plain function of shapes, so it is computed once)."""
    value = cache.get(key)
    if value is None:
        if len(cache) > MEMO_LIMIT:
            cache.clear()
        value = cache[key] = build()
    return value


def cdiv(a, b):
    return -(-a // b)


def smem_optin_or_none():
    """The current device's per-block shared-memory opt-in, or None when CuPy or a GPU is
    missing (a rung's supports() then leaves the check to the launch, which says what is
    missing)."""
    try:
        return device_props().smem_per_block_optin
    except (ImportError, RuntimeError):
        return None


def smem_reason(nbytes, what):
    """None when ``nbytes`` of shared memory a block fit the current device (or no device
    is visible), else why not, for a rung's supports()."""
    limit = smem_optin_or_none()
    if limit is None or nbytes <= limit:
        return None
    return f"{what} needs {nbytes // 1024} KB of shared memory a block; this GPU allows {limit // 1024} KB"


def check_smem(nbytes, props, what):
    """Raise a clear error when ``what`` needs more shared memory than one block may have."""
    if nbytes > props.smem_per_block_optin:
        raise ValueError(
            f"{what} needs {nbytes} bytes of shared memory per block; "
            f"{props.name} allows at most {props.smem_per_block_optin}"
        )


_smem_opted = {}


def request_smem(kernel, nbytes, props, what):
    """Make ``kernel`` launchable with ``nbytes`` of dynamic shared memory (opting in past
    48 KB, once per kernel and size) or raise ValueError when it cannot fit."""
    check_smem(nbytes, props, what)
    if nbytes > DEFAULT_SMEM_LIMIT:
        key = id(kernel)
        if _smem_opted.get(key, 0) < nbytes:
            kernel.max_dynamic_shared_size_bytes = nbytes
            _smem_opted[key] = nbytes


# ------------------------------------------------------------------ launches through the driver
# C types of the NumPy scalars a kernel takes (the conversion CuPy's own launch makes).
_C_SCALARS = {
    "int32": ctypes.c_int32, "uint32": ctypes.c_uint32, "int64": ctypes.c_int64,
    "uint64": ctypes.c_uint64, "float32": ctypes.c_float, "float64": ctypes.c_double,
}


def _c_scalar(v):
    v = np.asarray(v)
    ctype = _C_SCALARS.get(v.dtype.name)
    if ctype is None:
        raise TypeError(f"no C type for a scalar kernel argument of dtype {v.dtype}")
    return ctype(v.item())


def _driver(driver_launch, current_stream):
    """CuPy's cuLaunchKernel and current stream, unless stand-ins are given (CPU tier)."""
    if driver_launch is None or current_stream is None:
        import cupy

        driver_launch = driver_launch or cupy.cuda.driver.launchKernel
        current_stream = current_stream or cupy.cuda.get_current_stream
    return driver_launch, current_stream


def _head(fn, grid, block, smem):
    """(the CUfunction's holder, cuLaunchKernel's function and geometry arguments)."""
    grid, block = tuple(grid), tuple(block)
    if not (1 <= len(grid) <= 3 and 1 <= len(block) <= 3):
        raise ValueError(f"grid {grid} and block {block} need 1 to 3 dimensions")
    # a RawKernel (what RawModule.get_function returns) holds its cupy.cuda.function.Function
    func = getattr(fn, "kernel", fn)
    return func, (func.ptr, *grid, *(1,) * (3 - len(grid)), *block, *(1,) * (3 - len(block)), int(smem))


def launch_with_structs(fn, grid, block, smem, args, *, cluster=1, driver_launch=None, current_stream=None):
    """Launch ``fn`` on CuPy's current stream through ``cuLaunchKernel`` with ``args``:
    CuPy arrays (their device addresses), NumPy scalars, and ``bytes`` passed by value as
    a struct of that many bytes (a TMA tensor map: cupyops/_tma.py), which CuPy's launch
    does not take. The driver copies each parameter as the kernel declares it.
    ``cluster`` > 1: blocks run in clusters of that many along x (``cuLaunchKernelEx``;
    grid x must be a multiple of it)."""
    driver_launch, current_stream = _driver(driver_launch, current_stream)
    _, head = _head(fn, grid, block, smem)
    slots = []
    for a in args:
        if isinstance(a, bytes):
            slots.append((ctypes.c_uint8 * len(a)).from_buffer_copy(a))
        elif isinstance(a, np.generic):
            slots.append(_c_scalar(a))
        else:
            slots.append(ctypes.c_uint64(a.data.ptr))
    params = (ctypes.c_void_p * len(slots))(*[ctypes.addressof(v) for v in slots])
    if cluster == 1:
        driver_launch(*head, current_stream().ptr, ctypes.addressof(params), 0)
    else:
        if head[1] % cluster:
            raise ValueError(f"grid x {head[1]} is not a multiple of the cluster size {cluster}")
        launch_cluster(head, current_stream().ptr, params, cluster)


class _CuLaunchConfig(ctypes.Structure):  # CUlaunchConfig (cuda.h)
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("numAttrs", ctypes.c_uint)]


class _CuLaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; the value's first 3 words: x, y, z


def _cluster_attribute(cluster):
    attr = _CuLaunchAttribute()
    attr.id = _CLUSTER_DIMENSION
    attr.value[0], attr.value[1], attr.value[2] = cluster, 1, 1
    return attr


@functools.lru_cache(maxsize=None)
def _libcuda():
    """The driver library (loaded once: a cluster launch looks up cuLaunchKernelEx in it)."""
    return ctypes.CDLL("libcuda.so.1")


def launch_cluster(head, stream, params, cluster):
    """cuLaunchKernelEx of ``head`` (what ``_head`` returns) in clusters of ``cluster``
    blocks along x. CuPy's launch has no cluster dimension to give at run time."""
    func, gx, gy, gz, bx, by, bz, smem = head
    attr = _cluster_attribute(cluster)
    cfg = _CuLaunchConfig(gx, gy, gz, bx, by, bz, smem, stream, ctypes.addressof(attr), 1)
    err = _libcuda().cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(func), params, None)
    if err != 0:
        raise RuntimeError(f"cuLaunchKernelEx (clusters of {cluster}) failed: CUresult {err}")


def max_active_clusters(fn, cluster, block, smem):
    """How many clusters of ``cluster`` blocks of ``fn`` (its shared-memory opt-in already
    made) the current GPU runs at once, from the driver's ``cuOccupancyMaxActiveClusters``;
    None where it cannot say. A persistent grid of more clusters than that would run its
    last ones after the others have finished."""
    try:
        query = _libcuda().cuOccupancyMaxActiveClusters
    except (OSError, AttributeError):
        return None
    block = tuple(block) + (1,) * (3 - len(block))
    attr = _cluster_attribute(cluster)
    cfg = _CuLaunchConfig(cluster, 1, 1, *block, int(smem), None, ctypes.addressof(attr), 1)
    count = ctypes.c_int(0)
    func = getattr(fn, "kernel", fn)
    err = query(ctypes.byref(count), ctypes.c_void_p(func.ptr), ctypes.byref(cfg))
    return count.value if err == 0 and count.value > 0 else None


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch but its arguments: the kernel file and instantiation, the grid,
    the block, the dynamic shared memory and the cluster size. A launcher's plan (a plain function of the
    problem's numbers, memoized per shape, checked by the CPU tier) returns one; calling
    it with the kernel's arguments does the rest the same way for every launcher: the
    function from the file's module, the shared-memory opt-in past 48 KB, and the launch
    itself, through CuPy, or through the driver when an argument is a struct passed by
    value (``bytes``: a TMA tensor map) or the blocks run in clusters.

    ``what`` names the rung in a shared-memory error."""

    kernels: object  # the KernelFile holding ``name``
    name: str
    grid: tuple
    block: tuple
    smem: int = 0
    what: str = ""
    cluster: int = 1  # blocks a cluster, along x

    def __call__(self, args):
        fn = self.kernels.function(self.name)
        if self.smem:
            request_smem(fn, self.smem, device_props(), self.what or self.name)
        if self.cluster > 1 or any(type(a) is bytes for a in args):
            launch_with_structs(fn, self.grid, self.block, self.smem, args, cluster=self.cluster)
        else:
            fn(self.grid, self.block, args, shared_mem=self.smem)


# An argument of a DirectLaunch given per call: a device address.
ADDRESS = object()


class DirectLaunch:
    """One kernel launch whose geometry and scalar arguments are fixed, issued through the
    driver's ``cuLaunchKernel`` from a parameter block packed once; a call only writes the
    array addresses into it and launches on the stream it is given.

    Why: ``Function.__call__`` turns every argument into a Python object on every call;
    for a kernel of a few microseconds that conversion and CuPy's launch bookkeeping cost
    more host time than the driver's launch (NOTES items 38 and 43). The memoized fast
    calls (cupyops/_fast.py) launch through this.

    ``fn``: a ``cupy.RawKernel`` (or its ``cupy.cuda.function.Function``); ``args``: the
    kernel's arguments in order, each ``ADDRESS`` (a device address a call passes, in a
    sequence in the order of these slots) or a NumPy scalar, whose dtype gives the C type (as CuPy's own
    launch does). Its caller serialises calls from several threads (the driver reads the
    parameter block during the launch, with the GIL released): a FastCall holds its lock
    around its launches. ``driver_launch`` stands in for CuPy's (the CPU tier checks the
    packing through it).

    The C replay of a fast call (cupyops/_cfast.c) launches from the same parameter block
    through ``driver_address``, cuLaunchKernel's C address (``c_description``); a stand-in
    ``driver_launch`` comes with its own C address or none (the replay is not used)."""

    def __init__(self, fn, grid, block, smem, args, *, driver_launch=None, driver_address=None):
        if driver_launch is None:
            import cupy

            driver_launch = cupy.cuda.driver.launchKernel
            driver_address = libcuda_address("cuLaunchKernel")
        self.driver_address = driver_address
        self._fn, self._head = _head(fn, grid, block, smem)  # (the holder keeps the module loaded)
        pointers = sum(1 for a in args if a is ADDRESS)
        self._addresses = (ctypes.c_uint64 * pointers)()  # device addresses, written per call
        base, word = ctypes.addressof(self._addresses), ctypes.sizeof(ctypes.c_uint64)
        values, slots, k = [], [], 0
        for a in args:
            if a is ADDRESS:
                slots.append(base + k * word)
                k += 1
            else:
                values.append(_c_scalar(a))
                slots.append(ctypes.addressof(values[-1]))
        self._values = values  # keeps the scalar slots alive
        self._params = (ctypes.c_void_p * len(slots))(*slots)
        self._params_ptr = ctypes.addressof(self._params)
        self._launch = driver_launch

    def __call__(self, stream, addresses):
        # (every line here is paid per call: one slice store, one driver call)
        self._addresses[:] = addresses
        self._launch(*self._head, stream, self._params_ptr, 0)

    def c_description(self):
        """What the C replay launches from: (cuLaunchKernel's address, the head: function,
        grid, block, shared memory; the parameter block's address, the address slots'
        address, their count). The replay holds this object, which keeps both alive."""
        return (self.driver_address, self._head, self._params_ptr, ctypes.addressof(self._addresses),
                len(self._addresses))


def has_current_context():
    """Whether this thread has a current CUDA context (cuCtxGetCurrent). A launch through
    the driver needs one; a thread that has made no CUDA call yet has none, until a runtime
    call (CuPy's, torch's) makes its device's primary context current. True where the
    driver cannot be asked (the launch will say)."""
    try:
        get = _libcuda().cuCtxGetCurrent
    except (OSError, AttributeError):
        return True
    ctx = ctypes.c_void_p()
    return get(ctypes.byref(ctx)) != 0 or ctx.value is not None


@functools.lru_cache(maxsize=None)
def libcuda_address(name):
    """The C address of driver function ``name`` in the library CuPy uses (None where it
    cannot be found). The C replay (cupyops/_cfast.c) calls cuLaunchKernel there (without
    it the replay is not used) and cuStreamIsCapturing (without it the replay cannot tell a
    capturing stream and keeps blocks as on any other)."""
    try:
        return ctypes.cast(getattr(_libcuda(), name), ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


# ------------------------------------------------------------------ rows held in registers
# The register-resident rungs (softmax_fused/_cluster, layer_norm_*, rms_norm_*) give each
# thread VECS 16-byte vectors of a row; G threads share a row (a warp, or a whole block),
# or CL blocks of G threads share it across a Hopper cluster. These choose the shapes.
# Registers hold the row widened to float: VECS 16-byte vectors are VECS * N floats; 32
# floats a thread (fp32 VECS = 8, half VECS = 4) cap the block at 512 threads.
ROW_VECS = {"float32": (1, 2, 4, 8), "float16": (1, 2, 4), "bfloat16": (1, 2, 4)}
CLUSTER_SIZES = (2, 4, 8)  # 8 is the portable maximum cluster size


def row_max_threads(vecs, dtype):
    """RowRegs<T, VECS>::MAX_THREADS: 32 floats a thread cap the block at 512 threads."""
    return 512 if vecs * vec_width(dtype) >= 32 else 1024


def vec_width(dtype):
    """Elements of ``dtype`` in one 16-byte vector."""
    return 16 // _dtypes.itemsize(dtype)


def pow2_ceil(v):
    return 1 << max(0, (int(v) - 1).bit_length())


def pow2_floor(v):
    return 1 << max(0, int(v).bit_length() - 1)


# Measured (benchmarks/sweep.py, H200): 16 elements a thread is the sweet spot of the
# register rungs; fewer leave too few bytes in flight, more cost occupancy.
FUSED_ELEMS_PER_THREAD = 16


def fused_row_plan(n, dtype):
    """(VECS, G) for a row of n elements held by one group of G threads, or None when
    the row is too long for one block's registers."""
    vec = vec_width(dtype)
    for vecs in ROW_VECS[dtype]:
        if vecs * vec < FUSED_ELEMS_PER_THREAD and vecs != ROW_VECS[dtype][-1] and n > 4 * vecs * vec:
            continue
        g = max(4, pow2_ceil(cdiv(n, vecs * vec)))
        if g <= min(512, row_max_threads(vecs, dtype)):
            return vecs, g
    return None


def cluster_row_plan(n, dtype):
    """(VECS, CL, G, chunk) for a row spread over a cluster of CL blocks of G threads,
    each holding ``chunk`` elements (a multiple of the vector width), or None."""
    vec = vec_width(dtype)
    for vecs in ROW_VECS[dtype]:
        for cl in CLUSTER_SIZES:
            chunk = cdiv(cdiv(n, cl), vec) * vec
            for g in (256, 512, 1024):
                if g * vecs * vec >= chunk and g <= row_max_threads(vecs, dtype):
                    return vecs, cl, g, chunk
    return None


# ------------------------------------------------------------------ rows staged in shared memory
# The staged rungs copy whole rows (or, on sm_90, a cluster's share of one long row) into
# shared memory with cp.async. Measured on an H200: a block should stage about 16 KB
# (64 KB for layer_norm, whose three sweeps over shared memory like more work per block)
# with 64 to 128 bytes per thread; a long row goes to a cluster of 8 with <= 64 KB a block.
STAGE_BLOCK_BYTES = {"softmax": (16384, 64), "rms_norm": (16384, 64), "layer_norm": (65536, 128)}
# Per-row parameters (weight, bias) a block staging several short rows keeps in shared
# memory after its rows, so its rows read them from there instead of each through L2.
# Measured: +1-4 % on rows <= 4 KB; on 16 KB rows the extra shared memory cost a resident
# block per SM and 7 %, so longer rows read them from L2.
STAGED_PARAM_ROWS = {"softmax": 0, "rms_norm": 1, "layer_norm": 2}
SHORT_ROW_BYTES = 4096  # rows this short: 16 KB a block, 128 bytes a thread, for every op
MAX_STAGED_ROW_BYTES = 32768  # above, the row is spread over a cluster (sm_90)


@dataclasses.dataclass(frozen=True)
class StagedPlan:
    cluster: int  # blocks per row (1: whole rows per block)
    block: int  # threads per block
    rows_per_block: int
    group: int  # threads per row (G)
    chunk: int  # elements per block of a cluster (0 when cluster == 1)
    smem: int  # dynamic shared memory bytes
    params: int = 0  # weight/bias rows staged after the rows (cluster == 1 only)


def staged_row_plan(n, itemsize, op, props):
    """How the staged rung of ``op`` handles rows of n elements, or None when a row is
    too long to stage (the caller falls back to its any-length rung)."""
    vec = 16 // itemsize
    row = n * itemsize
    if row <= MAX_STAGED_ROW_BYTES or props.cc < 90:
        if row > min(props.smem_per_block_optin, 200 * 1024):
            return None
        block_bytes, thread_bytes = (16384, 128) if row <= SHORT_ROW_BYTES else STAGE_BLOCK_BYTES[op]
        rb = pow2_floor(max(1, block_bytes // row))
        threads = min(1024, max(64, pow2_ceil(cdiv(rb * row, thread_bytes))))
        while rb > 1 and threads // rb < 4:
            rb //= 2
        params = STAGED_PARAM_ROWS[op] if rb > 1 and row <= SHORT_ROW_BYTES else 0
        return StagedPlan(1, threads, rb, threads // rb, 0, (rb + params) * row, params)
    for cl in CLUSTER_SIZES:
        chunk = cdiv(cdiv(n, cl), vec) * vec
        if chunk * itemsize <= MAX_STAGED_ROW_BYTES or cl == CLUSTER_SIZES[-1]:
            break
    if chunk * itemsize > 200 * 1024:
        return None
    threads = min(1024, max(256, pow2_ceil(cdiv(chunk * itemsize, 128))))
    return StagedPlan(cl, threads, 1, threads, chunk, chunk * itemsize)


def rows_aligned(vec, n, *arrays):
    """16-byte vector access is safe when every row starts on a 16-byte boundary."""
    if n % vec:
        return False
    for a in arrays:  # a plain loop: this runs on every call of a small operator
        if a is not None and a.data.ptr & 15:
            return False
    return True
