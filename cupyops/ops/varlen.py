"""attention_varlen: attention over a batch of sequences of different lengths packed without
padding, FlashAttention's ``flash_attn_varlen_func`` layout (issue 19).

    q [total_q, q_heads, head_dim], k and v [total_k, kv_heads, head_dim]
    sequence b: query rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 and
                key rows   cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1

Each sequence attends only to its own keys, with ``attention``'s semantics (GQA, scale,
the causal alignments, a query that sees no key gives zeros and LSE -inf).

Rungs: ``flash3`` runs every sequence in one launch of the Hopper kernel
(kernels/attention_flash3.cu reads the offsets on the GPU: its work tiles are (64 NC rows
of the longest sequence, head, sequence), and a tile past its sequence's end has nothing to
do); ``per_sequence`` calls ``attention`` (its auto rung) once a sequence, on views, with
the offsets read on the host. ``auto`` takes flash3 where it runs the problem (sm_90,
float16/bfloat16, head_dim 64/96/128/256, 16-byte aligned rows; windows and soft caps
included), else per_sequence.

The offsets and the longest lengths: where ``max_seqlen_q`` and ``max_seqlen_k`` are given
and the offsets live on the GPU, nothing is read on the host (no synchronisation: the call
can be captured in a CUDA graph); their values are then not checked: the kernel clamps each
sequence into the tensors and to the given longest lengths, never reading or writing out of
bounds, and query rows past a sequence's clamped length are left unwritten. Otherwise
(NumPy offsets, a length not given, or the per_sequence rung) the offsets are read on the
host and checked, and a bad value raises ValueError naming the argument.
"""

import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes
from . import _attention_flash3
from ._attention_problem import AttentionProblem
from .attention import NO_MASKS, _Fresh, _hopper, _needs_copy, addressable, check_heads, check_masks, check_options, \
    check_out, lead_strides, operands
from .attention import attention as _attention

VARIANTS = {
    "attention_varlen": {
        "per_sequence": f"[{', '.join(_dtypes.FLOAT_TYPES)}] attention's auto rung once a sequence, on views of the "
                        "packed tensors (the offsets read on the host)",
        "flash3": "[float16, bfloat16] the Hopper flash3 kernel over every sequence in one launch, the offsets "
                  "read on the GPU (sm_90a; head_dim 64, 96, 128, 256)",
    }
}
KERNEL_FILES = list(_attention_flash3.KERNEL_FILES)
_INT32_MAX = 2**31 - 1


@foreign_arrays()
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None, causal=False,
                     causal_align="bottom_right", scale=None, window=None, softcap=None, return_lse=False, out=None,
                     impl="auto"):
    """Attention of packed sequences: q ``[total_q, q_heads, head_dim]``, k and v
    ``[total_k, kv_heads, head_dim]``, sequence b being rows ``cu_seqlens_q[b]:cu_seqlens_q[b
    + 1]`` of q (and of the output) and ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of k and v
    (int32 ``[batch + 1]``, non-decreasing, within the tensors), as FlashAttention's
    ``flash_attn_varlen_func``. Per sequence, ``attention``'s semantics: GQA/MQA (q_heads a
    multiple of kv_heads), ``scale`` (default 1 / sqrt(head_dim)), ``causal`` with
    ``causal_align`` "bottom_right" (the default here, as FlashAttention's: a sequence's
    last query sees its last key) or "top_left"; ``window`` (left, right) and ``softcap`` as
    in ``attention`` (a window takes the causal_align alignment of each sequence, with or
    without a causal mask: FlashAttention's ``window_size``); a query that sees no key gets
    zeros and LSE -inf. ``max_seqlen_q`` / ``max_seqlen_k``: the longest sequence's lengths (see the module
    docstring: giving them, with the offsets on the GPU, spares a host read). Returns the
    output (q's shape and dtype), or (output, lse) with ``return_lse``: lse float32
    ``[q_heads, total_q]``, the natural-log log-sum-exp of each row's scaled scores.
    Query rows outside every sequence are left unwritten (zeros for a new output). flash3
    reads up to a key tile (192 rows) of k and v past a sequence's end, masked: rows there
    that lie inside the tensors but after the last sequence must hold finite values (a NaN
    in v reaches the output through its zero weight)."""
    q, k, v, dt = operands(q, k, v)
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _arrays.check_ndim(x, name, ndim=3)
    total_q, Hq, D = q.shape
    total_k, Hkv, Dk = k.shape
    check_heads(q, k, v, D, Dk, Hq, Hkv)
    if max(total_q, total_k) > _INT32_MAX:
        raise ValueError(f"q: at most {_INT32_MAX} packed tokens, got {max(total_q, total_k)}")
    cu_q = check_offsets(cu_seqlens_q, "cu_seqlens_q", q)
    cu_k = check_offsets(cu_seqlens_k, "cu_seqlens_k", q)
    if cu_k.shape != cu_q.shape:
        raise ValueError(f"cu_seqlens_k: {cu_k.shape[0] - 1} sequences, cu_seqlens_q has {cu_q.shape[0] - 1}")
    batch = cu_q.shape[0] - 1
    max_q = check_max_len(max_seqlen_q, "max_seqlen_q", total_q)
    max_k = check_max_len(max_seqlen_k, "max_seqlen_k", total_k)
    causal, scale, return_lse = check_options(causal, causal_align, scale, return_lse, D)
    masks = check_masks(window, softcap, causal, total_q + total_k)
    _arrays.check_impl(impl, VARIANTS["attention_varlen"], "attention_varlen")
    out = check_out(out, q, k, v)

    host = not _arrays.is_cupy(q)
    # the offsets on the host where they are there already, where a length is missing or
    # the rung needs them: read once, checked, and the longest lengths taken from them
    offsets = None
    if not _arrays.is_cupy(cu_q) or not _arrays.is_cupy(cu_k) or max_q is None or max_k is None \
            or impl == "per_sequence":
        offsets = _host_offsets(cu_q, cu_k, total_q, total_k, max_q, max_k)
        max_q, max_k = max_q if max_q is not None else offsets[2], max_k if max_k is not None else offsets[3]
    launches = batch > 0 and Hq > 0 and max_q > 0 and total_q > 0

    flash3 = False  # whether flash3 runs the packed problem
    if launches and impl in ("auto", "flash3"):
        # (judged, as attention() does, on the operands as they will be launched: fresh
        # contiguous pool arrays for NumPy input and for views the kernels cannot address)
        probe = _problem(dt, batch, Hq, Hkv, max_q, max_k, D,
                         *(_Fresh(x.shape, x.dtype) if host or _needs_copy(x) else x for x in (q, k, v)),
                         out if out is not None and not host else _Fresh(q.shape, q.dtype),
                         None, scale, causal, causal_align, cu_q, cu_k, total_q, total_k, masks)
        hopper = _hopper()
        reason = _attention_flash3.supports("flash3", probe) if hopper else "it runs on sm_90 GPUs"
        if reason is None:
            flash3 = True
        elif impl == "flash3":
            raise ValueError(f"impl: 'flash3' cannot run this problem: {reason}")
        elif offsets is None:  # auto falls back to per_sequence, which reads the offsets
            offsets = _host_offsets(cu_q, cu_k, total_q, total_k, max_q, max_k)

    call = _arrays.HostCall() if host else None
    cp = _arrays.cupy_module()
    y = _arrays.device_out(out, call, q.shape, q.dtype)
    if out is None and y.size and (offsets is None or offsets[0][0] > 0 or offsets[0][-1] < total_q):
        y.fill(0)  # (rows outside every sequence, or past one's clamped length: zeros, not the pool's leftovers)
    lse = cp.full((Hq, total_q), -np.inf, dtype=np.float32) if return_lse else None
    if launches:
        qd, kd, vd = (_arrays.to_device(x, call) if host else x for x in (q, k, v))
        if flash3:
            cq = cp.ascontiguousarray(cp.asarray(cu_q, dtype=np.int32))
            ck = cp.ascontiguousarray(cp.asarray(cu_k, dtype=np.int32))
            qd, kd, vd = (addressable(x) for x in (qd, kd, vd))
            p = _problem(dt, batch, Hq, Hkv, max_q, max_k, D, qd, kd, vd, y, lse, scale, causal, causal_align,
                         cq, ck, total_q, total_k, masks)
            _attention_flash3.launch("flash3", p)
        else:
            _per_sequence(qd, kd, vd, y, lse, offsets, causal, causal_align, scale, window, softcap)
    result = _arrays.finish(y, out, call)
    if not return_lse:
        return result
    return result, _arrays.finish(lse, None, call)


# ------------------------------------------------------------------------- checking
def check_offsets(x, name, q):
    """An int32 1-D offsets array of at least one entry, living where q does or on the host
    (NumPy, or a list)."""
    if not _arrays.is_cupy(x):
        x = np.asarray(x)
    if x.dtype != np.int32:
        raise TypeError(f"{name}: expected int32 offsets, got {x.dtype}")
    if x.ndim != 1 or x.shape[0] < 1:
        raise ValueError(f"{name}: expected a 1-D array of batch + 1 offsets, got shape {tuple(x.shape)}")
    if _arrays.is_cupy(x) and not _arrays.is_cupy(q):
        raise TypeError(f"{name}: a CuPy array with NumPy q, k, v; give NumPy offsets")
    return x


def check_max_len(value, name, total):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int or None, got {type(value).__name__}")
    value = int(value)
    if not 0 <= value <= total:
        raise ValueError(f"{name}: must be in 0..{total} (the packed tokens), got {value}")
    return value


def _host_offsets(cu_q, cu_k, total_q, total_k, max_q, max_k):
    """(offsets of q, of k, as NumPy int64; the longest query and key sequences), checked
    (host_offsets). (Reads GPU offsets back: a synchronisation.)"""
    hq, longest_q = host_offsets(cu_q, "cu_seqlens_q", total_q, max_q, "max_seqlen_q")
    hk, longest_k = host_offsets(cu_k, "cu_seqlens_k", total_k, max_k, "max_seqlen_k")
    return hq, hk, longest_q, longest_k


def host_offsets(x, name, total, given, what):
    """(offsets ``x`` as NumPy int64, the longest sequence), checked: non-decreasing, from 0
    or more, within the ``total`` packed tokens, none longer than ``given`` (the argument
    ``what``) where given."""
    h = (x.get() if _arrays.is_cupy(x) else x).astype(np.int64)
    if h[0] < 0:
        raise ValueError(f"{name}: offsets must be >= 0, got {h[0]} at index 0")
    steps = np.diff(h)
    if (steps < 0).any():
        i = int(np.argmax(steps < 0))
        raise ValueError(f"{name}: offsets must not decrease, got {h[i]} then {h[i + 1]} at index {i + 1}")
    if h[-1] > total:
        raise ValueError(f"{name}: the last offset {h[-1]} is past the {total} packed tokens")
    longest = int(steps.max()) if steps.size else 0
    if given is not None and longest > given:
        raise ValueError(f"{what}: {given} is less than the longest sequence ({longest})")
    return h, longest


def _row_strides(x):
    """(batch, row, head) element strides of a packed [rows, heads, head_dim] operand: batch
    0 (one packed batch)."""
    return (0, *lead_strides(x, 2))


def _problem(dt, batch, Hq, Hkv, max_q, max_k, D, q, k, v, o, lse, scale, causal, causal_align, cq, ck, total_q,
             total_k, masks=NO_MASKS):
    return AttentionProblem(
        dtype=dt, B=batch, Hq=Hq, Hkv=Hkv, Sq=max_q, Skv=max_k, D=D, Q=q, K=k, V=v, O=o, LSE=lse,
        q_strides=_row_strides(q), k_strides=_row_strides(k), v_strides=_row_strides(v), o_strides=_row_strides(o),
        scale=scale, causal=causal, causal_offset=0, cu_q=cq, cu_k=ck, total_q=total_q, total_k=total_k,
        bottom_right=causal_align == "bottom_right", window_left=masks.window_left, window_right=masks.window_right,
        softcap=masks.softcap)


def _per_sequence(q, k, v, y, lse, offsets, causal, causal_align, scale, window, softcap):
    """attention() once a sequence, on row views of the packed tensors (a sequence with no
    query row launches nothing; one with no key gets zeros and LSE -inf)."""
    oq, ok = offsets[0], offsets[1]
    for b in range(len(oq) - 1):
        q0, q1, k0, k1 = int(oq[b]), int(oq[b + 1]), int(ok[b]), int(ok[b + 1])
        if q1 == q0:
            continue
        r = _attention(q[q0:q1][None], k[k0:k1][None], v[k0:k1][None], causal=causal, causal_align=causal_align,
                       scale=scale, window=window, softcap=softcap, return_lse=lse is not None, out=y[q0:q1][None])
        if lse is not None:
            lse[:, q0:q1] = r[1][0]
