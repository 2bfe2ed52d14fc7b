"""One checked GEMM launch, as every GEMM kernel file's launcher receives it.

``cupyops.ops.gemm`` checks the arguments, broadcasts the batch dimensions and allocates
the output; it then hands a ``GemmProblem`` to the launcher of the chosen rung
(``_gemm_simt``, ``_gemm_mma``, ``_gemm_skinny``), which only picks the launch geometry.
The meaning of every field is the contract in kernels/gemm_common.cuh.
"""
import dataclasses

import numpy as np

# gridDim.z limit: kernels loop over the rest of the batch
MAX_GRID_Z = 65535


@dataclasses.dataclass
class GemmProblem:
    dtype: str  # element dtype name of A and B: float32, float16, bfloat16, int8
    ta: bool  # A stored K x M (op(A) = A^T)
    tb: bool  # B stored N x K
    M: int
    N: int
    K: int
    A: object  # CuPy arrays (any view; the kernels use lda/sA, not the array's strides)
    B: object
    C: object  # None when beta == 0
    D: object
    lda: int  # row strides, in elements
    ldb: int
    ldc: int
    ldd: int
    sA: int  # batch strides, in elements (0: broadcast)
    sB: int
    sC: int
    sD: int
    batch: int
    alpha: float
    beta: float

    @property
    def is_int(self):
        return self.dtype == "int8"

    def args(self):
        """Kernel arguments in GEMM_PARAMS order, with the C types the kernels expect."""
        scalar = np.int32 if self.is_int else np.float32
        i64 = np.int64
        return (
            self.A, self.B, self.C if self.C is not None else self.D, self.D,
            np.int32(self.M), np.int32(self.N), np.int32(self.K),
            i64(self.lda), i64(self.ldb), i64(self.ldc), i64(self.ldd),
            i64(self.sA), i64(self.sB), i64(self.sC), i64(self.sD), np.int32(self.batch),
            scalar(self.alpha), scalar(self.beta if self.C is not None else 0),
        )

    def shape_key(self):
        """What a launch plan depends on (not the pointers): plans are memoized on it, since
        a decode-sized call has only ~15 us of GPU work to hide the host's time behind."""
        return (self.dtype, self.ta, self.tb, self.M, self.N, self.K, self.batch)

    def grid_z(self):
        return min(self.batch, MAX_GRID_Z)

    def layout(self):
        """The two template booleans, spelled for a name expression."""
        return ("true" if self.ta else "false", "true" if self.tb else "false")


LAYOUTS = [(ta, tb) for ta in ("false", "true") for tb in ("false", "true")]


def check_rung(family, impl, dtype, config, variants, dtypes, configs):
    """A launcher's own checks of (impl, dtype, config) against its tables (gemm.py has
    already checked the user's arguments; these guard direct calls, e.g. from a sweep)."""
    if impl not in variants:
        raise ValueError(f"impl: unknown {family} rung {impl!r}; expected one of {', '.join(variants)}")
    if dtype not in dtypes[impl]:
        raise TypeError(f"gemm impl={impl!r} supports {', '.join(dtypes[impl])}, got {dtype}")
    if config is not None and config not in configs[impl]:
        accepted = ", ".join(configs[impl]) or "none"
        raise ValueError(f"config: {config!r} is not a {impl} configuration; expected one of: {accepted}")
