"""Small paged-KV problems for compute-sanitizer (issue 19: memcheck clean on small cases,
bad GPU-resident values included):

    compute-sanitizer --tool memcheck python benchmarks/sanitize_paged.py

attention_paged for each head_dim tier, both 16-bit dtypes, the 16-byte and the element
path (a cache one element off a 16-byte boundary), one split and several (a long
sequence beside a short one), page sizes 16 and 256, tables whose unused entries hold
garbage, and lengths / table entries out of range (clamped, read as zeros);
kv_cache_append with positions and pages out of range (skipped); merge_attention_states
with -inf sides; packed chunked prefill (cu_seqlens_q: the gather rung) with the same bad
values. Every result is checked against the float64 reference, so a run the
sanitizer passes is also a right one.
"""
import cupy as cp
import numpy as np

import cupyops
from cupyops import _dtypes, reference

I32 = np.int32


def cache(rng, dtype, lens, P, H, D):
    need = [-(-n // P) for n in lens]
    pages = sum(need) + 1
    order = rng.permutation(pages)
    kc = rng.standard_normal((pages, P, H, D)).astype(dtype)
    vc = rng.standard_normal((pages, P, H, D)).astype(dtype)
    table = np.full((len(lens), max(need) + 1), 10**8, I32)  # garbage past each sequence
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = order[at:at + n]
        at += n
    return kc, vc, table


def offset_copy(a):
    flat = cp.empty(a.size + 1, a.dtype)
    flat[1:] = cp.asarray(a).ravel()
    return flat[1:].reshape(a.shape)


def check(got, want, dtype, what):
    err = reference.rel_error(got, want)
    assert err <= reference.TOLERANCE["attention"][dtype], f"{what}: rel error {err:.3g}"


def main():
    rng = np.random.default_rng(0)
    n = 0
    for dtype in ("float16", "bfloat16"):
        t = _dtypes.to_dtype(dtype)
        for D in (64, 128, 256, 40):
            for lens, P, Sq in (([3000, 5], 16, 1), ([70, 1, 300], 256, 4)):
                kc, vc, table = cache(rng, t, lens, P, 2, D)
                q = rng.standard_normal((len(lens), Sq, 8, D)).astype(t)
                want = reference.attention_paged(q, kc, vc, table, np.array(lens, I32))
                for aligned in (True, False):
                    dk, dv = (cp.asarray(x) if aligned else offset_copy(x) for x in (kc, vc))
                    got = cupyops.attention_paged(cp.asarray(q), dk, dv, cp.asarray(table), cp.asarray(np.array(lens, I32)))
                    check(got, want, dtype, f"{dtype} D{D} P{P} lens {lens} aligned {aligned}")
                    n += 1
        # out-of-range device values: lengths clamped, a bad entry in use reads as zeros
        kc, vc, table = cache(rng, t, [40, 40], 16, 2, 64)
        table[1, 1] = -9
        zero = kc.shape[0]
        kz = np.concatenate([kc, np.zeros_like(kc[:1])])
        vz = np.concatenate([vc, np.zeros_like(vc[:1])])
        ref_table = table.copy()
        ref_table[1, 1] = ref_table[0, 3] = zero  # (the garbage column 3: in use once 10**9 is clamped to 64)
        q = rng.standard_normal((2, 1, 4, 64)).astype(t)
        want = reference.attention_paged(q, kz, vz, ref_table, np.array([64, 40], I32))
        got = cupyops.attention_paged(cp.asarray(q), cp.asarray(kc), cp.asarray(vc), cp.asarray(table),
                                      cp.asarray(np.array([10**9, 40], I32)))
        check(got, want, dtype, f"{dtype} bad device values")
        # appends past the table or into bad pages: skipped
        k = rng.standard_normal((2, 5, 2, 64)).astype(t)
        v = rng.standard_normal((2, 5, 2, 64)).astype(t)
        pos = np.array([45, -2], I32)
        want_k, want_v = reference.kv_cache_append(kc, vc, k, v, table, pos)
        dk, dv = cp.asarray(kc), cp.asarray(vc)
        cupyops.kv_cache_append(dk, dv, cp.asarray(k), cp.asarray(v), cp.asarray(table), cp.asarray(pos))
        assert np.array_equal(dk.get().view(np.uint16), want_k.view(np.uint16)), dtype
        assert np.array_equal(dv.get().view(np.uint16), want_v.view(np.uint16)), dtype
        # merges, one side without keys, both
        o = rng.standard_normal((2, 3, 5, 40)).astype(t)
        lse = rng.standard_normal((2, 3, 5)).astype(np.float32)
        lse[1, 0] = -np.inf
        lse[:, 2] = -np.inf
        mo, ml = cupyops.merge_attention_states(offset_copy(o[0]), cp.asarray(lse[0]), cp.asarray(o[1]),
                                                cp.asarray(lse[1]))
        ro, rl = reference.merge_attention_states(o[0], lse[0], o[1], lse[1])
        assert reference.rel_error(mo, ro) <= reference.TOLERANCE["attention"][dtype], dtype
        assert np.array_equal(np.isneginf(ml.get()), np.isneginf(rl)), dtype
        n += 4
        # packed chunked prefill (the gather rung): aligned and element-path caches, device
        # lengths out of range and a bad entry in use (as above), a chunk longer than its
        # sequence, a sequence with no new token
        cu = np.array([0, 3, 3, 10], I32)
        qp = rng.standard_normal((10, 4, 64)).astype(t)
        lens = np.array([64, 0, 40], I32)
        kc, vc, table = cache(rng, t, [40, 40, 40], 16, 2, 64)
        table[2, 1] = -9
        kz = np.concatenate([kc, np.zeros_like(kc[:1])])
        vz = np.concatenate([vc, np.zeros_like(vc[:1])])
        ref_table = table.copy()
        ref_table[2, 1] = ref_table[0, 3] = kc.shape[0]
        want = reference.attention_paged(qp, kz, vz, ref_table, lens, cu_seqlens_q=cu)
        for aligned in (True, False):
            dk, dv = (cp.asarray(x) if aligned else offset_copy(x) for x in (kc, vc))
            got = cupyops.attention_paged(cp.asarray(qp), dk, dv, cp.asarray(table),
                                          cp.asarray(np.array([10**9, -4, 40], I32)), cu_seqlens_q=cp.asarray(cu),
                                          max_seqlen_q=7)
            check(got, want, dtype, f"{dtype} packed prefill aligned {aligned}")
            n += 1
    cp.cuda.Device().synchronize()
    print(f"sanitize_paged: {n} cases checked")


if __name__ == "__main__":
    main()
