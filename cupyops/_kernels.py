"""Locate the CUDA sources, compile them through NVRTC (cupy.RawModule), memoize per device.

One ``KernelFile`` per ``kernels/<name>.cu``. Its ``name_expressions`` list every template
instantiation the Python layer may launch (``softmax_fused<__half, 4, 256>`` ...), built by
``template_name`` so that the compile and the lookup spell each name identically.

Local ``#include "x.cuh"`` lines are inlined (with ``#line`` markers) before the source goes
to CuPy: CuPy's disk cache keys on the source text, so an edited header changes the key and
can never serve a stale binary, and NVRTC's messages still name the real file and line.
Nothing compiles at import: the first launch of a file's kernel compiles the whole file for
the current device; ``cupyops.warmup()`` does it ahead of time, several files at once
(NVRTC runs without the GIL, so threads compile in parallel), and ``warmup_async()`` does
it in the background while the caller goes on (the benchmark times the first operators
while the GEMM files still compile). A file compiles once: a second caller waits for the
first.
"""
import functools
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

# C++17 for `if constexpr`; CuPy appends -arch for the device and -ftz=true itself.
NVRTC_OPTIONS = ("--std=c++17",)
# For the files with many large instantiations (the GEMM tile configurations): NVRTC
# optimises the kernels on all cores instead of one. Two cores: gemm_mma.cu 45 s -> 26 s,
# same cubin size, same registers (one kernel of 56 differs by one); gemm_skinny.cu
# 30 s -> 22 s, identical. Not used on the tuned memory-bound files, where some kernels
# moved by a register or two.
SPLIT_COMPILE = ("--split-compile=0",)

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


class CompileError(RuntimeError):
    """NVRTC rejected a kernel file; ``log`` holds the compiler output (file:line: error)."""

    def __init__(self, filename, log):
        self.filename = filename
        self.log = log
        super().__init__(f"compiling kernels/{filename} failed:\n{log}")


def kernel_dir():
    """The directory holding the .cu/.cuh sources (package data of cupyops.kernels)."""
    try:
        return Path(str(resources.files("cupyops.kernels")))
    except (ModuleNotFoundError, TypeError):  # running from a bare source tree
        return Path(__file__).resolve().parent.parent / "kernels"


@functools.lru_cache(maxsize=None)
def kernel_source(filename):
    """Source of ``kernels/<filename>`` with its local includes inlined once each."""
    return _inline(filename, set())


def _inline(filename, seen):
    path = kernel_dir() / filename
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"kernel source {filename} not found in {kernel_dir()}") from None
    out = [f'#line 1 "{filename}"']
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _INCLUDE.match(line)
        if m:
            inc = m.group(1)
            if inc not in seen:
                seen.add(inc)
                out.append(_inline(inc, seen))
            out.append(f'#line {lineno + 1} "{filename}"')
        elif line.strip() == "#pragma once":
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def template_name(kernel, *args):
    """``template_name('softmax_fused', '__half', 4)`` -> ``'softmax_fused<__half, 4>'``."""
    if not args:
        return kernel
    return f"{kernel}<{', '.join(str(a) for a in args)}>"


# The architectures the CPU tier compiles a portable kernel file for.
PORTABLE_ARCHS = ("sm_80", "sm_90")


class KernelFile:
    """One .cu file: its instantiations, its compiled module per device, its functions.

    ``arch``: a file of architecture-specific code (``"sm_90a"``: wgmma, setmaxnreg) is
    compiled for that target alone, and only on a GPU of that compute capability
    (``runs_on``); ``compile()`` and ``warmup`` pass over it elsewhere, and its launchers
    check the GPU before asking for a kernel. Portable files compile for the device's own
    architecture (CuPy's -arch) and are checked for sm_80 and sm_90 by the CPU tier."""

    registry = {}

    def __init__(self, filename, name_expressions, *, options=(), arch=None):
        self.filename = filename
        self.name_expressions = list(dict.fromkeys(name_expressions))
        self.extra_options = tuple(options)  # this file's own, after NVRTC_OPTIONS
        self.arch = arch
        # CuPy adds -arch=sm_<cc> for the device; ours comes after it and wins (on an H100
        # with NVRTC 13, -arch=sm_90a defines __CUDA_ARCH_FEAT_SM90_ALL).
        self.options = NVRTC_OPTIONS + self.extra_options + ((f"-arch={arch}",) if arch else ())
        self.archs = (arch,) if arch else PORTABLE_ARCHS  # what the CPU tier compiles
        # the one compute capability an arch-specific cubin runs on ("sm_90a" -> 90)
        self._cc = int("".join(ch for ch in arch if ch.isdigit())) if arch else None
        self._modules = {}
        self._functions = {}
        # Held while this file compiles: a launch (or another warm-up thread) that needs the
        # module meanwhile waits for it instead of starting a second NVRTC run.
        self._lock = threading.Lock()
        KernelFile.registry[filename] = self

    def _module(self, device_id):
        mod = self._modules.get(device_id)
        if mod is not None:
            return mod
        with self._lock:
            mod = self._modules.get(device_id)
            if mod is None:
                mod = self._build()
                self._modules[device_id] = mod
        return mod

    def _build(self):
        import cupy

        from cupy.cuda.compiler import CompileException

        try:
            mod = cupy.RawModule(
                code=kernel_source(self.filename),
                options=self.options,
                name_expressions=self.name_expressions,
            )
            mod.compile()
        except CompileException as exc:
            raise CompileError(self.filename, str(exc)) from None
        return mod

    def function(self, name):
        """The launchable kernel ``name`` (a name expression) on the current device."""
        import cupy

        dev = cupy.cuda.runtime.getDevice()
        key = (dev, name)
        fn = self._functions.get(key)
        if fn is None:
            if name not in self.name_expressions:
                raise KeyError(f"{name} is not instantiated in kernels/{self.filename}")
            fn = self._module(dev).get_function(name)
            self._functions[key] = fn
        return fn

    def runs_on(self, cc):
        """Can a GPU of compute capability ``cc`` (90 for sm_90) run this file's kernels?
        An sm_90a cubin runs on sm_90 alone."""
        return self._cc is None or cc == self._cc

    def compile(self):
        """Compile (or load from CuPy's disk cache) this file for the current device.
        Returns False, compiling nothing, for a file the device cannot run."""
        import cupy

        device = cupy.cuda.runtime.getDevice()
        if self.arch is not None:
            from ._launch import device_props

            if not self.runs_on(device_props(device).cc):
                return False
        self._module(device)
        return True


def warmup(ops=None, *, threads=None):
    """Compile the kernel files behind ``ops`` (all when None) for the current device, so a
    notebook's first timed call does not pay for NVRTC. Files compile in parallel on up to
    ``threads`` threads (default: one per file, at most the CPU count). Returns the files
    compiled; a CompileError of any file is raised after the others finish."""
    return warmup_async(ops, threads=threads)()


def warmup_async(ops=None, *, threads=None, on_compiled=None):
    """Start compiling the kernel files behind ``ops`` in background threads and return at
    once. Returns ``wait()``: it blocks until every file is compiled and raises the first
    CompileError. Operators called meanwhile wait only for their own file.
    ``on_compiled(filename, seconds)`` is called (from the compiling thread) as each file
    is ready."""
    pool, futures, names = _start(ops, threads, on_compiled)

    def wait():
        try:
            for f in futures:
                f.result()
        finally:
            pool.shutdown(wait=True)
        return names

    return wait


def _start(ops, threads, on_compiled=None):
    from . import ops as _ops
    from ._arrays import cupy_module

    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads: must be a positive int, got {threads!r}")
    cp = cupy_module()
    device_id = cp.cuda.runtime.getDevice()
    from ._launch import device_props

    cc = device_props(device_id).cc
    files = [kf for kf in _ops.kernel_files(ops) if kf.runs_on(cc)]
    workers = threads or max(1, min(len(files), os.cpu_count() or 1))

    def build(kf):
        t0 = time.perf_counter()
        cp.cuda.Device(device_id).use()  # the module belongs to the caller's device
        kf.compile()
        if on_compiled is not None:
            on_compiled(kf.filename, time.perf_counter() - t0)

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cupyops-nvrtc")
    futures = [pool.submit(build, kf) for kf in files]
    return pool, futures, [kf.filename for kf in files]
