"""Kernel launches straight through the driver's cuLaunchKernel (ctypes), for small calls.

CuPy's RawKernel call converts every argument on every launch (type checks, a small
object per argument, the parameter vector): measured 6.8 us of a 14.5 us softmax of a
(1, 1024) array on an H200's host (benchmarks/results/h200-host-overhead.txt). A
``DirectKernel`` works out once how each argument position converts to a C value, keeps
the parameter buffer, and per call only stores the values and launches.

Arguments: CuPy arrays (their data pointer), None or np.uint64 (a raw pointer), NumPy
scalars and Python ints/floats (as the C type of the NumPy scalar at the same position on
the first call). When ctypes
cannot reach libcuda, or the call comes from a thread other than the one that made the
buffer (the buffer is not shared between threads), the launch goes through CuPy.
"""
import ctypes
import threading

import numpy as np

_C_OF = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
         np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.uint64): ctypes.c_uint64,
         np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}

_driver = None  # cuLaunchKernel, or False when libcuda is out of reach


def _launcher():
    global _driver
    if _driver is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            f = lib.cuLaunchKernel
            f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
                ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
            f.restype = ctypes.c_int
            _driver = f
        except (OSError, AttributeError):
            _driver = False
    return _driver


def _slot(value):
    """(ctypes storage, converter) for one argument position, from its first value.
    Arrays, None and 64-bit unsigned scalars (np.uint64(0) is how the norms pass an
    absent weight) share the pointer kind, so a position may hold any of them."""
    if value is None or type(value).__module__.startswith("cupy"):
        return ctypes.c_void_p(), _address
    dt = np.dtype(getattr(value, "dtype", np.int64 if isinstance(value, int) else np.float64))
    if dt == np.uint64:
        return ctypes.c_void_p(), _address
    ctype = _C_OF.get(dt)
    if ctype is None:
        raise TypeError(f"DirectKernel: unsupported argument type {type(value).__name__}")
    return ctype(), (int if dt.kind in "iu" else float)


def _address(a):
    if a is None:
        return None
    if type(a).__module__.startswith("cupy"):
        return a.data.ptr
    return int(a) or None


_current_stream = None  # cupy.cuda.get_current_stream, looked up once


class DirectKernel:
    """``k(grid, block, args, shared_mem=0)`` with CuPy's calling convention for a
    RawModule function ``fn`` (1-D grid and block tuples). Every call must pass the
    same kinds of argument at each position as the first (the launch plans do)."""

    __slots__ = ("fn", "_fptr", "_owner", "_store", "_conv", "_params")

    def __init__(self, fn):
        self.fn = fn
        self._owner = None  # the thread that owns the buffer; -1: always go through CuPy
        self._store = ()

    def _prepare(self, args):
        global _current_stream
        if not _launcher():
            return False
        import cupy

        _current_stream = cupy.cuda.get_current_stream
        self._fptr = getattr(self.fn, "kernel", self.fn).ptr  # RawKernel -> cuda Function
        slots = [_slot(a) for a in args]
        self._store = [st for st, _ in slots]
        self._conv = [cv for _, cv in slots]
        self._params = (ctypes.c_void_p * len(args))(
            *[ctypes.cast(ctypes.pointer(st), ctypes.c_void_p) for st in self._store])
        return True

    def __call__(self, grid, block, args, shared_mem=0):
        if self._owner is None:
            self._owner = threading.get_ident() if self._prepare(args) else -1
        if self._owner != threading.get_ident() or len(args) != len(self._store):
            return self.fn(grid, block, args, shared_mem=shared_mem)
        for st, conv, a in zip(self._store, self._conv, args):
            st.value = conv(a)
        err = _driver(self._fptr, grid[0], 1, 1, block[0], 1, 1, shared_mem,
                      _current_stream().ptr, self._params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed with CUresult {err}")
