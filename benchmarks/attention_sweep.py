"""Tile-configuration sweep for the tensor-core attention rungs: every ``config`` of
cupyops/ops/_attention_flash.py and _attention_flash3.py CONFIGS (``--rungs``; flash3's
configurations include its serial and overlap schedules) on the issue's acceptance shapes, validated on
sampled query rows against a float64 computation, then timed (CUDA events, L2 flushed,
median) side by side with PyTorch SDPA's flash and cuDNN backends on the same data. The
default configuration of each head_dim is chosen from this.

    python benchmarks/attention_sweep.py [--json PATH] [--dtypes float16,bfloat16] [--rungs flash,flash3]
Prints one line per run: dtype shape causal config ms TFLOP/s ratio-to-SDPA-flash ratio-to-cuDNN.
"""
import argparse
import json

import cupy as cp
import numpy as np

from cupyops.bench.timing import L2Flusher, time_gpu
from cupyops.ops import _attention_flash, _attention_flash3
from cupyops.ops._attention_problem import AttentionProblem

# (B, Hq, Hkv, S, D, causal)
SHAPES = [(4, 16, 16, 4096, 128, False), (4, 16, 16, 4096, 128, True), (4, 32, 32, 4096, 64, False),
          (4, 32, 32, 4096, 64, True), (1, 32, 8, 8192, 128, True), (2, 8, 8, 4096, 256, False),
          (2, 8, 8, 4096, 256, True), (4, 16, 16, 4096, 96, False), (16, 16, 16, 1024, 128, False),
          (1, 16, 16, 16384, 128, False)]


def flops(B, Hq, S, D, causal):
    pairs = S * (S + 1) // 2 if causal else S * S
    return 4 * B * Hq * D * pairs


def sample_reference(q, k, v, rows, heads, scale, causal):
    """float64 outputs of batch 0 at the given query rows and heads (bshd, top-left causal)."""
    qh = q[0].get().astype(np.float64)
    kh = k[0].get().astype(np.float64)
    vh = v[0].get().astype(np.float64)
    group = q.shape[2] // k.shape[2]
    out = np.empty((len(rows), len(heads), q.shape[3]))
    for a, h in enumerate(heads):
        s = qh[rows, h] @ kh[:, h // group].T * scale
        if causal:
            s[np.arange(kh.shape[0])[None, :] > np.asarray(rows)[:, None]] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, a] = (p / p.sum(axis=1, keepdims=True)) @ vh[:, h // group]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--rungs", default="flash", help="flash, flash3 (sm_90)")
    ap.add_argument("--dims", default="", help="only these head_dims (e.g. 96,128)")
    ap.add_argument("--masks", default="none,causal", help="none, causal or both")
    ap.add_argument("--l2-shares", default="", help="flash3: head groups whose K and V fill these shares of L2 "
                    "(0: one head a group), each timed; default: the launcher's")
    args = ap.parse_args()
    launchers = {"flash": _attention_flash, "flash3": _attention_flash3}
    rungs = args.rungs.split(",")
    for impl in rungs:
        if impl not in launchers:
            raise SystemExit(f"--rungs: unknown rung {impl!r}; expected one of {', '.join(launchers)}")
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as tF
    except ImportError:
        torch = None
    flush = L2Flusher()
    results = []
    for dt in args.dtypes.split(","):
        for B, Hq, Hkv, S, D, causal in SHAPES:
            if args.dims and str(D) not in args.dims.split(",") or \
                    ("causal" if causal else "none") not in args.masks.split(","):
                continue
            rs = cp.random.RandomState(1)
            q, k, v = (rs.standard_normal((B, S, h, D), dtype=np.float32).astype(dt) for h in (Hq, Hkv, Hkv))
            o = cp.empty_like(q)
            scale = 1.0 / np.sqrt(D)
            el = lambda x: tuple(s // x.itemsize for s in x.strides[:3])  # noqa: E731
            p = AttentionProblem(dt, B, Hq, Hkv, S, S, D, q, k, v, o, None, el(q), el(k), el(v), el(o),
                                 scale, causal, 0)
            rows = np.unique(np.linspace(0, S - 1, 48).round().astype(np.int64))
            heads = sorted({0, Hq - 1})
            ref = sample_reference(q, k, v, rows, heads, scale, causal)
            fl = flops(B, Hq, S, D, causal)
            base = {}
            if torch is not None:
                tq, tk, tv = (torch.from_dlpack(x).transpose(1, 2) for x in (q, k, v))
                for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        with sdpa_kernel(backend):
                            fn = lambda: tF.scaled_dot_product_attention(  # noqa: E731
                                tq, tk, tv, is_causal=causal, enable_gqa=Hq != Hkv)
                            fn()
                            base[label] = time_gpu(fn, repeats=args.repeats, warmup=2, flush=flush).median_ms
                    except Exception as exc:  # noqa: BLE001 - a backend that cannot run this case
                        print(f"  sdpa {label}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            shape = f"B{B} Hq{Hq} Hkv{Hkv} S{S} D{D}"
            for label, ms in base.items():
                print(f"sdpa-{label:6s} {dt:9s} {shape:28s} causal={causal!s:5s} {'':9s} {ms:8.3f} ms "
                      f"{fl / ms / 1e9:6.1f} TFLOP/s", flush=True)
            for impl in rungs:
                mod = launchers[impl]
                shares = [float(x) for x in args.l2_shares.split(",") if x] if impl == "flash3" else []
                for cfg, share in [(c, sh) for c in mod.CONFIGS.get(D, ()) for sh in (shares or [None])]:
                    kw = {} if share is None else {"l2_share": share}
                    o.fill(np.nan)
                    mod.launch(impl, p, cfg, **kw)
                    got = o[0][rows][:, heads].get().astype(np.float64)
                    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                    if not err <= 2e-2:
                        print(f"  WRONG {impl} {dt} {shape} causal={causal} {cfg}: rel error {err:.3g}", flush=True)
                        continue
                    ms = time_gpu(lambda: mod.launch(impl, p, cfg, **kw), repeats=args.repeats, warmup=2,
                                  flush=flush).median_ms
                    if share is not None:
                        cfg = f"{cfg}/L2x{share:g}"
                    ratios = {k2: b / ms for k2, b in base.items()}
                    results.append({"impl": impl, "dtype": dt, "shape": [B, Hq, Hkv, S, D], "causal": causal,
                                    "config": cfg, "ms": ms, "tflops": fl / ms / 1e9, "err": err, "vs": ratios})
                    print(f"{impl:11s} {dt:9s} {shape:28s} causal={causal!s:5s} {cfg:9s} {ms:8.3f} ms "
                          f"{fl / ms / 1e9:6.1f} TFLOP/s  vs flash {ratios.get('flash', float('nan')):5.2f}x  "
                          f"vs cudnn {ratios.get('cudnn', float('nan')):5.2f}x  err {err:.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=0)


if __name__ == "__main__":
    main()
