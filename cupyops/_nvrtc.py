"""Compile kernel files with NVRTC directly (ctypes), with no GPU and no CuPy.

The CPU tier uses this to compile every kernel file for every claimed dtype and arch
(sm_80, sm_90) and to read ptxas' resource report (registers, spills) from the log.
libnvrtc and the CUDA headers come from NVIDIA's wheels (``cuda-toolkit[nvrtc,cudart]``),
or from a CUDA installation named by CUDA_PATH / CUDA_HOME.
"""
import ctypes
import dataclasses
import glob
import os
import re
import sys
from pathlib import Path

from ._kernels import NVRTC_OPTIONS, kernel_source


class NvrtcUnavailable(RuntimeError):
    pass


def _candidate_roots():
    roots = []
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            roots.append(Path(os.environ[env]))
    for sp in sys.path:
        for sub in ("nvidia/cu13", "nvidia/cu12", "nvidia/cuda_nvrtc", "nvidia/cuda_runtime"):
            p = Path(sp) / sub
            if p.is_dir():
                roots.append(p)
    roots.append(Path("/usr/local/cuda"))
    return roots


def find_libnvrtc():
    for root in _candidate_roots():
        for lib in ("lib", "lib64"):
            hits = sorted(glob.glob(str(root / lib / "libnvrtc.so*")))
            hits = [h for h in hits if "builtins" not in h and "alt" not in Path(h).name]
            if hits:
                return hits[0]
    raise NvrtcUnavailable(
        "libnvrtc not found: pip install 'cuda-toolkit[nvrtc,cudart]' or set CUDA_PATH"
    )


def find_cuda_include():
    for root in _candidate_roots():
        inc = root / "include"
        if (inc / "cuda_fp16.h").exists():
            return str(inc)
    raise NvrtcUnavailable(
        "CUDA headers (cuda_fp16.h) not found: pip install 'cuda-toolkit[cudart]' or set CUDA_PATH"
    )


_lib = None


def _nvrtc():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(find_libnvrtc())
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def _check(status, what):
    if status != 0:
        msg = _nvrtc().nvrtcGetErrorString(status).decode()
        raise RuntimeError(f"{what}: {msg}")


def version():
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(_nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


@dataclasses.dataclass
class KernelResources:
    registers: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


@dataclasses.dataclass
class CompileResult:
    arch: str
    log: str
    cubin_size: int
    lowered: dict  # name expression -> mangled name
    resources: dict  # mangled name -> KernelResources

    def resources_of(self, name_expression):
        return self.resources[self.lowered[name_expression]]


_FUNC = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_ENTRY = re.compile(r"Compiling entry function '(\S+)'")
_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(log):
    """Per-kernel registers, stack frame and spills from ptxas' verbose output."""
    res, current = {}, None
    for line in log.splitlines():
        m = _FUNC.search(line) or _ENTRY.search(line)
        if m:
            current = res.setdefault(m.group(1), KernelResources())
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            current.stack_bytes, current.spill_stores, current.spill_loads = map(int, m.groups())
        m = _REGS.search(line)
        if m:
            current.registers = int(m.group(1))
    return res


def compile_file(filename, name_expressions, arch, extra_options=()):
    """Compile kernels/<filename> to a cubin for ``arch`` (e.g. 'sm_90'); raise
    ``cupyops.CompileError`` with the log on failure."""
    from ._kernels import CompileError

    lib = _nvrtc()
    src = kernel_source(filename).encode()
    prog = ctypes.c_void_p()
    _check(
        lib.nvrtcCreateProgram(ctypes.byref(prog), src, filename.encode(), 0, None, None),
        "nvrtcCreateProgram",
    )
    try:
        for ne in name_expressions:
            _check(lib.nvrtcAddNameExpression(prog, ne.encode()), f"nvrtcAddNameExpression({ne})")
        opts = [
            *NVRTC_OPTIONS,
            *extra_options,
            f"-arch={arch}",
            "-ftz=true",  # what CuPy adds
            f"-I{find_cuda_include()}",
            "--ptxas-options=-v",
        ]
        copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        status = lib.nvrtcCompileProgram(prog, len(opts), copts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if status != 0:
            raise CompileError(filename, log)
        cubin_size = ctypes.c_size_t()
        _check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(cubin_size)), "nvrtcGetCUBINSize")
        lowered = {}
        for ne in name_expressions:
            name = ctypes.c_char_p()
            _check(lib.nvrtcGetLoweredName(prog, ne.encode(), ctypes.byref(name)), "nvrtcGetLoweredName")
            lowered[ne] = name.value.decode()
        return CompileResult(arch, log, cubin_size.value, lowered, parse_ptxas_log(log))
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
