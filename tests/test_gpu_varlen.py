"""GPU tier for attention_varlen (cupyops/ops/varlen.py): packed sequences of mixed lengths
(odd ones, a sequence with no query row, one with no key, q_len != kv_len both ways), GQA,
both causal alignments, every flash3 head_dim, each rung, the offsets on the GPU with the
longest lengths given (no host read) and on the host, against the float64 reference per
sequence (out= poisoned with NaN, LSE checked); the flash3 launch is the one kernel for
every sequence; torch tensors in, torch tensors out."""
import numpy as np
import pytest

import cupyops
from cupyops import _dtypes, _launch, reference
from cupyops.ops import _attention_flash3

pytestmark = pytest.mark.gpu


def _cp():
    return pytest.importorskip("cupy")


def hopper():
    return _attention_flash3.runs_here(_launch.device_props())


def packed(rng, dtype, q_lens, k_lens, Hq, Hkv, D, big=False):
    t = _dtypes.to_dtype(dtype)
    cq = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32)
    q = (rng.standard_normal((cq[-1], Hq, D)) * (30.0 if big else 1.0)).astype(t)
    k = rng.standard_normal((ck[-1], Hkv, D)).astype(t)
    v = rng.standard_normal((ck[-1], Hkv, D)).astype(t)
    return q, k, v, cq, ck


def check(got, ref, dtype, what):
    got = got.get().astype(np.float64)
    assert got.shape == ref.shape, what
    assert not np.isnan(got).any(), f"{what}: NaN in the output"
    err = reference.rel_error(got, ref)
    assert err <= reference.TOLERANCE["attention"][dtype], f"{what}: rel error {err:.3g}"


CASES = [  # (q_lens, k_lens, Hq, Hkv, D, causal, align)
    ([1], [1], 1, 1, 64, False, "bottom_right"),
    ([77, 5, 300, 1], [77, 5, 300, 1], 4, 2, 64, True, "bottom_right"),
    ([130, 0, 64, 257], [200, 33, 0, 257], 4, 1, 128, True, "bottom_right"),  # no q row; no key
    ([300, 17], [100, 600], 8, 2, 128, True, "top_left"),  # rows that see no key
    ([513, 200, 1], [513, 900, 40], 2, 2, 128, False, "bottom_right"),
    ([129, 64], [333, 64], 4, 2, 96, True, "bottom_right"),
    ([200, 70, 131], [333, 70, 131], 4, 2, 256, True, "bottom_right"),
    ([1100, 300, 5, 77], [1100, 300, 5, 77], 8, 2, 64, False, "bottom_right"),  # more tiles than SMs
]


@pytest.mark.parametrize("impl", ["flash3", "per_sequence", "auto"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"q{c[0]}k{c[1]}H{c[2]}/{c[3]}D{c[4]}"
                         + (f"-causal-{c[6]}" if c[5] else ""))
def test_matches_reference(impl, dtype, case):
    cp = _cp()
    if impl == "flash3" and not hopper():
        pytest.skip("flash3 runs on sm_90")
    q_lens, k_lens, Hq, Hkv, D, causal, align = case
    rng = np.random.default_rng(len(q_lens) + D)
    q, k, v, cq, ck = packed(rng, dtype, q_lens, k_lens, Hq, Hkv, D, big=D == 128)
    ref, ref_lse = reference.attention_varlen(q, k, v, cq, ck, causal=causal, causal_align=align, return_lse=True)
    dq, dk, dv, dcq, dck = (cp.asarray(x) for x in (q, k, v, cq, ck))
    what = f"{impl} {dtype} {case}"
    kw = dict(causal=causal, causal_align=align, impl=impl)
    # the offsets on the GPU and the longest lengths given: nothing read on the host
    got = cupyops.attention_varlen(dq, dk, dv, dcq, dck, max_seqlen_q=max(q_lens), max_seqlen_k=max(k_lens), **kw)
    check(got, ref, dtype, what)
    # host offsets, lengths found, out= poisoned, the LSE
    out = cp.full(q.shape, np.nan, dtype=q.dtype)
    res, lse = cupyops.attention_varlen(dq, dk, dv, cq, ck, out=out, return_lse=True, **kw)
    assert res is out
    check(out, ref, dtype, what + " out=")
    from test_gpu_attention import check_lse

    check_lse(lse, ref_lse, what)


def test_numpy_in_numpy_out_and_no_key_rows_are_zero():
    rng = np.random.default_rng(3)
    q, k, v, cq, ck = packed(rng, "float16", [40, 9], [0, 30], 2, 1, 64)
    got, lse = cupyops.attention_varlen(q, k, v, cq, ck, causal=True, return_lse=True)
    assert isinstance(got, np.ndarray) and isinstance(lse, np.ndarray)
    assert np.all(got[:40] == 0) and np.all(np.isneginf(lse[:, :40]))
    assert reference.rel_error(got.astype(np.float64), reference.attention_varlen(q, k, v, cq, ck, causal=True)) \
        <= reference.TOLERANCE["attention"]["float16"]


def test_flash3_is_one_launch_for_every_sequence(monkeypatch):
    cp = _cp()
    if not hopper():
        pytest.skip("flash3 runs on sm_90")
    calls = []
    real = _attention_flash3.launch
    monkeypatch.setattr(_attention_flash3, "launch", lambda impl, p, *a, **kw: (calls.append(p), real(impl, p))[1])
    rng = np.random.default_rng(1)
    q, k, v, cq, ck = packed(rng, "bfloat16", [256, 100, 3000], [256, 100, 3000], 8, 2, 128)
    cupyops.attention_varlen(*(cp.asarray(x) for x in (q, k, v, cq, ck)), max_seqlen_q=3000, max_seqlen_k=3000,
                             causal=True)
    assert len(calls) == 1 and calls[0].varlen and calls[0].B == 3 and calls[0].Sq == 3000


def test_torch_tensors_in_torch_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    q, k, v, cq, ck = packed(rng, "float16", [33, 70], [50, 70], 4, 2, 64)
    tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).cuda().half() for x in (q, k, v))
    tcq, tck = torch.from_numpy(cq).cuda(), torch.from_numpy(ck).cuda()
    got = cupyops.attention_varlen(tq, tk, tv, tcq, tck, max_seqlen_q=70, max_seqlen_k=70, causal=True)
    assert isinstance(got, torch.Tensor) and got.shape == tq.shape and got.device == tq.device
    ref = reference.attention_varlen(q, k, v, cq, ck, causal=True)
    assert reference.rel_error(got.float().cpu().numpy().astype(np.float64), ref) \
        <= reference.TOLERANCE["attention"]["float16"]
