"""The operators. Each family module owns its kernel file(s), its variant table
(public ``impl=`` names -> one line on what the rung adds) and its launchers."""
from . import activation, attention, fp8, gemm, norm, reduce, rope, sampling, softmax

# The operator ladders (textbook rung to hardware limit, on every GPU the project targets).
_LADDERS = {
    "trace": reduce,
    "sum": reduce,
    "max": reduce,
    "softmax": softmax,
    "layer_norm": norm,
    "rms_norm": norm,
    "matmul": gemm,
    "gemm": gemm,
    "attention": attention,
    # the fused LLM operators (issue 19)
    "silu_and_mul": activation,
    "gelu_and_mul": activation,
    "add_rms_norm": norm,
    "rope": rope,
    "sample": sampling,
}
# Registered for variants(), kernel_files() and warmup(), but kept out of OPS: OPS is what
# the generic sweeps walk (every op a ladder of at least two rungs; the GPU tier's
# NumPy-in/CuPy-in checks on any GPU), and these are one rung each, scaled_matmul on sm_90
# alone. Their own tests are tests/test_fp8_args.py and tests/test_gpu_fp8.py.
_FP8 = {
    "scaled_matmul": fp8,
    "quantize_fp8": fp8,
}
# The paged-KV serving operators (issue 19): one kernel each, kept out of OPS like the fp8
# ones; their tests are tests/test_paged_args.py and tests/test_gpu_paged.py.
from . import paged  # noqa: E402

_PAGED = dict.fromkeys(("attention_paged", "kv_cache_append", "merge_attention_states"), paged)
# Packed variable-length attention (issue 19), kept out of OPS as well: tests/test_varlen_args.py
# and tests/test_gpu_varlen.py.
from . import varlen  # noqa: E402

_VARLEN = {"attention_varlen": varlen}
_FAMILIES = {**_LADDERS, **_FP8, **_PAGED, **_VARLEN}

OPS = tuple(_LADDERS)
FP8_OPS = tuple(_FP8)
PAGED_OPS = tuple(_PAGED)
VARLEN_OPS = tuple(_VARLEN)
ALL_OPS = tuple(_FAMILIES)


def variants(op):
    """The ladder of ``op``: {impl name: what this rung adds}, textbook first, top rung
    last. ``impl="auto"`` (the default of every operator) picks the fastest correct rung."""
    try:
        return dict(_FAMILIES[op].VARIANTS[op])
    except KeyError:
        raise ValueError(f"op: unknown operator {op!r}; expected one of {', '.join(ALL_OPS)}") from None


def kernel_files(ops=None):
    """The KernelFile objects behind ``ops`` (every registered operator when None)."""
    if ops is None:
        ops = ALL_OPS
    elif isinstance(ops, str):
        ops = (ops,)
    files = []
    for op in ops:
        if op not in _FAMILIES:
            raise ValueError(f"ops: unknown operator {op!r}; expected one of {', '.join(ALL_OPS)}")
        for kf in _FAMILIES[op].KERNEL_FILES:
            if kf not in files:
                files.append(kf)
    return files
