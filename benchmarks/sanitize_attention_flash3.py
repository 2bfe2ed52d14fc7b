"""Small odd attention problems through every flash3 configuration (each head_dim, ring
depth and schedule), for compute-sanitizer:

    compute-sanitizer --tool memcheck  python benchmarks/sanitize_attention_flash3.py
    compute-sanitizer --tool racecheck python benchmarks/sanitize_attention_flash3.py

Edges in both lengths (none a multiple of a tile), q_len < kv_len and q_len > kv_len
(bottom-right causal: rows that see no key), GQA, one and several K/V tiles (the rings
wrapping), more work tiles than SMs (a persistent block going from tile to tile), both
layouts. Each result, with its LSE, is checked against the float64
reference, so a run that the sanitizer passes is also a right one.
"""
import cupy as cp
import numpy as np

from cupyops import reference
from cupyops.ops import _attention_flash3 as F3
from cupyops.ops import attention as A


def main():
    rng = np.random.default_rng(0)
    cases = 0
    for D, cfgs in F3.CONFIGS.items():
        for cfg in cfgs:
            # (B, Sq, Skv, Hq, Hkv, causal, align, layout)
            for B, Sq, Skv, Hq, Hkv, causal, align, layout in (
                    (1, 77, 333, 2, 1, True, "bottom_right", "bshd"),
                    (2, 200, 72, 2, 2, True, "bottom_right", "bhsd"),
                    (1, 130, 130, 4, 2, False, "top_left", "bshd"),
                    (4, 1000, 200, 8, 2, True, "bottom_right", "bshd")):  # 256 work tiles: more than SMs
                q = rng.standard_normal((B, Sq, Hq, D)).astype(np.float16)
                k = rng.standard_normal((B, Skv, Hkv, D)).astype(np.float16)
                v = rng.standard_normal((B, Skv, Hkv, D)).astype(np.float16)
                ref, ref_lse = reference.attention(q, k, v, causal=causal, causal_align=align, return_lse=True)
                dq, dk, dv = (cp.asarray(x if layout == "bshd" else np.ascontiguousarray(x.transpose(0, 2, 1, 3)))
                              for x in (q, k, v))
                out = cp.full(dq.shape, np.nan, cp.float16)
                lse = cp.full((B, Hq, Sq), np.nan, cp.float32)
                offset = Skv - Sq if causal and align == "bottom_right" else 0
                p = A._problem("float16", (B, Hq, Hkv, Sq, Skv, D), layout, [dq, dk, dv], out, lse,
                               1 / np.sqrt(D), causal, offset)
                F3.launch("flash3", p, cfg)
                got = out.get().astype(np.float64)
                got = got if layout == "bshd" else got.transpose(0, 2, 1, 3)
                err = float(np.max(np.abs(got - ref)))
                assert err < 2e-2, (D, cfg, B, Sq, Skv, causal, align, layout, err)
                lg, lr = lse.get(), ref_lse
                assert np.array_equal(np.isneginf(lg), np.isneginf(lr)), (D, cfg, "lse -inf rows")
                fin = np.isfinite(lr)
                assert np.allclose(lg[fin], lr[fin], atol=1e-3), (D, cfg, "lse")
                cases += 1
    print(f"sanitize_attention_flash3: {cases} cases right")


if __name__ == "__main__":
    main()
