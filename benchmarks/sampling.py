"""cupyops.sample, every rung, against the PyTorch eager composition vLLM falls back to
(vLLM's ``apply_top_k_top_p``: sort, top-k gather mask, softmax + cumsum top-p mask,
scatter back; then softmax and ``torch.multinomial``) and FlashInfer's
``top_k_top_p_sampling_from_logits`` where FlashInfer is importable, on Llama 3's vocabulary
(128256) at batch 1, 32 and 64, bf16 and float32 logits.

Each rung is first checked against ``cupyops.reference.sample`` (the float64 draw with the
same Philox uniforms) on the first rows of the timed logits; then everything is timed with
CUDA events (cupyops.bench.timing: L2 flushed by a read before each repeat, median). The
floor column is the logits read once at the measured copy bandwidth.

    python benchmarks/sampling.py [--budget S] [--batches 1,32,64] [--json PATH]
"""
import argparse
import json

import cupy as cp
import numpy as np

import cupyops
from cupyops import _dtypes, reference
from cupyops.bench.timing import L2Flusher, copy_bandwidth, time_gpu

VOCAB = 128256
DTYPES = ("bfloat16", "float32")
CONFIGS = {  # what a serving engine asks for, and the two cuts alone
    "T0.8 k50 p0.9": dict(temperature=0.8, top_k=50, top_p=0.9),
    "T1 p0.9": dict(temperature=1.0, top_p=0.9),
    "T1": dict(temperature=1.0),
}
CHECK_ROWS = 16  # rows checked against the float64 reference before timing


def torch_composition(torch):
    """vLLM's fallback sampler (vllm/v1/sample/ops/topk_topp_sampler.py, apply_top_k_top_p
    and a multinomial draw), per-row k and p tensors as vLLM passes them."""

    def run(logits, temperature, k, p):
        x = logits.float().div_(temperature)
        x_sort, x_idx = x.sort(dim=-1, descending=False)
        if k is not None:
            kth = x_sort.gather(1, (x_sort.size(1) - k.long()).unsqueeze(1))
            x_sort.masked_fill_(x_sort < kth, -float("inf"))
        if p is not None:
            probs_sort = x_sort.softmax(dim=-1)
            cum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
            mask = cum <= 1 - p.unsqueeze(1)
            mask[:, -1] = False
            x_sort.masked_fill_(mask, -float("inf"))
        x = x_sort.scatter(dim=-1, index=x_idx, src=x_sort)
        return torch.multinomial(x.softmax(dim=-1), 1).view(-1)

    return run


def flashinfer_sampler():
    try:
        import flashinfer.sampling as fs
    except Exception as exc:  # noqa: BLE001 - absent, or broken for this torch/CUDA
        return None, f"{type(exc).__name__}: {exc}"
    return fs.top_k_top_p_sampling_from_logits, None


def check(x, impl, opts, seed):
    """The rung's tokens on the first CHECK_ROWS rows against the reference's draw (the same
    counters: one seed a call, counter = the row); returns how many needed the tolerance."""
    got = cupyops.sample(x, seed=seed, impl=impl, **opts)
    rows = min(CHECK_ROWS, x.shape[0])
    ok, exact = reference.sample_accepts(x[:rows].get(), got[:rows].get(), seed=seed, tol=1e-5, **opts)
    if not ok.all():
        raise SystemExit(f"{impl} {x.dtype} {x.shape} {opts}: rows {np.flatnonzero(~ok)} differ from the reference")
    return int((~exact).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=0.4, help="seconds of timing a measurement (default 0.4)")
    ap.add_argument("--batches", default="1,32,64")
    ap.add_argument("--json")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    try:
        import torch
    except ImportError:
        torch = None
    flashinfer, why_not = flashinfer_sampler() if torch is not None else (None, "no torch")
    cupyops.warmup(["sample"])
    flush = L2Flusher()
    gbps = copy_bandwidth(1 << 28, flush=flush)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    print(f"{props['name'].decode()}  copy {gbps:.0f} GB/s  torch {torch.__version__ if torch else '-'}  "
          f"flashinfer: {'yes' if flashinfer else 'skipped (' + why_not + ')'}")
    rungs = list(cupyops.variants("sample"))
    cols = rungs + ["torch"] + (["flashinfer"] if flashinfer else [])
    print(f"{'dtype':9} {'batch':>5} {'options':15} {'floor':>7} " + " ".join(f"{c:>10}" for c in cols)
          + "   (us)   torch / " + ", ".join(rungs))
    rng = np.random.default_rng(0)
    results = []
    for dtype in DTYPES:
        for batch in batches:
            # logits of a trained model's spread: a few tokens well ahead, a long tail
            x = cp.asarray((rng.standard_normal((batch, VOCAB)) * 3.0).astype(_dtypes.to_dtype(dtype)))
            seed = cp.asarray(np.uint64(rng.integers(0, 2**63)))  # a device seed: the fast path
            floor_us = x.nbytes / (gbps * 1e9) * 1e6
            xt = torch.from_dlpack(x) if torch else None
            for name, opts in CONFIGS.items():
                near = {impl: check(x, impl, opts, int(seed.get())) for impl in rungs}
                us = {impl: time_gpu(lambda impl=impl: cupyops.sample(x, seed=seed, impl=impl, **opts), flush=flush,
                                     budget_s=args.budget).median_ms * 1e3 for impl in rungs}
                if torch:
                    k = torch.full((batch,), opts["top_k"], device="cuda", dtype=torch.int32) if "top_k" in opts else None
                    p = torch.full((batch,), opts["top_p"], device="cuda") if "top_p" in opts else None
                    run = torch_composition(torch)
                    us["torch"] = time_gpu(lambda: run(xt, opts["temperature"], k, p), flush=flush,
                                           budget_s=args.budget).median_ms * 1e3
                    if flashinfer:
                        kk = k if k is not None else torch.full((batch,), VOCAB, device="cuda", dtype=torch.int32)
                        pp = p if p is not None else torch.ones(batch, device="cuda")
                        T = opts["temperature"]
                        us["flashinfer"] = time_gpu(lambda: flashinfer(xt.float() / T, kk, pp), flush=flush,
                                                    budget_s=args.budget).median_ms * 1e3
                ratios = ("   " + " ".join(f"{us['torch'] / us[r]:6.2f}x" for r in rungs)) if torch else ""
                print(f"{dtype:9} {batch:5d} {name:15} {floor_us:7.1f} " + " ".join(f"{us[c]:10.1f}" for c in cols)
                      + ratios + (f"   (near-boundary rows: {near})" if any(near.values()) else ""))
                results.append({"dtype": dtype, "batch": batch, "vocab": VOCAB, "options": opts, "floor_us": floor_us,
                                "us": us, "near_boundary_rows": near, "gpu": props["name"].decode()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
