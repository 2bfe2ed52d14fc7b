"""Foreign arrays: PyTorch tensors, JAX arrays and any other producer of DLPack
(``__dlpack__``) or of the CUDA array interface (``__cuda_array_interface__``) go into every
operator without a copy and come back as the caller's type.

``foreign_arrays`` wraps a public operator. A call whose arguments are all CuPy, NumPy or
plain Python values goes straight through (one set lookup per argument), after the
operator's memoized fast path where it has one (cupyops/_fast.py). Otherwise:

- A CUDA torch tensor is seen as a CuPy array made from its address, shape, strides and
  dtype (a view of the same memory: no copy, no DLPack capsule; bfloat16 as the package's
  bfloat16 dtype); other GPU arrays through ``cupy.from_dlpack``, or ``cupy.asarray`` of
  the CUDA array interface (views, strides kept). The operator runs on them and each CuPy
  result is handed back in the framework of the first foreign argument: a torch tensor on
  the same device, a JAX array (``jax.dlpack``); a producer we do not know gets the CuPy
  array. An ``out=`` tensor is written in place and returned as given.
- For torch tensors on a GPU the work runs on torch's current stream of the tensor's
  device (nothing synchronises), and everything the call allocates (outputs, scratch)
  comes from torch's caching allocator on that stream (``torch.empty``, as torch's own
  operators' memory does; under ``torch.cuda.graph`` from the graph's pool). A result in
  such memory goes back as a view of the torch block it lives in; any other through
  ``torch.from_dlpack``. A call of a signature the operator has remembered (its fast
  path) makes no CuPy array at all: it launches on torch's stream with torch's memory.
- Tensors with ``requires_grad`` are read as detached: the results do not require grad
  (cupyops has no backward).
- float8 e4m3 torch tensors travel as their uint8 bits (CuPy has no float8 type); other
  float8 types are refused (a TypeError), not read as e4m3; ``quantize_fp8`` gives torch
  callers ``torch.float8_e4m3fn`` values.
- A CPU tensor beside GPU ones (a 0-d scale) is read through NumPy.
- Host arrays (a CPU torch tensor, a CPU JAX array) take the NumPy path and come back as
  the caller's type on the host.
"""
import functools
import warnings

import numpy as np

from . import _fast

_PLAIN = "plain"  # CuPy, NumPy, Python values: the operators take them as they are
_KINDS = {}  # type -> "plain", "torch", "jax", "dlpack", "cai"
# The types classified plain, for the wrapper's fast test (a set lookup an argument: this
# runs on every call of every operator, where decode-sized calls cost a few microseconds).
_PLAIN_TYPES = {int, float, bool, str, type(None), tuple, list, np.ndarray}


def kind_of(a):
    """How an argument is handled: its type's classification, memoized."""
    t = type(a)
    k = _KINDS.get(t)
    if k is None:
        k = _KINDS[t] = _classify(t)
        if k is _PLAIN:
            _PLAIN_TYPES.add(t)
    return k


def _classify(t):
    mod = getattr(t, "__module__", None) or ""
    if mod.split(".", 1)[0] in ("cupy", "cupyx", "numpy", "builtins"):
        return _PLAIN
    root = mod.split(".", 1)[0]
    # torch.Tensor and its subclasses from any package (nn.Parameter, torchao's, a user's)
    if hasattr(t, "__dlpack__") and any((c.__module__ or "").split(".", 1)[0] == "torch" and c.__name__ == "Tensor"
                                        for c in t.__mro__):
        return "torch"
    if hasattr(t, "__dlpack__") and root in ("jax", "jaxlib"):
        return "jax"
    if hasattr(t, "__cuda_array_interface__"):
        return "cai"
    if hasattr(t, "__dlpack__") and hasattr(t, "__dlpack_device__"):
        return "dlpack"
    return _PLAIN


def foreign_arrays(fp8_results=(), fast=None):
    """Decorator of a public operator (see the module docstring). ``fp8_results``: indices
    of the results that hold float8 e4m3 bits (handed to torch as float8_e4m3fn).
    ``fast``: the operator's ``_fast.FastCalls``, tried first on CuPy arrays and on CUDA
    torch tensors, and filled by its checked path.

    Where the fast calls run in C (``_fast.USE_C``), an operator with ``fast`` is a
    ``_cfast.Operator``: the C object tries the remembered call on the arguments as they
    were passed (no Python frame, tuple or dict of them) and otherwise calls ``checked``
    below with them; it carries the function's name, doc and ``__wrapped__``
    (``functools.update_wrapper``), so that ``inspect.signature`` and ``help`` show the
    operator's own. Otherwise it is the Python function ``op``."""

    def wrap(fn):
        plain = _PLAIN_TYPES
        run = fast.bind(fn).run if fast is not None else None

        def checked(*args, **kwargs):  # what follows the fast path, or stands for it
            for a in args:
                if type(a) not in plain:
                    break
            else:
                for a in kwargs.values():
                    if type(a) not in plain:
                        break
                else:
                    return fn(*args, **kwargs) if fast is None else fast.checked(fn, args, kwargs)
            # a type not seen yet, or a foreign array
            if any(kind_of(a) is not _PLAIN for a in (*args, *kwargs.values())):
                return _call(fn, args, kwargs, fp8_results, fast)
            return fn(*args, **kwargs) if fast is None else fast.checked(fn, args, kwargs)

        if run is None:
            return functools.wraps(fn)(checked)
        if _fast.USE_C and type(run) is _fast._cfast.Dispatch:
            return functools.update_wrapper(_fast._cfast.Operator(run, checked), fn)

        @functools.wraps(fn)
        def op(*args, **kwargs):
            r = run(args, kwargs)
            if r is not None:
                return r
            return checked(*args, **kwargs)

        return op

    return wrap


_DL_CUDA, _DL_CUDA_MANAGED, _DL_CPU = 2, 13, 1  # DLPack device types


def _on_gpu(a, kind):
    if kind == "cai":
        return True
    if kind == "torch":
        return a.device.type == "cuda"
    try:
        return a.__dlpack_device__()[0] in (_DL_CUDA, _DL_CUDA_MANAGED)
    except Exception:  # a producer without the device query: try the GPU path
        return True


def _call(fn, args, kwargs, fp8_results, fast):
    first = next(a for a in (*args, *kwargs.values()) if kind_of(a) is not _PLAIN)
    kind = kind_of(first)
    if not _on_gpu(first, kind):
        return _host_call(fn, args, kwargs, first, kind, fp8_results)
    from ._arrays import cupy_module

    cp = cupy_module()
    if kind != "torch":
        return _device_call(fn, args, kwargs, kind, fp8_results, cp)
    _torch_module()
    device = first.get_device()
    stream, alloc = _torch_stream(cp, _fast.raw_stream(device), device)
    with cp.cuda.Device(device), stream, cp.cuda.using_allocator(alloc):
        return _device_call(fn, args, kwargs, kind, fp8_results, cp, fast)


def _device_call(fn, args, kwargs, kind, fp8_results, cp, fast=None):
    given = {}  # id(CuPy view) -> the caller's object, for results that are an argument (out=)

    def to_cupy(a):
        k = kind_of(a)
        if k is _PLAIN:
            return a
        if k == "torch" and a.device.type != "cuda":  # a host tensor beside GPU ones (a scale)
            v = _torch_to_numpy(a)
        elif k == "torch":
            v = _torch_as_cupy(a, cp)
        else:
            v = cp.asarray(a) if k == "cai" else cp.from_dlpack(a)
        given[id(v)] = a
        return v

    cargs = tuple(to_cupy(a) for a in args)  # (kept alive, so their ids stay theirs)
    ckwargs = {k: to_cupy(v) for k, v in kwargs.items()}
    if fast is not None:
        res = fast.checked(fn, cargs, ckwargs, torch_args=(args, kwargs))
    else:
        res = fn(*cargs, **ckwargs)

    def back(i, r):
        if id(r) in given:
            return given[id(r)]
        if not type(r).__module__.startswith("cupy"):
            return r
        if kind == "torch":
            return _cupy_to_torch(r, i in fp8_results)
        if kind == "jax":
            import jax.dlpack

            return jax.dlpack.from_dlpack(r)
        return r

    return _map_results(res, back)


def _map_results(res, back):
    if isinstance(res, tuple):
        return tuple(back(i, r) for i, r in enumerate(res))
    return back(0, res)


def _torch_exportable(t):
    """A tensor CuPy can read: detached, float8 seen as its uint8 bits."""
    import torch

    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    elif t.dtype.is_floating_point and t.element_size() == 1:  # e5m2, the fnuz forms: other bits
        raise TypeError(f"{t.dtype} tensors are not supported; float8 operands are float8_e4m3fn")
    return t


def _torch_as_cupy(t, cp):
    """The CuPy view of CUDA tensor ``t`` (the same memory, its strides), from its address,
    shape, strides and dtype: torch's ``__dlpack__`` builds stream objects and queries the
    device several times (most of a torch-in call's host time in
    benchmarks/results/h100-host-profile.txt). A dtype with no NumPy form here, an empty
    or a non-strided tensor goes through DLPack."""
    t = _torch_exportable(t)
    dtype = _NUMPY_OF_TORCH.get(t.dtype)
    if dtype is None or not t.numel() or t.layout is not _torch_module().strided:
        return cp.from_dlpack(t)
    item = dtype.itemsize
    shape, strides = tuple(t.shape), tuple(s * item for s in t.stride())
    span = item + sum((n - 1) * s for n, s in zip(shape, strides))  # (torch strides are >= 0)
    mem = cp.cuda.UnownedMemory(t.data_ptr(), span, t, t.get_device())
    return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0), strides)


def _cupy_to_torch(r, fp8):
    """A CuPy result as a torch tensor: a view of the torch block it was allocated in
    (``_torch_allocator``), or through DLPack for memory of any other origin."""
    import torch

    owner = getattr(r.data.mem, "_owner", None)
    dtype = torch.float8_e4m3fn if fp8 else _fast.TORCH_DTYPES.get(r.dtype)
    item = r.itemsize
    if type(owner) is _TorchBlock and dtype is not None and owner.tensor.numel() % item == 0:
        offset = r.data.ptr - owner.ptr
        if offset % item == 0 and all(s % item == 0 for s in r.strides):
            return owner.tensor.view(dtype).as_strided(r.shape, [s // item for s in r.strides], offset // item)
    t = torch.from_dlpack(r)
    return t.view(torch.float8_e4m3fn) if fp8 else t


_NUMPY_OF_TORCH = {}  # torch dtype -> the NumPy dtype its CuPy view has (_torch_module)
_TORCH = None


def _torch_module():
    """torch, with the dtype tables and what the fast calls use bound on first use."""
    global _TORCH
    if _TORCH is None:
        import torch

        _fast.torch_loaded(torch)
        _NUMPY_OF_TORCH.update({v: k for k, v in _fast.TORCH_DTYPES.items()})
        _TORCH = torch
    return _TORCH


_STREAMS = {}  # (stream pointer, device) -> (cupy.cuda.ExternalStream, its torch allocator)


def _torch_stream(cp, ptr, device):
    """CuPy's view of torch's stream ``ptr`` on ``device`` and the allocator drawing from
    torch's caching allocator on it, made once a stream (not once a call)."""
    key = (ptr, device)
    s = _STREAMS.get(key)
    if s is None:
        if len(_STREAMS) >= 64:  # programs that make a stream per request
            _STREAMS.clear()
        with warnings.catch_warnings():  # CuPy 14 prefers Stream.from_external (a __cuda_stream__
            warnings.simplefilter("ignore", DeprecationWarning)  # object); this form is checked
            s = _STREAMS[key] = (cp.cuda.ExternalStream(ptr, device), _torch_allocator(device))
    return s


class _TorchBlock:
    """The torch tensor (uint8, on the device) backing one CuPy allocation: CuPy holds it
    while it uses the memory, and dropping it gives the block back to torch's cache."""

    __slots__ = ("tensor", "ptr")

    def __init__(self, tensor):
        self.tensor, self.ptr = tensor, tensor.data_ptr()


def _torch_allocator(device):
    """CuPy allocator (size -> MemoryPointer) drawing from torch's caching allocator on
    ``device``'s current stream (``torch.empty``: under ``torch.cuda.graph`` the memory
    comes from the graph's pool, as torch's own operators' does)."""
    import cupy

    torch = _torch_module()
    empty, uint8 = torch.empty, torch.uint8

    def alloc(size):
        block = _TorchBlock(empty(max(int(size), 1), dtype=uint8, device=device))
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(block.ptr, size, block, device), 0)

    return alloc


# ------------------------------------------------------------------ host arrays
def _host_call(fn, args, kwargs, first, kind, fp8_results):
    """Foreign host arrays: as NumPy in, NumPy out, handed back in the caller's type."""
    given = {}

    def to_numpy(a):
        k = kind_of(a)
        if k is _PLAIN:
            return a
        if k == "torch":
            v = _torch_to_numpy(a)
        else:
            try:
                v = np.from_dlpack(a)
            except Exception:  # a dtype NumPy's DLPack does not know (bfloat16)
                v = np.asarray(a)
        given[id(v)] = a
        return v

    nargs = tuple(to_numpy(a) for a in args)
    nkwargs = {k: to_numpy(v) for k, v in kwargs.items()}
    res = fn(*nargs, **nkwargs)

    def back(i, r):
        if id(r) in given:
            return given[id(r)]
        if not isinstance(r, (np.ndarray, np.generic)):
            return r
        if kind == "torch":
            return _numpy_to_torch(np.asarray(r), fp8=i in fp8_results)
        if kind == "jax":
            import jax.numpy as jnp

            return jnp.asarray(r)
        return r

    return _map_results(res, back)


def _torch_to_numpy(t):
    """A CPU tensor's NumPy view (bfloat16 through its int16 bits, float8 as uint8)."""
    import torch

    t = _torch_exportable(t)
    if t.dtype == torch.bfloat16:
        from . import _dtypes

        return t.view(torch.int16).numpy().view(_dtypes.to_dtype("bfloat16"))
    return t.numpy()


def _numpy_to_torch(a, fp8=False):
    import torch

    from . import _dtypes

    a = a if a.flags.c_contiguous else a.copy()  # (not ascontiguousarray: it makes 0-d 1-d)
    if _dtypes.dtype_name(a.dtype) == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    t = torch.from_numpy(a)
    return t.view(torch.float8_e4m3fn) if fp8 else t
