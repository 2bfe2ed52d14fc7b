"""What the CPU tests of the benchmark use to run its GPU-side code on the host: NumPy
arrays standing in for CuPy's (with CuPy's .get()), and runners.random_normal's data made
with NumPy."""
import numpy as np

from cupyops import _dtypes


class HostArray(np.ndarray):
    """A NumPy array with CuPy's .get()."""

    def get(self):
        return np.array(self)


def host_normal(shape, dtype, seed):
    """runners.random_normal on the host: N(0, 1) floats; integers over int8's range, and
    -100..99 for the wider ones (sums that stay exact)."""
    rng = np.random.default_rng(seed)
    if dtype in ("int8", "int32", "int64"):
        lo, hi = (-128, 128) if dtype == "int8" else (-100, 100)
        return rng.integers(lo, hi, size=shape).astype(dtype).view(HostArray)
    return rng.standard_normal(shape).astype(_dtypes.to_dtype(dtype)).view(HostArray)
