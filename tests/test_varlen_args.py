"""CPU tier for attention_varlen (cupyops/ops/varlen.py): every bad argument raises a
TypeError/ValueError naming it before anything touches a GPU (NumPy operands and offsets:
no CuPy needed), the offsets checked on the host; registration; the float64 reference
against attention() on each sequence padded alone."""
import numpy as np
import pytest

import cupyops
from cupyops import reference

F16, I32 = np.float16, np.int32


def case(q_lens=(3, 5), k_lens=(4, 5), Hq=4, Hkv=2, D=8, dtype=F16):
    rng = np.random.default_rng(0)
    cq = np.concatenate([[0], np.cumsum(q_lens)]).astype(I32)
    ck = np.concatenate([[0], np.cumsum(k_lens)]).astype(I32)
    q = rng.standard_normal((cq[-1], Hq, D)).astype(dtype)
    k = rng.standard_normal((ck[-1], Hkv, D)).astype(dtype)
    v = rng.standard_normal((ck[-1], Hkv, D)).astype(dtype)
    return q, k, v, cq, ck


Q, K, V, CQ, CK = case()
A = cupyops.attention_varlen


@pytest.mark.parametrize("call, exc, match", [
    (lambda: A(Q.astype(np.int32), K, V, CQ, CK), TypeError, r"^q: dtype int32"),
    (lambda: A(Q, K.astype(np.float32), V, CQ, CK), TypeError, r"^k: dtype float32 does not match q's float16"),
    (lambda: A(Q[None], K, V, CQ, CK), ValueError, r"^q: expected a 3-D array"),
    (lambda: A(Q, K[..., :4], V, CQ, CK), ValueError, r"^k: head_dim 4 does not match q's 8"),
    (lambda: A(Q, K, V[:, :1], CQ, CK), ValueError, r"^v: expected k's shape"),
    (lambda: A(Q[:, :3], K, V, CQ, CK), ValueError, r"^k: kv_heads \(2\) must divide q_heads \(3\)"),
    (lambda: A(Q, K, V, CQ.astype(np.int64), CK), TypeError, r"^cu_seqlens_q: expected int32 offsets, got int64"),
    (lambda: A(Q, K, V, CQ, CK.astype(np.float32)), TypeError, r"^cu_seqlens_k: expected int32"),
    (lambda: A(Q, K, V, CQ[None], CK), ValueError, r"^cu_seqlens_q: expected a 1-D array of batch \+ 1"),
    (lambda: A(Q, K, V, CQ[:0], CK), ValueError, r"^cu_seqlens_q: expected a 1-D array"),
    (lambda: A(Q, K, V, CQ, CK[:2]), ValueError, r"^cu_seqlens_k: 1 sequences, cu_seqlens_q has 2"),
    (lambda: A(Q, K, V, np.array([0, 5, 3], I32), CK), ValueError,
     r"^cu_seqlens_q: offsets must not decrease, got 5 then 3 at index 2"),
    (lambda: A(Q, K, V, np.array([-1, 3, 8], I32), CK), ValueError, r"^cu_seqlens_q: offsets must be >= 0"),
    (lambda: A(Q, K, V, CQ, np.array([0, 4, 10], I32)), ValueError,
     r"^cu_seqlens_k: the last offset 10 is past the 9 packed tokens"),
    (lambda: A(Q, K, V, CQ, CK, max_seqlen_q=4), ValueError, r"^max_seqlen_q: 4 is less than the longest sequence \(5\)"),
    (lambda: A(Q, K, V, CQ, CK, max_seqlen_k=99), ValueError, r"^max_seqlen_k: must be in 0..9"),
    (lambda: A(Q, K, V, CQ, CK, max_seqlen_q=2.0), TypeError, r"^max_seqlen_q: expected an int or None"),
    (lambda: A(Q, K, V, CQ, CK, max_seqlen_q=True), TypeError, r"^max_seqlen_q: expected an int or None"),
    (lambda: A(Q, K, V, CQ, CK, causal=1), TypeError, r"^causal: expected a bool"),
    (lambda: A(Q, K, V, CQ, CK, causal_align="left"), ValueError, r"^causal_align: expected one of"),
    (lambda: A(Q, K, V, CQ, CK, scale=float("nan")), ValueError, r"^scale: must be finite"),
    (lambda: A(Q, K, V, CQ, CK, window=(1, -3)), ValueError, r"^window: the right side must be >= 0"),
    (lambda: A(Q, K, V, CQ, CK, softcap=-5.0), ValueError, r"^softcap: must be a finite float32 >= 0"),
    (lambda: A(Q, K, V, CQ, CK, impl="flash9"), ValueError, r"^impl: "),
    (lambda: A(Q, K, V, CQ, CK, out=np.empty((8, 4, 8), np.float32)), TypeError, r"^out: "),
    (lambda: A(Q, K, V, CQ, CK, out=np.empty((7, 4, 8), F16)), ValueError, r"^out: "),
])
def test_bad_arguments_name_themselves(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_registered_with_its_ladder():
    assert cupyops.variants("attention_varlen").keys() == {"per_sequence", "flash3"}
    assert "attention_varlen" in cupyops.__all__
    assert [kf.filename for kf in cupyops.ops.kernel_files("attention_varlen")] == ["attention_flash3.cu"]


@pytest.mark.parametrize("causal, align", [(False, "bottom_right"), (True, "bottom_right"), (True, "top_left")])
def test_reference_is_attention_per_sequence(causal, align):
    q, k, v, cq, ck = case(q_lens=(3, 0, 6, 2), k_lens=(5, 2, 6, 0), Hq=4, Hkv=1)
    got, lse = reference.attention_varlen(q, k, v, cq, ck, causal=causal, causal_align=align, return_lse=True)
    for b in range(4):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        o, l_b = reference.attention(q[q0:q1][None], k[k0:k1][None], v[k0:k1][None], causal=causal,
                                     causal_align=align, return_lse=True)
        np.testing.assert_array_equal(got[q0:q1], o[0])
        np.testing.assert_array_equal(lse[:, q0:q1], l_b[0])
    assert np.all(got[cq[3]:] == 0) and np.all(np.isneginf(lse[:, cq[3]:]))  # the sequence with no key


def test_reference_windows_and_caps_go_to_each_sequence():
    q, k, v, cq, ck = case(q_lens=(3, 6, 2), k_lens=(5, 6, 7), Hq=4, Hkv=2)
    got = reference.attention_varlen(q, k, v, cq, ck, causal=True, window=(2, None), softcap=1.5)
    for b in range(3):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        o = reference.attention(q[q0:q1][None], k[k0:k1][None], v[k0:k1][None], causal=True,
                                causal_align="bottom_right", window=(2, None), softcap=1.5)
        np.testing.assert_array_equal(got[q0:q1], o[0])
