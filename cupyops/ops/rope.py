"""rope: rotary position embedding of q and k in one launch (kernels/rope.cu)."""
import numbers

import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _fast, _launch
from .._kernels import KernelFile, template_name

VARIANTS = {
    "rope": {
        "naive": "a thread per rotated pair, each computing its own cos/sin (a double pow and "
        "a sincospif), 2- or 4-byte accesses",
        "fused": "block per token: its cos/sin computed (or read from the cache) once into "
        "shared memory for every head of q and k, while the token's q and k rows are already "
        "on their way (16-byte loads, 4 a thread, issued first) where the layout allows",
    }
}
STYLES = ("neox", "gptj")
POSITION_TYPES = ("int32", "int64")
FUSED_MAX_THREADS = 256  # ROPE_MAX_THREADS, the fused kernel's __launch_bounds__
FUSED_SLOTS = 4  # ROPE_SLOTS: work items a thread of the fused rung loads at once
NAIVE_BLOCK = 256


def _cache_types(d):
    """The cos_sin_cache dtypes taken with q of dtype ``d``: float32, or q's own (vLLM keeps
    the cache in the model's dtype)."""
    return ("float32",) if d == "float32" else ("float32", d)


def _kernel(rung, dt, cache_dt, pos_dt):
    return template_name(f"rope_{rung}", _dtypes.cuda_type(dt), _dtypes.cuda_type(cache_dt),
                         _dtypes.cuda_type(pos_dt))


def _expressions():
    return [_kernel(rung, d, c, p) for rung in ("naive", "fused") for d in _dtypes.FLOAT_TYPES
            for c in _cache_types(d) for p in POSITION_TYPES]


KERNELS = KernelFile("rope.cu", _expressions())
KERNEL_FILES = [KERNELS]


def _fast_spec(sig, q, k, positions, cos_sin_cache, rotary_dim, base, style, inplace, impl, out0, out1):
    """rope's fast-path signature (cupyops/_fast.py): the arrays' layouts and the options,
    for calls with no out=."""
    if (out0 is not None or out1 is not None or not (rotary_dim is None or type(rotary_dim) is int)
            or type(base) not in (int, float) or type(style) is not str or type(inplace) is not bool
            or type(impl) is not str):
        return None
    # in place, q and k are both written: where they lie against each other is part of the
    # call (the checked path refuses a shared element; head slices of one qkv buffer pass)
    where = _fast.placement(q, k) if inplace else None
    key = (sig(q), sig(k), sig(positions), sig(cos_sin_cache), rotary_dim, base, style, inplace, impl, where)
    return key, (q, k, positions, cos_sin_cache)


_FAST = _fast.FastCalls(_fast_spec)


def rope(q, k, positions, *, rotary_dim=None, base=10000.0, style="neox", cos_sin_cache=None, inplace=False,
         out=None, impl="auto"):
    """Rotary position embedding of queries and keys, vLLM's ``rotary_embedding``
    (``RotaryEmbedding.forward``) semantics: returns ``(q, k)`` rotated.

    q ``[tokens, q_heads, D]``, k ``[tokens, kv_heads, D]`` (float32, float16, bfloat16, one
    dtype; any token and head strides, e.g. views of a fused qkv projection), integer
    ``positions [tokens]`` (int32 or int64). Token t at position p: for each frequency
    i < R/2 (R = rotary_dim, even, <= D; default D) the pair (x[i], x[i + R/2])
    (style="neox", GPT-NeoX/Llama) or (x[2i], x[2i + 1]) (style="gptj", interleaved) becomes
    ``(a cos - b sin, b cos + a sin)`` of the angle p * inv_freq[i]; dims [R, D) pass through.

    cos/sin: from ``cos_sin_cache`` ``[max_pos, R]`` (cos in its first R/2 columns, sin in
    the last R/2, as vLLM builds it; float32 or q's dtype) when given, ``base`` unused;
    otherwise computed in float32 as vLLM's cache is: inv_freq[i] = base^(-2i/R) (rounded
    once to float32; vLLM's float32 pow may differ by an ulp), angle = float32(p) * inv_freq
    in float32, its cos and sin to float32 accuracy. The rotation is float32, rounded once
    to the dtype (vLLM's kernel computes it in the dtype).

    Positions outside ``[0, max_pos)`` of the cache: NumPy positions (the host has them)
    raise ValueError before anything runs; device positions are not checked on the host
    (that would wait for the GPU): the kernels do not read the cache there, and those
    tokens' rotated dims come out NaN (their passed-through dims as ever).

    ``inplace=True``: q and k are rotated in place (their last axis unit-stride, not
    overlapping) and returned. ``out=(q_out, k_out)``: C-contiguous arrays of q's and k's
    shapes and dtype to write (not with inplace). Otherwise new C-contiguous arrays."""
    out0, out1 = _arrays.out_pair(out, "q_out, k_out")
    packed = _rope(q, k, positions, cos_sin_cache, rotary_dim, base, style, inplace, impl, out0, out1)
    if inplace:
        return q, k
    if out0 is not None:  # (out=(None, None) asks for new arrays, as out=None)
        return out0, out1
    # q's rows then k's, C-contiguous, in the caller's array type (views: no copy)
    q_shape, k_shape = np.shape(q), np.shape(k)
    nq = q_shape[0] * q_shape[1] * q_shape[2]
    return packed[:nq].reshape(q_shape), packed[nq:].reshape(k_shape)


def _check(q, k, positions, cache, rotary_dim, base, style, inplace, impl, out0, out1):
    given = (q, k)  # what the caller passed: in place, the arrays written must be these
    q = _arrays.as_input(q, "q")
    dt = _arrays.check_dtype(q, "q", _dtypes.FLOAT_TYPES)
    _arrays.check_ndim(q, "q", ndim=3)
    tokens, _, D = q.shape
    k = _same_place(k, "k", q)
    if _dtypes.dtype_name(k.dtype) != dt:
        raise TypeError(f"k: dtype {_dtypes.dtype_name(k.dtype)} must be q's, {dt}")
    _arrays.check_ndim(k, "k", ndim=3)
    if k.shape[0] != tokens or k.shape[2] != D:
        raise ValueError(f"k: expected shape ({tokens}, kv_heads, {D}) like q's {tuple(q.shape)}, "
                         f"got {tuple(k.shape)}")
    positions = _same_place(positions, "positions", q)
    pos_dt = _arrays.check_dtype(positions, "positions", POSITION_TYPES)
    if tuple(positions.shape) != (tokens,):
        raise ValueError(f"positions: expected shape ({tokens},), one position a token, "
                         f"got {tuple(positions.shape)}")
    if rotary_dim is None:
        R = D
    elif isinstance(rotary_dim, bool) or not isinstance(rotary_dim, numbers.Integral):
        raise TypeError(f"rotary_dim: expected an int, got {type(rotary_dim).__name__}")
    else:
        R = int(rotary_dim)
    if R % 2 or not 2 <= R <= D:
        raise ValueError(f"rotary_dim: must be even and in [2, head_size={D}], got {R}")
    if isinstance(base, bool) or not isinstance(base, numbers.Real):
        raise TypeError(f"base: expected a number, got {type(base).__name__}")
    try:
        base = float(base)
    except OverflowError:  # an int past float's range
        raise ValueError("base: must be a finite number > 0, got an integer too large for a float") from None
    if not (base > 0 and np.isfinite(base)):
        raise ValueError(f"base: must be a finite number > 0, got {base}")
    if type(style) is not str:
        raise TypeError(f"style: expected 'neox' or 'gptj', got {type(style).__name__}")
    if style not in STYLES:
        raise ValueError(f"style: expected 'neox' or 'gptj', got {style!r}")
    cache_dt = "float32"
    if cache is not None:
        cache = _same_place(cache, "cos_sin_cache", q)
        cache_dt = _arrays.check_dtype(cache, "cos_sin_cache", _cache_types(dt))
        if cache.ndim != 2 or cache.shape[1] != R or cache.shape[0] < 1:
            raise ValueError(f"cos_sin_cache: expected shape (max_pos, rotary_dim={R}), got {tuple(cache.shape)}")
        if not _arrays.is_cupy(positions) and positions.size:
            lo, hi = int(positions.min()), int(positions.max())
            if lo < 0 or hi >= cache.shape[0]:
                bad = lo if lo < 0 else hi
                raise ValueError(f"positions: {bad} is outside cos_sin_cache's {cache.shape[0]} rows")
    if type(inplace) is not bool:
        raise TypeError(f"inplace: expected True or False, got {inplace!r}")
    _arrays.check_impl(impl, VARIANTS["rope"], "rope")
    if inplace and (out0 is not None or out1 is not None):
        raise ValueError("out: not with inplace=True (the results go to q and k)")
    inputs = [("q", q), ("k", k), ("positions", positions), ("cos_sin_cache", cache)]
    if out0 is not None:
        out0 = _arrays.check_out(out0, q, q.shape, q.dtype, name="out[0]")
        out1 = _arrays.check_out(out1, q, k.shape, q.dtype, name="out[1]")
        _arrays.check_no_overlap("out[0]", out0, inputs)
        _arrays.check_no_overlap("out[1]", out1, inputs + [("out[0]", out0)])
    if inplace:
        for name, a, g in (("q", q, given[0]), ("k", k, given[1])):
            if a is not g:  # (a list made into a new array: the results would go nowhere)
                raise TypeError(f"{name}: inplace=True needs an array to write into, got {type(g).__name__}")
            # (the kernels then write the caller's memory itself: _rows_view copies no other)
            if _arrays.is_cupy(a) and a.size and (a.strides[-1] != a.itemsize
                                                  or any(s % a.itemsize for s in a.strides)):
                raise ValueError(f"{name}: its last axis must be unit-stride and its strides whole elements "
                                 "for inplace=True")
            if any(st == 0 and n > 1 for n, st in zip(a.shape, a.strides)):  # (a broadcast view)
                raise ValueError(f"{name}: a zero stride would rotate one element several times "
                                 "for inplace=True")
            if not _arrays.is_cupy(a) and not a.flags.writeable:
                raise ValueError(f"{name}: must be writeable for inplace=True")
        _arrays.check_no_overlap("k", k, [("q", q)])
        _arrays.check_no_overlap("positions", positions, [("q", q), ("k", k)])
        _arrays.check_no_overlap("cos_sin_cache", cache, [("q", q), ("k", k)])
    return q, k, positions, cache, dt, pos_dt, cache_dt, R, base, out0, out1


def _same_place(a, name, q):
    """Array argument ``a`` (not None), living where q does."""
    if a is None:
        raise TypeError(f"{name}: expected an array, got None")
    a = _arrays.as_input(a, name)
    if _arrays.is_cupy(a) != _arrays.is_cupy(q):
        where = "CuPy" if _arrays.is_cupy(q) else "NumPy"
        raise TypeError(f"{name}: must live where q does ({where} array)")
    return a


def _rows_view(a, call):
    """(device array, token stride, head stride) in elements: the array itself where its
    last axis is unit-stride and its strides whole elements, else a C-contiguous copy."""
    if call is None and a.size and a.strides[-1] == a.itemsize and all(s % a.itemsize == 0 for s in a.strides):
        d = a
    else:
        d = _arrays.to_device(a, call)
        if not d.flags.c_contiguous:
            d = _arrays.cupy_module().ascontiguousarray(d)
    return d, d.strides[0] // d.itemsize, d.strides[1] // d.itemsize


@foreign_arrays(fast=_FAST)
def _rope(q, k, positions, cos_sin_cache, rotary_dim, base, style, inplace, impl, out0, out1):
    """rope on arrays (the public function's arguments, out= as two): returns q's and k's
    results packed in one new 1-D array (q's rows, then k's), or nothing where they went
    to out= or in place."""
    q, k, positions, cache, dt, pos_dt, cache_dt, R, base, out0, out1 = _check(
        q, k, positions, cos_sin_cache, rotary_dim, base, style, inplace, impl, out0, out1)
    call = None if _arrays.is_cupy(q) else _arrays.HostCall()
    cp = _arrays.cupy_module()
    tokens, hq, D = q.shape
    hkv = k.shape[1]
    qd, q_ts, q_hs = _rows_view(q, call)
    kd, k_ts, k_hs = _rows_view(k, call)
    pd = _arrays.to_device(positions, call)
    cd = _arrays.to_device(cache, call) if cache is not None else None
    packed = None
    if inplace:
        qo, ko = qd, kd
        o_strides = (q_ts, q_hs, k_ts, k_hs)
    else:
        if out0 is not None:
            qo = _arrays.device_out(out0, call, q.shape, q.dtype)
            ko = _arrays.device_out(out1, call, k.shape, q.dtype)
        else:
            packed = cp.empty(tokens * (hq + hkv) * D, q.dtype)
            qo, ko = packed, None  # the kernels put k's rows after q's
        o_strides = (hq * D, D, hkv * D, D)
    if tokens and hq + hkv:
        gptj = style == "gptj"
        strides = (q_ts, q_hs, k_ts, k_hs) + o_strides
        vec = _launch.vec_width(dt)
        # 16-byte access: every row start and every vector of a rotation on a 16-byte boundary
        layout_ok = (D % vec == 0 and (R if gptj else R // 2) % vec == 0 and all(s % vec == 0 for s in strides))
        aligned = layout_ok and not any(a.data.ptr & 15 for a in (qd, kd, qo, ko) if a is not None)
        plan = _plan(impl, dt, cache_dt, pos_dt, tokens, hq + hkv, D, R, gptj, inplace)
        args = (qd, kd, pd, _p(cd), qo, _p(ko), np.int64(tokens), np.int32(hq), np.int32(hkv), np.int32(D),
                np.int32(R), *(np.int64(s) for s in strides), np.int64(cache.shape[0] if cache is not None else 0),
                np.float64(base), np.int32(gptj), np.int32(inplace))
        _fast.launch_checked(plan.launches(args, layout_ok)[aligned])
        if call is None and qd is q and kd is k and pd is positions and cd is cache and out0 is None:
            # the caller's own arrays were read: remember the call (in place, the launches
            # name only the inputs, and the fast call's output is a token)
            result = packed if packed is not None else cp.empty((0,), q.dtype)
            _FAST.offer(lambda: _fast.build(plan.launches(args, layout_ok), (qd, kd, pd, cd), result))
            return result
    targets = (q, k) if inplace else (out0, out1) if out0 is not None else None
    return _arrays.finish_pair(packed, call, (qd, kd) if inplace else (qo, ko), targets)


_p = _arrays.arg_or_null


class RopePlan:
    """One rung's kernels of a rope signature: the launch for 16-byte access and the one
    for element access (grid, block, shared memory)."""

    __slots__ = ("fn", "fused", "geometry")

    def __init__(self, fn, fused, geometry):
        self.fn, self.fused, self.geometry = fn, fused, geometry  # geometry: (unaligned, aligned)

    def launches(self, args, layout_ok):
        """(the launch list for element access, the one for 16-byte access) with the
        kernel's arguments ``args`` (the fused rung's ``aligned`` flag appended); the second
        is the first where ``layout_ok`` is False (shapes or strides 16-byte access can't
        take, whatever the addresses)."""
        out = []
        for aligned in (False, layout_ok):
            grid, block, smem = self.geometry[aligned]
            tail = (np.int32(aligned),) if self.fused else ()
            out.append([(self.fn, grid, block, smem, args + tail)])
        return tuple(out)


_plans = {}


def _plan(impl, dt, cache_dt, pos_dt, tokens, heads, D, R, gptj, inplace):
    key = (impl, dt, cache_dt, pos_dt, tokens, heads, D, R, gptj, inplace,
           _arrays.cupy_module().cuda.runtime.getDevice())
    return _launch.memo(_plans, key, lambda: _choose(impl, dt, cache_dt, pos_dt, tokens, heads, D, R, gptj, inplace))


def _choose(impl, dt, cache_dt, pos_dt, tokens, heads, D, R, gptj, inplace):
    if impl == "naive":
        per_head = R // 2 + (0 if inplace else D - R)
        grid = (_launch.cdiv(tokens * heads * per_head, NAIVE_BLOCK),)
        g = (grid, (NAIVE_BLOCK,), 0)
        return RopePlan(KERNELS.function(_kernel("naive", dt, cache_dt, pos_dt)), False, (g, g))
    if 4 * R > _launch.DEFAULT_SMEM_LIMIT:  # the token's cos/sin would not fit in shared memory
        return _choose("naive", dt, cache_dt, pos_dt, tokens, heads, D, R, gptj, inplace)
    geometry = []
    vec = _launch.vec_width(dt)
    for aligned in (False, True):
        geometry.append(((tokens,), (fused_threads(heads, D, R, gptj, inplace, vec if aligned else 1),), 4 * R))
    return RopePlan(KERNELS.function(_kernel("fused", dt, cache_dt, pos_dt)), True, tuple(geometry))


def fused_threads(heads, D, R, gptj, inplace, unit):
    """Threads of the fused rung's block for one token's work items (its rotations and
    passed-through vectors, ``unit`` elements an access): FUSED_SLOTS items a thread, whose
    loads it issues together, in a whole number of warps, at most FUSED_MAX_THREADS (more
    items go round again)."""
    rot = (R // unit if gptj else R // 2 // unit) if unit > 1 else R // 2
    items = heads * (rot + (0 if inplace else (D - R) // unit))
    return min(FUSED_MAX_THREADS, max(32, _launch.cdiv(_launch.cdiv(items, FUSED_SLOTS), 32) * 32))
