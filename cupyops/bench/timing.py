"""GPU timing: CUDA events around each call, L2 flushed between repeats, median of many.

Everything runs on CuPy's current stream (the CLI puts PyTorch on the same stream), so an
event pair brackets exactly the work of one call. CuPy is imported inside the functions:
this module must import on a machine without it.
"""
import statistics
import time
from dataclasses import dataclass

from .._kernels import KernelFile

# kernels/timing.cu: a kernel that holds the stream until the host has queued a batch.
HOLD = KernelFile("timing.cu", ["hold_until_released"])
# Repeats queued behind one hold: few enough that the launch queue never fills (the host
# would then block inside a launch while the GPU waits for the release).
HOLD_BATCH = 10
HOLD_TIMEOUT_NS = 1_000_000_000

# The flush buffer is this many times the L2 size: writing 2x L2 already evicts
# everything in theory; the margin covers L2 partitions and replacement-policy quirks
# for a few tens of microseconds per repeat.
FLUSH_FACTOR = 4


class L2Flusher:
    """Reads a buffer several times the L2 size, so each timed call starts from DRAM.

    A read, not a write: a memset flush leaves the L2 full of dirty lines, and the timed
    call then pays for writing them back. Measured on an H200: 8 us a call, which cost a
    float16 sum of 65536x1024 a fifth of its bandwidth (74 % -> 91 % of copy bandwidth once
    the flush was a read) and every read-mostly kernel, ours and the baselines, some."""

    def __init__(self, factor=FLUSH_FACTOR):
        import cupy

        dev = cupy.cuda.Device()
        self.l2_bytes = int(cupy.cuda.runtime.getDeviceProperties(dev.id)["l2CacheSize"])
        self.nbytes = max(factor * self.l2_bytes, 1 << 24)
        self.buf = cupy.ones(self.nbytes // 4, dtype=cupy.float32)

    def __call__(self):
        # A reduction reads every byte and writes one number: the L2 ends up holding clean
        # lines of this buffer, and the write-backs of the previous call happen here.
        self.buf.sum()


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    repeats: int


def _sync():
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def time_one(fn):
    """Milliseconds of one call (no flush), by events; also serves as a warm-up call."""
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end)


def time_gpu(fn, *, repeats=50, warmup=5, flush=None, budget_s=2.0, min_repeats=3, held=True, est_ms=None):
    """Median event time of ``fn()`` over ``repeats`` calls, each after an L2 flush.

    The first warm-up call is timed alone to size the rest (``est_ms``: that time, where
    the caller has taken it): a textbook rung can take a second per call, so repeats (and
    warm-up) shrink to fit ``budget_s`` per measurement, never below ``min_repeats``.
    Compilation must already have happened (the CLI validates every impl first, which runs
    it once)."""
    if est_ms is None:
        est_ms = time_one(fn)
    if (warmup - 1) * est_ms < 250.0 * budget_s:  # warm-up may use a quarter of the budget
        for _ in range(warmup - 1):
            fn()
    n = max(min_repeats, min(repeats, int(budget_s * 1e3 / max(est_ms, 1e-3))))
    times = _event_times({None: fn}, n, flush, held)[None]
    return Timing(statistics.median(times), min(times), n)


def time_gpu_interleaved(fns, *, repeats=30, warmup=3, flush=None, held=True):
    """``time_gpu`` of several callables (name -> no-argument callable) whose calls
    interleave: the i-th call of each runs before the (i + 1)-th of any, each after an L2
    flush and between its own events, so that a drift of the GPU's clock or power over the
    measure (several percent within seconds on an H100 running long GEMMs: NOTES) falls on
    all of them alike; the rounds' orders are those of a Williams design (``round_order``),
    so that each callable runs in each place, and after each other one, equally often
    (under a plain rotation, the same GEMM kernel measured 0.4-0.5 % slower right after
    cuBLAS than right after itself: NOTES 137). For A/B comparisons of
    configurations, and the benchmark's impls of one case. As in ``time_gpu``, the calls
    are queued in batches behind the hold kernel, so that the GPU never waits for the host
    inside an event pair; where a batch outlives the hold (a call that waits for the stream
    on the host, such as a synchronous copy on the legacy stream), they are timed again
    unheld, which is sound only for calls far longer than their host time. ``repeats`` is
    rounded up to whole rounds of the design. {name: Timing}."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    rows = len(fns) if len(fns) % 2 == 0 else 2 * len(fns)  # (the design's rounds: whole ones)
    repeats = -(-repeats // rows) * rows
    times = _event_times(fns, repeats, flush, held)
    return {name: Timing(statistics.median(t), min(t), repeats) for name, t in times.items()}


def _event_times(fns, n, flush, held):
    """{name: n event times (ms)} of the callables ``fns``, the i-th call of each before the
    (i + 1)-th of any (round i in ``round_order(len(fns), i)``), each after ``flush`` (if
    any). Where ``held``, calls are queued in batches behind a hold kernel
    (kernels/timing.cu) and released together: the GPU then runs flush, event, call, event
    back to back and never waits for the host inside an event pair, however long the
    call's Python side takes; where a batch outlived the hold, all are timed again
    unheld."""
    import cupy

    events = {name: [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(n)] for name in fns}
    names = list(fns)
    per_batch = max(1, HOLD_BATCH // len(fns))
    _sync()
    hold = _Hold() if held else None
    for b in range(0, n, per_batch):
        if hold is not None:
            hold.engage()
        for i in range(b, min(b + per_batch, n)):
            for j in round_order(len(names), i):
                name = names[j]
                if flush is not None:
                    flush()
                start, end = events[name][i]
                start.record()
                fns[name]()
                end.record()
        if hold is not None:
            hold.release()
    _sync()
    if hold is not None and hold.timed_out():
        return _event_times(fns, n, flush, False)
    return {name: [cupy.cuda.get_elapsed_time(s, e) for s, e in pairs] for name, pairs in events.items()}


def round_order(k, i):
    """The order of round i of an interleaved measure of k callables (indices): row i of a
    Williams design, a Latin square whose rows 0, 1, k - 1, 2, k - 2, ... (shifted by the
    row) put every callable in every place and right after every other one once in k
    rounds (2k for odd k, whose second k rows are the first k reversed)."""
    first = [0]
    for j in range(1, k):
        first.append((j + 1) // 2 if j % 2 else k - j // 2)
    r = i % (k if k % 2 == 0 else 2 * k)
    row = [(x + r) % k for x in first]
    return row if r < k else row[::-1]


def time_side_by_side(fns, *, repeats=50, warmup=5, flush=None, budget_s=2.0, min_repeats=3):
    """{name: Timing} of a case's callables, as the benchmark reports them side by side.
    Each is sized as ``time_gpu`` sizes it (a first call timed alone; repeats shrink to fit
    ``budget_s``, never below ``min_repeats``); those that fit ``repeats`` calls in the
    budget (the fast rungs and the baselines a ratio compares) are timed together,
    interleaved (``time_gpu_interleaved``: a drift of the GPU's clocks over the
    measure falls on all alike, where timed in turn a ratio of long GEMMs moved by 5-10 %
    between passes: NOTES), the slower ones (and a lone one) each by ``time_gpu``."""
    est = {name: time_one(fn) for name, fn in fns.items()}
    fit = {name: fn for name, fn in fns.items() if repeats * est[name] <= budget_s * 1e3}
    out = {}
    if len(fit) > 1:
        out.update(time_gpu_interleaved(fit, repeats=repeats, warmup=max(0, warmup - 1), flush=flush))
    for name, fn in fns.items():
        if name not in out:
            out[name] = time_gpu(fn, repeats=repeats, warmup=warmup, flush=flush, budget_s=budget_s,
                                 min_repeats=min_repeats, est_ms=est[name])
    return out


class _Hold:
    """A flag in pinned host memory that the hold kernel polls (mapped into the device's
    address space: unified addressing), and a device word it sets when it gave up."""

    def __init__(self):
        import cupy
        import numpy as np

        self._mem = cupy.cuda.alloc_pinned_memory(4)
        self._flag = np.frombuffer(self._mem, np.int32, 1)
        self._flag[0] = 0
        self._held = 0  # holds engaged so far; the flag says how many were released
        self._timed_out = cupy.zeros(1, cupy.int32)
        self._kernel = HOLD.function("hold_until_released")

    def engage(self):
        import numpy as np

        self._held += 1
        self._kernel((1,), (1,), (np.uint64(self._mem.ptr), np.int32(self._held),
                                  np.int64(HOLD_TIMEOUT_NS), self._timed_out))

    def release(self):
        self._flag[0] = self._held

    def timed_out(self):
        return bool(self._timed_out.get()[0])


def copy_bandwidth(nbytes=1 << 30, *, repeats=20, warmup=3, flush=None):
    """Device-to-device cudaMemcpyAsync of ``nbytes``, timed like the cases. Returns
    GB/s counting bytes read + bytes written (2 * nbytes), the same way the cases count."""
    ms = copy_ms_for(2 * nbytes, repeats=repeats, warmup=warmup, flush=flush)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def copy_ms_for(nbytes, *, repeats=20, warmup=3, flush=None):
    """Median milliseconds of a device-to-device copy that moves ``nbytes`` in all (reads
    ``nbytes // 2``, writes as many): the issue's "copy bandwidth of the same bytes". A
    copy of 128 MiB pays the same launch, ramp-up and drain as a 128 MiB reduction, which
    the 1 GiB copy behind ``copy_bandwidth`` hides."""
    import cupy

    half = max(16, nbytes // 2)
    src = cupy.empty(half, dtype=cupy.uint8)
    src.fill(1)
    dst = cupy.empty_like(src)

    def copy():
        dst.data.copy_from_device_async(src.data, half)

    return time_gpu(copy, repeats=repeats, warmup=warmup, flush=flush, budget_s=10.0).median_ms


def host_overhead_us(fn, *, calls=2000, warmup=50, rounds=5):
    """CPU microseconds per call of ``fn`` issued back to back (the GPU work is tiny, so
    this is the Python + launch cost a user pays per call): the median over ``rounds``
    rounds of ``calls // rounds`` calls, with the garbage collector paused as timeit does.
    One round of 2000 calls on the H100 host measured 13.6 to 54.4 us for the same
    softmax in two runs an hour apart; the median of rounds is what steady state means.
    Each round's final synchronisation is outside the clock: only the host side counts."""
    import gc

    for _ in range(warmup):
        fn()
    per_round = max(1, calls // rounds)
    samples = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            _sync()
            t0 = time.perf_counter()
            for _ in range(per_round):
                fn()
            t1 = time.perf_counter()
            samples.append((t1 - t0) / per_round * 1e6)
        _sync()
    finally:
        if enabled:
            gc.enable()
    return statistics.median(samples)


def host_overhead_side_by_side_us(fns, *, calls=2000, warmup=50, rounds=9):
    """``host_overhead_us`` of several callables (name -> no-argument callable) measured
    side by side: their rounds interleave (a round of each, then the next round of each),
    so that a drift of the host's speed during the measure, which moved one callable's
    figure by 30-70 % between runs a minute apart (NOTES item 76), falls on all of them
    alike. {name: the median over its rounds}."""
    import gc

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    per_round = max(1, calls // rounds)
    samples = {name: [] for name in fns}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, fn in fns.items():
                _sync()
                t0 = time.perf_counter()
                for _ in range(per_round):
                    fn()
                t1 = time.perf_counter()
                samples[name].append((t1 - t0) / per_round * 1e6)
        _sync()
    finally:
        if enabled:
            gc.enable()
    return {name: statistics.median(v) for name, v in samples.items()}


def time_then_profile(calls, *, flush, repeats=50):
    """For the Nsight Compute scripts (benchmarks/*_profile.py): warm up every call in
    ``calls`` (name -> no-argument callable), time each twice and keep the second round (the
    first brings the clocks up from an idle GPU: NOTES item 42), then run each once more,
    after a flush, inside a cudaProfilerStart/Stop range (``ncu --profile-from-start off``
    profiles only those). Returns {name: median ms} of the second round."""
    import cupy

    for fn in calls.values():  # compile, pick algorithms
        fn()
        fn()
    cupy.cuda.runtime.deviceSynchronize()
    for _ in range(2):
        ms = {name: time_gpu(fn, flush=flush, repeats=repeats).median_ms for name, fn in calls.items()}
    cupy.cuda.profiler.start()
    for fn in calls.values():
        flush()
        fn()
    cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.profiler.stop()
    return ms
