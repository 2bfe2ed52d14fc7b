"""Paged decode attention (issue 19's acceptance shape) against the contiguous `decode` rung
on the same tokens and against PyTorch SDPA on the contiguous equivalent.

bf16, batch 64, 4096 cached tokens a sequence, Hq 32, Hkv 8, head_dim 128, q_len 1; pages
of 16 and of 128 tokens, each sequence's pages scattered over the pool in random order (a
pool after churn; in order would flatter the page walk). Each variant is checked against
the contiguous rung's output before it is timed (CUDA events, L2 flushed by a read before
each repeat, median: cupyops.bench.timing). Reported: us, TFLOP/s (4 * B * Hq * q_len *
tokens * head_dim: the two matrix products), GB/s of K + V read, and the ratios the issue
sets targets for (paged >= 0.95x the contiguous rung, >= 1.0x SDPA).

The floor: 64 x 4096 x 8 x 128 x 2 bytes x 2 (K and V) = 1.07 GB, at ~3.0 TB/s (H100 copy
rate, read + write; a pure read streams somewhat faster) about 350 us, i.e. ~0.8 TFLOP/s:
decode is a stream over the cache, and what the page table may cost is the lookups'
latency, not bandwidth (4 table entries a 64-key tile).

    python benchmarks/paged_decode.py [--repeats N] [--pages 16,128] [--one-an-sm]

--one-an-sm also times each page size launched as the contiguous rung is at this shape:
asking for over half an SM's shared memory, so one block an SM (NOTES 44) instead of the
two the paged plan keeps (the measurement behind that choice: _attention_decode.plan).
"""
import argparse
import contextlib
import dataclasses
from unittest import mock

import cupy as cp
import numpy as np

import cupyops
from cupyops.bench.timing import L2Flusher, time_gpu
from cupyops.ops import _attention_decode as dec
from cupyops.ops import paged as paged_ops

B, S, HQ, HKV, D = 64, 4096, 32, 8, 128


def paged_copy(k, v, P, rng, in_order=False):
    """k, v [B, S, Hkv, D] as caches [B * S / P, P, Hkv, D] with each sequence's pages at
    random places of the pool (``in_order``: page i of the pool is the i-th page of the
    sequences laid end to end): (k_cache, v_cache, block_table)."""
    pages = B * S // P
    order = np.arange(pages) if in_order else rng.permutation(pages)
    table = order.astype(np.int32).reshape(B, S // P)
    kc = cp.empty((pages, P, HKV, D), k.dtype)
    vc = cp.empty((pages, P, HKV, D), v.dtype)
    dtab = cp.asarray(table)
    kc[dtab.ravel()] = k.reshape(B * S // P, P, HKV, D)
    vc[dtab.ravel()] = v.reshape(B * S // P, P, HKV, D)
    return kc, vc, dtab


_planned = dec.plan


def _one_an_sm(*a, **k):
    """The paged plan with the contiguous plan's shared-memory request."""
    pl = _planned(*a, **k)
    return dataclasses.replace(pl, launch_smem=_planned(*a, **{**k, "paged": False}).launch_smem)


def plan_variant(one_an_sm):
    """A context in which attention_paged launches with its plan (one_an_sm False) or with
    the contiguous rung's residency (True); memoized plans and fast calls forgotten on the
    way in and out."""
    @contextlib.contextmanager
    def ctx():
        def forget():
            dec._PAGED_PLANS.clear()
            paged_ops._FAST["attention_paged"].cupy.clear()

        forget()
        with mock.patch.object(dec, "plan", _one_an_sm) if one_an_sm else contextlib.nullcontext():
            yield
        forget()
    return ctx()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--pages", default="16,128", help="comma-separated page sizes")
    ap.add_argument("--one-an-sm", action="store_true", help="also time the launch one block an SM")
    ap.add_argument("--in-order", action="store_true",
                    help="also time each page size over a pool whose pages lie in order (where the "
                         "random placement's cost to DRAM shows apart from the lookups)")
    args = ap.parse_args()
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    cupyops.warmup(["attention_paged"])  # kernels/attention_decode.cu: the contiguous rung too
    flush = L2Flusher()
    rng = np.random.default_rng(0)
    bf16 = cupyops._dtypes.to_dtype("bfloat16")
    q = cp.random.standard_normal((B, 1, HQ, D), dtype=cp.float32).astype(bf16)
    k = cp.random.standard_normal((B, S, HKV, D), dtype=cp.float32).astype(bf16)
    v = cp.random.standard_normal((B, S, HKV, D), dtype=cp.float32).astype(bf16)
    lens = cp.full(B, S, np.int32)
    flops = 4.0 * B * HQ * 1 * S * D
    kv_bytes = k.nbytes + v.nbytes
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}: bf16 B{B} tokens {S} Hq{HQ} Hkv{HKV} "
          f"D{D} q_len 1 ({kv_bytes / 1e9:.2f} GB of K + V)", flush=True)

    ref = cupyops.attention(q, k, v, impl="decode")
    ref32 = ref.astype(cp.float32)

    def checked(name, fn, tol=2e-2):
        out = fn()
        got = cp.from_dlpack(out.transpose(1, 2).contiguous()) if isinstance(out, torch.Tensor) else out
        err = float(cp.abs(got.astype(cp.float32) - ref32).max())
        if not np.isfinite(err) or err > tol:
            print(f"  {name}: WRONG (max |diff| from the contiguous rung {err:.3g}); not timed", flush=True)
            return None
        return time_gpu(fn, flush=flush, repeats=args.repeats).median_ms * 1e3

    rows = {}
    rows["decode (contiguous)"] = checked("decode", lambda: cupyops.attention(q, k, v, impl="decode"), tol=0.0)
    for P in (int(p) for p in args.pages.split(",") if p):
        for in_order in (False, True) if args.in_order else (False,):
            kc, vc, dtab = paged_copy(k, v, P, rng, in_order)
            for one in (False, True) if args.one_an_sm else (False,):
                name = f"attention_paged P={P}" + (" one an SM" if one else "") + (" in order" if in_order else "")
                with plan_variant(one):
                    rows[name] = checked(name, lambda kc=kc, vc=vc, dtab=dtab:
                                         cupyops.attention_paged(q, kc, vc, dtab, lens))
            del kc, vc
        cp.get_default_memory_pool().free_all_blocks()
    tq, tk, tv = (torch.from_dlpack(a).transpose(1, 2) for a in (q, k, v))  # [B, H, S, D] views
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
        try:
            rows[f"SDPA {name}"] = checked(f"SDPA {name}", sdpa)
        except RuntimeError as exc:  # a backend that does not take this problem here
            print(f"  SDPA {name}: not run ({str(exc).splitlines()[0][:90]})", flush=True)

    print(f"{'':26s} {'us':>8s} {'TFLOP/s':>8s} {'GB/s':>7s}")
    for name, us in rows.items():
        if us is not None:
            print(f"{name:26s} {us:8.1f} {flops / us / 1e6:8.3f} {kv_bytes / us / 1e3:7.0f}")
    base = rows["decode (contiguous)"]
    sdpa = [us for name, us in rows.items() if name.startswith("SDPA") and us is not None]
    best = min(sdpa) if sdpa else None
    for name, us in rows.items():
        if name.startswith("attention_paged") and us is not None:
            line = f"{name}: {base / us:.3f}x the contiguous rung (target >= 0.95)"
            if best is not None:
                line += f", {best / us:.3f}x the fastest SDPA backend (target >= 1.0)"
            print(line)
    if best is not None and base is not None:
        print(f"decode (contiguous): {best / base:.3f}x the fastest SDPA backend")


if __name__ == "__main__":
    main()
