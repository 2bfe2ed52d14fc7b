"""Small helpers the GPU test files share: CuPy imported only when a test runs (the files
collect, and skip, without it), dtype names, and any array brought to the host as NumPy."""
import numpy as np

from cupyops import _dtypes


def _cp():
    import cupy

    return cupy


def dt(name):
    return _dtypes.to_dtype(name)


def host(a):
    """A NumPy copy of a NumPy, CuPy or torch (CPU or CUDA) array."""
    if type(a).__module__.startswith("torch"):
        a = a.cpu().numpy() if a.device.type == "cpu" else _cp().from_dlpack(a.detach())
    return a.get() if type(a).__module__.startswith("cupy") else np.asarray(a)
