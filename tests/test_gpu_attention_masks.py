"""GPU tier for sliding windows and logit soft-capping (``window=``, ``softcap=``) in
attention, attention_varlen and attention_paged, against the float64 reference.

Every rung of ``cupyops.variants("attention")`` and ``auto``, every dtype it claims: a rung
that runs a problem without a window or a cap must run it with them (none may refuse the
masks where it takes the plain problem), and give the reference's output and LSE, into an
``out=`` poisoned with NaN. The cases mix q_len != kv_len both ways, GQA/MQA, both
alignments with and without a causal mask, windows that leave some rows no key (exact
zeros, LSE -inf), one-sided and zero-width windows, large queries under a cap (a nearly
one-hot softmax without one), and decode shapes. CuPy is imported inside the tests only."""

import numpy as np
import pytest

import cupyops
from cupyops import reference
from gpu_helpers import _cp
from test_gpu_attention import check_lse, check_out, make_qkv, run_case, rungs, skip_unless_runs_here, support_reason
from test_gpu_paged import run_paged

pytestmark = pytest.mark.gpu

# (B, Sq, Skv, Hq, Hkv, D, causal, align, window, softcap, big)
CASES = [
    (2, 100, 257, 4, 2, 64, False, "bottom_right", (32, 8), None, False),
    (1, 257, 257, 4, 1, 128, True, "top_left", (50, None), None, False),  # Mistral: (W - 1, 0) under causal
    (2, 64, 300, 6, 3, 96, True, "bottom_right", (100, 0), 20.0, False),
    (1, 300, 100, 4, 4, 128, False, "top_left", (None, 5), 30.0, False),
    (1, 17, 64, 2, 1, 64, False, "bottom_right", (0, 0), None, False),  # one key a row
    (1, 40, 17, 2, 2, 64, True, "bottom_right", (3, None), None, False),  # rows 0..22 see no key
    (1, 130, 200, 4, 2, 128, False, "top_left", (None, -1), 3.0, True),  # a cap alone, large scores
    (2, 129, 129, 2, 2, 256, True, "bottom_right", (64, None), 50.0, True),
    (3, 1, 1000, 8, 2, 128, True, "bottom_right", (255, None), None, False),  # decode
    (2, 4, 700, 4, 1, 64, True, "bottom_right", (100, 0), 30.0, False),
    (2, 16, 257, 4, 4, 256, False, "bottom_right", (20, 3), 10.0, False),
    (1, 3, 50, 2, 1, 40, False, "top_left", (60, 1), 5.0, False),  # odd head_dim: CUDA-core rungs
    (1, 400, 450, 4, 2, 64, True, "bottom_right", (None, None), 30.0, True),  # a cap alone, 192-row tiles
]


def reason(impl, dtype, case, masks):
    """The rung's supports() on the contiguous problem, with or without the case's masks."""
    B, Sq, Skv, Hq, Hkv, D, causal, align, window, softcap, _ = case
    return support_reason(impl, dtype, B, Hq, Hkv, Sq, Skv, D, causal, align, window=window if masks else None,
                          softcap=softcap if masks else None)


@pytest.mark.parametrize("impl,dtype", rungs())
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-q{}-kv{}-h{}/{}-d{}-{}-{}-w{}-c{}".format(*c[:10]))
def test_windows_and_caps_against_the_reference(impl, dtype, case):
    skip_unless_runs_here(impl)
    if impl != "auto":
        plain = reason(impl, dtype, case, masks=False)
        if plain:
            pytest.skip(f"{impl} does not run this problem at all: {plain}")
        why = reason(impl, dtype, case, masks=True)
        assert why is None, f"{impl} refuses the masks of a problem it runs: {why}"
    B, Sq, Skv, Hq, Hkv, D, causal, align, window, softcap, big = case
    assert run_case(impl, dtype, B, Sq, Skv, Hq, Hkv, D, causal=causal, align=align, big=big, seed=7, window=window,
                    softcap=softcap)


def test_repeated_calls_with_other_caps_and_windows_take_their_own_values():
    """The fast path keys a call by its options: a second call with another softcap (or a
    window, which takes the checked path) must not replay the first one's launch."""
    cp = _cp()
    q, k, v = make_qkv(np.random.default_rng(3), "bfloat16", 4, 1, 512, 8, 2, 128, big=True)
    dq, dk, dv = (cp.asarray(x) for x in (q, k, v))
    for window, softcap in [(None, 30.0), (None, 30.0), (None, 5.0), ((100, None), 5.0), (None, None), (None, 5.0)]:
        ref = reference.attention(q, k, v, causal=True, causal_align="bottom_right", window=window, softcap=softcap)
        got = cupyops.attention(dq, dk, dv, causal=True, causal_align="bottom_right", window=window, softcap=softcap)
        check_out(got, ref, "bfloat16", "bshd", f"window={window} softcap={softcap}")


# ---------------------------------------------------------------------------- varlen
VARLEN = [  # (q_lens, k_lens, Hq, Hkv, D, causal, align, window, softcap)
    ([77, 5, 300, 1], [77, 5, 300, 1], 4, 2, 64, True, "bottom_right", (31, None), None),
    ([130, 0, 64, 257], [200, 33, 0, 257], 4, 1, 128, False, "bottom_right", (40, 10), 25.0),
    ([300, 17], [100, 600], 8, 2, 128, True, "top_left", (16, None), 50.0),
    ([129, 64], [333, 64], 4, 2, 96, False, "top_left", (None, 0), None),
]


@pytest.mark.parametrize("impl", ["flash3", "per_sequence", "auto"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", VARLEN, ids=lambda c: f"{len(c[0])}seq-d{c[4]}-{c[5]}-{c[6]}-w{c[7]}-c{c[8]}")
def test_varlen_windows_and_caps(impl, dtype, case):
    from test_gpu_varlen import check, hopper, packed

    if impl == "flash3" and not hopper():
        pytest.skip("flash3 runs on sm_90")
    cp = _cp()
    q_lens, k_lens, Hq, Hkv, D, causal, align, window, softcap = case
    q, k, v, cq, ck = packed(np.random.default_rng(5), dtype, q_lens, k_lens, Hq, Hkv, D, big=softcap is not None)
    ref, ref_lse = reference.attention_varlen(q, k, v, cq, ck, causal=causal, causal_align=align, return_lse=True,
                                              window=window, softcap=softcap)
    out = cp.full(q.shape, np.nan, dtype=q.dtype)
    dq, dk, dv = (cp.asarray(x) for x in (q, k, v))
    kw = dict(max_seqlen_q=max(q_lens), max_seqlen_k=max(k_lens), causal=causal, causal_align=align, window=window,
              softcap=softcap, return_lse=True, out=out, impl=impl)
    res, lse = cupyops.attention_varlen(dq, dk, dv, cp.asarray(cq), cp.asarray(ck), **kw)
    # rows outside every sequence stay as they were (NaN here): none in these cases
    check(res, ref, dtype, f"{impl} {case}")
    check_lse(lse, ref_lse, f"{impl} {case}")


# ---------------------------------------------------------------------------- paged
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("P", [16, 128])
@pytest.mark.parametrize("Sq,causal,window,softcap", [
    (1, True, (255, None), None), (4, True, (100, 0), 1.0), (16, False, (7, 2), 0.5), (1, True, (None, None), 2.0),
    (3, True, (0, 0), None), (5, False, (None, 1), None), (2, False, (40, 0), 1.5)])
def test_paged_windows_and_caps(dtype, P, Sq, causal, window, softcap):
    # (caps near the scores' own size, about 1 here, so that they bend them)
    run_paged(dtype, [Sq, 1000, 257, 1823, max(Sq, 40)], Sq, 8, 2, 128, P, causal=causal, seed=11, window=window,
              softcap=softcap)
