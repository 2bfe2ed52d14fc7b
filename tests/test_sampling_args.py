"""CPU tier: cupyops.sample refuses bad input with a TypeError/ValueError naming the argument
before anything touches a GPU (NumPy arrays, no CuPy needed); its variant table and kernel
instantiations; the float64 reference's Philox against Random123's published known answers
and its draw against a direct inverse CDF. (The kernels compile in tests/test_compile.py.)"""
import importlib.util

import numpy as np
import pytest

import cupyops
from cupyops import _dtypes, reference
from cupyops.ops import sampling

X = np.zeros((3, 10), np.float32)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(logits=np.zeros(10, np.float32)), ValueError, r"^logits: expected a 2-D array \[batch, vocab\], got shape \(10,\)"),
    (dict(logits=np.zeros((2, 3, 4), np.float32)), ValueError, r"^logits: expected a 2-D array"),
    (dict(logits=np.zeros((3, 10), np.int32)), TypeError, "^logits: dtype int32 is not supported; expected one of float32, float16, bfloat16"),
    (dict(logits=np.zeros((3, 10), np.float64)), TypeError, "^logits: dtype float64 is not supported"),
    (dict(logits=np.zeros((3, 0), np.float32)), ValueError, r"^logits: vocab \(the last axis\) must be in \[1, 2097152\], got 0"),
    (dict(temperature=-0.5), ValueError, r"^temperature: must be >= 0 \(0: greedy\) and not NaN, got -0.5"),
    (dict(temperature=float("nan")), ValueError, "^temperature: must be >= 0"),
    (dict(temperature=None), TypeError, "^temperature: expected a number or an array of 3 values, got NoneType"),
    (dict(temperature="1"), TypeError, "^temperature: expected a number or an array of 3 values, got str"),
    (dict(temperature=np.array([1.0, -1.0, 1.0])), ValueError, r"^temperature: every entry must be >= 0 .* got -1.0 \(entry 1\)"),
    (dict(temperature=np.ones(4, np.float32)), ValueError, r"^temperature: expected a number or an array of shape \(3,\) \(one a row\), got shape \(4,\)"),
    (dict(temperature=np.ones(3, np.int32)), TypeError, "^temperature: dtype int32 is not supported"),
    (dict(top_k=-1), ValueError, r"^top_k: must be >= 0 \(0 or None: no limit\), got -1"),
    (dict(top_k=2.0), TypeError, "^top_k: expected an int or an integer array, got float"),
    (dict(top_k=True), TypeError, "^top_k: expected an int or an integer array of 3 values, got bool"),
    (dict(top_k=np.array([1, -2, 3])), ValueError, r"^top_k: every entry must be >= 0, got -2 \(entry 1\)"),
    (dict(top_k=np.ones(3, np.float32)), TypeError, "^top_k: dtype float32 is not supported"),
    (dict(top_p=0.0), ValueError, r"^top_p: must be in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), ValueError, r"^top_p: must be in \(0, 1\]"),
    (dict(top_p=float("nan")), ValueError, r"^top_p: must be in \(0, 1\]"),
    (dict(top_p=np.array([0.5, 0.0, 1.0], np.float32)), ValueError, r"^top_p: every entry must be in \(0, 1\], got 0.0 \(entry 1\)"),
    (dict(seed=-1), ValueError, r"^seed: must be in \[0, 2\*\*64\), got -1"),
    (dict(seed=2**64), ValueError, r"^seed: must be in \[0, 2\*\*64\)"),
    (dict(seed=1.0), TypeError, "^seed: expected an int, an integer array or None, got float"),
    (dict(seed=np.array([1, 2], np.int64)), ValueError, r"^seed: expected a number or an array of shape \(3,\)"),
    (dict(seed=np.array([1, -2, 3], np.int64)), ValueError, r"^seed: every entry must be in \[0, 2\*\*64\), got -2 \(entry 1\)"),
    (dict(seed=np.ones(3, np.float64)), TypeError, "^seed: dtype float64 is not supported"),
    (dict(impl="sorted"), ValueError, "^impl: unknown variant 'sorted' for sample; expected one of auto, naive, fused, cluster"),
])
def test_argument_errors(kw, exc, msg):
    args = dict(logits=X)
    args.update(kw)
    with pytest.raises(exc, match=msg):
        cupyops.sample(args.pop("logits"), **args)


def test_checks_come_in_argument_order_before_anything_runs():
    # logits first, then the options in signature order: a call with several bad arguments
    # names the first (and, with no GPU here, never reaches CuPy)
    with pytest.raises(TypeError, match="^logits"):
        cupyops.sample(np.zeros((2, 3), np.int8), temperature=-1, top_k=-1)
    with pytest.raises(ValueError, match="^temperature"):
        cupyops.sample(X, temperature=-1, top_k=-1, top_p=2.0)
    with pytest.raises(ValueError, match="^top_k"):
        cupyops.sample(X, top_k=-1, top_p=2.0, seed=-1)
    with pytest.raises(ValueError, match="^top_p"):
        cupyops.sample(X, top_p=2.0, seed=-1, impl="x")
    with pytest.raises(ValueError, match="^seed"):
        cupyops.sample(X, seed=-1, impl="x")


def test_variant_table_and_instantiations():
    assert list(cupyops.variants("sample")) == ["naive", "fused", "cluster"]
    assert "sample" in cupyops.OPS and cupyops.sample is sampling.sample
    names = sampling.KERNELS.name_expressions
    for d in _dtypes.FLOAT_TYPES:
        t = _dtypes.cuda_type(d)
        for k in ("sample_naive_softmax", "sample_naive_thresholds", "sample_naive_draw", "sample_fused",
                  "sample_cluster"):
            assert f"{k}<{t}>" in names
    # the fused histogram's shared memory needs the opt-in past 48 KB, within every target's
    # per-block limit (sm_80: 163 KB, sm_90: 227 KB)
    assert 48 * 1024 < sampling.HIST_SMEM <= 160 * 1024


@pytest.mark.parametrize("counter,key,want", [  # Random123's kat_vectors for philox4x32_10
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(counter, key, want):
    assert tuple(int(w) for w in reference.philox4x32_10(counter, key)) == want


def test_uniforms_follow_the_documented_mapping():
    seed = 0x0123456789ABCDEF
    u = reference.sample_uniforms(5, seed)
    for row in range(5):
        word = reference.philox4x32_10((row, 0, 0, 0), (seed & 0xFFFFFFFF, seed >> 32))[0]
        assert u[row] == (int(word) >> 8) * 2.0**-24
    # a seed a row: counter 0 whatever the row, so a row's uniform is its seed's alone
    per_row = reference.sample_uniforms(3, np.array([7, seed, 7], np.uint64))
    assert per_row[0] == per_row[2] == reference.sample_uniforms(1, 7)[0]
    assert per_row[1] == u[0]
    # int64 seeds are their uint64 bits
    assert reference.sample_uniforms(1, np.array([-1], np.int64))[0] == reference.sample_uniforms(1, 2**64 - 1)[0]


def test_reference_draw_is_the_inverse_cdf():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 50)).astype(np.float32)
    for T, k, p in [(1.0, None, None), (0.7, 5, None), (1.3, None, 0.8), (1.0, 10, 0.5)]:
        got = reference.sample(x, temperature=T, top_k=k, top_p=p, seed=11)
        u = reference.sample_uniforms(64, 11)
        for i in range(64):
            v = x[i].astype(np.float64)
            e = np.exp((v - v.max()) / np.float32(T))
            keep = np.ones(50, bool) if k is None else v >= np.sort(v)[-k]
            if p is not None:  # the smallest set of largest tokens reaching p of the kept mass
                order = np.argsort(-np.where(keep, v, -np.inf))
                mass = np.cumsum(np.where(keep, e, 0)[order]) / np.where(keep, e, 0).sum()
                keep &= v >= v[order[np.argmax(mass >= np.float32(p))]]
            cdf = np.cumsum(np.where(keep, e, 0))
            assert got[i] == np.argmax(cdf > u[i] * cdf[-1]), (T, k, p, i)


def test_reference_semantics():
    x = np.array([[0.0, 3.0, 3.0, -np.inf, np.nan, 1.0]], np.float32)
    assert reference.sample(x, temperature=0)[0] == 1  # first of the tied maxima; NaN is -inf
    assert reference.sample(np.full((1, 4), -np.inf, np.float32))[0] == 0  # no finite logit
    for seed in range(20):
        assert reference.sample(x, top_k=1, seed=seed)[0] in (1, 2)  # ties with the k-th kept
        assert reference.sample(x, top_p=1e-6, seed=seed)[0] in (1, 2)
        assert reference.sample(x, seed=seed)[0] not in (3, 4)  # -inf and NaN are never drawn
    inf = np.array([[1.0, np.inf, 2.0, np.inf]], np.float32)  # +inf: the largest float, tied
    assert reference.sample(inf, temperature=0)[0] == 1
    assert {int(reference.sample(inf, seed=s)[0]) for s in range(40)} == {1, 3}


def test_accepts_only_tokens_near_a_boundary():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((200, 30)).astype(np.float32)
    tokens = reference.sample(x, top_k=20, top_p=0.9, seed=3)
    ok, exact = reference.sample_accepts(x, tokens, top_k=20, top_p=0.9, seed=3)
    assert ok.all() and exact.all()
    shifted = (tokens + 1) % 30  # the neighbour: accepted only where u is within tol of the step
    ok, exact = reference.sample_accepts(x, shifted, top_k=20, top_p=0.9, seed=3, tol=1e-5)
    assert not exact.any() and ok.sum() <= 2
    ok, _ = reference.sample_accepts(x, shifted, top_k=20, top_p=0.9, seed=3, tol=1.0)
    kept = x >= np.sort(x, axis=1)[:, -20:-19]
    assert (ok <= kept[np.arange(200), shifted]).all()  # never outside top-k, whatever the tol


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_valid_calls_without_cupy_say_what_is_missing():
    with pytest.raises(RuntimeError, match="needs CuPy"):
        cupyops.sample(X, temperature=0.7, top_k=5, top_p=0.9, seed=1)
