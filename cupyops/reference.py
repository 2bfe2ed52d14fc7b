"""NumPy float64 references for every operator: the ground truth of the tests and of the
benchmark's validation step. Inputs may be NumPy or CuPy arrays (copied to the host);
results are float64 NumPy arrays (integer sums stay exact in int64/Python ints)."""
import builtins
import math

import numpy as np


def _host(a):
    if type(a).__module__.startswith("cupy"):
        a = a.get()
    return np.asarray(a)


def _f64(a):
    return _host(a).astype(np.float64)


def trace(a):
    a = _host(a)
    if a.dtype.kind in "iu":
        return np.trace(a.astype(np.int64))
    return np.trace(a.astype(np.float64))


def sum(x, axis=None):  # noqa: A001 - mirrors the operator's name
    x = _host(x)
    if x.dtype.kind in "iu":
        return np.sum(x.astype(np.int64), axis=axis)
    return np.sum(x.astype(np.float64), axis=axis)


def max(x, axis=None):  # noqa: A001
    x = _host(x)
    if x.dtype.kind in "iu":
        return np.max(x, axis=axis)
    return np.max(x.astype(np.float64), axis=axis)


def softmax(x, axis=-1):
    x = _f64(x)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Returns (y, mean, rstd) over the last axis."""
    x = _f64(x)
    mean = x.mean(axis=-1)
    var = ((x - mean[..., None]) ** 2).mean(axis=-1)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean[..., None]) * rstd[..., None]
    if weight is not None:
        y = y * _f64(weight)
    if bias is not None:
        y = y + _f64(bias)
    return y, mean, rstd


def rms_norm(x, weight=None, eps=1e-6):
    x = _f64(x)
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1) + eps)
    y = x * rstd[..., None]
    if weight is not None:
        y = y * _f64(weight)
    return y


def add_rms_norm(x, residual, weight=None, eps=1e-6):
    """Returns (normed, s): s = x + residual rounded to x's dtype (as the operator and
    PyTorch's ``x + residual`` give it), then RMSNorm of that rounded s in float64."""
    xh = _host(x)
    s = (xh.astype(np.float64) + _f64(residual)).astype(xh.dtype).astype(np.float64)
    return rms_norm(s, weight, eps), s


def _erfc(v):
    try:
        from scipy.special import erfc
    except ImportError:  # NumPy has no erfc of its own
        import math

        erfc = np.vectorize(math.erfc, otypes=[np.float64])
    return erfc(v)


def silu_and_mul(x):
    """silu(a) * b for x = [a | b] along the last axis, in float64."""
    x = _f64(x)
    d = x.shape[-1] // 2
    a, b = x[..., :d], x[..., d:]
    with np.errstate(over="ignore"):
        return a / (1.0 + np.exp(-a)) * b


def gelu_and_mul(x, approximate="none"):
    """gelu(a) * b for x = [a | b] along the last axis, in float64; approximate "none"
    (erf) or "tanh", as torch.nn.functional.gelu."""
    x = _f64(x)
    d = x.shape[-1] // 2
    a, b = x[..., :d], x[..., d:]
    # 1 + erf(z) as erfc(-z), 1 + tanh(u) as 2 / (1 + exp(-2u)): the sums cancel for a << 0
    # even in float64 (a = -8: 1 + erf keeps one digit)
    if approximate == "tanh":
        u = np.sqrt(2.0 / np.pi) * (a + 0.044715 * a**3)
        with np.errstate(over="ignore"):
            g = a / (1.0 + np.exp(-2.0 * u))
    elif approximate == "none":
        g = 0.5 * a * _erfc(-a / np.sqrt(2.0))
    else:
        raise ValueError(f"approximate: 'none' or 'tanh', got {approximate!r}")
    return g * b


def rope_cos_sin(positions, rotary_dim, base=10000.0, cos_sin_cache=None):
    """(cos, sin), each [tokens, rotary_dim / 2] float64: the rows of cos_sin_cache at the
    positions (NaN for a position outside its rows, as the operator gives on the device),
    or the cos and sin in float64 of the operator's float32 angle float32(p) *
    float32(base ** (-2i / rotary_dim))."""
    pos = _host(positions).astype(np.int64)
    half = rotary_dim // 2
    if cos_sin_cache is not None:
        cache = _f64(cos_sin_cache)
        inside = (pos >= 0) & (pos < cache.shape[0])
        rows = cache[np.where(inside, pos, 0)]
        rows[~inside] = np.nan
        return rows[:, :half], rows[:, half:]
    inv_freq = (float(base) ** (-(2.0 * np.arange(half)) / rotary_dim)).astype(np.float32)
    angle = (pos.astype(np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)  # a float32 product
    return np.cos(angle), np.sin(angle)


def rope(q, k, positions, rotary_dim=None, base=10000.0, style="neox", cos_sin_cache=None):
    """(q, k) rotated, float64, cupyops.rope's semantics: q [tokens, q_heads, D], k
    [tokens, kv_heads, D]; the pairs (x[i], x[i + R/2]) (neox) or (x[2i], x[2i + 1]) (gptj)
    of the first R = rotary_dim dims turn by the angle of rope_cos_sin; dims [R, D) pass."""
    q, k = _f64(q), _f64(k)
    R = q.shape[-1] if rotary_dim is None else rotary_dim
    cos, sin = rope_cos_sin(positions, R, base, cos_sin_cache)
    c, s = cos[:, None, :], sin[:, None, :]

    def turn(x):
        out = x.copy()
        if style == "neox":
            first, second = slice(0, R // 2), slice(R // 2, R)
        elif style == "gptj":
            first, second = slice(0, R, 2), slice(1, R, 2)
        else:
            raise ValueError(f"style: 'neox' or 'gptj', got {style!r}")
        a, b = x[..., first], x[..., second]
        out[..., first] = a * c - b * s
        out[..., second] = b * c + a * s
        return out

    return turn(q), turn(k)


def matmul(a, b):
    """numpy.matmul in float64 (int8 operands: exactly, in int64)."""
    a, b = _host(a), _host(b)
    if a.dtype.kind in "iu":
        return np.matmul(a.astype(np.int64), b.astype(np.int64))
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def gemm(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False):
    """alpha * op(a) @ op(b) + beta * c, op = transpose of the last two axes when asked.
    int8 operands: exact in int64, then wrapped to int32 as the kernels' two's-complement
    arithmetic does."""
    a, b = _host(a), _host(b)
    if trans_a:
        a = np.swapaxes(a, -1, -2)
    if trans_b:
        b = np.swapaxes(b, -1, -2)
    exact = a.dtype.kind in "iu"
    if exact:
        alpha, beta = int(alpha), int(beta)
    y = alpha * matmul(a, b)
    if c is not None and beta != 0:
        y = y + beta * _host(c).astype(np.int64 if exact else np.float64)
    if exact:
        return (y & 0xFFFFFFFF).astype(np.uint32).view(np.int32)  # wraps modulo 2^32
    return y


def attention_mask(Sq, Skv, causal=False, offset=0, window=None):
    """The keys each query row sees, bool [Sq, Skv]: row i sees key j iff j <= i + offset
    under ``causal`` and i + offset - left <= j <= i + offset + right under ``window`` (left,
    right) (None or -1: that side unlimited). ``offset``: 0 for "top_left", kv_len - q_len
    for "bottom_right" (any int: the kernels' causal_offset)."""
    left, right = window if window is not None else (None, None)
    left, right = (None if w is None or w == -1 else w for w in (left, right))
    pos, key = np.arange(Sq)[:, None] + offset, np.arange(Skv)[None, :]
    seen = np.ones((Sq, Skv), dtype=bool)
    if causal:
        seen &= key <= pos
    if right is not None:
        seen &= key <= pos + right
    if left is not None:
        seen &= key >= pos - left
    return seen


def attention(q, k, v, causal=False, causal_align="top_left", scale=None, layout="bshd",
              return_lse=False, window=None, softcap=None):
    """Scaled dot-product attention in float64, with cupyops.attention's semantics: layout
    "bshd" ([batch, len, heads, head_dim]) or "bhsd"; GQA/MQA (query head h reads kv head
    h // (q_heads // kv_heads)); causal: query i sees key j iff j <= i + offset, offset 0
    ("top_left") or kv_len - q_len ("bottom_right"); window (left, right): only keys
    i + offset - left <= j <= i + offset + right (None or -1: that side unlimited), with the
    same offset; softcap c > 0: each scaled score s becomes c * tanh(s / c). A query that
    sees no key gets zeros and LSE -inf. Returns out (q's layout) or (out, lse [batch,
    q_heads, q_len])."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    if layout == "bshd":  # work in [batch, heads, len, head_dim]
        q, k, v = (np.swapaxes(x, 1, 2) for x in (q, k, v))
    elif layout != "bhsd":
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    Sq, D = q.shape[2], q.shape[3]
    Skv = k.shape[2]
    group = q.shape[1] // k.shape[1] if k.shape[1] else 1
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    s = scale * np.matmul(q, np.swapaxes(k, -1, -2))  # [B, Hq, Sq, Skv]
    if softcap:
        s = softcap * np.tanh(s / softcap)
    seen = attention_mask(Sq, Skv, causal, Skv - Sq if causal_align == "bottom_right" else 0, window)
    s = np.where(seen, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    m_safe = np.where(np.isneginf(m), 0.0, m)  # rows that see nothing: exp(-inf) = 0, no NaN
    e = np.exp(s - m_safe)
    l = np.sum(e, axis=-1, keepdims=True)
    p = e / np.where(l > 0, l, 1.0)
    out = np.matmul(p, v)
    with np.errstate(divide="ignore"):
        lse = (m_safe + np.log(l))[..., 0]  # log(0) = -inf for rows that see nothing
    if layout == "bshd":
        out = np.swapaxes(out, 1, 2)
    return (out, lse) if return_lse else out


def paged_kv(k_cache, v_cache, block_table, seq_len, b):
    """Sequence b's keys and values gathered from a paged cache, float64 [seq_len, kv_heads,
    head_dim] each: key j is slot j % page_size of page block_table[b, j // page_size]."""
    kc, vc = _f64(k_cache), _f64(v_cache)
    j = np.arange(int(seq_len))
    pages = _host(block_table)[b, j // kc.shape[1]]
    return kc[pages, j % kc.shape[1]], vc[pages, j % kc.shape[1]]


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, causal_align="bottom_right", scale=None,
                     return_lse=False, window=None, softcap=None):
    """cupyops.attention_varlen in float64: each packed sequence (rows cu_seqlens[b] ..
    cu_seqlens[b + 1] - 1 of q and of k, v) through ``attention``. Rows outside every
    sequence are zeros (LSE -inf). Returns out [total_q, q_heads, head_dim] or (out, lse
    [q_heads, total_q])."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    cq, ck = _host(cu_seqlens_q).astype(np.int64), _host(cu_seqlens_k).astype(np.int64)
    out = np.zeros(q.shape)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if q1 == q0:
            continue
        o, l_b = attention(q[q0:q1][None], k[k0:k1][None], v[k0:k1][None], causal=causal, causal_align=causal_align,
                           scale=scale, return_lse=True, window=window, softcap=softcap)
        out[q0:q1], lse[:, q0:q1] = o[0], l_b[0]
    return (out, lse) if return_lse else out


def attention_paged(q, k_cache, v_cache, block_table, seq_lens, causal=True, scale=None, return_lse=False,
                    window=None, softcap=None, cu_seqlens_q=None):
    """cupyops.attention_paged in float64: each sequence's pages gathered into contiguous K/V
    (paged_kv) and attended to by its q_len rows, the sequence's last tokens (bottom-right
    causal). Returns out [batch, q_len, q_heads, head_dim] or (out, lse [batch, q_heads,
    q_len]); with ``cu_seqlens_q`` (q packed [total_q, q_heads, head_dim]) as
    attention_varlen: out [total_q, ...], lse [q_heads, total_q], rows outside every
    sequence zeros (LSE -inf)."""
    q = _f64(q)
    lens = _host(seq_lens)
    if cu_seqlens_q is not None:  # every sequence's pages packed, then attention_varlen
        kv = [paged_kv(k_cache, v_cache, block_table, lens[b], b) for b in range(len(lens))]
        empty = np.zeros((0,) + tuple(k_cache.shape[2:]))
        k = np.concatenate([empty] + [kb for kb, _ in kv])
        v = np.concatenate([empty] + [vb for _, vb in kv])
        cu_k = np.concatenate([[0], np.cumsum(np.asarray(lens, np.int64))])
        return attention_varlen(q, k, v, cu_seqlens_q, cu_k, causal=causal, causal_align="bottom_right", scale=scale,
                                return_lse=return_lse, window=window, softcap=softcap)
    outs, lses = [], []
    for b in range(q.shape[0]):
        k, v = paged_kv(k_cache, v_cache, block_table, lens[b], b)
        o, lse = attention(q[b:b + 1], k[None], v[None], causal=causal, causal_align="bottom_right", scale=scale,
                           return_lse=True, window=window, softcap=softcap)
        outs.append(o)
        lses.append(lse)
    shape = (0,) + q.shape[1:]
    out = np.concatenate(outs) if outs else np.zeros(shape)
    lse = np.concatenate(lses) if lses else np.zeros((0, q.shape[2], q.shape[1]))
    return (out, lse) if return_lse else out


def kv_cache_append(k_cache, v_cache, k, v, block_table, positions):
    """The caches after cupyops.kv_cache_append (copies, in the caches' dtype: the writes are
    exact): token i of sequence b to position positions[b] + i (slot p % page_size of page
    block_table[b, p // page_size]); a token whose position is outside the table's capacity
    or whose page is not one of the cache's is skipped, as on the device."""
    kc, vc = _host(k_cache).copy(), _host(v_cache).copy()
    k, v, table, pos = _host(k), _host(v), _host(block_table), _host(positions)
    num_pages, P = kc.shape[:2]
    for b in range(k.shape[0]):
        for i in range(k.shape[1]):
            p = int(pos[b]) + i
            if not 0 <= p < table.shape[1] * P:
                continue
            page = int(table[b, p // P])
            if 0 <= page < num_pages:
                kc[page, p % P], vc[page, p % P] = k[b, i], v[b, i]
    return kc, vc


def merge_attention_states(o_a, lse_a, o_b, lse_b):
    """(o, lse) of two partial attentions merged through their natural-log LSEs, float64:
    o = (e^lse_a o_a + e^lse_b o_b) / (e^lse_a + e^lse_b), lse = log(e^lse_a + e^lse_b);
    a side with lse -inf contributes nothing; both -inf give o = 0 and lse -inf."""
    la, lb = _f64(lse_a), _f64(lse_b)
    m = np.maximum(la, lb)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    wa, wb = np.exp(la - m_safe), np.exp(lb - m_safe)
    total = wa + wb
    with np.errstate(invalid="ignore"):  # a side with weight 0 never multiplies its o (NaN stays out)
        o = (np.where(wa[..., None] > 0, wa[..., None] * _f64(o_a), 0.0)
             + np.where(wb[..., None] > 0, wb[..., None] * _f64(o_b), 0.0)) / np.where(total > 0, total, 1.0)[..., None]
    with np.errstate(divide="ignore"):
        lse = m_safe + np.log(total)
    return o, np.where(np.isneginf(m), -np.inf, lse)


# ------------------------------------------------------------------ float8 e4m3
E4M3_MAX = 448.0  # the largest finite float8 e4m3 value


def e4m3_to_float(q):
    """float64 values of float8 e4m3 bit patterns (a uint8 array, or a float8_e4m3fn one)."""
    import ml_dtypes

    q = _host(q)
    if q.dtype != np.uint8:
        q = q.view(np.uint8)
    return q.view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def quantize_fp8(x, scale=None, axis=None):
    """cupyops.quantize_fp8 bit for bit: (q, scale) with q the uint8 e4m3 bits of
    sat(x / scale) and scale float32 (shape () for axis=None, x.shape[:-1] for axis=-1).
    Computed in float32 as the kernel does: scale = amax / 448 (amax over |x| ignoring NaN;
    0 -> 1), the correctly rounded float32 quotient x / scale, clamped to +-448 (NaN kept),
    rounded to nearest even by ml_dtypes (whose own overflow would give NaN, hence the
    clamp first; both give 448 from anything in (448, 464]). An amax under 448 times
    float32's smallest normal gives scale 1 (the kernel flushes the subnormal quotient); an
    infinite |x| gives an infinite scale, so every finite element quantises to 0."""
    import ml_dtypes

    x = _host(x).astype(np.float32)
    per_row = axis is not None
    if per_row and axis not in (-1, x.ndim - 1):
        raise ValueError(f"axis: only the last axis or None, got {axis}")
    if scale is None:
        mag = np.abs(x)
        amax = np.fmax.reduce(mag if per_row else mag.ravel(), axis=-1, initial=np.float32(0))
        s = (np.asarray(amax, np.float32) / np.float32(E4M3_MAX)).astype(np.float32)
        # the kernel runs with -ftz: a quotient under float32's smallest normal is 0, and a
        # scale of 0 becomes 1
        tiny = np.finfo(np.float32).tiny
        s = np.where(s < tiny, np.float32(1), s).astype(np.float32)
    else:
        s = np.asarray(_host(scale), np.float32).reshape(x.shape[:-1] if per_row else ())
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = x / (s[..., None] if per_row else s)
    v = np.clip(v, np.float32(-E4M3_MAX), np.float32(E4M3_MAX))
    return v.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), s


def dequantize_fp8(q, scale, axis=None):
    """float64 q * scale: the values quantize_fp8's (q, scale) stand for."""
    v = e4m3_to_float(q)
    s = _f64(scale)
    return v * (s[..., None] if axis is not None else s)


def scaled_matmul(a, b, scale_a, scale_b, bias=None):
    """cupyops.scaled_matmul in float64: (a * scale_a) @ (b * scale_b) + bias for e4m3
    bit arrays a [M, K] and b [K, N]; scale_a a scalar or one a row ([M] or [M, 1]),
    scale_b a scalar or one a column ([N] or [1, N]), each taken as the float32 the kernel
    reads; bias [N]."""
    A, B = e4m3_to_float(a), e4m3_to_float(b)
    sa = np.asarray(_host(scale_a), np.float32).astype(np.float64)
    sb = np.asarray(_host(scale_b), np.float32).astype(np.float64)
    sa = sa.reshape(-1, 1) if sa.size > 1 else sa.reshape(())
    sb = sb.reshape(1, -1) if sb.size > 1 else sb.reshape(())
    y = np.matmul(A * sa, B * sb)
    if bias is not None:
        y = y + _f64(bias)
    return y


def rel_error(out, ref):
    """||out - ref|| / ||ref|| in float64; inf when out has a NaN that ref has not."""
    out = _f64(out)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: {out.shape} vs {ref.shape}")
    both_nan = np.isnan(out) & np.isnan(ref)
    if np.any(np.isnan(out) != np.isnan(ref)):
        return float("inf")
    out = np.where(both_nan, 0.0, out)
    ref = np.where(both_nan, 0.0, ref)
    num = np.linalg.norm((out - ref).ravel())
    den = np.linalg.norm(ref.ravel())
    return float(num / den) if den > 0 else float(num)


# Tolerances on rel_error by dtype (see GUIDE.md section 4).
TOLERANCE = {
    "reduce": {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1e-2},
    "norm": {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2},
    # fp32 GEMM accumulates K products in float32 (error ~ sqrt(K) * 2^-24 relative);
    # fp16/bf16 outputs are rounded to their own precision (2^-11, 2^-8); int8 is exact.
    "gemm": {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2, "int8": 0.0},
    # Attention, against the reference fed the same (rounded) inputs. float32: the scores'
    # float32 dot products carry an absolute error ~ |q||k| * 2^-24 * sqrt(D), which
    # exp turns into a relative error of the probabilities: ~1e-6 for unit-scale inputs,
    # ~3e-5 when the scores are 30x larger (nearly one-hot softmax), hence 1e-4.
    # fp16/bf16: the output is rounded to 2^-11 / 2^-8 (RMS ~3e-4 / 2.3e-3), and the
    # tensor-core rungs also round P to the input type for P @ V (FlashAttention does):
    # another ~2^-11 / 2^-8 relative on each term of the weighted sum. Twice each,
    # with room: 2e-3 and 1.5e-2.
    "attention": {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1.5e-2},
    # scaled_matmul against the float64 product of the dequantised operands, by output
    # dtype. The fp8 tensor cores keep ~14 bits of a running sum (DeepSeek-V3 report, 3.3.2);
    # the kernel restarts it every 128 K and adds it into float32, which leaves a few 1e-4
    # at most (4 truncations of a 128-term partial, a random walk over the partials):
    # float32 output is bounded by that, 2e-3 with room; float16 adds its rounding (RMS
    # ~3e-4), bfloat16 its (~2.3e-3).
    "scaled_matmul": {"float32": 2e-3, "float16": 3e-3, "bfloat16": 1e-2},
}


def float32_sum_tolerance(terms, base=TOLERANCE["reduce"]["float32"]):
    """The rel_error bound of a float32 sum of ``terms`` terms: a thread's sequential sum (the
    rows of the naive and vector rungs, a second pass) errs by ~1.4e-8 * sqrt(terms) rms
    (measured; 2e-6 is reached near 4000 terms), so 1.2e-7 * sqrt(terms) (> 6 sigma), never
    under ``base``, capped at 1e-5 ("well under 1e-5", GUIDE.md)."""
    return builtins.min(1e-5, builtins.max(base, 1.2e-7 * math.sqrt(terms)))  # (this module's max is the reduction)


def gemm_tolerance(dtype, K, base=None):
    """The rel_error bound of a GEMM of inner dimension ``K``: ``base`` (default
    TOLERANCE["gemm"][dtype]), and for float32, whose K products are summed in float32 with
    an error growing as sqrt(K) (cuBLAS's too), at least 2e-7 * sqrt(K)."""
    tol = TOLERANCE["gemm"][dtype] if base is None else base
    return builtins.max(tol, 2e-7 * math.sqrt(builtins.max(K, 1))) if dtype == "float32" else tol


# sampling (cupyops.sample): the Philox uniforms, the draw and the boundary-tolerant check,
# in their own module for their length
from ._sampling_reference import philox4x32_10, sample, sample_accepts, sample_uniforms  # noqa: E402,F401
