"""The operators. Each family module owns its kernel file(s), its variant table
(public ``impl=`` names -> one line on what the rung adds) and its launchers."""
from . import attention, gemm, norm, reduce, softmax

_FAMILIES = {
    "trace": reduce,
    "sum": reduce,
    "max": reduce,
    "softmax": softmax,
    "layer_norm": norm,
    "rms_norm": norm,
    "matmul": gemm,
    "gemm": gemm,
    "attention": attention,
}

OPS = tuple(_FAMILIES)


def variants(op):
    """The ladder of ``op``: {impl name: what this rung adds}, textbook first, top rung
    last. ``impl="auto"`` (the default of every operator) picks the fastest correct rung."""
    try:
        return dict(_FAMILIES[op].VARIANTS[op])
    except KeyError:
        raise ValueError(f"op: unknown operator {op!r}; expected one of {', '.join(OPS)}") from None


def kernel_files(ops=None):
    """The KernelFile objects behind ``ops`` (all operators when None)."""
    if ops is None:
        ops = OPS
    elif isinstance(ops, str):
        ops = (ops,)
    files = []
    for op in ops:
        if op not in _FAMILIES:
            raise ValueError(f"ops: unknown operator {op!r}; expected one of {', '.join(OPS)}")
        for kf in _FAMILIES[op].KERNEL_FILES:
            if kf not in files:
                files.append(kf)
    return files

