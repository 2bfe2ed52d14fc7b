"""CPU tier: the fused LLM operators (silu_and_mul, gelu_and_mul, add_rms_norm, rope) refuse
bad input with a TypeError/ValueError naming the argument before anything touches a GPU
(NumPy arrays, no CuPy needed), leave out= untouched when they do, instantiate a kernel
of every rung for every dtype, and plan launch geometry that covers the work."""
import importlib.util

import numpy as np
import pytest

import cupyops
from cupyops import _dtypes
from cupyops.ops import activation, norm, rope

F32 = np.ones((4, 8), np.float32)
Q = np.ones((5, 4, 16), np.float32)
K = np.ones((5, 2, 16), np.float32)
POS = np.arange(5)


def call_rope(**kw):
    args = dict(q=Q, k=K, positions=POS)
    args.update(kw)
    q, k, p = args.pop("q"), args.pop("k"), args.pop("positions")
    return cupyops.rope(q, k, p, **args)


# ------------------------------------------------------------------ silu_and_mul / gelu_and_mul
@pytest.mark.parametrize("fn", [cupyops.silu_and_mul, cupyops.gelu_and_mul])
def test_and_mul_argument_errors(fn):
    with pytest.raises(TypeError, match="^x: dtype int32 is not supported"):
        fn(np.ones((2, 4), np.int32))
    with pytest.raises(ValueError, match="^x: expected at least 1 dimension"):
        fn(np.float32(1))
    with pytest.raises(ValueError, match=r"^x: the last axis holds \[a \| b\] and must have an even length, got 7"):
        fn(np.ones((3, 7), np.float32))
    with pytest.raises(ValueError, match=r"^out: expected shape \(4, 4\), got \(4, 8\)"):
        fn(F32, out=np.empty((4, 8), np.float32))
    with pytest.raises(TypeError, match="^out: expected dtype float32, got float16"):
        fn(F32, out=np.empty((4, 4), np.float16))
    with pytest.raises(ValueError, match="^impl: unknown variant 'fast' for .*_and_mul; expected one of auto, naive, vector"):
        fn(F32, impl="fast")


def test_gelu_approximate():
    with pytest.raises(ValueError, match="^approximate: expected 'none' or 'tanh', got 'erf'"):
        cupyops.gelu_and_mul(F32, "erf")
    with pytest.raises(TypeError, match="^approximate: expected 'none' or 'tanh', got bool"):
        cupyops.gelu_and_mul(F32, approximate=True)


def test_and_mul_out_untouched_on_error():
    poison = np.full((4, 4), -7.0, np.float32)
    with pytest.raises(ValueError, match="^impl"):
        cupyops.silu_and_mul(F32, out=poison, impl="nope")
    with pytest.raises(ValueError, match="^approximate"):
        cupyops.gelu_and_mul(F32, "nope", out=poison)
    assert np.all(poison == -7.0)


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 17), (16384, 512), (5, 1823), (7, 256), (1000, 3)])
def test_and_mul_vector_geometry_covers_the_array(rows, cols):
    tx, blocks = activation.vector_geometry(rows, cols)
    ty = activation.VECTOR_BLOCK // tx
    assert tx & (tx - 1) == 0 and tx * ty == activation.VECTOR_BLOCK
    column_blocks = -(-cols // tx)
    assert blocks % column_blocks == 0
    assert column_blocks * tx >= cols and (blocks // column_blocks) * ty * activation.VECTOR_UNROLL >= rows
    assert tx < 2 * cols or tx == 1  # no block twice as wide as a row


# ------------------------------------------------------------------ add_rms_norm
def test_add_rms_norm_argument_errors():
    r = F32.copy()
    with pytest.raises(TypeError, match="^x: dtype float64 is not supported"):
        cupyops.add_rms_norm(F32.astype(np.float64), r, None)
    with pytest.raises(ValueError, match=r"^residual: expected shape \(4, 8\), got \(4, 4\)"):
        cupyops.add_rms_norm(F32, np.ones((4, 4), np.float32), None)
    with pytest.raises(TypeError, match="^residual: dtype float16 is not supported; expected one of float32"):
        cupyops.add_rms_norm(F32, r.astype(np.float16), None)
    with pytest.raises(TypeError, match="^residual: expected an array, got None"):
        cupyops.add_rms_norm(F32, None, None)
    with pytest.raises(ValueError, match=r"^weight: expected shape \(8,\), got \(4,\)"):
        cupyops.add_rms_norm(F32, r, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="^eps: must be a finite number > 0"):
        cupyops.add_rms_norm(F32, r, None, 0.0)
    with pytest.raises(TypeError, match="^inplace: expected True or False, got 1"):
        cupyops.add_rms_norm(F32, r, None, inplace=1)
    with pytest.raises(ValueError, match="^impl: unknown variant 'x' for add_rms_norm; expected one of auto, twopass"):
        cupyops.add_rms_norm(F32, r, None, impl="x")


def test_add_rms_norm_in_place_and_out_rules():
    x, r = F32.copy(), F32.copy() * 2
    with pytest.raises(ValueError, match="^residual: must not overlap x"):
        cupyops.add_rms_norm(x, x, None, inplace=True)
    with pytest.raises(ValueError, match="^residual: must not overlap x"):
        cupyops.add_rms_norm(x, x[::-1], None, inplace=True)
    ro = F32.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="^residual: must be writeable for inplace=True"):
        cupyops.add_rms_norm(x, ro, None, inplace=True)
    outs = (np.empty_like(x), np.empty_like(x))
    with pytest.raises(ValueError, match="^out: not with inplace=True"):
        cupyops.add_rms_norm(x, r, None, inplace=True, out=outs)
    with pytest.raises(TypeError, match=r"^out: expected a pair of arrays \(normed, sum\), got ndarray"):
        cupyops.add_rms_norm(x, r, None, out=outs[0])
    with pytest.raises(TypeError, match=r"^out: expected a pair of arrays \(normed, sum\), got None in it"):
        cupyops.add_rms_norm(x, r, None, out=(outs[0], None))
    with pytest.raises(TypeError, match="^out\\[1\\]: expected dtype float32, got float16"):
        cupyops.add_rms_norm(x, r, None, out=(outs[0], np.empty((4, 8), np.float16)))
    with pytest.raises(ValueError, match="^out\\[0\\]: must not overlap residual"):
        cupyops.add_rms_norm(x, r, None, out=(r, outs[1]))
    with pytest.raises(ValueError, match="^out\\[1\\]: must not overlap out\\[0\\]"):
        cupyops.add_rms_norm(x, r, None, out=(outs[0], outs[0]))
    # a failed call leaves the arrays it would write as they were
    poison = (np.full((4, 8), -7.0, np.float32), np.full((4, 8), -7.0, np.float32))
    with pytest.raises(ValueError, match="^impl"):
        cupyops.add_rms_norm(x, r, None, out=poison, impl="x")
    with pytest.raises(ValueError, match="^eps"):
        cupyops.add_rms_norm(x, r, None, -1.0, inplace=True)
    assert np.all(poison[0] == -7.0) and np.all(poison[1] == -7.0)
    assert np.all(x == 1.0) and np.all(r == 2.0)


# ------------------------------------------------------------------ rope
@pytest.mark.parametrize("kw,exc,msg", [
    (dict(q=np.ones((5, 16), np.float32)), ValueError, r"^q: expected a 3-D array, got 2-D"),
    (dict(q=Q.astype(np.float64)), TypeError, "^q: dtype float64 is not supported"),
    (dict(k=K.astype(np.float16)), TypeError, "^k: dtype float16 must be q's, float32"),
    (dict(k=np.ones((4, 2, 16), np.float32)), ValueError, r"^k: expected shape \(5, kv_heads, 16\)"),
    (dict(k=np.ones((5, 2, 8), np.float32)), ValueError, r"^k: expected shape \(5, kv_heads, 16\)"),
    (dict(k=None), TypeError, "^k: expected an array, got None"),
    (dict(positions=POS.astype(np.float32)), TypeError, "^positions: dtype float32 is not supported; expected one of int32, int64"),
    (dict(positions=np.arange(4)), ValueError, r"^positions: expected shape \(5,\)"),
    (dict(rotary_dim=7), ValueError, r"^rotary_dim: must be even and in \[2, head_size=16\], got 7"),
    (dict(rotary_dim=18), ValueError, "^rotary_dim: must be even"),
    (dict(rotary_dim=0), ValueError, "^rotary_dim: must be even"),
    (dict(rotary_dim=8.0), TypeError, "^rotary_dim: expected an int, got float"),
    (dict(rotary_dim=True), TypeError, "^rotary_dim: expected an int, got bool"),
    (dict(base=0.0), ValueError, "^base: must be a finite number > 0"),
    (dict(base=float("inf")), ValueError, "^base: must be a finite number > 0"),
    (dict(base="1e4"), TypeError, "^base: expected a number, got str"),
    (dict(style="llama"), ValueError, "^style: expected 'neox' or 'gptj', got 'llama'"),
    (dict(style=None), TypeError, "^style: expected 'neox' or 'gptj', got NoneType"),
    (dict(cos_sin_cache=np.ones((8, 8), np.float32)), ValueError,
     r"^cos_sin_cache: expected shape \(max_pos, rotary_dim=16\), got \(8, 8\)"),
    (dict(cos_sin_cache=np.ones((8, 16), np.float64)), TypeError, "^cos_sin_cache: dtype float64 is not supported; expected one of float32"),
    (dict(cos_sin_cache=np.ones((4, 16), np.float32)), ValueError, "^positions: 4 is outside cos_sin_cache's 4 rows"),
    (dict(positions=np.array([0, 1, -2, 3, 4]), cos_sin_cache=np.ones((8, 16), np.float32)), ValueError,
     "^positions: -2 is outside cos_sin_cache's 8 rows"),
    (dict(inplace="yes"), TypeError, "^inplace: expected True or False, got 'yes'"),
    (dict(impl="fast"), ValueError, "^impl: unknown variant 'fast' for rope; expected one of auto, naive, fused"),
    (dict(out=np.empty_like(Q)), TypeError, r"^out: expected a pair of arrays \(q_out, k_out\), got ndarray"),
    (dict(out=(np.empty_like(Q), np.empty_like(Q))), ValueError, r"^out\[1\]: expected shape \(5, 2, 16\), got \(5, 4, 16\)"),
    (dict(out=(np.empty_like(Q), np.empty_like(K)), inplace=True), ValueError, "^out: not with inplace=True"),
])
def test_rope_argument_errors(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        call_rope(**kw)


def test_rope_model_dtype_cache_and_in_place_rules():
    h = np.ones((5, 4, 16), np.float16)
    with pytest.raises(TypeError, match="^cos_sin_cache: dtype bfloat16 is not supported; expected one of float32, float16"):
        cupyops.rope(h, h[:, :2], POS, cos_sin_cache=np.ones((8, 16), _dtypes.to_dtype("bfloat16")))
    with pytest.raises(ValueError, match="^k: must not overlap q"):
        cupyops.rope(Q, Q[:, :2], POS, inplace=True)
    ro = K.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="^k: must be writeable for inplace=True"):
        cupyops.rope(Q.copy(), ro, POS, inplace=True)
    poison = (np.full_like(Q, -7.0), np.full_like(K, -7.0))
    with pytest.raises(ValueError, match="^style"):
        cupyops.rope(Q, K, POS, style="x", out=poison)
    assert np.all(poison[0] == -7.0) and np.all(poison[1] == -7.0)


def test_add_rms_norm_in_place_needs_arrays_and_out_pair_of_none_is_none(monkeypatch):
    # in place, a list would be updated in a new array and the caller's left as it was
    with pytest.raises(TypeError, match="^x: inplace=True needs an array to write into, got list"):
        cupyops.add_rms_norm(list(F32.copy()), F32.copy(), None, inplace=True)
    with pytest.raises(TypeError, match="^residual: inplace=True needs an array to write into, got list"):
        cupyops.add_rms_norm(F32.copy(), list(F32.copy()), None, inplace=True)
    # out=(None, None) is out=None: the results, not the Nones (the kernels stood in for)
    packed = np.arange(2 * F32.size, dtype=np.float32).reshape((2,) + F32.shape)
    monkeypatch.setattr(norm, "_add_rms_norm", lambda *args: packed)
    normed, s = cupyops.add_rms_norm(F32, F32, None, out=(None, None))
    assert normed is not None and s is not None
    np.testing.assert_array_equal(normed, packed[0])
    np.testing.assert_array_equal(s, packed[1])


def test_rope_in_place_needs_arrays_and_a_float_base():
    # in place, a list (here of float32 token rows) would be rotated in a new array and the
    # caller's left as it was
    with pytest.raises(TypeError, match="^q: inplace=True needs an array to write into, got list"):
        cupyops.rope(list(Q.copy()), K.copy(), POS, inplace=True)
    with pytest.raises(TypeError, match="^k: inplace=True needs an array to write into, got list"):
        cupyops.rope(Q.copy(), list(K.copy()), POS, inplace=True)
    with pytest.raises(ValueError, match="^base: must be a finite number > 0, got an integer too large"):
        call_rope(base=10**400)
    shared_head = np.lib.stride_tricks.as_strided(Q.copy(), Q.shape, (Q.strides[0], 0, Q.strides[2]))
    with pytest.raises(ValueError, match="^q: a zero stride would rotate one element several times"):
        cupyops.rope(shared_head, K.copy(), POS, inplace=True)


def test_rope_out_pair_of_none_returns_new_arrays(monkeypatch):
    # out=(None, None) is out=None: the results, not the Nones (the kernels stood in for)
    packed = np.arange(Q.size + K.size, dtype=np.float32)
    monkeypatch.setattr(rope, "_rope", lambda *args: packed)
    got_q, got_k = cupyops.rope(Q, K, POS, out=(None, None))
    np.testing.assert_array_equal(got_q, packed[:Q.size].reshape(Q.shape))
    np.testing.assert_array_equal(got_k, packed[Q.size:].reshape(K.shape))


@pytest.mark.parametrize("heads,D,R,gptj,inplace,unit", [(40, 128, 128, False, False, 8), (40, 128, 128, True, True, 8),
                                                         (1, 2, 2, False, False, 1), (9, 80, 40, False, False, 4),
                                                         (3, 34, 16, True, False, 1), (64, 256, 256, False, True, 8),
                                                         (1, 2, 2, False, False, 8)])
def test_rope_fused_block_gives_each_thread_its_slots(heads, D, R, gptj, inplace, unit):
    # (the last: a 16-byte geometry with no whole vector to rotate, planned but never used)
    threads = rope.fused_threads(heads, D, R, gptj, inplace, unit)
    rot = R // unit if (gptj and unit > 1) else (R // 2 // unit if unit > 1 else R // 2)
    items = heads * (rot + (0 if inplace else (D - R) // unit))
    assert threads % 32 == 0 and 32 <= threads <= rope.FUSED_MAX_THREADS
    if threads < rope.FUSED_MAX_THREADS:  # one batch of loads, no warp without an item
        assert threads * rope.FUSED_SLOTS >= items
        assert threads == 32 or (threads - 32) * rope.FUSED_SLOTS < items


# ------------------------------------------------------------------ kernels behind every rung
@pytest.mark.parametrize("dtype", _dtypes.FLOAT_TYPES)
def test_every_rung_has_a_kernel_for_every_dtype(dtype):
    t = _dtypes.cuda_type(dtype)
    names = {"silu_and_mul": activation.KERNELS.name_expressions, "gelu_and_mul": activation.KERNELS.name_expressions,
             "add_rms_norm": norm.KERNELS.name_expressions, "rope": rope.KERNELS.name_expressions}
    for op, exprs in names.items():
        for rung in cupyops.variants(op):
            assert any(ne.startswith(f"{op}_{rung}<{t},") or ne == f"{op}_{rung}<{t}>" for ne in exprs), (op, rung)
    cache_types = [ne for ne in rope.KERNELS.name_expressions if ne.startswith(f"rope_fused<{t},")]
    assert len(cache_types) == 2 * len(rope._cache_types(dtype))  # int32 and int64 positions


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_valid_calls_without_cupy_say_what_is_missing():
    for fn in (lambda: cupyops.silu_and_mul(F32), lambda: cupyops.add_rms_norm(F32, F32 + 1, None),
               lambda: cupyops.rope(Q, K, POS)):
        with pytest.raises(RuntimeError, match="needs CuPy"):
            fn()
