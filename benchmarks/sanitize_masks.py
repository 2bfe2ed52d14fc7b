"""Small windowed and soft-capped attention cases for compute-sanitizer (memcheck,
racecheck): every attention rung (flash3 in its window and cap instantiations) on odd lengths,
windows that start and end mid-tile and leave rows no key, q_len != kv_len both ways;
varlen's per_sequence; the paged decode kernel with windows over shuffled pages. Each case
is checked against the float64 reference.

    compute-sanitizer --tool memcheck python benchmarks/sanitize_masks.py
"""
import cupy as cp
import numpy as np

import cupyops
from cupyops import _dtypes, reference
from cupyops.ops import attention as A

TOL = reference.TOLERANCE["attention"]


def ok(got, ref, dtype):
    got = got.get().astype(np.float64)
    return not np.isnan(got).any() and reference.rel_error(got, ref) <= TOL[dtype]


def main():
    rng = np.random.default_rng(0)
    right = wrong = 0
    cases = [  # (Sq, Skv, D, causal, align, window, softcap)
        (37, 70, 64, False, "bottom_right", (9, 3), None),
        (70, 37, 128, True, "bottom_right", (20, None), 7.0),
        (1, 300, 128, True, "bottom_right", (64, 0), None),
        (5, 130, 96, False, "top_left", (None, 2), 30.0),
        (129, 129, 256, True, "top_left", (1, None), 2.0),
        (200, 260, 64, True, "bottom_right", (None, None), 10.0),  # a cap alone (flash3: 192-row tiles)
    ]
    for impl in A.LADDER:
        for dtype in A.dtypes_of(impl):
            t = _dtypes.to_dtype(dtype)
            for Sq, Skv, D, causal, align, window, softcap in cases:
                q = rng.standard_normal((2, Sq, 4, D)).astype(t)
                k = rng.standard_normal((2, Skv, 2, D)).astype(t)
                v = rng.standard_normal((2, Skv, 2, D)).astype(t)
                try:
                    got = cupyops.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=causal,
                                            causal_align=align, window=window, softcap=softcap, impl=impl)
                except ValueError as exc:  # a rung that does not run the shape (head_dim, q_len)
                    if str(exc).startswith(f"impl: {impl!r} cannot run"):
                        continue
                    raise
                ref = reference.attention(q, k, v, causal=causal, causal_align=align, window=window,
                                          softcap=softcap)
                good = ok(got, ref, dtype)
                right, wrong = right + good, wrong + (not good)
                if not good:
                    print("WRONG", impl, dtype, Sq, Skv, D, causal, align, window, softcap)
    for impl in ("per_sequence", "flash3"):
        q_lens, k_lens = [37, 0, 130, 5], [50, 9, 0, 5]
        cq = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        ck = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32)
        q, k, v = (rng.standard_normal((n, h, 128)).astype(np.float16) for n, h in ((cq[-1], 4), (ck[-1], 2),
                                                                                    (ck[-1], 2)))
        ref = reference.attention_varlen(q, k, v, cq, ck, causal=True, window=(7, None), softcap=5.0)
        try:
            got = cupyops.attention_varlen(*(cp.asarray(x) for x in (q, k, v, cq, ck)), max_seqlen_q=130,
                                           max_seqlen_k=50, causal=True, window=(7, None), softcap=5.0, impl=impl)
        except ValueError:  # flash3 off sm_90
            continue
        good = ok(got, ref, "float16")
        right, wrong = right + good, wrong + (not good)
    from test_gpu_paged import build_cache  # (tests/ on sys.path: run from the repository root)

    for P in (16, 64):
        lens = np.array([3, 200, 77], np.int32)
        kc, vc, table = build_cache(rng, "bfloat16", lens, P, 2, 64)
        q = rng.standard_normal((3, 3, 4, 64)).astype(kc.dtype)
        ref = reference.attention_paged(q, kc, vc, table, lens, window=(30, None), softcap=4.0)
        got = cupyops.attention_paged(*(cp.asarray(x) for x in (q, kc, vc, table, lens)), window=(30, None),
                                      softcap=4.0)
        good = ok(got, ref, "bfloat16")
        right, wrong = right + good, wrong + (not good)
    cp.cuda.Device().synchronize()
    print(f"{right} cases right, {wrong} wrong")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, "tests")
    main()
