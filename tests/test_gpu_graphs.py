"""GPU tier: CUDA graphs. One decode step of a small transformer block (rms_norm -> qkv
matmul -> decode attention over a KV cache -> o matmul -> residual -> rms_norm -> MLP
matmuls -> residual), captured through CuPy's stream capture and through
torch.cuda.graph, then replayed on new input values: the replay gives the eager result
(bit for bit: the same kernels on the same inputs)."""
import numpy as np
import pytest

import cupyops

pytestmark = pytest.mark.gpu

B, S, HQ, HKV, D, HIDDEN, FFN = 4, 512, 8, 2, 128, 1024, 2816


def _weights(make):
    """The block's parameters, each drawn by ``make(shape)``."""
    return {
        "ln1": make((HIDDEN,)) * 0.1 + 1.0,
        "wqkv": make(((HQ + 2 * HKV) * D, HIDDEN)) * HIDDEN ** -0.5,
        "wo": make((HIDDEN, HQ * D)) * (HQ * D) ** -0.5,
        "ln2": make((HIDDEN,)) * 0.1 + 1.0,
        "wgu": make((2 * FFN, HIDDEN)) * HIDDEN ** -0.5,
        "wd": make((HIDDEN, FFN)) * FFN ** -0.5,
        "k_cache": make((B, S, HKV, D)),
        "v_cache": make((B, S, HKV, D)),
    }


def _block(x, p, silu):
    """One decode token per sequence: x [B, HIDDEN] -> [B, HIDDEN]. The new token attends to
    the whole cache (its own K/V are the cache's last row, written before the step)."""
    h = cupyops.rms_norm(x, p["ln1"])
    qkv = cupyops.matmul(h, p["wqkv"].T)
    q = qkv[:, : HQ * D].reshape(B, 1, HQ, D)
    o = cupyops.attention(q, p["k_cache"], p["v_cache"], causal=True, causal_align="bottom_right")
    x = x + cupyops.matmul(o.reshape(B, HQ * D), p["wo"].T)
    h = cupyops.rms_norm(x, p["ln2"])
    gu = cupyops.matmul(h, p["wgu"].T)
    return x + cupyops.matmul(silu(gu[:, :FFN]) * gu[:, FFN:], p["wd"].T)


def test_cupy_stream_capture_replays_the_eager_block():
    import cupy as cp

    f16 = cp.float16  # (CuPy's elementwise kernels, used between the operators here, take float16)
    rs = cp.random.RandomState(0)
    p = _weights(lambda shape: rs.standard_normal(shape, dtype=cp.float32).astype(f16))
    silu = lambda t: (t.astype(cp.float32) / (1 + cp.exp(-t.astype(cp.float32)))).astype(t.dtype)  # noqa: E731
    x = rs.standard_normal((B, HIDDEN), dtype=cp.float32).astype(f16)
    cp.cuda.Device().synchronize()  # (p and x were made on the null stream)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        _block(x, p, silu)  # compile, plan, allocate tickets outside the capture
        stream.synchronize()
        stream.begin_capture()
        y = _block(x, p, silu)
        graph = stream.end_capture()
    for seed in (1, 2):
        with stream:  # the new input is written on the replay's stream: a non-blocking stream does not
            # wait for the null stream, so a write there could land during the replay
            x[...] = cp.random.RandomState(seed).standard_normal((B, HIDDEN), dtype=cp.float32).astype(f16)
            graph.launch(stream)
        stream.synchronize()
        with stream:
            want = _block(x, p, silu)
        stream.synchronize()
        assert cp.array_equal(y.view(cp.uint16), want.view(cp.uint16)), f"replay {seed} differs from eager"


def test_torch_cuda_graph_replays_the_eager_block():
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cpu").manual_seed(0)

    def make(shape):
        return torch.randn(shape, generator=g).to("cuda", torch.bfloat16)

    p = _weights(make)
    silu = torch.nn.functional.silu
    x = make((B, HIDDEN))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph asks
        for _ in range(2):
            _block(x, p, silu)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # torch's default "global" capture mode
        y = _block(x, p, silu)
    assert isinstance(y, torch.Tensor)
    for seed in (1, 2):
        x.copy_(torch.randn((B, HIDDEN), generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16))
        graph.replay()
        want = _block(x, p, silu)
        torch.cuda.synchronize()
        assert torch.equal(y, want), f"replay {seed} differs from eager"
    assert np.isfinite(y.float().cpu().numpy()).all()
