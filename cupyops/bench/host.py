"""Host time per call of every operator at decode size, the cost that decides a decode
loop's speed when each operator's GPU work is a few microseconds: cupyops on CuPy arrays,
cupyops on torch tensors (the same memory), and PyTorch's eager equivalent on the same
host (F.rms_norm, F.layer_norm, torch.softmax, torch.sum, torch.matmul,
scaled_dot_product_attention, x + residual then F.rms_norm, F.silu(a) * b); and the time
per call of the same calls replayed from a CUDA graph (cupyops captured by CuPy's stream
capture, torch's by torch.cuda.graph), where no host work runs between them: what a decode
loop captured once costs a call.

The sizes are one decode step of a Llama-3-8B-like layer: 8 sequences of one token,
hidden 4096, bfloat16; attention over a 2048-token KV cache with 32 query and 8 KV heads
of 128. The eager figures of an operator are timing.host_overhead_side_by_side_us: the
median of 9 rounds of back-to-back calls, the three callables' rounds interleaved (the
host's speed drifts), the final synchronisation outside the clock; each graph figure is
graph_replay_us.
"""
GRAPH_CALLS, GRAPH_REPLAYS = 20, 50
TOKENS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, CACHE = 8, 4096, 32, 8, 128, 2048
OPS = ("softmax", "rms_norm", "layer_norm", "sum", "matmul", "attention", "add_rms_norm", "silu_and_mul")


def _operands(cp, bf16):
    rs = cp.random.RandomState(0)

    def make(shape):
        return rs.standard_normal(shape, dtype=cp.float32).astype(bf16)

    return {"x": make((TOKENS, HIDDEN)), "w": make((HIDDEN,)), "b": make((HIDDEN,)), "r": make((TOKENS, HIDDEN)),
            "gu": make((TOKENS, 2 * HIDDEN)),
            "W": make((HIDDEN, HIDDEN)), "q": make((TOKENS, 1, HEADS, HEAD_DIM)),
            "k": make((TOKENS, CACHE, KV_HEADS, HEAD_DIM)), "v": make((TOKENS, CACHE, KV_HEADS, HEAD_DIM))}


def decode_ops(torch=None):
    """{op: (shape label, cupyops call of an operand dict, torch call of a tensor dict or
    None)}: the calls each take the operands (CuPy arrays, or torch tensors) by name."""
    import cupyops

    F = torch.nn.functional if torch is not None else None
    ops = {
        "softmax": (f"{TOKENS}x{HIDDEN}", lambda a: cupyops.softmax(a["x"]),
                    lambda t: torch.softmax(t["x"], -1)),
        "rms_norm": (f"{TOKENS}x{HIDDEN}", lambda a: cupyops.rms_norm(a["x"], a["w"]),
                     lambda t: F.rms_norm(t["x"], (HIDDEN,), t["w"])),
        "layer_norm": (f"{TOKENS}x{HIDDEN}", lambda a: cupyops.layer_norm(a["x"], a["w"], a["b"]),
                       lambda t: F.layer_norm(t["x"], (HIDDEN,), t["w"], t["b"])),
        "sum": (f"{TOKENS}x{HIDDEN} axis -1", lambda a: cupyops.sum(a["x"], axis=-1),
                lambda t: torch.sum(t["x"], -1)),
        "matmul": (f"{TOKENS}x{HIDDEN} @ ({HIDDEN}x{HIDDEN}).T", lambda a: cupyops.matmul(a["x"], a["W"].T),
                   lambda t: torch.matmul(t["x"], t["W"].T)),
        "attention": (f"decode B{TOKENS} Hq{HEADS} Hkv{KV_HEADS} kv{CACHE} D{HEAD_DIM}",
                      lambda a: cupyops.attention(a["q"], a["k"], a["v"]),
                      lambda t: F.scaled_dot_product_attention(
                          t["q"].transpose(1, 2), t["k"].transpose(1, 2), t["v"].transpose(1, 2), enable_gqa=True)),
        "add_rms_norm": (f"{TOKENS}x{HIDDEN}", lambda a: cupyops.add_rms_norm(a["x"], a["r"], a["w"]),
                         lambda t: _add_rms_norm_torch(F, t)),
        "silu_and_mul": (f"{TOKENS}x{2 * HIDDEN}", lambda a: cupyops.silu_and_mul(a["gu"]),
                         lambda t: F.silu(t["gu"][:, :HIDDEN]) * t["gu"][:, HIDDEN:]),
    }
    return {op: (label, ours, theirs if torch is not None else None) for op, (label, ours, theirs) in ops.items()}


def _add_rms_norm_torch(F, t):
    s = t["x"] + t["r"]
    return F.rms_norm(s, (HIDDEN,), t["w"]), s


def graph_replay_us(fn, calls=GRAPH_CALLS, replays=GRAPH_REPLAYS, torch=None):
    """Microseconds per call of ``fn`` replayed from a CUDA graph: ``calls`` calls captured
    on a side stream (by torch.cuda.graph when ``torch`` is given, else by CuPy's stream
    capture) after two eager ones (compile, remember), the graph launched ``replays``
    times back to back, timed by CUDA events around the replays."""
    if torch is not None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / (calls * replays)
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        fn()
        stream.synchronize()
        stream.begin_capture()
        try:
            for _ in range(calls):
                fn()
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(replays):
            graph.launch(stream)
        end.record(stream)
        end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) * 1e3 / (calls * replays)


def per_op_us(calls, torch=None, log=print, ops=OPS):
    """{op: {"shape": label, "cupyops": us, "cupyops_torch_in": us, "torch": us,
    "cupyops_graph": us, "torch_graph": us}} for the operators ``ops`` (the benchmark's
    selection: a first call compiles its kernels): eager host time per call, then the
    graph-replay time per call; a figure that could not be measured is None (its error
    logged), never a crashed run."""
    import cupy

    from .. import _dtypes
    from . import timing

    if not ops:
        return {}
    arrays = _operands(cupy, _dtypes.to_dtype("bfloat16"))
    tensors = {k: torch.from_dlpack(v) for k, v in arrays.items()} if torch is not None else None
    out = {}
    for op, (label, ours, theirs) in decode_ops(torch).items():
        if op not in ops:
            continue
        eager = {"cupyops": lambda: ours(arrays)}
        if torch is not None:
            eager["cupyops_torch_in"] = lambda: ours(tensors)
            eager["torch"] = lambda: theirs(tensors)
        graphs = {"cupyops_graph": lambda: graph_replay_us(lambda: ours(arrays))}
        if torch is not None:
            graphs["torch_graph"] = lambda: graph_replay_us(lambda: theirs(tensors), torch=torch)
        row = {"shape": label}
        for who, fn in list(eager.items()):  # each callable once on its own: a failing one is left out
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - one failing figure, not a failed run
                row[who] = None
                del eager[who]
                log(f"  host time {op} {who}: failed ({type(exc).__name__}: {exc})")
        try:
            row.update(timing.host_overhead_side_by_side_us(eager, calls=calls))
        except Exception as exc:  # noqa: BLE001
            row.update({who: None for who in eager})
            log(f"  host time {op}: failed ({type(exc).__name__}: {exc})")
        for who, measure in graphs.items():
            try:
                row[who] = measure()
            except Exception as exc:  # noqa: BLE001 - one failing figure, not a failed run
                row[who] = None
                log(f"  host time {op} {who}: failed ({type(exc).__name__}: {exc})")
        out[op] = row
        log("  host time " + op + ": " + ", ".join(
            f"{k} {'-' if v is None else f'{v:.1f} us'}" for k, v in row.items() if k != "shape"))
    return out


def summary_lines(per_op):
    """One line per operator for the report's header: cupyops (CuPy in, torch in) against
    torch; "**over**" marks a cupyops figure above torch's; then the graph-replay times."""
    lines = []
    for op, row in per_op.items():
        t = row.get("torch")
        parts = []
        for who, label in (("cupyops", "cupyops"), ("cupyops_torch_in", "with torch tensors")):
            v = row.get(who)
            if v is None:
                parts.append(f"{label} -")
                continue
            parts.append(f"{label} {v:.1f} us" + (" **over**" if t is not None and v > t else ""))
        parts.append("torch -" if t is None else f"torch {t:.1f} us")
        line = f"host time per call, {op} {row.get('shape', '')}: " + ", ".join(parts)
        if "cupyops_graph" in row or "torch_graph" in row:
            line += "; replayed from a CUDA graph: " + ", ".join(
                f"{label} {'-' if row.get(who) is None else f'{row[who]:.1f} us'}"
                for who, label in (("cupyops_graph", "cupyops"), ("torch_graph", "torch")))
        lines.append(line)
    return lines
