"""Small odd problems through every rung of the serving operators (issue 19), for
compute-sanitizer:

    compute-sanitizer --tool memcheck python benchmarks/sanitize_serving.py

silu_and_mul and gelu_and_mul (both approximations), add_rms_norm (out of place and in
place), rope (neox and gptj, a partial rotary_dim, q and k as head slices of one qkv
buffer, in place, a cos/sin cache): odd row lengths (none a multiple of a 16-byte vector),
one row and many, inputs starting off 16 bytes. Each result is checked against the
float64 reference, so a run the sanitizer passes is also a right one.
"""
import cupy as cp
import numpy as np

import cupyops
from cupyops import _dtypes, reference

DTYPES = ("float32", "float16", "bfloat16")


def dev(a, dtype, offset=0):
    """``a`` on the GPU in ``dtype``; ``offset`` elements in (a start off 16 bytes)."""
    dt = _dtypes.to_dtype(dtype)
    flat = cp.zeros(a.size + offset, dt)
    flat[offset:] = cp.asarray(a.astype(np.float32).ravel()).astype(dt)
    return flat[offset:].reshape(a.shape)


def host(a):
    return cp.asnumpy(a.astype(cp.float32)).astype(np.float64)


def check(got, ref, what, tol):
    got, ref = host(got), np.asarray(ref, np.float64)
    assert np.isfinite(got).all(), what
    err = reference.rel_error(got, ref)
    assert err < tol, (what, err)


def main():
    rng = np.random.default_rng(0)
    cases = 0
    for dtype in DTYPES:
        tol = 1e-5 if dtype == "float32" else 2e-2
        for rows, d in ((1, 7), (3, 33), (130, 515)):
            x = rng.standard_normal((rows, 2 * d))
            for impl in ("auto", *cupyops.variants("silu_and_mul")):
                check(cupyops.silu_and_mul(dev(x, dtype, 1), impl=impl), reference.silu_and_mul(x),
                      ("silu_and_mul", dtype, rows, d, impl), tol)
                for approx in ("none", "tanh"):
                    check(cupyops.gelu_and_mul(dev(x, dtype), approximate=approx, impl=impl),
                          reference.gelu_and_mul(x, approx), ("gelu_and_mul", dtype, rows, d, impl, approx), tol)
                cases += 3
            n = 2 * d
            xr, rr, w = rng.standard_normal((rows, n)), rng.standard_normal((rows, n)), rng.standard_normal(n)
            for impl in ("auto", *cupyops.variants("add_rms_norm")):
                for inplace in (False, True):
                    xd, rd = dev(xr, dtype, 3), dev(rr, dtype)
                    normed, s = cupyops.add_rms_norm(xd, rd, dev(w, dtype), 1e-6, inplace=inplace, impl=impl)
                    ref_n, ref_s = reference.add_rms_norm(host(dev(xr, dtype)), host(dev(rr, dtype)), host(dev(w, dtype)))
                    check(normed, ref_n, ("add_rms_norm", dtype, rows, n, impl, inplace), tol)
                    check(s, ref_s, ("add_rms_norm sum", dtype, rows, n, impl, inplace), tol)
                    cases += 1
        for tokens, hq, hkv, D, R, style in ((1, 2, 1, 64, 64, "neox"), (5, 3, 1, 80, 48, "gptj"),
                                             (37, 8, 2, 128, 128, "neox"), (9, 4, 4, 96, 32, "neox")):
            qkv = rng.standard_normal((tokens, (hq + 2 * hkv) * D))
            pos = rng.integers(0, 4096, tokens).astype(np.int64)
            for impl in ("auto", *cupyops.variants("rope")):
                for inplace in (False, True):
                    buf = dev(qkv, dtype)
                    q = buf[:, :hq * D].reshape(tokens, hq, D)
                    k = buf[:, hq * D:(hq + hkv) * D].reshape(tokens, hkv, D)
                    rq, rk = reference.rope(host(q), host(k), pos, rotary_dim=R, style=style)
                    oq, ok = cupyops.rope(q, k, cp.asarray(pos), rotary_dim=R, style=style, inplace=inplace, impl=impl)
                    check(oq, rq, ("rope q", dtype, tokens, hq, D, R, style, impl, inplace), tol)
                    check(ok, rk, ("rope k", dtype, tokens, hkv, D, R, style, impl, inplace), tol)
                    cases += 1
            cache = np.concatenate([np.cos(np.outer(np.arange(4096), 1e-2 * np.arange(R // 2))),
                                    np.sin(np.outer(np.arange(4096), 1e-2 * np.arange(R // 2)))], 1)
            q, k = rng.standard_normal((tokens, hq, D)), rng.standard_normal((tokens, hkv, D))
            rq, rk = reference.rope(host(dev(q, dtype)), host(dev(k, dtype)), pos, rotary_dim=R, style=style,
                                    cos_sin_cache=cache.astype(np.float32))
            oq, ok = cupyops.rope(dev(q, dtype), dev(k, dtype), cp.asarray(pos), rotary_dim=R, style=style,
                                  cos_sin_cache=cp.asarray(cache.astype(np.float32)))
            check(oq, rq, ("rope cache q", dtype), tol)
            check(ok, rk, ("rope cache k", dtype), tol)
            cases += 1
    cp.cuda.Device().synchronize()
    print(f"sanitize_serving: {cases} cases right")


if __name__ == "__main__":
    main()
