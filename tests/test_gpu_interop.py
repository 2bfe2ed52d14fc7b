"""GPU tier: foreign arrays (cupyops/_interop.py). Every operator called with CUDA torch
tensors returns torch tensors on the same device equal to what the CuPy path gives; out=
tensors are written in place; the work runs on torch's current stream with memory from
torch's caching allocator; requires_grad tensors are read as detached; float8 travels as
torch.float8_e4m3fn; CPU tensors come back as CPU tensors; JAX GPU arrays as JAX arrays."""
import numpy as np
import pytest

import cupyops
from cupyops import _dtypes

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _cp():
    import cupy

    return cupy


def _hopper():
    return _cp().cuda.Device().compute_capability == "90"


TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def tensor(shape, dtype="float32", seed=0, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=TORCH_DTYPES[dtype])


def as_cupy(t):
    """The CuPy view of a CUDA tensor (the reference path's input)."""
    return _cp().from_dlpack(t.detach())


def same(got, want_cupy):
    """A torch result equals the CuPy path's, bit for bit (same kernels, same inputs)."""
    assert isinstance(got, torch.Tensor), type(got)
    want = torch.from_dlpack(want_cupy)
    assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
    assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                       want.view(torch.uint8) if want.dtype == torch.float8_e4m3fn else want)


# every operator: (name, call with torch tensors, the same call with CuPy views)
def _cases(dtype):
    x = tensor((8, 4096), dtype, 1)
    w = tensor((4096,), dtype, 2)
    b = tensor((4096,), dtype, 3)
    xs = tensor((64, 256), dtype, 4)[:, ::2]  # a strided view
    a, bt = tensor((64, 512), dtype, 5), tensor((384, 512), dtype, 6)
    cases = [
        ("softmax", lambda f: cupyops.softmax(f(x))),
        ("softmax strided", lambda f: cupyops.softmax(f(xs), axis=0)),
        ("layer_norm", lambda f: cupyops.layer_norm(f(x), f(w), f(b))),
        ("layer_norm stats", lambda f: cupyops.layer_norm(f(x), f(w), f(b), return_stats=True)),
        ("rms_norm", lambda f: cupyops.rms_norm(f(x), f(w))),
        ("sum", lambda f: cupyops.sum(f(x), axis=-1)),
        ("sum all", lambda f: cupyops.sum(f(xs))),
        ("max", lambda f: cupyops.max(f(x), axis=-1)),
        ("trace", lambda f: cupyops.trace(f(a))),
        ("matmul", lambda f: cupyops.matmul(f(a), f(bt).T)),
        ("gemm", lambda f: cupyops.gemm(f(a), f(bt), trans_b=True, alpha=0.5)),
    ]
    if dtype != "float32":
        q, k, v = (tensor((2, 80, h, 64), dtype, 7 + i) for i, h in enumerate((8, 2, 2)))
        cases.append(("attention", lambda f: cupyops.attention(f(q), f(k), f(v), causal=True, return_lse=True)))
    cases.append(("quantize_fp8", lambda f: cupyops.quantize_fp8(f(x), axis=-1)))
    return cases


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_every_operator_takes_and_returns_torch_tensors(dtype):
    for name, call in _cases(dtype):
        got, want = call(lambda t: t), call(as_cupy)
        torch.cuda.synchronize()
        if isinstance(want, tuple):
            assert isinstance(got, tuple) and len(got) == len(want), name
            for i, (g, w) in enumerate(zip(got, want)):
                if name == "quantize_fp8" and i == 0:
                    assert g.dtype == torch.float8_e4m3fn, name  # torch callers get float8 values
                    w = torch.from_dlpack(w).view(torch.float8_e4m3fn)
                    assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), name
                else:
                    same(g, w)
        else:
            same(got, want)


def test_out_tensor_is_written_and_returned():
    x = tensor((16, 1024), "float16")
    out = torch.empty_like(x)
    y = cupyops.softmax(x, out=out)
    assert y is out
    torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), rtol=2e-3, atol=1e-5)
    out2 = torch.empty((16, 1024), dtype=torch.float16, device="cuda")
    assert cupyops.rms_norm(x, None, out=out2) is out2


def test_runs_on_torchs_current_stream_with_torchs_memory():
    x = tensor((4096, 4096), "bfloat16")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    before = torch.cuda.memory_allocated()
    with torch.cuda.stream(side):
        # a long kernel queued first on the side stream: the result is only right if
        # cupyops' kernel is ordered after it on the same stream
        x.mul_(2.0)
        y = cupyops.rms_norm(x, None)
    assert torch.cuda.memory_allocated() - before >= y.numel() * y.element_size()  # torch's allocator
    side.synchronize()
    want = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)


def test_requires_grad_is_read_detached():
    lin = torch.nn.Linear(512, 256, bias=False, device="cuda", dtype=torch.float16)
    x = tensor((32, 512), "float16")
    y = cupyops.matmul(x, lin.weight.T)
    assert isinstance(y, torch.Tensor) and not y.requires_grad
    torch.testing.assert_close(y, (x @ lin.weight.T).detach(), rtol=2e-2, atol=2e-2)


def test_cpu_tensors_come_back_on_the_cpu():
    for dtype in ("float32", "bfloat16"):
        x = tensor((4, 100), dtype, device="cpu")
        y = cupyops.softmax(x)
        assert isinstance(y, torch.Tensor) and y.device.type == "cpu" and y.dtype == x.dtype
        torch.testing.assert_close(y.float(), torch.softmax(x.float(), -1), rtol=1e-2, atol=1e-3)
    s = cupyops.sum(tensor((10, 10), device="cpu"))
    assert isinstance(s, torch.Tensor) and s.shape == ()


def test_bad_torch_input_names_the_argument():
    with pytest.raises(TypeError, match="x: dtype int64"):
        cupyops.softmax(torch.zeros(4, 4, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="weight: expected shape"):
        cupyops.rms_norm(tensor((4, 64)), tensor((32,)))


def test_fp8_torch_tensors():
    if not _hopper():
        pytest.skip("scaled_matmul runs on sm_90")
    x, w = tensor((256, 512), "bfloat16", 1), tensor((384, 512), "bfloat16", 2)
    xq, sx = cupyops.quantize_fp8(x)
    wq, sw = cupyops.quantize_fp8(w)
    assert xq.dtype == torch.float8_e4m3fn and sx.dtype == torch.float32 and sx.shape == ()
    ours = cupyops.scaled_matmul(xq, wq.T, sx, sw)
    theirs = torch._scaled_mm(xq, wq.T, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
    assert isinstance(ours, torch.Tensor) and ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=1e-2, atol=1e-2)


def test_other_float8_types_are_refused():
    x = tensor((16, 64), "float32").to(torch.float8_e5m2)
    with pytest.raises(TypeError, match="float8_e5m2"):
        cupyops.scaled_matmul(x, x.T, 1.0, 1.0)


def test_jax_gpu_arrays():
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    x = jax.device_put(np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32), gpu)
    y = cupyops.softmax(x)
    assert isinstance(y, jax.Array) and list(y.devices())[0].platform == "gpu"
    np.testing.assert_allclose(np.asarray(y), np.asarray(jax.nn.softmax(x, axis=-1)), rtol=1e-5, atol=1e-6)


def test_bfloat16_through_dlpack_is_ml_dtypes():
    y = as_cupy(tensor((4, 4), "bfloat16"))
    assert _dtypes.dtype_name(y.dtype) == "bfloat16"
