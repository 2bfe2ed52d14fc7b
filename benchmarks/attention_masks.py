"""Sliding windows and soft caps in prefill: what a masked call costs beside the plain one.

For each case (bfloat16, bottom-right causal where causal), timed with CUDA events, the L2
flushed before each repeat, median (cupyops.bench.timing), after a check of the masked call
against the float64 reference on a slice of its heads:
- masked: ``attention`` (or ``attention_varlen``) with the window and / or cap, impl="auto";
- plain:  the same call without them on ``flash3`` (a Hopper GPU), the kernel a masked call
  would be compared with;
- keys:   a windowed case's plain time scaled by the share of (query, key) pairs its window
  leaves, i.e. the time a window that cost nothing beyond its keys would take.
TFLOP/s count the two products over the keys each query row sees (the window's and the
causal mask's pairs only).

    python benchmarks/attention_masks.py [--repeats N] [--json path]
"""
import argparse
import json

import cupy as cp
import numpy as np

import cupyops
from cupyops import reference
from cupyops.bench.operators import visible_pairs
from cupyops.bench.runners import random_normal
from cupyops.bench.timing import L2Flusher, time_gpu

# (name, B, Hq, Hkv, S, D, causal, window, softcap)
CASES = [
    ("mistral window", 1, 32, 8, 8192, 128, True, (4095, 0), None),
    ("gemma2 cap d256", 2, 8, 8, 4096, 256, False, None, 50.0),
    ("gemma2 cap d256 causal", 2, 8, 8, 4096, 256, True, None, 50.0),
    ("gemma2 local d256", 1, 32, 16, 8192, 256, True, (4095, 0), 50.0),
    ("cap d128", 4, 16, 16, 4096, 128, False, None, 30.0),
    ("cap d128 causal", 4, 16, 16, 4096, 128, True, None, 30.0),
    ("cap d64 causal", 4, 32, 32, 4096, 64, True, None, 30.0),
]
VARLEN = [256, 4096, 1024, 3000, 512, 2048, 777, 4096]  # Mistral prefill of mixed lengths, window 1024


def pairs(sq, skv, causal, window):
    """(query, key) pairs that the masks leave visible, bottom-right aligned."""
    return visible_pairs(sq, skv, causal, skv - sq, window)


def check(got, q, k, v, causal, window, softcap, rows=512):
    """The last ``rows`` query rows of the first batch element's first two query heads
    against the float64 reference (bottom-right alignment: the same masks as in the call)."""
    hk = 2 // (q.shape[2] // k.shape[2]) or 1
    q1 = q[:1, -rows:, :2].get()
    k1, v1 = (x[:1, :, :hk].get() for x in (k, v))
    ref = reference.attention(q1, k1, v1, causal=causal, causal_align="bottom_right", window=window,
                              softcap=softcap)
    err = reference.rel_error(got[:1, -rows:, :2].get().astype(np.float64), ref)
    assert err <= reference.TOLERANCE["attention"]["bfloat16"], err
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    flush = L2Flusher()
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    print(name)
    rows = []
    for label, B, Hq, Hkv, S, D, causal, window, softcap in CASES:
        q = random_normal((B, S, Hq, D), "bfloat16", 1)
        k = random_normal((B, S, Hkv, D), "bfloat16", 2)
        v = random_normal((B, S, Hkv, D), "bfloat16", 3)
        masked = lambda: cupyops.attention(q, k, v, causal=causal, window=window, softcap=softcap)
        plain = lambda: cupyops.attention(q, k, v, causal=causal, impl="flash3")
        err = check(masked(), q, k, v, causal, window, softcap)
        ms = time_gpu(masked, flush=flush, repeats=args.repeats).median_ms
        plain()
        ms0 = time_gpu(plain, flush=flush, repeats=args.repeats).median_ms
        seen, full = pairs(S, S, causal, window), pairs(S, S, causal, None)
        row = dict(case=label, B=B, Hq=Hq, Hkv=Hkv, S=S, D=D, causal=causal, window=window, softcap=softcap,
                   masked_ms=ms, plain_ms=ms0, keys_ms=ms0 * seen / full,
                   tflops=4.0 * B * Hq * D * seen / ms / 1e9, rel_err=err)
        rows.append(row)
        print(f"{label:24s} masked {ms:8.4f} ms {row['tflops']:6.0f} TFLOP/s | plain flash3 {ms0:8.4f} ms | "
              f"masked / (plain x pairs share) {ms / row['keys_ms']:.3f} | rel err {err:.1e}", flush=True)
    cu = cp.asarray(np.concatenate([[0], np.cumsum(VARLEN)]).astype(np.int32))
    T = int(sum(VARLEN))
    q = random_normal((T, 32, 128), "bfloat16", 4)
    k = random_normal((T, 8, 128), "bfloat16", 5)
    v = random_normal((T, 8, 128), "bfloat16", 6)
    for window in ((1023, 0), None):
        f = lambda: cupyops.attention_varlen(q, k, v, cu, cu, max_seqlen_q=max(VARLEN), max_seqlen_k=max(VARLEN),
                                             causal=True, window=window)
        f()
        ms = time_gpu(f, flush=flush, repeats=args.repeats).median_ms
        seen = sum(pairs(n, n, True, window) for n in VARLEN)
        rows.append(dict(case=f"varlen 8 seqs window {window}", tokens=T, window=window, masked_ms=ms,
                         tflops=4.0 * 32 * 128 * seen / ms / 1e9))
        print(f"varlen {len(VARLEN)} seqs {T} tokens window {window}: {ms:.4f} ms {rows[-1]['tflops']:.0f} TFLOP/s",
              flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": name, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
