"""Shared pytest configuration.

The GPU tier: tests marked ``@pytest.mark.gpu`` (the marker is declared in pyproject.toml)
are skipped, with the reason, where CuPy cannot be imported or no CUDA GPU is visible, so
the CPU-only CI collects them cleanly and reports skips rather than errors.
"""
import pytest

_GPU_MISSING = []  # memo: [reason or None], filled on first need


def gpu_unavailable_reason():
    """None when CuPy imports and sees at least one CUDA device, else why not."""
    if not _GPU_MISSING:
        _GPU_MISSING.append(_probe_gpu())
    return _GPU_MISSING[0]


def _probe_gpu():
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install failing at import
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device node...
        return f"no usable CUDA GPU (cupy.cuda.runtime.getDeviceCount() failed: {exc})"
    if count == 0:
        return "no CUDA GPU visible (cupy.cuda.runtime.getDeviceCount() == 0)"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return  # CPU-only selection: do not even import CuPy
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU tier skipped: {reason}")
    for item in gpu_items:
        item.add_marker(skip)
