"""What a sliding window and a soft cap cost (issue 19): each windowed call against the same
call without the window and against a call over as many keys as the window lets a row see,
so that "window / its span" near 1.0 says the keys outside the window are skipped, not
masked (prefill: the span is the full causal time times the share of keys the window
leaves); and a capped call against the plain one. bfloat16, Hq 32, Hkv 8, head_dim 128,
CUDA events with L2 flushed (cupyops.bench.timing); every call checked first against
attention() on the keys the window leaves (prefill) or the reference (decode, small).

    python benchmarks/masks_probe.py [--json F]
"""
import argparse
import json

import numpy as np

import cupyops
from cupyops import reference
from cupyops.bench.runners import random_normal
from cupyops.bench.timing import L2Flusher, time_gpu

HQ, HKV, D = 32, 8, 128
TOL = reference.TOLERANCE["attention"]["bfloat16"]  # (two kernels' float32 sums, each rounded to bf16)


def timed(fn, flush):
    fn()
    return time_gpu(fn, flush=flush, repeats=20).median_ms * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    flush = L2Flusher()
    rows = []

    # decode over a long cache: batch 32, 32768 cached tokens, Mistral's window (4096 keys)
    B, L, W = 32, 32768, 4096
    q = random_normal((B, 1, HQ, D), "bfloat16", 1)
    k = random_normal((B, L, HKV, D), "bfloat16", 2)
    v = random_normal((B, L, HKV, D), "bfloat16", 3)
    kw = dict(causal=True, causal_align="bottom_right")
    win = cupyops.attention(q, k, v, window=(W - 1, 0), **kw)
    tail = cupyops.attention(q, k[:, L - W:], v[:, L - W:], **kw)  # the keys the window leaves
    err = reference.rel_error(win.get().astype(np.float64), tail.get().astype(np.float64))
    assert err <= TOL, f"decode window != attention over its span: {err}"
    t_full = timed(lambda: cupyops.attention(q, k, v, **kw), flush)
    t_win = timed(lambda: cupyops.attention(q, k, v, window=(W - 1, 0), **kw), flush)
    t_span = timed(lambda: cupyops.attention(q, k[:, L - W:], v[:, L - W:], **kw), flush)
    t_cap = timed(lambda: cupyops.attention(q, k, v, softcap=30.0, **kw), flush)
    rows.append(("decode B32 L32768 window 4096", t_full, t_win, t_span, t_cap))

    # prefill: 8192 tokens, causal, window 1024 (flash3 on sm_90, else flash)
    S, W = 8192, 1024
    q = random_normal((1, S, HQ, D), "bfloat16", 4)
    k = random_normal((1, S, HKV, D), "bfloat16", 5)
    v = random_normal((1, S, HKV, D), "bfloat16", 6)
    got = cupyops.attention(q, k, v, causal=True, window=(W - 1, 0))
    i0 = S - 300  # rows from here on see keys i - W + 1 .. i: checked against those keys alone
    part = cupyops.attention(q[:, i0:], k[:, i0 - W + 1:], v[:, i0 - W + 1:], causal=True,
                             causal_align="bottom_right", window=(W - 1, 0))
    err = reference.rel_error(got[:, i0:].get().astype(np.float64), part.get().astype(np.float64))
    assert err <= TOL, f"prefill window differs from attention over each row's keys: {err}"
    t_full = timed(lambda: cupyops.attention(q, k, v, causal=True), flush)
    t_win = timed(lambda: cupyops.attention(q, k, v, causal=True, window=(W - 1, 0)), flush)
    t_cap = timed(lambda: cupyops.attention(q, k, v, causal=True, softcap=30.0), flush)
    # its span: the full causal time scaled by the keys the window leaves (rows see W keys,
    # the first W rows fewer) over the keys a causal row sees
    seen = sum(min(i + 1, W) for i in range(S)) / (S * (S + 1) / 2)
    rows.append(("prefill S8192 causal window 1024", t_full, t_win, t_full * seen, t_cap))

    print(f"{'':36s} {'full us':>9s} {'window':>9s} {'its span':>9s} {'capped':>9s}  window/span  capped/full")
    for name, full, win, span, cap in rows:
        print(f"{name:36s} {full:9.1f} {win:9.1f} {span:9.1f} {cap:9.1f}  {win / span:10.2f}x  {cap / full:10.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([dict(zip(("case", "full_us", "window_us", "span_us", "capped_us"), r)) for r in rows], fh,
                      indent=1)


if __name__ == "__main__":
    main()
