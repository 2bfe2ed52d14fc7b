"""Stand-ins for the CPU tier's attention launcher tests: an AttentionProblem over fake
device arrays (a pointer and a dtype are all a plan and supports() look at)."""
import types

import numpy as np

from cupyops.ops._attention_problem import AttentionProblem


def array(ptr=0, dtype=np.float16):
    return types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr), dtype=np.dtype(dtype))


def problem(dtype="bfloat16", B=2, Hq=8, Hkv=2, Sq=300, Skv=700, D=128, scale=0.1, ptr=0, stride=None):
    """bshd-contiguous strides unless ``stride`` (batch, seq, head) is given; causal,
    bottom-right aligned."""
    dt = np.float16 if dtype != "float32" else np.float32
    arrays = [array(ptr, dt) for _ in range(4)]
    s = stride if stride is not None else (Sq * Hq * D, Hq * D, D)
    return AttentionProblem(dtype, B, Hq, Hkv, Sq, Skv, D, *arrays, None, s, s, s, s, scale, True, Skv - Sq)
