"""GPU side of the benchmark: the inputs of a case, the calls to time (cupyops variants and
vendor baselines), and their validation against ``cupyops.reference`` in float64. What
each operator's inputs, reference and calls are is its description in ``operators``; this
module makes, calls and checks them the same way for every operator.

Validation of a cupyops variant, before it is timed:
1. the plain call ``op(x, impl=...)`` (what gets timed) is compared with the reference;
2. the same call with ``out=`` a buffer poisoned with NaN (integer outputs: INT_MIN) must
   return that buffer with every element written: the poison is counted over the whole
   output on the GPU, which also catches a kernel that skips rows we do not compare;
3. the comparison runs on the host in float64 over every row, or over an evenly spaced
   subset of rows on big row-wise cases (see cases.sample_rows).
Baselines get step 1 only; their error is reported, never held against them.

A matmul case's B is made in its layout (operators.LAYOUTS; nt: the transposed view of an
N x K weight), and that one array goes to cupyops, cupy and torch alike; the reference
multiplies by the same logical K x N B.

Attention is compared on a sample (cases.attention_sample: a few batches and heads, ~64
query rows), against reference_rows: the float64 attention of just those query rows,
with the causal mask of their place in the whole problem.

The fused operators with two results (add_rms_norm: normed and sum; rope: q and k) are
checked result by result (the error reported is the larger), with out= a pair of
poisoned buffers; the baselines are the PyTorch eager compositions they replace.
"""
import math
import re
import warnings
from dataclasses import dataclass, field

import numpy as np

from . import cases as _cases
from .operators import SDPA_BACKENDS, operator

# Same-size unsigned type per itemsize: gathers, poison and NaN counts go through these
# raw views, so they work for bfloat16 whatever CuPy's ufuncs support for it.
_RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_NAN_BITS = {"float16": 0x7E00, "bfloat16": 0x7FC0, "float32": 0x7FC00000,
             "float64": 0x7FF8000000000000}
_EXP_MASK = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000,
             "float64": 0x7FF0000000000000}


@dataclass
class CaseData:
    case: object
    x: object  # cupy array of case.shape (matmul: A, M x K; attention: q [B, Sq, Hq, D])
    weight: object = None  # matmul: B, K x N, in the case's layout (nt: a view of N x K)
    bias: object = None
    rows: object = None  # cupy int64 row indices checked, or None for all
    ref: object = None  # float64 reference (on the checked rows; attention: the sample)
    tol: float = 0.0
    k: object = None  # attention: [B, Skv, Hkv, D]
    v: object = None
    scales: tuple = ()  # scaled_matmul: (scale_a, scale_b), float32 0-d device arrays
    sample: object = None  # attention: the cases.AttnSample compared
    residual: object = None  # add_rms_norm
    positions: object = None  # rope: int64 [tokens]
    cos_sin_cache: object = None  # rope's torch baseline: [max_pos, head_dim] in the case's dtype
    _torch: dict = field(default_factory=dict)

    def torch_args(self, torch):
        """The same device memory seen by PyTorch (DLPack, no copy), made once per case.
        DLPack carries strides: an nt case's B reaches PyTorch as the same transposed
        view."""
        if not self._torch:
            conv = lambda a: None if a is None else torch.from_dlpack(a)  # noqa: E731
            self._torch.update(x=conv(self.x), weight=conv(self.weight), bias=conv(self.bias),
                               k=conv(self.k), v=conv(self.v), scales=tuple(conv(s) for s in self.scales),
                               residual=conv(self.residual), positions=conv(self.positions),
                               cos_sin_cache=conv(self.cos_sin_cache))
        return self._torch


def random_normal(shape, dtype, seed):
    """Fresh N(0, 1) data (never zeros); integers uniform in [-1000, 1000]."""
    import cupy

    from .._dtypes import to_dtype

    rs = cupy.random.RandomState(seed)
    if dtype == "int8":
        return rs.randint(-128, 128, size=shape, dtype="int8")
    if dtype in ("int32", "int64"):
        return rs.randint(-1000, 1001, size=shape, dtype=dtype)
    if dtype == "float64":
        return rs.standard_normal(shape, dtype=cupy.float64)
    return rs.standard_normal(shape, dtype=cupy.float32).astype(to_dtype(dtype))


def prepare(case, *, seed=0, check_limit=_cases.CHECK_LIMIT):
    """Inputs of ``case`` on the GPU (its description's make_inputs) and the float64
    reference on the rows checked (attention: on its sample)."""
    import cupy

    from .. import reference

    spec = case.spec
    data = CaseData(case, tol=_cases.tolerance(case, reference.TOLERANCE), **spec.make_inputs(case, seed))
    if spec.family == "attention":
        data.sample = _cases.attention_sample(case, 0 if check_limit == 0 else _cases.ATTN_CHECK_ROWS)
    else:
        rows = _cases.sample_rows(case, check_limit)
        if rows is not None:
            data.rows = cupy.asarray(rows)
    data.ref = spec.reference(data)
    if data.rows is not None:  # compared as (rows checked, -1), as host_rows gathers results
        n = len(data.rows)
        data.ref = (tuple(r.reshape(n, -1) for r in data.ref) if isinstance(data.ref, tuple)
                    else data.ref.reshape(n, -1))
    return data


def gather_bshd(a, batches, seqs, heads):
    """``a[batches][:, seqs][:, :, heads]`` of a contiguous [B, S, H, D] CuPy array, on the
    host in its own dtype: one gather on the GPU (through raw bits, see _RAW), so only the
    sample crosses to the host."""
    import cupy

    raw = a.view(_RAW[a.dtype.itemsize])
    b = cupy.asarray(batches, dtype=cupy.int64)[:, None, None]
    s = cupy.asarray(seqs, dtype=cupy.int64)[None, :, None]
    h = cupy.asarray(heads, dtype=cupy.int64)[None, None, :]
    return raw[b, s, h].get().view(a.dtype)


def reference_rows(q, k, v, rows, *, q_len=None, kv_index=None, causal=False,
                   causal_align="top_left", scale=None):
    """float64 attention output of some query rows only: [Bs, R, H, D] ("bshd").

    q: [Bs, R, H, D], the query rows ``rows`` (their indices in the whole problem of
    ``q_len`` rows, default R) of some batches and heads; k, v: [Bs, Skv, Hk, D], all keys
    of the same batches; ``kv_index[j]``: the head of k/v that q's head j reads (default
    the GQA mapping j // (H / Hk)). Row i sees key j iff j <= i + offset under a causal
    mask (offset 0 for top_left, Skv - q_len for bottom_right), every key otherwise; a row
    that sees no key is zeros (the kernels' contract). scale defaults to 1/sqrt(D).
    Computed head by head in float64 (softmax with its max subtracted): NumPy only."""
    q = np.asarray(q)
    k = np.asarray(k)
    v = np.asarray(v)
    Bs, R, H, D = q.shape
    Skv, Hk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != Bs or k.shape[3] != D:
        raise ValueError(f"reference_rows: q {q.shape}, k {k.shape}, v {v.shape} do not match")
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if len(rows) != R:
        raise ValueError(f"reference_rows: {len(rows)} row indices for {R} query rows")
    if kv_index is None:
        if H % Hk:
            raise ValueError(f"reference_rows: {H} query heads over {Hk} key/value heads")
        kv_index = np.arange(H) // (H // Hk)
    if causal_align not in ("top_left", "bottom_right"):
        raise ValueError(f"reference_rows: causal_align {causal_align!r}")
    q_len = R if q_len is None else int(q_len)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if causal:
        offset = 0 if causal_align == "top_left" else Skv - q_len
        seen = np.clip(rows + offset + 1, 0, Skv)  # keys j < seen[r] are visible
        visible = np.arange(Skv)[None, :] < seen[:, None]  # [R, Skv]
    else:
        visible = np.ones((R, Skv), dtype=bool)
    out = np.empty((Bs, R, H, D), dtype=np.float64)
    q64 = q.astype(np.float64)
    for j in range(H):
        kh = k[:, :, kv_index[j]].astype(np.float64)  # [Bs, Skv, D]
        vh = v[:, :, kv_index[j]].astype(np.float64)
        s = np.matmul(q64[:, :, j], kh.transpose(0, 2, 1)) * scale  # [Bs, R, Skv]
        s = np.where(visible, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)  # a row with no visible key: p = 0
        p = np.exp(s - m)
        denom = p.sum(axis=-1, keepdims=True)
        out[:, :, j] = np.matmul(p, vh) / np.where(denom > 0, denom, 1.0)
    return out


def host_rows(data, a):
    """``a`` on the host: whole, or only the checked rows of its (rows, -1) view. The
    gather runs on raw bits (see _RAW)."""
    if data.rows is None:
        return a.get()
    raw = a.reshape(data.case.rows, -1).view(_RAW[a.dtype.itemsize])
    return raw[data.rows].get().view(a.dtype)


def as_cupy(y):
    """cupy array for a result of any library (torch tensors through DLPack)."""
    import cupy

    if type(y).__module__.startswith("torch"):
        return cupy.from_dlpack(y.detach())
    return cupy.asarray(y)


def check(data, y):
    """rel_error of the output ``y`` against the reference (on the checked rows); for an
    operator with several results (a tuple ``y``), the largest of theirs."""
    from .. import reference

    if data.sample is not None:  # attention
        return reference.rel_error(attention_output_sample(data, y), data.ref)
    if isinstance(data.ref, tuple):
        if not isinstance(y, (tuple, list)) or len(y) != len(data.ref):
            raise ValueError(f"expected {len(data.ref)} results, got {type(y).__name__}")
        # (rope's results are [tokens, heads, D], its references [tokens checked, heads * D])
        return max(reference.rel_error(host_rows(data, as_cupy(r)).reshape(ref.shape), ref)
                   for r, ref in zip(y, data.ref))
    return reference.rel_error(host_rows(data, as_cupy(y)), data.ref)


def attention_output_sample(data, y):
    """The sampled outputs of an attention result [B, Sq, Hq, D] on the host. A PyTorch
    result is SDPA's [B, Hq, Sq, D]: it is put back in "bshd" order first (a copy, outside
    any timing)."""
    import cupy

    if type(y).__module__.startswith("torch"):
        y = y.detach().transpose(1, 2).contiguous()
    y = as_cupy(y)
    if not y.flags.c_contiguous:
        y = cupy.ascontiguousarray(y)
    smp = data.sample
    return gather_bshd(y, smp.batches, smp.rows, smp.heads)


def poisoned_like(y):
    """An empty array like ``y`` filled with NaN (integers: their minimum), so an
    element the kernel never writes cannot look like a result."""
    import cupy

    out = cupy.empty(y.shape, y.dtype)
    name = y.dtype.name
    if name in _NAN_BITS:
        out.reshape(-1).view(_RAW[y.dtype.itemsize]).fill(_NAN_BITS[name])
    else:
        out.fill(np.iinfo(y.dtype).min)
    return out


def count_poison(a):
    """Elements of ``a`` that are NaN/Inf (integers: equal to the poison value)."""
    import cupy

    name = a.dtype.name
    flat = a.reshape(-1)
    if name in _EXP_MASK:
        raw_t = _RAW[a.dtype.itemsize]
        mask = raw_t(_EXP_MASK[name])
        return int(cupy.count_nonzero((flat.view(raw_t) & mask) == mask))
    return int(cupy.count_nonzero(flat == np.iinfo(a.dtype).min))


# ----------------------------------------------------------------------------------
# the calls
# ----------------------------------------------------------------------------------
def cupyops_call(data, impl):
    """``call(out=None)`` running cupyops' ``impl`` on the case (trace takes no out=)."""
    return data.case.spec.call(data, impl)


class BaselineCall:
    """A baseline's timed callable, with a note for its row (what had to be done before
    timing so that it runs) and the context it must run in (SDPA's backend selection),
    entered once around its validation and timing rather than in every timed call."""

    def __init__(self, fn, note=None, context=None):
        self.fn, self.note, self.context = fn, note, context

    def __call__(self):
        return self.fn()


def baseline_call(data, name, torch=None):
    """A no-argument callable running the vendor's version of the case (the op's
    description says which there are and how each is called)."""
    op = data.case.op
    make = operator(op).baselines.get(name)
    if make is None and name in SDPA_BACKENDS:
        raise ValueError(f"{name} is an attention baseline, not one of {op}")
    if make is None and name == "cupy":
        raise ValueError(f"CuPy has no {op}")
    if name in _cases.BASELINE_NAMES and name != "cupy" and torch is None:
        raise RuntimeError("PyTorch with CUDA is not available")
    if make is None:
        raise ValueError(f"unknown baseline {name!r}")
    return make(data, torch)


def validate_cupyops(data, call):
    """Steps 1-3 of the module docstring. Returns (rel_error, failure message or None)."""
    y = call()
    y = tuple(as_cupy(r) for r in y) if isinstance(y, tuple) else as_cupy(y)
    err = check(data, y)
    if not data.case.spec.takes_out:  # a scalar result (trace), no out=
        return err, (None if err <= data.tol else f"rel_error {err:.3g} > tol {data.tol:g}")
    out = tuple(poisoned_like(r) for r in y) if isinstance(y, tuple) else poisoned_like(y)
    del y  # its memory goes back to the pool before the out= call
    got = call(out=out)
    outs, gots = (out, got) if isinstance(out, tuple) else ((out,), (got,))
    if not isinstance(gots, (tuple, list)) or len(gots) != len(outs) or any(
            g is None or as_cupy(g).data.ptr != o.data.ptr for g, o in zip(gots, outs)):
        return err, "out=: the call did not return the out array"
    bad = sum(count_poison(o) for o in outs)
    if bad:
        return err, (f"out=: {bad} of {sum(o.size for o in outs)} output elements left unwritten "
                     f"(NaN poison)")
    err = max(err, check(data, out))
    if not err <= data.tol:  # also catches NaN
        return err, f"rel_error {err:.3g} > tol {data.tol:g}"
    return err, None


# ----------------------------------------------------------------------------------
# attention baselines: torch.nn.functional.scaled_dot_product_attention per backend
# ----------------------------------------------------------------------------------
def _first_line(text):
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _why_refused(exc, caught):
    """The exception's first line, plus the reasons in the warnings SDPA gives with a
    refusal, without PyTorch's "(Triggered internally at ...)" source locations, the
    "... kernel not used because:" headers, and the "runtime disabled" lines that
    sdpa_kernel's own backend selection causes."""
    why = f"{type(exc).__name__}: {_first_line(exc)}"
    reasons = []
    for w in caught or ():
        text = re.sub(r"\s*\(Triggered internally at [^)]*\)", "", str(w.message))
        for line in text.splitlines():
            line = line.strip()
            if (not line or line.endswith("because:") or "runtime disabled" in line
                    or line in reasons):
                continue
            reasons.append(line)
    if reasons:
        why += " (" + "; ".join(reasons[:3]) + ")"
    return why


def sdpa_call(data, name, torch):
    """SDPA with one backend (sdpa_kernel) on the case's q, k, v, as a BaselineCall.

    SDPA wants [B, H, S, D]: it gets transposed views of the "bshd" tensors (DLPack, no
    copy). GQA goes through enable_gqa=True (torch >= 2.5). Causal top_left is is_causal;
    bottom_right (Sq != Skv) is torch.nn.attention.bias.causal_lower_right. Where a backend
    refuses that, the next form is tried, each made once here, outside the timed region:
    contiguous [B, H, S, D] copies; for GQA, K/V heads repeated (repeat_interleave) instead
    of enable_gqa. The form that ran is named in the row's note; when none runs, the
    RuntimeError names the first refusal (its first line and SDPA's warnings)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    c = data.case
    _, Hq, Hkv, Sq, Skv, _ = c.shape
    backend = getattr(SDPBackend, SDPA_BACKENDS[name])
    context = lambda: sdpa_kernel(backend)  # noqa: E731
    t = data.torch_args(torch)
    q, k, v = (t[n].transpose(1, 2) for n in ("x", "k", "v"))  # [B, H, S, D] views
    kwargs = {}
    if c.causal:
        if c.causal_offset == 0:
            kwargs["is_causal"] = True
        else:
            from torch.nn.attention.bias import causal_lower_right

            kwargs["attn_mask"] = causal_lower_right(Sq, Skv)
    gqa = Hq != Hkv
    contig = lambda *ts: tuple(x.contiguous() for x in ts)  # noqa: E731
    rep = lambda x: x.repeat_interleave(Hq // Hkv, dim=1)  # noqa: E731
    forms = [(None, lambda: (q, k, v), gqa),
             ("contiguous copies", lambda: contig(q, k, v), gqa)]
    if gqa:
        forms += [("K/V heads repeated for GQA", lambda: (q, rep(k), rep(v)), False),
                  ("contiguous copies, K/V heads repeated for GQA",
                   lambda: contig(q, rep(k), rep(v)), False)]
    refusals = []
    for note, make, enable_gqa in forms:
        caught = []
        args = kw = fn = None
        try:
            args = make()
            kw = dict(kwargs, enable_gqa=True) if enable_gqa else kwargs
            fn = lambda args=args, kw=kw: F.scaled_dot_product_attention(*args, **kw)  # noqa: E731
            with warnings.catch_warnings(record=True) as caught, context():
                warnings.simplefilter("always")
                fn()
                torch.cuda.current_stream().synchronize()
        except Exception as exc:
            refusals.append(_why_refused(exc, caught))
            args = kw = fn = None  # let a refused form's copies go
            continue
        if note:
            note = f"{note} (made before timing)"
        return BaselineCall(fn, note, context)
    raise RuntimeError(f"SDPA {backend.name} refused the case in every form tried: "
                       f"{refusals[0]}")


# ----------------------------------------------------------------------------------
# rope's baseline: the PyTorch eager code it replaces
# ----------------------------------------------------------------------------------
def torch_rope(torch, q, k, positions, cos_sin_cache, style="neox"):
    """Rotary embedding written in PyTorch (vLLM's RotaryEmbedding.forward_native): cos and
    sin gathered from the cache rows at the positions, the rotary dims (the cache's width)
    turned, the rest passed through; q, k [tokens, heads, head_dim]."""
    R = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [tokens, 1, R / 2]

    def turn(x):
        rot, rest = x[..., :R], x[..., R:]
        if style == "neox":
            a, b = rot.chunk(2, dim=-1)
            out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
        else:
            a, b = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
        return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out

    return turn(q), turn(k)
