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


def _streamk_shape(sm_count):
    """(M, N, K) of a prefill-sized matmul whose auto plan on this GPU is stream-K (a
    whole round of 128 x 256 tiles, then a little over half a round shared along K), or
    None where the wave model picks otherwise."""
    from cupyops.ops import _gemm_wgmma as W
    from cupyops.ops._gemm_problem import GemmProblem

    N, K = 2560, 4096
    M = 128 * -(-(sm_count + sm_count // 2 + 2) // (N // 256))
    p = GemmProblem("bfloat16", False, True, M, N, K, None, None, None, None, K, K, N, N, 0, 0, 0, 0, 1, 1.0, 0.0)
    return (M, N, K) if W.pick_config(p, sm_count) == "128x256sk" else None


def _hopper_streamk_shape():
    import cupy as cp

    from cupyops import _launch
    from cupyops.ops import _gemm_wgmma as W

    props = _launch.device_props()
    if not W.runs_here(props):
        pytest.skip("stream-K GEMM: an sm_90 GPU")
    shape = _streamk_shape(cp.cuda.Device().attributes["MultiProcessorCount"])
    if shape is None:
        pytest.skip("no stream-K shape picked on this GPU's SM count")
    return shape


def test_streamk_matmul_replays_from_both_captures():
    # auto's stream-K GEMM takes a workspace (flags zeroed by a memset, partials) a call:
    # captured, both come from the capturing framework's pool and stream, and the replay
    # on new values is the eager result
    import cupy as cp

    M, N, K = _hopper_streamk_shape()
    rs = cp.random.RandomState(0)
    x = rs.standard_normal((M, K), dtype=cp.float32).astype(cp.float16)
    w = rs.standard_normal((N, K), dtype=cp.float32).astype(cp.float16)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        cupyops.matmul(x, w.T)
        stream.synchronize()
        stream.begin_capture()
        y = cupyops.matmul(x, w.T)
        graph = stream.end_capture()
        for seed in (1, 2):
            x[...] = cp.random.RandomState(seed).standard_normal((M, K), dtype=cp.float32).astype(cp.float16)
            graph.launch(stream)
            want = cupyops.matmul(x, w.T)
            stream.synchronize()
            assert cp.array_equal(y.view(cp.uint16), want.view(cp.uint16)), f"CuPy replay {seed} differs"
    ref = x.astype(cp.float32) @ w.astype(cp.float32).T
    assert float(cp.abs(y.astype(cp.float32) - ref).max()) < 0.05 * float(cp.abs(ref).max())

    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cpu").manual_seed(0)
    xt = torch.randn((M, K), generator=g).to("cuda", torch.bfloat16)
    wt = torch.randn((N, K), generator=g).to("cuda", torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cupyops.matmul(xt, wt.T)
    torch.cuda.current_stream().wait_stream(side)
    tg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(tg):
        yt = cupyops.matmul(xt, wt.T)
    for seed in (1, 2):
        xt.copy_(torch.randn((M, K), generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16))
        tg.replay()
        want = cupyops.matmul(xt, wt.T)
        torch.cuda.synchronize()
        assert torch.equal(yt, want), f"torch replay {seed} differs"
    assert (yt.float() - xt.float() @ wt.float().T).abs().max() < 0.05 * yt.float().abs().max()
