"""Memoized fast calls: what a decode loop pays per operator call.

In a decode loop each operator runs a few microseconds of GPU work, so the host's time per
call decides the speed. A call that passed every check once for a signature (the shapes,
strides and dtypes of its arrays, its options, the device) is remembered as a
``FastCall``: its kernel launches with their geometry and scalar arguments packed once
(``_launch.DirectLaunch``), the shapes and dtypes of its outputs, and the workspace its
launches share. A later call of the same signature builds one key from its arguments,
finds the FastCall in a dict, allocates the outputs, writes the addresses and launches.
Anything else (another layout or dtype, an option the fast path does not take, a bad
argument) finds nothing and takes the checked path, which raises its errors, as ever,
before anything runs. A remembered signature fixes the strides, so only arrays laid out
exactly like the checked ones take it; the one thing a FastCall looks at per call is
whether the input addresses are 16-byte aligned, for the kernels that take a 16-byte path.

Two kinds of device array take it:

- CuPy arrays: outputs and workspace from CuPy's current allocator, launches on CuPy's
  current stream (so ``with stream:`` and CuPy's stream capture see them); a FastCall
  keeps its last blocks for its next call on the same stream (see KEEP_BYTES).
- CUDA torch tensors (``torch.Tensor``, ``nn.Parameter``): outputs and workspace from
  torch's caching allocator (``torch.empty_like`` / ``new_empty`` / ``torch.empty`` and
  its raw block calls, on the tensor's device and torch's current stream: under
  ``torch.cuda.graph`` they come from the graph's pool), launches on torch's current stream
  of that device, results as torch tensors. No CuPy array is made. Tensors that require
  grad are read as detached, as on the checked path. Where torch exports DLPack's C
  exchange table (torch >= 2.11) the C calls read the tensors' layouts and addresses and
  torch's current stream through it, with no Python call (``bind_torch_dlpack``).

An operator takes part by giving ``foreign_arrays`` a ``FastCalls(spec)``.
``spec(sig, *args, **kwargs)`` takes the operator's own parameters and returns ``(key,
arrays)``, or None for a call the fast path does not take: the key holds ``sig(a)`` of each
array argument (shape, strides, dtype; a torch tensor's also its device) and the options,
each admitted by its exact type so that equal keys mean equal calls (``True`` never
stands for ``1``); ``arrays`` are the inputs in the order the FastCall takes them. After a
launch that read the caller's own arrays (nothing copied), the checked path calls
``offer(make)``; the wrapper files ``make()`` under the call's key, and, for a torch call,
under the torch tensors' key as well.
"""
import functools
import operator
import os
import sys
import threading
import warnings

import numpy as np

from . import _launch

try:  # the per-call work in C (cupyops/_cfast.c), where it was compiled at install
    from . import _cfast
except ImportError:  # no C compiler at install: the same steps in Python
    _cfast = None
# CUPYOPS_FAST_C=0 keeps the Python steps (to compare the two, or to rule the C out)
USE_C = _cfast is not None and os.environ.get("CUPYOPS_FAST_C", "1") != "0"

# Set once the libraries are loaded (cupy_loaded, torch_loaded): until then no call can
# have been remembered.
CUPY_ARRAY = None  # cupy.ndarray
TORCH_TENSORS = frozenset()  # the torch types whose layout a key may describe
_get_device = None  # cupy.cuda.runtime.getDevice
_cupy_alloc = None  # cupy.cuda.alloc
_cupy_stream = None  # the address of CuPy's current stream
_stream_capturing = None  # whether a stream (an address) is capturing a graph
_torch_empty = _torch_empty_like = None
_torch_raw_alloc = _torch_raw_delete = None  # torch's caching allocator, block by address
raw_stream = None  # torch's current stream of a device, as an address (torch_loaded)
TORCH_DTYPES = {}  # NumPy dtype -> torch dtype, for the dtypes the operators return
TORCH_DLPACK = False  # whether the C calls read torch tensors through DLPack's C table


def cupy_loaded(cupy):
    global CUPY_ARRAY, _get_device, _cupy_alloc, _cupy_stream, _stream_capturing
    _get_device, _cupy_alloc = cupy.cuda.runtime.getDevice, cupy.cuda.alloc
    # (the address alone, where CuPy exports the query: no Stream object looked up)
    _cupy_stream = getattr(cupy.cuda.stream, "get_current_stream_ptr", None) or (
        lambda: cupy.cuda.get_current_stream().ptr)
    CUPY_ARRAY = cupy.ndarray
    query = cupy.cuda.runtime.streamIsCapturing

    def capturing(stream):
        try:
            return query(stream) != 0
        except Exception:  # noqa: BLE001 - (the legacy stream beside a global capture) keep nothing
            return True

    _stream_capturing = capturing
    if _cfast is not None:
        # (cuCtxGetDevice: the current device as getDevice gives it, with no Python call;
        # _cfast.c's current_device says why the answers agree)
        _cfast.bind(cupy_type=CUPY_ARRAY, get_device=_get_device,
                    is_capturing=_launch.libcuda_address("cuStreamIsCapturing"),
                    ctx_get_device=_launch.libcuda_address("cuCtxGetDevice"))


def torch_loaded(torch):
    """Bind what the torch side of a FastCall uses (once a torch tensor has been seen)."""
    global TORCH_TENSORS, _torch_empty, _torch_empty_like, _torch_raw_alloc, _torch_raw_delete, raw_stream
    if _torch_empty is not None:
        return
    from . import _dtypes

    TORCH_DTYPES.update({np.dtype(n): getattr(torch, n) for n in
                         ("float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")})
    TORCH_DTYPES[_dtypes.to_dtype("bfloat16")] = torch.bfloat16
    # (torch.cuda.current_stream builds a Stream object through several Python-level
    # device queries; the raw query is one C call)
    query = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    raw_stream = query if query is not None else (lambda i: torch.cuda.current_stream(i).cuda_stream)
    _torch_empty, _torch_empty_like = torch.empty, torch.empty_like
    # (what torch.cuda.caching_allocator_alloc/delete call, less their Python device and
    # stream lookups; a block on a capturing stream comes from the capture's pool)
    _torch_raw_alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc
    _torch_raw_delete = torch._C._cuda_cudaCachingAllocator_raw_delete
    TORCH_TENSORS = frozenset((torch.Tensor, torch.nn.Parameter))
    if _cfast is not None:
        _cfast.bind(torch_types=TORCH_TENSORS)
        bind_torch_dlpack(torch)


def bind_torch_dlpack(torch):
    """Where torch has DLPack's C exchange table (``torch.Tensor.__dlpack_c_exchange_api__``,
    torch >= 2.11), the C calls read a tensor's address, layout and device and torch's
    current stream through it instead of Python calls (about 0.3-0.6 us less a call;
    NOTES 141); ``None`` unbinds it. The C side learns which torch dtype each DLPack dtype
    stands for from an empty tensor of every dtype torch has (some share one: torch's
    sub-byte integers report int8's and uint8's). Sets TORCH_DLPACK to whether bound."""
    global TORCH_DLPACK
    if _cfast is None:
        return
    api = None if torch is None else getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    samples = []
    with warnings.catch_warnings():  # (torch warns that complex32 is experimental)
        warnings.simplefilter("ignore")
        for dtype in () if api is None else dict.fromkeys(v for v in vars(torch).values()
                                                          if isinstance(v, torch.dtype)):
            try:
                samples.append(torch.empty(0, dtype=dtype))
            except Exception:  # noqa: BLE001 - a dtype torch.empty does not make: none of its tensors to read
                continue
    TORCH_DLPACK = _cfast.bind_torch_dlpack(api, samples)


class Unfit(Exception):
    """An argument a key cannot describe (a NumPy array, a list, another library's array):
    the call takes the checked path."""


if _cfast is not None:
    _cfast.bind(unfit=Unfit)


def cupy_sig(a):
    """What a key holds of a CuPy array argument (None for an absent one)."""
    if type(a) is CUPY_ARRAY:
        return a.shape, a.strides, a.dtype
    if a is None:
        return None
    raise Unfit


def torch_sig(a):
    """What a key holds of a torch tensor argument: its shape, its strides (counting
    elements), its dtype and its device (a FastCall launches on the device it was built
    for), in one flat tuple whose length gives the rank: no torch.Size in it, which hashes
    and compares slower in a key lookup than plain values (NOTES 91)."""
    if type(a) in TORCH_TENSORS:
        return (*a.shape, *a.stride(), a.dtype, a.get_device())
    if a is None:
        return None
    raise Unfit


def _span(a):
    """(lowest, one past the highest) byte address of a CuPy array's or torch tensor's
    elements."""
    if type(a) is CUPY_ARRAY:
        ptr, item, strides = a.data.ptr, a.itemsize, a.strides
    elif type(a) in TORCH_TENSORS:
        ptr, item = a.data_ptr(), a.element_size()
        strides = [s * item for s in a.stride()]
    else:
        raise Unfit
    lo = hi = ptr
    for n, s in zip(a.shape, strides):
        if n == 0:
            return ptr, ptr
        if s > 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return lo, hi + item


def placement(a, b):
    """Where array ``b`` lies against ``a``, for the key of an in-place call that writes
    both (they must not share an element): "apart" where their byte ranges do not meet,
    else b's address minus a's. With the layouts in the key that fixes whether they share
    an element, which the checked call that filed the key has settled (vLLM's q and k, head
    slices of one qkv buffer, interleave without sharing one)."""
    lo_a, hi_a = _span(a)
    lo_b, hi_b = _span(b)
    if hi_a <= lo_b or hi_b <= lo_a:
        return "apart"
    return (b.data.ptr - a.data.ptr) if type(a) is CUPY_ARRAY else (b.data_ptr() - a.data_ptr())


def apart(arrays, others):
    """Whether every array of ``arrays`` (None entries skipped) lies apart from every one of
    ``others``: their byte ranges do not meet."""
    spans = [_span(b) for b in others if b is not None]
    for a in arrays:
        if a is None:
            continue
        lo, hi = _span(a)
        for lo_b, hi_b in spans:
            if lo < hi_b and lo_b < hi:
                return False
    return True


class Work:
    """Stands for piece ``index`` of a launch list's workspace in a kernel's arguments."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


WORK_ALIGN = 256  # workspace pieces start on allocator-like boundaries


def _offsets(sizes):
    """(each piece's byte offset, the bytes of them all)."""
    out, at, end = [], 0, 0
    for n in sizes:
        out.append(at)
        end = at + n
        at = -(-end // WORK_ALIGN) * WORK_ALIGN
    return out, max(end, 1)


def launch_checked(launches, work=()):
    """The checked path's launch of ``launches`` (``(fn, grid, block, smem, args)`` each,
    ``Work`` pieces of sizes ``work`` in bytes drawn from CuPy's current allocator) through
    CuPy, on its current stream."""
    if work:
        if _cupy_alloc is None:  # (a launcher called before any operator loaded CuPy)
            from . import _arrays

            _arrays.cupy_module()
        offsets, total = _offsets(work)
        buf = _cupy_alloc(total)  # (held until every launch is queued)
        at = [np.uint64(buf.ptr + off) for off in offsets]
    for fn, grid, block, smem, args in launches:
        if work:
            args = tuple(at[a.index] if type(a) is Work else a for a in args)
        # CuPy's shared_mem= keyword alone costs 0.5-1.9 us a call (NOTES item 38)
        if smem:
            fn(grid, block, args, shared_mem=smem)
        else:
            fn(grid, block, args)


def build(variants, inputs, output, work=()):
    """The FastCall replaying a checked call, or None where it cannot.

    ``variants``: (the launches for inputs of which one starts off a 16-byte boundary, or
    None where those need the checked path; the launches for aligned inputs), each a list
    of ``(fn, grid, block, smem, args)`` as the checked call launched them. Their array
    arguments must be among ``inputs`` (the call's input arrays in the order a later call
    passes them, None for an absent one) and ``output`` (its result, made anew each call
    with its shape and dtype, C-contiguous), or ``Work`` pieces of sizes ``work``."""
    slot = {}
    for i, a in enumerate((*inputs, output)):
        if a is not None:
            if id(a) in slot:  # one array in two roles (k is v): a later call may differ
                return None
            slot[id(a)] = i
    first_work = len(inputs) + 1
    packed = []
    for launches in variants:
        if launches is None:
            packed.append(None)
            continue
        pack = []
        for fn, grid, block, smem, args in launches:
            template, slots = [], []
            for a in args:
                if isinstance(a, np.generic):  # a scalar (a null pointer among them)
                    template.append(a)
                    continue
                if type(a) is Work:
                    slots.append(first_work + a.index)
                elif id(a) in slot:
                    slots.append(slot[id(a)])
                else:  # an array of the call's own (a copy, a ticket counter), a struct
                    return None
                template.append(_launch.ADDRESS)
            pick = operator.itemgetter(*slots) if len(slots) > 1 else (lambda addrs, i=slots[0]: (addrs[i],))
            pack.append((_launch.DirectLaunch(fn, grid, block, smem, template), pick, tuple(slots)))
        packed.append(tuple(pack))
    return FastCall(packed, (tuple(output.shape), output.dtype), work, _get_device(), len(inputs))


def build_from_launcher(launches, inputs, output):
    """``build`` for a launcher's ``fast_launches`` answer ``launches``: (the launch list,
    the workspace bytes), whose kernels check the operands' alignment themselves (one list
    for aligned and unaligned inputs), or None (nothing to replay)."""
    if launches is None:
        return None
    lists, work = launches
    return build((lists, lists), inputs, output, work)


LIKE_FIRST, NEW_OF_FIRST, EMPTY = 0, 1, 2  # how a torch call makes its output (_torch_output_form)

# A CuPy FastCall keeps its last output block and its workspace for the next call on the
# same stream: CuPy's pool costs about as much host time per allocation and free as the
# kernel launch (a fifth of a decode call). The workspace never leaves the call, so the next
# call on the stream (ordered after this one's kernels) may reuse it; the output block only
# once nothing refers to it any more: no array, no view (their MemoryPointers hold its
# memory object), counted by reference counts against those of a block nothing else holds.
# That is the reuse CuPy's pool itself makes of a freed block on its stream. While the
# stream captures a graph a call neither takes nor keeps blocks: the graph goes on using
# those of its calls, replayed on any stream, after the capture (NOTES 78). The C replay
# (cupyops/_cfast.c) keeps the output array itself and hands it out again on the same
# terms (nor one someone holds a weak reference to, or reshaped in place), which spares
# making the ndarray too. Blocks above KEEP_BYTES go back to the pool.
KEEP_BYTES = 4 << 20
_FREE_REFS = None  # the reference counts _block_refs finds on a block nothing else holds
_refs = sys.getrefcount


def _block_refs(kept):
    """The reference counts FastCall.cupy reads on its kept output block (the same
    expressions, so that a free block reads as _FREE_REFS)."""
    block = kept[0]
    return _refs(block), _refs(block.mem)


def _free_refs():
    global _FREE_REFS
    _FREE_REFS = _block_refs([_cupy_alloc(1)])
    return _FREE_REFS


_THREAD = threading.local()  # .context: this thread has a current CUDA context


def _thread_has_context():
    """Whether a launch from this thread has a context to go to (_launch.has_current_context,
    asked until the answer is yes): a thread that has made no CUDA call yet has none, and
    its calls are the checked path's, whose runtime calls make one current (the C replay
    asks cuCtxGetDevice, which says the same)."""
    if getattr(_THREAD, "context", False):
        return True
    _THREAD.context = ok = _launch.has_current_context()
    return ok


class FastCall(_cfast.Replay if _cfast is not None else object):
    """A checked call's launches, replayed on other arrays of the same layout (``build``).

    Where cupyops._cfast was compiled (and USE_C), a FastCall is its own C replay: a
    ``_cfast.Replay``, initialised by ``_c_replay``, which the C Finder runs itself when a
    key finds it (no attribute of the FastCall looked up); ``cupy`` and ``torch`` then hand
    over to the same steps in C. The Python below documents them and runs without it."""

    def __init__(self, variants, output, work, device, n_inputs):
        # [inputs off 16 bytes, aligned] -> ((launch, pick, its address indices), ...)
        self._variants = tuple(variants)
        self._shape, self._dtype = output  # of the result
        self._work, self._work_bytes = _offsets(work) if work else ((), 0)
        self.device = device
        self._torch_like = None  # (form, maker): _torch_output_form
        self._keep_output = self._dtype.itemsize * int(np.prod(self._shape)) <= KEEP_BYTES
        self._keep_work = self._work_bytes <= KEEP_BYTES
        self._kept = [None, None]  # CuPy: the last output block, the workspace
        self._kept_stream = None
        lock = threading.Lock()  # (around the kept blocks: two threads must not take one)
        self._acquire, self._release = lock.acquire, lock.release
        self._c = USE_C and self._c_replay(n_inputs)

    @property
    def _replay(self):
        """This FastCall as its C replay (initialised), or None."""
        return self if self._c else None

    def _c_replay(self, n_inputs):
        """Initialise this FastCall's C replay of these launches: False where a launch has
        no C driver address (a stand-in driver without one)."""
        lists = []
        for launches in self._variants:
            if launches is None:
                lists.append(None)
                continue
            pairs = []
            for launch, _, slots in launches:
                if not launch.driver_address:
                    return False
                pairs.append((launch, slots))
            lists.append(pairs)
        _cfast.Replay.__init__(self, lists, n_inputs, self._shape, self._dtype, self._work, self._work_bytes,
                               self._keep_output, self._keep_work, self.device, CUPY_ARRAY, _cupy_alloc,
                               _cupy_stream, _get_device)
        return True

    def _launches(self, addrs):
        """The launches for these input addresses: the 16-byte variant where every one is
        16-byte aligned (None: this signature has no such variant; the checked path's turn)."""
        bits = 0
        for p in addrs:
            bits |= p
        return self._variants[not bits & 15]

    def cupy(self, arrays):
        """Run on CuPy arrays; the result as a CuPy array (None: the checked path's turn)."""
        if self._c:
            return _cfast.Replay.cupy(self, arrays)
        if not _thread_has_context():
            return None
        addrs = [0 if a is None else a.data.ptr for a in arrays]
        launches = self._launches(addrs)
        if launches is None:
            return None
        stream = _cupy_stream()
        # while the stream captures a graph nothing is kept or reused: the graph goes on
        # using its blocks, replayed on whatever stream, after the call (NOTES 78)
        keep = not _stream_capturing(stream)
        kept = self._kept
        self._acquire()
        try:
            if keep and self._kept_stream != stream:
                kept[0] = kept[1] = None
                self._kept_stream = stream
            block = kept[0] if keep else None
            free = _FREE_REFS or _free_refs()
            if block is not None and _refs(block) == free[0] and _refs(block.mem) == free[1]:
                y = CUPY_ARRAY(self._shape, self._dtype, block)
            else:
                y = CUPY_ARRAY(self._shape, self._dtype)  # (ndarray: cp.empty less a call)
                if keep and self._keep_output:
                    kept[0] = y.data
            addrs.append(y.data.ptr)
            if self._work_bytes:
                work = kept[1] if keep else None
                if work is None:
                    work = _cupy_alloc(self._work_bytes)
                    if keep and self._keep_work:
                        kept[1] = work
                base = work.ptr
                addrs += [base + off for off in self._work]
            for launch, pick, _ in launches:
                launch(stream, pick(addrs))
        finally:
            self._release()
        return y

    def torch(self, tensors):
        """Run on CUDA torch tensors (on this FastCall's device, which the key names); the
        result as a torch tensor (None: the checked path's turn). The output comes from
        ``torch.empty``, the workspace from torch's caching allocator for the current
        stream, given back once the launches are queued (as torch's own temporaries). Where
        the C replay exists it runs every torch call, the first included: a Python launch
        here would write the parameter blocks it writes, without its lock."""
        if self._c:
            if self._torch_like is None:  # (set first, then marked: the C keeps the first set)
                like = self._torch_output_form(tensors)
                self.set_torch(*like, raw_stream, _torch_raw_alloc, _torch_raw_delete)
                self._torch_like = like
            return _cfast.Replay.torch(self, tensors)
        dev = self.device
        if not _thread_has_context() or _get_device() != dev:  # (the kernels belong to the device's context)
            return None
        addrs = [0 if t is None else t.data_ptr() for t in tensors]
        launches = self._launches(addrs)
        if launches is None:
            return None
        if self._torch_like is None:
            self._torch_like = self._torch_output_form(tensors)
        form, make = self._torch_like
        y = make(tensors[0]) if form == LIKE_FIRST else tensors[0].new_empty(self._shape) if form == NEW_OF_FIRST \
            else make()
        addrs.append(y.data_ptr())
        stream = raw_stream(dev)
        base = _torch_raw_alloc(self._work_bytes, stream) if self._work_bytes else 0
        self._acquire()
        try:
            if base:
                addrs += [base + off for off in self._work]
            for launch, pick, _ in launches:
                launch(stream, pick(addrs))
        finally:
            self._release()
            if base:
                _torch_raw_delete(base)
        return y

    def _torch_output_form(self, tensors):
        """How a torch call makes its output, (form, maker), the cheapest form that gives it:
        like the first input (same shape and dtype, C-contiguous: the key fixes its strides;
        torch.empty's argument parsing costs more than the rest), a new tensor of the first
        input's dtype (no maker), or torch.empty of the shape, dtype and device."""
        first, dtype = tensors[0], TORCH_DTYPES[self._dtype]
        if first is None or first.dtype != dtype:
            return EMPTY, functools.partial(_torch_empty, self._shape, dtype=dtype, device=self.device)
        if tuple(first.shape) == self._shape and first.is_contiguous():
            return LIKE_FIRST, _torch_empty_like
        return NEW_OF_FIRST, None


_REQUIRED = object()  # a Declared parameter without a default
ARRAY, OPTION, FIXED = "a", "o", "f"  # a Declared parameter's part in a call


class Declared:
    """A spec described rather than written: which of the operator's parameters are arrays
    (their signatures in the key, their values the inputs, in parameter order), which are
    options (their values in the key, each admitted by its exact type: a tuple of types,
    ``type(None)`` among them where None is one; a ``tuple`` value only if it holds ints and
    Nones, by their exact types) and which are fixed at their defaults
    (``out=None``, ``return_lse=False``: any other value is the checked path's). The names
    and defaults come from the operator itself (``bind``, which foreign_arrays calls), so a
    parameter added to an operator and not declared here fails at import. The key is the
    parameters' parts in order, fixed ones left out. Called, it is the spec; the C Finder
    makes the same key itself, with no Python run per call."""

    def __init__(self, arrays, options=None, fixed=()):
        self.arrays, self.fixed = tuple(arrays), tuple(fixed)
        self.options = {k: tuple(v) if isinstance(v, tuple) else (v,) for k, v in (options or {}).items()}
        self.params = None  # ((name, part, default, admitted types), ...): bind's

    def bind(self, fn):
        """Read ``fn``'s parameters (positional-or-keyword, then keyword-only)."""
        import inspect

        params, positional = [], 0
        declared = set(self.arrays) | set(self.options) | set(self.fixed)
        for p in inspect.signature(fn).parameters.values():
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                raise TypeError(f"Declared: {fn.__name__}'s parameter {p.name} is neither positional-or-keyword "
                                "nor keyword-only")
            if p.name not in declared:
                raise TypeError(f"Declared: {fn.__name__}'s parameter {p.name} is not declared")
            declared.discard(p.name)
            positional += p.kind == p.POSITIONAL_OR_KEYWORD
            part = ARRAY if p.name in self.arrays else OPTION if p.name in self.options else FIXED
            default = _REQUIRED if p.default is p.empty else p.default
            params.append((p.name, part, default, self.options.get(p.name)))
        if declared:
            raise TypeError(f"Declared: {fn.__name__} has no parameter {sorted(declared)}")
        self.params, self.positional = tuple(params), positional
        self._index = {name: j for j, (name, *_) in enumerate(params)}
        return self

    def c_description(self):
        """What _cfast.Finder takes as ``declared``."""
        return (tuple(p[0] for p in self.params), self.positional, tuple(p[2] for p in self.params),
                "".join(p[1] for p in self.params).encode(), tuple(p[3] for p in self.params), _REQUIRED)

    def __call__(self, sig, *args, **kwargs):
        if self.params is None:
            raise TypeError("Declared: not bound to its operator")
        if len(args) > self.positional:
            return None
        vals = list(args) + [_REQUIRED] * (len(self.params) - len(args))
        for name, v in kwargs.items():
            j = self._index.get(name)
            if j is None or vals[j] is not _REQUIRED:
                return None
            vals[j] = v
        key, arrays = [], []
        for v, (_, part, default, admitted) in zip(vals, self.params):
            if v is _REQUIRED:
                if default is _REQUIRED:
                    return None
                v = default
            if part is ARRAY:
                key.append(sig(v))
                arrays.append(v)
            elif part is OPTION:
                if type(v) not in admitted or (type(v) is tuple and not all(e is None or type(e) is int for e in v)):
                    return None  # (a tuple option holds ints and Nones: _cfast.c says why)
                key.append(v)
            elif v is not default:
                return None
        return tuple(key), tuple(arrays)


class FastCalls:
    """One operator's remembered calls (see the module docstring): ``spec`` names a call's
    signature (a function, or a ``Declared``); ``cupy`` maps (key, device) and ``torch``
    maps key to FastCalls. ``run(args, kwargs)`` is what the operator's Python wrapper
    calls first: the remembered call's result for the first argument's kind, or None (in C,
    a ``_cfast.Dispatch``, which the operator as a ``_cfast.Operator`` calls with the
    arguments as passed: _interop.foreign_arrays)."""

    def __init__(self, spec):
        self.spec = spec
        self.cupy = {}
        self.torch = {}
        self._offered = threading.local()  # what the checked path offered, per thread
        self._c_finders()

    def bind(self, fn):
        """For a ``Declared`` spec, read the operator ``fn``'s parameters (foreign_arrays)."""
        if isinstance(self.spec, Declared):
            self.spec.bind(fn)
            self._c_finders()
        return self

    def _c_finders(self):
        if not USE_C:  # the same lookups in C, with the same signatures (_cfast.cupy_sig / torch_sig)
            return
        declared = self.spec.c_description() if isinstance(self.spec, Declared) and self.spec.params else None
        self.run_cupy = _cfast.Finder(self.spec, self.cupy, False, declared)
        self.run_torch = _cfast.Finder(self.spec, self.torch, True, declared)
        self.run = _cfast.Dispatch(self.run_cupy, self.run_torch)

    def run(self, args, kwargs):
        """The remembered call's result for a CuPy array or CUDA torch tensor first
        argument, or None."""
        if args:
            t = type(args[0])
            if t is CUPY_ARRAY:
                return self.run_cupy(args, kwargs)
            if t in TORCH_TENSORS:
                return self.run_torch(args, kwargs)
        return None

    def offer(self, make):
        """From the checked path, after a launch that read the caller's own arrays:
        ``make()`` builds this call's FastCall (or None), once a signature."""
        self._offered.make = make

    def run_cupy(self, args, kwargs):
        """The remembered call's result on CuPy arrays, or None (not remembered)."""
        if not self.cupy:
            return None
        try:
            found = self.spec(cupy_sig, *args, **kwargs)
            fast = None if found is None else self.cupy.get((found[0], _get_device()))
        except Exception:  # noqa: BLE001 - Unfit, an unhashable option, a bad call: the checked path says
            return None
        return None if fast is None else fast.cupy(found[1])

    def run_torch(self, args, kwargs):
        """The remembered call's result on CUDA torch tensors, or None."""
        if not self.torch:
            return None
        try:
            found = self.spec(torch_sig, *args, **kwargs)
            fast = None if found is None else self.torch.get(found[0])
        except Exception:  # noqa: BLE001 - as run_cupy (and a sparse tensor has no strides)
            return None
        return None if fast is None else fast.torch(found[1])

    def checked(self, fn, args, kwargs, torch_args=None):
        """Run the checked path ``fn`` on ``args`` / ``kwargs`` (CuPy, NumPy or plain values)
        and file what it offers under their key; ``torch_args``: (args, kwargs) of the torch
        call they are the CuPy views of, whose key gets the same FastCall."""
        offered = self._offered
        offered.make = None
        result = fn(*args, **kwargs)
        make, offered.make = offered.make, None
        if make is not None:
            self._file(make, args, kwargs, torch_args)
        return result

    def _key(self, sig, args, kwargs):
        try:
            found = self.spec(sig, *args, **kwargs)
            if found is not None:
                hash(found[0])
                return found[0]
        except Exception:  # noqa: BLE001 - not a call the fast path can describe
            pass
        return None

    def _file(self, make, args, kwargs, torch_args):
        key = self._key(cupy_sig, args, kwargs)
        if key is None:
            return
        key = (key, _get_device())
        fast = self.cupy.get(key)
        if fast is None:
            fast = make()
            if fast is None:
                return
            if len(self.cupy) > _launch.MEMO_LIMIT:  # a program of many distinct shapes
                self.cupy.clear()
            self.cupy[key] = fast
        if torch_args is not None and fast._dtype in TORCH_DTYPES:
            tkey = self._key(torch_sig, *torch_args)
            if tkey is not None:
                if len(self.torch) > _launch.MEMO_LIMIT:
                    self.torch.clear()
                self.torch[tkey] = fast
