"""GPU tier: the memoized fast paths (cupyops/_fast.py) of softmax, layer_norm, rms_norm,
sum, max, matmul (split-K decode shapes) and decode attention, on CuPy arrays and on CUDA
torch tensors. A repeated call gives the checked call's bits in a fresh output; a call of
the same operator with another layout (strides, a misaligned start, dtype, shape) gives
what the checked path gives; torch calls return torch tensors made by torch's allocator,
on torch's current stream; CUDA graphs (CuPy's stream capture, torch.cuda.graph) capture
the fast calls, and replay them on new values."""
import contextlib

import numpy as np
import pytest

import cupyops
from cupyops.ops import attention as attention_op
from cupyops.ops import gemm, norm, reduce, softmax

pytestmark = pytest.mark.gpu

FAST = {"softmax": softmax._FAST, "rms_norm": norm._FAST["rms_norm"], "layer_norm": norm._FAST["layer_norm"],
        "sum": reduce._FAST["sum"], "max": reduce._FAST["max"], "matmul": gemm._FAST,
        "attention": attention_op._FAST}


def _cp():
    import cupy

    return cupy


def _dtype(name):
    from cupyops import _dtypes

    return _dtypes.to_dtype(name)


def rand(shape, dtype, seed):
    cp = _cp()
    return cp.random.RandomState(seed).standard_normal(shape, dtype=cp.float32).astype(_dtype(dtype))


def misaligned(a):
    """``a``'s values in an array that starts one element past a 16-byte boundary (same
    shape and strides: the fast path's key, with an address it must notice)."""
    cp = _cp()
    buf = cp.empty(a.size + 1, a.dtype)
    out = buf[1:].reshape(a.shape)
    out[...] = a
    return out


def strided(a):
    """``a``'s values in a view of the same shape whose rows are twice as far apart."""
    cp = _cp()
    buf = cp.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    out = buf[..., : a.shape[-1]]
    out[...] = a
    return out


# op -> (make the CuPy operands of a dtype, the call on operands {name: array})
def _rows_operands(dtype, seed, n=1024):
    return {"x": rand((8, n), dtype, seed), "w": rand((n,), dtype, seed + 1), "b": rand((n,), dtype, seed + 2)}


OPS = {
    "softmax": (_rows_operands, lambda o: cupyops.softmax(o["x"])),
    "rms_norm": (_rows_operands, lambda o: cupyops.rms_norm(o["x"], o["w"])),
    "layer_norm": (_rows_operands, lambda o: cupyops.layer_norm(o["x"], o["w"], o["b"])),
    "sum": (_rows_operands, lambda o: cupyops.sum(o["x"], axis=-1)),
    "max": (_rows_operands, lambda o: cupyops.max(o["x"], axis=-1)),
    # 8 x 1024 @ (1024 x 1024).T: 8 tiles of 64 x 128, split over K (_gemm_mma.split_plan)
    "matmul": (lambda dtype, seed: {"x": rand((8, 1024), dtype, seed), "W": rand((1024, 1024), dtype, seed + 1)},
               lambda o: cupyops.matmul(o["x"], o["W"].T)),
    # 4 sequences of one token, 8 query heads over 2 KV heads, 1024 cached keys: split KV
    "attention": (lambda dtype, seed: {"q": rand((4, 1, 8, 64), dtype, seed), "k": rand((4, 1024, 2, 64), dtype, seed + 1),
                                       "v": rand((4, 1024, 2, 64), dtype, seed + 2)},
                  lambda o: cupyops.attention(o["q"], o["k"], o["v"])),
}
# (matmul: float32 runs the skinny rung, whose split-K counters are per stream: no fast path)
FAST_DTYPES = {op: (("float16", "bfloat16") if op == "matmul" else ("float32", "float16", "bfloat16")) for op in OPS}
CASES = [(op, d) for op in OPS for d in FAST_DTYPES[op]]


@contextlib.contextmanager
def checked_only(op):
    """Calls of ``op`` take the checked path and file nothing (a signature of no call)."""
    fast = FAST[op]
    spec, fast.spec = fast.spec, lambda *args, **kwargs: None
    try:
        yield
    finally:
        fast.spec = spec


def bits(a):
    """A CuPy or torch array's bytes on the host, for bit-for-bit comparisons."""
    if not isinstance(a, _cp().ndarray):
        a = _cp().from_dlpack(a.detach())
    return _cp().asnumpy(a).view(np.uint8)


def same_bits(got, want, what):
    assert tuple(got.shape) == tuple(want.shape), what
    np.testing.assert_array_equal(bits(got), bits(want), err_msg=what)


def other_layouts(op, operands):
    """The same values in other layouts of the fast path's key: a misaligned start, strided
    rows (rows ops), the other weight layout (matmul), a cache view (attention)."""
    if op == "matmul":
        W = operands["W"]
        yield "misaligned x", {**operands, "x": misaligned(operands["x"])}
        yield "x with strided rows", {**operands, "x": strided(operands["x"])}
        yield "W as a transposed copy", {**operands, "W": _cp().ascontiguousarray(W.T).T}
    elif op == "attention":
        cp = _cp()
        k, v = operands["k"], operands["v"]
        ck, cv = (cp.zeros((k.shape[0], k.shape[1] + 64) + k.shape[2:], k.dtype) for _ in range(2))
        ck[:, : k.shape[1]], cv[:, : k.shape[1]] = k, v
        yield "k and v in a longer cache", {**operands, "k": ck[:, : k.shape[1]], "v": cv[:, : k.shape[1]]}
        yield "misaligned q", {**operands, "q": misaligned(operands["q"])}
        yield "q a head slice of qkv", {**operands, "q": strided(operands["q"])}
    else:
        yield "misaligned x", {**operands, "x": misaligned(operands["x"])}
        yield "x with strided rows", {**operands, "x": strided(operands["x"])}
        if op in ("rms_norm", "layer_norm"):
            yield "misaligned weight", {**operands, "w": misaligned(operands["w"])}


@pytest.mark.parametrize("op,dtype", CASES)
def test_cupy_fast_path_repeats_the_checked_call_and_rechecks_layout(op, dtype):
    make, call = OPS[op]
    operands = make(dtype, 1)
    with checked_only(op):
        want = call(operands)
    first = call(operands)  # checked, and remembered
    assert FAST[op].cupy, f"{op}: nothing remembered"
    second = call(operands)  # the fast path
    assert second.data.ptr != first.data.ptr, "a fresh output each call"
    same_bits(first, want, f"{op} {dtype} checked")
    same_bits(second, want, f"{op} {dtype} fast")
    for what, other in other_layouts(op, operands):
        with checked_only(op):
            want_other = call(other)
        for _ in range(2):  # (the second of each may take a fast call of its own)
            same_bits(call(other), want_other, f"{op} {dtype} {what}")
    # another dtype and another shape of the same op: their own checked calls
    for d in FAST_DTYPES[op]:
        if d != dtype:
            o = make(d, 2)
            with checked_only(op):
                w = call(o)
            same_bits(call(o), w, f"{op} {d} after {dtype}")
            same_bits(call(o), w, f"{op} {d} after {dtype}, again")
    if op not in ("matmul", "attention"):
        o = _rows_operands(dtype, 3, n=1000)
        with checked_only(op):
            w = call(o)
        same_bits(call(o), w, f"{op} {dtype} n=1000")
        same_bits(call(o), w, f"{op} {dtype} n=1000, again")


@pytest.mark.parametrize("op,dtype", CASES)
def test_torch_fast_path_gives_the_cupy_bits(op, dtype):
    torch = pytest.importorskip("torch")
    make, call = OPS[op]
    operands = make(dtype, 4)
    with checked_only(op):
        want = call(operands)
    tensors = {k: torch.from_dlpack(v) for k, v in operands.items()}
    got = [call(tensors) for _ in range(3)]  # checked (files the torch key), then fast
    assert FAST[op].torch, f"{op}: no torch call remembered"
    for i, t in enumerate(got):
        assert isinstance(t, torch.Tensor) and t.device == tensors["x" if "x" in tensors else "q"].device
        assert not t.requires_grad
        same_bits(t, want, f"{op} {dtype} torch call {i}")
    assert got[1].data_ptr() != got[2].data_ptr()
    for what, other in other_layouts(op, operands):
        with checked_only(op):
            want_other = call(other)
        t_other = {k: torch.from_dlpack(v) for k, v in other.items()}
        for _ in range(2):
            same_bits(call(t_other), want_other, f"{op} {dtype} torch {what}")
    # a parameter that requires grad (a model's weight) is read as detached, fast too
    if op in ("rms_norm", "layer_norm", "matmul"):
        name = "W" if op == "matmul" else "w"
        param = {**tensors, name: torch.nn.Parameter(tensors[name].clone())}
        for _ in range(2):
            r = call(param)
            assert not r.requires_grad
            same_bits(r, want, f"{op} {dtype} with a Parameter")


def test_torch_fast_path_runs_on_torchs_current_stream_with_torchs_memory():
    torch = pytest.importorskip("torch")
    x = torch.randn((4096, 4096), device="cuda").to(torch.bfloat16)
    w = torch.randn((4096,), device="cuda").to(torch.bfloat16)
    cupyops.rms_norm(x, w)  # checked; the next calls are fast
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    kept = []
    with torch.cuda.stream(side):
        for _ in range(2):
            before = torch.cuda.memory_allocated()
            # a long kernel queued first on the side stream: the result is only right if
            # cupyops' kernel is ordered after it on the same stream
            x.mul_(2.0)
            y = cupyops.rms_norm(x, w)
            kept.append(y)
            assert torch.cuda.memory_allocated() - before >= y.numel() * y.element_size()
    side.synchronize()
    want = torch.nn.functional.rms_norm(x.float(), (4096,), w.float(), eps=1e-6)
    torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)


def test_cupy_output_blocks_are_reused_only_once_free():
    # a fast call keeps its last output block for the next call on the stream, but takes it
    # only when no array or view refers to it any more
    x, w = rand((8, 1024), "bfloat16", 30), rand((1024,), "bfloat16", 31)
    cupyops.rms_norm(x, w)
    a = cupyops.rms_norm(x, w)
    want = a.copy()
    view, ptr = a[1:], a.data.ptr
    del a
    b = cupyops.rms_norm(rand((8, 1024), "bfloat16", 32), w)  # other values, same layout
    assert b.data.ptr != ptr
    same_bits(view, want[1:], "a view of a dropped result")
    del view, b
    for _ in range(3):
        c = cupyops.rms_norm(x, w)
        same_bits(c, want, "a result in a reused block")


def test_torch_out_tensors_and_bad_input_take_the_checked_path():
    torch = pytest.importorskip("torch")
    x = torch.randn((8, 1024), device="cuda").to(torch.float16)
    for _ in range(2):
        cupyops.softmax(x)  # remembered
    out = torch.empty_like(x)
    assert cupyops.softmax(x, out=out) is out
    torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), rtol=2e-3, atol=1e-5)
    with pytest.raises(TypeError, match="axis"):
        cupyops.softmax(x, axis=1.0)
    with pytest.raises(TypeError, match="weight"):
        cupyops.rms_norm(x, torch.ones(1024, device="cuda", dtype=torch.float32))
    w = torch.ones(1024, device="cuda", dtype=torch.float16)
    for _ in range(2):
        cupyops.rms_norm(x, w)
    with pytest.raises(TypeError, match="eps"):
        cupyops.rms_norm(x, w, eps="small")


def _no_checked_calls(monkeypatch):
    for name, fast in FAST.items():
        def refuse(*args, _name=name, **kwargs):
            raise AssertionError(f"{_name}: the checked path ran during capture")

        monkeypatch.setattr(fast, "checked", refuse)


def test_cupy_stream_capture_takes_the_fast_paths(monkeypatch):
    cp = _cp()
    operands = {op: OPS[op][0]("bfloat16", 10 + i) for i, op in enumerate(OPS)}
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for op, (_, call) in OPS.items():
            for _ in range(2):  # checked, then fast: the capture finds every call remembered
                call(operands[op])
        stream.synchronize()
        with monkeypatch.context() as m:
            _no_checked_calls(m)
            stream.begin_capture()
            got = {op: call(operands[op]) for op, (_, call) in OPS.items()}
            graph = stream.end_capture()
        rs = cp.random.RandomState(99)
        for o in operands.values():  # new values in the same arrays: the replay reads them
            for v in o.values():
                v[...] = rs.standard_normal(v.shape, dtype=cp.float32).astype(v.dtype)
        graph.launch(stream)
        stream.synchronize()
        for op, (_, call) in OPS.items():
            same_bits(got[op], call(operands[op]), f"{op} replayed")


def test_torch_cuda_graph_takes_the_fast_paths(monkeypatch):
    torch = pytest.importorskip("torch")
    operands = {op: {k: torch.from_dlpack(v) for k, v in OPS[op][0]("bfloat16", 20 + i).items()}
                for i, op in enumerate(OPS)}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph asks
        for op, (_, call) in OPS.items():
            for _ in range(2):
                call(operands[op])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with monkeypatch.context() as m:
        _no_checked_calls(m)
        with torch.cuda.graph(graph):  # the default "global" capture mode
            got = {op: call(operands[op]) for op, (_, call) in OPS.items()}
    g = torch.Generator(device="cpu").manual_seed(7)
    for o in operands.values():
        for v in o.values():
            v.copy_(torch.randn(v.shape, generator=g).to(v.device, v.dtype))
    graph.replay()
    for op, (_, call) in OPS.items():
        want = call(operands[op])
        torch.cuda.synchronize()
        assert isinstance(got[op], torch.Tensor)
        same_bits(got[op], want, f"{op} replayed")


def test_windows_are_remembered_each_and_bad_ones_still_refused():
    # window=(left, right) is a part of the fast path's key (attention and attention_paged):
    # each window its own remembered call with the checked path's bits, and a window the
    # checked path refuses (a float or bool side) is refused with one of ints remembered
    from cupyops.ops import paged
    from test_gpu_paged import build_cache

    cp = _cp()
    make, _ = OPS["attention"]
    o = make("bfloat16", 5)
    rng = np.random.default_rng(3)
    lens = np.array([300, 77, 512], np.int32)
    kc, vc, table = build_cache(rng, "bfloat16", lens, 16, 2, 64)
    pq = rng.standard_normal((3, 1, 8, 64)).astype(kc.dtype)
    kc, vc, table, lens, pq = (cp.asarray(x) for x in (kc, vc, table, lens, pq))
    calls = {
        "attention": (attention_op._FAST, lambda w: cupyops.attention(o["q"], o["k"], o["v"], causal=True,
                                                                      causal_align="bottom_right", window=w)),
        "attention_paged": (paged._FAST["attention_paged"], lambda w: cupyops.attention_paged(pq, kc, vc, table, lens,
                                                                                              window=w)),
    }
    for name, (fast, call) in calls.items():
        before = set(fast.cupy)  # (other tests of this process may have remembered calls too)
        spec, fast.spec = fast.spec, lambda *args, **kwargs: None  # checked_only for this op
        try:
            want = {w: call(w) for w in ((100, 0), (300, None), None)}
        finally:
            fast.spec = spec
        for _ in range(3):
            for w in want:
                same_bits(call(w), want[w], f"{name} window {w}")
        windowed = [key for key in fast.cupy if any(part == (100, 0) for part in key[0])]
        assert windowed and len(set(windowed) - before) <= 1, (name, windowed)  # remembered, once
        for bad in ((100.0, 0), (True, 0)):
            with pytest.raises(TypeError, match="^window: "):
                call(bad)


def test_torch_fast_path_takes_every_form_of_a_call(monkeypatch):
    # the operator (a _cfast.Operator where the C extension runs) finds a remembered call
    # however its arguments are passed: positionally, by keyword, through * and ** or a
    # partial; each gives the checked call's bits, with no checked run
    import functools

    torch = pytest.importorskip("torch")
    x = torch.from_dlpack(rand((8, 4096), "bfloat16", 40))
    w = torch.from_dlpack(rand((4096,), "bfloat16", 41))
    forms = {
        "softmax": [lambda: cupyops.softmax(x), lambda: cupyops.softmax(x, -1), lambda: cupyops.softmax(x, axis=-1),
                    lambda: cupyops.softmax(*(x,), **{"impl": "auto"}),
                    lambda: functools.partial(cupyops.softmax, axis=-1)(x)],
        "rms_norm": [lambda: cupyops.rms_norm(x, w), lambda: cupyops.rms_norm(x, weight=w),
                     lambda: cupyops.rms_norm(x, w, 1e-6), lambda: cupyops.rms_norm(x, w, eps=1e-6, impl="auto")],
        "sum": [lambda: cupyops.sum(x, -1), lambda: cupyops.sum(x, axis=-1),
                lambda: cupyops.sum(x, -1, keepdims=False)],
    }
    for op, calls in forms.items():
        with checked_only(op):
            want = calls[0]()
        for call in calls:  # checked (and remembered) or fast
            same_bits(call(), want, f"{op} first calls")
        with monkeypatch.context() as m:
            _no_checked_calls(m)
            for i, call in enumerate(calls):
                same_bits(call(), want, f"{op} form {i}")


def test_the_c_device_query_agrees_with_cupy_and_torch():
    # the C calls take the current device from cuCtxGetDevice (_cfast.c current_device):
    # the answer CuPy's getDevice and torch's current_device give, whichever made it current
    torch = pytest.importorskip("torch")
    from cupyops import _fast

    if not _fast.USE_C:
        pytest.skip("the C extension is not in use")
    cp = _cp()
    cupyops.softmax(torch.ones((2, 64), device="cuda"))  # (loads CuPy: binds cuCtxGetDevice)
    c = _fast._cfast.ctx_device
    assert c() == cp.cuda.runtime.getDevice() == torch.cuda.current_device()
    for d in range(cp.cuda.runtime.getDeviceCount()):
        with torch.cuda.device(d):
            assert c() == cp.cuda.runtime.getDevice() == d
        with cp.cuda.Device(d):
            assert c() == torch.cuda.current_device() == d
    assert c() == cp.cuda.runtime.getDevice() == torch.cuda.current_device()


def test_torchs_dlpack_table_reads_what_the_attributes_read():
    # torch >= 2.11 exports DLPack's C exchange table; the C calls then read a tensor's
    # layout, device and address and torch's current stream through it (_cfast.c
    # torch_sig_dlpack, torch_address): the answers of the Python attributes
    torch = pytest.importorskip("torch")
    from cupyops import _fast

    if not _fast.USE_C:
        pytest.skip("the C extension is not in use")
    cupyops.softmax(torch.ones((2, 64), device="cuda"))  # (binds torch: _fast.torch_loaded)
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        assert not _fast.TORCH_DLPACK
        pytest.skip(f"torch {torch.__version__} has no DLPack C exchange table")
    assert _fast.TORCH_DLPACK
    base = torch.randn((6, 8, 10), device="cuda")
    tensors = [base, base[:, 1:, ::2], base.transpose(0, 2), base[2, 3, 4], base[:0], base.float().to(torch.bfloat16),
               torch.ones(5, device="cuda", dtype=torch.bool), torch.zeros(7, device="cuda", dtype=torch.int8),
               torch.zeros((3, 4), device="cuda").to(torch.float8_e4m3fn), torch.nn.Parameter(base.clone()),
               base[:, :1].expand(6, 5, 10), torch.ones(3), torch.ones((2, 2), dtype=torch.float16)[:, 1]]
    tensors += [torch.empty(8, device="cuda", dtype=torch.uint4), torch.empty(8, device="cuda", dtype=torch.int4)]
    wants = [(*t.shape, *t.stride(), t.dtype, t.get_device()) for t in tensors]
    described = [(t.data_ptr(), tuple(t.shape), t.stride()) for t in tensors]
    asked = []
    real_stride = torch.Tensor.stride
    with pytest.MonkeyPatch.context() as mp:  # (the attributes' path calls stride(): not taken)
        mp.setattr(torch.Tensor, "stride", lambda self, *a: asked.append(1) or real_stride(self, *a))
        for t, want, desc in zip(tensors, wants, described):
            got = _fast._cfast.torch_sig(t)
            # (uint4 / int4 report uint8's / int8's DLPack dtype: their dtype attribute is read)
            assert got == want and [type(v) for v in got] == [type(v) for v in want], (got, want)
            assert _fast._cfast.dl_describe(t)[:3] == desc
    assert not asked
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            assert _fast._cfast.dl_current_stream(torch.cuda.current_device()) == stream.cuda_stream == torch.cuda.current_stream().cuda_stream


def test_a_remembered_torch_call_is_right_on_another_current_device():
    # the FastCall's kernels belong to device 0's context: with device 1 current, a call
    # on device 0's tensors takes the checked path and still gives device 0's result
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.from_dlpack(rand((8, 4096), "bfloat16", 42))
    with checked_only("softmax"):
        want = cupyops.softmax(x)
    for _ in range(2):
        cupyops.softmax(x)
    with torch.cuda.device(1):
        got = [cupyops.softmax(x) for _ in range(2)]
    torch.cuda.synchronize(0)
    for g in got:
        assert g.device == x.device
        same_bits(g, want, "softmax with device 1 current")


def test_a_remembered_call_from_a_fresh_thread():
    # a thread that has made no CUDA call has no current context: cuCtxGetDevice has no
    # answer there, and the call is the checked path's (a launch with no current context
    # would fail with CUDA_ERROR_INVALID_CONTEXT); it must give the right result
    import threading

    torch = pytest.importorskip("torch")
    x = torch.from_dlpack(rand((8, 4096), "bfloat16", 43))
    with checked_only("softmax"):
        want = cupyops.softmax(x)
    for _ in range(2):
        cupyops.softmax(x)
    torch.cuda.synchronize()
    got = []

    def run():
        try:
            got.append(cupyops.softmax(x))
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported below
            got.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not isinstance(got[0], Exception), got[0]
    same_bits(got[0], want, "softmax from a fresh thread")
