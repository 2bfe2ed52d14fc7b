"""GPU tier: every benchmarked operator, from its description alone
(cupyops/bench/operators.py): each rung of its ladder and impl="auto", in each dtype the
description claims, on the description's small shapes (every axis, mask and operand
layout the op takes), validated as cupyops-bench validates before timing
(runners.validate_cupyops): the plain call against the description's float64 reference
within the description's tolerance, then the call into NaN-poisoned out= arrays, which must
come back fully written. Every row is checked (check_limit 0).

A rung that refuses a dtype or shape with TypeError/ValueError/NotImplementedError on its
first call (a float32-only GEMM rung given float16, a head_dim flash does not take) is
skipped with its reason, as the benchmark skips it; impl="auto" must take every case (its
refusal fails the test). The per-family files
(test_gpu_ops.py, test_gpu_fused.py, ...) pin which rung takes what.
"""
import random

import pytest

import cupyops
from cupyops.bench import cases, runners
from cupyops.bench.operators import OPERATORS

pytestmark = pytest.mark.gpu


def description_cases(op):
    """The cases of the op's test shapes in every dtype, axis, mask and layout it takes."""
    spec = OPERATORS[op]
    return cases.expand_cases((op,), "quick", dtypes=spec.dtypes, shapes=spec.test_shapes,
                              masks=tuple(cases.MASKS), layouts=spec.layouts or None)


GRID = [pytest.param(case, impl, id=f"{impl}-{case}".replace(" ", "-"))
        for op in OPERATORS for case in description_cases(op) for impl in [*cupyops.variants(op), "auto"]]


@pytest.mark.parametrize("case,impl", GRID)
def test_rung_matches_the_description_reference(case, impl):
    seed = random.randrange(2**31)  # fresh data each run; the seed is in the message
    data = runners.prepare(case, seed=seed, check_limit=0)
    call = runners.cupyops_call(data, impl)
    try:
        call()  # the first call compiles, and refuses what the rung does not take
    except (TypeError, ValueError, NotImplementedError) as exc:
        if impl == "auto":  # auto takes every case the description claims
            raise
        pytest.skip(f"{impl} does not take {case}: {type(exc).__name__}: {exc}")
    err, failure = runners.validate_cupyops(data, call)
    assert failure is None, f"{impl} on {case} (seed {seed}): {failure}"
    assert err <= data.tol
