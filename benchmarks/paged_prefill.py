"""Chunked prefill over a paged KV cache (attention_paged with cu_seqlens_q, the ``gather``
rung): what the page gather costs beside the attention it feeds.

B sequences, each with CACHED tokens already in the cache and NEW tokens (also appended)
whose queries attend bottom-right causally to all CACHED + NEW keys; Hq 32, Hkv 8, head_dim
128, pages of 16 and 128, float16 and bfloat16. Timed (CUDA events, L2 flushed before each
repeat, median: cupyops.bench.timing), each after a check against attention_varlen on the
same keys packed contiguously:
- paged: attention_paged(..., cu_seqlens_q=, max_seqlen_q=) with device lengths (the gather
  sized for the table's capacity, as a serving loop calls it);
- varlen: attention_varlen on the contiguous packed K/V (the same attention, no gather);
- gather: the gather kernel alone (its launch, as attention_paged makes it).
TFLOP/s count the two products over the keys each query row sees.

    python benchmarks/paged_prefill.py [--batch 4] [--cached 3072] [--new 1024] [--repeats N]
"""
import argparse

import cupy as cp
import numpy as np

import cupyops
from cupyops import _fast
from cupyops.bench.timing import L2Flusher, time_gpu
from cupyops.ops import _attention_decode

HQ, HKV, D = 32, 8, 128


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--cached", type=int, default=3072)
    ap.add_argument("--new", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    B, L, N = args.batch, args.cached + args.new, args.new
    flush = L2Flusher()
    print(cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode())
    print(f"{B} sequences, {args.cached} cached + {N} new tokens each, Hq {HQ}, Hkv {HKV}, head_dim {D}")
    keys_seen = N * (L - N) + N * (N + 1) // 2  # a row sees the cached keys and the new ones up to itself
    tflop = 4.0 * HQ * D * keys_seen * B / 1e12
    for dtype in ("float16", "bfloat16"):
        t = cp.dtype(cupyops._dtypes.to_dtype(dtype))
        rs = cp.random.RandomState(0)
        k = rs.standard_normal((B * L, HKV, D), dtype=cp.float32).astype(t)
        v = rs.standard_normal((B * L, HKV, D), dtype=cp.float32).astype(t)
        q = rs.standard_normal((B * N, HQ, D), dtype=cp.float32).astype(t)
        cu_q = cp.asarray(np.arange(B + 1) * N, dtype=cp.int32)
        cu_k = cp.asarray(np.arange(B + 1) * L, dtype=cp.int32)
        lens = cp.full(B, L, cp.int32)
        for P in (16, 128):
            pages = -(-L // P)
            perm = cp.asarray(np.random.default_rng(P).permutation(B * pages).astype(np.int32))
            table = perm.reshape(B, pages)
            kc = cp.zeros((B * pages, P, HKV, D), t)
            vc = cp.zeros((B * pages, P, HKV, D), t)
            pos = cp.zeros(B, cp.int32)
            cupyops.kv_cache_append(kc, vc, k.reshape(B, L, HKV, D), v.reshape(B, L, HKV, D), table, pos)

            def paged():
                return cupyops.attention_paged(q, kc, vc, table, lens, cu_seqlens_q=cu_q, max_seqlen_q=N)

            def varlen():
                return cupyops.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=N, max_seqlen_k=L, causal=True)

            want = varlen().astype(cp.float32)
            err = float(cp.abs(paged().astype(cp.float32) - want).max())  # (the same keys: 0 expected)
            rows = B * pages * P
            kp, vp, ck = cp.empty((rows, HKV, D), t), cp.empty((rows, HKV, D), t), cp.empty(B + 1, cp.int32)
            launches = _attention_decode.gather_launches(
                dtype, kc, vc, kp, vp, ck, table, lens, (B, HKV, D, rows, B * pages, pages),
                (*(s // t.itemsize for s in kc.strides[:3]), *(s // t.itemsize for s in vc.strides[:3]), pages),
                P.bit_length() - 1)

            def gather():
                _fast.launch_checked(*launches)

            ms = {name: time_gpu(f, flush=flush, repeats=args.repeats).median_ms
                  for name, f in (("paged", paged), ("varlen", varlen), ("gather", gather))}
            print(f"{dtype:9s} page {P:3d}: paged {ms['paged']:.4f} ms ({tflop / ms['paged'] * 1e3:6.1f} TFLOP/s), "
                  f"varlen {ms['varlen']:.4f} ms ({tflop / ms['varlen'] * 1e3:6.1f}), gather {ms['gather']:.4f} ms; "
                  f"paged / varlen time {ms['paged'] / ms['varlen']:.3f}x; max |paged - varlen| {err:.3g}", flush=True)


if __name__ == "__main__":
    main()
