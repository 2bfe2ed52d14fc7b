"""CPU tier for the tensor-core attention launcher (cupyops/ops/_attention_flash.py): what
it refuses and why, and that every plan names a compiled kernel with a legal grid and
shared memory that fits (two blocks an SM for the defaults, which its speed relies on)."""
import pytest

from cupyops.ops import _attention_flash as F
from attention_stubs import problem

SMEM_OPTIN = 227 * 1024  # H100/H200 per-block opt-in
SMEM_PER_SM = 228 * 1024  # of which the driver reserves 1 KB a block


_problem = problem


@pytest.mark.parametrize("kw, prefix", [
    ({"dtype": "float32"}, "q: flash supports float16, bfloat16"),
    ({"D": 80}, "head_dim: flash supports 64, 128"),
    ({"D": 256}, "head_dim: flash supports 64, 128"),
    ({"scale": 0.0}, "scale: flash needs a positive scale"),
    ({"scale": -0.5}, "scale: flash needs a positive scale"),
    ({"B": 70000}, "q: flash supports at most 65535"),
    ({"ptr": 8}, "q: flash needs 16-byte aligned rows"),
    ({"stride": (1000, 132, 4)}, "q: flash needs 16-byte aligned rows"),
])
def test_supports_names_the_argument(kw, prefix):
    reason = F.supports("flash", _problem(**kw))
    assert reason is not None and reason.startswith(prefix), reason


def test_supports_the_claimed_problems():
    for dtype in F.DTYPES["flash"]:
        for D in F.HEAD_DIMS:
            assert F.supports("flash", _problem(dtype=dtype, D=D)) is None
    assert F.supports("naive", _problem()).startswith("impl: ")


@pytest.mark.parametrize("D", F.HEAD_DIMS)
@pytest.mark.parametrize("dtype", F.DTYPES["flash"])
def test_every_plan_names_a_compiled_kernel_that_fits(dtype, D):
    for cfg in (None, *F.CONFIGS[D]):
        for B, Hq, Sq in ((1, 1, 1), (3, 32, 4097), (65535, 2, 64)):
            p = _problem(dtype=dtype, B=B, Hq=Hq, Hkv=1, Sq=Sq, Skv=Sq, D=D)
            name, grid, block, smem = F.plan(p, cfg)
            mt, _, _, warps = F.CONFIGS[D][cfg or next(iter(F.CONFIGS[D]))][:4]
            assert name in F.KERNELS.name_expressions
            assert grid == (-(-Sq // (16 * mt * warps)), Hq, B) and block == (32 * warps,)
            assert smem == F.smem_bytes(D, cfg or next(iter(F.CONFIGS[D]))) <= SMEM_OPTIN
    default = next(iter(F.CONFIGS[D]))
    assert 2 * (F.smem_bytes(D, default) + 1024) <= SMEM_PER_SM, "the default runs two blocks an SM"


def test_an_unknown_config_names_the_argument():
    with pytest.raises(ValueError, match=r"^config: 'm9c9w9s9' is not a flash configuration for head_dim 128"):
        F.plan(_problem(), "m9c9w9s9")
