"""CPU tier: the operator descriptions (cupyops/bench/operators.py) are complete and agree
with the CLI, the reference tolerances and the operators themselves.

The last test makes each description's inputs on the host (NumPy arrays standing in for
CuPy's), computes its reference, and hands the inputs to the cupyops operator through the
description's call: the operator's argument checks must pass for every dtype the
description claims (the call gets as far as needing CuPy) and refuse the dtypes it does
not. The GPU tier (test_gpu_operators.py) runs the same calls for real.
"""
import contextlib
import importlib.util
import math
import sys
import types

import numpy as np
import pytest

import cupyops
from cupyops import _dtypes, reference
from cupyops.bench import cases, cli, runners
from host_cupy import HostArray, host_normal
from cupyops.bench.operators import ITEMSIZE, LAYOUTS, OPERATORS, AttnShape

FAMILIES = ("array", "gemm", "attention")
CALLABLES = ("make_inputs", "reference", "call", "bytes_moved")


def test_every_op_the_cli_lists_has_a_description():
    assert cases.parse_ops(None) == tuple(OPERATORS) == cases.OPS
    assert all(spec.name == op for op, spec in OPERATORS.items())
    help_text = cli.build_parser().format_help()
    for op, spec in OPERATORS.items():
        assert op in help_text, op
        for alias in spec.aliases:  # each alias names this op, and only it
            assert alias not in OPERATORS and cases.parse_ops([alias]) == (op,), alias
    aliases = [a for spec in OPERATORS.values() for a in spec.aliases]
    assert len(aliases) == len(set(aliases))


@pytest.mark.parametrize("op", OPERATORS)
def test_description_is_complete(op):
    spec = OPERATORS[op]
    assert spec.dtypes and set(spec.dtypes) <= set(ITEMSIZE)
    assert spec.family in FAMILIES
    for name in CALLABLES:
        assert callable(getattr(spec, name)), name
    # baselines: known names, each with its maker; the default choice is among them
    assert spec.baselines and set(spec.baselines) <= set(cases.BASELINE_NAMES)
    assert all(callable(make) for make in spec.baselines.values())
    # a tolerance for every result dtype (integer results are exact)
    table = reference.TOLERANCE[spec.tolerance_kind]
    for dtype in spec.dtypes:
        if dtype not in cases.EXACT_DTYPES:
            out = spec.result_dtype(dtype)
            assert out in ITEMSIZE and out in table, (dtype, out)
    # the shapes: operand layouts for the GEMMs only; axes --axis can pick
    assert bool(spec.layouts) == (spec.family == "gemm") and set(spec.layouts) <= set(LAYOUTS)
    assert set(spec.axes) <= {-1, None} and spec.axes
    # the operator it describes: a public cupyops function, its ladder, its reference
    assert callable(getattr(cupyops, op)) and cupyops.variants(op)
    assert callable(getattr(reference, op))
    # shapes for the GPU test, which the op takes
    assert spec.test_shapes
    for shape in spec.test_shapes:
        assert isinstance(shape, AttnShape) == (spec.family == "attention")
        assert not (spec.check_shape and spec.check_shape(shape)), shape
        if spec.claims_rank:
            assert len(shape) == spec.claims_rank


def test_quick_suite_and_test_shapes_count_positive_bytes_and_flops():
    from_suite = cases.expand_cases(cases.OPS, "quick")
    from_tests = [c for op, spec in OPERATORS.items()
                  for c in cases.expand_cases((op,), "quick", dtypes=spec.dtypes, shapes=spec.test_shapes,
                                              masks=tuple(cases.MASKS), layouts=spec.layouts or None)]
    assert {c.op for c in from_suite} == {c.op for c in from_tests} == set(OPERATORS)
    for c in from_suite + from_tests:
        nbytes, work = cases.bytes_moved(c), cases.flops(c)
        assert isinstance(nbytes, int) and nbytes > 0, c
        assert (work is None) == (c.spec.flops is None), c
        assert work is None or (isinstance(work, int) and work > 0), c
        assert isinstance(cases.reports_bandwidth(c), bool), c
        tol = cases.tolerance(c, reference.TOLERANCE)
        assert math.isfinite(tol) and (tol == 0.0) == (c.dtype in cases.EXACT_DTYPES), c
        assert c.rows >= 1 and c.cols >= 1 and c.numel >= c.rows, c
        # every output is at least one element of the result dtype, every input read once
        assert nbytes > c.spec.result_itemsize(c.dtype), c


# ------------------------------------------------------------------------------------------
# the descriptions' inputs, reference and calls, with NumPy standing in for CuPy
# ------------------------------------------------------------------------------------------
class HostRandomState:
    def __init__(self, seed):
        self.rs = np.random.RandomState(seed)

    def randint(self, *args, **kwargs):
        return self.rs.randint(*args, **kwargs).view(HostArray)


@contextlib.contextmanager
def cupy_on_the_host():
    """A ``cupy`` module of what the descriptions' input makers and the reference gathers
    use, for the time of the block only: the operators themselves must not find it."""
    fake = types.ModuleType("cupy")
    fake.asarray = lambda a, dtype=None: np.asarray(a, dtype=dtype).view(HostArray)
    fake.int64 = np.int64
    fake.random = types.SimpleNamespace(RandomState=HostRandomState)
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = fake
    try:
        yield
    finally:
        if saved is None:
            del sys.modules["cupy"]
        else:
            sys.modules["cupy"] = saved


def host_case_data(monkeypatch, case):
    """The description's inputs and reference of ``case``, made on the host."""
    monkeypatch.setattr(runners, "random_normal", host_normal)
    monkeypatch.setattr(cupyops, "quantize_fp8", lambda x: tuple(
        np.asarray(a).view(HostArray) for a in reference.quantize_fp8(np.asarray(x))))
    spec = case.spec
    with cupy_on_the_host():
        data = runners.CaseData(case, **spec.make_inputs(case, 0))
        if spec.family == "attention":
            data.sample = cases.attention_sample(case, 0)
        data.ref = spec.reference(data)
    return data


# (scaled_matmul makes its own uint8 e4m3 inputs whatever the case's dtype: fp8 alone)
CALL_CASES = [pytest.param(op, dtype, id=f"{op}-{dtype}") for op, spec in OPERATORS.items() for dtype in ITEMSIZE
              if (dtype == "float8_e4m3") == (op == "scaled_matmul")]


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                    reason="CuPy is installed here: test_gpu_operators.py runs the calls for real")
@pytest.mark.parametrize("op,dtype", CALL_CASES)
def test_description_calls_the_operator_with_what_it_takes(monkeypatch, op, dtype):
    spec = OPERATORS[op]
    shape = spec.test_shapes[0]
    case = cases.Case(op, dtype, shape, spec.axes[0], layout=(spec.layouts or ("",))[-1])
    data = host_case_data(monkeypatch, case)
    if dtype not in spec.dtypes and data.x.dtype != _dtypes.to_dtype(dtype):
        pytest.skip(f"{op} makes its own input dtype ({data.x.dtype}) whatever the case's")
    if dtype in spec.dtypes:
        refs = data.ref if isinstance(data.ref, tuple) else (data.ref,)
        for ref in refs:
            ref = np.asarray(ref)
            assert (ref.dtype == np.float64 or ref.dtype.kind == "i") and np.all(np.isfinite(ref)), op
            assert ref.size and np.any(ref != 0), op  # fresh data, a real result
        # the arguments pass the operator's checks: the call gets as far as needing CuPy
        with pytest.raises(RuntimeError, match="needs CuPy"):
            spec.call(data, "auto")()
    else:  # the operator refuses what the description leaves out, naming the dtype
        with pytest.raises(TypeError, match=f"dtype {data.x.dtype}"):
            spec.call(data, "auto")()
