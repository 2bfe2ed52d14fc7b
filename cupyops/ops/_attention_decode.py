"""Placeholder: the attention rung(s) of kernels/attention_decode.cu land here (see
_attention_problem.py for the launcher-module interface). Until then it registers nothing."""
VARIANTS = {}
DTYPES = {}
KERNEL_FILES = []


def supports(impl, p):
    return f"impl: {impl!r} is not available"


def launch(impl, p):
    raise ValueError(f"impl: {impl!r} is not available")
