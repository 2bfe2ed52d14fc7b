"""Small odd problems through every rung of cupyops.sample, for compute-sanitizer:

    compute-sanitizer --tool memcheck  python benchmarks/sanitize_sampling.py
    compute-sanitizer --tool racecheck python benchmarks/sanitize_sampling.py --quick

Vocabularies of 1, 17 and 1823 (none a multiple of a 16-byte vector; fewer tokens than the
cluster rung has blocks) and 4099, rows starting off 16 bytes and rows padded apart, greedy
and sampled rows, top-k and top-p alone and together, per-row options and seeds. Each
result is checked against the float64 reference, so a run the sanitizer passes is also a
right one. ``--quick``: the fused and cluster rungs (the shared-memory histograms and the
cluster's exchanges) on two vocabularies, for racecheck's slower pace.
"""
import sys

import cupy as cp
import numpy as np

import cupyops
from cupyops import _dtypes, reference


def main():
    quick = "--quick" in sys.argv[1:]
    rng = np.random.default_rng(0)
    cases = 0
    for dtype in ("float32", "float16", "bfloat16"):
        dt = _dtypes.to_dtype(dtype)
        for vocab in (17, 1823) if quick else (1, 17, 1823, 4099):
            rows = 3
            x = (rng.standard_normal((rows, vocab)) * 2).astype(dt)
            flat = cp.zeros(rows * (vocab + 3) + 1, dt)  # rows 3 apart, the first one element in
            view = flat[1:1 + rows * (vocab + 3)].reshape(rows, vocab + 3)[:, :vocab]
            view[...] = cp.asarray(x)
            for impl in [i for i in cupyops.variants("sample") if not quick or i != "naive"]:
                for opts in (dict(temperature=0.0), dict(top_k=5, seed=1), dict(top_p=0.7, seed=2),
                             dict(temperature=cp.asarray(np.array([0.0, 0.8, 1.3], np.float32)), top_k=3,
                                  top_p=cp.asarray(np.array([0.9, 0.5, 1.0], np.float32)),
                                  seed=cp.asarray(np.array([7, 8, 9], np.int64)))):
                    for logits in (cp.asarray(x), view):
                        got = cupyops.sample(logits, impl=impl, **opts)
                        host = {k: (v.get() if hasattr(v, "get") else v) for k, v in opts.items()}
                        ok, _ = reference.sample_accepts(x, got.get(), **host)
                        assert ok.all(), (dtype, vocab, impl, opts, got.get(), reference.sample(x, **host))
                        cases += 1
    cp.cuda.Device().synchronize()
    print(f"{cases} sampling cases checked")


if __name__ == "__main__":
    main()
