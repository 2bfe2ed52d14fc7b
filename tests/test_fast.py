"""CPU tier: the memoized fast calls (cupyops/_fast.py) with stand-ins for CuPy, torch and
the driver: what a FastCall launches (addresses in kernel order, fixed scalars, the
16-byte variant only for aligned inputs, null pointers for absent ones, outputs made per
call, workspace carved per call), what build() refuses, and which calls a FastCalls finds
(the exact layout, dtype and options of a checked call; nothing else)."""
import ctypes
import functools
import os
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

from cupyops import _fast, _launch
from cupyops.ops import _rows


class FakeFunction:
    ptr = 0xF00D


class FakeMemoryPointer:
    """CuPy's MemoryPointer stand-in: an address and the memory object it holds."""

    next_ptr = 0x10000

    def __init__(self, ptr=None, mem=None):
        if ptr is None:
            ptr, FakeMemoryPointer.next_ptr = FakeMemoryPointer.next_ptr, FakeMemoryPointer.next_ptr + 0x1000
        self.ptr, self.mem = ptr, mem if mem is not None else object()


class FakeArray:
    """A CuPy array stand-in: shape, strides, dtype, data (new memory unless given)."""

    def __init__(self, shape, dtype, memptr=None, strides=None, *, ptr=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        step, st = self.dtype.itemsize, []
        for n in reversed(self.shape):
            st.insert(0, step)
            step *= max(n, 1)
        self.strides = strides or tuple(st)
        self.data = memptr if memptr is not None else FakeMemoryPointer(ptr)
        self.itemsize = self.dtype.itemsize

    def offset_view(self):
        """A view one element in: its own MemoryPointer on the same memory."""
        return FakeArray(self.shape, self.dtype, FakeMemoryPointer(self.data.ptr + self.itemsize, self.data.mem))


class FakeTensor:
    """A torch tensor stand-in: element strides, a device index, data_ptr()."""

    def __init__(self, shape, dtype, ptr, device=0, strides=None):
        self.shape, self.dtype, self._ptr, self._device = tuple(shape), dtype, ptr, device
        self._strides = strides or self._c(shape)

    @staticmethod
    def _c(shape):
        out, step = [], 1
        for n in reversed(shape):
            out.insert(0, step)
            step *= max(n, 1)
        return tuple(out)

    def stride(self):
        return self._strides

    def is_contiguous(self):
        return self._strides == self._c(self.shape)

    def new_empty(self, shape):
        return FakeTensor(shape, self.dtype, 0xD00000)

    def get_device(self):
        return self._device

    def element_size(self):
        return np.dtype(self.dtype).itemsize

    def data_ptr(self):
        return self._ptr


_C = {"int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint64": ctypes.c_uint64, "float32": ctypes.c_float}


_CAPTURING_C = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
_CTX_DEVICE_C = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))  # cuCtxGetDevice's
_DIRECT = _launch.DirectLaunch  # (the fixture replaces it with one on its stand-in driver)
# cuLaunchKernel's C signature, for the stand-in driver the C replay calls
_LAUNCH_C = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *(ctypes.c_uint,) * 7, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p)


@pytest.fixture(params=["python", "c"])
def fake(monkeypatch, request):
    """The driver (recording each launch's geometry, stream and arguments, read back by
    their C types), CuPy's allocator and stream, and torch's, as stand-ins; each test runs
    with the Python steps of a FastCall and with the C replay (cupyops/_cfast.c), which
    call the same stand-ins (the C one through a C function pointer)."""
    launched, allocated, templates = [], [], {}
    use_c = request.param == "c"
    if use_c and _fast._cfast is None:
        pytest.skip("cupyops._cfast was not compiled at install")
    monkeypatch.setattr(_fast, "USE_C", use_c)

    def driver_launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        values = [ctypes.cast(slots[i], ctypes.POINTER(ctypes.c_uint64 if a is _launch.ADDRESS else _C[a.dtype.name]))
                  .contents.value for i, a in enumerate(templates[params])]
        launched.append(((gx, bx, smem, stream or 0), values))  # (a null pointer comes as None)
        return 0

    c_driver = _LAUNCH_C(driver_launch)
    real = _launch.DirectLaunch

    def direct(fn, grid, block, smem, args):
        launch = real(fn, grid, block, smem, args, driver_launch=driver_launch,
                      driver_address=ctypes.cast(c_driver, ctypes.c_void_p).value)
        templates[launch._params_ptr] = list(args)
        return launch

    monkeypatch.setattr(_launch, "DirectLaunch", direct)

    def cupy_alloc(n):
        allocated.append(n)
        return FakeMemoryPointer(0x900000 + 0x100000 * len(allocated))

    stream = types.SimpleNamespace(ptr=0x5EA)
    monkeypatch.setattr(_fast, "CUPY_ARRAY", FakeArray)
    monkeypatch.setattr(_fast, "_cupy_alloc", cupy_alloc)
    monkeypatch.setattr(_fast, "_cupy_stream", lambda: stream.ptr)
    device = [0]  # the current device (a test may change it)
    monkeypatch.setattr(_fast, "_get_device", lambda: device[0])
    monkeypatch.setattr(_fast, "_FREE_REFS", _fast._block_refs([FakeMemoryPointer()]))
    made, raw = [], []

    def torch_empty(shape, dtype=None, device=None):
        made.append((shape, dtype, device))
        return FakeTensor(shape, dtype, 0xA00000 + 0x1000 * len(made))

    def raw_alloc(size, stream):
        raw.append(("alloc", size, stream))
        return 0xB00000

    monkeypatch.setattr(_fast, "TORCH_TENSORS", frozenset({FakeTensor}))
    monkeypatch.setattr(_fast, "TORCH_DTYPES", {np.dtype(np.float32): "torch.float32"})
    monkeypatch.setattr(_fast, "_torch_empty", torch_empty)
    monkeypatch.setattr(_fast, "_torch_empty_like", lambda t: FakeTensor(t.shape, t.dtype, 0xC00000))
    monkeypatch.setattr(_fast, "_torch_raw_alloc", raw_alloc)
    monkeypatch.setattr(_fast, "_torch_raw_delete", lambda ptr: raw.append(("delete", ptr)))
    monkeypatch.setattr(_fast, "raw_stream", lambda device: 0x7000 + device)
    capture = [0]  # the stand-in stream's capture status (cuStreamIsCapturing's answer)
    monkeypatch.setattr(_fast, "_stream_capturing", lambda s: capture[0] != 0)

    def is_capturing(s, status):
        status[0] = capture[0]
        return 0

    c_capturing = _CAPTURING_C(is_capturing)
    ctx_error = [0]  # cuCtxGetDevice's answer (201, CUDA_ERROR_INVALID_CONTEXT: no context current)

    def ctx_get_device(d):
        d[0] = device[0]
        return ctx_error[0]

    c_ctx_device = _CTX_DEVICE_C(ctx_get_device)
    # (the Python steps' context query answers as the C one's stand-in: on a machine with a
    # driver, a thread of the test process may have no real context current)
    monkeypatch.setattr(_fast._launch, "has_current_context", lambda: ctx_error[0] == 0)
    monkeypatch.setattr(_fast, "_THREAD", threading.local())
    if use_c:  # the C signature functions and replays see the stand-ins too (the current
        # device from the driver stand-in, as _fast.cupy_loaded binds cuCtxGetDevice)
        old = _fast._cfast.bind(cupy_type=FakeArray, torch_types=frozenset({FakeTensor}), get_device=lambda: device[0],
                                is_capturing=ctypes.cast(c_capturing, ctypes.c_void_p).value,
                                ctx_get_device=ctypes.cast(c_ctx_device, ctypes.c_void_p).value)
        request.addfinalizer(lambda: _fast._cfast.bind(**old))
        # (where a GPU test bound torch's DLPack table in this process, the stand-ins' calls
        # ask the Python attributes and the stand-in stream query; bound again after)
        if _fast.TORCH_DLPACK:
            _fast.bind_torch_dlpack(None)
            request.addfinalizer(lambda: _fast.bind_torch_dlpack(sys.modules["torch"]))
    return types.SimpleNamespace(device=device, launched=launched, allocated=allocated, made=made, raw=raw,
                                 stream=stream, use_c=use_c, c_driver=c_driver, capture=capture,
                                 c_capturing=c_capturing, ctx_error=ctx_error, c_ctx_device=c_ctx_device)


def test_row_fast_call_launches_in_kernel_order(fake):
    # rms_norm's arguments: x, weight, out, rows, n, eps, then the plan's tail and the
    # aligned flag; the 16-byte variant only when every input is 16-byte aligned
    plan = _rows.RowPlan(FakeFunction(), "rms_norm_fused<float, 1>", 256, rows_per_block=8, tail=(32,))
    x, w = FakeArray((4, 6, 128), np.float32, ptr=0x1000), FakeArray((128,), np.float32, ptr=0x2000)
    y = FakeArray((4, 6, 128), np.float32)
    args = (x, w, y, *_rows.shape_args(24, 128), np.float32(0.5))
    fc = _fast.build(plan.fast_variants(24, 128, 4, args), (x, w), y)
    out = fc.cupy((x, w))
    assert isinstance(out, FakeArray) and out is not y and out.shape == (4, 6, 128)
    assert fake.launched == [((3, 256, 0, 0x5EA), [0x1000, 0x2000, out.data.ptr, 24, 128, 0.5, 32, 1])]
    fc.cupy((x, None))  # no weight: a null pointer, still aligned
    assert fake.launched[-1][1][1] == 0 and fake.launched[-1][1][-1] == 1
    fc.cupy((FakeArray((4, 6, 128), np.float32, ptr=0x1004), w))  # a row start off 16 bytes
    assert fake.launched[-1][1][-1] == 0
    # a row length the 16-byte path cannot take keeps the scalar path for aligned inputs too
    fc2 = _fast.build(plan.fast_variants(1, 127, 4, args), (x, w), y)
    fc2.cupy((x, w))
    assert fake.launched[-1][1][-1] == 0


def test_work_pieces_are_carved_from_one_block_kept_for_the_stream(fake):
    q = FakeArray((2, 64), np.float32, ptr=0x1000)
    y = FakeArray((2, 64), np.float32)
    launches = [(FakeFunction(), (5,), (128,), 4096, (q, y, _fast.Work(0), _fast.Work(1), np.int32(3))),
                (FakeFunction(), (6,), (128,), 0, (_fast.Work(0), _fast.Work(1), y))]
    fc = _fast.build((None, launches), (q,), y, work=(1000, 24))
    out = fc.cupy((q,))
    assert fake.allocated == [1024 + 24]  # pieces on 256-byte boundaries
    w = 0x900000 + 0x100000
    assert fake.launched[0] == ((5, 128, 4096, 0x5EA), [0x1000, out.data.ptr, w, w + 1024, 3])
    assert fake.launched[1] == ((6, 128, 0, 0x5EA), [w, w + 1024, out.data.ptr])
    fc.cupy((q,))  # the next call on the stream: the same workspace (ordered after the first)
    assert fake.allocated == [1048] and fake.launched[-1][1][:2] == [w, w + 1024]
    fake.stream.ptr = 0x5EB  # another stream: a workspace of its own
    fc.cupy((q,))
    assert len(fake.allocated) == 2 and fake.launched[-1][0][3] == 0x5EB
    # no launch list for inputs off 16 bytes: the checked path's turn, nothing made
    assert fc.cupy((FakeArray((2, 64), np.float32, ptr=0x1008),)) is None
    assert len(fake.launched) == 6 and len(fake.allocated) == 2


def test_an_output_block_is_reused_only_once_nothing_refers_to_it(fake):
    x = FakeArray((8, 32), np.float32, ptr=0x1000)
    y = FakeArray((8, 32), np.float32)
    one = [(FakeFunction(), (1,), (32,), 0, (x, y))]
    fc = _fast.build((one, one), (x,), y)
    first = fc.cupy((x,))
    held = fc.cupy((x,))  # the first is still held: a block of its own
    assert held.data.ptr != first.data.ptr
    ptr = held.data.ptr
    del held
    again = fc.cupy((x,))  # the block of the dropped one, nothing else on it
    assert again.data.ptr == ptr and fake.launched[-1][1][1] == ptr
    view = again.offset_view()  # a view keeps the block's memory in use
    del again
    other = fc.cupy((x,))
    assert other.data.ptr != ptr
    del view, other
    fake.stream.ptr = 0x5EB  # a block dropped on another stream is not taken
    assert fc.cupy((x,)).data.ptr != ptr


def test_build_refuses_what_it_cannot_replay(fake):
    x, y = FakeArray((8,), np.float32), FakeArray((8,), np.float32)
    copy = FakeArray((8,), np.float32)
    one = [(FakeFunction(), (1,), (32,), 0, (copy, y))]  # reads an array not among the inputs
    assert _fast.build((one, one), (x,), y) is None
    both = [(FakeFunction(), (1,), (32,), 0, (x, x, y))]  # k is v: a later call may differ
    assert _fast.build((both, both), (x, x), y) is None
    struct = [(FakeFunction(), (1,), (32,), 0, (x, y, bytes(128)))]  # a tensor map (addresses inside)
    assert _fast.build((struct, struct), (x,), y) is None


def _spec(sig, x, w=None, *, scale=1.0, flag=False, out=None):
    if out is not None or type(scale) is not float or type(flag) is not bool:
        return None
    return (sig(x), sig(w), scale, flag), (x, w)


def _declared():
    """_spec as a _fast.Declared (bound to _checked_op's operator)."""
    return _fast.Declared(arrays=("x", "w"), options={"scale": float, "flag": bool}, fixed=("out",))


def _checked_op(seen, declared=False):
    """An operator's checked path: launches one kernel on (x, w) into a new output and
    offers the call; counts its runs in ``seen``. Its spec is _spec, or the same declared."""
    fast = _fast.FastCalls(_declared() if declared else _spec)

    def op(x, w=None, *, scale=1.0, flag=False, out=None):
        seen.append(1)
        y = FakeArray(x.shape, x.dtype)
        launches = [(FakeFunction(), (1,), (32,), 0, (x, _fast.Work(0) if w is None else w, y, np.float32(scale)))]
        fast.offer(lambda: _fast.build((launches, launches), (x, w), y, work=(64,)))
        return y

    return fast.bind(op), op


@pytest.mark.parametrize("declared", [False, True], ids=["spec", "declared"])
def test_fast_calls_find_only_the_checked_signature(fake, declared):
    seen = []
    fast, op = _checked_op(seen, declared)
    x, w = FakeArray((4, 32), np.float32), FakeArray((32,), np.float32)
    assert fast.run_cupy((x, w), {}) is None  # nothing remembered yet
    fast.checked(op, (x, w), {"scale": 2.0})
    assert len(seen) == 1 and len(fast.cupy) == 1 and not fast.torch
    y = fast.run_cupy((x, w), {"scale": 2.0})
    assert isinstance(y, FakeArray) and len(seen) == 1  # no checked run
    assert fake.launched[-1][1][:3] == [x.data.ptr, w.data.ptr, y.data.ptr]
    other = FakeArray((4, 32), np.float32)  # same layout, other memory: found
    assert fast.run_cupy((other, w), {"scale": 2.0}) is not None
    misses = [
        ((x, w), {"scale": 3.0}),  # another option value
        ((x, w), {"scale": 2}),  # an int where a float was checked
        ((x, w), {"scale": 2.0, "flag": 0}),  # 0 is not False
        ((x, None), {"scale": 2.0}),  # an absent weight
        ((FakeArray((4, 32), np.float32, strides=(256, 4)), w), {"scale": 2.0}),  # other strides
        ((FakeArray((4, 32), np.float64), w), {"scale": 2.0}),  # another dtype
        ((FakeArray((4, 31), np.float32), w), {"scale": 2.0}),  # another shape
        ((x, np.zeros(32, np.float32)), {"scale": 2.0}),  # a NumPy weight: the checked path says
        ((x, w), {"scale": 2.0, "out": x}),  # out=
        ((x, w), {"scale": 2.0, "bogus": 1}),  # a bad call: the checked path raises
        ((x, [1.0]), {"scale": 2.0}),  # a list
        ((x, w), {"scale": 2.0, "flag": [True]}),  # unhashable
    ]
    if declared:
        misses += [
            ((x, w, 2.0), {}),  # scale is keyword-only
            ((x,), {"w": w, "x": x, "scale": 2.0}),  # x twice
            ((), {"w": w, "scale": 2.0}),  # no x
        ]
    for args, kwargs in misses:
        assert fast.run_cupy(args, kwargs) is None, (args, kwargs)
        assert fast.run(args, kwargs) is None, (args, kwargs)
    assert fast.run((x, w), {"scale": 2.0}) is not None  # run: the first argument's kind
    assert fast.run((x,), {"w": w, "scale": 2.0}) is not None  # (by keyword: the same call)
    assert fast.run((w, x), {"scale": 2.0}) is None and fast.run((), {}) is None
    assert len(seen) == 1


def test_a_tuple_option_is_found_only_for_ints_and_nones(fake):
    # attention's window=(left, right): (3.0, None) and (True, 0) equal (3, None) and (1, 0)
    # as keys, but the checked path refuses them, so the fast path must not run them
    seen = []
    fast = _fast.FastCalls(_fast.Declared(arrays=("x",), options={"window": (type(None), tuple)}, fixed=("out",)))

    def op(x, *, window=None, out=None):
        seen.append(1)
        y = FakeArray(x.shape, x.dtype)
        launches = [(FakeFunction(), (1,), (32,), 0, (x, y))]
        fast.offer(lambda: _fast.build((launches, launches), (x,), y))
        return y

    fast.bind(op)
    x = FakeArray((4, 32), np.float32)
    for window in ((3, None), (1, 0)):
        fast.checked(op, (x,), {"window": window})
    assert len(seen) == 2 and len(fast.cupy) == 2
    for window in ((3, None), (1, 0)):
        assert fast.run_cupy((x,), {"window": window}) is not None, window
    for window in ((3.0, None), (True, 0), (1, False), [1, 0], (3, [None]), (np.int64(3), None)):
        assert fast.run_cupy((x,), {"window": window}) is None, window
        assert fast.spec(_fast.cupy_sig, x, window=window) is None, window
    assert len(seen) == 2


def test_a_declared_key_is_the_parameters_parts_in_order(fake):
    fast, op = _checked_op([], declared=True)
    x, w = FakeArray((4, 32), np.float32), FakeArray((32,), np.float32)
    sig = _fast.cupy_sig
    assert fast.spec(sig, x, w, scale=2.0) == ((sig(x), sig(w), 2.0, False), (x, w))
    assert fast.spec(sig, x, scale=2.0, flag=True) == ((sig(x), None, 2.0, True), (x, None))
    # the C Finder makes the same key: a call filed by the Python spec is found by it
    fast.checked(op, (x,), {"w": w, "scale": 2.0})
    assert fast.run_cupy((FakeArray((4, 32), np.float32),), {"scale": 2.0, "w": w}) is not None


def test_declared_names_every_parameter_of_its_operator():
    def op(x, w=None, *, scale=1.0, out=None):
        pass

    with pytest.raises(TypeError, match="parameter out is not declared"):
        _fast.Declared(arrays=("x", "w"), options={"scale": float}).bind(op)
    with pytest.raises(TypeError, match="no parameter"):
        _fast.Declared(arrays=("x", "w", "bias"), options={"scale": float}, fixed=("out",)).bind(op)

    def star(x, *rest):
        pass

    with pytest.raises(TypeError, match="neither"):
        _fast.Declared(arrays=("x",), fixed=("rest",)).bind(star)


@pytest.mark.parametrize("declared", [False, True], ids=["spec", "declared"])
def test_a_torch_call_files_both_keys(fake, declared):
    seen = []
    fast, op = _checked_op(seen, declared)
    t = FakeTensor((4, 32), np.dtype(np.float32), ptr=0xB000)
    view = FakeArray((4, 32), np.float32, ptr=0xB000)  # the CuPy view the checked path reads
    fast.checked(op, (view,), {}, torch_args=((t,), {}))
    assert len(fast.cupy) == 1 and len(fast.torch) == 1
    y = fast.run_torch((FakeTensor((4, 32), np.dtype(np.float32), ptr=0xC000),), {})
    assert isinstance(y, FakeTensor) and len(seen) == 1
    # the output from torch.empty and the workspace from torch's caching allocator on the
    # call's device, given back after the launch on torch's current stream of it
    assert fake.made == [((4, 32), "torch.float32", 0)]
    assert fake.raw == [("alloc", 64, 0x7000), ("delete", 0xB00000)]
    (head, slots) = fake.launched[-1]
    # (x, the workspace in place of the absent weight, the output)
    assert head[3] == 0x7000 and slots[:3] == [0xC000, 0xB00000, 0xA00000 + 0x1000]
    # another device, other strides: the checked path's turn
    assert fast.run_torch((FakeTensor((4, 32), np.dtype(np.float32), ptr=0xC000, device=1),), {}) is None
    assert fast.run_torch((FakeTensor((4, 32), np.dtype(np.float32), ptr=0xC000, strides=(1, 4)),), {}) is None
    # a CuPy call of the same layout finds the same FastCall
    assert fast.run_cupy((FakeArray((4, 32), np.float32),), {}) is not None
    assert isinstance(fast.run((FakeTensor((4, 32), np.dtype(np.float32), ptr=0xC000),), {}), FakeTensor)
    assert len(seen) == 1


def test_a_torch_call_on_another_current_device_takes_the_checked_path(fake):
    fast, op = _checked_op([])
    t = FakeTensor((4, 32), np.dtype(np.float32), ptr=0xB000)
    fast.checked(op, (FakeArray((4, 32), np.float32, ptr=0xB000),), {}, torch_args=((t,), {}))
    fake.device[0] = 1  # the kernels live in device 0's context (the C replay's device query too)
    assert fast.run_torch((t,), {}) is None


def test_an_offer_is_filed_only_for_its_own_call(fake):
    # a checked call that offers nothing (a copy was made, a NumPy input) files nothing,
    # and a later call does not pick up an earlier call's offer
    fast = _fast.FastCalls(_spec)
    x = FakeArray((4, 32), np.float32)
    fast.offer(lambda: pytest.fail("a stale offer was built"))
    fast.checked(lambda *a, **k: FakeArray((4, 32), np.float32), (x,), {})
    assert not fast.cupy


def test_a_torch_output_takes_the_cheapest_form_that_gives_it(fake):
    # like the first input (same shape and dtype, contiguous), else a new tensor of its
    # dtype, else torch.empty with the dtype
    def run(shape, out_shape, strides=None, dtype=np.float32):
        x = FakeArray(shape, dtype, ptr=0x1000)
        y = FakeArray(out_shape, np.float32)
        one = [(FakeFunction(), (1,), (32,), 0, (x, y))]
        fc = _fast.build((one, one), (x,), y)
        t = FakeTensor(shape, "torch.float32" if dtype == np.float32 else "torch.float64", 0x2000, strides=strides)
        return fc.torch((t,))._ptr

    assert run((4, 32), (4, 32)) == 0xC00000  # empty_like
    assert run((4, 32), (4,)) == 0xD00000  # first.new_empty(shape)
    assert run((4, 32), (4, 32), strides=(1, 4)) == 0xD00000  # not contiguous: new_empty
    assert run((4, 32), (4, 32), dtype=np.float64) == 0xA00000 + 0x1000  # another dtype: torch.empty
    assert fake.made == [((4, 32), "torch.float32", 0)]


def test_the_c_replay_and_finder_are_what_runs(fake):
    # with the extension compiled, a FastCall's cupy/torch and a FastCalls' lookups are the
    # C ones (the "c" runs of every test above exercise them), else the Python methods
    fast, op = _checked_op([])
    fast.checked(op, (FakeArray((4, 32), np.float32),), {})
    (fc,) = fast.cupy.values()
    if fake.use_c:
        assert type(fast.run_cupy) is _fast._cfast.Finder and type(fast.run_torch) is _fast._cfast.Finder
        assert type(fast.run) is _fast._cfast.Dispatch
        assert isinstance(fc, _fast._cfast.Replay) and fc._replay is fc
    else:
        assert fc._replay is None and fast.run_cupy.__func__ is _fast.FastCalls.run_cupy


def test_a_replay_keeps_its_first_torch_form(fake):
    # two threads' first torch calls may both tell the C replay how to make the output;
    # the first answer stays (a second could free a maker the other thread is calling)
    if not fake.use_c:
        pytest.skip("the C replay's")
    x = FakeArray((4, 32), np.float32, ptr=0x1000)
    y = FakeArray((4, 32), np.float32)
    one = [(FakeFunction(), (1,), (32,), 0, (x, y))]
    fc = _fast.build((one, one), (x,), y)
    t = FakeTensor((4, 32), "torch.float32", 0x2000)
    assert fc.torch((t,))._ptr == 0xC00000  # empty_like
    fc._replay.set_torch(2, lambda: pytest.fail("replaced"), *(lambda *a: 0,) * 3)
    assert fc.torch((t,))._ptr == 0xC00000


def test_a_failed_launch_raises_from_the_c_replay(fake, monkeypatch):
    if not fake.use_c:
        pytest.skip("the Python steps launch through CuPy, which raises its own CUDADriverError")
    x = FakeArray((8, 32), np.float32, ptr=0x1000)
    y = FakeArray((8, 32), np.float32)
    bad = _LAUNCH_C(lambda *a: 700)  # CUDA_ERROR_ILLEGAL_ADDRESS
    monkeypatch.setattr(_launch, "DirectLaunch", lambda *a: _DIRECT(
        *a, driver_launch=lambda *b: None, driver_address=ctypes.cast(bad, ctypes.c_void_p).value))
    one = [(FakeFunction(), (1,), (32,), 0, (x, y))]
    fc = _fast.build((one, one), (x,), y)
    with pytest.raises(_fast._cfast.LaunchError, match="CUDA error 700"):
        fc.cupy((x,))


def test_an_interrupt_in_the_spec_is_not_taken_for_a_miss(fake):
    def spec(sig, x):
        raise KeyboardInterrupt

    fast = _fast.FastCalls(spec)
    fast.cupy[("anything", 0)] = None
    with pytest.raises(KeyboardInterrupt):
        fast.run_cupy((FakeArray((4,), np.float32),), {})


def test_nothing_is_kept_or_reused_while_the_stream_captures(fake):
    # a graph captured on the stream goes on using the blocks of its calls after them,
    # replayed on whatever stream: an eager call must not take them (NOTES 78)
    x = FakeArray((8, 32), np.float32, ptr=0x1000)
    y = FakeArray((8, 32), np.float32)
    launches = [(FakeFunction(), (1,), (32,), 0, (x, y, _fast.Work(0)))]
    fc = _fast.build((launches, launches), (x,), y, work=(64,))
    eager = fc.cupy((x,))
    eager_ptr, work_ptr = eager.data.ptr, fake.launched[-1][1][2]
    del eager  # free: an eager call would take its block again
    fake.capture[0] = 1
    captured = [fc.cupy((x,)) for _ in range(2)]
    ptrs = [c.data.ptr for c in captured]
    works = [v[2] for _, v in fake.launched[-2:]]
    assert eager_ptr not in ptrs and work_ptr not in works and len(set(works)) == 2
    del captured  # dropped after the capture: still not the eager calls' to take
    fake.capture[0] = 0
    again = fc.cupy((x,))
    assert again.data.ptr == eager_ptr and fake.launched[-1][1][2] == work_ptr
    assert again.data.ptr not in ptrs and fake.launched[-1][1][2] not in works


def test_a_kept_array_reshaped_or_watched_is_not_reused(fake):
    import weakref

    x = FakeArray((8, 32), np.float32, ptr=0x1000)
    y = FakeArray((8, 32), np.float32)
    one = [(FakeFunction(), (1,), (32,), 0, (x, y))]
    fc = _fast.build((one, one), (x,), y)
    first = fc.cupy((x,))
    ptr = first.data.ptr
    watch = weakref.ref(first)
    del first
    nxt = fc.cupy((x,))
    if fake.use_c:  # the C replay reuses the array object itself, never one someone watches:
        # it lets that one go (the watcher sees it die, as without the replay)
        assert watch() is None and nxt.data.ptr != ptr
    del nxt
    second = fc.cupy((x,))
    ptr = second.data.ptr
    second.shape = (256,)  # a reshape in place (ndarray.shape's setter)
    del second
    third = fc.cupy((x,))
    assert third.shape == (8, 32)


def test_placement_tells_apart_interleaved_and_shared_memory(fake):
    # the key part of in-place calls that write two arrays (rope's q and k, add_rms_norm's
    # x and residual): "apart" for disjoint byte ranges, else the address difference
    buf = FakeArray((6, 3 * 64), np.float32, ptr=0x10000)
    q = FakeArray((6, 2, 32), np.float32, buf.data, strides=(3 * 64 * 4, 32 * 4, 4))  # head slices
    k = FakeArray((6, 1, 32), np.float32, FakeMemoryPointer(0x10000 + 64 * 4, buf.data.mem), strides=(3 * 64 * 4, 32 * 4, 4))
    assert _fast.placement(q, k) == 64 * 4  # interleaved rows of one buffer: where exactly
    other = FakeArray((6, 1, 32), np.float32, ptr=0x90000)
    assert _fast.placement(q, other) == "apart" and _fast.placement(other, q) == "apart"
    assert _fast.placement(q, q) == 0
    t1 = FakeTensor((4, 8), np.dtype(np.float32), 0x20000)
    t2 = FakeTensor((4, 8), np.dtype(np.float32), 0x20000 + 4 * 8 * 4)  # right after
    assert _fast.placement(t1, t2) == "apart"
    t3 = FakeTensor((4, 8), np.dtype(np.float32), 0x20000 + 4)  # one element on
    assert _fast.placement(t1, t3) == 4
    with pytest.raises(_fast.Unfit):
        _fast.placement(q, np.zeros(3))


def test_apart_compares_byte_ranges(fake):
    # kv_cache_append's fast key takes only calls whose inputs lie apart from the caches
    cache = FakeArray((4, 16, 2, 8), np.float32, ptr=0x100000)
    inside = FakeArray((2, 1, 2, 8), np.float32, ptr=0x100000 + 64)  # a view into the cache
    after = FakeArray((2, 1, 2, 8), np.float32, ptr=0x100000 + cache.strides[0] * 4)  # right after it
    assert not _fast.apart((inside,), (cache,))
    assert _fast.apart((after, None), (cache, None))
    assert not _fast.apart((after, inside), (cache,))


# ------------------------------------------------------------------ the operator as a C callable
def _operator(seen, declared=True):
    """_checked_op's operator wrapped as foreign_arrays wraps a public one: a _cfast.Operator
    where the fast calls run in C (the "c" runs), else the Python wrapper; ``seen`` gets the
    checked path's arguments."""
    fast = _fast.FastCalls(_declared() if declared else _spec)

    def op(x, w=None, *, scale=1.0, flag=False, out=None):
        """The stand-in operator's doc."""
        seen.append((x, w, scale, flag, out))
        y = FakeArray(x.shape, x.dtype)
        launches = [(FakeFunction(), (1,), (32,), 0, (x, _fast.Work(0) if w is None else w, y, np.float32(scale)))]
        fast.offer(lambda: _fast.build((launches, launches), (x, w), y, work=(64,)))
        return y

    from cupyops import _interop

    return _interop.foreign_arrays(fast=fast)(op), op, fast


@pytest.mark.parametrize("declared", [False, True], ids=["spec", "declared"])
def test_an_operator_finds_its_calls_as_passed_and_hands_on_the_rest(fake, declared):
    seen = []
    wrapped, op, fast = _operator(seen, declared)
    assert (type(wrapped) is _fast._cfast.Operator) == fake.use_c
    x, w = FakeArray((4, 32), np.float32), FakeArray((32,), np.float32)
    wrapped(x, w, scale=2.0)  # checked, and remembered
    assert len(seen) == 1 and len(fast.cupy) == 1
    hits = [lambda: wrapped(x, w, scale=2.0), lambda: wrapped(x, w=w, scale=2.0),
            lambda: wrapped(x, scale=2.0, w=w), lambda: wrapped(*(x, w), **{"scale": 2.0}),
            lambda: functools.partial(wrapped, scale=2.0)(x, w), lambda: wrapped(x, w, scale=2.0, flag=False, out=None)]
    for i, call in enumerate(hits):
        before = len(fake.launched)
        y = call()
        assert isinstance(y, FakeArray) and len(seen) == 1, i  # no checked run
        assert len(fake.launched) == before + 1 and fake.launched[-1][1][:3] == [x.data.ptr, w.data.ptr, y.data.ptr], i
    # a call not remembered reaches the checked path with its arguments as given
    wrapped(x, w, scale=3.0)
    assert seen[-1] == (x, w, 3.0, False, None)
    wrapped(x=x, w=w, scale=2.0)  # (no positional argument: the checked path, as ever)
    assert seen[-1] == (x, w, 2.0, False, None) and len(seen) == 3
    # bad calls: the checked path's errors, word for word those of the function itself
    for args, kwargs in [((x, w, 2.0), {}), ((x, w), {"bogus": 1}), ((), {}), ((x,), {"x": x}),
                         ((x, w), {"scale": 2.0, "w": w})]:
        with pytest.raises(TypeError) as direct:
            op(*args, **kwargs)
        with pytest.raises(TypeError) as through:
            wrapped(*args, **kwargs)
        assert str(through.value) == str(direct.value), (args, kwargs)
    assert len(seen) == 3


def test_an_operator_is_its_function_to_users_and_tools():
    import copy
    import inspect
    import pickle
    import pydoc
    import weakref

    import cupyops
    from cupyops.ops import norm

    ops = [cupyops.softmax, cupyops.rms_norm, cupyops.layer_norm, cupyops.sum, cupyops.max, cupyops.matmul,
           cupyops.attention, cupyops.silu_and_mul, cupyops.attention_paged, cupyops.sample, norm._add_rms_norm]
    for op in ops:
        fn = op.__wrapped__
        assert type(op) is (_fast._cfast.Operator if _fast.USE_C else types.FunctionType), op
        for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
            assert getattr(op, attr) == getattr(fn, attr), (fn.__name__, attr)
        assert inspect.signature(op) == inspect.signature(fn) and inspect.isroutine(op)
        # help(): the function's page, but for its first line (pydoc names the type there)
        assert pydoc.render_doc(op, renderer=pydoc.plaintext).split("\n", 1)[1] == \
            pydoc.render_doc(fn, renderer=pydoc.plaintext).split("\n", 1)[1]
        assert pickle.loads(pickle.dumps(op)) is op and copy.deepcopy(op) is op and weakref.ref(op)() is op
        assert repr(op).startswith(f"<function {fn.__qualname__} at ")
    assert str(inspect.signature(cupyops.softmax)) == "(x, axis=-1, out=None, *, impl='auto')"

    class Model:  # in a class body an operator binds as a function does
        norm = cupyops.rms_norm

    assert Model.norm is cupyops.rms_norm
    bound = Model().norm
    assert bound.__func__ is cupyops.rms_norm and isinstance(bound.__self__, Model)


def test_without_the_c_extension_operators_are_python_functions(tmp_path):
    import cupyops

    code = ("import inspect, types, cupyops; from cupyops import _fast; op = cupyops.softmax; "
            "print(_fast.USE_C, type(op).__name__, inspect.signature(op), op.__wrapped__.__name__)")
    # (the package this process imported, with its built extension: run from elsewhere, a
    # checkout's source tree in the working directory would shadow an installed package)
    home = os.path.dirname(os.path.dirname(os.path.abspath(cupyops.__file__)))
    for flag in ("0", "1"):
        env = dict(os.environ, CUPYOPS_FAST_C=flag, PYTHONPATH=home)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                             cwd=tmp_path).stdout
        c = flag == "1" and _fast._cfast is not None
        assert out.split() == [str(c), "Operator" if c else "function", "(x,", "axis=-1,", "out=None,", "*,",
                               "impl='auto')", "softmax"], out


def test_a_torch_key_is_one_flat_tuple(fake):
    # no torch.Size in a key (NOTES 91): shape, strides, dtype and device in one tuple, the
    # same from the Python and the C signature function (the C Finder finds Python's keys)
    t = FakeTensor((4, 32), "torch.float32", 0x1000)
    s = FakeTensor((4, 32), "torch.float32", 0x1000, device=1, strides=(64, 2))
    assert _fast.torch_sig(t) == (4, 32, 32, 1, "torch.float32", 0)
    assert _fast.torch_sig(s) == (4, 32, 64, 2, "torch.float32", 1) and _fast.torch_sig(None) is None
    if fake.use_c:
        for a in (t, s, FakeTensor((), "torch.float32", 0x1000), None):
            assert _fast._cfast.torch_sig(a) == _fast.torch_sig(a)
        with pytest.raises(_fast.Unfit):
            _fast._cfast.torch_sig(np.zeros(3))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):  # dlpack.h's layouts
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_DLTENSOR_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_DLTensor))
_STREAM_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


class _DLPackAPI(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev_api", ctypes.c_void_p),
                ("allocator", ctypes.c_void_p), ("managed_from_py", ctypes.c_void_p), ("managed_to_py", ctypes.c_void_p),
                ("dltensor_from_py", _DLTENSOR_FN), ("current_work_stream", _STREAM_FN)]


def _fake_dlpack_table(major=1):
    """A DLPack C exchange table over FakeTensors (float32 as DLPack's float code 2, 32
    bits; a tensor whose data_ptr is 0xBAD0 declined), in a capsule as torch gives it, and
    the calls it answered."""
    kept, calls = [], []  # (the shape / stride arrays must outlive a call, as torch's do)

    def dltensor(obj, out):
        t = ctypes.cast(obj, ctypes.py_object).value
        calls.append(("tensor", t))
        if not isinstance(t, FakeTensor) or t.data_ptr() == 0xBAD0:
            return -1
        n = len(t.shape)
        shape, strides = (ctypes.c_int64 * max(n, 1))(*t.shape), (ctypes.c_int64 * max(n, 1))(*t._strides)
        kept.append((shape, strides))
        out[0].data, out[0].byte_offset = t.data_ptr() - 0x10, 0x10  # (data + byte_offset: the address)
        out[0].device.device_type, out[0].device.device_id = 2, t.get_device()
        out[0].ndim, out[0].shape, out[0].strides = n, shape, strides
        out[0].dtype.code, out[0].dtype.bits, out[0].dtype.lanes = 2, 32, 1
        return 0

    def stream(device_type, device_id, out):
        calls.append(("stream", device_type, device_id))
        out[0] = 0x8000 + device_id
        return 0

    fns = (_DLTENSOR_FN(dltensor), _STREAM_FN(stream))
    api = _DLPackAPI(major, 3, None, None, None, None, *fns)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    name = b"dlpack_exchange_api"
    capsule = new(ctypes.addressof(api), name, None)
    return types.SimpleNamespace(capsule=capsule, calls=calls, keep=(api, fns, name, kept))


def test_torch_tensors_read_through_a_dlpack_table_as_through_their_attributes(fake, monkeypatch):
    # with DLPack's C exchange table bound (torch >= 2.11), the C calls read a tensor's
    # layout, device and address and the current stream through it, not its attributes
    # (stride() is spied on); what they read equals the attributes' answers, and a tensor
    # the table declines is read through those
    if not fake.use_c:
        pytest.skip("the table serves the C calls")
    table = _fake_dlpack_table()
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    asked, real_stride = [], FakeTensor.stride
    monkeypatch.setattr(FakeTensor, "stride", lambda self: asked.append(1) or real_stride(self))
    assert _fast._cfast.bind_torch_dlpack(table.capsule, [FakeTensor((0,), f32, 0x1000)])
    try:
        for t in (FakeTensor((4, 32), f32, 0x1000), FakeTensor((4, 32), f32, 0x1000, device=1, strides=(64, 2)),
                  FakeTensor((), f32, 0x1000), FakeTensor((4, 32), f32, 0xBAD0)):
            want = (*t.shape, *real_stride(t), f32, t.get_device())
            table.calls.clear()
            asked.clear()
            assert _fast._cfast.torch_sig(t) == want
            assert table.calls == [("tensor", t)] and bool(asked) == (t.data_ptr() == 0xBAD0)  # (declined)
        assert _fast._cfast.dl_describe(FakeTensor((3,), f32, 0x2000)) == (0x2000, (3,), (1,), 2 | 32 << 8 | 1 << 16,
                                                                              2, 0)
        assert _fast._cfast.dl_describe(FakeTensor((3,), f32, 0xBAD0)) is None
        assert _fast._cfast.dl_current_stream(1) == 0x8001
        # a replay: input and output addresses from the table, torch's stream of the device from it
        fast, op = _checked_op([], declared=True)
        t = FakeTensor((4, 32), f32, ptr=0xB000)
        fast.checked(op, (FakeArray((4, 32), np.float32, ptr=0xB000),), {}, torch_args=((t,), {}))
        table.calls.clear()
        y = fast.run((FakeTensor((4, 32), f32, ptr=0xC000),), {})
        assert isinstance(y, FakeTensor)
        (head, slots) = fake.launched[-1]
        assert head[3] == 0x8000 and slots[0] == 0xC000 and slots[2] == y.data_ptr()
        assert ("stream", 2, 0) in table.calls and sum(c[0] == "tensor" for c in table.calls) >= 3
        # two dtypes the table reports as one DLPack dtype (the stand-in reports every tensor
        # as float32): the layout still from the table, the dtype from each tensor's attribute
        assert _fast._cfast.bind_torch_dlpack(table.capsule, [FakeTensor((0,), f32, 0x1000),
                                                              FakeTensor((0,), i32, 0x1000)])
        for dtype in (f32, i32):
            asked.clear()
            assert _fast._cfast.torch_sig(FakeTensor((4, 32), dtype, 0x1000)) == (4, 32, 32, 1, dtype, 0)
            assert not asked
        # a table of another major version and no older one in its chain is not bound
        other = _fake_dlpack_table(major=2)  # (held: the capsule does not own the table)
        assert not _fast._cfast.bind_torch_dlpack(other.capsule, [])
        assert _fast._cfast.dl_current_stream(0) is None
    finally:
        _fast._cfast.bind_torch_dlpack(None, ())


def test_a_finder_runs_a_replay_itself_and_calls_anything_else(fake):
    # a FastCall that is its C replay is run by the C Finder itself: nothing looked up on
    # it (its torch side once its first torch call, FastCall.torch, has set it); any other
    # value has its method called with a tuple of the inputs, as the Python finder does
    fast, op = _checked_op([], declared=True)
    x = FakeArray((4, 32), np.float32)
    t = FakeTensor((4, 32), np.dtype(np.float32), ptr=0xB000)
    fast.checked(op, (FakeArray((4, 32), np.float32, ptr=0xB000),), {}, torch_args=((t,), {}))
    (fc,) = fast.cupy.values()
    assert fc._torch_like is None and isinstance(fast.run((t,), {}), FakeTensor)  # FastCall.torch's first call
    assert fc._torch_like is not None
    got = []

    def spy(inputs):
        got.append(inputs)
        return "stand-in"

    fc.cupy = fc.torch = spy  # instance attributes over the methods
    ran = fast.run((x,), {}), fast.run((t,), {"scale": 1.0})
    if fake.use_c:
        assert isinstance(ran[0], FakeArray) and isinstance(ran[1], FakeTensor) and not got
    else:
        assert ran == ("stand-in", "stand-in") and got == [(x, None), (t, None)]
    got.clear()
    for table, kind in ((fast.cupy, "cupy"), (fast.torch, "torch")):
        for key in table:
            table[key] = types.SimpleNamespace(**{kind: spy})
    assert fast.run((x,), {}) == "stand-in" and fast.run((t,), {}) == "stand-in"
    assert got == [(x, None), (t, None)]


def test_the_current_device_comes_from_the_driver(fake, monkeypatch):
    # cuCtxGetDevice (bound as _fast.cupy_loaded binds it) answers for runtime.getDevice in
    # the Finder's CuPy key and the Replay's torch check; where it has no answer (no context
    # current: a thread that made no CUDA call, where a launch would fail) the call is the
    # checked path's, even on the kernels' device; where it is not bound, getDevice is asked
    if not fake.use_c:
        pytest.skip("the C calls'")
    asked = []

    def get_device():
        asked.append(1)
        return fake.device[0]

    _fast._cfast.bind(get_device=get_device)  # (the Finder's)
    monkeypatch.setattr(_fast, "_get_device", get_device)  # (the Replays are built with it)
    fast, op = _checked_op([], declared=True)
    t = FakeTensor((4, 32), np.dtype(np.float32), ptr=0xB000)
    x = FakeArray((4, 32), np.float32)
    fast.checked(op, (FakeArray((4, 32), np.float32, ptr=0xB000),), {}, torch_args=((t,), {}))
    asked.clear()
    assert fast.run((t,), {}) is not None and fast.run((x,), {}) is not None
    assert _fast._cfast.ctx_device() == 0 and not asked
    fake.device[0] = 1  # another current device: the kernels are device 0's
    assert fast.run((t,), {}) is None and fast.run((x,), {}) is None and not asked
    fake.device[0] = 0
    fake.ctx_error[0] = 201  # no context current: a miss, whatever getDevice would say
    assert _fast._cfast.ctx_device() is None
    assert fast.run((t,), {}) is None and fast.run((x,), {}) is None and not asked
    fake.ctx_error[0] = 0
    assert fast.run((t,), {}) is not None and fast.run((x,), {}) is not None and not asked
    _fast._cfast.bind(ctx_get_device=None)  # unbound: getDevice says
    assert fast.run((t,), {}) is not None and fast.run((x,), {}) is not None and len(asked) == 2
    assert _fast._cfast.ctx_device() is None


def test_a_thread_without_a_context_takes_the_checked_path(fake, monkeypatch):
    # the Python steps ask, once a thread until the answer is yes, whether a CUDA context is
    # current (a launch through the driver needs one; a fresh thread has none): until then
    # a call is the checked path's (the C replay asks cuCtxGetDevice: the test above)
    if fake.use_c:
        pytest.skip("the Python steps'")
    answer = [False]
    monkeypatch.setattr(_fast._launch, "has_current_context", lambda: answer[0])
    monkeypatch.setattr(_fast, "_THREAD", threading.local())
    fast, op = _checked_op([], declared=True)
    t = FakeTensor((4, 32), np.dtype(np.float32), ptr=0xB000)
    x = FakeArray((4, 32), np.float32)
    fast.checked(op, (FakeArray((4, 32), np.float32, ptr=0xB000),), {}, torch_args=((t,), {}))
    assert fast.run((t,), {}) is None and fast.run((x,), {}) is None
    answer[0] = True
    assert fast.run((t,), {}) is not None and fast.run((x,), {}) is not None
    answer[0] = False  # (remembered for the thread once yes)
    assert fast.run((t,), {}) is not None and fast.run((x,), {}) is not None


def test_the_context_query_asks_the_driver_each_time(monkeypatch):
    # has_current_context answers for the calling thread at the moment (cuCtxGetCurrent):
    # nothing of it may be remembered for the process (_fast remembers a yes per thread)
    current = [None]

    def get_current(ref):
        ref._obj.value = current[0]
        return 0

    monkeypatch.setattr(_launch, "_libcuda", lambda: types.SimpleNamespace(cuCtxGetCurrent=get_current))
    assert not _launch.has_current_context()
    current[0] = 0x1000
    assert _launch.has_current_context()
    current[0] = None
    assert not _launch.has_current_context()
    monkeypatch.setattr(_launch, "_libcuda", lambda: types.SimpleNamespace())  # (no driver: the launch says)
    assert _launch.has_current_context()


def test_the_c_objects_are_initialised_once(fake):
    if not fake.use_c:
        pytest.skip("the C objects'")
    fast = _fast.FastCalls(_declared())
    c = _fast._cfast
    with pytest.raises(RuntimeError, match="once"):
        fast.run_cupy.__init__(_spec, {}, False)
    with pytest.raises(RuntimeError, match="once"):
        fast.run.__init__(fast.run_cupy, fast.run_torch)
    operator_ = c.Operator(fast.run, print)
    with pytest.raises(RuntimeError, match="once"):
        operator_.__init__(fast.run, print)
    with pytest.raises(TypeError, match="before its __init__"):
        c.Operator.__new__(c.Operator)(1)
    with pytest.raises(TypeError, match="callable"):
        c.Operator(fast.run, None)
    with pytest.raises(RuntimeError, match="not initialised"):  # (a FastCall without C replay)
        c.Replay.cupy(c.Replay.__new__(c.Replay), ())
