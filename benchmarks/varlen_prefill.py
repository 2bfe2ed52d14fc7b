"""Varlen prefill (issue 19's acceptance shape): 8 sequences of mixed lengths packed without
padding through attention_varlen, against attention on the padded equivalent (batch 8, every
sequence padded to the longest) and against attention_varlen's per_sequence rung.

Hq 32, Hkv 8, head_dim 128, float16 and bfloat16, causal (bottom-right: prefill) and not.
Each result is checked against attention() on each sequence alone (and, causal, against
the padded run's real rows) before anything is timed
(CUDA events, L2 flushed before each repeat, median: cupyops.bench.timing). TFLOP/s count
the two matrix products of the real tokens only (4 * Hq * D * the keys each query row sees);
the padded run's own rate counts its padded work (what it computes), so that
"varlen / padded (own rate)" compares how fast each kernel runs the work it does, and
"varlen / padded (real tokens)" is the time saved by not padding.

    python benchmarks/varlen_prefill.py [--repeats N] [--lens 256,512,...] [--json F]
"""
import argparse
import json

import cupy as cp
import numpy as np

import cupyops
from cupyops import reference
from cupyops.bench.timing import L2Flusher, time_gpu

HQ, HKV, D = 32, 8, 128
LENS = (256, 512, 768, 1024, 1536, 2048, 3072, 4096)


def flops(lens, causal):
    """The two products' FLOPs over the keys each row sees (square sequences)."""
    keys = sum(n * (n + 1) // 2 if causal else n * n for n in lens)
    return 4.0 * HQ * D * keys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--lens", default=",".join(map(str, LENS)))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lens = [int(x) for x in args.lens.split(",")]
    B, S = len(lens), max(lens)
    flush = L2Flusher()
    print(cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode())
    print(f"{B} sequences {lens}, Hq {HQ}, Hkv {HKV}, head_dim {D}")
    rows = []
    for dtype in ("float16", "bfloat16"):
        t = cp.dtype(cupyops._dtypes.to_dtype(dtype))
        rs = cp.random.RandomState(0)
        cq = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        total = int(cq[-1])
        q = rs.standard_normal((total, HQ, D), dtype=cp.float32).astype(t)
        k = rs.standard_normal((total, HKV, D), dtype=cp.float32).astype(t)
        v = rs.standard_normal((total, HKV, D), dtype=cp.float32).astype(t)
        dcq = cp.asarray(cq)
        qp, kp, vp = (cp.zeros((B, S) + x.shape[1:], t) for x in (q, k, v))
        for b, n in enumerate(lens):
            qp[b, :n], kp[b, :n], vp[b, :n] = q[cq[b]:cq[b + 1]], k[cq[b]:cq[b + 1]], v[cq[b]:cq[b + 1]]
        for causal in (False, True):
            # every call into an output made once (out=): a new attention_varlen output is
            # zero-filled where the host cannot tell that the offsets cover every row, a memset
            # of the whole output (4-7 % of these calls) that neither the kernel nor the padded
            # run has to do
            out, out_p = cp.empty_like(q), cp.empty_like(qp)
            kw = dict(max_seqlen_q=S, max_seqlen_k=S, causal=causal, out=out)
            calls = {
                "varlen": lambda: cupyops.attention_varlen(q, k, v, dcq, dcq, **kw),
                "per_sequence": lambda: cupyops.attention_varlen(q, k, v, dcq, dcq, impl="per_sequence", **kw),
                # right padding: top-left causal keeps each real row's keys its own
                "padded": lambda: cupyops.attention(qp, kp, vp, causal=causal, out=out_p),
            }
            got = calls["varlen"]().copy()
            worst = 0.0
            for b, n in enumerate(lens):
                s = slice(int(cq[b]), int(cq[b + 1]))
                want = cupyops.attention(q[s][None], k[s][None], v[s][None], causal=causal, causal_align="bottom_right")
                worst = max(worst, reference.rel_error(got[s].astype(cp.float64).get(), want[0].astype(cp.float64).get()))
            padded = calls["padded"]()
            for b, n in enumerate(lens if causal else ()):  # (without a mask a padded row also sees the zero keys)
                s = slice(int(cq[b]), int(cq[b + 1]))
                worst = max(worst, reference.rel_error(padded[b, :n].astype(cp.float64).get(),
                                                       got[s].astype(cp.float64).get()))
            ok = worst <= reference.TOLERANCE["attention"][dtype]
            us = {name: time_gpu(fn, repeats=args.repeats, flush=flush).median_ms * 1e3 for name, fn in calls.items()}
            real = flops(lens, causal)
            pad = flops([S] * B, causal)
            row = {"dtype": dtype, "causal": causal, "lens": lens, "check_rel_error": worst, "ok": ok,
                   "us": us, "tflops_real": {n: real / (u * 1e-6) / 1e12 for n, u in us.items()},
                   "padded_own_tflops": pad / (us["padded"] * 1e-6) / 1e12}
            row["varlen_vs_padded_own_rate"] = row["tflops_real"]["varlen"] / row["padded_own_tflops"]
            row["varlen_vs_padded_real_tokens"] = us["padded"] / us["varlen"]
            rows.append(row)
            print(f"{dtype:8s} {'causal' if causal else 'full  '} check {worst:.2e} {'ok' if ok else 'WRONG'} | "
                  f"varlen {us['varlen']:8.1f} us {row['tflops_real']['varlen']:6.1f} TF/s | per_sequence "
                  f"{us['per_sequence']:8.1f} us | padded {us['padded']:8.1f} us ({row['padded_own_tflops']:6.1f} TF/s "
                  f"own) | varlen/padded own rate {row['varlen_vs_padded_own_rate']:.3f}, real tokens "
                  f"{row['varlen_vs_padded_real_tokens']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
