"""cupyops: hand-written CUDA kernels for LLM-inference operators, each a ladder of
variants from the textbook version to the hardware limit, JIT-compiled through CuPy/NVRTC.

Importing is cheap (CuPy is imported on the first operator call). Arrays: CuPy in ->
CuPy out, on CuPy's current stream; NumPy in -> NumPy out (through pinned memory).
"""
from ._kernels import CompileError, warmup, warmup_async
from .ops import OPS, variants
from .ops.activation import gelu_and_mul, silu_and_mul
from .ops.attention import attention
from .ops.fp8 import quantize_fp8, scaled_matmul
from .ops.gemm import gemm, matmul
from .ops.norm import add_rms_norm, layer_norm, rms_norm
from .ops.paged import attention_paged, kv_cache_append, merge_attention_states
from .ops.varlen import attention_varlen
from .ops.reduce import max, sum, trace  # noqa: A004 - NumPy's names
from .ops.rope import rope
from .ops.sampling import sample
from .ops.softmax import softmax
from . import reference

amax = max

__version__ = "0.1.0"

__all__ = [
    "CompileError",
    "OPS",
    "add_rms_norm",
    "amax",
    "attention",
    "attention_paged",
    "attention_varlen",
    "gelu_and_mul",
    "gemm",
    "kv_cache_append",
    "layer_norm",
    "matmul",
    "max",
    "merge_attention_states",
    "quantize_fp8",
    "reference",
    "rms_norm",
    "rope",
    "sample",
    "scaled_matmul",
    "silu_and_mul",
    "softmax",
    "sum",
    "trace",
    "variants",
    "warmup",
    "warmup_async",
]
