"""CPU tier: bad input raises TypeError/ValueError naming the argument before anything
touches a GPU (these run with NumPy arrays on machines with neither CuPy nor a GPU),
and ``out`` is left untouched."""
import importlib.util

import numpy as np
import pytest

import cupyops

F32 = np.ones((4, 8), np.float32)
ROWS = [
    ("softmax", lambda x, **k: cupyops.softmax(x, **k)),
    ("layer_norm", lambda x, **k: cupyops.layer_norm(x, **k)),
    ("rms_norm", lambda x, **k: cupyops.rms_norm(x, **k)),
]


@pytest.mark.parametrize("name,fn", ROWS)
@pytest.mark.parametrize("dtype", [np.bool_, np.complex64, np.int32, np.float64])
def test_float_ops_reject_dtypes(name, fn, dtype):
    with pytest.raises(TypeError, match=r"^x: dtype .* is not supported; expected one of float32, float16, bfloat16"):
        fn(np.ones((2, 3), dtype))


@pytest.mark.parametrize("dtype", [np.bool_, np.complex128, np.uint8, np.int16])
def test_reductions_reject_dtypes(dtype):
    x = np.ones((3, 3), dtype)
    for fn, arg in ((cupyops.sum, "x"), (cupyops.max, "x"), (cupyops.trace, "a")):
        with pytest.raises(TypeError, match=f"^{arg}: dtype"):
            fn(x)


def test_trace_needs_2d():
    with pytest.raises(ValueError, match=r"^a: expected a 2-D array, got 3-D"):
        cupyops.trace(np.ones((2, 2, 2), np.float32))
    with pytest.raises(ValueError, match=r"^a: expected a 2-D array, got 1-D"):
        cupyops.trace(np.ones(3, np.float32))


@pytest.mark.parametrize("name,fn", ROWS)
def test_zero_dim_rejected(name, fn):
    with pytest.raises(ValueError, match="^x: expected at least 1 dimension"):
        fn(np.float32(1.0))


@pytest.mark.parametrize("axis", [2, -3, 7])
def test_axis_out_of_range(axis):
    for fn in (cupyops.softmax, cupyops.sum, cupyops.max):
        with pytest.raises(np.exceptions.AxisError if hasattr(np, "exceptions") else ValueError,
                           match=f"axis: {axis} is out of bounds"):
            fn(F32, axis=axis)


def test_axis_type_and_repeats():
    with pytest.raises(TypeError, match="^axis: expected an integer"):
        cupyops.softmax(F32, axis=1.5)
    with pytest.raises(ValueError, match="^axis: repeated axis"):
        cupyops.sum(F32, axis=(1, -1))


def test_weight_and_bias_shape_dtype():
    with pytest.raises(ValueError, match=r"^weight: expected shape \(8,\), got \(4,\)"):
        cupyops.layer_norm(F32, np.ones(4, np.float32))
    with pytest.raises(ValueError, match=r"^bias: expected shape \(8,\), got \(1, 8\)"):
        cupyops.layer_norm(F32, None, np.ones((1, 8), np.float32))
    with pytest.raises(TypeError, match="^weight: dtype float16 is not supported; expected one of float32"):
        cupyops.rms_norm(F32, np.ones(8, np.float16))


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan"), float("inf")])
def test_eps_must_be_positive(eps):
    with pytest.raises(ValueError, match="^eps: must be a finite number > 0"):
        cupyops.layer_norm(F32, eps=eps)
    with pytest.raises(ValueError, match="^eps: must be a finite number > 0"):
        cupyops.rms_norm(F32, eps=eps)


def test_eps_type():
    with pytest.raises(TypeError, match="^eps: expected a number"):
        cupyops.rms_norm(F32, eps="small")


def test_out_checks_and_out_untouched():
    poison = np.full((4, 8), -7.0, np.float32)
    with pytest.raises(ValueError, match=r"^out: expected shape \(4, 8\), got \(8, 4\)"):
        cupyops.softmax(F32, out=np.empty((8, 4), np.float32))
    with pytest.raises(TypeError, match="^out: expected dtype float32, got float16"):
        cupyops.softmax(F32, out=np.empty((4, 8), np.float16))
    with pytest.raises(ValueError, match="^out: must be C-contiguous"):
        cupyops.softmax(F32, out=np.empty((8, 4), np.float32).T)
    with pytest.raises(TypeError, match="^out: expected a NumPy array"):
        cupyops.softmax(F32, out=[[0.0] * 8] * 4)
    with pytest.raises(TypeError, match="^out: expected dtype int64, got int32"):
        cupyops.sum(np.ones(3, np.int32), out=np.empty((), np.int32))
    # an argument checked after `out` fails: out still holds its poison
    with pytest.raises(ValueError, match="^impl"):
        cupyops.softmax(F32, out=poison, impl="nope")
    with pytest.raises(ValueError, match="^weight"):
        cupyops.layer_norm(F32, np.ones(3, np.float32), out=poison)
    assert np.all(poison == -7.0)


def test_unknown_impl_lists_the_ladder():
    with pytest.raises(ValueError, match="impl: unknown variant 'fastest' for softmax; expected one of auto, naive"):
        cupyops.softmax(F32, impl="fastest")
    with pytest.raises(ValueError, match="impl: unknown variant 'x' for trace"):
        cupyops.trace(F32, impl="x")


def test_sum_dtype_policy():
    with pytest.raises(TypeError, match="^dtype: cannot sum float32 into int64"):
        cupyops.sum(F32, dtype=np.int64)
    with pytest.raises(TypeError, match="^dtype: not a dtype"):
        cupyops.sum(F32, dtype="float99")


def test_max_of_empty_axis():
    with pytest.raises(ValueError, match="zero-size array"):
        cupyops.max(np.ones((3, 0), np.float32), axis=1)


def test_not_an_array():
    with pytest.raises(TypeError, match="^x: expected an array"):
        cupyops.softmax([[1.0, 2.0], [3.0]])


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_valid_call_without_cupy_says_what_is_missing():
    with pytest.raises(RuntimeError, match=r'needs CuPy.*pip install "\.\[cuda13\]"'):
        cupyops.softmax(F32)
