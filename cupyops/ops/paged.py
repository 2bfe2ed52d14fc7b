"""Attention for serving over a paged KV cache (issue 19): ``attention_paged`` (decode: each
sequence's last 1..16 tokens attend to its pages), ``kv_cache_append`` (new tokens into
their pages) and ``merge_attention_states`` (two partial attentions into one through their
log-sum-exps).

A paged cache holds every sequence's keys and values in fixed-size pages of one pool,
``[num_pages, page_size, kv_heads, head_dim]`` for K and for V (the "NHD" layout of vLLM
and FlashInfer), and a block table lists each sequence's pages in order: key j of sequence
b is slot ``j % page_size`` of page ``block_table[b, j // page_size]``. The kernels are
kernels/attention_decode.cu's (launcher: _attention_decode.py): ``attention_paged`` is the
``decode`` rung of ``attention`` with its K/V rows found through the table instead of a
stride (one kernel body; a page lookup per 16 keys, made a tile ahead).

Values that live on the GPU (block_table entries, seq_lens, positions) are never read on
the host: a read would synchronise and break CUDA-graph capture. The kernels clamp or skip
bad ones instead, never reading or writing out of bounds; each function says what it does
with them. Where those arrays are NumPy arrays (a host call) their values are checked
first and a bad one raises ValueError.
"""
import math

import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _fast
from . import _attention_decode, varlen
from ._attention_problem import MAX_HEAD_DIM, AttentionProblem
from .attention import _flag, _needs_copy, _scale, _strides, addressable, check_masks, check_options, lead_strides

_PAGED = ", ".join(_attention_decode.PAGED_DTYPES)
_ALL = ", ".join(_dtypes.FLOAT_TYPES)
VARIANTS = {
    "attention_paged": {
        "decode": f"[{_PAGED}] the decode rung's split-KV kernel (cp.async ring, mma.sync, splits merged "
                  "through their LSE) reading K/V through the block table: a page lookup per 16 keys, a tile "
                  "ahead; q_len 1..16",
        "gather": f"[{_ALL}] packed chunked prefill (cu_seqlens_q): each sequence's pages copied into packed K/V "
                  "(one kernel, offsets computed on the GPU), then attention_varlen's auto rung (flash3 in one "
                  "launch on sm_90)",
    },
    "kv_cache_append": {
        "scatter": f"[{_ALL}] one thread a 16-byte chunk of a new token's row, to its page and slot",
    },
    "merge_attention_states": {
        "lse": f"[{_ALL}] one thread a 16-byte chunk of a row: the two states weighted by e^(lse - max)",
    },
}
KERNEL_FILES = [_attention_decode.KERNELS]
MAX_Q_LEN = _attention_decode.MAX_Q_LEN
PAGE_SIZES = _attention_decode.PAGE_SIZES
_INT32_MAX = 2**31 - 1


# ------------------------------------------------------------------ fast-path signatures
def _fast_spec_append(sig, k_cache, v_cache, k, v, block_table, positions):
    """kv_cache_append's fast-path signature: the layouts, where the two caches lie against
    each other (the halves of one buffer are fine; the checked path settled that layout),
    and only calls whose other arrays lie apart from both caches (the checked path refuses
    an overlap: a remembered call must not let one past)."""
    arrays = (k_cache, v_cache, k, v, block_table, positions)
    if not _fast.apart((k, v, block_table, positions), (k_cache, v_cache)):
        return None
    return tuple(sig(a) for a in arrays) + (_fast.placement(k_cache, v_cache),), arrays


# attention_paged's: the five arrays' layouts and the options, for calls with no out= or LSE;
# merge_attention_states's: the four arrays' layouts
_FAST = {"attention_paged": _fast.FastCalls(_fast.Declared(
             arrays=("q", "k_cache", "v_cache", "block_table", "seq_lens"),
             fixed=("cu_seqlens_q", "max_seqlen_q", "return_lse", "out"),
             options={"causal": bool, "scale": (type(None), float), "window": (type(None), tuple),
                      "softcap": (type(None), float), "impl": str})),
         "kv_cache_append": _fast.FastCalls(_fast_spec_append),
         "merge_attention_states": _fast.FastCalls(_fast.Declared(arrays=("o_a", "lse_a", "o_b", "lse_b")))}


# ------------------------------------------------------------------ attention_paged
@foreign_arrays(fast=_FAST["attention_paged"])
def attention_paged(q, k_cache, v_cache, block_table, seq_lens, *, cu_seqlens_q=None, max_seqlen_q=None, causal=True,
                    scale=None, window=None, softcap=None, return_lse=False, out=None, impl="auto"):
    """Attention over a paged KV cache: for each sequence b, its newest tokens attend to its
    first ``seq_lens[b]`` cached keys. Decode (q_len 1..16 tokens a sequence, q
    ``[batch, q_len, ...]``), or packed chunked prefill (``cu_seqlens_q``, below).

    q: [batch, q_len, q_heads, head_dim], q_len 1..16: the LAST q_len tokens of each
    sequence (their keys and values already in the cache, e.g. by ``kv_cache_append``).
    k_cache, v_cache: [num_pages, page_size, kv_heads, head_dim] (vLLM's and FlashInfer's
    "NHD" layout), page_size a power of two from 16 to 256; any strides with a unit-stride
    head_dim axis (so the K and V halves of one [num_pages, 2, page_size, ...] buffer
    work), never copied. block_table: int32 [batch, max_pages], key j of sequence b at
    slot j % page_size of page block_table[b, j // page_size] (any row stride: a slice
    ``block_table[:, :n]`` of a wider table is read in place). seq_lens: int32 [batch],
    tokens in the cache per sequence, the new ones included; they may all differ.

    Query row i of sequence b (of length L) sees keys j <= i + L - q_len with ``causal``
    (bottom-right aligned: the newest token sees everything), all L keys without.
    window=(left, right): row i also sees only keys i + L - q_len - left <= j <= i + L - q_len
    + right (None or -1: that side unlimited; Mistral's sliding window is (W - 1, 0));
    softcap: scaled scores capped at softcap * tanh(s / softcap) (None or 0: none). GQA/MQA:
    query head h reads kv head h // (q_heads // kv_heads). scale defaults to
    1 / sqrt(head_dim). float16 or bfloat16 (float32 math; P rounded to the input type for
    P @ V). Returns the output (q's shape and dtype), or (output, lse) with
    ``return_lse``: lse float32 [batch, q_heads, q_len], natural log, -inf (and a zero
    output row) for a row that sees no key. ``out=``: a C-contiguous array of q's shape
    and dtype to write.

    The launch is planned for the table's capacity (max_pages * page_size keys; the
    lengths stay on the GPU): a table much wider than the longest sequence splits the work
    for sequences that long, leaving blocks with nothing to do; pass the columns in use
    (``block_table[:, :pages]``) for the best plan.

    GPU-resident values are used as they are, with no host check (none can be made
    without a synchronisation): a sequence length is clamped to [0, max_pages *
    page_size], and a table entry it uses that is outside [0, num_pages) reads as a page
    of zeros (keys scoring 0, zero values); nothing is read out of bounds. NumPy
    block_table / seq_lens (a host call) are checked and raise ValueError instead.

    Packed chunked prefill: with ``cu_seqlens_q`` (int32 [batch + 1], non-decreasing, where
    q lives or on the host), q is ``[total_q, q_heads, head_dim]`` and sequence b's query
    rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` are its LAST tokens (their keys already
    in the cache), with the masks above (bottom-right causal: FlashInfer's and vLLM's chunked
    prefill). Returns the output (q's shape) or (output, lse [q_heads, total_q]), as
    ``attention_varlen``; query rows outside every sequence are zeros in a new output and
    left unwritten in ``out=``. The ``gather`` rung copies each sequence's pages into
    packed K/V arrays, then runs ``attention_varlen``'s auto rung: a copy of the keys and
    values the call reads (memory: ``batch * max_pages * page_size`` rows of K and of V
    where seq_lens is on the GPU, the lengths' sum where it is a NumPy array, and 256
    more), small beside the prefill's arithmetic. ``max_seqlen_q``: the longest query
    chunk; given, with GPU-resident offsets, nothing is read on the host (else the offsets
    are read and checked, a synchronisation). float16, bfloat16 and float32."""
    if cu_seqlens_q is not None:
        return _paged_prefill(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, causal, scale,
                              window, softcap, return_lse, out, impl)
    if max_seqlen_q is not None:
        raise ValueError("max_seqlen_q: only with cu_seqlens_q (packed chunked prefill)")
    if impl == "gather":
        raise ValueError("impl: 'gather' runs packed chunked prefill: give cu_seqlens_q (and q [total_q, q_heads, "
                         "head_dim])")
    q = _arrays.as_input(q, "q")
    dt = _arrays.check_dtype(q, "q", _dtypes.FLOAT_TYPES)
    if dt not in _attention_decode.PAGED_DTYPES:
        raise TypeError(f"q: attention_paged supports {_PAGED}, got {dt}")
    _arrays.check_ndim(q, "q", ndim=4)
    B, Sq, Hq, D = q.shape
    k_cache, v_cache, num_pages, P, Hkv = _caches(k_cache, v_cache, q, "q", D)
    if not 1 <= Sq <= MAX_Q_LEN:
        raise ValueError(f"q: q_len (axis 1) must be in 1..{MAX_Q_LEN} (decode), got {Sq}; for longer chunks "
                         "pass q packed [total_q, q_heads, head_dim] with cu_seqlens_q")
    _check_heads(q, D, Hq, Hkv)
    block_table, seq_lens = _per_sequence(block_table, seq_lens, "seq_lens", q, "q", B)
    max_pages = block_table.shape[1]
    capacity = _capacity(max_pages, P)
    causal = _flag(causal, "causal")
    scale = 1.0 / math.sqrt(D) if scale is None else _scale(scale)
    masks = check_masks(window, softcap, causal, Sq + capacity)
    return_lse = _flag(return_lse, "return_lse")
    _arrays.check_impl(impl, VARIANTS["attention_paged"], "attention_paged")
    out = _check_out(out, q, k_cache, v_cache, block_table, seq_lens)
    host = not _arrays.is_cupy(q)
    if host:
        _check_host_pages(block_table, seq_lens, None, P, num_pages, "seq_lens")
    launches = B * Hq > 0
    if launches:  # the GPU's own limit (shared memory a block): before anything is allocated
        reason = _attention_decode.paged_supports(_problem(
            dt, (B, Hq, Hkv, Sq, capacity, D), [q, k_cache, v_cache], q, None, scale, causal, masks))
        if reason:
            raise ValueError(f"impl: 'decode' cannot run this problem: {reason}")

    call = _arrays.HostCall() if host else None
    cp = _arrays.cupy_module()
    y = _arrays.device_out(out, call, q.shape, q.dtype)
    lse = cp.empty((B, Hq, Sq), dtype=np.float32) if return_lse else None
    if launches:
        if host:
            qd, kd, vd, btd, sld = (_arrays.to_device(x, call) for x in (q, k_cache, v_cache, block_table, seq_lens))
        else:
            qd = addressable(q)
            kd, vd = k_cache, v_cache
            btd, sld = addressable(block_table), addressable(seq_lens)
        pp = _attention_decode.PagedProblem(
            problem=_problem(dt, (B, Hq, Hkv, Sq, capacity, D), [qd, kd, vd], y, lse, scale, causal, masks),
            block_table=btd, bt_stride=btd.strides[0] // 4 if max_pages and B > 1 else 0, seq_lens=sld,
            page_shift=P.bit_length() - 1, num_pages=num_pages)
        _attention_decode.launch_paged(pp)
        if not host and out is None and not return_lse and qd is q and btd is block_table and sld is seq_lens:
            arrays = (q, k_cache, v_cache, block_table, seq_lens)
            _FAST["attention_paged"].offer(
                lambda: _fast.build_from_launcher(_attention_decode.paged_launches(pp), arrays, y))
    result = _arrays.finish(y, out, call)
    if not return_lse:
        return result
    return result, _arrays.finish(lse, None, call)


def _check_out(out, q, k_cache, v_cache, block_table, seq_lens):
    """out= checked: q's shape and dtype, sharing no memory with the other operands."""
    out = _arrays.check_out(out, q, q.shape, q.dtype)
    _arrays.check_no_overlap("out", out, [("k_cache", k_cache), ("v_cache", v_cache),
                                          ("block_table", block_table), ("seq_lens", seq_lens)])
    return out


def _check_heads(q, D, Hq, Hkv):
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"q: head_dim must be in 1..{MAX_HEAD_DIM}, got {D} (shape {tuple(q.shape)})")
    if Hq % Hkv:
        raise ValueError(f"k_cache: kv_heads ({Hkv}) must divide q_heads ({Hq}): each kv head serves "
                         "q_heads // kv_heads query heads")


def _paged_prefill(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, causal, scale, window,
                   softcap, return_lse, out, impl):
    """attention_paged with cu_seqlens_q (the ``gather`` rung; see attention_paged): every
    argument checked first, then the pages gathered and attention_varlen run."""
    q = _arrays.as_input(q, "q")
    dt = _arrays.check_dtype(q, "q", _dtypes.FLOAT_TYPES)
    if q.ndim != 3:
        raise ValueError(f"q: with cu_seqlens_q, q is packed [total_q, q_heads, head_dim], got shape {tuple(q.shape)}")
    total_q, Hq, D = q.shape
    k_cache, v_cache, num_pages, P, Hkv = _caches(k_cache, v_cache, q, "q", D)
    _check_heads(q, D, Hq, Hkv)
    cu_q = varlen.check_offsets(cu_seqlens_q, "cu_seqlens_q", q)
    B = cu_q.shape[0] - 1
    if B > _attention_decode.MAX_GATHER_SEQUENCES:
        raise ValueError(f"cu_seqlens_q: at most {_attention_decode.MAX_GATHER_SEQUENCES} sequences, got {B}")
    block_table, seq_lens = _per_sequence(block_table, seq_lens, "seq_lens", q, "cu_seqlens_q", B)
    max_pages = block_table.shape[1]
    capacity = _capacity(max_pages, P)
    max_q = varlen.check_max_len(max_seqlen_q, "max_seqlen_q", total_q)
    causal, scale, return_lse = check_options(causal, "bottom_right", scale, return_lse, D)
    check_masks(window, softcap, causal, total_q + capacity)
    _arrays.check_impl(impl, VARIANTS["attention_paged"], "attention_paged")
    if impl not in ("auto", "gather"):
        raise ValueError(f"impl: {impl!r} takes q [batch, q_len, q_heads, head_dim] without cu_seqlens_q; packed "
                         "chunked prefill runs 'gather'")
    out = _check_out(out, q, k_cache, v_cache, block_table, seq_lens)
    host = not _arrays.is_cupy(q)
    if not _arrays.is_cupy(cu_q):  # (host offsets: checked here, before anything runs)
        varlen.host_offsets(cu_q, "cu_seqlens_q", total_q, max_q, "max_seqlen_q")
    if host:
        _check_host_pages(block_table, seq_lens, None, P, num_pages, "seq_lens")
        lens = seq_lens.astype(np.int64)
        cu_k = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)  # (the kernel's, known here)
        rows, max_k = int(cu_k[-1]), int(lens.max(initial=0))
    else:  # the lengths stay on the GPU: room for every sequence at the table's capacity
        rows, cu_k, max_k = B * capacity, None, capacity if B else 0
    rows += _attention_decode.GATHER_TAIL_ROWS  # (zeros after the last sequence, written by the gather)
    if rows > _INT32_MAX:
        raise ValueError(f"block_table: {B} sequences of up to {capacity} keys exceed {_INT32_MAX} gathered rows; "
                         "pass the columns in use (block_table[:, :pages]) or NumPy seq_lens")

    call = _arrays.HostCall() if host else None
    cp = _arrays.cupy_module()
    kp = cp.empty((rows, Hkv, D), k_cache.dtype)
    vp = cp.empty((rows, Hkv, D), k_cache.dtype)
    cu_kd = cp.empty((B + 1,), np.int32) if B else cp.zeros((1,), np.int32)  # (the gather writes every entry)
    if B:
        kc, vc, btd, sld = ((_arrays.to_device(x, call) for x in (k_cache, v_cache, block_table, seq_lens)) if host
                            else (k_cache, v_cache, addressable(block_table), addressable(seq_lens)))
        strides = (*_strides(kc, "bshd"), *_strides(vc, "bshd"), btd.strides[0] // 4 if max_pages and B > 1 else 0)
        _fast.launch_checked(*_attention_decode.gather_launches(
            dt, kc, vc, kp, vp, cu_kd, btd, sld, (B, Hkv, D, rows, num_pages, max_pages), strides, P.bit_length() - 1))
    # host: q (and out=, whose rows outside every sequence stay as they are) to the device,
    # the offsets as NumPy arrays (attention_varlen reads them there), the result brought
    # back below; device: the caller's out= written in place
    if host:
        yd = _arrays.to_device(out, call) if out is not None else None
    else:
        yd = out
    r = varlen.attention_varlen(_arrays.to_device(q, call) if host else q, kp, vp, cu_q, cu_k if host else cu_kd,
                                max_seqlen_q=max_q, max_seqlen_k=max_k, causal=causal, causal_align="bottom_right",
                                scale=scale, window=window, softcap=softcap, return_lse=return_lse, out=yd)
    if not host:
        return r
    y, lse = r if return_lse else (r, None)
    result = _arrays.finish(y, out, call)
    return (result, _arrays.finish(lse, None, call)) if return_lse else result


def _problem(dt, dims, qkv, o, lse, scale, causal, masks):
    """The AttentionProblem of a paged launch: the caches' (page, slot, head) strides where
    attention has (batch, seq, head), Skv the table's capacity (the kernel takes each
    sequence's offset, for the causal mask and the window, from its own length)."""
    B, Hq, Hkv, Sq, capacity, D = dims
    q, k, v = qkv
    return AttentionProblem(
        dtype=dt, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Skv=capacity, D=D, Q=q, K=k, V=v, O=o, LSE=lse,
        q_strides=_strides(q, "bshd"), k_strides=_strides(k, "bshd"), v_strides=_strides(v, "bshd"),
        o_strides=_strides(o, "bshd"), scale=scale, causal=causal, causal_offset=0,
        window_left=masks.window_left, window_right=masks.window_right, softcap=masks.softcap)


# ------------------------------------------------------------------ kv_cache_append
def kv_cache_append(k_cache, v_cache, k, v, block_table, positions):
    """Write new tokens' keys and values into their pages of a paged cache, in place.

    k_cache, v_cache: [num_pages, page_size, kv_heads, head_dim] (as ``attention_paged``
    reads them; written in place, never copied: any strides with a unit-stride head_dim
    axis; NumPy caches are updated in place too). k, v: [batch, n_new, kv_heads, head_dim],
    the caches' dtype. block_table: int32 [batch, max_pages]; positions: int32 [batch].
    Token i of sequence b goes to position p = positions[b] + i of that sequence: slot
    p % page_size of page block_table[b, p // page_size]. For decode, positions[b] is the
    sequence's length before the new tokens (then seq_lens = positions + n_new for
    ``attention_paged``). Returns None.

    vLLM's ``reshape_and_cache`` takes the same tokens flattened ([num_tokens, heads,
    head_dim]) with a precomputed ``slot_mapping`` (page * page_size + slot); FlashInfer's
    ``append_paged_kv_cache`` takes them packed with per-token batch indices and positions.
    Here the batch is dense (n_new tokens each) and the slot comes from the table.

    GPU-resident positions and table entries are used unchecked (no synchronisation): a
    token whose position falls outside [0, max_pages * page_size), or whose page entry is
    outside [0, num_pages), is not written; nothing is written out of bounds. Two tokens
    mapped to one slot leave an unspecified mix of them. NumPy positions / block_table (a host call) are
    checked and raise ValueError instead, as does an array sharing memory with a cache.
    k_cache and v_cache may be the two halves of one buffer, but must not share
    elements."""
    _kv_cache_append(k_cache, v_cache, k, v, block_table, positions)


@foreign_arrays(fast=_FAST["kv_cache_append"])
def _kv_cache_append(k_cache, v_cache, k, v, block_table, positions):
    """kv_cache_append on arrays; returns a token (an empty array: the fast path's result)
    for device caches, None for NumPy ones."""
    k = _arrays.as_input(k, "k")
    dt = _arrays.check_dtype(k, "k", _dtypes.FLOAT_TYPES)
    _arrays.check_ndim(k, "k", ndim=4)
    B, N, H, D = k.shape
    k_cache, v_cache, num_pages, P, Hkv = _caches(k_cache, v_cache, k, "k", D, written=True)
    if H != Hkv:
        raise ValueError(f"k: kv_heads {H} does not match k_cache's {Hkv}")
    v = _like(v, "v", k, "k", k.shape)
    block_table, positions = _per_sequence(block_table, positions, "positions", k, "k", B)
    max_pages = block_table.shape[1]
    _capacity(max_pages, P)
    host = not _arrays.is_cupy(k)
    # (element by element: the K and V halves of one [num_pages, 2, ...] buffer interleave)
    _arrays.check_no_overlap("v_cache", v_cache, [("k_cache", k_cache)])
    for x, name in ((k, "k"), (v, "v"), (block_table, "block_table"), (positions, "positions")):
        _arrays.check_no_overlap(name, x, [("k_cache", k_cache), ("v_cache", v_cache)])
    if host:
        _check_host_pages(block_table, positions, N, P, num_pages, "positions")
    if not B * N * H:
        return None if host else _arrays.cupy_module().empty((0,), k_cache.dtype)

    call = _arrays.HostCall() if host else None
    cp = _arrays.cupy_module()
    if host:
        kc, vc, kd, vd, btd, pd = (_arrays.to_device(x, call) for x in (k_cache, v_cache, k, v, block_table, positions))
    else:
        kc, vc = k_cache, v_cache
        kd, vd, btd, pd = (addressable(x) for x in (k, v, block_table, positions))
    strides = (*_strides(kc, "bshd"), *_strides(vc, "bshd"), *_strides(kd, "bshd"), *_strides(vd, "bshd"),
               btd.strides[0] // 4 if max_pages and B > 1 else 0)
    launches = _attention_decode.append_launches(dt, kc, vc, kd, vd, btd, pd, (B, N, H, D, num_pages, max_pages),
                                                 strides, P.bit_length() - 1)
    _fast.launch_checked(*launches)
    if host:  # the results back into the caller's caches (the one synchronisation)
        _arrays.finish(kc, k_cache, call)
        _arrays.finish(vc, v_cache, call)
        return None
    token = cp.empty((0,), k_cache.dtype)
    if kd is k and vd is v and btd is block_table and pd is positions:
        arrays = (k_cache, v_cache, k, v, block_table, positions)
        _FAST["kv_cache_append"].offer(lambda: _fast.build_from_launcher(launches, arrays, token))
    return token


# ------------------------------------------------------------------ merge_attention_states
def merge_attention_states(o_a, lse_a, o_b, lse_b):
    """Combine two partial attentions of the same query rows, over disjoint key sets A and B,
    into the attention over A and B (FlashInfer's ``merge_state``; the split-KV merge).

    o_a, o_b: [tokens, heads, head_dim], one float dtype, each normalised by its own
    softmax sum; lse_a, lse_b: float32 [tokens, heads], the natural-log log-sum-exp of each
    side's scaled scores (as ``attention(..., return_lse=True)`` and FlashAttention give
    them, and vLLM's ``merge_attn_states`` takes them; FlashInfer's own kernels return base
    2 by default: multiply those by ln 2 first). Any strides (a transposed [heads, tokens]
    LSE view works). Returns (o, lse) as new arrays, o of o_a's dtype, lse float32:

        M = max(lse_a, lse_b), w = exp(lse - M),
        o = (w_a o_a + w_b o_b) / (w_a + w_b), lse = M + log(w_a + w_b),

    in float32. A side with lse -inf (it saw no key) leaves the other side's o and lse
    unchanged, bit for bit, whatever its own o holds; both -inf give o = 0 and lse -inf."""
    packed = _merge_packed(o_a, lse_a, o_b, lse_b)
    # views of the one buffer in the caller's framework (NumPy, CuPy, torch: each has
    # .view(dtype) of a byte slice; the dtypes are the inputs' own, checked above)
    o_dtype = o_a.dtype if hasattr(o_a, "dtype") else np.asarray(o_a).dtype
    T, H, D = o_a.shape if hasattr(o_a, "shape") else np.shape(o_a)
    rows = T * H
    at = _attention_decode.merge_states_lse_offset(rows, D, o_dtype.itemsize)
    o = packed[:rows * D * o_dtype.itemsize].view(o_dtype).reshape(T, H, D)
    lse = packed[at:at + 4 * rows].view(lse_a.dtype if hasattr(lse_a, "dtype") else np.float32).reshape(T, H)
    return o, lse


@foreign_arrays(fast=_FAST["merge_attention_states"])
def _merge_packed(o_a, lse_a, o_b, lse_b):
    """merge_attention_states on arrays: o, then (16-byte aligned) lse, in one uint8 array
    (one result, so the fast path can make it)."""
    o_a = _arrays.as_input(o_a, "o_a")
    dt = _arrays.check_dtype(o_a, "o_a", _dtypes.FLOAT_TYPES)
    _arrays.check_ndim(o_a, "o_a", ndim=3)
    T, H, D = o_a.shape
    if D < 1:
        raise ValueError(f"o_a: head_dim (axis 2) must be at least 1, got shape {tuple(o_a.shape)}")
    o_b = _like(o_b, "o_b", o_a, "o_a", (T, H, D))
    lses = []
    for x, name in ((lse_a, "lse_a"), (lse_b, "lse_b")):
        x = _arrays.as_input(x, name)
        if _arrays.is_cupy(x) != _arrays.is_cupy(o_a):
            raise TypeError(f"{name}: must live where o_a does (both CuPy or both NumPy arrays)")
        if x.dtype != np.float32:
            raise TypeError(f"{name}: expected float32, got {_dtypes.dtype_name(x.dtype)}")
        if tuple(x.shape) != (T, H):
            raise ValueError(f"{name}: expected shape {(T, H)} (o_a's tokens, heads), got {tuple(x.shape)}")
        lses.append(x)
    lse_a, lse_b = lses
    host = not _arrays.is_cupy(o_a)
    call = _arrays.HostCall() if host else None
    cp = _arrays.cupy_module()
    rows = T * H
    item = o_a.itemsize
    at = _attention_decode.merge_states_lse_offset(rows, D, item)
    packed = cp.empty((at + 4 * rows,), np.uint8)
    if rows:
        if host:
            ops = [_arrays.to_device(x, call) for x in (o_a, lse_a, o_b, lse_b)]
        else:
            ops = [addressable(x) for x in (o_a, lse_a, o_b, lse_b)]
        oa, la, ob, lb = ops
        strides = (*lead_strides(oa, 2), *lead_strides(ob, 2), *lead_strides(la, 2), *lead_strides(lb, 2))
        launches = _attention_decode.merge_states_launches(dt, oa, la, ob, lb, packed, T, H, D, strides)
        _fast.launch_checked(*launches)
        if not host and all(x is y for x, y in zip(ops, (o_a, lse_a, o_b, lse_b))):
            arrays = (o_a, lse_a, o_b, lse_b)
            _FAST["merge_attention_states"].offer(lambda: _fast.build_from_launcher(launches, arrays, packed))
    return _arrays.finish(packed, None, call)


# ------------------------------------------------------------------ shared checks
def _like(x, name, like, like_name, shape=None):
    """``x`` as an array that lives where ``like`` does and has its dtype, and ``shape``
    where given (v against k, o_b against o_a, the caches against q or k)."""
    x = _arrays.as_input(x, name)
    if _arrays.is_cupy(x) != _arrays.is_cupy(like):
        raise TypeError(f"{name}: must live where {like_name} does (both CuPy or both NumPy arrays)")
    dt = _dtypes.dtype_name(like.dtype)
    if _dtypes.dtype_name(x.dtype) != dt:
        raise TypeError(f"{name}: dtype {_dtypes.dtype_name(x.dtype)} does not match {like_name}'s {dt}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected {like_name}'s shape {tuple(shape)}, got {tuple(x.shape)}")
    return x


def _caches(k_cache, v_cache, like, like_name, D, written=False):
    """k_cache and v_cache checked against ``like`` (q or k: residence, dtype, head_dim D):
    (k_cache, v_cache, num_pages, page_size, kv_heads)."""
    out = []
    for x, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        x = _like(x, name, like, like_name)
        _arrays.check_ndim(x, name, ndim=4)
        out.append(x)
    k_cache, v_cache = out
    num_pages, P, Hkv, Dk = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache: expected k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if P not in PAGE_SIZES:
        raise ValueError(f"k_cache: page_size (axis 1) must be a power of two in 16..256, got {P}")
    if Dk != D:
        raise ValueError(f"k_cache: head_dim {Dk} does not match {like_name}'s {D}")
    if Hkv < 1:
        raise ValueError(f"k_cache: needs at least one kv head, got shape {tuple(k_cache.shape)}")
    if num_pages < 1:
        raise ValueError(f"k_cache: needs at least one page, got shape {tuple(k_cache.shape)}")
    for x, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if _arrays.is_cupy(x) and _needs_copy(x):
            raise ValueError(f"{name}: needs a unit-stride head_dim axis and non-negative strides (a KV cache "
                             f"is never copied), got strides {x.strides}")
        if written and not _arrays.is_cupy(x) and not x.flags.writeable:
            raise ValueError(f"{name}: must be writeable (tokens are written into it)")
    return k_cache, v_cache, num_pages, P, Hkv


def _per_sequence(block_table, values, name, like, like_name, B):
    """block_table (int32 [B, max_pages]) and ``values`` (int32 [B]: seq_lens, positions),
    checked against ``like``'s batch B: a row and a value a sequence."""
    block_table = _int_array(block_table, "block_table", like, 2)
    if block_table.shape[0] != B:
        raise ValueError(f"block_table: expected {B} rows ({like_name}'s batch), got shape "
                         f"{tuple(block_table.shape)}")
    values = _int_array(values, name, like, 1)
    if tuple(values.shape) != (B,):
        raise ValueError(f"{name}: expected shape ({B},) ({like_name}'s batch), got {tuple(values.shape)}")
    return block_table, values


def _int_array(x, name, like, ndim):
    x = _arrays.as_input(x, name)
    if _arrays.is_cupy(x) != _arrays.is_cupy(like):
        raise TypeError(f"{name}: must live where the caches do (both CuPy or both NumPy arrays)")
    if x.dtype != np.int32:
        raise TypeError(f"{name}: expected int32, got {_dtypes.dtype_name(x.dtype)}")
    _arrays.check_ndim(x, name, ndim=ndim)
    return x


# The kernels count keys in int32, and look a few tiles past a sequence's end (a page
# look-ahead of up to 2 tiles and a group of 64 keys): the capacity leaves that headroom.
_KEY_HEADROOM = 1024


def _capacity(max_pages, P):
    capacity = max_pages * P
    if capacity > _INT32_MAX - _KEY_HEADROOM:
        raise ValueError(f"block_table: {max_pages} pages of {P} tokens exceed "
                         f"{_INT32_MAX - _KEY_HEADROOM} tokens a sequence")
    return capacity


def _check_host_pages(block_table, starts, n_new, P, num_pages, name):
    """Host (NumPy) block table and lengths (n_new None: ``starts`` are seq_lens) or
    positions (tokens starts[b] .. starts[b] + n_new - 1): ValueError naming the argument
    for a length or position outside the table's capacity, or a page in use outside
    [0, num_pages)."""
    max_pages = block_table.shape[1]
    capacity = max_pages * P
    s = starts.astype(np.int64)
    lo, hi = (np.zeros_like(s), s) if n_new is None else (s, s + n_new)
    bad = np.flatnonzero((s < 0) | (hi > capacity)) if s.size and (n_new is None or n_new) else []
    if len(bad):
        b = int(bad[0])
        what = (f"seq_lens[{b}] = {s[b]} is outside 0..{capacity}" if n_new is None else
                f"positions[{b}] = {s[b]} puts its {n_new} new tokens outside 0..{capacity - 1}")
        raise ValueError(f"{name}: {what} (block_table's {max_pages} pages of {P} tokens)")
    if not s.size or not max_pages:
        return
    page = np.arange(max_pages)[None, :]
    used = (page >= lo[:, None] // P) & (page < -(-hi[:, None] // P)) & (hi[:, None] > lo[:, None])
    wrong = used & ((block_table < 0) | (block_table >= num_pages))
    if wrong.any():
        b, j = (int(i) for i in np.argwhere(wrong)[0])
        raise ValueError(f"block_table: block_table[{b}, {j}] = {block_table[b, j]} is not a page of the cache "
                         f"(0..{num_pages - 1}), and sequence {b} uses it")
