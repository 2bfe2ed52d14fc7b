"""attention: scaled dot-product attention (kernels/attention.cu, attention_flash.cu,
attention_flash3.cu, attention_decode.cu).

    O[b, i, h] = sum_j softmax_j(scale * q[b, i, h] . k[b, j, hk]) v[b, j, hk],
    hk = h // (q_heads // kv_heads)

over the keys j that query i sees (all, or j <= i + offset under a causal mask). This
module owns the public semantics: argument checks (all before anything is allocated or
launched), the layouts, GQA/MQA, the causal alignments, ``out=``, NumPy in / NumPy out. It
turns a call into one AttentionProblem (cupyops/ops/_attention_problem.py) and hands it to
the launcher module of the chosen rung, which picks the launch geometry.

No operand is copied for its layout: "bshd" and "bhsd", and any view whose head_dim axis
has unit stride, become element strides of the problem. Only an operand whose last axis is
not unit-stride, or that has a negative stride, is made contiguous first.
"""
import math
import numbers
import types

import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _fast, _launch
from . import _attention_decode, _attention_flash, _attention_flash3, _attention_simt
from ._attention_problem import MAX_HEAD_DIM, AttentionProblem

LAYOUTS = ("bshd", "bhsd")
CAUSAL_ALIGNS = ("top_left", "bottom_right")
DECODE_MAX_Q = 16  # auto: q_len up to this goes to "decode" when it is registered
_F32_MAX = float(np.finfo(np.float32).max)
MIN_SOFTCAP = 1e-6  # the smallest cap taken (a cap scales scores by up to ~1 / cap)

# The ladder, textbook first: the CUDA-core rungs, then the tensor-core and decode rungs.
LAUNCHER_MODULES = (_attention_simt, _attention_flash, _attention_flash3, _attention_decode)


def build_ladder(modules):
    """({impl: launcher module}, {impl: "[dtypes] what the rung adds"}) from the modules'
    VARIANTS, in module order: a module that registers a rung needs no edit here."""
    launchers, ladder = {}, {}
    for mod in modules:
        for impl, line in mod.VARIANTS.items():
            launchers[impl] = mod
            dts = ", ".join(d for d in _dtypes.FLOAT_TYPES if d in mod.DTYPES[impl])
            ladder[impl] = f"[{dts}] {line}"
    return launchers, ladder


_LAUNCHERS, LADDER = build_ladder(LAUNCHER_MODULES)
VARIANTS = {"attention": LADDER}
KERNEL_FILES = [kf for mod in LAUNCHER_MODULES for kf in mod.KERNEL_FILES]


def dtypes_of(impl):
    return tuple(d for d in _dtypes.FLOAT_TYPES if d in _LAUNCHERS[impl].DTYPES[impl])


def _can_run(impl, p):
    mod = _LAUNCHERS.get(impl)
    return mod is not None and p.dtype in mod.DTYPES[impl] and mod.supports(impl, p) is None


def auto_impl(p, hopper=False):
    """The rung ``impl="auto"`` runs on problem ``p``: ``decode`` for decode-shaped queries
    (q_len <= 16: the work is a stream over K and V), else the Hopper ``flash3`` on a GPU
    that runs it (``hopper``: sm_90) where it runs the problem, else the tensor-core ``flash`` where
    it runs the problem (dtype, head_dim, alignment), else ``flash_v1`` (the CUDA-core
    FlashAttention: any dtype, any head_dim up to 256, any strides)."""
    if p.Sq <= DECODE_MAX_Q and _can_run("decode", p):
        return "decode"
    if hopper and _can_run("flash3", p):
        return "flash3"
    if _can_run("flash", p):
        return "flash"
    return "flash_v1"


# ------------------------------------------------------------------------- public API
# the fast path's signature (cupyops/_fast.py): the layouts of q, k, v and the options, for
# calls with no out= and no LSE
_FAST = _fast.FastCalls(_fast.Declared(arrays=("q", "k", "v"), fixed=("return_lse", "out"), options={
    "causal": bool, "causal_align": str, "scale": (type(None), float), "window": (type(None), tuple),
    "softcap": (type(None), float), "layout": str, "impl": str}))


@foreign_arrays(fast=_FAST)
def attention(q, k, v, *, causal=False, causal_align="top_left", scale=None, window=None, softcap=None,
              layout="bshd", return_lse=False, out=None, impl="auto"):
    """Scaled dot-product attention, ``softmax(scale * q @ k^T [+ causal mask]) @ v``.

    layout "bshd": q is [batch, q_len, q_heads, head_dim], k and v [batch, kv_len, kv_heads,
    head_dim]; "bhsd": [batch, heads, len, head_dim]. q_heads must be a multiple of kv_heads
    (GQA; MQA when kv_heads == 1): query head h reads kv head h // (q_heads // kv_heads).
    scale defaults to 1 / sqrt(head_dim). causal: query i sees key j iff j <= i
    (causal_align "top_left") or j <= i + kv_len - q_len ("bottom_right"). window=(left,
    right): query i also sees only keys i + offset - left <= j <= i + offset + right, offset
    as causal_align says (0, or kv_len - q_len), with or without a causal mask (None or -1:
    that side unlimited; FlashAttention's window_size with causal_align="bottom_right").
    softcap: each scaled score s becomes softcap * tanh(s / softcap) (None or 0: no cap).
    A query that sees no key gets zeros (and LSE -inf). float32, float16, bfloat16 (float32
    math), head_dim 1..256. Returns the output (q's shape, dtype and layout), or (output,
    lse) with ``return_lse``: lse float32 [batch, q_heads, q_len], the natural-log
    log-sum-exp of each row's scaled (and capped) scores."""
    q, k, v, dt = operands(q, k, v)
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _arrays.check_ndim(x, name, ndim=4)
    B, Sq, Hq, D = _dims(q, layout)
    Bk, Skv, Hkv, Dk = _dims(k, layout)
    if Bk != B and 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"k: batch size {Bk} does not match q's {B}")
    check_heads(q, k, v, D, Dk, Hq, Hkv)
    causal, scale, return_lse = check_options(causal, causal_align, scale, return_lse, D)
    masks = check_masks(window, softcap, causal, Sq + Skv)
    _arrays.check_impl(impl, LADDER, "attention")
    if impl != "auto" and dt not in dtypes_of(impl):
        raise TypeError(f"impl: {impl!r} supports {', '.join(dtypes_of(impl))}, not {dt}")
    out = check_out(out, q, k, v)

    # The rung is chosen, and its own limits checked, on the problem as it will be launched:
    # operands still to be copied (NumPy input, unusable strides) and a new output stand in
    # as fresh contiguous pool arrays, so nothing is copied or allocated before this point.
    # A call with an empty result, or no key (zeros), launches nothing and consults no rung.
    host = not _arrays.is_cupy(q)
    offset = Skv - Sq if (causal or masks.windowed) and causal_align == "bottom_right" else 0
    launches = B * Hq * Sq > 0 and Skv > 0
    if launches:
        probe = _problem(dt, (B, Hq, Hkv, Sq, Skv, D), layout,
                         [_Fresh(x.shape, x.dtype) if host or _needs_copy(x) else x for x in (q, k, v)],
                         out if out is not None and not host else _Fresh(q.shape, q.dtype),
                         _Fresh((B, Hq, Sq), np.float32) if return_lse else None, scale, causal, offset, masks)
        if impl == "auto":
            impl = auto_impl(probe, hopper=_hopper())
        else:
            reason = _LAUNCHERS[impl].supports(impl, probe)
            if reason:
                raise ValueError(f"impl: {impl!r} cannot run this problem: {reason}")

    call = _arrays.HostCall() if host else None
    cp = _arrays.cupy_module()
    y = _arrays.device_out(out, call, q.shape, q.dtype)
    lse = cp.empty((B, Hq, Sq), dtype=np.float32) if return_lse else None
    if y.size and Skv == 0:  # nothing to attend to: no kernel needed
        y.fill(0)
        if lse is not None:
            lse.fill(-np.inf)
    elif launches:
        ops = [_arrays.to_device(x, call) if host else addressable(x)
               for x in (q, k, v)]
        p = _problem(dt, (B, Hq, Hkv, Sq, Skv, D), layout, ops, y, lse, scale, causal, offset, masks)
        _LAUNCHERS[impl].launch(impl, p)
        replay = getattr(_LAUNCHERS[impl], "fast_launches", None)
        if replay and not host and out is None and not return_lse:  # offered to the fast path
            _FAST.offer(lambda: _fast.build_from_launcher(replay(impl, p), (q, k, v), y))
    result = _arrays.finish(y, out, call)
    if not return_lse:
        return result
    return result, _arrays.finish(lse, None, call)


def _hopper():
    """Whether the current GPU runs the sm_90a rung. (Without CuPy or a GPU: CuPy's error,
    which says what is missing.)"""
    _arrays.cupy_module()
    return _attention_flash3.runs_here(_launch.device_props())


# ------------------------------------------------------------------------- checking
def operands(q, k, v):
    """(q, k, v as arrays, q's dtype name): k and v live where q does, in its dtype."""
    q = _arrays.as_input(q, "q")
    k = _arrays.as_input(k, "k")
    v = _arrays.as_input(v, "v")
    dt = _arrays.check_dtype(q, "q", _dtypes.FLOAT_TYPES)
    for x, name in ((k, "k"), (v, "v")):
        if _arrays.is_cupy(x) != _arrays.is_cupy(q):
            raise TypeError(f"{name}: must live where q does (both CuPy or both NumPy arrays)")
        if _dtypes.dtype_name(x.dtype) != dt:
            raise TypeError(f"{name}: dtype {_dtypes.dtype_name(x.dtype)} does not match q's {dt}; "
                            "mixed dtypes are not supported")
    return q, k, v, dt


def check_heads(q, k, v, D, Dk, Hq, Hkv):
    """head_dim in range and shared by q and k, v shaped as k, kv_heads dividing q_heads."""
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"q: head_dim must be in 1..{MAX_HEAD_DIM}, got {D} (shape {tuple(q.shape)})")
    if Dk != D:
        raise ValueError(f"k: head_dim {Dk} does not match q's {D}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v: expected k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if Hkv == 0 and Hq > 0 or Hkv > 0 and Hq % Hkv:
        raise ValueError(f"k: kv_heads ({Hkv}) must divide q_heads ({Hq}): each kv head serves "
                         "q_heads // kv_heads query heads")


def check_options(causal, causal_align, scale, return_lse, D):
    """(causal, the scale, return_lse) checked: bools, an alignment, a finite scale or None
    (1 / sqrt(head_dim))."""
    causal = _flag(causal, "causal")
    if not isinstance(causal_align, str) or causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align: expected one of {', '.join(map(repr, CAUSAL_ALIGNS))}, "
                         f"got {causal_align!r}")
    scale = 1.0 / math.sqrt(D) if scale is None else _scale(scale)
    return causal, scale, _flag(return_lse, "return_lse")


class Masks(types.SimpleNamespace):
    """A call's sliding window and soft cap as the kernels take them (AttentionProblem's
    window_left, window_right: -1 for an unlimited side; softcap 0.0 for none)."""

    @property
    def windowed(self):
        return self.window_left >= 0 or self.window_right >= 0


NO_MASKS = Masks(window_left=-1, window_right=-1, softcap=0.0)


def check_masks(window, softcap, causal, reach):
    """``window`` ((left, right), each an int >= 0, or None / -1 for unlimited; or None) and
    ``softcap`` (a positive real, or None / 0 for none) checked, as a Masks. ``reach``: a
    side at least this long (the query and key lengths together) hides nothing, and the
    right side hides nothing under a causal mask: both are taken as unlimited."""
    if window is None and softcap is None:
        return NO_MASKS
    sides = [-1, -1]
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise TypeError(f"window: expected (left, right) or None, got {window!r}")
        for j, (w, side) in enumerate(zip(window, ("left", "right"))):
            if w is None:
                continue
            if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Integral):
                raise TypeError(f"window: the {side} side must be an int or None, got {type(w).__name__}")
            if w < -1:
                raise ValueError(f"window: the {side} side must be >= 0 (or -1 / None: unlimited), got {int(w)}")
            sides[j] = -1 if w >= reach else int(w)
        if causal:
            sides[1] = -1  # the causal mask hides every key right of the diagonal already
    cap = 0.0
    if softcap is not None:
        if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
            raise TypeError(f"softcap: expected a positive real number or None, got {type(softcap).__name__}")
        cap = float(softcap)
        if not (math.isfinite(cap) and cap >= 0) or cap > _F32_MAX:
            raise ValueError(f"softcap: must be a finite float32 >= 0 (0: no cap), got {softcap}")
        if 0 < cap < MIN_SOFTCAP:  # (it would flatten every score to +-cap; the kernels' factors overflow)
            raise ValueError(f"softcap: must be 0 (no cap) or at least {MIN_SOFTCAP:g}, got {softcap}")
    return Masks(window_left=sides[0], window_right=sides[1], softcap=cap)


def check_out(out, q, k, v):
    """``out``: q's kind, shape and dtype, contiguous, apart from k and v."""
    out = _arrays.check_out(out, q, q.shape, q.dtype)
    if out is not None and _arrays.is_cupy(out) and out.size:
        for x, name in ((k, "k"), (v, "v")):
            if _arrays._shares_memory_with(out, x):
                raise ValueError(f"out: must not overlap the input {name}")
    return out


def _dims(x, layout):
    """(batch, seq, heads, head_dim) of a 4-D operand in ``layout``."""
    b, a1, a2, d = x.shape
    return (b, a1, a2, d) if layout == "bshd" else (b, a2, a1, d)


def _flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return bool(value)


def _scale(value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"scale: expected a real number or None, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"scale: must be finite, got {value}")
    if abs(value) > _F32_MAX:  # the kernels take it as float32
        raise ValueError(f"scale: {value} is out of float32 range")
    return value


# ------------------------------------------------------------------------- lowering
class _Fresh:
    """Stands for a device array not made yet: a contiguous copy or a new output from
    CuPy's pool, whose blocks are 512-byte aligned (so data.ptr 0 has its alignment). A
    launcher's supports() judges the problem on it before anything is copied."""

    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.ndim = len(self.shape)
        self.size = math.prod(self.shape)
        self.nbytes = self.size * self.itemsize
        strides, step = [], self.itemsize
        for n in reversed(self.shape):
            strides.insert(0, step)
            step *= max(n, 1)
        self.strides = tuple(strides)
        self.data = types.SimpleNamespace(ptr=0)


def _needs_copy(x):
    """A CuPy operand the kernels cannot address: head_dim not unit-stride, or a negative
    (or fractional) stride. Axes of extent 1 are never stepped, so their strides do not
    count."""
    item = x.itemsize
    if any(n > 1 and (s < 0 or s % item) for n, s in zip(x.shape, x.strides)):
        return True
    return x.shape[-1] > 1 and x.strides[-1] != item


def addressable(x):
    """x, or a contiguous copy where the kernels cannot address it (_needs_copy)."""
    return _arrays.cupy_module().ascontiguousarray(x) if _needs_copy(x) else x


def lead_strides(x, n):
    """The element strides of ``x``'s first ``n`` axes; 0 on an axis of extent 1 (never
    stepped), so such an axis does not spoil 16-byte alignment."""
    item = x.itemsize
    return tuple(s // item if d > 1 else 0 for d, s in zip(x.shape[:n], x.strides[:n]))


def _strides(x, layout):
    """(batch, seq, head) element strides of ``x`` (lead_strides)."""
    st = lead_strides(x, 3)
    return st if layout == "bshd" else (st[0], st[2], st[1])


def _problem(dt, dims, layout, qkv, o, lse, scale, causal, offset, masks=NO_MASKS):
    B, Hq, Hkv, Sq, Skv, D = dims
    q, k, v = qkv
    return AttentionProblem(
        dtype=dt, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Skv=Skv, D=D, Q=q, K=k, V=v, O=o, LSE=lse,
        q_strides=_strides(q, layout), k_strides=_strides(k, layout), v_strides=_strides(v, layout),
        o_strides=_strides(o, layout), scale=scale, causal=causal, causal_offset=offset,
        window_left=masks.window_left, window_right=masks.window_right, softcap=masks.softcap,
    )
