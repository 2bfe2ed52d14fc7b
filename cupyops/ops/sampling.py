"""sample: one token per row of logits -- temperature, top-k, top-p, a seeded draw
(kernels/sampling.cu; the float64 reference: cupyops.reference.sample)."""
import numbers
import os

import numpy as np

from .._interop import foreign_arrays
from .. import _arrays, _dtypes, _fast, _launch
from .._kernels import KernelFile, template_name

VARIANTS = {
    "sample": {
        "naive": "three launches: softmax into a float32 workspace [batch, vocab]; the top-k and "
        "top-p thresholds by bisection over the logits' order keys, a pass over the row per key "
        "bit; the inverse-CDF draw by float32 block scans",
        "fused": "one launch, a block a row, no workspace: the thresholds by radix select (8 key "
        "bits a pass, a shared histogram with a copy per lane), masses as 40-bit fixed-point "
        "integers (exact sums: the same token whatever the order of the additions), the draw "
        "from the warps' segment sums and one segment rescanned",
        "cluster": "sm_90: fused with each row spread over a cluster of 8 blocks (a block a row "
        "is bound by one SM and leaves most idle at decode batches); argmax, histogram bins "
        "and segment sums swapped through distributed shared memory",
    }
}
BLOCK = 512  # SAMPLE_BLOCK: threads a block, every kernel
CLUSTER = 8  # SAMPLE_CLUSTER: blocks a row in sample_cluster
BINS, LANES = 256, 32  # the fused histogram: 8-bit digits, a copy per lane
HIST_SMEM = BINS * LANES * 8  # its dynamic shared memory: a 64-bit mass a bin and lane
# Vocabularies up to 2^21 (the largest LLM vocabularies are ~2^18): the fused rung's
# fixed-point masses (at most 2^40 a token) sum without overflow far past that.
MAX_VOCAB = 1 << 21
INT32_MAX = 2**31 - 1


def _expressions():
    names = []
    for d in _dtypes.FLOAT_TYPES:
        t = _dtypes.cuda_type(d)
        names += [template_name(k, t) for k in ("sample_naive_softmax", "sample_naive_thresholds", "sample_naive_draw",
                                                "sample_fused", "sample_cluster")]
    return names


KERNELS = KernelFile("sampling.cu", _expressions())
KERNEL_FILES = [KERNELS]


# ------------------------------------------------------------------ the fast path
def _option(sig, v):
    """A per-row option in a fast-path key: a plain number or None by its type and value,
    an array by its layout."""
    t = type(v)
    if v is None or t is float or t is int:
        return t, v
    return sig(v)


def _array_or_none(v):
    return None if v is None or type(v) in (float, int) else v


def _fast_spec(sig, logits, *, temperature=1.0, top_k=None, top_p=None, seed=None, impl="auto"):
    """sample's fast-path signature (cupyops/_fast.py): the layouts of logits and of the
    per-row arrays, the plain options, impl. Only calls whose seed is an array take it: a
    launch's scalars are fixed once remembered, and a seed given as a number changes from
    call to call (seed=None draws a new one every call)."""
    if seed is None or type(seed) is int or type(impl) is not str:
        return None
    key = (sig(logits), _option(sig, temperature), _option(sig, top_k), _option(sig, top_p), sig(seed), impl)
    return key, (logits, _array_or_none(temperature), _array_or_none(top_k), _array_or_none(top_p), seed)


_FAST = _fast.FastCalls(_fast_spec)


# ------------------------------------------------------------------ the operator
@foreign_arrays(fast=_FAST)
def sample(logits, *, temperature=1.0, top_k=None, top_p=None, seed=None, impl="auto"):
    """One token id per row of ``logits`` ``[batch, vocab]`` (float32, float16, bfloat16),
    as int64 ``[batch]``: temperature, then top-k, then top-p, then a seeded draw.

    - ``temperature`` (a number >= 0, or an array ``[batch]``): 0 is greedy, the first index
      of the largest logit (``torch.argmax``); otherwise the draw is from
      ``softmax(logits / temperature)`` over the tokens top-k and top-p keep.
    - ``top_k`` (int >= 0, or an integer array ``[batch]``; None or 0: no limit): keep the
      tokens whose logit is at least the k-th largest (ties with the k-th all kept, as the
      masks of vLLM's ``apply_top_k_top_p`` and Hugging Face's ``TopKLogitsWarper`` keep
      them).
    - ``top_p`` (in (0, 1], or an array ``[batch]``; None or 1: no limit): of what top-k
      kept, keep the smallest set of largest-probability tokens whose probability reaches
      ``top_p`` (ties at the boundary all kept), renormalised: FlashInfer's
      ``top_k_top_p_sampling_from_logits(..., filter_apply_order="top_k_first")`` and vLLM's
      sampler order.
    - ``seed`` (an int in [0, 2**64), an integer array of shape () or ``[batch]``, or None):
      the same seed and inputs give the same tokens on any run (the integer sums of the
      fused rung do not depend on thread timing). None draws a fresh 64-bit seed from the
      operating system (``os.urandom``) on every call: not reproducible.

    PyTorch equivalent (vLLM's fallback sampler): ``probs = softmax(apply_top_k_top_p(logits /
    T, k, p))``, then ``torch.multinomial(probs, 1)`` (or ``probs.div_(q).argmax()`` with
    exponential ``q``); ``logits.argmax(-1)`` where T = 0. The tokens are int64 as
    ``torch.multinomial`` and ``torch.argmax`` return them (and as embedding lookups take them).

    The draw (reproducible by ``cupyops.reference.sample`` in float64): one uniform a row,
    ``u = (Philox4x32-10(counter=(c, c >> 32, 0, 0), key=(seed & 0xffffffff, seed >> 32))[0]
    >> 8) * 2**-24`` with c = the row index for one seed a call and c = 0 for a seed a row
    (a request then keeps its draw wherever it sits in the batch; vary the seed from step to
    step, e.g. hash(request seed, step)). The token is the first kept index, in vocabulary
    order, whose cumulative probability exceeds u (the inverse CDF). Weights are
    ``exp((logit - max) / T)`` in float32 (``exp2`` of a float32 product), so a token lands
    on the other side of a step from the float64 reference only when u or top-p's cut falls
    within ~1e-6 of the step.

    Logits: NaN is read as -inf and never drawn (``torch.argmax`` would pick it), +inf as the
    dtype's largest finite value; a row with no finite logit gives token 0. Per-row arrays
    on the device are read by the kernel, not checked (a check would synchronise): there a
    temperature <= 0 or NaN is greedy, a top_k <= 0 or >= vocab or a top_p >= 1 or NaN keeps
    everything, a top_p <= 0 keeps the largest logit's ties. NumPy arrays and numbers are
    checked (ValueError/TypeError naming the argument, before anything runs) and NumPy
    arrays copied to the device. Nothing on the default path synchronises: with the seed
    (and any per-row options) in device arrays a call can be captured in a CUDA graph and
    replayed after the arrays are rewritten in place (a number seed is baked into the graph:
    every replay would draw the same uniforms). ``impl``: a rung of
    ``cupyops.variants("sample")`` or "auto": cluster on sm_90 and newer while its 8 blocks a
    row fit in two waves of the GPU's SMs (batch <= 33 on 132 SMs), else fused; cluster
    falls back to fused before sm_90.
    """
    logits = _arrays.as_input(logits, "logits")
    dt = _arrays.check_dtype(logits, "logits", _dtypes.FLOAT_TYPES)
    if logits.ndim != 2:
        raise ValueError(f"logits: expected a 2-D array [batch, vocab], got shape {tuple(logits.shape)}")
    batch, vocab = (int(n) for n in logits.shape)
    if not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(f"logits: vocab (the last axis) must be in [1, {MAX_VOCAB}], got {vocab}")
    on_device = _arrays.is_cupy(logits)
    temp = _float_option(temperature, "temperature", batch, on_device, _check_temperature)
    k = _top_k(top_k, batch, vocab, on_device)
    p = _float_option(1.0 if top_p is None else top_p, "top_p", batch, on_device, _check_top_p)
    seeds = _seed(seed, batch, on_device)
    _arrays.check_impl(impl, VARIANTS["sample"], "sample")

    call = None if on_device else _arrays.HostCall()
    cp = _arrays.cupy_module()
    out = cp.empty(batch, np.int64)
    if batch:
        xd, ld = _rows(logits, call, cp)
        given = (temp, k, p, seeds)
        launches, work = _launches(impl, dt, xd, ld, out, *(_on_device(o, cp) for o in given))
        _fast.launch_checked(launches[_aligned(xd, ld, batch)], work)
        if call is None and xd is logits and seeds.array is not None:
            # Remembered with the caller's own arrays as inputs: where one was converted (another
            # dtype), the launches read a copy that no input stands for, and build declines.
            _FAST.offer(lambda: _fast.build(launches, (xd, *(o.array for o in given)), out, work))
    return _arrays.finish(out, None, call)


# ------------------------------------------------------------------ argument checks
class _Option:
    """One per-row option as the kernel takes it: ``array`` (a device array, or a NumPy
    array still to be copied; None: ``scalar`` for every row) and ``dtype`` (what the kernel
    reads)."""

    __slots__ = ("array", "scalar", "dtype", "per_row")

    def __init__(self, array, scalar, dtype, per_row=True):
        self.array, self.scalar, self.dtype = array, scalar, dtype
        self.per_row = per_row  # (False: a seed array of shape (), one seed for the call)


def _is_number(v):
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _row_array(v, name, batch, on_device, kinds, expected):
    """``v`` as an array of one value a row: a NumPy or CuPy array (CuPy only with CuPy
    logits) of an accepted dtype and shape (batch,); a list or tuple becomes NumPy."""
    if isinstance(v, (list, tuple)):
        v = np.asarray(v)
    if not (_arrays.is_cupy(v) or isinstance(v, np.ndarray)):
        raise TypeError(f"{name}: expected {expected}, got {type(v).__name__}")
    if _arrays.is_cupy(v) and not on_device:
        raise TypeError(f"{name}: a CuPy array with NumPy logits; pass NumPy (or put logits on the device)")
    dt = _dtypes.dtype_name(v.dtype)
    if dt not in kinds:
        raise TypeError(f"{name}: dtype {dt} is not supported; expected one of {', '.join(kinds)}")
    if tuple(v.shape) != (batch,):
        raise ValueError(f"{name}: expected a number or an array of shape ({batch},) (one a row), got shape "
                         f"{tuple(v.shape)}")
    return v


_FLOAT_KINDS = ("float32", "float64", "float16", "bfloat16")
_INT_KINDS = ("int32", "int64", "int16", "int8", "uint8", "uint16", "uint32", "uint64")


def _check_temperature(t):
    """None if ``t`` (float64 values) is a valid temperature, else what is wrong."""
    bad = np.isnan(t) | (t < 0)
    if bad.any():
        return f"must be >= 0 (0: greedy) and not NaN, got {_first(t, bad)}"
    return None


def _check_top_p(p):
    bad = ~((p > 0) & (p <= 1))  # (NaN fails both)
    if bad.any():
        return f"must be in (0, 1], got {_first(p, bad)}"
    return None


def _first(values, bad):
    i = int(np.flatnonzero(bad)[0])
    v = values.flat[i].item()  # (a Python number: NumPy's repr would say np.float64(...))
    return f"{v!r}" if values.ndim == 0 else f"{v!r} (entry {i})"


def _scalar(v):
    """A 0-d NumPy array as its number (a 0-d CuPy array stays: reading it would sync)."""
    return v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v


def _float_option(v, name, batch, on_device, check):
    v = _scalar(v)
    if _is_number(v):
        f = np.float64(v)
        why = check(f)
        if why:
            raise ValueError(f"{name}: {why}")
        return _Option(None, np.float32(f), np.float32)
    a = _row_array(v, name, batch, on_device, _FLOAT_KINDS, f"a number or an array of {batch} values")
    if isinstance(a, np.ndarray):
        why = check(a.astype(np.float64))
        if why:
            raise ValueError(f"{name}: every entry {why}")
    return _Option(a, np.float32(0), np.float32)


def _top_k(v, batch, vocab, on_device):
    v = _scalar(v)
    if v is None:
        return _Option(None, np.int32(0), np.int32)
    if isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
        if v < 0:
            raise ValueError(f"top_k: must be >= 0 (0 or None: no limit), got {v}")
        return _Option(None, np.int32(v if v < vocab else 0), np.int32)  # (k >= vocab keeps all)
    if _is_number(v):
        raise TypeError(f"top_k: expected an int or an integer array, got {type(v).__name__}")
    a = _row_array(v, "top_k", batch, on_device, _INT_KINDS, f"an int or an integer array of {batch} values")
    if isinstance(a, np.ndarray):
        bad = a < 0
        if bad.any():
            raise ValueError(f"top_k: every entry must be >= 0, got {_first(a, bad)}")
    return _Option(a, np.int32(0), np.int32)


def _seed(v, batch, on_device):
    v = _scalar(v)
    if v is None:  # a fresh seed from the operating system's entropy
        return _Option(None, np.uint64(int.from_bytes(os.urandom(8), "little")), np.uint64)
    if isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
        if not 0 <= v < 2**64:
            raise ValueError(f"seed: must be in [0, 2**64), got {v}")
        return _Option(None, np.uint64(v), np.uint64)
    if _is_number(v):
        raise TypeError(f"seed: expected an int, an integer array or None, got {type(v).__name__}")
    if _arrays.is_cupy(v) and v.ndim == 0:  # one seed for the call, on the device (read there)
        if not on_device:
            raise TypeError("seed: a CuPy array with NumPy logits; pass NumPy (or put logits on the device)")
        if _dtypes.dtype_name(v.dtype) not in _INT_KINDS:
            raise TypeError(f"seed: dtype {_dtypes.dtype_name(v.dtype)} is not supported; expected one of "
                            f"{', '.join(_INT_KINDS)}")
        return _Option(v, np.uint64(0), np.uint64, per_row=False)
    a = _row_array(v, "seed", batch, on_device, _INT_KINDS, "an int, an integer array of shape () or "
                   f"({batch},), or None")
    if isinstance(a, np.ndarray) and a.dtype.kind == "i" and (a < 0).any():
        raise ValueError(f"seed: every entry must be in [0, 2**64), got {_first(a, a < 0)}")
    return _Option(a, np.uint64(0), np.uint64)


# ------------------------------------------------------------------ device side
def _rows(x, call, cp):
    """(device array whose rows the kernels read, row stride in elements): the caller's own
    array where its last axis is contiguous and its row stride a whole number of elements."""
    if call is not None:
        return _arrays.to_device(x, call), x.shape[1]
    s0, s1 = x.strides
    if s1 == x.itemsize and s0 >= 0 and s0 % x.itemsize == 0:
        return x, s0 // x.itemsize
    return cp.ascontiguousarray(x), x.shape[1]


def _aligned(xd, ld, batch):
    """Whether every row starts on 16 bytes (the 16-byte loads of the fused rung)."""
    return not xd.data.ptr % 16 and (batch == 1 or ld * xd.itemsize % 16 == 0)


def _on_device(o, cp):
    """The option with its array (if any) as the kernel reads it: float32, int32 (clipped
    to [-1, 2**31 - 1] first: an entry past the vocabulary keeps everything either way), or 64-bit
    seeds (int64 read as their uint64 bits). NumPy arrays are copied to the device."""
    a = o.array
    if a is None:
        return o
    if isinstance(a, np.ndarray):
        if o.dtype is np.int32:
            a = np.minimum(a, INT32_MAX)
        a = cp.asarray(a.astype(o.dtype))
    elif o.dtype is np.uint64:
        if a.dtype not in (np.int64, np.uint64):
            a = a.astype(np.uint64)
    elif a.dtype != o.dtype:
        if o.dtype is np.int32:
            a = cp.minimum(a, INT32_MAX) if a.dtype.kind == "u" else cp.clip(a, -1, INT32_MAX)
        a = a.astype(o.dtype)
    return _Option(a, o.scalar, o.dtype, o.per_row)


_NULL = _arrays.NULL_PTR


def _ptr(o):
    return (_NULL, o.scalar) if o.array is None else (o.array, o.scalar)


def _launches(impl, dt, xd, ld, out, temp, k, p, seeds):
    """((the launch list for rows off 16 bytes, the one for aligned rows), workspace bytes):
    each list ``[(fn, grid, block, smem, args)]`` (``_fast.launch_checked`` / ``_fast.build``)."""
    batch, vocab = (int(n) for n in xd.shape)
    t = _dtypes.cuda_type(dt)
    head = (xd, np.int64(ld), np.int32(vocab))
    seed_args = (*_ptr(seeds)[:1], np.int32(seeds.array is not None and seeds.per_row), seeds.scalar)
    grid, block = (batch,), (BLOCK,)
    if impl == "naive":
        probs, argmax, keep = _fast.Work(0), _fast.Work(1), _fast.Work(2)
        work = (batch * vocab * 4, batch * 4, batch * 4)
        launches = [
            (KERNELS.function(template_name("sample_naive_softmax", t)), grid, block, 0,
             head + (*_ptr(temp), probs, argmax)),
            (KERNELS.function(template_name("sample_naive_thresholds", t)), grid, block, 0,
             head + (probs, argmax, *_ptr(temp), *_ptr(k), *_ptr(p), keep)),
            (KERNELS.function(template_name("sample_naive_draw", t)), grid, block, 0,
             head + (probs, argmax, keep, *_ptr(temp), *seed_args, out)),
        ]
        return (launches, launches), work
    rung = _rung(impl, batch)
    fn = KERNELS.function(template_name(f"sample_{rung}", t))
    _launch.request_smem(fn, HIST_SMEM, _launch.device_props(), f"sample ({rung})")
    if rung == "cluster":
        grid = (batch * CLUSTER,)
    args = head + (out, *_ptr(temp), *_ptr(k), *_ptr(p), *seed_args)
    vec_ok = batch == 1 or ld * xd.itemsize % 16 == 0
    return tuple([(fn, grid, block, HIST_SMEM, args + (np.int32(aligned),))] for aligned in (False, vec_ok)), ()


def _rung(impl, batch):
    """The kernel behind ``impl`` for ``batch`` rows on the current GPU: "fused" or
    "cluster" (sm_90 and newer). "auto" takes the cluster rung while its blocks (8 a row,
    one an SM) fit in two waves: measured on an H200 at 128256 tokens (benchmarks/sampling.py),
    cluster ran 2.4-3.5x faster than fused at batch 1 and 1.04-1.36x at 32, 1.2-1.6x slower
    at 64 (4 waves)."""
    props = _launch.device_props()
    if props.cc < 90 or impl == "fused":
        return "fused"
    return "cluster" if impl == "cluster" or batch * CLUSTER <= 2 * props.sm_count else "fused"
