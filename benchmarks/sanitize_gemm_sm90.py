"""Small odd GEMMs through every sm_90a rung and configuration (the 16-bit wgmma rungs and
the float8 scaled_matmul), for compute-sanitizer:

    compute-sanitizer --tool memcheck  python benchmarks/sanitize_gemm_sm90.py
    compute-sanitizer --tool racecheck python benchmarks/sanitize_gemm_sm90.py

Every layout, edges in M, N and K (extents multiples of 8 so that tensor maps describe
them, none a multiple of a tile), a stack with a broadcast operand, beta == 0 (the
tensor-store epilogue) and beta != 0 (direct stores), one problem of more tiles than
SMs for every wgmma_ws configuration, and stream-K (128x256sk) with its tiles cut into
pieces of one k-tile, so that blocks hand partials to each other through the workspace. Each result is checked against the
float64 reference, so a run that the sanitizer passes is also a right one.
"""
import cupy as cp
import numpy as np

from cupyops import reference
from cupyops.ops import gemm as G

W = G._gemm_wgmma


def main():
    rng = np.random.default_rng(0)
    cases = 0
    for impl in W.VARIANTS:
        for cfg in W.CONFIGS[impl] or (None,):
            for M, N, K in ((72, 264, 136),):
                for ta, tb in W.LAYOUTS:
                    ta, tb = ta == "true", tb == "true"
                    if impl == "wgmma_ws" and not W.takes_layout(W.tile_of(impl, cfg), tb):
                        continue  # (128x176c2: a K-major B alone)
                    for batch, beta in (((), 0.0), ((2,), 0.5)):
                        a = rng.standard_normal(batch + ((K, M) if ta else (M, K))).astype(np.float32)
                        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
                        c = rng.standard_normal(batch + (M, N)).astype(np.float32) if beta else None
                        da = cp.asarray(a).astype(cp.float16)
                        db = cp.asarray(b).astype(cp.float16)
                        dc = None if c is None else cp.asarray(c).astype(cp.float16)
                        ref = reference.gemm(da.get(), db.get(), None if dc is None else dc.get(), 1.0, beta, ta, tb)
                        d = cp.full(batch + (M, N), np.nan, cp.float16)
                        for p in G._problems("float16", ta, tb, M, N, K, da, db, dc, d, batch, 1.0, beta, cp):
                            W.launch(impl, p, cfg)
                        err = reference.rel_error(d.get(), ref)
                        assert err < 1e-2, (impl, cfg, M, N, K, ta, tb, batch, beta, err)
                        cases += 1
    # more tiles than SMs: persistent blocks go from one tile to the next (ring phases,
    # staging buffer reuse, the producer running ahead into the next tile)
    M, N, K = 2056, 2312, 72
    a = cp.asarray(rng.standard_normal((M, K)).astype(np.float32)).astype(cp.float16)
    b = cp.asarray(rng.standard_normal((N, K)).astype(np.float32)).astype(cp.float16)
    ref = reference.gemm(a.get(), b.get(), None, 1.0, 0.0, False, True)
    for cfg in W.CONFIGS["wgmma_ws"]:
        d = cp.full((M, N), np.nan, cp.float16)
        (p,) = G._problems("float16", False, True, M, N, K, a, b, None, d, (), 1.0, 0.0, cp)
        W.launch("wgmma_ws", p, cfg)
        err = reference.rel_error(d.get(), ref)
        assert err < 1e-2, (cfg, err)
        cases += 1
    # stream-K with ranges of one k-tile (SK_MIN_K_TILES = 1): tiles cut into pieces held by
    # two to four blocks, after whole waves (the 2056 x 2312 problem: 170 tiles) or with
    # none; a broadcast stack, beta == 0 (tensor stores) and beta != 0 (direct stores)
    W.SK_MIN_K_TILES, default = 1, W.SK_MIN_K_TILES
    try:
        for (M, N, K), batch, beta, tb in (((72, 264, 136), (2,), 0.0, True), ((72, 264, 136), (2,), 0.5, False),
                                           ((2056, 2312, 200), (), 0.0, True), ((2056, 2312, 200), (), 0.5, True)):
            a = cp.asarray(rng.standard_normal(batch + (M, K)).astype(np.float32)).astype(cp.float16)
            b = cp.asarray(rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)).astype(cp.float16)
            c = cp.asarray(rng.standard_normal(batch + (M, N)).astype(np.float32)).astype(cp.float16) if beta else None
            ref = reference.gemm(a.get(), b.get(), None if c is None else c.get(), 1.0, beta, False, tb)
            d = cp.full(batch + (M, N), np.nan, cp.float16)
            for p in G._problems("float16", False, tb, M, N, K, a, b, c, d, batch, 1.0, beta, cp):
                W.launch("wgmma_ws", p, "128x256sk")
            err = reference.rel_error(d.get(), ref)
            assert err < 1e-2, ("128x256sk split", M, N, K, batch, beta, tb, err)
            cases += 1
    finally:
        W.SK_MIN_K_TILES = default
    # the float8 GEMM: every tile, each epilogue (tensor stores: bfloat16 out, one scale for
    # B; direct: per-column scales with a bias, and float32 out), edges in M, N and K, and
    # more tiles than SMs
    from cupyops.ops import _fp8_gemm, fp8

    def e4m3_bits(shape):  # values of magnitude below 2 (bits under 0x40), either sign
        bits = rng.integers(0, 0x40, shape, dtype=np.uint8) | (rng.integers(0, 2, shape, dtype=np.uint8) << 7)
        return cp.asarray(bits)

    for M, N, K in ((72, 264, 144), (2056, 2312, 48)):
        a = e4m3_bits((M, K))
        b = e4m3_bits((N, K)).T  # K x N, K-major
        sb_cols = cp.asarray(rng.uniform(0.5, 2, N).astype(np.float32))
        bias = cp.asarray(rng.standard_normal(N).astype(np.float32))
        for cfg in _fp8_gemm.CONFIGS["wgmma_ws"]:
            _fp8_gemm.DEFAULT_CONFIG, default = cfg, _fp8_gemm.DEFAULT_CONFIG
            try:
                for out_dtype, sb, bi in (("bfloat16", 0.5, None), ("float16", sb_cols, bias), ("float32", 0.5, None)):
                    got = fp8.scaled_matmul(a, b, 0.25, sb, out_dtype=out_dtype, bias=bi)
                    ref = reference.scaled_matmul(a.get(), b.get(), 0.25, sb if isinstance(sb, float) else sb.get(),
                                                  None if bi is None else bi.get())
                    err = reference.rel_error(got.astype(cp.float32).get(), ref)
                    assert err < 1e-2, ("fp8", cfg, M, N, K, out_dtype, err)
                    cases += 1
            finally:
                _fp8_gemm.DEFAULT_CONFIG = default
    cp.cuda.runtime.deviceSynchronize()
    print(f"{cases} sm_90a GEMM cases right")


if __name__ == "__main__":
    main()
