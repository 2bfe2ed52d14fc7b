"""Dtype policy shared by every operator: names, CUDA C++ spellings, accumulators.

Nothing here imports CuPy, so argument checking works on machines without a GPU.
bfloat16 arrays come from ``ml_dtypes`` (the type CuPy and PyTorch's DLPack bridge use);
without it there simply is no bfloat16 dtype to check against.
"""
import numpy as np

try:  # optional: only needed to *make* bfloat16 arrays
    import ml_dtypes as _ml_dtypes

    bfloat16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    bfloat16 = None

# numpy dtype name -> CUDA C++ type used in template name expressions
CUDA_TYPES = {
    "float32": "float",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float64": "double",
    "int32": "int",
    "int64": "long long",
    "int8": "signed char",
}

FLOAT_TYPES = ("float32", "float16", "bfloat16")
ALL_FLOAT_TYPES = ("float32", "float64", "float16", "bfloat16")
INT_TYPES = ("int32", "int64")
REDUCE_TYPES = ALL_FLOAT_TYPES + INT_TYPES


_NAMES = {}  # dtype -> name: numpy builds dtype.name anew on every access (hot path)


def dtype_name(dtype):
    """Canonical name of a dtype ('bfloat16' for ml_dtypes' type)."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = np.dtype(dtype).name
    return name


def to_dtype(name):
    """numpy dtype object for one of our dtype names."""
    if name == "bfloat16":
        if bfloat16 is None:
            raise TypeError("bfloat16 needs the 'ml_dtypes' package (pip install ml_dtypes)")
        return bfloat16
    return np.dtype(name)


def cuda_type(name):
    return CUDA_TYPES[name]


def itemsize(name):
    return 2 if name in ("float16", "bfloat16") else np.dtype(name).itemsize
