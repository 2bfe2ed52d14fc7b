"""Small attention_varlen cases for compute-sanitizer (memcheck, racecheck): each rung on
odd packed lengths (a sequence with no query row, one with no key), both causal alignments,
every flash3 head_dim, and bad offsets on the GPU with the longest lengths given (decreasing,
negative, past the tensors: clamped, never addressed out of bounds); each good case checked
against the float64 reference.

    compute-sanitizer --tool memcheck python benchmarks/sanitize_varlen.py
"""
import cupy as cp
import numpy as np

import cupyops
from cupyops import _launch, reference
from cupyops.ops import _attention_flash3


def main():
    rungs = ["per_sequence"] + (["flash3"] if _attention_flash3.runs_here(_launch.device_props()) else [])
    rng = np.random.default_rng(0)
    right = wrong = 0
    for impl in rungs:
        for D in (64, 96, 128, 256):
            for causal, align in ((False, "bottom_right"), (True, "bottom_right"), (True, "top_left")):
                q_lens, k_lens = [37, 0, 130, 5], [50, 9, 0, 5]
                cq = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
                ck = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32)
                q = rng.standard_normal((cq[-1], 4, D)).astype(np.float16)
                k = rng.standard_normal((ck[-1], 2, D)).astype(np.float16)
                v = rng.standard_normal((ck[-1], 2, D)).astype(np.float16)
                ref = reference.attention_varlen(q, k, v, cq, ck, causal=causal, causal_align=align)
                got = cupyops.attention_varlen(cp.asarray(q), cp.asarray(k), cp.asarray(v), cp.asarray(cq),
                                               cp.asarray(ck), max_seqlen_q=130, max_seqlen_k=50, causal=causal,
                                               causal_align=align, impl=impl)
                ok = reference.rel_error(got.get().astype(np.float64), ref) <= reference.TOLERANCE["attention"]["float16"]
                right, wrong = right + ok, wrong + (not ok)
                if impl == "flash3":  # offsets the host never saw: clamped on the GPU
                    for bad in ([0, 100, 50, 172, 172], [-5, 3, 2000, -1, 9], [0, 172, 172, 172, 5000]):
                        cupyops.attention_varlen(cp.asarray(q), cp.asarray(k), cp.asarray(v),
                                                 cp.asarray(np.array(bad, np.int32)), cp.asarray(ck),
                                                 max_seqlen_q=130, max_seqlen_k=50, causal=causal, impl=impl)
    cp.cuda.Device().synchronize()
    print(f"{right} cases right, {wrong} wrong")


if __name__ == "__main__":
    main()
